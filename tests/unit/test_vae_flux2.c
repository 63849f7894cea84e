/*
 * AutoencoderKLFlux2 tests: FLUX.2's latent layouts (tokens scattered by position ids,
 * 2x2 unpatchifying), the batch-norm de-normalisation, tiled decoding, and the load errors.
 *
 * The model is the vae-decode-flux2 golden case's VAE (diffusers' own AutoencoderKLFlux2
 * with small random weights); variants of it (another config, a tensor left out) are
 * written to DF_TEST_TMP by copying its tensors. Expected values never come from the code
 * under test: layouts are checked against index formulas, the de-normalisation against the
 * statistics read straight from the file, tiling against the untiled decode.
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

#define GOLDEN_VAE DF_GOLDEN_DIR "/vae-decode-flux2/vae"
#define LATENT     32 /* the golden VAE's latent channels */

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    return ctx;
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

/* Values i * 0.5 - 7 (distinct, exact in f32) of an [d0, d1, d2(, d3)] tensor. */
static df_tensor *counting(df_ctx *ctx, const int64_t *shape, int ndim, float **host)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = (float)i * 0.5f - 7.0f;
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, ndim, v);
    assert_non_null(t);
    *host = v;
    return t;
}

/* --- unpacking by position ids ----------------------------------------------------------- */

/* Raster ids [0, h, w, 0]: token y * W + x lands at (y, x), channels kept. */
static void test_unpack_with_raster_ids(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    enum { B = 2, H = 3, W = 4, S = H * W, C = 8 };
    int64_t ids[B * S * 4];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            int64_t *id = ids + (b * S + i) * 4;
            id[0] = 0, id[1] = i / W, id[2] = i % W, id[3] = 0;
        }
    float *packed;
    df_tensor *p = counting(ctx, DF_SHAPE(B, S, C), &packed), *z;
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, p, ids, &z), DF_OK);
    assert_int_equal(df_tensor_ndim(z), 4);
    assert_int_equal(df_tensor_dim(z, 1), C);
    assert_int_equal(df_tensor_dim(z, 2), H);
    assert_int_equal(df_tensor_dim(z, 3), W);
    float *got = read_f32(ctx, z);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++)
                    assert_float_equal(got[((b * C + c) * H + y) * W + x],
                                       packed[(b * S + y * W + x) * C + c], 0);
    free(got);
    free(packed);
    df_ctx_free(ctx);
}

/* Tokens in another order land where their ids say; grid cells no token names are 0. */
static void test_unpack_scatters_shuffled_ids_and_zero_fills(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    enum { B = 2, S = 5, C = 3, H = 2, W = 3 }; /* 5 tokens on a 2 x 3 grid: one hole */
    /* sample 0: positions (1,2) (0,0) (1,0) (0,1) (0,2), hole at (1,1);
     * sample 1: positions (0,2) (1,1) (0,0) (1,2) (1,0), hole at (0,1). */
    const int pos[B][S][2] = {{{1, 2}, {0, 0}, {1, 0}, {0, 1}, {0, 2}},
                              {{0, 2}, {1, 1}, {0, 0}, {1, 2}, {1, 0}}};
    int64_t ids[B * S * 4];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            int64_t *id = ids + (b * S + i) * 4;
            id[0] = 0, id[1] = pos[b][i][0], id[2] = pos[b][i][1], id[3] = 0;
        }
    float *packed;
    df_tensor *p = counting(ctx, DF_SHAPE(B, S, C), &packed), *z;
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, p, ids, &z), DF_OK);
    float *got = read_f32(ctx, z);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int y = 0; y < H; y++)
                for (int x = 0; x < W; x++) {
                    float want = 0.0f;
                    for (int i = 0; i < S; i++)
                        if (pos[b][i][0] == y && pos[b][i][1] == x)
                            want = packed[(b * S + i) * C + c];
                    assert_float_equal(got[((b * C + c) * H + y) * W + x], want, 0);
                }
    free(got);
    free(packed);
    df_ctx_free(ctx);
}

static void test_unpack_rejects_bad_ids(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    float v[2 * 2 * 4] = {0};
    df_tensor *p = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 2, 4), v), *z;
    /* two tokens of sample 1 at (0, 1) */
    int64_t dup[] = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0};
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, p, dup, &z), DF_E_ARG);
    assert_null(z);
    assert_non_null(strstr(df_error_message(), "share position"));
    /* sample 0 spans 1 x 2, sample 1 spans 2 x 1 */
    int64_t sizes[] = {0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0};
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, p, sizes, &z), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "grid"));
    int64_t neg[] = {0, -1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0};
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, p, neg, &z), DF_E_ARG);
    df_tensor *flat = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(16), v);
    assert_int_equal(df_vae_unpack_latents_with_ids(ctx, flat, dup, &z), DF_E_SHAPE);
    df_ctx_free(ctx);
}

/* --- unpatchifying ----------------------------------------------------------------------- */

/* Channel c*4 + dy*2 + dx of (y, x) lands at (c, 2y + dy, 2x + dx); patchify inverts it. */
static void test_unpatchify_layout_and_round_trip(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    enum { B = 2, C = 3, h = 2, w = 3 };
    float *in;
    df_tensor *t = counting(ctx, DF_SHAPE(B, 4 * C, h, w), &in), *z, *back;
    assert_int_equal(df_vae_unpatchify_latents(ctx, t, &z), DF_OK);
    assert_int_equal(df_tensor_dim(z, 1), C);
    assert_int_equal(df_tensor_dim(z, 2), 2 * h);
    assert_int_equal(df_tensor_dim(z, 3), 2 * w);
    float *got = read_f32(ctx, z);
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int yy = 0; yy < 2 * h; yy++)
                for (int xx = 0; xx < 2 * w; xx++) {
                    int ch = c * 4 + (yy % 2) * 2 + xx % 2;
                    float want = in[((b * 4 * C + ch) * h + yy / 2) * w + xx / 2];
                    assert_float_equal(got[((b * C + c) * 2 * h + yy) * 2 * w + xx], want, 0);
                }
    assert_int_equal(df_vae_patchify_latents(ctx, z, &back), DF_OK);
    float *round = read_f32(ctx, back);
    assert_memory_equal(round, in, sizeof(float) * B * 4 * C * h * w);

    float v[6 * 2 * 2] = {0};
    df_tensor *six = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 6, 2, 2), v);
    assert_int_equal(df_vae_unpatchify_latents(ctx, six, &z), DF_E_SHAPE); /* 6 % 4 */
    df_tensor *odd = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 2, 3, 4), v);
    assert_int_equal(df_vae_patchify_latents(ctx, odd, &z), DF_E_SHAPE);
    free(round);
    free(got);
    free(in);
    df_ctx_free(ctx);
}

/* --- the golden VAE and variants of it --------------------------------------------------- */

/* Writes DF_TEST_TMP/<name> with `config` and the golden VAE's tensors but `skip`. */
static const char *write_variant(const char *name, const char *config, const char *skip)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", DF_TEST_TMP, name);
    mkdir(DF_TEST_TMP, 0755);
    mkdir(dir, 0755);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(config, f);
    fclose(f);

    df_safetensors *st;
    assert_int_equal(df_safetensors_open(GOLDEN_VAE "/diffusion_pytorch_model.safetensors", &st),
                     DF_OK);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    for (int64_t i = 0; i < df_safetensors_count(st); i++) {
        df_tensor_info info;
        assert_int_equal(df_safetensors_at(st, i, &info), DF_OK);
        if (skip && strcmp(info.name, skip) == 0)
            continue;
        assert_int_equal(
            df_st_writer_add(w, info.name, info.dtype, info.shape, info.ndim, info.data), DF_OK);
    }
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    df_safetensors_free(st);
    return dir;
}

/* The golden config with `edit` spliced in after the opening brace. */
static const char *config_with(const char *edit)
{
    static char text[4096];
    snprintf(text, sizeof text,
             "{%s\"_class_name\": \"AutoencoderKLFlux2\", \"act_fn\": \"silu\", "
             "\"block_out_channels\": [8, 16, 16, 16], \"latent_channels\": 32, "
             "\"layers_per_block\": 1, \"norm_num_groups\": 4, \"out_channels\": 3, "
             "\"mid_block_add_attention\": true, \"use_post_quant_conv\": true, "
             "\"use_quant_conv\": true, \"force_upcast\": true}",
             edit);
    return text;
}

static void test_config_of_the_golden_vae(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, GOLDEN_VAE, &vae), DF_OK);
    const df_vae_info *c = df_vae_config(vae);
    assert_true(c->flux2);
    assert_int_equal(c->latent_channels, 32);
    assert_int_equal(c->bn_channels, 128);
    assert_float_equal(c->batch_norm_eps, 1e-4, 0);
    assert_int_equal(c->scale_factor, 8);
    assert_true(c->use_post_quant_conv);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* x * sqrt(running_var + eps) + running_mean per channel, the statistics read from the
 * file here, in double. */
static void test_denormalize_uses_the_bn_statistics(void **state)
{
    (void)state;
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(GOLDEN_VAE "/diffusion_pytorch_model.safetensors", &st),
                     DF_OK);
    double mean[128], var[128];
    assert_int_equal(df_safetensors_read(st, "bn.running_mean", DF_DTYPE_F64, mean, sizeof mean),
                     DF_OK);
    assert_int_equal(df_safetensors_read(st, "bn.running_var", DF_DTYPE_F64, var, sizeof var),
                     DF_OK);
    df_safetensors_free(st);

    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, GOLDEN_VAE, &vae), DF_OK);
    enum { B = 2, C = 128, h = 2, w = 3, HW = h * w };
    float *in;
    df_tensor *t = counting(ctx, DF_SHAPE(B, C, h, w), &in), *z;
    assert_int_equal(df_vae_bn_denormalize(ctx, vae, t, &z), DF_OK);
    float *got = read_f32(ctx, z);
    double max_rel = 0;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++)
            for (int p = 0; p < HW; p++) {
                int64_t i = ((int64_t)b * C + c) * HW + p;
                double want = in[i] * sqrt(var[c] + 1e-4) + mean[c];
                max_rel = fmax(max_rel, fabs(got[i] - want) / fmax(1.0, fabs(want)));
            }
    printf("  de-normalised vs the file's statistics: max rel error %.3g\n", max_rel);
    assert_true(max_rel < 1e-6);

    /* the shape, and the factors an AutoencoderKLFlux2 does not have */
    df_tensor *wrong = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 32, 2, 3), in);
    assert_int_equal(df_vae_bn_denormalize(ctx, vae, wrong, &z), DF_E_SHAPE);
    assert_non_null(strstr(df_error_message(), "[B, 128, h, w]"));
    assert_int_equal(df_vae_unscale(ctx, vae, wrong, &z), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "df_vae_bn_denormalize"));
    free(got);
    free(in);
    df_vae_free(vae);

    /* an AutoencoderKL has no statistics */
    assert_int_equal(df_vae_load(ctx, DF_GOLDEN_DIR "/vae-decode-flux/vae", &vae), DF_OK);
    assert_int_equal(df_vae_bn_denormalize(ctx, vae, t, &z), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "AutoencoderKLFlux2"));
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* Tiled decoding of FLUX.2 latents (tiles of 16 latents overlapping by 4, 2 x 2 tiles):
 * where only the first tile reaches, the image is that tile decoded alone; as a whole it
 * stays close to the untiled decode (the random mid-block attention and the GroupNorms
 * see one tile instead of the image, so not equal), far closer than a one-latent
 * misplacement would be. */
static void test_tiled_close_to_untiled(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae;
    assert_int_equal(df_vae_load(ctx, GOLDEN_VAE, &vae), DF_OK);
    const int64_t h = 28, w = 26, n = LATENT * h * w;
    float *v = malloc((size_t)n * sizeof *v);
    assert_non_null(v);
    df_rng rng;
    df_rng_init(&rng, 7);
    assert_int_equal(df_rng_randn_f32(&rng, v, n), DF_OK);
    df_tensor *z = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, LATENT, h, w), v);
    free(v);
    df_tensor *tiled, *whole;
    assert_int_equal(df_vae_decode_tiled(ctx, vae, z, 16, 4, &tiled), DF_OK);
    assert_int_equal(df_vae_decode(ctx, vae, z, &whole), DF_OK);
    assert_int_equal(df_tensor_dim(tiled, 2), 8 * h);
    assert_int_equal(df_tensor_dim(tiled, 3), 8 * w);
    float *got = read_f32(ctx, tiled), *want = read_f32(ctx, whole);
    int64_t m = df_tensor_numel(whole), W = 8 * w;
    double d = 0, r = 0, ds = 0;
    for (int64_t i = 0; i < m; i++) {
        d += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        r += (double)want[i] * want[i];
        if (i % W + 8 < W) /* the whole image shifted by one latent (8 pixels) */
            ds += ((double)want[i + 8] - want[i]) * ((double)want[i + 8] - want[i]);
    }
    printf("  tiled vs whole: rel_l2 %.3g; whole vs itself shifted by one latent: %.3g\n",
           sqrt(d / r), sqrt(ds / r));
    assert_true(sqrt(d / r) < 0.3);
    assert_true(sqrt(d / r) < 0.25 * sqrt(ds / r));

    df_tensor *first_tile = df_slice(ctx, df_slice(ctx, z, 2, 0, 16), 3, 0, 16), *alone;
    assert_int_equal(df_vae_decode(ctx, vae, first_tile, &alone), DF_OK);
    float *a = read_f32(ctx, alone); /* [1, 3, 128, 128] */
    double max_abs = 0;
    for (int64_t c = 0; c < 3; c++)
        for (int64_t y = 0; y < 96; y++) /* (16 - 4) * 8: before the blend */
            for (int64_t x = 0; x < 96; x++)
                max_abs = fmax(max_abs, fabs((double)got[(c * 8 * h + y) * W + x] -
                                             a[(c * 128 + y) * 128 + x]));
    printf("  first tile's own region vs the tile decoded alone: max_abs %.3g\n", max_abs);
    assert_true(max_abs < 1e-5);
    free(a);
    free(got);
    free(want);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

/* --- load errors ------------------------------------------------------------------------- */

static df_status try_load(const char *dir)
{
    df_ctx *ctx = new_ctx();
    df_vae *vae = (df_vae *)1;
    df_status s = df_vae_load(ctx, dir, &vae);
    if (s != DF_OK)
        assert_null(vae);
    else
        df_vae_free(vae);
    df_ctx_free(ctx);
    return s;
}

static void test_missing_bn_statistics_are_named(void **state)
{
    (void)state;
    const char *dir = write_variant("vae_flux2_no_var", config_with(""), "bn.running_var");
    assert_int_equal(try_load(dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "bn.running_var"));
    assert_non_null(strstr(df_error_message(), "vae_flux2_no_var"));
    assert_non_null(strstr(df_error_message(), "safetensors"));
    dir = write_variant("vae_flux2_no_mean", config_with(""), "bn.running_mean");
    assert_int_equal(try_load(dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "bn.running_mean"));
    /* the step counter is not needed */
    dir = write_variant("vae_flux2_no_count", config_with(""), "bn.num_batches_tracked");
    assert_int_equal(try_load(dir), DF_OK);
}

static void test_bad_configs_are_named(void **state)
{
    (void)state;
    const char *dir = write_variant("vae_flux2_patch", config_with("\"patch_size\": [1, 1], "),
                                    NULL);
    assert_int_equal(try_load(dir), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "patch_size"));
    assert_non_null(strstr(df_error_message(), "config.json"));

    dir = write_variant("vae_flux2_eps", config_with("\"batch_norm_eps\": -1, "), NULL);
    assert_int_equal(try_load(dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "batch_norm_eps"));

    dir = write_variant("vae_flux2_dec",
                        config_with("\"decoder_block_out_channels\": [8, 16, 16], "), NULL);
    assert_int_equal(try_load(dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "decoder_block_out_channels has 3 entries"));

    /* decoder_block_out_channels build the decoder: other widths do not fit the file */
    dir = write_variant("vae_flux2_dec32",
                        config_with("\"decoder_block_out_channels\": [8, 16, 16, 32], "), NULL);
    assert_int_equal(try_load(dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "decoder.conv_in.weight"));
    dir = write_variant("vae_flux2_dec_same",
                        config_with("\"decoder_block_out_channels\": [8, 16, 16, 16], "), NULL);
    assert_int_equal(try_load(dir), DF_OK);
}

/* Every allocation of a FLUX.2 load fails in turn: DF_E_OOM each time, and nothing leaks. */
static void test_load_out_of_memory_sweep(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae = NULL;
    assert_int_equal(df_vae_load(ctx, GOLDEN_VAE, &vae), DF_OK); /* warm the context */
    df_vae_free(vae);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        vae = NULL;
        df_alloc_fail_at(nth);
        df_status s = df_vae_load(ctx, GOLDEN_VAE, &vae);
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
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unpack_with_raster_ids),
        cmocka_unit_test(test_unpack_scatters_shuffled_ids_and_zero_fills),
        cmocka_unit_test(test_unpack_rejects_bad_ids),
        cmocka_unit_test(test_unpatchify_layout_and_round_trip),
        cmocka_unit_test(test_config_of_the_golden_vae),
        cmocka_unit_test(test_denormalize_uses_the_bn_statistics),
        cmocka_unit_test(test_tiled_close_to_untiled),
        cmocka_unit_test(test_missing_bn_statistics_are_named),
        cmocka_unit_test(test_bad_configs_are_named),
        cmocka_unit_test(test_load_out_of_memory_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
