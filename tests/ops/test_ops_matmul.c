/*
 * Op tests for the matrix products: linear, matmul, attention, conv2d.
 *
 * Every case runs through the public op API on random inputs against a float64
 * reference computed here from the values the tensors actually hold (bf16/f16 weights
 * rounded first), in each execution mode the context supports and in both compute dtypes:
 * f32 compute must agree to a relative L2 error of 1e-5, bf16 compute to 1e-2. The
 * cases include tiny and odd sizes, sizes that are not multiples of the kernels' blocks,
 * broadcasting and non-contiguous views. One test checks that a weight is packed once
 * (on devices that run the CPU's kernels: cpu and sim).
 *
 * The device is the library's default, or the one $DIFFUSE_DEVICE names (ctest runs this
 * program on cpu, on sim and on vulkan:0). The program prints which device it ran on and
 * fails when a device other than the CPU dispatched no kernel: the products ran there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "backend/cpu/gemm.h"

static const df_eager_mode modes[] = {DF_DEFER_NEVER, DF_DEFER_AND_FUSE};
static const char *const mode_names[] = {"eager", "fuse"};
static const df_dtype computes[] = {DF_DTYPE_F32, DF_DTYPE_BF16};
#define N_MODES    2
#define N_COMPUTES 2

/* The device the contexts opened, and the kernels dispatched there (ctx_done adds them). */
static char device[64];
static int64_t dispatched;

/* A context in `mode`, or NULL when this build does not offer the mode yet. */
static df_ctx *ctx_for(int mode, df_dtype compute)
{
    df_ctx *ctx = NULL;
    df_status s = df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = compute}, &ctx);
    assert_int_equal(s, DF_OK);
    s = df_set_eager_mode(ctx, modes[mode]);
    if (s == DF_E_UNSUPPORTED) {
        df_ctx_free(ctx);
        return NULL;
    }
    assert_int_equal(s, DF_OK);
    snprintf(device, sizeof device, "%s", df_ctx_device_name(ctx));
    return ctx;
}

static void ctx_done(df_ctx *ctx)
{
    df_stats st;
    df_ctx_stats(ctx, &st);
    dispatched += st.device_dispatches;
    df_ctx_free(ctx);
}

/* Whether the context runs the CPU's kernels (cpu, and sim, which runs them on its own
 * memory), so the CPU GEMM's counters move. */
static bool cpu_kernels(const df_ctx *ctx)
{
    const char *name = df_ctx_device_name(ctx);
    return strncmp(name, "cpu", 3) == 0 || strncmp(name, "sim", 3) == 0;
}

/* --- data ------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void) /* [-1, 1) */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 52) - 1.0;
}

static double *random_values(int64_t n)
{
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = uniform();
    return v;
}

/* A tensor of `dtype` holding `vals` rounded to it; vals is overwritten with what the
 * tensor holds, so the reference sees the same numbers. */
static df_tensor *tensor_of(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                            double *vals)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    void *buf = malloc((size_t)(n > 0 ? n : 1) * 4);
    assert_non_null(buf);
    for (int64_t i = 0; i < n; i++) {
        float f = (float)vals[i];
        if (dtype == DF_DTYPE_BF16) {
            ((uint16_t *)buf)[i] = df_f32_to_bf16(f);
            vals[i] = df_bf16_to_f32(((uint16_t *)buf)[i]);
        } else if (dtype == DF_DTYPE_F16) {
            ((uint16_t *)buf)[i] = df_f32_to_f16(f);
            vals[i] = df_f16_to_f32(((uint16_t *)buf)[i]);
        } else {
            ((float *)buf)[i] = f;
            vals[i] = f;
        }
    }
    df_tensor *t = df_tensor_from_host(ctx, dtype, shape, ndim, buf);
    free(buf);
    assert_non_null(t);
    return t;
}

/* Relative L2 error of got against ref, checked against the compute dtype's bound. */
static void check_close(df_ctx *ctx, df_tensor *t, const double *ref, int64_t n, df_dtype compute,
                        const char *what)
{
    assert_non_null(t);
    assert_int_equal(df_tensor_numel(t), n);
    double *got = malloc((size_t)(n > 0 ? n : 1) * sizeof *got);
    assert_non_null(got);
    df_status s = df_tensor_read(ctx, t, DF_DTYPE_F64, got, (size_t)n * sizeof *got);
    if (s != DF_OK)
        print_error("%s: %s\n", what, df_error_message());
    assert_int_equal(s, DF_OK);
    double num = 0, den = 0, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        worst = fabs(d) > worst ? fabs(d) : worst;
        if (!isfinite(got[i])) {
            print_error("%s: element %lld is %g (reference %g)\n", what, (long long)i, got[i],
                        ref[i]);
            fail();
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    double tol = compute == DF_DTYPE_BF16 ? 1e-2 : 1e-5;
    if (!(rel <= tol)) {
        print_error("%s (%s compute): relative L2 error %.3g > %.0e (max abs %.3g)\n", what,
                    df_dtype_name(compute), rel, tol, worst);
        fail();
    }
    free(got);
}

/* --- linear ------------------------------------------------------------------------------ */

typedef struct linear_case {
    int xnd;
    int64_t xshape[3]; /* last is K */
    int64_t n;
    bool bias;
    df_dtype wtype, btype;
} linear_case;

static const linear_case linear_cases[] = {
    {2, {5, 7}, 9, true, DF_DTYPE_F32, DF_DTYPE_F32},
    {2, {1, 3}, 1, true, DF_DTYPE_F32, DF_DTYPE_F32}, /* M = 1, K = 3, N = 1 */
    {2, {1, 3}, 1, false, DF_DTYPE_BF16, DF_DTYPE_F32},
    {3, {2, 3, 17}, 33, true, DF_DTYPE_BF16, DF_DTYPE_F32},
    {2, {4, 64}, 48, false, DF_DTYPE_F16, DF_DTYPE_F32},
    {3, {2, 77, 130}, 70, true, DF_DTYPE_BF16, DF_DTYPE_BF16},
    {2, {33, 129}, 257, true, DF_DTYPE_F16, DF_DTYPE_F16},
};

static void run_linear(df_ctx *ctx, df_dtype compute, const linear_case *c, bool persist,
                       const char *mode)
{
    int64_t K = c->xshape[c->xnd - 1], N = c->n, M = 1;
    for (int d = 0; d < c->xnd - 1; d++)
        M *= c->xshape[d];
    double *x = random_values(M * K), *w = random_values(N * K), *b = random_values(N);
    df_tensor *tx = tensor_of(ctx, DF_DTYPE_F32, c->xshape, c->xnd, x);
    df_tensor *tw = tensor_of(ctx, c->wtype, DF_SHAPE(N, K), w);
    df_tensor *tb = c->bias ? tensor_of(ctx, c->btype, DF_SHAPE(N), b) : NULL;
    if (persist) {
        df_tensor_persist(tw);
        if (tb)
            df_tensor_persist(tb);
    }
    df_tensor *y = df_linear(ctx, tx, &(df_linear_weights){tw, tb});
    double *ref = calloc((size_t)(M * N), sizeof *ref);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double acc = c->bias ? b[j] : 0;
            for (int64_t k = 0; k < K; k++)
                acc += x[i * K + k] * w[j * K + k];
            ref[i * N + j] = acc;
        }
    char what[160];
    snprintf(what, sizeof what, "linear [%lld, %lld] x %s [%lld, %lld]^T%s%s, %s", (long long)M,
             (long long)K, df_dtype_name(c->wtype), (long long)N, (long long)K,
             c->bias ? " + bias" : "", persist ? " (weight)" : "", mode);
    assert_int_equal(df_tensor_ndim(y), c->xnd);
    assert_int_equal(df_tensor_dim(y, -1), N);
    check_close(ctx, y, ref, M * N, compute, what);
    if (persist) {
        df_tensor_free(tw);
        df_tensor_free(tb);
    }
    free(x), free(w), free(b), free(ref);
}

static void test_linear(void **state)
{
    (void)state;
    for (int mode = 0; mode < N_MODES; mode++)
        for (int ci = 0; ci < N_COMPUTES; ci++) {
            df_ctx *ctx = ctx_for(mode, computes[ci]);
            if (!ctx)
                continue;
            for (size_t i = 0; i < sizeof linear_cases / sizeof *linear_cases; i++)
                for (int persist = 0; persist < 2; persist++)
                    run_linear(ctx, computes[ci], &linear_cases[i], persist, mode_names[mode]);
            ctx_done(ctx);
        }
}

static void test_weight_is_packed_once(void **state)
{
    (void)state;
    for (int ci = 0; ci < N_COMPUTES; ci++) {
        df_ctx *ctx = ctx_for(0, computes[ci]);
        if (!cpu_kernels(ctx)) { /* the count is the CPU GEMM's */
            printf("test_weight_is_packed_once: not run on %s (it counts the CPU GEMM's "
                   "packs)\n", df_ctx_device_name(ctx));
            ctx_done(ctx);
            return;
        }
        int64_t M = 37, K = 96, N = 80;
        double *x = random_values(M * K), *w = random_values(N * K), *b = random_values(N);
        df_tensor *tx = tensor_of(ctx, DF_DTYPE_F32, DF_SHAPE(M, K), x);
        df_tensor *tw = df_tensor_persist(tensor_of(ctx, DF_DTYPE_BF16, DF_SHAPE(N, K), w));
        df_tensor *tb = df_tensor_persist(tensor_of(ctx, DF_DTYPE_F32, DF_SHAPE(N), b));
        df_linear_weights lw = {tw, tb};
        float y1[37 * 80], y2[37 * 80];
        int64_t before = df_gemm_pack_count();
        df_tensor *a = df_linear(ctx, tx, &lw);
        assert_int_equal(df_tensor_read(ctx, a, DF_DTYPE_F32, y1, sizeof y1), DF_OK);
        int64_t after_first = df_gemm_pack_count();
        df_tensor *c = df_linear(ctx, tx, &lw);
        assert_int_equal(df_tensor_read(ctx, c, DF_DTYPE_F32, y2, sizeof y2), DF_OK);
        assert_int_equal(after_first - before, 1);           /* packed on first use */
        assert_int_equal(df_gemm_pack_count(), after_first); /* and reused */
        assert_memory_equal(y1, y2, sizeof y1);

        /* A tensor that is not a weight is never packed or cached. */
        df_tensor *tw2 = tensor_of(ctx, DF_DTYPE_BF16, DF_SHAPE(N, K), w);
        df_tensor *d = df_linear(ctx, tx, &(df_linear_weights){tw2, NULL});
        assert_int_equal(df_tensor_read(ctx, d, DF_DTYPE_F32, y2, sizeof y2), DF_OK);
        assert_int_equal(df_gemm_pack_count(), after_first);
        df_tensor_free(tw);
        df_tensor_free(tb);
        ctx_done(ctx);
        free(x), free(w), free(b);
    }
}

/* --- matmul ------------------------------------------------------------------------------ */

typedef struct matmul_case {
    int and_, bnd;
    int64_t ashape[4], bshape[4]; /* b as the op sees it: [..., K, N] */
    bool b_trans;                 /* b is the transpose of a dense [..., N, K] */
} matmul_case;

static const matmul_case matmul_cases[] = {
    {3, 3, {3, 5, 7}, {3, 7, 4}, false},
    {4, 2, {2, 3, 6, 5}, {5, 8}, false}, /* 2-D b shared by the batch */
    {3, 3, {3, 5, 7}, {3, 7, 4}, true},
    {2, 2, {11, 6}, {6, 9}, true},
    {2, 2, {1, 1}, {1, 1}, false},
    {3, 3, {2, 77, 40}, {2, 40, 130}, true},
};

static void run_matmul(df_ctx *ctx, df_dtype compute, const matmul_case *c, const char *mode)
{
    int64_t M = c->ashape[c->and_ - 2], K = c->ashape[c->and_ - 1], N = c->bshape[c->bnd - 1];
    int64_t batch = 1;
    for (int d = 0; d < c->and_ - 2; d++)
        batch *= c->ashape[d];
    int64_t bbatch = c->bnd == 2 ? 1 : batch;
    double *a = random_values(batch * M * K), *b = random_values(bbatch * K * N);
    df_tensor *ta = tensor_of(ctx, DF_DTYPE_F32, c->ashape, c->and_, a);
    df_tensor *tb;
    double *bref = b; /* [bbatch, K, N] */
    if (c->b_trans) {
        /* store b as dense [..., N, K] and hand the op its transpose */
        int64_t st[4];
        memcpy(st, c->bshape, sizeof st);
        st[c->bnd - 2] = N;
        st[c->bnd - 1] = K;
        tb = tensor_of(ctx, DF_DTYPE_F32, st, c->bnd, b); /* b read as [bbatch, N, K] */
        tb = df_transpose(ctx, tb, -1, -2);
        assert_false(df_tensor_is_contiguous(tb));
        bref = malloc((size_t)(bbatch * K * N) * sizeof *bref);
        for (int64_t z = 0; z < bbatch; z++)
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < N; j++)
                    bref[(z * K + k) * N + j] = b[(z * N + j) * K + k];
    } else {
        tb = tensor_of(ctx, DF_DTYPE_F32, c->bshape, c->bnd, b);
    }
    df_tensor *y = df_matmul(ctx, ta, tb);
    double *ref = calloc((size_t)(batch * M * N), sizeof *ref);
    for (int64_t z = 0; z < batch; z++) {
        const double *bz = bref + (c->bnd == 2 ? 0 : z) * K * N;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += a[(z * M + i) * K + k] * bz[k * N + j];
                ref[(z * M + i) * N + j] = acc;
            }
    }
    char what[160];
    snprintf(what, sizeof what, "matmul batch %lld [%lld, %lld] @ [%lld, %lld]%s%s, %s",
             (long long)batch, (long long)M, (long long)K, (long long)K, (long long)N,
             c->bnd == 2 ? " shared" : "", c->b_trans ? " transposed" : "", mode);
    check_close(ctx, y, ref, batch * M * N, compute, what);
    if (bref != b)
        free(bref);
    free(a), free(b), free(ref);
}

static void test_matmul(void **state)
{
    (void)state;
    for (int mode = 0; mode < N_MODES; mode++)
        for (int ci = 0; ci < N_COMPUTES; ci++) {
            df_ctx *ctx = ctx_for(mode, computes[ci]);
            if (!ctx)
                continue;
            for (size_t i = 0; i < sizeof matmul_cases / sizeof *matmul_cases; i++)
                run_matmul(ctx, computes[ci], &matmul_cases[i], mode_names[mode]);
            ctx_done(ctx);
        }
}

/* --- attention --------------------------------------------------------------------------- */

typedef enum mask_kind { MASK_NONE, MASK_FULL, MASK_KEYS, MASK_QK, MASK_DEAD_ROW } mask_kind;

typedef struct attn_case {
    int64_t B, H, Sq, Sk, D, Dv;
    mask_kind mask;
    bool causal;
    bool bshd;   /* q, k, v are [B, S, H, D] tensors permuted to [B, H, S, D] */
    float scale; /* 0: 1/sqrt(D) */
} attn_case;

static const attn_case attn_cases[] = {
    {1, 2, 77, 77, 32, 32, MASK_NONE, false, false, 0},
    {2, 3, 1, 77, 16, 24, MASK_FULL, false, false, 0},     /* one query, Dv != D */
    {1, 2, 130, 600, 64, 64, MASK_KEYS, false, false, 0},  /* tails of query and key blocks */
    {1, 1, 200, 200, 32, 32, MASK_NONE, true, false, 0},   /* causal over several blocks */
    {1, 2, 77, 600, 32, 16, MASK_NONE, true, false, 0.3f}, /* causal, Sq != Sk */
    {2, 3, 77, 1, 8, 8, MASK_NONE, false, true, 0},        /* a single key */
    {2, 4, 77, 77, 32, 32, MASK_QK, false, true, 0},       /* permuted views, [Sq, Sk] mask */
    {1, 2, 260, 513, 24, 40, MASK_QK, true, true, 0},
    {1, 1, 5, 9, 8, 8, MASK_DEAD_ROW, false, false, 0}, /* a row with every key masked */
};

/* The mask's own shape for a case, broadcast to [B, H, Sq, Sk] by the op. */
static int mask_shape(const attn_case *c, int64_t *shape)
{
    switch (c->mask) {
    case MASK_FULL:
        memcpy(shape, (int64_t[]){c->B, c->H, c->Sq, c->Sk}, 4 * sizeof *shape);
        return 4;
    case MASK_KEYS:
        memcpy(shape, (int64_t[]){c->B, 1, 1, c->Sk}, 4 * sizeof *shape);
        return 4;
    default:
        memcpy(shape, (int64_t[]){c->Sq, c->Sk}, 2 * sizeof *shape);
        return 2;
    }
}

/* q/k/v tensor [B, H, S, n] from values laid out as [B, H, S, n]. */
static df_tensor *attn_input(df_ctx *ctx, const attn_case *c, int64_t S, int64_t n, double *v)
{
    if (!c->bshd)
        return tensor_of(ctx, DF_DTYPE_F32, DF_SHAPE(c->B, c->H, S, n), v);
    /* store as [B, S, H, n] and permute; v keeps the [B, H, S, n] order for the reference */
    double *t = malloc((size_t)(c->B * S * c->H * n) * sizeof *t);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t h = 0; h < c->H; h++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t d = 0; d < n; d++)
                    t[((b * S + s) * c->H + h) * n + d] = v[((b * c->H + h) * S + s) * n + d];
    df_tensor *x = tensor_of(ctx, DF_DTYPE_F32, DF_SHAPE(c->B, S, c->H, n), t);
    free(t);
    x = df_permute(ctx, x, DF_SHAPE(0, 2, 1, 3));
    if (S > 1 && c->H > 1)
        assert_false(df_tensor_is_contiguous(x));
    return x;
}

static void run_attention(df_ctx *ctx, df_dtype compute, const attn_case *c, const char *mode)
{
    int64_t B = c->B, H = c->H, Sq = c->Sq, Sk = c->Sk, D = c->D, Dv = c->Dv;
    double *q = random_values(B * H * Sq * D), *k = random_values(B * H * Sk * D);
    double *v = random_values(B * H * Sk * Dv);
    for (int64_t i = 0; i < B * H * Sq * D; i++)
        q[i] *= 3; /* peaked enough that the softmax matters */
    df_tensor *tq = attn_input(ctx, c, Sq, D, q), *tk = attn_input(ctx, c, Sk, D, k);
    df_tensor *tv = attn_input(ctx, c, Sk, Dv, v);
    int64_t mshape[4];
    int mnd = mask_shape(c, mshape);
    int64_t mn = 1;
    for (int d = 0; d < mnd; d++)
        mn *= mshape[d];
    double *m = random_values(mn);
    for (int64_t i = 0; i < mn; i++) {
        if (c->mask == MASK_DEAD_ROW)
            m[i] = i / Sk == 2 || i % 3 == 0 ? -INFINITY : 0.5 * m[i];
        else if (c->mask == MASK_KEYS)
            m[i] = i % Sk % 7 == 3 ? -INFINITY : m[i]; /* some keys masked out */
    }
    df_tensor *tm = NULL;
    if (c->mask != MASK_NONE) {
        float *mf = malloc((size_t)mn * sizeof *mf);
        for (int64_t i = 0; i < mn; i++)
            mf[i] = (float)m[i];
        tm = df_tensor_from_host(ctx, DF_DTYPE_F32, mshape, mnd, mf);
        free(mf);
    }
    df_tensor *y = df_attention(ctx, tq, tk, tv, tm, c->causal, c->scale);
    assert_int_equal(df_tensor_dim(y, 1), H); /* [B, H, Sq, Dv] view */
    assert_int_equal(df_tensor_dim(y, 2), Sq);

    double scale = c->scale > 0 ? c->scale : 1.0 / sqrt((double)D);
    double *ref = calloc((size_t)(B * H * Sq * Dv), sizeof *ref), *s = malloc((size_t)Sk * 8);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < Sq; i++) {
                const double *qi = q + ((b * H + h) * Sq + i) * D;
                double mx = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    const double *kj = k + ((b * H + h) * Sk + j) * D;
                    double acc = 0;
                    for (int64_t d = 0; d < D; d++)
                        acc += qi[d] * kj[d];
                    acc *= scale;
                    if (c->mask == MASK_FULL)
                        acc += m[((b * H + h) * Sq + i) * Sk + j];
                    else if (c->mask == MASK_KEYS)
                        acc += m[b * Sk + j];
                    else if (c->mask != MASK_NONE)
                        acc += m[i * Sk + j];
                    if (c->causal && j > i)
                        acc = -INFINITY;
                    s[j] = acc;
                    mx = acc > mx ? acc : mx;
                }
                if (mx == -INFINITY)
                    continue; /* every key masked: zeros */
                double sum = 0;
                for (int64_t j = 0; j < Sk; j++)
                    sum += s[j] = exp(s[j] - mx);
                double *o = ref + ((b * H + h) * Sq + i) * Dv;
                for (int64_t j = 0; j < Sk; j++)
                    for (int64_t d = 0; d < Dv; d++)
                        o[d] += s[j] / sum * v[((b * H + h) * Sk + j) * Dv + d];
            }
    char what[200];
    snprintf(what, sizeof what, "attention B%lld H%lld Sq%lld Sk%lld D%lld Dv%lld mask %d%s%s, %s",
             (long long)B, (long long)H, (long long)Sq, (long long)Sk, (long long)D, (long long)Dv,
             (int)c->mask, c->causal ? " causal" : "", c->bshd ? " permuted" : "", mode);
    check_close(ctx, y, ref, B * H * Sq * Dv, compute, what);
    free(q), free(k), free(v), free(m), free(ref), free(s);
}

static void test_attention(void **state)
{
    (void)state;
    for (int mode = 0; mode < N_MODES; mode++)
        for (int ci = 0; ci < N_COMPUTES; ci++) {
            df_ctx *ctx = ctx_for(mode, computes[ci]);
            if (!ctx)
                continue;
            for (size_t i = 0; i < sizeof attn_cases / sizeof *attn_cases; i++) {
                df_scope mark = df_scope_begin(ctx);
                run_attention(ctx, computes[ci], &attn_cases[i], mode_names[mode]);
                df_scope_end(ctx, mark, NULL);
            }
            ctx_done(ctx);
        }
}

/* --- conv2d ------------------------------------------------------------------------------- */

typedef struct conv_case {
    int64_t B, C, H, W, O, ks;
    int stride, pad;
    bool bias;
    df_dtype wtype;
} conv_case;

static const conv_case conv_cases[] = {
    {2, 3, 8, 9, 4, 3, 1, 1, true, DF_DTYPE_F32},    {1, 5, 7, 6, 3, 1, 1, 0, false, DF_DTYPE_F32},
    {1, 4, 9, 9, 5, 3, 2, 1, true, DF_DTYPE_BF16}, /* stride 2 */
    {2, 3, 5, 5, 2, 1, 2, 0, true, DF_DTYPE_F16},    {1, 6, 10, 7, 7, 1, 1, 0, true, DF_DTYPE_BF16},
    {1, 64, 64, 64, 8, 3, 1, 1, true, DF_DTYPE_F32}, /* patches in more than one chunk */
};

static void run_conv(df_ctx *ctx, df_dtype compute, const conv_case *c, bool persist,
                     const char *mode)
{
    int64_t B = c->B, C = c->C, H = c->H, W = c->W, O = c->O, ks = c->ks;
    int64_t Ho = (H + 2 * c->pad - ks) / c->stride + 1, Wo = (W + 2 * c->pad - ks) / c->stride + 1;
    double *x = random_values(B * C * H * W), *w = random_values(O * C * ks * ks);
    double *b = random_values(O);
    df_tensor *tx = tensor_of(ctx, DF_DTYPE_F32, DF_SHAPE(B, C, H, W), x);
    df_tensor *tw = tensor_of(ctx, c->wtype, DF_SHAPE(O, C, ks, ks), w);
    df_tensor *tb = c->bias ? tensor_of(ctx, c->wtype, DF_SHAPE(O), b) : NULL;
    if (persist) {
        df_tensor_persist(tw);
        if (tb)
            df_tensor_persist(tb);
    }
    df_tensor *y = df_conv2d(ctx, tx, tw, tb, c->stride, c->pad);
    assert_int_equal(df_tensor_dim(y, 2), Ho);
    assert_int_equal(df_tensor_dim(y, 3), Wo);
    double *ref = calloc((size_t)(B * O * Ho * Wo), sizeof *ref);
    for (int64_t n = 0; n < B; n++)
        for (int64_t o = 0; o < O; o++)
            for (int64_t oy = 0; oy < Ho; oy++)
                for (int64_t ox = 0; ox < Wo; ox++) {
                    double acc = c->bias ? b[o] : 0;
                    for (int64_t ci = 0; ci < C; ci++)
                        for (int64_t ky = 0; ky < ks; ky++)
                            for (int64_t kx = 0; kx < ks; kx++) {
                                int64_t iy = oy * c->stride - c->pad + ky;
                                int64_t ix = ox * c->stride - c->pad + kx;
                                if (iy < 0 || iy >= H || ix < 0 || ix >= W)
                                    continue;
                                acc += x[((n * C + ci) * H + iy) * W + ix] *
                                       w[((o * C + ci) * ks + ky) * ks + kx];
                            }
                    ref[((n * O + o) * Ho + oy) * Wo + ox] = acc;
                }
    char what[160];
    snprintf(what, sizeof what,
             "conv2d [%lld, %lld, %lld, %lld] %lldx%lld -> %lld stride %d "
             "pad %d %s%s%s, %s",
             (long long)B, (long long)C, (long long)H, (long long)W, (long long)ks, (long long)ks,
             (long long)O, c->stride, c->pad, df_dtype_name(c->wtype), c->bias ? " bias" : "",
             persist ? " (weight)" : "", mode);
    check_close(ctx, y, ref, B * O * Ho * Wo, compute, what);
    if (persist) {
        df_tensor_free(tw);
        df_tensor_free(tb);
    }
    free(x), free(w), free(b), free(ref);
}

static void test_conv2d(void **state)
{
    (void)state;
    for (int mode = 0; mode < N_MODES; mode++)
        for (int ci = 0; ci < N_COMPUTES; ci++) {
            df_ctx *ctx = ctx_for(mode, computes[ci]);
            if (!ctx)
                continue;
            for (size_t i = 0; i < sizeof conv_cases / sizeof *conv_cases; i++)
                for (int persist = 0; persist < 2; persist++) {
                    df_scope mark = df_scope_begin(ctx);
                    run_conv(ctx, computes[ci], &conv_cases[i], persist, mode_names[mode]);
                    df_scope_end(ctx, mark, NULL);
                }
            ctx_done(ctx);
        }
}

int main(void)
{
    df_ctx *probe = NULL;
    const char *want = getenv("DIFFUSE_DEVICE");
    if (df_ctx_create(&(df_ctx_opts){.threads = 2}, &probe) != DF_OK) {
        printf("test_ops_matmul: the default device does not open: %s\n", df_error_message());
        return want && *want && strncmp(want, "cpu", 3) != 0 ? 77 : 1; /* no driver: skipped */
    }
    df_ctx_free(probe);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear), cmocka_unit_test(test_weight_is_packed_once),
        cmocka_unit_test(test_matmul), cmocka_unit_test(test_attention),
        cmocka_unit_test(test_conv2d),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    printf("test_ops_matmul: ran on %s, %lld kernels dispatched there\n", device,
           (long long)dispatched);
    if (strncmp(device, "cpu", 3) != 0 && dispatched <= 0) {
        printf("test_ops_matmul: FAIL %s dispatched nothing: the products did not run there\n",
               device);
        failed++;
    }
    return failed;
}
