/*
 * Workload "peer": diffuse against PyTorch on the same FLUX.1 double + single block pair,
 * in the same run (issue #28: the pair at >= 3x PyTorch's best CPU configuration).
 *
 * The diffuse side is the "flux" workload's pair (bench_flux_pairs): FLUX.1 width, random
 * bf16 weights, 1024 image + 512 text tokens, in f32, bf16 and int8 compute (--dtype picks
 * one) and --mode eager or fuse, on --threads threads (default 2). The PyTorch side is
 * tools/peer/flux_block_pair.py, diffusers' own FluxTransformerBlock and
 * FluxSingleTransformerBlock at the same shapes in f32 and bf16, eager and torch.compile,
 * run as a child process with the Python of `--python PATH` (else $DIFFUSE_PEER_PYTHON; a
 * venv with torch and diffusers, never part of the build). It prints one JSON object per
 * configuration, which we read back and report as rows of our own. Without a Python the
 * PyTorch side is skipped with a line that says how to enable it.
 *
 * Both sides report the fastest of a few calls after a warm-up (the machines this runs on
 * are shared; the fastest call is the least disturbed). The ratios are PyTorch's ms over
 * diffuse's: best against best, and per dtype.
 * --quick shrinks both sides to hidden 128 (4 heads of 32) on 64 + 8 tokens.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

#ifndef DF_PEER_SCRIPT
#define DF_PEER_SCRIPT "tools/peer/flux_block_pair.py"
#endif

/* The best time seen so far of one side, and where it came from. */
typedef struct best {
    double ms;
    char what[64];
} best;

static void keep_best(best *b, double ms, const char *what)
{
    if (ms > 0 && (b->ms == 0 || ms < b->ms)) {
        b->ms = ms;
        snprintf(b->what, sizeof b->what, "%s", what);
    }
}

typedef struct peer_run {
    const bench_opts *o;
    int threads;
    int64_t s_img, s_txt;
    double gflop;                    /* one pair's matrix products */
    best diffuse, torch;             /* over every dtype */
    best diffuse_dt[2], torch_dt[2]; /* f32, bf16: the dtypes both sides have */
    char versions[96];               /* "torch X, diffusers Y" from the script */
} peer_run;

static int dtype_slot(const char *name)
{
    return !strcmp(name, "f32") ? 0 : !strcmp(name, "bf16") ? 1 : -1;
}

static int measure_diffuse(peer_run *r, const char *mode)
{
    static const df_dtype all[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    df_dtype dtypes[3];
    int n = 0;
    for (int i = 0; i < 3; i++)
        if (bench_dtype_wanted(r->o, all[i]))
            dtypes[n++] = all[i];
    bench_flux_pair pair[3];
    int failures = bench_flux_pairs(r->o, r->threads, mode, r->s_img, r->s_txt, dtypes, n, pair);
    r->gflop = pair[0].gflop[0] + pair[0].gflop[1]; /* the PyTorch rows' rate counts the same */
    char shape[64];
    snprintf(shape, sizeof shape, "diffuse %" PRId64 "+%" PRId64 " double+single", r->s_img,
             r->s_txt);
    for (int i = 0; i < n; i++) {
        double ms = pair[i].ms[0] + pair[i].ms[1];
        if (pair[i].ms[0] == 0)
            continue;
        const char *dt = df_dtype_name(dtypes[i]);
        char extra[128], what[64];
        snprintf(extra, sizeof extra, ",\"impl\":\"diffuse\",\"double_ms\":%.2f,\"single_ms\":%.2f",
                 pair[i].ms[0], pair[i].ms[1]);
        bench_report(r->o, "peer", shape, r->threads, dt, mode, ms, r->gflop / (ms / 1e3),
                     bench_ceiling_gflops(dtypes[i], r->threads), pair[i].peak_bytes, extra);
        snprintf(what, sizeof what, "%s %s", dt, mode);
        keep_best(&r->diffuse, ms, what);
        if (dtype_slot(dt) >= 0)
            keep_best(&r->diffuse_dt[dtype_slot(dt)], ms, what);
    }
    return failures;
}

/* One line of the script's output: a measurement becomes a row, an error a message.
 * Returns 1 for an error or a line that is not the script's JSON. */
static int read_peer_line(peer_run *r, const char *line)
{
    df_json *j;
    if (df_json_parse_string(line, strlen(line), "peer script output", &j) != DF_OK) {
        fprintf(stderr, "peer: unexpected output from the script: %s\n", line);
        return 1;
    }
    const char *config = "?", *error = NULL, *dt = "?", *tv = "?", *dv = "?";
    double ms = 0, median_ms = 0;
    bool compiled = false;
    df_json_get_string_or(j, "config", "?", &config);
    df_json_get_string_or(j, "error", NULL, &error);
    int bad = error != NULL;
    if (error)
        fprintf(stderr, "peer: PyTorch %s failed: %s\n", config, error);
    else if (df_json_get_double(j, "ms", &ms) != DF_OK || ms <= 0 ||
             df_json_get_string(j, "dtype", &dt) != DF_OK) {
        fprintf(stderr, "peer: the script's line for %s has no time: %s\n", config,
                df_error_message());
        bad = 1;
    } else {
        df_json_get_double_or(j, "median_ms", ms, &median_ms);
        df_json_get_bool_or(j, "compile", false, &compiled);
        df_json_get_string_or(j, "torch", "?", &tv);
        df_json_get_string_or(j, "diffusers", "?", &dv);
        snprintf(r->versions, sizeof r->versions, "torch %s, diffusers %s", tv, dv);
        char shape[64], extra[160], what[64];
        const char *mode = compiled ? "compile" : "eager";
        snprintf(shape, sizeof shape, "torch %" PRId64 "+%" PRId64 " double+single", r->s_img,
                 r->s_txt);
        snprintf(extra, sizeof extra,
                 ",\"impl\":\"torch\",\"torch\":\"%.20s\",\"diffusers\":\"%.20s\","
                 "\"median_ms\":%.2f",
                 tv, dv, median_ms);
        bench_report(r->o, "peer", shape, r->threads, dt, mode, ms, r->gflop / (ms / 1e3), 0, 0,
                     extra);
        snprintf(what, sizeof what, "%s %s", dt, compiled ? "torch.compile" : "eager");
        keep_best(&r->torch, ms, what);
        if (dtype_slot(dt) >= 0)
            keep_best(&r->torch_dt[dtype_slot(dt)], ms, what);
    }
    df_json_free(j);
    return bad;
}

/* Runs `python script args...` with its stdout read back line by line; its stderr is
 * ours. Returns the number of failures: lines that reported one, or the process itself. */
static int measure_torch(peer_run *r, const char *python, const char *script)
{
    char threads[16], img[24], txt[24];
    snprintf(threads, sizeof threads, "%d", r->threads);
    snprintf(img, sizeof img, "%" PRId64, r->s_img);
    snprintf(txt, sizeof txt, "%" PRId64, r->s_txt);
    char *argv[20] = {
        (char *)python, (char *)script, "--threads", threads, "--img", img, "--txt", txt};
    int argc = 8;
    if (r->o->quick) {
        char *const tiny[] = {"--dim",   "128",      "--heads", "4",         "--axes",
                              "8,12,12", "--warmup", "1",       "--repeats", "3"};
        for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++)
            argv[argc++] = tiny[i];
    }
    int fd[2];
    if (pipe(fd) != 0) {
        perror("peer: pipe");
        return 1;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        perror("peer: fork");
        close(fd[0]);
        close(fd[1]);
        return 1;
    }
    if (pid == 0) {
        dup2(fd[1], STDOUT_FILENO);
        close(fd[0]);
        close(fd[1]);
        execv(python, argv);
        fprintf(stderr, "peer: cannot run the Python '%s': %s\n", python, strerror(errno));
        _exit(127);
    }
    close(fd[1]);
    FILE *f = fdopen(fd[0], "r");
    int failures = 0, lines = 0;
    char line[4096];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        failures += read_peer_line(r, line);
        lines++;
    }
    if (f)
        fclose(f);
    else
        close(fd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && code != 127 && !failures)
        fprintf(stderr, "peer: %s %s exited with status %d after %d lines\n", python, script, code,
                lines);
    return failures + (code != 0 && !failures);
}

static void print_ratio(const peer_run *r, const char *label, const best *t, const best *d)
{
    if (t->ms <= 0 || d->ms <= 0)
        return;
    if (r->o->json) {
        printf("{\"workload\":\"peer\",\"ratio_of\":\"%s\",\"torch_ms\":%.2f,\"torch\":\"%s\","
               "\"diffuse_ms\":%.2f,\"diffuse\":\"%s\",\"ratio\":%.3f,\"threads\":%d}\n",
               label, t->ms, t->what, d->ms, d->what, t->ms / d->ms, r->threads);
        return;
    }
    printf("  peer %-5s PyTorch %s %.1f ms / diffuse %s %.1f ms = %.2fx\n", label, t->what, t->ms,
           d->what, d->ms, t->ms / d->ms);
}

int bench_peer(const bench_opts *o)
{
    const char *python = getenv("DIFFUSE_PEER_PYTHON"), *script = DF_PEER_SCRIPT;
    for (int i = 0; i < o->argc; i++) {
        if (!strcmp(o->argv[i], "--python") && i + 1 < o->argc)
            python = o->argv[++i];
        else if (!strcmp(o->argv[i], "--script") && i + 1 < o->argc)
            script = o->argv[++i];
        else {
            fprintf(stderr, "peer: usage: peer [--python PATH] [--script PATH]\n");
            return 2;
        }
    }
    peer_run r = {.o = o,
                  .threads = o->threads ? o->threads : 2,
                  .s_img = o->quick ? 64 : 1024,
                  .s_txt = o->quick ? 8 : 512};
    int failures = measure_diffuse(&r, o->mode ? o->mode : "eager");
    if (!python || !*python) {
        const char *msg = "PyTorch side skipped: no Python given (--python PATH or "
                          "DIFFUSE_PEER_PYTHON=PATH: a venv with torch and diffusers, see "
                          "tools/peer/flux_block_pair.py)";
        if (o->json)
            printf("{\"workload\":\"peer\",\"skipped\":\"%s\"}\n", msg);
        else
            printf("peer: %s\n", msg);
        return failures ? 1 : 0;
    }
    if (access(script, R_OK) != 0) {
        fprintf(stderr, "peer: cannot read the PyTorch script '%s' (--script PATH): %s\n", script,
                strerror(errno));
        return 1;
    }
    failures += measure_torch(&r, python, script);
    if (!o->json && r.versions[0])
        printf("  peer: PyTorch is %s; ratios are PyTorch's ms over diffuse's (goal >= 3x)\n",
               r.versions);
    print_ratio(&r, "best", &r.torch, &r.diffuse);
    print_ratio(&r, "f32", &r.torch_dt[0], &r.diffuse_dt[0]);
    print_ratio(&r, "bf16", &r.torch_dt[1], &r.diffuse_dt[1]);
    return failures ? 1 : 0;
}
