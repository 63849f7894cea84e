/*
 * Attention under int8 compute (backend/cpu/k_attention_int8.c: Q K^T in int8 with K
 * smoothed, P V in int8 with V smoothed and P as 14-bit fixed point), through the public op
 * API, against a float64 reference of the unquantized inputs: relative L2 error at most
 * 1e-2, in eager and defer-and-fuse mode. The cases cover ragged query and key blocks,
 * several key blocks, head dimensions that are not a multiple of 4, causal and additive
 * masks, rows with every key masked, permuted views, keys and values that share a large
 * offset (which the smoothing removes) and a peaked softmax (many small probabilities,
 * which an 8-bit P would lose). The portable kernels and the AVX2 and AVX512-VNNI ones
 * (where the CPU has them) give the same bits, P's quantization is checked on its own, and
 * DIFFUSE_INT8_ATTENTION=0 gives int8 compute f32 attention (1e-5).
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

#include <diffuse/diffuse.h>

#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/k_attention_int8.h"

typedef struct attn_case {
    int64_t B, H, Sq, Sk, D, Dv;
    bool causal, mask, dead_row, permuted;
    double k_offset; /* added to every key */
    double v_offset; /* added to every value */
    double q_range;  /* queries uniform in [-q_range, q_range) (0: 3) */
} attn_case;

static const attn_case cases[] = {
    {1, 2, 77, 77, 32, 32, false, false, false, false, 0},
    {2, 3, 1, 77, 16, 24, false, true, false, false, 0}, /* one query, Dv != D, a mask */
    {1, 2, 130, 600, 64, 64, false, true, false, true, 0}, /* tails of both blocks */
    {1, 1, 200, 200, 32, 32, true, false, false, false, 0},
    {1, 2, 77, 1100, 6, 16, true, false, false, false, 0}, /* D = 6, three key blocks */
    {2, 3, 77, 1, 8, 8, false, false, false, true, 0},     /* a single key */
    {1, 1, 5, 9, 8, 8, false, true, true, false, 0},       /* a row with every key masked */
    {1, 4, 64, 300, 128, 128, false, false, false, true, 8.0}, /* keys far from zero */
    {1, 2, 40, 700, 64, 64, false, false, false, false, 0, 4.0}, /* values far from zero */
    {1, 2, 64, 1500, 64, 64, false, false, false, false, 0, 0, 4.0}, /* a peaked softmax */
};

static uint64_t rng_state = 0x2545f4914f6cdd1dull;

static double uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

/* [B, H, S, n] values in `x` as a tensor: dense, or [B, S, H, n] permuted to [B, H, S, n]. */
static df_tensor *input(df_ctx *ctx, const attn_case *c, int64_t S, int64_t n, const double *x)
{
    int64_t B = c->B, H = c->H;
    float *f = malloc((size_t)(B * H * S * n) * sizeof *f);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t d = 0; d < n; d++) {
                    int64_t src = ((b * H + h) * S + s) * n + d;
                    int64_t dst = c->permuted ? ((b * S + s) * H + h) * n + d : src;
                    f[dst] = (float)x[src];
                }
    df_tensor *t = c->permuted ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, H, n), f)
                               : df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, H, S, n), f);
    free(f);
    return c->permuted ? df_permute(ctx, t, DF_SHAPE(0, 2, 1, 3)) : t;
}

typedef struct attn_data {
    double *q, *k, *v, *m, *ref;
    int64_t n_out;
} attn_data;

static void make_data(const attn_case *c, attn_data *a)
{
    int64_t B = c->B, H = c->H, Sq = c->Sq, Sk = c->Sk, D = c->D, Dv = c->Dv;
    a->q = malloc((size_t)(B * H * Sq * D) * 8);
    a->k = malloc((size_t)(B * H * Sk * D) * 8);
    a->v = malloc((size_t)(B * H * Sk * Dv) * 8);
    a->m = malloc((size_t)(Sq * Sk) * 8);
    for (int64_t i = 0; i < B * H * Sq * D; i++)
        a->q[i] = (c->q_range > 0 ? c->q_range : 3) * uniform(); /* the softmax matters */
    for (int64_t i = 0; i < B * H * Sk * D; i++)
        a->k[i] = uniform() + (i % D % 3 == 0 ? c->k_offset : 0.0);
    for (int64_t i = 0; i < B * H * Sk * Dv; i++)
        a->v[i] = uniform() + (i % Dv % 2 == 0 ? c->v_offset : 0.0);
    for (int64_t i = 0; i < Sq * Sk; i++)
        a->m[i] = c->dead_row && (i / Sk == 2 || i % 3 == 0) ? -INFINITY : 0.5 * uniform();
    a->n_out = B * H * Sq * Dv;
    a->ref = calloc((size_t)a->n_out, 8);
    double scale = 1.0 / sqrt((double)D), *s = malloc((size_t)Sk * 8);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < Sq; i++) {
            double mx = -INFINITY, sum = 0;
            for (int64_t j = 0; j < Sk; j++) {
                double acc = 0;
                for (int64_t d = 0; d < D; d++)
                    acc += a->q[(bh * Sq + i) * D + d] * a->k[(bh * Sk + j) * D + d];
                s[j] = acc * scale + (c->mask ? a->m[i * Sk + j] : 0.0);
                if (c->causal && j > i)
                    s[j] = -INFINITY;
                mx = s[j] > mx ? s[j] : mx;
            }
            if (mx == -INFINITY)
                continue; /* every key masked: zeros */
            for (int64_t j = 0; j < Sk; j++)
                sum += s[j] = exp(s[j] - mx);
            for (int64_t j = 0; j < Sk; j++)
                for (int64_t d = 0; d < Dv; d++)
                    a->ref[(bh * Sq + i) * Dv + d] += s[j] / sum * a->v[(bh * Sk + j) * Dv + d];
        }
    free(s);
}

static void free_data(attn_data *a)
{
    free(a->q), free(a->k), free(a->v), free(a->m), free(a->ref);
}

/* The op's output in [B, H, Sq, Dv] order, as doubles (caller frees). */
static double *run(df_eager_mode mode, const attn_case *c, const attn_data *a)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = DF_DTYPE_I8, .mode = mode},
                                   &ctx),
                     DF_OK);
    df_tensor *q = input(ctx, c, c->Sq, c->D, a->q), *k = input(ctx, c, c->Sk, c->D, a->k);
    df_tensor *v = input(ctx, c, c->Sk, c->Dv, a->v), *m = NULL;
    if (c->mask) {
        float *mf = malloc((size_t)(c->Sq * c->Sk) * sizeof *mf);
        for (int64_t i = 0; i < c->Sq * c->Sk; i++)
            mf[i] = (float)a->m[i];
        m = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(c->Sq, c->Sk), mf);
        free(mf);
    }
    df_tensor *y = df_attention(ctx, q, k, v, m, c->causal, 0);
    double *got = malloc((size_t)a->n_out * 8);
    df_status s = y ? df_tensor_read(ctx, y, DF_DTYPE_F64, got, (size_t)a->n_out * 8)
                    : df_ctx_status(ctx);
    if (s != DF_OK)
        print_error("%s\n", df_error_message());
    assert_int_equal(s, DF_OK);
    df_ctx_free(ctx);
    return got;
}

static double rel_l2(const double *got, const double *ref, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        assert_true(isfinite(got[i]));
        num += (got[i] - ref[i]) * (got[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void test_error_bound(void **state)
{
    (void)state;
    static const df_eager_mode modes[2] = {DF_DEFER_NEVER, DF_DEFER_AND_FUSE};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        attn_data a;
        make_data(&cases[i], &a);
        for (int mi = 0; mi < 2; mi++) {
            double *got = run(modes[mi], &cases[i], &a);
            double e = rel_l2(got, a.ref, a.n_out);
            print_message("case %zu, mode %d: relative L2 error %.3g\n", i, mi, e);
            if (!(e <= 1e-2)) {
                print_error("case %zu, mode %d: relative L2 error %.3g > 1e-2\n", i, mi, e);
                fail();
            }
            free(got);
        }
        free_data(&a);
    }
}

/* Every scores kernel this CPU has (AVX2, AVX512-VNNI) gives the portable one's bits. */
static void test_paths_agree(void **state)
{
    (void)state;
    const df_i8_path paths[] = {DF_I8_PATH_AVX2, DF_I8_PATH_AVX512_VNNI};
    int compared = 0;
    for (int p = 0; p < 2; p++) {
        if (!df_i8_path_available(paths[p]))
            continue;
        compared++;
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            attn_data a;
            make_data(&cases[i], &a);
            assert_int_equal(df_i8_force_path(DF_I8_PATH_PORTABLE), DF_OK);
            double *plain = run(DF_DEFER_NEVER, &cases[i], &a);
            assert_int_equal(df_i8_force_path(paths[p]), DF_OK);
            double *fast = run(DF_DEFER_NEVER, &cases[i], &a);
            assert_int_equal(df_i8_force_path(DF_I8_PATH_AUTO), DF_OK);
            for (int64_t j = 0; j < a.n_out; j++)
                if (plain[j] != fast[j]) {
                    print_error("case %zu: element %lld: portable %.9g, %s %.9g\n", i, (long long)j,
                                plain[j], df_i8_path_name(paths[p]), fast[j]);
                    fail();
                }
            free(plain), free(fast);
            free_data(&a);
        }
    }
    if (!compared)
        skip(); /* only the portable kernel on this CPU: nothing to compare */
}

/* P's two planes hold z = round(p * 16383 / pmax) (the largest p gives 16383), 7 bits
 * each, zeros past n; the returned sum is the quantized values' (what P V multiplies). */
static void test_p_quantize(void **state)
{
    (void)state;
    enum { n = 37, n4 = 40 };
    float p[n], scale;
    uint8_t u[2 * n4];
    memset(u, 0xaa, sizeof u);
    for (int j = 0; j < n; j++)
        p[j] = (float)exp(-0.4 * j);
    p[5] = 0;
    float pmax = p[0], sum = df_attn_i8_p_quantize(p, n, n4, pmax, u, &scale);
    assert_true(scale == pmax / 16383.0f);
    int64_t total = 0;
    for (int j = 0; j < n4; j++) {
        long z = (long)u[j] * 128 + u[n4 + j];
        long want = j < n ? lrintf(p[j] * (16383.0f / pmax)) : 0;
        if (z != want) {
            print_error("p[%d] = %.9g: z %ld, want %ld\n", j, p[j], z, want);
            fail();
        }
        total += z;
    }
    assert_int_equal(u[0], 127); /* 7 bits per plane */
    assert_int_equal(u[n4], 127);
    assert_true(sum == (float)total * scale);
    /* an all-zero (all masked) row: zeros and a zero sum */
    assert_true(df_attn_i8_p_quantize(p, 0, n4, 0, u, &scale) == 0);
    for (int j = 0; j < 2 * n4; j++)
        assert_int_equal(u[j], 0);
}

static void test_switch_off(void **state)
{
    (void)state;
    setenv("DIFFUSE_INT8_ATTENTION", "0", 1);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        attn_data a;
        make_data(&cases[i], &a);
        double *got = run(DF_DEFER_NEVER, &cases[i], &a);
        double e = rel_l2(got, a.ref, a.n_out);
        if (!(e <= 1e-5)) {
            print_error("case %zu: f32 attention's relative L2 error %.3g > 1e-5\n", i, e);
            fail();
        }
        free(got);
        free_data(&a);
    }
    unsetenv("DIFFUSE_INT8_ATTENTION");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_bound),
        cmocka_unit_test(test_paths_agree),
        cmocka_unit_test(test_p_quantize),
        cmocka_unit_test(test_switch_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
