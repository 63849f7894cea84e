/* diffuse generate --tp N: starting the ranks, and which rank speaks (tp.c). */
#ifndef DIFFUSE_CLI_TP_H
#define DIFFUSE_CLI_TP_H

#include <diffuse/diffuse.h>

typedef struct cli_tp {
    df_comm *comm; /* NULL without --tp */
    int rank, size;
} cli_tp;

/* On ranks other than 0 of an mpirun launch, sends stderr to /dev/null while the arguments
 * are parsed (they are the same on every rank, so rank 0's usage errors suffice); returns
 * what cli_tp_unmute needs. */
int cli_tp_mute_others(void);
void cli_tp_unmute(int saved);

/* Checks --tp against the launch and starts the ranks: `tp` 0 means no --tp. Sets *threads
 * to this rank's share of the cores when it is 0. Returns 0, or the exit status after
 * printing the reason once (2: usage, 1: failure). */
int cli_tp_start(int tp, int *threads, cli_tp *out);
/* Ends the ranks (MPI_Finalize once every rank got here). */
void cli_tp_end(cli_tp *t);

#endif
