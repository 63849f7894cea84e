/*
 * Tests for FLUX.1 Kontext's size rules (src/pipelines/kontext.c) beyond the kontext-* cases:
 * the output fitted to max_area at the requested aspect ratio as Python computes it, the
 * picture's encoding size (PREFERRED_KONTEXT_RESOLUTIONS after rounding down to 16, or its
 * own size), and the refusals with their messages. Expected sizes are diffusers 0.42's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "pipelines/kontext.h"
#include "pipelines/pipeline.h"

static df_pipeline kontext = {.cls = &df_flux_kontext_pipeline_class, .dir = "kontext"};

static void sized(int height, int width, int64_t max_area, int *h, int *w)
{
    df_gen_params g = {.height = height, .width = width, .max_area = max_area}, out;
    assert_int_equal(df_kontext_params(&kontext, &g, 1024, 16, &out), DF_OK);
    *h = out.height, *w = out.width;
}

static void test_output_fitted_to_max_area(void **state)
{
    (void)state;
    int h, w;
    sized(0, 0, 0, &h, &w); /* diffusers' defaults: 1024 x 1024 */
    assert_int_equal(h, 1024), assert_int_equal(w, 1024);
    sized(64, 96, 70 * 70, &h, &w); /* round(85.7) = 86 -> 80, round(57.2) = 57 -> 48 */
    assert_int_equal(h, 48), assert_int_equal(w, 80);
    sized(768, 1360, 0, &h, &w);
    assert_int_equal(h, 768), assert_int_equal(w, 1360);
    sized(48, 96, 48 * 96, &h, &w); /* the CLI's -W / -H: max_area W x H gives W x H back */
    assert_int_equal(h, 48), assert_int_equal(w, 96);
}

static void image_size(int iw, int ih, bool auto_resize, int *h, int *w)
{
    df_image img = {.width = iw, .height = ih, .channels = 3};
    assert_int_equal(df_kontext_image_size(&img, 16, auto_resize, h, w), DF_OK);
}

static void test_picture_size(void **state)
{
    (void)state;
    int h, w;
    image_size(40, 56, true, &h, &w); /* 32x48 first: aspect 2/3 exactly */
    assert_int_equal(w, 832), assert_int_equal(h, 1248);
    image_size(1000, 1000, true, &h, &w);
    assert_int_equal(w, 1024), assert_int_equal(h, 1024);
    image_size(1920, 1080, true, &h, &w); /* 1920x1072 */
    assert_int_equal(w, 1392), assert_int_equal(h, 752);
    image_size(500, 3000, true, &h, &w); /* beyond the list: its narrowest */
    assert_int_equal(w, 672), assert_int_equal(h, 1568);
    image_size(48, 40, false, &h, &w); /* _auto_resize=False: rounded down to 16 */
    assert_int_equal(w, 48), assert_int_equal(h, 32);
}

static void test_refusals_name_the_rule(void **state)
{
    (void)state;
    df_image tiny = {.width = 8, .height = 29, .channels = 3};
    int h, w;
    assert_int_equal(df_kontext_image_size(&tiny, 16, true, &h, &w), DF_E_ARG);
    assert_non_null(
        strstr(df_error_message(), "8x29 is too small: both sides must be at least 16"));
    df_gen_params out;
    df_image pic = {.width = 64, .height = 64, .channels = 3};
    const df_image *two[2] = {&pic, &pic};
    df_gen_params list = {.images = two, .n_images = 2};
    assert_int_equal(df_kontext_params(&kontext, &list, 1024, 16, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "edits one picture, not a list of 2"));
    df_gen_params strength = {.image = &pic, .strength = 0.5};
    assert_int_equal(df_kontext_params(&kontext, &strength, 1024, 16, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "takes no strength"));
    df_gen_params small = {.height = 64, .width = 64, .max_area = 100};
    assert_int_equal(df_kontext_params(&kontext, &small, 1024, 16, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "both sides must reach 16"));
    df_gen_params picture = {.image = &tiny};
    assert_int_equal(df_kontext_params(&kontext, &picture, 1024, 16, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "input image: 8x29 is too small"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_output_fitted_to_max_area),
        cmocka_unit_test(test_picture_size),
        cmocka_unit_test(test_refusals_name_the_rule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
