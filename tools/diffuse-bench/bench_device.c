/*
 * Workload "device": a device (--device, default vulkan) against the CPU in the same run.
 *
 * 1. GEMM: df_linear of a [M, K] activation by a [N, K] weight with bias, on square sizes,
 *    timed until the device has finished, on the device and on the CPU. The rate is set
 *    against the device's nominal peak where one is known: no Vulkan query gives clocks or
 *    ALU counts, so it is --peak GFLOPS when given (from the vendor's sheet), "unknown"
 *    otherwise (lavapipe has none; its CPU's ceiling is the CPU rows' own).
 * 2. A FLUX.1-shaped transformer step (the "modes" workload, at its --quick shape unless
 *    --full): eager, fuse and compile on the device, then on the CPU, with the device's
 *    counters (dispatches, recorded dispatches, submits and graph launches per step).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct gemm_run {
    df_ctx *ctx;
    df_tensor *x, *w, *b;
    int bad;
} gemm_run;

static int gemm_setup(const char *device, int threads, int64_t n, gemm_run *g)
{
    memset(g, 0, sizeof *g);
    if (df_ctx_create(&(df_ctx_opts){.device = device, .threads = threads}, &g->ctx) != DF_OK) {
        fprintf(stderr, "device: %s: %s\n", device, df_error_message());
        return g->bad = 1;
    }
    float *v = malloc((size_t)(n * n + n) * sizeof *v);
    if (!v)
        return g->bad = 1;
    bench_fill_random(v, n * n, 1);
    g->x = df_tensor_persist(df_tensor_from_host(g->ctx, DF_DTYPE_F32, DF_SHAPE(n, n), v));
    bench_fill_random(v, n * n, 2);
    g->w = df_tensor_persist(df_tensor_from_host(g->ctx, DF_DTYPE_F32, DF_SHAPE(n, n), v));
    bench_fill_random(v, n, 3);
    g->b = df_tensor_persist(df_tensor_from_host(g->ctx, DF_DTYPE_F32, DF_SHAPE(n), v));
    free(v);
    return g->bad = df_sync(g->ctx) != DF_OK;
}

/* Seconds of `repeats` products, queued back to back, until the device has finished. */
static double gemm_time(gemm_run *g, int repeats)
{
    df_scope mark = df_scope_begin(g->ctx);
    double t0 = bench_now();
    for (int i = 0; i < repeats; i++)
        df_linear(g->ctx, g->x, &(df_linear_weights){g->w, g->b});
    g->bad |= df_sync(g->ctx) != DF_OK;
    double t = bench_now() - t0;
    df_scope_end(g->ctx, mark, NULL);
    return t;
}

static void gemm_free(gemm_run *g)
{
    df_tensor_free(g->x);
    df_tensor_free(g->w);
    df_tensor_free(g->b);
    df_ctx_free(g->ctx);
}

static int gemm_rows(const bench_opts *o, const char *device, double peak)
{
    static const int64_t quick_sizes[2] = {128, 256}, full_sizes[3] = {256, 512, 1024};
    const int64_t *sizes = o->quick ? quick_sizes : full_sizes;
    int n_sizes = o->quick ? 2 : 3, threads = o->threads ? o->threads : 2, failures = 0;
    for (int k = 0; k < n_sizes; k++) {
        int64_t n = sizes[k];
        double flop = 2.0 * (double)n * (double)n * (double)n;
        int repeats = n <= 256 ? 8 : n <= 512 ? 4 : 2;
        const char *targets[2] = {device, "cpu"};
        for (int t = 0; t < 2; t++) {
            gemm_run g;
            if (gemm_setup(targets[t], threads, n, &g) == 0) {
                gemm_time(&g, 1); /* pipelines, packed weights, pools */
                double sec = gemm_time(&g, repeats) / repeats;
                char shape[64], extra[160];
                snprintf(shape, sizeof shape, "linear %" PRId64 "^3 on %s", n, targets[t]);
                bool dev = t == 0;
                double ceiling = dev ? peak : bench_ceiling_gflops(DF_DTYPE_F32, threads);
                snprintf(extra, sizeof extra, ",\"device\":\"%s\",\"peak\":\"%s\"", targets[t],
                         dev && peak <= 0 ? "unknown" : dev ? "nominal" : "cpu ceiling");
                if (!g.bad)
                    bench_report(o, "device", shape, threads, "f32", "eager", sec * 1e3,
                                 flop / sec * 1e-9, ceiling, 0, extra);
            }
            failures += g.bad;
            gemm_free(&g);
        }
    }
    return failures;
}

int bench_device(const bench_opts *o)
{
    const char *device = o->device ? o->device : "vulkan";
    double peak = 0;
    bool full = false;
    for (int i = 0; i < o->argc; i++) {
        if (!strcmp(o->argv[i], "--peak") && i + 1 < o->argc)
            peak = atof(o->argv[++i]);
        else if (!strcmp(o->argv[i], "--full"))
            full = true;
    }
    if (!o->json)
        printf("device %s: nominal peak %s%s\n", device, peak > 0 ? "" : "unknown",
               peak > 0 ? "(--peak)" : " (no Vulkan query gives it; --peak GFLOPS sets it)");
    int failures = gemm_rows(o, device, peak);
    /* The transformer step, on the device, then on the CPU. */
    bench_opts m = *o;
    m.quick = !full;
    m.argc = 0;
    m.argv = NULL;
    m.mode = o->mode ? o->mode : "eager,fuse,compile";
    m.dtype = o->dtype ? o->dtype : "f32";
    const char *saved = bench_device_name;
    bench_device_name = device;
    failures += bench_modes(&m);
    bench_device_name = "cpu";
    failures += bench_modes(&m);
    bench_device_name = saved;
    return failures ? 1 : 0;
}
