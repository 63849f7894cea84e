/*
 * What the CPU's kernels take from their device: a buffer's derived forms (a weight packed
 * for the GEMM or converted, cached on the buffer and dropped with it), the pages of a
 * mapped file a kernel has finished reading, a kernel call's scratch memory, and the
 * element count and density of a view. Kept apart from cpu.c, which runs the kernels, so
 * that the kernels and the GEMM depend on this file and nothing depends back on them.
 */
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/cpu/cpu_device.h"
#include "core/alloc.h"

void df_cpu_buffer_init(df_dev_buffer *b, void *ptr, uint64_t bytes)
{
    *b = (df_dev_buffer){.ptr = ptr, .bytes = bytes, .wrapped = true};
}

df_derived *df_cpu_find_derived(df_dev_buffer *b, int64_t key)
{
    for (df_derived *d = b->derived; d; d = d->next)
        if (d->key == key)
            return d;
    return NULL;
}

void df_cpu_add_derived(df_dev_buffer *b, df_derived *d)
{
    d->next = b->derived;
    b->derived = d;
}

void df_cpu_drop_derived(df_dev_buffer *b)
{
    for (df_derived *d = b->derived, *next; d; d = next) {
        next = d->next;
        if (d->free)
            d->free(d->data);
        df_free(d);
    }
    b->derived = NULL;
}

/* madvise over the whole pages of [p, p + n) of a file mapping (advice: failure changes
 * nothing). */
static void advise_file_pages(const df_view *v, const void *p, size_t n, int advice)
{
    if (v->flags & DF_VIEW_FILE_PAGES)
        df_pages_advise(p, n, advice);
}

void df_cpu_drop_pages(const df_view *v, const void *p, size_t n)
{
    advise_file_pages(v, p, n, MADV_DONTNEED);
}

void df_cpu_read_ahead(const df_view *v, const void *p, size_t n)
{
    advise_file_pages(v, p, n, MADV_WILLNEED);
}

void *df_env_scratch(df_kernel_env *env, size_t bytes)
{
    if (bytes <= env->scratch_bytes)
        return env->scratch;
    df_aligned_free(env->scratch);
    env->scratch = df_aligned_alloc(bytes);
    env->scratch_bytes = env->scratch ? bytes : 0;
    return env->scratch;
}

int64_t df_view_numel(const df_view *v)
{
    return df_shape_numel(v->ndim, v->shape);
}

bool df_view_is_dense(const df_view *v)
{
    return df_shape_is_dense(v->ndim, v->shape, v->stride);
}
