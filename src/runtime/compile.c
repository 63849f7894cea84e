/*
 * Compiled mode (see include/diffuse/compile.h).
 *
 * A trace runs the module's forward with a recording executor, then turns the recorded
 * nodes into a template: each input of each node refers to another node, a call input, a
 * weight of the instance, or a constant (a storage that existed before the call: another
 * model's weights, or host data the forward uploaded). Nodes that depend on no input and
 * no weight are constants too: they run once, with the trace, and their results are kept
 * (constant folding). A replay instantiates the template over the call's inputs and
 * weights and runs it with a plan (fusion and one arena, from graph_plan.c) made once per
 * program. The signature that selects a program holds the shapes, strides, offsets and
 * dtypes of the inputs and weights, never their values.
 *
 * On a device that records graphs (capture_begin ... graph_launch in the device ABI), a
 * program's kernels are recorded once and replayed from the second call on: see "replay by
 * a recorded graph" below.
 *
 * With fullgraph, a sync inside the forward (a host read) fails the call with a message
 * naming the op whose result was read. Without it, such a forward is not traced: it runs
 * under defer-and-fuse, whose graph cache then holds one program per piece between cuts.
 */
#include <string.h>

#include <diffuse/compile.h>

#include "core/alloc.h"
#include "core/status.h"
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

struct df_compiled {
    df_module m;
    df_compile_opts o;
    program *progs;
    int n_progs;
};

/* ---- the recording executor ---------------------------------------------------------- */

typedef struct trace_state {
    df_gnode **nodes;
    int n, cap;
    bool fullgraph;
    const char *module;
} trace_state;

static df_status trace_submit(df_ctx *ctx, df_gnode *node)
{
    trace_state *t = ctx->exec_state;
    if (t->n == t->cap) {
        int cap = t->cap ? 2 * t->cap : 512;
        df_gnode **nn = df_realloc(t->nodes, (size_t)cap * sizeof *nn);
        if (!nn) {
            df_node_free(node);
            return df_errorf(DF_E_OOM, "out of memory tracing '%s'", t->module);
        }
        t->nodes = nn;
        t->cap = cap;
    }
    node->id = t->n;
    node->out.st->producer = node;
    t->nodes[t->n++] = node;
    return DF_OK;
}

static df_status trace_flush(df_ctx *ctx)
{
    trace_state *t = ctx->exec_state;
    if (t->n == 0)
        return DF_OK;
    const df_tensor *r = ctx->reading;
    const char *op = r && r->v.st->producer ? df_op_name(r->v.st->producer->op) : NULL;
    if (op)
        return df_errorf(DF_E_STATE, "compiled '%s': the forward reads the result of op '%s' on "
                         "the host, which would cut the graph (fullgraph)", t->module, op);
    return df_errorf(DF_E_STATE, "compiled '%s': the forward waits for its own results "
                     "(a sync inside the traced forward cuts the graph; fullgraph)", t->module);
}

static const df_executor exec_trace = {.submit = trace_submit, .flush = trace_flush};

/* ---- signatures -------------------------------------------------------------------------- */

static void layout_of(df_gview *dst, const df_tensor *t)
{
    memset(dst, 0, sizeof *dst);
    if (!t)
        return;
    *dst = t->v;
    dst->st = (df_storage *)1; /* present; the pointer is never used */
}

static bool same_layout(const df_gview *a, const df_gview *b)
{
    if ((a->st != NULL) != (b->st != NULL))
        return false;
    if (!a->st)
        return true;
    if (a->dtype != b->dtype || a->ndim != b->ndim || a->offset != b->offset)
        return false;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || a->stride[d] != b->stride[d])
            return false;
    return true;
}

static void make_signature(signature *s, int n_in, df_tensor *const *in, int n_w, df_tensor **w)
{
    s->n = n_in + n_w;
    for (int i = 0; i < n_in; i++)
        layout_of(&s->v[i], in[i]);
    for (int k = 0; k < n_w; k++)
        layout_of(&s->v[n_in + k], w[k]);
}

static bool same_signature(const signature *a, const signature *b)
{
    if (a->n != b->n)
        return false;
    for (int i = 0; i < a->n; i++)
        if (!same_layout(&a->v[i], &b->v[i]))
            return false;
    return true;
}

/* ---- building a program from a trace --------------------------------------------------- */

typedef struct binding {
    int n_in, n_w;
    df_tensor *const *in;
    df_tensor **w;
} binding;

static int add_const(program *p, df_storage *st)
{
    for (int i = 0; i < p->n_consts; i++)
        if (p->consts[i] == st)
            return i;
    df_storage **c = df_realloc(p->consts, ((size_t)p->n_consts + 1) * sizeof *c);
    if (!c)
        return -1;
    p->consts = c;
    df_storage_retain(st);
    c[p->n_consts] = st;
    return p->n_consts++;
}

static ref classify(program *p, const binding *b, df_storage *st, const int *new_id)
{
    if (!st)
        return (ref){R_NONE, 0};
    if (st->producer && !st->buf)
        return new_id[st->producer->id] >= 0 ? (ref){R_NODE, new_id[st->producer->id]}
                                             : (ref){R_CONST, add_const(p, st)};
    for (int i = 0; i < b->n_in; i++)
        if (b->in[i] && b->in[i]->v.st == st)
            return (ref){R_INPUT, i};
    for (int k = 0; k < b->n_w; k++)
        if (b->w[k] && b->w[k]->v.st == st)
            return (ref){R_WEIGHT, k};
    return (ref){R_CONST, add_const(p, st)};
}

static df_status replay(df_ctx *ctx, program *p, const binding *b, df_tensor **out);

/* Turns the trace into p's template, folding constant nodes; then runs the trace. */
static df_status build_and_run(df_ctx *ctx, program *p, const binding *b, df_gnode **nodes, int n,
                               df_tensor **out, int n_out, double *plan_seconds)
{
    double t_plan = df_now();
    df_status s = DF_OK;
    bool *is_const = df_calloc((size_t)n + 1, sizeof *is_const);
    bool *boundary = df_calloc((size_t)n + 1, sizeof *boundary);
    int *new_id = df_malloc(((size_t)n + 1) * sizeof *new_id);
    p->nodes = df_calloc((size_t)n + 1, sizeof *p->nodes);
    if (!is_const || !boundary || !new_id || !p->nodes)
        s = df_errorf(DF_E_OOM, "out of memory compiling");
    /* Constant nodes: every input a constant storage or a constant node. */
    for (int i = 0; s == DF_OK && i < n; i++) {
        bool c = true;
        for (int k = 0; k < nodes[i]->n_in && c; k++) {
            df_storage *st = nodes[i]->in[k].st;
            if (!st)
                continue;
            if (st->producer && !st->buf)
                c = is_const[st->producer->id];
            else
                for (int j = 0; j < b->n_in + b->n_w && c; j++) {
                    df_tensor *t = j < b->n_in ? b->in[j] : b->w[j - b->n_in];
                    c = !t || t->v.st != st;
                }
        }
        is_const[i] = c;
    }
    int m = 0;
    for (int i = 0; s == DF_OK && i < n; i++)
        new_id[i] = is_const[i] ? -1 : m++;
    /* A constant read by a non-constant node (or returned) is kept: visible to the plan. */
    for (int i = 0; s == DF_OK && i < n; i++)
        for (int k = 0; k < nodes[i]->n_in; k++) {
            df_storage *st = nodes[i]->in[k].st;
            if (!is_const[i] && st && st->producer && !st->buf && is_const[st->producer->id])
                boundary[st->producer->id] = true;
        }
    for (int j = 0; s == DF_OK && j < n_out; j++) {
        df_storage *st = out[j]->v.st;
        if (st->producer && !st->buf && is_const[st->producer->id])
            boundary[st->producer->id] = true;
    }
    for (int i = 0; s == DF_OK && i < n; i++)
        if (boundary[i])
            nodes[i]->out.st->handles++;
    /* Everything up to the run is compile work; the run itself is the first call's. */
    /* The template. */
    for (int i = 0; s == DF_OK && i < n; i++) {
        if (is_const[i])
            continue;
        tnode *t = &p->nodes[new_id[i]];
        t->tmpl = *nodes[i];
        for (int k = 0; k < nodes[i]->n_in; k++) {
            t->in[k] = classify(p, b, nodes[i]->in[k].st, new_id);
            if (t->in[k].kind == R_CONST && t->in[k].index < 0)
                s = df_errorf(DF_E_OOM, "out of memory compiling");
            t->tmpl.in[k].st = NULL;
        }
        t->tmpl.out.st = NULL;
        t->tmpl.next = NULL;
    }
    p->n = m;
    p->n_out = n_out;
    for (int j = 0; s == DF_OK && j < n_out; j++) {
        p->out_ref[j] = classify(p, b, out[j]->v.st, new_id);
        p->out_view[j] = out[j]->v;
        p->out_view[j].st = NULL;
    }
    /* On a device that records graphs, the constants run as a graph of their own and
     * the program itself as its first replay, which records it (the trace's own nodes of
     * the program are dropped unrun): the second call then records nothing. */
    df_storage **held = df_malloc(((size_t)n + 1) * sizeof *held);
    int n_held = 0;
    for (int i = 0; held && boundary && i < n; i++)
        if (boundary[i])
            held[n_held++] = nodes[i]->out.st;
    bool split = s == DF_OK && df_dev_can_capture(ctx->dev);
    int n_run = n;
    for (int i = 0; split && i < n; i++) {
        if (is_const[i]) {
            nodes[i]->id = n_run - n; /* renumbered from 0 among the constants */
            nodes[n_run++ - n] = nodes[i];
        } else {
            nodes[i]->out.st->producer = NULL; /* never computed: the replay computes it */
            df_node_free(nodes[i]);
        }
    }
    if (split)
        n_run -= n;
    /* Run the trace itself (constants included), then drop the extra visibility. */
    lz_program *plan = s == DF_OK && n_run > 0 ? df_graph_plan_make(nodes, n_run, ctx->dev)
                                               : NULL;
    if (s == DF_OK && ((!plan && n_run > 0) || !held))
        s = df_errorf(DF_E_OOM, "out of memory compiling");
    *plan_seconds = df_now() - t_plan;
    if (plan && df_graph_plan_arena(plan) > ctx->stats.arena_bytes)
        ctx->stats.arena_bytes = df_graph_plan_arena(plan);
    if (s == DF_OK && n_run > 0) {
        s = df_graph_execute(ctx, nodes, n_run, plan);
    } else if (s != DF_OK) {
        for (int i = 0; i < n_run; i++) {
            nodes[i]->out.st->producer = NULL; /* never computed, as after a failed trace */
            df_node_free(nodes[i]);
        }
    }
    if (split && s == DF_OK) { /* the trace's outputs give way to the replay's */
        for (int j = 0; j < n_out; j++) {
            df_tensor_free(out[j]);
            out[j] = NULL;
        }
        s = replay(ctx, p, b, out);
    }
    for (int i = 0; i < n_held; i++)
        held[i]->handles--;
    df_free(held);
    df_graph_plan_free(plan);
    df_free(is_const);
    df_free(boundary);
    df_free(new_id);
    return s;
}

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

static df_status replay(df_ctx *ctx, program *p, const binding *b, df_tensor **out)
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
            out[n++] = b->w[k]->v.st;
            if (b->w[k]->v.st->i8_scale)
                out[n++] = b->w[k]->v.st->i8_scale;
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
        usable = !bst[i]->transient;
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

/* Frees what replay by recorded graphs kept (after the stream has passed its last use). */
static void program_free_captures(program *p)
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


/* ---- the API ----------------------------------------------------------------------------- */

df_status df_compile(const df_module *m, const df_compile_opts *opts, df_compiled **out)
{
    *out = NULL;
    df_compile_opts o = opts ? *opts : (df_compile_opts){0};
    if (o.dynamic)
        return df_errorf(DF_E_UNSUPPORTED, "compile '%s': dynamic shapes are not supported "
                         "(shapes are static; each new input shape compiles once)",
                         m && m->name ? m->name : "?");
    if (!m || !m->forward || m->n_in < 0 || m->n_in > DF_MODULE_MAX_IO || m->n_out < 1 ||
        m->n_out > DF_MODULE_MAX_IO)
        return df_errorf(DF_E_ARG, "compile: invalid module");
    df_compiled *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "out of memory");
    c->m = *m;
    c->o = o;
    *out = c;
    return DF_OK;
}

static void program_free(program *p)
{
    program_free_captures(p);
    for (int i = 0; i < p->n_consts; i++)
        df_storage_release(p->consts[i]);
    df_free(p->consts);
    df_free(p->nodes);
    df_graph_plan_free(p->plan);
    df_free(p);
}

void df_compiled_free(df_compiled *c)
{
    if (!c)
        return;
    for (program *p = c->progs, *next; p; p = next) {
        next = p->next;
        program_free(p);
    }
    df_free(c);
}

int df_compiled_programs(const df_compiled *c)
{
    return c->n_progs;
}

static df_status trace(df_ctx *ctx, df_compiled *c, program *p, void *self, const binding *b,
                       df_tensor **out)
{
    trace_state t = {.fullgraph = c->o.fullgraph, .module = c->m.name ? c->m.name : "module"};
    const df_executor *saved = ctx->exec;
    void *saved_state = ctx->exec_state;
    ctx->exec = &exec_trace;
    ctx->exec_state = &t;
    double t0 = df_now();
    /* The forward's intermediates are released before planning, whether or not the module
     * opens scopes of its own: a handle still alive would keep its node out of the arena. */
    df_scope mark = df_scope_begin(ctx);
    df_status s = c->m.forward(ctx, self, b->in, out);
    if (s == DF_OK)
        s = df_ctx_status(ctx) != DF_OK ? df_ctx_raise(ctx) : DF_OK;
    for (int j = 0; s == DF_OK && j < c->m.n_out; j++)
        if (!out[j])
            s = df_errorf(DF_E_STATE, "compiled '%s': the forward gave no output %d and no "
                          "error", t.module, j);
    if (s != DF_OK)
        for (int j = 0; j < c->m.n_out; j++)
            out[j] = NULL;
    df_scope_end_n(ctx, mark, out, c->m.n_out);
    ctx->exec = saved;
    ctx->exec_state = saved_state;
    double compile_s = df_now() - t0, plan_s = 0;
    if (s == DF_OK) {
        s = build_and_run(ctx, p, b, t.nodes, t.n, out, c->m.n_out, &plan_s);
    } else {
        for (int i = 0; i < t.n; i++) {
            t.nodes[i]->out.st->producer = NULL;
            df_node_free(t.nodes[i]);
        }
    }
    df_free(t.nodes);
    ctx->stats.compile_ms += (compile_s + plan_s) * 1e3; /* recording and planning, not the run */
    ctx->stats.graphs_compiled++;
    ctx->stats.graphs_built++;
    ctx->stats.cache_misses++;
    return s;
}

/* A call made while another module is being traced: the forward is recorded into the outer
 * trace (the outer program contains this module), as torch.compile traces through a region
 * compiled on its own. */
static bool tracing(const df_ctx *ctx)
{
    return ctx->exec == &exec_trace;
}

static df_status call(df_ctx *ctx, df_compiled *c, void *self, df_tensor *const *in,
                      df_tensor **out)
{
    if (ctx->status != DF_OK)
        return df_ctx_raise(ctx);
    if (tracing(ctx))
        return c->m.forward(ctx, self, in, out);
    df_tensor *w[DF_MODULE_MAX_WEIGHTS] = {0};
    int n_w = c->m.weights ? c->m.weights(self, w) : 0;
    if (n_w < 0 || n_w > DF_MODULE_MAX_WEIGHTS)
        return df_errorf(DF_E_ARG, "compiled '%s': bad weight count %d", c->m.name, n_w);
    DF_TRY(ctx->exec->flush(ctx)); /* inputs must be produced before they are bound */
    binding b = {.n_in = c->m.n_in, .n_w = n_w, .in = in, .w = w};
    signature sig;
    make_signature(&sig, c->m.n_in, in, n_w, w);
    program *p = c->progs;
    while (p && !same_signature(&p->sig, &sig))
        p = p->next;
    df_status s;
    if (p && p->not_traceable) {
        s = c->m.forward(ctx, self, in, out);
    } else if (p) {
        ctx->stats.cache_hits++;
        s = replay(ctx, p, &b, out);
    } else {
        p = df_calloc(1, sizeof *p);
        if (!p)
            return df_errorf(DF_E_OOM, "out of memory compiling '%s'", c->m.name);
        p->sig = sig;
        s = trace(ctx, c, p, self, &b, out);
        if (s == DF_E_STATE && !c->o.fullgraph) {
            /* The forward syncs: it runs as separate pieces, op by op or fused. */
            df_ctx_reset_error(ctx);
            program_free(p);
            p = df_calloc(1, sizeof *p);
            if (!p)
                return df_errorf(DF_E_OOM, "out of memory compiling '%s'", c->m.name);
            p->sig = sig;
            p->not_traceable = true;
            s = c->m.forward(ctx, self, in, out);
        } else if (s != DF_OK) {
            program_free(p);
            return s;
        }
        p->next = c->progs;
        c->progs = p;
        c->n_progs++;
    }
    return s;
}

/* Every failure fails the context, whichever path found it, so that a caller that goes on
 * with the NULL outputs reaches its next status check with the real message. */
df_status df_compiled_call(df_ctx *ctx, df_compiled *c, void *self, df_tensor *const *in,
                           df_tensor **out)
{
    for (int j = 0; j < c->m.n_out; j++)
        out[j] = NULL;
    df_status s = call(ctx, c, self, in, out);
    for (int j = 0; s == DF_OK && j < c->m.n_out; j++)
        if (!out[j])
            s = df_errorf(DF_E_STATE, "compiled '%s': the forward gave no output %d and no "
                          "error", c->m.name ? c->m.name : "module", j);
    if (s != DF_OK) {
        for (int j = 0; j < c->m.n_out; j++)
            out[j] = NULL;
        df_ctx_fail(ctx, s);
        return df_ctx_raise(ctx);
    }
    return DF_OK;
}
