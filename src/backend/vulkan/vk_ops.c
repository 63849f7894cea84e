/*
 * Recording the ops of backend/ops.def: the elementwise ops, norms, positions and data
 * movement (matrix products, attention, convolution and the fused program are in
 * vk_ops_mm.c). Each op turns its node into a parameter block for its shader (addresses,
 * dtypes, shapes, strides), declares the ranges it reads and writes, and dispatches.
 *
 * The semantics are the CPU kernels' (src/backend/cpu/): the same inputs, attributes and
 * output dtypes. Arithmetic is f32 throughout (the CPU accumulates some statistics in
 * double; here they are f32 tree reductions), so results agree within f32 rounding, not to
 * the bit. The timestep embedding and the RoPE table run on the device too, their sines
 * and cosines within an ulp of libm's (position.comp).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

/* ---- shared helpers --------------------------------------------------------------------- */

static int64_t numel(const df_view *v)
{
    return df_shape_numel(v->ndim, v->shape);
}

dvk_range dvk_view_range(const dvk_env *e, const df_view *v)
{
    VkDeviceAddress a = e->addr(e->user, v);
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < v->ndim; d++) {
        if (v->shape[d] == 0)
            return (dvk_range){a, a};
        int64_t span = (v->shape[d] - 1) * v->stride[d];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    int64_t es = dvk_esize(v->dtype);
    return (dvk_range){(uint64_t)((int64_t)a + lo * es), (uint64_t)((int64_t)a + (hi + 1) * es)};
}

/* Groups for `n` invocations of workgroups of `local`: x up to 65535, the rest in y. */
static void grid(int64_t n, int64_t local, uint32_t *gx, uint32_t *gy)
{
    int64_t groups = (n + local - 1) / local;
    int64_t x = groups < 65535 ? groups : 65535;
    *gx = (uint32_t)(x > 0 ? x : 0);
    *gy = (uint32_t)(x > 0 ? (groups + x - 1) / x : 0);
}

static df_status no_f64(const df_view *v, const char *op)
{
    if (dvk_has(v) && v->dtype == DF_DTYPE_F64)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan %s: f64 tensors are not supported", op);
    return DF_OK;
}

/* ---- elementwise ------------------------------------------------------------------------ */

typedef struct ew_view {
    uint64_t addr;
    int64_t dtype;
    int64_t stride[DVK_MAX_DIMS];
} ew_view;

typedef struct ew_params {
    int64_t ndim, total, groups_x, pad;
    int64_t shape[DVK_MAX_DIMS];
    ew_view o, a, b;
    float f0, f1;
    int64_t fill_i;
    float fill_f, pad2;
} ew_params;

/* Fills p's shape and the views' strides, with size-1 dimensions dropped and neighbours
 * that every view steps through evenly merged (as the CPU's walk does). */
static void ew_shape(ew_params *p, const dvk_env *e, const df_view *const v[], int nv,
                     const df_view *shape_of)
{
    ew_view *w[3] = {&p->o, &p->a, &p->b};
    int nd = 0;
    p->total = 1;
    for (int k = 0; k < nv; k++) {
        w[k]->addr = e->addr(e->user, v[k]);
        w[k]->dtype = v[k]->dtype;
    }
    for (int d = 0; d < shape_of->ndim; d++) {
        int64_t n = shape_of->shape[d];
        p->total *= n;
        if (n == 1)
            continue;
        bool merge = nd > 0;
        for (int k = 0; merge && k < nv; k++)
            merge = w[k]->stride[nd - 1] == v[k]->stride[d] * n;
        if (merge) {
            p->shape[nd - 1] *= n;
            for (int k = 0; k < nv; k++)
                w[k]->stride[nd - 1] = v[k]->stride[d];
        } else {
            p->shape[nd] = n;
            for (int k = 0; k < nv; k++)
                w[k]->stride[nd] = v[k]->stride[d];
            nd++;
        }
    }
    if (nd == 0) {
        nd = 1;
        p->shape[0] = 1;
    }
    p->ndim = nd;
}

/* ew.comp, specialised for op (its df_op number: vocab.glsl's OP_*). */
static df_status ew_run(const dvk_env *e, df_op op, const df_view *out, const df_view *a,
                        const df_view *b, float f0, float f1, double fill)
{
    static int shader = -2;
    if (shader == -2)
        shader = dvk_shader_find("ew");
    ew_params p;
    memset(&p, 0, sizeof p);
    const df_view *v[3] = {out, a, b};
    int nv = b ? 3 : a ? 2 : 1;
    for (int k = 0; k < nv; k++)
        DF_TRY(no_f64(v[k], "elementwise"));
    ew_shape(&p, e, v, nv, out);
    p.f0 = f0;
    p.f1 = f1;
    p.fill_f = (float)fill;
    p.fill_i = fill != fill ? 0 : fill >= 0x1p63 ? INT64_MAX : fill <= -0x1p63 ? INT64_MIN
                                                                            : (int64_t)fill;
    uint32_t gx, gy;
    grid(p.total, 256, &gx, &gy);
    p.groups_x = gx;
    dvk_range r[2], w = dvk_view_range(e, out);
    for (int k = 1; k < nv; k++)
        r[k - 1] = dvk_view_range(e, v[k]);
    dvk_hazard(e->d, r, nv - 1, &w, 1);
    uint32_t spec[1] = {(uint32_t)op};
    return dvk_dispatch(e->d, shader, spec, 1, &p, sizeof p, gx, gy, 1);
}

df_status dvk_run_copy_views(const dvk_env *e, const df_view *dst, const df_view *src)
{
    return ew_run(e, DF_OP_COPY, dst, src, NULL, 0, 0, 0);
}

static df_status run_elementwise(const dvk_env *e, const df_node *n)
{
    const df_view *a = n->n_in >= 1 ? &n->in[0] : NULL, *b = n->n_in >= 2 ? &n->in[1] : NULL;
    return ew_run(e, n->op, &n->out, a, b, (float)n->a.alpha, (float)n->a.beta, n->a.value);
}

/* ---- data movement ---------------------------------------------------------------------- */

static df_status run_concat(const dvk_env *e, const df_node *n)
{
    const df_view *a = &n->in[0], *b = &n->in[1], *out = &n->out;
    int d = (int)n->a.axis;
    df_view part = *out;
    memcpy(part.shape, a->shape, sizeof part.shape);
    DF_TRY(dvk_run_copy_views(e, &part, a));
    memcpy(part.shape, b->shape, sizeof part.shape);
    part = dvk_view_shift(part, a->shape[d] * out->stride[d]);
    return dvk_run_copy_views(e, &part, b);
}

/* Nearest 2x: out [B, C, 2H, 2W] seen as [B*C*H, 2, W, 2], x as the same shape with
 * stride 0 over the two repeats. */
static df_status run_upsample(const dvk_env *e, const df_node *n)
{
    const df_view *x = &n->in[0];
    int64_t W = x->shape[3], rows = x->shape[0] * x->shape[1] * x->shape[2];
    df_view o = n->out, s = *x;
    o.ndim = s.ndim = 4;
    int64_t shape[4] = {rows, 2, W, 2};
    memcpy(o.shape, shape, sizeof shape);
    memcpy(s.shape, shape, sizeof shape);
    int64_t os[4] = {4 * W, 2 * W, 2, 1}, xs[4] = {x->stride[2], 0, x->stride[3], 0};
    memcpy(o.stride, os, sizeof os);
    memcpy(s.stride, xs, sizeof xs);
    if (x->shape[0] * x->shape[1] > 1 &&
        (x->stride[1] != x->shape[2] * x->stride[2] ||
         (x->shape[0] > 1 && x->stride[0] != x->shape[1] * x->stride[1])))
        return df_errorf(DF_E_UNSUPPORTED, "vulkan upsample: x must have dense planes");
    return dvk_run_copy_views(e, &o, &s);
}

typedef struct gather_params {
    uint64_t table, ids, out, fault;
    int64_t table_dtype, ids_dtype, rows, dim, count, groups_x;
} gather_params;

static df_status run_gather(const dvk_env *e, const df_node *n)
{
    const df_view *t = &n->in[0], *ids = &n->in[1];
    gather_params p = {.table = e->addr(e->user, t),
                       .ids = e->addr(e->user, ids),
                       .out = e->addr(e->user, &n->out),
                       .fault = e->d->fault.addr,
                       .table_dtype = t->dtype,
                       .ids_dtype = ids->dtype,
                       .rows = t->shape[0],
                       .dim = t->shape[1],
                       .count = numel(ids)};
    DF_TRY(no_f64(t, "gather"));
    uint32_t gx, gy;
    grid(p.count * p.dim, 256, &gx, &gy);
    p.groups_x = gx;
    dvk_range r[2] = {dvk_view_range(e, t), dvk_view_range(e, ids)};
    dvk_range w = dvk_view_range(e, &n->out);
    dvk_hazard(e->d, r, 2, &w, 1);
    return dvk_dispatch(e->d, dvk_shader_find("gather"), NULL, 0, &p, sizeof p, gx, gy, 1);
}

typedef struct token_rows_params {
    uint64_t ids, out;
    int64_t ids_dtype, rows, len, token;
} token_rows_params;

static df_status run_token_rows(const dvk_env *e, const df_node *n)
{
    const df_view *ids = &n->in[0];
    token_rows_params p = {.ids = e->addr(e->user, ids),
                           .out = e->addr(e->user, &n->out),
                           .ids_dtype = ids->dtype,
                           .rows = ids->shape[0],
                           .len = ids->shape[1],
                           .token = n->a.token};
    dvk_range r = dvk_view_range(e, ids), w = dvk_view_range(e, &n->out);
    dvk_hazard(e->d, &r, 1, &w, 1);
    uint32_t gx = (uint32_t)((p.rows + 63) / 64);
    return dvk_dispatch(e->d, dvk_shader_find("token_rows"), NULL, 0, &p, sizeof p, gx, 1, 1);
}

/* ---- norms and softmax ------------------------------------------------------------------ */


typedef struct norm_params {
    uint64_t x, w, b, out;
    int64_t x_dtype, w_dtype, b_dtype;
    int64_t rows, d, hw, cpg, channels, groups_x;
    float eps, pad;
} norm_params;

/* norm.comp's workgroup, and the invocations it gives one row of d values (its LANES): a
 * power of two from 8 to NORM_WG with about four values each, so that a text encoder's
 * 32-96-value rows share a workgroup (NORM_WG / lanes rows each) instead of each leaving
 * most of one idle. */
enum { NORM_WG = 256 };

static int norm_lanes(int64_t d)
{
    int lanes = 8;
    while (lanes < NORM_WG && (int64_t)lanes * 4 < d)
        lanes *= 2;
    return lanes;
}

static df_status run_norm(const dvk_env *e, const df_node *n)
{
    const df_view *x = &n->in[0];
    norm_params p = {.x = e->addr(e->user, x),
                     .out = e->addr(e->user, &n->out),
                     .x_dtype = x->dtype,
                     .eps = (float)n->a.eps};
    df_op op = n->op; /* norm.comp's specialisation: SOFTMAX, LAYER_NORM, RMS_NORM, GROUP_NORM */
    if (op == DF_OP_SOFTMAX)
        p.eps = 0;
    dvk_range r[3];
    int nr = 0;
    r[nr++] = dvk_view_range(e, x);
    for (int i = 1; i < n->n_in && i < 3; i++) {
        if (!dvk_has(&n->in[i]))
            continue;
        DF_TRY(no_f64(&n->in[i], dvk_op_name(n->op)));
        uint64_t a = e->addr(e->user, &n->in[i]);
        if (i == 1)
            p.w = a, p.w_dtype = n->in[i].dtype;
        else
            p.b = a, p.b_dtype = n->in[i].dtype;
        r[nr++] = dvk_view_range(e, &n->in[i]);
    }
    DF_TRY(no_f64(x, dvk_op_name(n->op)));
    if (op == DF_OP_GROUP_NORM) {
        int64_t batch = x->shape[0], channels = x->shape[1], groups = n->a.groups, hw = 1;
        for (int d = 2; d < x->ndim; d++)
            hw *= x->shape[d];
        if (groups <= 0 || channels % groups)
            return df_errorf(DF_E_INTERNAL, "vulkan group_norm: %lld channels in %lld groups",
                             (long long)channels, (long long)groups);
        p.cpg = channels / groups;
        p.hw = hw;
        p.channels = channels;
        p.rows = batch * groups;
        p.d = p.cpg * hw;
    } else {
        p.d = x->ndim > 0 ? x->shape[x->ndim - 1] : 1;
        p.rows = p.d > 0 ? numel(x) / p.d : 0;
    }
    int lanes = norm_lanes(p.d);
    uint32_t gx, gy;
    grid(p.rows, NORM_WG / lanes, &gx, &gy);
    p.groups_x = gx;
    dvk_range w = dvk_view_range(e, &n->out);
    dvk_hazard(e->d, r, nr, &w, 1);
    uint32_t spec[2] = {(uint32_t)op, (uint32_t)lanes};
    return dvk_dispatch(e->d, dvk_shader_find("norm"), spec, 2, &p, sizeof p, gx, gy, 1);
}

/* ---- RoPE --------------------------------------------------------------------------------- */

typedef struct rope_params {
    uint64_t x, table, w, out;
    int64_t x_dtype, w_dtype, out_dtype, norm;
    int64_t B, H, S, D;
    int64_t xs[4], os[4];
    int64_t groups_x;
    float eps, pad;
} rope_params;

static df_status run_rope(const dvk_env *e, const df_node *n)
{
    const df_view *x = &n->in[0], *o = &n->out;
    bool fused = n->op == DF_OP_RMS_NORM_ROPE;
    const df_view *table = &n->in[fused ? 2 : 1];
    DF_TRY(no_f64(x, "rope"));
    rope_params p = {.x = e->addr(e->user, x),
                     .table = e->addr(e->user, table),
                     .out = e->addr(e->user, o),
                     .x_dtype = x->dtype,
                     .out_dtype = o->dtype,
                     .norm = fused,
                     .eps = (float)n->a.eps};
    dvk_range r[3] = {dvk_view_range(e, x), dvk_view_range(e, table)};
    int nr = 2;
    if (fused) { /* x [B, S, H, D] dense; out a [B, H, S, D] view */
        p.B = x->shape[0], p.S = x->shape[1], p.H = x->shape[2], p.D = x->shape[3];
        int64_t xs[4] = {x->stride[0], x->stride[2], x->stride[1], x->stride[3]};
        memcpy(p.xs, xs, sizeof xs);
        if (dvk_has(&n->in[1])) {
            p.w = e->addr(e->user, &n->in[1]);
            p.w_dtype = n->in[1].dtype;
            r[nr++] = dvk_view_range(e, &n->in[1]);
        }
    } else { /* x [B, H, S, D] strided; out dense */
        p.B = x->shape[0], p.H = x->shape[1], p.S = x->shape[2], p.D = x->shape[3];
        memcpy(p.xs, x->stride, sizeof p.xs);
    }
    memcpy(p.os, o->stride, sizeof p.os);
    int64_t rows = p.B * p.H * p.S;
    uint32_t gx, gy;
    grid(rows, 1, &gx, &gy);
    p.groups_x = gx;
    if (p.D > 1024)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan rope: head dim %lld > 1024", (long long)p.D);
    dvk_range w = dvk_view_range(e, o);
    dvk_hazard(e->d, r, nr, &w, 1);
    return dvk_dispatch(e->d, dvk_shader_find("rope"), NULL, 0, &p, sizeof p, gx, gy, 1);
}

/* ---- positions --------------------------------------------------------------------------- */
/* position.comp: the frequencies depend on the attributes only, so the host computes them
 * as the CPU does and they travel in the parameter block after its fixed part; the angles,
 * sines and cosines are the shader's, so nothing waits for the device. */


typedef struct timestep_params {
    uint64_t t, out;
    int64_t t_dtype, t_stride, batch, dim, half, flip, groups_x;
    float scale, pad;
} timestep_params;

typedef struct rope_table_params {
    uint64_t ids, out;
    int64_t ids_dtype, ids_s0, ids_s1, seq, pairs, n_axes, groups_x, pad;
    int64_t axis_of[8];
} rope_table_params;

/* One position.comp dispatch of `kind` reading `in` and writing `out`; frees `block`, the
 * parameters and the frequency table the host computed. */
static df_status position_dispatch(const dvk_env *e, const df_view *in, const df_view *out,
                                   uint32_t kind, char *block, size_t bytes, uint32_t gx,
                                   uint32_t gy)
{
    dvk_range r = dvk_view_range(e, in), w = dvk_view_range(e, out);
    dvk_hazard(e->d, &r, 1, &w, 1);
    uint32_t spec[1] = {kind};
    df_status s = dvk_dispatch(e->d, dvk_shader_find("position"), spec, 1, block, bytes, gx, gy,
                               1);
    free(block);
    return s;
}

static df_status run_timestep(const dvk_env *e, const df_node *n)
{
    const df_view *t = &n->in[0];
    int64_t batch = t->shape[0], dim = n->a.dim, half = dim / 2;
    timestep_params p = {.t = e->addr(e->user, t),
                         .out = e->addr(e->user, &n->out),
                         .t_dtype = t->dtype,
                         .t_stride = t->ndim > 0 ? t->stride[0] : 0,
                         .batch = batch,
                         .dim = dim,
                         .half = half,
                         .flip = n->a.flip != 0,
                         .scale = (float)n->a.scale};
    size_t bytes = sizeof p + (size_t)half * sizeof(float);
    char *block = malloc(bytes);
    if (!block)
        return df_errorf(DF_E_OOM, "vulkan timestep_embed: out of host memory");
    float *freq = (float *)(block + sizeof p);
    float neg_log = (float)-log(n->a.max_period);
    float denom = (float)((double)half - n->a.shift);
    for (int64_t i = 0; i < half; i++)
        freq[i] = expf(neg_log * (float)i / denom);
    uint32_t gx, gy;
    grid(batch * (half + dim % 2), 64, &gx, &gy);
    p.groups_x = gx;
    memcpy(block, &p, sizeof p);
    return position_dispatch(e, t, &n->out, DF_OP_TIMESTEP_EMBED, block, bytes, gx, gy);
}

static df_status run_rope_table(const dvk_env *e, const df_node *n)
{
    const df_view *ids = &n->in[0];
    int64_t seq = ids->shape[0], pairs = n->out.shape[1];
    int n_axes = (int)n->a.n_axes;
    if (n_axes < 1 || n_axes > 7)
        return df_errorf(DF_E_INTERNAL, "vulkan rope_table: %d axes", n_axes);
    rope_table_params p = {.ids = e->addr(e->user, ids),
                           .out = e->addr(e->user, &n->out),
                           .ids_dtype = ids->dtype,
                           .ids_s0 = ids->stride[0],
                           .ids_s1 = ids->ndim > 1 ? ids->stride[1] : 1,
                           .seq = seq,
                           .pairs = pairs,
                           .n_axes = n_axes};
    size_t bytes = sizeof p + (size_t)pairs * 2 * sizeof(float);
    char *block = malloc(bytes);
    if (!block)
        return df_errorf(DF_E_OOM, "vulkan rope_table: out of host memory");
    /* freq_k = 1 / theta^(2k/d) in f64, as hi + lo in f32 */
    float *freq = (float *)(block + sizeof p);
    int64_t k0 = 0;
    double theta = n->a.theta;
    for (int a = 0; a < n_axes; a++) {
        int64_t d = n->a.axes_dim[a];
        p.axis_of[a] = k0 < pairs ? k0 : pairs;
        for (int64_t k = 0; k < d / 2 && k0 + k < pairs; k++) {
            double f = 1.0 / pow(theta, (double)(2 * k) / (double)d);
            freq[2 * (k0 + k)] = (float)f;
            freq[2 * (k0 + k) + 1] = (float)(f - (double)(float)f);
        }
        k0 += d / 2;
    }
    p.axis_of[n_axes] = k0 < pairs ? k0 : pairs;
    for (int64_t k = k0; k < pairs; k++) /* past the last axis: not written */
        freq[2 * k] = freq[2 * k + 1] = 0.0f;
    uint32_t gx, gy;
    grid(seq * pairs, 64, &gx, &gy);
    p.groups_x = gx;
    memcpy(block, &p, sizeof p);
    return position_dispatch(e, ids, &n->out, DF_OP_ROPE_TABLE, block, bytes, gx, gy);
}

/* ---- the table -------------------------------------------------------------------------- */

df_status dvk_run_linear(const dvk_env *e, const df_node *n);
df_status dvk_run_matmul(const dvk_env *e, const df_node *n);
df_status dvk_run_conv2d(const dvk_env *e, const df_node *n);
df_status dvk_run_attention(const dvk_env *e, const df_node *n);

typedef df_status (*run_fn)(const dvk_env *e, const df_node *n);

/* The kernel of each op, NULL where this device has none (ALL_REDUCE runs on the host-staged
 * path). ew.comp computes FILL and every op marked fuse in ops.def, keyed by its df_op (a
 * unary one through common.glsl's unary_f, which vulkan/vocab checks has its branch). */
static const run_fn run_table[DF_OP_COUNT] = {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                      \
    DF_IF_##fuse([DF_OP_##name] = run_elementwise, )
#include "backend/ops.def"
#undef DF_OP
    [DF_OP_FILL]           = run_elementwise,
    [DF_OP_SOFTMAX]        = run_norm,
    [DF_OP_LAYER_NORM]     = run_norm,
    [DF_OP_RMS_NORM]       = run_norm,
    [DF_OP_GROUP_NORM]     = run_norm,
    [DF_OP_TIMESTEP_EMBED] = run_timestep,
    [DF_OP_ROPE_TABLE]     = run_rope_table,
    [DF_OP_ROPE]           = run_rope,
    [DF_OP_RMS_NORM_ROPE]  = run_rope,
    [DF_OP_LINEAR]         = dvk_run_linear,
    [DF_OP_MATMUL]         = dvk_run_matmul,
    [DF_OP_ATTENTION]      = dvk_run_attention,
    [DF_OP_CONV2D]         = dvk_run_conv2d,
    [DF_OP_UPSAMPLE2X]     = run_upsample,
    [DF_OP_CONCAT]         = run_concat,
    [DF_OP_GATHER]         = run_gather,
    [DF_OP_TOKEN_ROWS]     = run_token_rows,
};

bool dvk_op_supported(df_op op)
{
    return (unsigned)op < DF_OP_COUNT && run_table[op] != NULL;
}

df_status dvk_run_node(const dvk_env *e, const df_node *n)
{
    if (!dvk_op_supported(n->op))
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: op '%s' is not supported on this device "
                         "(collectives run on the host-staged path only)",
                         dvk_op_name(n->op));
    if (numel(&n->out) == 0)
        return DF_OK;
    return run_table[n->op](e, n);
}
