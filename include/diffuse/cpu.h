/*
 * What the CPU offers for matrix products: whether bf16 compute is fast here, and the raw
 * rate of the GEMM provider (oneDNN), which benchmarks use as the ceiling that diffuse's
 * own matrix products are measured against.
 */
#ifndef DIFFUSE_CPU_H
#define DIFFUSE_CPU_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when the CPU has native bf16 dot products (AMX-BF16 or AVX512-BF16), so that bf16
 * compute is faster than f32; bf16 compute works everywhere, but elsewhere it is slower.
 * Use it to choose the default compute dtype. */
DF_API bool df_cpu_has_fast_bf16(void);

/* The kernel int8 compute runs on this CPU: "avx512-vnni", "avx-vnni" or "portable" (chosen
 * from cpuid; DIFFUSE_INT8_PATH forces one the CPU has). */
DF_API const char *df_cpu_int8_kernel(void);

/* Measures the GEMM provider alone: C[m, n] (f32) = A[m, k] B[k, n] with A and B already
 * in `dtype` (DF_DTYPE_F32 or DF_DTYPE_BF16; DF_DTYPE_I8: u8 x s8 -> s32, oneDNN's int8
 * ceiling) and B already in the provider's preferred layout, on `threads` threads (0 = all cores), `reps` timed runs after one warm-up.
 * *out_gflops is the best run's rate. Runs on the calling thread and blocks; it touches
 * no context. Fails with DF_E_ARG for bad sizes or dtype, DF_E_OOM, or DF_E_DEVICE when
 * the provider fails. */
DF_API df_status df_cpu_gemm_rate(df_dtype dtype, int threads, int64_t m, int64_t n, int64_t k,
                                  int reps, double *out_gflops);

#ifdef __cplusplus
}
#endif
#endif
