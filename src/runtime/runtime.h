/*
 * Internal view of contexts and tensor handles, shared by the runtime's files and the
 * execution modes.
 */
#ifndef DF_RUNTIME_H
#define DF_RUNTIME_H

#include <diffuse/ops.h>
#include <diffuse/runtime.h>

#include "backend/graph.h"
#include "core/clock.h"

struct df_tensor {
    df_gview v;      /* holds one reference on v.st */
    df_ctx *ctx;
    int64_t slot;   /* index in ctx->live; -1 when persistent (owned by the caller) */
};

/* Strict eager: launches tracked for the bound on queued output bytes (eager.c). */
#define DF_EAGER_QUEUE 64

/* The hooks an execution mode provides. Strict eager is the default set. */
typedef struct df_executor {
    /* Takes ownership of the node (its storages are already retained). */
    df_status (*submit)(df_ctx *ctx, df_gnode *node);
    /* Runs everything pending so that storages are produced (not necessarily finished). */
    df_status (*flush)(df_ctx *ctx);
    /* Called when a tensor handle is released (lazy modes track liveness). */
    void (*handle_released)(df_ctx *ctx, df_storage *st);
    void (*destroy)(df_ctx *ctx);
} df_executor;

struct df_ctx {
    df_device *dev;
    df_dev_stream *stream;
    df_dev_stream *copy_stream; /* weight uploads (residency.c); made when first needed */
    uint64_t copy_waited;   /* the copy stream position the compute stream waits for */
    uint64_t evicted_at;    /* the compute position after the last weight eviction */
    int threads;            /* compute threads (df_ctx_threads) */
    df_dtype compute;
    int int8_group;     /* df_ctx_opts.int8_group, which the device quantizes weights with */
    int int8_keep;      /* int8 compute: 1 keep the transformer's embedders and outputs in
                           precision, -1 quantize them too, 0 DIFFUSE_INT8_KEEP decides */
    int int8_attention; /* under int8 compute: 1 int8 attention scores, -1 f32
                           attention, 0 as DIFFUSE_INT8_ATTENTION says (on unless 0 / off) */
    df_eager_mode mode;
    const df_executor *exec;
    void *exec_state;
    int64_t fuse_max_nodes;
    bool launch_blocking;   /* DIFFUSE_LAUNCH_BLOCKING=1: wait after every op */
    /* Strict eager: the launches not yet known to have run, oldest first (a ring), each
     * with the stream position after it and the bytes of the output it allocated; their
     * sum is bounded (eager.c). */
    struct { uint64_t at; size_t bytes; } queued[DF_EAGER_QUEUE];
    int queued_first, queued_n;
    size_t queued_bytes;
    /* The memory of planned graphs' intermediates (defer-and-fuse, compiled programs):
     * one arena that every graph reuses. Kernels run in stream order, so a graph's kernels
     * start only after the previous graph's are done with it. */
    struct df_storage *arena;

    df_status status;       /* first failure, sticky */
    char status_msg[1024];

    df_tensor **live;       /* handles in creation order; scopes are ranges of it */
    int64_t n_live, cap_live;

    struct df_comm *comm;     /* tensor parallelism: the ranks this context works with */
    df_dev_comm *dev_comm;    /* the device's communicator over `comm` (made when first used) */
    struct df_comm *dev_comm_of;
    const df_tensor *reading; /* the tensor df_tensor_read is waiting for (for messages) */
    struct df_lora_set *lora; /* adapters merged into weights as they bind (models/lora.h) */

    bool profiling;
    _Atomic int64_t prof_ns[DF_OP_COUNT + 1]; /* per op kind; the last slot: fused kernels */
    _Atomic int64_t prof_calls[DF_OP_COUNT + 1];

    df_stats stats;
    int64_t allocated_base; /* allocator total at the last df_stats_reset */
    int64_t uploaded_base, downloaded_base; /* the device's copy counters then */
    df_dev_counters counters_base;          /* the device's counters then */
    double step_clock;      /* time of the previous df_mark_step */
    double step_seconds;    /* summed wall time of steps after the first */
    int64_t steps_timed;
};

/* Returns the context's failure again as the thread's current error (for reporting). */
df_status df_ctx_raise(df_ctx *ctx);

/* A handle over view `v` (takes over one reference on v->st), registered in the
 * current scope. NULL (and the context failed) when out of memory. */
df_tensor *df_handle_new(df_ctx *ctx, const df_gview *v);

/* A weight [rows, k] over host bytes in a compact file format (GGUF blocks of ggml type
 * block_type, or fp8 times block_scale; see df_view.block_type): an I8 tensor whose
 * storage is the `bytes` at `data`, not int8 values. Only int8 products read it. */
df_tensor *df_tensor_wrap_blocks(df_ctx *ctx, int64_t rows, int64_t k, const void *data,
                                 size_t bytes, uint32_t block_type, float block_scale);

/* Builds a node's output (dense, n->out.dtype/ndim/shape already set), retains its inputs
 * and gives the node to the executor. Returns the output handle. */
df_tensor *df_emit(df_ctx *ctx, df_gnode *n);

/* Host data into a fresh storage (a copy in stream order where the host cannot address
 * the device); a dense view's bytes out to the host, once the stream has made them (the
 * caller has flushed and synced what produces them). */
df_status df_upload(df_ctx *ctx, df_storage *st, const void *data);
df_status df_download(df_ctx *ctx, const df_gview *v, void *dst, size_t bytes);

/* Residency of weights on devices that cannot read host memory in place (residency.c):
 * restore uploads the host form on the copy stream, evict gives the device form back in
 * stream order, ready makes the compute stream wait for a weight's upload (restoring it
 * first when it was evicted) before a kernel that reads it. No-ops on the CPU. */
df_status df_residency_restore(df_ctx *ctx, df_storage *st);
df_status df_residency_evict(df_ctx *ctx, df_storage *st);
/* The offload hint, decided here from how a weight comes and goes (every device, the CPU
 * included): acquire and release are the models' calls (weight.h), `part` when
 * they name a part of a model (a block, its outer weights) rather than all of it. A weight
 * released before it was ever acquired (sequential offload releases everything up front),
 * or a part released within the step it was acquired in, is transient: resident for one
 * pass, so kernels use it in place (DF_VIEW_STREAMED) instead of deriving a packed form
 * that the next release would drop. Acquiring a whole model makes it resident for good. */
void df_residency_note_acquire(df_ctx *ctx, df_weight *w, bool part);
void df_residency_note_release(df_ctx *ctx, df_weight *w, bool part);
df_status df_residency_ready(df_ctx *ctx, df_storage *st);

/* Strict eager (df_exec_eager); df_eager_submit queues one node of a planned graph on the
 * stream (strict eager's own ops go through the executor, which also bounds the queued
 * bytes). */
extern const df_executor df_exec_eager;
df_status df_eager_submit(df_ctx *ctx, df_gnode *node);
/* Releases the references a node holds and frees it. */
void df_node_free(df_gnode *n);
/* Calls launch(ctx, arg), timed into profile slot `slot` when profiling. */
df_status df_launch_timed(df_ctx *ctx, int slot, df_status (*launch)(df_ctx *, const void *),
                          const void *arg);

/* Adds one kernel's time to the context's profile (called on the stream thread). */
void df_profile_add(df_ctx *ctx, int slot, double seconds);

/* The compute dtype an attention op records: the context's, except f32 under int8 compute
 * when int8 attention is off (ctx->int8_attention, else DIFFUSE_INT8_ATTENTION). */
df_dtype df_ctx_attention_compute(const df_ctx *ctx);

#endif
