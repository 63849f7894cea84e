/*
 * The offload hint that the runtime's residency layer decides (runtime/residency.c): which
 * weights are transient (used in place, not packed) from how the models acquire and
 * release them, on a weight record of its own (the rule reads only the step count).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <diffuse/diffuse.h>

#include "runtime/runtime.h"
#include "unit/fixtures.h"

/* Sequential offload: everything released up front, then each block acquired and released
 * within every step: transient throughout. */
static void test_sequential_blocks_are_transient(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(1);
    df_weight st = {0};
    df_residency_note_release(ctx, &st, false); /* df_blocks_set_sequential(on) */
    assert_true(st.transient);
    for (int step = 0; step < 3; step++) {
        df_residency_note_acquire(ctx, &st, true);
        assert_true(st.transient); /* the forward uses it in place */
        df_residency_note_release(ctx, &st, true);
        assert_true(st.transient);
        assert_int_equal(df_mark_step(ctx), DF_OK);
    }
    df_residency_note_acquire(ctx, &st, false); /* sequential off: resident for good */
    assert_false(st.transient);
    df_ctx_free(ctx);
}

/* Model offload: a whole model acquired for its phase and released after it keeps its
 * packed forms, however long the phase. */
static void test_whole_models_are_not_transient(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(1);
    df_weight encoder = {0}, transformer = {0};
    for (int run = 0; run < 2; run++) {
        df_residency_note_acquire(ctx, &encoder, false);
        df_residency_note_release(ctx, &encoder, false); /* within one step */
        df_residency_note_acquire(ctx, &transformer, false);
        assert_int_equal(df_mark_step(ctx), DF_OK);
        assert_int_equal(df_mark_step(ctx), DF_OK);
        df_residency_note_release(ctx, &transformer, false);
        assert_false(encoder.transient);
        assert_false(transformer.transient);
    }
    df_ctx_free(ctx);
}

/* A part kept resident across a step (not released once per pass) is not transient. */
static void test_part_resident_across_steps_is_not_transient(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(1);
    df_weight st = {.transient = true};
    df_residency_note_acquire(ctx, &st, true);
    assert_int_equal(df_mark_step(ctx), DF_OK);
    df_residency_note_release(ctx, &st, true);
    assert_false(st.transient);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_blocks_are_transient),
        cmocka_unit_test(test_whole_models_are_not_transient),
        cmocka_unit_test(test_part_resident_across_steps_is_not_transient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
