/*
 * The CPU backend's one GEMM interface.
 *
 * Every matrix product of the CPU kernels (linear, matmul, the blocks of attention, conv2d)
 * goes through this header, so the provider can be swapped here alone. The provider today
 * is oneDNN's matmul primitive.
 *
 *     C[b] = A[b] B[b] (+ bias) (+ C[b] when accumulating)
 *
 * A is [m, k] row-major; B is [k, n] row-major or the transpose of an [n, k] row-major
 * matrix; C is [m, n] f32 with any row stride. A and B share one input dtype, f32 or bf16
 * (bf16 products accumulate in f32). A batch walks A, B and C by fixed element strides;
 * a B stride of 0 shares one B across the batch.
 *
 * A plan is the provider's compiled kernel for one description (sizes, dtype, layout,
 * strides, bias, accumulation, thread count); plans are cached per calling thread, so
 * creation is paid once per shape. Plans are made on a stream thread (they use the
 * OpenMP thread count set there); a `serial` plan runs wholly on the thread that runs it
 * and may be run from inside an OpenMP parallel region, by any thread.
 *
 * Weights: df_gemm_linear packs a weight (a storage with is_weight) once into the
 * provider's preferred blocked layout for the compute dtype and keeps it on the storage as
 * a derived form, keyed by that layout; df_gemm_operand keeps a plain converted copy (e.g.
 * a bf16 weight as f32) the same way. Nothing is cached for other storages.
 */
#ifndef DF_BACKEND_CPU_GEMM_H
#define DF_BACKEND_CPU_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/cpu.h>

#include "backend/cpu/cpu_device.h"

typedef struct df_gemm_desc {
    int64_t batch;                        /* 0 or 1: a single product */
    int64_t m, n, k;                      /* C is [m, n]; k is the inner dimension */
    df_dtype type;                        /* A and B: DF_DTYPE_F32 or DF_DTYPE_BF16 */
    bool b_trans;                         /* B is given as [n, k] row-major */
    int64_t lda, ldb, ldc;                /* row strides in elements; 0 = dense */
    int64_t stride_a, stride_b, stride_c; /* batch strides; 0 = dense (B: 0 = shared) */
    bool bias;                            /* adds bias [n] (f32) to every row */
    bool accumulate;                      /* C += A B instead of C = A B */
    bool serial;                          /* runs on the calling thread alone */
    int act;                              /* DF_GEMM_ACT_*: applied to C as a post-op */
    bool c_bf16;                          /* C is bf16, rounded to nearest even (not with
                                             accumulate); else f32 */
    /* Epilogue (defer-and-fuse): C = r + g * (A B + bias), with g one f32 row of n
     * broadcast over the rows and r f32 rows of n, ldr apart; not with act, accumulate or
     * a batch. */
    bool gated_residual;
    int64_t ldr;
} df_gemm_desc;

/* Activations a product can apply to its result on the way out (epilogue fusion). */
enum {
    DF_GEMM_ACT_NONE = DF_ACT_NONE,
    DF_GEMM_ACT_GELU_TANH = DF_ACT_GELU_TANH,
    DF_GEMM_ACT_SILU = DF_ACT_SILU,
    DF_GEMM_ACT_GELU = DF_ACT_GELU,
};

typedef struct df_gemm_plan df_gemm_plan;

/* The cached plan for `d`, made on first use. The plan stays valid until this thread has
 * fetched DF_GEMM_PLAN_CACHE other plans; it is freed when the thread exits. */
#define DF_GEMM_PLAN_CACHE 64
df_status df_gemm_plan_get(const df_gemm_desc *d, const df_gemm_plan **out);

/* Bytes of scratch a serial plan needs each time it runs (0 for other plans, whose
 * provider keeps its own). */
size_t df_gemm_plan_scratch(const df_gemm_plan *p);

/* Runs a plan on the given pointers (bias NULL when the plan has none; scratch 64-byte
 * aligned, df_gemm_plan_scratch(p) bytes, or NULL when that is 0). Serial plans may run
 * on several threads at once, each with its own scratch. */
df_status df_gemm_plan_run(const df_gemm_plan *p, const void *a, const void *b, const float *bias,
                           void *c, void *scratch);
/* The same with the epilogue's gate row and residual rows (plans with gated_residual). */
df_status df_gemm_plan_run_gated(const df_gemm_plan *p, const void *a, const void *b,
                                 const float *bias, void *c, const float *gate,
                                 const float *residual);

/* df_gemm_plan_get and df_gemm_plan_run in one call, for plans that are not serial. */
df_status df_gemm(const df_gemm_desc *d, const void *a, const void *b, const float *bias, void *c);

/* A linear layer: out [m, n] = x [m, k] w^T (+ bias), with x dense [.., k] (any float
 * dtype), w a dense [n, k] view (f32, bf16 or f16), bias NULL or a dense [n] view, and the
 * product in `compute` (DF_DTYPE_F32 or DF_DTYPE_BF16). out is `out_type` (f32, or bf16
 * rounded to nearest even), its rows ldc elements apart (0: n, dense). A weight storage is
 * packed once and reused; activations are converted to the compute dtype per call in env's
 * scratch. */
df_status df_gemm_linear(df_kernel_env *env, const df_view *x, int64_t m, const df_view *w,
                         const df_view *bias, df_dtype compute, int act, void *out,
                         int64_t ldc, df_dtype out_type);
/* A linear layer with the gated residual epilogue: out = residual + gate * (x w^T + bias),
 * gate a dense [n] f32 row, residual f32 rows of n, ldr apart (0: n); out f32. */
df_status df_gemm_linear_gated(df_kernel_env *env, const df_view *x, int64_t m,
                               const df_view *w, const df_view *bias, df_dtype compute,
                               float *out, int64_t ldc, const float *gate,
                               const float *residual, int64_t ldr);

/* Operands in a dtype: the elements of dense view v as `type`. Returns v's own memory when
 * it already has that dtype, a conversion cached on v's storage when it is a weight, or a
 * conversion written to `scratch`, which must then hold df_gemm_operand_scratch(v, type)
 * bytes (0 in the first two cases). Conversions use the calling thread's OpenMP team. */
size_t df_gemm_operand_scratch(const df_view *v, df_dtype type);
df_status df_gemm_operand(const df_view *v, df_dtype type, void *scratch, const void **out);

/* The compute dtype to use for a requested one (an op's attribute): DF_DTYPE_BF16 when
 * asked and the provider can compute in bf16 on this CPU, else DF_DTYPE_F32. */
df_dtype df_gemm_compute_dtype(int requested);

/* The rates (GFLOP/s) of oneDNN's f32 and bf16 products on `threads` threads (bf16 0 where
 * oneDNN has none), measured once and cached by CPU, ISA, oneDNN version and threads
 * (matmul_rates.c); `how` says where they come from. DIFFUSE_MATMUL_RATES overrides. */
df_status df_cpu_matmul_rates(int threads, double *f32, double *bf16, char *how, size_t cap);
/* Rates given as text, "f32=470,bf16=961" (either order, bf16 may be 0), by the environment
 * variable `var` (named in the DF_E_ARG message when malformed). */
df_status df_matmul_rates_parse(const char *var, const char *text, double *f32, double *bf16);

/* f32 -> bf16, round to nearest even, vectorised, on the calling thread alone. */
void df_gemm_f32_to_bf16(const float *src, uint16_t *dst, int64_t n);

/* Weight preparations (packings and cached conversions) made so far in this process. */
int64_t df_gemm_pack_count(void);

#endif
