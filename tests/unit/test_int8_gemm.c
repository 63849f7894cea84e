/*
 * The int8 products (backend/cpu/gemm_int8.h): every kernel path this CPU has, and the
 * portable one, against a float64 reference of the same quantized operands (they must agree
 * to f32 rounding), against the float64 product of the unquantized operands (the
 * quantization error, bounded), and against each other (bit for bit: every path of the
 * project's own does the same integer and f32 operations in the same order; oneDNN's, for
 * whole-k groups, agrees to f32 rounding). Sizes cover ragged m, n and k, every
 * group size, and the whole-k group; epilogues cover bias, activations, the gated
 * residual and bf16 output.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_int8.h"
#include "core/alloc.h"

static uint64_t rng_state = 0x1234567u;

static float uniform(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) * (1.0 / (double)(1ull << 23)) - 1.0);
}

static float *random_matrix(int64_t rows, int64_t cols, float scale)
{
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    for (int64_t i = 0; i < rows * cols; i++)
        x[i] = scale * uniform() * (i % 17 == 0 ? 4.0f : 1.0f); /* a few larger values */
    return x;
}

/* The value the packed weight holds for [row, kk], dequantized, in double. */
static double weight_value(const df_i8_weight *w, int64_t row, int64_t kk)
{
    int64_t b = row / DF_I8_NR, c = row % DF_I8_NR, g = kk / w->group;
    int8_t q = w->q[((b * (w->kp / 4) + kk / 4) * DF_I8_NR + c) * 4 + kk % 4];
    return (double)q * w->scale[(b * w->n_groups + g) * DF_I8_NR + c];
}

static double act_value(const df_i8_act *a, int64_t row, int64_t kk)
{
    return ((double)a->q[row * a->kp + kk] - 128.0) * a->scale[row * a->n_groups + kk / a->group];
}

static double activate(int act, double x)
{
    switch (act) {
    case DF_GEMM_ACT_GELU_TANH:
        return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case DF_GEMM_ACT_SILU:
        return x / (1.0 + exp(-x));
    case DF_GEMM_ACT_GELU:
        return 0.5 * x * (1.0 + erf(x * 0.70710678118654752));
    default:
        return x;
    }
}

typedef struct shape {
    int64_t m, n, k, group;
} shape;

static double rel_l2(const double *ref, const float *got, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Runs one product on every available path and checks it; returns the quantization error
 * (relative L2 against the unquantized float64 product). */
static double check_product(shape s, int act, bool gated, bool with_bias)
{
    float *x = random_matrix(s.m, s.k, 1.0f), *wf = random_matrix(s.n, s.k, 0.05f);
    float *bias = with_bias ? random_matrix(1, s.n, 0.5f) : NULL;
    float *gate = gated ? random_matrix(1, s.n, 1.0f) : NULL;
    float *res = gated ? random_matrix(s.m, s.n, 1.0f) : NULL;
    df_i8_weight *w;
    assert_int_equal(df_i8_weight_pack(wf, DF_DTYPE_F32, s.n, s.k, s.k, s.group, &w), DF_OK);
    assert_int_equal(w->group, df_i8_group_for(s.k, s.group));
    assert_true(w->kp % w->group == 0 && w->kp >= s.k);
    void *scratch = malloc(df_i8_act_bytes(w, s.m));
    df_i8_act a;
    df_i8_act_quantize(w, x, DF_DTYPE_F32, s.m, s.k, scratch, &a);

    double *exact = malloc((size_t)(s.m * s.n) * sizeof *exact);
    double *quant = malloc((size_t)(s.m * s.n) * sizeof *quant);
    for (int64_t i = 0; i < s.m; i++)
        for (int64_t j = 0; j < s.n; j++) {
            double e = 0, q = 0;
            for (int64_t kk = 0; kk < s.k; kk++) {
                e += (double)x[i * s.k + kk] * wf[j * s.k + kk];
                q += act_value(&a, i, kk) * weight_value(w, j, kk);
            }
            double b = bias ? bias[j] : 0;
            e += b, q += b;
            if (gated) {
                e = res[i * s.n + j] + gate[j] * e;
                q = res[i * s.n + j] + gate[j] * q;
            } else {
                e = activate(act, e);
                q = activate(act, q);
            }
            exact[i * s.n + j] = e;
            quant[i * s.n + j] = q;
        }

    float *first = NULL;
    int paths = 0;
    for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
        if (!df_i8_path_available((df_i8_path)p))
            continue;
        float *out = malloc((size_t)(s.m * s.n) * sizeof *out);
        df_i8_epilogue e = {.bias = bias,
                            .act = gated ? 0 : act,
                            .gate = gate,
                            .residual = res,
                            .ldr = s.n,
                            .out = out,
                            .ldc = s.n};
        assert_int_equal(df_i8_gemm(&a, w, &e, (df_i8_path)p), DF_OK);
        double err = rel_l2(quant, out, s.m * s.n);
        if (err > 1e-5)
            fail_msg("%s %lldx%lldx%lld group %lld: %.3g from the quantized reference",
                     df_i8_path_name((df_i8_path)p), (long long)s.m, (long long)s.n, (long long)s.k,
                     (long long)s.group, err);
        /* oneDNN's path (whole-k weights only; others fall back) rounds differently */
        bool own = p != DF_I8_PATH_ONEDNN || w->n_groups != 1;
        if (!first)
            first = out;
        else if (own)
            assert_memory_equal(first, out, (size_t)(s.m * s.n) * sizeof *out);
        if (out != first)
            free(out);
        paths++;
    }
    assert_true(paths >= 1);
    double qerr = rel_l2(exact, first, s.m * s.n);

    /* bf16 output: the f32 result rounded */
    uint16_t *half = malloc((size_t)(s.m * s.n) * sizeof *half);
    df_i8_epilogue e = {.bias = bias,
                        .act = gated ? 0 : act,
                        .gate = gate,
                        .residual = res,
                        .ldr = s.n,
                        .out = half,
                        .ldc = s.n,
                        .out_bf16 = true};
    assert_int_equal(df_i8_gemm(&a, w, &e, DF_I8_PATH_AUTO), DF_OK);
    for (int64_t i = 0; i < s.m * s.n; i++)
        assert_int_equal(half[i], df_f32_to_bf16(first[i]));

    free(half);
    free(first);
    free(exact);
    free(quant);
    free(scratch);
    df_i8_weight_free(w);
    free(x);
    free(wf);
    free(bias);
    free(gate);
    free(res);
    return qerr;
}

static void test_paths_agree_with_reference(void **state)
{
    (void)state;
    const shape shapes[] = {
        {1, 1, 4, 32},      {3, 33, 64, 32},
        {5, 64, 128, 32},   {9, 70, 256, 64},
        {17, 96, 384, 128}, {4, 32, 512, 256},
        {7, 40, 100, 32},                                               /* k % 32 != 0: whole k */
        {6, 31, 30, 32},    /* k % 4 != 0: padded */ {130, 65, 192, 0}, /* default group */
        {2, 48, 96, 96},                                                /* group == k: whole k */
        {9, 40, 1300, 32},  /* whole k, cut by the driver's pieces of k */
        {11, 64, 1536, 1536},
        {523, 40, 1100, 64}, /* two chunks of rows (512 and a ragged 11), k cut by pieces */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double err = check_product(shapes[i], 0, false, i % 2 == 0);
        /* uniform data, 8 bits: about 0.5 / 127 of a value's range per operand (a whole k
         * of over a thousand values holds more of the larger ones, so its step is larger) */
        if (err > (shapes[i].k > 1024 ? 2.5e-2 : 1.5e-2))
            fail_msg("shape %zu: quantization error %.3g", i, err);
    }
}

static void test_epilogues(void **state)
{
    (void)state;
    shape s = {11, 72, 160, 32};
    assert_true(check_product(s, DF_GEMM_ACT_GELU_TANH, false, true) < 2e-2);
    assert_true(check_product(s, DF_GEMM_ACT_SILU, false, true) < 2e-2);
    assert_true(check_product(s, DF_GEMM_ACT_GELU, false, false) < 2e-2);
    assert_true(check_product(s, 0, true, true) < 2e-2);
}

/* The gated residual written over its own residual rows (out == residual) gives the bits
 * of the product into separate rows, on every path. */
static void test_gated_residual_in_place(void **state)
{
    (void)state;
    int64_t m = 13, n = 70, k = 96;
    float *x = random_matrix(m, k, 1.0f), *wf = random_matrix(n, k, 0.05f);
    float *bias = random_matrix(1, n, 0.5f), *gate = random_matrix(1, n, 1.0f);
    float *res = random_matrix(m, n, 1.0f);
    float *apart = malloc((size_t)(m * n) * sizeof *apart);
    float *inplace = malloc((size_t)(m * n) * sizeof *inplace);
    /* groups of 32, and the whole k, which oneDNN's path takes (it writes the product
     * before the epilogue reads the residual) */
    int64_t groups[2] = {32, k};
    for (int t = 0; t < 2; t++) {
        df_i8_weight *w;
        assert_int_equal(df_i8_weight_pack(wf, DF_DTYPE_F32, n, k, k, groups[t], &w), DF_OK);
        void *scratch = malloc(df_i8_act_bytes(w, m));
        df_i8_act a;
        df_i8_act_quantize(w, x, DF_DTYPE_F32, m, k, scratch, &a);
        for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
            if (!df_i8_path_available((df_i8_path)p))
                continue;
            df_i8_epilogue e = {.bias = bias, .gate = gate, .residual = res, .ldr = n,
                                .out = apart};
            assert_int_equal(df_i8_gemm(&a, w, &e, (df_i8_path)p), DF_OK);
            memcpy(inplace, res, (size_t)(m * n) * sizeof *inplace);
            e.residual = inplace;
            e.out = inplace;
            assert_int_equal(df_i8_gemm(&a, w, &e, (df_i8_path)p), DF_OK);
            if (memcmp(apart, inplace, (size_t)(m * n) * sizeof *apart) != 0)
                fail_msg("%s, group %lld: in place differs", df_i8_path_name((df_i8_path)p),
                         (long long)groups[t]);
        }
        free(scratch);
        df_i8_weight_free(w);
    }
    free(x), free(wf), free(bias), free(gate), free(res), free(apart), free(inplace);
}

static void test_smaller_groups_are_more_accurate(void **state)
{
    (void)state;
    /* one outlier per row of 256 values: a whole-k scale spends its range on it */
    int64_t m = 8, n = 64, k = 1024;
    float *x = random_matrix(m, k, 1.0f), *wf = random_matrix(n, k, 1.0f);
    for (int64_t i = 0; i < m * k; i += 256)
        x[i] = 60.0f;
    double errs[2];
    int64_t groups[2] = {32, k};
    for (int t = 0; t < 2; t++) {
        df_i8_weight *w;
        assert_int_equal(df_i8_weight_pack(wf, DF_DTYPE_F32, n, k, k, groups[t], &w), DF_OK);
        void *scratch = malloc(df_i8_act_bytes(w, m));
        df_i8_act a;
        df_i8_act_quantize(w, x, DF_DTYPE_F32, m, k, scratch, &a);
        float *out = malloc((size_t)(m * n) * sizeof *out);
        assert_int_equal(df_i8_gemm(&a, w, &(df_i8_epilogue){.out = out}, DF_I8_PATH_AUTO), DF_OK);
        double *ref = malloc((size_t)(m * n) * sizeof *ref);
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double e = 0;
                for (int64_t kk = 0; kk < k; kk++)
                    e += (double)x[i * k + kk] * wf[j * k + kk];
                ref[i * n + j] = e;
            }
        errs[t] = rel_l2(ref, out, m * n);
        free(ref);
        free(out);
        free(scratch);
        df_i8_weight_free(w);
    }
    assert_true(errs[0] < errs[1]);
    free(x);
    free(wf);
}

static void test_bf16_inputs(void **state)
{
    (void)state;
    /* bf16 weights and activations quantize exactly like their f32 values */
    int64_t m = 5, n = 40, k = 96;
    float *x = random_matrix(m, k, 1.0f), *wf = random_matrix(n, k, 0.1f);
    uint16_t *xh = malloc((size_t)(m * k) * 2), *wh = malloc((size_t)(n * k) * 2);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = df_bf16_to_f32(xh[i] = df_f32_to_bf16(x[i]));
    for (int64_t i = 0; i < n * k; i++)
        wf[i] = df_bf16_to_f32(wh[i] = df_f32_to_bf16(wf[i]));
    df_i8_weight *w1, *w2;
    assert_int_equal(df_i8_weight_pack(wf, DF_DTYPE_F32, n, k, k, 32, &w1), DF_OK);
    assert_int_equal(df_i8_weight_pack(wh, DF_DTYPE_BF16, n, k, k, 32, &w2), DF_OK);
    size_t bytes = df_i8_weight_bytes(n, k, 32);
    assert_memory_equal(w1->q, w2->q, (size_t)(w1->n_blocks * w1->kp * DF_I8_NR));
    assert_memory_equal(w1->scale, w2->scale, (size_t)(w1->n_blocks * w1->n_groups * DF_I8_NR) * 4);
    assert_true(bytes > (size_t)(n * k));
    void *s1 = malloc(df_i8_act_bytes(w1, m)), *s2 = malloc(df_i8_act_bytes(w1, m));
    df_i8_act a1, a2;
    df_i8_act_quantize(w1, x, DF_DTYPE_F32, m, k, s1, &a1);
    df_i8_act_quantize(w1, xh, DF_DTYPE_BF16, m, k, s2, &a2);
    assert_memory_equal(a1.q, a2.q, (size_t)(m * a1.kp));
    assert_memory_equal(a1.scale, a2.scale, (size_t)(m * a1.n_groups) * 4);
    free(s1);
    free(s2);
    df_i8_weight_free(w1);
    df_i8_weight_free(w2);
    free(x);
    free(wf);
    free(xh);
    free(wh);
}

/* The activations' quantizer (vectorised where the CPU allows) gives the bytes and scales
 * of the scalar rule, df_i8_round per value, for groups, the whole k, a k padded past its
 * end, a zero row, a tiny value and ties of the rounding. */
static void test_activations_follow_the_rounding_rule(void **state)
{
    (void)state;
    const shape shapes[] = {{3, 32, 256, 32}, {2, 32, 100, 0}, {2, 32, 30, 32}, {4, 32, 384, 128}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        shape s = shapes[si];
        float *x = random_matrix(s.m, s.k, 3.0f), *wf = random_matrix(s.n, s.k, 0.1f);
        memset(x, 0, (size_t)s.k * sizeof *x); /* row 0: zeros */
        x[s.k + 1] = 3.0f * 127.0f / 126.0f; /* scales the row so that 1.5 and 2.5 are ties */
        x[s.k + 2] = 1.5f * 3.0f / 126.0f;
        x[s.k + 3] = 2.5f * 3.0f / 126.0f;
        x[s.k + 5] = 1e-30f;
        uint16_t *xh = malloc((size_t)(s.m * s.k) * 2);
        for (int64_t i = 0; i < s.m * s.k; i++)
            xh[i] = df_f32_to_bf16(x[i]);
        df_i8_weight *w;
        assert_int_equal(df_i8_weight_pack(wf, DF_DTYPE_F32, s.n, s.k, s.k, s.group, &w), DF_OK);
        void *scratch = malloc(df_i8_act_bytes(w, s.m));
        for (int bf16 = 0; bf16 < 2; bf16++) {
            df_i8_act a;
            df_i8_act_quantize(w, bf16 ? (void *)xh : (void *)x,
                               bf16 ? DF_DTYPE_BF16 : DF_DTYPE_F32, s.m, s.k, scratch, &a);
            for (int64_t r = 0; r < s.m; r++)
                for (int64_t g = 0; g < w->n_groups; g++) {
                    float amax = 0;
                    for (int64_t kk = g * w->group; kk < (g + 1) * w->group && kk < s.k; kk++) {
                        float v = bf16 ? df_bf16_to_f32(xh[r * s.k + kk]) : x[r * s.k + kk];
                        amax = fmaxf(amax, fabsf(v));
                    }
                    float inv = amax > 0 ? 127.0f / amax : 0.0f;
                    assert_true(a.scale[r * w->n_groups + g] == amax / 127.0f);
                    for (int64_t kk = g * w->group; kk < (g + 1) * w->group; kk++) {
                        float v = kk >= s.k ? 0.0f
                                  : bf16    ? df_bf16_to_f32(xh[r * s.k + kk])
                                            : x[r * s.k + kk];
                        assert_int_equal(a.q[r * w->kp + kk], (uint8_t)(df_i8_round(v, inv) + 128));
                    }
                }
        }
        free(scratch);
        df_i8_weight_free(w);
        free(x);
        free(xh);
        free(wf);
    }
}

static void test_forcing_a_path(void **state)
{
    (void)state;
    assert_int_equal(df_i8_force_path(DF_I8_PATH_PORTABLE), DF_OK);
    assert_int_equal(df_i8_path_best(), DF_I8_PATH_PORTABLE);
    for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
        if (df_i8_path_available((df_i8_path)p)) {
            assert_int_equal(df_i8_force_path((df_i8_path)p), DF_OK);
            assert_int_equal(df_i8_path_best(), p);
        } else {
            assert_int_equal(df_i8_force_path((df_i8_path)p), DF_E_UNSUPPORTED);
        }
    }
    assert_int_equal(df_i8_force_path(DF_I8_PATH_AUTO), DF_OK);
    assert_int_not_equal(df_i8_path_best(), DF_I8_PATH_AUTO);
    print_message("int8 paths on this CPU:%s%s%s%s%s; dispatched: %s\n",
                  df_i8_path_available(DF_I8_PATH_PORTABLE) ? " portable" : "",
                  df_i8_path_available(DF_I8_PATH_AVX2) ? " avx2" : "",
                  df_i8_path_available(DF_I8_PATH_AVX_VNNI) ? " avx-vnni" : "",
                  df_i8_path_available(DF_I8_PATH_AVX512_VNNI) ? " avx512-vnni" : "",
                  df_i8_path_available(DF_I8_PATH_ONEDNN) ? " onednn" : "",
                  df_i8_path_name(df_i8_path_best()));
}

int main(void)
{
    /* AUTO on whole-k weights is the project's kernel here, whose bits the checks compare;
     * the measured choice with oneDNN is test_int8_gemm_choice's */
    setenv("DIFFUSE_INT8_GEMM", "own", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_paths_agree_with_reference),
        cmocka_unit_test(test_epilogues),
        cmocka_unit_test(test_gated_residual_in_place),
        cmocka_unit_test(test_smaller_groups_are_more_accurate),
        cmocka_unit_test(test_bf16_inputs),
        cmocka_unit_test(test_activations_follow_the_rounding_rule),
        cmocka_unit_test(test_forcing_a_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
