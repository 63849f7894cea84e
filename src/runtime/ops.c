/*
 * The op API: one function per op, each with its shape rule.
 *
 * Every function here checks its inputs, decides the output's dtype and shape, and hands a
 * node to df_emit(), the single dispatch point every execution mode goes through. Layout
 * rules live here too: kernels receive inputs that are either broadcast views (the
 * elementwise ops) or dense where the kernel needs it (a copy node is inserted first).
 * Activations come out as f32; matrix products record the context's compute dtype in the
 * node, so a graph remembers how it was computed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <math.h>
#include <string.h>

#include "backend/registry.h"
#include "core/alloc.h"
#include "core/status.h"
#include "runtime/runtime.h"

#include <diffuse/dist.h>

/* --- the dispatch point ----------------------------------------------------------------- */

df_tensor *df_emit(df_ctx *ctx, df_gnode *n)
{
    for (int i = 0; i < DF_NODE_MAX_IN; i++) {
        const df_storage *st = n->in[i].st;
        if (st && !st->buf && !st->producer && !st->host) {
            df_op op = n->op;
            df_free(n);
            return df_ctx_fail(ctx, df_errorf(DF_E_STATE, "%s: an input was never computed "
                                              "(the op that made it failed)", df_op_name(op)));
        }
    }
    df_gview *o = &n->out;
    size_t bytes = df_dtype_size(o->dtype);
    int64_t s = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        o->stride[d] = s;
        s *= o->shape[d];
    }
    o->offset = 0;
    const char *name = df_op_name(n->op);
    if (!df_size_mul(bytes, (size_t)s, &bytes)) {
        df_free(n);
        return df_ctx_fail(ctx, df_errorf(DF_E_SHAPE, "%s: output too large", name));
    }
    o->st = df_storage_lazy(ctx->dev, bytes);
    if (!o->st) {
        df_free(n);
        return df_ctx_fail(ctx, df_errorf(DF_E_OOM, "%s: out of memory", name));
    }
    n->n_in = df_op_inputs(n->op);
    for (int i = n->n_in; i < DF_NODE_MAX_IN; i++)
        if (n->in[i].st)
            n->n_in = i + 1; /* slots past the op's own: a linear's gated residual epilogue */
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i].st)
            df_storage_retain(n->in[i].st);
    df_storage_retain(o->st); /* one for the node, one (the initial) for the handle */
    df_gview out = *o;
    df_status st = ctx->exec->submit(ctx, n);
    if (st != DF_OK) {
        df_storage_release(out.st);
        return df_ctx_fail(ctx, st);
    }
    return df_handle_new(ctx, &out);
}

/* --- helpers ------------------------------------------------------------------------------ */

static df_gnode *node_new(df_ctx *ctx, df_op op)
{
    df_gnode *n = df_calloc(1, sizeof *n);
    if (!n)
        df_ctx_fail(ctx, df_errorf(DF_E_OOM, "%s: out of memory", df_op_name(op)));
    else
        n->op = op;
    return n;
}

/* Whether op can run on these required inputs. A failed context makes every op a no-op
 * returning NULL. A NULL input in a context that has not failed means the call that made it
 * lost its error: the context fails here, so the message names at least the op. */
static bool ready(df_ctx *ctx, const char *op, int count, ...)
{
    if (ctx->status != DF_OK)
        return false;
    va_list ap;
    va_start(ap, count);
    int missing = -1;
    for (int i = 0; i < count; i++)
        if (va_arg(ap, df_tensor *) == NULL && missing < 0)
            missing = i;
    va_end(ap);
    if (missing >= 0)
        df_ctx_fail(ctx, df_errorf(DF_E_ARG, "%s: input %d is NULL (the call that made it "
                                   "failed without an error)", op, missing));
    return missing < 0;
}

static df_tensor *fail_shape(df_ctx *ctx, df_gnode *n, const char *op, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static df_tensor *fail_shape(df_ctx *ctx, df_gnode *n, const char *op, const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    df_free(n);
    return df_ctx_fail(ctx, df_errorf(DF_E_SHAPE, "%s: %s", op, why));
}

static const char *desc(const df_tensor *t, char *buf)
{
    return df_tensor_describe(t, buf, 96);
}

static bool is_float(df_dtype t)
{
    return t == DF_DTYPE_F32 || t == DF_DTYPE_BF16 || t == DF_DTYPE_F16 || t == DF_DTYPE_F64;
}

static bool is_int(df_dtype t)
{
    return t == DF_DTYPE_I32 || t == DF_DTYPE_I64;
}

/* The tensor itself if dense, else a dense copy (made in the current scope). */
static df_tensor *dense(df_ctx *ctx, df_tensor *t)
{
    return t && !df_gview_is_dense(&t->v) ? df_contiguous(ctx, t) : t;
}

/* A node whose inputs are a, b, c made dense (NULL entries: absent optional inputs); NULL
 * (and the context failed) when a required input or the node could not be made. */
static df_gnode *dense_node(df_ctx *ctx, df_op op, df_tensor *a, df_tensor *b, df_tensor *c)
{
    df_tensor *in[3] = {a, b, c};
    df_gnode *n = node_new(ctx, op);
    for (int i = 0; n && i < 3; i++) {
        if (!in[i])
            continue;
        df_tensor *d = dense(ctx, in[i]);
        if (!d) {
            df_free(n);
            return NULL;
        }
        n->in[i] = d->v;
    }
    return n;
}

static void set_out(df_gnode *n, df_dtype dtype, int ndim, const int64_t *shape)
{
    n->out.dtype = dtype;
    n->out.ndim = ndim;
    memcpy(n->out.shape, shape, (size_t)ndim * sizeof *shape);
}

/* Output shape of broadcasting a and b; false if they do not broadcast. */
static bool broadcast_shape(const df_gview *a, const df_gview *b, int *ndim, int64_t *shape)
{
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return false;
        shape[d] = sa == 1 ? sb : sa;
    }
    *ndim = nd;
    return true;
}

/* v seen with `shape`: leading dimensions added and size-1 dimensions stretched (stride 0). */
static df_gview broadcast_view(const df_gview *v, int ndim, const int64_t *shape)
{
    df_gview r = *v;
    r.ndim = ndim;
    int lead = ndim - v->ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t have = d < lead ? 1 : v->shape[d - lead];
        r.shape[d] = shape[d];
        r.stride[d] = d < lead || have != shape[d] ? 0 : v->stride[d - lead];
    }
    return r;
}

/* --- copies ------------------------------------------------------------------------------- */

static df_tensor *copy_as(df_ctx *ctx, df_tensor *x, df_dtype dtype)
{
    if (!ready(ctx, "cast", 1, x))
        return NULL;
    if (df_dtype_size(dtype) == 0)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "cast: invalid dtype %d", (int)dtype));
    df_gnode *n = node_new(ctx, DF_OP_COPY);
    if (!n)
        return NULL;
    n->in[0] = x->v;
    set_out(n, dtype, x->v.ndim, x->v.shape);
    return df_emit(ctx, n);
}

df_tensor *df_contiguous(df_ctx *ctx, df_tensor *x)
{
    return copy_as(ctx, x, x ? x->v.dtype : DF_DTYPE_F32);
}

df_tensor *df_cast(df_ctx *ctx, df_tensor *x, df_dtype dtype)
{
    return copy_as(ctx, x, dtype);
}

df_tensor *df_concat(df_ctx *ctx, df_tensor *a, df_tensor *b, int dim)
{
    if (!ready(ctx, "concat", 2, a, b))
        return NULL;
    char da[96], db[96];
    int nd = a->v.ndim, d = dim < 0 ? dim + nd : dim;
    bool fits = b->v.ndim == nd && d >= 0 && d < nd && a->v.dtype == b->v.dtype;
    for (int k = 0; fits && k < nd; k++)
        fits = k == d || a->v.shape[k] == b->v.shape[k];
    if (!fits)
        return fail_shape(ctx, NULL, "concat", "%s and %s along dimension %d", desc(a, da),
                          desc(b, db), dim);
    df_gnode *n = node_new(ctx, DF_OP_CONCAT);
    if (!n)
        return NULL;
    n->in[0] = a->v;
    n->in[1] = b->v;
    n->a.axis = d;
    set_out(n, a->v.dtype, nd, a->v.shape);
    n->out.shape[d] = a->v.shape[d] + b->v.shape[d];
    return df_emit(ctx, n);
}

df_tensor *df_gather(df_ctx *ctx, df_tensor *table, df_tensor *ids)
{
    if (!ready(ctx, "gather", 2, table, ids))
        return NULL;
    char dt[96], di[96];
    if (table->v.ndim != 2 || !is_float(table->v.dtype) || !is_int(ids->v.dtype) ||
        ids->v.ndim >= DF_MAX_DIMS)
        return fail_shape(ctx, NULL, "gather", "table %s must be [V, D] float, ids %s integer",
                          desc(table, dt), desc(ids, di));
    table = dense(ctx, table);
    ids = dense(ctx, ids);
    df_gnode *n = node_new(ctx, DF_OP_GATHER);
    if (!n || !table || !ids)
        return df_free(n), NULL;
    n->in[0] = table->v;
    n->in[1] = ids->v;
    set_out(n, DF_DTYPE_F32, ids->v.ndim, ids->v.shape);
    n->out.shape[n->out.ndim++] = table->v.shape[1];
    return df_emit(ctx, n);
}

df_tensor *df_token_rows(df_ctx *ctx, df_tensor *ids, int64_t token)
{
    if (!ready(ctx, "token_rows", 1, ids))
        return NULL;
    char di[96];
    if (ids->v.ndim != 2 || (ids->v.dtype != DF_DTYPE_I64 && ids->v.dtype != DF_DTYPE_I32) ||
        ids->v.shape[1] < 1)
        return fail_shape(ctx, NULL, "token_rows", "ids %s must be [B, S] i32 or i64",
                          desc(ids, di));
    ids = dense(ctx, ids);
    df_gnode *n = node_new(ctx, DF_OP_TOKEN_ROWS);
    if (!n || !ids)
        return df_free(n), NULL;
    n->in[0] = ids->v;
    n->a.token = token;
    set_out(n, DF_DTYPE_I64, 1, ids->v.shape);
    return df_emit(ctx, n);
}

/* --- elementwise -------------------------------------------------------------------------- */

static df_tensor *binary(df_ctx *ctx, df_op op, df_tensor *a, df_tensor *b)
{
    if (!ready(ctx, df_op_name(op), 2, a, b))
        return NULL;
    int nd;
    int64_t shape[DF_MAX_DIMS];
    char da[96], db[96];
    if (!is_float(a->v.dtype) || !is_float(b->v.dtype) || !broadcast_shape(&a->v, &b->v, &nd, shape))
        return fail_shape(ctx, NULL, df_op_name(op), "%s and %s do not broadcast",
                          desc(a, da), desc(b, db));
    df_gnode *n = node_new(ctx, op);
    if (!n)
        return NULL;
    n->in[0] = broadcast_view(&a->v, nd, shape);
    n->in[1] = broadcast_view(&b->v, nd, shape);
    set_out(n, DF_DTYPE_F32, nd, shape);
    return df_emit(ctx, n);
}

df_tensor *df_add(df_ctx *ctx, df_tensor *a, df_tensor *b) { return binary(ctx, DF_OP_ADD, a, b); }
df_tensor *df_sub(df_ctx *ctx, df_tensor *a, df_tensor *b) { return binary(ctx, DF_OP_SUB, a, b); }
df_tensor *df_mul(df_ctx *ctx, df_tensor *a, df_tensor *b) { return binary(ctx, DF_OP_MUL, a, b); }
df_tensor *df_div(df_ctx *ctx, df_tensor *a, df_tensor *b) { return binary(ctx, DF_OP_DIV, a, b); }

static df_tensor *unary(df_ctx *ctx, df_op op, df_tensor *x, float alpha, float beta)
{
    if (!ready(ctx, df_op_name(op), 1, x))
        return NULL;
    char dx[96];
    if (!is_float(x->v.dtype))
        return fail_shape(ctx, NULL, df_op_name(op), "%s is not a float tensor", desc(x, dx));
    df_gnode *n = node_new(ctx, op);
    if (!n)
        return NULL;
    n->in[0] = x->v;
    n->a.alpha = alpha;
    n->a.beta = beta;
    set_out(n, DF_DTYPE_F32, x->v.ndim, x->v.shape);
    return df_emit(ctx, n);
}

df_tensor *df_scale(df_ctx *ctx, df_tensor *x, float alpha, float beta)
{
    return unary(ctx, DF_OP_SCALE, x, alpha, beta);
}
df_tensor *df_silu(df_ctx *ctx, df_tensor *x) { return unary(ctx, DF_OP_SILU, x, 0, 0); }
df_tensor *df_gelu(df_ctx *ctx, df_tensor *x) { return unary(ctx, DF_OP_GELU, x, 0, 0); }
df_tensor *df_gelu_tanh(df_ctx *ctx, df_tensor *x) { return unary(ctx, DF_OP_GELU_TANH, x, 0, 0); }
df_tensor *df_quick_gelu(df_ctx *ctx, df_tensor *x) { return unary(ctx, DF_OP_QUICK_GELU, x, 0, 0); }

/* --- normalisation ------------------------------------------------------------------------ */

/* A [D] parameter (NULL allowed) for a last dimension of size d. */
static bool param_ok(const df_tensor *p, int64_t d)
{
    return !p || (p->v.ndim == 1 && p->v.shape[0] == d && is_float(p->v.dtype));
}

static df_tensor *norm_node(df_ctx *ctx, df_op op, df_tensor *x, df_tensor *w, df_tensor *b,
                            double eps, int64_t groups)
{
    df_gnode *n = dense_node(ctx, op, x, w, b);
    if (!n)
        return NULL;
    n->a.eps = eps;
    n->a.groups = groups;
    set_out(n, DF_DTYPE_F32, x->v.ndim, x->v.shape);
    return df_emit(ctx, n);
}

df_tensor *df_softmax(df_ctx *ctx, df_tensor *x)
{
    if (!ready(ctx, "softmax", 1, x))
        return NULL;
    return norm_node(ctx, DF_OP_SOFTMAX, x, NULL, NULL, 0, 0);
}

df_tensor *df_layer_norm(df_ctx *ctx, df_tensor *x, df_tensor *w, df_tensor *b, float eps)
{
    if (!ready(ctx, "layer_norm", 1, x))
        return NULL;
    char dx[96];
    int64_t d = df_tensor_dim(x, -1);
    if (x->v.ndim < 1 || !param_ok(w, d) || !param_ok(b, d))
        return fail_shape(ctx, NULL, "layer_norm", "weight/bias must be [%lld] for %s",
                          (long long)d, desc(x, dx));
    return norm_node(ctx, DF_OP_LAYER_NORM, x, w, b, eps, 0);
}

df_tensor *df_rms_norm(df_ctx *ctx, df_tensor *x, df_tensor *w, float eps)
{
    if (!ready(ctx, "rms_norm", 1, x))
        return NULL;
    char dx[96];
    int64_t d = df_tensor_dim(x, -1);
    if (x->v.ndim < 1 || !param_ok(w, d))
        return fail_shape(ctx, NULL, "rms_norm", "weight must be [%lld] for %s", (long long)d,
                          desc(x, dx));
    return norm_node(ctx, DF_OP_RMS_NORM, x, w, NULL, eps, 0);
}

df_tensor *df_group_norm(df_ctx *ctx, df_tensor *x, int groups, df_tensor *w, df_tensor *b,
                         float eps)
{
    if (!ready(ctx, "group_norm", 1, x))
        return NULL;
    char dx[96];
    int64_t c = x->v.ndim >= 2 ? x->v.shape[1] : 0;
    if (x->v.ndim < 2 || groups <= 0 || c % groups || !param_ok(w, c) || !param_ok(b, c))
        return fail_shape(ctx, NULL, "group_norm", "%s in %d groups (weight/bias [%lld])",
                          desc(x, dx), groups, (long long)c);
    return norm_node(ctx, DF_OP_GROUP_NORM, x, w, b, eps, groups);
}

/* --- positions and time ------------------------------------------------------------------- */

df_tensor *df_timestep_embedding(df_ctx *ctx, df_tensor *t, int dim, bool flip, float shift,
                                 float scale, float max_period)
{
    if (!ready(ctx, "timestep_embedding", 1, t))
        return NULL;
    char dt[96];
    if (t->v.ndim != 1 || dim <= 1 || !is_float(t->v.dtype))
        return fail_shape(ctx, NULL, "timestep_embedding", "t %s must be [B] float, dim %d > 1",
                          desc(t, dt), dim);
    t = dense(ctx, t);
    df_gnode *n = node_new(ctx, DF_OP_TIMESTEP_EMBED);
    if (!n || !t)
        return df_free(n), NULL;
    n->in[0] = t->v;
    n->a.dim = dim;
    n->a.flip = flip;
    n->a.shift = shift;
    n->a.scale = scale;
    n->a.max_period = max_period;
    set_out(n, DF_DTYPE_F32, 2, (int64_t[]){t->v.shape[0], dim});
    return df_emit(ctx, n);
}

df_tensor *df_rope_table(df_ctx *ctx, df_tensor *ids, const int *axes_dim, int n_axes,
                         double theta)
{
    if (!ready(ctx, "rope_table", 1, ids))
        return NULL;
    char di[96];
    if (ids->v.ndim != 2 || ids->v.shape[1] != n_axes || n_axes < 1 || n_axes > DF_ATTR_MAX_AXES)
        return fail_shape(ctx, NULL, "rope_table", "ids %s must be [S, %d]", desc(ids, di),
                          n_axes);
    int64_t total = 0;
    for (int a = 0; a < n_axes; a++) {
        if (axes_dim[a] <= 0 || axes_dim[a] % 2)
            return fail_shape(ctx, NULL, "rope_table", "axis %d has odd or empty size %d", a,
                              axes_dim[a]);
        total += axes_dim[a];
    }
    ids = dense(ctx, ids);
    df_gnode *n = node_new(ctx, DF_OP_ROPE_TABLE);
    if (!n || !ids)
        return df_free(n), NULL;
    n->in[0] = ids->v;
    n->a.n_axes = n_axes;
    for (int a = 0; a < n_axes; a++)
        n->a.axes_dim[a] = axes_dim[a];
    n->a.theta = theta;
    set_out(n, DF_DTYPE_F32, 3, (int64_t[]){ids->v.shape[0], total / 2, 2});
    return df_emit(ctx, n);
}

df_tensor *df_rope(df_ctx *ctx, df_tensor *x, df_tensor *table)
{
    if (!ready(ctx, "rope", 2, x, table))
        return NULL;
    char dx[96], dt[96];
    if (x->v.ndim != 4 || table->v.ndim != 3 || table->v.shape[0] != x->v.shape[2] ||
        table->v.shape[1] * 2 != x->v.shape[3] || table->v.shape[2] != 2 ||
        table->v.dtype != DF_DTYPE_F32)
        return fail_shape(ctx, NULL, "rope", "x %s [B, H, S, D] and table %s [S, D/2, 2] f32",
                          desc(x, dx), desc(table, dt));
    if (x->v.stride[3] != 1)
        x = df_contiguous(ctx, x);
    table = dense(ctx, table);
    df_gnode *n = node_new(ctx, DF_OP_ROPE);
    if (!n || !x || !table)
        return df_free(n), NULL;
    n->in[0] = x->v;
    n->in[1] = table->v;
    set_out(n, DF_DTYPE_F32, 4, x->v.shape);
    return df_emit(ctx, n);
}

/* --- matrix products ---------------------------------------------------------------------- */

/* A LINEAR node for x w^T (+ b), not yet emitted; NULL (and the context failed) when the
 * shapes do not fit. */
static df_gnode *linear_node(df_ctx *ctx, df_tensor *x, df_tensor *w, df_tensor *b)
{
    char dx[96], dw[96];
    int64_t k = df_tensor_dim(x, -1);
    if (x->v.ndim < 1 || w->v.ndim != 2 || w->v.shape[1] != k ||
        !(is_float(w->v.dtype) || w->v.dtype == DF_DTYPE_I8) || !param_ok(b, w->v.shape[0])) {
        fail_shape(ctx, NULL, "linear", "x %s and weight %s (bias %s)", desc(x, dx), desc(w, dw),
                   b ? "given" : "none");
        return NULL;
    }
    df_gnode *n = dense_node(ctx, DF_OP_LINEAR, x, w, b);
    if (!n)
        return NULL;
    n->a.compute = ctx->compute;
    set_out(n, DF_DTYPE_F32, x->v.ndim, x->v.shape);
    n->out.shape[x->v.ndim - 1] = w->v.shape[0];
    return n;
}

/* y + h up^T, the second half of an unmerged LoRA's side product. Where the device's
 * products have the gated residual epilogue (out = in[4] + in[3] * (x w^T + b)), it is one
 * product that adds y on its way out, with a gate row of ones: no add pass over [.., N]
 * and no [.., N] temporary. Elsewhere a product and an add. */
static df_tensor *lora_up(df_ctx *ctx, df_tensor *h, df_tensor *up, df_tensor *y)
{
    df_linear_weights uw = {.weight = up};
    if (!df_dev_has(ctx->dev, DF_CAP_EPI_GATED_RESIDUAL) || !h || !y || y->v.dtype != DF_DTYPE_F32)
        return df_add(ctx, y, df_linear(ctx, h, &uw));
    if (!ready(ctx, "linear", 1, up))
        return NULL;
    df_tensor *ones = df_full(ctx, DF_DTYPE_F32, (int64_t[]){up->v.shape[0]}, 1, 1.0); /* [N] */
    df_gnode *n = ones ? linear_node(ctx, h, up, NULL) : NULL;
    if (!n)
        return NULL;
    char dh[96], du[96], dy[96];
    if (y->v.ndim != n->out.ndim ||
        memcmp(y->v.shape, n->out.shape, (size_t)y->v.ndim * sizeof y->v.shape[0]) != 0)
        return fail_shape(ctx, n, "linear", "the LoRA update %s x %s^T does not fit the output %s",
                          desc(h, dh), desc(up, du), desc(y, dy));
    n->in[3] = ones->v;
    n->in[4] = y->v; /* a product's own output: dense */
    n->a.gated = 1;
    return df_emit(ctx, n);
}

df_tensor *df_linear(df_ctx *ctx, df_tensor *x, const df_linear_weights *lw)
{
    if (!ready(ctx, "linear", 2, x, lw ? lw->weight : NULL))
        return NULL;
    df_gnode *n = linear_node(ctx, x, lw->weight, lw->bias);
    df_tensor *y = n ? df_emit(ctx, n) : NULL;
    if (!y || (!lw->lora_down && !lw->lora_up))
        return y;
    df_tensor *h = df_linear(ctx, x, &(df_linear_weights){.weight = lw->lora_down}); /* [.., R] */
    return lora_up(ctx, h, lw->lora_up, y);
}

/* A [.., K, N] operand is either dense or the transpose of a dense [.., N, K]. */
static bool transposed_dense(const df_gview *v)
{
    int nd = v->ndim;
    if (nd < 2 || v->stride[nd - 2] != 1 || v->stride[nd - 1] != v->shape[nd - 2])
        return false;
    int64_t s = v->shape[nd - 2] * v->shape[nd - 1];
    for (int d = nd - 3; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != s)
            return false;
        s *= v->shape[d];
    }
    return true;
}

df_tensor *df_matmul(df_ctx *ctx, df_tensor *a, df_tensor *b)
{
    if (!ready(ctx, "matmul", 2, a, b))
        return NULL;
    char da[96], db[96];
    int na = a->v.ndim, nb = b->v.ndim;
    bool fits = na >= 2 && nb >= 2 && a->v.shape[na - 1] == b->v.shape[nb - 2] &&
                (nb == 2 || nb == na);
    for (int d = 0; fits && nb == na && d < na - 2; d++)
        fits = a->v.shape[d] == b->v.shape[d];
    if (!fits || !is_float(a->v.dtype) || !is_float(b->v.dtype))
        return fail_shape(ctx, NULL, "matmul", "%s @ %s", desc(a, da), desc(b, db));
    a = dense(ctx, a);
    bool bt = transposed_dense(&b->v);
    if (!bt)
        b = dense(ctx, b);
    df_gnode *n = node_new(ctx, DF_OP_MATMUL);
    if (!n || !a || !b)
        return df_free(n), NULL;
    n->in[0] = a->v;
    n->in[1] = b->v;
    n->a.compute = ctx->compute;
    n->a.trans_b = bt;
    set_out(n, DF_DTYPE_F32, na, a->v.shape);
    n->out.shape[na - 1] = b->v.shape[nb - 1];
    return df_emit(ctx, n);
}

df_tensor *df_attention(df_ctx *ctx, df_tensor *q, df_tensor *k, df_tensor *v, df_tensor *mask,
                        bool causal, float scale)
{
    if (!ready(ctx, "attention", 3, q, k, v))
        return NULL;
    char dq[96], dk[96], dv[96];
    bool fits = q->v.ndim == 4 && k->v.ndim == 4 && v->v.ndim == 4 &&
                k->v.shape[0] == q->v.shape[0] && k->v.shape[1] == q->v.shape[1] &&
                k->v.shape[3] == q->v.shape[3] && v->v.shape[0] == q->v.shape[0] &&
                v->v.shape[1] == q->v.shape[1] && v->v.shape[2] == k->v.shape[2];
    if (!fits)
        return fail_shape(ctx, NULL, "attention", "q %s, k %s, v %s", desc(q, dq), desc(k, dk),
                          desc(v, dv));
    int64_t B = q->v.shape[0], H = q->v.shape[1], Sq = q->v.shape[2], Sk = k->v.shape[2];
    int64_t mshape[4] = {B, H, Sq, Sk};
    df_gview mv = {0};
    if (mask) {
        int nd;
        int64_t bs[DF_MAX_DIMS];
        if (mask->v.ndim > 4 || !broadcast_shape(&mask->v, &(df_gview){.ndim = 4, .shape = {B, H, Sq, Sk}}, &nd, bs) ||
            bs[0] != B || bs[1] != H || bs[2] != Sq || bs[3] != Sk || mask->v.dtype != DF_DTYPE_F32)
            return fail_shape(ctx, NULL, "attention", "mask %s does not broadcast to [%lld, %lld, %lld, %lld] f32",
                              desc(mask, dq), (long long)B, (long long)H, (long long)Sq, (long long)Sk);
        mv = broadcast_view(&mask->v, 4, mshape);
    }
    /* The kernel reads rows with unit stride; other strides are free. */
    if (q->v.stride[3] != 1)
        q = df_contiguous(ctx, q);
    if (k->v.stride[3] != 1)
        k = df_contiguous(ctx, k);
    if (v->v.stride[3] != 1)
        v = df_contiguous(ctx, v);
    df_gnode *n = node_new(ctx, DF_OP_ATTENTION);
    if (!n || !q || !k || !v)
        return df_free(n), NULL;
    n->in[0] = q->v;
    n->in[1] = k->v;
    n->in[2] = v->v;
    if (mask)
        n->in[3] = mv;
    n->a.causal = causal;
    n->a.compute = df_ctx_attention_compute(ctx); /* f32 when int8 attention is off */
    n->a.scale = scale > 0 ? scale : 1.0 / sqrt((double)q->v.shape[3]);
    /* The node writes [B, Sq, H, Dv] densely, so that the usual transpose back to
     * [B, Sq, H*Dv] is free; the caller sees the [B, H, Sq, Dv] view of it. */
    set_out(n, DF_DTYPE_F32, 4, (int64_t[]){B, Sq, H, v->v.shape[3]});
    df_tensor *o = df_emit(ctx, n);
    return o ? df_transpose(ctx, o, 1, 2) : NULL;
}

df_tensor *df_conv2d(df_ctx *ctx, df_tensor *x, df_tensor *w, df_tensor *b, int stride,
                     int padding)
{
    if (!ready(ctx, "conv2d", 2, x, w))
        return NULL;
    char dx[96], dw[96];
    bool fits = x->v.ndim == 4 && w->v.ndim == 4 && w->v.shape[1] == x->v.shape[1] &&
                stride >= 1 && padding >= 0 && param_ok(b, w->v.shape[0]);
    int64_t ho = 0, wo = 0;
    if (fits) {
        ho = (x->v.shape[2] + 2 * padding - w->v.shape[2]) / stride + 1;
        wo = (x->v.shape[3] + 2 * padding - w->v.shape[3]) / stride + 1;
        fits = ho > 0 && wo > 0;
    }
    if (!fits)
        return fail_shape(ctx, NULL, "conv2d", "x %s, weight %s, stride %d, padding %d",
                          desc(x, dx), desc(w, dw), stride, padding);
    df_gnode *n = dense_node(ctx, DF_OP_CONV2D, x, w, b);
    if (!n)
        return NULL;
    n->a.stride = stride;
    n->a.padding = padding;
    n->a.compute = ctx->compute;
    set_out(n, DF_DTYPE_F32, 4, (int64_t[]){x->v.shape[0], w->v.shape[0], ho, wo});
    return df_emit(ctx, n);
}

df_tensor *df_upsample_nearest2x(df_ctx *ctx, df_tensor *x)
{
    if (!ready(ctx, "upsample_nearest2x", 1, x))
        return NULL;
    char dx[96];
    if (x->v.ndim != 4)
        return fail_shape(ctx, NULL, "upsample_nearest2x", "x %s must be [B, C, H, W]",
                          desc(x, dx));
    x = dense(ctx, x);
    df_gnode *n = node_new(ctx, DF_OP_UPSAMPLE2X);
    if (!n || !x)
        return df_free(n), NULL;
    n->in[0] = x->v;
    set_out(n, DF_DTYPE_F32, 4,
            (int64_t[]){x->v.shape[0], x->v.shape[1], 2 * x->v.shape[2], 2 * x->v.shape[3]});
    return df_emit(ctx, n);
}

/* --- tensor parallelism ------------------------------------------------------------------- */

void df_ctx_set_comm(df_ctx *ctx, df_comm *comm)
{
    ctx->comm = comm;
}

df_comm *df_ctx_comm(const df_ctx *ctx)
{
    return ctx->comm;
}

df_tensor *df_all_reduce(df_ctx *ctx, df_tensor *x)
{
    if (!ready(ctx, "all_reduce", 1, x))
        return NULL;
    char dx[96];
    if (x->v.dtype != DF_DTYPE_F32)
        return fail_shape(ctx, NULL, "all_reduce", "%s must be f32", desc(x, dx));
    x = dense(ctx, x);
    df_gnode *n = node_new(ctx, DF_OP_ALL_REDUCE);
    if (!n || !x)
        return df_free(n), NULL;
    n->in[0] = x->v;
    n->comm = ctx->comm;
    set_out(n, DF_DTYPE_F32, x->v.ndim, x->v.shape);
    return df_emit(ctx, n);
}
