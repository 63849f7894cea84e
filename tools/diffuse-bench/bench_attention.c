/*
 * Workload "attention": df_attention as the FLUX transformer calls it, 24 heads of 128 on
 * 4608 tokens (a 1024x1024 image plus 512 text tokens) and on 1536, in f32, bf16 and int8
 * compute (int8: Q K^T and P V in int8; DIFFUSE_INT8_ATTENTION=0 gives int8 compute's
 * f32 attention), on 1 and 2 threads. q, k and v are [B, S, H*D] projections viewed as
 * [B, H, S, D] (a reshape and a permute, so the kernel reads strided rows), no mask.
 *
 * GFLOP/s count the two products, 4 B H Sq Sk D (the softmax is not counted), and are set
 * against the GEMM ceiling of the compute dtype measured in the same run. Each shape is
 * the best of a few calls, each ending in df_sync (--quick: one call, 1024 tokens), after
 * an untimed call on 512 tokens that makes the kernel's block plans. As in
 * the gemm workload, cpu_gflops and cpu_ratio repeat the comparison from CPU time.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static df_tensor *projection(df_ctx *ctx, int64_t B, int64_t S, int64_t H, int64_t D, uint64_t seed)
{
    float *f = malloc((size_t)(B * S * H * D) * sizeof *f);
    if (!f)
        return NULL;
    bench_fill_random(f, B * S * H * D, seed);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, H * D), f);
    free(f);
    t = df_reshape(ctx, t, DF_SHAPE(B, S, H, D));
    return df_permute(ctx, t, DF_SHAPE(0, 2, 1, 3)); /* [B, H, S, D] */
}

static int attention_config(const bench_opts *o, df_dtype compute, int threads, const char *mode)
{
    static const int64_t full[] = {4608, 1536}, quick[] = {1024};
    const int64_t *sizes = o->quick ? quick : full;
    int n_sizes = o->quick ? 1 : 2, reps = o->quick ? 1 : 2;
    const int64_t B = 1, H = 24, D = 128;
    double ceiling = bench_ceiling_gflops(compute, threads);
    double ceiling_cpu = bench_ceiling_cpu_gflops(compute, threads);

    df_ctx *ctx;
    df_ctx_opts opts = {.threads = threads,
                        .compute = compute,
                        .mode = strcmp(mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER};
    if (df_ctx_create(&opts, &ctx) != DF_OK) {
        fprintf(stderr, "attention: mode %s: %s\n", mode, df_error_message());
        return strcmp(mode, "fuse") == 0 ? 0 : 1;
    }
    /* 512 tokens first, untimed: the same block sizes, so the block plans get made here */
    df_scope warm = df_scope_begin(ctx);
    df_tensor *w = projection(ctx, B, 512, H, D, 4);
    df_attention(ctx, w, w, w, NULL, false, 0);
    int failures = df_sync(ctx) != DF_OK;
    if (failures)
        fprintf(stderr, "attention: %s\n", df_error_message());
    df_scope_end(ctx, warm, NULL);
    for (int si = 0; si < n_sizes && !failures; si++) {
        int64_t S = sizes[si];
        df_scope outer = df_scope_begin(ctx);
        df_tensor *q = projection(ctx, B, S, H, D, 1), *k = projection(ctx, B, S, H, D, 2);
        df_tensor *v = projection(ctx, B, S, H, D, 3);
        df_stats_reset(ctx);
        double best = -1, best_cpu = 0;
        for (int r = 0; r < reps; r++) {
            df_scope mark = df_scope_begin(ctx);
            double t0 = bench_now(), c0 = bench_cpu_now();
            df_tensor *y = df_attention(ctx, q, k, v, NULL, false, 0);
            df_status s = y ? df_sync(ctx) : df_ctx_status(ctx);
            double t = bench_now() - t0, c = bench_cpu_now() - c0;
            if (r == 0 || c < best_cpu)
                best_cpu = c;
            df_scope_end(ctx, mark, NULL);
            if (s != DF_OK) {
                fprintf(stderr, "attention: %s\n", df_error_message());
                failures++;
                break;
            }
            if (best < 0 || t < best)
                best = t;
        }
        if (best > 0) {
            df_stats st;
            df_ctx_stats(ctx, &st);
            double flop = 4.0 * (double)(B * H) * (double)S * (double)S * (double)D;
            double gflops = 1e-9 * flop / best, cpu_gflops = 1e-9 * flop * threads / best_cpu;
            char shape[64], extra[160];
            snprintf(shape, sizeof shape, "B=%lld H=%lld S=%lld D=%lld", (long long)B, (long long)H,
                     (long long)S, (long long)D);
            snprintf(extra, sizeof extra,
                     ",\"ratio\":%.3f,\"cpu_gflops\":%.1f,\"cpu_ratio\":%.3f,\"layout\":\"bshd\"",
                     ceiling > 0 ? gflops / ceiling : 0.0, cpu_gflops,
                     ceiling_cpu > 0 ? cpu_gflops / ceiling_cpu : 0.0);
            bench_report(o, "attention", shape, threads, df_dtype_name(compute), mode, best * 1e3,
                         gflops, ceiling, st.peak_bytes, extra);
        }
        df_scope_end(ctx, outer, NULL);
    }
    df_ctx_free(ctx);
    return failures;
}

int bench_attention(const bench_opts *o)
{
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    int threads[2] = {o->threads, 0}, nt = 1;
    if (o->threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        nt = 2;
    }
    const char *mode = o->mode ? o->mode : "eager";
    int failures = 0;
    for (int di = 0; di < 3; di++) {
        if (o->dtype && strcmp(o->dtype, df_dtype_name(dtypes[di])) != 0)
            continue;
        for (int ti = 0; ti < nt; ti++)
            failures += attention_config(o, dtypes[di], threads[ti], mode);
    }
    return failures ? 1 : 0;
}
