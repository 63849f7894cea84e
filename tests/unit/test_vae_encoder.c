/*
 * Tests for the VAE encoder and its posterior (src/models/vae_encoder.c) beyond the
 * reference cases of tests/cases/vae-encode-*: inputs that do not fit are refused with a
 * message, an AutoencoderKLFlux2 encoder loads and patchifies + normalises (refused for an
 * AutoencoderKL and for odd sizes), the posterior's mode
 * is the mean and sample() continues the generator as torch does (one draw for the batch),
 * and scaling applies (x - shift) * scale. The tiled encoder refuses tiles that are not
 * whole latents, encodes an image that fits in one tile exactly as the plain encoder does,
 * and gives the plain encoder's shape otherwise (its values: vae-encode-flux-tiled).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/diffuse.h>

#define FLUX_VAE  DF_GOLDEN_DIR "/vae-decode-flux/vae"
#define FLUX2_VAE DF_GOLDEN_DIR "/vae-decode-flux2/vae"

static df_ctx *new_ctx(void)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    return ctx;
}

static void test_images_that_do_not_fit_are_refused(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae_encoder *e;
    assert_int_equal(df_vae_encoder_load(ctx, FLUX_VAE, &e), DF_OK);
    assert_int_equal(df_vae_encoder_config(e)->latent_channels, 16);
    df_tensor *odd = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 3, 60, 64));
    df_tensor *out = (df_tensor *)1;
    assert_int_equal(df_vae_encode(ctx, e, odd, &out), DF_E_SHAPE);
    assert_null(out);
    assert_non_null(strstr(df_error_message(), "multiples of 8"));
    df_tensor *grey = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 1, 64, 64));
    assert_int_equal(df_vae_encode(ctx, e, grey, &out), DF_E_SHAPE);
    df_tensor *ok = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(2, 3, 64, 64));
    assert_int_equal(df_vae_encode(ctx, e, ok, &out), DF_OK);
    assert_int_equal(df_tensor_dim(out, 0), 2);
    assert_int_equal(df_tensor_dim(out, 1), 32);
    assert_int_equal(df_tensor_dim(out, 2), 8);
    df_vae_encoder_free(e);
    df_ctx_free(ctx);
}

static void test_tiled_encoding(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae_encoder *e;
    assert_int_equal(df_vae_encoder_load(ctx, FLUX_VAE, &e), DF_OK);
    assert_int_equal(df_vae_encoder_config(e)->sample_size, 64); /* the config's */
    float px[3 * 80 * 96];
    for (size_t i = 0; i < sizeof px / sizeof px[0]; i++)
        px[i] = (float)((i * 7919) % 255) / 127.5f - 1;
    df_tensor *img = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 3, 80, 96), px);
    df_tensor *out = (df_tensor *)1;
    assert_int_equal(df_vae_encode_tiled(ctx, e, img, 20, &out), DF_E_UNSUPPORTED);
    assert_null(out);
    assert_non_null(strstr(df_error_message(), "tiles of 20 pixels"));
    /* one tile: the plain encoder, bit for bit */
    df_tensor *whole = NULL, *one = NULL, *tiled = NULL;
    assert_int_equal(df_vae_encode(ctx, e, img, &whole), DF_OK);
    assert_int_equal(df_vae_encode_tiled(ctx, e, img, 96, &one), DF_OK);
    static float a[32 * 10 * 12], b[32 * 10 * 12];
    assert_int_equal(df_tensor_read(ctx, whole, DF_DTYPE_F32, a, sizeof a), DF_OK);
    assert_int_equal(df_tensor_read(ctx, one, DF_DTYPE_F32, b, sizeof b), DF_OK);
    assert_memory_equal(a, b, sizeof a);
    /* 32-pixel tiles every 24: the same shape, other values near the tiles' seams */
    assert_int_equal(df_vae_encode_tiled(ctx, e, img, 32, &tiled), DF_OK);
    assert_int_equal(df_tensor_dim(tiled, 2), 10);
    assert_int_equal(df_tensor_dim(tiled, 3), 12);
    assert_int_equal(df_tensor_read(ctx, tiled, DF_DTYPE_F32, b, sizeof b), DF_OK);
    assert_true(memcmp(a, b, sizeof a) != 0);
    df_vae_encoder_free(e);
    df_ctx_free(ctx);
}

static void test_flux2_encoder_and_its_normalisation(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae_encoder *e;
    assert_int_equal(df_vae_encoder_load(ctx, FLUX2_VAE, &e), DF_OK);
    const df_vae_info *info = df_vae_encoder_config(e);
    assert_true(info->flux2);
    assert_int_equal(info->latent_channels, 32);
    enum { C = 32, H = 2, W = 4 };
    static float lat[C * H * W], out[C * H * W];
    for (int i = 0; i < C * H * W; i++)
        lat[i] = (float)i;
    assert_int_equal(df_vae_encoder_flux2_normalize(e, lat, 1, H, W, out), DF_OK);
    /* (c, y, x) = (1, 1, 3) lands in channel 1*4 + 1*2 + 1 = 7 at (0, 1) of [128, 1, 2]:
     * changing that input changes that output and no other */
    static float lat2[C * H * W], out2[C * H * W];
    memcpy(lat2, lat, sizeof lat);
    lat2[(1 * H + 1) * W + 3] += 1.0f;
    assert_int_equal(df_vae_encoder_flux2_normalize(e, lat2, 1, H, W, out2), DF_OK);
    for (int i = 0; i < C * H * W; i++)
        assert_true((out2[i] != out[i]) == (i == 7 * 2 + 1));
    assert_int_equal(df_vae_encoder_flux2_normalize(e, lat, 1, 3, W, out), DF_E_SHAPE);
    df_vae_encoder_free(e);

    df_vae_encoder *kl;
    assert_int_equal(df_vae_encoder_load(ctx, FLUX_VAE, &kl), DF_OK);
    assert_int_equal(df_vae_encoder_flux2_normalize(kl, lat, 1, H, W, out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "AutoencoderKLFlux2"));
    df_vae_encoder_free(kl);
    df_ctx_free(ctx);
}

static void test_posterior_mode_and_sample(void **state)
{
    (void)state;
    enum { B = 2, C = 2, N = C * 3 }; /* [B, 2C, 1, 3] moments */
    float moments[B * 2 * N];
    for (int i = 0; i < B * 2 * N; i++)
        moments[i] = (float)(i % 7) - 3.0f;
    moments[N] = 100.0f; /* a log variance past the clamp at 20 */
    float mode[B * N], sample[B * N], noise[B * N];
    assert_int_equal(df_vae_latent_dist(moments, B, C, 1, 3, NULL, mode), DF_OK);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++)
            assert_true(mode[b * N + i] == moments[b * 2 * N + i]);

    df_rng rng, ref;
    df_rng_init(&rng, 42);
    df_rng_init(&ref, 42);
    assert_int_equal(df_vae_latent_dist(moments, B, C, 1, 3, &rng, sample), DF_OK);
    assert_int_equal(df_rng_randn_f32(&ref, noise, B * N), DF_OK); /* one draw, B * C * h * w */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < N; i++) {
            float lv = fminf(fmaxf(moments[b * 2 * N + N + i], -30.0f), 20.0f);
            float want = moments[b * 2 * N + i] + expf(0.5f * lv) * noise[b * N + i];
            assert_true(sample[b * N + i] == want);
        }
    /* the generator moved on exactly as far as the reference one */
    float a, r;
    df_rng_randn_f32(&rng, &a, 1);
    df_rng_randn_f32(&ref, &r, 1);
    assert_true(a == r);
    assert_int_equal(df_vae_latent_dist(NULL, B, C, 1, 3, NULL, mode), DF_E_ARG);
}

static void test_scaling_uses_shift_then_scale(void **state)
{
    (void)state;
    df_vae_info info = {.scaling_factor = 0.3611, .shift_factor = 0.1159};
    float x[2] = {1.0f, -2.0f};
    assert_int_equal(df_vae_scale_latents(&info, x, 2), DF_OK);
    assert_true(x[0] == (1.0f - 0.1159f) * 0.3611f);
    assert_true(x[1] == (-2.0f - 0.1159f) * 0.3611f);
    info.flux2 = true;
    assert_int_equal(df_vae_scale_latents(&info, x, 2), DF_E_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_images_that_do_not_fit_are_refused),
        cmocka_unit_test(test_tiled_encoding),
        cmocka_unit_test(test_flux2_encoder_and_its_normalisation),
        cmocka_unit_test(test_posterior_mode_and_sample),
        cmocka_unit_test(test_scaling_uses_shift_then_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
