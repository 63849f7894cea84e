/*
 * The CPU device.
 *
 * Buffers are 64-byte aligned host memory. The stream is one worker thread fed by a queue:
 * submitting returns at once, and kernels run in order on the worker, each using OpenMP
 * inside (the worker sets its own OpenMP thread count, since that setting is per thread).
 * A failing item leaves the stream failed: later items are not run (their done callbacks
 * still are, so references are released) and sync reports the first failure, whose message
 * is carried from the worker thread to the waiting one.
 */
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "core/alloc.h"
#include "core/status.h"

typedef struct cpu_device {
    int threads;
} cpu_device;

struct df_stream {
    pthread_mutex_t mu;
    pthread_cond_t has_work, idle;
    df_work *q; /* ring buffer */
    size_t cap, head, count;
    bool busy, stop;
    uint64_t submitted, completed; /* items ever queued / finished: events are positions */
    df_status failed;
    char failed_msg[1024];
    int threads;
    pthread_t thread;
    df_kernel_env env;
};

static int cpu_device_count(void)
{
    return 1;
}

static df_status cpu_device_open(int index, int threads, void **impl)
{
    cpu_device *d = df_calloc(1, sizeof *d);
    if (!d)
        return df_errorf(DF_E_OOM, "out of memory opening cpu");
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    d->threads = threads > 0 ? threads : (n > 0 ? (int)n : 1);
    *impl = d;
    return DF_OK;
}

static void cpu_device_close(void *impl)
{
    df_free(impl);
}

static df_status cpu_buffer_alloc(void *impl, size_t bytes, void **out)
{
    *out = df_aligned_alloc(bytes);
    return *out ? DF_OK : DF_E_OOM;
}

static void cpu_buffer_free(void *impl, void *p)
{
    df_aligned_free(p);
}

static df_status cpu_copy(void *impl, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
    return DF_OK;
}

static void *worker(void *arg)
{
    df_stream *s = arg;
    omp_set_num_threads(s->threads);
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (s->count == 0 && !s->stop)
            pthread_cond_wait(&s->has_work, &s->mu);
        if (s->count == 0 && s->stop)
            break;
        df_work w = s->q[s->head];
        s->head = (s->head + 1) % s->cap;
        s->count--;
        s->busy = true;
        df_status prior = s->failed;
        pthread_mutex_unlock(&s->mu);

        df_status st = prior;
        if (prior == DF_OK) {
            df_error_clear();
            st = w.run(w.arg, &s->env);
        }
        if (w.done)
            w.done(w.arg, st);

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

static df_status cpu_stream_create(void *impl, df_stream **out)
{
    *out = NULL;
    cpu_device *d = impl;
    df_stream *s = df_calloc(1, sizeof *s);
    if (!s)
        return df_errorf(DF_E_OOM, "out of memory creating a cpu stream");
    s->cap = 256;
    s->q = df_malloc(s->cap * sizeof *s->q);
    if (!s->q) {
        df_free(s);
        return df_errorf(DF_E_OOM, "out of memory creating a cpu stream");
    }
    s->threads = d->threads;
    s->env.threads = d->threads;
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

static void cpu_stream_free(df_stream *s)
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

static df_status cpu_stream_submit(df_stream *s, const df_work *w)
{
    pthread_mutex_lock(&s->mu);
    if (s->count == s->cap) {
        size_t ncap = s->cap * 2;
        df_work *nq = df_malloc(ncap * sizeof *nq);
        if (!nq) {
            pthread_mutex_unlock(&s->mu);
            return df_errorf(DF_E_OOM, "cpu: out of memory growing the stream queue");
        }
        for (size_t i = 0; i < s->count; i++)
            nq[i] = s->q[(s->head + i) % s->cap];
        df_free(s->q);
        s->q = nq;
        s->cap = ncap;
        s->head = 0;
    }
    s->q[(s->head + s->count) % s->cap] = *w;
    s->count++;
    s->submitted++;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&s->mu);
    return DF_OK;
}

static df_status cpu_stream_sync(df_stream *s)
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

static void cpu_stream_throttle(df_stream *s, size_t depth)
{
    pthread_mutex_lock(&s->mu);
    while (s->count + (s->busy ? 1 : 0) > depth && s->failed == DF_OK)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static uint64_t cpu_stream_record(df_stream *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t at = s->submitted;
    pthread_mutex_unlock(&s->mu);
    return at;
}

static bool cpu_stream_reached(df_stream *s, uint64_t at, bool wait)
{
    pthread_mutex_lock(&s->mu);
    while (wait && s->completed < at)
        pthread_cond_wait(&s->idle, &s->mu);
    bool done = s->completed >= at;
    pthread_mutex_unlock(&s->mu);
    return done;
}

static void cpu_stream_reset(df_stream *s)
{
    pthread_mutex_lock(&s->mu);
    s->failed = DF_OK;
    s->failed_msg[0] = '\0';
    pthread_mutex_unlock(&s->mu);
}

static int cpu_device_threads(void *impl)
{
    return ((const cpu_device *)impl)->threads;
}

static df_dtype cpu_matmul_dtype(df_dtype requested)
{
    return df_gemm_compute_dtype(requested);
}

static const df_backend_ops cpu_ops = {
    .abi_version    = DF_BACKEND_ABI_VERSION,
    .name           = "cpu",
    .device_count   = cpu_device_count,
    .device_open    = cpu_device_open,
    .device_close   = cpu_device_close,
    .buffer_alloc   = cpu_buffer_alloc,
    .buffer_free    = cpu_buffer_free,
    .copy_to_device = cpu_copy,
    .copy_to_host   = cpu_copy,
    .stream_create  = cpu_stream_create,
    .stream_free    = cpu_stream_free,
    .stream_submit  = cpu_stream_submit,
    .stream_sync    = cpu_stream_sync,
    .stream_reset   = cpu_stream_reset,
    .stream_throttle = cpu_stream_throttle,
    .stream_record  = cpu_stream_record,
    .stream_reached = cpu_stream_reached,
    .device_threads = cpu_device_threads,
    .kernels        = df_cpu_kernels,
    .run_fused      = df_cpu_fused,
    .matmul_dtype   = cpu_matmul_dtype,
};

const df_backend_ops *df_backend_cpu(void)
{
    return &cpu_ops;
}
