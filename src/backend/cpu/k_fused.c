/*
 * The fused elementwise kernel of the defer-and-fuse mode (see df_fused in backend.h).
 *
 * One pass over memory: each thread takes whole rows, evaluates the program with one row
 * per register (registers live in per-thread scratch, so they stay in cache for the row
 * widths of these models), and writes the output row once. A normalisation head computes
 * its row's statistics in double, like the standalone norm kernels, so fused and unfused
 * results agree to float rounding.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/status.h"

static int64_t row_offset(const df_view *v, const df_view *out, int64_t row)
{
    int64_t off = v->offset;
    for (int d = out->ndim - 2; d >= 0; d--) {
        off += (row % out->shape[d]) * v->stride[d];
        row /= out->shape[d];
    }
    return off;
}

static void load_row(const df_view *v, const df_view *out, int64_t row, int64_t w, float *dst)
{
    int64_t off = row_offset(v, out, row);
    int64_t s = out->ndim ? v->stride[out->ndim - 1] : 1;
    const void *base = v->st->data;
    if (v->dtype == DF_DTYPE_F32) {
        const float *p = (const float *)base + off;
        if (s == 1)
            memcpy(dst, p, (size_t)w * sizeof *dst);
        else if (s == 0)
            for (int64_t j = 0; j < w; j++)
                dst[j] = p[0];
        else
            for (int64_t j = 0; j < w; j++)
                dst[j] = p[j * s];
        return;
    }
    for (int64_t j = 0; j < w; j++)
        dst[j] = df_load_f32(base, v->dtype, off + j * s);
}

static void head_row(const df_fused *f, int64_t row, int64_t w, float *dst)
{
    const float *x = (const float *)df_view_ptr(&f->head_x) + row * w;
    double mean = 0, var = 0;
    if (f->head_op == DF_OP_LAYER_NORM) {
        for (int64_t j = 0; j < w; j++)
            mean += x[j];
        mean /= (double)w;
        for (int64_t j = 0; j < w; j++)
            var += ((double)x[j] - mean) * ((double)x[j] - mean);
    } else {
        for (int64_t j = 0; j < w; j++)
            var += (double)x[j] * x[j];
    }
    var /= (double)w;
    float m = (float)mean, inv = (float)(1.0 / sqrt(var + f->head_eps));
    const df_view *wv = &f->head_w, *bv = &f->head_b;
    for (int64_t j = 0; j < w; j++) {
        float y = (x[j] - m) * inv;
        if (wv->st)
            y *= df_load_f32(df_view_ptr(wv), wv->dtype, j);
        if (bv->st)
            y += df_load_f32(df_view_ptr(bv), bv->dtype, j);
        dst[j] = y;
    }
}

static void run_insn(const df_fused_insn *in, float *const *r, int64_t w)
{
    float *d = r[in->dst];
    const float *a = r[in->a], *b = r[in->b];
    switch ((df_fused_opcode)in->op) {
    case DF_FI_ADD: for (int64_t j = 0; j < w; j++) d[j] = a[j] + b[j]; break;
    case DF_FI_SUB: for (int64_t j = 0; j < w; j++) d[j] = a[j] - b[j]; break;
    case DF_FI_MUL: for (int64_t j = 0; j < w; j++) d[j] = a[j] * b[j]; break;
    case DF_FI_DIV: for (int64_t j = 0; j < w; j++) d[j] = a[j] / b[j]; break;
    case DF_FI_SCALE: {
        float al = in->f0, be = in->f1;
        for (int64_t j = 0; j < w; j++)
            d[j] = al * a[j] + be;
        break;
    }
    case DF_FI_SILU: for (int64_t j = 0; j < w; j++) d[j] = a[j] / (1.0f + expf(-a[j])); break;
    case DF_FI_GELU:
        for (int64_t j = 0; j < w; j++)
            d[j] = 0.5f * a[j] * (1.0f + erff(a[j] * 0.70710678118654752f));
        break;
    case DF_FI_GELU_TANH:
        for (int64_t j = 0; j < w; j++) {
            float x = a[j];
            d[j] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
        }
        break;
    case DF_FI_QUICK_GELU:
        for (int64_t j = 0; j < w; j++) d[j] = a[j] / (1.0f + expf(-1.702f * a[j]));
        break;
    case DF_FI_COPY: memcpy(d, a, (size_t)w * sizeof *d); break;
    case DF_FI_LOAD:
    case DF_FI_HEAD: break;
    }
}

df_status df_cpu_fused(const df_fused *f, df_kernel_env *env)
{
    const df_view *out = &f->out;
    int64_t w = out->ndim ? out->shape[out->ndim - 1] : 1;
    int64_t total = df_view_numel(out);
    int64_t rows = w ? total / w : 0;
    if (rows == 0)
        return DF_OK;
    int threads = env->threads > 0 ? env->threads : 1;
    size_t per = (size_t)f->n_regs * (size_t)w;
    float *scratch = df_env_scratch(env, per * sizeof(float) * (size_t)threads);
    if (!scratch)
        return df_errorf(DF_E_OOM, "fused kernel: out of scratch memory (%d registers of %lld)",
                         f->n_regs, (long long)w);
    float *o = out->st->data;
    #pragma omp parallel num_threads(threads) if (total > 16384)
    {
        float *regs = scratch + per * (size_t)omp_get_thread_num();
        float *r[64];
        for (int i = 0; i < f->n_regs && i < 64; i++)
            r[i] = regs + (size_t)i * (size_t)w;
        #pragma omp for schedule(static)
        for (int64_t row = 0; row < rows; row++) {
            for (int k = 0; k < f->n_insn; k++) {
                const df_fused_insn *in = &f->insn[k];
                if (in->op == DF_FI_LOAD)
                    load_row(&f->in[in->a], out, row, w, r[in->dst]);
                else if (in->op == DF_FI_HEAD)
                    head_row(f, row, w, r[in->dst]);
                else
                    run_insn(in, r, w);
            }
            memcpy(o + row * w, r[f->out_reg], (size_t)w * sizeof *o);
        }
    }
    return DF_OK;
}
