/*
 * The measurement the text-encoder workloads share (bench_t5.c, bench_decoder_lm.c): a
 * context in the asked dtype, mode and thread count, the model loaded once, one warm-up run
 * (weights packed or quantized for the GEMM, pages read), then the fastest wall and CPU
 * times of `repeats` runs, each until a few values of the result are on the host.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* One encoder run on s token ids; the wall and CPU seconds it took. */
static int run_once(df_ctx *ctx, const bench_encoder *e, void *model, int64_t s, double *seconds,
                    double *cpu_seconds)
{
    int64_t *ids = malloc((size_t)s * sizeof *ids);
    if (!ids)
        return 1;
    for (int64_t i = 0; i < s; i++)
        ids[i] = (i * 37 + 11) % e->vocab;
    float probe[4];
    double t0 = bench_now(), c0 = bench_cpu_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(1, s), ids);
    df_tensor *h = NULL;
    df_status st = e->encode(ctx, model, t, &h);
    if (st == DF_OK)
        st = df_tensor_read(ctx, df_slice(ctx, df_slice(ctx, h, 1, 0, 1), 2, 0, 4), DF_DTYPE_F32,
                            probe, sizeof probe);
    df_scope_end(ctx, mark, NULL);
    *seconds = bench_now() - t0;
    *cpu_seconds = bench_cpu_now() - c0;
    free(ids);
    if (st != DF_OK)
        fprintf(stderr, "%s: %s\n", e->workload, df_error_message());
    return st != DF_OK;
}

int bench_encoder_measure(const bench_opts *o, const bench_encoder *e, const char *dir, int threads,
                          df_dtype dtype, const char *mode, int64_t s, const char *shape,
                          double gflop)
{
    df_ctx *ctx;
    df_eager_mode em = strcmp(mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = threads, .compute = dtype, .mode = em}, &ctx) !=
        DF_OK) {
        fprintf(stderr, "%s: %s\n", e->workload, df_error_message());
        return 1;
    }
    void *m = NULL;
    int bad = e->load(ctx, dir, e->arg, &m) != DF_OK;
    if (bad)
        fprintf(stderr, "%s: %s\n", e->workload, df_error_message());
    double best = 0, best_cpu = 0, sec, cpu;
    bad = bad || run_once(ctx, e, m, s, &sec, &cpu); /* warm-up */
    df_stats_reset(ctx);
    int repeats = o->quick ? 1 : 3;
    for (int r = 0; !bad && r < repeats; r++) {
        bad = run_once(ctx, e, m, s, &sec, &cpu);
        if (r == 0 || sec < best)
            best = sec;
        if (r == 0 || cpu < best_cpu)
            best_cpu = cpu;
    }
    if (!bad) {
        df_stats stats;
        df_ctx_stats(ctx, &stats);
        int nt = df_ctx_threads(ctx);
        /* On a shared machine the rate from CPU time (flop * threads / CPU seconds) is the
         * steadier one; it is reported beside the wall-clock rate. */
        char extra[160];
        snprintf(extra, sizeof extra, ",\"cpu_gflops\":%.1f,\"ceiling_cpu_gflops\":%.1f",
                 best_cpu > 0 ? gflop * nt / best_cpu : 0.0, bench_ceiling_cpu_gflops(dtype, nt));
        bench_report(o, e->workload, shape, nt, df_dtype_name(dtype), mode, best * 1e3,
                     gflop / best, bench_ceiling_gflops(dtype, nt), stats.peak_bytes, extra);
    }
    if (m)
        e->free(m);
    df_ctx_free(ctx);
    return bad;
}
