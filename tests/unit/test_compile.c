/*
 * Compiled mode: one program per input signature, replays, weights as arguments,
 * constant folding, and fullgraph errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/compile.h>
#include <diffuse/diffuse.h>

#include "runtime/runtime.h"

typedef struct block {
    df_tensor *w, *b; /* [D], [D] */
    int forwards;     /* how often the C forward ran */
    bool read_inside;
} block;

/* out = silu(x * w + b) * t  (t [B, 1] broadcast), plus a constant table folded once. */
static df_status block_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    block *k = self;
    k->forwards++;
    float one[1] = {2.0f};
    df_tensor *c = df_scale(ctx, df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), one), 0.5f,
                            0.0f); /* depends on nothing: a constant (== 1) */
    df_tensor *h = df_add(ctx, df_mul(ctx, in[0], k->w), k->b);
    h = df_mul(ctx, df_silu(ctx, h), in[1]);
    if (k->read_inside) {
        float tmp[1];
        df_tensor_read(ctx, df_slice(ctx, df_reshape(ctx, h, DF_SHAPE(-1)), 0, 0, 1), DF_DTYPE_F32,
                       tmp, sizeof tmp);
    }
    out[0] = df_mul(ctx, h, c);
    return df_ctx_status(ctx);
}

static int block_weights(void *self, df_tensor **out)
{
    block *k = self;
    out[0] = k->w;
    out[1] = k->b;
    return 2;
}

static const df_module block_module = {
    .name = "block", .n_in = 2, .n_out = 1, .forward = block_forward, .weights = block_weights};

static void reference(const float *x, const float *t, const float *w, const float *b, int B,
                      int D, float *out)
{
    for (int i = 0; i < B; i++)
        for (int j = 0; j < D; j++) {
            float h = x[i * D + j] * w[j] + b[j];
            out[i * D + j] = h / (1.0f + expf(-h)) * t[i];
        }
}

static block make_block(df_ctx *ctx, int D, float seed)
{
    float w[64], b[64];
    for (int j = 0; j < D; j++) {
        w[j] = seed + 0.1f * (float)j;
        b[j] = seed - 0.05f * (float)j;
    }
    block k = {.w = df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D), w)),
               .b = df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D), b))};
    return k;
}

static void free_block(block *k)
{
    df_tensor_free(k->w);
    df_tensor_free(k->b);
}

static void call_and_check(df_ctx *ctx, df_compiled *c, block *k, int B, int D, float phase)
{
    float x[256], t[16], w[64], b[64], want[256], got[256];
    for (int i = 0; i < B * D; i++)
        x[i] = sinf(phase + 0.3f * (float)i);
    for (int i = 0; i < B; i++)
        t[i] = 0.5f + phase * (float)i;
    assert_int_equal(df_tensor_read(ctx, k->w, DF_DTYPE_F32, w, sizeof w), DF_OK);
    assert_int_equal(df_tensor_read(ctx, k->b, DF_DTYPE_F32, b, sizeof b), DF_OK);
    reference(x, t, w, b, B, D, want);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *in[2] = {df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, D), x),
                        df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, 1), t)};
    df_tensor *out[1];
    assert_int_equal(df_compiled_call(ctx, c, k, in, out), DF_OK);
    assert_int_equal(df_tensor_read(ctx, out[0], DF_DTYPE_F32, got, (size_t)B * D * 4), DF_OK);
    for (int i = 0; i < B * D; i++)
        assert_float_equal(got[i], want[i], 1e-5 * (1 + fabsf(want[i])));
    df_scope_end(ctx, mark, NULL);
}

static void test_one_program_per_shape_and_no_retrace(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    block k = make_block(ctx, 16, 0.3f);
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&block_module, &(df_compile_opts){.fullgraph = true}, &c), DF_OK);
    df_stats_reset(ctx);
    for (int i = 0; i < 2; i++)
        call_and_check(ctx, c, &k, 2, 16, 0.1f * (float)i); /* "256x256" twice */
    for (int i = 0; i < 3; i++)
        call_and_check(ctx, c, &k, 4, 16, 0.2f * (float)i); /* "512x512" three times */
    assert_int_equal(df_compiled_programs(c), 2);
    assert_int_equal(k.forwards, 2); /* the C forward ran only to trace */
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.graphs_compiled, 2);
    assert_int_equal(st.cache_hits, 3);
    free_block(&k);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

static void test_constant_is_folded(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    block k = make_block(ctx, 8, 0.1f);
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&block_module, NULL, &c), DF_OK);
    call_and_check(ctx, c, &k, 2, 8, 0.0f);
    df_stats_reset(ctx);
    call_and_check(ctx, c, &k, 2, 8, 1.0f);
    df_stats st;
    df_ctx_stats(ctx, &st);
    /* Replay: the scale of the constant is not run again; the rest is one fused kernel.
     * A device that records graphs (sim) replays it: no op is queued, nothing recorded. */
    if (st.device_graph_launches > 0) {
        assert_int_equal(st.ops_enqueued, 0);
        assert_int_equal(st.device_dispatches, 1);
        assert_int_equal(st.device_dispatches_recorded, 0);
        assert_int_equal(st.device_graph_launches, 1);
    } else {
        assert_int_equal(st.ops_enqueued, 1);
        assert_int_equal(st.fused_kernels, 1);
    }
    free_block(&k);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

static void test_blocks_share_one_program(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    block blocks[5];
    for (int i = 0; i < 5; i++)
        blocks[i] = make_block(ctx, 16, 0.2f * (float)i - 0.4f);
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&block_module, NULL, &c), DF_OK);
    for (int step = 0; step < 2; step++)
        for (int i = 0; i < 5; i++)
            call_and_check(ctx, c, &blocks[i], 3, 16, 0.1f * (float)(i + step));
    assert_int_equal(df_compiled_programs(c), 1);
    assert_int_equal(blocks[0].forwards, 1);
    for (int i = 1; i < 5; i++)
        assert_int_equal(blocks[i].forwards, 0);
    for (int i = 0; i < 5; i++)
        free_block(&blocks[i]);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

static void test_host_read_under_fullgraph_names_the_op(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    block k = make_block(ctx, 8, 0.1f);
    k.read_inside = true;
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&block_module, &(df_compile_opts){.fullgraph = true}, &c), DF_OK);
    float x[16] = {0}, t[2] = {1, 1};
    df_tensor *in[2] = {df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 8), x),
                        df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 1), t)};
    df_tensor *out[1];
    assert_int_equal(df_compiled_call(ctx, c, &k, in, out), DF_E_STATE);
    assert_non_null(strstr(df_error_message(), "'mul'"));
    assert_non_null(strstr(df_error_message(), "fullgraph"));
    df_compiled_free(c);
    /* Without fullgraph the same forward runs (as pieces) and gives the right answer. */
    df_ctx_reset_error(ctx);
    assert_int_equal(df_compile(&block_module, NULL, &c), DF_OK);
    call_and_check(ctx, c, &k, 2, 8, 0.5f);
    call_and_check(ctx, c, &k, 2, 8, 0.7f);
    free_block(&k);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

static void test_dynamic_is_rejected(void **state)
{
    (void)state;
    df_compiled *c = (df_compiled *)1;
    assert_int_equal(df_compile(&block_module, &(df_compile_opts){.dynamic = true}, &c),
                     DF_E_UNSUPPORTED);
    assert_null(c);
    assert_non_null(strstr(df_error_message(), "dynamic"));
}

/* softmax three times over x, with no scope of its own: the intermediates' handles are
 * the caller's until the forward returns. */
static df_status softmax3_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    (void)self;
    out[0] = df_softmax(ctx, df_softmax(ctx, df_softmax(ctx, in[0])));
    return df_ctx_status(ctx);
}

static void test_intermediates_go_to_the_arena_on_the_first_call(void **state)
{
    (void)state;
    enum { R = 32, C = 64 };
    static float x[R * C], y[2][R * C];
    for (int i = 0; i < R * C; i++)
        x[i] = sinf(0.1f * (float)i);
    static const df_module m = {.name = "softmax3", .n_in = 1, .n_out = 1,
                                .forward = softmax3_forward};
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_compiled *c;
    assert_int_equal(df_compile(&m, NULL, &c), DF_OK);
    df_tensor *in = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(R, C), x);
    for (int call = 0; call < 2; call++) {
        df_stats_reset(ctx);
        df_tensor *out;
        assert_int_equal(df_compiled_call(ctx, c, NULL, &in, &out), DF_OK);
        assert_int_equal(df_tensor_read(ctx, out, DF_DTYPE_F32, y[call], sizeof y[call]), DF_OK);
        df_stats st;
        df_ctx_stats(ctx, &st);
        /* Both intermediates live in the planned arena, the first call (the trace) too;
         * only the result gets memory of its own. */
        assert_true(st.arena_bytes >= 2 * R * C * 4);
        assert_true(st.bytes_allocated <= (call == 0 ? 2 : 1) * (1 << 20) + R * C * 4 + 256);
        df_tensor_free(out);
    }
    assert_memory_equal(y[0], y[1], sizeof y[0]);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

/* On a device that records graphs ($DIFFUSE_DEVICE, else sim): the first call traces and
 * records, every later call replays the recorded graph over its new inputs: nothing
 * recorded, one submit, the right values. Blocks sharing a program get a graph each. */
static void test_second_call_replays_the_recorded_graph(void **state)
{
    (void)state;
    const char *dev = getenv("DIFFUSE_DEVICE");
    df_ctx *ctx = NULL;
    if (df_ctx_create(&(df_ctx_opts){.device = dev && *dev ? dev : "sim", .threads = 2},
                      &ctx) != DF_OK)
        skip(); /* a build without the sim device */
    block blocks[3];
    for (int i = 0; i < 3; i++)
        blocks[i] = make_block(ctx, 16, 0.3f * (float)i - 0.2f);
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&block_module, &(df_compile_opts){.fullgraph = true}, &c), DF_OK);
    for (int step = 0; step < 3; step++)
        for (int i = 0; i < 3; i++) {
            float x[48], t[3] = {0.5f, 1.0f + (float)step, 1.5f}, w[16], b[16], want[48],
                  got[48];
            for (int e = 0; e < 48; e++) /* new values in new tensors at every call */
                x[e] = sinf(0.2f * (float)(e + 7 * step + 3 * i));
            assert_int_equal(df_tensor_read(ctx, blocks[i].w, DF_DTYPE_F32, w, sizeof w), DF_OK);
            assert_int_equal(df_tensor_read(ctx, blocks[i].b, DF_DTYPE_F32, b, sizeof b), DF_OK);
            reference(x, t, w, b, 3, 16, want);
            df_scope mark = df_scope_begin(ctx);
            df_tensor *in[2] = {df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(3, 16), x),
                                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(3, 1), t)};
            df_tensor *out[1];
            df_stats_reset(ctx);
            assert_int_equal(df_compiled_call(ctx, c, &blocks[i], in, out), DF_OK);
            assert_int_equal(df_sync(ctx), DF_OK); /* the call's work, handed over */
            df_stats st;
            df_ctx_stats(ctx, &st);
            assert_int_equal(df_tensor_read(ctx, out[0], DF_DTYPE_F32, got, sizeof got), DF_OK);
            for (int e = 0; e < 48; e++)
                assert_float_equal(got[e], want[e], 1e-5 * (1 + fabsf(want[e])));
            if (step == 0) { /* recorded while it ran */
                assert_int_equal(st.device_graph_launches, 0);
                assert_true(st.device_dispatches_recorded >= 1);
            } else { /* replayed: the kernels run, none is recorded, one hand-over */
                assert_int_equal(st.device_graph_launches, 1);
                assert_int_equal(st.device_dispatches_recorded, 0);
                assert_true(st.device_dispatches >= 1);
                assert_int_equal(st.device_submits, 1);
                assert_int_equal(st.ops_enqueued, 0);
            }
            df_scope_end(ctx, mark, NULL);
        }
    assert_int_equal(df_compiled_programs(c), 1);
    assert_int_equal(blocks[0].forwards, 1);
    for (int i = 0; i < 3; i++)
        free_block(&blocks[i]);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_program_per_shape_and_no_retrace),
        cmocka_unit_test(test_constant_is_folded),
        cmocka_unit_test(test_blocks_share_one_program),
        cmocka_unit_test(test_host_read_under_fullgraph_names_the_op),
        cmocka_unit_test(test_dynamic_is_rejected),
        cmocka_unit_test(test_intermediates_go_to_the_arena_on_the_first_call),
        cmocka_unit_test(test_second_call_replays_the_recorded_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
