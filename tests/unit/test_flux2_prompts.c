/*
 * Flux2Pipeline and Flux2KleinPipeline from prompts, on the folders `diffuse make-tiny --arch
 * flux2` and `--arch flux2-klein` write (tests/flux2.cmake passes them: DF_TEST_NEEDS_ARGS).
 *
 * Every mode (defer-and-fuse, the compiled transformer, compiled blocks) and bf16 against
 * strict eager; model and sequential offload bit-identical to none, with model offload
 * keeping one component resident at a time (text_encoder, then transformer, then vae); a
 * batch of prompts with two images each whose images are those of single runs (one
 * generator: the first image's noise; a list: each image's own); klein base's CFG from
 * prompts (the prompt as its own negative is the unguided run, the default "" moves it);
 * and bad prompts / parameters failing with DF_E_ARG and a message naming them.
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

#include <diffuse/diffuse.h>

#include "unit/fixtures.h"

/* DF_TEST_NEEDS_ARGS: DEV_DIR KLEIN_DIR */
static const char *dirs[2];

static df_pipeline *load(const char *dir, const df_load_opts *o)
{
    df_pipeline *p = NULL;
    df_load_opts d = {.threads = 2, .dtype = DF_DTYPE_F32};
    if (df_pipeline_load(dir, o ? o : &d, &p) != DF_OK)
        fail_msg("load %s: %s", dir, df_error_message());
    return p;
}

static df_gen_params params(const char *prompt)
{
    return (df_gen_params){.prompt = prompt, .width = 48, .height = 32, .steps = 2, .seed = 5,
                           .max_sequence_length = 64};
}

static void run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    if (df_pipeline_run(p, g, out) != DF_OK)
        fail_msg("run: %s", df_error_message());
}

static double rel_diff(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return sqrt(d / (r > 0 ? r : 1));
}

static int64_t n_image(const df_gen_output *o)
{
    return (int64_t)o->count * o->width * o->height * 3;
}

/* Modes and bf16 against strict eager, for both pipelines. */
static void test_modes_match_eager(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        df_gen_params g = params("a red fox in the snow");
        df_pipeline *p = load(dirs[k], NULL);
        df_gen_output ref = {0};
        run(p, &g, &ref);
        assert_int_equal(ref.count, 1);
        assert_int_equal(ref.width, 48);
        assert_int_equal(ref.height, 32);
        df_pipeline_free(p);
        struct {
            const char *name;
            df_load_opts o;
            double tol;
        } modes[] = {
            {"fuse", {.threads = 2, .dtype = DF_DTYPE_F32, .mode = DF_DEFER_AND_FUSE}, 1e-5},
            {"compile", {.threads = 2, .dtype = DF_DTYPE_F32, .mode = DF_DEFER_AND_FUSE,
                         .compile = true}, 1e-5},
            {"blocks", {.threads = 2, .dtype = DF_DTYPE_F32, .mode = DF_DEFER_AND_FUSE,
                        .compile_blocks = true}, 1e-5},
            {"bf16", {.threads = 2, .dtype = DF_DTYPE_BF16}, 5e-2},
        };
        for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
            df_gen_output o = {0};
            p = load(dirs[k], &modes[m].o);
            run(p, &g, &o);
            double d = rel_diff(o.image_f32, ref.image_f32, n_image(&ref));
            printf("  %s %s: image rel diff from eager %.3g\n", df_pipeline_class(p),
                   modes[m].name, d);
            assert_true(d < modes[m].tol);
            if (m < 3)
                assert_true(d < 1e-5);
            df_gen_output_free(&o);
            df_pipeline_free(p);
        }
        df_gen_output_free(&ref);
    }
}

/* Offload levels give the same bits; model offload holds one component at a time. */
static void test_offload(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        df_gen_params g = params("a lighthouse at dusk");
        df_gen_output none = {0}, model = {0}, seq = {0};
        df_pipeline *p = load(dirs[k], NULL);
        run(p, &g, &none);
        df_pipeline_free(p);
        p = load(dirs[k], &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_F32,
                                          .offload = DF_OFFLOAD_MODEL});
        run(p, &g, &model);
        df_pipeline_free(p);
        p = load(dirs[k], &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_F32,
                                          .offload = DF_OFFLOAD_SEQUENTIAL});
        run(p, &g, &seq);
        df_pipeline_free(p);
        assert_memory_equal(model.image_f32, none.image_f32, n_image(&none) * sizeof(float));
        assert_memory_equal(seq.image_f32, none.image_f32, n_image(&none) * sizeof(float));
        /* text_encoder -> transformer -> vae, nothing resident after its phase */
        static const char *const order[] = {"encode", "denoise", "decode"};
        assert_int_equal(model.n_phases, 3);
        int64_t sum = 0, most = 0;
        for (int i = 0; i < 3; i++) {
            assert_string_equal(model.phases[i].phase, order[i]);
            assert_true(model.phases[i].peak_resident_weight_bytes > 0);
            assert_int_equal(model.phases[i].resident_weight_bytes, 0);
            sum += model.phases[i].peak_resident_weight_bytes;
            if (model.phases[i].peak_resident_weight_bytes > most)
                most = model.phases[i].peak_resident_weight_bytes;
            /* without offload every component stays resident throughout */
            assert_int_equal(none.phases[i].resident_weight_bytes,
                             none.phases[2].resident_weight_bytes);
        }
        printf("  model offload peaks %lld / %lld / %lld bytes; none keeps %lld\n",
               (long long)model.phases[0].peak_resident_weight_bytes,
               (long long)model.phases[1].peak_resident_weight_bytes,
               (long long)model.phases[2].peak_resident_weight_bytes,
               (long long)none.phases[2].resident_weight_bytes);
        assert_int_equal(sum, none.phases[2].resident_weight_bytes); /* one each, all of them */
        assert_true(most < sum);
        df_gen_output_free(&none);
        df_gen_output_free(&model);
        df_gen_output_free(&seq);
    }
}

/* Two prompts x two images: with one generator the first image is the single run's (the
 * first quarter of the same draw); with a list each image is its own generator's run. */
static void test_batches(void **state)
{
    (void)state;
    const char *const prompts[] = {"a cat on a mat", "the moon over a city"};
    for (int k = 0; k < 2; k++) {
        df_pipeline *p = load(dirs[k], NULL);
        df_gen_params g = params(NULL);
        g.prompts = prompts;
        g.n_prompts = 2;
        g.num_images = 2;
        df_gen_output batch = {0}, listed = {0}, one = {0}, two = {0};
        run(p, &g, &batch);
        assert_int_equal(batch.count, 4);
        uint64_t seeds[4] = {11, 12, 13, 14};
        g.seeds = seeds;
        g.n_seeds = 4;
        run(p, &g, &listed);
        df_gen_params s = params(prompts[0]);
        run(p, &s, &one);
        s = params(prompts[1]);
        s.seed = 13;
        run(p, &s, &two);
        int64_t per = n_image(&one);
        double d0 = rel_diff(batch.image_f32, one.image_f32, per);
        double d2 = rel_diff(listed.image_f32 + 2 * per, two.image_f32, per);
        double d01 = rel_diff(batch.image_f32 + per, batch.image_f32, per);
        printf("  %s batch image 0 vs single %.3g, listed image 2 vs single %.3g, images 0/1 "
               "differ by %.3g\n", df_pipeline_class(p), d0, d2, d01);
        assert_true(d0 < 1e-5);
        assert_true(d2 < 1e-5);
        assert_true(d01 > 1e-3); /* the second image of a prompt has its own noise */
        /* a list of the wrong length */
        g.n_seeds = 3;
        df_gen_output bad = {0};
        assert_int_equal(df_pipeline_run(p, &g, &bad), DF_E_ARG);
        assert_non_null(strstr(df_error_message(), "generators"));
        df_gen_output_free(&batch);
        df_gen_output_free(&listed);
        df_gen_output_free(&one);
        df_gen_output_free(&two);
        df_pipeline_free(p);
    }
}

/* A base klein folder: the distilled one's components, is_distilled false. */
static const char *klein_base_dir(void)
{
    static char dir[1024];
    snprintf(dir, sizeof dir, "%s/flux2-klein-base-prompts", DF_TEST_TMP);
    fixture_klein_base(dirs[1], dir);
    return dir;
}

static void test_klein_base_cfg_from_prompts(void **state)
{
    (void)state;
    df_pipeline *distilled = load(dirs[1], NULL), *base = load(klein_base_dir(), NULL);
    int steps = 0;
    float guidance = 0;
    df_pipeline_defaults(base, &steps, &guidance, NULL, NULL);
    assert_int_equal(steps, 50);
    assert_true(guidance == 4.0f);
    df_gen_params g = params("a bowl of fruit");
    df_gen_output a = {0}, b = {0}, c = {0};
    run(distilled, &g, &a);
    g.guidance = 4.0f;
    g.guidance_set = true;
    g.negative_prompt = "a bowl of fruit"; /* neg + 4 (cond - neg) = cond */
    run(base, &g, &b);
    g.negative_prompt = NULL; /* "" */
    run(base, &g, &c);
    int64_t n = n_image(&a);
    double same = rel_diff(b.image_f32, a.image_f32, n);
    double moved = rel_diff(c.image_f32, a.image_f32, n);
    printf("  klein base: prompt as negative vs distilled %.3g; \"\" as negative %.3g\n", same,
           moved);
    assert_true(same < 1e-6);
    assert_true(moved > 1e-3);
    df_gen_output_free(&a);
    df_gen_output_free(&b);
    df_gen_output_free(&c);
    df_pipeline_free(distilled);
    df_pipeline_free(base);
}

static void expect_arg_error(df_pipeline *p, const df_gen_params *g, const char *needle)
{
    df_gen_output o = {0};
    assert_int_equal(df_pipeline_run(p, g, &o), DF_E_ARG);
    if (!strstr(df_error_message(), needle))
        fail_msg("expected '%s' in: %s", needle, df_error_message());
    assert_null(o.images);
}

static void test_bad_prompts(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        df_pipeline *p = load(dirs[k], NULL);
        df_gen_params g = params("caf\xc3");
        expect_arg_error(p, &g, "UTF-8");
        const char *const prompts[] = {"fine", NULL};
        g = params(NULL);
        g.prompts = prompts;
        g.n_prompts = 2;
        expect_arg_error(p, &g, "prompt 1 of 2 is NULL");
        g = params(NULL);
        expect_arg_error(p, &g, "no prompt");
        g = params("a cat");
        g.max_sequence_length = 600;
        expect_arg_error(p, &g, "max_sequence_length");
        static const int layers[] = {1, 2, 99};
        g.max_sequence_length = 0;
        g.text_encoder_out_layers = layers;
        g.n_text_encoder_out_layers = 3;
        expect_arg_error(p, &g, "hidden state 99");
        g.n_text_encoder_out_layers = 2; /* 2 x hidden is not joint_attention_dim */
        expect_arg_error(p, &g, "joint_attention_dim");
        /* the caller's layers when valid: another embedding, another image */
        df_gen_output a = {0}, b = {0};
        g = params("a cat");
        run(p, &g, &a);
        static const int early[] = {1, 2, 3};
        g.text_encoder_out_layers = early;
        g.n_text_encoder_out_layers = 3;
        run(p, &g, &b);
        assert_true(rel_diff(b.image_f32, a.image_f32, n_image(&a)) > 1e-4);
        df_gen_output_free(&a);
        df_gen_output_free(&b);
        df_pipeline_free(p);
    }
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: test_flux2_prompts DEV_DIR KLEIN_DIR (diffuse make-tiny "
                        "--arch flux2 / flux2-klein)\n");
        return 2;
    }
    dirs[0] = argv[1];
    dirs[1] = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes_match_eager),
        cmocka_unit_test(test_offload),
        cmocka_unit_test(test_batches),
        cmocka_unit_test(test_klein_base_cfg_from_prompts),
        cmocka_unit_test(test_bad_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
