/*
 * fp8 safetensors: every bit pattern of F8_E4M3 and F8_E5M2 and scaled weights (ComfyUI's
 * scale_weight, per-tensor and per-row weight_scale) read exactly as torch upcasts them
 * (tests/cases/fp8-safetensors, made by tools/refgen/fp8_safetensors.py), whole, by rows,
 * by columns and to bf16; and the refusals.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/safetensors.h>

#include "unit/io_files.h"

#define CASE_DIR DF_GOLDEN_DIR "/../cases/fp8-safetensors"

static bool same(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0;
}

static void test_matches_torch(void **state)
{
    (void)state;
    df_safetensors *st, *ref;
    assert_int_equal(df_safetensors_open(CASE_DIR "/model.safetensors", &st), DF_OK);
    assert_int_equal(df_safetensors_open(CASE_DIR "/case.safetensors", &ref), DF_OK);
    int checked = 0;
    for (int64_t k = 0; k < df_safetensors_count(ref); k++) {
        df_tensor_info ri, ti;
        assert_int_equal(df_safetensors_at(ref, k, &ri), DF_OK);
        const char *name = ri.name + 4; /* "out." */
        assert_int_equal(df_safetensors_find(st, name, &ti), DF_OK);
        assert_int_equal(ti.numel, ri.numel);
        assert_int_equal(ti.elem_size, 1);
        size_t n = (size_t)ri.numel;
        float *want = malloc(n * 4), *got = malloc(n * 4);
        uint16_t *bf = malloc(n * 2);
        assert_int_equal(df_safetensors_read(ref, ri.name, DF_DTYPE_F32, want, n * 4), DF_OK);
        assert_int_equal(df_safetensors_read(st, name, DF_DTYPE_F32, got, n * 4), DF_OK);
        for (size_t i = 0; i < n; i++)
            if (!same(got[i], want[i]))
                fail_msg("%s [%zu]: %.9g, torch %.9g", name, i, got[i], want[i]);
        /* the last row alone, and columns [1, C) */
        int64_t rows = ti.shape[0], cols = ti.shape[1];
        assert_int_equal(
            df_safetensors_read_rows(st, name, rows - 1, rows, DF_DTYPE_F32, got, n * 4), DF_OK);
        for (int64_t c = 0; c < cols; c++)
            assert_true(same(got[c], want[(rows - 1) * cols + c]));
        assert_int_equal(df_safetensors_read_cols(st, name, 1, cols, DF_DTYPE_F32, got, n * 4),
                         DF_OK);
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 1; c < cols; c++)
                assert_true(same(got[r * (cols - 1) + c - 1], want[r * cols + c]));
        assert_int_equal(df_safetensors_read(st, name, DF_DTYPE_BF16, bf, n * 2), DF_OK);
        for (size_t i = 0; i < n; i++)
            assert_true(same(df_bf16_to_f32(bf[i]), df_bf16_to_f32(df_f32_to_bf16(want[i]))));
        free(want);
        free(got);
        free(bf);
        checked++;
    }
    assert_int_equal(checked, 6);
    df_safetensors_free(ref);
    df_safetensors_free(st);
}

static void test_conversions(void **state)
{
    (void)state;
    assert_true(df_f8_e4m3_to_f32(0x7e) == 448.0f); /* largest e4m3fn */
    assert_true(isnan(df_f8_e4m3_to_f32(0xff)));
    assert_true(df_f8_e4m3_to_f32(0x01) == 0x1p-9f); /* smallest subnormal */
    assert_true(df_f8_e4m3_to_f32(0xb8) == -1.0f);
    assert_true(df_f8_e5m2_to_f32(0x7b) == 57344.0f); /* largest e5m2 */
    assert_true(isinf(df_f8_e5m2_to_f32(0xfc)) && df_f8_e5m2_to_f32(0xfc) < 0);
}

static void test_refusals(void **state)
{
    (void)state;
    int32_t ints[32];
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(CASE_DIR "/model.safetensors", &st), DF_OK);
    assert_int_equal(df_safetensors_read(st, "plain.weight", DF_DTYPE_I32, ints, sizeof ints),
                     DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "F8_E4M3"));
    df_safetensors_free(st);

    /* A scale with neither one value nor one per row. */
    uint8_t w[8] = {0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38, 0x38};
    float sc[3] = {1, 2, 3};
    uint8_t data[20];
    memcpy(data, sc, 12);
    memcpy(data + 12, w, 8);
    size_t len;
    uint8_t *file = st_bytes("{\"m.scale_weight\":{\"dtype\":\"F32\",\"shape\":[3],"
                             "\"data_offsets\":[0,12]},\"m.weight\":{\"dtype\":\"F8_E4M3\","
                             "\"shape\":[2,4],\"data_offsets\":[12,20]}}",
                             data, 20, &len);
    assert_int_equal(df_safetensors_open_memory(file, len, "s.safetensors", &st), DF_OK);
    float out[8];
    assert_int_equal(df_safetensors_read(st, "m.weight", DF_DTYPE_F32, out, sizeof out),
                     DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "m.scale_weight"));
    assert_non_null(strstr(df_error_message(), "3 values"));
    df_safetensors_free(st);
    free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_torch),
        cmocka_unit_test(test_conversions),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
