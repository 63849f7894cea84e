/*
 * Tests for the PyTorch-compatible generator (src/core/rng.c): the mt19937 stream, the two
 * torch.randn paths (n < 16 double path with its cache, n >= 16 blocks with the last-16
 * refill), bfloat16, and the values torch 1.13 itself drew (the rng-* golden cases).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/dtype.h>
#include <diffuse/rng.h>

#include "core/rng.h"
#include "golden_tensors.h"

/* ---- the engine ------------------------------------------------------------------- */

static void test_mt19937_matches_the_standard_engine(void **state)
{
    (void)state;
    df_rng r;
    df_rng_init(&r, 5489); /* std::mt19937's default seed */
    assert_int_equal(df_rng_u32(&r), 3499211612u);
    for (int i = 1; i < 9999; i++)
        df_rng_u32(&r);
    assert_int_equal(df_rng_u32(&r), 4123659995u); /* the C++ standard's 10000th value */
}

static void test_only_the_low_32_bits_of_the_seed_count(void **state)
{
    (void)state;
    df_rng a, b, c;
    df_rng_init(&a, 5);
    df_rng_init(&b, (UINT64_C(1) << 32) + 5);
    df_rng_init(&c, 6);
    uint32_t xa = df_rng_u32(&a);
    assert_int_equal(xa, df_rng_u32(&b));
    assert_int_not_equal(xa, df_rng_u32(&c));
}

static void test_random64_puts_the_first_draw_high(void **state)
{
    (void)state;
    df_rng a, b;
    df_rng_init(&a, 7);
    df_rng_init(&b, 7);
    uint64_t hi = df_rng_u32(&a), lo = df_rng_u32(&a);
    assert_true(df_rng_u64(&b) == ((hi << 32) | lo));
}

/* ---- the double path and its cache ------------------------------------------------ */

static void test_small_draws_share_the_cached_value_across_calls(void **state)
{
    (void)state;
    float pair[2], one, other;
    df_rng a, b;
    df_rng_init(&a, 123);
    df_rng_init(&b, 123);
    assert_int_equal(df_rng_randn_f32(&a, pair, 2), DF_OK);
    assert_int_equal(df_rng_randn_f32(&b, &one, 1), DF_OK);
    assert_int_equal(df_rng_randn_f32(&b, &other, 1), DF_OK);
    assert_true(pair[0] == one && pair[1] == other);
    assert_true(pair[0] != pair[1]);
}

static void test_block_draws_leave_the_cache_alone(void **state)
{
    (void)state;
    float pair[2], first, block[32], second;
    df_rng a, b;
    df_rng_init(&a, 99);
    df_rng_init(&b, 99);
    assert_int_equal(df_rng_randn_f32(&a, pair, 2), DF_OK);
    assert_int_equal(df_rng_randn_f32(&b, &first, 1), DF_OK);
    assert_int_equal(df_rng_randn_f32(&b, block, 32), DF_OK);  /* consumes 32 words */
    assert_int_equal(df_rng_randn_f32(&b, &second, 1), DF_OK); /* still the cached sine */
    assert_true(first == pair[0]);
    assert_true(second == pair[1]);
}

static void test_double_path_is_box_muller_on_53_bit_uniforms(void **state)
{
    (void)state;
    df_rng a, b;
    df_rng_init(&a, 2024);
    df_rng_init(&b, 2024);
    double u1 = (double)(df_rng_u64(&a) & ((UINT64_C(1) << 53) - 1)) / 9007199254740992.0;
    double u2 = (double)(df_rng_u64(&a) & ((UINT64_C(1) << 53) - 1)) / 9007199254740992.0;
    double r = sqrt(-2.0 * log(1.0 - u2));
    double want_cos = r * cos(2.0 * M_PI * u1), want_sin = r * sin(2.0 * M_PI * u1);
    float got[2];
    assert_int_equal(df_rng_randn_f32(&b, got, 2), DF_OK);
    assert_float_equal(got[0], want_cos, 1e-6);
    assert_float_equal(got[1], want_sin, 1e-6);
}

/* ---- the block path -------------------------------------------------------------- */

static void test_block_of_16_is_float_box_muller(void **state)
{
    (void)state;
    df_rng a, b;
    df_rng_init(&a, 31337);
    df_rng_init(&b, 31337);
    float u[16], got[16];
    for (int i = 0; i < 16; i++)
        u[i] = (float)(df_rng_u32(&a) & 0xffffff) / 16777216.0f;
    assert_int_equal(df_rng_randn_f32(&b, got, 16), DF_OK);
    for (int j = 0; j < 8; j++) {
        double r = sqrt(-2.0 * log(1.0 - (double)u[j]));
        double theta = 2.0 * M_PI * (double)u[j + 8];
        assert_float_equal(got[j], r * cos(theta), 2e-6);
        assert_float_equal(got[j + 8], r * sin(theta), 2e-6);
    }
}

static void test_uneven_length_refills_the_last_16(void **state)
{
    (void)state;
    float seventeen[17], head[16], tail[16];
    df_rng a, b, c;
    df_rng_init(&a, 4);
    df_rng_init(&b, 4);
    df_rng_init(&c, 4);
    assert_int_equal(df_rng_randn_f32(&a, seventeen, 17), DF_OK);
    /* element 0 comes from the first block, transformed from the first 16 uniforms */
    assert_int_equal(df_rng_randn_f32(&b, head, 16), DF_OK);
    assert_true(seventeen[0] == head[0]);
    /* elements 1..16 are a fresh block drawn after the 17 first uniforms */
    for (int i = 0; i < 17; i++)
        df_rng_u32(&c);
    assert_int_equal(df_rng_randn_f32(&c, tail, 16), DF_OK);
    assert_memory_equal(seventeen + 1, tail, sizeof tail);
    /* and the stream continues after 17 + 16 words in both */
    assert_int_equal(df_rng_u32(&a), df_rng_u32(&c));
}

static void test_negative_count_is_an_argument_error(void **state)
{
    (void)state;
    df_rng r;
    df_rng_init(&r, 0);
    float x;
    uint16_t h;
    assert_int_equal(df_rng_randn_f32(&r, &x, -1), DF_E_ARG);
    assert_int_equal(df_rng_randn_bf16(&r, &h, -1), DF_E_ARG);
    assert_int_equal(df_rng_randn_f32(&r, NULL, 3), DF_E_ARG);
    assert_int_equal(df_rng_randn_f32(&r, NULL, 0), DF_OK);
}

/* ---- bfloat16 ----------------------------------------------------------------------- */

static void test_bf16_small_path_rounds_the_double_values(void **state)
{
    (void)state;
    df_rng a, b;
    df_rng_init(&a, 77);
    df_rng_init(&b, 77);
    float f[5];
    uint16_t h[5];
    assert_int_equal(df_rng_randn_f32(&a, f, 5), DF_OK);
    assert_int_equal(df_rng_randn_bf16(&b, h, 5), DF_OK);
    for (int i = 0; i < 5; i++)
        assert_int_equal(h[i], df_f32_to_bf16(f[i]));
}

static void test_bf16_block_path_is_not_the_float_stream_rounded(void **state)
{
    (void)state;
    df_rng a, b;
    df_rng_init(&a, 42);
    df_rng_init(&b, 42);
    float f[64];
    uint16_t h[64];
    assert_int_equal(df_rng_randn_f32(&a, f, 64), DF_OK);
    assert_int_equal(df_rng_randn_bf16(&b, h, 64), DF_OK);
    int same = 0;
    for (int i = 0; i < 64; i++) {
        same += h[i] == df_f32_to_bf16(f[i]);
        assert_true(fabsf(df_bf16_to_f32(h[i])) < 6.0f);
    }
    assert_true(same < 32); /* 8-bit uniforms: a different stream of values */
}

/* ---- the values torch drew ---------------------------------------------------------- */

typedef struct cmp {
    double max_abs;
    int64_t exact;
} cmp;

static cmp compare(const double *want, const float *got, int64_t n)
{
    cmp c = {0, 0};
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - want[i]);
        c.max_abs = d > c.max_abs ? d : c.max_abs;
        c.exact += d == 0.0;
    }
    return c;
}

static void test_f32_sequence_matches_torch_seed0(void **state)
{
    (void)state;
    static const int64_t sizes[] = {3, 15, 16, 17, 30};
    df_rng r;
    df_rng_init(&r, 0);
    for (int k = 0; k < 5; k++) {
        char name[32];
        snprintf(name, sizeof name, "out.sample_%d", k);
        int64_t n = 0;
        double *want = golden_read_f64("rng-randn-f32-small", name, &n);
        if (!want)
            skip();
        assert_int_equal(n, sizes[k]);
        float got[32];
        assert_int_equal(df_rng_randn_f32(&r, got, n), DF_OK);
        cmp c = compare(want, got, n);
        assert_true(c.max_abs <= 1e-5);
        if (n < 16) /* double libm: the same bits as torch */
            assert_int_equal(c.exact, n);
        free(want);
    }
}

static void test_f32_latent_matches_torch_seed42(void **state)
{
    (void)state;
    int64_t n = 0;
    double *want = golden_read_f64("rng-randn-f32-seed42-latent", "out.sample_0", &n);
    if (!want)
        skip();
    assert_int_equal(n, 16 * 32 * 32);
    float *got = malloc((size_t)n * sizeof *got);
    assert_non_null(got);
    df_rng r;
    df_rng_init(&r, 42);
    assert_int_equal(df_rng_randn_f32(&r, got, n), DF_OK);
    cmp c = compare(want, got, n);
    print_message("seed 42 latent: max |diff| %.3g, %lld of %lld bit-exact\n", c.max_abs,
                  (long long)c.exact, (long long)n);
    assert_true(c.max_abs <= 1e-5);
    assert_true(c.exact >= n * 8 / 10);
    free(got);
    free(want);
}

static void test_bf16_matches_torch_seed42(void **state)
{
    (void)state;
    static const int64_t sizes[] = {16 * 8 * 8, 7};
    df_rng r;
    df_rng_init(&r, 42);
    for (int k = 0; k < 2; k++) {
        char name[32];
        snprintf(name, sizeof name, "out.sample_%d", k);
        int64_t n = 0;
        double *want = golden_read_f64("rng-randn-bf16-seed42", name, &n);
        if (!want)
            skip();
        assert_int_equal(n, sizes[k]);
        uint16_t *h = malloc((size_t)n * sizeof *h);
        assert_non_null(h);
        assert_int_equal(df_rng_randn_bf16(&r, h, n), DF_OK);
        int64_t exact = 0;
        for (int64_t i = 0; i < n; i++) {
            double got = df_bf16_to_f32(h[i]);
            double ulp = ldexp(1.0, ilogb(want[i] == 0 ? 1e-30 : want[i]) - 7);
            assert_true(fabs(got - want[i]) <= ulp);
            exact += got == want[i];
        }
        print_message("bf16 sample_%d: %lld of %lld exact\n", k, (long long)exact, (long long)n);
        assert_true(exact >= n * 9 / 10);
        free(h);
        free(want);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mt19937_matches_the_standard_engine),
        cmocka_unit_test(test_only_the_low_32_bits_of_the_seed_count),
        cmocka_unit_test(test_random64_puts_the_first_draw_high),
        cmocka_unit_test(test_small_draws_share_the_cached_value_across_calls),
        cmocka_unit_test(test_block_draws_leave_the_cache_alone),
        cmocka_unit_test(test_double_path_is_box_muller_on_53_bit_uniforms),
        cmocka_unit_test(test_block_of_16_is_float_box_muller),
        cmocka_unit_test(test_uneven_length_refills_the_last_16),
        cmocka_unit_test(test_negative_count_is_an_argument_error),
        cmocka_unit_test(test_bf16_small_path_rounds_the_double_values),
        cmocka_unit_test(test_bf16_block_path_is_not_the_float_stream_rounded),
        cmocka_unit_test(test_f32_sequence_matches_torch_seed0),
        cmocka_unit_test(test_f32_latent_matches_torch_seed42),
        cmocka_unit_test(test_bf16_matches_torch_seed42),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
