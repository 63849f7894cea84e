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
 * a recorded graph" in compile_replay.c.
 *
 * With fullgraph, a sync inside the forward (a host read) fails the call with a message
 * naming the op whose result was read. Without it, such a forward is not traced: it runs
 * under defer-and-fuse, whose graph cache then holds one program per piece between cuts.
 */
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/compile_impl.h"

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
    if (!df_graph_append(&t->nodes, &t->n, &t->cap, node)) {
        df_node_free(node);
        return df_errorf(DF_E_OOM, "out of memory tracing '%s'", t->module);
    }
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

static void make_signature(const df_ctx *ctx, signature *s, int n_in, df_tensor *const *in, int n_w,
                           df_tensor **w)
{
    s->n = n_in + n_w;
    s->attention = df_ctx_attention_compute(ctx);
    for (int i = 0; i < n_in; i++)
        layout_of(&s->v[i], in[i]);
    for (int k = 0; k < n_w; k++)
        layout_of(&s->v[n_in + k], w[k]);
}

static bool same_signature(const signature *a, const signature *b)
{
    if (a->n != b->n || a->attention != b->attention)
        return false;
    for (int i = 0; i < a->n; i++)
        if (!same_layout(&a->v[i], &b->v[i]))
            return false;
    return true;
}

/* ---- building a program from a trace --------------------------------------------------- */

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
        s = df_compile_replay(ctx, p, b, out);
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
    df_compile_free_captures(p);
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
    make_signature(ctx, &sig, c->m.n_in, in, n_w, w);
    program *p = c->progs;
    while (p && !same_signature(&p->sig, &sig))
        p = p->next;
    df_status s;
    if (p && p->not_traceable) {
        s = c->m.forward(ctx, self, in, out);
    } else if (p) {
        ctx->stats.cache_hits++;
        s = df_compile_replay(ctx, p, &b, out);
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
