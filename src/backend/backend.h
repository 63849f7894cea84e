/*
 * The device interface and the work item every backend runs.
 *
 * A node is one op with its input and output views, resolved to storages. Strict eager
 * queues a node as soon as it is made; defer-and-fuse and compiled mode collect nodes
 * into graphs first. Either way a backend runs it through its kernel table, indexed by
 * df_op. A storage is reference-counted: tensor handles and queued nodes hold references,
 * so memory returns to the device's caching allocator only after the last kernel that
 * reads it has run, and the host may write into a fresh allocation at once.
 *
 * The op enum comes from runtime/ops.def: it is a data table shared by the runtime (which
 * builds nodes) and the backends (which run them).
 */
#ifndef DF_BACKEND_H
#define DF_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <diffuse/runtime.h>

#define DF_BACKEND_ABI_VERSION 2 /* 2: df_storage.base, df_backend_ops.matmul_dtype */
#define DF_NODE_MAX_IN 5

typedef enum df_op {
#define DF_OP(name, printed, n_in, kind) DF_OP_##name,
#include "runtime/ops.def"
#undef DF_OP
    DF_OP_COUNT
} df_op;

typedef enum df_op_kind {
    DF_OPK_ELEMENTWISE,
    DF_OPK_REDUCE,
    DF_OPK_MATMUL,
    DF_OPK_DATA,
    DF_OPK_OTHER,
} df_op_kind;

const char *df_op_name(df_op op);
df_op_kind df_op_kind_of(df_op op);
int df_op_inputs(df_op op);

typedef struct df_device df_device;
typedef struct df_node df_node;

/* Something a backend keeps beside a storage: a weight packed for its GEMM, converted to
 * another dtype, and so on. Freed with the storage. */
typedef struct df_derived {
    struct df_derived *next;
    int64_t key;            /* backend-defined (layout, dtype, shape) */
    void *data;
    size_t bytes;
    void (*free)(void *data);
} df_derived;

typedef struct df_storage {
    atomic_int refs;        /* handles + nodes + graphs that hold it */
    int handles;            /* tensor handles only (host thread) */
    df_device *dev;
    void *data;             /* NULL while the storage is lazy (not yet produced) */
    size_t bytes;
    bool external;          /* memory owned elsewhere (mapped weights): never freed here */
    bool is_weight;         /* long-lived: may carry derived forms */
    bool file_backed;       /* external memory that is a read-only file mapping: its pages
                               can be dropped and will be read again from the file */
    bool transient;         /* a weight that is resident only briefly (sequential offload):
                               backends use it in place rather than pack a copy each time */
    bool keep_precision;    /* a weight that int8 compute keeps in f32 (models/quant_policy.c) */
    const float *i8_scale;  /* an I8 weight saved quantized: its scales [rows, i8_groups] */
    int64_t i8_groups;
    struct df_storage *base; /* external memory inside another storage (a concat's part
                               that the defer-and-fuse planner has its producer write in
                               place): held until this one is freed */
    df_node *producer;      /* the pending node that will produce it (defer-and-fuse) */
    df_derived *derived;    /* backend caches; touched only by the stream that runs kernels */
} df_storage;

/* What a kernel sees of one tensor. Strides and offset are in elements. */
typedef struct df_view {
    df_storage *st; /* NULL: the optional input is absent */
    df_dtype dtype;
    int ndim;
    int64_t shape[DF_MAX_DIMS];
    int64_t stride[DF_MAX_DIMS];
    int64_t offset;
} df_view;

/* Activations a matrix product can apply on its way out (LINEAR's a.i[3]), set by the
 * defer-and-fuse planner when it folds an activation into the product feeding it. */
enum { DF_ACT_NONE, DF_ACT_GELU_TANH, DF_ACT_SILU, DF_ACT_GELU };

typedef struct df_attrs {
    int64_t i[8];
    double f[4];
} df_attrs;

struct df_node {
    df_op op;
    int n_in;
    df_view in[DF_NODE_MAX_IN];
    df_view out;        /* dense row-major; the defer-and-fuse planner may point it into a
                           larger tensor for the kernels that take that (rms_norm_rope,
                           and linear or attention writing their columns of a concat) */
    df_attrs a;
    /* Graph bookkeeping (defer-and-fuse / compile); unused in strict eager. */
    int id;
    df_node *next;
};

/*
 * A fused elementwise kernel (built by the defer-and-fuse optimiser): for every row of the
 * dense output, an optional normalisation "head" (LAYER_NORM / RMS_NORM of head_x's row),
 * then a straight-line program over registers that each hold one row. Inputs are views
 * broadcast to the output's shape; the last dimension is the row.
 */
#define DF_FUSED_MAX_IN 16
#define DF_FUSED_MAX_INSN 48

typedef enum df_fused_opcode {
    DF_FI_LOAD,       /* r[dst] = in[a] */
    DF_FI_HEAD,       /* r[dst] = norm(head_x row) */
    DF_FI_ADD, DF_FI_SUB, DF_FI_MUL, DF_FI_DIV,
    DF_FI_SCALE,      /* r[dst] = f0 * r[a] + f1 */
    DF_FI_SILU, DF_FI_GELU, DF_FI_GELU_TANH, DF_FI_QUICK_GELU,
    DF_FI_COPY,       /* r[dst] = r[a] */
} df_fused_opcode;

typedef struct df_fused_insn {
    uint8_t op, dst, a, b;
    float f0, f1;
} df_fused_insn;

typedef struct df_fused {
    df_view out;
    int n_in;
    df_view in[DF_FUSED_MAX_IN];
    int n_insn;
    df_fused_insn insn[DF_FUSED_MAX_INSN];
    int n_regs, out_reg;
    int head_op;              /* DF_OP_LAYER_NORM, DF_OP_RMS_NORM, or -1 */
    df_view head_x, head_w, head_b;
    double head_eps;          /* the norm's own eps (a double, as its kernel reads it) */
} df_fused;

/* Scratch memory and threading for one kernel call. */
typedef struct df_kernel_env {
    int threads;
    void *scratch;
    size_t scratch_bytes;
} df_kernel_env;

typedef df_status (*df_kernel_fn)(const df_node *n, df_kernel_env *env);

/* A 64-byte aligned scratch buffer of at least `bytes`, valid until the kernel returns. */
void *df_env_scratch(df_kernel_env *env, size_t bytes);

static inline void *df_view_ptr(const df_view *v)
{
    return (char *)v->st->data + v->offset * (int64_t)df_dtype_size(v->dtype);
}
int64_t df_view_numel(const df_view *v);
bool df_view_is_dense(const df_view *v);

/* A queue of work that runs in order. */
typedef struct df_stream df_stream;
typedef struct df_work {
    df_status (*run)(void *arg, df_kernel_env *env);
    void (*done)(void *arg, df_status s); /* always called, on the stream's thread */
    void *arg;
} df_work;

typedef struct df_backend_ops {
    int abi_version;
    const char *name;
    int (*device_count)(void);
    df_status (*device_open)(int index, int threads, void **impl);
    void (*device_close)(void *impl);
    df_status (*buffer_alloc)(void *impl, size_t bytes, void **out);
    void (*buffer_free)(void *impl, void *p);
    /* Copies between host and device memory (for the CPU both are plain memory). */
    df_status (*copy_to_device)(void *impl, void *dst, const void *src, size_t bytes);
    df_status (*copy_to_host)(void *impl, void *dst, const void *src, size_t bytes);
    df_status (*stream_create)(void *impl, df_stream **out);
    void (*stream_free)(df_stream *s);
    /* Queues work; returns at once. Fails only if the work cannot be queued. */
    df_status (*stream_submit)(df_stream *s, const df_work *w);
    /* Waits for all queued work; returns the stream's first failure (sticky). */
    df_status (*stream_sync)(df_stream *s);
    /* Events: a position in the stream. record returns the position after everything queued
     * so far; reached tells (or, with wait, waits until) the stream has finished it. */
    uint64_t (*stream_record)(df_stream *s);
    bool (*stream_reached)(df_stream *s, uint64_t at, bool wait);
    /* Waits until at most `depth` items are queued and not finished. */
    void (*stream_throttle)(df_stream *s, size_t depth);
    /* Forgets the stream's failure after it has been reported. */
    void (*stream_reset)(df_stream *s);
    /* Compute threads the device uses (CPU), or 1. */
    int (*device_threads)(void *impl);
    const df_kernel_fn *kernels; /* indexed by df_op; NULL = not supported */
    /* Runs a fused elementwise kernel; NULL = the backend cannot fuse. Its output may be
     * f32 or bf16. */
    df_status (*run_fused)(const df_fused *f, df_kernel_env *env);
    /* The dtype matrix products really compute in when `requested` is asked for (bf16
     * falls back to f32 where the device has no bf16 products); NULL = as requested. */
    df_dtype (*matmul_dtype)(df_dtype requested);
} df_backend_ops;

/* An opened device: its backend, its caching allocator and counters. */
struct df_device {
    const df_backend_ops *ops;
    void *impl;
    int index;
    char name[48];
    struct df_buffer_cache *cache;
};

const df_backend_ops *df_backend_cpu(void);
const df_backend_ops *df_backend_find(const char *name);

df_status df_device_open(const char *name, int threads, df_device **out);
void df_device_close(df_device *dev);

/* Storages: allocation through the device's caching allocator. */
df_status df_storage_alloc(df_device *dev, size_t bytes, df_storage **out);
df_storage *df_storage_lazy(df_device *dev, size_t bytes);
df_status df_storage_materialize(df_storage *st);
df_storage *df_storage_external(df_device *dev, void *data, size_t bytes);
void df_storage_retain(df_storage *st);
void df_storage_release(df_storage *st);
/* The derived form with `key`, or NULL. */
df_derived *df_storage_find_derived(df_storage *st, int64_t key);
void df_storage_add_derived(df_storage *st, df_derived *d);
void df_storage_drop_derived(df_storage *st);
/* Drops the pages of [p, p + n) when the storage is file-backed (a backend that keeps its
 * own packed copy of a weight need not keep the file's pages as well). */
void df_storage_drop_pages(const df_storage *st, const void *p, size_t n);

/* Memory counters of a device's caching allocator. */
typedef struct df_mem_stats {
    int64_t live_bytes, peak_bytes, allocated_total, cached_bytes;
} df_mem_stats;
void df_device_mem_stats(df_device *dev, df_mem_stats *out);
void df_device_mem_reset_peak(df_device *dev);
/* Returns cached, unused blocks to the backend. */
void df_device_trim(df_device *dev);

#endif
