/*
 * CONV2D through oneDNN's direct convolution (k_conv_dnnl.c), tried first by k_conv.c.
 */
#ifndef DF_BACKEND_CPU_K_CONV_DNNL_H
#define DF_BACKEND_CPU_K_CONV_DNNL_H

#include "backend/cpu/cpu_kernels.h"

/* Runs conv2d node n in `compute` (f32 or bf16) with oneDNN's convolution primitive.
 * DF_E_UNSUPPORTED, with the output untouched, where it has no fast kernel for the shape or
 * dtypes (the caller then uses im2col + GEMM); other errors are real failures. */
df_status df_conv2d_dnnl(const df_node *n, df_kernel_env *env, df_dtype compute);

#endif
