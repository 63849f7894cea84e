/*
 * Golden kind "vae_decode": the pipelines' tail after denoising, for AutoencoderKL.
 *
 * As the case's "call" does: when args.unpack_latents, FluxPipeline._unpack_latents with
 * the latent size 2 * (height // (f * 2)) x 2 * (width // (f * 2)) (f = the VAE's scale
 * factor); then latents / scaling_factor + shift_factor, AutoencoderKL.decode, and
 * VaeImageProcessor.postprocess to a float image and to 8-bit pixels. Each output the case
 * lists (unpacked, scaled, decoded, image, image_uint8) is compared; image_uint8 as
 * numbers, within the case's max_abs of 1. The context comes from --device, --threads,
 * --dtype and --mode.
 *
 * AutoencoderKLFlux2 replaces the unpacking and unscaling with Flux2Pipeline's own steps:
 * the tokens (args.latents) are scattered by their position ids (args.latent_ids), de-
 * normalised by the VAE's batch-norm statistics and unpatchified (outputs unpacked,
 * denormalized, unpatchified) before the same decode and post-processing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef struct run_state {
    check_case *c;
    df_ctx *ctx;
    df_vae *vae;
    int failed; /* an output beyond tolerance, or an error */
    bool error; /* an error: later steps do not run */
} run_state;

static bool wants(const check_case *c, const char *output)
{
    return df_json_get(df_json_get(c->root, "outputs"), output) != NULL;
}

/* Reads tensor t back as f32 (malloc'd) and compares it when the case lists `output`. */
static float *read_and_compare(run_state *r, const char *output, df_tensor *t)
{
    int64_t n = df_tensor_numel(t);
    float *got = malloc((size_t)n * sizeof *got + 1);
    if (!got) {
        r->failed = check_fail(r->c, "out of memory");
        r->error = true;
        return NULL;
    }
    if (df_tensor_read(r->ctx, t, DF_DTYPE_F32, got, (size_t)n * sizeof *got) != DF_OK) {
        r->failed = check_fail(r->c, "%s: %s", output, df_error_message());
        r->error = true;
        free(got);
        return NULL;
    }
    if (wants(r->c, output))
        r->failed |= check_compare_f32(r->c, output, got, n);
    return got;
}

static df_tensor *upload_latents(run_state *r)
{
    const char *name;
    if (df_json_get_string(r->c->args, "latents", &name) != DF_OK) {
        r->failed = check_fail(r->c, "args.latents: %s", df_error_message());
        return NULL;
    }
    float *data;
    int64_t shape[8];
    int ndim;
    if (check_read_f32(r->c, name, &data, shape, &ndim) != DF_OK) {
        r->failed =
            check_fail(r->c, "args.latents: cannot read '%s': %s", name, df_error_message());
        return NULL;
    }
    df_tensor *t = df_tensor_from_host(r->ctx, DF_DTYPE_F32, shape, ndim, data);
    free(data);
    if (!t)
        r->failed = check_fail(r->c, "args.latents: %s", df_error_message());
    return t;
}

/* Unpacks FLUX's packed latents to [B, C, h, w] when the case asks for it. */
static df_tensor *unpack(run_state *r, df_tensor *z)
{
    bool do_unpack;
    int64_t height, width;
    if (df_json_get_bool_or(r->c->args, "unpack_latents", false, &do_unpack) != DF_OK) {
        r->failed = check_fail(r->c, "args: %s", df_error_message());
        return NULL;
    }
    if (!do_unpack)
        return z;
    if (df_json_get_int(r->c->args, "height", &height) != DF_OK ||
        df_json_get_int(r->c->args, "width", &width) != DF_OK) {
        r->failed = check_fail(r->c, "args: %s", df_error_message());
        return NULL;
    }
    int64_t f = df_vae_config(r->vae)->scale_factor;
    df_tensor *out;
    if (df_vae_unpack_latents(r->ctx, z, 2 * (height / (f * 2)), 2 * (width / (f * 2)), &out) !=
        DF_OK) {
        r->failed = check_fail(r->c, "unpack: %s", df_error_message());
        return NULL;
    }
    free(read_and_compare(r, "unpacked", out));
    return r->error ? NULL : out;
}

/* The result of one FLUX.2 layout step (status st, tensor next), compared with `output`;
 * NULL after a failure. */
static df_tensor *flux2_step(run_state *r, const char *output, df_status st, df_tensor *next)
{
    if (st != DF_OK) {
        r->failed = check_fail(r->c, "%s: %s", output, df_error_message());
        return NULL;
    }
    free(read_and_compare(r, output, next));
    return r->error ? NULL : next;
}

/* Flux2Pipeline's tail before decode: unpack by ids, de-normalise, unpatchify. */
static df_tensor *flux2_prepare(run_state *r, df_tensor *z)
{
    const char *name;
    int64_t *ids = NULL, shape[8];
    int ndim = 0;
    if (df_json_get_string(r->c->args, "latent_ids", &name) != DF_OK ||
        check_read_i64(r->c, name, &ids, shape, &ndim) != DF_OK) {
        r->failed = check_fail(r->c, "args.latent_ids: %s", df_error_message());
        return NULL;
    }
    if (ndim != 3 || shape[2] != 4 || shape[0] != df_tensor_dim(z, 0) ||
        shape[1] != df_tensor_dim(z, 1)) {
        free(ids);
        r->failed = check_fail(r->c, "args.latent_ids: expected [B, S, 4] for the latents");
        return NULL;
    }
    df_tensor *next = NULL;
    df_status st = df_vae_unpack_latents_with_ids(r->ctx, z, ids, &next);
    free(ids);
    z = flux2_step(r, "unpacked", st, next);
    if (z) {
        st = df_vae_bn_denormalize(r->ctx, r->vae, z, &next);
        z = flux2_step(r, "denormalized", st, next);
    }
    if (z) {
        st = df_vae_unpatchify_latents(r->ctx, z, &next);
        z = flux2_step(r, "unpatchified", st, next);
    }
    return z;
}

static void postprocess(run_state *r, const float *decoded, df_tensor *t)
{
    int64_t b = df_tensor_dim(t, 0), ch = df_tensor_dim(t, 1);
    int64_t h = df_tensor_dim(t, 2), w = df_tensor_dim(t, 3), n = df_tensor_numel(t);
    float *image = malloc((size_t)n * sizeof *image);
    uint8_t *rgb = malloc((size_t)n);
    double *rgb_f64 = malloc((size_t)n * sizeof *rgb_f64);
    if (!image || !rgb || !rgb_f64) {
        r->failed = check_fail(r->c, "out of memory");
    } else if (df_vae_postprocess_f32(decoded, b, ch, h, w, image) != DF_OK ||
               df_vae_postprocess_rgb8(decoded, b, ch, h, w, rgb) != DF_OK) {
        r->failed = check_fail(r->c, "postprocess: %s", df_error_message());
    } else {
        if (wants(r->c, "image"))
            r->failed |= check_compare_f32(r->c, "image", image, n);
        for (int64_t i = 0; i < n; i++)
            rgb_f64[i] = rgb[i];
        if (wants(r->c, "image_uint8"))
            r->failed |= check_compare_f64(r->c, "image_uint8", rgb_f64, n);
    }
    free(image);
    free(rgb);
    free(rgb_f64);
}

static int run(run_state *r)
{
    char file[4096];
    if (df_vae_load_file(r->ctx, r->c->model_dir, check_single_file(r->c, file, sizeof file),
                         &r->vae) != DF_OK)
        return check_fail(r->c, "loading %s: %s", r->c->model_dir, df_error_message());
    df_tensor *z = upload_latents(r);
    df_tensor *scaled = NULL, *decoded = NULL;
    if (z && df_vae_config(r->vae)->flux2) {
        scaled = flux2_prepare(r, z);
    } else {
        if (z)
            z = unpack(r, z);
        if (z && df_vae_unscale(r->ctx, r->vae, z, &scaled) != DF_OK)
            r->failed = check_fail(r->c, "unscale: %s", df_error_message());
        if (scaled)
            free(read_and_compare(r, "scaled", scaled));
    }
    if (scaled && !r->error && df_vae_decode(r->ctx, r->vae, scaled, &decoded) != DF_OK)
        r->failed = check_fail(r->c, "decode: %s", df_error_message());
    if (decoded && !r->error) {
        float *img = read_and_compare(r, "decoded", decoded);
        if (img)
            postprocess(r, img, decoded);
        free(img);
    }
    if (r->c->stats_json) {
        df_stats st;
        df_ctx_stats(r->ctx, &st);
        char buf[2048];
        df_stats_to_json(&st, buf, sizeof buf);
        fprintf(r->c->stats_json, "%s\n", buf);
    }
    df_vae_free(r->vae);
    return r->failed ? 1 : 0;
}

int check_kind_vae_decode(check_case *c)
{
    if (!check_runs_class("vae_decode", c->cls)) /* a VAE row of the model table */
        return check_fail(c, "class %s is not implemented yet", c->cls);
    if (!c->model_dir)
        return check_fail(c, "a vae_decode case needs \"dir\" (the vae folder)");

    df_ctx *ctx;
    df_ctx_opts opts = check_ctx_opts(c);
    if (df_ctx_create(&opts, &ctx) != DF_OK)
        return check_fail(c, "cannot create a context on %s: %s",
                          c->device ? c->device : "the default device", df_error_message());
    run_state r = {.c = c, .ctx = ctx};
    int rc = run(&r);
    df_ctx_free(ctx);
    return rc;
}
