/*
 * What the CPU backend's kernels see of the device layer: its buffers (host memory), the
 * forms of weights it derives and keeps on them, and the scratch and threads of a kernel
 * call. Kernels take the device interface's df_node and df_view (backend/device.h); the
 * sim backend runs these same kernels on CPU buffers it builds over its own memory.
 */
#ifndef DF_CPU_DEVICE_H
#define DF_CPU_DEVICE_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/runtime.h>

#include "backend/device.h"

/* Something the backend keeps beside a buffer: a weight packed for its GEMM, converted to
 * another dtype, and so on. Freed with the buffer, or when its caches are dropped. */
typedef struct df_derived {
    struct df_derived *next;
    int64_t key;            /* kernel-defined (layout, dtype, shape) */
    void *data;
    size_t bytes;
    void (*free)(void *data);
} df_derived;

/* A CPU buffer: 64-byte aligned memory of the backend's, or host memory it wraps. */
struct df_dev_buffer {
    void *ptr;
    uint64_t bytes;
    bool wrapped;           /* ptr is the caller's: never freed here */
    df_derived *derived;    /* touched only by the stream that runs kernels */
};

/* The buffer for host memory [ptr, ptr + bytes) without taking it over (the sim backend
 * builds these over its own memory to run the kernels). */
void df_cpu_buffer_init(struct df_dev_buffer *b, void *ptr, uint64_t bytes);

/* The derived form of b with `key`, or NULL. */
df_derived *df_cpu_find_derived(struct df_dev_buffer *b, int64_t key);
void df_cpu_add_derived(struct df_dev_buffer *b, df_derived *d);
void df_cpu_drop_derived(struct df_dev_buffer *b);
/* Drops the pages of [p, p + n) when the view says they come from a file (a kernel that
 * keeps its own packed copy of a weight need not keep the file's pages as well). */
void df_cpu_drop_pages(const df_view *v, const void *p, size_t n);
/* Asks for the pages of [p, p + n) ahead of their use when the view says they come from a
 * file (a kernel about to read a weight in place). */
void df_cpu_read_ahead(const df_view *v, const void *p, size_t n);

/* Scratch memory and threading for one kernel call. */
typedef struct df_kernel_env {
    int threads;
    /* int8 products, as the device was opened (int8_path=NAME, int8_group=N): a df_i8_path
     * (0, AUTO: DIFFUSE_INT8_PATH, else cpuid dispatch) and the weights' quantization group
     * (-1 the whole k; 0: DIFFUSE_INT8_GROUP, else 128). */
    int int8_path;
    int64_t int8_group;
    void *scratch;
    size_t scratch_bytes;
} df_kernel_env;

typedef df_status (*df_kernel_fn)(const df_node *n, df_kernel_env *env);

/* A 64-byte aligned scratch buffer of at least `bytes`, valid until the kernel returns. */
void *df_env_scratch(df_kernel_env *env, size_t bytes);

static inline void *df_view_ptr(const df_view *v)
{
    return (char *)v->buf->ptr + v->offset;
}
int64_t df_view_numel(const df_view *v);
bool df_view_is_dense(const df_view *v);

/* Runs node n's kernel with env (the CPU stream does this; so does the sim backend's). */
df_status df_cpu_run_node(const df_node *n, df_kernel_env *env);
df_status df_cpu_run_fused(const df_fused *f, df_kernel_env *env);
bool df_cpu_supports(const df_node *n);
/* Nanoseconds a CPU stream's worker has spent waiting for other streams (stream_wait). */
int64_t df_cpu_stream_waited_ns(df_dev_stream *s);

#endif
