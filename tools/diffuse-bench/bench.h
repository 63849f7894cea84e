/*
 * diffuse-bench: speed and memory, measured, never asserted.
 *
 * Each workload is a function in its own file (bench_<name>.c) registered in the table in
 * main.c. A workload prints a readable table to stdout and, with --json, one JSON object
 * per measurement per line with at least the keys workload, shape, threads, dtype, mode,
 * ms, gflops, ceiling_gflops, peak_bytes.
 */
#ifndef DIFFUSE_BENCH_H
#define DIFFUSE_BENCH_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <diffuse/diffuse.h>

typedef struct bench_opts {
    bool json;          /* one JSON object per measurement, per line */
    bool quick;         /* smaller shapes / fewer repeats (CI smoke runs) */
    bool profile;       /* per-op-kind time profile */
    int threads;        /* 0 = try 1 and 2 where the workload says so */
    const char *dtype;  /* NULL = both f32 and bf16 */
    const char *mode;   /* NULL = every mode that exists */
    const char *device; /* --device: NULL = the default device */
    int argc;           /* workload-specific arguments after the name */
    char **argv;
} bench_opts;

typedef struct bench_workload {
    const char *name;
    const char *help;
    int (*run)(const bench_opts *o);
} bench_workload;

/* Wall-clock seconds from a monotonic clock. */
double bench_now(void);

/* Prints one measurement: a table row, or a JSON line with --json. `extra` is NULL or a
 * string of further JSON members (",\"key\":value,..."). */
void bench_report(const bench_opts *o, const char *workload, const char *shape, int threads,
                  const char *dtype, const char *mode, double ms, double gflops,
                  double ceiling_gflops, int64_t peak_bytes, const char *extra);

/* CPU seconds used so far by the whole process (all threads). On a shared machine, rates
 * from CPU time (flop * threads / cpu seconds) are steadier than wall-clock ones. */
double bench_cpu_now(void);

/* The best GEMM rate (GFLOP/s) the provider reaches on this machine for `dtype` (f32 or
 * bf16) on `threads` threads (0 = all cores): large square-ish products with inputs
 * already in the dtype and weights prepacked, measured once per process and remembered.
 * Returns 0 when it cannot be measured. */
double bench_ceiling_gflops(df_dtype dtype, int threads);
/* The same ceiling from CPU time: flop * threads / CPU seconds over all its runs. */
double bench_ceiling_cpu_gflops(df_dtype dtype, int threads);

/* --device as given (NULL: the default device), for the workloads that open contexts. */
extern const char *bench_device_name;

/* --quick as given on the command line, for helpers that have no bench_opts (the ceiling
 * then measures smaller products, once each). */
extern bool bench_quick;

/* n uniform values in [-1, 1), reproducible from `seed`. */
void bench_fill_random(float *p, int64_t n, uint64_t seed);

/* One tensor of a random checkpoint: a [rows, cols] matrix, or a vector of `rows` when cols
 * is 0; values uniform in [-scale, scale), or all ones when scale is 0 (norm weights). */
typedef struct bench_weight {
    char name[128];
    int64_t rows, cols;
    float scale;
} bench_weight;

/* Writes the n tensors as one BF16 safetensors file at `path`, streaming (bench_checkpoint.c).
 * Returns 0 on success. */
int bench_write_checkpoint(const char *path, const bench_weight *w, int n);

/* A text encoder to time (bench_encoder.c): `load` opens the model in `dir` (`arg` is the
 * workload's own), `encode` runs it on token ids [1, S] below `vocab` and gives its hidden
 * states [1, S, D], `free` frees it. `workload` names the report rows and the errors. */
typedef struct bench_encoder {
    const char *workload;
    int64_t vocab;
    const void *arg;
    df_status (*load)(df_ctx *ctx, const char *dir, const void *arg, void **out);
    df_status (*encode)(df_ctx *ctx, void *model, df_tensor *ids, df_tensor **out);
    void (*free)(void *model);
} bench_encoder;

/* Loads the encoder in a new context (threads, compute dtype, "eager" or "fuse"), runs it
 * once to warm up, then reports the fastest of 1 (--quick) or 3 runs on s tokens as one row
 * named `shape`, with rates from `gflop` per run. Returns 0 on success. */
int bench_encoder_measure(const bench_opts *o, const bench_encoder *e, const char *dir, int threads,
                          df_dtype dtype, const char *mode, int64_t s, const char *shape,
                          double gflop);

/* A model folder `dir` holding the n tensors as model.safetensors (bench_write_checkpoint)
 * and `config` as config.json. Returns 0 on success. bench_remove_model removes both files
 * and the folder. */
int bench_write_model(const char *dir, const bench_weight *w, int n, const char *config);
void bench_remove_model(const char *dir);

/* A new empty folder "$TMPDIR/diffuse-bench-<workload>-XXXXXX" (/tmp without TMPDIR) in
 * dir[cap]. Returns 0 on success; otherwise says why on stderr and returns 1. */
int bench_temp_dir(const char *workload, char *dir, size_t cap);

/* The compute dtypes a workload is asked for: --dtype names f32, bf16 or int8 (i8). */
bool bench_dtype_wanted(const bench_opts *o, df_dtype t);

/* One FLUX.1 double + single block pair as the "flux" workload times it (bench_flux.c). */
typedef struct bench_flux_pair {
    double ms[2];       /* double block, single block; 0 when not measured */
    double gflop[2];    /* their matrix products (GFLOP per call) */
    int64_t peak_bytes; /* the most the forwards held */
} bench_flux_pair;

/* Times one double and one single block at FLUX.1 width (hidden 128 with --quick) on
 * s_img + s_txt tokens in each of the n compute dtypes, in `mode` ("eager" or "fuse") on
 * `threads` threads: random checkpoints of the embedders alone, of one double block and of
 * one single block, each block's time the fastest forward less the embedders'. out[i] is
 * dtypes[i]'s; its gflop is set even when timing fails. Returns the number of dtypes that
 * failed (each says why on stderr). */
int bench_flux_pairs(const bench_opts *o, int threads, const char *mode, int64_t s_img,
                     int64_t s_txt, const df_dtype *dtypes, int n, bench_flux_pair *out);

/* The workloads (one file each). */
int bench_ceiling(const bench_opts *o);   /* bench_gemm.c */
int bench_gemm(const bench_opts *o);      /* bench_gemm.c */
int bench_attention(const bench_opts *o); /* bench_attention.c */
int bench_modes(const bench_opts *o);     /* bench_flux.c */
int bench_device(const bench_opts *o);    /* bench_device.c */
int bench_single_file(const bench_opts *o); /* bench_single_file.c */

#endif
