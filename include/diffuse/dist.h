/*
 * Processes working together: communicators and tensor parallelism.
 *
 * A df_comm connects `size` ranks. Two kinds exist: MPI (one process per device, started by
 * mpirun) and threads (ranks inside one process, for tests and for trying a tensor-parallel
 * plan without mpirun). A context given a communicator (df_ctx_set_comm) can run
 * df_all_reduce, which works in every execution mode like any other op.
 */
#ifndef DIFFUSE_DIST_H
#define DIFFUSE_DIST_H

#include <stddef.h>
#include <stdint.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_comm df_comm;

/* Initialises MPI (thread level "serialized" or better) and returns the world
 * communicator. DF_E_UNSUPPORTED when diffuse was built without MPI. */
DF_API df_status df_dist_init(int *argc, char ***argv, df_comm **out);
/* Whether this process was started by an MPI launcher (mpirun sets its variables). */
DF_API bool df_dist_launched(void);
/* n communicators of one in-process group; rank i must be used by one thread. */
DF_API df_status df_comm_create_threads(int n, df_comm **out);

DF_API int df_comm_rank(const df_comm *c);
DF_API int df_comm_size(const df_comm *c);
/* Sums n floats across ranks, in place, on every rank. */
DF_API df_status df_comm_all_reduce_f32(df_comm *c, float *buf, int64_t n);
/* Copies `bytes` from rank `root` to every rank. */
DF_API df_status df_comm_broadcast(df_comm *c, void *buf, size_t bytes, int root);
/* Every rank gets every rank's `bytes`, in rank order, in recv (size * bytes). */
DF_API df_status df_comm_all_gather(df_comm *c, const void *send, void *recv, size_t bytes);
DF_API df_status df_comm_barrier(df_comm *c);
/* The status of the lowest failing rank (DF_OK when all are fine): lets every rank stop
 * together when one fails. A rank that failed keeps its own status and message; the others
 * get "rank K: <rank K's message>", so rank 0 can print the failure once. A collective:
 * every rank must call it at the same point. */
DF_API df_status df_comm_agree(df_comm *c, df_status local);
/* Stops every rank, for a failure between two agreement points (other ranks may wait in a
 * collective this rank will not join). MPI: prints "diffuse: rank K of N: <the calling
 * thread's error message>" to stderr and calls MPI_Abort, which ends the whole job (this
 * process included). Threads: every collective of every rank, waiting or later, fails at
 * once with DF_E_STATE. No-op for NULL or a single rank. */
DF_API void df_comm_abort(df_comm *c);
/* Frees a communicator; for MPI, the last one finalises MPI. NULL is fine. */
DF_API void df_comm_free(df_comm *c);

/* Binds a communicator to a context (NULL: none); the context does not own it. */
DF_API void df_ctx_set_comm(df_ctx *ctx, df_comm *comm);
DF_API df_comm *df_ctx_comm(const df_ctx *ctx);
/* Sum of x over the ranks of the context's communicator (x itself without one). */
DF_API df_tensor *df_all_reduce(df_ctx *ctx, df_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
