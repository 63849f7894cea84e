/*
 * Defer-and-fuse mode: recording, cutting, fusion, liveness and the graph cache.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/cpu.h>
#include <diffuse/diffuse.h>

#include "runtime/lazy.h"
#include "runtime/runtime.h"

static df_ctx *new_ctx(df_eager_mode mode)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .mode = mode}, &ctx), DF_OK);
    assert_int_equal(df_get_eager_mode(ctx), mode);
    return ctx;
}

/* y = silu(2x + 1) * x + b, with every intermediate released by its scope. */
static df_tensor *chain(df_ctx *ctx, df_tensor *x, df_tensor *b)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *t = df_scale(ctx, x, 2.0f, 1.0f);
    t = df_silu(ctx, t);
    t = df_mul(ctx, t, x);
    t = df_add(ctx, t, b); /* b broadcasts over rows */
    return df_scope_end(ctx, mark, t);
}

static void fill(float *v, int n, float s)
{
    for (int i = 0; i < n; i++)
        v[i] = s * sinf(0.37f * (float)i + 0.1f);
}

static void test_chain_becomes_one_kernel_and_matches_eager(void **state)
{
    (void)state;
    enum { R = 64, C = 96 };
    static float x[R * C], b[C], want[R * C], got[R * C];
    fill(x, R * C, 2.0f);
    fill(b, C, 0.5f);
    df_ctx *eager = new_ctx(DF_DEFER_NEVER), *lazy = new_ctx(DF_DEFER_AND_FUSE);
    df_tensor *y0 = chain(eager, df_tensor_from_host(eager, DF_DTYPE_F32, DF_SHAPE(R, C), x),
                          df_tensor_from_host(eager, DF_DTYPE_F32, DF_SHAPE(C), b));
    assert_int_equal(df_tensor_read(eager, y0, DF_DTYPE_F32, want, sizeof want), DF_OK);

    df_tensor *xl = df_tensor_from_host(lazy, DF_DTYPE_F32, DF_SHAPE(R, C), x);
    df_tensor *bl = df_tensor_from_host(lazy, DF_DTYPE_F32, DF_SHAPE(C), b);
    df_stats_reset(lazy);
    df_tensor *y1 = chain(lazy, xl, bl);
    assert_null(y1->v.st->buf); /* recorded, not run */
    assert_int_equal(df_lazy_pending(lazy), 4);
    assert_int_equal(df_tensor_read(lazy, y1, DF_DTYPE_F32, got, sizeof got), DF_OK);
    df_stats st;
    df_ctx_stats(lazy, &st);
    assert_int_equal(st.fused_kernels, 1);
    assert_int_equal(st.ops_enqueued, 1); /* four ops, one kernel */
    /* Only the output was allocated: the three intermediates never existed. */
    assert_int_equal(st.bytes_allocated, (R * C * 4 + 255) / 256 * 256);
    double num = 0, den = 0;
    for (int i = 0; i < R * C; i++) {
        num += (got[i] - want[i]) * (double)(got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    assert_true(sqrt(num / den) <= 1e-6);
    df_ctx_free(eager);
    df_ctx_free(lazy);
}

static void test_repeated_steps_hit_the_cache(void **state)
{
    (void)state;
    enum { N = 256 };
    float x[N], b[N], out[N];
    fill(x, N, 1.0f);
    fill(b, N, 1.0f);
    df_ctx *ctx = new_ctx(DF_DEFER_AND_FUSE);
    df_tensor *lat = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), x);
    df_tensor *bt = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), b);
    df_stats_reset(ctx);
    for (int step = 0; step < 4; step++) {
        df_scope mark = df_scope_begin(ctx);
        /* The scale changes each step, like a sigma: it must not change the graph's key. */
        df_tensor *v = df_scale(ctx, chain(ctx, lat, bt), 0.1f * (float)(step + 1), 0.0f);
        df_tensor *next = df_add(ctx, lat, v);
        df_scope_end(ctx, mark, next);
        df_tensor_free(lat);
        lat = next;
        assert_int_equal(df_mark_step(ctx), DF_OK);
    }
    assert_int_equal(df_tensor_read(ctx, lat, DF_DTYPE_F32, out, sizeof out), DF_OK);
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.graphs_built, 4);
    assert_int_equal(st.graphs_compiled, 1);
    assert_int_equal(st.cache_misses, 1);
    assert_int_equal(st.cache_hits, 3);
    /* The same computation in strict eager. */
    df_ctx *e = new_ctx(DF_DEFER_NEVER);
    df_tensor *le = df_tensor_from_host(e, DF_DTYPE_F32, DF_SHAPE(N), x);
    df_tensor *be = df_tensor_from_host(e, DF_DTYPE_F32, DF_SHAPE(N), b);
    for (int step = 0; step < 4; step++)
        le = df_add(e, le, df_scale(e, chain(e, le, be), 0.1f * (float)(step + 1), 0.0f));
    float want[N];
    assert_int_equal(df_tensor_read(e, le, DF_DTYPE_F32, want, sizeof want), DF_OK);
    for (int i = 0; i < N; i++)
        assert_float_equal(out[i], want[i], 1e-5 * (1 + fabs(want[i])));
    df_ctx_free(e);
    df_ctx_free(ctx);
}

static void test_host_read_in_the_middle_cuts_the_graph(void **state)
{
    (void)state;
    float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, mid[8], out[8];
    df_ctx *ctx = new_ctx(DF_DEFER_AND_FUSE);
    df_tensor *a = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(8), x);
    df_stats_reset(ctx);
    df_tensor *b = df_scale(ctx, a, 3.0f, 0.0f);
    df_tensor *c = df_add(ctx, b, a); /* 4x */
    assert_int_equal(df_tensor_read(ctx, b, DF_DTYPE_F32, mid, sizeof mid), DF_OK);
    df_tensor *d = df_mul(ctx, c, b); /* 12 x^2, recorded after the cut */
    assert_int_equal(df_lazy_pending(ctx), 1);
    assert_int_equal(df_tensor_read(ctx, d, DF_DTYPE_F32, out, sizeof out), DF_OK);
    for (int i = 0; i < 8; i++) {
        assert_float_equal(mid[i], 3 * x[i], 0);
        assert_float_equal(out[i], 12 * x[i] * x[i], 1e-4);
    }
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.graphs_built, 2);
    df_ctx_free(ctx);
}

static void test_unread_results_are_never_computed(void **state)
{
    (void)state;
    float x[16] = {0}, out[16];
    df_ctx *ctx = new_ctx(DF_DEFER_AND_FUSE);
    df_tensor *a = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(16), x);
    df_stats_reset(ctx);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *unused = df_gelu(ctx, df_scale(ctx, a, 5.0f, 0.0f));
    (void)unused;
    df_tensor *kept = df_scale(ctx, a, 1.0f, 2.0f);
    df_scope_end(ctx, mark, kept);
    assert_int_equal(df_tensor_read(ctx, kept, DF_DTYPE_F32, out, sizeof out), DF_OK);
    assert_float_equal(out[3], 2.0f, 0);
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.ops_enqueued, 1);
    df_ctx_free(ctx);
}

static void test_node_limit_cuts_and_keeps_live_results(void **state)
{
    (void)state;
    float x[4] = {1, 1, 1, 1}, out[4];
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1, .mode = DF_DEFER_AND_FUSE,
                                                  .fuse_max_nodes = 3},
                                   &ctx),
                     DF_OK);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(4), x);
    for (int i = 0; i < 10; i++)
        t = df_scale(ctx, t, 1.0f, 1.0f);
    assert_true(df_lazy_pending(ctx) <= 3);
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, out, sizeof out), DF_OK);
    assert_float_equal(out[0], 11.0f, 0);
    df_ctx_free(ctx);
}

/* Relative L2 distance of two arrays. */
static double rel_l2(const float *got, const float *want, int n)
{
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        num += (got[i] - want[i]) * (double)(got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* q and k before attention in a FLUX double block: two streams RMS-normed per head,
 * joined along the sequence, heads moved forward, rotated. With one stream, a single
 * block. Returns [1, H, S, D]. */
static df_tensor *norm_join_rotate(df_ctx *ctx, df_tensor *x1, df_tensor *w1, df_tensor *x2,
                                   df_tensor *w2, df_tensor *table)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *q = df_rms_norm(ctx, x1, w1, 1e-6f);
    if (x2)
        q = df_concat(ctx, q, df_rms_norm(ctx, x2, w2, 1e-6f), 1);
    q = df_rope(ctx, df_permute(ctx, q, DF_SHAPE(0, 2, 1, 3)), table);
    return df_scope_end(ctx, mark, q);
}

static void test_norm_and_rope_become_one_pass_per_part(void **state)
{
    (void)state;
    enum { S1 = 5, S2 = 7, H = 3, D = 8, S = S1 + S2 };
    static float x1[S1 * H * D], x2[S2 * H * D], w1[D], w2[D], table[S * D];
    static float want[H * S * D], got[H * S * D];
    fill(x1, S1 * H * D, 3.0f);
    fill(x2, S2 * H * D, -1.5f);
    fill(w1, D, 1.0f);
    fill(w2, D, 0.7f);
    for (int s = 0; s < S; s++) /* (cos, sin) pairs */
        for (int i = 0; i < D / 2; i++) {
            table[s * D + 2 * i] = cosf(0.3f * (float)(s * (i + 1)));
            table[s * D + 2 * i + 1] = sinf(0.3f * (float)(s * (i + 1)));
        }
    for (int parts = 1; parts <= 2; parts++) {
        int64_t s_all = parts == 2 ? S : S1, n = H * s_all * D;
        df_ctx *ctx[2] = {new_ctx(DF_DEFER_NEVER), new_ctx(DF_DEFER_AND_FUSE)};
        float *out[2] = {want, got};
        df_stats st[2];
        for (int m = 0; m < 2; m++) {
            df_ctx *c = ctx[m];
            df_tensor *a = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(1, S1, H, D), x1);
            df_tensor *b = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(1, S2, H, D), x2);
            df_tensor *wa = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(D), w1);
            df_tensor *wb = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(D), w2);
            df_tensor *t = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(s_all, D / 2, 2), table);
            assert_int_equal(df_sync(c), DF_OK);
            df_stats_reset(c);
            df_tensor *y = norm_join_rotate(c, a, wa, parts == 2 ? b : NULL, wb, t);
            assert_non_null(y);
            assert_int_equal(df_tensor_read(c, y, DF_DTYPE_F32, out[m], (size_t)n * 4), DF_OK);
            df_ctx_stats(c, &st[m]);
        }
        /* One kernel per part instead of norms, concat and rope; only the rotated
         * tensor is ever allocated. */
        assert_int_equal(st[0].ops_enqueued, parts == 2 ? 4 : 2);
        assert_int_equal(st[1].ops_enqueued, parts);
        assert_int_equal(st[1].bytes_allocated, (n * 4 + 255) / 256 * 256);
        assert_true(rel_l2(got, want, (int)n) <= 1e-6);
        df_ctx_free(ctx[0]);
        df_ctx_free(ctx[1]);
    }
}

/* Two producers joined along `dim`: a matrix product with a GELU (folded into it in
 * defer-and-fuse), and a scale of y or (with w2) a product of y. x [B, R, K], w [N, K],
 * y [B, R, N], w2 NULL or [N, N]. */
static df_tensor *two_parts_joined(df_ctx *ctx, df_tensor *x, df_tensor *w, df_tensor *y,
                                   df_tensor *w2, int dim)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *a = df_gelu_tanh(ctx, df_linear(ctx, x, &(df_linear_weights){.weight = w}));
    df_tensor *b = w2 ? df_linear(ctx, y, &(df_linear_weights){.weight = w2})
                      : df_scale(ctx, y, 0.5f, 1.0f);
    return df_scope_end(ctx, mark, df_concat(ctx, a, b, dim));
}

static void test_contiguous_concat_parts_are_written_in_place(void **state)
{
    (void)state;
    enum { R = 6, K = 16, N = 8 };
    static float x[2 * R * K], w[N * K], w2[N * N], y[2 * R * N], want[4 * R * N],
        got[4 * R * N];
    fill(x, 2 * R * K, 1.0f);
    fill(w, N * K, 0.25f);
    fill(w2, N * N, -0.5f);
    fill(y, 2 * R * N, 2.0f);
    /* Joined along the rows of one batch the parts are contiguous: no copy. Joined along
     * the features, products write their columns of every row: no copy either, unless a
     * part comes from another kernel. Rows of two batches interleave: the concat copies. */
    const struct { int64_t batch; int dim; bool products; int64_t kernels; } cases[] = {
        {1, 1, false, 2}, {1, 2, false, 3}, {2, 1, false, 3},
        {1, 2, true, 2},  {2, 2, true, 2},  {2, 1, true, 3}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int64_t B = cases[ci].batch, n = B * 2 * R * N;
        df_ctx *ctx[2] = {new_ctx(DF_DEFER_NEVER), new_ctx(DF_DEFER_AND_FUSE)};
        float *out[2] = {want, got};
        df_stats st;
        for (int m = 0; m < 2; m++) {
            df_ctx *c = ctx[m];
            df_tensor *xt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(B, R, K), x);
            df_tensor *wt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(N, K), w);
            df_tensor *yt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(B, R, N), y);
            df_tensor *w2t = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(N, N), w2);
            assert_int_equal(df_sync(c), DF_OK);
            df_stats_reset(c);
            df_tensor *j = two_parts_joined(c, xt, wt, yt, cases[ci].products ? w2t : NULL,
                                            cases[ci].dim);
            assert_non_null(j);
            assert_int_equal(df_tensor_read(c, j, DF_DTYPE_F32, out[m], (size_t)n * 4), DF_OK);
            df_ctx_stats(c, &st);
        }
        assert_int_equal(st.ops_enqueued, cases[ci].kernels);
        assert_true(rel_l2(got, want, (int)n) <= 1e-6);
        df_ctx_free(ctx[0]);
        df_ctx_free(ctx[1]);
    }
}

/* The modulated norm of a FLUX block feeding three bf16 products, then q and k (per-head
 * RMS norm and RoPE) and v feeding bf16 attention, and its output feeding a product.
 * x [1, S, D], D = H * Dh; returns [1, S, D]. */
static df_tensor *bf16_operands(df_ctx *ctx, df_tensor *x, df_tensor *mod, df_tensor *w,
                                df_tensor *table, int64_t H)
{
    df_scope mark = df_scope_begin(ctx);
    int64_t S = df_tensor_dim(x, 1), D = df_tensor_dim(x, 2);
    df_tensor *h = df_add(ctx, df_mul(ctx, df_layer_norm(ctx, x, NULL, NULL, 1e-6f), mod), mod);
    df_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        df_tensor *t = df_linear(ctx, h, &(df_linear_weights){.weight = w, .bias = mod});
        t = df_reshape(ctx, t, DF_SHAPE(1, S, H, D / H));
        if (i < 2)
            t = df_rms_norm(ctx, t, NULL, 1e-6f);
        t = df_permute(ctx, t, DF_SHAPE(0, 2, 1, 3));
        qkv[i] = i < 2 ? df_rope(ctx, t, table) : t;
    }
    df_tensor *o = df_attention(ctx, qkv[0], qkv[1], qkv[2], NULL, false, 0.0f);
    o = df_reshape(ctx, df_transpose(ctx, o, 1, 2), DF_SHAPE(1, S, D));
    o = df_linear(ctx, o, &(df_linear_weights){.weight = w}); /* the output projection */
    return df_scope_end(ctx, mark, o);
}

static void test_bf16_operands_are_written_in_bf16_and_match_eager(void **state)
{
    (void)state;
    enum { S = 40, H = 2, Dh = 16, D = H * Dh };
    static float x[S * D], mod[D], w[D * D], table[S * Dh], out[3][S * D];
    fill(x, S * D, 2.0f);
    fill(mod, D, 0.3f);
    fill(w, D * D, 0.2f);
    for (int s = 0; s < S; s++)
        for (int i = 0; i < Dh / 2; i++) {
            table[s * Dh + 2 * i] = cosf(0.1f * (float)(s * (i + 1)));
            table[s * Dh + 2 * i + 1] = sinf(0.1f * (float)(s * (i + 1)));
        }
    /* strict eager in bf16, defer-and-fuse in bf16, defer-and-fuse in f32 */
    const df_eager_mode modes[3] = {DF_DEFER_NEVER, DF_DEFER_AND_FUSE, DF_DEFER_AND_FUSE};
    const df_dtype compute[3] = {DF_DTYPE_BF16, DF_DTYPE_BF16, DF_DTYPE_F32};
    df_stats st[3];
    for (int m = 0; m < 3; m++) {
        df_ctx *c;
        assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .mode = modes[m],
                                                      .compute = compute[m]},
                                       &c),
                         DF_OK);
        df_tensor *xt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(1, S, D), x);
        df_tensor *mt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(D), mod);
        df_tensor *wt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(D, D), w);
        df_tensor *tt = df_tensor_from_host(c, DF_DTYPE_F32, DF_SHAPE(S, Dh / 2, 2), table);
        assert_int_equal(df_sync(c), DF_OK);
        df_stats_reset(c);
        df_tensor *o = bf16_operands(c, xt, mt, wt, tt, H);
        assert_non_null(o);
        assert_int_equal(df_tensor_read(c, o, DF_DTYPE_F32, out[m], sizeof out[m]), DF_OK);
        df_ctx_stats(c, &st[m]);
        df_ctx_free(c);
    }
    if (df_cpu_has_fast_bf16()) {
        /* The planner's bf16 results are rounded as the products round their operands:
         * at these sizes the same bits as strict eager (larger packed products may differ
         * by a bf16 ulp in a few elements), from a smaller arena than the f32 plan's. */
        assert_memory_equal(out[1], out[0], sizeof out[0]);
        assert_true(st[1].arena_bytes < st[2].arena_bytes);
    } else {
        assert_true(rel_l2(out[1], out[0], S * D) <= 1e-6);
    }
}

static void test_one_arena_serves_every_graph(void **state)
{
    (void)state;
    enum { R = 32, C = 64 };
    static float x[R * C], y[R * C];
    fill(x, R * C, 1.0f);
    df_ctx *ctx = new_ctx(DF_DEFER_AND_FUSE);
    df_tensor *xt = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(R, C), x);
    assert_int_equal(df_sync(ctx), DF_OK);
    const void *arena = NULL;
    for (int step = 0; step < 3; step++) {
        df_stats_reset(ctx);
        df_scope mark = df_scope_begin(ctx);
        df_tensor *t = df_softmax(ctx, df_softmax(ctx, df_softmax(ctx, xt)));
        t = df_scope_end(ctx, mark, t); /* the intermediates' handles are gone */
        assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, y, sizeof y), DF_OK);
        df_tensor_free(t);
        df_stats st;
        df_ctx_stats(ctx, &st);
        assert_true(st.arena_bytes >= 2 * R * C * 4); /* the two intermediates */
        /* The first graph makes the context's arena; the later ones run in the same memory
         * (stream order keeps them apart) instead of each taking an arena of its own. */
        assert_non_null(ctx->arena);
        if (step == 0)
            arena = ctx->arena->buf;
        assert_ptr_equal(ctx->arena->buf, arena);
        assert_true((int64_t)ctx->arena->bytes >= st.arena_bytes);
    }
    df_ctx_free(ctx);
}

static void test_environment_selects_the_mode(void **state)
{
    (void)state;
    setenv("DIFFUSE_DEFER_AND_FUSE", "1", 1);
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    assert_int_equal(df_get_eager_mode(ctx), DF_DEFER_AND_FUSE);
    df_ctx_free(ctx);
    unsetenv("DIFFUSE_DEFER_AND_FUSE");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_becomes_one_kernel_and_matches_eager),
        cmocka_unit_test(test_repeated_steps_hit_the_cache),
        cmocka_unit_test(test_host_read_in_the_middle_cuts_the_graph),
        cmocka_unit_test(test_unread_results_are_never_computed),
        cmocka_unit_test(test_node_limit_cuts_and_keeps_live_results),
        cmocka_unit_test(test_norm_and_rope_become_one_pass_per_part),
        cmocka_unit_test(test_contiguous_concat_parts_are_written_in_place),
        cmocka_unit_test(test_bf16_operands_are_written_in_bf16_and_match_eager),
        cmocka_unit_test(test_one_arena_serves_every_graph),
        cmocka_unit_test(test_environment_selects_the_mode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
