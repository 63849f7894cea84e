/*
 * Defer-and-fuse mode: ops are recorded into a pending graph and run at sync points.
 *
 * A graph is cut at a host read, df_sync(), df_mark_step() or when it reaches
 * ctx->fuse_max_nodes nodes. It is then planned (graph_plan.c: liveness, fusion, one
 * arena) or its plan is found in the context's cache of plans by the graph's structure,
 * and its kernels are queued as planned.
 */
#include <stdlib.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/graph_plan.h"
#include "runtime/lazy.h"

typedef struct lz_state {
    df_gnode **nodes;
    int n, cap;
    lz_program *cache;
} lz_state;

static df_status lazy_flush(df_ctx *ctx)
{
    lz_state *z = ctx->exec_state;
    if (!z || z->n == 0)
        return DF_OK;
    int n = z->n;
    df_gnode **nodes = z->nodes;
    z->nodes = NULL;
    z->n = z->cap = 0;
    ctx->stats.graphs_built++;
    double t0 = df_now();
    bool hit;
    lz_program *p = df_graph_plan_cached(&z->cache, nodes, n, ctx->dev, &hit);
    if (hit) {
        ctx->stats.cache_hits++;
    } else {
        ctx->stats.compile_ms += (df_now() - t0) * 1e3;
        ctx->stats.cache_misses++;
        ctx->stats.graphs_compiled++;
    }
    if (!p) {
        for (int i = 0; i < n; i++) {
            nodes[i]->out.st->producer = NULL; /* never computed */
            df_node_free(nodes[i]);
        }
        df_free(nodes);
        return df_errorf(DF_E_OOM, "out of memory planning a graph of %d ops", n);
    }
    if (df_graph_plan_arena(p) > ctx->stats.arena_bytes)
        ctx->stats.arena_bytes = df_graph_plan_arena(p);
    df_status s = df_graph_execute(ctx, nodes, n, p);
    df_free(nodes);
    return s;
}

static df_status lazy_submit(df_ctx *ctx, df_gnode *node)
{
    lz_state *z = ctx->exec_state;
    if (node->op != DF_OP_ALL_REDUCE && !df_dev_has_op(ctx->dev, node->op)) {
        df_status s = df_errorf(DF_E_UNSUPPORTED, "op '%s' is not supported on %s",
                                df_op_name(node->op), ctx->dev->name);
        df_node_free(node);
        return s;
    }
    /* Cut before adding: the new node's handle does not exist yet, so it must not be
     * judged dead by the flush. */
    if (z->n >= ctx->fuse_max_nodes) {
        df_status s = lazy_flush(ctx);
        if (s != DF_OK) {
            df_node_free(node);
            return s;
        }
    }
    if (!df_graph_append(&z->nodes, &z->n, &z->cap, node)) {
        const char *op = df_op_name(node->op);
        df_node_free(node);
        return df_errorf(DF_E_OOM, "out of memory recording op '%s'", op);
    }
    return DF_OK;
}

static void lazy_destroy(df_ctx *ctx)
{
    lz_state *z = ctx->exec_state;
    if (!z)
        return;
    for (int i = 0; i < z->n; i++)
        df_node_free(z->nodes[i]);
    df_free(z->nodes);
    df_graph_cache_free(z->cache);
    df_free(z);
    ctx->exec_state = NULL;
}

static const df_executor exec_lazy = {
    .submit = lazy_submit,
    .flush = lazy_flush,
    .destroy = lazy_destroy,
};

df_status df_lazy_attach(df_ctx *ctx)
{
    lz_state *z = df_calloc(1, sizeof *z);
    if (!z)
        return df_errorf(DF_E_OOM, "out of memory");
    ctx->exec_state = z;
    ctx->exec = &exec_lazy;
    return DF_OK;
}

df_status df_lazy_cut(df_ctx *ctx)
{
    return ctx->exec == &exec_lazy ? lazy_flush(ctx) : DF_OK;
}

int64_t df_lazy_pending(const df_ctx *ctx)
{
    const lz_state *z = ctx->mode == DF_DEFER_AND_FUSE ? ctx->exec_state : NULL;
    return z ? z->n : 0;
}
