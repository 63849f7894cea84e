/*
 * What the library grew for the server, on models/demo: a run stopped by on_step fails with
 * DF_E_CANCELLED, leaves nothing behind (the sanitized build checks for leaks) and the next
 * run on the same pipeline is bit-identical to one never interrupted; PNG in memory is the
 * file df_image_save_png writes, byte for byte; host_step as a run parameter picks the path
 * (the same bits, different work); the log hook receives the library's lines; live
 * previews (df_gen_params.preview) come at the asked steps, approach the final image, are
 * the same on the host and device paths, and leave the run's image unchanged (the demo, and
 * the golden SD3 with guidance and FLUX.2 pipelines; klein shares FLUX.2's loop); the run's
 * int8_attention field does what DIFFUSE_INT8_ATTENTION does, run by run, and the load's
 * int8_keep what DIFFUSE_INT8_KEEP does, pipeline by pipeline.
 */
#include <math.h>
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

typedef struct previews {
    int n, steps[8];
    df_image *img[8];
} previews;

static void keep_preview(int step, int steps, const df_image *img, void *user)
{
    previews *pv = user;
    assert_int_equal(steps, 4);
    assert_int_equal(img->width, 64);
    assert_int_equal(img->height, 64);
    assert_true(pv->n < 8);
    pv->steps[pv->n] = step;
    assert_int_equal(df_image_create(img->width, img->height, &pv->img[pv->n]), DF_OK);
    memcpy(pv->img[pv->n]->pixels, img->pixels, (size_t)img->width * img->height * 3);
    pv->n++;
}

static double mean_abs_diff(const df_image *a, const df_image *b)
{
    double d = 0;
    size_t n = (size_t)a->width * a->height * 3;
    for (size_t i = 0; i < n; i++)
        d += abs((int)a->pixels[i] - (int)b->pixels[i]);
    return d / (double)n;
}

static void previews_free(previews *pv)
{
    for (int i = 0; i < pv->n; i++)
        df_image_free(pv->img[i]);
}

static void test_previews_come_at_the_asked_steps_and_approach_the_image(void **state)
{
    (void)state;
    df_image *plain = run((df_gen_params){0});
    previews every = {0}, host = {0}, second = {0};
    df_image *img = run((df_gen_params){.preview = keep_preview, .progress_user = &every});
    assert_memory_equal(img->pixels, plain->pixels, 64 * 64 * 3); /* previews change nothing */
    assert_int_equal(every.n, 3); /* after steps 1, 2, 3: not the last, the run's own image */
    for (int i = 0; i < 3; i++)
        assert_int_equal(every.steps[i], i + 1);
    double first = mean_abs_diff(every.img[0], img), last = mean_abs_diff(every.img[2], img);
    assert_true(last < first);

    df_image *h =
        run((df_gen_params){.preview = keep_preview, .progress_user = &host, .host_step = 1});
    assert_int_equal(host.n, 3);
    for (int i = 0; i < 3; i++) /* the device path's estimate is the host path's */
        assert_true(mean_abs_diff(host.img[i], every.img[i]) < 0.5);

    df_image *e2 =
        run((df_gen_params){.preview = keep_preview, .progress_user = &second, .preview_every = 2});
    assert_int_equal(second.n, 1);
    assert_int_equal(second.steps[0], 2);
    assert_memory_equal(second.img[0]->pixels, every.img[1]->pixels, 64 * 64 * 3);

    df_gen_output out;
    assert_int_equal(df_pipeline_run(pipe_,
                                     &(df_gen_params){.prompt = PROMPT,
                                                      .width = 64,
                                                      .height = 64,
                                                      .steps = 4,
                                                      .preview = keep_preview,
                                                      .progress_user = &second,
                                                      .preview_every = -1},
                                     &out),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "preview_every"));
    previews_free(&every);
    previews_free(&host);
    previews_free(&second);
    df_image_free(plain);
    df_image_free(img);
    df_image_free(h);
    df_image_free(e2);
}

/* Previews on the other pipeline classes (the golden cases' tiny pipelines): one per step
 * but the last; the device path's estimate is the host path's (SD3: the guided prediction on
 * both); previews leave the image as it was. */
static void previews_of(const char *dir, const char *prompt, float guidance)
{
    df_pipeline *p;
    if (df_pipeline_load(dir, &(df_load_opts){.threads = 2}, &p) != DF_OK)
        fail_msg("%s", df_error_message());
    df_image *img[3] = {NULL};
    previews pv[3] = {{0}};
    for (int k = 0; k < 3; k++) {
        df_gen_output out;
        df_gen_params g = {.prompt = prompt,
                           .width = 64,
                           .height = 64,
                           .steps = 4,
                           .seed = 3,
                           .guidance = guidance,
                           .guidance_set = true,
                           .preview = k < 2 ? keep_preview : NULL,
                           .progress_user = &pv[k],
                           .host_step = k == 1 ? 1 : -1};
        if (df_pipeline_run(p, &g, &out) != DF_OK)
            fail_msg("%s: %s", dir, df_error_message());
        img[k] = out.images[0];
        out.images[0] = NULL;
        df_gen_output_free(&out);
    }
    assert_int_equal(pv[0].n, 3);
    assert_int_equal(pv[1].n, 3);
    for (int i = 0; i < 3; i++)
        if (!(mean_abs_diff(pv[0].img[i], pv[1].img[i]) < 0.5))
            fail_msg("%s: preview %d differs between the device and host paths by %.2f", dir, i,
                     mean_abs_diff(pv[0].img[i], pv[1].img[i]));
    assert_memory_equal(img[0]->pixels, img[2]->pixels, 64 * 64 * 3);
    double first = mean_abs_diff(pv[0].img[0], img[0]), last = mean_abs_diff(pv[0].img[2], img[0]);
    if (!(last < first))
        fail_msg("%s: the last preview is %.2f from the image, the first %.2f", dir, last, first);
    for (int k = 0; k < 3; k++) {
        previews_free(&pv[k]);
        df_image_free(img[k]);
    }
    df_pipeline_free(p);
}

static void test_previews_on_every_pipeline_class(void **state)
{
    (void)state;
    previews_of(DF_GOLDEN_DIR "/t2i-sd3/pipeline", "an oil painting of a lighthouse", 5.0f);
    previews_of(DF_GOLDEN_DIR "/t2i-flux2/pipeline", "a small wooden cabin by a frozen lake", 4.0f);
}

static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

/* The final latents of a 4-step 64x64 run of pipeline p; caller frees. */
static float *run_latents(df_pipeline *p, int int8_attention, size_t *n)
{
    df_gen_output out;
    df_gen_params g = {.prompt = PROMPT,
                       .width = 64,
                       .height = 64,
                       .steps = 4,
                       .seed = 42,
                       .int8_attention = int8_attention};
    if (df_pipeline_run(p, &g, &out) != DF_OK)
        fail_msg("%s", df_error_message());
    *n = 1;
    for (int d = 0; d < out.latents_ndim; d++)
        *n *= (size_t)out.latents_shape[d];
    float *lat = malloc(*n * sizeof *lat);
    memcpy(lat, out.latents, *n * sizeof *lat);
    df_gen_output_free(&out);
    return lat;
}

static void test_int8_attention_is_a_run_parameter(void **state)
{
    (void)state;
    df_pipeline *i8;
    assert_int_equal(
        df_pipeline_load(DF_DEMO_MODEL, &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_I8}, &i8),
        DF_OK);
    size_t n;
    unsetenv("DIFFUSE_INT8_ATTENTION");
    float *on = run_latents(i8, 1, &n), *off = run_latents(i8, -1, &n);
    float *dflt = run_latents(i8, 0, &n);
    assert_memory_not_equal(on, off, n * sizeof *on); /* the field changes the scores */
    assert_memory_equal(dflt, on, n * sizeof *on);    /* default: int8 attention */
    setenv("DIFFUSE_INT8_ATTENTION", "0", 1);
    float *env_off = run_latents(i8, 0, &n), *forced_on = run_latents(i8, 1, &n);
    unsetenv("DIFFUSE_INT8_ATTENTION");
    assert_memory_equal(env_off, off, n * sizeof *on);  /* the variable is the default */
    assert_memory_equal(forced_on, on, n * sizeof *on); /* the field wins over it */
    float *after = run_latents(i8, 0, &n);              /* a run's setting does not outlive it */
    assert_memory_equal(after, on, n * sizeof *on);
    df_pipeline_free(i8);

    /* A compiled transformer traces its attention once: the setting is part of the trace.
     * A run that turns int8 attention off after one that had it on must give what a
     * pipeline compiled with it off from the start gives (comparing on with off alone would
     * not tell: the text encoder, eager here, takes the setting too). */
    df_pipeline *c1, *c2;
    df_load_opts co = {.threads = 2, .dtype = DF_DTYPE_I8, .compile = true};
    assert_int_equal(df_pipeline_load(DF_DEMO_MODEL, &co, &c1), DF_OK);
    assert_int_equal(df_pipeline_load(DF_DEMO_MODEL, &co, &c2), DF_OK);
    float *c_on = run_latents(c1, 1, &n), *c_off = run_latents(c1, -1, &n);
    float *c_on2 = run_latents(c1, 1, &n);
    setenv("DIFFUSE_INT8_ATTENTION", "0", 1);
    float *fresh_off = run_latents(c2, 0, &n);
    unsetenv("DIFFUSE_INT8_ATTENTION");
    if (!(rel_l2(c_off, fresh_off, n) < 1e-6))
        fail_msg("compiled, switched off per run vs compiled off from the start: %.3g",
                 rel_l2(c_off, fresh_off, n));
    assert_memory_equal(c_on, c_on2, n * sizeof *on);
    assert_memory_not_equal(c_on, c_off, n * sizeof *on);
    /* Compiled and eager agree with it on: closer to each other than to a run with it off.
     * Not bit for bit, and not to 1e-3 everywhere: where oneDNN's f32 kernels block a
     * compiled program's products differently (AVX-512), their last-bit differences move
     * some int8 roundings of the next layer, and this model carries that through its steps. */
    double same = rel_l2(c_on, on, n), other = rel_l2(c_off, on, n);
    if (!(same < 0.5 * other && same < 1e-2))
        fail_msg("compiled vs eager with int8 attention: %.3g; compiled off vs eager on: %.3g",
                 same, other);
    free(c_on), free(c_off), free(c_on2), free(fresh_off);
    df_pipeline_free(c1);
    df_pipeline_free(c2);
    free(on), free(off), free(dflt), free(env_off), free(forced_on), free(after);

    /* f32 compute: no int8 attention either way */
    float *f_on = run_latents(pipe_, 1, &n), *f_off = run_latents(pipe_, -1, &n);
    assert_memory_equal(f_on, f_off, n * sizeof *f_on);
    free(f_on), free(f_off);
}

/* The final latents of demo loaded in int8 with `keep` (df_load_opts.int8_keep). */
static float *keep_latents(int keep, size_t *n)
{
    df_pipeline *p;
    assert_int_equal(
        df_pipeline_load(DF_DEMO_MODEL,
                         &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_I8, .int8_keep = keep},
                         &p),
        DF_OK);
    float *lat = run_latents(p, 0, n);
    df_pipeline_free(p);
    return lat;
}

static void test_int8_keep_is_a_load_option(void **state)
{
    (void)state;
    size_t n;
    unsetenv("DIFFUSE_INT8_KEEP");
    float *kept = keep_latents(1, &n), *none = keep_latents(-1, &n), *dflt = keep_latents(0, &n);
    assert_memory_not_equal(kept, none, n * sizeof *kept); /* the embedders quantized or not */
    assert_memory_equal(dflt, kept, n * sizeof *kept);
    setenv("DIFFUSE_INT8_KEEP", "none", 1);
    float *env_none = keep_latents(0, &n), *forced = keep_latents(1, &n);
    unsetenv("DIFFUSE_INT8_KEEP");
    assert_memory_equal(env_none, none, n * sizeof *kept); /* the variable is the default */
    assert_memory_equal(forced, kept, n * sizeof *kept);   /* the option wins over it */
    free(kept), free(none), free(dflt), free(env_none), free(forced);
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
        cmocka_unit_test(test_previews_come_at_the_asked_steps_and_approach_the_image),
        cmocka_unit_test(test_previews_on_every_pipeline_class),
        cmocka_unit_test(test_int8_attention_is_a_run_parameter),
        cmocka_unit_test(test_int8_keep_is_a_load_option),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
