/*
 * The scores Q K^T of attention in int8 (k_attention_int8.c), for k_attention.c under int8
 * compute.
 *
 * K is prepared once per call (smoothed, quantized per key, packed); each task quantizes
 * its own Q rows per query; a block of scores is then an int32 product per (query, key)
 * times the two scales, written as f32 for k_attention.c's softmax and P V.
 *
 *   size_t n = df_attn_i8_k_bytes(B, H, Sk, D);     caller's scratch, 64-byte aligned
 *   df_attn_i8_k_prepare(&k8, k, path, mem);        K [B, H, Sk, D] view; OpenMP inside
 *   per task: df_attn_i8_q_load(&k8, q, b, h, i0, mq, qbuf)   qbuf: df_attn_i8_q_bytes(bq, D)
 *             df_attn_i8_scores(&k8, qbuf, b, h, mq, j0, nk, s, lds)
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
} df_attn_i8_k;

#define DF_ATTN_I8_MAX_D 1024 /* head dimensions past this keep the f32 scores */

/* Whether attention under `requested` compute with head dimension D takes its scores in
 * int8: int8 compute and 1 <= D <= DF_ATTN_I8_MAX_D, (an op recorded with int8 attention off
 * carries f32). */
bool df_attn_i8_wanted(int requested, int64_t D);

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

#endif
