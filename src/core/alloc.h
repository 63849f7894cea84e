/*
 * Heap memory, checked size arithmetic and the growth of arrays.
 *
 * All heap memory in diffuse comes from these functions so that tests can make the Nth
 * allocation fail (df_alloc_fail_at) and count what is live (df_alloc_live).
 */
#ifndef DF_CORE_ALLOC_H
#define DF_CORE_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *df_malloc(size_t n);
void *df_calloc(size_t count, size_t size);
void *df_realloc(void *p, size_t n);
void  df_free(void *p);
char *df_strdup(const char *s);
/* 64-byte aligned memory for kernels and tensor storage; free with df_aligned_free. */
void *df_aligned_alloc(size_t n);
void  df_aligned_free(void *p);

/* madvise(advice) over the whole pages that [p, p + n) touches: begin rounded down, end up.
 * Advice only: a failure changes nothing, and NULL or n == 0 asks nothing. The one helper
 * for the weights' file pages (runtime/weight.c) and the CPU device's (cpu_buffer.c). */
void df_pages_advise(const void *p, size_t n, int advice);

/* Testing hooks: the `nth` allocation from now on (1 = the next) fails, and every
 * allocation after it succeeds again. 0 turns failure injection off. */
void    df_alloc_fail_at(int64_t nth);
/* Number of allocations made through these functions that are not yet freed. */
int64_t df_alloc_live(void);

static inline bool df_size_mul(size_t a, size_t b, size_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}
static inline bool df_size_add(size_t a, size_t b, size_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}
static inline bool df_i64_mul(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

/* Makes room for `need` elements of `elem` bytes in *data (capacity *cap, doubled from 16
 * until it is enough, with checked sizes); false when memory ran out (the array is
 * unchanged then). The check that there is room already is inline, as the tokenizers'
 * inner loops call it for every element. */
bool df_array_grow(void **data, size_t *cap, size_t need, size_t elem);
static inline bool df_array_reserve(void **data, size_t *cap, size_t need, size_t elem)
{
    return need <= *cap || df_array_grow(data, cap, need, elem);
}

#endif
