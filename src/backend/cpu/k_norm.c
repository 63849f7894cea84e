/*
 * Softmax and the normalisations: layer norm, RMS norm, group norm, and RMS norm fused
 * with the RoPE rotation that follows it in attention (defer-and-fuse only).
 *
 * All four get dense inputs from their shape rules and work row by row (a row is the last
 * dimension; for group norm, one group of channels of one sample), rows spread over
 * OpenMP threads. Statistics are accumulated in double and the result computed in f32:
 *  - softmax: max, then e^(x - max) with the vectorised exponential (k_common.h, about
 *    1 ulp), summed in double, scaled by the f32 reciprocal of the sum;
 *  - layer norm: mean and biased variance in double from sums shifted by the row's first
 *    element (one pass, no cancellation when the mean is large), rstd = 1/sqrt(var + eps)
 *    in double, then (x - mean) * rstd [* w + b] in f32, with the mean subtracted as two
 *    f32 halves (hi + lo) so that a large mean loses nothing to its f32 rounding;
 *  - RMS norm as T5 and FLUX write it: the mean of squares rounded to f32, then
 *    r = 1 / sqrtf(var + eps) in f32 and (x * r) [* w] in f32;
 *  - group norm: shifted sums in double per group, then (x - mean) * (rstd * w[c]) + b[c],
 *    the mean again subtracted in two halves.
 * Weights and biases may be f32, bf16 or f16; they are converted to f32 once per call
 * into the kernel's scratch memory. An input that is not f32 is converted there too.
 */
#include <math.h>

#include <omp.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/k_common.h"
#include "core/status.h"

/* f32 views of a norm's x, weight and bias, converted into scratch where needed. */
typedef struct norm_io {
    const float *x, *w, *b;
    float *y;
    int64_t rows, d;
    int threads;
    double *extra; /* the kernel's own scratch, if it asked for some */
} norm_io;

static size_t round_up(size_t n)
{
    return (n + 15) & ~(size_t)15; /* keeps each part of the scratch 64-byte aligned */
}

static size_t f32_need(const df_view *v)
{
    return v->buf && v->dtype != DF_DTYPE_F32 ? round_up((size_t)df_view_numel(v)) : 0;
}

/* The dense view v as f32: in place when it is f32, else converted into *scratch. */
static const float *as_f32(const df_view *v, float **scratch, int threads)
{
    if (!v->buf)
        return NULL;
    if (v->dtype == DF_DTYPE_F32)
        return df_view_ptr(v);
    float *dst = *scratch;
    int64_t numel = df_view_numel(v);
    *scratch += round_up((size_t)numel);
    const char *src = df_view_ptr(v);
    size_t es = df_dtype_size(v->dtype);
    int64_t chunk = DF_CPU_PAR_MIN, parts = (numel + chunk - 1) / chunk;
    #pragma omp parallel for schedule(static) num_threads(threads) if (parts > 1)
    for (int64_t p = 0; p < parts; p++) {
        int64_t i = p * chunk, cnt = numel - i < chunk ? numel - i : chunk;
        df_cpu_load_f32(src + i * (int64_t)es, v->dtype, 1, dst + i, cnt);
    }
    return dst;
}

/* Sets up io for a norm whose rows have d elements, with optional weight and bias, and
 * `extra` doubles of scratch for the kernel; DF_E_OOM when scratch memory is short. */
static df_status norm_setup(const df_node *n, df_kernel_env *env, int64_t d, size_t extra,
                            norm_io *io)
{
    io->threads = df_cpu_threads(env);
    io->d = d;
    io->rows = d > 0 ? df_view_numel(&n->in[0]) / d : 0;
    io->y = df_view_ptr(&n->out);
    size_t need = round_up(2 * extra); /* in floats */
    for (int i = 0; i < n->n_in; i++)
        need += f32_need(&n->in[i]);
    float *scratch = NULL;
    if (need > 0) {
        scratch = df_env_scratch(env, need * sizeof(float));
        if (!scratch)
            return df_errorf(DF_E_OOM, "cpu %s: out of memory for %zu bytes of scratch",
                             df_vocab_op_name(n->op), need * sizeof(float));
    }
    io->extra = extra ? (double *)scratch : NULL;
    scratch += round_up(2 * extra);
    io->x = as_f32(&n->in[0], &scratch, io->threads);
    io->w = n->n_in > 1 ? as_f32(&n->in[1], &scratch, io->threads) : NULL;
    io->b = n->n_in > 2 ? as_f32(&n->in[2], &scratch, io->threads) : NULL;
    return DF_OK;
}

/* Threads for the rows: one unless there is enough work. */
static int row_threads(const norm_io *io)
{
    return io->rows > 1 && io->rows * io->d >= DF_CPU_PAR_MIN ? io->threads : 1;
}

/* ---- softmax -------------------------------------------------------------------------- */

DF_CPU_KERNEL(softmax)
{
    const df_view *x = &n->in[0];
    norm_io io;
    DF_TRY(norm_setup(n, env, x->ndim > 0 ? x->shape[x->ndim - 1] : 1, 0, &io));
    int64_t d = io.d;
    int nt = row_threads(&io);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < io.rows; r++) {
        const float *xr = io.x + r * d;
        float *yr = io.y + r * d;
        float m = -INFINITY;
        #pragma omp simd reduction(max : m)
        for (int64_t i = 0; i < d; i++)
            m = xr[i] > m ? xr[i] : m;
        double sum = 0;
        #pragma omp simd reduction(+ : sum)
        for (int64_t i = 0; i < d; i++) {
            float e = df_cpu_expf(xr[i] - m);
            yr[i] = e;
            sum += e;
        }
        float inv = (float)(1.0 / sum);
        for (int64_t i = 0; i < d; i++)
            yr[i] *= inv;
    }
    return DF_OK;
}

/* ---- layer norm ----------------------------------------------------------------------- */

DF_CPU_KERNEL(layer_norm)
{
    const df_view *x = &n->in[0];
    norm_io io;
    DF_TRY(norm_setup(n, env, x->shape[x->ndim - 1], 0, &io));
    int64_t d = io.d;
    double eps = n->a.eps;
    const float *w = io.w, *b = io.b;
    int nt = row_threads(&io);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < io.rows; r++) {
        const float *restrict xr = io.x + r * d;
        float *restrict yr = io.y + r * d;
        double mean, var;
        df_cpu_row_moments(xr, d, &mean, &var);
        float hi = (float)mean, lo = (float)(mean - hi), rs = (float)(1.0 / sqrt(var + eps));
        if (w && b) {
            for (int64_t i = 0; i < d; i++)
                yr[i] = ((xr[i] - hi) - lo) * rs * w[i] + b[i];
        } else if (w) {
            for (int64_t i = 0; i < d; i++)
                yr[i] = ((xr[i] - hi) - lo) * rs * w[i];
        } else if (b) {
            for (int64_t i = 0; i < d; i++)
                yr[i] = ((xr[i] - hi) - lo) * rs + b[i];
        } else {
            for (int64_t i = 0; i < d; i++)
                yr[i] = ((xr[i] - hi) - lo) * rs;
        }
    }
    return DF_OK;
}

/* ---- RMS norm ------------------------------------------------------------------------- */

DF_CPU_KERNEL(rms_norm)
{
    const df_view *x = &n->in[0];
    norm_io io;
    DF_TRY(norm_setup(n, env, x->shape[x->ndim - 1], 0, &io));
    int64_t d = io.d;
    float eps = (float)n->a.eps;
    const float *w = io.w;
    int nt = row_threads(&io);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < io.rows; r++) {
        const float *restrict xr = io.x + r * d;
        float *restrict yr = io.y + r * d;
        float rs = df_cpu_rms_inverse(xr, d, eps);
        if (w) {
            for (int64_t i = 0; i < d; i++)
                yr[i] = (xr[i] * rs) * w[i];
        } else {
            for (int64_t i = 0; i < d; i++)
                yr[i] = xr[i] * rs;
        }
    }
    return DF_OK;
}

/* RMS norm over each head of q or k followed by RoPE, in one pass (made by the
 * defer-and-fuse planner from rms_norm -> [concat] -> permute -> rope). x [B, S, H, D]
 * dense, table [S, D/2, 2] f32 (already offset to this part's first position), out a view
 * [B, H, S, D] with any strides: the part of the rotated tensor this x fills. The
 * arithmetic is the two kernels' own, so the result is the same to the bit. */
DF_CPU_KERNEL(rms_norm_rope)
{
    const df_view *x = &n->in[0];
    df_node norm = *n;
    norm.n_in = 2; /* x and weight: the table is read in place */
    norm_io io;
    /* A bf16 output (for attention in bf16) is rounded from an f32 row per thread. */
    bool to_bf16 = n->out.dtype == DF_DTYPE_BF16;
    int64_t row_floats = (x->shape[3] + 15) & ~(int64_t)15;
    size_t extra = to_bf16 ? (size_t)(df_cpu_threads(env) * row_floats) / 2 : 0;
    DF_TRY(norm_setup(&norm, env, x->shape[3], extra, &io));
    int64_t S = x->shape[1], H = x->shape[2], d = io.d, half = d / 2;
    const float *table = df_view_ptr(&n->in[2]);
    const df_view *o = &n->out;
    char *out = df_view_ptr(o);
    size_t es = df_dtype_size(o->dtype);
    float eps = (float)n->a.eps;
    const float *w = io.w;
    int nt = row_threads(&io);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < io.rows; r++) {
        int64_t h = r % H, s = r / H % S, b = r / H / S;
        const float *restrict xr = io.x + r * d;
        const float *restrict cs = table + s * d;
        int64_t at = b * o->stride[0] + h * o->stride[1] + s * o->stride[2];
        float *restrict yr = to_bf16 ? (float *)io.extra + omp_get_thread_num() * row_floats
                                  : (float *)(out + at * (int64_t)es);
        float rs = df_cpu_rms_inverse(xr, d, eps);
        for (int64_t i = 0; i < half; i++) {
            float x0 = xr[2 * i] * rs, x1 = xr[2 * i + 1] * rs;
            if (w)
                x0 *= w[2 * i], x1 *= w[2 * i + 1];
            float c = cs[2 * i], sn = cs[2 * i + 1];
            yr[2 * i] = x0 * c - x1 * sn;
            yr[2 * i + 1] = x1 * c + x0 * sn;
        }
        if (to_bf16)
            df_gemm_f32_to_bf16(yr, (uint16_t *)(out + at * (int64_t)es), d);
    }
    return DF_OK;
}

/* ---- group norm ----------------------------------------------------------------------- */

DF_CPU_KERNEL(group_norm)
{
    const df_view *x = &n->in[0];
    int64_t batch = x->shape[0], channels = x->shape[1], groups = n->a.groups;
    int64_t hw = 1;
    for (int d = 2; d < x->ndim; d++)
        hw *= x->shape[d];
    if (groups <= 0 || channels % groups)
        return df_errorf(DF_E_INTERNAL, "cpu group_norm: %lld channels in %lld groups",
                         (long long)channels, (long long)groups);
    int64_t cpg = channels / groups; /* channels per group */
    int64_t ngroups = batch * groups;
    norm_io io; /* a row is one group of one sample: cpg * hw contiguous values */
    DF_TRY(norm_setup(n, env, cpg * hw, 2 * (size_t)ngroups, &io));
    double eps = n->a.eps;
    double *stats = io.extra; /* mean, rstd per (sample, group) */
    int nt = row_threads(&io);
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t g = 0; g < ngroups; g++) {
        double mean, var;
        df_cpu_row_moments(io.x + g * io.d, io.d, &mean, &var);
        stats[2 * g] = mean;
        stats[2 * g + 1] = 1.0 / sqrt(var + eps);
    }
    const float *w = io.w, *b = io.b;
    int64_t planes = batch * channels;
    nt = planes > 1 && planes * hw >= DF_CPU_PAR_MIN ? io.threads : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t bc = 0; bc < planes; bc++) {
        int64_t c = bc % channels, g = bc / channels * groups + c / cpg;
        float hi = (float)stats[2 * g], lo = (float)(stats[2 * g] - hi);
        float a = (float)(stats[2 * g + 1] * (w ? w[c] : 1.0f));
        float shift = b ? b[c] : 0.0f;
        const float *restrict xr = io.x + bc * hw;
        float *restrict yr = io.y + bc * hw;
        for (int64_t i = 0; i < hw; i++)
            yr[i] = ((xr[i] - hi) - lo) * a + shift;
    }
    return DF_OK;
}
