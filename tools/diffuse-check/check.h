/*
 * diffuse-check: runs golden case folders (tests/golden/README.md gives the format).
 *
 * main.c loads a case (case.json, case.safetensors, the model folder it names), picks the
 * handler for its "kind", and the handler runs the computation with the library and
 * compares each output through check_compare_*(). A handler returns 0 when every output
 * is within tolerance, 1 otherwise (a case that cannot be run is a failure, with the
 * reason printed).
 */
#ifndef DIFFUSE_CHECK_H
#define DIFFUSE_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/diffuse.h>

typedef struct check_case {
    const char *name;        /* case.json "case" */
    const char *dir;         /* the case folder */
    const char *model_dir;   /* case.json "dir" resolved against the case folder; NULL if null */
    const char *kind;        /* case.json "kind" */
    const char *cls;         /* case.json "class" */
    const df_json *root;     /* case.json */
    const df_json *args;     /* case.json "args" */
    df_safetensors *tensors; /* case.safetensors */
    const char *mode;        /* "eager", "fuse", "compile", "blocks" (compiled repeated blocks) */
    const char *device;      /* "cpu" unless --device */
    df_dtype compute;        /* --dtype: F32 (default), BF16 or I8 */
    int threads;             /* --threads, 0 = default */
    double tol_scale;        /* tolerance multiplier (1; bf16 compute uses its own rule) */
    int verbose;
    FILE *stats_json;        /* --stats-json target or NULL */
    df_comm *comm;           /* --tp: the ranks the pipeline is split over; NULL without */
} check_case;

/* With --dtype bf16 every float output must be within this relative L2 error. */
#define CHECK_BF16_REL_L2 2e-2
/* With --dtype int8, the bound for each kind of case (check_int8_rel_l2). */
#define CHECK_INT8_REL_L2_MODEL 3e-2    /* worst measured 1.66e-2 (sd3-transformer) */
#define CHECK_INT8_REL_L2_TEXT 5e-2     /* worst measured 3.10e-2 (te-mistral) */
#define CHECK_INT8_REL_L2_PIPELINE 3.5e-2 /* worst measured 1.92e-2 (t2i-sd3 latents) */
double check_int8_rel_l2(const check_case *c);

/* The case's "single_file" (the component's weights, relative to the case folder; "dir"
 * then gives only the config) written into buf: buf, or NULL when the case names none. */
const char *check_single_file(const check_case *c, char *buf, size_t cap);

/* Context options for the case: device, threads, compute dtype, and the execution mode for
 * components that are not compiled (eager: strict eager; fuse, compile, blocks: defer-and-
 * fuse, since in the compiled modes only the transformer is compiled, as in the CLI). */
df_ctx_opts check_ctx_opts(const check_case *c);

/* Reads tensor `name` of case.safetensors ("in.x", "out.y") converted to f64 / i64.
 * *out is malloc'd (free()); shape and ndim receive its shape (shape has room for 8). */
df_status check_read_f64(const check_case *c, const char *name, double **out, int64_t *shape,
                         int *ndim);
df_status check_read_i64(const check_case *c, const char *name, int64_t **out, int64_t *shape,
                         int *ndim);
/* Same, as f32 (what the library computes with). */
df_status check_read_f32(const check_case *c, const char *name, float **out, int64_t *shape,
                         int *ndim);

/* Compares `got` (n values) with out.<output>: the case's tolerance, or exact equality when
 * the output is listed in "exact". Prints one line: output, max-abs, rel-L2, limits,
 * PASS/FAIL. Returns 0 on pass, 1 on fail (also when the shapes' element counts differ). */
int check_compare_f64(const check_case *c, const char *output, const double *got, int64_t n);
int check_compare_f32(const check_case *c, const char *output, const float *got, int64_t n);
int check_compare_i64(const check_case *c, const char *output, const int64_t *got, int64_t n);

/* args.<key> uploaded as an f32 tensor: "in.<tensor>" of case.safetensors, or a number
 * (a [1] tensor); *out stays NULL for null or absent. Returns 0, or 1 after check_fail. */
int check_upload_arg(check_case *c, df_ctx *ctx, const char *key, df_tensor **out);
/* The "seed" of a generator object ({"seed": N}) as torch's manual_seed takes it: any
 * integer in [-2^63, 2^64 - 1], a negative one as its 64-bit two's complement. Returns 0,
 * or 1 after check_fail. */
int check_read_seed(check_case *c, const df_json *gen, uint64_t *out);
/* args.<key>: absent or null (*n = 0), or a list of at most `cap` integers in [0, 2^31)
 * copied into out. Returns 0, or 1 after check_fail. */
int check_read_indices(check_case *c, const char *key, int *out, int cap, int *n);
/* Reads t (NULL: the forward failed) and compares it with out.<output>. */
int check_compare_tensor(const check_case *c, df_ctx *ctx, const char *output, df_tensor *t);
/* Appends the context's counters to --stats-json, one JSON object per line. */
void check_write_stats(const check_case *c, df_ctx *ctx);

/* Prints "case: reason" for a case that cannot run, and returns 1. */
int check_fail(const check_case *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The reason the last check_fail printed ("" before any). */
const char *check_last_failure(void);

/* --tp N (tp.c): one process per rank under mpirun; rank 0 compares and reports. */
typedef struct check_tp {
    df_comm *comm; /* NULL without --tp */
    int rank, size;
} check_tp;
/* Checks --tp against the launch and initialises MPI (tp <= 1: nothing). Returns 0, or the
 * exit status after printing why (2: usage). Ranks other than 0 send stdout to /dev/null. */
int check_tp_start(int tp, check_tp *out);
/* A point every rank reaches: returns 1 on every rank when rc is non-zero on any (rank 0
 * prints the other ranks' failures), else 0. rc itself without --tp. */
int check_tp_agree(const check_case *c, int rc);
void check_tp_end(check_tp *t);

/* The row named `name` of the table `rows` (n rows of `size` bytes, each a struct whose
 * first member is its name), or NULL: the lookup of the handlers' tables of runners. */
const void *check_find_row(const void *rows, size_t n, size_t size, const char *name);
#define CHECK_FIND_ROW(rows, name)                                                                 \
    check_find_row(rows, sizeof rows / sizeof *rows, sizeof *rows, name)

/* Whether a case of `kind` runs class `cls`: a row of the library's model table (models.h)
 * of the component that the kind runs, which the kind's handler has a runner for.
 * `diffuse-check --classes` prints each row of the table with the kinds that run it, then
 * each pipeline class with "pipeline". */
bool check_runs_class(const char *kind, const char *cls);
/* Whether the handler has a runner of its own for the class (kind_model_forward.c,
 * kind_text_encoder.c). */
bool check_model_forward_runs(const char *cls);
bool check_text_encoder_runs(const char *cls);
/* The i-th pipeline class the pipeline kind runs (kind_pipeline.c), NULL past the last. */
const char *check_pipeline_class(int i);

/* The handlers, one per kind, each in its own file (kind_<kind>.c). */
int check_kind_model_forward(check_case *c);
int check_kind_scheduler(check_case *c);
int check_kind_vae_decode(check_case *c);
int check_kind_vae_encode(check_case *c);
int check_kind_pipeline(check_case *c);
int check_kind_tokenizer(check_case *c);
int check_kind_text_encoder(check_case *c);
int check_kind_rng(check_case *c);

#endif
