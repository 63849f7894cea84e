/*
 * Residency of weights on a device that cannot read host memory in place.
 *
 * A weight's host form is the mapped file (df_storage.host); its device form is a buffer
 * from the caching allocator that the weight was uploaded into. Offload (weight.c:
 * df_weight_release / df_weight_acquire, which the models call by name prefix, say when)
 * evicts and restores the device form here:
 * evicting hands the buffer back to the allocator once the compute stream has passed its
 * last use; restoring uploads the host form again on the context's copy stream, and the
 * compute stream waits for that upload only when a kernel that reads the weight is
 * launched, so the upload of the next block overlaps the kernels of this one. On a device
 * that reads host memory in place (the CPU) a weight's buffer wraps the mapping: there is
 * nothing to evict or restore, and none of this runs.
 *
 * The offload hint (df_weight.transient, DF_VIEW_STREAMED) is decided here too, on every
 * device: a weight that comes and goes once per pass (sequential offload's blocks) is used
 * in place, because a packed form would be dropped again at its release; a model that
 * stays resident across steps (no offload, model offload) keeps its packed forms.
 */
#include "core/alloc.h"
#include "core/status.h"
#include "runtime/runtime.h"
#include "runtime/weight.h"

static bool device_form(const df_storage *st)
{
    return st->host && !st->owns_buf && !st->external;
}

static df_status copy_stream(df_ctx *ctx)
{
    if (ctx->copy_stream)
        return DF_OK;
    return df_dev_stream_create(ctx->dev, DF_STREAM_COPY, &ctx->copy_stream);
}

df_status df_residency_restore(df_ctx *ctx, df_storage *st)
{
    if (!device_form(st) || st->buf)
        return DF_OK;
    df_weight *w;
    DF_TRY(df_weight_of(st, &w));
    DF_TRY(copy_stream(ctx));
    /* Memory of what was evicted last returns to the allocator once the compute stream
     * has passed it: wait for that before taking memory for more, so that sequential
     * offload holds about two blocks (the one running, the one uploading), not every
     * block the host has queued ahead. */
    if (ctx->evicted_at) {
        df_dev_reached(ctx->dev, ctx->stream, ctx->evicted_at, true);
        ctx->evicted_at = 0;
    }
    DF_TRY(df_storage_materialize(st));
    DF_TRY(df_dev_copy_h2d(ctx->dev, ctx->copy_stream, st->buf, st->offset, st->host,
                           st->bytes));
    atomic_fetch_add(&ctx->dev->bytes_uploaded, (int64_t)st->bytes);
    w->ready_at = df_dev_record(ctx->dev, ctx->copy_stream);
    return DF_OK;
}

typedef struct evicted {
    df_device *dev;
    df_dev_buffer *buf;
    size_t bytes;
} evicted;

static void give_back(void *arg, df_status s)
{
    (void)s;
    evicted *e = arg;
    df_buffer_release(e->dev, e->buf, e->bytes);
    df_free(e);
}

df_status df_residency_evict(df_ctx *ctx, df_storage *st)
{
    if (!device_form(st) || !st->buf)
        return DF_OK;
    /* An upload never waited for (restored, then dropped unused) must end first. */
    uint64_t ready_at = st->weight ? st->weight->ready_at : 0;
    if (ready_at > ctx->copy_waited) {
        DF_TRY(df_dev_wait(ctx->dev, ctx->stream, ctx->copy_stream, ready_at));
        ctx->copy_waited = ready_at;
    }
    evicted *e = df_malloc(sizeof *e);
    if (!e)
        return df_errorf(DF_E_OOM, "out of memory offloading a weight");
    *e = (evicted){.dev = ctx->dev, .buf = st->buf, .bytes = st->bytes};
    df_status s = df_dev_callback(ctx->dev, ctx->stream, give_back, e);
    if (s != DF_OK) {
        df_free(e);
        return s;
    }
    st->buf = NULL;
    if (st->weight)
        st->weight->ready_at = 0;
    ctx->evicted_at = df_dev_record(ctx->dev, ctx->stream);
    return DF_OK;
}

static df_status ready_one(df_ctx *ctx, df_storage *st)
{
    if (!st->buf)
        DF_TRY(df_residency_restore(ctx, st)); /* used without being acquired: upload now */
    uint64_t ready_at = st->weight ? st->weight->ready_at : 0;
    if (ready_at > ctx->copy_waited) {
        DF_TRY(df_dev_wait(ctx->dev, ctx->stream, ctx->copy_stream, ready_at));
        ctx->copy_waited = ready_at;
    }
    return DF_OK;
}

df_status df_residency_ready(df_ctx *ctx, df_storage *st)
{
    if (!st || !device_form(st))
        return DF_OK;
    DF_TRY(ready_one(ctx, st));
    df_storage *scale = st->weight ? st->weight->i8_scale : NULL;
    return scale && device_form(scale) ? ready_one(ctx, scale) : DF_OK;
}

void df_residency_note_acquire(df_ctx *ctx, df_weight *w, bool part)
{
    w->resident_since = ctx->stats.steps + 1;
    if (!part)
        w->transient = false; /* the whole model, resident until it is released whole */
}

void df_residency_note_release(df_ctx *ctx, df_weight *w, bool part)
{
    if (w->resident_since == 0) /* never acquired: it will be, once per pass */
        w->transient = true;
    else if (part)
        w->transient = w->resident_since == ctx->stats.steps + 1; /* within one step */
    w->resident_since = 0;
}
