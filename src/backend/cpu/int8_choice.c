/*
 * Which path runs a whole-k int8 product on this CPU: the project's kernel or oneDNN's
 * u8 x s8 matmul (gemm_int8.h). Weights with groups have no choice (oneDNN scales per output
 * channel only), so this applies where the group is the whole k.
 *
 * Feature flags do not decide it: on the AVX512-VNNI Xeon the two were within a few percent
 * of each other, one ahead at one shape and behind at another. So the first whole-k product
 * of a shape class (k, n) on a thread count times both on that weight (PROBE_M rows of
 * activations, best of PROBE_REPS after a warm-up, the two taking turns so that a slow
 * spell of a shared machine falls on both) and keeps the faster one. A verdict timed once
 * per process moved with the machine's load, and the two paths differ in the last bits, so
 * two runs of one model gave different outputs: the verdict is kept on disk instead, like
 * the f32 / bf16 rates (cpu_cache.h: the CPU model, oneDNN's ISA and version, the threads,
 * and here the shape class in the key), and every later process reads it back. A file that
 * cannot be read back exactly (damaged, another key, an unknown verdict) is measured over
 * and replaced.
 *
 * DIFFUSE_INT8_GEMM=own|onednn|auto overrides (auto, the default, is the above); any other
 * value is an error naming the variable. DIFFUSE_INT8_PATH, df_i8_force_path and a device's
 * int8_path force one kernel for every product and come first.
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_cache.h"
#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/gemm_int8_impl.h"
#include "core/alloc.h"
#include "core/status.h"

#define CHOICE_MAGIC "diffuse int8 choice 1"
#define PROBE_M      512 /* rows of the probe's activations: a FLUX text or image chunk */
#define PROBE_REPS   3
#define MEMO_MAX     64

typedef struct verdict {
    int64_t k, n;
    int threads;
    df_i8_path path;
} verdict;

/* Verdicts already taken in this process, so that each class reads its file once. */
static verdict memo[MEMO_MAX];
static int n_memo;
static pthread_mutex_t memo_lock = PTHREAD_MUTEX_INITIALIZER;

/* The threads a product started now runs on (one inside a parallel region). */
static int threads_now(void)
{
    return omp_in_parallel() ? 1 : omp_get_max_threads();
}

static void choice_key(int64_t k, int64_t n, int threads, char *out, size_t cap)
{
    char cpu[512];
    df_cpu_cache_key(threads, cpu, sizeof cpu);
    snprintf(out, cap, "%s|int8 k %lld n %lld whole-k", cpu, (long long)k, (long long)n);
}

void df_i8_choice_file(int64_t k, int64_t n, int threads, char *out, size_t cap)
{
    char key[640];
    choice_key(k, n, threads, key, sizeof key);
    df_cpu_cache_path("int8-choice", key, out, cap);
}

/* The verdict in the file at path, when it holds exactly that for key. */
static bool choice_read(const char *path, const char *key, df_i8_path own, df_i8_path *out)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    char magic[64] = "", line[1024] = "", choice[16] = "", tail[8];
    double own_rate = -1, dnnl_rate = -1;
    bool ok = fgets(magic, sizeof magic, f) && strcmp(magic, CHOICE_MAGIC "\n") == 0 &&
              fgets(line, sizeof line, f) && strncmp(line, "key ", 4) == 0 &&
              strcspn(line + 4, "\n") == strlen(key) && strncmp(line + 4, key, strlen(key)) == 0 &&
              fscanf(f, "own %lf\nonednn %lf\nchoice %15s\n", &own_rate, &dnnl_rate, choice) == 3 &&
              fscanf(f, "%7s", tail) == EOF && isfinite(own_rate) && isfinite(dnnl_rate) &&
              own_rate > 0 && dnnl_rate > 0 &&
              (strcmp(choice, "own") == 0 || strcmp(choice, "onednn") == 0);
    fclose(f);
    if (ok)
        *out = strcmp(choice, "onednn") == 0 ? DF_I8_PATH_ONEDNN : own;
    return ok;
}

/* GOP/s of the two paths on w, PROBE_M rows of pseudo-random activations. The weight keeps
 * the oneDNN form the probe made (freeing it could race with a product another thread runs
 * on it through a forced path). */
static df_status probe(const df_i8_weight *w, df_i8_path own, double *own_rate, double *dnnl_rate)
{
    int64_t m = PROBE_M, n = w->n;
    uint8_t *q = df_aligned_alloc((size_t)(m * w->kp));
    float *scale = df_malloc((size_t)m * sizeof(float));
    float *out = df_aligned_alloc((size_t)(m * n) * sizeof(float));
    if (!q || !scale || !out) {
        df_aligned_free(q), df_free(scale), df_aligned_free(out);
        return df_errorf(DF_E_OOM, "int8: out of memory timing a [%lld, %lld] product",
                         (long long)m, (long long)n);
    }
    uint32_t r = 0x9e3779b9u;
    for (int64_t i = 0; i < m * w->kp; i++) {
        r ^= r << 13, r ^= r >> 17, r ^= r << 5;
        q[i] = (uint8_t)(1 + r % 255);
    }
    for (int64_t i = 0; i < m; i++)
        scale[i] = 1.0f / 127;
    df_i8_act a = {.m = m, .kp = w->kp, .group = w->group, .n_groups = 1, .q = q, .scale = scale};
    df_i8_epilogue e = {.out = out, .ldc = n};
    double best[2] = {INFINITY, INFINITY};
    df_status s = DF_OK;
    /* round 0 warms up: oneDNN makes its plan and its form of the weight there */
    for (int round = 0; round <= PROBE_REPS && s == DF_OK; round++)
        for (int p = 0; p < 2 && s == DF_OK; p++) {
            double t0 = omp_get_wtime();
            s = df_i8_gemm_run(&a, w, &e, p ? DF_I8_PATH_ONEDNN : own);
            double t = omp_get_wtime() - t0;
            if (round > 0 && t < best[p])
                best[p] = t;
        }
    double ops = 2e-9 * (double)m * (double)n * (double)w->kp;
    *own_rate = ops / best[0];
    *dnnl_rate = ops / best[1];
    df_aligned_free(q), df_free(scale), df_aligned_free(out);
    return s;
}

/* The verdict for w's class on `threads`, from the file or measured now; says which. */
static df_status decide(const df_i8_weight *w, df_i8_path own, int threads, df_i8_path *out,
                        char *how, size_t cap)
{
    char key[640], path[4096], text[1024];
    choice_key(w->kp, w->n, threads, key, sizeof key);
    df_cpu_cache_path("int8-choice", key, path, sizeof path);
    if (path[0] && choice_read(path, key, own, out)) {
        snprintf(how, cap, "measured earlier on %d threads, cached in %s", threads, path);
        return DF_OK;
    }
    double own_rate = 0, dnnl_rate = 0;
    DF_TRY(probe(w, own, &own_rate, &dnnl_rate));
    /* another process that measured at the same time and wrote first is followed, so that
     * both take one verdict */
    if (path[0] && choice_read(path, key, own, out)) {
        snprintf(how, cap, "measured by another process meanwhile, cached in %s", path);
        return DF_OK;
    }
    *out = dnnl_rate > own_rate ? DF_I8_PATH_ONEDNN : own;
    snprintf(text, sizeof text, CHOICE_MAGIC "\nkey %s\nown %.1f\nonednn %.1f\nchoice %s\n", key,
             own_rate, dnnl_rate, *out == DF_I8_PATH_ONEDNN ? "onednn" : "own");
    bool kept = path[0] && df_cpu_cache_write(path, text);
    snprintf(how, cap, "measured now on %d threads (%s %.0f, onednn %.0f GOP/s)%s%s", threads,
             df_i8_path_name(own), own_rate, dnnl_rate, kept ? ", cached in " : ", not cached",
             kept ? path : "");
    return DF_OK;
}

df_status df_i8_whole_k_path(const df_i8_weight *w, df_i8_path *out, char *how, size_t cap)
{
    char sink[8];
    if (!how || !cap)
        how = sink, cap = sizeof sink;
    df_i8_path own = df_i8_best_kernel();
    *out = own;
    const char *env = getenv("DIFFUSE_INT8_GEMM");
    if (env && *env && strcmp(env, "auto") != 0) {
        if (strcmp(env, "own") == 0) {
            snprintf(how, cap, "DIFFUSE_INT8_GEMM=own");
            return DF_OK;
        }
        if (strcmp(env, "onednn") != 0)
            return df_errorf(DF_E_ARG, "DIFFUSE_INT8_GEMM='%.32s': expected own, onednn or auto",
                             env);
        if (!df_i8_dnnl_available())
            return df_errorf(DF_E_UNSUPPORTED,
                             "DIFFUSE_INT8_GEMM=onednn: oneDNN's int8 products need VNNI or "
                             "AMX-INT8, which this CPU lacks");
        *out = w->n_groups == 1 ? DF_I8_PATH_ONEDNN : own;
        snprintf(how, cap, "DIFFUSE_INT8_GEMM=onednn%s", w->n_groups == 1 ? "" : " (grouped: own)");
        return DF_OK;
    }
    if (w->n_groups != 1) {
        snprintf(how, cap, "grouped weights: only the project's kernels take them");
        return DF_OK;
    }
    if (!df_i8_dnnl_available()) {
        snprintf(how, cap, "oneDNN has no exact int8 products on this CPU");
        return DF_OK;
    }
    int threads = threads_now();
    df_status s = DF_OK;
    pthread_mutex_lock(&memo_lock);
    int i = 0;
    while (i < n_memo && !(memo[i].k == w->kp && memo[i].n == w->n && memo[i].threads == threads))
        i++;
    if (i < n_memo) {
        *out = memo[i].path;
        snprintf(how, cap, "decided earlier in this process");
    } else {
        s = decide(w, own, threads, out, how, cap);
        if (s == DF_OK) {
            if (n_memo == MEMO_MAX)
                n_memo = 0; /* a model has a handful of classes; start over rather than grow */
            memo[n_memo++] = (verdict){w->kp, w->n, threads, *out};
        }
    }
    pthread_mutex_unlock(&memo_lock);
    return s;
}

void df_i8_choice_forget(void)
{
    pthread_mutex_lock(&memo_lock);
    n_memo = 0;
    pthread_mutex_unlock(&memo_lock);
}
