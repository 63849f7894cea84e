#version 450
/*
 * The tiled matrix product of mm.comp on cooperative matrices (VK_KHR_cooperative_matrix),
 * for bf16 compute: C[z] = A[z] B[z] with the operands rounded to bf16, multiplied as
 * 16 x 16 x 16 f16 tiles with f32 accumulation. A bf16 value is exactly an f16 value while
 * it lies in f16's normal range (2^-14 <= |x| <= 65504), so inside that range the products
 * are the portable shader's, summed in another order. The host selects this shader only
 * where the device reports that tile shape and those types at subgroup scope
 * (vk_coopmat.c), and only for products without the convolution gather.
 *
 * A workgroup of 256 invocations computes a 64 x 64 tile of C: each k step of 16 loads the
 * A [64, 16] and B [16, 64] tiles into shared memory as the portable shader does (any float
 * dtype and stride, converted and rounded as they are loaded), then every subgroup
 * multiplies its share of the 16 output tiles of 16 x 16 (at most 4 each: subgroups of up
 * to 64 invocations). The accumulators go through shared memory once at the end, where
 * every invocation applies the epilogue of mm.comp (bias, activation, gated residual) to
 * 16 elements and stores them (f32 or bf16).
 *
 * Parameter block: mm.comp's (vk_ops_mm.c fills one struct for both).
 */
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_GOOGLE_include_directive : enable
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const int A_DT = 0;
layout(constant_id = 1) const int B_DT = 0;
const int BM = 64, BN = 64, BK = 16, T = 16;
const int TILES = (BM / T) * (BN / T), MAX_TILES = 4;

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

shared float16_t As[BM * BK]; /* [m][k] */
shared float16_t Bs[BK * BN]; /* [k][n] */
shared float Cs[BM * BN];     /* [m][n] */

void main()
{
    Params p = Params(pc.params);
    int tid = int(gl_LocalInvocationID.x);
    int64_t m0 = int64_t(gl_WorkGroupID.y) * BM, n0 = int64_t(gl_WorkGroupID.x) * BN;
    int64_t z = int64_t(gl_WorkGroupID.z);
    int sg = int(gl_SubgroupID), nsg = int(gl_NumSubgroups);
    coopmat<float, gl_ScopeSubgroup, T, T, gl_MatrixUseAccumulator> acc[MAX_TILES];
    for (int t = 0; t < MAX_TILES; t++)
        acc[t] = coopmat<float, gl_ScopeSubgroup, T, T, gl_MatrixUseAccumulator>(0.0);
    /* the tile positions each invocation loads, as in mm.comp */
    bool a_k = p.sak == 1, b_k = p.sbk == 1;
    const int AL = BM * BK / 256, BL = BK * BN / 256;
    uint64_t arow[AL], bcol[BL];
    int amm[AL], akk[AL], bnn[BL], bkk[BL];
    bool aok[AL], bok[BL];
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
        bcol[r] = elem_addr(p.b, B_DT, bok[r] ? z * p.zb + n * p.sbn : 0);
    }
    int sak = int(p.sak), sbk = int(p.sbk);
    for (int64_t k0 = 0; k0 < p.K; k0 += BK) {
        for (int r = 0; r < AL; r++) {
            int64_t k = k0 + akk[r];
            float v = aok[r] && k < p.K ? load_fi(arow[r], A_DT, int(k) * sak) : 0.0;
            As[amm[r] * BK + akk[r]] = float16_t(round_bf16(v));
        }
        for (int r = 0; r < BL; r++) {
            int64_t k = k0 + bkk[r];
            float v = bok[r] && k < p.K ? load_fi(bcol[r], B_DT, int(k) * sbk) : 0.0;
            Bs[bkk[r] * BN + bnn[r]] = float16_t(round_bf16(v));
        }
        barrier();
        for (int t = 0; t < MAX_TILES; t++) {
            int tile = sg + nsg * t;
            if (tile >= TILES)
                break;
            int tm = tile / (BN / T), tn = tile % (BN / T);
            coopmat<float16_t, gl_ScopeSubgroup, T, T, gl_MatrixUseA> ma;
            coopmat<float16_t, gl_ScopeSubgroup, T, T, gl_MatrixUseB> mb;
            coopMatLoad(ma, As, uint(tm * T * BK), uint(BK), gl_CooperativeMatrixLayoutRowMajor);
            coopMatLoad(mb, Bs, uint(tn * T), uint(BN), gl_CooperativeMatrixLayoutRowMajor);
            acc[t] = coopMatMulAdd(ma, mb, acc[t]);
        }
        barrier();
    }
    for (int t = 0; t < MAX_TILES; t++) {
        int tile = sg + nsg * t;
        if (tile >= TILES)
            break;
        int tm = tile / (BN / T), tn = tile % (BN / T);
        coopMatStore(acc[t], Cs, uint(tm * T * BN + tn * T), uint(BN),
                     gl_CooperativeMatrixLayoutRowMajor);
    }
    barrier();
    int ot = int(p.o_dtype);
    for (int e = tid; e < BM * BN; e += 256) {
        int64_t m = m0 + e / BN, n = n0 + e % BN;
        if (m >= p.M || n >= p.N)
            continue;
        float v = Cs[e];
        if (p.bias != 0ul)
            v += load_f(p.bias, int(p.bias_dtype), p.bias_per_row != 0 ? m : n);
        v = activate(int(p.act), v);
        if (p.gated != 0)
            v = load_f(p.resid, int(p.resid_dtype), m * p.ldr + n) +
                load_f(p.gate, int(p.gate_dtype), n) * v;
        store_f(p.o, ot, z * p.zo + m * p.ldc + n, v);
    }
}
