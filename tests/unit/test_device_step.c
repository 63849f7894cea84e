/*
 * The flow-match Euler step on the device against the host step, the reference path.
 *
 * The scheduler tests: df_scheduler_step_tensor gives the host step's bits for values that
 * stress the rounding (signed zeros, subnormals, large and tiny magnitudes, bf16 model
 * outputs), and the guidance compositions give the host formulas' bits. The pipeline
 * tests: FLUX.1, SD3 (classifier-free guidance) and FLUX.2 klein base (CFG) give the same
 * final latents with DIFFUSE_HOST_STEP=1 and without, in eager and fuse, f32 and bf16, and
 * the device path downloads nothing per step (df_stats bytes_downloaded does not grow with
 * the step count). The device is DIFFUSE_DEVICE's (tests/sim.cmake runs this on sim).
 * Arguments: the tiny FLUX.1, SD3 and FLUX.2 klein folders that make-tiny writes
 * (tests/device_step.cmake): DF_TEST_NEEDS_ARGS.
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
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "sched/flow_match_euler.h"
#include "unit/fixtures.h"

static const char *flux_dir, *sd3_dir, *klein_dir;

/* Test values: a deterministic mix of ordinary, tiny, huge, subnormal and signed-zero. */
static float value(uint32_t *state, int i)
{
    *state = *state * 1664525u + 1013904223u;
    float u = (float)(*state >> 8) / 16777216.0f * 2.0f - 1.0f;
    switch (i % 8) {
    case 0:
        return 0.0f;
    case 1:
        return -0.0f;
    case 2:
        return u * 1e-39f; /* subnormal */
    case 3:
        return u * 3e37f;
    default:
        return u * (float)(1 + i % 5);
    }
}

static df_scheduler *make_sched(int steps)
{
    df_scheduler_config c;
    df_scheduler_config_default(&c);
    df_scheduler *s = NULL;
    assert_int_equal(df_scheduler_create(&c, &s), DF_OK);
    assert_int_equal(df_scheduler_set_timesteps(s, steps, NULL, NULL), DF_OK);
    return s;
}

static void step_matches_host(df_eager_mode mode, df_dtype v_dtype)
{
    enum { N = 4099, STEPS = 3 };
    df_ctx *ctx = fixture_ctx(2);
    assert_int_equal(df_set_eager_mode(ctx, mode), DF_OK);
    static float x[N], v[N], host[N], dev[N];
    uint32_t st = 11;
    for (int i = 0; i < N; i++) {
        x[i] = value(&st, i);
        v[i] = value(&st, i / 3 + 1);
    }
    df_scheduler *hs = make_sched(STEPS), *ds = make_sched(STEPS);
    memcpy(host, x, sizeof x);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *xt = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), x);
    df_tensor *vt = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), v);
    if (v_dtype == DF_DTYPE_BF16) {
        vt = df_cast(ctx, vt, DF_DTYPE_BF16);
        assert_int_equal(df_tensor_read(ctx, vt, DF_DTYPE_F32, v, sizeof v), DF_OK);
    }
    for (int k = 0; k < STEPS; k++) {
        assert_int_equal(df_scheduler_step(hs, v, host, N), DF_OK);
        assert_int_equal(df_scheduler_step_tensor(ds, ctx, vt, &xt), DF_OK);
    }
    assert_int_equal(df_tensor_read(ctx, xt, DF_DTYPE_F32, dev, sizeof dev), DF_OK);
    assert_memory_equal(host, dev, sizeof host);
    assert_int_equal(df_scheduler_step_index(ds), STEPS);
    assert_int_equal(df_scheduler_step_tensor(ds, ctx, vt, &xt), DF_E_STATE); /* none left */
    df_scope_end(ctx, mark, NULL);
    df_scheduler_free(hs);
    df_scheduler_free(ds);
    df_ctx_free(ctx);
}

static void test_step_eager_f32(void **state)
{
    (void)state;
    step_matches_host(DF_DEFER_NEVER, DF_DTYPE_F32);
}
static void test_step_fuse_f32(void **state)
{
    (void)state;
    step_matches_host(DF_DEFER_AND_FUSE, DF_DTYPE_F32);
}
static void test_step_eager_bf16(void **state)
{
    (void)state;
    step_matches_host(DF_DEFER_NEVER, DF_DTYPE_BF16);
}
static void test_step_fuse_bf16(void **state)
{
    (void)state;
    step_matches_host(DF_DEFER_AND_FUSE, DF_DTYPE_BF16);
}

/* uncond + g * (cond - uncond), as the pipelines compose it on the device, against the
 * host's float32 loop. */
static void test_guidance_matches_host(void **state)
{
    (void)state;
    enum { N = 1031 };
    static float u[N], c[N], host[N], dev[N];
    uint32_t st = 5;
    for (int i = 0; i < N; i++) {
        u[i] = value(&st, i + 2);
        c[i] = value(&st, i + 5);
    }
    float g = 7.0f;
    for (int i = 0; i < N; i++) {
        float diff = c[i] - u[i], guided = g * diff;
        host[i] = u[i] + guided;
    }
    for (int m = 0; m < 2; m++) {
        df_ctx *ctx = fixture_ctx(2);
        assert_int_equal(df_set_eager_mode(ctx, m ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER), DF_OK);
        df_tensor *ut = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), u);
        df_tensor *ct = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), c);
        df_tensor *r = df_add(ctx, ut, df_scale(ctx, df_sub(ctx, ct, ut), g, -0.0f));
        assert_int_equal(df_tensor_read(ctx, r, DF_DTYPE_F32, dev, sizeof dev), DF_OK);
        assert_memory_equal(host, dev, sizeof host);
        df_ctx_free(ctx);
    }
}

/* ---- pipelines ------------------------------------------------------------------------ */

typedef struct result {
    df_gen_output out;
    int64_t downloaded;
} result;

static void generate(df_pipeline *p, int steps, bool host, result *r)
{
    if (host)
        setenv("DIFFUSE_HOST_STEP", "1", 1);
    else
        unsetenv("DIFFUSE_HOST_STEP");
    df_ctx *ctx = df_pipeline_ctx(p);
    df_stats_reset(ctx);
    /* 16 prompt tokens: the step and the guidance do not depend on the prompt's length, and
     * the tiny encoders' 512 default made most of this test's time */
    assert_int_equal(df_pipeline_run(p,
                                     &(df_gen_params){.prompt = "a red fox",
                                                      .height = 32,
                                                      .width = 32,
                                                      .steps = steps,
                                                      .guidance = 4.0f,
                                                      .seed = 3,
                                                      .max_sequence_length = 16},
                                     &r->out),
                     DF_OK);
    df_stats s;
    df_ctx_stats(ctx, &s);
    r->downloaded = s.bytes_downloaded;
    unsetenv("DIFFUSE_HOST_STEP");
}

static size_t latents_bytes(const df_gen_output *o)
{
    size_t n = 1;
    for (int d = 0; d < o->latents_ndim; d++)
        n *= (size_t)o->latents_shape[d];
    return n * sizeof(float);
}

static void pipeline_matches_host(const char *dir, const char *name)
{
    for (int m = 0; m < 2; m++)
        for (int d = 0; d < 2; d++) {
            df_pipeline *p = NULL;
            df_load_opts o = {.threads = 2,
                              .mode = m ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER,
                              .dtype = d ? DF_DTYPE_BF16 : DF_DTYPE_F32};
            assert_int_equal(df_pipeline_load(dir, &o, &p), DF_OK);
            bool sim = strncmp(df_ctx_device_name(df_pipeline_ctx(p)), "sim", 3) == 0;
            result dev1, dev2, host1 = {0}, host2;
            generate(p, 1, false, &dev1);
            generate(p, 2, false, &dev2);
            generate(p, 2, true, &host2);
            if (sim) /* for the per-step downloads of the host path */
                generate(p, 1, true, &host1);
            size_t bytes = latents_bytes(&dev2.out);
            assert_true(bytes > 0);
            assert_int_equal(latents_bytes(&host2.out), bytes);
            assert_memory_equal(dev2.out.latents, host2.out.latents, bytes);
            /* nothing read back per step on the device path */
            assert_int_equal(dev2.downloaded, dev1.downloaded);
            if (sim) { /* the host path reads the prediction every step */
                assert_true(host2.downloaded - host1.downloaded >= (int64_t)bytes);
                print_message("%s %s %s on %s: bytes downloaded per step: host step %lld, "
                              "device step %lld\n",
                              name, m ? "fuse" : "eager", d ? "bf16" : "f32",
                              df_ctx_device_name(df_pipeline_ctx(p)),
                              (long long)(host2.downloaded - host1.downloaded),
                              (long long)(dev2.downloaded - dev1.downloaded));
            }
            df_gen_output_free(&dev1.out);
            df_gen_output_free(&dev2.out);
            if (sim)
                df_gen_output_free(&host1.out);
            df_gen_output_free(&host2.out);
            df_pipeline_free(p);
        }
}

static void test_flux_pipeline(void **state)
{
    (void)state;
    pipeline_matches_host(flux_dir, "flux");
}

static void test_sd3_pipeline_cfg(void **state)
{
    (void)state;
    pipeline_matches_host(sd3_dir, "sd3");
}

/* The klein folder made a base checkpoint (is_distilled false): CFG every step. */
static void test_klein_base_pipeline_cfg(void **state)
{
    (void)state;
    static char dir[512], cmd[1024];
    /* one folder per process: the CPU and sim runs of this test may run at once */
    snprintf(dir, sizeof dir, "%s/device-step-klein-base-%ld", DF_TEST_TMP, (long)getpid());
    fixture_klein_base(klein_dir, dir);
    pipeline_matches_host(dir, "flux2-klein-base");
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: test_device_step TINY_FLUX_DIR TINY_SD3_DIR TINY_KLEIN_DIR\n");
        return 2;
    }
    flux_dir = argv[1];
    sd3_dir = argv[2];
    klein_dir = argv[3];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_step_eager_f32),
        cmocka_unit_test(test_step_fuse_f32),
        cmocka_unit_test(test_step_eager_bf16),
        cmocka_unit_test(test_step_fuse_bf16),
        cmocka_unit_test(test_guidance_matches_host),
        cmocka_unit_test(test_flux_pipeline),
        cmocka_unit_test(test_sd3_pipeline_cfg),
        cmocka_unit_test(test_klein_base_pipeline_cfg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
