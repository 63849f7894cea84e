/*
 * diffuse serve's request layer (tools/diffuse/serve_request.c): base64 against RFC 4648's
 * vectors, JSON string escaping, and the two protocols' bodies to a serve_request, with the
 * messages that name the field at fault.
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_base64_rfc4648_vectors),
        cmocka_unit_test(test_base64_all_bytes_round_trip),
        cmocka_unit_test(test_json_string_escapes),
        cmocka_unit_test(test_a1111_fields),
        cmocka_unit_test(test_a1111_errors_name_the_field),
        cmocka_unit_test(test_openai_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
