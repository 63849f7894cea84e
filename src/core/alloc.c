/*
 * Heap allocation with failure injection.
 *
 * The counters are atomics: the stream worker frees tensor storage while the host thread
 * allocates. Failure injection counts every allocation on every thread.
 */
#include "core/alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static _Atomic int64_t fail_countdown; /* 0 = off */
static _Atomic int64_t live;

static bool should_fail(void)
{
    int64_t c = atomic_load(&fail_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1))
            return c == 1;
    }
    return false;
}

void df_alloc_fail_at(int64_t nth)
{
    atomic_store(&fail_countdown, nth > 0 ? nth : 0);
}

int64_t df_alloc_live(void)
{
    return atomic_load(&live);
}

void *df_malloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = malloc(n ? n : 1);
    if (p)
        atomic_fetch_add(&live, 1);
    return p;
}

void *df_calloc(size_t count, size_t size)
{
    if (should_fail())
        return NULL;
    void *p = calloc(count ? count : 1, size ? size : 1);
    if (p)
        atomic_fetch_add(&live, 1);
    return p;
}

void *df_realloc(void *p, size_t n)
{
    if (!p)
        return df_malloc(n);
    if (should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

void df_free(void *p)
{
    if (!p)
        return;
    atomic_fetch_sub(&live, 1);
    free(p);
}

char *df_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = df_malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

void *df_aligned_alloc(size_t n)
{
    if (should_fail())
        return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64) != 0)
        return NULL;
    atomic_fetch_add(&live, 1);
    return p;
}

void df_aligned_free(void *p)
{
    df_free(p);
}

bool df_array_grow(void **data, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return false;
        n *= 2;
    }
    size_t bytes;
    if (!df_size_mul(n, elem, &bytes))
        return false;
    void *p = df_realloc(*data, bytes);
    if (!p)
        return false;
    *data = p;
    *cap = n;
    return true;
}

void df_pages_advise(const void *p, size_t n, int advice)
{
    if (!p || n == 0)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = (uintptr_t)p / page * page;
    uintptr_t end = ((uintptr_t)p + n + page - 1) / page * page;
    madvise((void *)begin, end - begin, advice);
}
