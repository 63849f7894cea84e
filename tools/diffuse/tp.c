/*
 * diffuse generate --tp N: tensor parallelism over MPI, one process per rank.
 *
 * `mpirun -np N diffuse generate --tp N ...` starts N copies of the same command. Each
 * checks the launch (--tp without mpirun, or a rank count other than N, is a usage error;
 * so is mpirun with several processes but no --tp, which would only repeat the same work),
 * initialises MPI through df_dist_init and hands the communicator to the pipeline. Every
 * rank parses the same arguments, so only rank 0 prints usage errors: the others send
 * stderr to /dev/null while parsing (and get it back afterwards, so a rank that has to stop
 * the job can still say why).
 *
 * Threads per rank (--threads, when not given): if the launcher bound the rank to some cores
 * (mpirun --bind-to core --map-by slot:PE=T, or a cpuset), the cores it may run on;
 * otherwise the machine's cores divided by the ranks started on this machine
 * (OMPI_COMM_WORLD_LOCAL_SIZE). OpenMP's own OMP_PROC_BIND / OMP_PLACES apply inside each
 * rank (docs/tensor-parallel.md).
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "tp.h"

static int env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

/* The rank mpirun gave this process (before MPI is initialised), 0 when not launched. */
static int launch_rank(void)
{
    return env_int("OMPI_COMM_WORLD_RANK", env_int("PMIX_RANK", env_int("PMI_RANK", 0)));
}

static int launch_size(void)
{
    return env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
}

int cli_tp_mute_others(void)
{
    if (!df_dist_launched() || launch_rank() <= 0)
        return -1;
    fflush(stderr);
    int saved = dup(STDERR_FILENO), null = open("/dev/null", O_WRONLY);
    if (saved >= 0 && null >= 0)
        dup2(null, STDERR_FILENO);
    if (null >= 0)
        close(null);
    return saved;
}

void cli_tp_unmute(int saved)
{
    if (saved < 0)
        return;
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
}

static int rank_threads(void)
{
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1)
        online = 1;
    cpu_set_t set;
    CPU_ZERO(&set);
    int bound = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)online;
    if (bound >= 1 && bound < online)
        return bound; /* the launcher gave this rank its cores */
    int local = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
    int share = (int)online / (local > 0 ? local : 1);
    return share > 0 ? share : 1;
}

int cli_tp_start(int tp, int *threads, cli_tp *out)
{
    *out = (cli_tp){.size = 1};
    bool launched = df_dist_launched();
    bool speak = launch_rank() == 0;
    if (tp == 0) {
        if (launched && launch_size() > 1) {
            if (speak)
                fprintf(stderr,
                        "diffuse generate: mpirun started %d processes but --tp was "
                        "not given: pass --tp %d to split the model over them\n",
                        launch_size(), launch_size());
            return 2;
        }
        return 0;
    }
    if (!launched) {
        fprintf(stderr,
                "diffuse generate: --tp %d runs one process per rank; start it as "
                "mpirun -np %d diffuse generate --tp %d ...\n",
                tp, tp, tp);
        return 2;
    }
    if (df_dist_init(NULL, NULL, &out->comm) != DF_OK) {
        if (speak)
            fprintf(stderr, "diffuse generate: %s\n", df_error_message());
        return 1;
    }
    out->rank = df_comm_rank(out->comm);
    out->size = df_comm_size(out->comm);
    if (out->size != tp) {
        if (out->rank == 0)
            fprintf(stderr,
                    "diffuse generate: --tp %d, but mpirun started %d processes "
                    "(use mpirun -np %d)\n",
                    tp, out->size, tp);
        cli_tp_end(out);
        return 2;
    }
    if (*threads == 0)
        *threads = rank_threads();
    return 0;
}

void cli_tp_end(cli_tp *t)
{
    df_comm_free(t->comm);
    t->comm = NULL;
}
