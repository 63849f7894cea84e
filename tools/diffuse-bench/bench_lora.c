/*
 * Workload "lora": an unmerged LoRA's side product at FLUX width, y = x W^T + b +
 * (x down^T) up^T with x [4096, 3072], W [3072, 3072] and rank 16 and 64, three ways in
 * one run:
 *   - plain: the linear alone (what the side product costs on top of);
 *   - unfused: the side product as two products and an add (df_add(y, (x down^T) up^T)),
 *     the composition df_linear used before the epilogue took the add;
 *   - fused: df_linear with lora_down / lora_up, whose up product adds y on its way out
 *     on a device with the gated residual epilogue.
 * The three alternate call by call and each keeps its best wall and CPU time (--quick: M =
 * 512, 2 rounds; else --reps N rounds, 6 by default), so a busy machine slows them alike.
 * The add a fusion saves is one pass over [M, N] against a 2 M N K product: a few percent
 * at this width, so only the best of several rounds shows it. Reported: ms of each,
 * fused / unfused and each one's time over plain, from wall and from CPU time.
 * W is a bf16 weight (packed once; quantized once under int8); the factors are f32 and are
 * not bound as weights (the public API has no way to keep a weight at full precision under
 * int8 compute, as the loader does), so they run as f32 products in every dtype.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

static df_tensor *random_tensor(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                                float scale, uint64_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *f = malloc((size_t)n * sizeof *f);
    uint16_t *h = dtype == DF_DTYPE_BF16 ? malloc((size_t)n * sizeof *h) : NULL;
    df_tensor *t = NULL;
    if (f && (dtype != DF_DTYPE_BF16 || h)) {
        bench_fill_random(f, n, seed);
        for (int64_t i = 0; i < n; i++)
            f[i] *= scale;
        for (int64_t i = 0; h && i < n; i++)
            h[i] = df_f32_to_bf16(f[i]);
        t = df_tensor_from_host(ctx, dtype, shape, ndim, h ? (void *)h : (void *)f);
    }
    free(f);
    free(h);
    return t;
}

enum { PLAIN, UNFUSED, FUSED, N_WAYS };
static const char *const way_name[N_WAYS] = {"plain", "unfused", "fused"};

/* One call of `way`, synchronised: its seconds, or < 0 on failure; *cpu gets the CPU
 * seconds of the whole process during the call. */
static double time_way(df_ctx *ctx, df_tensor *x, const df_linear_weights *lw, int way, double *cpu)
{
    df_scope mark = df_scope_begin(ctx);
    double t0 = bench_now(), c0 = bench_cpu_now();
    df_tensor *y;
    if (way == PLAIN) {
        y = df_linear(ctx, x, &(df_linear_weights){.weight = lw->weight, .bias = lw->bias});
    } else if (way == UNFUSED) {
        df_tensor *h = df_linear(ctx, x, &(df_linear_weights){.weight = lw->lora_down});
        y = df_add(ctx,
                   df_linear(ctx, x, &(df_linear_weights){.weight = lw->weight, .bias = lw->bias}),
                   df_linear(ctx, h, &(df_linear_weights){.weight = lw->lora_up}));
    } else {
        y = df_linear(ctx, x, lw);
    }
    df_status s = y ? df_sync(ctx) : df_ctx_status(ctx);
    double t = bench_now() - t0;
    *cpu = bench_cpu_now() - c0;
    df_scope_end(ctx, mark, NULL);
    if (s != DF_OK) {
        fprintf(stderr, "lora: %s: %s\n", way_name[way], df_error_message());
        return -1;
    }
    return t;
}

static int lora_config(const bench_opts *o, df_dtype compute, int threads, const char *mode,
                       int reps)
{
    int64_t M = o->quick ? 512 : 4096, K = 3072, N = 3072;
    static const int64_t ranks[] = {16, 64};
    df_ctx *ctx;
    df_ctx_opts opts = {.device = bench_device_name,
                        .threads = threads,
                        .compute = compute,
                        .mode = strcmp(mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER};
    if (df_ctx_create(&opts, &ctx) != DF_OK) {
        fprintf(stderr, "lora: %s: %s\n", df_dtype_name(compute), df_error_message());
        return 1;
    }
    int failures = 0;
    df_tensor *w = df_tensor_persist(random_tensor(ctx, DF_DTYPE_BF16, DF_SHAPE(N, K), 0.02f, 1));
    df_tensor *b = df_tensor_persist(random_tensor(ctx, DF_DTYPE_F32, DF_SHAPE(N), 0.1f, 2));
    df_tensor *x = random_tensor(ctx, DF_DTYPE_F32, DF_SHAPE(M, K), 1.0f, 3);
    for (size_t ri = 0; ri < sizeof ranks / sizeof ranks[0] && !failures; ri++) {
        int64_t R = ranks[ri];
        df_scope mark = df_scope_begin(ctx);
        df_linear_weights lw = {
            .weight = w,
            .bias = b,
            .lora_down = random_tensor(ctx, DF_DTYPE_F32, DF_SHAPE(R, K), 0.02f, 4),
            .lora_up = random_tensor(ctx, DF_DTYPE_F32, DF_SHAPE(N, R), 0.02f, 5)};
        if (!w || !b || !x || !lw.lora_down || !lw.lora_up) {
            fprintf(stderr, "lora: %s\n", df_error_message());
            failures++;
        }
        double best[N_WAYS] = {0}, cpu[N_WAYS] = {0}, c;
        for (int k = 0; k < N_WAYS && !failures; k++)
            failures += time_way(ctx, x, &lw, k, &c) < 0; /* packs and quantizes; plans */
        for (int r = 0; r < reps && !failures; r++)
            for (int k = 0; k < N_WAYS && !failures; k++) {
                double t = time_way(ctx, x, &lw, k, &c);
                failures += t < 0;
                if (r == 0 || t < best[k])
                    best[k] = t;
                if (r == 0 || c < cpu[k])
                    cpu[k] = c;
            }
        df_scope_end(ctx, mark, NULL);
        if (failures)
            break;
        double flop = 2.0 * (double)M * (double)N * (double)K;
        double lora_flop = 2.0 * (double)M * (double)R * (double)(K + N);
        for (int k = 0; k < N_WAYS; k++) {
            char shape[80], extra[320];
            snprintf(shape, sizeof shape, "M=%lld K=%lld N=%lld R=%lld", (long long)M, (long long)K,
                     (long long)N, (long long)R);
            snprintf(extra, sizeof extra,
                     ",\"way\":\"%s\",\"rank\":%lld,\"over_plain\":%.3f,"
                     "\"fused_over_unfused\":%.3f,\"cpu_ms\":%.1f,\"cpu_over_plain\":%.3f,"
                     "\"cpu_fused_over_unfused\":%.3f",
                     way_name[k], (long long)R, best[k] / best[PLAIN], best[FUSED] / best[UNFUSED],
                     cpu[k] * 1e3, cpu[k] / cpu[PLAIN], cpu[FUSED] / cpu[UNFUSED]);
            double f = k == PLAIN ? flop : flop + lora_flop;
            char way_mode[48];
            snprintf(way_mode, sizeof way_mode, "%s/%s", mode, way_name[k]);
            bench_report(o, "lora", shape, threads, df_dtype_name(compute), way_mode, best[k] * 1e3,
                         1e-9 * f / best[k], 0, 0, extra);
        }
        if (!o->json)
            printf("# rank %lld, %s, %s: fused / unfused = %.3f wall, %.3f CPU; over the "
                   "plain linear: unfused %.3f / %.3f, fused %.3f / %.3f\n",
                   (long long)R, df_dtype_name(compute), mode, best[FUSED] / best[UNFUSED],
                   cpu[FUSED] / cpu[UNFUSED], best[UNFUSED] / best[PLAIN],
                   cpu[UNFUSED] / cpu[PLAIN], best[FUSED] / best[PLAIN], cpu[FUSED] / cpu[PLAIN]);
    }
    df_tensor_free(w);
    df_tensor_free(b);
    df_ctx_free(ctx);
    return failures;
}

int bench_lora(const bench_opts *o)
{
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    const char *mode = o->mode ? o->mode : "eager";
    if (strcmp(mode, "eager") != 0 && strcmp(mode, "fuse") != 0) {
        fprintf(stderr, "lora: --mode eager or fuse\n");
        return 2;
    }
    int reps = o->quick ? 2 : 6;
    for (int i = 0; i < o->argc; i++)
        if (strcmp(o->argv[i], "--reps") == 0 && i + 1 < o->argc && atoi(o->argv[i + 1]) > 0)
            reps = atoi(o->argv[++i]);
    int failures = 0;
    for (int di = 0; di < 3; di++) {
        /* f32 and int8 unless --dtype names one (bf16 only when named) */
        bool wanted = o->dtype ? bench_dtype_wanted(o, dtypes[di]) : dtypes[di] != DF_DTYPE_BF16;
        if (wanted)
            failures += lora_config(o, dtypes[di], o->threads, mode, reps);
    }
    return failures ? 1 : 0;
}
