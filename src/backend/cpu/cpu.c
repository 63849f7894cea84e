/*
 * The CPU device: the worked example of the device interface (docs/backends.md).
 *
 * Buffers are 64-byte aligned host memory, or host memory the backend wraps in place (a
 * mapped weight: its "upload" is the mapping itself). A stream is one worker thread fed by
 * a queue of items: kernels (the node copied in by value), fused programs, copies, waits
 * on other streams, host callbacks, collectives. launch returns at once; kernels run in
 * order on the worker, each using OpenMP inside (the worker sets its own OpenMP thread
 * count, since that setting is per thread). A failing item leaves the stream failed:
 * later work is skipped (host callbacks still run, so the runtime's references are
 * released) and sync reports the first failure, whose message is carried from the worker
 * thread to the waiting one. Positions (events) count the items queued and finished.
 */
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_int8.h"
#include "backend/registry.h"
#include "core/alloc.h"
#include "core/status.h"

typedef struct cpu_device {
    int threads;
    int int8_path;      /* df_kernel_env.int8_path of its streams */
    int64_t int8_group; /* df_kernel_env.int8_group of its streams */
} cpu_device;

struct df_dev_comm {
    df_host_comm host;
};

enum { IT_KERNEL, IT_FUSED, IT_CALLBACK, IT_COPY, IT_WAIT, IT_DROP, IT_COLL };

typedef struct item {
    int kind;
    union {
        df_node node;
        df_fused *fused; /* a copy, freed once run */
        struct {
            void (*fn)(void *arg, df_status st);
            void *arg;
        } cb;
        struct {
            void *dst;
            const void *src;
            size_t bytes;
        } copy;
        struct {
            df_dev_stream *other;
            uint64_t at;
        } wait;
        df_dev_buffer *drop;
        struct {
            df_dev_comm *comm;
            df_coll op;
        } coll;
    } u;
} item;

struct df_dev_stream {
    pthread_mutex_t mu;
    pthread_cond_t has_work, idle;
    item *q; /* ring buffer */
    size_t cap, head, count;
    bool busy, stop;
    uint64_t submitted, completed; /* items ever queued / finished: events are positions */
    df_status failed;
    char failed_msg[1024];
    int threads;
    pthread_t thread;
    df_kernel_env env;
    _Atomic int64_t waited_ns; /* time the worker spent in waits on other streams */
};

/* ---- running a node (the sim backend runs its kernels the same way) -------------------- */

df_status df_cpu_run_node(const df_node *n, df_kernel_env *env)
{
    df_kernel_fn k = (unsigned)n->op < DF_OP_COUNT ? df_cpu_kernels[n->op] : NULL;
    if (!k)
        return df_errorf(DF_E_UNSUPPORTED, "op '%s' has no cpu kernel", df_vocab_op_name(n->op));
    return k(n, env);
}

df_status df_cpu_run_fused(const df_fused *f, df_kernel_env *env)
{
    return df_cpu_fused(f, env);
}

bool df_cpu_supports(const df_node *n)
{
    return (unsigned)n->op < DF_OP_COUNT && df_cpu_kernels[n->op] != NULL;
}

/* ---- device ---------------------------------------------------------------------------- */

static int cpu_device_count(void)
{
    return 1;
}

static int online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

static df_status cpu_device_info(int index, df_device_info *out)
{
    *out = (df_device_info){.kind = DF_DEVICE_KIND_CPU, .alignment = 64,
                            .compute_units = online_cpus()};
    char model[80] = "CPU";
    FILE *f = fopen("/proc/cpuinfo", "r");
    for (char line[256]; f && fgets(line, sizeof line, f);) {
        char *colon = strchr(line, ':');
        if (strncmp(line, "model name", 10) == 0 && colon) {
            colon += colon[1] == ' ' ? 2 : 1;
            colon[strcspn(colon, "\n")] = '\0';
            snprintf(model, sizeof model, "%s", colon);
            break;
        }
    }
    if (f)
        fclose(f);
    snprintf(out->name, sizeof out->name, "%s (%d threads)", model, out->compute_units);
    long pages = sysconf(_SC_PHYS_PAGES), avail = sysconf(_SC_AVPHYS_PAGES);
    long page = sysconf(_SC_PAGESIZE);
    out->memory_bytes = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
    out->memory_free = avail > 0 && page > 0 ? (uint64_t)avail * (uint64_t)page : 0;
    out->caps = DF_CAP_FUSED | DF_CAP_FUSED_HEAD | DF_CAP_EPI_GELU_TANH | DF_CAP_EPI_SILU |
                DF_CAP_EPI_GELU | DF_CAP_EPI_GATED_RESIDUAL | DF_CAP_OUT_STRIDED |
                DF_CAP_OUT_BF16 | DF_CAP_HOST_MEMORY | DF_CAP_COLLECTIVES | DF_CAP_PREPACK |
                DF_CAP_INT8;
    (void)index;
    return DF_OK;
}

/* Where the value of `key` starts in "key=value,key=value", or NULL. */
static const char *option(const char *options, const char *key)
{
    size_t n = strlen(key);
    for (const char *p = options; p && *p;) {
        if (strncmp(p, key, n) == 0 && p[n] == '=')
            return p + n + 1;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return NULL;
}

static long option_int(const char *options, const char *key)
{
    const char *v = option(options, key);
    return v ? strtol(v, NULL, 10) : -1;
}

/* The int8 settings of the options (df_kernel_env says what they mean): int8_path=NAME (a
 * kernel this CPU has) and int8_group=N (32 to 256, a multiple of 4, or -1 for the whole k). */
static df_status int8_options(cpu_device *d, const char *options)
{
    const char *v = option(options, "int8_path");
    if (v) {
        char name[32];
        size_t n = strcspn(v, ",");
        snprintf(name, sizeof name, "%.*s", (int)(n < sizeof name ? n : sizeof name - 1), v);
        df_i8_path path;
        DF_TRY(df_i8_path_parse(name, &path));
        d->int8_path = (int)path;
    }
    if (option(options, "int8_group")) {
        long g = option_int(options, "int8_group");
        if (g != -1 && (g < 32 || g > 256 || g % 4 != 0))
            return df_errorf(DF_E_ARG,
                             "cpu: int8_group must be 32 to 256 and a multiple of 4, or -1 "
                             "for the whole k, not %ld",
                             g);
        d->int8_group = g;
    }
    return DF_OK;
}

static df_status cpu_device_open(int index, const char *options, void **impl)
{
    *impl = NULL;
    cpu_device *d = df_calloc(1, sizeof *d);
    if (!d)
        return df_errorf(DF_E_OOM, "out of memory opening cpu");
    long threads = option_int(options, "threads");
    d->threads = threads > 0 ? (int)threads : online_cpus();
    df_status s = int8_options(d, options);
    if (s != DF_OK) {
        df_free(d);
        return s;
    }
    *impl = d;
    return DF_OK;
}

static void cpu_device_close(void *impl)
{
    df_free(impl);
}

static df_status cpu_buffer_alloc(void *impl, uint64_t bytes, df_dev_buffer **out)
{
    df_dev_buffer *b = df_calloc(1, sizeof *b);
    void *p = b ? df_aligned_alloc(bytes ? bytes : 1) : NULL;
    if (!p) {
        df_free(b);
        return DF_E_OOM; /* the caching allocator writes the message */
    }
    b->ptr = p;
    b->bytes = bytes;
    *out = b;
    return DF_OK;
}

static void cpu_buffer_free(void *impl, df_dev_buffer *b)
{
    if (!b)
        return;
    df_cpu_drop_derived(b);
    if (!b->wrapped)
        df_aligned_free(b->ptr);
    df_free(b);
}

static df_status cpu_buffer_wrap_host(void *impl, void *host, uint64_t bytes,
                                      df_dev_buffer **out)
{
    df_dev_buffer *b = df_calloc(1, sizeof *b);
    if (!b)
        return df_errorf(DF_E_OOM, "cpu: out of memory wrapping host memory");
    df_cpu_buffer_init(b, host, bytes);
    *out = b;
    return DF_OK;
}

static void *cpu_buffer_host_ptr(void *impl, df_dev_buffer *b)
{
    return b->ptr;
}

/* ---- streams --------------------------------------------------------------------------- */

static void cpu_coll_run(const df_dev_comm *c, const df_coll *op, df_status *st);

static df_status run_item(df_dev_stream *s, item *it)
{
    switch (it->kind) {
    case IT_KERNEL: {
        df_status st = df_cpu_run_node(&it->u.node, &s->env);
        return st == DF_OK ? st : df_error_context(st, "op '%s'", df_vocab_op_name(it->u.node.op));
    }
    case IT_FUSED: {
        df_status st = df_cpu_fused(it->u.fused, &s->env);
        return st == DF_OK ? st : df_error_context(st, "fused kernel");
    }
    case IT_CALLBACK:
    case IT_WAIT: /* run by the worker itself */
        return DF_OK;
    case IT_COPY:
        memcpy(it->u.copy.dst, it->u.copy.src, it->u.copy.bytes);
        return DF_OK;
    case IT_DROP:
        df_cpu_drop_derived(it->u.drop);
        return DF_OK;
    case IT_COLL: {
        df_status st = DF_OK;
        cpu_coll_run(it->u.coll.comm, &it->u.coll.op, &st);
        return st;
    }
    }
    return DF_OK;
}

static bool stream_reached_locked(df_dev_stream *s, uint64_t at, bool wait);

static void *worker(void *arg)
{
    df_dev_stream *s = arg;
    omp_set_num_threads(s->threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stop)
            pthread_cond_wait(&s->has_work, &s->mu);
        if (s->count == 0 && s->stop)
            break;
        item it = s->q[s->head]; /* a copy: the queue may grow while this runs */
        int kind = it.kind;
        s->head = (s->head + 1) % s->cap;
        s->count--;
        s->busy = true;
        df_status prior = s->failed;
        pthread_mutex_unlock(&s->mu);

        df_status st = prior;
        if (kind == IT_CALLBACK) {
            it.u.cb.fn(it.u.cb.arg, prior);
        } else if (kind == IT_WAIT) {
            df_dev_stream *o = it.u.wait.other;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            pthread_mutex_lock(&o->mu);
            stream_reached_locked(o, it.u.wait.at, true);
            pthread_mutex_unlock(&o->mu);
            clock_gettime(CLOCK_MONOTONIC, &t1);
            atomic_fetch_add(&s->waited_ns, (int64_t)(t1.tv_sec - t0.tv_sec) * 1000000000 +
                                                (t1.tv_nsec - t0.tv_nsec));
        } else if (prior == DF_OK) {
            df_error_clear();
            st = run_item(s, &it);
        }
        if (kind == IT_FUSED)
            df_free(it.u.fused);

        pthread_mutex_lock(&s->mu);
        if (st != DF_OK && s->failed == DF_OK) {
            s->failed = st;
            snprintf(s->failed_msg, sizeof s->failed_msg, "%s", df_error_message());
        }
        s->busy = false;
        s->completed++;
        pthread_cond_broadcast(&s->idle); /* sync waits for empty, throttle for shallower */
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static df_status cpu_stream_create(void *impl, int kind, df_dev_stream **out)
{
    *out = NULL;
    cpu_device *d = impl;
    df_dev_stream *s = df_calloc(1, sizeof *s);
    if (!s)
        return df_errorf(DF_E_OOM, "out of memory creating a cpu stream");
    s->cap = 256;
    s->q = df_malloc(s->cap * sizeof *s->q);
    if (!s->q) {
        df_free(s);
        return df_errorf(DF_E_OOM, "out of memory creating a cpu stream");
    }
    s->threads = kind == DF_STREAM_COPY ? 1 : d->threads;
    s->env.threads = s->threads;
    s->env.int8_path = d->int8_path;
    s->env.int8_group = d->int8_group;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->has_work, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, worker, s) != 0) {
        df_free(s->q);
        df_free(s);
        return df_errorf(DF_E_DEVICE, "cpu: could not start the stream thread");
    }
    *out = s;
    return DF_OK;
}

static void cpu_stream_free(df_dev_stream *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->has_work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->has_work);
    pthread_cond_destroy(&s->idle);
    df_aligned_free(s->env.scratch);
    df_free(s->q);
    df_free(s);
}

/* A free slot at the queue's tail (the caller fills it and calls push_done), or NULL. */
static item *push_begin(df_dev_stream *s)
{
    pthread_mutex_lock(&s->mu);
    if (s->count == s->cap) {
        size_t ncap = s->cap * 2;
        item *nq = df_malloc(ncap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&s->mu);
            df_errorf(DF_E_OOM, "cpu: out of memory growing the stream queue");
            return NULL;
        }
        for (size_t i = 0; i < s->count; i++)
            nq[i] = s->q[(s->head + i) % s->cap];
        df_free(s->q);
        s->q = nq;
        s->cap = ncap;
        s->head = 0;
    }
    return &s->q[(s->head + s->count) % s->cap];
}

static df_status push_done(df_dev_stream *s)
{
    s->count++;
    s->submitted++;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->mu);
    return DF_OK;
}

static df_status cpu_launch(df_dev_stream *s, const df_node *n)
{
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_KERNEL;
    it->u.node = *n;
    return push_done(s);
}

static df_status cpu_launch_fused(df_dev_stream *s, const df_fused *f)
{
    df_fused *copy = df_malloc(sizeof *copy);
    if (!copy)
        return df_errorf(DF_E_OOM, "cpu: out of memory queuing a fused kernel");
    *copy = *f;
    item *it = push_begin(s);
    if (!it) {
        df_free(copy);
        return DF_E_OOM;
    }
    it->kind = IT_FUSED;
    it->u.fused = copy;
    return push_done(s);
}

static df_status push_copy(df_dev_stream *s, void *dst, const void *src, uint64_t bytes)
{
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_COPY;
    it->u.copy.dst = dst;
    it->u.copy.src = src;
    it->u.copy.bytes = (size_t)bytes;
    return push_done(s);
}

static df_status cpu_copy_h2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t off,
                              const void *src, uint64_t bytes)
{
    return push_copy(s, (char *)dst->ptr + off, src, bytes);
}

static df_status cpu_copy_d2h(df_dev_stream *s, void *dst, df_dev_buffer *src, uint64_t off,
                              uint64_t bytes)
{
    return push_copy(s, dst, (const char *)src->ptr + off, bytes);
}

static df_status cpu_copy_d2d(df_dev_stream *s, df_dev_buffer *dst, uint64_t doff,
                              df_dev_buffer *src, uint64_t soff, uint64_t bytes)
{
    return push_copy(s, (char *)dst->ptr + doff, (const char *)src->ptr + soff, bytes);
}

static df_status cpu_host_callback(df_dev_stream *s, void (*fn)(void *, df_status), void *arg)
{
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_CALLBACK;
    it->u.cb.fn = fn;
    it->u.cb.arg = arg;
    return push_done(s);
}

static df_status cpu_buffer_drop_cache(df_dev_stream *s, df_dev_buffer *b)
{
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_DROP;
    it->u.drop = b;
    return push_done(s);
}

static df_status cpu_stream_wait(df_dev_stream *s, df_dev_stream *other, uint64_t at)
{
    if (other == s)
        return DF_OK; /* a stream is already in its own order */
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_WAIT;
    it->u.wait.other = other;
    it->u.wait.at = at;
    return push_done(s);
}

static df_status cpu_stream_sync(df_dev_stream *s)
{
    pthread_mutex_lock(&s->mu);
    while (s->count > 0 || s->busy)
        pthread_cond_wait(&s->idle, &s->mu);
    df_status st = s->failed;
    if (st != DF_OK)
        df_errorf(st, "%s", s->failed_msg);
    pthread_mutex_unlock(&s->mu);
    return st;
}

static void cpu_stream_throttle(df_dev_stream *s, size_t depth)
{
    pthread_mutex_lock(&s->mu);
    while (s->count + (s->busy ? 1 : 0) > depth && s->failed == DF_OK)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static uint64_t cpu_stream_record(df_dev_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t at = s->submitted;
    pthread_mutex_unlock(&s->mu);
    return at;
}

static bool stream_reached_locked(df_dev_stream *s, uint64_t at, bool wait)
{
    while (wait && s->completed < at)
        pthread_cond_wait(&s->idle, &s->mu);
    return s->completed >= at;
}

static bool cpu_stream_reached(df_dev_stream *s, uint64_t at, bool wait)
{
    pthread_mutex_lock(&s->mu);
    bool done = stream_reached_locked(s, at, wait);
    pthread_mutex_unlock(&s->mu);
    return done;
}

int64_t df_cpu_stream_waited_ns(df_dev_stream *s)
{
    return atomic_load(&s->waited_ns);
}

static void cpu_stream_reset(df_dev_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->failed = DF_OK;
    s->failed_msg[0] = '\0';
    pthread_mutex_unlock(&s->mu);
}

/* ---- what it computes, collectives ----------------------------------------------------- */

static bool cpu_supports(void *impl, const df_node *n)
{
    return df_cpu_supports(n);
}

static df_dtype cpu_matmul_dtype(void *impl, df_dtype requested)
{
    return df_gemm_compute_dtype(requested);
}

static df_status cpu_matmul_rates(void *impl, double *f32, double *bf16, char *how, size_t cap)
{
    const cpu_device *d = impl;
    return df_cpu_matmul_rates(d->threads, f32, bf16, how, cap);
}

static df_status cpu_comm_create(void *impl, const df_host_comm *host, df_dev_comm **out)
{
    df_dev_comm *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "cpu: out of memory creating a communicator");
    c->host = *host;
    *out = c;
    return DF_OK;
}

static void cpu_comm_free(df_dev_comm *c)
{
    df_free(c);
}

static void cpu_coll_run(const df_dev_comm *c, const df_coll *op, df_status *st)
{
    const df_host_comm *h = &c->host;
    char *p = (char *)op->buf->ptr + op->offset;
    size_t es = df_dtype_size(op->dtype);
    if (h->size <= 1)
        return;
    switch (op->kind) {
    case DF_COLL_ALL_REDUCE_SUM:
        *st = op->dtype == DF_DTYPE_F32
                  ? h->all_reduce_f32(h->self, (float *)p, op->count)
                  : df_errorf(DF_E_UNSUPPORTED, "all_reduce of %s", df_dtype_name(op->dtype));
        return;
    case DF_COLL_ALL_GATHER: {
        size_t n = (size_t)op->count * es;
        void *mine = df_malloc(n);
        if (!mine) {
            *st = df_errorf(DF_E_OOM, "all_gather: out of memory");
            return;
        }
        memcpy(mine, p + (size_t)h->rank * n, n);
        *st = h->all_gather(h->self, mine, p, n);
        df_free(mine);
        return;
    }
    case DF_COLL_BROADCAST:
        *st = h->broadcast(h->self, p, (size_t)op->count * es, op->root);
        return;
    }
}

static df_status cpu_collective(df_dev_stream *s, df_dev_comm *c, const df_coll *op)
{
    item *it = push_begin(s);
    if (!it)
        return DF_E_OOM;
    it->kind = IT_COLL;
    it->u.coll.comm = c;
    it->u.coll.op = *op;
    return push_done(s);
}

static const df_device_ops cpu_ops = {
    .abi_version       = DF_DEVICE_ABI_VERSION,
    .struct_size       = sizeof(df_device_ops),
    .name              = "cpu",
    .device_count      = cpu_device_count,
    .device_info       = cpu_device_info,
    .device_open       = cpu_device_open,
    .device_close      = cpu_device_close,
    .buffer_alloc      = cpu_buffer_alloc,
    .buffer_free       = cpu_buffer_free,
    .buffer_wrap_host  = cpu_buffer_wrap_host,
    .buffer_host_ptr   = cpu_buffer_host_ptr,
    .buffer_drop_cache = cpu_buffer_drop_cache,
    .stream_create     = cpu_stream_create,
    .stream_free       = cpu_stream_free,
    .launch            = cpu_launch,
    .launch_fused      = cpu_launch_fused,
    .copy_h2d          = cpu_copy_h2d,
    .copy_d2h          = cpu_copy_d2h,
    .copy_d2d          = cpu_copy_d2d,
    .host_callback     = cpu_host_callback,
    .stream_record     = cpu_stream_record,
    .stream_reached    = cpu_stream_reached,
    .stream_wait       = cpu_stream_wait,
    .stream_sync       = cpu_stream_sync,
    .stream_reset      = cpu_stream_reset,
    .stream_throttle   = cpu_stream_throttle,
    .supports          = cpu_supports,
    .matmul_dtype      = cpu_matmul_dtype,
    .matmul_rates      = cpu_matmul_rates,
    .comm_create       = cpu_comm_create,
    .comm_free         = cpu_comm_free,
    .collective        = cpu_collective,
};

const df_device_ops *df_backend_cpu(void)
{
    return &cpu_ops;
}
