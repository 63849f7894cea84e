/*
 * int8 products with weights kept in their file's form (backend/cpu/gemm_int8_blocks.c):
 * GGUF blocks of every type diffuse dequantises, and fp8 with a scale, packed block by
 * block as the product runs.
 *
 * - Q8_0, Q4_0, Q5_0 (groups of 32) and Q3_K, Q6_K (groups of 16) are exact: the product
 *   equals, to f32 rounding, the float64 product of the quantized activations with ggml's
 *   dequantised weights (no rounding of the weight), and Q8_0 gives bit for bit the product
 *   of a weight packed from its integers and scales (df_i8_weight_from_plain, the
 *   saved-int8 path).
 * - The other types and fp8 are requantized per group of 32: within the int8 bound of the
 *   float64 product of the unquantized operands.
 * Random blocks (scales set to finite values), ragged n (a partial block of channels), every
 * path this CPU has.
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
#include <diffuse/status.h>

#include "backend/cpu/gemm_int8.h"
#include "core/alloc.h"
#include "core/quant_blocks.h"

static uint64_t rng_state = 0x9e3779b9u;

static uint32_t next_u32(void)
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 32);
}

static float uniform(void) /* [-1, 1) */
{
    return (float)((next_u32() >> 8) * (1.0 / (double)(1u << 23)) - 1.0);
}

static void put_f16(uint8_t *p, float v)
{
    /* a small normal f16: sign, exponent 8..14 (2^-7 .. 2^-1), 10 random mantissa bits */
    uint16_t h =
        (uint16_t)((v < 0 ? 0x8000u : 0) | ((8u + next_u32() % 7) << 10) | (next_u32() & 0x3ffu));
    memcpy(p, &h, 2);
}

/* Where each type keeps its f16 scales (byte offsets in a block; -1 ends the list). */
static const int *scale_fields(uint32_t type)
{
    static const int at0[] = {0, -1}, at01[] = {0, 2, -1}, q2k[] = {80, 82, -1}, q3k[] = {108, -1},
                     q6k[] = {208, -1};
    switch (type) {
    case DF_GGML_Q4_1:
    case DF_GGML_Q5_1:
    case DF_GGML_Q4_K:
    case DF_GGML_Q5_K:
        return at01;
    case DF_GGML_Q2_K:
        return q2k;
    case DF_GGML_Q3_K:
        return q3k;
    case DF_GGML_Q6_K:
        return q6k;
    default:
        return at0;
    }
}

/* n rows of k values of `type`: random bytes, finite scales. */
static uint8_t *random_blocks(uint32_t type, int64_t n, int64_t k, size_t *row_bytes)
{
    const df_qblock_info *q = df_qblock_info_of(type);
    *row_bytes = (size_t)(k / q->block) * (size_t)q->bytes;
    uint8_t *data = malloc((size_t)n * *row_bytes);
    for (size_t i = 0; i < (size_t)n * *row_bytes; i++)
        data[i] = (uint8_t)next_u32();
    for (int64_t b = 0; b < n * (k / q->block); b++)
        for (const int *f = scale_fields(type); *f >= 0; f++)
            put_f16(data + b * q->bytes + *f, uniform());
    return data;
}

typedef struct run {
    float *out;
    df_i8_act act;
    void *act_mem;
} run;

/* out = x w^T through the blocks path on `path`. */
static void run_blocks(const df_i8_blocks *w, const float *x, int64_t m, df_i8_path path, run *r)
{
    df_i8_weight shape = df_i8_blocks_shape(w);
    r->act_mem = malloc(df_i8_act_bytes(&shape, m));
    df_i8_act_quantize(&shape, x, DF_DTYPE_F32, m, w->k, r->act_mem, &r->act);
    r->out = malloc((size_t)(m * w->n) * sizeof(float));
    df_i8_epilogue e = {.out = r->out};
    assert_int_equal(df_i8_gemm_blocks(&r->act, w, &e, path), DF_OK);
}

static void run_free(run *r)
{
    free(r->out);
    free(r->act_mem);
}

static double rel_l2(const double *ref, const float *got, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* The float64 product of x (quantized as in `act` when act is set) and the weight wf. */
static double *reference(const float *x, const df_i8_act *act, const float *wf, int64_t m,
                         int64_t n, int64_t k)
{
    double *ref = malloc((size_t)(m * n) * sizeof *ref);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t kk = 0; kk < k; kk++) {
                double a = act ? ((double)act->q[i * act->kp + kk] - 128.0) *
                                     act->scale[i * act->n_groups + kk / act->group]
                               : x[i * k + kk];
                s += a * wf[j * k + kk];
            }
            ref[i * n + j] = s;
        }
    return ref;
}

static const uint32_t types[] = {DF_GGML_Q8_0, DF_GGML_Q4_0, DF_GGML_Q5_0, DF_GGML_Q4_1,
                                 DF_GGML_Q5_1, DF_GGML_Q2_K, DF_GGML_Q3_K, DF_GGML_Q4_K,
                                 DF_GGML_Q5_K, DF_GGML_Q6_K};

static bool exact_type(uint32_t t)
{
    return t == DF_GGML_Q8_0 || t == DF_GGML_Q4_0 || t == DF_GGML_Q5_0 || t == DF_GGML_Q3_K ||
           t == DF_GGML_Q6_K;
}

static void test_gguf_types(void **state)
{
    (void)state;
    const int64_t m = 9, n = 70, k = 512;
    float *x = malloc((size_t)(m * k) * sizeof *x);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = uniform() * (i % 13 == 0 ? 3.0f : 1.0f);
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
        size_t row_bytes;
        uint8_t *data = random_blocks(types[t], n, k, &row_bytes);
        const df_qblock_info *info = df_qblock_info_of(types[t]);
        float *wf = malloc((size_t)(n * k) * sizeof *wf);
        assert_int_equal(df_qblock_dequant(types[t], data, n * k / info->block, wf), DF_OK);
        df_i8_blocks w;
        assert_int_equal(df_i8_blocks_of(data, types[t], 1.0f, n, k, &w), DF_OK);
        assert_int_equal((int64_t)w.row_bytes, (int64_t)row_bytes);
        bool runs16 = types[t] == DF_GGML_Q3_K || types[t] == DF_GGML_Q6_K;
        assert_int_equal(df_i8_blocks_shape(&w).group, runs16 ? 16 : 32);
        run first = {0};
        for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
            if (!df_i8_path_available((df_i8_path)p))
                continue;
            run r;
            run_blocks(&w, x, m, (df_i8_path)p, &r);
            double e;
            if (exact_type(types[t])) { /* the weight is ggml's, unrounded */
                double *ref = reference(x, &r.act, wf, m, n, k);
                e = rel_l2(ref, r.out, m * n);
                free(ref);
                if (e > 1e-5)
                    fail_msg("%s on %s: rel_l2 %g against the quantized activations times "
                             "the exact weight",
                             info->name, df_i8_path_name((df_i8_path)p), e);
            }
            double *ref = reference(x, NULL, wf, m, n, k);
            e = rel_l2(ref, r.out, m * n);
            free(ref);
            print_message("%s on %s: rel_l2 %.3g against the float64 product\n", info->name,
                          df_i8_path_name((df_i8_path)p), e);
            if (e > 2e-2)
                fail_msg("%s on %s: rel_l2 %g against the float64 product", info->name,
                         df_i8_path_name((df_i8_path)p), e);
            if (!first.out) {
                first = r;
            } else { /* our own paths agree bit for bit (oneDNN runs the best own kernel) */
                assert_memory_equal(first.out, r.out, (size_t)(m * n) * sizeof(float));
                run_free(&r);
            }
        }
        run_free(&first);
        free(wf);
        free(data);
    }
    free(x);
}

/* df_qblock_ints: the integers times their run's scale, multiplied in f32, are ggml's
 * dequantised values bit for bit (Q6_K too: ggml's d * sc * q rounds the same product). */
static void test_block_integers(void **state)
{
    (void)state;
    const uint32_t runs[] = {DF_GGML_Q8_0, DF_GGML_Q4_0, DF_GGML_Q5_0, DF_GGML_Q3_K, DF_GGML_Q6_K};
    for (int t = 0; t < 5; t++) {
        const df_qblock_info *info = df_qblock_info_of(runs[t]);
        int64_t nb = 8, n = nb * info->block, run = df_qblock_run(runs[t]);
        size_t row_bytes;
        uint8_t *data = random_blocks(runs[t], 1, n, &row_bytes);
        float *y = malloc((size_t)n * sizeof *y), work[256], *sc = malloc((size_t)(n / run) * 4);
        int8_t *q = malloc((size_t)n);
        assert_int_equal(df_qblock_dequant(runs[t], data, nb, y), DF_OK);
        assert_int_equal(df_qblock_ints(runs[t], data, nb, work, q, sc), DF_OK);
        for (int64_t i = 0; i < n; i++) {
            float v = sc[i / run] * (float)q[i];
            if (v != y[i])
                fail_msg("%s value %lld: %d x %g = %g, ggml's %g", info->name, (long long)i, q[i],
                         sc[i / run], v, y[i]);
        }
        free(q);
        free(sc);
        free(y);
        free(data);
    }
    float work[256];
    int8_t q[256];
    float sc[16];
    uint8_t block[144] = {0};
    assert_int_equal(df_qblock_ints(DF_GGML_Q4_K, block, 1, work, q, sc), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "Q4_K"));
}

/* Q8_0 packed block by block is the saved-int8 weight of the same integers and scales. */
static void test_q8_0_is_the_int8_layout(void **state)
{
    (void)state;
    const int64_t m = 5, n = 40, k = 96;
    size_t row_bytes;
    uint8_t *data = random_blocks(DF_GGML_Q8_0, n, k, &row_bytes);
    int8_t *q = malloc((size_t)(n * k));
    float *scale = malloc((size_t)(n * k / 32) * sizeof *scale);
    for (int64_t b = 0; b < n * k / 32; b++) {
        uint16_t h;
        memcpy(&h, data + b * 34, 2);
        scale[b] = df_f16_to_f32(h);
        memcpy(q + b * 32, data + b * 34 + 2, 32);
    }
    float *x = malloc((size_t)(m * k) * sizeof *x);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = uniform();
    df_i8_blocks w;
    assert_int_equal(df_i8_blocks_of(data, DF_GGML_Q8_0, 1.0f, n, k, &w), DF_OK);
    run r;
    run_blocks(&w, x, m, DF_I8_PATH_AUTO, &r);
    df_i8_weight *plain;
    assert_int_equal(df_i8_weight_from_plain(q, scale, n, k, 32, &plain), DF_OK);
    float *out = malloc((size_t)(m * n) * sizeof *out);
    df_i8_epilogue e = {.out = out};
    assert_int_equal(df_i8_gemm(&r.act, plain, &e, DF_I8_PATH_AUTO), DF_OK);
    assert_memory_equal(out, r.out, (size_t)(m * n) * sizeof(float));
    df_i8_weight_free(plain);
    run_free(&r);
    free(out);
    free(x);
    free(scale);
    free(q);
    free(data);
}

static void test_fp8(void **state)
{
    (void)state;
    const int64_t m = 7, n = 33, k = 200; /* 32 does not divide k: one group per row */
    const uint32_t kinds[] = {DF_QBLOCK_F8_E4M3, DF_QBLOCK_F8_E5M2};
    float *x = malloc((size_t)(m * k) * sizeof *x);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = uniform();
    for (int t = 0; t < 2; t++) {
        uint8_t *data = malloc((size_t)(n * k));
        float *wf = malloc((size_t)(n * k) * sizeof *wf);
        for (int64_t i = 0; i < n * k; i++) {
            do {
                data[i] = (uint8_t)next_u32();
                wf[i] = (t == 0 ? df_f8_e4m3_to_f32(data[i]) : df_f8_e5m2_to_f32(data[i]));
            } while (!isfinite(wf[i]) || fabsf(wf[i]) > 64.0f);
            wf[i] *= 0.25f;
        }
        df_i8_blocks w;
        assert_int_equal(df_i8_blocks_of(data, kinds[t], 0.25f, n, k, &w), DF_OK);
        assert_int_equal(df_i8_blocks_shape(&w).n_groups, 1);
        run r;
        run_blocks(&w, x, m, DF_I8_PATH_AUTO, &r);
        double *ref = reference(x, NULL, wf, m, n, k);
        double e = rel_l2(ref, r.out, m * n);
        print_message("fp8 kind %d: rel_l2 %.3g against the float64 product\n", t, e);
        if (e > 3e-2)
            fail_msg("fp8 kind %d: rel_l2 %g against the float64 product", t, e);
        free(ref);
        run_free(&r);
        free(wf);
        free(data);
    }
    free(x);
}

static void test_unsupported_types_are_named(void **state)
{
    (void)state;
    uint8_t data[64] = {0};
    df_i8_blocks w;
    assert_int_equal(df_i8_blocks_of(data, DF_GGML_Q8_1, 1.0f, 1, 32, &w), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "Q8_1"));
    assert_int_equal(df_i8_blocks_of(data, 77, 1.0f, 1, 32, &w), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "77"));
    assert_int_equal(df_i8_blocks_of(data, DF_GGML_F16, 1.0f, 1, 32, &w), DF_E_UNSUPPORTED);
    assert_int_equal(df_i8_blocks_of(data, DF_GGML_Q4_K, 1.0f, 1, 32, &w), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "256"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gguf_types),
        cmocka_unit_test(test_block_integers),
        cmocka_unit_test(test_q8_0_is_the_int8_layout),
        cmocka_unit_test(test_fp8),
        cmocka_unit_test(test_unsupported_types_are_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
