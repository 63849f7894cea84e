/*
 * Workloads "ceiling" and "gemm", and the GEMM ceiling the other workloads compare with.
 *
 * ceiling: the provider's own rate (df_cpu_gemm_rate: inputs already in the dtype, weights
 * prepacked, no bias) on large square-ish products, best of a few shapes, per dtype (f32,
 * bf16, and i8: oneDNN's u8 x s8 -> s32) and thread count. The best is remembered, so every workload in one run compares against
 * the same number.
 *
 * gemm: our df_linear with its bias through the public op API at FLUX's shapes, x [M, K]
 * f32 with M = 1536, 3072, 4608 tokens and weights [N, K] in bf16 (as FLUX checkpoints
 * store them) with (K, N) = (3072, 3072), (3072, 12288), (12288, 3072), in f32, bf16 and
 * int8 compute, against the ceiling of the compute dtype measured in the same run (int8:
 * oneDNN's u8 x s8 -> s32 product, without quantization or scales), and (int8 only) against
 * the f32 rate of the same shape measured in the same run (f32_ratio). Each
 * weight is used once untimed first (that call packs it); then each shape is timed as the
 * best of a few calls, each ending in df_sync. GFLOP/s count 2 M N K.
 *
 * The machine may be shared, so each row also carries rates from CPU time (cpu_gflops =
 * flop * threads / CPU seconds, and cpu_ratio against the ceiling's own CPU-time rate),
 * which contention from other processes distorts much less than wall time.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

typedef struct gemm_shape {
    int64_t m, n, k;
} gemm_shape;

static const gemm_shape ceiling_shapes[] = {
    {2048, 2048, 2048}, {3072, 3072, 3072}, {4608, 3072, 3072}};
static const gemm_shape ceiling_quick[] = {{1024, 1024, 1024}, {1536, 3072, 3072}};

typedef struct ceiling_memo {
    df_dtype dtype;
    int threads;
    bool quick;
    double gflops, cpu_gflops;
    gemm_shape best;
} ceiling_memo;

static ceiling_memo memo[16];
static int n_memo;

static const ceiling_memo *measure_ceiling(df_dtype dtype, int threads)
{
    for (int i = 0; i < n_memo; i++)
        if (memo[i].dtype == dtype && memo[i].threads == threads && memo[i].quick == bench_quick)
            return &memo[i];
    ceiling_memo m = {.dtype = dtype, .threads = threads, .quick = bench_quick};
    const gemm_shape *shapes = bench_quick ? ceiling_quick : ceiling_shapes;
    int n = bench_quick ? 2 : 3, reps = bench_quick ? 1 : 2;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nthr = threads > 0 ? threads : cores > 0 ? (int)cores : 1;
    for (int i = 0; i < n; i++) {
        double g = 0, c0 = bench_cpu_now();
        df_status s =
            df_cpu_gemm_rate(dtype, threads, shapes[i].m, shapes[i].n, shapes[i].k, reps, &g);
        double cpu = bench_cpu_now() - c0;
        if (s != DF_OK) {
            fprintf(stderr, "ceiling: %s\n", df_error_message());
            continue;
        }
        /* the warm-up run counts too: CPU time is only known for all runs together */
        double flop = 2.0 * (double)shapes[i].m * (double)shapes[i].n * (double)shapes[i].k;
        double cg = cpu > 0 ? 1e-9 * flop * (reps + 1) * nthr / cpu : 0;
        if (cg > m.cpu_gflops)
            m.cpu_gflops = cg;
        if (g > m.gflops) {
            m.gflops = g;
            m.best = shapes[i];
        }
    }
    if (n_memo == (int)(sizeof memo / sizeof memo[0]))
        n_memo = 0; /* never in practice: a run asks for a handful */
    memo[n_memo] = m;
    return &memo[n_memo++];
}

double bench_ceiling_gflops(df_dtype dtype, int threads)
{
    return measure_ceiling(dtype, threads)->gflops;
}

double bench_ceiling_cpu_gflops(df_dtype dtype, int threads)
{
    return measure_ceiling(dtype, threads)->cpu_gflops;
}

/* The thread counts a workload runs: --threads, else 1 and 2. */
static int thread_list(const bench_opts *o, int *out)
{
    if (o->threads > 0) {
        out[0] = o->threads;
        return 1;
    }
    out[0] = 1;
    out[1] = 2;
    return 2;
}

bool bench_dtype_wanted(const bench_opts *o, df_dtype t)
{
    if (o->dtype && t == DF_DTYPE_I8 && strcmp(o->dtype, "int8") == 0)
        return true;
    return !o->dtype || strcmp(o->dtype, df_dtype_name(t)) == 0;
}

int bench_ceiling(const bench_opts *o)
{
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    int threads[2], nt = thread_list(o, threads);
    if (!o->json)
        printf("# fast bf16 on this CPU (AMX-BF16 or AVX512-BF16): %s\n",
               df_cpu_has_fast_bf16() ? "yes" : "no");
    for (int di = 0; di < 3; di++) {
        if (!bench_dtype_wanted(o, dtypes[di]))
            continue;
        for (int ti = 0; ti < nt; ti++) {
            const ceiling_memo *m = measure_ceiling(dtypes[di], threads[ti]);
            if (m->gflops <= 0)
                return 1;
            char shape[64], extra[96];
            snprintf(shape, sizeof shape, "M=%lld N=%lld K=%lld", (long long)m->best.m,
                     (long long)m->best.n, (long long)m->best.k);
            snprintf(extra, sizeof extra, ",\"cpu_gflops\":%.1f,\"fast_bf16\":%s", m->cpu_gflops,
                     df_cpu_has_fast_bf16() ? "true" : "false");
            double ms =
                2e-6 * (double)m->best.m * (double)m->best.n * (double)m->best.k / m->gflops;
            bench_report(o, "ceiling", shape, threads[ti], df_dtype_name(dtypes[di]), "-", ms,
                         m->gflops, m->gflops, 0, extra);
        }
    }
    return 0;
}

/* A persistent tensor of random values in `dtype` (weights, so that they are packed once). */
static df_tensor *random_weight(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                                uint64_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *f = malloc((size_t)n * sizeof *f);
    if (!f)
        return NULL;
    bench_fill_random(f, n, seed);
    df_tensor *t;
    if (dtype == DF_DTYPE_BF16) {
        uint16_t *h = malloc((size_t)n * sizeof *h);
        if (!h) {
            free(f);
            return NULL;
        }
        for (int64_t i = 0; i < n; i++)
            h[i] = df_f32_to_bf16(f[i] * 0.05f);
        t = df_tensor_from_host(ctx, dtype, shape, ndim, h);
        free(h);
    } else {
        t = df_tensor_from_host(ctx, dtype, shape, ndim, f);
    }
    free(f);
    return df_tensor_persist(t);
}

/* Seconds of the best of `reps` linear calls (each synchronised), or < 0 on failure;
 * *cpu gets the least CPU time of one call. */
static double time_linear(df_ctx *ctx, df_tensor *x, const df_linear_weights *w, int reps,
                          double *cpu)
{
    double best = -1;
    for (int r = 0; r < reps; r++) {
        df_scope mark = df_scope_begin(ctx);
        double t0 = bench_now(), c0 = bench_cpu_now();
        df_tensor *y = df_linear(ctx, x, w);
        df_status s = y ? df_sync(ctx) : df_ctx_status(ctx);
        double t = bench_now() - t0, c = bench_cpu_now() - c0;
        if (r == 0 || c < *cpu)
            *cpu = c;
        df_scope_end(ctx, mark, NULL);
        if (s != DF_OK) {
            fprintf(stderr, "gemm: %s\n", df_error_message());
            return -1;
        }
        if (best < 0 || t < best)
            best = t;
    }
    return best;
}

/* f32 rates measured in this run, by shape and thread count, for int8's f32_ratio. */
typedef struct f32_rate {
    int64_t m, n, k;
    int threads;
    double gflops, cpu_gflops;
} f32_rate;
static f32_rate f32_rates[32];
static int n_f32_rates;

static const f32_rate *find_f32_rate(int64_t m, int64_t n, int64_t k, int threads)
{
    for (int i = 0; i < n_f32_rates; i++)
        if (f32_rates[i].m == m && f32_rates[i].n == n && f32_rates[i].k == k &&
            f32_rates[i].threads == threads)
            return &f32_rates[i];
    return NULL;
}

static int gemm_config(const bench_opts *o, df_dtype compute, int threads, const char *mode)
{
    static const int64_t ms_full[] = {1536, 3072, 4608}, ms_quick[] = {1536};
    static const int64_t kn_full[][2] = {{3072, 3072}, {3072, 12288}, {12288, 3072}};
    const int64_t *ms = o->quick ? ms_quick : ms_full;
    int n_m = o->quick ? 1 : 3, n_kn = o->quick ? 1 : 3, reps = o->quick ? 1 : 2;
    double ceiling = bench_ceiling_gflops(compute, threads);
    double ceiling_cpu = bench_ceiling_cpu_gflops(compute, threads);

    df_ctx *ctx;
    df_ctx_opts opts = {.threads = threads,
                        .compute = compute,
                        .mode = strcmp(mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER};
    if (df_ctx_create(&opts, &ctx) != DF_OK) {
        fprintf(stderr, "gemm: mode %s: %s\n", mode, df_error_message());
        return strcmp(mode, "fuse") == 0 ? 0 : 1; /* a mode not built yet is skipped */
    }
    int failures = 0;
    for (int kn = 0; kn < n_kn && !failures; kn++) {
        int64_t K = kn_full[kn][0], N = kn_full[kn][1];
        df_linear_weights w = {random_weight(ctx, DF_DTYPE_BF16, DF_SHAPE(N, K), 1 + kn),
                               random_weight(ctx, DF_DTYPE_F32, DF_SHAPE(N), 7 + kn)};
        for (int mi = 0; mi < n_m && w.weight && w.bias; mi++) {
            int64_t M = ms[mi];
            df_scope mark = df_scope_begin(ctx);
            float *xf = malloc((size_t)(M * K) * sizeof *xf);
            df_tensor *x = NULL;
            if (xf) {
                bench_fill_random(xf, M * K, 100 + (uint64_t)mi);
                x = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(M, K), xf);
                free(xf);
            }
            double cpu = 0;
            if (mi == 0 && x)
                time_linear(ctx, x, &w, 1, &cpu); /* packs the weight */
            df_stats_reset(ctx);
            double sec = x ? time_linear(ctx, x, &w, reps, &cpu) : -1;
            if (sec <= 0) {
                failures++;
                df_scope_end(ctx, mark, NULL);
                break;
            }
            df_stats st;
            df_ctx_stats(ctx, &st);
            double flop = 2.0 * (double)M * (double)N * (double)K;
            double gflops = 1e-9 * flop / sec, cpu_gflops = 1e-9 * flop * threads / cpu;
            char shape[64], extra[320];
            snprintf(shape, sizeof shape, "M=%lld K=%lld N=%lld", (long long)M, (long long)K,
                     (long long)N);
            snprintf(extra, sizeof extra,
                     ",\"ratio\":%.3f,\"cpu_gflops\":%.1f,\"cpu_ratio\":%.3f,"
                     "\"weight\":\"bf16\",\"bias\":true",
                     ceiling > 0 ? gflops / ceiling : 0.0, cpu_gflops,
                     ceiling_cpu > 0 ? cpu_gflops / ceiling_cpu : 0.0);
            const f32_rate *f = find_f32_rate(M, N, K, threads);
            if (compute == DF_DTYPE_F32 && !f && n_f32_rates < 32)
                f32_rates[n_f32_rates++] = (f32_rate){M, N, K, threads, gflops, cpu_gflops};
            if (compute == DF_DTYPE_I8 && f) {
                size_t len = strlen(extra);
                snprintf(extra + len, sizeof extra - len,
                         ",\"f32_ratio\":%.2f,\"f32_cpu_ratio\":%.2f,\"kernel\":\"%s\"",
                         gflops / f->gflops, cpu_gflops / f->cpu_gflops, df_cpu_int8_kernel());
            }
            bench_report(o, "gemm", shape, threads, df_dtype_name(compute), mode, sec * 1e3, gflops,
                         ceiling, st.peak_bytes, extra);
            df_scope_end(ctx, mark, NULL);
        }
        if (!w.weight || !w.bias)
            failures++;
        df_tensor_free(w.weight);
        df_tensor_free(w.bias);
    }
    df_ctx_free(ctx);
    return failures;
}

int bench_gemm(const bench_opts *o)
{
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    int threads[2], nt = thread_list(o, threads);
    const char *mode = o->mode ? o->mode : "eager";
    int failures = 0;
    for (int di = 0; di < 3; di++) {
        if (!bench_dtype_wanted(o, dtypes[di]))
            continue;
        for (int ti = 0; ti < nt; ti++)
            failures += gemm_config(o, dtypes[di], threads[ti], mode);
    }
    return failures ? 1 : 0;
}
