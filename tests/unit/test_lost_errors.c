/*
 * No error is lost: whoever returns a NULL tensor has failed the context with the real
 * message, so the next status check (a host read, df_pipeline_run) reports the cause
 * rather than "NULL tensor".
 *
 * - an op or a view given a NULL input in a healthy context fails it, naming the op;
 * - a compiled call that fails in any way (its forward's own error, a forward that gives
 *   no output, every allocation it makes) fails the context, so a caller that goes on with
 *   the NULL outputs reads the real message;
 * - a compiled call made while another module is traced (the transformer compiled, its
 *   blocks compiled too) is traced into the outer program;
 * - a tiny FLUX pipeline (diffuse make-tiny) in each execution mode, with the Nth
 *   allocation of the run failing for N spread over the whole run: every failure reaches
 *   df_pipeline_run's caller as DF_E_OOM with an "out of memory" message.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/compile.h>
#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "core/status.h"

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    return ctx;
}

static df_tensor *vec(df_ctx *ctx, float v)
{
    float x[4] = {v, v, v, v};
    return df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(4), x);
}

/* Reads t and expects failure `want` whose message contains `needle`. */
static void read_fails_with(df_ctx *ctx, df_tensor *t, df_status want, const char *needle)
{
    float out[4];
    df_status s = df_tensor_read(ctx, t, DF_DTYPE_F32, out, sizeof out);
    assert_int_equal(s, want);
    if (!strstr(df_error_message(), needle))
        fail_msg("expected a message with '%s', got '%s'", needle, df_error_message());
    assert_null(strstr(df_error_message(), "NULL tensor"));
}

static void test_op_with_null_input_fails_the_context(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_tensor *y = df_add(ctx, vec(ctx, 1.0f), NULL);
    assert_null(y);
    assert_int_equal(df_ctx_status(ctx), DF_E_ARG);
    read_fails_with(ctx, df_silu(ctx, y), DF_E_ARG, "add: input 1 is NULL");
    df_ctx_free(ctx);

    ctx = new_ctx();
    assert_null(df_reshape(ctx, NULL, DF_SHAPE(2, 2)));
    read_fails_with(ctx, NULL, DF_E_ARG, "reshape: the input is NULL");
    df_ctx_free(ctx);

    ctx = new_ctx();
    assert_null(df_linear(ctx, vec(ctx, 1.0f), &(df_linear_weights){0}));
    read_fails_with(ctx, NULL, DF_E_ARG, "linear: input 1 is NULL");
    df_ctx_free(ctx);
}

/* ---- compiled calls ------------------------------------------------------------------- */

typedef struct mod {
    int behaviour; /* 0: out = 2 x; 1: an error of its own; 2: no output; 3: calls `inner` */
    df_compiled *inner;
    struct mod *inner_self;
} mod;

static df_status mod_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    mod *m = self;
    switch (m->behaviour) {
    case 1:
        return df_errorf(DF_E_IO, "mod: the forward's own error");
    case 2:
        return DF_OK;
    case 3: {
        df_tensor *h = NULL;
        df_status s = df_compiled_call(ctx, m->inner, m->inner_self, in, &h);
        if (s != DF_OK)
            return s;
        out[0] = df_add(ctx, h, in[0]); /* 3 x */
        return df_ctx_status(ctx);
    }
    default:
        out[0] = df_scale(ctx, in[0], 2.0f, 0.0f);
        return df_ctx_status(ctx);
    }
}

static const df_module mod_module = {.name = "mod", .n_in = 1, .n_out = 1, .forward = mod_forward};

/* Calls a compiled `mod` with behaviour b as model code does that ignores the status, and
 * reads what follows. */
static void ignored_call_reports(int b, df_status want, const char *needle)
{
    df_ctx *ctx = new_ctx();
    df_compiled *c = NULL;
    assert_int_equal(df_compile(&mod_module, &(df_compile_opts){.fullgraph = true}, &c), DF_OK);
    mod m = {.behaviour = b};
    df_tensor *out = (df_tensor *)1;
    df_compiled_call(ctx, c, &m, (df_tensor *[]){vec(ctx, 1.0f)}, &out);
    assert_null(out);
    assert_int_equal(df_ctx_status(ctx), want);
    read_fails_with(ctx, df_add(ctx, out, out), want, needle);
    df_compiled_free(c);
    df_ctx_free(ctx);
}

static void test_compiled_forward_error_reaches_the_reader(void **state)
{
    (void)state;
    ignored_call_reports(1, DF_E_IO, "mod: the forward's own error");
}

static void test_compiled_forward_without_output_is_an_error(void **state)
{
    (void)state;
    ignored_call_reports(2, DF_E_STATE, "compiled 'mod': the forward gave no output 0");
}

/* Every allocation of the first (tracing) and a later (replaying) call fails in turn. */
static void test_compiled_call_out_of_memory_reaches_the_reader(void **state)
{
    (void)state;
    int failures = 0;
    for (int replay = 0; replay < 2; replay++) {
        for (int64_t nth = 1;; nth++) {
            df_ctx *ctx = new_ctx();
            df_compiled *c = NULL;
            assert_int_equal(df_compile(&mod_module, NULL, &c), DF_OK);
            mod m = {0};
            df_tensor *x = vec(ctx, 1.0f), *out = NULL;
            if (replay) {
                assert_int_equal(df_compiled_call(ctx, c, &m, &x, &out), DF_OK);
                assert_int_equal(df_sync(ctx), DF_OK);
            }
            df_alloc_fail_at(nth);
            df_status s = df_compiled_call(ctx, c, &m, &x, &out);
            df_alloc_fail_at(0);
            float host[4];
            if (s == DF_OK && df_tensor_read(ctx, out, DF_DTYPE_F32, host, sizeof host) == DF_OK) {
                assert_true(host[0] == 2.0f);
                df_compiled_free(c);
                df_ctx_free(ctx);
                break; /* no allocation left to fail */
            }
            if (s != DF_OK) {
                assert_null(out);
                assert_int_equal(df_ctx_status(ctx), s);
                read_fails_with(ctx, df_add(ctx, out, x), DF_E_OOM, "out of memory");
            } else {
                assert_int_equal(df_ctx_status(ctx), DF_E_OOM);
            }
            failures++;
            df_compiled_free(c);
            df_ctx_free(ctx);
            assert_true(nth < 10000);
        }
    }
    assert_true(failures > 4);
}

/* The outer module's forward calls a compiled inner one: the whole is one program. */
static void test_compiled_call_inside_a_trace_is_traced(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_compiled *inner = NULL, *outer = NULL;
    assert_int_equal(df_compile(&mod_module, &(df_compile_opts){.fullgraph = true}, &inner), DF_OK);
    assert_int_equal(df_compile(&mod_module, &(df_compile_opts){.fullgraph = true}, &outer), DF_OK);
    mod in_m = {0}, out_m = {.behaviour = 3, .inner = inner, .inner_self = &in_m};
    for (int call = 0; call < 2; call++) {
        df_scope mark = df_scope_begin(ctx);
        df_tensor *x = vec(ctx, 1.5f + (float)call), *y = NULL;
        assert_int_equal(df_compiled_call(ctx, outer, &out_m, &x, &y), DF_OK);
        float host[4];
        assert_int_equal(df_tensor_read(ctx, y, DF_DTYPE_F32, host, sizeof host), DF_OK);
        for (int i = 0; i < 4; i++)
            assert_true(host[i] == 3.0f * (1.5f + (float)call));
        df_scope_end(ctx, mark, NULL);
    }
    assert_int_equal(df_compiled_programs(outer), 1);
    assert_int_equal(df_compiled_programs(inner), 0); /* traced into the outer program */
    df_compiled_free(inner);
    df_compiled_free(outer);
    df_ctx_free(ctx);
}

/* ---- a whole pipeline ------------------------------------------------------------------- */

#ifdef DF_DIFFUSE_BIN
#define TINY DF_TEST_TMP "/lost-errors-tiny-flux"

static int make_tiny(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' make-tiny --arch flux --seed 5 '%s' >/dev/null",
             TINY, DF_DIFFUSE_BIN, TINY);
    return system(cmd) == 0 ? 0 : -1;
}

static df_status run_once(df_pipeline *p)
{
    df_gen_output out;
    df_status s = df_pipeline_run(
        p,
        &(df_gen_params){.prompt = "a red fox", .width = 32, .height = 32, .steps = 2, .seed = 1},
        &out);
    df_gen_output_free(&out);
    return s;
}

/* A run with allocation N failing, for N spread from the first to past the last. */
static void pipeline_oom_sweep(const df_load_opts *lo)
{
    df_pipeline *p = NULL;
    assert_int_equal(df_pipeline_load(TINY, lo, &p), DF_OK);
    assert_int_equal(run_once(p), DF_OK); /* compiles; later runs replay */
    int failures = 0;
    for (int64_t nth = 1;; nth += nth < 16 ? 1 : nth / 4) {
        df_alloc_fail_at(nth);
        df_status s = run_once(p);
        df_alloc_fail_at(0);
        if (s == DF_OK)
            break;
        if (s != DF_E_OOM || !strstr(df_error_message(), "out of memory"))
            fail_msg("allocation %lld failing: status %d, '%s'", (long long)nth, (int)s,
                     df_error_message());
        failures++;
        assert_true(nth < 100000000);
    }
    printf("    %d runs failed, each with DF_E_OOM and its message\n", failures);
    assert_true(failures > 10);
    assert_int_equal(run_once(p), DF_OK); /* the pipeline still works after all that */
    df_pipeline_free(p);
}

static void test_pipeline_oom_eager(void **state)
{
    (void)state;
    pipeline_oom_sweep(&(df_load_opts){.threads = 1, .dtype = DF_DTYPE_F32});
}

static void test_pipeline_oom_fuse_compiled_blocks(void **state)
{
    (void)state;
    pipeline_oom_sweep(&(df_load_opts){
        .threads = 1, .dtype = DF_DTYPE_F32, .mode = DF_DEFER_AND_FUSE, .compile_blocks = true});
}

static void test_pipeline_oom_compiled_with_blocks(void **state)
{
    (void)state;
    pipeline_oom_sweep(&(df_load_opts){.threads = 1,
                                       .dtype = DF_DTYPE_F32,
                                       .mode = DF_DEFER_AND_FUSE,
                                       .compile = true,
                                       .compile_blocks = true});
}

static void test_pipeline_oom_sequential_offload(void **state)
{
    (void)state;
    pipeline_oom_sweep(&(df_load_opts){.threads = 1,
                                       .dtype = DF_DTYPE_F32,
                                       .mode = DF_DEFER_AND_FUSE,
                                       .compile = true,
                                       .offload = DF_OFFLOAD_SEQUENTIAL});
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_op_with_null_input_fails_the_context),
        cmocka_unit_test(test_compiled_forward_error_reaches_the_reader),
        cmocka_unit_test(test_compiled_forward_without_output_is_an_error),
        cmocka_unit_test(test_compiled_call_out_of_memory_reaches_the_reader),
        cmocka_unit_test(test_compiled_call_inside_a_trace_is_traced),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
#ifdef DF_DIFFUSE_BIN
    const struct CMUnitTest pipeline_tests[] = {
        cmocka_unit_test(test_pipeline_oom_eager),
        cmocka_unit_test(test_pipeline_oom_fuse_compiled_blocks),
        cmocka_unit_test(test_pipeline_oom_compiled_with_blocks),
        cmocka_unit_test(test_pipeline_oom_sequential_offload),
    };
    failed += cmocka_run_group_tests(pipeline_tests, make_tiny, NULL);
#endif
    return failed;
}
