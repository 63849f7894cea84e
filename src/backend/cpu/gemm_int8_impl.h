/*
 * What the int8 driver (gemm_int8.c) and its micro-kernels (gemm_int8_x86.c) share.
 *
 * A micro-kernel computes one tile: DF_I8_MR rows of quantized activations against one
 * block of DF_I8_NR packed channels over the whole (padded) k, into f32 accumulators, group
 * by group: acc = corr + sum of u8 * s8 (int32, exact), then f = fma((float)acc,
 * scale_w * scale_a, f). Every kernel does exactly these operations in this order (the AVX2
 * one reaches the same integer as the sum of (u8 - 128) * s8).
 */
#ifndef DF_BACKEND_CPU_GEMM_INT8_IMPL_H
#define DF_BACKEND_CPU_GEMM_INT8_IMPL_H

#include "backend/cpu/gemm_int8.h"

typedef struct df_i8_tile_args {
    const df_i8_weight *w;
    int64_t block;                   /* which block of DF_I8_NR channels */
    const uint8_t *rows[DF_I8_MR];   /* each row's kp quantized activations */
    const float *scales[DF_I8_MR];   /* each row's n_groups scales */
} df_i8_tile_args;

typedef void (*df_i8_tile_fn)(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR]);

void df_i8_tile_portable(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR]);
/* The x86 kernels, or NULL when this CPU (cpuid, at run time) or compiler lacks them. */
df_i8_tile_fn df_i8_tile_avx512vnni_fn(void);
df_i8_tile_fn df_i8_tile_avx2_fn(void);
df_i8_tile_fn df_i8_tile_avxvnni_fn(void);

/* The placing of a channel quantized by df_i8_quantize_channel (core/int8_quant.h: kp
 * values and its group scales) as channel c of block b. */
void df_i8_place_channel(df_i8_weight *w, int64_t b, int c, const int8_t *q, const float *scale);

/* The oneDNN path (gemm_int8_dnnl.c): whole-k groups only (per-channel weight scales, as
 * oneDNN's output scales; the per-token scales, bias and the rest of the epilogue are
 * applied by the driver afterwards). */
bool df_i8_dnnl_available(void);
df_status df_i8_gemm_dnnl(const df_i8_act *a, df_i8_weight *w, float *out, int64_t ldc);
void df_i8_dnnl_free(void *form);

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
