/*
 * What the int8 driver (gemm_int8.c) and its micro-kernels (gemm_int8_x86.c) share.
 *
 * A micro-kernel computes one tile: DF_I8_MR rows of quantized activations against one
 * block of DF_I8_NR packed channels, into f32 accumulators, group by group:
 * acc = corr + sum of u8 * s8 (int32, exact), then f = fma((float)acc, scale_w * scale_a, f).
 * Every kernel does exactly these operations in this order (the AVX2 one reaches the same
 * integer as the sum of (u8 - 128) * s8).
 *
 * A call covers one piece of k, the quads (runs of 4 k) [q0, q1), so that the driver can
 * keep a piece of the weight's block in L1 while every tile of a chunk of rows runs over
 * it. A group cut by q1 leaves its int32 sums in `part`, and the next piece resumes them;
 * the f32 tile is added to (the driver zeroes it before the first piece). The operations
 * and their order are those of one call over the whole k.
 */
#ifndef DF_BACKEND_CPU_GEMM_INT8_IMPL_H
#define DF_BACKEND_CPU_GEMM_INT8_IMPL_H

#include "backend/cpu/gemm_int8.h"

typedef struct df_i8_tile_args {
    const df_i8_weight *w;
    int64_t block;                   /* which block of DF_I8_NR channels */
    int64_t q0, q1;                  /* the piece of k: quads [q0, q1) */
    const uint8_t *rows[DF_I8_MR];   /* each row's kp quantized activations */
    const float *scales[DF_I8_MR];   /* each row's n_groups scales */
    int32_t (*part)[DF_I8_NR];       /* [DF_I8_MR]: a cut group's sums, between pieces */
} df_i8_tile_args;

typedef void (*df_i8_tile_fn)(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR]);

/* The quads [*qs, *qe) of group g (of gq quads) in the call's piece. A kernel runs the
 * groups g = q0 / gq while g * gq < q1; a group starts from corr when *qs is its first quad,
 * else from part, and ends (into f32) when *qe is its last, else into part. */
static inline void df_i8_group_span(const df_i8_tile_args *t, int64_t g, int64_t gq, int64_t *qs,
                                    int64_t *qe)
{
    *qs = g * gq > t->q0 ? g * gq : t->q0;
    *qe = (g + 1) * gq < t->q1 ? (g + 1) * gq : t->q1;
}

void df_i8_tile_portable(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR]);
/* The x86 kernels, or NULL when this CPU (cpuid, at run time) or compiler lacks them. */
df_i8_tile_fn df_i8_tile_avx512vnni_fn(void);
df_i8_tile_fn df_i8_tile_avx2_fn(void);
df_i8_tile_fn df_i8_tile_avxvnni_fn(void);

/* One row of activations x (k values, f32 or bf16) quantized into q (n_groups * group
 * bytes, u8 = value + 128, zero past k) and its n_groups scales, exactly as the scalar
 * loop of gemm_int8.c does it; the AVX-512 one, or NULL when this CPU lacks it. */
typedef void (*df_i8_quantize_row_fn)(const void *x, bool bf16, int64_t k, int64_t group,
                                      int64_t n_groups, uint8_t *q, float *sc);
df_i8_quantize_row_fn df_i8_quantize_row_avx512_fn(void);

/* The placing of a channel quantized by df_i8_quantize_channel (core/int8_quant.h: kp
 * values and its group scales) as channel c of block b. */
void df_i8_place_channel(df_i8_weight *w, int64_t b, int c, const int8_t *q, const float *scale);

/* The oneDNN path (gemm_int8_dnnl.c): whole-k groups only (per-channel weight scales, as
 * oneDNN's output scales; the per-token scales, bias and the rest of the epilogue are
 * applied by the driver afterwards). */
bool df_i8_dnnl_available(void);
df_status df_i8_gemm_dnnl(const df_i8_act *a, df_i8_weight *w, float *out, int64_t ldc);
void df_i8_dnnl_free(void *form);

/* out = epilogue(a w^T) on exactly `path` (a kernel this CPU has, or ONEDNN for whole-k
 * weights), not counted by df_i8_products: the whole-k choice's probe. The best of the
 * project's own kernels on this CPU. */
df_status df_i8_gemm_run(const df_i8_act *a, const df_i8_weight *w, const df_i8_epilogue *e,
                         df_i8_path path);
df_i8_path df_i8_best_kernel(void);

/* Whether oneDNN runs AMX-INT8 on this CPU (gemm.c). */
bool df_cpu_has_amx_int8(void);

/* gemm.c's oneDNN engine and this thread's stream; its error message for a dnnl status; its
 * reorder of src (laid out as the dnnl_memory_desc_t src_md) into dst (dst_md) on that
 * stream, waited for. */
df_status df_gemm_dnnl_handles(void **engine, void **stream);
df_status df_gemm_dnnl_failed(int status, const char *what);
df_status df_gemm_dnnl_reorder(const void *src_md, const void *src, const void *dst_md, void *dst,
                               const char *what);

#endif
