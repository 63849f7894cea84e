/*
 * diffuse serve's request layer (tools/diffuse/serve_request.c): base64 against RFC 4648's
 * vectors, JSON string escaping, and the two protocols' bodies to a serve_request, with the
 * messages that name the field at fault; pictures in (A1111 img2img's base64 init_images,
 * OpenAI edits' form parts), with theirs.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "serve.h"

static const serve_limits lim = {.max_pixels = 2048 * 2048};

static void test_base64_rfc4648_vectors(void **state)
{
    (void)state;
    const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    const char *coded[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (int i = 0; i < 7; i++) {
        serve_buf b = {0};
        serve_buf_puts(&b, "");
        serve_buf_base64(&b, plain[i], strlen(plain[i]));
        assert_string_equal(b.data, coded[i]);
        uint8_t out[16];
        int64_t n = serve_base64_decode(coded[i], strlen(coded[i]), out);
        assert_int_equal(n, (int64_t)strlen(plain[i]));
        assert_memory_equal(out, plain[i], (size_t)n);
        serve_buf_free(&b);
    }
    uint8_t out[16];
    assert_int_equal(serve_base64_decode("Zm9v!", 5, out), -1); /* not in the alphabet */
    assert_int_equal(serve_base64_decode("Zm9vY", 5, out), -1); /* 4n + 1 characters */
}

static void test_base64_all_bytes_round_trip(void **state)
{
    (void)state;
    uint8_t all[256], back[256 / 3 * 3 + 6];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    serve_buf b = {0};
    serve_buf_base64(&b, all, sizeof all);
    assert_int_equal(b.len, (256 + 2) / 3 * 4);
    assert_int_equal(serve_base64_decode(b.data, b.len, back), 256);
    assert_memory_equal(back, all, 256);
    serve_buf_free(&b);
}

static void test_json_string_escapes(void **state)
{
    (void)state;
    serve_buf b = {0};
    serve_buf_json_str(&b, "a\"b\\c\nd\x01");
    assert_string_equal(b.data, "\"a\\\"b\\\\c\\nd\\u0001\"");
    serve_buf_free(&b);
}

static void test_a1111_fields(void **state)
{
    (void)state;
    const char *body = "{\"prompt\": \"a red circle\", \"negative_prompt\": \"blur\", "
                       "\"steps\": 8, \"cfg_scale\": 3.5, \"width\": 512, \"height\": 256, "
                       "\"seed\": 42, \"batch_size\": 2, \"n_iter\": 3, "
                       "\"sampler_name\": \"Euler\", \"sampler_index\": \"Euler a\", "
                       "\"scheduler\": \"automatic\", \"restore_faces\": false, "
                       "\"override_settings\": {\"sd_model_checkpoint\": \"schnell\"}}";
    serve_request r;
    serve_error e;
    assert_int_equal(serve_parse_a1111(body, strlen(body), &lim, &r, &e), 0);
    assert_string_equal(r.prompt, "a red circle");
    assert_string_equal(r.negative_prompt, "blur");
    assert_string_equal(r.model, "schnell");
    assert_int_equal(r.steps, 8);
    assert_int_equal(r.width, 512);
    assert_int_equal(r.height, 256);
    assert_int_equal(r.images, 6);
    assert_true(r.guidance_set);
    assert_true(r.guidance == 3.5f);
    assert_false(r.seed_random);
    assert_int_equal(r.seed, 42);
    serve_request_deinit(&r);

    const char *random_seed = "{\"prompt\": \"x\", \"seed\": -1}";
    assert_int_equal(serve_parse_a1111(random_seed, strlen(random_seed), &lim, &r, &e), 0);
    assert_true(r.seed_random);
    assert_int_equal(r.images, 1);
    serve_request_deinit(&r);
}

/* Each bad body is a 400 whose param and message name the field. */
static void test_a1111_errors_name_the_field(void **state)
{
    (void)state;
    static const struct {
        const char *body, *param, *in_message;
    } cases[] = {
        {"{\"prompt\": \"x\", \"sampler_name\": \"DPM++ 2M\"}", "sampler_name", "'Euler'"},
        {"{\"prompt\": \"x\", \"scheduler\": \"karras\"}", "scheduler", "automatic"},
        {"{\"prompt\": \"x\", \"width\": 100}", "width", "multiple of 16"},
        {"{\"prompt\": \"x\", \"width\": 4096, \"height\": 4096}", "width", "--max-pixels"},
        {"{\"prompt\": \"x\", \"steps\": 0}", "steps", "[1, 1000]"},
        {"{\"prompt\": \"x\", \"steps\": \"8\"}", "steps", "steps"},
        {"{\"prompt\": \"x\", \"batch_size\": 16, \"n_iter\": 2}", "batch_size", "at most 16"},
        {"{\"prompt\": \"x\", \"cfg_scale\": -1}", "cfg_scale", "cfg_scale"},
        {"{\"prompt\": \"x\", \"enable_hr\": true}", "enable_hr", "hires"},
        {"{\"prompt\": \"x\", \"override_settings\": 3}", "override_settings", "object"},
        {"{\"negative_prompt\": \"x\"}", "prompt", "required"},
        {"[]", "", "object"},
        {"{\"prompt\": \"x\",}", "", "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        serve_request r;
        serve_error e;
        int st = serve_parse_a1111(cases[i].body, strlen(cases[i].body), &lim, &r, &e);
        if (st != 400 || strcmp(e.param, cases[i].param) || !strstr(e.message, cases[i].in_message))
            fail_msg("%s: got %d, param '%s', message '%s'", cases[i].body, st, e.param, e.message);
        assert_null(r.prompt);
    }
}

static void test_openai_fields(void **state)
{
    (void)state;
    const char *body = "{\"model\": \"demo\", \"prompt\": \"a cat\", \"n\": 3, "
                       "\"size\": \"1024x768\", \"response_format\": \"url\", "
                       "\"quality\": \"hd\", \"seed\": 7, \"steps\": 4, \"guidance\": 0}";
    serve_request r;
    serve_error e;
    assert_int_equal(serve_parse_openai(body, strlen(body), &lim, &r, &e), 0);
    assert_string_equal(r.model, "demo");
    assert_int_equal(r.images, 3);
    assert_int_equal(r.width, 1024);
    assert_int_equal(r.height, 768);
    assert_true(r.want_url);
    assert_int_equal(r.seed, 7);
    assert_int_equal(r.steps, 4);
    assert_true(r.guidance_set);
    serve_request_deinit(&r);

    const char *bad[][2] = {
        {"{\"prompt\": \"x\", \"size\": \"1024\"}", "size"},
        {"{\"prompt\": \"x\", \"size\": \"1024x1000\"}", "size"},
        {"{\"prompt\": \"x\", \"size\": \"16x16x16\"}", "size"},
        {"{\"prompt\": \"x\", \"n\": 17}", "n"},
        {"{\"prompt\": \"x\", \"response_format\": \"png\"}", "response_format"},
        {"{\"prompt\": 1}", "prompt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = serve_parse_openai(bad[i][0], strlen(bad[i][0]), &lim, &r, &e);
        if (st != 400 || strcmp(e.param, bad[i][1]))
            fail_msg("%s: got %d, param '%s' (%s)", bad[i][0], st, e.param, e.message);
    }
}

/* A 16x16 PNG of one colour, made by the library, as base64 (caller frees). */
static serve_buf picture(int w, int h, serve_buf *raw)
{
    df_image *img;
    assert_int_equal(df_image_create(w, h, &img), DF_OK);
    memset(img->pixels, 0x80, (size_t)w * h * 3);
    void *png;
    size_t len;
    assert_int_equal(df_image_encode_png(img, NULL, &png, &len), DF_OK);
    serve_buf b = {0};
    serve_buf_base64(&b, png, len);
    if (raw)
        serve_buf_put(raw, png, len);
    df_image_png_free(png);
    df_image_free(img);
    return b;
}

static int img2img(const char *fmt, const char *a, const char *b, serve_request *r, serve_error *e)
{
    char body[8192];
    snprintf(body, sizeof body, fmt, a, b);
    return serve_parse_a1111_img2img(body, strlen(body), &lim, r, e);
}

static void test_img2img_fields_and_errors(void **state)
{
    (void)state;
    serve_buf p16 = picture(16, 16, NULL), p32 = picture(32, 32, NULL), odd = picture(20, 16, NULL);
    serve_request r;
    serve_error e;
    assert_int_equal(img2img("{\"prompt\": \"x\", \"init_images\": [\"data:image/png;base64,%s\"], "
                             "\"mask\": \"%s\", \"inpaint_full_res\": true, "
                             "\"inpaint_full_res_padding\": 12}",
                             p16.data, p16.data, &r, &e),
                     0);
    assert_int_equal(r.n_inputs, 1);
    assert_int_equal(r.width, 16); /* the picture's size */
    assert_non_null(r.mask);
    assert_int_equal(r.padding_mask_crop, 12);
    assert_true(r.strength == 0.75); /* A1111's default */
    serve_request_deinit(&r);

    static const struct {
        const char *fmt, *param, *in_message;
    } bad[] = {
        {"{\"prompt\": \"x\", \"init_images\": [\"%s\"], \"mask\": \"%s\"}", "mask", "16x16"},
        {"{\"prompt\": \"x\", \"init_images\": [\"%s\", 1], \"x\": \"%s\"}", "init_images", "[1]"},
        {"{\"prompt\": \"x\", \"init_images\": \"%s\", \"x\": \"%s\"}", "init_images", "list"},
        {"{\"prompt\": \"x\", \"init_images\": [\"%s\"], \"denoising_strength\": 0, \"x\": \"%s\"}",
         "denoising_strength", "(0, 1]"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int st = img2img(bad[i].fmt, i == 0 ? p32.data : p16.data, p16.data, &r, &e);
        if (st != 400 || strcmp(e.param, bad[i].param) || !strstr(e.message, bad[i].in_message))
            fail_msg("case %zu: got %d, param '%s', message '%s'", i, st, e.param, e.message);
        assert_int_equal(r.n_inputs, 0);
    }
    /* a 20x16 picture needs a size; with one it is resized */
    assert_int_equal(
        img2img("{\"prompt\": \"x\", \"init_images\": [\"%s\"]%s}", odd.data, "", &r, &e), 400);
    assert_non_null(strstr(e.message, "multiples of 16"));
    assert_int_equal(img2img("{\"prompt\": \"x\", \"init_images\": [\"%s\"]%s}", odd.data,
                             ", \"width\": 32, \"height\": 16", &r, &e),
                     0);
    assert_int_equal(r.width, 32);
    serve_request_deinit(&r);
    serve_buf_free(&p16), serve_buf_free(&p32), serve_buf_free(&odd);
}

static void add_part(serve_form *f, const char *name, bool file, const void *data, size_t n)
{
    serve_form_part *p = &f->parts[f->n++];
    snprintf(p->name, sizeof p->name, "%s", name);
    p->is_file = file;
    serve_buf_put(&p->data, data, n);
}

static void test_edit_form(void **state)
{
    (void)state;
    serve_buf raw16 = {0}, raw32 = {0};
    serve_buf b16 = picture(16, 16, &raw16), b32 = picture(32, 32, &raw32);
    serve_form f = {0};
    add_part(&f, "prompt", false, "42", 2); /* a numeric-looking prompt stays a string */
    add_part(&f, "n", false, "2", 1);
    add_part(&f, "strength", false, "0.5", 3);
    add_part(&f, "image[]", true, raw16.data, raw16.len);
    add_part(&f, "image[]", true, raw16.data, raw16.len);
    add_part(&f, "response_format", false, "b64_json", 8);
    serve_request r;
    serve_error e;
    assert_int_equal(serve_parse_openai_edit(&f, &lim, &r, &e), 0);
    assert_string_equal(r.prompt, "42");
    assert_int_equal(r.images, 2);
    assert_int_equal(r.n_inputs, 2);
    assert_true(r.strength == 0.5);
    assert_int_equal(r.width, 16);
    serve_request_deinit(&r);

    add_part(&f, "mask", true, raw32.data, raw32.len);
    assert_int_equal(serve_parse_openai_edit(&f, &lim, &r, &e), 400);
    assert_string_equal(e.param, "mask");
    serve_form_free(&f);

    add_part(&f, "prompt", true, "x", 1);
    add_part(&f, "image", true, raw16.data, raw16.len);
    assert_int_equal(serve_parse_openai_edit(&f, &lim, &r, &e), 400);
    assert_string_equal(e.param, "prompt"); /* a file where text belongs */
    serve_form_free(&f);

    add_part(&f, "prompt", false, "x", 1);
    add_part(&f, "n", false, "1", 1);
    add_part(&f, "n", false, "2", 1);
    assert_int_equal(serve_parse_openai_edit(&f, &lim, &r, &e), 400);
    assert_string_equal(e.param, "n");
    serve_form_free(&f);

    f.too_many = true;
    assert_int_equal(serve_parse_openai_edit(&f, &lim, &r, &e), 400);
    assert_non_null(strstr(e.message, "parts"));
    serve_form_free(&f);
    serve_buf_free(&raw16), serve_buf_free(&raw32), serve_buf_free(&b16), serve_buf_free(&b32);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_rfc4648_vectors),
        cmocka_unit_test(test_base64_all_bytes_round_trip),
        cmocka_unit_test(test_json_string_escapes),
        cmocka_unit_test(test_a1111_fields),
        cmocka_unit_test(test_a1111_errors_name_the_field),
        cmocka_unit_test(test_openai_fields),
        cmocka_unit_test(test_img2img_fields_and_errors),
        cmocka_unit_test(test_edit_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
