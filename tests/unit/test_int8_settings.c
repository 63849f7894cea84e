/*
 * The int8 settings that were environment variables only, as load options, on models/demo
 * (the folder is the first argument: DF_TEST_NEEDS_ARGS, registered by tests/int8.cmake):
 * df_load_opts.int8_group quantizes the weights as DIFFUSE_INT8_GROUP does, and
 * df_load_opts.int8_path picks the kernel as DIFFUSE_INT8_PATH does (counted per kernel by
 * df_i8_products, since the project's kernels agree bit for bit); 0 and NULL fall back to
 * the variables. Both variables are read once per process, so main sets them before
 * the first int8 product: DIFFUSE_INT8_GROUP=64, and DIFFUSE_INT8_PATH=onednn where oneDNN
 * runs int8, else portable.
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

#include "backend/cpu/gemm_int8.h"

#define PROMPT "a large yellow circle in the top left corner on a blue background"

static const char *model_dir;
static bool onednn; /* oneDNN runs int8 products here: DIFFUSE_INT8_PATH=onednn */

/* The final latents of a 2-step 64x64 int8 run of demo loaded with `lo`; caller frees. */
static float *latents(df_load_opts lo, size_t *n)
{
    lo.threads = 2;
    lo.dtype = DF_DTYPE_I8;
    df_pipeline *p;
    if (df_pipeline_load(model_dir, &lo, &p) != DF_OK)
        fail_msg("%s", df_error_message());
    df_gen_output out;
    df_gen_params g = {.prompt = PROMPT, .width = 64, .height = 64, .steps = 2, .seed = 5};
    if (df_pipeline_run(p, &g, &out) != DF_OK)
        fail_msg("%s", df_error_message());
    *n = 1;
    for (int d = 0; d < out.latents_ndim; d++)
        *n *= (size_t)out.latents_shape[d];
    float *lat = malloc(*n * sizeof *lat);
    memcpy(lat, out.latents, *n * sizeof *lat);
    df_gen_output_free(&out);
    df_pipeline_free(p);
    return lat;
}

static void test_int8_group_is_a_load_option(void **state)
{
    (void)state;
    size_t n;
    float *dflt = latents((df_load_opts){0}, &n);
    float *g64 = latents((df_load_opts){.int8_group = 64}, &n);
    float *g128 = latents((df_load_opts){.int8_group = 128}, &n);
    float *whole = latents((df_load_opts){.int8_group = -1}, &n);
    assert_memory_equal(dflt, g64, n * sizeof *dflt);     /* 0: DIFFUSE_INT8_GROUP=64 */
    assert_memory_not_equal(g64, g128, n * sizeof *dflt); /* the option changes the scales */
    assert_memory_not_equal(g128, whole, n * sizeof *dflt);
    free(dflt), free(g64), free(g128), free(whole);

    df_pipeline *p = (void *)1;
    assert_int_equal(
        df_pipeline_load(model_dir, &(df_load_opts){.dtype = DF_DTYPE_I8, .int8_group = 66}, &p),
        DF_E_ARG);
    assert_null(p);
    assert_non_null(strstr(df_error_message(), "int8_group"));
    assert_non_null(strstr(df_error_message(), "not 66"));
}

/* The products that ran on each kernel during an int8 run of demo loaded with `group` and
 * `path`. */
static void products_of(int group, const char *path, int64_t out[DF_I8_PATH_COUNT])
{
    int64_t before[DF_I8_PATH_COUNT];
    for (int k = 0; k < DF_I8_PATH_COUNT; k++)
        before[k] = df_i8_products((df_i8_path)k);
    size_t n;
    free(latents((df_load_opts){.int8_group = group, .int8_path = path}, &n));
    for (int k = 0; k < DF_I8_PATH_COUNT; k++)
        out[k] = df_i8_products((df_i8_path)k) - before[k];
}

static void test_int8_path_is_a_load_option(void **state)
{
    (void)state;
    /* Our kernels agree bit for bit: the products counted per kernel tell which ran. */
    int64_t dflt[DF_I8_PATH_COUNT], portable[DF_I8_PATH_COUNT];
    products_of(0, NULL, dflt);
    products_of(0, "portable", portable);
    if (!onednn) { /* NULL: DIFFUSE_INT8_PATH=portable, and nothing else */
        assert_true(dflt[DF_I8_PATH_PORTABLE] > 0);
        assert_int_equal(dflt[DF_I8_PATH_AVX2], 0);
    }
    assert_true(portable[DF_I8_PATH_PORTABLE] > 0);
    for (int k = DF_I8_PATH_AVX2; k < DF_I8_PATH_COUNT; k++)
        assert_int_equal(portable[k], 0);
    if (df_i8_path_available(DF_I8_PATH_AVX2)) { /* the option wins over the variable */
        int64_t avx2[DF_I8_PATH_COUNT];
        products_of(0, "avx2", avx2);
        assert_int_equal(avx2[DF_I8_PATH_PORTABLE], 0);
        assert_int_equal(avx2[DF_I8_PATH_AVX2], portable[DF_I8_PATH_PORTABLE]);
    }

    /* oneDNN takes only one group per row: there the variable and the option pick it */
    if (onednn) {
        int64_t by_env[DF_I8_PATH_COUNT], named[DF_I8_PATH_COUNT];
        products_of(-1, NULL, by_env);
        products_of(-1, "onednn", named);
        assert_true(by_env[DF_I8_PATH_ONEDNN] > 0);
        assert_int_equal(named[DF_I8_PATH_ONEDNN], by_env[DF_I8_PATH_ONEDNN]);
    }

    df_pipeline *p = (void *)1;
    df_load_opts bad = {.dtype = DF_DTYPE_I8, .int8_path = "fast"};
    assert_int_equal(df_pipeline_load(model_dir, &bad, &p), DF_E_ARG);
    assert_null(p);
    assert_non_null(strstr(df_error_message(), "'fast'"));
    assert_non_null(strstr(df_error_message(), "avx512-vnni"));
    bad.int8_path = "avx2,threads=1"; /* not smuggled into the device's options */
    assert_int_equal(df_pipeline_load(model_dir, &bad, &p), DF_E_ARG);
    static const df_i8_path kernels[] = {DF_I8_PATH_AVX512_VNNI, DF_I8_PATH_AVX_VNNI,
                                         DF_I8_PATH_AVX2, DF_I8_PATH_ONEDNN};
    for (size_t i = 0; i < sizeof kernels / sizeof *kernels; i++) {
        if (df_i8_path_available(kernels[i]))
            continue;
        bad.int8_path = df_i8_path_name(kernels[i]);
        assert_int_equal(df_pipeline_load(model_dir, &bad, &p), DF_E_UNSUPPORTED);
        assert_non_null(strstr(df_error_message(), "cannot run"));
        assert_non_null(strstr(df_error_message(), bad.int8_path));
    }
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL_DIR (tests/int8.cmake passes models/demo)\n", argv[0]);
        return 2;
    }
    model_dir = argv[1];
    onednn = df_i8_path_available(DF_I8_PATH_ONEDNN);
    setenv("DIFFUSE_INT8_GROUP", "64", 1);
    setenv("DIFFUSE_INT8_PATH", onednn ? "onednn" : "portable", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_group_is_a_load_option),
        cmocka_unit_test(test_int8_path_is_a_load_option),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
