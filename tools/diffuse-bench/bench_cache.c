/*
 * Workload "cache": step caches (docs/step-cache.md) against the uncached run of the same
 * pipeline, in one process: time per denoising step, its ratio to the uncached one, the
 * trace of computed / skipped / predicted steps, and the image's PSNR against the uncached
 * image.
 *
 *   diffuse-bench cache DIR [--steps N] [--size PIXELS] [--guidance X] [--cache SPEC]...
 *
 * DIR is a FluxPipeline or Flux2KleinPipeline folder (`diffuse make-tiny --arch flux
 * --heads 8 --head-dim 128 --double 4 --single 8 DIR` gives a reduced-width FLUX.1-shaped
 * one). Defaults: 28 steps at 512x512, and the caches first-block:threshold=0.05,
 * first-block:threshold=0.2 and taylorseer (diffusers' defaults). A step's time is taken
 * from the progress callback between the first step's end and the last's (so the first
 * step, which packs weights, is left out of every run alike), on the wall clock and in CPU
 * seconds (steadier on a shared machine); the ratio is the CPU one, against the mean of an
 * uncached run before the caches and one after them.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define MAX_CACHES 8

typedef struct timing {
    double wall0, cpu0, wall1, cpu1;
    int first, last;
} timing;

static void on_step(int step, int steps, double elapsed, void *user)
{
    (void)steps, (void)elapsed;
    timing *t = user;
    double w = bench_now(), c = bench_cpu_now();
    if (step == 1)
        t->wall0 = w, t->cpu0 = c, t->first = step;
    t->wall1 = w, t->cpu1 = c, t->last = step;
}

typedef struct result {
    double wall_step, cpu_step; /* seconds per step */
    char trace[1001];
    float *image;
    int64_t n;
} result;

static int run_once(df_pipeline *p, const df_gen_params *base, const char *spec, result *r)
{
    df_cache_config cfg;
    if (spec && df_cache_config_parse(spec, &cfg) != DF_OK) {
        fprintf(stderr, "diffuse-bench cache: %s\n", df_error_message());
        return 2;
    }
    timing t = {0};
    df_gen_params g = *base;
    g.cache = spec ? &cfg : NULL;
    g.progress = on_step;
    g.progress_user = &t;
    df_gen_output out;
    if (df_pipeline_run(p, &g, &out) != DF_OK) {
        fprintf(stderr, "diffuse-bench cache: %s: %s\n", spec ? spec : "uncached",
                df_error_message());
        return 1;
    }
    int n_steps = t.last - t.first;
    r->wall_step = n_steps > 0 ? (t.wall1 - t.wall0) / n_steps : NAN;
    r->cpu_step = n_steps > 0 ? (t.cpu1 - t.cpu0) / n_steps : NAN;
    snprintf(r->trace, sizeof r->trace, "%s", out.cache_trace);
    r->n = (int64_t)out.count * out.height * out.width * 3;
    r->image = malloc((size_t)r->n * sizeof *r->image);
    if (r->image)
        memcpy(r->image, out.image_f32, (size_t)r->n * sizeof *r->image);
    df_gen_output_free(&out);
    return r->image ? 0 : 1;
}

static double psnr(const float *a, const float *b, int64_t n)
{
    double se = 0;
    for (int64_t i = 0; i < n; i++)
        se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return se == 0 ? INFINITY : 10 * log10(1.0 / (se / (double)n));
}

static int count(const char *trace, char c)
{
    int n = 0;
    for (; *trace; trace++)
        n += *trace == c;
    return n;
}

int bench_cache(const bench_opts *o)
{
    const char *dir = NULL, *specs[MAX_CACHES];
    int n_specs = 0, steps = 28, size = 512;
    double guidance = 3.5;
    for (int i = 0; i < o->argc; i++) {
        const char *a = o->argv[i], *v = i + 1 < o->argc ? o->argv[i + 1] : NULL;
        if (strcmp(a, "--steps") == 0 && v)
            steps = atoi(v), i++;
        else if (strcmp(a, "--size") == 0 && v)
            size = atoi(v), i++;
        else if (strcmp(a, "--guidance") == 0 && v)
            guidance = atof(v), i++;
        else if (strcmp(a, "--cache") == 0 && v && n_specs < MAX_CACHES)
            specs[n_specs++] = v, i++;
        else if (a[0] != '-' && !dir)
            dir = a;
        else {
            fprintf(stderr, "diffuse-bench cache: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "diffuse-bench cache: need a pipeline folder (see diffuse-bench --help)\n");
        return 2;
    }
    if (n_specs == 0) {
        specs[n_specs++] = "first-block:threshold=0.05";
        specs[n_specs++] = "first-block:threshold=0.2";
        specs[n_specs++] = "taylorseer";
    }
    if (o->quick)
        steps = steps > 6 ? 6 : steps, size = 64;
    int threads = o->threads ? o->threads : 2;
    df_dtype dtype = o->dtype && strcmp(o->dtype, "bf16") == 0   ? DF_DTYPE_BF16
                     : o->dtype && strcmp(o->dtype, "int8") == 0 ? DF_DTYPE_I8
                                                                 : DF_DTYPE_F32;
    const char *mode = o->mode ? o->mode : "eager";
    df_load_opts lo = {.device = o->device,
                       .threads = threads,
                       .dtype = dtype,
                       .mode = strcmp(mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER,
                       .compile_blocks = strcmp(mode, "blocks") == 0};
    df_pipeline *p;
    if (df_pipeline_load(dir, &lo, &p) != DF_OK) {
        fprintf(stderr, "diffuse-bench cache: %s\n", df_error_message());
        return 1;
    }
    df_gen_params g = {.prompt = "a photo of a red fox in the snow",
                       .height = size,
                       .width = size,
                       .steps = steps,
                       .guidance = (float)guidance,
                       .guidance_set = true,
                       .seed = 0};
    char shape[96];
    snprintf(shape, sizeof shape, "%s %dx%d %d steps", df_pipeline_class(p), size, size, steps);
    /* The uncached run goes first and last: on a shared machine the load drifts, and the
     * speed-ups are against the mean of the two. */
    result base = {0}, again = {0}, r[MAX_CACHES] = {{0}};
    int rc = run_once(p, &g, NULL, &base);
    for (int k = 0; k < n_specs && rc == 0; k++)
        rc = run_once(p, &g, specs[k], &r[k]);
    if (rc == 0)
        rc = run_once(p, &g, NULL, &again);
    double ref = 0.5 * (base.cpu_step + again.cpu_step);
    if (rc == 0 && !o->json) {
        printf("%-44s %-6s %9s %9s %7s %8s  %s\n", "cache", "mode", "s/step", "cpu s/st", "speedup",
               "PSNR dB", "trace (C computed, S skipped, P predicted)");
        printf("%-44s %-6s %9.3f %9.3f %7.2f %8s\n", "none (first)", mode, base.wall_step,
               base.cpu_step, ref / base.cpu_step, "-");
        printf("%-44s %-6s %9.3f %9.3f %7.2f %8s\n", "none (last)", mode, again.wall_step,
               again.cpu_step, ref / again.cpu_step, "-");
    }
    for (int k = 0; k < n_specs && rc == 0; k++) {
        double speedup = ref / r[k].cpu_step, db = psnr(r[k].image, base.image, r[k].n);
        if (o->json) {
            char extra[17000];
            snprintf(extra, sizeof extra,
                     ",\"cache\":\"%s\",\"trace\":\"%s\",\"computed\":%d,\"skipped\":%d,"
                     "\"predicted\":%d,\"cpu_s_per_step\":%.4f,\"uncached_cpu_s_per_step\":%.4f,"
                     "\"speedup\":%.3f,\"psnr_db\":%.2f",
                     specs[k], r[k].trace, count(r[k].trace, 'C'), count(r[k].trace, 'S'),
                     count(r[k].trace, 'P'), r[k].cpu_step, ref, speedup, db);
            bench_report(o, "cache", shape, threads, df_dtype_name(dtype), mode,
                         r[k].wall_step * 1e3, 0, 0, 0, extra);
        } else {
            printf("%-44s %-6s %9.3f %9.3f %7.2f %8.2f  %s\n", specs[k], mode, r[k].wall_step,
                   r[k].cpu_step, speedup, db, r[k].trace);
        }
    }
    for (int k = 0; k < n_specs; k++)
        free(r[k].image);
    free(again.image);
    if (rc == 0 && !o->json)
        printf("(%s, %d threads, %s; speed-up = uncached CPU s/step (mean of first and last "
               "run) / cached, steps 2..%d)\n",
               shape, threads, df_dtype_name(dtype), steps);
    free(base.image);
    df_pipeline_free(p);
    return rc;
}
