#version 450
/*
 * Softmax, layer norm, RMS norm and group norm (for group norm a row is one group of one
 * sample: cpg * hw contiguous values), statistics by reductions in f32, then the row
 * written. The op is a specialisation constant, and so is LANES, the invocations given to
 * one row: a workgroup of WG invocations normalises WG / LANES rows side by side, so that a
 * short row (a text encoder's 32-96 values) does not leave most of a workgroup idle through
 * every barrier of its reductions. LANES is a power of two from 1 to WG.
 */
#include "common.glsl"

#define WG 256
layout(local_size_x = WG) in;
layout(constant_id = 0) const int OP = 0;
layout(constant_id = 1) const int LANES = WG;


layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t x, w, b, o;
    int64_t x_dtype, w_dtype, b_dtype;
    int64_t rows, d, hw, cpg, channels, groups_x;
    float eps, pad;
};

/* Reductions over the LANES invocations of one row, side by side in shared memory. Every
 * invocation of the workgroup takes part (a row past the end reduces nothing), so the
 * barriers stay in uniform control flow. */
shared float red_buf[WG];

float row_sum(float v)
{
    uint t = gl_LocalInvocationID.x, l = t % uint(LANES);
    red_buf[t] = v;
    barrier();
    for (uint s = uint(LANES) / 2; s > 0; s >>= 1) {
        if (l < s)
            red_buf[t] += red_buf[t + s];
        barrier();
    }
    float r = red_buf[t - l];
    barrier();
    return r;
}

float row_max(float v)
{
    uint t = gl_LocalInvocationID.x, l = t % uint(LANES);
    red_buf[t] = v;
    barrier();
    for (uint s = uint(LANES) / 2; s > 0; s >>= 1) {
        if (l < s)
            red_buf[t] = max(red_buf[t], red_buf[t + s]);
        barrier();
    }
    float r = red_buf[t - l];
    barrier();
    return r;
}

void main()
{
    Params p = Params(pc.params);
    int lt = int(gl_LocalInvocationID.x);
    int t = lt % LANES;
    int64_t wg = int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x);
    int64_t row = wg * (WG / LANES) + lt / LANES;
    bool live = row < p.rows;
    int xt = int(p.x_dtype);
    /* a row past the end loops over nothing, reduces with the others and stores nothing */
    int64_t d = live ? p.d : 0, base = live ? row * d : 0;
    if (OP == OP_SOFTMAX) {
        float m = -1.0 / 0.0;
        for (int64_t i = t; i < d; i += LANES)
            m = max(m, load_f(p.x, xt, base + i));
        m = row_max(m);
        float s = 0.0;
        for (int64_t i = t; i < d; i += LANES)
            s += exp(load_f(p.x, xt, base + i) - m);
        float inv = 1.0 / row_sum(s);
        for (int64_t i = t; i < d; i += LANES)
            store_f(p.o, DT_F32, base + i, exp(load_f(p.x, xt, base + i) - m) * inv);
        return;
    }
    float mean = 0.0, rs;
    if (OP == OP_RMS_NORM) {
        float q = 0.0;
        for (int64_t i = t; i < d; i += LANES) {
            float v = load_f(p.x, xt, base + i);
            q += v * v;
        }
        q = row_sum(q);
        rs = 1.0 / sqrt(q / float(p.d) + p.eps);
    } else {
        float k = live ? load_f(p.x, xt, base) : 0.0;
        float s = 0.0, q = 0.0;
        for (int64_t i = t; i < d; i += LANES) {
            float v = load_f(p.x, xt, base + i) - k;
            s += v;
            q += v * v;
        }
        s = row_sum(s);
        q = row_sum(q);
        float ms = s / float(p.d);
        mean = k + ms;
        float var = max(q / float(p.d) - ms * ms, 0.0);
        rs = 1.0 / sqrt(var + p.eps);
    }
    int wt = int(p.w_dtype), bt = int(p.b_dtype);
    for (int64_t i = t; i < d; i += LANES) {
        float v = load_f(p.x, xt, base + i);
        float y;
        if (OP == OP_GROUP_NORM) {
            int64_t c = (row % (p.channels / p.cpg)) * p.cpg + i / p.hw;
            float a = rs * (p.w != 0ul ? load_f(p.w, wt, c) : 1.0);
            y = (v - mean) * a + (p.b != 0ul ? load_f(p.b, bt, c) : 0.0);
        } else {
            y = OP == OP_RMS_NORM ? v * rs : (v - mean) * rs;
            if (p.w != 0ul)
                y *= load_f(p.w, wt, i);
            if (p.b != 0ul)
                y += load_f(p.b, bt, i);
        }
        store_f(p.o, DT_F32, base + i, y);
    }
}
