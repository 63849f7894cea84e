/*
 * Tests for FLUX.2's reference-image size rules (src/pipelines/flux2_reference.c) beyond the
 * edit-flux2-* cases: Flux2ImageProcessor's shrink of pictures over 1024 x 1024 pixels (int()
 * of the scaled sides, in Python's doubles) and the round-down to 16 that the centre crop
 * makes, and check_image_input's refusals with their messages. Expected sizes are diffusers
 * 0.42's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "pipelines/flux2_reference.h"

static void size_of(int w, int h, int *ow, int *oh)
{
    df_image img = {.width = w, .height = h, .channels = 3};
    df_flux2_reference_size(&img, 16, oh, ow);
}

static void test_shrink_and_crop_sizes(void **state)
{
    (void)state;
    int w, h;
    size_of(1032, 1024, &w, &h); /* shrunk to 1027x1020, cropped */
    assert_int_equal(w, 1024), assert_int_equal(h, 1008);
    size_of(90, 75, &w, &h); /* not shrunk, cropped */
    assert_int_equal(w, 80), assert_int_equal(h, 64);
    size_of(2000, 500, &w, &h); /* 10^6 pixels: under the area, kept */
    assert_int_equal(w, 2000), assert_int_equal(h, 496);
    size_of(4096, 4096, &w, &h);
    assert_int_equal(w, 1024), assert_int_equal(h, 1024);
    size_of(3000, 2000, &w, &h); /* 1254x836 */
    assert_int_equal(w, 1248), assert_int_equal(h, 832);
    size_of(64, 64, &w, &h);
    assert_int_equal(w, 64), assert_int_equal(h, 64);
}

static void test_check_image_input_refusals(void **state)
{
    (void)state;
    df_image small = {.width = 63, .height = 100, .channels = 3};
    assert_int_equal(df_flux2_reference_check(&small), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "63x100 is too small"));
    df_image wide = {.width = 900, .height = 100, .channels = 3};
    assert_int_equal(df_flux2_reference_check(&wide), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "aspect ratio is over 8:1"));
    df_image ok = {.width = 800, .height = 100, .channels = 3};
    assert_int_equal(df_flux2_reference_check(&ok), DF_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shrink_and_crop_sizes),
        cmocka_unit_test(test_check_image_input_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
