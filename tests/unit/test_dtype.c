/*
 * dtypes: exact conversions (round to nearest even, NaN and infinities kept), names, and
 * the generic converter.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/dtype.h>

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_bf16_rounds_to_nearest_even(void **state)
{
    (void)state;
    assert_int_equal(df_f32_to_bf16(1.0f), 0x3f80);
    /* 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even one (1.0). */
    assert_int_equal(df_f32_to_bf16(from_bits(0x3f808000)), 0x3f80);
    /* 1 + 3*2^-8 is halfway too, and rounds up to the even 0x3f82. */
    assert_int_equal(df_f32_to_bf16(from_bits(0x3f818000)), 0x3f82);
    assert_int_equal(df_f32_to_bf16(from_bits(0x3f808001)), 0x3f81); /* above halfway */
    assert_int_equal(df_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(df_f32_to_bf16(-INFINITY), 0xff80);
    assert_true(isnan(df_bf16_to_f32(df_f32_to_bf16(NAN))));
    /* A NaN whose payload sits only in the low bits must stay a NaN, not become infinity. */
    assert_true(isnan(df_bf16_to_f32(df_f32_to_bf16(from_bits(0x7f800001)))));
    /* Every bf16 value survives the round trip through f32. */
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = df_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(df_f32_to_bf16(f), h);
    }
}

static void test_f16_exact_in_range_subnormals_and_overflow(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = df_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(df_f32_to_f16(f), h);
        else
            assert_true(isnan(df_f16_to_f32(df_f32_to_f16(f))));
    }
    assert_float_equal(df_f16_to_f32(0x0001), ldexpf(1.0f, -24), 0); /* smallest subnormal */
    assert_int_equal(df_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);        /* tie to even: 0 */
    assert_int_equal(df_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    assert_int_equal(df_f32_to_f16(65504.0f), 0x7bff);                  /* largest finite */
    assert_int_equal(df_f32_to_f16(65520.0f), 0x7c00);                  /* rounds to inf */
    assert_int_equal(df_f32_to_f16(-1e9f), 0xfc00);
    /* Halfway between 1 and the next f16 (1 + 2^-11): ties to even, down to 1. */
    assert_int_equal(df_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(df_f32_to_f16(1.0f + 3 * ldexpf(1.0f, -11)), 0x3c02);
}

static void test_names_and_sizes(void **state)
{
    (void)state;
    df_dtype t;
    assert_true(df_dtype_parse("bfloat16", &t));
    assert_int_equal(t, DF_DTYPE_BF16);
    assert_true(df_dtype_parse("f16", &t));
    assert_int_equal(t, DF_DTYPE_F16);
    assert_false(df_dtype_parse("f8", &t));
    assert_string_equal(df_dtype_name(DF_DTYPE_I64), "i64");
    assert_string_equal(df_dtype_name((df_dtype)99), "?");
    assert_int_equal(df_dtype_size(DF_DTYPE_BF16), 2);
    assert_int_equal(df_dtype_size((df_dtype)99), 0);
}

static void test_convert_between_kinds(void **state)
{
    (void)state;
    const float src[5] = {1.5f, -2.7f, NAN, 1e30f, -1e30f};
    int32_t i32[5];
    assert_int_equal(df_convert(src, DF_DTYPE_F32, i32, DF_DTYPE_I32, 5), DF_OK);
    assert_int_equal(i32[0], 1);
    assert_int_equal(i32[1], -2);
    assert_int_equal(i32[2], 0);          /* NaN */
    assert_int_equal(i32[3], INT32_MAX);  /* clamped, not undefined */
    assert_int_equal(i32[4], INT32_MIN);
    uint16_t bf[5];
    float back[5];
    assert_int_equal(df_convert(src, DF_DTYPE_F32, bf, DF_DTYPE_BF16, 5), DF_OK);
    assert_int_equal(df_convert(bf, DF_DTYPE_BF16, back, DF_DTYPE_F32, 5), DF_OK);
    assert_float_equal(back[0], 1.5f, 0);
    int64_t ids[3] = {0, 49407, -1};
    double d[3];
    assert_int_equal(df_convert(ids, DF_DTYPE_I64, d, DF_DTYPE_F64, 3), DF_OK);
    assert_float_equal(d[1], 49407.0, 0);
    assert_int_equal(df_convert(ids, (df_dtype)77, d, DF_DTYPE_F64, 3), DF_E_ARG);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_rounds_to_nearest_even),
        cmocka_unit_test(test_f16_exact_in_range_subnormals_and_overflow),
        cmocka_unit_test(test_names_and_sizes),
        cmocka_unit_test(test_convert_between_kinds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
