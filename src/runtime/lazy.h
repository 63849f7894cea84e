/* Defer-and-fuse mode (lazy.c): records nodes into a pending graph. */
#ifndef DF_RUNTIME_LAZY_H
#define DF_RUNTIME_LAZY_H

#include "runtime/runtime.h"

/* Switches the context's executor to defer-and-fuse. */
df_status df_lazy_attach(df_ctx *ctx);
/*
 * Graph planning, shared with compiled mode: liveness (a node is needed when a handle
 * sees its output or a needed node reads it), fusion (pointwise chains, activations into
 * matrix products, RMS norm with RoPE, concats written in place, bf16 operands written in
 * bf16) as far as the backend's kernels allow, and the arena layout of intermediates. A
 * plan depends only on the graph's structure, so it can be applied to any graph with the
 * same structure.
 */
typedef struct lz_program lz_program;
lz_program *df_graph_plan_make(df_node *const *nodes, int n, const df_backend_ops *ops);
/* Allocates, then queues the kernels of nodes[0..n) as planned; takes the nodes. */
df_status df_graph_execute(df_ctx *ctx, df_node **nodes, int n, const lz_program *p);
void df_graph_plan_free(lz_program *p);
int64_t df_graph_plan_arena(const lz_program *p);
int df_graph_plan_kernels(const lz_program *p);

/* Nodes recorded and not yet run (0 in strict eager). */
int64_t df_lazy_pending(const df_ctx *ctx);

#endif
