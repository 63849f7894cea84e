/*
 * Devices and storages, common to every backend.
 *
 * A device name is "<backend>" or "<backend>:<index>". Storages count references with an
 * atomic because the stream thread drops the references its finished nodes held; the last
 * release returns the memory to the device's caching allocator (or leaves it alone for
 * external memory) and frees whatever the backend derived from it.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/buffer_cache.h"
#include "core/alloc.h"
#include "core/status.h"

static const struct {
    const char *name;
    int n_in;
    df_op_kind kind;
} op_table[DF_OP_COUNT] = {
#define DF_OP(name, printed, n_in, kind) [DF_OP_##name] = {printed, n_in, kind},
#include "runtime/ops.def"
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

const df_backend_ops *df_backend_find(const char *name)
{
    if (strcmp(name, "cpu") == 0)
        return df_backend_cpu();
    return NULL;
}

df_status df_device_open(const char *name, int threads, df_device **out)
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
    const df_backend_ops *ops = df_backend_find(backend);
    if (!ops)
        return df_errorf(DF_E_UNSUPPORTED, "device '%s': no backend named '%s' is available "
                         "(built in: cpu)", name, backend);
    if (index >= ops->device_count())
        return df_errorf(DF_E_ARG, "device '%s': backend '%s' has %d device(s)", name, backend,
                         ops->device_count());
    df_device *dev = df_calloc(1, sizeof *dev);
    if (!dev)
        return df_errorf(DF_E_OOM, "out of memory opening device '%s'", name);
    dev->ops = ops;
    dev->index = index;
    snprintf(dev->name, sizeof dev->name, "%s:%d", backend, index);
    df_status s = ops->device_open(index, threads, &dev->impl);
    if (s == DF_OK)
        s = df_buffer_cache_create(dev, &dev->cache);
    if (s != DF_OK) {
        df_device_close(dev);
        return s;
    }
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
    if (st->data)
        return DF_OK;
    return df_buffer_cache_alloc(st->dev->cache, st->bytes, &st->data);
}

df_storage *df_storage_external(df_device *dev, void *data, size_t bytes)
{
    df_storage *st = storage_new(dev, bytes);
    if (st) {
        st->data = data;
        st->external = true;
    }
    return st;
}

void df_storage_drop_pages(const df_storage *st, const void *p, size_t n)
{
    if (!st->file_backed || !p || n == 0)
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = (uintptr_t)p / page * page;
    uintptr_t end = ((uintptr_t)p + n + page - 1) / page * page;
    madvise((void *)begin, end - begin, MADV_DONTNEED); /* advice: failure changes nothing */
}

void df_storage_retain(df_storage *st)
{
    atomic_fetch_add_explicit(&st->refs, 1, memory_order_relaxed);
}

void df_storage_drop_derived(df_storage *st)
{
    for (df_derived *d = st->derived, *next; d; d = next) {
        next = d->next;
        if (d->free)
            d->free(d->data);
        df_free(d);
    }
    st->derived = NULL;
}

void df_storage_release(df_storage *st)
{
    if (!st)
        return;
    if (atomic_fetch_sub_explicit(&st->refs, 1, memory_order_acq_rel) != 1)
        return;
    df_storage_drop_derived(st);
    if (st->data && !st->external)
        df_buffer_cache_release(st->dev->cache, st->data, st->bytes);
    df_storage *base = st->base;
    df_free(st);
    df_storage_release(base);
}

df_derived *df_storage_find_derived(df_storage *st, int64_t key)
{
    for (df_derived *d = st->derived; d; d = d->next)
        if (d->key == key)
            return d;
    return NULL;
}

void df_storage_add_derived(df_storage *st, df_derived *d)
{
    d->next = st->derived;
    st->derived = d;
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
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

bool df_view_is_dense(const df_view *v)
{
    int64_t expect = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] != 1 && v->stride[d] != expect)
            return false;
        expect *= v->shape[d];
    }
    return true;
}
