/*
 * Strict eager mode: every node is launched on the device stream as soon as it is made.
 *
 * The node is lowered to the device's form (buffers and byte offsets) and launched from
 * the host thread; a host callback queued after it drops the references the node held, so
 * memory returns to the caching allocator only once the stream has passed the kernel that
 * touches it. Nothing here waits, except with DIFFUSE_LAUNCH_BLOCKING=1 (debugging), which
 * syncs after every op so a failure points at the op that caused it.
 *
 * All-reduce nodes do not go to a kernel: the runtime queues the device's collective on
 * the communicator of the context, or stages the data through the host where the device
 * has no collectives.
 */
#include <string.h>

#include "core/alloc.h"
#include "core/comm.h"
#include "core/status.h"
#include "runtime/runtime.h"

/* Queue items a host may run ahead of the stream by: a launch and its release each. */
#define DF_MAX_QUEUED_ITEMS 64
/* Output bytes the launches queued behind the one running may hold (see bound_queued). */
#define DF_MAX_QUEUED_BYTES ((size_t)32 << 20)

void df_node_free(df_gnode *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n_in; i++)
        df_storage_release(n->in[i].st);
    df_storage_release(n->out.st);
    df_free(n);
}

static void release_node(void *arg, df_status s)
{
    df_gnode *n = arg;
    if (s != DF_OK && n->out.st)
        atomic_store(&n->out.st->write_failed, true); /* a read of it reports the failure */
    df_node_free(n);
}

/* Profiling: host callbacks on either side of a kernel time it (on the CPU they run on
 * the stream's thread, right before and after it). */
typedef struct prof_mark {
    df_ctx *ctx;
    int slot;
    double t0;
} prof_mark;

static void prof_begin(void *arg, df_status s)
{
    (void)s;
    ((prof_mark *)arg)->t0 = df_now();
}

static void prof_end(void *arg, df_status s)
{
    (void)s;
    prof_mark *m = arg;
    df_profile_add(m->ctx, m->slot, df_now() - m->t0);
    df_free(m);
}

df_status df_launch_timed(df_ctx *ctx, int slot, df_status (*launch)(df_ctx *, const void *),
                          const void *arg)
{
    prof_mark *m = ctx->profiling ? df_calloc(1, sizeof *m) : NULL;
    if (m) {
        *m = (prof_mark){.ctx = ctx, .slot = slot};
        if (df_dev_callback(ctx->dev, ctx->stream, prof_begin, m) != DF_OK) {
            df_free(m);
            m = NULL;
        }
    }
    df_status s = launch(ctx, arg);
    if (m && df_dev_callback(ctx->dev, ctx->stream, prof_end, m) != DF_OK) {
        df_dev_sync(ctx->dev, ctx->stream);
        df_free(m);
    }
    return s;
}

static df_status launch_node(df_ctx *ctx, const void *arg)
{
    return df_dev_launch(ctx->dev, ctx->stream, (const df_node *)arg);
}

/* A host communicator over the context's df_comm, for the device's comm_create. */
static df_status hc_all_reduce(void *self, float *buf, int64_t n)
{
    df_comm *c = self;
    return c->ops->all_reduce_f32(c, buf, n);
}

static df_status hc_all_gather(void *self, const void *send, void *recv, size_t bytes)
{
    df_comm *c = self;
    return c->ops->all_gather(c, send, recv, bytes);
}

static df_status hc_broadcast(void *self, void *buf, size_t bytes, int root)
{
    df_comm *c = self;
    return c->ops->broadcast(c, buf, bytes, root);
}

static df_status hc_barrier(void *self)
{
    df_comm *c = self;
    return c->ops->barrier(c);
}

/* in -> out (a copy on the device when they differ), then the sum over the ranks. */
static df_status all_reduce(df_ctx *ctx, const df_gnode *g, const df_node *n)
{
    df_comm *comm = g->comm;
    uint64_t bytes = (uint64_t)df_gview_numel(&g->out) * sizeof(float);
    if (n->in[0].buf != n->out.buf || n->in[0].offset != n->out.offset)
        DF_TRY(df_dev_copy_d2d(ctx->dev, ctx->stream, n->out.buf, n->out.offset, n->in[0].buf,
                               n->in[0].offset, bytes));
    if (!comm || comm->size == 1 || bytes == 0)
        return DF_OK;
    df_coll op = {.kind = DF_COLL_ALL_REDUCE_SUM, .buf = n->out.buf, .offset = n->out.offset,
                  .count = (int64_t)(bytes / sizeof(float)), .dtype = DF_DTYPE_F32};
    const df_device_ops *ops = ctx->dev->ops;
    if (ops->collective && ops->comm_create) {
        if (!ctx->dev_comm || ctx->dev_comm_of != comm) {
            if (ctx->dev_comm)
                ops->comm_free(ctx->dev_comm);
            ctx->dev_comm = NULL;
            df_host_comm h = {.rank = comm->rank, .size = comm->size, .self = comm,
                              .all_reduce_f32 = hc_all_reduce, .all_gather = hc_all_gather,
                              .broadcast = hc_broadcast, .barrier = hc_barrier};
            DF_TRY(ops->comm_create(ctx->dev->impl, &h, &ctx->dev_comm));
            ctx->dev_comm_of = comm;
        }
        return ops->collective(ctx->stream, ctx->dev_comm, &op);
    }
    /* Host-staged: down, summed on the host, up again. */
    float *tmp = df_malloc((size_t)bytes);
    if (!tmp)
        return df_errorf(DF_E_OOM, "all_reduce: out of memory staging %llu bytes",
                         (unsigned long long)bytes);
    df_status s = df_dev_copy_d2h(ctx->dev, ctx->stream, tmp, op.buf, op.offset, bytes);
    if (s == DF_OK)
        s = df_dev_sync(ctx->dev, ctx->stream);
    if (s == DF_OK)
        s = comm->ops->all_reduce_f32(comm, tmp, op.count);
    if (s == DF_OK)
        s = df_dev_copy_h2d(ctx->dev, ctx->stream, op.buf, op.offset, tmp, bytes);
    if (s == DF_OK)
        s = df_dev_sync(ctx->dev, ctx->stream);
    df_free(tmp);
    return s;
}

/* all_reduce under df_launch_timed, so that profiling counts the exchange (and the wait
 * for the slower rank) as the op's time. */
typedef struct reduce_arg {
    const df_gnode *g;
    const df_node *n;
} reduce_arg;

static df_status launch_reduce(df_ctx *ctx, const void *arg)
{
    const reduce_arg *r = arg;
    return all_reduce(ctx, r->g, r->n);
}

static void queued_pop(df_ctx *ctx)
{
    ctx->queued_bytes -= ctx->queued[ctx->queued_first].bytes;
    ctx->queued_first = (ctx->queued_first + 1) % DF_EAGER_QUEUE;
    ctx->queued_n--;
}

/* Outputs are allocated when an op is queued, and the inputs it reads last are released
 * only once it has run, so a host far ahead of the stream holds the memory of every queued
 * op at once: with large activations (a FLUX block at 1024x1024 has dozens of 50-200 MB
 * tensors) that is most of a block's working set however early the model code lets go of
 * its tensors. So beyond the item count, the host waits while the launches queued before
 * the newest one (`at`, `bytes`) hold more than DF_MAX_QUEUED_BYTES of outputs: large ops
 * then run one behind the host (the next is prepared while one runs), small ones still
 * run far ahead. */
static void bound_queued(df_ctx *ctx, uint64_t at, size_t bytes)
{
    while (ctx->queued_n > 0 &&
           df_dev_reached(ctx->dev, ctx->stream, ctx->queued[ctx->queued_first].at, false))
        queued_pop(ctx);
    if (ctx->queued_n == DF_EAGER_QUEUE) {
        df_dev_reached(ctx->dev, ctx->stream, ctx->queued[ctx->queued_first].at, true);
        queued_pop(ctx);
    }
    while (ctx->queued_n > 0 && ctx->queued_bytes > DF_MAX_QUEUED_BYTES) {
        df_dev_reached(ctx->dev, ctx->stream, ctx->queued[ctx->queued_first].at, true);
        queued_pop(ctx);
    }
    int last = (ctx->queued_first + ctx->queued_n++) % DF_EAGER_QUEUE;
    ctx->queued[last].at = at;
    ctx->queued[last].bytes = bytes;
    ctx->queued_bytes += bytes;
}

/* Queues node's kernel; `bound`: an op of strict eager itself (not one of a planned graph's,
 * whose memory the plan lays out and whose launches a device may be capturing), held to the
 * queued-bytes bound. */
static df_status submit(df_ctx *ctx, df_gnode *node, bool bound)
{
    df_status s = df_storage_materialize(node->out.st);
    for (int i = 0; s == DF_OK && i < node->n_in; i++)
        s = df_residency_ready(ctx, node->in[i].st);
    if (s != DF_OK) {
        df_node_free(node);
        return s;
    }
    df_node n;
    df_gnode_lower(node, &n);
    if (node->op == DF_OP_ALL_REDUCE) {
        s = df_launch_timed(ctx, node->op, launch_reduce, &(reduce_arg){node, &n});
    } else if (!df_dev_supports(ctx->dev, &n)) {
        s = df_errorf(DF_E_UNSUPPORTED, "op '%s' is not supported on %s", df_op_name(node->op),
                      ctx->dev->name);
    } else {
        s = df_launch_timed(ctx, node->op, launch_node, &n);
    }
    df_storage *out = node->out.st; /* alive after the release: the handle holds it */
    if (s == DF_OK)
        s = df_dev_callback(ctx->dev, ctx->stream, release_node, node);
    bool strict = ctx->exec == &df_exec_eager;
    uint64_t at = s == DF_OK && strict ? df_dev_record(ctx->dev, ctx->stream) : 0;
    if (s == DF_OK && strict && !out->base && !out->external)
        out->written_at = at; /* what a read waits for */
    if (s != DF_OK) {
        /* Work already queued may still read the node's storages. */
        df_dev_sync(ctx->dev, ctx->stream);
        df_node_free(node);
        return s;
    }
    ctx->stats.ops_enqueued++;
    if (ctx->launch_blocking)
        return df_dev_sync(ctx->dev, ctx->stream);
    /* Outputs are allocated when an op is queued, so a host far ahead of the stream would
     * hold every queued op's memory at once. Like a GPU driver's launch queue, the queue
     * has a bounded depth: past it the host waits for the oldest work to finish; strict
     * eager's own ops also past a number of queued bytes. */
    df_dev_throttle(ctx->dev, ctx->stream, DF_MAX_QUEUED_ITEMS);
    if (bound && strict)
        bound_queued(ctx, at, out->base || out->external ? 0 : out->bytes);
    return DF_OK;
}

df_status df_eager_submit(df_ctx *ctx, df_gnode *node)
{
    return submit(ctx, node, false);
}

static df_status eager_submit(df_ctx *ctx, df_gnode *node)
{
    return submit(ctx, node, true);
}

static df_status eager_flush(df_ctx *ctx)
{
    (void)ctx;
    return DF_OK;
}

const df_executor df_exec_eager = {
    .submit = eager_submit,
    .flush = eager_flush,
};
