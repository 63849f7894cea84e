/*
 * Offloading: the residency each offload level promises, and identical images.
 *
 * Runs on the tiny FLUX.1 pipeline that `diffuse make-tiny` writes (its components have
 * very different sizes: CLIP, T5, a transformer of three blocks, a VAE); the folder is
 * given as the first argument (tests/offload.cmake makes it first): DF_TEST_NEEDS_ARGS.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "models/loader.h"
#include "models/weight_sets.h"

static const char *model_dir;

typedef struct run {
    df_gen_output out;
    int64_t clip, t5, transformer, vae, largest_block;
} run;

static void generate(df_offload level, run *r)
{
    df_pipeline *p = NULL;
    assert_int_equal(df_pipeline_load(model_dir, &(df_load_opts){.threads = 2, .offload = level},
                                      &p),
                     DF_OK);
    assert_int_equal(df_pipeline_run(p, &(df_gen_params){.prompt = "a red fox", .height = 64,
                                                         .width = 64, .steps = 2, .seed = 7},
                                     &r->out),
                     DF_OK);
    assert_int_equal(r->out.n_phases, 3);
    /* The context's counters (what --stats-json writes) carry the run's peak: the largest
     * phase's, not the last phase's. */
    df_stats st;
    df_ctx_stats(df_pipeline_ctx(p), &st);
    int64_t peak = 0;
    for (int i = 0; i < r->out.n_phases; i++)
        if (r->out.phases[i].peak_resident_weight_bytes > peak)
            peak = r->out.phases[i].peak_resident_weight_bytes;
    assert_true(peak > 0);
    assert_int_equal(st.peak_resident_weight_bytes, peak);
    df_pipeline_free(p);
}

/* Sizes of each component's weights, from a plain load of each. */
static void component_sizes(run *r)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    char dir[4096];
    const char *names[4] = {"text_encoder", "text_encoder_2", "transformer", "vae"};
    int64_t *sizes[4] = {&r->clip, &r->t5, &r->transformer, &r->vae};
    for (int i = 0; i < 4; i++) {
        snprintf(dir, sizeof dir, "%s/%s", model_dir, names[i]);
        df_weights *w;
        assert_int_equal(df_weights_open(dir, &w), DF_OK);
        *sizes[i] = (int64_t)df_weights_total_bytes(w);
        if (i == 2) { /* the largest block: all tensors of one block prefix */
            int64_t best = 0;
            for (int b = 0; b < 3; b++) {
                char prefix[64];
                snprintf(prefix, sizeof prefix, b == 0 ? "transformer_blocks.0."
                                                       : "single_transformer_blocks.%d.", b - 1);
                int64_t n = 0;
                for (int64_t k = 0; k < df_weights_count(w); k++) {
                    df_tensor_info info;
                    df_weights_at(w, k, &info);
                    if (strncmp(info.name, prefix, strlen(prefix)) == 0)
                        n += (int64_t)info.nbytes;
                }
                best = n > best ? n : best;
            }
            r->largest_block = best;
        }
        df_weights_free(w);
    }
    df_ctx_free(ctx);
}

static void test_offload_levels(void **state)
{
    (void)state;
    static run none, model, seq;
    component_sizes(&none);
    generate(DF_OFFLOAD_NONE, &none);
    generate(DF_OFFLOAD_MODEL, &model);
    generate(DF_OFFLOAD_SEQUENTIAL, &seq);
    int64_t total = none.clip + none.t5 + none.transformer + none.vae;

    /* No offload: everything resident the whole time. */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(none.out.phases[i].peak_resident_weight_bytes, total);
        assert_int_equal(none.out.phases[i].resident_weight_bytes, total);
    }
    /* Model offload: only the running component; nothing left behind. */
    assert_string_equal(model.out.phases[0].phase, "encode");
    assert_int_equal(model.out.phases[0].peak_resident_weight_bytes, none.clip + none.t5);
    assert_int_equal(model.out.phases[1].peak_resident_weight_bytes, none.transformer);
    assert_int_equal(model.out.phases[2].peak_resident_weight_bytes, none.vae);
    for (int i = 0; i < 3; i++)
        assert_int_equal(model.out.phases[i].resident_weight_bytes, 0);
    /* Sequential: the transformer never wholly resident; at most two blocks plus the
     * weights outside the blocks. */
    assert_true(seq.out.phases[1].peak_resident_weight_bytes < none.transformer);
    assert_true(seq.out.phases[1].peak_resident_weight_bytes > 0);
    assert_true(seq.out.phases[1].peak_resident_weight_bytes <=
                none.transformer - none.largest_block + 2 * none.largest_block);
    /* The same image at every level, bit for bit. */
    size_t bytes = (size_t)none.out.width * (size_t)none.out.height * 3;
    assert_memory_equal(none.out.images[0]->pixels, model.out.images[0]->pixels, bytes);
    assert_memory_equal(none.out.images[0]->pixels, seq.out.images[0]->pixels, bytes);
    assert_memory_equal(none.out.latents, seq.out.latents,
                        (size_t)none.out.latents_shape[1] * (size_t)none.out.latents_shape[2] * 4);
    df_gen_output_free(&none.out);
    df_gen_output_free(&model.out);
    df_gen_output_free(&seq.out);
}

/* Compiled transformer: a new step count replays the program; a new size compiles once. */
static void test_compiled_steps_do_not_recompile(void **state)
{
    (void)state;
    df_pipeline *p = NULL;
    assert_int_equal(df_pipeline_load(model_dir,
                                      &(df_load_opts){.threads = 2, .compile = true,
                                                      .mode = DF_DEFER_AND_FUSE},
                                      &p),
                     DF_OK);
    df_ctx *ctx = df_pipeline_ctx(p);
    df_gen_output out;
    df_stats a, b, c;
    df_gen_params g = {.prompt = "a red fox", .height = 64, .width = 64, .steps = 4, .seed = 1};
    assert_int_equal(df_pipeline_run(p, &g, &out), DF_OK);
    df_gen_output_free(&out);
    df_ctx_stats(ctx, &a);
    assert_true(a.graphs_compiled >= 1);
    g.steps = 8;
    assert_int_equal(df_pipeline_run(p, &g, &out), DF_OK);
    df_gen_output_free(&out);
    df_ctx_stats(ctx, &b);
    assert_int_equal(b.graphs_compiled, a.graphs_compiled); /* 8 steps: nothing new */
    assert_true(b.cache_hits >= a.cache_hits + 8);
    g.height = g.width = 96;
    assert_int_equal(df_pipeline_run(p, &g, &out), DF_OK);
    df_gen_output_free(&out);
    df_ctx_stats(ctx, &c);
    assert_true(c.graphs_compiled > b.graphs_compiled); /* a new size compiles */
    df_pipeline_free(p);
}

/* Running out of memory names what would need less. */
static void test_out_of_memory_suggests_offload(void **state)
{
    (void)state;
    df_pipeline *p = NULL;
    assert_int_equal(df_pipeline_load(model_dir, &(df_load_opts){.threads = 1}, &p), DF_OK);
    df_gen_output out;
    df_gen_params g = {.prompt = "a red fox", .height = 64, .width = 64, .steps = 1, .seed = 1};
    /* Fail the Nth allocation inside the run, for N across the whole run: every failure
     * is a clean DF_E_OOM with the hint, never a crash or a leak of the context's state. */
    int failures = 0;
    for (int nth = 1; nth < 3000; nth = nth * 3 / 2 + 1) {
        df_alloc_fail_at(nth);
        df_status s = df_pipeline_run(p, &g, &out);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            df_gen_output_free(&out);
            continue;
        }
        failures++;
        assert_int_equal(s, DF_E_OOM);
        assert_non_null(strstr(df_error_message(), "--offload model"));
    }
    assert_true(failures > 5);
    /* The pipeline still works afterwards. */
    assert_int_equal(df_pipeline_run(p, &g, &out), DF_OK);
    df_gen_output_free(&out);
    df_pipeline_free(p);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_offload TINY_FLUX_DIR\n");
        return 2;
    }
    model_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_levels),
        cmocka_unit_test(test_compiled_steps_do_not_recompile),
        cmocka_unit_test(test_out_of_memory_suggests_offload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
