/*
 * Flux2Pipeline / Flux2KleinPipeline beyond the golden runs (which diffuse-check does):
 * the defaults per checkpoint kind, klein base's classifier-free guidance, seeded noise,
 * and the errors for what is not implemented yet.
 *
 * The models are the pipe-flux2 and pipe-flux2-klein golden cases' (random weights, 64x64,
 * 16 image tokens); the klein base folder is the distilled one with "is_distilled": false
 * in its model_index.json and links to the same components.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "golden_tensors.h"

#define KLEIN DF_GOLDEN_DIR "/pipe-flux2-klein/pipeline"
#define DEV   DF_GOLDEN_DIR "/pipe-flux2/pipeline"

typedef struct inputs {
    float *embeds, *latents; /* [1, 8, 48], [1, 128, 4, 4] */
    int64_t n_embeds, n_latents;
} inputs;

static float *to_f32(double *v, int64_t n)
{
    assert_non_null(v);
    float *f = malloc((size_t)n * sizeof *f);
    assert_non_null(f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)v[i];
    free(v);
    return f;
}

static inputs klein_inputs(void)
{
    inputs in = {0};
    double *e = golden_read_f64("pipe-flux2-klein", "in.prompt_embeds", &in.n_embeds);
    in.embeds = to_f32(e, in.n_embeds);
    double *l = golden_read_f64("pipe-flux2-klein", "in.latents", &in.n_latents);
    in.latents = to_f32(l, in.n_latents);
    assert_int_equal(in.n_embeds, 8 * 48);
    assert_int_equal(in.n_latents, 128 * 4 * 4);
    return in;
}

static df_pipeline *load(const char *dir)
{
    df_pipeline *p = NULL;
    df_status s = df_pipeline_load(dir, &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_F32}, &p);
    if (s != DF_OK)
        fail_msg("%s", df_error_message());
    return p;
}

/* The klein folder as a base (not distilled) checkpoint, in DF_TEST_TMP. */
static const char *klein_base_dir(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/flux2_klein_base", DF_TEST_TMP);
    mkdir(DF_TEST_TMP, 0755);
    mkdir(dir, 0755);
    /* Component folders of its own whose files link to the case's (a component folder that
     * is itself a link out of the pipeline folder is refused). */
    static const char *const files[] = {
        "scheduler/scheduler_config.json", "transformer/config.json",
        "transformer/diffusion_pytorch_model.safetensors", "vae/config.json",
        "vae/diffusion_pytorch_model.safetensors"};
    char link[1200], target[1200];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(link, sizeof link, "%s/%.*s", dir, (int)(strchr(files[i], '/') - files[i]),
                 files[i]);
        unlink(link); /* a folder link left by an older run of this test */
        mkdir(link, 0755);
        snprintf(link, sizeof link, "%s/%s", dir, files[i]);
        snprintf(target, sizeof target, "%s/%s", KLEIN, files[i]);
        unlink(link);
        assert_int_equal(symlink(target, link), 0);
    }
    snprintf(link, sizeof link, "%s/model_index.json", dir);
    FILE *f = fopen(link, "w");
    assert_non_null(f);
    fputs("{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": false, "
          "\"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"], "
          "\"text_encoder\": [null, null], \"tokenizer\": [null, null], "
          "\"transformer\": [\"diffusers\", \"Flux2Transformer2DModel\"], "
          "\"vae\": [\"diffusers\", \"AutoencoderKLFlux2\"]}",
          f);
    fclose(f);
    return dir;
}

static df_gen_params params(const inputs *in, float guidance)
{
    return (df_gen_params){.height = 64, .width = 64, .steps = 4, .guidance = guidance,
                           .guidance_set = true, .prompt_embeds = in->embeds,
                           .prompt_embeds_len = 8, .latents = in->latents};
}

static double rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / r);
}

static void test_defaults_follow_the_checkpoint(void **state)
{
    (void)state;
    int steps, size;
    float guidance;
    df_pipeline *p = load(KLEIN); /* distilled */
    df_pipeline_defaults(p, &steps, &guidance, NULL, &size);
    assert_int_equal(steps, 4);
    assert_float_equal(guidance, 1.0f, 0);
    assert_int_equal(size, 1024);
    assert_string_equal(df_pipeline_class(p), "Flux2KleinPipeline");
    df_pipeline_free(p);
    p = load(klein_base_dir());
    df_pipeline_defaults(p, &steps, &guidance, NULL, NULL);
    assert_int_equal(steps, 50);
    assert_float_equal(guidance, 4.0f, 0);
    df_pipeline_free(p);
    p = load(DEV);
    df_pipeline_defaults(p, &steps, &guidance, NULL, NULL);
    assert_int_equal(steps, 50);
    assert_float_equal(guidance, 4.0f, 0);
    assert_string_equal(df_pipeline_class(p), "Flux2Pipeline");
    df_pipeline_free(p);
}

/* Base klein with guidance 4: neg + 4 (cond - neg). With the prompt as its own negative
 * that is the conditional prediction, i.e. the distilled run; another negative moves it. */
static void test_klein_base_runs_real_cfg(void **state)
{
    (void)state;
    inputs in = klein_inputs();
    df_pipeline *distilled = load(KLEIN), *base = load(klein_base_dir());
    df_gen_output a = {0}, b = {0}, c = {0};
    df_gen_params g = params(&in, 1.0f);
    assert_int_equal(df_pipeline_run(distilled, &g, &a), DF_OK);
    g = params(&in, 4.0f);
    g.negative_prompt_embeds = in.embeds;
    assert_int_equal(df_pipeline_run(base, &g, &b), DF_OK);
    assert_int_equal(a.latents_ndim, 4); /* klein returns the decoder's input */
    assert_int_equal(a.latents_shape[1], 32);
    int64_t n = 32 * 8 * 8;
    double same = rel_diff(b.latents, a.latents, n);
    float *zeros = calloc((size_t)in.n_embeds, sizeof *zeros);
    assert_non_null(zeros);
    g.negative_prompt_embeds = zeros;
    assert_int_equal(df_pipeline_run(base, &g, &c), DF_OK);
    double moved = rel_diff(c.latents, a.latents, n);
    printf("  cfg with the prompt as negative vs no cfg: %.3g; with zero negative: %.3g\n", same,
           moved);
    assert_true(same < 1e-6);
    assert_true(moved > 1e-2);

    /* guidance <= 1 on a base checkpoint: no CFG, no negative needed */
    df_gen_output d = {0};
    g = params(&in, 1.0f);
    assert_int_equal(df_pipeline_run(base, &g, &d), DF_OK);
    assert_true(rel_diff(d.latents, a.latents, n) < 1e-6);
    /* guidance > 1 without negative embeddings needs the text encoder to encode "" */
    df_gen_output e = {0};
    g = params(&in, 4.0f);
    assert_int_equal(df_pipeline_run(base, &g, &e), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "negative prompt embeddings"));
    free(zeros);
    df_gen_output_free(&a);
    df_gen_output_free(&b);
    df_gen_output_free(&c);
    df_gen_output_free(&d);
    df_pipeline_free(distilled);
    df_pipeline_free(base);
    free(in.embeds);
    free(in.latents);
}

/* A seed gives the run that torch's randn((1, 128, 4, 4)) of that seed, passed as the
 * latents, gives. */
static void test_seeded_noise_is_the_patchified_draw(void **state)
{
    (void)state;
    inputs in = klein_inputs();
    df_rng rng;
    df_rng_init(&rng, 42);
    assert_int_equal(df_rng_randn_f32(&rng, in.latents, in.n_latents), DF_OK);
    df_pipeline *p = load(KLEIN);
    df_gen_output a = {0}, b = {0};
    df_gen_params g = params(&in, 1.0f);
    assert_int_equal(df_pipeline_run(p, &g, &a), DF_OK);
    g.latents = NULL;
    g.seed = 42;
    assert_int_equal(df_pipeline_run(p, &g, &b), DF_OK);
    assert_memory_equal(a.latents, b.latents, sizeof(float) * 32 * 8 * 8);
    assert_memory_equal(a.image_f32, b.image_f32, sizeof(float) * 64 * 64 * 3);
    g.seed = 43;
    df_gen_output c = {0};
    assert_int_equal(df_pipeline_run(p, &g, &c), DF_OK);
    assert_true(rel_diff(c.latents, a.latents, 32 * 8 * 8) > 1e-2);
    df_gen_output_free(&a);
    df_gen_output_free(&b);
    df_gen_output_free(&c);
    df_pipeline_free(p);
    free(in.embeds);
    free(in.latents);
}

static void test_prompts_need_the_text_encoder(void **state)
{
    (void)state;
    df_pipeline *p = load(DEV);
    df_gen_output out = {0};
    df_gen_params g = {.prompt = "a cat", .height = 64, .width = 64, .steps = 1};
    assert_int_equal(df_pipeline_run(p, &g, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "has no text encoder: pass prompt embeddings"));
    assert_null(out.latents);
    df_pipeline_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_follow_the_checkpoint),
        cmocka_unit_test(test_klein_base_runs_real_cfg),
        cmocka_unit_test(test_seeded_noise_is_the_patchified_draw),
        cmocka_unit_test(test_prompts_need_the_text_encoder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
