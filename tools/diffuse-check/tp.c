/*
 * diffuse-check --tp N: golden pipeline cases under tensor parallelism.
 *
 *   mpirun -np 2 diffuse-check --tp 2 [--mode ...] CASE_DIR...
 *
 * Every rank runs the same command, as `diffuse generate --tp` does: it loads its slice of
 * the sharded weights (the pipeline is given the world communicator) and takes part in the
 * run; rank 0 compares the outputs and prints the report, the other ranks' stdout goes to
 * /dev/null. Only pipeline cases run split: a case of another kind fails on every rank.
 *
 * Stopping together: a rank that fails inside the pipeline (loading or running) is handled
 * by the pipeline's own agreement points. Around them, every rank meets at fixed points
 * (check_tp_agree: after loading the case, before loading the pipeline, after comparing),
 * where each rank's result and last failure are gathered, so a failure on one rank fails the
 * case on all of them, the message is printed once by rank 0, and no rank waits in a
 * collective the others will never reach.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* What one rank sends at an agreement point. */
typedef struct rank_result {
    int32_t failed;
    char message[508];
} rank_result;

int check_tp_start(int tp, check_tp *out)
{
    *out = (check_tp){.size = 1};
    if (tp <= 1)
        return 0;
    if (!df_dist_launched()) {
        fprintf(stderr, "diffuse-check: --tp %d runs one process per rank; start it as "
                        "mpirun -np %d diffuse-check --tp %d ...\n", tp, tp, tp);
        return 2;
    }
    if (df_dist_init(NULL, NULL, &out->comm) != DF_OK) {
        fprintf(stderr, "diffuse-check: %s\n", df_error_message());
        return 2;
    }
    out->rank = df_comm_rank(out->comm);
    out->size = df_comm_size(out->comm);
    if (out->size != tp) {
        if (out->rank == 0)
            fprintf(stderr, "diffuse-check: --tp %d, but mpirun started %d processes (use "
                            "mpirun -np %d)\n", tp, out->size, tp);
        check_tp_end(out);
        return 2;
    }
    if (out->rank != 0 && !freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "diffuse-check: rank %d: cannot silence stdout\n", out->rank);
        df_comm_abort(out->comm); /* the other ranks would wait for this one */
        return 1;
    }
    return 0;
}

int check_tp_agree(const check_case *c, int rc)
{
    if (!c->comm)
        return rc;
    int n = df_comm_size(c->comm), me = df_comm_rank(c->comm);
    rank_result mine = {.failed = rc != 0}, all[64];
    if (n > (int)(sizeof all / sizeof all[0])) {
        fprintf(stderr, "diffuse-check: at most 64 ranks, not %d\n", n);
        df_comm_abort(c->comm);
        return 1;
    }
    if (rc)
        snprintf(mine.message, sizeof mine.message, "%s", check_last_failure());
    if (df_comm_all_gather(c->comm, &mine, all, sizeof mine) != DF_OK) {
        fprintf(stderr, "diffuse-check: rank %d: %s\n", me, df_error_message());
        df_comm_abort(c->comm);
        return 1;
    }
    int failed = 0;
    for (int r = 0; r < n; r++) {
        if (!all[r].failed)
            continue;
        failed = 1;
        if (me == 0 && r != 0 && !rc) /* rank 0 printed its own failure already */
            check_fail(c, "rank %d: %s", r, all[r].message);
    }
    return failed;
}

void check_tp_end(check_tp *t)
{
    df_comm_free(t->comm);
    t->comm = NULL;
}
