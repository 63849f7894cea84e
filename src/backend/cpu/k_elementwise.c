/*
 * Elementwise kernels: copy/cast, fill, binary arithmetic, unary activations.
 *
 * The shape rules hand these kernels inputs already broadcast to the output's shape
 * (stride 0 where a dimension stretches), so one strided walk serves every case.
 * (Straightforward versions; the vectorised ones replace them.)
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "core/status.h"

/* Element offset in v of flat output index i. */
static int64_t offset_of(const df_view *v, const df_view *out, int64_t i)
{
    int64_t off = v->offset;
    for (int d = out->ndim - 1; d >= 0; d--) {
        off += (i % out->shape[d]) * v->stride[d];
        i /= out->shape[d];
    }
    return off;
}

static double load(const df_view *v, int64_t k)
{
    const void *b = v->st->data;
    switch (v->dtype) {
    case DF_DTYPE_F32:  return ((const float *)b)[k];
    case DF_DTYPE_BF16: return df_bf16_to_f32(((const uint16_t *)b)[k]);
    case DF_DTYPE_F16:  return df_f16_to_f32(((const uint16_t *)b)[k]);
    case DF_DTYPE_F64:  return ((const double *)b)[k];
    case DF_DTYPE_I32:  return ((const int32_t *)b)[k];
    case DF_DTYPE_I64:  return (double)((const int64_t *)b)[k];
    case DF_DTYPE_U8:   return ((const uint8_t *)b)[k];
    default:            return 0;
    }
}

DF_CPU_KERNEL(copy)
{
    const df_view *in = &n->in[0], *out = &n->out;
    int64_t total = df_view_numel(out);
    size_t ies = df_dtype_size(in->dtype), oes = df_dtype_size(out->dtype);
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) {
        int64_t k = offset_of(in, out, i);
        if (in->dtype == out->dtype)
            memcpy((char *)out->st->data + (size_t)i * oes, (const char *)in->st->data + (size_t)k * ies, ies);
        else
            df_convert((const char *)in->st->data + (size_t)k * ies, in->dtype,
                       (char *)out->st->data + (size_t)i * oes, out->dtype, 1);
    }
    return DF_OK;
}

DF_CPU_KERNEL(fill)
{
    const df_view *out = &n->out;
    int64_t total = df_view_numel(out);
    double v = n->a.f[0];
    size_t es = df_dtype_size(out->dtype);
    char one[8];
    df_convert(&v, DF_DTYPE_F64, one, out->dtype, 1);
    for (int64_t i = 0; i < total; i++)
        memcpy((char *)out->st->data + (size_t)i * es, one, es);
    return DF_OK;
}

DF_CPU_KERNEL(binary)
{
    const df_view *a = &n->in[0], *b = &n->in[1], *out = &n->out;
    int64_t total = df_view_numel(out);
    float *o = out->st->data;
    df_op op = n->op;
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) {
        float x = (float)load(a, offset_of(a, out, i)), y = (float)load(b, offset_of(b, out, i));
        float r;
        switch (op) {
        case DF_OP_ADD: r = x + y; break;
        case DF_OP_SUB: r = x - y; break;
        case DF_OP_MUL: r = x * y; break;
        default:        r = x / y; break;
        }
        o[i] = r;
    }
    return DF_OK;
}

DF_CPU_KERNEL(unary)
{
    const df_view *a = &n->in[0], *out = &n->out;
    int64_t total = df_view_numel(out);
    float *o = out->st->data;
    df_op op = n->op;
    float alpha = (float)n->a.f[0], beta = (float)n->a.f[1];
    #pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < total; i++) {
        float x = (float)load(a, offset_of(a, out, i)), r;
        switch (op) {
        case DF_OP_SCALE:     r = alpha * x + beta; break;
        case DF_OP_SILU:      r = x / (1.0f + expf(-x)); break;
        case DF_OP_GELU:      r = 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); break;
        case DF_OP_GELU_TANH:
            r = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
            break;
        default:              r = x / (1.0f + expf(-1.702f * x)); break;
        }
        o[i] = r;
    }
    return DF_OK;
}
