/*
 * The two products of attention in 8-bit integers (SageAttention-style), for
 * k_attention.c under int8 compute.
 *
 * Scores Q K^T:
 * - K is smoothed: the mean key of each (batch, head) is subtracted from every key. That
 *   changes all the scores of a query row by the same amount (q . mean), so not its softmax,
 *   and it removes the offset that keys of a DiT share, which would otherwise take most of
 *   the int8 range.
 * - Smoothed K and Q are quantized symmetrically per row (per key, per query): q = round(x *
 *   127 / max|x|), scale max|x| / 127. A score is the exact int32 dot product, converted
 *   once, times the key's scale and then the query's: ((float)acc * s_k) * s_q.
 * - The product is vpdpbusd (u8 x s8): Q is stored +128 as u8 and each key's accumulator
 *   starts at -128 x its quantized sum, which cancels the shift exactly. K is packed per
 *   block of 32 keys as quads of 4 d (the layout of gemm_int8's weights), so one 64-byte
 *   load feeds 16 keys; the AVX512-VNNI micro-kernel takes 8 queries x 32 keys at a time.
 *   The AVX2 kernel (CPUs without AVX512-VNNI, AVX-VNNI ones included) takes 2 queries x
 *   32 keys with gemm_int8's AVX2 trick; the portable kernel computes the same integers and
 *   the same f32 operations in the same order, so the three agree bit for bit. The path
 *   follows gemm_int8's dispatch (DIFFUSE_INT8_PATH=portable forces the portable one here
 *   too, =avx2 the AVX2 one).
 * P V:
 * - V is smoothed per channel (the mean over the keys of each (batch, head) is subtracted;
 *   k_attention.c adds it back to each normalised output row, exactly since the weights of
 *   a row sum to one) and quantized symmetrically per channel, packed as quads of 4 keys x
 *   the channels (one 64-byte load feeds 16 channels).
 * - The softmax's probabilities of a block, in [0, 1], are quantized per row against the
 *   row's largest in the block to 14-bit fixed point, z = round(p * 16383 / max), kept as
 *   two u8 planes of 7 bits (z >> 7 and z & 127): 8 bits alone lose the small
 *   probabilities that a peaked row has many of, and 7-bit planes let the AVX2 kernel use
 *   vpmaddubsw without saturating. The row's sum for the softmax's denominator is taken
 *   from the quantized values, so the weights that multiply V sum to one exactly.
 * - The product is vpdpbusd again (u8 P x s8 V, no shift needed), an int32 sum per plane
 *   over the block, then ((hi * 128 + lo) * s_v) * s_p added to the f32 accumulator. The
 *   AVX512-VNNI kernel takes 3 rows x 64 channels x both planes; the AVX2 one 2 rows x 16
 *   channels x both planes with vpmaddubsw and vpmaddwd; all three give the same bits, as
 *   for the scores.
 * The online softmax stays in k_attention.c (f32).
 */
#include <immintrin.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/k_attention_int8.h"

#define NR DF_ATTN_I8_NR
#define MR 8 /* queries per micro-tile */
#define NV DF_ATTN_I8_NV

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

bool df_attn_i8_wanted(int requested, int64_t D, int64_t Dv)
{
    /* DIFFUSE_INT8_ATTENTION=0 (or df_gen_params.int8_attention) made the op's compute f32
     * when it was recorded (df_ctx_attention_compute) */
    return requested == DF_DTYPE_I8 && D >= 1 && D <= DF_ATTN_I8_MAX_D && Dv >= 1 &&
           Dv <= DF_ATTN_I8_MAX_D;
}

static int64_t padded_d(int64_t D)
{
    return (D + 3) / 4 * 4;
}

size_t df_attn_i8_k_bytes(int64_t B, int64_t H, int64_t Sk, int64_t D)
{
    int64_t bh = B * H, keys = (Sk + NR - 1) / NR * NR;
    return round64((size_t)(bh * keys * padded_d(D))) + 2 * round64((size_t)(bh * keys) * 4) +
           round64((size_t)(bh * D) * sizeof(float));
}

/* Element (b, h, s, 0) of a [B, H, S, n] view, and its values as f32 into dst. */
static void load_row(const df_view *t, int64_t b, int64_t h, int64_t s, float *dst)
{
    int64_t n = t->shape[3], off = b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
    if (t->dtype == DF_DTYPE_F32) {
        memcpy(dst, (const float *)df_view_ptr(t) + off, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] = df_load_f32(df_view_ptr(t), t->dtype, off + j);
}

/* lrintf without the call (the default rounding, to nearest even). */
static inline int32_t round_even(float x)
{
#if defined(__x86_64__) || defined(__i386__)
    return _mm_cvtss_si32(_mm_set_ss(x));
#else
    return (int32_t)lrintf(x);
#endif
}

#if defined(__x86_64__) || defined(__i386__)
/* quantize_row with AVX-512: the same max, products and rounding. */
__attribute__((target("avx512f"))) static float quantize_row_avx512(const float *x, int64_t n,
                                                                    int8_t *q)
{
    __m512 mx = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        mx = _mm512_max_ps(mx, _mm512_abs_ps(_mm512_maskz_loadu_ps(k, x + j)));
    }
    float m = _mm512_reduce_max_ps(mx);
    __m512 inv = _mm512_set1_ps(m > 0 ? 127.0f / m : 0.0f);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = n - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - j)) - 1);
        __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + j), inv));
        _mm512_mask_cvtepi32_storeu_epi8(q + j, k, v);
    }
    return m / 127.0f;
}
#endif

/* Quantizes x[0..n) symmetrically; returns the scale (0 for an all-zero row). avx512: with
 * AVX-512 (the same results). */
static float quantize_row(const float *x, int64_t n, int8_t *q, bool avx512)
{
#if defined(__x86_64__) || defined(__i386__)
    if (avx512)
        return quantize_row_avx512(x, n, q);
#else
    (void)avx512;
#endif
    float mx = 0;
    for (int64_t j = 0; j < n; j++)
        mx = fabsf(x[j]) > mx ? fabsf(x[j]) : mx;
    float inv = mx > 0 ? 127.0f / mx : 0.0f;
    for (int64_t j = 0; j < n; j++)
        q[j] = (int8_t)round_even(x[j] * inv);
    return mx / 127.0f;
}

void df_attn_i8_k_prepare(df_attn_i8_k *k8, const df_view *k, df_i8_path path, void *mem)
{
    int64_t B = k->shape[0], H = k->shape[1], Sk = k->shape[2], D = k->shape[3];
    int64_t Dp = padded_d(D), n_blk = (Sk + NR - 1) / NR, keys = n_blk * NR;
    char *p = mem;
    *k8 = (df_attn_i8_k){.B = B, .H = H, .Sk = Sk, .D = D, .Dp = Dp, .n_blk = n_blk};
    k8->q = (int8_t *)p;
    p += round64((size_t)(B * H * keys * Dp));
    k8->scale = (float *)p;
    p += round64((size_t)(B * H * keys) * 4);
    k8->corr = (int32_t *)p;
    p += round64((size_t)(B * H * keys) * 4);
    k8->mean = (float *)p;
    if (path == DF_I8_PATH_AUTO)
        path = df_i8_path_best();
    k8->vnni = path != DF_I8_PATH_PORTABLE && path != DF_I8_PATH_AVX_VNNI &&
               path != DF_I8_PATH_AVX2 && df_i8_path_available(DF_I8_PATH_AVX512_VNNI);
    k8->avx2 = !k8->vnni && path != DF_I8_PATH_PORTABLE && df_i8_path_available(DF_I8_PATH_AVX2);
#if defined(__x86_64__) || defined(__i386__)
    k8->avx512 = path != DF_I8_PATH_PORTABLE && __builtin_cpu_supports("avx512f");
#endif

#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H;
        float *mean = k8->mean + bh * D;
        float row[Dp]; /* D <= DF_ATTN_I8_MAX_D */
        int8_t qr[Dp];
        double sum[Dp];
        memset(sum, 0, sizeof sum);
        for (int64_t s = 0; s < Sk; s++) {
            load_row(k, b, h, s, row);
            for (int64_t d = 0; d < D; d++)
                sum[d] += row[d];
        }
        for (int64_t d = 0; d < D; d++)
            mean[d] = Sk > 0 ? (float)(sum[d] / (double)Sk) : 0.0f;
        int8_t *kq = k8->q + bh * keys * Dp;
        memset(kq, 0, (size_t)(keys * Dp));
        for (int64_t s = 0; s < keys; s++) {
            float sc = 0;
            int32_t total = 0;
            if (s < Sk) {
                load_row(k, b, h, s, row);
                for (int64_t d = 0; d < D; d++)
                    row[d] -= mean[d];
                sc = quantize_row(row, D, qr, k8->avx512);
                for (int64_t d = 0; d < D; d++) {
                    total += qr[d];
                    /* block s / NR, quad d / 4, key s % NR, byte d % 4 */
                    kq[((s / NR * (Dp / 4) + d / 4) * NR + s % NR) * 4 + d % 4] = qr[d];
                }
            }
            k8->scale[bh * keys + s] = sc;
            k8->corr[bh * keys + s] = -128 * total;
        }
    }
}

size_t df_attn_i8_q_bytes(int64_t bq, int64_t D)
{
    return round64((size_t)(bq * padded_d(D)) + (size_t)bq * sizeof(float));
}

/* The quantized rows and their scales in a task's buffer of mq rows. */
static float *q_scales(const df_attn_i8_k *k8, const void *qbuf, int64_t mq)
{
    return (float *)((char *)qbuf + mq * k8->Dp);
}

void df_attn_i8_q_load(const df_attn_i8_k *k8, const df_view *q, int64_t b, int64_t h,
                       int64_t i0, int64_t mq, void *qbuf)
{
    int64_t D = k8->D, Dp = k8->Dp;
    uint8_t *u = qbuf;
    float *scales = q_scales(k8, qbuf, mq);
    float row[Dp];
    int8_t qr[Dp];
    for (int64_t r = 0; r < mq; r++) {
        load_row(q, b, h, i0 + r, row);
        scales[r] = quantize_row(row, D, qr, k8->avx512);
        for (int64_t d = 0; d < Dp; d++)
            u[r * Dp + d] = (uint8_t)((d < D ? qr[d] : 0) + 128);
    }
}

size_t df_attn_i8_v_bytes(int64_t B, int64_t H, int64_t Sk, int64_t Dv)
{
    int64_t bh = B * H, Dvp = (Dv + NV - 1) / NV * NV, quads = (Sk + 3) / 4;
    return round64((size_t)(bh * quads * 4 * Dvp)) + round64((size_t)(bh * Dvp) * sizeof(float)) +
           round64((size_t)(bh * Dv) * sizeof(float));
}

void df_attn_i8_v_prepare(df_attn_i8_v *v8, const df_view *v, void *mem)
{
    int64_t B = v->shape[0], H = v->shape[1], Sk = v->shape[2], Dv = v->shape[3];
    int64_t Dvp = (Dv + NV - 1) / NV * NV, quads = (Sk + 3) / 4;
    char *p = mem;
    *v8 = (df_attn_i8_v){.Sk = Sk, .Dv = Dv, .Dvp = Dvp, .quads = quads};
    v8->q = (int8_t *)p;
    p += round64((size_t)(B * H * quads * 4 * Dvp));
    v8->scale = (float *)p;
    p += round64((size_t)(B * H * Dvp) * sizeof(float));
    v8->mean = (float *)p;

#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < B * H; bh++) {
        int64_t b = bh / H, h = bh % H;
        float *mean = v8->mean + bh * Dv, *scale = v8->scale + bh * Dvp;
        float row[Dv], inv[Dv]; /* Dv <= DF_ATTN_I8_MAX_D */
        double sum[Dv];
        memset(sum, 0, sizeof sum);
        for (int64_t s = 0; s < Sk; s++) {
            load_row(v, b, h, s, row);
            for (int64_t c = 0; c < Dv; c++)
                sum[c] += row[c];
        }
        for (int64_t c = 0; c < Dv; c++) {
            mean[c] = Sk > 0 ? (float)(sum[c] / (double)Sk) : 0.0f;
            inv[c] = 0;
        }
        for (int64_t s = 0; s < Sk; s++) { /* inv holds each channel's max |v - mean| */
            load_row(v, b, h, s, row);
            for (int64_t c = 0; c < Dv; c++)
                inv[c] = fabsf(row[c] - mean[c]) > inv[c] ? fabsf(row[c] - mean[c]) : inv[c];
        }
        memset(scale, 0, (size_t)Dvp * sizeof *scale);
        for (int64_t c = 0; c < Dv; c++) {
            scale[c] = inv[c] / 127.0f;
            inv[c] = inv[c] > 0 ? 127.0f / inv[c] : 0.0f;
        }
        int8_t *vq = v8->q + bh * quads * 4 * Dvp;
        memset(vq, 0, (size_t)(quads * 4 * Dvp));
        for (int64_t s = 0; s < Sk; s++) {
            load_row(v, b, h, s, row);
            int8_t *dst = vq + s / 4 * Dvp * 4 + s % 4; /* quad s / 4, channel c, byte s % 4 */
            for (int64_t c = 0; c < Dv; c++)
                dst[c * 4] = (int8_t)round_even((row[c] - mean[c]) * inv[c]);
        }
    }
}

/* Portable: per (query, key) the int32 sum from the key's correction, then the scales. */
static void scores_plain(const df_attn_i8_k *k8, const uint8_t *u, const float *qs, int64_t bh,
                         int64_t mq, int64_t j0, int64_t nk, float *s, int64_t lds)
{
    int64_t Dp = k8->Dp, keys = k8->n_blk * NR;
    const float *ks = k8->scale + bh * keys;
    const int32_t *kc = k8->corr + bh * keys;
    for (int64_t r = 0; r < mq; r++)
        for (int64_t j = j0; j < j0 + nk; j++) {
            const int8_t *kb = k8->q + (bh * k8->n_blk + j / NR) * Dp * NR;
            int32_t acc = kc[j];
            for (int64_t d = 0; d < Dp; d++)
                acc += (int32_t)u[r * Dp + d] * kb[((d / 4) * NR + j % NR) * 4 + d % 4];
            s[r * lds + j - j0] = ((float)acc * ks[j]) * qs[r];
        }
}

#if defined(__x86_64__) || defined(__i386__)
static inline __mmask16 lanes(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
}

/* acc + a . b (vpdpbusd) with the accumulator tied to the instruction's destination: gcc 12
 * expands the intrinsic with a register copy (and, with many accumulators, a store) per
 * product. */
__attribute__((target("avx512f,avx512vnni"), always_inline)) static inline __m512i
dpbusd(__m512i acc, __m512i a, __m512i b)
{
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
    return acc;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
scores_avx512vnni(const df_attn_i8_k *k8, const uint8_t *u, const float *qs, int64_t bh,
                  int64_t mq, int64_t j0, int64_t nk, float *s, int64_t lds)
{
    int64_t Dp = k8->Dp, quads = Dp / 4, keys = k8->n_blk * NR;
    for (int64_t jb = 0; jb < nk; jb += NR) {
        int64_t j = j0 + jb;
        const int8_t *kb = k8->q + (bh * k8->n_blk + j / NR) * Dp * NR;
        __m512i c0 = _mm512_loadu_si512(k8->corr + bh * keys + j);
        __m512i c1 = _mm512_loadu_si512(k8->corr + bh * keys + j + 16);
        __m512 s0 = _mm512_loadu_ps(k8->scale + bh * keys + j);
        __m512 s1 = _mm512_loadu_ps(k8->scale + bh * keys + j + 16);
        __mmask16 m0 = lanes(nk - jb), m1 = lanes(nk - jb - 16);
        for (int64_t r0 = 0; r0 < mq; r0 += MR) {
            const uint8_t *a[MR];
            for (int r = 0; r < MR; r++)
                a[r] = u + (r0 + r < mq ? r0 + r : r0) * Dp; /* past mq: computed, not kept */
            __m512i acc[MR][2];
#pragma GCC unroll 8
            for (int r = 0; r < MR; r++)
                acc[r][0] = c0, acc[r][1] = c1;
            for (int64_t q = 0; q < quads; q++) {
                __m512i b0 = _mm512_loadu_si512(kb + q * NR * 4);
                __m512i b1 = _mm512_loadu_si512(kb + q * NR * 4 + 64);
#pragma GCC unroll 8
                for (int r = 0; r < MR; r++) {
                    int32_t x;
                    memcpy(&x, a[r] + q * 4, 4);
                    __m512i v = _mm512_set1_epi32(x);
                    acc[r][0] = dpbusd(acc[r][0], v, b0);
                    acc[r][1] = dpbusd(acc[r][1], v, b1);
                }
            }
            for (int r = 0; r < MR && r0 + r < mq; r++) {
                __m512 sq = _mm512_set1_ps(qs[r0 + r]);
                float *dst = s + (r0 + r) * lds + jb;
                __m512 f0 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][0]), s0), sq);
                __m512 f1 = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][1]), s1), sq);
                _mm512_mask_storeu_ps(dst, m0, f0);
                _mm512_mask_storeu_ps(dst + 16, m1, f1);
            }
        }
    }
}

/* AVX2 without VNNI: gemm_int8_x86.c's tile_avx2 on a block of 32 keys, two queries at a
 * time: |k| (u8) times (u - 128) with k's sign, pairs into s16 (at most 2 x 128 x 127),
 * then into each key's int32 lane. That is the VNNI kernels' corr + sum of u k, so the
 * same integer and then the same f32 operations: the same scores bit for bit. */
__attribute__((target("avx2,fma"))) static void scores_avx2(const df_attn_i8_k *k8,
                                                            const uint8_t *u, const float *qs,
                                                            int64_t bh, int64_t mq, int64_t j0,
                                                            int64_t nk, float *s, int64_t lds)
{
    int64_t Dp = k8->Dp, quads = Dp / 4, keys = k8->n_blk * NR;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    for (int64_t jb = 0; jb < nk; jb += NR) {
        int64_t j = j0 + jb, cols = nk - jb < NR ? nk - jb : NR;
        const int8_t *kb = k8->q + (bh * k8->n_blk + j / NR) * Dp * NR;
        const float *ks = k8->scale + bh * keys + j;
        for (int64_t r0 = 0; r0 < mq; r0 += 2) {
            const uint8_t *a0 = u + r0 * Dp, *a1 = u + (r0 + 1 < mq ? r0 + 1 : r0) * Dp;
            __m256i acc[2][4];
            for (int c = 0; c < 4; c++)
                acc[0][c] = acc[1][c] = _mm256_setzero_si256();
            for (int64_t q = 0; q < quads; q++) {
                __m256i bv[4], ba[4];
                for (int c = 0; c < 4; c++) {
                    bv[c] = _mm256_loadu_si256((const __m256i *)(kb + q * NR * 4 + 32 * c));
                    ba[c] = _mm256_abs_epi8(bv[c]);
                }
                int32_t x[2];
                memcpy(&x[0], a0 + q * 4, 4);
                memcpy(&x[1], a1 + q * 4, 4);
                for (int r = 0; r < 2; r++) {
                    __m256i v = _mm256_xor_si256(_mm256_set1_epi32(x[r]), flip);
                    for (int c = 0; c < 4; c++) {
                        __m256i p = _mm256_maddubs_epi16(ba[c], _mm256_sign_epi8(v, bv[c]));
                        acc[r][c] = _mm256_add_epi32(acc[r][c], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            for (int r = 0; r < 2 && r0 + r < mq; r++) {
                float row[NR];
                __m256 sq = _mm256_set1_ps(qs[r0 + r]);
                for (int c = 0; c < 4; c++) {
                    __m256 f =
                        _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][c]), _mm256_loadu_ps(ks + 8 * c));
                    _mm256_storeu_ps(row + 8 * c, _mm256_mul_ps(f, sq));
                }
                memcpy(s + (r0 + r) * lds + jb, row, (size_t)cols * sizeof(float));
            }
        }
    }
}
/* Row r of a P V tile: (hi x 128 + lo) x V's scale x P's scale added to its 64 channels of
 * o (left: channels of the row from c0 on). */
__attribute__((target("avx512f"), always_inline)) static inline void
pv_row_out(float *dst, const float *vs, int64_t left, float ps, __m512i h0, __m512i h1, __m512i h2,
           __m512i h3, __m512i l0, __m512i l1, __m512i l2, __m512i l3)
{
    __m512i h[4] = {h0, h1, h2, h3}, l[4] = {l0, l1, l2, l3};
    __m512 sp = _mm512_set1_ps(ps), c128 = _mm512_set1_ps(128.0f);
    for (int k = 0; k < 4; k++) {
        __mmask16 cm = lanes(left - 16 * k);
        __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(h[k]), c128);
        f = _mm512_add_ps(f, _mm512_cvtepi32_ps(l[k]));
        f = _mm512_mul_ps(_mm512_mul_ps(f, _mm512_loadu_ps(vs + 16 * k)), sp);
        __m512 d = _mm512_maskz_loadu_ps(cm, dst + 16 * k);
        _mm512_mask_storeu_ps(dst + 16 * k, cm, _mm512_add_ps(d, f));
    }
}

/* The accumulators of a P V tile are named variables: an array of them is kept in memory by
 * the compiler, which costs a store per product. */
#define PV_ZERO(x) __m512i x##0 = _mm512_setzero_si512(), x##1 = x##0, x##2 = x##0, x##3 = x##0
#define PV_DP(x, w)                                                                            \
    do {                                                                                       \
        x##0 = dpbusd(x##0, w, b0);                                                            \
        x##1 = dpbusd(x##1, w, b1);                                                            \
        x##2 = dpbusd(x##2, w, b2);                                                            \
        x##3 = dpbusd(x##3, w, b3);                                                            \
    } while (0)
#define PV_ROW(a, h, l)                                                                        \
    do {                                                                                       \
        int32_t x_, y_;                                                                        \
        memcpy(&x_, a + q * 4, 4);                                                             \
        memcpy(&y_, a + (nq + q) * 4, 4);                                                      \
        __m512i w_ = _mm512_set1_epi32(x_), z_ = _mm512_set1_epi32(y_);                        \
        PV_DP(h, w_);                                                                          \
        PV_DP(l, z_);                                                                          \
    } while (0)
#define PV_OUT(r, h, l)                                                                        \
    if (r0 + r < mq)                                                                           \
    pv_row_out(o + (r0 + r) * ldo + c0, vs + c0, Dv - c0, ps[r0 + r], h##0, h##1, h##2, h##3,  \
               l##0, l##1, l##2, l##3)

/* P V with AVX512-VNNI: 3 rows x 64 channels x both planes of P (24 accumulators), per
 * quad of keys one 64-byte load of V per 16 channels and two broadcasts of 4 u8 (hi, lo)
 * per row. */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
pv_avx512vnni(const df_attn_i8_v *v8, int64_t bh, const uint8_t *u, int64_t ldu, const float *ps,
              int64_t mq, int64_t q0, int64_t nq, float *o, int64_t ldo)
{
    int64_t Dvp = v8->Dvp, Dv = v8->Dv;
    const int8_t *vb = v8->q + (bh * v8->quads + q0) * Dvp * 4;
    const float *vs = v8->scale + bh * Dvp;
    for (int64_t c0 = 0; c0 < Dvp; c0 += NV) {
        for (int64_t r0 = 0; r0 < mq; r0 += 3) {
            /* rows past mq: computed, not kept */
            const uint8_t *a0 = u + r0 * ldu, *a1 = u + (r0 + 1 < mq ? r0 + 1 : r0) * ldu;
            const uint8_t *a2 = u + (r0 + 2 < mq ? r0 + 2 : r0) * ldu;
            PV_ZERO(h0_);
            PV_ZERO(l0_);
            PV_ZERO(h1_);
            PV_ZERO(l1_);
            PV_ZERO(h2_);
            PV_ZERO(l2_);
            for (int64_t q = 0; q < nq; q++) {
                const int8_t *vq = vb + (q * Dvp + c0) * 4;
                __m512i b0 = _mm512_loadu_si512(vq), b1 = _mm512_loadu_si512(vq + 64);
                __m512i b2 = _mm512_loadu_si512(vq + 128), b3 = _mm512_loadu_si512(vq + 192);
                PV_ROW(a0, h0_, l0_);
                PV_ROW(a1, h1_, l1_);
                PV_ROW(a2, h2_, l2_);
            }
            PV_OUT(0, h0_, l0_);
            PV_OUT(1, h1_, l1_);
            PV_OUT(2, h2_, l2_);
        }
    }
}
#undef PV_ZERO
#undef PV_DP
#undef PV_ROW
#undef PV_OUT

/* P V with AVX2, gemm_int8's AVX2 trick without its sign step (P's planes are u8 of at most
 * 127): vpmaddubsw P x V into s16 pairs (at most 2 x 127 x 128, no saturation), vpmaddwd
 * into each channel's int32 lane, the VNNI kernel's sums. 2 rows x 16 channels x both
 * planes. */
__attribute__((target("avx2"))) static void pv_avx2(const df_attn_i8_v *v8, int64_t bh,
                                                    const uint8_t *u, int64_t ldu, const float *ps,
                                                    int64_t mq, int64_t q0, int64_t nq, float *o,
                                                    int64_t ldo)
{
    int64_t Dvp = v8->Dvp, Dv = v8->Dv;
    const int8_t *vb = v8->q + (bh * v8->quads + q0) * Dvp * 4;
    const float *vs = v8->scale + bh * Dvp;
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256 c128 = _mm256_set1_ps(128.0f);
    for (int64_t c0 = 0; c0 < Dvp; c0 += 16) {
        for (int64_t r0 = 0; r0 < mq; r0 += 2) {
            const uint8_t *a[2] = {u + r0 * ldu, u + (r0 + 1 < mq ? r0 + 1 : r0) * ldu};
            __m256i acc[2][2][2]; /* [row][plane][8 channels] */
            for (int r = 0; r < 2; r++)
                for (int p = 0; p < 2; p++)
                    acc[r][p][0] = acc[r][p][1] = _mm256_setzero_si256();
            for (int64_t q = 0; q < nq; q++) {
                const int8_t *vq = vb + (q * Dvp + c0) * 4;
                __m256i b0 = _mm256_loadu_si256((const __m256i *)vq);
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(vq + 32));
                for (int r = 0; r < 2; r++)
                    for (int p = 0; p < 2; p++) {
                        int32_t x;
                        memcpy(&x, a[r] + (p * nq + q) * 4, 4);
                        __m256i w = _mm256_set1_epi32(x);
                        acc[r][p][0] = _mm256_add_epi32(
                            acc[r][p][0], _mm256_madd_epi16(_mm256_maddubs_epi16(w, b0), ones));
                        acc[r][p][1] = _mm256_add_epi32(
                            acc[r][p][1], _mm256_madd_epi16(_mm256_maddubs_epi16(w, b1), ones));
                    }
            }
            for (int r = 0; r < 2 && r0 + r < mq; r++) {
                __m256 sp = _mm256_set1_ps(ps[r0 + r]);
                float *dst = o + (r0 + r) * ldo + c0;
                for (int c = 0; c < 2; c++) {
                    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][0][c]), c128);
                    f = _mm256_add_ps(f, _mm256_cvtepi32_ps(acc[r][1][c]));
                    f = _mm256_mul_ps(_mm256_mul_ps(f, _mm256_loadu_ps(vs + c0 + 8 * c)), sp);
                    float t[8];
                    _mm256_storeu_ps(t, f);
                    for (int e = 0; e < 8 && c0 + 8 * c + e < Dv; e++)
                        dst[8 * c + e] += t[e];
                }
            }
        }
    }
}
#endif

void df_attn_i8_scores(const df_attn_i8_k *k8, const void *qbuf, int64_t b, int64_t h,
                       int64_t mq, int64_t j0, int64_t nk, float *s, int64_t lds)
{
    int64_t bh = b * k8->H + h;
    const float *qs = q_scales(k8, qbuf, mq);
#if defined(__x86_64__) || defined(__i386__)
    if (k8->vnni) {
        scores_avx512vnni(k8, qbuf, qs, bh, mq, j0, nk, s, lds);
        return;
    }
    if (k8->avx2) {
        scores_avx2(k8, qbuf, qs, bh, mq, j0, nk, s, lds);
        return;
    }
#endif
    scores_plain(k8, qbuf, qs, bh, mq, j0, nk, s, lds);
}

/* Portable P V: per (row, channel) the int32 sums of both planes over the block's keys,
 * then the same f32 operations as the vector kernels. */
static void pv_plain(const df_attn_i8_v *v8, int64_t bh, const uint8_t *u, int64_t ldu,
                     const float *ps, int64_t mq, int64_t q0, int64_t nq, float *o, int64_t ldo)
{
    int64_t Dvp = v8->Dvp;
    const int8_t *vb = v8->q + (bh * v8->quads + q0) * Dvp * 4;
    const float *vs = v8->scale + bh * Dvp;
    for (int64_t r = 0; r < mq; r++)
        for (int64_t c = 0; c < v8->Dv; c++) {
            int32_t hs = 0, ls = 0;
            for (int64_t j = 0; j < nq * 4; j++) {
                int32_t vv = vb[(j / 4 * Dvp + c) * 4 + j % 4];
                hs += (int32_t)u[r * ldu + j] * vv;
                ls += (int32_t)u[r * ldu + nq * 4 + j] * vv;
            }
            float f = (float)hs * 128.0f + (float)ls;
            o[r * ldo + c] += (f * vs[c]) * ps[r];
        }
}

void df_attn_i8_pv(const df_attn_i8_k *k8, const df_attn_i8_v *v8, int64_t b, int64_t h,
                   const uint8_t *u, int64_t ldu, const float *ps, int64_t mq, int64_t j0,
                   int64_t nk, float *o, int64_t ldo)
{
    int64_t bh = b * k8->H + h, q0 = j0 / 4, nq = (nk + 3) / 4;
#if defined(__x86_64__) || defined(__i386__)
    if (k8->vnni) {
        pv_avx512vnni(v8, bh, u, ldu, ps, mq, q0, nq, o, ldo);
        return;
    }
    if (k8->avx2) {
        pv_avx2(v8, bh, u, ldu, ps, mq, q0, nq, o, ldo);
        return;
    }
#endif
    pv_plain(v8, bh, u, ldu, ps, mq, q0, nq, o, ldo);
}

float df_attn_i8_p_quantize(const float *p, int64_t n, int64_t n4, float pmax, uint8_t *u,
                            float *scale)
{
    uint8_t *lo = u + n4;
    int64_t total = 0;
    float inv = pmax > 0 ? 16383.0f / pmax : 0.0f;
    for (int64_t j = 0; j < n; j++) {
        int32_t z = round_even(p[j] * inv < 16383.0f ? p[j] * inv : 16383.0f);
        u[j] = (uint8_t)(z >> 7);
        lo[j] = (uint8_t)(z & 127);
        total += z;
    }
    memset(u + n, 0, (size_t)(n4 - n));
    memset(lo + n, 0, (size_t)(n4 - n));
    *scale = pmax / 16383.0f;
    return (float)total * *scale;
}
