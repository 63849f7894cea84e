/*
 * Tests for inpainting's pieces that are not the models (src/io/image_mask.c,
 * src/pipelines/inpaint.c): the mask processor's grey and threshold, get_crop_region's box
 * worked by hand, the overlay at its three kinds of mask pixel, the refusals of
 * df_inpaint_check with their messages, and the mask's PNG parameters round trip. The runs
 * themselves are checked against diffusers by the inpaint-* cases.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "pipelines/inpaint.h"
#include "pipelines/pipeline.h"

static df_image *filled(int w, int h, uint8_t r, uint8_t g, uint8_t b)
{
    df_image *img;
    assert_int_equal(df_image_create(w, h, &img), DF_OK);
    for (int i = 0; i < w * h; i++)
        img->pixels[i * 3] = r, img->pixels[i * 3 + 1] = g, img->pixels[i * 3 + 2] = b;
    return img;
}

static void set(df_image *img, int x, int y, uint8_t v)
{
    memset(img->pixels + ((size_t)y * img->width + x) * 3, v, 3);
}

static void test_mask_grey_and_threshold(void **state)
{
    (void)state;
    df_image *m = filled(4, 1, 0, 0, 0);
    set(m, 0, 0, 127);                                        /* 127 / 255 < 0.5 */
    set(m, 1, 0, 128);                                        /* 128 / 255 >= 0.5 */
    m->pixels[6] = 255, m->pixels[7] = 0, m->pixels[8] = 0;   /* red: grey 76 */
    m->pixels[9] = 0, m->pixels[10] = 255, m->pixels[11] = 0; /* green: grey 150 */
    float out[4];
    assert_int_equal(df_image_mask_preprocess(m, 0, 0, 1, DF_RESAMPLE_LANCZOS, out), DF_OK);
    assert_true(out[0] == 0.0f && out[1] == 1.0f && out[2] == 0.0f && out[3] == 1.0f);
    df_image_free(m);
}

static void test_crop_region_as_get_crop_region(void **state)
{
    (void)state;
    df_image *m = filled(20, 10, 0, 0, 0);
    for (int y = 3; y < 5; y++)
        for (int x = 12; x < 15; x++)
            set(m, x, y, 1); /* any grey above 0 counts */
    int box[4];
    /* (12, 3, 15, 5) padded by 1: (11, 2, 16, 6), 5 wide and 4 high; a square output
     * grows the height by int(5 - 4) = 1, all of it below */
    assert_int_equal(df_image_mask_crop_region(m, 64, 64, 1, box), DF_OK);
    assert_int_equal(box[0], 11), assert_int_equal(box[1], 2);
    assert_int_equal(box[2], 16), assert_int_equal(box[3], 7);
    /* a 4:1 output: the width grows by int(4 * 4 - 5) = 11, 5 left and 6 right, to
     * (6, 22), then shifted back inside the 20 columns */
    assert_int_equal(df_image_mask_crop_region(m, 64, 16, 1, box), DF_OK);
    assert_int_equal(box[0], 4), assert_int_equal(box[1], 2);
    assert_int_equal(box[2], 20), assert_int_equal(box[3], 6);
    df_image_free(m);

    df_image *black = filled(8, 8, 0, 0, 0);
    assert_int_equal(df_image_mask_crop_region(black, 64, 64, 4, box), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "all black"));
    df_image_free(black);
}

static void test_overlay_keeps_the_picture_where_the_mask_is_black(void **state)
{
    (void)state;
    df_image *init = filled(3, 1, 10, 20, 30), *result = filled(3, 1, 200, 100, 50);
    df_image *mask = filled(3, 1, 0, 0, 0), *out;
    set(mask, 1, 0, 255);
    set(mask, 2, 0, 128);
    assert_int_equal(df_image_apply_overlay(mask, init, result, NULL, &out), DF_OK);
    assert_memory_equal(out->pixels, init->pixels, 3);       /* black: the picture */
    assert_memory_equal(out->pixels + 3, result->pixels, 3); /* white: the result */
    /* grey 128: PIL's alpha_composite of the picture at alpha 127 over the result */
    assert_int_equal(out->pixels[6], 105);
    assert_int_equal(out->pixels[7], 60);
    assert_int_equal(out->pixels[8], 40);
    df_image_free(out);
    df_image *small = filled(2, 1, 0, 0, 0);
    assert_int_equal(df_image_apply_overlay(small, init, result, NULL, &out), DF_E_ARG);
    assert_null(out);
    df_image_free(small);
    df_image_free(init), df_image_free(result), df_image_free(mask);
}

/* Image.resize with a box, bytes from Pillow 13.0 on the 7x5 picture (x * 37 + y * 59 +
 * c * 91) % 256: the empty boxes diffusers' resize_mode "fill" uses for its bands, and a
 * fractional box along one axis. (Along both, the pass order is Pillow 13's, which we
 * approximate: docs/pipelines.md.) */
static void test_resize_box_as_pil(void **state)
{
    (void)state;
    df_image *img;
    assert_int_equal(df_image_create(7, 5, &img), DF_OK);
    for (int y = 0; y < 5; y++)
        for (int x = 0; x < 7; x++)
            for (int c = 0; c < 3; c++)
                img->pixels[(y * 7 + x) * 3 + c] = (uint8_t)((x * 37 + y * 59 + c * 91) % 256);
    static const uint8_t left[] = {0,  86,  177, 54, 145, 255, 113, 204,
                                   39, 172, 7,   98, 255, 66,  157};
    static const uint8_t bottom[] = {243, 78,  169, 0,   115, 206, 29,  152, 243, 98,  189,
                                     0,   135, 226, 29,  172, 0,   98,  209, 12,  135, 243,
                                     78,  169, 0,   115, 206, 29,  152, 243, 98,  189, 0,
                                     135, 226, 29,  172, 0,   98,  209, 12,  135};
    static const uint8_t part[] = {64,  150, 75,  119, 235, 25,  180, 93,  110, 122, 204, 31,
                                   185, 23,  108, 213, 71,  165, 200, 102, 107, 156, 52,  170,
                                   23,  137, 198, 231, 76,  162, 50,  131, 247, 98,  192, 105,
                                   26,  130, 216, 103, 215, 35,  160, 73,  83};
    df_image *out;
    assert_int_equal(
        df_image_resize_box(img, 1, 5, DF_RESAMPLE_BICUBIC, (double[4]){0, 0, 0, 5}, &out), DF_OK);
    assert_memory_equal(out->pixels, left, sizeof left);
    df_image_free(out);
    assert_int_equal(
        df_image_resize_box(img, 7, 2, DF_RESAMPLE_BICUBIC, (double[4]){0, 5, 7, 5}, &out), DF_OK);
    assert_memory_equal(out->pixels, bottom, sizeof bottom);
    df_image_free(out);
    assert_int_equal(
        df_image_resize_box(img, 3, 5, DF_RESAMPLE_LANCZOS, (double[4]){1.5, 0, 6, 5}, &out),
        DF_OK);
    assert_memory_equal(out->pixels, part, sizeof part);
    df_image_free(out);
    assert_int_equal(
        df_image_resize_box(img, 3, 2, DF_RESAMPLE_LANCZOS, (double[4]){0, 0, 8, 5}, &out),
        DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "not inside the 7x5 image"));
    df_image_free(img);
}

static df_status check(const df_pipeline_kind *cls, const df_gen_params *g)
{
    df_pipeline p = {.cls = cls};
    strcpy(p.dir, "models/x");
    return df_inpaint_check(&p, g);
}

static void test_bad_masks_are_refused(void **state)
{
    (void)state;
    df_image *img = filled(64, 48, 1, 2, 3), *mask = filled(64, 48, 255, 255, 255);
    df_image *other = filled(48, 64, 255, 255, 255);
    assert_int_equal(check(&df_flux_pipeline_class, &(df_gen_params){.image = img, .mask = mask}),
                     DF_OK);
    assert_int_equal(check(&df_sd3_inpaint_pipeline_class,
                           &(df_gen_params){.image = img, .mask = mask, .padding_mask_crop = 8}),
                     DF_OK);
    assert_int_equal(check(&df_flux2_pipeline_class, &(df_gen_params){.image = img, .mask = mask}),
                     DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "not Flux2Pipeline"));
    assert_int_equal(check(&df_flux_pipeline_class, &(df_gen_params){.mask = mask}), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "needs an input image"));
    assert_int_equal(check(&df_flux_pipeline_class, &(df_gen_params){.image = img, .mask = other}),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "the mask is 48x64 but the input image is 64x48"));
    assert_int_equal(check(&df_flux_inpaint_pipeline_class, &(df_gen_params){.image = img}),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "FluxInpaintPipeline needs"));
    assert_int_equal(check(&df_flux_pipeline_class, &(df_gen_params){.padding_mask_crop = 4}),
                     DF_E_ARG);
    assert_int_equal(check(&df_sd3_pipeline_class,
                           &(df_gen_params){.image = img, .mask = mask, .padding_mask_crop = -1}),
                     DF_E_ARG);
    df_image_free(img), df_image_free(mask), df_image_free(other);
}

static void test_mask_parameters_round_trip(void **state)
{
    (void)state;
    df_image_params p = {.prompt = "a tulip",
                         .steps = 4,
                         .seed = 3,
                         .width = 64,
                         .height = 64,
                         .denoising_strength = 0.8,
                         .init_image = "in.png",
                         .init_image_hash = "ab",
                         .mask_image = "the mask, v2.png",
                         .mask_image_hash = "cd",
                         .mask_padding = 32};
    char *text;
    assert_int_equal(df_image_format_parameters(&p, &text), DF_OK);
    assert_non_null(strstr(text, "Init image hash: ab, Mask image: \"the mask, v2.png\", "
                                 "Mask image hash: cd, Masked area padding: 32"));
    df_image_params q;
    assert_int_equal(df_image_parse_parameters(text, &q), DF_OK);
    assert_string_equal(q.mask_image, p.mask_image);
    assert_string_equal(q.mask_image_hash, p.mask_image_hash);
    assert_int_equal(q.mask_padding, 32);
    df_image_params_deinit(&q);
    df_image_text_free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mask_grey_and_threshold),
        cmocka_unit_test(test_crop_region_as_get_crop_region),
        cmocka_unit_test(test_overlay_keeps_the_picture_where_the_mask_is_black),
        cmocka_unit_test(test_bad_masks_are_refused),
        cmocka_unit_test(test_mask_parameters_round_trip),
        cmocka_unit_test(test_resize_box_as_pil),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
