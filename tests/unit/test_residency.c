/*
 * The offload hint that the runtime's residency layer decides (runtime/residency.c): which
 * weights are transient (used in place, not packed) from how the models acquire and
 * release them, on a weight record of its own (the rule reads only the step count). Then
 * the weight object itself (runtime/weight.c): acquire and release by name prefix, and the
 * precision and int8 scales the device sees through the view.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <diffuse/diffuse.h>

#include "runtime/runtime.h"
#include "runtime/weight.h"
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

/* Two bound weights named by prefix: releasing one takes only its bytes out of the resident
 * set, marks it transient (released before it was acquired), and acquiring it gives them
 * back; an activation carries no weight record. */
static void test_release_and_acquire_by_prefix(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(1);
    float data[6] = {1, 2, 3, 4, 5, 6};
    df_tensor *a = df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 3), data));
    df_tensor *b = df_tensor_persist(df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(3), data));
    assert_non_null(a);
    assert_non_null(b);
    assert_null(a->v.st->weight); /* nothing bound yet */
    assert_int_equal(df_weight_bind(ctx, a, NULL, 24, 24, 24), DF_OK);
    assert_int_equal(df_weight_bind(ctx, b, NULL, 12, 12, 10), DF_OK);
    df_weight_ref list[] = {{.name = "block.0.w", .t = a}, {.name = "norm.w", .t = b}};
    assert_int_equal(df_weight_resident_bytes(list, 2), 34);

    assert_int_equal(df_weight_release(ctx, list, 2, "block.0."), DF_OK);
    assert_int_equal(df_weight_resident_bytes(list, 2), 10);
    assert_true(a->v.st->weight->transient);
    assert_false(b->v.st->weight->transient);
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, 10);

    df_weight_acquire(ctx, list, 2, "block.0.");
    assert_int_equal(df_weight_resident_bytes(list, 2), 34);
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, 34);

    df_tensor *y = df_add(ctx, b, b);
    assert_non_null(y);
    assert_null(y->v.st->weight);
    assert_int_equal(df_sync(ctx), DF_OK);
    df_weight_unbind(ctx, a);
    df_weight_unbind(ctx, b);
    assert_int_equal(df_weight_resident_bytes(list, 2), 0);
    df_tensor_free(a);
    df_tensor_free(b);
    df_ctx_free(ctx);
}

/* Precision and int8 scales set through the runtime reach the device in the lowered view;
 * the scale storage lives as long as the weight's. */
static void test_precision_and_scales_reach_the_view(void **state)
{
    (void)state;
    df_ctx *ctx = fixture_ctx(1);
    int8_t q[8] = {1, -2, 3, -4, 5, -6, 7, -8};
    float sc[4] = {0.5f, 0.25f, 2.0f, 4.0f};
    df_tensor *w = df_tensor_from_host(ctx, DF_DTYPE_I8, DF_SHAPE(2, 4), q);
    df_tensor *s = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 2), sc);
    assert_non_null(w);
    assert_non_null(s);
    df_view v;
    df_gview_lower(&w->v, &v);
    assert_int_equal(v.flags & DF_VIEW_KEEP_PRECISION, 0);
    assert_null(v.scale_buf);

    assert_int_equal(df_weight_keep_precision(w, true), DF_OK);
    assert_int_equal(df_weight_attach_scales(w, s, false), DF_OK);
    df_gview_lower(&w->v, &v);
    assert_int_not_equal(v.flags & DF_VIEW_KEEP_PRECISION, 0);
    assert_ptr_equal(v.scale_buf, s->v.st->buf);
    assert_int_equal(v.scale_groups, 2);
    assert_int_equal(v.block_type, 0);
    assert_int_equal(atomic_load(&s->v.st->refs), 2); /* its handle and the weight */
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_blocks_are_transient),
        cmocka_unit_test(test_whole_models_are_not_transient),
        cmocka_unit_test(test_part_resident_across_steps_is_not_transient),
        cmocka_unit_test(test_release_and_acquire_by_prefix),
        cmocka_unit_test(test_precision_and_scales_reach_the_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
