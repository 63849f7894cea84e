/*
 * Running a compiled program (compile.c traces and plans it; compile_impl.h): a replay
 * instantiates the program's template over the call's inputs and weights and runs it with
 * the program's plan, or, on a device that records graphs, launches the graph its first
 * replay recorded.
 */
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/compile_impl.h"

/* ---- replay ------------------------------------------------------------------------------ */

static void release_storage_cb(void *arg, df_status s)
{
    (void)s;
    df_storage_release(arg);
}

static df_storage *resolve(const program *p, const binding *b, df_gnode **nodes, ref r)
{
    switch (r.kind) {
    case R_CONST:  return p->consts[r.index];
    case R_INPUT:  return b->in[r.index]->v.st;
    case R_WEIGHT: return b->w[r.index]->v.st;
    case R_NODE:   return nodes[r.index]->out.st;
    default:       return NULL;
    }
}

/* The program's nodes over the call's storages (its inputs from the program's slots when
 * `slots`); on failure the nodes made so far are freed. */
static df_status instantiate(df_ctx *ctx, const program *p, const binding *b, bool slots,
                             df_gnode **nodes)
{
    df_status s = DF_OK;
    for (int i = 0; i < p->n && s == DF_OK; i++) {
        const df_gview *o = &p->nodes[i].tmpl.out;
        size_t bytes = df_dtype_size(o->dtype); /* checked when the op was first made */
        for (int d = 0; d < o->ndim; d++)
            bytes *= (size_t)o->shape[d];
        df_gnode *x = df_malloc(sizeof *x);
        df_storage *st = x ? df_storage_lazy(ctx->dev, bytes) : NULL;
        if (!x || !st) {
            df_free(x);
            df_free(st);
            s = df_errorf(DF_E_OOM, "out of memory replaying a compiled program");
            break;
        }
        *x = p->nodes[i].tmpl;
        st->producer = x;
        x->out.st = st;
        x->id = i;
        for (int k = 0; k < x->n_in; k++) {
            ref r = p->nodes[i].in[k];
            x->in[k].st = slots && r.kind == R_INPUT ? p->in_slot[r.index]
                                                     : resolve(p, b, nodes, r);
            if (x->in[k].st)
                df_storage_retain(x->in[k].st);
        }
        nodes[i] = x;
    }
    if (s != DF_OK)
        for (int i = 0; i < p->n && nodes[i]; i++) {
            nodes[i]->out.st->producer = NULL; /* never computed */
            df_node_free(nodes[i]);
            nodes[i] = NULL;
        }
    return s;
}

/* The plan, made at the program's first replay (when the outputs' visibility is set). */
static df_status plan_once(df_ctx *ctx, program *p, df_gnode **nodes)
{
    if (!p->plan) {
        double t0 = df_now();
        p->plan = df_graph_plan_make(nodes, p->n, ctx->dev);
        ctx->stats.compile_ms += (df_now() - t0) * 1e3;
    }
    if (!p->plan)
        return df_errorf(DF_E_OOM, "out of memory planning a compiled program");
    if (df_graph_plan_arena(p->plan) > ctx->stats.arena_bytes)
        ctx->stats.arena_bytes = df_graph_plan_arena(p->plan);
    return DF_OK;
}

static df_status replay_captured(df_ctx *ctx, program *p, const binding *b, df_tensor **out,
                                 bool *ran);

df_status df_compile_replay(df_ctx *ctx, program *p, const binding *b, df_tensor **out)
{
    bool ran = false;
    df_status s = replay_captured(ctx, p, b, out, &ran);
    if (ran || s != DF_OK)
        return s;
    df_gnode **nodes = df_calloc((size_t)p->n + 1, sizeof *nodes);
    if (!nodes)
        return df_errorf(DF_E_OOM, "out of memory replaying a compiled program");
    s = instantiate(ctx, p, b, false, nodes);
    for (int j = 0; j < p->n_out && s == DF_OK; j++) {
        df_gview v = p->out_view[j];
        v.st = resolve(p, b, nodes, p->out_ref[j]);
        df_storage_retain(v.st);
        out[j] = df_handle_new(ctx, &v);
        if (!out[j])
            s = df_ctx_raise(ctx);
    }
    if (s == DF_OK)
        s = plan_once(ctx, p, nodes);
    if (s == DF_OK) {
        ctx->stats.graphs_built++;
        s = df_graph_execute(ctx, nodes, p->n, p->plan);
    } else {
        for (int i = 0; i < p->n && nodes[i]; i++) {
            nodes[i]->out.st->producer = NULL; /* never computed */
            df_node_free(nodes[i]);
        }
    }
    df_free(nodes);
    return s;
}

/* ---- replay by a recorded graph ----------------------------------------------------------- */
/*
 * On a device that records graphs, a program's kernels are recorded while they run at its
 * first replay-able call and replayed from then on: one graph launch, no node built, no
 * kernel recorded. Every address the graph uses must be the same at each call: the
 * program's inputs are copied (device to device) into slots it owns, its intermediates
 * live in its own arena, its outputs in buffers it owns (copied out into fresh storages for
 * the caller); weights and constants are read in place, so a capture is kept per set of
 * their buffers (each retained): repeated blocks get a graph each, and a capture whose
 * buffers moved (offload restored a weight elsewhere) is recorded again. A call with a
 * weight that is not resident (sequential offload streams it) replays node by node; so
 * does, from then on, a program the device cannot record (it computes an op on the host).
 */

enum { DF_CAPTURES_MAX = 64 }; /* graphs per program: FLUX.1 has 38 single blocks */

static void release_on_stream(df_ctx *ctx, df_storage *st)
{
    if (st && df_dev_callback(ctx->dev, ctx->stream, release_storage_cb, st) != DF_OK) {
        df_dev_sync(ctx->dev, ctx->stream);
        df_storage_release(st);
    }
}

static void capture_free(df_ctx *ctx, capture *c)
{
    if (!c)
        return;
    if (c->g) {
        df_dev_sync(ctx->dev, ctx->stream); /* no queued launch uses it any more */
        ctx->dev->ops->graph_free(ctx->dev->impl, c->g);
    }
    for (int i = 0; i < c->n; i++)
        release_on_stream(ctx, c->b[i].st);
    df_free(c->b);
    df_free(c);
}

/* What the program reads of each input (bytes from its storage's start) and which weights
 * it reads: from the template's views. False: a layout with negative strides. */
static bool io_ranges(program *p)
{
    for (int i = 0; i < p->n; i++)
        for (int k = 0; k < p->nodes[i].tmpl.n_in; k++) {
            ref r = p->nodes[i].in[k];
            if (r.kind == R_WEIGHT)
                p->w_used[r.index] = true;
            if (r.kind != R_INPUT)
                continue;
            const df_gview *v = &p->nodes[i].tmpl.in[k];
            int64_t hi = v->offset;
            for (int d = 0; d < v->ndim; d++) {
                if (v->stride[d] < 0)
                    return false;
                hi += (v->shape[d] - 1) * v->stride[d];
            }
            uint64_t es = df_dtype_size(v->dtype);
            uint64_t lo_b = (uint64_t)v->offset * es, hi_b = ((uint64_t)hi + 1) * es;
            if (p->in_hi[r.index] == 0 || lo_b < p->in_lo[r.index])
                p->in_lo[r.index] = lo_b;
            if (hi_b > p->in_hi[r.index])
                p->in_hi[r.index] = hi_b;
        }
    p->io_known = true;
    return true;
}

/* The storages a graph of p reads in place: the used weights (and their scales), then the
 * constants; out holds 2 * n_w + n_consts. */
static int bound_storages(const program *p, const binding *b, df_storage **out)
{
    int n = 0;
    for (int k = 0; k < b->n_w; k++)
        if (p->w_used[k] && b->w[k]) {
            const df_weight *w = b->w[k]->v.st->weight;
            out[n++] = b->w[k]->v.st;
            if (w && w->i8_scale)
                out[n++] = w->i8_scale;
        }
    for (int i = 0; i < p->n_consts; i++)
        out[n++] = p->consts[i];
    return n;
}

static size_t node_bytes(const program *p, int i)
{
    const df_gview *o = &p->nodes[i].tmpl.out;
    size_t bytes = df_dtype_size(o->dtype);
    for (int d = 0; d < o->ndim; d++)
        bytes *= (size_t)o->shape[d];
    return bytes;
}

/* The bytes [lo, hi) of an input into its slot. The input is held until the copy has
 * run: its caller may drop it at once, and its memory must not be reused before. */
static df_status copy_in(df_ctx *ctx, df_storage *slot, df_storage *src, uint64_t lo,
                         uint64_t hi)
{
    DF_TRY(df_dev_copy_d2d(ctx->dev, ctx->stream, slot->buf, slot->offset + lo, src->buf,
                           src->offset + lo, hi - lo));
    df_storage_retain(src);
    release_on_stream(ctx, src);
    return DF_OK;
}

/* The program's slots for its inputs and outputs, made at its first recording. */
static df_status make_slots(df_ctx *ctx, program *p, const binding *b)
{
    for (int i = 0; i < b->n_in; i++)
        if (p->in_hi[i] > 0 && !p->in_slot[i])
            DF_TRY(df_storage_alloc(ctx->dev, (size_t)p->in_hi[i], &p->in_slot[i]));
    for (int j = 0; j < p->n_out; j++) {
        if (p->out_ref[j].kind != R_NODE || p->out_slot[j])
            continue;
        for (int q = 0; q < j && !p->out_slot[j]; q++) /* the same node returned twice */
            if (p->out_ref[q].kind == R_NODE && p->out_ref[q].index == p->out_ref[j].index) {
                p->out_slot[j] = p->out_slot[q];
                df_storage_retain(p->out_slot[j]);
            }
        if (!p->out_slot[j])
            DF_TRY(df_storage_alloc(ctx->dev, node_bytes(p, p->out_ref[j].index),
                                    &p->out_slot[j]));
    }
    return DF_OK;
}

/* Runs p's nodes with its inputs and outputs in their slots, recording them;
 * a graph the device could not record leaves the program replaying node by node. */
/* Whether memory the program owns holds (buf, offset): what a replay may read again. */
static bool owned(const program *p, placed_out o)
{
    if (p->arena && o.buf == p->arena->buf)
        return true;
    for (int j = 0; j < p->n_out; j++)
        if (p->out_slot[j] && o.buf == p->out_slot[j]->buf)
            return true;
    return false;
}

static df_status record(df_ctx *ctx, program *p, df_storage **bst, int n_bound,
                        const binding *b, placed_out *where)
{
    df_gnode **nodes = df_calloc((size_t)p->n + 1, sizeof *nodes);
    df_storage *outs[DF_MODULE_MAX_IO] = {0};
    if (!nodes)
        return df_errorf(DF_E_OOM, "out of memory replaying a compiled program");
    df_status s = instantiate(ctx, p, b, true, nodes);
    for (int j = 0; s == DF_OK && j < p->n_out; j++) {
        if (p->out_ref[j].kind != R_NODE)
            continue;
        df_storage *st = nodes[p->out_ref[j].index]->out.st;
        df_storage_retain(st); /* kernels may free their nodes on another thread */
        st->handles++;         /* seen by the caller, as the plan must know */
        outs[j] = st;
    }
    /* The plan sees the graph as a replay by nodes does (outputs still to be produced):
     * the same plan serves both. Then each output is put in its slot. */
    if (s == DF_OK)
        s = plan_once(ctx, p, nodes);
    for (int j = 0; s == DF_OK && j < p->n_out; j++)
        if (outs[j] && !outs[j]->buf) { /* the first output of this node */
            outs[j]->buf = p->out_slot[j]->buf;
            outs[j]->offset = p->out_slot[j]->offset;
            outs[j]->external = true;
        }
    if (s != DF_OK) {
        for (int i = 0; i < p->n && nodes[i]; i++) {
            nodes[i]->out.st->producer = NULL;
            df_node_free(nodes[i]);
        }
    } else {
        df_storage *shared = ctx->arena; /* the program's arena stays at its place */
        ctx->arena = p->arena;
        bool capturing = ctx->dev->ops->capture_begin(ctx->stream) == DF_OK;
        ctx->stats.graphs_built++;
        s = df_graph_execute(ctx, nodes, p->n, p->plan);
        df_dev_graph *g = NULL;
        if (capturing && ctx->dev->ops->capture_end(ctx->stream, &g) != DF_OK)
            g = NULL;
        if (s != DF_OK && g) { /* a part of the work: not a graph of the program */
            ctx->dev->ops->graph_free(ctx->dev->impl, g);
            g = NULL;
            capturing = false;
        }
        p->arena = ctx->arena;
        ctx->arena = shared;
        for (int j = 0; j < p->n_out; j++)
            if (outs[j]) {
                where[j] = (placed_out){outs[j]->buf, outs[j]->offset};
                if (g && !owned(p, where[j])) { /* not where the next run writes it */
                    ctx->dev->ops->graph_free(ctx->dev->impl, g);
                    g = NULL;
                }
            }
        capture *c = g ? df_calloc(1, sizeof *c) : NULL;
        if (c)
            c->b = df_malloc(((size_t)n_bound + 1) * sizeof *c->b);
        if (c && c->b) {
            c->g = g;
            c->n = n_bound;
            memcpy(c->out, where, sizeof c->out);
            for (int i = 0; i < n_bound; i++) {
                df_storage_retain(bst[i]);
                c->b[i] = (bound){bst[i], bst[i]->buf, bst[i]->offset};
            }
            c->next = p->captures;
            p->captures = c;
        } else {
            if (c)
                df_free(c);
            if (g)
                ctx->dev->ops->graph_free(ctx->dev->impl, g); /* out of memory: not kept */
            if (!g && capturing)
                p->no_capture = true; /* the device cannot record this program */
        }
    }
    for (int j = 0; j < p->n_out; j++)
        if (outs[j]) {
            outs[j]->handles--;
            df_storage_release(outs[j]);
        }
    df_free(nodes);
    return s;
}

static df_status run_recorded(df_ctx *ctx, program *p, const binding *b, df_storage **bst,
                              int n_bound, df_tensor **out, bool *ran);

static df_status replay_captured(df_ctx *ctx, program *p, const binding *b, df_tensor **out,
                                 bool *ran)
{
    *ran = false;
    if (p->no_capture || !df_dev_can_capture(ctx->dev) || (p->ctx && p->ctx != ctx))
        return DF_OK;
    if (!p->io_known && !io_ranges(p)) {
        p->no_capture = true;
        return DF_OK;
    }
    /* Everything read in place must be resident (and its upload waited for); a weight
     * streamed through the device (sequential offload) is not kept there. */
    df_storage **bst = df_malloc(((size_t)(2 * b->n_w + p->n_consts) + 1) * sizeof *bst);
    if (!bst)
        return df_errorf(DF_E_OOM, "out of memory replaying a compiled program");
    int n_bound = bound_storages(p, b, bst);
    bool usable = true;
    for (int i = 0; i < n_bound && usable; i++)
        usable = !(bst[i]->weight && bst[i]->weight->transient);
    df_status s = DF_OK;
    for (int i = 0; usable && s == DF_OK && i < n_bound; i++)
        s = df_residency_ready(ctx, bst[i]);
    for (int i = 0; usable && s == DF_OK && i < b->n_in; i++)
        if (p->in_hi[i] > 0)
            s = df_residency_ready(ctx, b->in[i]->v.st);
    for (int i = 0; usable && i < n_bound; i++)
        usable = bst[i]->buf != NULL;
    for (int i = 0; usable && i < b->n_in; i++)
        usable = p->in_hi[i] == 0 || b->in[i]->v.st->buf != NULL;
    if (usable && s == DF_OK)
        s = run_recorded(ctx, p, b, bst, n_bound, out, ran);
    df_free(bst);
    return s;
}

static df_status run_recorded(df_ctx *ctx, program *p, const binding *b, df_storage **bst,
                              int n_bound, df_tensor **out, bool *ran)
{
    capture **pc = &p->captures;
    bool same = false, moved = false;
    for (; *pc; pc = &(*pc)->next) {
        same = (*pc)->n == n_bound;
        moved = false;
        for (int i = 0; same && i < n_bound; i++) {
            same = (*pc)->b[i].st == bst[i];
            moved |= (*pc)->b[i].buf != bst[i]->buf || (*pc)->b[i].offset != bst[i]->offset;
        }
        if (same)
            break;
    }
    if (same && moved) { /* its weights were put elsewhere: recorded again */
        capture *stale = *pc;
        *pc = stale->next;
        capture_free(ctx, stale);
        same = false;
    }
    *ran = true;
    p->ctx = ctx;
    DF_TRY(make_slots(ctx, p, b));
    for (int i = 0; i < b->n_in; i++)
        if (p->in_hi[i] > 0)
            DF_TRY(copy_in(ctx, p->in_slot[i], b->in[i]->v.st, p->in_lo[i], p->in_hi[i]));
    placed_out where[DF_MODULE_MAX_IO] = {{0}};
    if (same) {
        memcpy(where, (*pc)->out, sizeof where);
        ctx->stats.graphs_built++;
        if (df_graph_plan_arena(p->plan) > ctx->stats.arena_bytes)
            ctx->stats.arena_bytes = df_graph_plan_arena(p->plan);
        DF_TRY(ctx->dev->ops->graph_launch(ctx->stream, (*pc)->g));
    } else {
        /* At most DF_CAPTURES_MAX graphs per program: the oldest goes. */
        int n_caps = 0;
        for (capture **q = &p->captures; *q; q = &(*q)->next)
            if (++n_caps >= DF_CAPTURES_MAX) {
                capture_free(ctx, *q);
                *q = NULL;
                break;
            }
        DF_TRY(record(ctx, p, bst, n_bound, b, where));
    }
    /* The outputs, copied out of the program's memory (the next call writes there). */
    for (int j = 0; j < p->n_out; j++) {
        df_gview v = p->out_view[j];
        if (p->out_ref[j].kind == R_NODE) {
            size_t bytes = p->out_slot[j]->bytes;
            DF_TRY(df_storage_alloc(ctx->dev, bytes, &v.st));
            df_status s = df_dev_copy_d2d(ctx->dev, ctx->stream, v.st->buf, v.st->offset,
                                          where[j].buf, where[j].offset, bytes);
            if (s != DF_OK) {
                df_storage_release(v.st);
                return s;
            }
        } else {
            v.st = resolve(p, b, NULL, p->out_ref[j]);
            df_storage_retain(v.st);
        }
        out[j] = df_handle_new(ctx, &v);
        if (!out[j])
            return df_ctx_raise(ctx);
    }
    return DF_OK;
}

void df_compile_free_captures(program *p)
{
    if (!p->ctx)
        return;
    for (capture *c = p->captures, *next; c; c = next) {
        next = c->next;
        capture_free(p->ctx, c);
    }
    p->captures = NULL;
    release_on_stream(p->ctx, p->arena);
    for (int i = 0; i < DF_MODULE_MAX_IO; i++) {
        release_on_stream(p->ctx, p->in_slot[i]);
        release_on_stream(p->ctx, p->out_slot[i]);
    }
}
