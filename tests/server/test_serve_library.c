/*
 * What the library grew for the server, on models/demo: a run stopped by on_step fails with
 * DF_E_CANCELLED, leaves nothing behind (the sanitized build checks for leaks) and the next
 * run on the same pipeline is bit-identical to one never interrupted; PNG in memory is the
 * file df_image_save_png writes, byte for byte; host_step as a run parameter picks the path
 * (the same bits, different work); the log hook receives the library's lines.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/diffuse.h>

#include "core/status.h"

#define PROMPT "a large yellow circle in the top left corner on a blue background"

static df_pipeline *pipe_;

static int setup(void **state)
{
    (void)state;
    if (df_pipeline_load(DF_DEMO_MODEL, &(df_load_opts){.threads = 2}, &pipe_) != DF_OK) {
        fprintf(stderr, "%s\n", df_error_message());
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    df_pipeline_free(pipe_);
    return 0;
}

typedef struct stopper {
    int stop_at; /* on_step returns false at this step */
    int calls, first_step;
} stopper;

static bool stop_at(int step, int steps, double elapsed, void *user)
{
    (void)steps;
    (void)elapsed;
    stopper *s = user;
    if (s->calls++ == 0)
        s->first_step = step;
    return step != s->stop_at;
}

static df_image *run(df_gen_params g)
{
    df_gen_output out;
    g.prompt = PROMPT;
    g.width = g.height = 64;
    g.steps = 4;
    g.seed = 42;
    if (df_pipeline_run(pipe_, &g, &out) != DF_OK)
        fail_msg("%s", df_error_message());
    df_image *img = out.images[0];
    out.images[0] = NULL;
    df_gen_output_free(&out);
    return img;
}

static void test_on_step_cancels_and_the_next_run_is_unchanged(void **state)
{
    (void)state;
    df_image *before = run((df_gen_params){0});
    for (int at = 0; at <= 3; at++) {
        stopper s = {.stop_at = at};
        df_gen_output out;
        df_gen_params g = {.prompt = PROMPT,
                           .width = 64,
                           .height = 64,
                           .steps = 4,
                           .seed = 42,
                           .on_step = stop_at,
                           .progress_user = &s};
        assert_int_equal(df_pipeline_run(pipe_, &g, &out), DF_E_CANCELLED);
        assert_non_null(strstr(df_error_message(), "cancelled"));
        assert_int_equal(out.count, 0);
        assert_null(out.images);
        assert_int_equal(s.first_step, 0); /* before the first step too */
        assert_int_equal(s.calls, at + 1);
    }
    stopper never = {.stop_at = -1};
    df_image *after = run((df_gen_params){.on_step = stop_at, .progress_user = &never});
    assert_int_equal(never.calls, 5); /* step 0, then 1..4 */
    assert_memory_equal(before->pixels, after->pixels, 64 * 64 * 3);
    df_image_free(before);
    df_image_free(after);
}

static void test_png_in_memory_is_the_saved_file(void **state)
{
    (void)state;
    df_image *img = run((df_gen_params){0});
    void *png;
    size_t len;
    assert_int_equal(df_image_encode_png(img, "a prompt\nSteps: 4", &png, &len), DF_OK);
    char path[512];
    snprintf(path, sizeof path, "%s/serve-library.png", DF_TEST_TMP);
    assert_int_equal(df_image_save_png(img, path, "a prompt\nSteps: 4"), DF_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *file = malloc(len + 1);
    size_t got = fread(file, 1, len + 1, f);
    fclose(f);
    assert_int_equal(got, len);
    assert_memory_equal(file, png, len);
    free(file);
    df_image_png_free(png);

    df_image bad = {.width = 4, .height = 4, .channels = 3, .pixels = NULL};
    png = (void *)1;
    assert_int_equal(df_image_encode_png(&bad, NULL, &png, &len), DF_E_ARG);
    assert_null(png);
    assert_int_equal(df_image_encode_png(img, "\xff not UTF-8", &png, &len), DF_E_ARG);
    assert_null(png);
    df_image_free(img);
}

static void test_host_step_parameter_picks_the_path(void **state)
{
    (void)state;
    df_stats st;
    df_stats_reset(df_pipeline_ctx(pipe_));
    df_image *host = run((df_gen_params){.host_step = 1});
    df_ctx_stats(df_pipeline_ctx(pipe_), &st);
    int64_t host_ops = st.ops_enqueued;
    df_stats_reset(df_pipeline_ctx(pipe_));
    df_image *device = run((df_gen_params){.host_step = -1});
    df_ctx_stats(df_pipeline_ctx(pipe_), &st);
    assert_memory_equal(host->pixels, device->pixels, 64 * 64 * 3);
    assert_int_not_equal(host_ops, st.ops_enqueued); /* the device path steps with ops */
    df_image_free(host);
    df_image_free(device);
}

typedef struct log_seen {
    int level, lines;
    char last[256];
} log_seen;

static void hook(int level, const char *line, void *user)
{
    log_seen *s = user;
    s->level = level;
    s->lines++;
    snprintf(s->last, sizeof s->last, "%s", line);
}

static void test_log_hook_receives_lines(void **state)
{
    (void)state;
    log_seen seen = {.level = -1};
    df_set_log_fn(hook, &seen);
    df_logf(0, "warning: %s has %d unused tensors", "x.safetensors", 3);
    df_logf(2, "detail");
    df_set_log_fn(NULL, NULL);
    df_logf(1, "to stderr, not the hook");
    assert_int_equal(seen.lines, 2);
    assert_int_equal(seen.level, 2);
    assert_string_equal(seen.last, "detail");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_on_step_cancels_and_the_next_run_is_unchanged),
        cmocka_unit_test(test_png_in_memory_is_the_saved_file),
        cmocka_unit_test(test_host_step_parameter_picks_the_path),
        cmocka_unit_test(test_log_hook_receives_lines),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
