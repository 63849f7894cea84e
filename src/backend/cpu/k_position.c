/*
 * Positions and time: the sinusoidal timestep embedding, the RoPE table and the rotation.
 *
 * These follow diffusers' float32 steps exactly (tests/golden/README.md, "float32 steps
 * inside the float64 references"), because parity depends on them:
 *  - timestep embedding (get_timestep_embedding): exponent_i = f32(-ln(max_period)) * i,
 *    divided by f32(half - shift), freq_i = expf(exponent_i), angle = f32(scale * t) *
 *    freq_i, all in f32 with libm's expf / sinf / cosf; [sin, cos] or [cos, sin], and a
 *    zero column when dim is odd. The scale is applied to t first, as the op documents
 *    (FLUX passes its x1000 that way);
 *  - RoPE table (get_1d_rotary_pos_embed with float64 frequencies): freq_k =
 *    1 / theta^(2k/d) in f64, the position is the id rounded to f32 (ids.float()) then
 *    widened, angle, cos and sin in f64, rounded to f32; axes concatenated;
 *  - rotation of interleaved pairs in f32: (x0 c - x1 s, x1 c + x0 s).
 */
#include <math.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/k_common.h"
#include "core/status.h"

DF_CPU_KERNEL(timestep_embed)
{
    const df_view *t = &n->in[0];
    int64_t batch = t->shape[0], dim = n->a.dim, half = dim / 2;
    bool flip = n->a.flip != 0;
    size_t need = (size_t)(half + batch) * sizeof(float);
    float *freq = df_env_scratch(env, need > 0 ? need : 1);
    if (!freq)
        return df_errorf(DF_E_OOM, "cpu timestep_embed: out of memory for %zu bytes", need);
    float *ts = freq + half;
    float neg_log = (float)-log(n->a.max_period);
    float denom = (float)((double)half - n->a.shift);
    for (int64_t i = 0; i < half; i++)
        freq[i] = expf(neg_log * (float)i / denom);
    df_cpu_load_f32(df_view_ptr(t), t->dtype, 1, ts, batch);
    float scale = (float)n->a.scale;
    float *out = df_view_ptr(&n->out);
    for (int64_t b = 0; b < batch; b++) {
        float tb = scale * ts[b];
        float *row = out + b * dim;
        float *sin_part = flip ? row + half : row, *cos_part = flip ? row : row + half;
        for (int64_t i = 0; i < half; i++) {
            float angle = tb * freq[i];
            sin_part[i] = sinf(angle);
            cos_part[i] = cosf(angle);
        }
        if (dim % 2)
            row[dim - 1] = 0.0f;
    }
    return DF_OK;
}

DF_CPU_KERNEL(rope_table)
{
    const df_view *ids = &n->in[0];
    int64_t seq = ids->shape[0];
    int n_axes = (int)n->a.n_axes;
    if (n_axes < 1 || n_axes > 7) /* the attributes hold at most 7 axis sizes */
        return df_errorf(DF_E_INTERNAL, "cpu rope_table: %d axes", n_axes);
    int64_t pairs = n->out.shape[1];
    double theta = n->a.theta;
    /* scratch: the frequency of every pair, then the ids as f32 */
    size_t need = (size_t)pairs * sizeof(double) + (size_t)(seq * n_axes) * sizeof(float);
    double *freq = df_env_scratch(env, need > 0 ? need : 1);
    if (!freq)
        return df_errorf(DF_E_OOM, "cpu rope_table: out of memory for %zu bytes", need);
    float *pos = (float *)(freq + pairs);
    int axis_of[8]; /* first pair of each axis, and the end */
    int64_t k0 = 0;
    for (int a = 0; a < n_axes; a++) {
        int64_t d = n->a.axes_dim[a];
        axis_of[a] = (int)k0;
        for (int64_t k = 0; k < d / 2; k++)
            freq[k0 + k] = 1.0 / pow(theta, (double)(2 * k) / (double)d);
        k0 += d / 2;
    }
    axis_of[n_axes] = (int)k0;
    df_cpu_load_f32(df_view_ptr(ids), ids->dtype, 1, pos, seq * n_axes);
    float *out = df_view_ptr(&n->out);
    int nt = seq * pairs >= DF_CPU_PAR_MIN / 16 ? df_cpu_threads(env) : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t s = 0; s < seq; s++) {
        float *row = out + s * pairs * 2;
        for (int a = 0; a < n_axes; a++) {
            double p = (double)pos[s * n_axes + a];
            for (int64_t k = axis_of[a]; k < axis_of[a + 1]; k++) {
                double angle = p * freq[k];
                row[2 * k] = (float)cos(angle);
                row[2 * k + 1] = (float)sin(angle);
            }
        }
    }
    return DF_OK;
}

/* y = x rotated pair by pair by the (cos, sin) pairs cs. */
static void rotate(float *restrict y, const float *restrict x, const float *restrict cs,
                   int64_t half)
{
    for (int64_t i = 0; i < half; i++) {
        float x0 = x[2 * i], x1 = x[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        y[2 * i] = x0 * c - x1 * s;
        y[2 * i + 1] = x1 * c + x0 * s;
    }
}

static void rotate_in_place(float *y, const float *restrict cs, int64_t half)
{
    for (int64_t i = 0; i < half; i++) {
        float x0 = y[2 * i], x1 = y[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        y[2 * i] = x0 * c - x1 * s;
        y[2 * i + 1] = x1 * c + x0 * s;
    }
}

DF_CPU_KERNEL(rope)
{
    const df_view *x = &n->in[0];
    int64_t B = x->shape[0], H = x->shape[1], S = x->shape[2], D = x->shape[3];
    int64_t half = D / 2, rows = B * H * S;
    const float *table = df_view_ptr(&n->in[1]);
    const char *xbase = df_view_ptr(x);
    size_t es = df_dtype_size(x->dtype);
    float *out = df_view_ptr(&n->out);
    int nt = rows > 1 && rows * D >= DF_CPU_PAR_MIN ? df_cpu_threads(env) : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = r % S, h = r / S % H, b = r / S / H;
        const char *src =
            xbase + (b * x->stride[0] + h * x->stride[1] + s * x->stride[2]) * (int64_t)es;
        float *y = out + r * D;
        if (x->dtype == DF_DTYPE_F32) {
            rotate(y, (const float *)src, table + s * D, half);
        } else { /* widen the row into the output, then rotate it in place */
            df_cpu_load_f32(src, x->dtype, 1, y, D);
            rotate_in_place(y, table + s * D, half);
        }
    }
    return DF_OK;
}
