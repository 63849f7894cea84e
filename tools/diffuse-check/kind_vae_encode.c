/*
 * Golden kind "vae_encode": what the img2img pipelines do to their input pictures.
 *
 * args.images are PNG / JPEG files in the case folder. Each is decoded and run through
 * VaeImageProcessor.preprocess (df_image_preprocess: args.height / args.width, null for the
 * picture's own, rounded down to args.vae_scale_factor; PIL's Lanczos resize when the size
 * differs) into one batch [B, 3, H, W]; AutoencoderKL's encoder gives the moments; the
 * posterior gives the latents, with sample(generator) (args.generator, one torch generator
 * for the batch) or the mean (args.sample_mode "argmax"); last (x - shift_factor) *
 * scaling_factor. Outputs compared: preprocessed, moments, latents, latents_scaled.
 * AutoencoderKLFlux2: latents_scaled is Flux2Pipeline._encode_vae_image's result instead,
 * the latents patchified 2x2 and normalised by the batch-norm statistics.
 * args.tile_sample_min_size (optional): the moments come from df_vae_encode_tiled with that
 * tile side, as enable_tiling() with it set.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef struct batch {
    int n, height, width;
    float *pixels; /* [n, 3, height, width] */
} batch;

static int int_or_zero(check_case *c, const char *key, int *out)
{
    *out = 0;
    const df_json *v = df_json_get(c->args, key);
    if (!v || df_json_is_null(v))
        return 0;
    int64_t x;
    if (df_json_to_int(v, &x) != DF_OK || x < 0 || x > 1 << 16)
        return check_fail(c, "args.%s: expected null or a size", key);
    *out = (int)x;
    return 0;
}

/* Decodes and preprocesses every picture of args.images into b. */
static int load_images(check_case *c, batch *b)
{
    const df_json *list = NULL;
    int h, w, multiple;
    if (df_json_get_array(c->args, "images", &list) != DF_OK || df_json_array_size(list) < 1)
        return check_fail(c, "args.images: expected a list of file names");
    if (int_or_zero(c, "height", &h) || int_or_zero(c, "width", &w) ||
        int_or_zero(c, "vae_scale_factor", &multiple))
        return 1;
    b->n = (int)df_json_array_size(list);
    for (int i = 0; i < b->n; i++) {
        const char *name;
        char path[4096];
        df_image *img = NULL;
        if (df_json_to_string(df_json_array_get(list, i), &name) != DF_OK)
            return check_fail(c, "args.images[%d]: expected a file name", i);
        snprintf(path, sizeof path, "%s/%s", c->dir, name);
        int ih, iw;
        df_status st = df_image_load(path, &img);
        if (st == DF_OK)
            st = df_image_preprocess_size(img, h, w, multiple ? multiple : 8, &ih, &iw);
        if (st == DF_OK && i > 0 && (ih != b->height || iw != b->width))
            st = DF_E_SHAPE;
        if (st == DF_OK && i == 0) {
            b->height = ih;
            b->width = iw;
            b->pixels = malloc((size_t)b->n * 3 * (size_t)ih * (size_t)iw * sizeof(float));
            if (!b->pixels)
                st = DF_E_OOM;
        }
        if (st == DF_OK)
            st = df_image_preprocess(img, h, w, multiple ? multiple : 8, DF_RESAMPLE_LANCZOS,
                                     b->pixels + (size_t)i * 3 * (size_t)ih * (size_t)iw);
        df_image_free(img);
        if (st != DF_OK)
            return check_fail(c, "%s: %s", path,
                              st == DF_E_SHAPE ? "pictures of different sizes"
                                               : df_error_message());
    }
    return 0;
}

static int run(check_case *c, df_ctx *ctx, df_vae_encoder *enc)
{
    batch b = {0};
    int failed = load_images(c, &b);
    int64_t per = 3 * (int64_t)b.height * b.width;
    if (!failed)
        failed |= check_compare_f32(c, "preprocessed", b.pixels, b.n * per);
    df_tensor *moments = NULL;
    int tile = 0;
    failed = failed || int_or_zero(c, "tile_sample_min_size", &tile);
    if (!failed) {
        df_tensor *img =
            df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(b.n, 3, b.height, b.width), b.pixels);
        if (!img || (tile ? df_vae_encode_tiled(ctx, enc, img, tile, &moments)
                          : df_vae_encode(ctx, enc, img, &moments)) != DF_OK)
            failed = check_fail(c, "encode: %s", df_error_message());
    }
    float *m = NULL, *lat = NULL;
    int64_t C2 = 0, lh = 0, lw = 0, n_lat = 0;
    if (!failed) {
        C2 = df_tensor_dim(moments, 1), lh = df_tensor_dim(moments, 2);
        lw = df_tensor_dim(moments, 3);
        n_lat = b.n * (C2 / 2) * lh * lw;
        m = malloc((size_t)df_tensor_numel(moments) * sizeof *m);
        lat = malloc((size_t)n_lat * sizeof *lat);
        if (!m || !lat ||
            df_tensor_read(ctx, moments, DF_DTYPE_F32, m,
                           (size_t)df_tensor_numel(moments) * sizeof *m) != DF_OK)
            failed = check_fail(c, "reading the moments: %s", df_error_message());
    }
    if (!failed)
        failed |= check_compare_f32(c, "moments", m, df_tensor_numel(moments));
    if (!failed) {
        const char *mode = "sample";
        df_json_get_string_or(c->args, "sample_mode", "sample", &mode);
        const df_json *gen = df_json_get(c->args, "generator");
        uint64_t seed = 0;
        df_rng rng;
        bool sample = strcmp(mode, "argmax") != 0;
        if (sample && (!gen || df_json_is_null(gen)))
            failed = check_fail(c, "args.generator: sample mode needs a generator");
        else if (sample)
            failed = check_read_seed(c, gen, &seed);
        if (!failed) {
            df_rng_init(&rng, seed);
            if (df_vae_latent_dist(m, b.n, C2 / 2, lh, lw, sample ? &rng : NULL, lat) != DF_OK)
                failed = check_fail(c, "posterior: %s", df_error_message());
        }
    }
    if (!failed)
        failed |= check_compare_f32(c, "latents", lat, n_lat);
    float *scaled = failed ? NULL : malloc((size_t)n_lat * sizeof *scaled);
    if (!failed && !scaled)
        failed = check_fail(c, "out of memory");
    if (!failed) {
        df_status st;
        if (df_vae_encoder_config(enc)->flux2) {
            st = df_vae_encoder_flux2_normalize(enc, lat, b.n, lh, lw, scaled);
        } else {
            memcpy(scaled, lat, (size_t)n_lat * sizeof *scaled);
            st = df_vae_scale_latents(df_vae_encoder_config(enc), scaled, n_lat);
        }
        if (st != DF_OK)
            failed = check_fail(c, "scale: %s", df_error_message());
        else
            failed |= check_compare_f32(c, "latents_scaled", scaled, n_lat);
    }
    free(scaled);
    check_write_stats(c, ctx);
    free(b.pixels);
    free(m);
    free(lat);
    return failed;
}

int check_kind_vae_encode(check_case *c)
{
    if (!check_runs_class("vae_encode", c->cls)) /* a VAE row of the model table */
        return check_fail(c, "class %s is not implemented yet", c->cls);
    if (!c->model_dir)
        return check_fail(c, "a vae_encode case needs \"dir\" (the vae folder)");
    df_ctx *ctx;
    df_ctx_opts opts = check_ctx_opts(c);
    if (df_ctx_create(&opts, &ctx) != DF_OK)
        return check_fail(c, "cannot create a context on %s: %s",
                          c->device ? c->device : "the default device", df_error_message());
    df_vae_encoder *enc = NULL;
    int rc;
    char file[4096]; /* "single_file": the weights from that file, the config from dir */
    if (df_vae_encoder_load_file(ctx, c->model_dir, check_single_file(c, file, sizeof file),
                                 &enc) != DF_OK)
        rc = check_fail(c, "loading %s: %s", c->model_dir, df_error_message());
    else
        rc = run(c, ctx, enc);
    df_vae_encoder_free(enc);
    df_ctx_free(ctx);
    return rc;
}
