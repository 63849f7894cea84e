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

#endif
