/*
 * Tensor handles and views.
 *
 * A handle is a view (dtype, shape, strides in elements, offset) over a reference-counted
 * storage. View functions (reshape, permute, slice, expand, ...) make a new handle over the
 * same storage and move no data; only a reshape of a non-contiguous tensor copies first.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "runtime/runtime.h"
#include "runtime/weight.h"

static void dense_strides(df_gview *v)
{
    int64_t s = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        v->stride[d] = s;
        s *= v->shape[d];
    }
}

df_tensor *df_handle_new(df_ctx *ctx, const df_gview *v)
{
    df_tensor *t = df_malloc(sizeof *t);
    if (t && ctx->n_live == ctx->cap_live) {
        int64_t cap = ctx->cap_live ? ctx->cap_live * 2 : 1024;
        df_tensor **live = df_realloc(ctx->live, (size_t)cap * sizeof *live);
        if (!live) {
            df_free(t);
            t = NULL;
        } else {
            ctx->live = live;
            ctx->cap_live = cap;
        }
    }
    if (!t) {
        df_storage_release(v->st);
        return df_ctx_fail(ctx, df_errorf(DF_E_OOM, "out of memory for a tensor handle"));
    }
    t->v = *v;
    t->ctx = ctx;
    t->slot = ctx->n_live;
    ctx->live[ctx->n_live++] = t;
    v->st->handles++;
    return t;
}

void df_tensor_free(df_tensor *t)
{
    if (!t)
        return;
    df_ctx *ctx = t->ctx;
    if (t->slot >= 0 && t->slot < ctx->n_live && ctx->live[t->slot] == t)
        ctx->live[t->slot] = NULL;
    df_storage *st = t->v.st;
    st->handles--;
    if (ctx->exec && ctx->exec->handle_released)
        ctx->exec->handle_released(ctx, st);
    df_storage_release(st);
    df_free(t);
}

df_tensor *df_tensor_persist(df_tensor *t)
{
    if (t && t->slot >= 0) {
        t->ctx->live[t->slot] = NULL;
        t->slot = -1;
    }
    if (t)
        t->v.st->is_weight = true; /* long-lived: kernels may keep packed forms of it */
    return t;
}

static bool check_shape(df_ctx *ctx, const char *what, const int64_t *shape, int ndim,
                        size_t elem, size_t *bytes)
{
    if (ndim < 0 || ndim > DF_MAX_DIMS) {
        df_ctx_fail(ctx, df_errorf(DF_E_SHAPE, "%s: %d dimensions (at most %d)", what, ndim,
                                   DF_MAX_DIMS));
        return false;
    }
    size_t n = elem;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || !df_size_mul(n, (size_t)shape[d], &n)) {
            df_ctx_fail(ctx, df_errorf(DF_E_SHAPE, "%s: bad size %lld in dimension %d", what,
                                       (long long)shape[d], d));
            return false;
        }
    }
    *bytes = n;
    return true;
}

static df_tensor *new_dense(df_ctx *ctx, const char *what, df_dtype dtype, const int64_t *shape,
                            int ndim, const void *external)
{
    if (ctx->status != DF_OK)
        return NULL;
    size_t es = df_dtype_size(dtype), bytes;
    if (es == 0)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "%s: invalid dtype %d", what, (int)dtype));
    if (!check_shape(ctx, what, shape, ndim, es, &bytes))
        return NULL;
    df_gview v = {.dtype = dtype, .ndim = ndim};
    memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
    dense_strides(&v);
    if (external) {
        df_status s = df_storage_host(ctx->dev, (void *)external, bytes, &v.st);
        if (s != DF_OK)
            return df_ctx_fail(ctx, df_error_context(s, "%s", what));
        v.st->is_weight = true;
    } else {
        df_status s = df_storage_alloc(ctx->dev, bytes, &v.st);
        if (s != DF_OK)
            return df_ctx_fail(ctx, df_error_context(s, "%s", what));
    }
    return df_handle_new(ctx, &v);
}

df_tensor *df_tensor_from_host(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                               const void *data)
{
    if (!data && ctx->status == DF_OK)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "tensor_from_host: NULL data"));
    df_tensor *t = data ? new_dense(ctx, "tensor_from_host", dtype, shape, ndim, NULL) : NULL;
    if (!t)
        return NULL;
    df_status s = df_upload(ctx, t->v.st, data);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s);
    return t;
}

static void free_staging(void *arg, df_status s)
{
    (void)s;
    df_free(arg);
}

df_status df_upload(df_ctx *ctx, df_storage *st, const void *data)
{
    size_t bytes = st->bytes;
    if (bytes == 0)
        return DF_OK;
    /* A fresh allocation: no queued kernel can still use this memory (storages return to
     * the allocator only after their last kernel ran), so where the host can address it
     * the copy happens now. */
    void *p = df_storage_host_ptr(st);
    if (p) {
        memcpy(p, data, bytes);
        return DF_OK;
    }
    /* Else a copy in stream order, from a staging copy of the caller's data (which may
     * change as soon as this returns), freed once the stream has passed the copy. */
    void *staging = df_malloc(bytes);
    if (!staging)
        return df_errorf(DF_E_OOM, "upload: out of memory staging %zu bytes", bytes);
    memcpy(staging, data, bytes);
    df_status s = df_dev_copy_h2d(ctx->dev, ctx->stream, st->buf, st->offset, staging, bytes);
    if (s == DF_OK)
        s = df_dev_callback(ctx->dev, ctx->stream, free_staging, staging);
    if (s != DF_OK) {
        df_dev_sync(ctx->dev, ctx->stream);
        df_free(staging);
        return s;
    }
    atomic_fetch_add(&ctx->dev->bytes_uploaded, (int64_t)bytes);
    return DF_OK;
}

df_tensor *df_tensor_wrap(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim,
                          const void *data)
{
    if (!data)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "tensor_wrap: NULL data"));
    return new_dense(ctx, "tensor_wrap", dtype, shape, ndim, data);
}

df_tensor *df_tensor_wrap_blocks(df_ctx *ctx, int64_t rows, int64_t k, const void *data,
                                 size_t bytes, uint32_t block_type, float block_scale)
{
    if (ctx->status != DF_OK)
        return NULL;
    if (!data || rows < 0 || k < 1 || block_type == 0)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "tensor_wrap_blocks: invalid arguments"));
    df_gview v = {.dtype = DF_DTYPE_I8, .ndim = 2, .shape = {rows, k}};
    dense_strides(&v);
    df_status s = df_storage_host(ctx->dev, (void *)data, bytes, &v.st);
    if (s != DF_OK)
        return df_ctx_fail(ctx, df_error_context(s, "tensor_wrap_blocks"));
    v.st->is_weight = true;
    df_weight *w;
    s = df_weight_of(v.st, &w);
    if (s != DF_OK) {
        df_storage_release(v.st);
        return df_ctx_fail(ctx, df_error_context(s, "tensor_wrap_blocks"));
    }
    w->block_type = block_type;
    w->block_scale = block_scale;
    return df_handle_new(ctx, &v);
}

df_tensor *df_full(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim, double value)
{
    if (ctx->status != DF_OK)
        return NULL;
    size_t bytes;
    if (!check_shape(ctx, "full", shape, ndim, 1, &bytes))
        return NULL;
    df_gnode *n = df_calloc(1, sizeof *n);
    if (!n)
        return df_ctx_fail(ctx, df_errorf(DF_E_OOM, "full: out of memory"));
    n->op = DF_OP_FILL;
    n->out.dtype = dtype;
    n->out.ndim = ndim;
    memcpy(n->out.shape, shape, (size_t)ndim * sizeof *shape);
    n->a.value = value;
    return df_emit(ctx, n);
}

df_tensor *df_zeros(df_ctx *ctx, df_dtype dtype, const int64_t *shape, int ndim)
{
    return df_full(ctx, dtype, shape, ndim, 0.0);
}

/* Reads wait on the producing launch only, not on work queued after it, where its position
 * is known: strict eager (every op launched as it is made, eager.c records the position
 * after the op and its release), not a weight (residency.c orders those), no earlier
 * failure. Anything else waits for the whole stream (df_sync). */
static bool written_at_known(const df_ctx *ctx, const df_storage *st)
{
    return ctx->exec == &df_exec_eager && ctx->status == DF_OK && st && st->buf &&
           st->written_at != 0 && !st->is_weight && !st->host;
}

/* Waits until the stream has passed st's producer; a failure there (or before it) is
 * reported as df_sync reports it. */
static df_status wait_written(df_ctx *ctx, df_storage *st)
{
    df_dev_reached(ctx->dev, ctx->stream, st->written_at, true);
    return atomic_load(&st->write_failed) ? df_sync(ctx) : DF_OK;
}

/* df_download once the producer is done: memory the host addresses is read in place; else
 * the copy goes on the copy stream, so it does not queue behind later compute work. */
static df_status download_early(df_ctx *ctx, const df_gview *v, void *dst, size_t bytes)
{
    if (df_storage_host_ptr(v->st))
        return df_download(ctx, v, dst, bytes);
    if (!ctx->copy_stream)
        DF_TRY(df_dev_stream_create(ctx->dev, DF_STREAM_COPY, &ctx->copy_stream));
    uint64_t off = v->st->offset + (uint64_t)v->offset * df_dtype_size(v->dtype);
    /* the device's own ordering too (a cross-queue wait: memory visibility on a GPU) */
    DF_TRY(df_dev_wait(ctx->dev, ctx->copy_stream, ctx->stream, v->st->written_at));
    DF_TRY(df_dev_copy_d2h(ctx->dev, ctx->copy_stream, dst, v->st->buf, off, bytes));
    atomic_fetch_add(&ctx->dev->bytes_downloaded, (int64_t)bytes);
    return df_dev_sync(ctx->dev, ctx->copy_stream);
}

df_status df_tensor_read(df_ctx *ctx, df_tensor *t, df_dtype as, void *dst, size_t dst_bytes)
{
    if (!t)
        return ctx->status != DF_OK ? df_ctx_raise(ctx)
                                    : df_errorf(DF_E_ARG, "tensor_read: NULL tensor");
    int64_t numel = df_tensor_numel(t);
    size_t need;
    if (!df_size_mul((size_t)numel, df_dtype_size(as), &need) || dst_bytes < need || !dst)
        return df_errorf(DF_E_ARG, "tensor_read: %lld elements of %s need %zu bytes, got %zu",
                         (long long)numel, df_dtype_name(as), need, dst_bytes);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *src = t;
    if (!df_gview_is_dense(&t->v))
        src = df_contiguous(ctx, t);
    ctx->reading = src;
    bool early = src && written_at_known(ctx, src->v.st);
    df_status s = early ? wait_written(ctx, src->v.st) : df_sync(ctx);
    ctx->reading = NULL;
    if (s == DF_OK)
        s = df_residency_ready(ctx, src->v.st); /* host data not uploaded yet */
    if (s == DF_OK && ctx->copy_stream)
        s = df_dev_sync(ctx->dev, ctx->copy_stream);
    if (s == DF_OK && !src->v.st->buf)
        s = df_errorf(DF_E_STATE, "tensor_read: the tensor was never computed (the op that "
                      "made it failed)");
    if (s == DF_OK) {
        size_t bytes = (size_t)numel * df_dtype_size(src->v.dtype);
        if (as == src->v.dtype) {
            s = early ? download_early(ctx, &src->v, dst, bytes)
                      : df_download(ctx, &src->v, dst, bytes);
        } else {
            void *tmp = df_malloc(bytes);
            if (!tmp) {
                s = df_errorf(DF_E_OOM, "tensor_read: out of memory");
            } else {
                s = early ? download_early(ctx, &src->v, tmp, bytes)
                          : df_download(ctx, &src->v, tmp, bytes);
                if (s == DF_OK)
                    s = df_convert(tmp, src->v.dtype, dst, as, numel);
                df_free(tmp);
            }
        }
    }
    df_scope_end(ctx, mark, NULL);
    return s;
}

df_status df_download(df_ctx *ctx, const df_gview *v, void *dst, size_t bytes)
{
    uint64_t off = v->st->offset + (uint64_t)v->offset * df_dtype_size(v->dtype);
    void *p = df_storage_host_ptr(v->st);
    if (p) {
        memcpy(dst, (char *)p + (off - v->st->offset), bytes);
        return DF_OK;
    }
    DF_TRY(df_dev_copy_d2h(ctx->dev, ctx->stream, dst, v->st->buf, off, bytes));
    atomic_fetch_add(&ctx->dev->bytes_downloaded, (int64_t)bytes);
    return df_dev_sync(ctx->dev, ctx->stream);
}

/* The accessors accept NULL (the result of a failed op) so that model code can carry on
 * to its next status check: a NULL tensor has no dimensions and no elements. */
df_dtype df_tensor_dtype(const df_tensor *t)
{
    return t ? t->v.dtype : DF_DTYPE_F32;
}

int df_tensor_ndim(const df_tensor *t)
{
    return t ? t->v.ndim : 0;
}

int64_t df_tensor_dim(const df_tensor *t, int d)
{
    if (!t)
        return 0;
    if (d < 0)
        d += t->v.ndim;
    return d >= 0 && d < t->v.ndim ? t->v.shape[d] : 0;
}

const int64_t *df_tensor_shape(const df_tensor *t)
{
    static const int64_t none[DF_MAX_DIMS];
    return t ? t->v.shape : none;
}

int64_t df_tensor_numel(const df_tensor *t)
{
    return t ? df_gview_numel(&t->v) : 0;
}

bool df_tensor_is_contiguous(const df_tensor *t)
{
    return t && df_gview_is_dense(&t->v);
}

const char *df_tensor_describe(const df_tensor *t, char *buf, size_t cap)
{
    if (!t) {
        snprintf(buf, cap, "(null)");
        return buf;
    }
    size_t used = 0;
    used += (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->v.ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld",
                                 (long long)t->v.shape[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "] %s", df_dtype_name(t->v.dtype));
    return buf;
}
