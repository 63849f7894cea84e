/*
 * A device plugin for the registry tests, built as libdiffuse-testdev.so (and, with
 * TESTDEV_BAD_ABI, as libdiffuse-badabi.so, which claims another ABI version). It links
 * nothing of the library: it sees only the installed device ABI (<diffuse/device.h>) and
 * the host services it is given, and cli/installed_plugins builds it outside the tree
 * against an installed prefix. Its memory is host memory, its one stream runs each item at once when it is
 * queued, and its only kernel is FILL of f32 (enough to run df_full and read it back).
 */
#include <stdlib.h>
#include <string.h>

#include <diffuse/device.h>

static const df_host_api *host;

struct df_dev_buffer {
    void *p;
};

struct df_dev_stream {
    uint64_t done;
};

static int td_count(void)
{
    return 2;
}

static df_status td_info(int index, df_device_info *out)
{
    memset(out, 0, sizeof *out);
    strcpy(out->name, index == 0 ? "test device zero" : "test device one");
    out->kind = DF_DEVICE_KIND_OTHER;
    out->memory_bytes = (uint64_t)1 << 30;
    out->alignment = 64;
    out->priority = -1; /* never the default */
    return DF_OK;
}

static df_status td_open(int index, const char *options, void **dev)
{
    (void)options;
    *dev = (void *)(intptr_t)(index + 1);
    return DF_OK;
}

static void td_close(void *dev)
{
    (void)dev;
}

static df_status td_alloc(void *dev, uint64_t bytes, df_dev_buffer **out)
{
    (void)dev;
    df_dev_buffer *b = malloc(sizeof *b);
    if (b)
        b->p = host->aligned_alloc(bytes ? bytes : 1);
    if (!b || !b->p) {
        free(b);
        return DF_E_OOM;
    }
    *out = b;
    return DF_OK;
}

static void td_free(void *dev, df_dev_buffer *b)
{
    (void)dev;
    host->aligned_free(b->p);
    free(b);
}

static df_status td_stream_create(void *dev, int kind, df_dev_stream **out)
{
    (void)dev;
    (void)kind;
    *out = calloc(1, sizeof **out);
    return *out ? DF_OK : host->errorf(DF_E_OOM, "testdev: out of memory");
}

static void td_stream_free(df_dev_stream *s)
{
    free(s);
}

static df_status td_launch(df_dev_stream *s, const df_node *n)
{
    if (n->op != DF_OP_FILL || n->out.dtype != DF_DTYPE_F32)
        return host->errorf(DF_E_UNSUPPORTED, "testdev: only f32 fill");
    float *o = (float *)((char *)n->out.buf->p + n->out.offset);
    int64_t count = 1;
    for (int d = 0; d < n->out.ndim; d++)
        count *= n->out.shape[d];
    for (int64_t i = 0; i < count; i++)
        o[i] = (float)n->a.value;
    s->done++;
    return DF_OK;
}

static df_status td_h2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t off, const void *src,
                        uint64_t bytes)
{
    memcpy((char *)dst->p + off, src, bytes);
    s->done++;
    return DF_OK;
}

static df_status td_d2h(df_dev_stream *s, void *dst, df_dev_buffer *src, uint64_t off,
                        uint64_t bytes)
{
    memcpy(dst, (char *)src->p + off, bytes);
    s->done++;
    return DF_OK;
}

static df_status td_d2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t doff, df_dev_buffer *src,
                        uint64_t soff, uint64_t bytes)
{
    memmove((char *)dst->p + doff, (char *)src->p + soff, bytes);
    s->done++;
    return DF_OK;
}

static df_status td_callback(df_dev_stream *s, void (*fn)(void *, df_status), void *arg)
{
    fn(arg, DF_OK);
    s->done++;
    return DF_OK;
}

static uint64_t td_record(df_dev_stream *s)
{
    return s->done;
}

static bool td_reached(df_dev_stream *s, uint64_t at, bool wait)
{
    (void)wait;
    return s->done >= at;
}

static df_status td_wait(df_dev_stream *s, df_dev_stream *other, uint64_t at)
{
    (void)s;
    (void)other;
    (void)at;
    return DF_OK;
}

static df_status td_sync(df_dev_stream *s)
{
    (void)s;
    return DF_OK;
}

static void td_reset(df_dev_stream *s)
{
    (void)s;
}

static bool td_supports(void *dev, const df_node *n)
{
    (void)dev;
    return n->op == DF_OP_FILL;
}

static const df_device_ops ops = {
#ifdef TESTDEV_BAD_ABI
    .abi_version = DF_DEVICE_ABI_VERSION + 100,
    .name = "badabi",
#else
    .abi_version = DF_DEVICE_ABI_VERSION,
    .name = "testdev",
#endif
    .struct_size = sizeof(df_device_ops),
    .device_count = td_count,
    .device_info = td_info,
    .device_open = td_open,
    .device_close = td_close,
    .buffer_alloc = td_alloc,
    .buffer_free = td_free,
    .stream_create = td_stream_create,
    .stream_free = td_stream_free,
    .launch = td_launch,
    .copy_h2d = td_h2d,
    .copy_d2h = td_d2h,
    .copy_d2d = td_d2d,
    .host_callback = td_callback,
    .stream_record = td_record,
    .stream_reached = td_reached,
    .stream_wait = td_wait,
    .stream_sync = td_sync,
    .stream_reset = td_reset,
    .supports = td_supports,
};

__attribute__((visibility("default"))) const df_device_ops *df_device_plugin(
    const df_host_api *h, int abi_version)
{
    host = h;
    (void)abi_version; /* the registry checks ops.abi_version */
    return &ops;
}
