/*
 * An unmerged LoRA's side product in the GEMM epilogue (runtime/ops.c, df_linear):
 * y + (x down^T) up^T runs as the main product, the small down product and an up product
 * that adds y on its way out, with no add kernel, in strict eager, defer-and-fuse and
 * compiled mode, in f32, bf16 and int8 compute, on the CPU and on Vulkan; on a device
 * without the epilogue (the sim with DIFFUSE_SIM_CAPS=-epilogue-gated-residual) it is a
 * product and an add, with the same result. Each case is checked against a float64
 * reference and proved by the per-op profile, which counts the kernels of each op that ran.
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

#include <diffuse/compile.h>
#include <diffuse/diffuse.h>

#include "runtime/runtime.h"
#include "runtime/weight.h"

enum { B = 2, S = 5, K = 24, N = 20, R = 6 };

typedef struct lora_layer {
    df_linear_weights lw; /* weight [N, K], bias [N], lora_down [R, K], lora_up [N, R] */
} lora_layer;

static void fill(float *v, int n, float s, float phase)
{
    for (int i = 0; i < n; i++)
        v[i] = s * sinf(0.37f * (float)i + phase);
}

static float x_h[B * S * K], w_h[N * K], b_h[N], down_h[R * K], up_h[N * R];

static void make_data(void)
{
    fill(x_h, B * S * K, 1.0f, 0.1f);
    fill(w_h, N * K, 0.2f, 0.7f);
    fill(b_h, N, 0.5f, 1.3f);
    fill(down_h, R * K, 0.3f, 2.1f);
    fill(up_h, N * R, 0.4f, 0.4f);
}

/* x w^T + b + (x down^T) up^T in float64. */
static void reference(double *out)
{
    for (int m = 0; m < B * S; m++) {
        double h[R];
        for (int r = 0; r < R; r++) {
            h[r] = 0;
            for (int k = 0; k < K; k++)
                h[r] += (double)x_h[m * K + k] * down_h[r * K + k];
        }
        for (int j = 0; j < N; j++) {
            double acc = b_h[j];
            for (int k = 0; k < K; k++)
                acc += (double)x_h[m * K + k] * w_h[j * K + k];
            for (int r = 0; r < R; r++)
                acc += h[r] * up_h[j * R + r];
            out[m * N + j] = acc;
        }
    }
}

static lora_layer make_layer(df_ctx *ctx)
{
    lora_layer l = {
        .lw = {
            .weight =
                df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N, K), w_h)),
            .bias = df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), b_h)),
            .lora_down =
                df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(R, K), down_h)),
            .lora_up =
                df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N, R), up_h)),
        }};
    assert_int_equal(df_ctx_status(ctx), DF_OK);
    /* as models/loader.c binds them: int8 compute keeps the factors in f32 */
    assert_int_equal(df_weight_keep_precision(l.lw.lora_down, true), DF_OK);
    assert_int_equal(df_weight_keep_precision(l.lw.lora_up, true), DF_OK);
    return l;
}

static void free_layer(lora_layer *l)
{
    df_tensor_free(l->lw.weight);
    df_tensor_free(l->lw.bias);
    df_tensor_free(l->lw.lora_down);
    df_tensor_free(l->lw.lora_up);
}

static df_status layer_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    out[0] = df_linear(ctx, in[0], &((lora_layer *)self)->lw);
    return df_ctx_status(ctx);
}

static int layer_weights(void *self, df_tensor **out)
{
    lora_layer *l = self;
    out[0] = l->lw.weight;
    out[1] = l->lw.bias;
    out[2] = l->lw.lora_down;
    out[3] = l->lw.lora_up;
    return 4;
}

static const df_module layer_module = {.name = "lora_linear",
                                       .n_in = 1,
                                       .n_out = 1,
                                       .forward = layer_forward,
                                       .weights = layer_weights};

/* Kernels of op `name` that ran since profiling was turned on. */
static int64_t kernels_of(df_ctx *ctx, const char *name)
{
    df_profile_entry e[64];
    int n = df_ctx_profile(ctx, e, 64);
    for (int i = 0; i < n && i < 64; i++)
        if (strcmp(e[i].op, name) == 0)
            return e[i].calls;
    return 0;
}

typedef enum { RUN_EAGER, RUN_FUSE, RUN_COMPILE } run_mode;

static const char *mode_name(run_mode m)
{
    return m == RUN_EAGER ? "eager" : m == RUN_FUSE ? "fuse" : "compile";
}

/* Kernels that ran, by op: products, adds, fused pointwise kernels. */
typedef struct counts {
    int64_t linear, add, fused;
} counts;

/* Runs the layer twice in `mode` (a compiled program's second call replays it), checks
 * the result against the reference within `tol` (relative L2) and returns the kernels that
 * ran in the two calls. */
static counts run_case(const char *device, df_dtype compute, run_mode mode, double tol)
{
    df_ctx *ctx = NULL;
    df_ctx_opts o = {.device = device,
                     .threads = 2,
                     .compute = compute,
                     .mode = mode == RUN_FUSE ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER};
    if (df_ctx_create(&o, &ctx) != DF_OK)
        fail_msg("%s: %s", device, df_error_message());
    lora_layer l = make_layer(ctx);
    df_compiled *c = NULL;
    if (mode == RUN_COMPILE)
        assert_int_equal(df_compile(&layer_module, &(df_compile_opts){.fullgraph = true}, &c),
                         DF_OK);
    static double want[B * S * N];
    static float got[B * S * N];
    reference(want);
    df_ctx_set_profiling(ctx, true);
    for (int call = 0; call < 2; call++) {
        df_scope mark = df_scope_begin(ctx);
        df_tensor *x = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, K), x_h);
        df_tensor *y = NULL;
        if (c)
            assert_int_equal(df_compiled_call(ctx, c, &l, &x, &y), DF_OK);
        else
            y = df_linear(ctx, x, &l.lw);
        if (df_tensor_read(ctx, y, DF_DTYPE_F32, got, sizeof got) != DF_OK)
            fail_msg("%s %s %s: %s", device, df_dtype_name(compute), mode_name(mode),
                     df_error_message());
        df_scope_end(ctx, mark, NULL);
        double num = 0, den = 0;
        for (int i = 0; i < B * S * N; i++) {
            num += (got[i] - want[i]) * (got[i] - want[i]);
            den += want[i] * want[i];
        }
        if (sqrt(num / den) > tol)
            fail_msg("%s %s %s: relative L2 error %g > %g", device, df_dtype_name(compute),
                     mode_name(mode), sqrt(num / den), tol);
    }
    counts k = {kernels_of(ctx, "linear"), kernels_of(ctx, "add"), kernels_of(ctx, "fused")};
    df_compiled_free(c);
    free_layer(&l);
    df_ctx_free(ctx);
    return k;
}

/* On the CPU, every mode and compute dtype: three products a call, no add. */
static void test_cpu_runs_no_add(void **state)
{
    (void)state;
    const struct {
        df_dtype compute;
        double tol;
    } dt[] = {{DF_DTYPE_F32, 1e-6}, {DF_DTYPE_BF16, 2e-2}, {DF_DTYPE_I8, 3e-2}};
    for (size_t d = 0; d < sizeof dt / sizeof dt[0]; d++)
        for (run_mode m = RUN_EAGER; m <= RUN_COMPILE; m++) {
            counts k = run_case("cpu", dt[d].compute, m, dt[d].tol);
            printf("cpu %s %s: %lld linear, %lld add, %lld fused kernels\n",
                   df_dtype_name(dt[d].compute), mode_name(m), (long long)k.linear,
                   (long long)k.add, (long long)k.fused);
            if (k.add != 0 || k.fused != 0 || k.linear != 6)
                fail_msg("cpu %s %s: %lld add, %lld fused and %lld linear kernels, want 0, 0 "
                         "and 6",
                         df_dtype_name(dt[d].compute), mode_name(m), (long long)k.add,
                         (long long)k.fused, (long long)k.linear);
        }
}

/* A device without the epilogue gets a product and an add, and the same result. (A
 * compiled program on the sim replays as one recorded graph, whose kernels the profile
 * does not see: the first call's count it.) */
static void test_device_without_epilogue_adds(void **state)
{
    (void)state;
    df_ctx *probe = NULL;
    if (df_ctx_create(&(df_ctx_opts){.device = "sim", .threads = 1}, &probe) != DF_OK) {
        printf("no sim device in this build: %s\n", df_error_message());
        return;
    }
    df_ctx_free(probe);
    for (run_mode m = RUN_EAGER; m <= RUN_COMPILE; m++) {
        counts k = run_case("sim", DF_DTYPE_F32, m, 1e-6);
        assert_int_equal(k.add + k.fused, 0);
    }
    setenv("DIFFUSE_SIM_CAPS", "-epilogue-gated-residual", 1);
    for (run_mode m = RUN_EAGER; m <= RUN_COMPILE; m++) {
        counts k = run_case("sim", DF_DTYPE_F32, m, 1e-6);
        if (k.add + k.fused < 1) /* the add runs alone, or in a fused kernel */
            fail_msg("sim without the epilogue, %s: %lld add and %lld fused kernels", mode_name(m),
                     (long long)k.add, (long long)k.fused);
    }
    unsetenv("DIFFUSE_SIM_CAPS");
}

/* The Vulkan backend has the epilogue too (lavapipe in CI, where tests/vulkan.cmake runs
 * this program with the plugin's folder; skipped without the plugin or a driver). */
static void test_vulkan_runs_no_add(void **state)
{
    (void)state;
    df_ctx *probe = NULL;
    if (df_ctx_create(&(df_ctx_opts){.device = "vulkan:0", .threads = 1}, &probe) != DF_OK) {
        printf("no vulkan device: %s\n", df_error_message());
        return;
    }
    df_ctx_free(probe);
    for (run_mode m = RUN_EAGER; m <= RUN_COMPILE; m++) {
        counts k = run_case("vulkan:0", DF_DTYPE_F32, m, 1e-5);
        assert_int_equal(k.add + k.fused, 0);
        if (m == RUN_EAGER) /* the profile sees this device's kernels: 2 calls x 3 products */
            assert_int_equal(k.linear, 6);
    }
}

int main(void)
{
    make_data();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_runs_no_add),
        cmocka_unit_test(test_device_without_epilogue_adds),
        cmocka_unit_test(test_vulkan_runs_no_add),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
