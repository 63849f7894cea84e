/*
 * Weights: binding, precision, int8 form, and acquire / release by name prefix (weight.h).
 *
 * The record (df_weight) hangs off the storage and is made when a storage first needs
 * one, so activations never carry it. Release runs in stream order behind the work already
 * asked for: pending graphs are flushed first, then the device drops the forms it derived
 * and residency.c gives the device copy back; the file's pages go last, in a stream
 * callback, once every kernel queued before the release has read them. Acquire asks the
 * kernel to read the pages ahead (madvise is advice: a failure changes nothing) and
 * uploads device copies on the copy stream, so both overlap the work still running.
 */
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/int8_tiles.h"
#include "core/status.h"
#include "runtime/runtime.h"
#include "runtime/weight.h"

df_status df_weight_of(df_storage *st, df_weight **out)
{
    *out = NULL;
    if (!st->weight)
        st->weight = df_calloc(1, sizeof *st->weight);
    if (!st->weight)
        return df_errorf(DF_E_OOM, "out of memory");
    *out = st->weight;
    return DF_OK;
}

df_status df_weight_bind(df_ctx *ctx, df_tensor *t, const void *data, size_t bytes, size_t read,
                         size_t resident_bytes)
{
    df_weight *w;
    DF_TRY(df_weight_of(t->v.st, &w));
    /* Wrapped tensors point into the file mapping df_weights_open made: their pages can be
     * dropped and read again (offloading, and after a backend packed its own copy). */
    w->file_backed = t->v.st->host != NULL;
    w->pages = data;
    w->page_bytes = bytes;
    w->resident = true;
    w->resident_bytes = resident_bytes;
    df_stats_add_weights(ctx, (int64_t)read, (int64_t)resident_bytes);
    return DF_OK;
}

void df_weight_unbind(df_ctx *ctx, const df_tensor *t)
{
    df_weight *w = t->v.st->weight;
    if (w && w->resident) {
        w->resident = false;
        df_stats_add_weights(ctx, 0, -(int64_t)w->page_bytes);
    }
}

df_status df_weight_keep_precision(df_tensor *t, bool keep)
{
    df_weight *w;
    DF_TRY(df_weight_of(t->v.st, &w));
    w->keep_precision = keep;
    return DF_OK;
}

df_status df_weight_attach_scales(df_tensor *t, const df_tensor *scale, bool tiled)
{
    df_weight *w;
    DF_TRY(df_weight_of(t->v.st, &w));
    df_storage_retain(scale->v.st);
    df_storage_release(w->i8_scale);
    w->i8_scale = scale->v.st;
    w->i8_scale_offset = (uint64_t)scale->v.offset * sizeof(float);
    w->i8_groups = scale->v.shape[1];
    /* in the kernels' tiles: the product reads them where they are */
    w->block_type = tiled ? DF_QBLOCK_I8_TILES : 0;
    return DF_OK;
}

/* ---- acquire and release by prefix ------------------------------------------------------ */

static bool matches(const df_weight_ref *r, const char *prefix)
{
    return !prefix || strncmp(r->name, prefix, strlen(prefix)) == 0;
}

/* The weight records of a bound list: df_weight_bind made one for each. */
static df_weight *record(const df_weight_ref *r)
{
    return r->t->v.st->weight;
}

/* The file-backed weights a release names, whose pages go once the stream gets there. The
 * list's owner keeps the storages alive until then (it syncs before it frees them). */
typedef struct release_job {
    int n;
    df_storage *st[];
} release_job;

static void release_pages(void *arg, df_status s)
{
    (void)s;
    release_job *j = arg;
    for (int i = 0; i < j->n; i++)
        if (df_storage_host_ptr(j->st[i]))
            df_pages_advise(j->st[i]->weight->pages, j->st[i]->weight->page_bytes,
                            MADV_DONTNEED);
    df_free(j);
}

df_status df_weight_release(df_ctx *ctx, const df_weight_ref *w, int n, const char *prefix)
{
    int n_file = 0;
    for (int i = 0; i < n; i++)
        n_file += matches(&w[i], prefix) && record(&w[i])->file_backed;
    release_job *j = df_malloc(sizeof *j + (size_t)n_file * sizeof j->st[0]);
    if (!j)
        return df_errorf(DF_E_OOM, "out of memory releasing weights");
    j->n = 0;
    /* After every kernel already asked for: flush pending graphs, then, in stream order,
     * drop the forms the device derived (packed, converted) and the file's pages. */
    df_status s = ctx->exec->flush(ctx);
    for (int i = 0; s == DF_OK && i < n; i++) {
        if (!matches(&w[i], prefix))
            continue;
        df_storage *st = w[i].t->v.st;
        if (st->buf)
            s = df_dev_drop_cache(ctx->dev, ctx->stream, st->buf);
        if (s == DF_OK) {
            df_residency_note_release(ctx, st->weight, prefix != NULL);
            s = df_residency_evict(ctx, st); /* a device copy of the file's bytes */
        }
        if (st->weight->file_backed)
            j->st[j->n++] = st;
    }
    if (s == DF_OK)
        s = df_dev_callback(ctx->dev, ctx->stream, release_pages, j);
    if (s != DF_OK) {
        df_free(j);
        return s;
    }
    for (int i = 0; i < n; i++) {
        df_weight *r = record(&w[i]);
        if (r->resident && matches(&w[i], prefix)) {
            r->resident = false;
            df_stats_add_weights(ctx, 0, -(int64_t)r->resident_bytes);
        }
    }
    return DF_OK;
}

void df_weight_acquire(df_ctx *ctx, const df_weight_ref *w, int n, const char *prefix)
{
    for (int i = 0; i < n; i++) {
        if (!matches(&w[i], prefix))
            continue;
        df_storage *st = w[i].t->v.st;
        df_weight *r = st->weight;
        if (r->file_backed)
            df_pages_advise(r->pages, r->page_bytes, MADV_WILLNEED); /* read ahead meanwhile */
        df_residency_note_acquire(ctx, r, prefix != NULL);
        df_status s = df_residency_restore(ctx, st); /* on the copy stream */
        if (s != DF_OK)
            df_ctx_fail(ctx, s);
        if (!r->resident) {
            r->resident = true;
            df_stats_add_weights(ctx, (int64_t)r->page_bytes, (int64_t)r->resident_bytes);
        }
    }
}

int64_t df_weight_resident_bytes(const df_weight_ref *w, int n)
{
    int64_t bytes = 0;
    for (int i = 0; i < n; i++)
        bytes += record(&w[i])->resident ? (int64_t)record(&w[i])->resident_bytes : 0;
    return bytes;
}
