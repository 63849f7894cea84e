#version 450
/*
 * Flash attention, softmax(q k^T * scale + mask) v, with an online softmax: one workgroup
 * per query row (i, head h, batch b). Keys are taken WG at a time: each invocation scores
 * one key, the block's max and sum come from workgroup reductions, the running max m and
 * sum l rescale the accumulator, and each invocation accumulates its share of the Dv
 * output columns. Only one block of WG scores exists at a time, never the S x S matrix.
 * Causal: key j is seen by query i when j <= i. A row whose every key is masked gives
 * zeros. With BF16, q and k are rounded to bf16, and so are the probabilities and v
 * (the CPU's bf16 products). D and Dv are at most 4 * WG.
 */
#include "common.glsl"

#define WG 64
layout(local_size_x = WG) in;
layout(constant_id = 0) const int BF16 = 0;
#include "reduce.glsl"

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t q, k, v, mask, o;
    int64_t q_dtype, k_dtype, v_dtype, o_dtype;
    int64_t B, H, Sq, Sk, D, Dv;
    int64_t qs[4], ks[4], vs[4], ms[4], os[3];
    int64_t causal;
    float scale, pad;
};

shared float qrow[4 * WG];
shared float prob[WG];

void main()
{
    Params p = Params(pc.params);
    int64_t i = int64_t(gl_WorkGroupID.x), h = int64_t(gl_WorkGroupID.y);
    int64_t b = int64_t(gl_WorkGroupID.z);
    int t = int(gl_LocalInvocationID.x);
    int64_t qo = b * p.qs[0] + h * p.qs[1] + i * p.qs[2];
    for (int64_t d = t; d < p.D; d += WG) {
        float x = load_f(p.q, int(p.q_dtype), qo + d * p.qs[3]);
        qrow[int(d)] = BF16 != 0 ? round_bf16(x) : x;
    }
    barrier();
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    float m = -1.0 / 0.0, l = 0.0;
    int64_t kend = p.causal != 0 ? min(i + 1, p.Sk) : p.Sk;
    for (int64_t j0 = 0; j0 < kend; j0 += WG) {
        int64_t j = j0 + t;
        float s = -1.0 / 0.0;
        if (j < kend) {
            int64_t ko = b * p.ks[0] + h * p.ks[1] + j * p.ks[2];
            float dot = 0.0;
            for (int64_t d = 0; d < p.D; d++) {
                float kv = load_f(p.k, int(p.k_dtype), ko + d * p.ks[3]);
                dot = fma(qrow[int(d)], BF16 != 0 ? round_bf16(kv) : kv, dot);
            }
            s = dot * p.scale;
            if (p.mask != 0ul)
                s += F32s(p.mask + uint64_t(b * p.ms[0] + h * p.ms[1] + i * p.ms[2] +
                                            j * p.ms[3]) * 4ul).v[0];
        }
        float m_new = max(m, wg_max(s));
        if (m_new == -1.0 / 0.0)
            continue; /* every key so far is masked (uniform across the workgroup) */
        float e = s == -1.0 / 0.0 ? 0.0 : exp(s - m_new);
        float sum = wg_sum(e);
        float alpha = m == -1.0 / 0.0 ? 0.0 : exp(m - m_new);
        l = l * alpha + sum;
        m = m_new;
        prob[t] = BF16 != 0 ? round_bf16(e) : e;
        barrier();
        int64_t nk = min(int64_t(WG), kend - j0);
        for (int r = 0; r < 4; r++) {
            int64_t d = t + r * WG;
            if (d >= p.Dv)
                break;
            float a = acc[r] * alpha;
            for (int64_t jj = 0; jj < nk; jj++) {
                int64_t vo = b * p.vs[0] + h * p.vs[1] + (j0 + jj) * p.vs[2] + d * p.vs[3];
                float vv = load_f(p.v, int(p.v_dtype), vo);
                a = fma(prob[int(jj)], BF16 != 0 ? round_bf16(vv) : vv, a);
            }
            acc[r] = a;
        }
        barrier();
    }
    int64_t oo = b * p.os[0] + i * p.os[1] + h * p.os[2];
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    for (int r = 0; r < 4; r++) {
        int64_t d = t + r * WG;
        if (d < p.Dv)
            store_f(p.o, int(p.o_dtype), oo + d, acc[r] * inv);
    }
}
