/*
 * Recording the matrix products (linear, matmul, conv2d), attention and the fused
 * elementwise program. Shapes and attributes are the CPU kernels' (k_matmul.c, k_conv.c,
 * k_attention.c, k_fused.c); the shaders are mm.comp, attn.comp and fused.comp.
 *
 * Compute dtype: f32, or bf16 (operands rounded to bf16, accumulation and the epilogue in
 * f32), as the CPU computes it. int8 products are not implemented here (DF_E_UNSUPPORTED).
 */
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

typedef struct mm_params {
    uint64_t a, b, bias, o, gate, resid;
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn;
    int64_t za, zb, zo;
    int64_t ldc, ldr;
    int64_t bias_dtype, gate_dtype, resid_dtype, o_dtype;
    int64_t act, gated, bias_per_row;
    int64_t C, H, W, kh, kw, Wo, stride, pad;
} mm_params;

static df_status compute_mode(int64_t requested, const char *op, uint32_t *bf16)
{
    if (requested == DF_DTYPE_I8)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan %s: int8 products are not implemented", op);
    *bf16 = requested == DF_DTYPE_BF16;
    return DF_OK;
}

static df_status float_operand(const df_view *v, const char *op)
{
    if (v->dtype != DF_DTYPE_F32 && v->dtype != DF_DTYPE_BF16 && v->dtype != DF_DTYPE_F16)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan %s: operand of dtype %s", op,
                         dvk_dtype_name(v->dtype));
    return DF_OK;
}

static df_status mm_dispatch(const dvk_env *e, const mm_params *p, df_dtype ta, df_dtype tb,
                             uint32_t bf16, uint32_t conv, int64_t batch, const dvk_range *r,
                             int nr, const df_view *out)
{
    if (batch > 65535)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: a batch of %lld products", (long long)batch);
    /* the shader steps along k with 32-bit indices */
    if (p->K * (p->sak < 0 ? -p->sak : p->sak) > INT32_MAX ||
        (!conv && p->K * (p->sbk < 0 ? -p->sbk : p->sbk) > INT32_MAX))
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: a product whose k steps span more than "
                         "2^31 elements");
    /* a convolution's kernel size is a constant of its pipeline: the patch gather divides
     * by it for every element it loads */
    uint32_t kh = conv ? (uint32_t)p->kh : 1, kw = conv ? (uint32_t)p->kw : 1;
    uint32_t spec[8] = {(uint32_t)ta, (uint32_t)tb, bf16, conv, 64, 64, kh, kw};
    dvk_range w = dvk_view_range(e, out);
    dvk_hazard(e->d, r, nr, &w, 1);
    uint32_t gx = (uint32_t)((p->N + 63) / 64), gy = (uint32_t)((p->M + 63) / 64);
    /* bf16 products on cooperative matrices where the device has them (vk_coopmat.c):
     * the same 64 x 64 tiles and parameter block */
    if (bf16 && !conv && e->d->coopmat.use)
        return dvk_dispatch(e->d, dvk_shader_find("mm_coop"), spec, 2, p, sizeof *p, gx, gy,
                            (uint32_t)batch);
    return dvk_dispatch(e->d, dvk_shader_find("mm"), spec, 8, p, sizeof *p, gx, gy,
                        (uint32_t)batch);
}

df_status dvk_run_linear(const dvk_env *e, const df_node *n)
{
    const df_view *x = &n->in[0], *w = &n->in[1], *o = &n->out;
    uint32_t bf16 = 0;
    DF_TRY(compute_mode(n->a.compute, "linear", &bf16));
    DF_TRY(float_operand(x, "linear"));
    DF_TRY(float_operand(w, "linear"));
    int64_t m = 1;
    for (int d = 0; d < x->ndim - 1; d++)
        m *= x->shape[d];
    int64_t K = x->shape[x->ndim - 1];
    /* x's rows must be evenly spaced: true of every view the runtime hands a linear */
    int64_t sam = x->ndim >= 2 ? x->stride[x->ndim - 2] : K;
    for (int d = 0; d + 2 < x->ndim; d++)
        if (x->shape[d] > 1 && x->stride[d] != x->stride[d + 1] * x->shape[d + 1])
            return df_errorf(DF_E_UNSUPPORTED, "vulkan linear: x rows are not evenly spaced");
    mm_params p = {.a = e->addr(e->user, x),
                   .b = e->addr(e->user, w),
                   .o = e->addr(e->user, o),
                   .M = m,
                   .N = w->shape[0],
                   .K = K,
                   .sam = sam,
                   .sak = x->stride[x->ndim - 1],
                   .sbk = w->stride[1],
                   .sbn = w->stride[0],
                   .ldc = o->ndim >= 2 && o->stride[o->ndim - 2] ? o->stride[o->ndim - 2]
                                                                  : w->shape[0],
                   .o_dtype = o->dtype,
                   .act = n->a.act};
    dvk_range r[5];
    int nr = 0;
    r[nr++] = dvk_view_range(e, x);
    r[nr++] = dvk_view_range(e, w);
    if (dvk_has(&n->in[2])) {
        p.bias = e->addr(e->user, &n->in[2]);
        p.bias_dtype = n->in[2].dtype;
        r[nr++] = dvk_view_range(e, &n->in[2]);
    }
    if (n->a.gated) {
        const df_view *g = &n->in[3], *res = &n->in[4];
        p.gated = 1;
        p.act = 0;
        p.gate = e->addr(e->user, g);
        p.gate_dtype = g->dtype;
        p.resid = e->addr(e->user, res);
        p.resid_dtype = res->dtype;
        p.ldr = res->ndim >= 2 && res->stride[res->ndim - 2] ? res->stride[res->ndim - 2] : p.N;
        r[nr++] = dvk_view_range(e, g);
        r[nr++] = dvk_view_range(e, res);
    }
    return mm_dispatch(e, &p, x->dtype, w->dtype, bf16, 0, 1, r, nr, o);
}

/* The stride between consecutive products over the batch dimensions [0, nb) of v (they
 * must flatten: each steps by the next one's extent), or -1. */
static int64_t batch_stride(const df_view *v, int nb)
{
    int64_t s = 0;
    bool have = false;
    for (int d = nb - 1; d >= 0; d--) {
        if (v->shape[d] == 1)
            continue;
        if (have && v->stride[d] != s)
            return -1;
        if (!have)
            s = v->stride[d];
        have = true;
        s *= v->shape[d];
    }
    for (int d = nb - 1; d >= 0; d--)
        if (v->shape[d] > 1)
            return v->stride[d];
    return 0;
}

df_status dvk_run_matmul(const dvk_env *e, const df_node *n)
{
    const df_view *a = &n->in[0], *b = &n->in[1], *o = &n->out;
    uint32_t bf16 = 0;
    DF_TRY(compute_mode(n->a.compute, "matmul", &bf16));
    DF_TRY(float_operand(a, "matmul"));
    DF_TRY(float_operand(b, "matmul"));
    int na = a->ndim, nb = b->ndim;
    int64_t M = a->shape[na - 2], K = a->shape[na - 1], N = b->shape[nb - 1];
    int64_t batch = 1;
    for (int d = 0; d < na - 2; d++)
        batch *= a->shape[d];
    int64_t za = batch_stride(a, na - 2), zb = nb == 2 ? 0 : batch_stride(b, nb - 2);
    if (za < 0 || zb < 0)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan matmul: batch dimensions that do not "
                         "flatten to one stride");
    mm_params p = {.a = e->addr(e->user, a),
                   .b = e->addr(e->user, b),
                   .o = e->addr(e->user, o),
                   .M = M,
                   .N = N,
                   .K = K,
                   .sam = a->stride[na - 2],
                   .sak = a->stride[na - 1],
                   /* b is [.., K, N] by its strides (i[1] says it is a transposed dense
                    * [.., N, K], which strides already tell) */
                   .sbk = b->stride[nb - 2],
                   .sbn = b->stride[nb - 1],
                   .za = za,
                   .zb = zb,
                   .zo = M * N,
                   .ldc = N,
                   .o_dtype = o->dtype};
    dvk_range r[2] = {dvk_view_range(e, a), dvk_view_range(e, b)};
    return mm_dispatch(e, &p, a->dtype, b->dtype, bf16, 0, batch, r, 2, o);
}

df_status dvk_run_conv2d(const dvk_env *e, const df_node *n)
{
    const df_view *x = &n->in[0], *w = &n->in[1], *o = &n->out;
    uint32_t bf16 = 0;
    DF_TRY(compute_mode(n->a.compute, "conv2d", &bf16));
    DF_TRY(float_operand(x, "conv2d"));
    DF_TRY(float_operand(w, "conv2d"));
    int64_t B = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t O = w->shape[0], kh = w->shape[2], kw = w->shape[3];
    int64_t Ho = o->shape[2], Wo = o->shape[3];
    if (C * H * W > INT32_MAX || C * kh * kw > INT32_MAX)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan conv2d: an image of more than 2^31 values");
    mm_params p = {.a = e->addr(e->user, w),
                   .b = e->addr(e->user, x),
                   .o = e->addr(e->user, o),
                   .M = O,
                   .N = Ho * Wo,
                   .K = C * kh * kw,
                   .sam = C * kh * kw,
                   .sak = 1,
                   .zb = C * H * W,
                   .zo = O * Ho * Wo,
                   .ldc = Ho * Wo,
                   .o_dtype = o->dtype,
                   .bias_per_row = 1,
                   .C = C, .H = H, .W = W, .kh = kh, .kw = kw, .Wo = Wo,
                   .stride = n->a.stride,
                   .pad = n->a.padding};
    dvk_range r[3] = {dvk_view_range(e, w), dvk_view_range(e, x)};
    int nr = 2;
    if (dvk_has(&n->in[2])) {
        p.bias = e->addr(e->user, &n->in[2]);
        p.bias_dtype = n->in[2].dtype;
        r[nr++] = dvk_view_range(e, &n->in[2]);
    }
    return mm_dispatch(e, &p, w->dtype, x->dtype, bf16, 1, B, r, nr, o);
}

typedef struct attn_params {
    uint64_t q, k, v, mask, o;
    int64_t q_dtype, k_dtype, v_dtype, o_dtype;
    int64_t B, H, Sq, Sk, D, Dv;
    int64_t qs[4], ks[4], vs[4], ms[4], os[3];
    int64_t causal;
    float scale, pad;
} attn_params;

/*
 * What a CPU implementation of Vulkan (lavapipe) can run of attn.comp. llvmpipe ends an
 * invocation's loops after 65535 iterations in all, without an error, so a longer row would
 * come out wrong; each key costs the shader two iterations (its loops over the head dims
 * are unrolled) and each block of 32 keys about four more. And llvmpipe takes minutes to
 * compile the unrolled loops for head dims over 128.
 */
static df_status attention_fits_cpu_driver(const dvk_device *d, const attn_params *p,
                                           uint32_t maxd)
{
    if (d->info.type != VK_PHYSICAL_DEVICE_TYPE_CPU)
        return DF_OK;
    int64_t iterations = 2 * p->Sk + 4 * ((p->Sk + 31) / 32) + 64;
    if (iterations > 65535)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan attention: %lld keys on '%s', a CPU implementation whose "
                         "shader loops stop after 65535 iterations (at most about 30000 keys "
                         "there; --device cpu runs it)",
                         (long long)p->Sk, d->info.name);
    if (maxd > 128)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan attention: head dims %lld / %lld on '%s', a CPU "
                         "implementation (at most 128 there; --device cpu runs it)",
                         (long long)p->D, (long long)p->Dv, d->info.name);
    return DF_OK;
}

df_status dvk_run_attention(const dvk_env *e, const df_node *n)
{
    const df_view *q = &n->in[0], *k = &n->in[1], *v = &n->in[2], *o = &n->out;
    uint32_t bf16 = 0;
    DF_TRY(compute_mode(n->a.compute, "attention", &bf16));
    for (int i = 0; i < 3; i++)
        DF_TRY(float_operand(&n->in[i], "attention"));
    /* k and v rows are read with 32-bit indices (float_operand allows f32, bf16, f16) */
    attn_params p = {.q = e->addr(e->user, q),
                     .k = e->addr(e->user, k),
                     .v = e->addr(e->user, v),
                     .o = e->addr(e->user, o),
                     .q_dtype = q->dtype,
                     .k_dtype = k->dtype,
                     .v_dtype = v->dtype,
                     .o_dtype = o->dtype,
                     .B = q->shape[0],
                     .H = q->shape[1],
                     .Sq = q->shape[2],
                     .Sk = k->shape[2],
                     .D = q->shape[3],
                     .Dv = v->shape[3],
                     .os = {o->stride[0], o->stride[1], o->stride[2]},
                     .causal = n->a.causal != 0,
                     .scale = (float)n->a.scale};
    if (p.D > 256 || p.Dv > 256)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan attention: head dims %lld / %lld > 256",
                         (long long)p.D, (long long)p.Dv);
    if (p.H > 65535 || p.B > 65535 || k->stride[3] * p.D > INT32_MAX ||
        v->stride[3] * p.Dv > INT32_MAX)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan attention: %lld queries x %lld heads",
                         (long long)p.Sq, (long long)p.H);
    memcpy(p.qs, q->stride, sizeof p.qs);
    memcpy(p.ks, k->stride, sizeof p.ks);
    memcpy(p.vs, v->stride, sizeof p.vs);
    dvk_range r[4] = {dvk_view_range(e, q), dvk_view_range(e, k), dvk_view_range(e, v)};
    int nr = 3;
    if (dvk_has(&n->in[3])) {
        if (n->in[3].dtype != DF_DTYPE_F32)
            return df_errorf(DF_E_UNSUPPORTED, "vulkan attention: a %s mask",
                             dvk_dtype_name(n->in[3].dtype));
        p.mask = e->addr(e->user, &n->in[3]);
        memcpy(p.ms, n->in[3].stride, sizeof p.ms);
        r[nr++] = dvk_view_range(e, &n->in[3]);
    }
    dvk_range w = dvk_view_range(e, o);
    dvk_hazard(e->d, r, nr, &w, 1);
    uint32_t maxd = 16;
    while (maxd < (uint32_t)p.D || maxd < (uint32_t)p.Dv)
        maxd *= 2;
    DF_TRY(attention_fits_cpu_driver(e->d, &p, maxd));
    uint32_t spec[2] = {bf16, maxd};
    return dvk_dispatch(e->d, dvk_shader_find("attn"), spec, 2, &p, sizeof p,
                        (uint32_t)((p.Sq + 63) / 64), (uint32_t)p.H, (uint32_t)p.B);
}

/* ---- the fused program ------------------------------------------------------------------- */

typedef struct fused_view {
    uint64_t addr;
    int64_t dtype;
    int64_t stride[DVK_MAX_DIMS];
} fused_view;

typedef struct fused_insn {
    int32_t op, dst, a, b;
    float f0, f1;
} fused_insn;

typedef struct fused_params {
    uint64_t o;
    int64_t o_dtype, ndim, rows, w, groups_x;
    int64_t shape[DVK_MAX_DIMS];
    int64_t n_in, n_insn, out_reg, head_op;
    uint64_t head_x, head_w, head_b;
    int64_t head_x_dtype, head_w_dtype, head_b_dtype;
    float head_eps, pad;
    fused_view in[DF_FUSED_MAX_IN];
    fused_insn insn[DF_FUSED_MAX_INSN];
} fused_params;

df_status dvk_run_fused(const dvk_env *e, const df_fused *f)
{
    const df_view *out = &f->out;
    if (f->n_regs > 64 || f->n_in > DF_FUSED_MAX_IN || f->n_insn > DF_FUSED_MAX_INSN)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan fused kernel: %d registers (at most 64)",
                         f->n_regs);
    fused_params p;
    memset(&p, 0, sizeof p);
    int64_t total = 1;
    for (int d = 0; d < out->ndim; d++) {
        total *= out->shape[d];
        p.shape[d] = out->shape[d];
    }
    p.w = out->ndim ? out->shape[out->ndim - 1] : 1;
    p.rows = p.w ? total / p.w : 0;
    if (p.rows == 0)
        return DF_OK;
    p.o = e->addr(e->user, out);
    p.o_dtype = out->dtype;
    p.ndim = out->ndim ? out->ndim : 1;
    if (!out->ndim)
        p.shape[0] = 1;
    p.n_in = f->n_in;
    p.n_insn = f->n_insn;
    p.out_reg = f->out_reg;
    dvk_range r[DF_FUSED_MAX_IN + 3];
    int nr = 0;
    for (int k = 0; k < f->n_in; k++) {
        const df_view *v = &f->in[k];
        if (v->dtype == DF_DTYPE_F64)
            return df_errorf(DF_E_UNSUPPORTED, "vulkan fused kernel: an f64 input");
        p.in[k].addr = e->addr(e->user, v);
        p.in[k].dtype = v->dtype;
        for (int d = 0; d < out->ndim; d++)
            p.in[k].stride[d] = v->stride[d];
        if (!out->ndim)
            p.in[k].stride[0] = 1;
        r[nr++] = dvk_view_range(e, v);
    }
    for (int k = 0; k < f->n_insn; k++) {
        const df_fused_insn *in = &f->insn[k];
        if (in->op != DF_FI_LOAD && in->op != DF_FI_HEAD && !df_vocab_op_fuses((df_op)in->op))
            return df_errorf(DF_E_UNSUPPORTED, "vulkan fused kernel: instruction %d has opcode "
                             "%d, not an op marked fuse in ops.def", k, in->op);
        p.insn[k] = (fused_insn){in->op, in->dst, in->a, in->b, in->f0, in->f1};
    }
    p.head_op = f->head_op; /* a df_op (vocab.glsl's OP_*), or -1 */
    if (p.head_op >= 0) {
        p.head_x = e->addr(e->user, &f->head_x);
        p.head_x_dtype = f->head_x.dtype;
        p.head_eps = (float)f->head_eps;
        r[nr++] = dvk_view_range(e, &f->head_x);
        if (dvk_has(&f->head_w)) {
            p.head_w = e->addr(e->user, &f->head_w);
            p.head_w_dtype = f->head_w.dtype;
            r[nr++] = dvk_view_range(e, &f->head_w);
        }
        if (dvk_has(&f->head_b)) {
            p.head_b = e->addr(e->user, &f->head_b);
            p.head_b_dtype = f->head_b.dtype;
            r[nr++] = dvk_view_range(e, &f->head_b);
        }
    }
    int64_t gx = p.rows < 65535 ? p.rows : 65535, gy = (p.rows + gx - 1) / gx;
    p.groups_x = gx;
    dvk_range w = dvk_view_range(e, out);
    dvk_hazard(e->d, r, nr, &w, 1);
    return dvk_dispatch(e->d, dvk_shader_find("fused"), NULL, 0, &p, sizeof p, (uint32_t)gx,
                        (uint32_t)gy, 1);
}
