/*
 * The sim device: a device whose memory the runtime cannot address, built for tests.
 *
 * A sim buffer handle is an id with a tag in the high bits, not a pointer: any place the
 * runtime still treats device memory as host memory dereferences a non-canonical address
 * and crashes at once, and every handle the sim is given is checked against its table of
 * live buffers (a stale or foreign handle fails the call with a message). The memory
 * itself is the sim's own allocation. Streams are CPU streams (a worker thread each) that
 * the sim feeds: a launch translates the node's handles to CPU buffers over the sim's
 * memory on the host thread and queues the CPU kernel, so kernels run on the sim's stream
 * thread on the sim's buffers. Copies are real copies in stream order, and the link they
 * cross can be slowed: DIFFUSE_SIM_LINK="GBPS[,LATENCY_US]" (e.g. "25,10", a PCIe-like
 * link) makes each host<->device copy take latency + bytes / rate on its stream, and
 * DIFFUSE_SIM_REPORT=1 prints at close how long the copies took and how long streams
 * waited for one another (the part of the link time the copy stream did not hide).
 *
 * It has every capability of the CPU except host memory: no buffer_wrap_host, no
 * buffer_host_ptr, so weights are uploaded and results downloaded through copies.
 * DIFFUSE_SIM_CAPS="-int8,-prepacked-weights" takes capabilities away (the words of
 * df_device_caps_string), so a test can show that the runtime asks the device, not the
 * host, what it can do. Its matrix product rates (matmul_rates, read by --dtype auto) are
 * fake ones given by DIFFUSE_SIM_MATMUL_RATES="f32=GFLOPS,bf16=GFLOPS"; without them it does
 * not say.
 *
 * Recorded graphs (capture_begin ... graph_launch): a capture keeps the launches, fused
 * launches and device-to-device copies of its stream, with the sim's handles, and a replay
 * queues them again (each handle checked against the live buffers once more), so compiled
 * mode's graph replay is tested without a GPU. Counters: every kernel the host hands over
 * outside a replay is a dispatch recorded and a submit; a replay is one submit.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu_device.h"
#include "backend/cpu/gemm.h"
#include "backend/registry.h"
#include "core/alloc.h"
#include "core/status.h"

#define SIM_TAG 0xd15c000000000000ull /* non-canonical on x86-64 and arm64 */
#define SIM_TAG_MASK 0xffff000000000000ull

typedef struct sim_record {
    df_dev_buffer cpu; /* the CPU buffer over the sim's memory (kernels' view) */
    bool live;
} sim_record;

typedef struct sim_device {
    const df_device_ops *cpu;
    void *cpu_dev;
    pthread_mutex_t mu;
    sim_record **rec;  /* by id - 1 */
    int64_t n_rec, cap_rec;
    int64_t *free_ids; /* ids to reuse */
    int64_t n_free;
    double link_gbps, link_latency_s; /* 0: copies take no extra time */
    _Atomic int64_t link_ns, copies, waited_ns; /* for DIFFUSE_SIM_REPORT=1 */
    df_dev_counters counters; /* host thread only */
} sim_device;

/* A recorded graph: what its stream was given between capture_begin and capture_end. */
enum { SIM_ITEM_NODE, SIM_ITEM_FUSED, SIM_ITEM_COPY };

typedef struct sim_item {
    int kind;
    union {
        df_node node;
        df_fused *fused;
        struct {
            df_dev_buffer *dst, *src;
            uint64_t doff, soff, bytes;
        } copy;
    } u;
} sim_item;

struct df_dev_graph {
    sim_item *items;
    int n, cap;
    const char *broken; /* why it cannot be replayed, or NULL */
    bool oom;
};

struct df_dev_stream {
    sim_device *dev;
    df_dev_stream *cpu; /* the CPU stream (its worker thread) that runs the work */
    df_dev_graph *capture; /* the graph being recorded, or NULL */
    bool replaying;        /* inside graph_launch: not recorded, not counted again */
};

/* ---- handles ---------------------------------------------------------------------------- */

static df_dev_buffer *handle_of(int64_t id)
{
    return (df_dev_buffer *)(uintptr_t)(SIM_TAG | (uint64_t)id);
}

/* The CPU buffer behind handle h, or NULL (with a message) when h is no live sim buffer. */
static df_dev_buffer *resolve(sim_device *d, df_dev_buffer *h)
{
    uintptr_t v = (uintptr_t)h;
    df_dev_buffer *b = NULL;
    pthread_mutex_lock(&d->mu);
    int64_t id = (int64_t)(v & ~SIM_TAG_MASK);
    if ((v & SIM_TAG_MASK) == SIM_TAG && id >= 1 && id <= d->n_rec && d->rec[id - 1]->live)
        b = &d->rec[id - 1]->cpu;
    pthread_mutex_unlock(&d->mu);
    if (!b)
        df_errorf(DF_E_INTERNAL, "sim: %p is not a live sim buffer (freed too early, or host "
                  "memory passed where device memory belongs)", (void *)h);
    return b;
}

static df_status resolve_view(sim_device *d, df_view *v)
{
    if (v->buf && !(v->buf = resolve(d, v->buf)))
        return DF_E_INTERNAL;
    if (v->scale_buf && !(v->scale_buf = resolve(d, v->scale_buf)))
        return DF_E_INTERNAL;
    return DF_OK;
}

/* ---- the link ---------------------------------------------------------------------------- */

/* A host<->device copy as the link carries it: the bytes move, and the copy takes at least
 * latency + bytes / rate. It runs on the stream's thread, in stream order. */
typedef struct link_copy {
    sim_device *dev;
    void *dst;
    const void *src;
    uint64_t bytes;
} link_copy;

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void run_link_copy(void *arg, df_status s)
{
    link_copy *c = arg;
    sim_device *d = c->dev;
    if (s == DF_OK) { /* a failed stream skips its work */
        double t0 = seconds_now();
        memcpy(c->dst, c->src, (size_t)c->bytes);
        double want = d->link_latency_s +
                      (d->link_gbps > 0 ? (double)c->bytes / (d->link_gbps * 1e9) : 0);
        double left = want - (seconds_now() - t0);
        if (left > 0) {
            struct timespec ts = {.tv_sec = (time_t)left,
                                  .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
            nanosleep(&ts, NULL);
        }
        atomic_fetch_add(&d->link_ns, (int64_t)((seconds_now() - t0) * 1e9));
        atomic_fetch_add(&d->copies, 1);
    }
    df_free(c);
}

static df_status link_copy_queue(df_dev_stream *s, void *dst, const void *src, uint64_t bytes)
{
    link_copy *c = df_malloc(sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "sim: out of memory queuing a copy");
    *c = (link_copy){.dev = s->dev, .dst = dst, .src = src, .bytes = bytes};
    df_status st = s->dev->cpu->host_callback(s->cpu, run_link_copy, c);
    if (st != DF_OK)
        df_free(c);
    return st;
}

/* ---- device ------------------------------------------------------------------------------ */

static int sim_device_count(void)
{
    return 2; /* two devices, for tests of device indices and of tensor parallelism */
}

static const struct {
    const char *word;
    uint32_t bit;
} cap_words[] = {
#define DF_CAP(name, bit, word, doc) {word, DF_CAP_##name},
#include "backend/ops.def"
#undef DF_CAP
};

/* caps less the words DIFFUSE_SIM_CAPS takes away ("-int8,-fused"). */
static df_status sim_caps(uint32_t caps, uint32_t *out)
{
    const char *env = getenv("DIFFUSE_SIM_CAPS");
    for (const char *p = env ? env : ""; *p;) {
        size_t n = strcspn(p, ",");
        uint32_t bit = 0;
        for (size_t w = 0; w < sizeof cap_words / sizeof *cap_words && *p == '-' && !bit; w++)
            if (strlen(cap_words[w].word) == n - 1 && strncmp(cap_words[w].word, p + 1, n - 1) == 0)
                bit = cap_words[w].bit;
        if (!bit)
            return df_errorf(DF_E_ARG, "DIFFUSE_SIM_CAPS='%.64s': '%.*s' is not -WORD with WORD "
                             "a capability (diffuse devices --all names them)", env, (int)n, p);
        caps &= ~bit;
        p += n + (p[n] == ',');
    }
    *out = caps;
    return DF_OK;
}

static df_status sim_device_info(int index, df_device_info *out)
{
    df_device_info cpu;
    DF_TRY(df_backend_cpu()->device_info(0, &cpu));
    *out = cpu;
    snprintf(out->name, sizeof out->name, "simulated device %d (memory the host cannot "
             "address)", index);
    out->kind = DF_DEVICE_KIND_SIM;
    DF_TRY(sim_caps(cpu.caps & ~(uint32_t)DF_CAP_HOST_MEMORY, &out->caps));
    out->priority = -100; /* never chosen unless named */
    return DF_OK;
}

static df_status sim_device_open(int index, const char *options, void **impl)
{
    (void)index;
    sim_device *d = df_calloc(1, sizeof *d);
    if (!d)
        return df_errorf(DF_E_OOM, "out of memory opening sim");
    d->cpu = df_backend_cpu();
    pthread_mutex_init(&d->mu, NULL);
    const char *link = getenv("DIFFUSE_SIM_LINK");
    if (link && *link) {
        char *end;
        d->link_gbps = strtod(link, &end);
        if (*end == ',')
            d->link_latency_s = strtod(end + 1, &end) * 1e-6;
        if (*end || d->link_gbps < 0 || d->link_latency_s < 0) {
            pthread_mutex_destroy(&d->mu);
            df_free(d);
            return df_errorf(DF_E_ARG, "DIFFUSE_SIM_LINK='%s': expected GBPS[,LATENCY_US]",
                             link);
        }
    }
    df_status s = d->cpu->device_open(0, options, &d->cpu_dev);
    if (s != DF_OK) {
        pthread_mutex_destroy(&d->mu);
        df_free(d);
        return s;
    }
    *impl = d;
    return DF_OK;
}

static void sim_device_close(void *impl)
{
    sim_device *d = impl;
    const char *report = getenv("DIFFUSE_SIM_REPORT");
    if (report && *report && strcmp(report, "0") != 0) /* how much of the link time showed */
        fprintf(stderr, "sim: %lld host<->device copies took %.1f ms; streams waited %.1f ms "
                "for other streams (the copy time that was not hidden)\n",
                (long long)atomic_load(&d->copies), (double)atomic_load(&d->link_ns) * 1e-6,
                (double)atomic_load(&d->waited_ns) * 1e-6);
    for (int64_t i = 0; i < d->n_rec; i++) {
        if (d->rec[i]->live) { /* the runtime frees every buffer first: this is a leak */
            df_cpu_drop_derived(&d->rec[i]->cpu);
            df_aligned_free(d->rec[i]->cpu.ptr);
        }
        df_free(d->rec[i]);
    }
    df_free(d->rec);
    df_free(d->free_ids);
    d->cpu->device_close(d->cpu_dev);
    pthread_mutex_destroy(&d->mu);
    df_free(d);
}

static df_status sim_buffer_alloc(void *impl, uint64_t bytes, df_dev_buffer **out)
{
    sim_device *d = impl;
    void *mem = df_aligned_alloc(bytes ? bytes : 1);
    if (!mem)
        return DF_E_OOM; /* the caching allocator writes the message */
    pthread_mutex_lock(&d->mu);
    int64_t id;
    if (d->n_free > 0) {
        id = d->free_ids[--d->n_free];
    } else {
        if (d->n_rec == d->cap_rec) {
            int64_t cap = d->cap_rec ? 2 * d->cap_rec : 256;
            sim_record **r = df_realloc(d->rec, (size_t)cap * sizeof *r);
            int64_t *f = r ? df_realloc(d->free_ids, (size_t)cap * sizeof *f) : NULL;
            if (r)
                d->rec = r;
            if (f)
                d->free_ids = f;
            if (!r || !f) {
                pthread_mutex_unlock(&d->mu);
                df_aligned_free(mem);
                return DF_E_OOM;
            }
            d->cap_rec = cap;
        }
        sim_record *rec = df_calloc(1, sizeof *rec);
        if (!rec) {
            pthread_mutex_unlock(&d->mu);
            df_aligned_free(mem);
            return DF_E_OOM;
        }
        d->rec[d->n_rec++] = rec;
        id = d->n_rec;
    }
    sim_record *rec = d->rec[id - 1];
    df_cpu_buffer_init(&rec->cpu, mem, bytes);
    rec->live = true;
    pthread_mutex_unlock(&d->mu);
    *out = handle_of(id);
    return DF_OK;
}

static void sim_buffer_free(void *impl, df_dev_buffer *h)
{
    sim_device *d = impl;
    df_dev_buffer *b = resolve(d, h);
    if (!b) {
        fprintf(stderr, "diffuse: %s\n", df_error_message());
        __builtin_trap(); /* a double free in the runtime: stop where it happened */
    }
    df_cpu_drop_derived(b);
    df_aligned_free(b->ptr);
    pthread_mutex_lock(&d->mu);
    int64_t id = (int64_t)((uintptr_t)h & ~SIM_TAG_MASK);
    d->rec[id - 1]->live = false;
    d->rec[id - 1]->cpu.ptr = NULL;
    d->free_ids[d->n_free++] = id;
    pthread_mutex_unlock(&d->mu);
}

/* ---- streams ------------------------------------------------------------------------------ */

static void graph_free_items(df_dev_graph *g);

static df_status sim_stream_create(void *impl, int kind, df_dev_stream **out)
{
    sim_device *d = impl;
    df_dev_stream *s = df_calloc(1, sizeof *s);
    if (!s)
        return df_errorf(DF_E_OOM, "out of memory creating a sim stream");
    s->dev = d;
    df_status st = d->cpu->stream_create(d->cpu_dev, kind, &s->cpu);
    if (st != DF_OK) {
        df_free(s);
        return st;
    }
    *out = s;
    return DF_OK;
}

static void sim_stream_free(df_dev_stream *s)
{
    if (!s)
        return;
    if (s->capture)
        graph_free_items(s->capture);
    s->dev->cpu->stream_sync(s->cpu);
    atomic_fetch_add(&s->dev->waited_ns, df_cpu_stream_waited_ns(s->cpu));
    s->dev->cpu->stream_free(s->cpu);
    df_free(s);
}

/* ---- recorded graphs ---------------------------------------------------------------------- */

static sim_item *graph_add(df_dev_stream *s, int kind)
{
    df_dev_graph *g = s->capture;
    if (!g || s->replaying)
        return NULL;
    if (g->n == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        sim_item *items = df_realloc(g->items, (size_t)cap * sizeof *items);
        if (!items) {
            g->oom = true;
            return NULL;
        }
        g->items = items;
        g->cap = cap;
    }
    sim_item *it = &g->items[g->n++];
    memset(it, 0, sizeof *it);
    it->kind = kind;
    return it;
}

/* Work the host handed over: a kernel outside a replay is recorded and submitted. */
static void count_kernel(df_dev_stream *s)
{
    s->dev->counters.dispatches++;
    if (!s->replaying) {
        s->dev->counters.dispatches_recorded++;
        s->dev->counters.submits++;
    }
}

static void graph_free_items(df_dev_graph *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->items[i].kind == SIM_ITEM_FUSED)
            df_free(g->items[i].u.fused);
    df_free(g->items);
    df_free(g);
}

static df_status sim_capture_begin(df_dev_stream *s)
{
    if (s->capture)
        return df_errorf(DF_E_STATE, "sim: a capture is already under way on this stream");
    s->capture = df_calloc(1, sizeof *s->capture);
    return s->capture ? DF_OK : df_errorf(DF_E_OOM, "sim: out of memory beginning a capture");
}

static df_status sim_capture_end(df_dev_stream *s, df_dev_graph **out)
{
    *out = NULL;
    df_dev_graph *g = s->capture;
    s->capture = NULL;
    if (!g)
        return df_errorf(DF_E_STATE, "sim: capture_end without capture_begin");
    if (g->broken || g->oom) {
        const char *why = g->oom ? "out of memory recording it" : g->broken;
        graph_free_items(g);
        return df_errorf(DF_E_UNSUPPORTED, "sim: the captured work cannot be replayed (%s)",
                         why);
    }
    *out = g;
    return DF_OK;
}

static df_status sim_launch(df_dev_stream *s, const df_node *n);
static df_status sim_launch_fused(df_dev_stream *s, const df_fused *f);
static df_status sim_copy_d2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t doff,
                              df_dev_buffer *src, uint64_t soff, uint64_t bytes);

static df_status sim_graph_launch(df_dev_stream *s, df_dev_graph *g)
{
    if (s->capture)
        return df_errorf(DF_E_STATE, "sim: a graph launched inside a capture");
    s->replaying = true;
    df_status st = DF_OK;
    for (int i = 0; st == DF_OK && i < g->n; i++) {
        const sim_item *it = &g->items[i];
        if (it->kind == SIM_ITEM_NODE)
            st = sim_launch(s, &it->u.node);
        else if (it->kind == SIM_ITEM_FUSED)
            st = sim_launch_fused(s, it->u.fused);
        else
            st = sim_copy_d2d(s, it->u.copy.dst, it->u.copy.doff, it->u.copy.src,
                              it->u.copy.soff, it->u.copy.bytes);
    }
    s->replaying = false;
    s->dev->counters.submits++;
    s->dev->counters.graph_launches++;
    return st;
}

static void sim_graph_free(void *impl, df_dev_graph *g)
{
    (void)impl;
    if (g)
        graph_free_items(g);
}

static void sim_counters(void *impl, df_dev_counters *out)
{
    *out = ((sim_device *)impl)->counters;
}

/* ---- work -------------------------------------------------------------------------------- */

static df_status sim_launch(df_dev_stream *s, const df_node *n)
{
    df_node k = *n;
    for (int i = 0; i < k.n_in; i++)
        DF_TRY(resolve_view(s->dev, &k.in[i]));
    DF_TRY(resolve_view(s->dev, &k.out));
    DF_TRY(s->dev->cpu->launch(s->cpu, &k));
    count_kernel(s);
    sim_item *it = graph_add(s, SIM_ITEM_NODE);
    if (it)
        it->u.node = *n;
    return DF_OK;
}

static df_status sim_launch_fused(df_dev_stream *s, const df_fused *f)
{
    df_fused *k = df_malloc(sizeof *k);
    if (!k)
        return df_errorf(DF_E_OOM, "sim: out of memory queuing a fused kernel");
    *k = *f;
    df_status st = resolve_view(s->dev, &k->out);
    for (int i = 0; st == DF_OK && i < k->n_in; i++)
        st = resolve_view(s->dev, &k->in[i]);
    if (st == DF_OK && k->head_op >= 0)
        st = resolve_view(s->dev, &k->head_x);
    if (st == DF_OK && k->head_op >= 0)
        st = resolve_view(s->dev, &k->head_w);
    if (st == DF_OK && k->head_op >= 0)
        st = resolve_view(s->dev, &k->head_b);
    if (st == DF_OK)
        st = s->dev->cpu->launch_fused(s->cpu, k);
    if (st == DF_OK) {
        count_kernel(s);
        sim_item *it = graph_add(s, SIM_ITEM_FUSED);
        if (it) {
            *k = *f; /* the sim's handles: resolved again at each replay */
            it->u.fused = k;
            return DF_OK;
        }
    }
    df_free(k);
    return st;
}

static df_status check_range(const df_dev_buffer *b, uint64_t off, uint64_t bytes)
{
    if (off > b->bytes || bytes > b->bytes - off)
        return df_errorf(DF_E_INTERNAL, "sim: a copy of %llu bytes at offset %llu of a "
                         "%llu-byte buffer", (unsigned long long)bytes,
                         (unsigned long long)off, (unsigned long long)b->bytes);
    return DF_OK;
}

static df_status sim_copy_h2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t off,
                              const void *src, uint64_t bytes)
{
    df_dev_buffer *b = resolve(s->dev, dst);
    if (!b)
        return DF_E_INTERNAL;
    DF_TRY(check_range(b, off, bytes));
    if (s->capture)
        s->capture->broken = "a host-to-device copy inside it";
    return link_copy_queue(s, (char *)b->ptr + off, src, bytes);
}

static df_status sim_copy_d2h(df_dev_stream *s, void *dst, df_dev_buffer *src, uint64_t off,
                              uint64_t bytes)
{
    df_dev_buffer *b = resolve(s->dev, src);
    if (!b)
        return DF_E_INTERNAL;
    DF_TRY(check_range(b, off, bytes));
    if (s->capture)
        s->capture->broken = "a device-to-host copy inside it";
    return link_copy_queue(s, dst, (const char *)b->ptr + off, bytes);
}

static df_status sim_copy_d2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t doff,
                              df_dev_buffer *src, uint64_t soff, uint64_t bytes)
{
    df_dev_buffer *db = resolve(s->dev, dst), *sb = db ? resolve(s->dev, src) : NULL;
    if (!sb)
        return DF_E_INTERNAL;
    DF_TRY(check_range(db, doff, bytes));
    DF_TRY(check_range(sb, soff, bytes));
    DF_TRY(s->dev->cpu->copy_d2d(s->cpu, db, doff, sb, soff, bytes));
    sim_item *it = graph_add(s, SIM_ITEM_COPY);
    if (it) {
        it->u.copy.dst = dst;
        it->u.copy.src = src;
        it->u.copy.doff = doff;
        it->u.copy.soff = soff;
        it->u.copy.bytes = bytes;
    }
    return DF_OK;
}

static df_status sim_host_callback(df_dev_stream *s, void (*fn)(void *, df_status), void *arg)
{
    return s->dev->cpu->host_callback(s->cpu, fn, arg);
}

static df_status sim_drop_cache(df_dev_stream *s, df_dev_buffer *h)
{
    df_dev_buffer *b = resolve(s->dev, h);
    return b ? s->dev->cpu->buffer_drop_cache(s->cpu, b) : DF_E_INTERNAL;
}

static uint64_t sim_record_pos(df_dev_stream *s)
{
    return s->dev->cpu->stream_record(s->cpu);
}

static bool sim_reached(df_dev_stream *s, uint64_t at, bool wait)
{
    return s->dev->cpu->stream_reached(s->cpu, at, wait);
}

static df_status sim_wait(df_dev_stream *s, df_dev_stream *other, uint64_t at)
{
    return s->dev->cpu->stream_wait(s->cpu, other->cpu, at);
}

static df_status sim_sync(df_dev_stream *s)
{
    return s->dev->cpu->stream_sync(s->cpu);
}

static void sim_reset(df_dev_stream *s)
{
    s->dev->cpu->stream_reset(s->cpu);
}

static void sim_throttle(df_dev_stream *s, size_t depth)
{
    s->dev->cpu->stream_throttle(s->cpu, depth);
}

static bool sim_supports(void *impl, const df_node *n)
{
    return df_cpu_supports(n);
}

static df_dtype sim_matmul_dtype(void *impl, df_dtype requested)
{
    return df_gemm_compute_dtype(requested);
}

static df_status sim_matmul_rates(void *impl, double *f32, double *bf16, char *how, size_t cap)
{
    (void)impl;
    const char *env = getenv("DIFFUSE_SIM_MATMUL_RATES");
    if (!env || !*env)
        return df_errorf(DF_E_UNSUPPORTED, "sim: the device does not say how fast its matrix "
                         "products are (DIFFUSE_SIM_MATMUL_RATES gives it rates)");
    DF_TRY(df_matmul_rates_parse("DIFFUSE_SIM_MATMUL_RATES", env, f32, bf16));
    snprintf(how, cap, "given by DIFFUSE_SIM_MATMUL_RATES");
    return DF_OK;
}

/* ---- collectives: the CPU's, on the sim's memory ---------------------------------------- */

struct df_dev_comm {
    sim_device *dev;
    df_dev_comm *cpu;
};

static df_status sim_comm_create(void *impl, const df_host_comm *host, df_dev_comm **out)
{
    sim_device *d = impl;
    df_dev_comm *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "sim: out of memory creating a communicator");
    c->dev = d;
    df_status s = d->cpu->comm_create(d->cpu_dev, host, &c->cpu);
    if (s != DF_OK) {
        df_free(c);
        return s;
    }
    *out = c;
    return DF_OK;
}

static void sim_comm_free(df_dev_comm *c)
{
    c->dev->cpu->comm_free(c->cpu);
    df_free(c);
}

static df_status sim_collective(df_dev_stream *s, df_dev_comm *c, const df_coll *op)
{
    df_coll k = *op;
    if (!(k.buf = resolve(s->dev, op->buf)))
        return DF_E_INTERNAL;
    if (s->capture) /* every rank would have to replay it in step: not recorded */
        s->capture->broken = "a collective inside it";
    return s->dev->cpu->collective(s->cpu, c->cpu, &k);
}

static const df_device_ops sim_ops = {
    .abi_version       = DF_DEVICE_ABI_VERSION,
    .struct_size       = sizeof(df_device_ops),
    .name              = "sim",
    .device_count      = sim_device_count,
    .device_info       = sim_device_info,
    .device_open       = sim_device_open,
    .device_close      = sim_device_close,
    .buffer_alloc      = sim_buffer_alloc,
    .buffer_free       = sim_buffer_free,
    .buffer_drop_cache = sim_drop_cache,
    .stream_create     = sim_stream_create,
    .stream_free       = sim_stream_free,
    .launch            = sim_launch,
    .launch_fused      = sim_launch_fused,
    .copy_h2d          = sim_copy_h2d,
    .copy_d2h          = sim_copy_d2h,
    .copy_d2d          = sim_copy_d2d,
    .host_callback     = sim_host_callback,
    .stream_record     = sim_record_pos,
    .stream_reached    = sim_reached,
    .stream_wait       = sim_wait,
    .stream_sync       = sim_sync,
    .stream_reset      = sim_reset,
    .stream_throttle   = sim_throttle,
    .supports          = sim_supports,
    .matmul_dtype      = sim_matmul_dtype,
    .matmul_rates      = sim_matmul_rates,
    .comm_create       = sim_comm_create,
    .comm_free         = sim_comm_free,
    .collective        = sim_collective,
    .device_counters   = sim_counters,
    .capture_begin     = sim_capture_begin,
    .capture_end       = sim_capture_end,
    .graph_launch      = sim_graph_launch,
    .graph_free        = sim_graph_free,
};

const df_device_ops *df_backend_sim(void)
{
    return &sim_ops;
}
