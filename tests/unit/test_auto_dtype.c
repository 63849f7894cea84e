/*
 * --dtype auto: the compute dtype chosen from the CPU's features and the checkpoint's dtype.
 *
 * - df_cpu_auto_dtype for every kind of CPU (none, AVX-512, AVX512-BF16 without AMX, AMX)
 *   and checkpoint (bf16, f32, f16, unknown): bf16 only for bf16 checkpoints with AMX-BF16;
 *   the reason names the feature that decided;
 * - this CPU's features are consistent (AMX-BF16 comes with AVX512-BF16, which comes with
 *   AVX-512);
 * - the checkpoint's dtype is the transformer's (a bf16 `make-tiny` folder, the f32 golden
 *   one, a folder without a transformer);
 * - a pipeline loaded with auto_dtype runs in df_cpu_auto_dtype's choice for this CPU and
 *   says why; an explicit dtype is "asked for".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "pipelines/pipeline.h"

#define SD3_DIR DF_GOLDEN_DIR "/t2i-sd3/pipeline"

static void test_choice_for_each_cpu_and_checkpoint(void **state)
{
    (void)state;
    const df_cpu_features none = {0}, avx512 = {.avx512 = true},
                          avx512_bf16 = {.avx512 = true, .avx512_bf16 = true},
                          amx = {.avx512 = true, .avx512_bf16 = true, .amx_bf16 = true};
    struct {
        const df_cpu_features *cpu;
        df_dtype weights, want;
        const char *why;
    } cases[] = {
        {&amx, DF_DTYPE_BF16, DF_DTYPE_BF16, "has AMX-BF16"},
        {&amx, DF_DTYPE_F32, DF_DTYPE_F32, "weights are not bf16"},
        {&amx, DF_DTYPE_F16, DF_DTYPE_F32, "weights are not bf16"},
        {&amx, DF_DTYPE_COUNT, DF_DTYPE_F32, "weights are not bf16"},
        {&avx512_bf16, DF_DTYPE_BF16, DF_DTYPE_F32, "AVX512-BF16 but no AMX-BF16"},
        {&avx512_bf16, DF_DTYPE_F32, DF_DTYPE_F32, "AVX512-BF16 but no AMX-BF16"},
        {&avx512, DF_DTYPE_BF16, DF_DTYPE_F32, "no native bf16"},
        {&none, DF_DTYPE_BF16, DF_DTYPE_F32, "no native bf16"},
        {&none, DF_DTYPE_F32, DF_DTYPE_F32, "no native bf16"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *why = NULL;
        df_dtype got = df_cpu_auto_dtype(cases[i].cpu, cases[i].weights, &why);
        if (got != cases[i].want || !why || !strstr(why, cases[i].why))
            fail_msg("case %zu: %s (%s), expected %s naming '%s'", i, df_dtype_name(got),
                     why ? why : "no reason", df_dtype_name(cases[i].want), cases[i].why);
    }
    assert_int_equal(df_cpu_auto_dtype(&amx, DF_DTYPE_BF16, NULL), DF_DTYPE_BF16);
}

static void test_this_cpu(void **state)
{
    (void)state;
    df_cpu_features f;
    df_cpu_features_get(&f);
    printf("this CPU: avx512 %d, avx512_bf16 %d, amx_bf16 %d\n", f.avx512, f.avx512_bf16,
           f.amx_bf16);
    assert_true(!f.amx_bf16 || f.avx512_bf16);
    assert_true(!f.avx512_bf16 || f.avx512);
    assert_int_equal(df_cpu_has_fast_bf16(), f.avx512_bf16); /* native, not necessarily fast */
}

#ifdef DF_DIFFUSE_BIN
/* DF_TEST_TMP/auto-dtype-<dtype>: a tiny SD3 pipeline stored in dtype. */
static const char *tiny(const char *dtype)
{
    static char dir[2][1024];
    char *d = dir[strcmp(dtype, "bf16") == 0];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(d, sizeof dir[0], "%s/auto-dtype-%s", DF_TEST_TMP, dtype);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' make-tiny --arch sd3 --dtype %s '%s' > /dev/null",
             DF_DIFFUSE_BIN, dtype, d);
    assert_int_equal(system(cmd), 0);
    return d;
}

static void test_checkpoint_dtype_is_the_transformers(void **state)
{
    (void)state;
    assert_int_equal(df_pipeline_checkpoint_dtype(tiny("bf16")), DF_DTYPE_BF16);
    assert_int_equal(df_pipeline_checkpoint_dtype(tiny("f32")), DF_DTYPE_F32);
    assert_int_equal(df_pipeline_checkpoint_dtype(SD3_DIR), DF_DTYPE_F32);
    assert_int_equal(df_pipeline_checkpoint_dtype(DF_TEST_TMP "/no-such-pipeline"),
                     DF_DTYPE_COUNT);
}

static void test_pipelines_run_in_the_choice(void **state)
{
    (void)state;
    df_cpu_features f;
    df_cpu_features_get(&f);
    const char *dirs[2] = {tiny("bf16"), SD3_DIR};
    const df_dtype stored[2] = {DF_DTYPE_BF16, DF_DTYPE_F32};
    for (int i = 0; i < 2; i++) {
        df_pipeline *p;
        assert_int_equal(df_pipeline_load(dirs[i], &(df_load_opts){.threads = 1,
                                                                   .auto_dtype = true},
                                          &p),
                         DF_OK);
        const char *want_why, *why;
        df_dtype want = df_cpu_auto_dtype(&f, stored[i], &want_why);
        assert_int_equal(df_pipeline_compute_dtype(p, &why), want);
        assert_string_equal(why, want_why);
        assert_int_equal(df_ctx_compute_dtype(df_pipeline_ctx(p)), want);
        printf("%s: %s (%s)\n", dirs[i], df_dtype_name(want), why);
        df_pipeline_free(p);
    }
    df_pipeline *p;
    assert_int_equal(df_pipeline_load(SD3_DIR, &(df_load_opts){.threads = 1,
                                                               .dtype = DF_DTYPE_BF16},
                                      &p),
                     DF_OK);
    const char *why;
    assert_int_equal(df_pipeline_compute_dtype(p, &why), DF_DTYPE_BF16);
    assert_string_equal(why, "asked for");
    assert_int_equal(df_ctx_compute_dtype(df_pipeline_ctx(p)), DF_DTYPE_BF16);
    df_pipeline_free(p);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choice_for_each_cpu_and_checkpoint),
        cmocka_unit_test(test_this_cpu),
#ifdef DF_DIFFUSE_BIN
        cmocka_unit_test(test_checkpoint_dtype_is_the_transformers),
        cmocka_unit_test(test_pipelines_run_in_the_choice),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
