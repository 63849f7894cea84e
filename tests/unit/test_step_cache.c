/*
 * Step caches: the --cache specs, TaylorSeer's schedule, the pipelines that refuse a cache
 * (naming why), and on the tiny FLUX.1 pipeline of
 * tests/golden/t2i-flux-schnell that a first-block cache that never skips gives the uncached
 * image bit for bit, and one that always skips runs fewer ops (the blocks really are left
 * out) and a different image. Parity with diffusers' cached runs is tests/step_cache.cmake's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "models/step_cache.h"
#include "models/transformer_base.h"

static void test_specs_take_the_configs_fields_and_defaults(void **state)
{
    (void)state;
    df_cache_config c;
    assert_int_equal(df_cache_config_parse("first-block", &c), DF_OK);
    assert_int_equal(c.kind, DF_CACHE_FIRST_BLOCK);
    assert_true(c.threshold == 0.05); /* FirstBlockCacheConfig's default */
    assert_int_equal(df_cache_config_parse("first-block:threshold=0.2", &c), DF_OK);
    assert_true(c.threshold == 0.2);

    assert_int_equal(df_cache_config_parse("taylorseer", &c), DF_OK);
    assert_int_equal(c.cache_interval, 5);
    assert_int_equal(c.disable_cache_before_step, 3);
    assert_int_equal(c.disable_cache_after_step, -1);
    assert_int_equal(c.max_order, 1);
    assert_int_equal(c.taylor_factors_dtype, DF_DTYPE_BF16);
    assert_int_equal(df_cache_config_parse("taylorseer:cache_interval=2,disable_cache_before_step="
                                           "1,disable_cache_after_step=9,max_order=3,"
                                           "taylor_factors_dtype=float32",
                                           &c),
                     DF_OK);
    assert_int_equal(c.cache_interval, 2);
    assert_int_equal(c.disable_cache_before_step, 1);
    assert_int_equal(c.disable_cache_after_step, 9);
    assert_int_equal(c.max_order, 3);
    assert_int_equal(c.taylor_factors_dtype, DF_DTYPE_F32);

    char buf[256];
    df_cache_config_format(&c, buf, sizeof buf); /* reads back as the same config */
    df_cache_config back;
    assert_int_equal(df_cache_config_parse(buf, &back), DF_OK);
    assert_int_equal(back.kind, c.kind);
    assert_int_equal(back.cache_interval, c.cache_interval);
    assert_int_equal(back.disable_cache_before_step, c.disable_cache_before_step);
    assert_int_equal(back.disable_cache_after_step, c.disable_cache_after_step);
    assert_int_equal(back.max_order, c.max_order);
    assert_int_equal(back.taylor_factors_dtype, c.taylor_factors_dtype);
    c = df_cache_config_default(DF_CACHE_FIRST_BLOCK);
    c.threshold = 0.65;
    df_cache_config_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "first-block:threshold=0.65");
}

/* MagCacheConfig: mag_ratios required; other lengths resampled as nearest_interp does. */
static void test_magcache_ratios(void **state)
{
    (void)state;
    df_cache_config c;
    assert_int_equal(df_cache_config_parse("magcache", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "mag_ratios is required"));
    assert_int_equal(df_cache_config_parse("magcache:mag_ratios=flux,calibrate=True", &c),
                     DF_E_UNSUPPORTED);
    assert_int_equal(df_cache_config_parse("magcache:mag_ratios=flux", &c), DF_OK);
    assert_true(c.threshold == 0.06 && c.max_skip_steps == 3 && c.retention_ratio == 0.2);
    assert_int_equal(c.n_mag_ratios, 28); /* FLUX_MAG_RATIOS at 28 steps */
    assert_true(c.mag_ratios[1] == 1.21094f && c.mag_ratios[27] == 0.89062f);
    /* 28 -> 12: index round(i * 27/11) in float32, half to even: 0, 2, 5, 7, 10, ... 27 */
    assert_int_equal(df_cache_config_parse("magcache:mag_ratios=flux,num_inference_steps=12", &c),
                     DF_OK);
    assert_int_equal(c.n_mag_ratios, 12);
    assert_true(c.mag_ratios[1] == 1.11719f && c.mag_ratios[2] == 1.03906f);
    assert_true(c.mag_ratios[11] == 0.89062f);
    assert_int_equal(df_cache_config_parse("magcache:mag_ratios=1/2/3,num_inference_steps=3", &c),
                     DF_OK);
    assert_true(c.mag_ratios[0] == 1.0f && c.mag_ratios[2] == 3.0f);
    assert_int_equal(df_cache_config_parse("magcache:mag_ratios=1/x", &c), DF_E_ARG);
}

static void test_bad_specs_are_refused_by_name(void **state)
{
    (void)state;
    df_cache_config c = df_cache_config_default(DF_CACHE_NONE);
    assert_int_equal(df_cache_config_parse("first-block:treshold=0.2", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "unknown key 'treshold'"));
    assert_int_equal(df_cache_config_parse("first-block:threshold=-1", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "threshold"));
    assert_int_equal(df_cache_config_parse("taylorseer:cache_interval=0", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "cache_interval"));
    assert_int_equal(df_cache_config_parse("taylorseer:max_order=1.5", &c), DF_E_ARG);
    assert_int_equal(df_cache_config_parse("taylorseer:taylor_factors_dtype=f16", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "bfloat16 or float32"));
    assert_int_equal(df_cache_config_parse("taylorseer:threshold=1", &c), DF_E_ARG);
    assert_int_equal(df_cache_config_parse("teacache", &c), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "unknown cache 'teacache'"));
    assert_int_equal(df_cache_config_parse("first-block:threshold", &c), DF_E_ARG);
    assert_int_equal(c.kind, DF_CACHE_NONE); /* untouched by a refused spec */
}

/* The calls TaylorSeerCacheHook computes: the warm-up, every cache_interval-th call after
 * it (counted with Python's modulo, so call disable_cache_before_step itself predicts),
 * and from disable_cache_after_step on. */
static void test_taylorseer_schedule_is_diffusers(void **state)
{
    (void)state;
    struct {
        const char *spec, *trace;
    } cases[] = {
        {"taylorseer", "CCCPCPPPPCPP"},
        {"taylorseer:cache_interval=3,disable_cache_before_step=2", "CCPCPPCPPCPP"},
        {"taylorseer:disable_cache_after_step=10", "CCCPCPPPPCCC"},
        {"taylorseer:cache_interval=1,disable_cache_before_step=1", "CCCCCCCCCCCC"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        df_cache_config cfg;
        assert_int_equal(df_cache_config_parse(cases[k].spec, &cfg), DF_OK);
        df_step_cache *c;
        assert_int_equal(df_step_cache_create(&cfg, "test", 4, &c), DF_OK);
        for (int i = 0; i < 12; i++) {
            df_step_cache_begin(c);
            df_step_cache_end(c);
        }
        assert_string_equal(df_step_cache_trace(c), cases[k].trace);
        df_step_cache_free(c);
    }
}

typedef struct run {
    df_gen_output out;
    int64_t ops;
} run;

static void generate(const char *spec, run *r)
{
    df_pipeline *p = NULL;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/t2i-flux-schnell/pipeline", DF_GOLDEN_DIR);
    assert_int_equal(df_pipeline_load(dir, &(df_load_opts){.threads = 2}, &p), DF_OK);
    df_cache_config cfg;
    assert_int_equal(df_cache_config_parse(spec, &cfg), DF_OK);
    df_stats_reset(df_pipeline_ctx(p));
    assert_int_equal(df_pipeline_run(p,
                                     &(df_gen_params){.prompt = "a red fox",
                                                      .height = 64,
                                                      .width = 64,
                                                      .steps = 6,
                                                      .seed = 3,
                                                      .cache = &cfg},
                                     &r->out),
                     DF_OK);
    df_stats st;
    df_ctx_stats(df_pipeline_ctx(p), &st);
    r->ops = st.ops_enqueued;
    df_pipeline_free(p);
}

static void test_first_block_cache_skips_only_when_told(void **state)
{
    (void)state;
    run plain, never, always;
    generate("none", &plain);
    generate("first-block:threshold=0", &never);
    generate("first-block:threshold=1e9", &always);
    size_t bytes = (size_t)plain.out.width * plain.out.height * 3 * sizeof(float);
    assert_string_equal(plain.out.cache_trace, "");
    assert_string_equal(never.out.cache_trace, "CCCCCC");
    assert_true(isnan(never.out.cache_diff[0]) && never.out.cache_diff[1] > 0);
    assert_memory_equal(never.out.image_f32, plain.out.image_f32, bytes);
    assert_string_equal(always.out.cache_trace, "CSSSSS");
    assert_true(always.ops < never.ops * 2 / 3); /* 5 of 6 calls ran 1 of 4 blocks */
    assert_memory_not_equal(always.out.image_f32, plain.out.image_f32, bytes);
    df_gen_output_free(&plain.out);
    df_gen_output_free(&never.out);
    df_gen_output_free(&always.out);
}

/* Where diffusers 0.42 has no such cache, diffuse refuses it and says why. */
static void test_pipelines_without_caches_say_why(void **state)
{
    (void)state;
    struct {
        const char *folder, *spec, *why;
    } cases[] = {
        {"t2i-sd3", "first-block", "SD3Transformer2DModel has no step caches"},
        {"t2i-flux2", "taylorseer", "outside a cache context"},
        {"t2i-sd3", "magcache:mag_ratios=flux", "SD3Transformer2DModel has no step caches"},
        {"t2i-flux2-klein", "first-block", "use taylorseer"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/%s/pipeline", DF_GOLDEN_DIR, cases[k].folder);
        df_pipeline *p = NULL;
        assert_int_equal(df_pipeline_load(dir, &(df_load_opts){.threads = 2}, &p), DF_OK);
        df_cache_config cfg;
        assert_int_equal(df_cache_config_parse(cases[k].spec, &cfg), DF_OK);
        df_gen_output out;
        assert_int_equal(df_pipeline_run(p,
                                         &(df_gen_params){.prompt = "a",
                                                          .height = 64,
                                                          .width = 64,
                                                          .steps = 2,
                                                          .max_sequence_length = 16,
                                                          .cache = &cfg},
                                         &out),
                         DF_E_UNSUPPORTED);
        assert_non_null(strstr(df_error_message(), cases[k].why));
        df_pipeline_free(p);
    }
}

/* The transformer base makes a run's caches (one per cache context), switches between them
 * and frees them; a model without step caches refuses one by its class name. */
static void test_the_base_makes_a_cache_per_context(void **state)
{
    (void)state;
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/t2i-flux-schnell/pipeline/transformer", DF_GOLDEN_DIR);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, dir, &m), DF_OK);
    df_transformer *t = (df_transformer *)m;
    df_cache_config cfg;
    assert_int_equal(df_cache_config_parse("taylorseer", &cfg), DF_OK);

    assert_int_equal(df_transformer_enable_cache(t, NULL, 2), DF_OK); /* none asked */
    assert_null(t->cache);
    assert_null(df_transformer_step_cache(t));
    assert_int_equal(df_transformer_enable_cache(t, &cfg, 2), DF_OK); /* "cond", "uncond" */
    assert_non_null(t->caches[0]);
    assert_non_null(t->caches[1]);
    assert_ptr_equal(t->cache, t->caches[0]);
    assert_ptr_equal(df_transformer_step_cache(t), t->caches[0]);
    df_transformer_cache_context(t, 1);
    assert_ptr_equal(t->cache, t->caches[1]);
    df_transformer_cache_context(t, -1);
    assert_null(t->cache);
    df_transformer_disable_cache(t);
    assert_null(t->caches[0]);
    assert_null(t->caches[1]);
    assert_int_equal(df_transformer_enable_cache(t, &cfg, 1), DF_OK); /* one context */
    assert_non_null(t->caches[0]);
    assert_null(t->caches[1]);
    df_flux_free(m); /* frees the caches too */

    snprintf(dir, sizeof dir, "%s/t2i-sd3/pipeline/transformer", DF_GOLDEN_DIR);
    df_sd3 *s = NULL;
    assert_int_equal(df_sd3_load(ctx, dir, &s), DF_OK);
    assert_int_equal(df_transformer_enable_cache((df_transformer *)s, &cfg, 1), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "SD3Transformer2DModel takes no step cache"));
    assert_null(((df_transformer *)s)->cache);
    df_sd3_free(s);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_specs_take_the_configs_fields_and_defaults),
        cmocka_unit_test(test_magcache_ratios),
        cmocka_unit_test(test_bad_specs_are_refused_by_name),
        cmocka_unit_test(test_taylorseer_schedule_is_diffusers),
        cmocka_unit_test(test_first_block_cache_skips_only_when_told),
        cmocka_unit_test(test_pipelines_without_caches_say_why),
        cmocka_unit_test(test_the_base_makes_a_cache_per_context),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
