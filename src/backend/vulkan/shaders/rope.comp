#version 450
/*
 * RoPE on interleaved pairs, (x0 c - x1 s, x1 c + x0 s), one workgroup per row (b, h, s);
 * with NORM (rms_norm_rope) the row is first RMS-normalised (and scaled by the weight) as
 * the rms_norm kernel does. x and out are strided views seen as [B, H, S, D]; the table is
 * [S, D/2, 2] f32.
 */
#include "common.glsl"

#define WG 64
layout(local_size_x = WG) in;
#include "reduce.glsl"

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x, table, w, o;
    int64_t x_dtype, w_dtype, o_dtype, norm;
    int64_t B, H, S, D;
    int64_t xs[4], os[4];
    int64_t groups_x;
    float eps, pad;
};

void main()
{
    Params p = Params(pc.params);
    int64_t row = int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x);
    if (row >= p.B * p.H * p.S)
        return;
    int64_t s = row % p.S, h = row / p.S % p.H, b = row / p.S / p.H;
    int64_t xo = b * p.xs[0] + h * p.xs[1] + s * p.xs[2];
    int64_t oo = b * p.os[0] + h * p.os[1] + s * p.os[2];
    int xt = int(p.x_dtype), t = int(gl_LocalInvocationID.x);
    int64_t half_d = p.D / 2;
    float rs = 1.0;
    if (p.norm != 0) {
        float q = 0.0;
        for (int64_t i = t; i < p.D; i += WG) {
            float v = load_f(p.x, xt, xo + i * p.xs[3]);
            q += v * v;
        }
        q = wg_sum(q);
        rs = 1.0 / sqrt(q / float(p.D) + p.eps);
    }
    for (int64_t i = t; i < half_d; i += WG) {
        float x0 = load_f(p.x, xt, xo + 2 * i * p.xs[3]);
        float x1 = load_f(p.x, xt, xo + (2 * i + 1) * p.xs[3]);
        if (p.norm != 0) {
            x0 *= rs;
            x1 *= rs;
            if (p.w != 0ul) {
                x0 *= load_f(p.w, int(p.w_dtype), 2 * i);
                x1 *= load_f(p.w, int(p.w_dtype), 2 * i + 1);
            }
        }
        float c = F32s(p.table + uint64_t(s * p.D + 2 * i) * 4ul).v[0];
        float sn = F32s(p.table + uint64_t(s * p.D + 2 * i + 1) * 4ul).v[0];
        store_f(p.o, int(p.o_dtype), oo + 2 * i * p.os[3], x0 * c - x1 * sn);
        store_f(p.o, int(p.o_dtype), oo + (2 * i + 1) * p.os[3], x1 * c + x0 * sn);
    }
}
