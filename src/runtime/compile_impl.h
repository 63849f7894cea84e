/* What a compiled program holds: compile.c traces a module's forward and turns it into a
 * program (a template, its constants, its plan), compile_replay.c runs a program over a
 * call's inputs, node by node or as a recorded graph. Private to those two files. */
#ifndef DF_RUNTIME_COMPILE_IMPL_H
#define DF_RUNTIME_COMPILE_IMPL_H

#include <diffuse/compile.h>

#include "runtime/graph_plan.h"
#include "runtime/runtime.h"

enum { R_NONE, R_CONST, R_INPUT, R_WEIGHT, R_NODE };

typedef struct ref {
    int kind;
    int index;
} ref;

typedef struct tnode {
    df_gnode tmpl; /* storages cleared; see refs */
    ref in[DF_NODE_MAX_IN];
} tnode;

typedef struct signature {
    int n;
    df_dtype attention; /* the attention ops' compute (df_ctx_attention_compute): a run may
                           turn int8 attention off, which a trace records */
    df_gview v[DF_MODULE_MAX_IO + DF_MODULE_MAX_WEIGHTS]; /* st == NULL: absent input */
} signature;

/* A storage a recorded graph reads (a weight or a constant) and where it was then. */
typedef struct bound {
    df_storage *st; /* retained */
    df_dev_buffer *buf;
    uint64_t offset;
} bound;

/* Where an output is after a run: its slot, or where the plan put it (a concat's part). */
typedef struct placed_out {
    df_dev_buffer *buf;
    uint64_t offset;
} placed_out;

typedef struct capture {
    struct capture *next;
    df_dev_graph *g;
    int n;
    bound *b;
    placed_out out[DF_MODULE_MAX_IO];
} capture;

typedef struct program {
    struct program *next;
    signature sig;
    bool not_traceable; /* fullgraph off and the forward syncs: run it under fuse */
    int n;
    tnode *nodes;
    df_storage **consts;
    int n_consts;
    int n_out;
    ref out_ref[DF_MODULE_MAX_IO];
    df_gview out_view[DF_MODULE_MAX_IO];
    lz_program *plan;
    /* Replay by recorded graphs: the program's own memory (arena, slots), so that every
     * address the graph uses stays put; [in_lo, in_hi) are the bytes of each input that
     * the program reads (in_hi == 0: none), copied into its slot at each call. */
    bool no_capture;       /* the device could not record it (or has no graphs) */
    bool io_known;         /* in_lo, in_hi, w_used computed */
    df_ctx *ctx;           /* whose stream the graphs run on */
    df_storage *arena;
    uint64_t in_lo[DF_MODULE_MAX_IO], in_hi[DF_MODULE_MAX_IO]; /* in_hi == 0: unread */
    bool w_used[DF_MODULE_MAX_WEIGHTS];
    df_storage *out_slot[DF_MODULE_MAX_IO];
    df_storage *in_slot[DF_MODULE_MAX_IO];
    capture *captures;
} program;

/* A call's inputs and weights, as the module gave them. */
typedef struct binding {
    int n_in, n_w;
    df_tensor *const *in;
    df_tensor **w;
} binding;

/* Runs p over the call's inputs and weights into out (p->n_out handles): by its recorded
 * graph where the device keeps one, else node by node with p's plan (made at the first). */
df_status df_compile_replay(df_ctx *ctx, program *p, const binding *b, df_tensor **out);
/* Frees what replay by recorded graphs kept (after the stream has passed its last use). */
void df_compile_free_captures(program *p);

#endif
