/*
 * The runtime: contexts, tensors, scopes, execution modes and statistics.
 *
 * A df_ctx binds a device, its stream, the execution mode and the compute dtype. Every op
 * (ops.h) takes the context and returns a new tensor handle at once; in strict eager mode
 * the kernel is already queued on the device stream, in defer-and-fuse mode it is recorded
 * into a pending graph. Only host reads (df_tensor_read), df_sync() and df_mark_step() wait.
 *
 * Ownership: every tensor made while a scope is open belongs to that scope;
 * df_scope_end() releases everything made since the matching df_scope_begin() except the
 * tensors it keeps, which move to the enclosing scope. Tensors made with no scope open
 * belong to the context until df_tensor_free() or df_ctx_free(). Model code never frees.
 *
 * Errors: an op that fails (bad shapes, out of memory, a failed kernel) returns NULL and
 * leaves the context failed; ops given a NULL input return NULL and, if the context had not
 * failed yet (the call that made the NULL lost its error), fail it with DF_E_ARG naming the
 * op. The next call that reports (df_ctx_status, df_sync, df_tensor_read, df_mark_step)
 * returns the first error, whose message names the op and the shapes.
 */
#ifndef DIFFUSE_RUNTIME_H
#define DIFFUSE_RUNTIME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_MAX_DIMS 6

typedef struct df_ctx df_ctx;
typedef struct df_tensor df_tensor;
typedef int64_t df_scope;

/* How ops run (DESIGN.md §5). */
typedef enum df_eager_mode {
    DF_DEFER_NEVER,      /* strict eager: each op is queued on the stream at once (default) */
    DF_DEFER_AND_FUSE,   /* ops are recorded, then optimised and run at sync points */
} df_eager_mode;

typedef struct df_ctx_opts {
    const char *device;     /* "cpu", "cuda", "cuda:1"; NULL = df_device_default() */
    int threads;            /* compute threads; 0 = all cores */
    df_dtype compute;       /* F32, BF16 or I8 for matrix products; 0 (F32) by default. I8:
                               linears of weights take 8-bit products, the rest F32 */
    df_eager_mode mode;     /* DIFFUSE_DEFER_AND_FUSE=1 in the environment selects fuse */
    int64_t fuse_max_nodes; /* defer-and-fuse: cut the pending graph at this many nodes; 0 = 4096 */
    /* I8 compute on the CPU backend (other devices ignore these): the weights' quantization
     * group (32 to 256, a multiple of 4; -1 one group per row, the whole k; 0 as
     * DIFFUSE_INT8_GROUP says, else 128) and the int8 kernel ("portable", "avx2",
     * "avx-vnni", "avx512-vnni", "onednn": one this CPU has; NULL as DIFFUSE_INT8_PATH
     * says, else the best by cpuid). */
    int int8_group;
    const char *int8_path;
} df_ctx_opts;

/* Counters every mode reports. A key that does not apply yet stays 0. */
typedef struct df_stats {
    int64_t ops_enqueued;          /* kernels queued on the device stream */
    int64_t graphs_built;          /* pending graphs cut and run (defer-and-fuse, compile) */
    int64_t graphs_compiled;       /* graphs optimised (cache misses that compiled) */
    int64_t cache_hits;
    int64_t cache_misses;
    double compile_ms;             /* time spent optimising / compiling */
    int64_t fused_kernels;         /* kernels that replaced two or more ops */
    int64_t bytes_allocated;       /* device bytes handed out by the allocator, in total */
    int64_t peak_bytes;            /* most device bytes in use at once */
    int64_t live_bytes;            /* device bytes in use now */
    int64_t peak_rss_bytes;        /* the process's peak resident set */
    int64_t weight_bytes_read;     /* bytes of weights read from files */
    int64_t resident_weight_bytes; /* weight bytes held in working form now */
    int64_t arena_bytes;           /* planned arena of compiled programs */
    int64_t steps;                 /* df_mark_step() calls */
    double seconds_per_step;       /* mean wall time between df_mark_step() calls */
    int64_t rss_bytes;             /* the process's resident set now */
    int64_t peak_resident_weight_bytes; /* most weight bytes resident at once */
    int64_t bytes_uploaded;        /* host -> device bytes copied (0 where the device reads
                                      host memory in place, as the CPU does) */
    int64_t bytes_downloaded;      /* device -> host bytes copied */
    /* The device's own counters (0 where the device keeps none, as the CPU): kernels run
     * on it (a replayed graph's again), kernels the host built (a replay builds none),
     * hand-overs of work (Vulkan: command batches submitted) and recorded graphs replayed
     * (compiled mode on a device that records them). */
    int64_t device_dispatches;
    int64_t device_dispatches_recorded;
    int64_t device_submits;
    int64_t device_graph_launches;
} df_stats;

/* The device chosen when none is named: $DIFFUSE_DEVICE (unless "auto"), else the best
 * device that answers (df_device_auto). */
DF_API const char *df_device_default(void);
/* The best device that opens, by the backends' priorities (a GPU before the CPU; test
 * devices never); "cpu" when nothing else answers. The name "auto" means this. */
DF_API const char *df_device_auto(void);

/* One device as `diffuse devices` lists it. */
typedef struct df_device_desc {
    char device[32];        /* what --device takes: "cpu:0", "vulkan:1" */
    char name[96];          /* what the backend calls it */
    const char *kind;       /* "cpu", "gpu", "sim", "other" */
    uint64_t memory_bytes;  /* device memory (the host's RAM for the CPU) */
    uint64_t memory_free;   /* 0: unknown */
    uint32_t caps;          /* capability bits (df_device_caps_string names them) */
    int priority;           /* how df_device_auto ranks it */
} df_device_desc;

/* Fills up to `cap` entries with the devices of every backend (test devices such as `sim`
 * only when `all`); returns how many there are. */
DF_API int df_device_list(df_device_desc *out, int cap, bool all);
/* The capability bits as space-separated words ("fused strided-outputs ..."). */
DF_API const char *df_device_caps_string(uint32_t caps, char *buf, size_t cap);

/* Loads the backend plugin libdiffuse-<name>.so from the plugin folder (the library's own
 * folder, or $DIFFUSE_BACKEND_DIR). Plugins there are loaded at the first device look-up
 * anyway, unless DIFFUSE_BACKEND_AUTOLOAD=0. DF_OK if the backend is already there. */
DF_API df_status df_backend_load(const char *name);

/* Creates a context. opts may be NULL. Free it with df_ctx_free() (which waits for work). */
DF_API df_status df_ctx_create(const df_ctx_opts *opts, df_ctx **out);
DF_API void df_ctx_free(df_ctx *ctx);

/* The first error since the context was created or last reset; DF_OK if none. Does not wait. */
DF_API df_status df_ctx_status(const df_ctx *ctx);
/* Waits for queued work, then forgets a recorded error so the context can be used again. */
DF_API void df_ctx_reset_error(df_ctx *ctx);
/* Records s as the context's failure if it has none yet (with the calling thread's current
 * message) and returns NULL, so that code building on ops fails the context as an op
 * does: `return df_ctx_fail(ctx, df_errorf(...))`. */
DF_API df_tensor *df_ctx_fail(df_ctx *ctx, df_status s);

DF_API df_status df_ctx_set_compute_dtype(df_ctx *ctx, df_dtype compute);
DF_API df_dtype df_ctx_compute_dtype(const df_ctx *ctx);
DF_API df_status df_set_eager_mode(df_ctx *ctx, df_eager_mode mode);
DF_API df_eager_mode df_get_eager_mode(const df_ctx *ctx);
DF_API int df_ctx_threads(const df_ctx *ctx);
DF_API const char *df_ctx_device_name(const df_ctx *ctx);

/* How fast the context's device multiplies matrices, as the device answers it. */
typedef struct df_matmul_rates {
    double f32_gflops;  /* f32 products, GFLOP/s */
    double bf16_gflops; /* bf16 products (f32 accumulation), GFLOP/s; 0: none */
    char how[320];      /* where the numbers come from: "measured now on 16 threads ...",
                           "measured earlier ..., cached in FILE", "given by ..." */
} df_matmul_rates;

/* Asks the context's device for its matrix product rates (the CPU measures oneDNN's f32 and
 * bf16 products the first time and caches them in DIFFUSE_CACHE_DIR; DIFFUSE_MATMUL_RATES=
 * "f32=N,bf16=M" answers instead). Fails with DF_E_UNSUPPORTED when the device does not
 * say, DF_E_ARG for a malformed DIFFUSE_MATMUL_RATES; *out is zeroed on failure. */
DF_API df_status df_ctx_matmul_rates(df_ctx *ctx, df_matmul_rates *out);

/* The compute dtype --dtype auto picks: bf16 only when the device's bf16 products measured
 * at least 1.25x its f32 ones (bf16 must pay for the precision it loses) and the checkpoint
 * stores bf16 weights (`weights`, the transformer's dtype; DF_DTYPE_COUNT when unknown: an
 * f32 or f16 checkpoint asks for more precision than bf16 keeps); f32 otherwise, and when
 * `rates` is NULL (the device does not say). `why` (cap bytes, may be NULL) gets one
 * sentence with the measured rates and the reason. */
DF_API df_dtype df_dtype_auto(const df_matmul_rates *rates, df_dtype weights, char *why,
                              size_t cap);

/* Waits until all queued work has run; returns the context's error, if any. */
DF_API df_status df_sync(df_ctx *ctx);
/* An event marks a point in the context's stream: everything asked for before it. */
typedef struct df_event {
    uint64_t at;
} df_event;
/* Records an event after all work asked for so far (pending graphs are flushed first). */
DF_API df_status df_event_record(df_ctx *ctx, df_event *out);
/* Whether the work before the event has finished; does not wait. */
DF_API bool df_event_done(df_ctx *ctx, df_event ev);
/* Waits for the work before the event (not for work queued after it); returns the
 * context's error, if any. */
DF_API df_status df_event_sync(df_ctx *ctx, df_event ev);

/* Gives memory nobody uses back: waits for queued work, returns the device allocator's
 * cached blocks to the device and, on the host, the heap's free pages to the system
 * (malloc_trim). Tensors stay valid. For the edges between phases of a run (before a VAE
 * decode, after the transformer), like torch.cuda.empty_cache(); returns the context's
 * error, if any. */
DF_API df_status df_empty_cache(df_ctx *ctx);

/* Bytes this process may still take: with DIFFUSE_MEMORY_LIMIT set (a byte count, or with a
 * K, M, G or T suffix in powers of 1024), that limit less the process's resident memory now
 * (0 once it is reached); otherwise the system's MemAvailable (/proc/meminfo). -1 when
 * neither is known or the setting is malformed. */
DF_API int64_t df_memory_available(void);

/* Marks the end of a denoising step: runs pending work and counts the step. */
DF_API df_status df_mark_step(df_ctx *ctx);

DF_API df_scope df_scope_begin(df_ctx *ctx);
/* Releases every tensor made since `mark` except `keep` (may be NULL), which moves to the
 * enclosing scope. Returns `keep`. */
DF_API df_tensor *df_scope_end(df_ctx *ctx, df_scope mark, df_tensor *keep);
/* The same for several kept tensors (NULL entries are skipped). */
DF_API void df_scope_end_n(df_ctx *ctx, df_scope mark, df_tensor **keep, int n);

/* Per-op-kind kernel time (profiling, off by default; DIFFUSE_PROFILE=1 turns it on for
 * every context). Fused kernels count under "fused". */
typedef struct df_profile_entry {
    const char *op;
    int64_t calls;
    double ms;
} df_profile_entry;
DF_API void df_ctx_set_profiling(df_ctx *ctx, bool on);
/* Fills up to `cap` entries, largest time first (waits for queued work); returns the count. */
DF_API int df_ctx_profile(df_ctx *ctx, df_profile_entry *out, int cap);

/* Counters since creation (or the last df_stats_reset). */
DF_API void df_ctx_stats(df_ctx *ctx, df_stats *out);
DF_API void df_stats_reset(df_ctx *ctx);
/* Writes the counters as one JSON object (no newline) into buf; returns the length it
 * needs (like snprintf). */
DF_API int df_stats_to_json(const df_stats *s, char *buf, size_t cap);
/* Adds weight bytes read / resident (for loaders). */
DF_API void df_stats_add_weights(df_ctx *ctx, int64_t bytes_read, int64_t resident_delta);
/* Restarts peak_resident_weight_bytes from the current residency (for per-phase peaks). */
DF_API void df_stats_reset_resident_peak(df_ctx *ctx);

/* --- tensors -------------------------------------------------------------------------- */

/* A new tensor holding a copy of n = prod(shape) elements of `data` (laid out densely in
 * `dtype`). The copy is taken before the call returns. */
DF_API df_tensor *df_tensor_from_host(df_ctx *ctx, df_dtype dtype, const int64_t *shape,
                                      int ndim, const void *data);
/* A tensor over memory the caller keeps alive and unchanged until the tensor and every
 * view of it are released (mmapped weights): no copy is made. */
DF_API df_tensor *df_tensor_wrap(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                                 const void *data);
/* A new tensor of zeros / of a constant. */
DF_API df_tensor *df_zeros(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim);
DF_API df_tensor *df_full(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                          double value);

/* Copies the tensor's elements, converted to `as`, into dst (row-major, densely). Waits for
 * the work that produces it. dst_bytes must be at least numel * size of `as`. */
DF_API df_status df_tensor_read(df_ctx *ctx, df_tensor *t, df_dtype as, void *dst,
                                size_t dst_bytes);

/* Releases a tensor now (owners of long-lived tensors, such as models, use this). */
DF_API void df_tensor_free(df_tensor *t);
/* Moves a tensor out of its scope: it then lives until df_tensor_free (weights, caches). */
DF_API df_tensor *df_tensor_persist(df_tensor *t);

DF_API df_dtype df_tensor_dtype(const df_tensor *t);
DF_API int df_tensor_ndim(const df_tensor *t);
/* Size of dimension d; negative d counts from the end. */
DF_API int64_t df_tensor_dim(const df_tensor *t, int d);
DF_API const int64_t *df_tensor_shape(const df_tensor *t);
DF_API int64_t df_tensor_numel(const df_tensor *t);
DF_API bool df_tensor_is_contiguous(const df_tensor *t);
/* "[2, 16, 64] f32" into buf; returns buf. */
DF_API const char *df_tensor_describe(const df_tensor *t, char *buf, size_t cap);

/* Shape and dimension lists for the view functions: DF_SHAPE(B, S, H, D). */
#define DF_SHAPE(...)                                                                      \
    (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

#ifdef __cplusplus
}
#endif
#endif
