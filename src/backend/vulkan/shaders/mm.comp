#version 450
/*
 * Tiled matrix product with f32 accumulation: C[z] = A[z] B[z] for BM x BN tiles of C per
 * workgroup (256 invocations, each a (BM/16) x (BN/16) block), through shared-memory tiles
 * of A [BM, 16] and B [16, BN]. Operands are strided views in any float dtype, converted as
 * they are loaded (bf16 and f16 weights stay 16-bit in memory); with BF16 they are rounded
 * to bf16 first, as bf16 products on the CPU round them. Epilogue: bias (per column, or per
 * row for a convolution), activation, gated residual (resid + gate * C), f32 or bf16 out.
 *
 * With CONV the B operand is the convolution's patch matrix, gathered from the image as it
 * is loaded (implicit im2col): B(k, n) = x[c, oy*stride - pad + ky, ox*stride - pad + kx]
 * for k = (c, ky, kx), n = (oy, ox), zero outside the image. The kernel size KH x KW is a
 * specialisation constant, so that splitting k divides by constants.
 */
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const int A_DT = 0;
layout(constant_id = 1) const int B_DT = 0;
layout(constant_id = 2) const int BF16 = 0;
layout(constant_id = 3) const int CONV = 0;
layout(constant_id = 4) const int BM = 64;
layout(constant_id = 5) const int BN = 64;
layout(constant_id = 6) const int KH = 1; /* CONV: the kernel's size */
layout(constant_id = 7) const int KW = 1;
const int BK = 16;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t a, b, bias, o, gate, resid;
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn;
    int64_t za, zb, zo;
    int64_t ldc, ldr;
    int64_t bias_dtype, gate_dtype, resid_dtype, o_dtype;
    int64_t act, gated, bias_per_row;
    int64_t C, H, W, kh, kw, Wo, stride, pad;
};

shared float As[BK * BM];
shared float Bs[BK * BN];

void main()
{
    Params p = Params(pc.params);
    const int TM = BM / 16, TN = BN / 16;
    int tid = int(gl_LocalInvocationID.x), tx = tid % 16, ty = tid / 16;
    int64_t m0 = int64_t(gl_WorkGroupID.y) * BM, n0 = int64_t(gl_WorkGroupID.x) * BN;
    int64_t z = int64_t(gl_WorkGroupID.z);
    float acc[TM * TN];
    for (int i = 0; i < TM * TN; i++)
        acc[i] = 0.0;
    /* Each invocation loads the same tile positions at every k step: consecutive
     * invocations walk k when A (B) is k-contiguous, else m (n). The rows (columns) it loads
     * are fixed, so their addresses are computed once and k indexes them in 32 bits (the
     * host checks K * stride fits). */
    bool a_k = p.sak == 1, b_k = CONV == 0 && p.sbk == 1;
    const int AL = BM * BK / 256, BL = BK * BN / 256;
    uint64_t arow[AL], bcol[BL];
    int amm[AL], akk[AL], bnn[BL], bkk[BL];
    bool aok[AL], bok[BL];
    int boy[BL], box[BL]; /* CONV: the output pixel of each column */
    for (int r = 0; r < AL; r++) {
        int i = tid + 256 * r;
        amm[r] = a_k ? i / BK : i % BM;
        akk[r] = a_k ? i % BK : i / BM;
        int64_t m = m0 + amm[r];
        aok[r] = m < p.M;
        arow[r] = elem_addr(p.a, A_DT, aok[r] ? z * p.za + m * p.sam : 0);
    }
    for (int r = 0; r < BL; r++) {
        int i = tid + 256 * r;
        bnn[r] = b_k ? i / BK : i % BN;
        bkk[r] = b_k ? i % BK : i / BN;
        int64_t n = n0 + bnn[r];
        bok[r] = n < p.N;
        bcol[r] = elem_addr(p.b, B_DT, CONV != 0 ? z * p.zb : bok[r] ? z * p.zb + n * p.sbn : 0);
        boy[r] = CONV != 0 ? int(n / p.Wo) : 0;
        box[r] = CONV != 0 ? int(n % p.Wo) : 0;
    }
    const int khw = KH * KW, kw = KW;
    int H = int(p.H), W = int(p.W);
    int cstride = int(p.stride), pad = int(p.pad);
    int sak = int(p.sak), sbk = int(p.sbk);
    for (int64_t k0 = 0; k0 < p.K; k0 += BK) {
        for (int r = 0; r < AL; r++) {
            int64_t k = k0 + akk[r];
            float v = aok[r] && k < p.K ? load_fi(arow[r], A_DT, int(k) * sak) : 0.0;
            As[akk[r] * BM + amm[r]] = BF16 != 0 ? round_bf16(v) : v;
        }
        for (int r = 0; r < BL; r++) {
            int64_t k = k0 + bkk[r];
            float v = 0.0;
            if (bok[r] && k < p.K && CONV != 0) { /* the patch matrix, gathered (32-bit) */
                int kk = int(k), c = kk / khw, rem = kk - c * khw, ky = rem / kw;
                int iy = boy[r] * cstride - pad + ky, ix = box[r] * cstride - pad + rem - ky * kw;
                if (iy >= 0 && iy < H && ix >= 0 && ix < W)
                    v = load_fi(bcol[r], B_DT, (c * H + iy) * W + ix);
            } else if (bok[r] && k < p.K) {
                v = load_fi(bcol[r], B_DT, int(k) * sbk);
            }
            Bs[bkk[r] * BN + bnn[r]] = BF16 != 0 ? round_bf16(v) : v;
        }
        barrier();
        for (int kk = 0; kk < BK; kk++) {
            float av[TM], bv[TN];
            for (int i = 0; i < TM; i++)
                av[i] = As[kk * BM + ty + 16 * i];
            for (int j = 0; j < TN; j++)
                bv[j] = Bs[kk * BN + tx + 16 * j];
            for (int i = 0; i < TM; i++)
                for (int j = 0; j < TN; j++)
                    acc[i * TN + j] = fma(av[i], bv[j], acc[i * TN + j]);
        }
        barrier();
    }
    int ot = int(p.o_dtype);
    for (int i = 0; i < TM; i++) {
        int64_t m = m0 + ty + 16 * i;
        if (m >= p.M)
            continue;
        for (int j = 0; j < TN; j++) {
            int64_t n = n0 + tx + 16 * j;
            if (n >= p.N)
                continue;
            float v = acc[i * TN + j];
            if (p.bias != 0ul)
                v += load_f(p.bias, int(p.bias_dtype), p.bias_per_row != 0 ? m : n);
            v = activate(int(p.act), v);
            if (p.gated != 0)
                v = load_f(p.resid, int(p.resid_dtype), m * p.ldr + n) +
                    load_f(p.gate, int(p.gate_dtype), n) * v;
            store_f(p.o, ot, z * p.zo + m * p.ldc + n, v);
        }
    }
}
