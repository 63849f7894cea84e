/*
 * libdiffuse-vulkan.so: the Vulkan core behind the device ABI (backend/device.h).
 *
 * A buffer is one pool allocation; a view's address is the allocation's device address
 * plus the view's byte offset. Every stream of a device records into the device's one
 * queue (the core's batches), so stream order is submission order and stream_wait has
 * nothing to add; the core's hazard tracking puts the barriers between dependent commands
 * whichever stream queued them. A position (event) is a count of items queued on the
 * device; the core maps it to the batch that holds the item, so stream_reached waits on
 * that batch's fence only. Host callbacks run on the host thread from the next call that
 * finds their position reached (launch, reached, sync, free).
 *
 * Copies: h2d stages the bytes at once (the caller's memory is free on return), d2h
 * submits and waits (a host read is the one place the host waits).
 *
 * The plugin links nothing of the library: errors go through the host's errorf.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

static const df_host_api *g_host;

/* The core reports errors with df_errorf; in the plugin that is the host's. */
df_status df_errorf(df_status s, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return g_host ? g_host->errorf(s, "%s", msg) : s;
}

const char *df_error_message(void)
{
    return g_host ? g_host->error_message() : "";
}

struct df_dev_buffer {
    dvk_alloc *a;
};

typedef struct pending_cb {
    uint64_t at;
    void (*fn)(void *arg, df_status st);
    void *arg;
    struct pending_cb *next;
} pending_cb;

typedef struct vk_dev {
    dvk_device *d;
    pthread_mutex_t mu; /* the runtime calls from one host thread; callbacks may not */
    pending_cb *cbs, *cbs_tail;
} vk_dev;

struct df_dev_stream {
    vk_dev *dev;
    int kind;
    df_status failed;
    char failed_msg[512];
};

static VkDeviceAddress addr_of(void *user, const df_view *v)
{
    return v->buf->a->addr + v->offset;
}

/* Runs the callbacks whose position the device has reached. */
static void run_callbacks(vk_dev *vd, df_status st)
{
    while (vd->cbs && dvk_done(vd->d, vd->cbs->at)) {
        pending_cb *c = vd->cbs;
        vd->cbs = c->next;
        if (!vd->cbs)
            vd->cbs_tail = NULL;
        c->fn(c->arg, st);
        free(c);
    }
}

static int device_count(void)
{
    int n = 0, order[16];
    if (dvk_devices_list(&n, order) != DF_OK)
        return 0;
    return n;
}

static df_status device_info(int index, df_device_info *out)
{
    memset(out, 0, sizeof *out);
    dvk_device_info in;
    DF_TRY(dvk_device_info_get(index, &in));
    snprintf(out->name, sizeof out->name, "%.48s (subgroup %u%s%s%s)", in.name, in.subgroup_size,
             in.fp16 ? ", fp16" : "", in.int8 ? ", int8" : "",
             in.coopmat ? ", coopmat" : ", no coopmat");
    bool cpu = in.type == VK_PHYSICAL_DEVICE_TYPE_CPU;
    out->kind = cpu ? DF_DEVICE_KIND_OTHER : DF_DEVICE_KIND_GPU;
    out->memory_bytes = in.device_local_bytes;
    out->caps = DF_CAP_FUSED | DF_CAP_FUSED_HEAD | DF_CAP_EPI_GELU_TANH | DF_CAP_EPI_SILU |
                DF_CAP_EPI_GELU | DF_CAP_EPI_GATED_RESIDUAL | DF_CAP_OUT_STRIDED |
                DF_CAP_OUT_BF16 | DF_CAP_COLLECTIVES;
    out->alignment = 256;
    /* GPUs before the CPU backend (0); a CPU implementation never by default */
    out->priority = !in.usable ? -2
                    : in.type == VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU   ? 100
                    : in.type == VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU ? 50
                    : cpu                                               ? -1
                                                                        : 10;
    return DF_OK;
}

static df_status device_open(int index, const char *options, void **out)
{
    *out = NULL;
    dvk_device_info in;
    DF_TRY(dvk_device_info_get(index, &in));
    /* A CPU implementation (lavapipe) opens when named (vulkan:N) or allowed. */
    bool named = options && strstr(options, "named=1") != NULL;
    if (in.usable && !named && !dvk_device_offered(&in))
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan:%d is '%s', a CPU implementation of Vulkan (slower than the "
                         "cpu backend); name it as --device vulkan:%d or set "
                         "DIFFUSE_VULKAN_ALLOW_CPU=1 to use it anyway", index, in.name, index);
    vk_dev *vd = calloc(1, sizeof *vd);
    if (!vd)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory");
    df_status s = dvk_device_open(index, &vd->d);
    if (s != DF_OK) {
        free(vd);
        return s;
    }
    pthread_mutex_init(&vd->mu, NULL);
    *out = vd;
    return DF_OK;
}

static void device_close(void *dev)
{
    vk_dev *vd = dev;
    dvk_finish(vd->d);
    run_callbacks(vd, DF_OK);
    dvk_device_close(vd->d);
    pthread_mutex_destroy(&vd->mu);
    free(vd);
}

static df_status buffer_alloc(void *dev, uint64_t bytes, df_dev_buffer **out)
{
    vk_dev *vd = dev;
    *out = NULL;
    df_dev_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory");
    df_status s = dvk_alloc_make(vd->d, bytes, &b->a);
    if (s != DF_OK) {
        free(b);
        return s;
    }
    *out = b;
    return DF_OK;
}

static void buffer_free(void *dev, df_dev_buffer *buf)
{
    vk_dev *vd = dev;
    if (!buf)
        return;
    dvk_alloc_free(vd->d, buf->a);
    free(buf);
}

static df_status stream_create(void *dev, int kind, df_dev_stream **out)
{
    df_dev_stream *s = calloc(1, sizeof *s);
    if (!s)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory");
    s->dev = dev;
    s->kind = kind;
    *out = s;
    return DF_OK;
}

static void stream_free(df_dev_stream *s)
{
    if (!s)
        return;
    dvk_finish(s->dev->d);
    run_callbacks(s->dev, s->failed);
    free(s);
}

/* A failure found while queuing: the stream's sticky status, with its message. */
static df_status fail(df_dev_stream *s, df_status st)
{
    if (s->failed == DF_OK) {
        s->failed = st;
        snprintf(s->failed_msg, sizeof s->failed_msg, "%s", df_error_message());
    }
    return st;
}

static df_status launch(df_dev_stream *s, const df_node *n)
{
    if (s->failed != DF_OK)
        return DF_OK; /* skipped: the stream reports its first failure at sync */
    dvk_env e = {.d = s->dev->d, .addr = addr_of};
    df_status st = dvk_run_node(&e, n);
    run_callbacks(s->dev, DF_OK);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static df_status launch_fused(df_dev_stream *s, const df_fused *f)
{
    if (s->failed != DF_OK)
        return DF_OK;
    dvk_env e = {.d = s->dev->d, .addr = addr_of};
    df_status st = dvk_run_fused(&e, f);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static df_status copy_h2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t offset,
                          const void *src, uint64_t bytes)
{
    if (s->failed != DF_OK)
        return DF_OK;
    df_status st = dvk_upload(s->dev->d, dst->a->addr + offset, src, bytes);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static df_status copy_d2h(df_dev_stream *s, void *dst, df_dev_buffer *src, uint64_t offset,
                          uint64_t bytes)
{
    if (s->failed != DF_OK)
        return DF_OK;
    df_status st = dvk_download(s->dev->d, dst, src->a->addr + offset, bytes);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static df_status copy_d2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t dst_offset,
                          df_dev_buffer *src, uint64_t src_offset, uint64_t bytes)
{
    if (s->failed != DF_OK)
        return DF_OK;
    df_status st = dvk_copy(s->dev->d, dst->a->addr + dst_offset, src->a->addr + src_offset,
                            bytes);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static df_status host_callback(df_dev_stream *s, void (*fn)(void *arg, df_status st), void *arg)
{
    pending_cb *c = malloc(sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory");
    *c = (pending_cb){dvk_position(s->dev->d), fn, arg, NULL};
    vk_dev *vd = s->dev;
    if (vd->cbs_tail)
        vd->cbs_tail->next = c;
    else
        vd->cbs = c;
    vd->cbs_tail = c;
    return DF_OK;
}

static uint64_t stream_record(df_dev_stream *s)
{
    return dvk_position(s->dev->d);
}

static bool stream_reached(df_dev_stream *s, uint64_t at, bool wait)
{
    bool r = dvk_reached(s->dev->d, at, wait);
    run_callbacks(s->dev, s->failed);
    return r;
}

static df_status stream_wait(df_dev_stream *s, df_dev_stream *other, uint64_t at)
{
    return DF_OK; /* one queue: submission order already orders them */
}

static df_status stream_sync(df_dev_stream *s)
{
    df_status st = dvk_finish(s->dev->d);
    if (st != DF_OK)
        fail(s, st);
    run_callbacks(s->dev, s->failed);
    if (s->failed != DF_OK)
        return df_errorf(s->failed, "%s", s->failed_msg);
    return DF_OK;
}

static void stream_reset(df_dev_stream *s)
{
    s->failed = DF_OK;
    s->failed_msg[0] = 0;
    s->dev->d->failed = DF_OK;
}

/* ---- recorded graphs and counters ------------------------------------------------------ */

struct df_dev_graph {
    dvk_graph *g;
};

static df_status capture_begin(df_dev_stream *s)
{
    return dvk_capture_begin(s->dev->d);
}

static df_status capture_end(df_dev_stream *s, df_dev_graph **out)
{
    *out = NULL;
    dvk_graph *g = NULL;
    DF_TRY(dvk_capture_end(s->dev->d, &g));
    df_dev_graph *h = malloc(sizeof *h);
    if (!h) {
        dvk_graph_free(s->dev->d, g);
        return df_errorf(DF_E_OOM, "vulkan: out of host memory");
    }
    h->g = g;
    *out = h;
    return DF_OK;
}

static df_status graph_launch(df_dev_stream *s, df_dev_graph *g)
{
    if (s->failed != DF_OK)
        return DF_OK;
    df_status st = dvk_graph_launch(s->dev->d, g->g);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static void graph_free(void *dev, df_dev_graph *g)
{
    vk_dev *vd = dev;
    if (!g)
        return;
    dvk_graph_free(vd->d, g->g);
    run_callbacks(vd, DF_OK);
    free(g);
}

static void device_counters(void *dev, df_dev_counters *out)
{
    const dvk_stats *st = &((vk_dev *)dev)->d->stats;
    *out = (df_dev_counters){.dispatches = st->dispatches,
                             .dispatches_recorded = st->dispatches_recorded,
                             .submits = st->submits,
                             .graph_launches = st->graph_launches};
}

static bool supports(void *dev, const df_node *n)
{
    if (!dvk_op_supported(n->op))
        return false;
    for (int i = 0; i < n->n_in; i++)
        if (n->in[i].buf && (n->in[i].dtype == DF_DTYPE_F64 || n->in[i].dtype == DF_DTYPE_I8))
            return false;
    if (n->op == DF_OP_LINEAR && n->a.compute == DF_DTYPE_I8)
        return false;
    return n->out.dtype != DF_DTYPE_F64;
}

static df_dtype matmul_dtype(void *dev, df_dtype requested)
{
    return requested == DF_DTYPE_I8 ? DF_DTYPE_F32 : requested;
}

/* Collectives: vk_collective.c, staged through host memory in stream order. */
static df_status comm_create(void *dev, const df_host_comm *host, df_dev_comm **out)
{
    return dvk_comm_create(host, out);
}

static df_status collective(df_dev_stream *s, df_dev_comm *c, const df_coll *op)
{
    if (s->failed != DF_OK)
        return DF_OK; /* skipped, as launch; the pipeline stops every rank at its check */
    df_status st = dvk_collective(s->dev->d, c, op, op->buf->a->addr + op->offset);
    run_callbacks(s->dev, DF_OK);
    return st == DF_OK ? DF_OK : fail(s, st);
}

static const df_device_ops ops = {
    .abi_version = DF_DEVICE_ABI_VERSION,
    .struct_size = sizeof(df_device_ops),
    .name = "vulkan",
    .device_count = device_count,
    .device_info = device_info,
    .device_open = device_open,
    .device_close = device_close,
    .buffer_alloc = buffer_alloc,
    .buffer_free = buffer_free,
    .stream_create = stream_create,
    .stream_free = stream_free,
    .launch = launch,
    .launch_fused = launch_fused,
    .copy_h2d = copy_h2d,
    .copy_d2h = copy_d2h,
    .copy_d2d = copy_d2d,
    .host_callback = host_callback,
    .stream_record = stream_record,
    .stream_reached = stream_reached,
    .stream_wait = stream_wait,
    .stream_sync = stream_sync,
    .stream_reset = stream_reset,
    .supports = supports,
    .matmul_dtype = matmul_dtype,
    .comm_create = comm_create,
    .comm_free = dvk_comm_free,
    .collective = collective,
    .device_counters = device_counters,
    .capture_begin = capture_begin,
    .capture_end = capture_end,
    .graph_launch = graph_launch,
    .graph_free = graph_free,
};

__attribute__((visibility("default"))) const df_device_ops *df_device_plugin(const df_host_api *host,
                                                                            int abi_version)
{
    g_host = host;
    dvk_logf = host->logf;
    if (abi_version != DF_DEVICE_ABI_VERSION) {
        host->errorf(DF_E_UNSUPPORTED,
                     "libdiffuse-vulkan.so was built for device ABI %d, the library has %d",
                     DF_DEVICE_ABI_VERSION, abi_version);
        return NULL;
    }
    dvk_instance *in;
    if (dvk_instance_get(&in) != DF_OK)
        return NULL; /* the message names what is missing (loader or driver) */
    return &ops;
}
