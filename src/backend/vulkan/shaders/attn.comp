#version 450
/*
 * Flash attention, softmax(q k^T * scale + mask) v, with an online softmax: one invocation
 * per query row (i, head h, batch b), 64 rows per workgroup (neighbouring invocations read
 * the same keys). The row walks the keys in blocks of BK: the block's scores in registers,
 * the running max m and sum l rescale the accumulator once per block, then the block's
 * probabilities times v are added. Only BK scores exist at a time, never the S x S matrix.
 * No shared memory and no barriers. Causal: key j is seen by query i when j <= i. A row
 * whose every key is masked gives zeros. With BF16, q and k are rounded to bf16, and so
 * are the probabilities and v (the CPU's bf16 products); the probabilities are rounded per
 * block relative to the running max. MAXD (a specialisation constant, at least D and Dv)
 * sizes the private q row and accumulator; the loops over them run to MAXD, skipping the
 * dims past D (Dv), and are unrolled ([[unroll]]) so that the rows stay in registers (on
 * lavapipe a loop to D kept them in memory: te-t5's attention about 15% slower). The unroll
 * is also what keeps the row correct on lavapipe: llvmpipe ends any invocation's loops after
 * 65535 iterations in all, silently, and without it NIR left the loops over MAXD >= 64 rolled,
 * so a row of D = 64 stopped after about 486 keys (the rest of its output never written).
 * Unrolled, each key costs two loop iterations, and the host refuses more keys than fit
 * (dvk_run_attention) on a CPU implementation.
 */
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require

layout(local_size_x = 64) in;
layout(constant_id = 0) const int BF16 = 0;
layout(constant_id = 1) const int MAXD = 64;
#define BK 32

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t q, k, v, mask, o;
    int64_t q_dtype, k_dtype, v_dtype, o_dtype;
    int64_t B, H, Sq, Sk, D, Dv;
    int64_t qs[4], ks[4], vs[4], ms[4], os[3];
    int64_t causal;
    float scale, pad;
};

void main()
{
    Params p = Params(pc.params);
    int64_t i = int64_t(gl_GlobalInvocationID.x), h = int64_t(gl_WorkGroupID.y);
    int64_t b = int64_t(gl_WorkGroupID.z);
    if (i >= p.Sq)
        return;
    int D = int(p.D), Dv = int(p.Dv);
    int qt = int(p.q_dtype), kt = int(p.k_dtype), vt = int(p.v_dtype);
    int ks3 = int(p.ks[3]), vs3 = int(p.vs[3]); /* the host checks they fit 32 bits */
    float qrow[MAXD], acc[MAXD];
    int64_t qo = b * p.qs[0] + h * p.qs[1] + i * p.qs[2];
    [[unroll]] for (int d = 0; d < MAXD; d++) {
        float x = d < D ? load_f(p.q, qt, qo + d * p.qs[3]) : 0.0;
        qrow[d] = BF16 != 0 ? round_bf16(x) : x;
        acc[d] = 0.0;
    }
    const float NEG_INF = -1.0 / 0.0;
    float m = NEG_INF, l = 0.0;
    int64_t kend = p.causal != 0 ? min(i + 1, p.Sk) : p.Sk;
    int64_t kb = b * p.ks[0] + h * p.ks[1], vb = b * p.vs[0] + h * p.vs[1];
    int64_t mb = b * p.ms[0] + h * p.ms[1] + i * p.ms[2];
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int nk = int(min(int64_t(BK), kend - j0));
        float s[BK];
        float bmax = NEG_INF;
        for (int jj = 0; jj < nk; jj++) {
            uint64_t krow = elem_addr(p.k, kt, kb + (j0 + jj) * p.ks[2]);
            float dot = 0.0;
            [[unroll]] for (int d = 0; d < MAXD; d++) {
                if (d < D) {
                    float kv = load_fi(krow, kt, d * ks3);
                    dot = fma(qrow[d], BF16 != 0 ? round_bf16(kv) : kv, dot);
                }
            }
            float x = dot * p.scale;
            if (p.mask != 0ul)
                x += F32s(p.mask + uint64_t(mb + (j0 + jj) * p.ms[3]) * 4ul).v[0];
            s[jj] = x;
            bmax = max(bmax, x);
        }
        float m_new = max(m, bmax);
        if (m_new == NEG_INF)
            continue; /* every key so far is masked */
        float alpha = m == NEG_INF ? 0.0 : exp(m - m_new);
        float sum = 0.0;
        for (int jj = 0; jj < nk; jj++) {
            float e = s[jj] == NEG_INF ? 0.0 : exp(s[jj] - m_new);
            sum += e;
            s[jj] = BF16 != 0 ? round_bf16(e) : e;
        }
        l = l * alpha + sum;
        m = m_new;
        [[unroll]] for (int d = 0; d < MAXD; d++)
            acc[d] *= alpha;
        for (int jj = 0; jj < nk; jj++) {
            uint64_t vrow = elem_addr(p.v, vt, vb + (j0 + jj) * p.vs[2]);
            float pj = s[jj];
            [[unroll]] for (int d = 0; d < MAXD; d++) {
                if (d < Dv) {
                    float vv = load_fi(vrow, vt, d * vs3);
                    acc[d] = fma(pj, BF16 != 0 ? round_bf16(vv) : vv, acc[d]);
                }
            }
        }
    }
    int64_t oo = b * p.os[0] + i * p.os[1] + h * p.os[2];
    float inv = l > 0.0 ? 1.0 / l : 0.0;
    [[unroll]] for (int d = 0; d < MAXD; d++)
        if (d < Dv)
            store_f(p.o, int(p.o_dtype), oo + d, acc[d] * inv);
}
