/* Graph planning and running a planned graph (graph_plan.c), shared by defer-and-fuse and
 * compiled mode. */
#ifndef DF_RUNTIME_GRAPH_PLAN_H
#define DF_RUNTIME_GRAPH_PLAN_H

#include "runtime/runtime.h"

/*
 * A plan for a graph of nodes: liveness (a node is needed when a handle sees its output or
 * a needed node reads it), fusion (pointwise chains, activations and gated residuals into
 * matrix products, RMS norm with RoPE, concats written in place, bf16 operands written in
 * bf16) as far as the backend's kernels allow, and the arena layout of intermediates. A
 * plan depends only on the graph's structure, so it can be applied to any graph with the
 * same structure.
 */
typedef struct lz_program lz_program;

/* Appends node to a recorded graph (*nodes holds *n of *cap), numbering it and making it its
 * output's producer. Returns false, changing nothing, when memory runs out. */
bool df_graph_append(df_gnode ***nodes, int *n, int *cap, df_gnode *node);

lz_program *df_graph_plan_make(df_gnode *const *nodes, int n, const df_device *dev);
/* Allocates, then queues the kernels of nodes[0..n) as planned; takes the nodes. */
df_status df_graph_execute(df_ctx *ctx, df_gnode **nodes, int n, const lz_program *p);
int64_t df_graph_plan_arena(const lz_program *p);
int df_graph_plan_kernels(const lz_program *p);
void df_graph_plan_free(lz_program *p);

/* The hash of a graph's structure: the key plans are cached under. */
uint64_t df_graph_key(df_gnode *const *nodes, int n);
/* A cache of plans (a list; NULL when empty). The plan for nodes from *cache, or a new
 * one added to it (*hit tells which); NULL when out of memory. */
lz_program *df_graph_plan_cached(lz_program **cache, df_gnode *const *nodes, int n,
                                 const df_device *dev, bool *hit);
void df_graph_cache_free(lz_program *cache);

#endif
