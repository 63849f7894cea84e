/*
 * The pipelines' component tables (pipeline.c) against the model checks of `diffuse
 * inspect` (models/model_classes.c):
 *
 * - every class any pipeline class loads, in every component slot, has a registered check,
 *   so inspect can say whether a folder's weights match its config; removing a check, or
 *   adding a class to a table without one, fails here;
 * - every table is well formed (a name, at least one class per slot, no slot twice) and
 *   holds the transformer, the VAE and the scheduler;
 * - every component a golden pipeline folder names is a slot of its class's table (so no
 *   component reaches a loader unchecked), and its class is one the slot allows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "pipelines/pipeline.h"

static const df_component_rule *find_rule(const df_pipeline_table *t, const char *name)
{
    for (int c = 0; c < DF_PIPELINE_MAX_COMPONENTS && t->components[c].name; c++)
        if (strcmp(t->components[c].name, name) == 0)
            return &t->components[c];
    return NULL;
}

static void test_every_loaded_class_has_a_check(void **state)
{
    (void)state;
    assert_int_equal(df_models_register_checks(), DF_OK);
    int n;
    const df_pipeline_table *tables = df_pipeline_tables(&n);
    assert_true(n >= 4);
    int classes = 0;
    for (int i = 0; i < n; i++) {
        const df_pipeline_table *t = &tables[i];
        assert_non_null(t->kind);
        assert_non_null(t->kind->name);
        for (int c = 0; c < DF_PIPELINE_MAX_COMPONENTS && t->components[c].name; c++) {
            const df_component_rule *r = &t->components[c];
            if (!r->classes[0])
                fail_msg("%s: slot '%s' allows no class", t->kind->name, r->name);
            if (find_rule(t, r->name) != r)
                fail_msg("%s: slot '%s' is listed twice", t->kind->name, r->name);
            for (int k = 0; k < DF_COMPONENT_MAX_CLASSES && r->classes[k]; k++, classes++)
                if (!df_model_check_find(r->classes[k]))
                    fail_msg("%s loads '%s' as a %s, which has no model check (add one to "
                             "src/models/model_classes.c)",
                             t->kind->name, r->name, r->classes[k]);
        }
        static const char *const needed[] = {"transformer", "vae", "scheduler"};
        for (int k = 0; k < 3; k++)
            if (!find_rule(t, needed[k]))
                fail_msg("%s has no '%s' slot", t->kind->name, needed[k]);
    }
    printf("%d pipeline classes, %d (slot, class) pairs, each with a check\n", n, classes);
    assert_non_null(df_model_check_find("Flux2Transformer2DModel"));
    assert_non_null(df_model_check_find("AutoencoderKLFlux2"));
}

static void test_golden_pipelines_fit_their_tables(void **state)
{
    (void)state;
    static const char *const dirs[] = {"t2i-flux-schnell", "t2i-sd3",    "t2i-flux2",
                                       "t2i-flux2-klein",  "pipe-flux2", "pipe-sd3"};
    int n;
    const df_pipeline_table *tables = df_pipeline_tables(&n);
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        char dir[1024];
        snprintf(dir, sizeof dir, "%s/%s/pipeline", DF_GOLDEN_DIR, dirs[d]);
        df_model_index *idx;
        if (df_model_index_load(dir, &idx) != DF_OK)
            fail_msg("%s", df_error_message());
        const df_pipeline_table *t = NULL;
        for (int i = 0; i < n; i++)
            if (strcmp(tables[i].kind->name, df_model_index_class(idx)) == 0)
                t = &tables[i];
        if (!t)
            fail_msg("%s: no table for %s", dir, df_model_index_class(idx));
        for (int c = 0; c < df_model_index_count(idx); c++) {
            const df_component *comp = df_model_index_at(idx, c);
            if (!comp->cls)
                continue;
            const df_component_rule *r = find_rule(t, comp->name);
            if (!r)
                fail_msg("%s: component '%s' is in no slot of %s's table", dir, comp->name,
                         t->kind->name);
            bool allowed = false;
            for (int k = 0; k < DF_COMPONENT_MAX_CLASSES && r->classes[k]; k++)
                allowed |= strcmp(r->classes[k], comp->cls) == 0;
            if (!allowed)
                fail_msg("%s: component '%s' is a %s, which the table does not allow", dir,
                         comp->name, comp->cls);
        }
        df_model_index_free(idx);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_loaded_class_has_a_check),
        cmocka_unit_test(test_golden_pipelines_fit_their_tables),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
