/*
 * libspng's allocator hooks (see spng_alloc.h). Each hook notes a NULL result in a
 * thread-local flag, cleared when a context is made, so a failure can be told apart from a
 * corrupt file afterwards.
 */
#include "io/spng_alloc.h"

#include "core/alloc.h"

static _Thread_local bool alloc_failed;

static void *note_null(void *p)
{
    alloc_failed = alloc_failed || !p;
    return p;
}
static void *spng_malloc(size_t n)
{
    return note_null(df_malloc(n));
}
static void *spng_realloc(void *p, size_t n)
{
    return note_null(df_realloc(p, n));
}
static void *spng_calloc(size_t c, size_t n)
{
    return note_null(df_calloc(c, n));
}

spng_ctx *df_spng_ctx_new(int flags)
{
    struct spng_alloc alloc = {
        .malloc_fn = spng_malloc,
        .realloc_fn = spng_realloc,
        .calloc_fn = spng_calloc,
        .free_fn = df_free,
    };
    alloc_failed = false;
    return spng_ctx_new2(&alloc, flags);
}

bool df_spng_out_of_memory(int err)
{
    return err == SPNG_EMEM || alloc_failed;
}
