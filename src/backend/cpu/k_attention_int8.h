/*
 * The two products of attention in int8 (k_attention_int8.c), for k_attention.c under int8
 * compute: the scores Q K^T and P V.
 *
 * K and V are prepared once per call (smoothed, quantized per key / per channel, packed);
 * each task quantizes its own Q rows per query; a block of scores is then an int32 product
 * per (query, key) times the two scales, written as f32 for k_attention.c's softmax. The
 * softmax's probabilities of a block are quantized per row to 14-bit fixed point in two u8
 * planes, and P V adds the two int32 products per (query, channel), times the scales, to the
 * f32 accumulator.
 *
 *   size_t n = df_attn_i8_k_bytes(B, H, Sk, D);     caller's scratch, 64-byte aligned
 *   df_attn_i8_k_prepare(&k8, k, path, mem);        K [B, H, Sk, D] view; OpenMP inside
 *   size_t nv = df_attn_i8_v_bytes(B, H, Sk, Dv);
 *   df_attn_i8_v_prepare(&v8, v, vmem);             V [B, H, Sk, Dv] view; OpenMP inside
 *   per task: df_attn_i8_q_load(&k8, q, b, h, i0, mq, qbuf)   qbuf: df_attn_i8_q_bytes(bq, D)
 *             df_attn_i8_scores(&k8, qbuf, b, h, mq, j0, nk, s, lds)
 *             per row: sum = df_attn_i8_p_quantize(p, n, n4, pmax, u + r * ldu, &ps[r])
 *             df_attn_i8_pv(&k8, &v8, b, h, u, ldu, ps, mq, j0, nk, o, ldo)
 *   output row: o / l + v8.mean (V's mean, which the smoothing took out)
 */
#ifndef DF_K_ATTENTION_INT8_H
#define DF_K_ATTENTION_INT8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/gemm_int8.h"

#define DF_ATTN_I8_NR 32 /* keys per packed block */

typedef struct df_attn_i8_k {
    int64_t B, H, Sk, D;
    int64_t Dp;      /* D padded with zeros to a multiple of 4 */
    int64_t n_blk;   /* key blocks of DF_ATTN_I8_NR per (b, h) */
    int8_t *q;       /* [B*H][n_blk][Dp/4][NR][4] smoothed keys, quantized */
    float *scale;    /* [B*H][n_blk*NR] per key (0 past Sk) */
    int32_t *corr;   /* [B*H][n_blk*NR] -128 x the key's quantized sum (the u8 shift of Q) */
    float *mean;     /* [B*H][D] the mean key that was subtracted */
    bool vnni;       /* the AVX512-VNNI micro-kernel, else the portable one (same results) */
    bool avx2;       /* else the AVX2 one (same results) */
    bool avx512;     /* Q and K rows quantized with AVX-512 (same results; not portable) */
} df_attn_i8_k;

#define DF_ATTN_I8_NV 64 /* channels of V per P V micro-tile (V's rows padded to it) */

typedef struct df_attn_i8_v {
    int64_t Sk, Dv;
    int64_t Dvp;    /* Dv padded with zeros to a multiple of DF_ATTN_I8_NV */
    int64_t quads;  /* keys padded with zeros to a multiple of 4, over 4 */
    int8_t *q;      /* [B*H][quads][Dvp][4] smoothed values, quantized per channel */
    float *scale;   /* [B*H][Dvp] per channel (0 past Dv) */
    float *mean;    /* [B*H][Dv] the mean value row that was subtracted */
} df_attn_i8_v;

#define DF_ATTN_I8_MAX_D 1024 /* head dimensions past this keep the f32 attention */

/* Whether attention under `requested` compute with head dimensions D (Q, K) and Dv (V) runs
 * in int8: int8 compute and both in [1, DF_ATTN_I8_MAX_D] (an op recorded with int8
 * attention off carries f32). */
bool df_attn_i8_wanted(int requested, int64_t D, int64_t Dv);

/* Bytes of scratch for K's int8 form (a multiple of 64). */
size_t df_attn_i8_k_bytes(int64_t B, int64_t H, int64_t Sk, int64_t D);
/* Smooths, quantizes and packs k [B, H, Sk, D] (any float dtype, unit stride in D) into
 * mem (df_attn_i8_k_bytes of it), for the micro-kernel of `path` (AUTO: df_i8_path_best).
 * Runs its own OpenMP loop: call outside a parallel region. */
void df_attn_i8_k_prepare(df_attn_i8_k *k8, const df_view *k, df_i8_path path, void *mem);

/* Bytes of one task's quantized Q rows (bq rows). */
size_t df_attn_i8_q_bytes(int64_t bq, int64_t D);
/* Quantizes rows [i0, i0 + mq) of q [B, H, Sq, D] at (b, h) into qbuf. */
void df_attn_i8_q_load(const df_attn_i8_k *k8, const df_view *q, int64_t b, int64_t h,
                       int64_t i0, int64_t mq, void *qbuf);
/* s[r * lds + j] = Q_r . K_(j0 + j) for the mq loaded rows and keys [j0, j0 + nk) of (b, h),
 * with K smoothed (the softmax of a row does not change). j0 is a multiple of NR. */
void df_attn_i8_scores(const df_attn_i8_k *k8, const void *qbuf, int64_t b, int64_t h,
                       int64_t mq, int64_t j0, int64_t nk, float *s, int64_t lds);

/* Bytes of scratch for V's int8 form (a multiple of 64). */
size_t df_attn_i8_v_bytes(int64_t B, int64_t H, int64_t Sk, int64_t Dv);
/* Smooths (subtracts each channel's mean over the keys), quantizes per channel and packs
 * v [B, H, Sk, Dv] (any float dtype, unit stride in Dv) into mem. Runs its own OpenMP loop:
 * call outside a parallel region. */
void df_attn_i8_v_prepare(df_attn_i8_v *v8, const df_view *v, void *mem);

/* Quantizes the probabilities p[0..n) (in [0, pmax], pmax the largest) of one row of a
 * block to 14-bit fixed point, z = round(min(p[j] * 16383 / pmax, 16383)), as two u8
 * planes of 7 bits: u[j] = z >> 7, u[n4 + j] = z & 127, zeros in [n, n4) of both; *scale =
 * pmax / 16383. Returns the row's sum as the quantized values give it, for the softmax's
 * denominator. (k_attention.c's AVX-512 exp loop does the same in its pass.) */
float df_attn_i8_p_quantize(const float *p, int64_t n, int64_t n4, float pmax, uint8_t *u,
                            float *scale);

/* o[r * ldo + c] += ((hi * 128 + lo) * vscale[c]) * ps[r] for the mq rows and the Dv
 * channels, where hi and lo are the int32 sums over keys [j0, j0 + nk) of the two planes of
 * row r (u + r * ldu, as df_attn_i8_p_quantize wrote them with n4 = nk rounded up to 4)
 * times V's quantized (j, c). j0 is a multiple of 4. */
void df_attn_i8_pv(const df_attn_i8_k *k8, const df_attn_i8_v *v8, int64_t b, int64_t h,
                   const uint8_t *u, int64_t ldu, const float *ps, int64_t mq, int64_t j0,
                   int64_t nk, float *o, int64_t ldo);

#endif
