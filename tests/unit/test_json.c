/*
 * Tests of the JSON layer: typed getters and their messages, navigation, the strict parse
 * (syntax errors with line and column, UTF-8, control characters, \u0000, duplicate keys,
 * deep nesting, trailing text), files that are not regular files, and out-of-memory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/json.h>

#include "core/alloc.h"
#include "unit/io_files.h"

static df_json *parse(const char *text)
{
    df_json *j = NULL;
    df_status s = df_json_parse_string(text, strlen(text), "cfg.json", &j);
    if (s != DF_OK)
        fail_msg("parse failed: %s", df_error_message());
    return j;
}

/* Asserts that parsing `text` fails with `status` and a message containing `word`. */
static void expect_parse_error(const char *text, size_t len, df_status status, const char *word)
{
    df_json *j = (df_json *)1;
    df_status s = df_json_parse_string(text, len, "bad.json", &j);
    if (s != status || !strstr(df_error_message(), word))
        fail_msg("parsing '%.40s': got %s '%s', expected %s with '%s'", text, df_status_name(s),
                 df_error_message(), df_status_name(status), word);
    assert_null(j);
    assert_non_null(strstr(df_error_message(), "bad.json"));
}

static void test_getters(void **state)
{
    (void)state;
    df_json *cfg = parse("{\"num_layers\": 19, \"patch_size\": null, \"theta\": 10000.5,\n"
                         " \"guidance_embeds\": false, \"_class_name\": \"FluxTransformer2DModel\","
                         " \"axes_dims_rope\": [16, 56, 56], \"shift\": 3}");
    int64_t v;
    assert_int_equal(df_json_get_int(cfg, "num_layers", &v), DF_OK);
    assert_int_equal(v, 19);
    assert_int_equal(df_json_get_int_or(cfg, "patch_size", 1, &v), DF_OK); /* null */
    assert_int_equal(v, 1);
    assert_int_equal(df_json_get_int_or(cfg, "absent", 7, &v), DF_OK);
    assert_int_equal(v, 7);
    double d;
    assert_int_equal(df_json_get_double(cfg, "theta", &d), DF_OK);
    assert_true(d == 10000.5);
    assert_int_equal(df_json_get_double(cfg, "shift", &d), DF_OK); /* an integer is a number */
    assert_true(d == 3.0);
    assert_int_equal(df_json_get_double_or(cfg, "absent", 0.25, &d), DF_OK);
    assert_true(d == 0.25);
    bool b = true;
    assert_int_equal(df_json_get_bool(cfg, "guidance_embeds", &b), DF_OK);
    assert_false(b);
    assert_int_equal(df_json_get_bool_or(cfg, "absent", true, &b), DF_OK);
    assert_true(b);
    const char *s;
    assert_int_equal(df_json_get_string(cfg, "_class_name", &s), DF_OK);
    assert_string_equal(s, "FluxTransformer2DModel");
    assert_int_equal(df_json_get_string_or(cfg, "absent", "x", &s), DF_OK);
    assert_string_equal(s, "x");
    int64_t axes[4], n;
    assert_int_equal(df_json_get_int_array(cfg, "axes_dims_rope", axes, 4, &n), DF_OK);
    assert_int_equal(n, 3);
    assert_int_equal(axes[0] + axes[1] + axes[2], 128);
    double da[3];
    assert_int_equal(df_json_get_double_array(cfg, "axes_dims_rope", da, 3, &n), DF_OK);
    assert_true(da[2] == 56.0);
    assert_string_equal(df_json_source(cfg), "cfg.json");
    df_json_free(cfg);
}

/* Asserts status DF_E_FORMAT and that the message holds every word given. */
static void expect_msg(df_status s, const char *w1, const char *w2, const char *w3)
{
    const char *m = df_error_message();
    if (s != DF_E_FORMAT || !strstr(m, w1) || (w2 && !strstr(m, w2)) || (w3 && !strstr(m, w3)))
        fail_msg("got %s '%s', expected DF_E_FORMAT with '%s' '%s' '%s'", df_status_name(s), m,
                 w1, w2 ? w2 : "", w3 ? w3 : "");
}

static void test_getter_errors(void **state)
{
    (void)state;
    df_json *cfg = parse("{\"num_layers\": \"19\", \"half\": 1.5, \"huge\": 1e300,"
                         " \"nested\": {\"list\": [1, \"two\"]}, \"nul\": null, \"b\": 1,"
                         " \"inf\": 1e999, \"long\": [1,2,3,4,5]}");
    int64_t v;
    expect_msg(df_json_get_int(cfg, "num_layers", &v), "cfg.json: key 'num_layers'",
               "expected an integer", "found string");
    expect_msg(df_json_get_int(cfg, "missing_key", &v), "cfg.json", "'missing_key'", "missing");
    expect_msg(df_json_get_int(cfg, "half", &v), "'half'", "1.5", NULL);
    expect_msg(df_json_get_int(cfg, "huge", &v), "'huge'", "out of range", NULL);
    expect_msg(df_json_get_int(cfg, "nul", &v), "'nul'", "found null", NULL);
    expect_msg(df_json_get_int_or(cfg, "num_layers", 3, &v), "'num_layers'", "found string",
               NULL);
    double d;
    expect_msg(df_json_get_double(cfg, "inf", &d), "'inf'", "finite", NULL);
    bool b;
    expect_msg(df_json_get_bool(cfg, "b", &b), "'b'", "true or false", "found number");
    const char *s;
    expect_msg(df_json_get_string(cfg, "half", &s), "'half'", "a string", NULL);
    assert_null(s);
    const df_json *nested;
    assert_int_equal(df_json_get_object(cfg, "nested", &nested), DF_OK);
    int64_t arr[4], n;
    expect_msg(df_json_get_int_array(nested, "list", arr, 4, &n), "'nested.list[1]'",
               "expected an integer", "found string");
    expect_msg(df_json_get_int_array(cfg, "long", arr, 4, &n), "'long'", "at most 4", NULL);
    expect_msg(df_json_get_int(nested, "x", &v), "'nested.x'", "missing", NULL);
    expect_msg(df_json_get_object(cfg, "half", &nested), "'half'", "an object", NULL);
    assert_null(nested);
    /* A getter on something that is not an object. */
    df_json *arrdoc = parse("[1, 2]");
    expect_msg(df_json_get_int(arrdoc, "x", &v), "top-level value", "an object", "array");
    assert_int_equal(df_json_get_int(NULL, "x", &v), DF_E_ARG);
    df_json_free(arrdoc);
    df_json_free(cfg);
}

/* Integers are read from their digits, not through a double: every 64-bit value is exact. */
static void test_exact_integers(void **state)
{
    (void)state;
    df_json *cfg = parse("{\"max\": 9223372036854775807, \"min\": -9223372036854775808,"
                         " \"u64\": 18446744073709551615, \"odd\": 9007199254740993,"
                         " \"over\": 18446744073709551616, \"i64_over\": 9223372036854775808,"
                         " \"neg\": -1, \"zero\": -0, \"three\": 3.0, \"e3\": 1e3,"
                         " \"big_e\": 1e17, \"tricky\": 9007199254740993.0,"
                         " \"seeds\": [0, 4294967301, 18446744073709551615]}");
    int64_t v;
    uint64_t u;
    assert_int_equal(df_json_get_int(cfg, "max", &v), DF_OK);
    assert_true(v == INT64_MAX);
    assert_int_equal(df_json_get_int(cfg, "min", &v), DF_OK);
    assert_true(v == INT64_MIN);
    assert_int_equal(df_json_get_int(cfg, "odd", &v), DF_OK); /* 2^53 + 1: no double holds it */
    assert_true(v == 9007199254740993LL);
    assert_int_equal(df_json_get_uint64(cfg, "u64", &u), DF_OK);
    assert_true(u == UINT64_MAX);
    assert_int_equal(df_json_get_uint64(cfg, "max", &u), DF_OK);
    assert_true(u == (uint64_t)INT64_MAX);
    assert_int_equal(df_json_get_int(cfg, "zero", &v), DF_OK);
    assert_true(v == 0);
    assert_int_equal(df_json_get_uint64(cfg, "zero", &u), DF_OK); /* -0 is not negative */
    assert_int_equal(df_json_get_int(cfg, "three", &v), DF_OK);
    assert_true(v == 3);
    assert_int_equal(df_json_get_int(cfg, "e3", &v), DF_OK);
    assert_true(v == 1000);
    const df_json *seeds;
    assert_int_equal(df_json_get_array(cfg, "seeds", &seeds), DF_OK);
    assert_int_equal(df_json_to_uint64(df_json_array_get(seeds, 1), &u), DF_OK);
    assert_true(u == 4294967301ULL);
    assert_int_equal(df_json_to_uint64(df_json_array_get(seeds, 2), &u), DF_OK);
    assert_true(u == UINT64_MAX);
    /* Messages give the number as written. */
    expect_msg(df_json_get_int(cfg, "u64", &v), "'u64'", "18446744073709551615", "out of range");
    expect_msg(df_json_get_int(cfg, "i64_over", &v), "9223372036854775808", "out of range",
               NULL);
    expect_msg(df_json_get_uint64(cfg, "over", &u), "'over'", "out of range", NULL);
    expect_msg(df_json_get_uint64(cfg, "neg", &u), "'neg'", "non-negative", "-1");
    /* A fraction or exponent is a double: whole values past 2^53 may have been rounded. */
    expect_msg(df_json_get_int(cfg, "big_e", &v), "'big_e'", "write the digits", NULL);
    expect_msg(df_json_get_int(cfg, "tricky", &v), "'tricky'", "write the digits", NULL);
    assert_true(df_json_number(df_json_get(cfg, "max")) == 9223372036854775807.0);
    df_json_free(cfg);
}

/* Numbers follow JSON's grammar, which cJSON alone does not enforce. */
static void test_number_grammar(void **state)
{
    (void)state;
    const char *bad[] = {"[+1]", "[01]", "[1.]", "[.5]", "[-]", "[1e]", "[1e+]", "[-01]",
                         "{\"a\": 1.5e}", "[0x10]", "[1E5.0]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_parse_error(bad[i], strlen(bad[i]), DF_E_FORMAT, "bad.json:1:");
    expect_parse_error("{\"k\": \"1\", \"a\": 01}", 19, DF_E_FORMAT,
                       "1:17: invalid number near '01}'");
    df_json *ok = parse("[0, -0, 0.5, -1.25e-3, 1E+2, 10, \"1\\\"2\", {\"3\": 4}, 5e0]");
    double want[] = {0, 0, 0.5, -1.25e-3, 100, 10};
    for (int i = 0; i < 6; i++)
        assert_true(df_json_number(df_json_array_get(ok, i)) == want[i]);
    int64_t v;
    assert_int_equal(df_json_get_int(df_json_array_get(ok, 7), "3", &v), DF_OK);
    assert_true(v == 4);
    assert_int_equal(df_json_to_int(df_json_array_get(ok, 8), &v), DF_OK);
    assert_true(v == 5);
    df_json_free(ok);
}

static void test_navigation(void **state)
{
    (void)state;
    df_json *j = parse("{\"z\": 1, \"a\": [true, null, \"s\", 2.5, {\"k\": []}], \"m\": {}}");
    assert_int_equal(df_json_type_of(j), DF_JSON_OBJECT);
    assert_int_equal(df_json_object_size(j), 3);
    const char *key;
    df_json_object_at(j, 0, &key);
    assert_string_equal(key, "z"); /* file order, not sorted */
    df_json_object_at(j, 2, &key);
    assert_string_equal(key, "m");
    assert_null(df_json_object_at(j, 3, &key));
    assert_null(key);
    const df_json *a = df_json_get(j, "a");
    assert_int_equal(df_json_array_size(a), 5);
    assert_true(df_json_bool(df_json_array_get(a, 0)));
    assert_true(df_json_is_null(df_json_array_get(a, 1)));
    assert_true(df_json_is_null(df_json_get(j, "absent")));
    assert_false(df_json_is_null(df_json_get(j, "z")));
    assert_string_equal(df_json_string(df_json_array_get(a, 2)), "s");
    assert_true(df_json_number(df_json_array_get(a, 3)) == 2.5);
    assert_null(df_json_array_get(a, 5));
    assert_null(df_json_array_get(a, -1));
    assert_null(df_json_get(a, "k")); /* not an object */
    char path[64];
    const df_json *inner = df_json_get(df_json_array_get(a, 4), "k");
    assert_string_equal(df_json_path(inner, path, sizeof path), "a[4].k");
    assert_string_equal(df_json_path(j, path, sizeof path), "");
    assert_int_equal(df_json_type_of(inner), DF_JSON_ARRAY);
    assert_int_equal(df_json_object_size(df_json_get(j, "m")), 0);
    df_json_free((df_json *)inner); /* not a root: ignored */
    df_json_free(j);
    df_json_free(NULL);
}

static void test_large_object(void **state)
{
    (void)state;
    enum { N = 3000 };
    char *text = malloc(N * 32 + 16);
    size_t n = 0;
    n += (size_t)sprintf(text + n, "{");
    for (int i = 0; i < N; i++)
        n += (size_t)sprintf(text + n, "%s\"key%d\": %d", i ? "," : "", (i * 7919) % N, i);
    sprintf(text + n, "}");
    df_json *j = parse(text);
    for (int i = 0; i < N; i++) {
        char key[16];
        sprintf(key, "key%d", (i * 7919) % N);
        int64_t v;
        assert_int_equal(df_json_get_int(j, key, &v), DF_OK);
        assert_int_equal(v, i);
    }
    df_json_free(j);
    free(text);
}

static void test_strings(void **state)
{
    (void)state;
    df_json *j = parse("{\"e\": \"caf\\u00e9\", \"pair\": \"\\ud83d\\ude00\", \"raw\": \"\xc3\xa9\","
                       " \"esc\": \"a\\\"b\\\\c\\n\"}");
    assert_string_equal(df_json_string(df_json_get(j, "e")), "caf\xc3\xa9");
    assert_string_equal(df_json_string(df_json_get(j, "pair")), "\xf0\x9f\x98\x80");
    assert_string_equal(df_json_string(df_json_get(j, "raw")), "\xc3\xa9");
    assert_string_equal(df_json_string(df_json_get(j, "esc")), "a\"b\\c\n");
    df_json_free(j);
}

static void test_syntax_errors(void **state)
{
    (void)state;
    const char *multi = "{\n  \"a\": 1,\n  \"b\": [1, 2,]\n}";
    expect_parse_error(multi, strlen(multi), DF_E_FORMAT, "bad.json:3:");
    expect_parse_error("{\"a\": 1,}", 9, DF_E_FORMAT, "invalid JSON");
    expect_parse_error("{\"a\": 1} x", 10, DF_E_FORMAT, "unexpected text");
    expect_parse_error("{\"a\": \"x", 8, DF_E_FORMAT, "unterminated");
    expect_parse_error("{\"a\": \"x\ty\"}", 12, DF_E_FORMAT, "control character");
    expect_parse_error("{\"a\": \"\xff\"}", 10, DF_E_FORMAT, "UTF-8");
    expect_parse_error("{\"a\": \"\xed\xa0\x80\"}", 12, DF_E_FORMAT, "UTF-8"); /* surrogate */
    expect_parse_error("{\"a\": \"\xc3\"}", 10, DF_E_FORMAT, "UTF-8");         /* cut short */
    expect_parse_error("{\"a\": \"x\\u0000y\"}", 17, DF_E_FORMAT, "NUL");
    expect_parse_error("{\"a\": 1, \"a\": 2}", 16, DF_E_FORMAT, "duplicate key 'a'");
    expect_parse_error("{\"o\": {\"k\": 1, \"k\": 1}}", 23, DF_E_FORMAT, "object 'o'");
    expect_parse_error("", 0, DF_E_FORMAT, "invalid JSON");
    expect_parse_error("   ", 3, DF_E_FORMAT, "invalid JSON");
    expect_parse_error("{\"a\": 1}\0", 9, DF_E_FORMAT, "unexpected text");
    expect_parse_error("{\"a\": tru}", 10, DF_E_FORMAT, "invalid JSON");
    /* Far deeper nesting than cJSON's limit: an error, not a stack overflow. */
    enum { DEEP = 200000 };
    char *deep = malloc(DEEP);
    memset(deep, '[', DEEP);
    expect_parse_error(deep, DEEP, DF_E_FORMAT, "invalid JSON");
    free(deep);
    /* Length is respected: the text need not end in NUL. */
    df_json *j = NULL;
    assert_int_equal(df_json_parse_string("[1]garbage", 3, NULL, &j), DF_OK);
    assert_string_equal(df_json_source(j), "<string>");
    df_json_free(j);
}

static void test_files(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("json", dir, sizeof dir);
    write_text(path_in(dir, "config.json", path, sizeof path), "{\"x\": [1, 2]}\n");
    df_json *j;
    assert_int_equal(df_json_parse_file(path, &j), DF_OK);
    assert_string_equal(df_json_source(j), path);
    assert_int_equal(df_json_array_size(df_json_get(j, "x")), 2);
    df_json_free(j);

    write_text(path_in(dir, "bad.json", path, sizeof path), "{\"x\": 1\n\"y\": 2}");
    assert_int_equal(df_json_parse_file(path, &j), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "bad.json:2:"));

    assert_int_equal(df_json_parse_file(path_in(dir, "none.json", path, sizeof path), &j),
                     DF_E_IO);
    assert_non_null(strstr(df_error_message(), "none.json"));
    assert_int_equal(df_json_parse_file(dir, &j), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "not a regular file"));
    path_in(dir, "fifo.json", path, sizeof path);
    assert_int_equal(mkfifo(path, 0644), 0);
    assert_int_equal(df_json_parse_file(path, &j), DF_E_IO); /* must not block */
    assert_non_null(strstr(df_error_message(), "not a regular file"));
    assert_null(j);
    remove_tree(dir);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    const char *text = "{\"a\": [1, 2, {\"b\": \"str\"}], \"c\": {\"d\": null, \"e\": true}}";
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t n = 1;; n++) {
        df_json *j = NULL;
        df_alloc_fail_at(n);
        df_status s = df_json_parse_string(text, strlen(text), "oom.json", &j);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            assert_int_equal(df_json_array_size(df_json_get(j, "a")), 3);
            df_json_free(j);
            break;
        }
        assert_int_equal(s, DF_E_OOM);
        assert_null(j);
        assert_int_equal(df_alloc_live(), live);
        failures++;
        assert_true(n < 1000);
    }
    assert_int_equal(df_alloc_live(), live);
    assert_true(failures >= 5); /* cJSON's allocations are reached too */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_getters),       cmocka_unit_test(test_getter_errors),
        cmocka_unit_test(test_exact_integers), cmocka_unit_test(test_number_grammar),
        cmocka_unit_test(test_navigation),    cmocka_unit_test(test_large_object),
        cmocka_unit_test(test_strings),       cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_files),         cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
