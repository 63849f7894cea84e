/*
 * The device answers device questions, not the host: what --dtype auto reads (the device's
 * matmul_rates entry) and whether int8 compute runs there (its DF_CAP_INT8 bit).
 *
 * The sim device runs the CPU's kernels on the same host, so whatever it answers differently
 * from the CPU can only have come from the device: fake rates for it
 * (DIFFUSE_SIM_MATMUL_RATES) against other fake rates for the CPU (DIFFUSE_MATMUL_RATES),
 * and a capability taken from it (DIFFUSE_SIM_CAPS=-int8) that the CPU keeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "backend/device.h" /* DF_CAP_INT8 */

/* A context on `device` computing in `compute`, or NULL with the status in *s. */
static df_ctx *open_ctx(const char *device, df_dtype compute, df_status *s)
{
    df_ctx *ctx = NULL;
    *s = df_ctx_create(&(df_ctx_opts){.device = device, .threads = 1, .compute = compute}, &ctx);
    return ctx;
}

static bool have_sim(void)
{
    df_status s;
    df_ctx *ctx = open_ctx("sim", DF_DTYPE_F32, &s);
    df_ctx_free(ctx);
    if (s != DF_OK)
        printf("no sim device in this build: %s\n", df_error_message());
    return s == DF_OK;
}

static void expect_rates(const char *device, double f32, double bf16, const char *how,
                         df_dtype pick)
{
    df_status s;
    df_ctx *ctx = open_ctx(device, DF_DTYPE_F32, &s);
    assert_int_equal(s, DF_OK);
    df_matmul_rates r;
    if (df_ctx_matmul_rates(ctx, &r) != DF_OK)
        fail_msg("%s: %s", device, df_error_message());
    if (r.f32_gflops != f32 || r.bf16_gflops != bf16 || !strstr(r.how, how))
        fail_msg("%s answered f32 %g, bf16 %g (%s); expected %g, %g (%s)", device, r.f32_gflops,
                 r.bf16_gflops, r.how, f32, bf16, how);
    char why[512];
    df_dtype got = df_dtype_auto(&r, DF_DTYPE_BF16, why, sizeof why);
    if (got != pick)
        fail_msg("%s: --dtype auto picks %s (%s), expected %s", device, df_dtype_name(got), why,
                 df_dtype_name(pick));
    printf("%s: f32 %g, bf16 %g GFLOP/s (%s): %s\n", device, f32, bf16, r.how,
           df_dtype_name(got));
    df_ctx_free(ctx);
}

static void test_rates_come_from_the_device(void **state)
{
    (void)state;
    if (!have_sim())
        return;
    setenv("DIFFUSE_MATMUL_RATES", "f32=231,bf16=145", 1); /* the CPU: bf16 slower */
    setenv("DIFFUSE_SIM_MATMUL_RATES", "f32=100,bf16=400", 1);
    expect_rates("cpu", 231, 145, "DIFFUSE_MATMUL_RATES", DF_DTYPE_F32);
    expect_rates("sim", 100, 400, "DIFFUSE_SIM_MATMUL_RATES", DF_DTYPE_BF16);
    setenv("DIFFUSE_MATMUL_RATES", "f32=470,bf16=961", 1); /* and the other way round */
    setenv("DIFFUSE_SIM_MATMUL_RATES", "bf16=0,f32=50", 1);
    expect_rates("cpu", 470, 961, "DIFFUSE_MATMUL_RATES", DF_DTYPE_BF16);
    expect_rates("sim", 50, 0, "DIFFUSE_SIM_MATMUL_RATES", DF_DTYPE_F32);

    /* A malformed fake rate is the user's to fix: named. Without one the sim does not say. */
    df_status s;
    df_ctx *ctx = open_ctx("sim", DF_DTYPE_F32, &s);
    assert_int_equal(s, DF_OK);
    df_matmul_rates r;
    setenv("DIFFUSE_SIM_MATMUL_RATES", "fast", 1);
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "DIFFUSE_SIM_MATMUL_RATES='fast'"));
    unsetenv("DIFFUSE_SIM_MATMUL_RATES");
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "sim"));
    assert_true(r.f32_gflops == 0 && r.bf16_gflops == 0);
    df_ctx_free(ctx);
    unsetenv("DIFFUSE_MATMUL_RATES");
}

static void test_int8_is_a_device_capability(void **state)
{
    (void)state;
    if (!have_sim())
        return;
    df_status s;
    df_ctx *ctx = open_ctx("sim", DF_DTYPE_I8, &s); /* the sim declares the CPU's int8 */
    if (s != DF_OK)
        fail_msg("sim with int8: %s", df_error_message());
    df_ctx_free(ctx);

    setenv("DIFFUSE_SIM_CAPS", "-int8", 1);
    ctx = open_ctx("sim", DF_DTYPE_I8, &s);
    assert_null(ctx);
    assert_int_equal(s, DF_E_UNSUPPORTED);
    const char *msg = df_error_message();
    if (!strstr(msg, "compute dtype int8: sim:0 has no int8 products") ||
        !strstr(msg, "devices with them: --device cpu:0"))
        fail_msg("unexpected message: %s", msg);
    ctx = open_ctx("sim", DF_DTYPE_F32, &s); /* f32 still opens; int8 is refused later too */
    assert_int_equal(s, DF_OK);
    assert_int_equal(df_ctx_set_compute_dtype(ctx, DF_DTYPE_I8), DF_E_UNSUPPORTED);
    assert_int_equal(df_ctx_compute_dtype(ctx), DF_DTYPE_F32);
    df_ctx_free(ctx);
    ctx = open_ctx("cpu", DF_DTYPE_I8, &s); /* the host's CPU keeps its own */
    assert_int_equal(s, DF_OK);
    df_ctx_free(ctx);

    df_device_desc d[16];
    int n = df_device_list(d, 16, true);
    bool listed = false;
    for (int i = 0; i < n && i < 16; i++)
        if (strncmp(d[i].device, "sim", 3) == 0) {
            listed = true;
            assert_int_equal(d[i].caps & DF_CAP_INT8, 0); /* as `diffuse devices --all` says */
        }
    assert_true(listed);

    setenv("DIFFUSE_SIM_CAPS", "-int9", 1);
    ctx = open_ctx("sim", DF_DTYPE_F32, &s);
    assert_null(ctx);
    assert_int_equal(s, DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "DIFFUSE_SIM_CAPS='-int9'"));
    unsetenv("DIFFUSE_SIM_CAPS");
}

int main(void)
{
    unsetenv("DIFFUSE_SIM_CAPS");
    unsetenv("DIFFUSE_SIM_MATMUL_RATES");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rates_come_from_the_device),
        cmocka_unit_test(test_int8_is_a_device_capability),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
