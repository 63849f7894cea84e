/*
 * diffuse-check: runs golden case folders and says PASS or FAIL for each.
 *
 *   diffuse-check [--mode eager|fuse|compile|blocks] [--device NAME] [--dtype f32|bf16|int8]
 *                 [--threads N] [--stats-json FILE] [-v] CASE_DIR...
 *   mpirun -np N diffuse-check --tp N [options] CASE_DIR...
 *   diffuse-check --classes
 *
 * For each folder: case.json is parsed, case.safetensors opened, "dir" resolved against the
 * case folder, and the handler of the case's "kind" runs it (check.h). A case that cannot be
 * loaded, has an unknown kind, or whose handler reports a failure is a FAIL. One summary
 * line per case, then the exit status: 0 when every case passed, 1 otherwise, 2 for a usage
 * error. The options are stored in check_case for the handlers; --stats-json opens the file
 * the handlers append their counters to (one JSON object per line). --tp splits pipeline cases
 * over the ranks of an mpirun launch (tp.c).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"

typedef struct kind_entry {
    const char *kind;
    int (*run)(check_case *c);
} kind_entry;

static const kind_entry kinds[] = {
    {"model_forward", check_kind_model_forward},
    {"scheduler", check_kind_scheduler},
    {"vae_decode", check_kind_vae_decode},
    {"vae_encode", check_kind_vae_encode},
    {"pipeline", check_kind_pipeline},
    {"tokenizer", check_kind_tokenizer},
    {"text_encoder", check_kind_text_encoder},
    {"rng", check_kind_rng},
};

/* The kinds that run the classes of each component of the model table (models.h), with
 * whether the kind's handler has a runner for a class (NULL: every class of the component,
 * which the library's loader tells apart, as df_vae_load tells the two VAEs). */
typedef struct class_kind {
    const char *component, *kind;
    bool (*runs)(const char *cls);
} class_kind;

static const class_kind class_kinds[] = {
    {"transformer", "model_forward", check_model_forward_runs},
    {"text_encoder", "text_encoder", check_text_encoder_runs},
    {"vae", "vae_decode", NULL},
    {"vae", "vae_encode", NULL},
    {"tokenizer", "tokenizer", NULL},
    {"scheduler", "scheduler", NULL},
};

const void *check_find_row(const void *rows, size_t n, size_t size, const char *name)
{
    for (size_t i = 0; name && i < n; i++) {
        const char *const *row_name = (const void *)((const char *)rows + i * size);
        if (strcmp(*row_name, name) == 0)
            return row_name;
    }
    return NULL;
}

bool check_runs_class(const char *kind, const char *cls)
{
    const df_model_class *row = df_model_class_find(cls);
    for (size_t i = 0; row && i < sizeof class_kinds / sizeof *class_kinds; i++) {
        const class_kind *k = &class_kinds[i];
        if (strcmp(k->kind, kind) == 0 && strcmp(k->component, row->component) == 0)
            return !k->runs || k->runs(cls);
    }
    return false;
}

/* --classes: each row of the model table, then the kinds that run it ("-": none); then the
 * pipeline classes the pipeline kind runs. */
static void print_classes(void)
{
    int n;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        int kinds_found = 0;
        printf("%s", rows[i].name);
        for (size_t k = 0; k < sizeof class_kinds / sizeof *class_kinds; k++)
            if (check_runs_class(class_kinds[k].kind, rows[i].name) && ++kinds_found)
                printf(" %s", class_kinds[k].kind);
        printf("%s\n", kinds_found ? "" : " -");
    }
    for (int i = 0; check_pipeline_class(i); i++)
        printf("%s pipeline\n", check_pipeline_class(i));
}

typedef struct options {
    const char *mode, *device;
    df_dtype compute;
    int threads, verbose, tp;
    FILE *stats;
    df_comm *comm;
} options;

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse-check [options] CASE_DIR...\n"
               "  --mode eager|fuse|compile|blocks  execution mode (default eager)\n"
               "  --device NAME                     device (default cpu)\n"
               "  --dtype f32|bf16|int8             compute dtype (default f32)\n"
               "  --threads N                       compute threads (default: all)\n"
               "  --stats-json FILE                 write the run's counters as JSON lines\n"
               "  --tp N                            split pipeline cases over N ranks, started as\n"
               "                                    mpirun -np N diffuse-check --tp N ...\n"
               "  -v                                more detail on failures\n"
               "  --classes                         print each class of the model table with\n"
               "                                    the case kinds that run it, and the pipeline\n"
               "                                    classes, and exit\n");
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The last component of a path, without trailing slashes, into buf. */
static const char *base_name(const char *path, char *buf, size_t cap)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    snprintf(buf, cap, "%.*s", (int)(n - b), path + b);
    return buf;
}

/* Loads case.json, case.safetensors and the model folder into c; 0 on success. */
static int load_case(check_case *c, const char *dir, char *model_dir, size_t cap, df_json **root)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/case.json", dir);
    if (df_json_parse_file(path, root) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    c->root = *root;
    int64_t format;
    if (df_json_get_int(c->root, "format", &format) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    if (format != 2)
        return check_fail(c, "%s: case format %lld; diffuse-check reads format 2", path,
                          (long long)format);
    const char *name;
    if (df_json_get_string_or(c->root, "case", NULL, &name) != DF_OK ||
        df_json_get_string(c->root, "kind", &c->kind) != DF_OK ||
        df_json_get_string_or(c->root, "class", "", &c->cls) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    if (name)
        c->name = name;
    c->args = df_json_get(c->root, "args");
    const df_json *d = df_json_get(c->root, "dir");
    if (!df_json_is_null(d)) {
        const char *rel;
        if (df_json_to_string(d, &rel) != DF_OK)
            return check_fail(c, "%s", df_error_message());
        char joined[PATH_MAX + 32];
        snprintf(joined, sizeof joined, "%s/%s", dir, rel);
        if (!realpath(joined, model_dir))
            snprintf(model_dir, cap, "%s", joined); /* the handler reports it missing */
        c->model_dir = model_dir;
    }
    snprintf(path, sizeof path, "%s/case.safetensors", dir);
    if (df_safetensors_open(path, &c->tensors) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    return 0;
}

const char *check_single_file(const check_case *c, char *buf, size_t cap)
{
    const char *rel = NULL;
    if (df_json_get_string_or(c->root, "single_file", NULL, &rel) != DF_OK || !rel)
        return NULL;
    snprintf(buf, cap, "%s/%s", c->dir, rel);
    return buf;
}

/* Runs one case folder; 0 when it passed. */
static int run_case(const options *o, const char *dir)
{
    char base[256], model_dir[PATH_MAX + 32];
    check_case c = {
        .name = base_name(dir, base, sizeof base),
        .dir = dir,
        .mode = o->mode,
        .device = o->device,
        .compute = o->compute,
        .threads = o->threads,
        .tol_scale = 1.0,
        .verbose = o->verbose,
        .stats_json = o->stats,
        .comm = o->comm,
    };
    df_json *root = NULL;
    double t0 = now();
    int rc = load_case(&c, dir, model_dir, sizeof model_dir, &root);
    if (rc == 0 && c.comm && strcmp(c.kind, "pipeline") != 0)
        rc = check_fail(&c, "--tp splits pipeline cases only, not kind '%s'", c.kind);
    rc = check_tp_agree(&c, rc);
    if (rc == 0) {
        const kind_entry *k = NULL;
        for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
            if (strcmp(kinds[i].kind, c.kind) == 0)
                k = &kinds[i];
        rc = k ? (k->run(&c) != 0) : check_fail(&c, "unknown kind '%s'", c.kind);
        rc = check_tp_agree(&c, rc);
    }
    char tp[32] = "";
    if (c.comm)
        snprintf(tp, sizeof tp, ", tp %d", df_comm_size(c.comm));
    printf("%s %s (%s, %s, %s, %s%s) %.2f s\n", rc ? "FAIL" : "PASS", c.name,
           c.kind ? c.kind : "?", c.mode, c.device, df_dtype_name(c.compute), tp, now() - t0);
    fflush(stdout);
    if (o->stats)
        fflush(o->stats); /* keep what was measured even if a later case crashes */
    df_safetensors_free(c.tensors);
    df_json_free(root);
    return rc;
}

/* Parses the options; returns the index of the first case folder, or -1 on a usage error. */
static int parse_args(int argc, char **argv, options *o)
{
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "-v") == 0) {
            o->verbose++;
            continue;
        }
        if (strcmp(a, "--classes") == 0) {
            print_classes();
            exit(0);
        }
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        if (!v) {
            fprintf(stderr, "diffuse-check: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (strcmp(a, "--mode") == 0) {
            if (strcmp(v, "eager") && strcmp(v, "fuse") && strcmp(v, "compile") &&
                strcmp(v, "blocks")) {
                fprintf(stderr, "diffuse-check: unknown mode '%s'\n", v);
                return -1;
            }
            o->mode = v;
        } else if (strcmp(a, "--device") == 0) {
            o->device = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "f32") == 0)
                o->compute = DF_DTYPE_F32;
            else if (strcmp(v, "bf16") == 0)
                o->compute = DF_DTYPE_BF16;
            else if (strcmp(v, "int8") == 0 || strcmp(v, "i8") == 0)
                o->compute = DF_DTYPE_I8;
            else {
                fprintf(stderr, "diffuse-check: --dtype is f32, bf16 or int8, not '%s'\n", v);
                return -1;
            }
        } else if (strcmp(a, "--threads") == 0) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 0 || n > 4096) {
                fprintf(stderr, "diffuse-check: --threads needs a count, not '%s'\n", v);
                return -1;
            }
            o->threads = (int)n;
        } else if (strcmp(a, "--tp") == 0) {
            char *end;
            long n = strtol(v, &end, 10);
            if (*end || end == v || n < 1 || n > 64) {
                fprintf(stderr, "diffuse-check: --tp needs a rank count (1 to 64), not '%s'\n",
                        v);
                return -1;
            }
            o->tp = (int)n;
        } else if (strcmp(a, "--stats-json") == 0) {
            if (o->stats)
                fclose(o->stats);
            o->stats = fopen(v, "w");
            if (!o->stats) {
                fprintf(stderr, "diffuse-check: cannot write %s\n", v);
                return -1;
            }
        } else {
            fprintf(stderr, "diffuse-check: unknown option '%s'\n", a);
            return -1;
        }
    }
    return i;
}

int main(int argc, char **argv)
{
    options o = {.mode = "eager", .device = "cpu", .compute = DF_DTYPE_F32};
    int first = parse_args(argc, argv, &o);
    if (first < 0 || first >= argc) {
        if (first >= argc)
            fprintf(stderr, "diffuse-check: no case folder given\n");
        usage(stderr);
        if (o.stats)
            fclose(o.stats);
        return 2;
    }
    check_tp tp;
    int rc = check_tp_start(o.tp, &tp);
    if (rc) {
        if (o.stats)
            fclose(o.stats);
        return rc;
    }
    o.comm = tp.comm;
    int failed = 0, total = 0;
    for (int i = first; i < argc; i++, total++)
        failed += run_case(&o, argv[i]);
    if (total > 1)
        printf("%d of %d cases passed\n", total - failed, total);
    check_tp_end(&tp);
    if (o.stats && fclose(o.stats) != 0) {
        fprintf(stderr, "diffuse-check: writing the stats file failed\n");
        return 1;
    }
    return failed ? 1 : 0;
}
