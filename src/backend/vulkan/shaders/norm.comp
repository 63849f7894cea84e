#version 450
/*
 * Softmax, layer norm, RMS norm and group norm: one workgroup per row (for group norm a
 * row is one group of one sample: cpg * hw contiguous values), statistics by workgroup
 * reductions in f32, then the row written. The op is a specialisation constant.
 */
#include "common.glsl"

#define WG 256
layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;
#include "reduce.glsl"

#define NORM_SOFTMAX 0
#define NORM_LAYER 1
#define NORM_RMS 2
#define NORM_GROUP 3

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x, w, b, o;
    int64_t x_dtype, w_dtype, b_dtype;
    int64_t rows, d, hw, cpg, channels, groups_x;
    float eps, pad;
};

void main()
{
    Params p = Params(pc.params);
    int64_t row = int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x);
    if (row >= p.rows)
        return;
    int t = int(gl_LocalInvocationID.x);
    int xt = int(p.x_dtype);
    int64_t d = p.d, base = row * d;
    if (OP == NORM_SOFTMAX) {
        float m = -1.0 / 0.0;
        for (int64_t i = t; i < d; i += WG)
            m = max(m, load_f(p.x, xt, base + i));
        m = wg_max(m);
        float s = 0.0;
        for (int64_t i = t; i < d; i += WG)
            s += exp(load_f(p.x, xt, base + i) - m);
        float inv = 1.0 / wg_sum(s);
        for (int64_t i = t; i < d; i += WG)
            store_f(p.o, DT_F32, base + i, exp(load_f(p.x, xt, base + i) - m) * inv);
        return;
    }
    float mean = 0.0, rs;
    if (OP == NORM_RMS) {
        float q = 0.0;
        for (int64_t i = t; i < d; i += WG) {
            float v = load_f(p.x, xt, base + i);
            q += v * v;
        }
        q = wg_sum(q);
        rs = 1.0 / sqrt(q / float(d) + p.eps);
    } else {
        float k = load_f(p.x, xt, base);
        float s = 0.0, q = 0.0;
        for (int64_t i = t; i < d; i += WG) {
            float v = load_f(p.x, xt, base + i) - k;
            s += v;
            q += v * v;
        }
        s = wg_sum(s);
        q = wg_sum(q);
        float ms = s / float(d);
        mean = k + ms;
        float var = max(q / float(d) - ms * ms, 0.0);
        rs = 1.0 / sqrt(var + p.eps);
    }
    int wt = int(p.w_dtype), bt = int(p.b_dtype);
    for (int64_t i = t; i < d; i += WG) {
        float v = load_f(p.x, xt, base + i);
        float y;
        if (OP == NORM_GROUP) {
            int64_t c = (row % (p.channels / p.cpg)) * p.cpg + i / p.hw;
            float a = rs * (p.w != 0ul ? load_f(p.w, wt, c) : 1.0);
            y = (v - mean) * a + (p.b != 0ul ? load_f(p.b, bt, c) : 0.0);
        } else {
            y = OP == NORM_RMS ? v * rs : (v - mean) * rs;
            if (p.w != 0ul)
                y *= load_f(p.w, wt, i);
            if (p.b != 0ul)
                y += load_f(p.b, bt, i);
        }
        store_f(p.o, DT_F32, base + i, y);
    }
}
