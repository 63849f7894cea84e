/*
 * The option matrix of `diffuse generate`: every combination of the values in a table
 * (tests/cli/option_matrix.txt, which says what each line means) runs on a tiny pipeline,
 * and each either gives the images of its reference combination or is refused in one line.
 *
 * usage: option_matrix TABLE DIFFUSE WORK_DIR [--mpirun PATH] [--slack N] [--pairs]
 *                      [AXIS=NAME ...]
 *
 * --slack N adds N levels to every tolerance (tests/matrix.cmake: 1 in unoptimised builds).
 * --pairs runs, instead of every combination, a subset that has every pair of values of two
 * axes in at least one combination (chosen greedily, the same subset each run), each
 * compared with its reference only, within the tolerances of all its values together, not
 * with each combination one axis away (tests/matrix.cmake says where this is enough).
 * AXIS=NAME arguments keep only the combinations with that value (several values of one
 * axis: any of them), so that ctest can run slices of the matrix side by side. A
 * combination whose reference lies outside the slice runs its reference too. Each command
 * runs under `timeout`, in a folder of its own that is checked afterwards: a success leaves
 * exactly its images, a refusal nothing. Prints one line per combination (its status, the
 * largest pixel difference from the reference, the seconds it took) and exits 1 if any
 * failed.
 */
#include <dirent.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>

#include <diffuse/diffuse.h>

#define MAX_AXES   16
#define MAX_VALUES 8
#define MAX_RULES  32
#define MAX_IMAGES 4
#define LIMIT_S    "300" /* per command: a hang fails its combination, not the whole suite */
#define BASE_ARGS  "-p 'a red fox' -W 32 -H 32 --steps 2 --seed 3 --threads 1"
/* Leak checking would report MPI's own allocations; the unit tests check ours. */
#define MPI_ENV "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_rmaps_base_oversubscribe=1 "

enum kind { K_MODEL, K_OWN, K_SAME };

typedef struct value {
    char name[32];
    int tol;
    int only_axis, only_value; /* -1: always */
    char args[256];
    int tp; /* --tp N among the arguments: run under mpirun -np N */
} value;

typedef struct axis {
    char name[32];
    enum kind kind;
    int n;
    value v[MAX_VALUES];
} axis;

enum rule_kind { R_REFUSE, R_TOLERATE, R_SKIP };

typedef struct rule {
    enum rule_kind kind;
    int n;
    int axis[MAX_AXES], value[MAX_AXES];
    char word[64]; /* refuse: the word its line must hold; tolerate: the tolerance */
} rule;

typedef struct matrix {
    int n_axes, n_rules;
    axis ax[MAX_AXES];
    rule rules[MAX_RULES];
    bool keep[MAX_AXES][MAX_VALUES]; /* the slice asked for */
} matrix;

/* What one combination gave. */
typedef struct result {
    bool done, ok;
    int n_images;
    df_image *img[MAX_IMAGES];
} result;

static const char *g_bin, *g_work, *g_mpirun = "mpirun";
static int g_slack;   /* --slack: added to every tolerance */
static bool g_pairs; /* --pairs: a pairwise subset, each compared with its reference only */
static result *g_results;
static int g_failures;

/* ---- the table ------------------------------------------------------------------------ */

static int find_axis(const matrix *m, const char *name)
{
    for (int a = 0; a < m->n_axes; a++)
        if (!strcmp(m->ax[a].name, name))
            return a;
    return -1;
}

static int find_value(const axis *ax, const char *name)
{
    for (int i = 0; i < ax->n; i++)
        if (!strcmp(ax->v[i].name, name))
            return i;
    return -1;
}

/* "AXIS=NAME" -> indices; false if either is unknown. */
static bool parse_pair(const matrix *m, const char *s, int *a, int *v)
{
    char name[64];
    const char *eq = strchr(s, '=');
    if (!eq || eq - s >= (int)sizeof name)
        return false;
    snprintf(name, sizeof name, "%.*s", (int)(eq - s), s);
    *a = find_axis(m, name);
    *v = *a >= 0 ? find_value(&m->ax[*a], eq + 1) : -1;
    return *v >= 0;
}

static bool parse_value_line(matrix *m, char *rest, int line)
{
    char an[32], vn[32], kind[16], tol[16], only[64];
    int used = 0;
    if (sscanf(rest, "%31s %31s %15s %15s %63s %n", an, vn, kind, tol, only, &used) < 5)
        return fprintf(stderr, "table line %d: expected AXIS NAME KIND TOL ONLY ARGS\n", line),
               false;
    int a = find_axis(m, an);
    if (a < 0) {
        if (m->n_axes == MAX_AXES)
            return fprintf(stderr, "table line %d: more than %d axes\n", line, MAX_AXES), false;
        a = m->n_axes++;
        snprintf(m->ax[a].name, sizeof m->ax[a].name, "%s", an);
        m->ax[a].kind = !strcmp(kind, "model") ? K_MODEL : !strcmp(kind, "own") ? K_OWN : K_SAME;
        if (strcmp(kind, "model") && strcmp(kind, "own") && strcmp(kind, "same"))
            return fprintf(stderr, "table line %d: kind '%s'\n", line, kind), false;
    }
    axis *ax = &m->ax[a];
    if (ax->n == MAX_VALUES)
        return fprintf(stderr, "table line %d: more than %d values\n", line, MAX_VALUES), false;
    value *v = &ax->v[ax->n++];
    snprintf(v->name, sizeof v->name, "%s", vn);
    v->tol = atoi(tol);
    v->only_axis = v->only_value = -1;
    if (strcmp(only, "-") && !parse_pair(m, only, &v->only_axis, &v->only_value))
        return fprintf(stderr, "table line %d: unknown value '%s'\n", line, only), false;
    char *args = rest + used;
    args[strcspn(args, "\n")] = '\0';
    snprintf(v->args, sizeof v->args, "%s", args);
    const char *tp = strstr(args, "--tp ");
    v->tp = tp ? atoi(tp + 5) : 0;
    return true;
}

static bool parse_rule_line(matrix *m, char *rest, int line, enum rule_kind kind)
{
    char conds[256], word[64];
    word[0] = '\0';
    int got = sscanf(rest, "%255s %63s", conds, word);
    if (got < (kind == R_SKIP ? 1 : 2) || m->n_rules == MAX_RULES)
        return fprintf(stderr, "table line %d: expected AXIS=NAME[,...] WORD\n", line), false;
    rule *r = &m->rules[m->n_rules++];
    r->kind = kind;
    snprintf(r->word, sizeof r->word, "%s", word);
    for (char *c = strtok(conds, ","); c; c = strtok(NULL, ",")) {
        if (r->n == MAX_AXES || !parse_pair(m, c, &r->axis[r->n], &r->value[r->n]))
            return fprintf(stderr, "table line %d: unknown value '%s'\n", line, c), false;
        r->n++;
    }
    return true;
}

static bool read_table(const char *path, matrix *m)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return perror(path), false;
    char line[1024];
    bool ok = true;
    for (int no = 1; ok && fgets(line, sizeof line, f); no++) {
        char word[16];
        int used = 0;
        if (line[0] == '#' || sscanf(line, "%15s %n", word, &used) < 1)
            continue;
        if (!strcmp(word, "value"))
            ok = parse_value_line(m, line + used, no);
        else if (!strcmp(word, "refuse"))
            ok = parse_rule_line(m, line + used, no, R_REFUSE);
        else if (!strcmp(word, "tolerate"))
            ok = parse_rule_line(m, line + used, no, R_TOLERATE);
        else if (!strcmp(word, "skip"))
            ok = parse_rule_line(m, line + used, no, R_SKIP);
        else
            ok = (fprintf(stderr, "table line %d: '%s'\n", no, word), false);
    }
    fclose(f);
    if (ok && (m->n_axes == 0 || m->ax[0].kind != K_MODEL))
        ok = (fprintf(stderr, "%s: the first axis must be the architecture\n", path), false);
    return ok;
}

/* ---- combinations ------------------------------------------------------------------------ */

/* A combination is one value index per axis, numbered in mixed radix. */
static int combo_count(const matrix *m)
{
    int n = 1;
    for (int a = 0; a < m->n_axes; a++)
        n *= m->ax[a].n;
    return n;
}

static void combo_decode(const matrix *m, int id, int *pick)
{
    for (int a = m->n_axes - 1; a >= 0; a--) {
        pick[a] = id % m->ax[a].n;
        id /= m->ax[a].n;
    }
}

static int combo_encode(const matrix *m, const int *pick)
{
    int id = 0;
    for (int a = 0; a < m->n_axes; a++)
        id = id * m->ax[a].n + pick[a];
    return id;
}

static const rule *combo_rule(const matrix *m, const int *pick, enum rule_kind kind);

/* Whether every value's ONLY condition holds and no `skip` line matches. */
static bool combo_valid(const matrix *m, const int *pick)
{
    if (combo_rule(m, pick, R_SKIP))
        return false;
    for (int a = 0; a < m->n_axes; a++) {
        const value *v = &m->ax[a].v[pick[a]];
        if (v->only_axis >= 0 && pick[v->only_axis] != v->only_value)
            return false;
    }
    return true;
}

static bool combo_kept(const matrix *m, const int *pick)
{
    for (int a = 0; a < m->n_axes; a++) {
        bool any = false, this = m->keep[a][pick[a]];
        for (int i = 0; i < m->ax[a].n; i++)
            any = any || m->keep[a][i];
        if (any && !this)
            return false;
    }
    return true;
}

/* The first rule of that kind whose values the combination has all. */
static const rule *combo_rule(const matrix *m, const int *pick, enum rule_kind kind)
{
    for (int r = 0; r < m->n_rules; r++) {
        if (m->rules[r].kind != kind)
            continue;
        bool all = true;
        for (int k = 0; k < m->rules[r].n && all; k++)
            all = pick[m->rules[r].axis[k]] == m->rules[r].value[k];
        if (all)
            return &m->rules[r];
    }
    return NULL;
}

/* The reference: every "same" axis at its first value. */
static int combo_reference(const matrix *m, const int *pick, int *tol)
{
    int ref[MAX_AXES];
    *tol = 0;
    for (int a = 0; a < m->n_axes; a++) {
        ref[a] = m->ax[a].kind == K_SAME ? 0 : pick[a];
        if (m->ax[a].kind == K_SAME)
            *tol += m->ax[a].v[pick[a]].tol;
    }
    return combo_encode(m, ref);
}

static void combo_label(const matrix *m, const int *pick, char *buf, size_t cap)
{
    size_t used = 0;
    for (int a = 0; a < m->n_axes && used < cap; a++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s=%s", a ? " " : "", m->ax[a].name,
                                 m->ax[a].v[pick[a]].name);
}

/* ---- running one ------------------------------------------------------------------------- */

static int run(const char *cmd)
{
    int st = system(cmd);
    if (st == -1)
        return 127;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* Non-empty lines of a file, the first one into `first`. */
static int count_lines(const char *path, char *first, size_t cap)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    first[0] = '\0';
    while (f && fgets(line, sizeof line, f)) {
        if (line[strspn(line, " \t\r\n")] == '\0')
            continue;
        if (n++ == 0)
            snprintf(first, cap, "%.1000s", line);
    }
    if (f)
        fclose(f);
    first[strcspn(first, "\n")] = '\0';
    return n;
}

static void print_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    for (int n = 0; f && fgets(line, sizeof line, f) && n < 40; n++)
        fprintf(stdout, "    | %s", line);
    if (f)
        fclose(f);
}

/* The entries of `dir` other than . and .., as "a b c". */
static int list_dir(const char *dir, char *buf, size_t cap)
{
    DIR *d = opendir(dir);
    int n = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        n++;
        if (used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s ", e->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

static int max_diff(const df_image *a, const df_image *b)
{
    if (a->width != b->width || a->height != b->height)
        return 256;
    int worst = 0;
    for (size_t i = 0; i < (size_t)a->width * (size_t)a->height * 3; i++) {
        int d = abs((int)a->pixels[i] - (int)b->pixels[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static int images_of(const matrix *m, const int *pick)
{
    for (int a = 0; a < m->n_axes; a++)
        if (!strcmp(m->ax[a].name, "n"))
            return atoi(m->ax[a].v[pick[a]].name);
    return 1;
}

/* Extra tolerance for combinations that may differ at all: the `own` values' TOL. */
static int combo_slack(const matrix *m, const int *pick)
{
    int slack = 0;
    for (int a = 0; a < m->n_axes; a++)
        if (m->ax[a].kind == K_OWN)
            slack += m->ax[a].v[pick[a]].tol;
    return slack;
}

/* Reports a failed combination (with its stderr, if `err`); false. */
static bool fail(const char *label, const char *why, const char *err)
{
    printf("FAIL %s: %s\n", label, why);
    if (err)
        print_file(err);
    g_failures++;
    return false;
}

/* Whether the images of r (combination `id`) lie within `tol` of combination `other`'s;
 * the largest difference seen goes to *worst. */
static bool compare(const result *r, int other, int id, int tol, const char *what, int *worst,
                    const char *label)
{
    if (other == id)
        return true;
    const result *o = &g_results[other];
    if (!o->ok) {
        char why[256];
        snprintf(why, sizeof why, "%s failed", what);
        fail(label, why, NULL);
        return false;
    }
    int d = 0;
    for (int i = 0; i < r->n_images; i++) {
        int di = max_diff(r->img[i], o->img[i]);
        d = di > d ? di : d;
    }
    *worst = d > *worst ? d : *worst;
    if (d > tol + g_slack) {
        char why[512];
        snprintf(why, sizeof why, "images differ from %s by %d levels (tolerance %d)", what, d,
                 tol + g_slack);
        fail(label, why, NULL);
        return false;
    }
    return true;
}

static void run_combo(const matrix *m, int id);

/* Runs combination `id` (its reference first) and checks it: whether it gave its images. */
static bool run_checked(const matrix *m, int id, result *r)
{
    int pick[MAX_AXES], tol;
    combo_decode(m, id, pick);
    int ref = combo_reference(m, pick, &tol);
    if (ref != id)
        run_combo(m, ref);
    char label[512], dir[1024], cmd[8192], args[2048] = "", err[1100], files[512];
    combo_label(m, pick, label, sizeof label);
    snprintf(dir, sizeof dir, "%s/c%d", g_work, id);
    snprintf(err, sizeof err, "%s.err", dir);
    int tp = 0;
    size_t used = 0;
    for (int a = 1; a < m->n_axes; a++) {
        const value *v = &m->ax[a].v[pick[a]];
        used += (size_t)snprintf(args + used, sizeof args - used, " %s", v->args);
        tp = v->tp > tp ? v->tp : tp;
    }
    char launch[1024] = "";
    if (tp > 1)
        snprintf(launch, sizeof launch,
                 "'%s' --oversubscribe --allow-run-as-root "
                 "-x ASAN_OPTIONS -np %d ",
                 g_mpirun, tp);
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir -p '%s' && %stimeout " LIMIT_S " %s'%s' generate "
             "-m '%s/tiny-%s' " BASE_ARGS "%s -o '%s/out.png' >/dev/null 2>'%s'",
             dir, dir, tp > 1 ? MPI_ENV : "", launch, g_bin, g_work, m->ax[0].v[pick[0]].name, args,
             dir, err);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = run(cmd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    char first[1024];
    int lines = count_lines(err, first, sizeof first);
    int n_files = list_dir(dir, files, sizeof files);
    const rule *refuse = combo_rule(m, pick, R_REFUSE);
    char why[2048];
    if (rc == 124 || rc >= 128) {
        snprintf(why, sizeof why, "%s (exit status %d)", rc == 124 ? "timed out" : "crashed", rc);
        return fail(label, why, err);
    }
    if (refuse) {
        if (rc == 0)
            return fail(label, "succeeded, but the table says it is refused", err);
        if (lines != 1 || !strstr(first, refuse->word)) {
            snprintf(why, sizeof why, "exit status %d; expected one stderr line naming '%s'", rc,
                     refuse->word);
            return fail(label, why, err);
        }
        if (n_files != 0) {
            snprintf(why, sizeof why, "refused, but left files behind: %s", files);
            return fail(label, why, NULL);
        }
        printf("ok   %-90s refused (%.2f s): %s\n", label, secs, first);
        return false; /* no images to compare others with */
    }
    if (rc != 0) {
        snprintf(why, sizeof why, "exit status %d", rc);
        return fail(label, why, err);
    }
    int want = images_of(m, pick);
    if (want > MAX_IMAGES || n_files != want) {
        snprintf(why, sizeof why, "expected %d image(s) in its folder, found: %s", want, files);
        return fail(label, why, NULL);
    }
    for (int i = 0; i < want; i++) {
        char path[1100];
        if (i == 0)
            snprintf(path, sizeof path, "%s/out.png", dir);
        else
            snprintf(path, sizeof path, "%s/out-%d.png", dir, i);
        if (df_image_load_png(path, &r->img[i], NULL) != DF_OK)
            return fail(label, df_error_message(), NULL);
        r->n_images++;
    }
    /* The reference, then each "same" axis alone back at its first value. */
    int worst = 0, slack = combo_slack(m, pick);
    const rule *known = combo_rule(m, pick, R_TOLERATE);
    int known_tol = known ? atoi(known->word) : 0;
    tol += tol ? slack : 0;
    if (!compare(r, ref, id, tol > known_tol ? tol : known_tol, "the reference", &worst, label))
        return false;
    for (int a = 0; a < m->n_axes && !g_pairs; a++) {
        if (m->ax[a].kind != K_SAME || pick[a] == 0)
            continue;
        int near[MAX_AXES], vt = m->ax[a].v[pick[a]].tol;
        memcpy(near, pick, sizeof near);
        near[a] = 0;
        int nid = combo_encode(m, near);
        if (!combo_valid(m, near) || combo_rule(m, near, R_REFUSE))
            continue;
        run_combo(m, nid);
        char what[128];
        snprintf(what, sizeof what, "the same with %s=%s", m->ax[a].name, m->ax[a].v[0].name);
        vt += vt ? slack : 0;
        if (!compare(r, nid, id, vt > known_tol ? vt : known_tol, what, &worst, label))
            return false;
    }
    printf("ok   %-90s max diff %d (%.2f s)\n", label, worst, secs);
    return true;
}

/* Runs combination `id` once. */
static void run_combo(const matrix *m, int id)
{
    result *r = &g_results[id];
    if (r->done)
        return;
    r->done = true;
    r->ok = run_checked(m, id, r);
}

/* ---- the pairwise subset ------------------------------------------------------------------ */

/* g_paired[a][i][b][j]: whether values i of axis a and j of axis b (a < b) are in a chosen
 * combination yet. */
static bool g_paired[MAX_AXES][MAX_VALUES][MAX_AXES][MAX_VALUES];

/* How many pairs of values of combination `pick` no chosen combination has yet. */
static int new_pairs(const matrix *m, const int *pick)
{
    int n = 0;
    for (int a = 0; a < m->n_axes; a++)
        for (int b = a + 1; b < m->n_axes; b++)
            n += !g_paired[a][pick[a]][b][pick[b]];
    return n;
}

/* Marks in `chosen` (one flag per combination) a subset of the slice's valid combinations
 * that has every pair of values some valid combination of the slice has: each time the one
 * with the most pairs not yet chosen, the first of those in combination order. */
static void choose_pairs(const matrix *m, bool *chosen)
{
    int n = combo_count(m), pick[MAX_AXES];
    for (;;) {
        int best = -1, best_new = 0;
        for (int id = 0; id < n; id++) {
            combo_decode(m, id, pick);
            if (chosen[id] || !combo_valid(m, pick) || !combo_kept(m, pick))
                continue;
            int k = new_pairs(m, pick);
            if (k > best_new)
                best = id, best_new = k;
        }
        if (best < 0)
            return;
        chosen[best] = true;
        combo_decode(m, best, pick);
        for (int a = 0; a < m->n_axes; a++)
            for (int b = a + 1; b < m->n_axes; b++)
                g_paired[a][pick[a]][b][pick[b]] = true;
    }
}

/* ---- main --------------------------------------------------------------------------------- */

static bool make_models(const matrix *m, const bool *needed)
{
    for (int i = 0; i < m->ax[0].n; i++) {
        if (!needed[i])
            continue;
        char cmd[4096];
        snprintf(cmd, sizeof cmd,
                 "rm -rf '%s/tiny-%s' && '%s' make-tiny %s --seed 3 "
                 "'%s/tiny-%s' >/dev/null",
                 g_work, m->ax[0].v[i].name, g_bin, m->ax[0].v[i].args, g_work, m->ax[0].v[i].name);
        if (run(cmd) != 0)
            return fprintf(stderr, "could not make the tiny %s pipeline\n", m->ax[0].v[i].name),
                   false;
    }
    return true;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: option_matrix TABLE DIFFUSE WORK_DIR [--mpirun PATH] "
                        "[--slack N] [--pairs] [AXIS=NAME ...]\n");
        return 2;
    }
    static matrix m;
    if (!read_table(argv[1], &m))
        return 2;
    g_bin = argv[2];
    g_work = argv[3];
    for (int i = 4; i < argc; i++) {
        int a, v;
        if (!strcmp(argv[i], "--mpirun") && i + 1 < argc) {
            g_mpirun = argv[++i];
        } else if (!strcmp(argv[i], "--slack") && i + 1 < argc) {
            g_slack = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--pairs")) {
            g_pairs = true;
        } else if (parse_pair(&m, argv[i], &a, &v)) {
            m.keep[a][v] = true;
        } else {
            fprintf(stderr, "option_matrix: unknown value '%s'\n", argv[i]);
            return 2;
        }
    }
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", g_work);
    if (run(cmd) != 0)
        return 2;
    int n = combo_count(&m), pick[MAX_AXES], selected = 0;
    bool needed[MAX_VALUES] = {0};
    for (int id = 0; id < n; id++) {
        combo_decode(&m, id, pick);
        if (combo_valid(&m, pick) && combo_kept(&m, pick))
            needed[pick[0]] = true;
    }
    if (!make_models(&m, needed))
        return 1;
    g_results = calloc((size_t)n, sizeof *g_results);
    bool *chosen = calloc((size_t)n, sizeof *chosen);
    if (!g_results || !chosen)
        return 1;
    if (g_pairs)
        choose_pairs(&m, chosen);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int id = 0; id < n; id++) {
        combo_decode(&m, id, pick);
        if (g_pairs ? chosen[id] : combo_valid(&m, pick) && combo_kept(&m, pick)) {
            run_combo(&m, id);
            selected++;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int id = 0; id < n; id++)
        for (int i = 0; i < g_results[id].n_images; i++)
            df_image_free(g_results[id].img[i]);
    free(g_results);
    free(chosen);
    printf("%d combinations, %d failed, %.1f s\n", selected, g_failures,
           (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9);
    if (g_failures == 0) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_work);
        run(cmd);
    }
    return g_failures ? 1 : 0;
}
