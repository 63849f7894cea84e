/*
 * What the CPU offers for matrix products: its bf16 and int8 instructions, and the raw
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
 * products round as the hardware instructions do; bf16 compute works everywhere. Native
 * does not mean faster: --dtype auto measures instead (df_ctx_matmul_rates, df_dtype_auto). */
DF_API bool df_cpu_has_fast_bf16(void);

/* The CPU features of the GEMM provider (oneDNN), as it can use them in this process (its
 * effective ISA: the hardware, what the OS allows, and a cap set with ONEDNN_MAX_CPU_ISA). */
typedef struct df_cpu_features {
    bool avx512;      /* AVX-512 F/BW/VL/DQ (oneDNN's avx512_core) */
    bool avx512_bf16; /* AVX512-BF16 dot products */
    bool amx_bf16;    /* AMX tiles with bf16 products */
} df_cpu_features;

/* The features of the CPU this runs on, read at run time. */
DF_API void df_cpu_features_get(df_cpu_features *out);

/* The kernel int8 compute runs on this CPU: "avx512-vnni", "avx-vnni" or "portable" (chosen
 * from cpuid; DIFFUSE_INT8_PATH forces one the CPU has). */
DF_API const char *df_cpu_int8_kernel(void);

/* Measures the GEMM provider alone: C[m, n] (f32) = A[m, k] B[k, n] with A and B already
 * in `dtype` (DF_DTYPE_F32 or DF_DTYPE_BF16; DF_DTYPE_I8: u8 x s8 -> s32, oneDNN's int8
 * ceiling) and B already in the provider's preferred layout, on `threads` threads (0 = all
 * cores), `reps` timed runs after one warm-up.
 * *out_gflops is the best run's rate. Runs on the calling thread and blocks; it touches
 * no context. Fails with DF_E_ARG for bad sizes or dtype, DF_E_OOM, or DF_E_DEVICE when
 * the provider fails. */
DF_API df_status df_cpu_gemm_rate(df_dtype dtype, int threads, int64_t m, int64_t n, int64_t k,
                                  int reps, double *out_gflops);

#ifdef __cplusplus
}
#endif
#endif
