/* What a plan holds (graph_plan.c makes plans, graph_run.c runs them): private to those
 * two files. */
#ifndef DF_RUNTIME_GRAPH_PLAN_IMPL_H
#define DF_RUNTIME_GRAPH_PLAN_IMPL_H

#include "runtime/graph_plan.h"

typedef struct lz_group {
    int root, head, n_members;
    int n_in;
    struct { int node, slot; } in[DF_FUSED_MAX_IN];
    int n_insn;
    df_fused_insn insn[DF_FUSED_MAX_INSN];
    int insn_node[DF_FUSED_MAX_INSN]; /* node whose float attributes an insn takes */
    int n_regs, out_reg;
} lz_group;

/* K_FOLDED: an activation computed by the matrix product that feeds it (epilogue).
 * K_ELIDED: a node whose output others write in place (a concat whose parts are written
 * straight into it, a rope whose input is normalised and rotated in one pass): it has
 * memory but no kernel. */
enum { K_DEAD, K_SINGLE, K_MEMBER, K_ROOT, K_FOLDED, K_ELIDED };

/* What a plan says about one node. */
typedef struct lz_node {
    uint8_t kind;       /* K_* */
    uint8_t epi_slots;  /* LINEAR with a gated residual: the mul's gate slot (bit 0) and the
                           add's residual slot (bit 1) */
    bool half;          /* a result written in bf16, for the bf16 products reading it */
    int group;          /* K_ROOT: its index in groups; -1 otherwise */
    int root_of;        /* the root of the fused group it is part of, or -1 */
    int fold;           /* LINEAR: the activation node folded into it, or the add of its gated
                           residual epilogue; -1 when none */
    int gate_mul;       /* LINEAR: the mul of its gated residual epilogue, or -1 */
    int alias_of;       /* the elided concat its output is a part of, or -1 */
    int alias_split;    /* ... 0 for a contiguous part; else the first of the node's own
                           trailing dimensions that make up the part's columns */
    int rope_of;        /* RMS_NORM: the elided rope it writes (rms_norm_rope), or -1 */
    int64_t alias_off;  /* the part's byte offset in its concat (contiguous parts), or its
                           first column (parts of the concat's rows) */
    int64_t rope_s0;    /* RMS_NORM writing a rope: the first position of its part */
    int64_t offset;     /* arena offset, -1 = own buffer or not materialised */
} lz_node;

struct lz_program {
    struct lz_program *next; /* the next plan of a cache */
    uint64_t key;            /* df_graph_key of the graph it was made for */
    int n;
    lz_node *node;           /* per node of the graph */
    int64_t arena_bytes;
    lz_group *groups;
    int n_groups;
};

/* The node that produces view v in the graph being planned or run, or -1. */
static inline int producer_of(const df_gview *v)
{
    return v->st && v->st->producer && !v->st->buf ? v->st->producer->id : -1;
}

/* The GEMM post-op of an activation op, or DF_ACT_NONE. */
static inline int activation_of(df_op op)
{
    return df_vocab_act_of(op);
}

/* The node whose storage holds node i's result: the activation folded into a product. */
static inline int result_node(const lz_program *p, int i)
{
    return p->node[i].fold >= 0 ? p->node[i].fold : i;
}

#endif
