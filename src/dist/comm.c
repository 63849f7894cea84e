/*
 * Communicators: the public functions, and the in-process implementation.
 *
 * The thread communicator connects n ranks that are threads of one process. Each
 * collective is two barrier phases over shared slots: every rank publishes its buffer
 * pointer, waits, reads the others, waits again so no buffer is reused too early. The
 * all-reduce sums in rank order on every rank, so every rank gets bit-identical results
 * (as MPI's reduction does). The barrier is a mutex and a condition variable rather than a
 * pthread barrier so that df_comm_abort can wake ranks waiting in it: every collective then
 * fails at once.
 *
 * df_comm_agree gathers every rank's status; when one failed, the lowest failing rank also
 * broadcasts its error message, so every rank can report the same message (and a program
 * prints it once, from rank 0).
 */
#include <diffuse/dist.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/comm.h"
#include "core/status.h"

typedef struct hub {
    pthread_mutex_t bar_mu; /* the barrier: */
    pthread_cond_t bar_cv;
    int waiting;
    uint64_t generation;
    bool aborted;
    int n, refs;
    pthread_mutex_t mu;
    const void **slot;
    int64_t *value;
} hub;

static hub *hub_of(df_comm *c)
{
    return c->impl;
}

/* Waits until every rank arrived; false (at once) once a rank aborted. */
static bool hub_wait(hub *h)
{
    pthread_mutex_lock(&h->bar_mu);
    uint64_t gen = h->generation;
    if (!h->aborted && ++h->waiting == h->n) {
        h->waiting = 0;
        h->generation++;
        pthread_cond_broadcast(&h->bar_cv);
    } else {
        while (gen == h->generation && !h->aborted)
            pthread_cond_wait(&h->bar_cv, &h->bar_mu);
    }
    bool ok = !h->aborted;
    pthread_mutex_unlock(&h->bar_mu);
    return ok;
}

static df_status aborted(void)
{
    return df_errorf(DF_E_STATE, "a rank of the communicator aborted");
}

static df_status t_all_reduce(df_comm *c, float *buf, int64_t n)
{
    hub *h = hub_of(c);
    /* Each rank sums every element into a scratch copy, in rank order. */
    float *tmp = df_malloc((size_t)(n ? n : 1) * sizeof *tmp);
    h->slot[c->rank] = buf;
    if (!hub_wait(h)) {
        df_free(tmp);
        return aborted();
    }
    df_status s = tmp ? DF_OK : df_errorf(DF_E_OOM, "all_reduce: out of memory");
    if (tmp)
        for (int64_t i = 0; i < n; i++) {
            float acc = 0;
            for (int r = 0; r < h->n; r++)
                acc += ((const float *)h->slot[r])[i];
            tmp[i] = acc;
        }
    bool ok = hub_wait(h); /* everyone has read every buffer */
    if (tmp && ok)
        memcpy(buf, tmp, (size_t)n * sizeof *tmp);
    df_free(tmp);
    if (!ok || !hub_wait(h))
        return aborted();
    return s;
}

static df_status t_broadcast(df_comm *c, void *buf, size_t bytes, int root)
{
    hub *h = hub_of(c);
    if (c->rank == root)
        h->slot[root] = buf;
    if (!hub_wait(h))
        return aborted();
    if (c->rank != root)
        memcpy(buf, h->slot[root], bytes);
    return hub_wait(h) ? DF_OK : aborted();
}

static df_status t_all_gather(df_comm *c, const void *send, void *recv, size_t bytes)
{
    hub *h = hub_of(c);
    h->slot[c->rank] = send;
    if (!hub_wait(h))
        return aborted();
    for (int r = 0; r < h->n; r++)
        memcpy((char *)recv + (size_t)r * bytes, h->slot[r], bytes);
    return hub_wait(h) ? DF_OK : aborted();
}

static df_status t_barrier(df_comm *c)
{
    return hub_wait(hub_of(c)) ? DF_OK : aborted();
}

static void t_abort(df_comm *c)
{
    hub *h = hub_of(c);
    pthread_mutex_lock(&h->bar_mu);
    h->aborted = true;
    pthread_cond_broadcast(&h->bar_cv);
    pthread_mutex_unlock(&h->bar_mu);
}

static void hub_free(hub *h)
{
    pthread_cond_destroy(&h->bar_cv);
    pthread_mutex_destroy(&h->bar_mu);
    pthread_mutex_destroy(&h->mu);
    df_free(h->slot);
    df_free(h->value);
    df_free(h);
}

static void t_free(df_comm *c)
{
    hub *h = hub_of(c);
    pthread_mutex_lock(&h->mu);
    int left = --h->refs;
    pthread_mutex_unlock(&h->mu);
    if (left == 0)
        hub_free(h);
    df_free(c);
}

static const df_comm_ops thread_ops = {
    .all_reduce_f32 = t_all_reduce,
    .broadcast = t_broadcast,
    .all_gather = t_all_gather,
    .barrier = t_barrier,
    .abort = t_abort,
    .free = t_free,
};

df_status df_comm_create_threads(int n, df_comm **out)
{
    if (n < 1 || n > 1024)
        return df_errorf(DF_E_ARG, "thread communicator: %d ranks (1..1024)", n);
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    hub *h = df_calloc(1, sizeof *h);
    if (h) {
        h->slot = df_calloc((size_t)n, sizeof *h->slot);
        h->value = df_calloc((size_t)n, sizeof *h->value);
    }
    if (!h || !h->slot || !h->value) {
        if (h) {
            df_free(h->slot);
            df_free(h->value);
        }
        df_free(h);
        return df_errorf(DF_E_OOM, "thread communicator: out of memory");
    }
    h->n = n;
    h->refs = n;
    pthread_mutex_init(&h->bar_mu, NULL);
    pthread_cond_init(&h->bar_cv, NULL);
    pthread_mutex_init(&h->mu, NULL);
    for (int i = 0; i < n; i++) {
        out[i] = df_calloc(1, sizeof **out);
        if (!out[i]) {
            for (int j = 0; j < i; j++)
                df_free(out[j]);
            hub_free(h);
            return df_errorf(DF_E_OOM, "thread communicator: out of memory");
        }
        *out[i] = (df_comm){.ops = &thread_ops, .rank = i, .size = n, .impl = h};
    }
    return DF_OK;
}

int df_comm_rank(const df_comm *c)
{
    return c ? c->rank : 0;
}

int df_comm_size(const df_comm *c)
{
    return c ? c->size : 1;
}

df_status df_comm_all_reduce_f32(df_comm *c, float *buf, int64_t n)
{
    return c->size == 1 ? DF_OK : c->ops->all_reduce_f32(c, buf, n);
}

df_status df_comm_broadcast(df_comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->size)
        return df_errorf(DF_E_ARG, "broadcast: root %d of %d ranks", root, c->size);
    return c->size == 1 ? DF_OK : c->ops->broadcast(c, buf, bytes, root);
}

df_status df_comm_all_gather(df_comm *c, const void *send, void *recv, size_t bytes)
{
    if (c->size == 1) {
        memcpy(recv, send, bytes);
        return DF_OK;
    }
    return c->ops->all_gather(c, send, recv, bytes);
}

df_status df_comm_barrier(df_comm *c)
{
    return c->size == 1 ? DF_OK : c->ops->barrier(c);
}

df_status df_comm_agree(df_comm *c, df_status local)
{
    if (!c || c->size == 1)
        return local;
    int32_t mine = (int32_t)local, *all = df_malloc((size_t)c->size * sizeof *all);
    if (!all)
        return df_errorf(DF_E_OOM, "agree: out of memory");
    df_status s = c->ops->all_gather(c, &mine, all, sizeof mine);
    int first = -1; /* the lowest failing rank */
    for (int r = 0; s == DF_OK && r < c->size && first < 0; r++)
        if (all[r] != DF_OK)
            first = r;
    df_status theirs = first >= 0 ? (df_status)all[first] : DF_OK;
    df_free(all);
    if (s != DF_OK || first < 0)
        return s != DF_OK ? s : DF_OK;
    /* Every rank knows `first`, so all of them take part in this broadcast. */
    char msg[768] = {0};
    if (c->rank == first)
        snprintf(msg, sizeof msg, "%s", df_error_message());
    s = c->ops->broadcast(c, msg, sizeof msg, first);
    if (local != DF_OK)
        return local; /* keeps its own message */
    if (s != DF_OK)
        return s;
    return df_errorf(theirs, "rank %d: %s", first, msg[0] ? msg : df_status_name(theirs));
}

void df_comm_abort(df_comm *c)
{
    if (c && c->size > 1 && c->ops->abort)
        c->ops->abort(c);
}

void df_comm_free(df_comm *c)
{
    if (c)
        c->ops->free(c);
}

bool df_dist_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i]))
            return true;
    return false;
}

#ifndef DF_HAVE_MPI
df_status df_dist_init(int *argc, char ***argv, df_comm **out)
{
    (void)argc;
    (void)argv;
    *out = NULL;
    return df_errorf(DF_E_UNSUPPORTED, "diffuse was built without MPI (install libopenmpi-dev "
                     "and rebuild for tensor parallelism across processes)");
}
#endif
