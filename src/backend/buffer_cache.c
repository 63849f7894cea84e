/*
 * The caching allocator every device uses.
 *
 * Freed blocks are kept in a list per size and handed out again for a request of the same
 * rounded size, so a denoising loop that allocates the same activations every step stops
 * calling the backend after the first step. Sizes round up to 256 bytes below 1 MiB and to
 * 64 KiB above, which keeps the waste under 7% for the tensors of a diffusion model. When
 * the backend refuses memory, the cache is emptied and the request retried once.
 *
 * Exact sizes alone would let the cache grow without bound where the sizes change: a
 * VAE decode that walks up four resolutions leaves every resolution's blocks behind, and
 * the transformer's blocks are still there when the decode starts. So the memory held
 * (live + cached) is kept within the most that was ever live at once, plus a slack: a miss
 * that would pass that bound first gives back the cached blocks released longest ago.
 * The slack grows with that high water (as much again, between 64 MiB and 1 GiB): the
 * host runs ahead of the stream, so a step asks for its blocks before the previous step's
 * are back, and with a fixed 64 MiB a FLUX.1 block pair at 1536 tokens (333 MiB live)
 * evicted and mapped afresh about 590 MB a forward, whose page faults cost about a tenth
 * of its time; 256 MiB stopped that.
 * A loop that allocates the same sizes every step hits the cache and never evicts; one
 * whose distinct sizes add up to more than its peak pays an allocation per miss, which
 * costs far less than the kernels that fill the block.
 * One mutex guards it: the host thread allocates and host callbacks free. A block comes
 * back only when the stream has passed its last use (the callback that drops the last
 * reference runs there), so whatever is in the cache may be handed out at once.
 */
#include <pthread.h>

#include "backend/graph.h"
#include "backend/buffer_cache.h"
#include "core/alloc.h"
#include "core/status.h"

#define SLACK_MIN ((int64_t)64 << 20)
#define SLACK_MAX ((int64_t)1 << 30)

typedef struct block {
    struct block *next;
    df_dev_buffer *buf;
    size_t bytes;
} block;

struct df_buffer_cache {
    pthread_mutex_t mu;
    df_device *dev;
    block *free_list; /* unused blocks, any size */
    block *spare;     /* block records to reuse */
    df_mem_stats stats;
    int64_t high_water; /* the most ever live at once; df_buffer_cache_reset_peak keeps it */
};

static size_t round_size(size_t n)
{
    size_t q = n < (1u << 20) ? 256 : 65536;
    return (n + q - 1) / q * q;
}

df_status df_buffer_cache_create(df_device *dev, df_buffer_cache **out)
{
    *out = NULL;
    df_buffer_cache *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "out of memory creating the allocator of %s", dev->name);
    pthread_mutex_init(&c->mu, NULL);
    c->dev = dev;
    *out = c;
    return DF_OK;
}

static void free_blocks(df_buffer_cache *c, block *b)
{
    for (block *next; b; b = next) {
        next = b->next;
        df_dev_buffer_free(c->dev, b->buf);
        c->stats.cached_bytes -= (int64_t)b->bytes;
        df_free(b);
    }
}

/* Makes room for a fresh block of n bytes: frees the oldest cached blocks (the list's
 * tail: releases push at the head) until live + cached + n is within the bound, or the
 * cache is empty. */
static void evict_for(df_buffer_cache *c, size_t n)
{
    int64_t want = c->stats.live_bytes + (int64_t)n;
    int64_t peak = c->high_water > want ? c->high_water : want;
    int64_t slack = peak < SLACK_MIN ? SLACK_MIN : peak > SLACK_MAX ? SLACK_MAX : peak;
    int64_t bound = peak + slack;
    int64_t excess = want + c->stats.cached_bytes - bound;
    if (excess <= 0)
        return;
    /* keep the newest blocks while the ones after them still cover the excess */
    int64_t after = c->stats.cached_bytes;
    block **p = &c->free_list;
    while (*p && after - (int64_t)(*p)->bytes >= excess) {
        after -= (int64_t)(*p)->bytes;
        p = &(*p)->next;
    }
    block *cut = *p;
    *p = NULL;
    free_blocks(c, cut);
}

static void drop_cached(df_buffer_cache *c)
{
    free_blocks(c, c->free_list);
    c->free_list = NULL;
}

void df_buffer_cache_free(df_buffer_cache *c)
{
    if (!c)
        return;
    drop_cached(c);
    for (block *b = c->spare, *next; b; b = next) {
        next = b->next;
        df_free(b);
    }
    pthread_mutex_destroy(&c->mu);
    df_free(c);
}

df_status df_buffer_cache_alloc(df_buffer_cache *c, size_t bytes, df_dev_buffer **out)
{
    size_t n = round_size(bytes);
    pthread_mutex_lock(&c->mu);
    for (block **p = &c->free_list; *p; p = &(*p)->next) {
        if ((*p)->bytes == n) {
            block *b = *p;
            *p = b->next;
            *out = b->buf;
            b->next = c->spare;
            c->spare = b;
            c->stats.cached_bytes -= (int64_t)n;
            goto got;
        }
    }
    evict_for(c, n);
    df_status s = df_dev_buffer_alloc(c->dev, n, out);
    if (s == DF_E_OOM && c->free_list) {
        drop_cached(c);
        s = df_dev_buffer_alloc(c->dev, n, out);
    }
    if (s != DF_OK) {
        pthread_mutex_unlock(&c->mu);
        return df_errorf(DF_E_OOM,
                         "%s: out of memory allocating %zu bytes (%lld bytes in use, peak %lld)",
                         c->dev->name, n, (long long)c->stats.live_bytes,
                         (long long)c->stats.peak_bytes);
    }
    c->stats.allocated_total += (int64_t)n;
got:
    c->stats.live_bytes += (int64_t)n;
    if (c->stats.live_bytes > c->stats.peak_bytes)
        c->stats.peak_bytes = c->stats.live_bytes;
    if (c->stats.live_bytes > c->high_water)
        c->high_water = c->stats.live_bytes;
    pthread_mutex_unlock(&c->mu);
    return DF_OK;
}

void df_buffer_cache_release(df_buffer_cache *c, df_dev_buffer *buf, size_t bytes)
{
    size_t n = round_size(bytes);
    pthread_mutex_lock(&c->mu);
    c->stats.live_bytes -= (int64_t)n;
    block *b = c->spare;
    if (b)
        c->spare = b->next;
    else
        b = df_malloc(sizeof *b);
    if (!b) { /* no record to keep it in: give it back */
        df_dev_buffer_free(c->dev, buf);
    } else {
        b->buf = buf;
        b->bytes = n;
        b->next = c->free_list;
        c->free_list = b;
        c->stats.cached_bytes += (int64_t)n;
    }
    pthread_mutex_unlock(&c->mu);
}

void df_buffer_cache_stats(df_buffer_cache *c, df_mem_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->stats;
    pthread_mutex_unlock(&c->mu);
}

void df_buffer_cache_reset_peak(df_buffer_cache *c)
{
    pthread_mutex_lock(&c->mu);
    c->stats.peak_bytes = c->stats.live_bytes;
    pthread_mutex_unlock(&c->mu);
}

void df_buffer_cache_trim(df_buffer_cache *c)
{
    pthread_mutex_lock(&c->mu);
    drop_cached(c);
    pthread_mutex_unlock(&c->mu);
}
