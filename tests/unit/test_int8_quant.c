/*
 * The int8 format (core/int8_quant.h, and quantize.h's df_int8_quantize): the rounding rule
 * (half to even, clamped to +-127), how k is cut into groups, and the public quantizer giving
 * the values and scales the rule gives, in every input dtype.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/dtype.h>
#include <diffuse/quantize.h>

#include "core/int8_quant.h"

static void test_rounding_is_half_to_even_and_clamped(void **state)
{
    (void)state;
    assert_int_equal(df_i8_round(0.5f, 1.0f), 0);
    assert_int_equal(df_i8_round(1.5f, 1.0f), 2);
    assert_int_equal(df_i8_round(2.5f, 1.0f), 2);
    assert_int_equal(df_i8_round(-2.5f, 1.0f), -2);
    assert_int_equal(df_i8_round(200.0f, 1.0f), 127);
    assert_int_equal(df_i8_round(-200.0f, 1.0f), -127); /* never -128 */
    assert_int_equal(df_i8_round(5.0f, 0.0f), 0);       /* a group of zeros */
}

static void expect_groups(int64_t k, int64_t group, int64_t want_group, int64_t want_kp,
                          int64_t want_n)
{
    df_i8_groups g = df_i8_groups_of(k, group);
    assert_int_equal(g.group, want_group);
    assert_int_equal(g.kp, want_kp);
    assert_int_equal(g.n_groups, want_n);
}

static void test_groups_of_k(void **state)
{
    (void)state;
    expect_groups(256, 64, 64, 256, 4);
    expect_groups(256, 0, 128, 256, 2); /* 0: the default 128 */
    expect_groups(256, DF_I8_WHOLE_K, 256, 256, 1);
    expect_groups(256, 256, 256, 256, 1); /* not below k: the whole k */
    expect_groups(96, 64, 96, 96, 1);     /* does not divide k */
    expect_groups(256, 30, 256, 256, 1);  /* not a multiple of 4 */
    expect_groups(102, 32, 104, 104, 1);  /* the whole k, padded to quads */
    assert_int_equal(df_i8_group_for(256, 64), 64);
    /* the public count: 0 is the whole k */
    assert_int_equal(df_int8_weight_groups(256, 0), 1);
    assert_int_equal(df_int8_weight_groups(256, 32), 8);
    assert_int_equal(df_int8_weight_groups(100, 32), 1);
}

static void test_quantize_gives_the_rule(void **state)
{
    (void)state;
    /* two rows of k = 8 in groups of 4: max|x| 1, 2, 0 and 0.5 */
    const float w[16] = {0.5f, -1.0f, 0.25f, 0.0f, 2.0f, 1.0f,  -0.5f, 0.125f,
                         0.0f, 0.0f,  0.0f,  0.0f, 0.5f, -0.5f, 0.25f, 0.375f};
    int8_t q[16];
    float scale[4];
    assert_int_equal(df_int8_quantize(w, DF_DTYPE_F32, 2, 8, 4, q, scale), DF_OK);
    const int8_t want_q[16] = {64, -127, 32, 0, 127, 64, -32, 8, 0, 0, 0, 0, 127, -127, 64, 95};
    assert_memory_equal(q, want_q, sizeof want_q);
    assert_true(scale[0] == 1.0f / 127.0f);
    assert_true(scale[1] == 2.0f / 127.0f);
    assert_true(scale[2] == 0.0f);
    assert_true(scale[3] == 0.5f / 127.0f);

    /* the same values in bf16 and f16 (all exact there) give the same bytes */
    uint16_t h[16];
    int8_t q16[16];
    float s16[4];
    for (int t = 0; t < 2; t++) {
        df_dtype type = t ? DF_DTYPE_F16 : DF_DTYPE_BF16;
        assert_int_equal(df_convert(w, DF_DTYPE_F32, h, type, 16), DF_OK);
        assert_int_equal(df_int8_quantize(h, type, 2, 8, 4, q16, s16), DF_OK);
        assert_memory_equal(q16, q, sizeof q);
        assert_memory_equal(s16, scale, sizeof scale);
    }

    /* whole k (group 0): one scale per row, the row's max */
    assert_int_equal(df_int8_quantize(w, DF_DTYPE_F32, 2, 8, 0, q, scale), DF_OK);
    assert_true(scale[0] == 2.0f / 127.0f);
    assert_true(scale[1] == 0.5f / 127.0f);
    assert_int_equal(q[0], 32); /* 0.5 * 63.5 = 31.75 */

    int8_t iq[16];
    assert_int_equal(df_int8_quantize(iq, DF_DTYPE_I8, 2, 8, 4, q, scale), DF_E_UNSUPPORTED);
}

/* The public quantizer is the channel rule, row by row (the CPU products pack with it). */
static void test_quantize_is_the_channel_rule(void **state)
{
    (void)state;
    enum { N = 3, K = 70 }; /* whole k: padded to 72 */
    float w[N * K];
    for (int i = 0; i < N * K; i++)
        w[i] = sinf((float)i * 0.37f) * (float)(1 + i % 5);
    int8_t q[N * K];
    float scale[N];
    assert_int_equal(df_int8_quantize(w, DF_DTYPE_F32, N, K, 32, q, scale), DF_OK);
    df_i8_groups g = df_i8_groups_of(K, 32);
    assert_int_equal(g.kp, 72);
    for (int j = 0; j < N; j++) {
        float row[72] = {0};
        int8_t qc[72];
        float sc;
        memcpy(row, w + j * K, K * sizeof(float));
        df_i8_quantize_channel(row, g.group, g.n_groups, qc, &sc);
        assert_memory_equal(qc, q + j * K, K);
        assert_true(sc == scale[j]);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rounding_is_half_to_even_and_clamped),
        cmocka_unit_test(test_groups_of_k),
        cmocka_unit_test(test_quantize_gives_the_rule),
        cmocka_unit_test(test_quantize_is_the_channel_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
