/*
 * The fused elementwise kernel of the defer-and-fuse mode (see df_fused in device.h).
 *
 * One pass over memory: each thread takes whole rows and evaluates the program with one
 * row per register. Loading a dense f32 row costs nothing (the register points at the
 * input), the instruction that makes the result writes straight into the output row, and
 * every other register lives in per-thread scratch that stays in cache for the row widths
 * of these models. Unary instructions run the standalone kernels' own row functions
 * (df_cpu_unary_fns, indexed by the opcode, which is the op), and
 * a normalisation head computes its statistics with the standalone norm kernels' own helpers
 * (k_common.h), so fused and unfused results are the same bits.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/k_common.h"
#include "core/status.h"

static int64_t row_offset(const df_view *v, const df_view *out, int64_t row)
{
    int64_t off = 0;
    for (int d = out->ndim - 2; d >= 0; d--) {
        off += (row % out->shape[d]) * v->stride[d];
        row /= out->shape[d];
    }
    return off;
}

/* Row `row` of input v: a pointer into v when it is a dense f32 row, else converted into
 * tmp. */
static const float *load_row(const df_view *v, const df_view *out, int64_t row, int64_t w,
                             float *tmp)
{
    int64_t off = row_offset(v, out, row);
    int64_t s = out->ndim ? v->stride[out->ndim - 1] : 1;
    const void *base = df_view_ptr(v);
    if (v->dtype == DF_DTYPE_F32 && (s == 1 || w == 1))
        return (const float *)base + off;
    if (v->dtype == DF_DTYPE_F32 && s == 0) {
        float x = ((const float *)base)[off];
        for (int64_t j = 0; j < w; j++)
            tmp[j] = x;
        return tmp;
    }
    for (int64_t j = 0; j < w; j++)
        tmp[j] = df_load_f32(base, v->dtype, off + j * s);
    return tmp;
}

/* Layer norm (mean removed) or RMS norm of one row, then the optional affine: the
 * standalone kernels' arithmetic (k_norm.c), step for step. */
static void head_row(const df_fused *f, const float *restrict x, int64_t w,
                     const float *restrict wt, const float *restrict bias, float *restrict y)
{
    if (f->head_op == DF_OP_LAYER_NORM) {
        double mean, var;
        df_cpu_row_moments(x, w, &mean, &var);
        float hi = (float)mean, lo = (float)(mean - hi);
        float rs = (float)(1.0 / sqrt(var + f->head_eps));
        for (int64_t i = 0; i < w; i++)
            y[i] = ((x[i] - hi) - lo) * rs;
    } else {
        float rs = df_cpu_rms_inverse(x, w, (float)f->head_eps);
        for (int64_t i = 0; i < w; i++)
            y[i] = x[i] * rs;
    }
    if (wt)
        for (int64_t i = 0; i < w; i++)
            y[i] *= wt[i];
    if (bias)
        for (int64_t i = 0; i < w; i++)
            y[i] += bias[i];
}

static void run_insn(const df_fused_insn *in, float *restrict d, const float *restrict a,
                     const float *restrict b, int64_t w)
{
    switch (in->op) {
    case DF_OP_ADD: for (int64_t j = 0; j < w; j++) d[j] = a[j] + b[j]; break;
    case DF_OP_SUB: for (int64_t j = 0; j < w; j++) d[j] = a[j] - b[j]; break;
    case DF_OP_MUL: for (int64_t j = 0; j < w; j++) d[j] = a[j] * b[j]; break;
    case DF_OP_DIV: for (int64_t j = 0; j < w; j++) d[j] = a[j] / b[j]; break;
    case DF_OP_COPY: memcpy(d, a, (size_t)w * sizeof *d); break;
    default: /* a unary op (known_opcodes checked) */
        df_cpu_unary_fns[in->op](d, a, w, in->f0, in->f1);
        break;
    }
}

/* The head's weight or bias as f32 (converted once per call), or NULL. */
static const float *param_f32(const df_view *v, int64_t w, float *tmp)
{
    if (!v->buf)
        return NULL;
    if (v->dtype == DF_DTYPE_F32)
        return df_view_ptr(v);
    for (int64_t j = 0; j < w; j++)
        tmp[j] = df_load_f32(df_view_ptr(v), v->dtype, j);
    return tmp;
}

/* Whether every instruction is one this kernel runs. */
static df_status known_opcodes(const df_fused *f)
{
    for (int k = 0; k < f->n_insn; k++) {
        int op = f->insn[k].op;
        bool known = op == DF_FI_LOAD || op == DF_FI_HEAD || op == DF_OP_ADD ||
                     op == DF_OP_SUB || op == DF_OP_MUL || op == DF_OP_DIV || op == DF_OP_COPY ||
                     (op < DF_OP_COUNT && df_cpu_unary_fns[op]);
        if (!known)
            return df_errorf(DF_E_UNSUPPORTED,
                             "cpu fused kernel: instruction %d has opcode %d ('%s'), which the "
                             "CPU does not run in a fused program", k, op,
                             op < DF_OP_COUNT ? df_vocab_op_name((df_op)op) : "?");
    }
    return DF_OK;
}

df_status df_cpu_fused(const df_fused *f, df_kernel_env *env)
{
    DF_TRY(known_opcodes(f));
    const df_view *out = &f->out;
    int64_t w = out->ndim ? out->shape[out->ndim - 1] : 1;
    int64_t total = df_view_numel(out);
    int64_t rows = w ? total / w : 0;
    if (rows == 0)
        return DF_OK;
    int threads = env->threads > 0 ? env->threads : 1;
    size_t per = (size_t)f->n_regs * (size_t)w;
    float *scratch = df_env_scratch(env, (per * (size_t)threads + 2 * (size_t)w) * sizeof(float));
    if (!scratch)
        return df_errorf(DF_E_OOM, "fused kernel: out of scratch memory (%d registers of %lld)",
                         f->n_regs, (long long)w);
    float *params = scratch + per * (size_t)threads;
    const float *hw = f->head_op >= 0 ? param_f32(&f->head_w, w, params) : NULL;
    const float *hb = f->head_op >= 0 ? param_f32(&f->head_b, w, params + w) : NULL;
    /* Which register the output comes from, and whether an instruction makes it. A bf16
     * output (for matrix products that compute in bf16) is rounded from the f32 row the
     * way the products round their operands, so the product sees the same bits. */
    bool computed = false, half = out->dtype == DF_DTYPE_BF16;
    for (int k = 0; k < f->n_insn; k++)
        if (f->insn[k].dst == f->out_reg)
            computed = f->insn[k].op != DF_FI_LOAD && !half;
    float *o = df_view_ptr(out);
    uint16_t *o16 = df_view_ptr(out);
    #pragma omp parallel num_threads(threads) if (total > 16384)
    {
        float *regs = scratch + per * (size_t)omp_get_thread_num();
        float *own[64];
        const float *r[64];
        for (int i = 0; i < f->n_regs && i < 64; i++)
            own[i] = regs + (size_t)i * (size_t)w;
        #pragma omp for schedule(static)
        for (int64_t row = 0; row < rows; row++) {
            float *orow = o + row * w;
            for (int k = 0; k < f->n_insn; k++) {
                const df_fused_insn *in = &f->insn[k];
                float *dst = computed && in->dst == f->out_reg ? orow : own[in->dst];
                if (in->op == DF_FI_LOAD) {
                    r[in->dst] = load_row(&f->in[in->a], out, row, w, own[in->dst]);
                } else if (in->op == DF_FI_HEAD) {
                    head_row(f, (const float *)df_view_ptr(&f->head_x) + row * w, w, hw, hb,
                             dst);
                    r[in->dst] = dst;
                } else {
                    run_insn(in, dst, r[in->a], r[in->b], w);
                    r[in->dst] = dst;
                }
            }
            if (half)
                df_gemm_f32_to_bf16(r[f->out_reg], o16 + row * w, w);
            else if (!computed)
                memcpy(orow, r[f->out_reg], (size_t)w * sizeof *orow);
        }
    }
    return DF_OK;
}
