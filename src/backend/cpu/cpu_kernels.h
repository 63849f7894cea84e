/*
 * The CPU backend's kernels, one function per op, and the table that indexes them.
 *
 * Contract for every kernel: the output view is dense row-major and freshly allocated;
 * inputs are views with arbitrary strides unless the op's shape rule (runtime/ops.c)
 * made them dense; activations are f32; weights (the second input of linear and conv2d,
 * the table of gather, norm weights) may be f32, bf16 or f16. A kernel returns DF_OK or a
 * df_status with a message; it never exits. OpenMP parallelism is used inside; the number
 * of threads is env->threads.
 */
#ifndef DF_CPU_KERNELS_H
#define DF_CPU_KERNELS_H

#include "backend/cpu/cpu_device.h"

extern const df_kernel_fn df_cpu_kernels[DF_OP_COUNT];

#define DF_CPU_KERNEL(name) df_status df_cpu_##name(const df_node *n, df_kernel_env *env)

/* k_elementwise.c */
DF_CPU_KERNEL(copy);
DF_CPU_KERNEL(fill);
DF_CPU_KERNEL(binary); /* add, sub, mul, div */
DF_CPU_KERNEL(unary);  /* the ops with a row function below */

/* The row function of a unary pointwise op: o[i] = f(x[i]) for n elements (alpha and beta
 * are SCALE's). Indexed by df_op, NULL for the others. The unary kernel and the fused
 * kernel run the same functions, so a fused program gives the standalone kernels' bits. */
typedef void (*df_cpu_unary_fn)(float *restrict o, const float *restrict x, int64_t n,
                                float alpha, float beta);
extern const df_cpu_unary_fn df_cpu_unary_fns[DF_OP_COUNT];
/* k_norm.c */
DF_CPU_KERNEL(softmax);
DF_CPU_KERNEL(layer_norm);
DF_CPU_KERNEL(rms_norm);
DF_CPU_KERNEL(group_norm);
/* k_position.c */
DF_CPU_KERNEL(timestep_embed);
DF_CPU_KERNEL(rope_table);
DF_CPU_KERNEL(rope);
DF_CPU_KERNEL(rms_norm_rope);
/* k_data.c */
DF_CPU_KERNEL(upsample2x);
DF_CPU_KERNEL(concat);
DF_CPU_KERNEL(gather);
DF_CPU_KERNEL(token_rows);
/* k_matmul.c, k_attention.c, k_conv.c */
DF_CPU_KERNEL(linear);
DF_CPU_KERNEL(matmul);
DF_CPU_KERNEL(attention);
DF_CPU_KERNEL(conv2d);

/* k_fused.c: the defer-and-fuse mode's fused elementwise kernel. */
df_status df_cpu_fused(const df_fused *f, df_kernel_env *env);

/* Reads element i of a dense f32/bf16/f16 array as f32 (for weights of any float dtype). */
static inline float df_load_f32(const void *p, df_dtype t, int64_t i)
{
    switch (t) {
    case DF_DTYPE_BF16: return df_bf16_to_f32(((const uint16_t *)p)[i]);
    case DF_DTYPE_F16:  return df_f16_to_f32(((const uint16_t *)p)[i]);
    case DF_DTYPE_F64:  return (float)((const double *)p)[i];
    default:            return ((const float *)p)[i];
    }
}

#endif
