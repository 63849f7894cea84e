/*
 * VAE decoder tests: the golden AutoencoderKL cases through the library API, FLUX latent
 * unpacking, image post-processing, tiled decoding, and the load errors. FLUX.2's
 * AutoencoderKLFlux2 and its latent layouts are tested in test_vae_flux2.c.
 *
 * The small random models are written here with the safetensors writer, under the
 * checkpoint names diffusers uses, so the tests need no download. Expected values never
 * come from the code under test: the golden cases come from diffusers, the layout tests
 * from index formulas, and the tiled decode is checked against tiles decoded one by one
 * and blended here on the host.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "models/loader.h"

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    return ctx;
}

/* --- golden cases ------------------------------------------------------------------------ */

typedef struct golden {
    char dir[1024];
    df_json *case_json;
    df_safetensors *st;
} golden;

static void golden_open(golden *g, const char *name)
{
    snprintf(g->dir, sizeof g->dir, "%s/%s", DF_GOLDEN_DIR, name);
    char path[1200];
    snprintf(path, sizeof path, "%s/case.json", g->dir);
    assert_int_equal(df_json_parse_file(path, &g->case_json), DF_OK);
    snprintf(path, sizeof path, "%s/case.safetensors", g->dir);
    assert_int_equal(df_safetensors_open(path, &g->st), DF_OK);
}

static void golden_close(golden *g)
{
    df_safetensors_free(g->st);
    df_json_free(g->case_json);
}

/* Tensor `name` of case.safetensors as f64 (malloc'd); *n its element count. */
static double *golden_f64(const golden *g, const char *name, int64_t *n, int64_t *shape)
{
    df_tensor_info info;
    assert_int_equal(df_safetensors_find(g->st, name, &info), DF_OK);
    double *v = malloc((size_t)info.numel * sizeof *v);
    assert_non_null(v);
    assert_int_equal(
        df_safetensors_read(g->st, name, DF_DTYPE_F64, v, (size_t)info.numel * sizeof *v), DF_OK);
    *n = info.numel;
    if (shape)
        memcpy(shape, info.shape, (size_t)info.ndim * sizeof *shape);
    return v;
}

/* Compares got with out.<output> within the case's tolerance; prints the errors. */
static void golden_compare(const golden *g, const char *output, const float *got, int64_t n)
{
    char name[128];
    snprintf(name, sizeof name, "out.%s", output);
    int64_t m;
    double *want = golden_f64(g, name, &m, NULL);
    assert_int_equal(m, n);
    const df_json *tol = df_json_get(df_json_get(g->case_json, "tolerance"), output);
    double max_tol, rel_tol;
    assert_int_equal(df_json_get_double(tol, "max_abs", &max_tol), DF_OK);
    assert_int_equal(df_json_get_double(tol, "rel_l2", &rel_tol), DF_OK);
    double max_abs = 0, diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        max_abs = d > max_abs ? d : max_abs;
        diff2 += d * d;
        ref2 += want[i] * want[i];
    }
    double rel = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
    printf("  %-12s max_abs %.3g (limit %.3g)  rel_l2 %.3g (limit %.3g)\n", output, max_abs,
           max_tol, rel, rel_tol);
    assert_true(max_abs <= max_tol);
    assert_true(rel <= rel_tol);
    free(want);
}

static float *read_f32(df_ctx *ctx, df_tensor *t)
{
    assert_non_null(t);
    int64_t n = df_tensor_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, v, (size_t)n * sizeof *v), DF_OK);
    return v;
}

static void run_golden(const char *case_name, bool unpack)
{
    printf("%s\n", case_name);
    golden g;
    golden_open(&g, case_name);
    df_ctx *ctx = new_ctx();
    char vae_dir[1200];
    snprintf(vae_dir, sizeof vae_dir, "%s/vae", g.dir);
    df_vae *vae = NULL;
    assert_int_equal(df_vae_load(ctx, vae_dir, &vae), DF_OK);
    const df_vae_info *info = df_vae_config(vae);
    assert_int_equal(info->scale_factor, 8);

    int64_t n, shape[8];
    double *lat64 = golden_f64(&g, "in.latents", &n, shape);
    float *lat = malloc((size_t)n * sizeof *lat);
    for (int64_t i = 0; i < n; i++)
        lat[i] = (float)lat64[i];
    df_tensor *z = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, unpack ? 3 : 4, lat);
    if (unpack) {
        int64_t height, width;
        const df_json *args = df_json_get(g.case_json, "args");
        assert_int_equal(df_json_get_int(args, "height", &height), DF_OK);
        assert_int_equal(df_json_get_int(args, "width", &width), DF_OK);
        int64_t f = info->scale_factor;
        assert_int_equal(
            df_vae_unpack_latents(ctx, z, 2 * (height / (2 * f)), 2 * (width / (2 * f)), &z),
            DF_OK);
        float *u = read_f32(ctx, z);
        golden_compare(&g, "unpacked", u, df_tensor_numel(z));
        free(u);
    }
    df_tensor *scaled, *decoded;
    assert_int_equal(df_vae_unscale(ctx, vae, z, &scaled), DF_OK);
    float *s = read_f32(ctx, scaled);
    golden_compare(&g, "scaled", s, df_tensor_numel(scaled));
    assert_int_equal(df_vae_decode(ctx, vae, scaled, &decoded), DF_OK);
    assert_int_equal(df_tensor_ndim(decoded), 4);
    assert_int_equal(df_tensor_dim(decoded, 1), 3);
    assert_int_equal(df_tensor_dim(decoded, 2), 8 * df_tensor_dim(scaled, 2));
    float *d = read_f32(ctx, decoded);
    int64_t nd = df_tensor_numel(decoded);
    golden_compare(&g, "decoded", d, nd);

    int64_t B = df_tensor_dim(decoded, 0), H = df_tensor_dim(decoded, 2);
    int64_t W = df_tensor_dim(decoded, 3);
    float *img = malloc((size_t)nd * sizeof *img);
    uint8_t *rgb = malloc((size_t)nd);
    float *rgb_f = malloc((size_t)nd * sizeof *rgb_f);
    assert_int_equal(df_vae_postprocess_f32(d, B, 3, H, W, img), DF_OK);
    golden_compare(&g, "image", img, nd);
    assert_int_equal(df_vae_postprocess_rgb8(d, B, 3, H, W, rgb), DF_OK);
    for (int64_t i = 0; i < nd; i++)
        rgb_f[i] = rgb[i];
    golden_compare(&g, "image_uint8", rgb_f, nd);

    free(img);
    free(rgb);
    free(rgb_f);
    free(d);
    free(s);
    free(lat);
    free(lat64);
    df_vae_free(vae);
    df_ctx_free(ctx);
    golden_close(&g);
}

static void test_golden_flux(void **state)
{
    (void)state;
    run_golden("vae-decode-flux", true);
}

static void test_golden_sd3(void **state)
{
    (void)state;
    run_golden("vae-decode-sd3", false);
}

/* --- latent layout ----------------------------------------------------------------------- */

static void test_unpack_follows_flux_layout(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    enum { B = 2, C = 3, h = 4, w = 6, S = (h / 2) * (w / 2) };
    float packed[B * S * 4 * C];
    for (int i = 0; i < B * S * 4 * C; i++)
        packed[i] = (float)i;
    df_tensor *p = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, 4 * C), packed);
    df_tensor *z;
    assert_int_equal(df_vae_unpack_latents(ctx, p, h, w, &z), DF_OK);
    assert_int_equal(df_tensor_dim(z, 1), C);
    float *got = read_f32(ctx, z);
    /* token (y, x) = y * (w/2) + x holds channel c*4 + dy*2 + dx of pixel (2y+dy, 2x+dx) */
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int yy = 0; yy < h; yy++)
                for (int xx = 0; xx < w; xx++) {
                    int tok = (yy / 2) * (w / 2) + xx / 2;
                    int ch = c * 4 + (yy % 2) * 2 + xx % 2;
                    float want = packed[(b * S + tok) * 4 * C + ch];
                    assert_float_equal(got[((b * C + c) * h + yy) * w + xx], want, 0);
                }
    df_tensor *back;
    assert_int_equal(df_vae_pack_latents(ctx, z, &back), DF_OK);
    float *round = read_f32(ctx, back);
    assert_memory_equal(round, packed, sizeof packed);
    free(round);
    free(got);
    df_ctx_free(ctx);
}

static void test_unpack_rejects_bad_shapes(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    float data[1 * 6 * 8] = {0};
    df_tensor *p = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 6, 8), data);
    df_tensor *z = (df_tensor *)1;
    assert_int_equal(df_vae_unpack_latents(ctx, p, 4, 4, &z), DF_E_SHAPE); /* 4 tokens */
    assert_null(z);
    assert_int_equal(df_vae_unpack_latents(ctx, p, 3, 8, &z), DF_E_SHAPE); /* odd */
    assert_non_null(strstr(df_error_message(), "unpack"));
    assert_int_equal(df_vae_unpack_latents(ctx, p, 4, 6, &z), DF_OK);
    df_ctx_free(ctx);
}

/* --- post-processing --------------------------------------------------------------------- */

static void test_postprocess_layout_clamp_and_rounding(void **state)
{
    (void)state;
    /* [1, 3, 1, 2]: channel-major in, pixel-major out */
    const float dec[6] = {-3.0f, 0.0f, 3.0f, 0.5f, -0.5f, NAN};
    float img[6];
    uint8_t rgb[6];
    assert_int_equal(df_vae_postprocess_f32(dec, 1, 3, 1, 2, img), DF_OK);
    assert_int_equal(df_vae_postprocess_rgb8(dec, 1, 3, 1, 2, rgb), DF_OK);
    /* pixel 0 = (c0, c1, c2) = (-3, 3, -0.5); pixel 1 = (0, 0.5, NaN) */
    assert_float_equal(img[0], 0.0f, 0);
    assert_float_equal(img[1], 1.0f, 0);
    assert_float_equal(img[2], 0.25f, 0);
    assert_float_equal(img[3], 0.5f, 0);
    assert_float_equal(img[4], 0.75f, 0);
    assert_true(isnan(img[5]));
    const uint8_t want[6] = {0, 255, 64, 128, 191, 0}; /* 63.75, 127.5 (tie: even), 191.25 */
    assert_memory_equal(rgb, want, sizeof want);

    /* A tie that numpy rounds down (to even): image * 255 == 128.5 exactly in float32.
     * Images in [0.5, 1) are multiples of 2^-24; x = 2 * (image - 0.5) is exact. */
    float x = 0;
    bool found = false;
    for (int32_t k = 8454000; k < 8455000 && !found; k++) {
        float v = ldexpf((float)k, -24);
        found = v * 255.0f == 128.5f;
        x = (v - 0.5f) * 2.0f;
    }
    assert_true(found);
    assert_int_equal(df_vae_postprocess_rgb8(&x, 1, 1, 1, 1, rgb), DF_OK);
    assert_int_equal(rgb[0], 128); /* half away from zero would give 129 */

    assert_int_equal(df_vae_postprocess_f32(NULL, 1, 3, 1, 1, img), DF_E_ARG);
    assert_int_equal(df_vae_postprocess_rgb8(dec, 0, 3, 1, 1, rgb), DF_E_ARG);
}

/* --- small random models ----------------------------------------------------------------- */

typedef struct tiny_opts {
    const char *config_override; /* whole config.json text, or NULL for the default */
    const char *skip;            /* a tensor left out of the file, or NULL */
    const char *extra;           /* a tensor added to the file, or NULL */
    bool encoder;                /* add a few encoder.* / quant_conv.* tensors */
    bool no_attention;           /* leave the mid-block attention out */
    float residual_scale;        /* scales conv2 of every ResNet; 0 = 1 */
    bool bf16;                   /* store the weights as bf16 */
    bool bf16_values;            /* store f32 weights holding bf16-rounded values */
} tiny_opts;

static const int64_t tiny_blocks[3] = {8, 16, 16};
#define TINY_LATENT 4
#define TINY_GROUPS 4

typedef struct writer {
    df_st_writer *w;
    const tiny_opts *o;
    uint64_t rng;
} writer;

static float uniform(writer *wr) /* [-1, 1) */
{
    wr->rng = wr->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((wr->rng >> 40) * (1.0 / (1 << 23)) - 1.0);
}

static void put(writer *wr, const char *name, const int64_t *shape, int ndim, float scale,
                float offset)
{
    if (wr->o->skip && strcmp(name, wr->o->skip) == 0)
        return;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++) {
        v[i] = offset + scale * uniform(wr);
        if (wr->o->bf16_values)
            v[i] = df_bf16_to_f32(df_f32_to_bf16(v[i]));
    }
    df_dtype dtype = wr->o->bf16 ? DF_DTYPE_BF16 : DF_DTYPE_F32;
    assert_int_equal(df_st_writer_add_f32(wr->w, name, dtype, shape, ndim, v), DF_OK);
    free(v);
}

/* Uniform weights of unit gain (variance 1 / fan_in), times `gain`. */
static void put_conv_gain(writer *wr, const char *name, int64_t o, int64_t i, int64_t k, float gain)
{
    char full[256];
    snprintf(full, sizeof full, "%s.weight", name);
    put(wr, full, (int64_t[]){o, i, k, k}, 4, gain * sqrtf(3.0f / (float)(i * k * k)), 0);
    snprintf(full, sizeof full, "%s.bias", name);
    put(wr, full, (int64_t[]){o}, 1, 0.1f, 0);
}

static void put_conv(writer *wr, const char *name, int64_t o, int64_t i, int64_t k)
{
    put_conv_gain(wr, name, o, i, k, 1.0f);
}

static void put_norm(writer *wr, const char *name, int64_t c)
{
    char full[256];
    int len = snprintf(full, sizeof full, "%s.weight", name);
    assert_true(len > 0 && len < (int)sizeof full);
    put(wr, full, (int64_t[]){c}, 1, 0.2f, 1.0f);
    len = snprintf(full, sizeof full, "%s.bias", name);
    assert_true(len > 0 && len < (int)sizeof full);
    put(wr, full, (int64_t[]){c}, 1, 0.2f, 0);
}

static void put_linear(writer *wr, const char *name, int64_t c)
{
    char full[256];
    snprintf(full, sizeof full, "%s.weight", name);
    put(wr, full, (int64_t[]){c, c}, 2, sqrtf(3.0f / (float)c), 0);
    snprintf(full, sizeof full, "%s.bias", name);
    put(wr, full, (int64_t[]){c}, 1, 0.1f, 0);
}

static void put_resnet(writer *wr, const char *p, int64_t in, int64_t out)
{
    char n[256];
    snprintf(n, sizeof n, "%s.norm1", p);
    put_norm(wr, n, in);
    snprintf(n, sizeof n, "%s.conv1", p);
    put_conv(wr, n, out, in, 3);
    snprintf(n, sizeof n, "%s.norm2", p);
    put_norm(wr, n, out);
    snprintf(n, sizeof n, "%s.conv2", p);
    put_conv_gain(wr, n, out, out, 3, wr->o->residual_scale > 0 ? wr->o->residual_scale : 1);
    if (in != out) {
        snprintf(n, sizeof n, "%s.conv_shortcut", p);
        put_conv(wr, n, out, in, 1);
    }
}

static const char *tiny_config =
    "{\"_class_name\": \"AutoencoderKL\", \"act_fn\": \"silu\", \"block_out_channels\": "
    "[8, 16, 16], \"in_channels\": 3, \"out_channels\": 3, \"latent_channels\": 4, "
    "\"layers_per_block\": 1, \"norm_num_groups\": 4, \"up_block_types\": "
    "[\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"], "
    "\"scaling_factor\": 0.5, \"shift_factor\": null, \"use_quant_conv\": false, "
    "\"use_post_quant_conv\": false, \"mid_block_add_attention\": true, "
    "\"force_upcast\": true}";

/* Writes a 3-block decoder (scale factor 4) into DF_TEST_TMP/<name>; returns the folder. */
static const char *write_tiny(const char *name, const tiny_opts *o)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DF_TEST_TMP, name);
    mkdir(DF_TEST_TMP, 0755);
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(o->config_override ? o->config_override : tiny_config, f);
    fclose(f);

    writer wr = {.o = o, .rng = 12345};
    assert_int_equal(df_st_writer_create(&wr.w), DF_OK);
    int64_t top = tiny_blocks[2];
    put_conv(&wr, "decoder.conv_in", top, TINY_LATENT, 3);
    put_resnet(&wr, "decoder.mid_block.resnets.0", top, top);
    if (!o->no_attention) {
        put_norm(&wr, "decoder.mid_block.attentions.0.group_norm", top);
        put_linear(&wr, "decoder.mid_block.attentions.0.to_q", top);
        put_linear(&wr, "decoder.mid_block.attentions.0.to_k", top);
        put_linear(&wr, "decoder.mid_block.attentions.0.to_v", top);
        put_linear(&wr, "decoder.mid_block.attentions.0.to_out.0", top);
    }
    put_resnet(&wr, "decoder.mid_block.resnets.1", top, top);
    int64_t prev = top;
    for (int b = 0; b < 3; b++) {
        int64_t out = tiny_blocks[2 - b];
        char n[256];
        for (int j = 0; j < 2; j++) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", b, j);
            put_resnet(&wr, n, j == 0 ? prev : out, out);
        }
        if (b < 2) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            put_conv(&wr, n, out, out, 3);
        }
        prev = out;
    }
    put_norm(&wr, "decoder.conv_norm_out", tiny_blocks[0]);
    put_conv(&wr, "decoder.conv_out", 3, tiny_blocks[0], 3);
    if (o->encoder) {
        put_conv(&wr, "encoder.conv_in", tiny_blocks[0], 3, 3);
        put_conv(&wr, "quant_conv", 2 * TINY_LATENT, 2 * TINY_LATENT, 1);
    }
    if (o->extra)
        put(&wr, o->extra, (int64_t[]){4}, 1, 1, 0);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_int_equal(df_st_writer_finish(wr.w, path), DF_OK);
    df_st_writer_free(wr.w);
    return dir;
}

static df_tensor *random_latents(df_ctx *ctx, int64_t h, int64_t w, float **host)
{
    int64_t n = TINY_LATENT * h * w;
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    writer wr = {.rng = 777};
    for (int64_t i = 0; i < n; i++)
        v[i] = uniform(&wr);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, TINY_LATENT, h, w), v);
    if (host)
        *host = v;
    else
        free(v);
    return t;
}

/* --- tiled decoding ---------------------------------------------------------------------- */

/* Blend weight of the tile starting at `start` (length len) of an axis of `n` pixels cut
 * on `stride` with overlap e: ramps (i + 0.5) / e up where the previous tile overlaps and
 * down where the next one does. */
static double axis_weight(int64_t p, int64_t start, int64_t len, int64_t n, int64_t e)
{
    double wgt = 1;
    if (start > 0 && p < start + e)
        wgt *= ((double)(p - start) + 0.5) / (double)e;
    if (start + len < n && p >= start + len - e)
        wgt *= 1.0 - ((double)(p - (start + len - e)) + 0.5) / (double)e;
    return wgt;
}

static double rel_l2(const float *got, const float *want, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        r += (double)want[i] * want[i];
    }
    return sqrt(d / r);
}

/* The tiled decode is exactly "each tile decoded alone, then blended": checked against
 * tiles decoded one by one here and blended on the host with explicit weights. */
static void test_tiled_matches_tiles_blended_on_host(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    const char *dir = write_tiny("vae_tiny_tiled", &(tiny_opts){0});
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_OK);
    const int64_t h = 22, w = 17, T = 8, O = 2, f = 4, stride = T - O;
    df_tensor *z = random_latents(ctx, h, w, NULL);

    df_tensor *tiled;
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, T, O, &tiled), DF_OK);
    assert_int_equal(df_tensor_dim(tiled, 2), h * f);
    assert_int_equal(df_tensor_dim(tiled, 3), w * f);
    float *got = read_f32(ctx, tiled);

    int64_t H = h * f, W = w * f, npix = H * W;
    double *acc = calloc((size_t)(3 * npix), sizeof *acc);
    int tiles = 0;
    for (int64_t y0 = 0; y0 == 0 || y0 + O < h; y0 += stride) {
        int64_t y1 = y0 + T < h ? y0 + T : h;
        for (int64_t x0 = 0; x0 == 0 || x0 + O < w; x0 += stride) {
            int64_t x1 = x0 + T < w ? x0 + T : w;
            df_scope mark = df_scope_begin(ctx);
            df_tensor *part = df_slice(ctx, df_slice(ctx, z, 2, y0, y1), 3, x0, x1), *dec;
            assert_int_equal(df_vae_decode(ctx, vae, part, &dec), DF_OK);
            float *t = read_f32(ctx, dec);
            int64_t th = (y1 - y0) * f, tw = (x1 - x0) * f;
            for (int c = 0; c < 3; c++)
                for (int64_t yy = 0; yy < th; yy++)
                    for (int64_t xx = 0; xx < tw; xx++) {
                        int64_t py = y0 * f + yy, px = x0 * f + xx;
                        double wgt = axis_weight(py, y0 * f, th, H, O * f) *
                                     axis_weight(px, x0 * f, tw, W, O * f);
                        acc[c * npix + py * W + px] += wgt * t[(c * th + yy) * tw + xx];
                    }
            free(t);
            df_scope_end(ctx, mark, NULL);
            tiles++;
        }
    }
    assert_int_equal(tiles, 4 * 3); /* rows at 0, 6, 12, 18 (the last 4 high); columns at
                                       0, 6, 12 (the last 5 wide) */
    double err = 0;
    for (int64_t i = 0; i < 3 * npix; i++)
        err = fmax(err, fabs(got[i] - acc[i]));
    printf("  tiled vs tiles blended on the host: max_abs %.3g\n", err);
    /* The same f32 tile outputs blended in f32 vs f64: a few ulps of values of order 1. */
    assert_true(err < 1e-5);

    free(acc);
    free(got);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

static const char *tame_config =
    "{\"_class_name\": \"AutoencoderKL\", \"block_out_channels\": [8, 16, 16], "
    "\"latent_channels\": 4, \"layers_per_block\": 1, \"norm_num_groups\": 4, "
    "\"use_post_quant_conv\": false, \"mid_block_add_attention\": false}";

/*
 * Tiled against whole. Tiling is an approximation by design: a tile's GroupNorms see
 * that tile's statistics, and its convolutions see zero padding at tile edges inside the
 * image. Both effects are confined to what the network makes non-local, so the test model
 * is one where that is modest, as in trained VAEs: no mid-block attention (global by
 * construction) and ResNet residual branches at a tenth of unit gain. The bound (rel_l2
 * 0.15, max_abs 1) sits a few times above what this model shows (see the printout);
 * a tile decoded from the wrong latents, put at the wrong place or not blended gives a
 * rel_l2 of order 1 (two unrelated images differ by about sqrt(2)).
 */
static void test_tiled_close_to_untiled(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    tiny_opts o = {.config_override = tame_config, .no_attention = true, .residual_scale = 0.1f};
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, write_tiny("vae_tiny_tame", &o), &vae), DF_OK);
    df_tensor *z = random_latents(ctx, 48, 40, NULL), *tiled, *whole;
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, 24, 6, &tiled), DF_OK);
    assert_int_equal(df_vae_decode(ctx, vae, z, &whole), DF_OK);
    float *got = read_f32(ctx, tiled), *want = read_f32(ctx, whole);
    int64_t n = df_tensor_numel(whole);
    double max_abs = 0;
    for (int64_t i = 0; i < n; i++)
        max_abs = fmax(max_abs, fabs((double)got[i] - want[i]));
    double rel = rel_l2(got, want, n);
    /* The whole image shifted by one latent (4 pixels): the size of a misplaced tile. */
    int64_t W = df_tensor_dim(whole, 3), rows = n / W;
    double d = 0, r = 0;
    for (int64_t y = 0; y < rows; y++)
        for (int64_t x = 0; x + 4 < W; x++) {
            double e = (double)want[y * W + x + 4] - want[y * W + x];
            d += e * e;
            r += (double)want[y * W + x] * want[y * W + x];
        }
    printf("  tiled vs whole: rel_l2 %.3g, max_abs %.3g; whole vs itself shifted by one "
           "latent: rel_l2 %.3g\n",
           rel, max_abs, sqrt(d / r));
    assert_true(rel < 0.15);
    assert_true(max_abs < 1.0);
    assert_true(sqrt(d / r) > 0.5); /* the bound does tell placements apart */
    free(got);
    free(want);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

static void test_tiled_single_tile_is_plain_decode(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    const char *dir = write_tiny("vae_tiny_single", &(tiny_opts){0});
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_OK);
    df_tensor *z = random_latents(ctx, 6, 5, NULL), *a, *b;
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, 0, 0, &a), DF_OK); /* default 64 */
    assert_int_equal(df_vae_decode(ctx, vae, z, &b), DF_OK);
    float *x = read_f32(ctx, a), *y = read_f32(ctx, b);
    assert_memory_equal(x, y, (size_t)df_tensor_numel(b) * sizeof *x);
    free(x);
    free(y);

    df_tensor *out = (df_tensor *)1;
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, 4, 3, &out), DF_E_ARG);
    assert_null(out);
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, -1, 0, &out), DF_E_ARG);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* --- choosing whole or tiled by the memory available ------------------------------------ */

static char logged[512];

static void keep_note(int level, const char *line, void *user)
{
    (void)user;
    if (level <= 1 && strstr(line, "decode:"))
        snprintf(logged, sizeof logged, "%s", line);
}

/* DIFFUSE_MEMORY_LIMIT fakes the memory available: with 1 byte the decode tiles by itself
 * with the smallest tiles (16 latents overlapping by 2) and says so in a note, giving
 * exactly df_vae_decode_tiled's result; with a terabyte it decodes whole, exactly as
 * df_vae_decode does. */
static void test_auto_tiles_when_memory_is_short(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, write_tiny("vae_tiny_auto", &(tiny_opts){0}), &vae), DF_OK);
    df_tensor *z = random_latents(ctx, 40, 36, NULL), *a, *b;
    int64_t n = 3 * 40 * 4 * 36 * 4;
    df_set_log_fn(keep_note, NULL);

    setenv("DIFFUSE_MEMORY_LIMIT", "1", 1);
    assert_int_equal(df_memory_available(), 0);
    logged[0] = 0;
    assert_int_equal(df_vae_decode_auto(ctx, vae, z, false, &a), DF_OK);
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, 16, 2, &b), DF_OK);
    float *x = read_f32(ctx, a), *y = read_f32(ctx, b);
    assert_memory_equal(x, y, (size_t)n * sizeof *x);
    assert_non_null(strstr(logged, "tiled (16-latent tiles)"));
    assert_non_null(strstr(logged, "0.00 GiB available"));
    free(x);
    free(y);

    setenv("DIFFUSE_MEMORY_LIMIT", "1T", 1);
    assert_true(df_memory_available() > ((int64_t)1 << 40) - ((int64_t)1 << 34));
    logged[0] = 0;
    assert_int_equal(df_vae_decode_auto(ctx, vae, z, false, &a), DF_OK);
    assert_int_equal(df_vae_decode(ctx, vae, z, &b), DF_OK);
    x = read_f32(ctx, a);
    y = read_f32(ctx, b);
    assert_memory_equal(x, y, (size_t)n * sizeof *x);
    assert_string_equal(logged, ""); /* whole: only a detail line */
    free(x);
    free(y);

    setenv("DIFFUSE_MEMORY_LIMIT", "12Q", 1);
    assert_int_equal(df_memory_available(), -1); /* malformed: unknown, so whole */
    unsetenv("DIFFUSE_MEMORY_LIMIT");
    df_set_log_fn(NULL, NULL);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* The estimate the choice rests on covers what the decode really holds at once (device
 * bytes live at the peak), without overstating it several times over. */
static void test_decode_bytes_cover_the_peak(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, write_tiny("vae_tiny_need", &(tiny_opts){0}), &vae), DF_OK);
    df_tensor *z = random_latents(ctx, 48, 40, NULL), *img;
    assert_int_equal(df_sync(ctx), DF_OK);
    df_stats_reset(ctx);
    assert_int_equal(df_vae_decode(ctx, vae, z, &img), DF_OK);
    df_stats st;
    df_ctx_stats(ctx, &st);
    int64_t need = df_vae_decode_bytes(vae, 1, 48, 40);
    printf("  decode: peak %lld bytes live, estimate %lld\n", (long long)st.peak_bytes,
           (long long)need);
    assert_true(st.peak_bytes <= need);
    assert_true(st.peak_bytes * 2 >= need);
    assert_true(df_vae_decode_bytes(vae, 2, 48, 40) > need); /* grows with the batch */
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* bf16 checkpoints (FLUX.1's VAE is one) stay bf16 in memory and are upcast exactly: the
 * result equals that of an f32 checkpoint holding the same bf16-rounded values. */
static void test_bf16_weights_decode_as_their_f32_values(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *a, *b;
    assert_int_equal(df_vae_load(ctx, write_tiny("vae_tiny_bf16", &(tiny_opts){.bf16 = true}), &a),
                     DF_OK);
    assert_int_equal(
        df_vae_load(ctx, write_tiny("vae_tiny_bf16v", &(tiny_opts){.bf16_values = true}), &b),
        DF_OK);
    df_tensor *z = random_latents(ctx, 6, 5, NULL), *da, *db;
    assert_int_equal(df_vae_decode(ctx, a, z, &da), DF_OK);
    assert_int_equal(df_vae_decode(ctx, b, z, &db), DF_OK);
    float *x = read_f32(ctx, da), *y = read_f32(ctx, db);
    double rel = rel_l2(x, y, df_tensor_numel(db));
    printf("  bf16 weights vs their f32 values: rel_l2 %.3g\n", rel);
    assert_true(rel < 1e-5); /* f32 rounding of two computations, not bf16's 4e-3 */
    free(x);
    free(y);
    df_vae_free(a);
    df_vae_free(b);
    df_ctx_free(ctx);
}

/* --- load errors ------------------------------------------------------------------------- */

static df_status try_load(const char *name, const tiny_opts *o)
{
    df_ctx *ctx = new_ctx();
    df_vae *vae = (df_vae *)1;
    df_status s = df_vae_load(ctx, write_tiny(name, o), &vae);
    if (s != DF_OK)
        assert_null(vae);
    df_vae_free(vae == (df_vae *)1 ? NULL : vae);
    df_ctx_free(ctx);
    return s;
}

static void test_encoder_tensors_are_skipped(void **state)
{
    (void)state;
    assert_int_equal(try_load("vae_tiny_enc", &(tiny_opts){.encoder = true}), DF_OK);
}

static void test_unexpected_decoder_tensor_is_a_warning(void **state)
{
    (void)state;
    tiny_opts o = {.extra = "decoder.up_blocks.0.resnets.2.norm1.bias"};
    assert_int_equal(try_load("vae_tiny_extra", &o), DF_OK); /* diffusers warns and loads */
    assert_non_null(strstr(df_ws_last_warning(), "'decoder.up_blocks.0.resnets.2.norm1.bias'"));
}

static void test_missing_tensor_is_named(void **state)
{
    (void)state;
    tiny_opts o = {.skip = "decoder.mid_block.attentions.0.to_v.weight"};
    assert_int_equal(try_load("vae_tiny_missing", &o), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "missing tensor"));
    assert_non_null(strstr(df_error_message(), "decoder.mid_block.attentions.0.to_v.weight"));
}

static void test_empty_blocks_are_rejected(void **state)
{
    (void)state;
    tiny_opts o = {.config_override = "{\"_class_name\": \"AutoencoderKL\", "
                                      "\"block_out_channels\": [], \"latent_channels\": 4, "
                                      "\"norm_num_groups\": 4, \"up_block_types\": []}"};
    assert_int_equal(try_load("vae_tiny_noblocks", &o), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "block_out_channels is empty"));
}

static void test_groups_must_divide_channels(void **state)
{
    (void)state;
    tiny_opts o = {.config_override = "{\"_class_name\": \"AutoencoderKL\", "
                                      "\"block_out_channels\": [8, 16, 16], "
                                      "\"latent_channels\": 4, \"norm_num_groups\": 3, "
                                      "\"layers_per_block\": 1, \"use_post_quant_conv\": false}"};
    assert_int_equal(try_load("vae_tiny_groups", &o), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "norm_num_groups 3 does not divide"));
}

static void test_other_classes_are_unsupported(void **state)
{
    (void)state;
    tiny_opts o = {.config_override = "{\"_class_name\": \"AutoencoderTiny\", "
                                      "\"block_out_channels\": [8, 16, 16]}"};
    assert_int_equal(try_load("vae_tiny_class", &o), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "AutoencoderTiny"));
    tiny_opts t = {.config_override = "{\"block_out_channels\": [8, 16, 16], "
                                      "\"norm_num_groups\": 4, "
                                      "\"up_block_types\": [\"UpDecoderBlock2D\", "
                                      "\"AttnUpDecoderBlock2D\", \"UpDecoderBlock2D\"]}"};
    assert_int_equal(try_load("vae_tiny_blocktype", &t), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "AttnUpDecoderBlock2D"));
}

/* The config asks for post_quant_conv (the default), which the file lacks. */
static void test_post_quant_conv_defaults_on(void **state)
{
    (void)state;
    tiny_opts o = {.config_override = "{\"block_out_channels\": [8, 16, 16], "
                                      "\"latent_channels\": 4, \"norm_num_groups\": 4}"};
    assert_int_equal(try_load("vae_tiny_pqc", &o), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "post_quant_conv.weight"));
}

static void test_decode_rejects_wrong_channels(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, write_tiny("vae_tiny_ch", &(tiny_opts){0}), &vae), DF_OK);
    float v[3 * 4 * 4] = {0};
    df_tensor *z = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 3, 4, 4), v), *out;
    assert_int_equal(df_vae_decode(ctx, vae, z, &out), DF_E_SHAPE);
    assert_null(out);
    assert_non_null(strstr(df_error_message(), "[B, 4, h, w]"));
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* Every allocation of a load fails in turn: DF_E_OOM each time, and nothing leaks. */
static void test_load_out_of_memory_sweep(void **state)
{
    (void)state;
    const char *dir = write_tiny("vae_tiny_oom", &(tiny_opts){.encoder = true});
    df_ctx *ctx = new_ctx();
    df_vae *vae = NULL;
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_OK); /* warm: the context's own tables */
    df_vae_free(vae);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        vae = NULL;
        df_alloc_fail_at(nth);
        df_status s = df_vae_load(ctx, dir, &vae);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            df_vae_free(vae);
            break;
        }
        failures++;
        if (s != DF_E_OOM)
            fail_msg("allocation %lld: %s instead of DF_E_OOM: %s", (long long)nth,
                     df_status_name(s), df_error_message());
        assert_null(vae);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(failures > 3);
    assert_int_equal(df_alloc_live(), live);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_flux),
        cmocka_unit_test(test_golden_sd3),
        cmocka_unit_test(test_unpack_follows_flux_layout),
        cmocka_unit_test(test_unpack_rejects_bad_shapes),
        cmocka_unit_test(test_postprocess_layout_clamp_and_rounding),
        cmocka_unit_test(test_tiled_matches_tiles_blended_on_host),
        cmocka_unit_test(test_tiled_close_to_untiled),
        cmocka_unit_test(test_tiled_single_tile_is_plain_decode),
        cmocka_unit_test(test_auto_tiles_when_memory_is_short),
        cmocka_unit_test(test_decode_bytes_cover_the_peak),
        cmocka_unit_test(test_bf16_weights_decode_as_their_f32_values),
        cmocka_unit_test(test_encoder_tensors_are_skipped),
        cmocka_unit_test(test_unexpected_decoder_tensor_is_a_warning),
        cmocka_unit_test(test_missing_tensor_is_named),
        cmocka_unit_test(test_empty_blocks_are_rejected),
        cmocka_unit_test(test_groups_must_divide_channels),
        cmocka_unit_test(test_other_classes_are_unsupported),
        cmocka_unit_test(test_post_quant_conv_defaults_on),
        cmocka_unit_test(test_decode_rejects_wrong_channels),
        cmocka_unit_test(test_load_out_of_memory_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
