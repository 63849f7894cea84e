/*
 * Tests for image to image's schedule cut (src/pipelines/img2img.c): the first step as
 * diffusers' get_timesteps computes it in Python doubles, the default strength, and the
 * refusal of a strength outside (0, 1] with its message. The
 * starting latents themselves are checked against diffusers by the img2img-* cases.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "pipelines/img2img.h"

static int first(double strength, int steps)
{
    int f = -1;
    df_gen_params g = {.strength = strength};
    assert_int_equal(df_img2img_first_step(&g, steps, &f), DF_OK);
    return f;
}

static void test_first_step_as_get_timesteps(void **state)
{
    (void)state;
    assert_int_equal(first(0.3, 4), 2);  /* 4 * 0.3 = 1.2000000000000002: int(2.8) */
    assert_int_equal(first(0.8, 5), 1);  /* 5 * 0.8 = 4.0 */
    assert_int_equal(first(0.8, 4), 0);  /* int(0.7999999999999998) */
    assert_int_equal(first(1.0, 4), 0);
    assert_int_equal(first(0.25, 4), 3); /* exactly one step */
    assert_int_equal(first(0.6, 28), 11); /* 28 * 0.6 = 16.8: int(11.2) */
    assert_int_equal(first(0.0, 10), 4);  /* 0: diffusers' default 0.6 */
}

static void test_bad_strengths_are_refused(void **state)
{
    (void)state;
    static const double bad[] = {-0.1, 1.0000001, 2.0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int f = 7;
        df_gen_params g = {.strength = bad[i]};
        assert_int_equal(df_img2img_first_step(&g, 4, &f), DF_E_ARG);
        assert_int_equal(f, 0);
        assert_non_null(strstr(df_error_message(), "(0, 1]"));
    }
}

static void test_any_positive_strength_runs_a_step(void **state)
{
    (void)state;
    /* int(n - x) for 0 < x < 1 is n - 1: diffusers' "< 1 step" error needs strength 0 */
    assert_int_equal(first(0.2, 4), 3);
    assert_int_equal(first(0.01, 28), 27);
    assert_int_equal(first(1e-9, 1), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_step_as_get_timesteps),
        cmocka_unit_test(test_bad_strengths_are_refused),
        cmocka_unit_test(test_any_positive_strength_runs_a_step),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
