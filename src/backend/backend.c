/*
 * Devices and storages, common to every backend.
 *
 * A device name is "<backend>" or "<backend>:<index>". Storages count references with an
 * atomic because host callbacks queued after a node's kernel drop the references the node
 * held; the last release returns the buffer to the device's caching allocator (or frees
 * the handle of wrapped host memory, and with it whatever the backend derived from it).
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/graph.h"
#include "backend/buffer_cache.h"
#include "core/alloc.h"
#include "core/status.h"

static const struct {
    const char *name;
    int n_in;
    df_op_kind kind;
} op_table[DF_OP_COUNT] = {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) [DF_OP_##name] = {printed, n_in, kind},
#include "backend/ops.def"
#undef DF_OP
};

const char *df_op_name(df_op op)
{
    return (unsigned)op < DF_OP_COUNT ? op_table[op].name : "?";
}

df_op_kind df_op_kind_of(df_op op)
{
    return op_table[op].kind;
}

int df_op_inputs(df_op op)
{
    return op_table[op].n_in;
}

df_status df_device_open(const char *name, const char *options, df_device **out)
{
    *out = NULL;
    char backend[16];
    int index = 0;
    const char *colon = strchr(name, ':');
    size_t len = colon ? (size_t)(colon - name) : strlen(name);
    if (len == 0 || len >= sizeof backend)
        return df_errorf(DF_E_ARG, "device '%s': expected NAME or NAME:INDEX", name);
    memcpy(backend, name, len);
    backend[len] = '\0';
    if (colon) {
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (*end || end == colon + 1 || v < 0 || v > 1024)
            return df_errorf(DF_E_ARG, "device '%s': bad device index", name);
        index = (int)v;
    }
    const df_device_ops *ops = df_backend_find(backend);
    if (!ops) {
        char known[256] = "";
        for (int i = 0, n = df_backend_count(); i < n; i++)
            snprintf(known + strlen(known), sizeof known - strlen(known), "%s%s", i ? ", " : "",
                     df_backend_at(i)->name);
        return df_errorf(DF_E_UNSUPPORTED, "device '%s': no backend named '%s' is available "
                         "(available: %s)", name, backend, known);
    }
    if (index >= ops->device_count())
        return df_errorf(DF_E_ARG, "device '%s': backend '%s' has %d device(s)", name, backend,
                         ops->device_count());
    df_device *dev = df_calloc(1, sizeof *dev);
    if (!dev)
        return df_errorf(DF_E_OOM, "out of memory opening device '%s'", name);
    dev->ops = ops;
    dev->index = index;
    snprintf(dev->name, sizeof dev->name, "%s:%d", backend, index);
    /* A device named by its index is asked for: the backend may open one it would not
     * offer by default (a CPU implementation of Vulkan). */
    char opts[512];
    snprintf(opts, sizeof opts, "%s%s%s", options ? options : "",
             options && *options && colon ? "," : "", colon ? "named=1" : "");
    df_status s = ops->device_info(index, &dev->info);
    if (s == DF_OK)
        s = ops->device_open(index, opts, &dev->impl);
    if (s == DF_OK)
        s = df_buffer_cache_create(dev, &dev->cache);
    if (s != DF_OK) {
        df_device_close(dev);
        return s;
    }
    if (dev->info.alignment == 0)
        dev->info.alignment = 64;
    *out = dev;
    return DF_OK;
}

void df_device_close(df_device *dev)
{
    if (!dev)
        return;
    df_buffer_cache_free(dev->cache);
    if (dev->impl)
        dev->ops->device_close(dev->impl);
    df_free(dev);
}

void df_buffer_release(df_device *dev, df_dev_buffer *buf, size_t bytes)
{
    df_buffer_cache_release(dev->cache, buf, bytes);
}

void df_device_mem_stats(df_device *dev, df_mem_stats *out)
{
    df_buffer_cache_stats(dev->cache, out);
}

void df_device_mem_reset_peak(df_device *dev)
{
    df_buffer_cache_reset_peak(dev->cache);
}

void df_device_trim(df_device *dev)
{
    df_buffer_cache_trim(dev->cache);
}

static df_storage *storage_new(df_device *dev, size_t bytes)
{
    df_storage *st = df_calloc(1, sizeof *st);
    if (!st)
        return NULL;
    atomic_init(&st->refs, 1);
    st->dev = dev;
    st->bytes = bytes;
    return st;
}

df_status df_storage_alloc(df_device *dev, size_t bytes, df_storage **out)
{
    *out = NULL;
    df_storage *st = storage_new(dev, bytes);
    if (!st)
        return df_errorf(DF_E_OOM, "out of memory");
    df_status s = df_storage_materialize(st);
    if (s != DF_OK) {
        df_free(st);
        return s;
    }
    *out = st;
    return DF_OK;
}

df_storage *df_storage_lazy(df_device *dev, size_t bytes)
{
    return storage_new(dev, bytes);
}

df_status df_storage_materialize(df_storage *st)
{
    if (st->buf)
        return DF_OK;
    st->offset = 0;
    return df_buffer_cache_alloc(st->dev->cache, st->bytes, &st->buf);
}

df_status df_storage_host(df_device *dev, void *host, size_t bytes, df_storage **out)
{
    *out = NULL;
    df_storage *st = storage_new(dev, bytes);
    if (!st)
        return df_errorf(DF_E_OOM, "out of memory");
    st->host = host;
    df_status s = DF_E_UNSUPPORTED;
    if (dev->ops->buffer_wrap_host && (dev->info.caps & DF_CAP_HOST_MEMORY))
        s = dev->ops->buffer_wrap_host(dev->impl, host, bytes, &st->buf);
    if (s == DF_OK)
        st->owns_buf = true; /* the handle only: the memory stays the caller's */
    else if (s == DF_E_UNSUPPORTED)
        s = DF_OK; /* the device cannot read host memory in place: its copy is made when
                      the storage is first used (runtime/residency.c), as offload allows */
    if (s != DF_OK) {
        df_storage_release(st);
        return s;
    }
    *out = st;
    return DF_OK;
}

void *df_storage_host_ptr(const df_storage *st)
{
    if (!st->buf || !st->dev->ops->buffer_host_ptr)
        return NULL;
    char *p = st->dev->ops->buffer_host_ptr(st->dev->impl, st->buf);
    return p ? p + st->offset : NULL;
}

void df_storage_retain(df_storage *st)
{
    atomic_fetch_add_explicit(&st->refs, 1, memory_order_relaxed);
}

void df_storage_release(df_storage *st)
{
    if (!st)
        return;
    if (atomic_fetch_sub_explicit(&st->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (st->buf && st->owns_buf)
        df_dev_buffer_free(st->dev, st->buf);
    else if (st->buf && !st->external)
        df_buffer_cache_release(st->dev->cache, st->buf, st->bytes);
    df_storage *base = st->base, *scale = st->weight ? st->weight->i8_scale : NULL;
    df_free(st->weight);
    df_free(st);
    df_storage_release(base);
    df_storage_release(scale);
}

int64_t df_gview_numel(const df_gview *v)
{
    return df_shape_numel(v->ndim, v->shape);
}

bool df_gview_is_dense(const df_gview *v)
{
    return df_shape_is_dense(v->ndim, v->shape, v->stride);
}

void df_gview_lower(const df_gview *v, df_view *out)
{
    const df_storage *st = v->st;
    if (!st) {
        memset(out, 0, sizeof *out);
        return;
    }
    out->buf = st->buf;
    out->offset = st->offset + (uint64_t)v->offset * df_dtype_size(v->dtype);
    out->dtype = v->dtype;
    out->ndim = v->ndim;
    memcpy(out->shape, v->shape, sizeof out->shape);
    memcpy(out->stride, v->stride, sizeof out->stride);
    const df_weight *w = st->weight;
    out->flags = st->is_weight ? DF_VIEW_CONST : 0;
    out->scale_buf = NULL;
    out->scale_offset = 0;
    out->scale_groups = 0;
    out->block_type = 0;
    out->block_scale = 0;
    if (!w)
        return;
    out->flags |= (w->transient ? DF_VIEW_STREAMED : 0) |
                  (w->keep_precision ? DF_VIEW_KEEP_PRECISION : 0) |
                  (w->file_backed && st->owns_buf ? DF_VIEW_FILE_PAGES : 0);
    if (w->i8_scale) {
        out->scale_buf = w->i8_scale->buf;
        out->scale_offset = w->i8_scale->offset + w->i8_scale_offset;
        out->scale_groups = w->i8_groups;
    }
    out->block_type = w->block_type;
    out->block_scale = w->block_scale;
}

void df_gnode_lower(const df_gnode *n, df_node *out)
{
    out->op = n->op;
    out->n_in = n->n_in;
    for (int i = 0; i < n->n_in; i++)
        df_gview_lower(&n->in[i], &out->in[i]);
    for (int i = n->n_in; i < DF_NODE_MAX_IN; i++)
        memset(&out->in[i], 0, sizeof out->in[i]);
    df_gview_lower(&n->out, &out->out);
    out->a = n->a;
}
