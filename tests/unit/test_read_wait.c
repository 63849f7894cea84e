/*
 * A host read waits on the launch that produced the tensor, not on the whole stream: in
 * strict eager mode, reading an early result while a long chain of products is still
 * queued returns its values with the chain unfinished; results and failures stay as a
 * full wait gives them. The device is DIFFUSE_DEVICE's (tests/device_step.cmake runs this
 * on sim too, where the read is a copy on the copy stream).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "unit/fixtures.h"

enum { N = 384, CHAIN = 48 };

static void test_early_read_does_not_wait_for_later_work(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(2);
    static float a_host[64], w_host[N * N], x_host[N * N], out[64];
    for (int i = 0; i < 64; i++)
        a_host[i] = (float)i - 20.0f;
    for (int i = 0; i < N * N; i++) {
        w_host[i] = (i % (N + 1) == 0 ? 1.0f : 0.0f) + (float)((i * 7) % 13 - 6) * 1e-4f;
        x_host[i] = (float)((i * 5) % 11 - 5) * 0.1f;
    }
    df_tensor *a = df_scale(ctx, df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(64), a_host), 2.0f,
                            1.0f); /* the early result */
    df_tensor *w = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N, N), w_host);
    df_tensor *x = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N, N), x_host);
    for (int k = 0; k < CHAIN; k++) /* queued after it: many milliseconds of products */
        x = df_matmul(ctx, x, w);
    df_event later;
    assert_int_equal(df_event_record(ctx, &later), DF_OK);
    assert_int_equal(df_tensor_read(ctx, a, DF_DTYPE_F32, out, sizeof out), DF_OK);
    bool chain_done = df_event_done(ctx, later);
    for (int i = 0; i < 64; i++)
        assert_true(out[i] == 2.0f * a_host[i] + 1.0f);
    assert_false(chain_done); /* the read did not wait for the products */
    static float xr[N * N];
    assert_int_equal(df_tensor_read(ctx, x, DF_DTYPE_F32, xr, sizeof xr), DF_OK);
    assert_true(df_event_done(ctx, later));
    for (int i = 0; i < N * N; i++)
        assert_true(isfinite(xr[i]));
    df_ctx_free(ctx);
}

/* A failure before the producer is still what the read returns. */
static void test_read_after_a_failure_reports_it(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(2);
    float table[4 * 3] = {0}, out[6];
    int64_t bad[2] = {1, 9}; /* 9: outside the table; only the kernel sees it */
    df_tensor *tab = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(4, 3), table);
    df_tensor *g = df_gather(ctx, tab, df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(2), bad));
    df_tensor *after = df_scale(ctx, g, 2.0f, 0.0f);
    assert_int_equal(df_tensor_read(ctx, after, DF_DTYPE_F32, out, sizeof out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "id 9"));
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_early_read_does_not_wait_for_later_work),
        cmocka_unit_test(test_read_after_a_failure_reports_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
