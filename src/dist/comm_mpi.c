/*
 * The MPI communicator (OpenMPI). Collectives are issued from the device stream's thread,
 * one at a time, so MPI is initialised with MPI_THREAD_SERIALIZED at least.
 *
 * Aborting (df_comm_abort) is MPI_Abort: ranks blocked inside a collective that the failing
 * rank will never join can only be freed by ending the job, so the failing rank prints its
 * message first (it is the only one that has it) and the launcher ends every rank.
 */
#include <diffuse/dist.h>

#include <mpi.h>
#include <stdbool.h>
#include <stdio.h>

#include "core/alloc.h"
#include "core/comm.h"
#include "core/status.h"

static int live_comms;

static df_status check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return DF_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return df_errorf(DF_E_DEVICE, "MPI %s failed: %.*s", what, len, msg);
}

static df_status m_all_reduce(df_comm *c, float *buf, int64_t n)
{
    (void)c;
    for (int64_t done = 0; done < n;) { /* MPI counts are int */
        int chunk = n - done > (1 << 30) ? (1 << 30) : (int)(n - done);
        DF_TRY(check(MPI_Allreduce(MPI_IN_PLACE, buf + done, chunk, MPI_FLOAT, MPI_SUM,
                                   MPI_COMM_WORLD), "all-reduce"));
        done += chunk;
    }
    return DF_OK;
}

static df_status m_broadcast(df_comm *c, void *buf, size_t bytes, int root)
{
    (void)c;
    for (size_t done = 0; done < bytes;) {
        int chunk = bytes - done > (1u << 30) ? (1 << 30) : (int)(bytes - done);
        DF_TRY(check(MPI_Bcast((char *)buf + done, chunk, MPI_BYTE, root, MPI_COMM_WORLD),
                     "broadcast"));
        done += (size_t)chunk;
    }
    return DF_OK;
}

static df_status m_all_gather(df_comm *c, const void *send, void *recv, size_t bytes)
{
    (void)c;
    if (bytes > (1u << 30))
        return df_errorf(DF_E_ARG, "all-gather of %zu bytes per rank is too large", bytes);
    return check(MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                               MPI_COMM_WORLD), "all-gather");
}

static df_status m_barrier(df_comm *c)
{
    (void)c;
    return check(MPI_Barrier(MPI_COMM_WORLD), "barrier");
}

static void m_abort(df_comm *c)
{
    fprintf(stderr, "diffuse: rank %d of %d: %s; stopping all ranks\n", c->rank, c->size,
            df_error_message());
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

static void m_free(df_comm *c)
{
    df_free(c);
    if (--live_comms == 0) {
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized)
            MPI_Finalize();
    }
}

static const df_comm_ops mpi_ops = {
    .all_reduce_f32 = m_all_reduce,
    .broadcast = m_broadcast,
    .all_gather = m_all_gather,
    .barrier = m_barrier,
    .abort = m_abort,
    .free = m_free,
};

df_status df_dist_init(int *argc, char ***argv, df_comm **out)
{
    *out = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        DF_TRY(check(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided), "init"));
        if (provided < MPI_THREAD_SERIALIZED)
            return df_errorf(DF_E_UNSUPPORTED, "MPI provides thread level %d; diffuse needs "
                             "MPI_THREAD_SERIALIZED", provided);
        /* Report errors as return codes: a failing rank must not hang the others. */
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    }
    df_comm *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "out of memory");
    c->ops = &mpi_ops;
    MPI_Comm_rank(MPI_COMM_WORLD, &c->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &c->size);
    live_comms++;
    *out = c;
    return DF_OK;
}
