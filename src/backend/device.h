/*
 * The device interface: the versioned plugin ABI that every backend implements.
 *
 * A backend owns its memory. The runtime sees a buffer as an opaque handle and addresses
 * it only by byte offset; a kernel argument is a view (buffer, byte offset of element 0,
 * dtype, shape, strides in elements). Work goes into streams: ordered queues that the
 * host fills from its own thread (launch, launch_fused, the copies, host callbacks) and
 * that run asynchronously. An event is a position in a stream: stream_record returns it,
 * stream_reached tells (or waits until) the stream has finished everything before it,
 * and stream_wait makes later work on one stream wait for a position of another. The
 * runtime frees a buffer only once every stream that used it has reached the position
 * after its last use, so a backend never has to track its users.
 *
 * Nothing of the runtime crosses this boundary: no reference counts, no producers, no
 * graph. A backend is a table of functions (df_device_ops) that a plugin returns from its
 * entry point `df_device_plugin` (DF_DEVICE_PLUGIN_ENTRY), given the host's services
 * (df_host_api: error messages, logging, memory). Entries marked "optional" may be NULL;
 * the runtime calls them only through checked wrappers with defaults (backend/registry.h).
 * docs/backends.md is the contract in prose, with the CPU backend as the worked example.
 *
 * Versioning: DF_DEVICE_ABI_VERSION changes whenever a type or an entry below changes in a
 * way an older plugin would misread; the runtime refuses a plugin built for another
 * version. New optional entries are appended at the end of df_device_ops (struct_size says
 * how much of the table a plugin knows). The vocabulary (ops, their attributes, the
 * capability bits, the epilogue activations; ops.def beside this header, which makes every
 * table below) is part of the ABI: new entries are only appended, and a backend refuses a
 * node whose op it does not know (supports() returns false).
 *
 * This header and ops.def are installed (<diffuse/device.h>, <diffuse/ops.def>) with the
 * public headers they include, so a plugin builds outside the tree.
 */
#ifndef DF_BACKEND_DEVICE_H
#define DF_BACKEND_DEVICE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/dtype.h>
#include <diffuse/status.h>

#define DF_DEVICE_ABI_VERSION 5
#define DF_DEVICE_MAX_DIMS 6 /* = DF_MAX_DIMS of the public API */
#define DF_NODE_MAX_IN 5

/* ---- The vocabulary (ops.def) --------------------------------------------------------- */

/* Expands to its arguments for a Y column of ops.def, to nothing for an N. */
#define DF_IF_Y(...) __VA_ARGS__
#define DF_IF_N(...)

/* What an op does, broadly (ops.def's kind column). */
typedef enum df_op_kind {
    DF_OPK_ELEMENTWISE,
    DF_OPK_REDUCE,
    DF_OPK_MATMUL, /* a product: its attribute `compute` is the dtype it computes in */
    DF_OPK_DATA,
    DF_OPK_OTHER,
} df_op_kind;

typedef enum df_op {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) DF_OP_##name,
#include "ops.def"
#undef DF_OP
    DF_OP_COUNT
} df_op;

/* Capability bits (df_device_info.caps) that the planner and the runtime read. */
enum {
#define DF_CAP(name, bit, word, doc) DF_CAP_##name = 1u << (bit),
#include "ops.def"
#undef DF_CAP
};

/* Activations a matrix product applies on its way out (LINEAR's attribute act), set by the
 * planner when the device has the matching DF_CAP_EPI_* bit: the ops marked epi. */
typedef enum df_act {
    DF_ACT_NONE,
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) DF_IF_##epi(DF_ACT_##name, )
#include "ops.def"
#undef DF_OP
    DF_ACT_COUNT
} df_act;

/* Attributes: one named field per meaning (ops.def's DF_ATTR list says which op reads
 * which). Every field is 8 bytes, so the struct has no padding. */
#define DF_ATTR_MAX_AXES 7
typedef int64_t df_attr_int;
typedef double df_attr_real;
typedef int64_t df_attr_axes[DF_ATTR_MAX_AXES];

typedef struct df_attrs {
#define DF_ATTR(type, name, doc) df_attr_##type name;
#include "ops.def"
#undef DF_ATTR
} df_attrs;

/* DF_A(name): the bit of attribute `name` in an op's attribute set (ops.def). */
enum {
#define DF_ATTR(type, name, doc) DF_ATTR_INDEX_##name,
#include "ops.def"
#undef DF_ATTR
    DF_ATTR_COUNT
};
#define DF_A(name) (UINT64_C(1) << DF_ATTR_INDEX_##name)

/* The tables made from ops.def, for the runtime and for plugins alike. */

/* The op's printed name ("gelu_tanh"), or "?". */
static inline const char *df_vocab_op_name(df_op op)
{
    switch (op) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) case DF_OP_##name: return printed;
#include "ops.def"
#undef DF_OP
    default: return "?";
    }
}

/* The op's attribute set: DF_A(...) bits. */
static inline uint64_t df_vocab_op_attrs(df_op op)
{
    switch (op) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) case DF_OP_##name: return (attrs);
#include "ops.def"
#undef DF_OP
    default: return 0;
    }
}

/* Whether op is an instruction of fused programs (ops.def's fuse column). */
static inline bool df_vocab_op_fuses(df_op op)
{
    switch (op) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) DF_IF_##fuse(case DF_OP_##name:)
#include "ops.def"
#undef DF_OP
        return true;
    default: return false;
    }
}

/* The epilogue activation of an op marked epi, else DF_ACT_NONE. */
static inline df_act df_vocab_act_of(df_op op)
{
    switch (op) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                      \
    DF_IF_##epi(case DF_OP_##name: return DF_ACT_##name;)
#include "ops.def"
#undef DF_OP
    default: return DF_ACT_NONE;
    }
}

/* The op an epilogue activation computes (DF_OP_COUNT for DF_ACT_NONE or an unknown one). */
static inline df_op df_vocab_act_op(int act)
{
    switch (act) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                      \
    DF_IF_##epi(case DF_ACT_##name: return DF_OP_##name;)
#include "ops.def"
#undef DF_OP
    default: return DF_OP_COUNT;
    }
}

/* The capability bit a device declares to apply `act` as an epilogue (0 for none). */
static inline uint32_t df_vocab_act_cap(int act)
{
    switch (act) {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                      \
    DF_IF_##epi(case DF_ACT_##name: return DF_CAP_EPI_##name;)
#include "ops.def"
#undef DF_OP
    default: return 0;
    }
}

/* Opaque objects a backend defines. */
typedef struct df_dev_buffer df_dev_buffer;
typedef struct df_dev_stream df_dev_stream;
typedef struct df_dev_comm df_dev_comm;
typedef struct df_dev_graph df_dev_graph;

/* ---- Kernel arguments ---------------------------------------------------------------- */

/* Hints on a view (df_view.flags). */
enum {
    /* A weight: the same bytes at every launch until the buffer is freed or its caches are
     * dropped (buffer_drop_cache). A backend may keep a derived form of it (packed for its
     * GEMM, converted to another dtype) attached to the buffer, keyed as it likes. */
    DF_VIEW_CONST = 1u << 0,
    /* A weight resident only for this pass (sequential offload): use it in place rather
     * than derive a form that is dropped again at once. */
    DF_VIEW_STREAMED = 1u << 1,
    /* A weight that int8 compute keeps in its float dtype (the model's quantization
     * policy said so). */
    DF_VIEW_KEEP_PRECISION = 1u << 2,
    /* A DF_VIEW_CONST weight over host memory that is a read-only file mapping: a backend
     * that derived its own copy may drop those pages (they are read again from the file
     * if ever needed). */
    DF_VIEW_FILE_PAGES = 1u << 3,
};

/* What a kernel sees of one tensor. */
typedef struct df_view {
    df_dev_buffer *buf; /* NULL: an optional input that is absent */
    uint64_t offset;    /* bytes from the buffer's start to element 0 */
    df_dtype dtype;
    int ndim;
    int64_t shape[DF_DEVICE_MAX_DIMS];
    int64_t stride[DF_DEVICE_MAX_DIMS]; /* in elements; 0 broadcasts */
    uint32_t flags;     /* DF_VIEW_* */
    /* An int8 weight saved quantized: its f32 scales [rows, scale_groups], in scale_buf
     * at scale_offset (bytes). scale_buf is NULL otherwise. */
    df_dev_buffer *scale_buf;
    uint64_t scale_offset;
    int64_t scale_groups;
    /* An I8 [rows, k] weight kept in a compact file format: the buffer holds the file's
     * bytes (GGUF blocks of ggml type block_type along k, or fp8 times block_scale when
     * block_type is 0x100 (e4m3) or 0x101 (e5m2)), not int8 values; 0x120: int8 values
     * and scales in the CPU kernels' tiles (core/int8_tiles.h). 0 otherwise. A
     * backend without a kernel for it fails the launch with DF_E_UNSUPPORTED. */
    uint32_t block_type;
    float block_scale;
} df_view;

/* The element count of a shape, and whether (shape, stride) is dense and row-major (a
 * dimension of size 1 may have any stride): written once for the runtime's views and the
 * devices' alike. */
static inline int64_t df_shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

static inline bool df_shape_is_dense(int ndim, const int64_t *shape, const int64_t *stride)
{
    int64_t expect = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        if (shape[d] != 1 && stride[d] != expect)
            return false;
        expect *= shape[d];
    }
    return true;
}

/* One op: its inputs, its output and its attributes (ops.def says what each op's slots
 * and attributes mean). The output is dense row-major unless the device declared
 * DF_CAP_OUT_STRIDED and the planner pointed it into a larger tensor. */
typedef struct df_node {
    df_op op;
    int n_in;
    df_view in[DF_NODE_MAX_IN];
    df_view out;
    df_attrs a;
} df_node;

/*
 * A fused elementwise program (launch_fused; devices with DF_CAP_FUSED): for every row of
 * the dense output, an optional normalisation "head" (LAYER_NORM or RMS_NORM of head_x's
 * row, DF_CAP_FUSED_HEAD), then a straight-line program over registers that each hold one
 * row. Inputs are views broadcast to the output's shape; the last dimension is the row.
 * Each instruction rounds to f32 as the separate kernel would, so the result is the same
 * bits as running the ops one by one.
 */
#define DF_FUSED_MAX_IN 16
#define DF_FUSED_MAX_INSN 48

/* An instruction's opcode is the df_op it computes (an op marked fuse in ops.def; COPY
 * copies a register), or one of these two: */
enum {
    DF_FI_LOAD = 254, /* r[dst] = in[a] */
    DF_FI_HEAD = 255, /* r[dst] = norm(head_x row) */
};
_Static_assert((int)DF_OP_COUNT < (int)DF_FI_LOAD, "fused opcodes: every op has a number below LOAD");

typedef struct df_fused_insn {
    uint8_t op, dst, a, b;
    float f0, f1;
} df_fused_insn;

typedef struct df_fused {
    df_view out;              /* f32, or bf16 with DF_CAP_OUT_BF16 */
    int n_in;
    df_view in[DF_FUSED_MAX_IN];
    int n_insn;
    df_fused_insn insn[DF_FUSED_MAX_INSN];
    int n_regs, out_reg;
    int head_op;              /* DF_OP_LAYER_NORM, DF_OP_RMS_NORM, or -1 */
    df_view head_x, head_w, head_b;
    double head_eps;
} df_fused;

/* ---- Collectives ---------------------------------------------------------------------- */

/* The host's communicator, given to comm_create: a backend with direct transfers between
 * devices uses it only to exchange its own identifiers (broadcast); the CPU uses it for
 * the data. Every call is collective: all ranks make it in the same order. */
typedef struct df_host_comm {
    int rank, size;
    void *self;
    df_status (*all_reduce_f32)(void *self, float *buf, int64_t n);
    df_status (*all_gather)(void *self, const void *send, void *recv, size_t bytes);
    df_status (*broadcast)(void *self, void *buf, size_t bytes, int root);
    df_status (*barrier)(void *self);
} df_host_comm;

typedef enum df_coll_kind {
    DF_COLL_ALL_REDUCE_SUM, /* buf[0, count) summed over the ranks, in place */
    DF_COLL_ALL_GATHER,     /* rank r's count elements at r * count, in place */
    DF_COLL_BROADCAST,      /* root's count elements to every rank */
} df_coll_kind;

typedef struct df_coll {
    df_coll_kind kind;
    df_dev_buffer *buf;
    uint64_t offset; /* bytes */
    int64_t count;   /* elements (per rank for ALL_GATHER) */
    df_dtype dtype;
    int root;
} df_coll;

/* ---- Devices -------------------------------------------------------------------------- */

typedef enum df_device_kind {
    DF_DEVICE_KIND_CPU,
    DF_DEVICE_KIND_GPU,
    DF_DEVICE_KIND_SIM,   /* a test device */
    DF_DEVICE_KIND_OTHER,
} df_device_kind;

typedef struct df_device_info {
    char name[96];            /* human-readable: "AMD EPYC 9654 (32 threads)", "llvmpipe" */
    df_device_kind kind;
    uint64_t memory_bytes;    /* device memory (the host's RAM for the CPU) */
    uint64_t memory_free;     /* 0: unknown */
    uint32_t caps;            /* DF_CAP_* */
    uint32_t alignment;       /* offsets the runtime sub-allocates at are multiples of it */
    int32_t compute_units;    /* cores, compute units; 0: unknown */
    int32_t priority;         /* df_device_default picks the highest that opens (cpu: 0) */
} df_device_info;

/* What a device has done since it was opened (device_counters). A kernel is counted as
 * dispatched each time it runs, and as recorded only when the host built it (a replayed
 * graph's kernels are dispatched again, not recorded again). A submit is one hand-over of
 * work to the device: a batch of commands (Vulkan), or one kernel or one graph queued on a
 * stream (a device without batches). */
typedef struct df_dev_counters {
    int64_t dispatches;
    int64_t dispatches_recorded;
    int64_t submits;
    int64_t graph_launches;
} df_dev_counters;

/* Stream kinds (stream_create). A device may run both on one queue. */
enum { DF_STREAM_COMPUTE = 0, DF_STREAM_COPY = 1 };

/* What the host offers a backend. Messages: a failing entry returns the status that
 * errorf returns, having written the message once (as every function of the library). */
typedef struct df_host_api {
    int abi_version;
    df_status (*errorf)(df_status s, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));
    void (*logf)(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
    const char *(*error_message)(void); /* the calling thread's last message */
    void *(*aligned_alloc)(size_t bytes); /* 64-byte aligned host memory, or NULL */
    void (*aligned_free)(void *p);
} df_host_api;

typedef struct df_device_ops {
    int abi_version;          /* DF_DEVICE_ABI_VERSION the backend was built for */
    size_t struct_size;       /* sizeof(df_device_ops) the backend was built with */
    const char *name;         /* "cpu", "sim", "vulkan": the NAME of --device NAME[:N] */

    /* -- Devices. `dev` below is what device_open returned. */
    int (*device_count)(void);
    df_status (*device_info)(int index, df_device_info *out);
    /* options: "key=value,key=value" the backend reads (the CPU: threads=N, int8_group=N,
     * int8_path=NAME); unknown keys are ignored. */
    df_status (*device_open)(int index, const char *options, void **dev);
    void (*device_close)(void *dev);  /* every stream and buffer is already freed */

    /* -- Memory. */
    df_status (*buffer_alloc)(void *dev, uint64_t bytes, df_dev_buffer **out);
    void (*buffer_free)(void *dev, df_dev_buffer *buf); /* no stream uses it any more */
    /* optional: a buffer over host memory [host, host + bytes) that kernels read in place
     * (DF_CAP_HOST_MEMORY: the CPU's "upload" of a mapped weight is the mapping itself).
     * The memory stays the caller's; buffer_free releases only the handle and whatever was
     * derived from it. NULL or DF_E_UNSUPPORTED: the runtime allocates and copies. */
    df_status (*buffer_wrap_host)(void *dev, void *host, uint64_t bytes, df_dev_buffer **out);
    /* optional: the host address of a buffer's byte 0 when the host may touch it directly
     * (after the stream has reached its last use), else NULL. */
    void *(*buffer_host_ptr)(void *dev, df_dev_buffer *buf);
    /* optional: queues, on s, dropping the forms derived from the buffer (offload of a
     * wrapped weight): after the work queued before it; the next launch derives them
     * again. Default: nothing to drop. */
    df_status (*buffer_drop_cache)(df_dev_stream *s, df_dev_buffer *buf);

    /* -- Streams and events. */
    df_status (*stream_create)(void *dev, int kind, df_dev_stream **out);
    void (*stream_free)(df_dev_stream *s); /* waits for the stream's work first */
    /* Queues the node's kernel; returns at once. The backend copies what it keeps of *n. */
    df_status (*launch)(df_dev_stream *s, const df_node *n);
    /* optional (DF_CAP_FUSED): queues a fused program. */
    df_status (*launch_fused)(df_dev_stream *s, const df_fused *f);
    /* Copies, queued; asynchronous. copy_h2d reads src, and copy_d2h writes dst, by the
     * time the stream reaches the position after the copy: the host keeps src unchanged
     * (and does not read dst) until then. */
    df_status (*copy_h2d)(df_dev_stream *s, df_dev_buffer *dst, uint64_t offset,
                          const void *src, uint64_t bytes);
    df_status (*copy_d2h)(df_dev_stream *s, void *dst, df_dev_buffer *src, uint64_t offset,
                          uint64_t bytes);
    df_status (*copy_d2d)(df_dev_stream *s, df_dev_buffer *dst, uint64_t dst_offset,
                          df_dev_buffer *src, uint64_t src_offset, uint64_t bytes);
    /* Queues fn(arg, status) to run once everything queued before it is done, on a thread
     * of the backend's choosing, with the stream's status so far. For bookkeeping only: fn
     * must not call this interface. It always runs, even on a failed stream. */
    df_status (*host_callback)(df_dev_stream *s, void (*fn)(void *arg, df_status st),
                               void *arg);
    /* The position after everything queued so far (monotonic per stream; 0 is reached). */
    uint64_t (*stream_record)(df_dev_stream *s);
    /* Whether s has finished everything before `at`; with wait, waits until it has. */
    bool (*stream_reached)(df_dev_stream *s, uint64_t at, bool wait);
    /* Later work on s starts only after `other` has reached `at`. */
    df_status (*stream_wait)(df_dev_stream *s, df_dev_stream *other, uint64_t at);
    /* Waits for all queued work; returns the stream's first failure (sticky), with its
     * message, until stream_reset. Work queued after a failure is skipped (its host
     * callbacks still run). */
    df_status (*stream_sync)(df_dev_stream *s);
    void (*stream_reset)(df_dev_stream *s);
    /* optional: waits until at most `depth` queued items are unfinished (bounds how far
     * the host runs ahead). Default: no bound. */
    void (*stream_throttle)(df_dev_stream *s, size_t depth);

    /* -- What the device computes. */
    /* optional: whether launch can run this node (op, dtypes, layout). Default: every op
     * below DF_OP_COUNT. Asked once per node before it is launched or planned. */
    bool (*supports)(void *dev, const df_node *n);
    /* optional: the dtype matrix products compute in when `requested` is asked for (bf16
     * falls back to f32 where the device has no bf16 products). Default: as requested. */
    df_dtype (*matmul_dtype)(void *dev, df_dtype requested);

    /* -- Collectives (DF_CAP_COLLECTIVES; optional). Without them the runtime stages
     * through the host: d2h, the host communicator, h2d. */
    df_status (*comm_create)(void *dev, const df_host_comm *host, df_dev_comm **out);
    void (*comm_free)(df_dev_comm *c);
    /* Queued on s in stream order; every rank queues the same collectives in order. */
    df_status (*collective)(df_dev_stream *s, df_dev_comm *c, const df_coll *op);

    /* -- Counters (optional): what the device did since it was opened. */
    void (*device_counters)(void *dev, df_dev_counters *out);

    /* -- Recorded graphs (optional: all four or none), as CUDA graphs are. Between
     * capture_begin and capture_end, the launches, fused launches and device-to-device
     * copies queued on s run as usual and are also recorded; capture_end returns them as
     * a graph, and graph_launch queues the same work again on a stream, with the same
     * buffers and offsets, without the host building it again (one submit). The caller
     * keeps every buffer a graph uses alive and at its place (replay reads what is there
     * when it runs). A host copy or a wait on the host inside a capture cannot be replayed:
     * the work still runs, and capture_end then returns DF_E_UNSUPPORTED naming why. */
    df_status (*capture_begin)(df_dev_stream *s);
    df_status (*capture_end)(df_dev_stream *s, df_dev_graph **out);
    df_status (*graph_launch)(df_dev_stream *s, df_dev_graph *g);
    void (*graph_free)(void *dev, df_dev_graph *g); /* no stream uses it any more */

    /* -- optional: how fast this device multiplies matrices in f32 and in bf16, in GFLOP/s
     * (*bf16 = 0: no bf16 products), for --dtype auto, which picks bf16 only where it is
     * clearly faster. `how` (cap bytes) gets a few words on where the numbers come from
     * ("measured now", "cached in FILE"). A device may measure the first time it is asked
     * and keep the answer. Default: the device does not say (auto stays with f32). */
    df_status (*matmul_rates)(void *dev, double *f32, double *bf16, char *how, size_t cap);
} df_device_ops;

/* The symbol a plugin library exports. Returns its table, or NULL (having written the
 * reason with host->errorf) when it cannot run here or was built for another ABI. */
#define DF_DEVICE_PLUGIN_ENTRY "df_device_plugin"
typedef const df_device_ops *(*df_device_plugin_fn)(const df_host_api *host, int abi_version);

#endif
