/*
 * Running a planned graph (the plan from graph_plan.c): the arena, the rewrites the plan
 * asks for, then the kernels in order.
 *
 * - The arena is the context's, reused by every graph and grown when a plan needs more:
 *   graphs run in stream order, so the next graph's kernels start only after the previous
 *   graph's are done with it, however far ahead the host has queued them.
 * - Before memory is handed out, the nodes are rewritten as planned: bf16 results change
 *   their views' dtype; a product takes its folded activation's output (and the gate and
 *   residual of a gated residual epilogue); an rms_norm becomes rms_norm_rope writing its
 *   rows of the rope's output; a concat's producers write into the concat's memory, at an
 *   offset or as columns.
 * - Fused groups run as one df_fused kernel; other nodes go to the stream one by one;
 *   elided nodes (a rope or concat others write) and dead ones are freed unrun.
 */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/graph_plan_impl.h"

/* A fused group's nodes, released once its kernel has run. */
typedef struct fused_owned {
    df_gnode **nodes;
    int n;
} fused_owned;

static void release_fused(void *arg, df_status s)
{
    (void)s;
    fused_owned *o = arg;
    for (int i = 0; i < o->n; i++)
        df_node_free(o->nodes[i]);
    df_free(o->nodes);
    df_free(o);
}

static void release_storage(void *arg, df_status s)
{
    (void)s;
    df_storage_release(arg);
}

/* The context's arena, grown to at least `bytes`. A smaller one is released after the work
 * already queued (which may still use it); the new one is rounded up to 1 MiB so that
 * graphs of slightly different sizes do not each grow it. */
static df_status arena_for(df_ctx *ctx, int64_t bytes, df_storage **out)
{
    if (ctx->arena && (int64_t)ctx->arena->bytes >= bytes) {
        *out = ctx->arena;
        return DF_OK;
    }
    df_storage *old = ctx->arena;
    ctx->arena = NULL;
    if (old && df_dev_callback(ctx->dev, ctx->stream, release_storage, old) != DF_OK) {
        df_dev_sync(ctx->dev, ctx->stream);
        df_storage_release(old);
    }
    int64_t mib = 1 << 20;
    DF_TRY(df_storage_alloc(ctx->dev, (size_t)((bytes + mib - 1) / mib * mib), &ctx->arena));
    *out = ctx->arena;
    return DF_OK;
}

static df_status launch_fused(df_ctx *ctx, const void *arg)
{
    return df_dev_launch_fused(ctx->dev, ctx->stream, arg);
}

/* A group that was never queued: its nodes (the root and its members) are freed here, as
 * its kernel would have freed them. */
static df_status drop_group(df_ctx *ctx, df_gnode **nodes, const lz_program *p,
                            const lz_group *g, df_status s)
{
    df_dev_sync(ctx->dev, ctx->stream); /* work already queued may still read them */
    for (int i = 0; i <= g->root; i++)
        if (i == g->root || p->node[i].root_of == g->root) {
            df_node_free(nodes[i]);
            nodes[i] = NULL;
        }
    return s;
}

static df_status submit_group(df_ctx *ctx, df_gnode **nodes, const lz_program *p,
                              const lz_group *g)
{
    fused_owned *o = df_calloc(1, sizeof *o);
    df_fused *f = df_calloc(1, sizeof *f);
    if (o)
        o->nodes = df_malloc((size_t)g->n_members * sizeof *o->nodes);
    if (!o || !o->nodes || !f) {
        if (o)
            df_free(o->nodes);
        df_free(o);
        df_free(f);
        return drop_group(ctx, nodes, p, g,
                          df_errorf(DF_E_OOM, "out of memory queuing a fused kernel"));
    }
    df_status s = DF_OK;
    for (int k = 0; s == DF_OK && k < g->n_in; k++)
        s = df_residency_ready(ctx, nodes[g->in[k].node]->in[g->in[k].slot].st);
    for (int k = 0; s == DF_OK && g->head >= 0 && k < nodes[g->head]->n_in; k++)
        s = df_residency_ready(ctx, nodes[g->head]->in[k].st);
    if (s != DF_OK) {
        df_free(o->nodes);
        df_free(o);
        df_free(f);
        return drop_group(ctx, nodes, p, g, s);
    }
    df_gview_lower(&nodes[g->root]->out, &f->out);
    f->n_in = g->n_in;
    for (int k = 0; k < g->n_in; k++)
        df_gview_lower(&nodes[g->in[k].node]->in[g->in[k].slot], &f->in[k]);
    f->n_insn = g->n_insn;
    f->n_regs = g->n_regs;
    f->out_reg = g->out_reg;
    f->head_op = -1;
    for (int k = 0; k < g->n_insn; k++) {
        f->insn[k] = g->insn[k];
        int src = g->insn_node[k];
        if (src >= 0 && g->insn[k].op == DF_OP_SCALE) {
            f->insn[k].f0 = (float)nodes[src]->a.alpha;
            f->insn[k].f1 = (float)nodes[src]->a.beta;
        }
    }
    if (g->head >= 0) {
        const df_gnode *h = nodes[g->head];
        f->head_op = h->op;
        df_gview_lower(&h->in[0], &f->head_x);
        df_gview_lower(&h->in[1], &f->head_w);
        df_gview_lower(h->op == DF_OP_LAYER_NORM ? &h->in[2] : &(df_gview){0}, &f->head_b);
        f->head_eps = h->a.eps;
    }
    for (int i = 0; i <= g->root; i++)
        if (i == g->root || p->node[i].root_of == g->root)
            o->nodes[o->n++] = nodes[i];
    s = df_launch_timed(ctx, DF_OP_COUNT, launch_fused, f);
    df_free(f);
    if (s == DF_OK)
        s = df_dev_callback(ctx->dev, ctx->stream, release_fused, o);
    if (s != DF_OK) {
        df_dev_sync(ctx->dev, ctx->stream);
        release_fused(o, s);
        return s;
    }
    ctx->stats.ops_enqueued++;
    ctx->stats.fused_kernels++;
    return DF_OK;
}

/* Turns rms_norm node x into rms_norm_rope: it writes its rows, rotated, into the output
 * of `rope` from position s0 on, and its own output is never made. */
static void write_rotated(df_gnode *x, const df_gnode *rope, int64_t s0)
{
    int64_t S = x->out.shape[1], D = x->out.shape[3];
    df_gview out = rope->out; /* [B, H, S_all, D] dense: this part is rows s0 .. s0 + S */
    out.shape[2] = S;
    out.offset += s0 * D;
    df_gview table = rope->in[1]; /* [S_all, D/2, 2] */
    table.shape[0] = S;
    table.offset += s0 * table.stride[0];
    df_storage_retain(out.st);
    df_storage_retain(table.st);
    df_storage *own = x->out.st;
    own->producer = NULL;
    df_storage_release(own);
    x->op = DF_OP_RMS_NORM_ROPE;
    x->out = out;
    x->in[2] = table;
    x->n_in = 3;
}

/* Points node x's output at its columns of `whole` (a concat's output along its last
 * dimension), from column `col` on: x's trailing dimensions from `split` on stay dense
 * inside the part, the ones before step over whole rows. */
static void write_columns(df_gnode *x, const df_gview *whole, int64_t col, int split)
{
    df_gview v = x->out;
    int64_t stride = whole->shape[whole->ndim - 1];
    for (int d = split - 1; d >= 0; d--) {
        v.stride[d] = stride;
        stride *= v.shape[d];
    }
    v.st = whole->st;
    v.offset = whole->offset + col;
    df_storage_retain(v.st);
    df_storage *own = x->out.st;
    own->producer = NULL;
    df_storage_release(own);
    x->out = v;
}

df_status df_graph_execute(df_ctx *ctx, df_gnode **nodes, int n, const lz_program *p)
{
    df_status s = DF_OK;
    df_storage *arena = NULL;
    if (p->arena_bytes > 0)
        s = arena_for(ctx, p->arena_bytes, &arena);
    /* bf16 results: their kernels, the kernels writing parts of them, and their readers
     * see them as bf16 (before folding, so that a product takes its activation's view). */
    for (int j = 0; j < n; j++)
        for (int k = 0; k < nodes[j]->n_in; k++) {
            int q = producer_of(&nodes[j]->in[k]);
            if (q >= 0 && p->node[q].half)
                nodes[j]->in[k].dtype = DF_DTYPE_BF16;
        }
    for (int i = 0; i < n; i++) {
        if (p->node[i].alias_of >= 0 && p->node[p->node[i].alias_of].half) {
            nodes[result_node(p, i)]->out.dtype = DF_DTYPE_BF16;
            nodes[result_node(p, i)]->out.st->bytes /= 2;
        }
        if (p->node[i].half) {
            nodes[i]->out.dtype = DF_DTYPE_BF16;
            nodes[i]->out.st->bytes /= 2;
        }
    }
    /* Folded activations: the product writes the activation's output and applies it. */
    for (int i = 0; i < n; i++) {
        int j = p->node[i].fold;
        if (j < 0)
            continue;
        df_storage *own = nodes[i]->out.st;
        nodes[i]->out = nodes[j]->out;
        df_storage_retain(nodes[i]->out.st);
        nodes[i]->a.act = activation_of(nodes[j]->op);
        int m = p->node[i].gate_mul;
        if (m >= 0) { /* the gate row from the mul, the residual from the add */
            df_gnode *x = nodes[i];
            x->in[3] = nodes[m]->in[p->node[i].epi_slots & 1];
            x->in[4] = nodes[j]->in[p->node[i].epi_slots >> 1 & 1];
            df_storage_retain(x->in[3].st);
            df_storage_retain(x->in[4].st);
            x->n_in = 5;
            x->a.gated = 1;
            nodes[m]->out.st->producer = NULL;
            df_node_free(nodes[m]);
            nodes[m] = NULL;
        }
        own->producer = NULL;
        df_storage_release(own);
        df_node_free(nodes[j]);
        nodes[j] = NULL;
    }
    /* Memory for every materialised output, then for the parts written in place, then the
     * kernels in order. */
    for (int i = 0; s == DF_OK && i < n; i++) {
        if ((p->node[i].kind != K_SINGLE && p->node[i].kind != K_ROOT && p->node[i].kind != K_ELIDED) ||
            p->node[i].alias_of >= 0 || p->node[i].rope_of >= 0)
            continue;
        df_storage *st = nodes[i]->out.st;
        if (p->node[i].offset >= 0) {
            st->buf = arena->buf;
            st->offset = arena->offset + (uint64_t)p->node[i].offset;
            st->external = true; /* the arena owns the memory */
        } else {
            s = df_storage_materialize(st);
        }
    }
    for (int i = 0; s == DF_OK && i < n; i++) {
        if (p->node[i].alias_of >= 0 && p->node[i].alias_split > 0) {
            write_columns(nodes[i], &nodes[p->node[i].alias_of]->out, p->node[i].alias_off,
                          p->node[i].alias_split);
        } else if (p->node[i].alias_of >= 0) {
            df_storage *st = nodes[i]->out.st, *base = nodes[p->node[i].alias_of]->out.st;
            st->buf = base->buf;
            st->offset = base->offset + (uint64_t)(p->node[p->node[i].alias_of].half ? p->node[i].alias_off / 2
                                                                             : p->node[i].alias_off);
            st->external = true;
            st->base = base; /* kept until this part is freed, whoever drops the concat */
            df_storage_retain(base);
        } else if (p->node[i].rope_of >= 0) {
            write_rotated(nodes[i], nodes[p->node[i].rope_of], p->node[i].rope_s0);
        }
    }
    for (int i = 0; i < n; i++)
        if (nodes[i])
            nodes[i]->out.st->producer = NULL;
    for (int i = 0; i < n; i++) {
        if (!nodes[i])
            continue; /* folded into its product */
        if (s != DF_OK || p->node[i].kind == K_DEAD || p->node[i].kind == K_ELIDED) {
            df_node_free(nodes[i]); /* never run: nothing reads it, or others write it */
            continue;
        }
        if (p->node[i].kind == K_SINGLE)
            s = df_eager_submit(ctx, nodes[i]);
        else if (p->node[i].kind == K_ROOT)
            s = submit_group(ctx, nodes, p, &p->groups[p->node[i].group]);
        /* K_MEMBER nodes are owned by their group's kernel */
    }
    return s;
}
