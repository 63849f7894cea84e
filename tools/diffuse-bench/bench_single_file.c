/*
 * Workload "single-file": loading a FLUX.1 transformer from one file (df_flux_load_file)
 * or a diffusers folder, and its step time.
 *
 *     diffuse-bench single-file CONFIG_DIR [FILE] [--tokens IMG TXT] [--runs N]
 *
 * CONFIG_DIR is the transformer folder (config.json, and the weights when FILE is absent).
 * Prints the load time, the process's resident memory after loading (VmRSS, and its rise
 * over the load), the bytes the model holds and its resident weight bytes (df_stats), then
 * one warm-up forward and the best of N - 1 timed forwards (N = --runs, default 3; with
 * --runs 1 the one forward is timed, warm-up included) at IMG image + TXT text tokens
 * (default 256 + 512, a 256x256 image), the first forward's time against that step's (what
 * the first step pays for reading, and for int8 packing, the weights), and the peak
 * resident memory of the process (VmHWM). One file per process, so that peaks do
 * not mix: tools/refgen/flux_bench_files.py writes the files for docs/io.md's table.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* A field of /proc/self/status in bytes ("VmRSS:", "VmHWM:"); 0 when unknown. */
static int64_t proc_status_bytes(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    int64_t kb = 0;
    size_t n = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, n) == 0)
            kb = strtoll(line + n, NULL, 10);
    if (f)
        fclose(f);
    return kb * 1024;
}

static df_tensor *filled(df_ctx *ctx, int64_t a, int64_t b, int64_t c, int ndim, uint64_t seed)
{
    int64_t shape[3] = {a, b, c}, n = a * (ndim > 1 ? b : 1) * (ndim > 2 ? c : 1);
    float *p = malloc((size_t)n * sizeof *p);
    if (!p)
        return NULL;
    bench_fill_random(p, n, seed);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, ndim, p);
    free(p);
    return t;
}

/* Position ids [S, 3]: rows [0, y, x] over a square grid for the image, zeros for text. */
static df_tensor *ids(df_ctx *ctx, int64_t s, bool image)
{
    float *p = calloc((size_t)s * 3, sizeof *p);
    int64_t side = 1;
    while (side * side < s)
        side++;
    for (int64_t i = 0; image && i < s; i++) {
        p[i * 3 + 1] = (float)(i / side);
        p[i * 3 + 2] = (float)(i % side);
    }
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, (int64_t[]){s, 3}, 2, p);
    free(p);
    return t;
}

int bench_single_file(const bench_opts *o)
{
    const char *dir = NULL, *file = NULL;
    int64_t s_img = 256, s_txt = 512;
    int runs = 3;
    for (int i = 0; i < o->argc; i++) {
        if (strcmp(o->argv[i], "--runs") == 0 && i + 1 < o->argc) {
            runs = atoi(o->argv[++i]);
            runs = runs < 1 ? 1 : runs;
        } else if (strcmp(o->argv[i], "--tokens") == 0 && i + 2 < o->argc) {
            s_img = atoll(o->argv[++i]);
            s_txt = atoll(o->argv[++i]);
        } else if (!dir) {
            dir = o->argv[i];
        } else {
            file = o->argv[i];
        }
    }
    if (!dir) {
        fprintf(stderr, "single-file: usage: CONFIG_DIR [FILE] [--tokens IMG TXT] [--runs N]\n");
        return 2;
    }
    df_dtype dtype = DF_DTYPE_BF16;
    if (o->dtype && !df_dtype_parse(o->dtype, &dtype)) {
        fprintf(stderr, "single-file: unknown --dtype %s\n", o->dtype);
        return 2;
    }
    int threads = o->threads ? o->threads : 2;
    df_ctx *ctx;
    if (df_ctx_create(&(df_ctx_opts){.threads = threads, .compute = dtype,
                                     .device = bench_device_name},
                      &ctx) != DF_OK) {
        fprintf(stderr, "single-file: %s\n", df_error_message());
        return 1;
    }
    int64_t rss0 = proc_status_bytes("VmRSS:");
    double t0 = bench_now();
    df_flux *m = NULL;
    df_status s = file ? df_flux_load_file(ctx, dir, file, &m) : df_flux_load(ctx, dir, &m);
    double load_s = bench_now() - t0;
    if (s != DF_OK) {
        fprintf(stderr, "single-file: %s\n", df_error_message());
        df_ctx_free(ctx);
        return 1;
    }
    int64_t rss1 = proc_status_bytes("VmRSS:");
    df_stats stats;
    df_ctx_stats(ctx, &stats);
    const df_flux_cfg *c = df_flux_config(m);
    df_flux_inputs in = {
        .hidden_states = filled(ctx, 1, s_img, c->in_channels, 3, 1),
        .encoder_hidden_states = filled(ctx, 1, s_txt, c->joint_attention_dim, 3, 2),
        .pooled_projections = filled(ctx, 1, c->pooled_projection_dim, 1, 2, 3),
        .timestep = df_full(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1, 0.5),
        .img_ids = ids(ctx, s_img, true),
        .txt_ids = ids(ctx, s_txt, false),
        .guidance = c->guidance_embeds ? df_full(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1, 3.5)
                                       : NULL,
    };
    double best = 0, first = 0, best_cpu = 0, first_cpu = 0; /* wall and process CPU s */
    int bad = 0;
    for (int r = 0; r < runs && !bad; r++) { /* run 0 warms up (packs weights, faults pages) */
        df_scope mark = df_scope_begin(ctx);
        double t = bench_now(), cpu = bench_cpu_now();
        df_tensor *out = df_flux_forward(ctx, m, &in);
        bad = !out || df_sync(ctx) != DF_OK;
        t = bench_now() - t;
        cpu = bench_cpu_now() - cpu;
        df_scope_end(ctx, mark, NULL);
        if (r == 0) {
            first = t;
            first_cpu = cpu;
        }
        if (runs == 1 || r == 1 || (r > 1 && t < best))
            best = t;
        if (runs == 1 || r == 1 || (r > 1 && cpu < best_cpu))
            best_cpu = cpu;
    }
    if (bad)
        fprintf(stderr, "single-file: forward: %s\n", df_error_message());
    df_stats after;
    df_ctx_stats(ctx, &after);
    char shape[128], extra[400];
    snprintf(shape, sizeof shape, "%" PRId64 "+%" PRId64 " %s", s_img, s_txt,
             file ? file : "folder");
    snprintf(extra, sizeof extra,
             ",\"load_s\":%.3f,\"rss_after_load\":%" PRId64 ",\"load_rss_rise\":%" PRId64
             ",\"model_bytes\":%" PRId64 ",\"resident_weight_bytes\":%" PRId64
             ",\"peak_bytes\":%" PRId64 ",\"peak_rss\":%" PRId64 ",\"first_s\":%.3f,\"step_cpu_s\":%.3f,\"first_cpu_s\":%.3f",
             load_s, rss1, rss1 - rss0, df_flux_weight_bytes(m), stats.resident_weight_bytes,
             after.peak_bytes, proc_status_bytes("VmHWM:"), first, best_cpu, first_cpu);
    if (!o->json)
        printf("load %.3f s, RSS after load %.1f MiB (+%.1f MiB), model %.1f MiB, resident "
               "weights %.1f MiB, step %.3f s, first step %.3f s (%.2fx; CPU time %.3f s and "
               "%.3f s, %.2fx), peak tensors %.1f MiB, peak RSS %.1f MiB\n",
               load_s, rss1 / 1048576.0, (rss1 - rss0) / 1048576.0,
               df_flux_weight_bytes(m) / 1048576.0, stats.resident_weight_bytes / 1048576.0, best,
               first, best > 0 ? first / best : 0.0, best_cpu, first_cpu,
               best_cpu > 0 ? first_cpu / best_cpu : 0.0, after.peak_bytes / 1048576.0, proc_status_bytes("VmHWM:") / 1048576.0);
    bench_report(o, "single-file", shape, threads, df_dtype_name(dtype), "eager", best * 1e3, 0,
                 0, 0, extra);
    df_flux_free(m);
    df_ctx_free(ctx);
    return bad;
}
