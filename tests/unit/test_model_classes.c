/*
 * The table of model classes (models.h, src/models/model_classes.c) against its readers:
 *
 * - every row is well formed (a name found once, a component, a check) and is what
 *   `diffuse inspect` registers;
 * - every transformer row has what each reader needs: weights int8 keeps in f32, which the
 *   quantization policy then keeps; a make-tiny architecture; a golden model_forward case
 *   of its class, which diffuse-check runs and the row's check (the class's loader) loads;
 * - every make-tiny architecture of a row writes a folder holding that class (the
 *   pipeline's component slot, or a text encoder folder's architectures[0]), and make-tiny
 *   refuses one the table does not name.
 * - every row is run by a golden case kind in diffuse-check (a transformer by
 *   model_forward, a text encoder by text_encoder, a VAE by vae_decode and vae_encode, ...),
 *   and every make-tiny writer is an architecture of a row (`diffuse make-tiny --list`);
 * - every pipeline class the library loads (pipeline.c's tables) is run by diffuse-check's
 *   pipeline kind, and that kind runs no other.
 * Adding a class without one of these fails here, naming the class and what it lacks.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "models/quant_policy.h"
#include "pipelines/pipeline.h"

static bool is_transformer(const df_model_class *c)
{
    return strcmp(c->component, "transformer") == 0;
}

static void test_rows_are_well_formed_and_registered(void **state)
{
    (void)state;
    int n;
    const df_model_class *rows = df_model_classes(&n);
    assert_true(n >= 3);
    assert_int_equal(df_models_register_checks(), DF_OK);
    int transformers = 0;
    for (int i = 0; i < n; i++) {
        const df_model_class *c = &rows[i];
        assert_non_null(c->name);
        if (!c->component || !c->check)
            fail_msg("%s: the row has no %s", c->name, c->component ? "check" : "component");
        if (df_model_class_find(c->name) != c)
            fail_msg("%s: the table holds the class twice", c->name);
        if (df_model_check_find(c->name) != c->check)
            fail_msg("%s: `diffuse inspect` does not run the row's check", c->name);
        transformers += is_transformer(c);
    }
    assert_null(df_model_class_find("FluxTransformer3DModel"));
    assert_null(df_model_class_find(NULL));
    assert_int_equal(transformers, 3);
}

static void test_every_transformer_has_an_int8_policy(void **state)
{
    (void)state;
    int n;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        const df_model_class *c = &rows[i];
        if (!is_transformer(c))
            continue;
        if (!c->int8_keep || !c->int8_keep[0])
            fail_msg("%s: the row names no weights that int8 keeps in f32 (int8_keep)", c->name);
        for (const char *const *k = c->int8_keep; *k; k++) {
            char name[256];
            snprintf(name, sizeof name, "%slinear_1.weight", *k);
            if (!df_quant_keeps_precision("transformer", name, 1))
                fail_msg("%s: the int8 policy quantizes '%s', which the row keeps", c->name, name);
            assert_false(df_quant_keeps_precision("transformer", name, -1)); /* keep=none */
        }
    }
    /* A block's weight is quantized whatever the class. */
    assert_false(
        df_quant_keeps_precision("transformer", "transformer_blocks.0.attn.to_q.weight", 1));
}

/* Whether a golden case of kind model_forward runs class `cls` (its model folder goes to
 * found). */
static bool golden_forward_case(const char *cls, char *found, size_t cap)
{
    DIR *d = opendir(DF_GOLDEN_DIR);
    if (!d)
        return false;
    bool ok = false;
    for (struct dirent *e; !ok && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s/case.json", DF_GOLDEN_DIR, e->d_name);
        df_json *j;
        if (df_json_parse_file(path, &j) != DF_OK)
            continue;
        const char *kind = df_json_string(df_json_get(j, "kind"));
        const char *c = df_json_string(df_json_get(j, "class"));
        const char *dir = df_json_string(df_json_get(j, "dir"));
        ok = kind && c && dir && strcmp(kind, "model_forward") == 0 && strcmp(c, cls) == 0;
        if (ok)
            snprintf(found, cap, "%s/%s/%s", DF_GOLDEN_DIR, e->d_name, dir);
        df_json_free(j);
    }
    closedir(d);
    return ok;
}

static void test_every_transformer_has_a_golden_forward(void **state)
{
    (void)state;
    struct stat st;
    if (stat(DF_GOLDEN_DIR, &st) != 0)
        skip();
    int n;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        char found[2048];
        if (!is_transformer(&rows[i]))
            continue;
        if (!golden_forward_case(rows[i].name, found, sizeof found))
            fail_msg("%s: no golden case of kind model_forward runs it in diffuse-check",
                     rows[i].name);
        /* The row's check loads the case's model with the class's own loader. */
        if (rows[i].check(found, NULL, NULL) != DF_OK)
            fail_msg("%s: the row's check refuses %s: %s", rows[i].name, found, df_error_message());
    }
}

#ifdef DF_DIFFUSE_BIN
/* The class `dir` (written by make-tiny) holds for component `component`: the pipeline's
 * slot, or for a lone component folder its config's architectures[0]. */
static void class_written(const char *dir, const char *component, char *out, size_t cap)
{
    out[0] = '\0';
    df_model_index *idx;
    if (df_model_index_load(dir, &idx) == DF_OK) {
        const df_component *c = df_model_index_find(idx, component);
        if (c && c->cls)
            snprintf(out, cap, "%s", c->cls);
        df_model_index_free(idx);
        return;
    }
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", dir);
    df_json *j;
    if (df_json_parse_file(path, &j) != DF_OK)
        return;
    const char *cls = df_json_string(df_json_array_get(df_json_get(j, "architectures"), 0));
    if (cls)
        snprintf(out, cap, "%s", cls);
    df_json_free(j);
}

static void test_every_tiny_arch_writes_its_class(void **state)
{
    (void)state;
    mkdir(DF_TEST_TMP, 0755);
    int n, archs = 0;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        const df_model_class *c = &rows[i];
        if (is_transformer(c) && !c->tiny_arch[0])
            fail_msg("%s: the row names no make-tiny architecture", c->name);
        for (int k = 0; k < DF_MODEL_TINY_ARCHS && c->tiny_arch[k]; k++, archs++) {
            char dir[1024], cmd[4096], cls[256];
            snprintf(dir, sizeof dir, "%s/model-classes-%s", DF_TEST_TMP, c->tiny_arch[k]);
            snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' make-tiny --arch %s '%s' > /dev/null",
                     dir, DF_DIFFUSE_BIN, c->tiny_arch[k], dir);
            if (system(cmd) != 0)
                fail_msg("%s: `diffuse make-tiny --arch %s` failed", c->name, c->tiny_arch[k]);
            class_written(dir, c->component, cls, sizeof cls);
            if (strcmp(cls, c->name) != 0)
                fail_msg("make-tiny --arch %s wrote a %s '%s', not the row's %s", c->tiny_arch[k],
                         c->component, cls, c->name);
        }
    }
    assert_true(archs >= 4);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' make-tiny --arch nope '%s/model-classes-nope' 2> /dev/null",
             DF_DIFFUSE_BIN, DF_TEST_TMP);
    assert_int_not_equal(system(cmd), 0);
}
#endif

#if defined(DF_DIFFUSE_BIN) || defined(DF_DIFFUSE_CHECK_BIN)
/* The line that `cmd` prints for class `cls` (its first word), or "" when none. */
static void line_of(const char *cmd, const char *cls, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    char line[512];
    size_t n = strlen(cls);
    while (fgets(line, sizeof line, f))
        if (!out[0] && strncmp(line, cls, n) == 0 && (line[n] == ' ' || line[n] == '\n')) {
            line[strcspn(line, "\n")] = '\0';
            snprintf(out, cap, "%s", line);
        }
    assert_int_equal(pclose(f), 0);
}
#endif

#ifdef DF_DIFFUSE_BIN
/* Whether arch is a make-tiny architecture of a row of the table. */
static bool arch_of_a_row(const char *arch)
{
    int n;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DF_MODEL_TINY_ARCHS && rows[i].tiny_arch[k]; k++)
            if (strcmp(rows[i].tiny_arch[k], arch) == 0)
                return true;
    return false;
}

static void test_every_tiny_writer_is_a_row(void **state)
{
    (void)state;
    char cmd[2048], line[512];
    snprintf(cmd, sizeof cmd, "'%s' make-tiny --list", DF_DIFFUSE_BIN);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int writers = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        if (!arch_of_a_row(line))
            fail_msg("make-tiny writes --arch %s, which no row of the model table names", line);
        writers++;
    }
    assert_int_equal(pclose(f), 0);
    assert_true(writers >= 4);
    /* ... and every row's architecture has a writer (`make-tiny --list` names it). */
    int n;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DF_MODEL_TINY_ARCHS && rows[i].tiny_arch[k]; k++) {
            char found[256];
            line_of(cmd, rows[i].tiny_arch[k], found, sizeof found);
            if (!found[0])
                fail_msg("%s: make-tiny has no writer for --arch %s", rows[i].name,
                         rows[i].tiny_arch[k]);
        }
}
#endif

#ifdef DF_DIFFUSE_CHECK_BIN
/* The case kinds that run a class of each component in diffuse-check. */
static const struct {
    const char *component;
    const char *kinds[2];
} kinds_of[] = {
    {"transformer", {"model_forward"}},
    {"text_encoder", {"text_encoder"}},
    {"vae", {"vae_decode", "vae_encode"}},
    {"tokenizer", {"tokenizer"}},
    {"scheduler", {"scheduler"}},
};

static void test_every_class_runs_in_diffuse_check(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' --classes", DF_DIFFUSE_CHECK_BIN);
    int n, checked = 0;
    const df_model_class *rows = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        const df_model_class *c = &rows[i];
        char line[512];
        line_of(cmd, c->name, line, sizeof line);
        if (!line[0])
            fail_msg("%s: `diffuse-check --classes` does not list the row", c->name);
        bool known = false;
        for (size_t k = 0; k < sizeof kinds_of / sizeof *kinds_of; k++) {
            if (strcmp(kinds_of[k].component, c->component) != 0)
                continue;
            known = true;
            for (int j = 0; j < 2 && kinds_of[k].kinds[j]; j++, checked++) {
                char word[64];
                snprintf(word, sizeof word, " %s", kinds_of[k].kinds[j]);
                size_t len = strlen(word);
                const char *at = strstr(line, word);
                if (!at || (at[len] != ' ' && at[len] != '\0'))
                    fail_msg("%s: diffuse-check has no %s runner for the class (it says: %s)",
                             c->name, kinds_of[k].kinds[j], line);
            }
        }
        if (!known)
            fail_msg("%s: no diffuse-check case kind is known for component %s", c->name,
                     c->component);
    }
    assert_true(checked >= n);
}

/* Every pipeline class the library loads has a pipeline runner in diffuse-check, and
 * diffuse-check runs no pipeline class the library does not load. */
static void test_every_pipeline_class_runs_in_diffuse_check(void **state)
{
    (void)state;
    char cmd[2048], line[512];
    snprintf(cmd, sizeof cmd, "'%s' --classes", DF_DIFFUSE_CHECK_BIN);
    int n;
    const df_pipeline_table *tables = df_pipeline_tables(&n);
    for (int i = 0; i < n; i++) {
        const char *cls = tables[i].kind->name;
        line_of(cmd, cls, line, sizeof line);
        if (!strstr(line, " pipeline"))
            fail_msg("%s: diffuse-check has no pipeline runner for the class", cls);
    }
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    int runners = 0;
    while (fgets(line, sizeof line, f)) {
        char *kind = strstr(line, " pipeline\n");
        if (!kind)
            continue;
        *kind = '\0';
        bool loaded = false;
        for (int i = 0; i < n; i++)
            loaded = loaded || strcmp(tables[i].kind->name, line) == 0;
        if (!loaded)
            fail_msg("diffuse-check runs pipeline class %s, which the library does not load", line);
        runners++;
    }
    assert_int_equal(pclose(f), 0);
    assert_int_equal(runners, n);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows_are_well_formed_and_registered),
        cmocka_unit_test(test_every_transformer_has_an_int8_policy),
        cmocka_unit_test(test_every_transformer_has_a_golden_forward),
#ifdef DF_DIFFUSE_BIN
        cmocka_unit_test(test_every_tiny_arch_writes_its_class),
        cmocka_unit_test(test_every_tiny_writer_is_a_row),
#endif
#ifdef DF_DIFFUSE_CHECK_BIN
        cmocka_unit_test(test_every_class_runs_in_diffuse_check),
        cmocka_unit_test(test_every_pipeline_class_runs_in_diffuse_check),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
