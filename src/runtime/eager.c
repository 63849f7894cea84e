/*
 * Strict eager mode: every node is queued on the device stream as soon as it is made.
 *
 * The node travels with its storages retained; the stream thread runs the backend's
 * kernel and then drops the references, so memory is recycled only after the last kernel
 * that touches it. Nothing here waits, except with DIFFUSE_LAUNCH_BLOCKING=1 (debugging),
 * which syncs after every op so a failure points at the op that caused it.
 */
#include "core/alloc.h"
#include "core/status.h"
#include "runtime/runtime.h"

#define DF_MAX_QUEUED_OPS 32

void df_node_free(df_node *n)
{
    if (!n)
        return;
    for (int i = 0; i < n->n_in; i++)
        df_storage_release(n->in[i].st);
    df_storage_release(n->out.st);
    df_free(n);
}

typedef struct eager_item {
    df_node *node;
    df_kernel_fn kernel;
    df_ctx *profile; /* set when profiling */
} eager_item;

static df_status run_node(void *arg, df_kernel_env *env)
{
    eager_item *it = arg;
    if (!it->profile)
        return it->kernel(it->node, env);
    double t0 = df_now();
    df_status s = it->kernel(it->node, env);
    df_profile_add(it->profile, it->node->op, df_now() - t0);
    return s;
}

static void done_node(void *arg, df_status s)
{
    eager_item *it = arg;
    if (s != DF_OK)
        df_error_context(s, "op '%s'", df_op_name(it->node->op));
    df_node_free(it->node);
    df_free(it);
}

df_status df_eager_submit(df_ctx *ctx, df_node *node)
{
    df_kernel_fn k = ctx->dev->ops->kernels[node->op];
    if (!k) {
        df_status s = df_errorf(DF_E_UNSUPPORTED, "op '%s' is not supported on %s",
                                df_op_name(node->op), ctx->dev->name);
        df_node_free(node);
        return s;
    }
    df_status s = df_storage_materialize(node->out.st);
    eager_item *it = s == DF_OK ? df_malloc(sizeof *it) : NULL;
    if (!it) {
        if (s == DF_OK)
            s = df_errorf(DF_E_OOM, "out of memory queuing op '%s'", df_op_name(node->op));
        df_node_free(node);
        return s;
    }
    it->node = node;
    it->kernel = k;
    it->profile = ctx->profiling ? ctx : NULL;
    s = ctx->dev->ops->stream_submit(ctx->stream,
                                     &(df_work){.run = run_node, .done = done_node, .arg = it});
    if (s != DF_OK) {
        df_node_free(node);
        df_free(it);
        return s;
    }
    ctx->stats.ops_enqueued++;
    if (ctx->launch_blocking)
        return ctx->dev->ops->stream_sync(ctx->stream);
    /* Outputs are allocated when an op is queued, so a host far ahead of the stream would
     * hold every queued op's memory at once. Like a GPU driver's launch queue, the queue
     * has a bounded depth: past it the host waits for the oldest work to finish. */
    if (ctx->dev->ops->stream_throttle)
        ctx->dev->ops->stream_throttle(ctx->stream, DF_MAX_QUEUED_OPS);
    return DF_OK;
}

static df_status eager_flush(df_ctx *ctx)
{
    (void)ctx;
    return DF_OK;
}

const df_executor df_exec_eager = {
    .submit = df_eager_submit,
    .flush = eager_flush,
};
