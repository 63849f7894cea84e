/*
 * --dtype auto: the compute dtype chosen from the device's measured matrix product rates
 * and the checkpoint's dtype.
 *
 * - df_dtype_auto for rates on either side of the 1.25x rule (the EPYC's 470 / 961, the
 *   Xeon's 231 / 145, no bf16, a device that does not say) and each checkpoint dtype; the
 *   reason names the rates and what decided;
 * - DIFFUSE_MATMUL_RATES answers for the CPU; a malformed value fails naming the variable;
 * - the CPU's probe is measured once and cached by CPU and threads: a second ask reads the
 *   cache, a damaged cache file or one of another key is measured again and rewritten;
 * - the checkpoint's dtype is the transformer's (a bf16 `make-tiny` folder, the f32 golden
 *   one, a folder without a transformer);
 * - a pipeline loaded with auto_dtype runs in the choice for fake rates and says why; an
 *   explicit dtype is "asked for"; on the sim device it is the sim's rates that decide
 *   (DIFFUSE_SIM_MATMUL_RATES), not the host CPU's;
 * - under tensor parallelism every rank takes rank 0's choice, even where its own cached
 *   rates would pick the other dtype.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "pipelines/pipeline.h"

#define SD3_DIR DF_GOLDEN_DIR "/t2i-sd3/pipeline"

static void test_choice_for_rates_and_checkpoint(void **state)
{
    (void)state;
    const df_matmul_rates epyc = {470, 961, "fake"}, xeon = {231, 145, "fake"},
                          none = {300, 0, "fake"}, near = {400, 480, "fake"},
                          edge = {400, 500, "fake"};
    struct {
        const df_matmul_rates *rates;
        df_dtype weights, want;
        const char *why;
    } cases[] = {
        {&epyc, DF_DTYPE_BF16, DF_DTYPE_BF16, "stores bf16 weights and bf16 products are 2.04x"},
        {&epyc, DF_DTYPE_F32, DF_DTYPE_F32, "weights are f32, not bf16"},
        {&epyc, DF_DTYPE_F16, DF_DTYPE_F32, "weights are f16, not bf16"},
        {&epyc, DF_DTYPE_COUNT, DF_DTYPE_F32, "of unknown dtype"},
        {&xeon, DF_DTYPE_BF16, DF_DTYPE_F32, "not clearly faster here: 145 against f32's 231"},
        {&xeon, DF_DTYPE_F32, DF_DTYPE_F32, "not clearly faster"},
        {&near, DF_DTYPE_BF16, DF_DTYPE_F32, "(1.20x, under 1.25x; fake)"},
        {&edge, DF_DTYPE_BF16, DF_DTYPE_BF16, "1.25x faster here (500 against 400 GFLOP/s"},
        {&none, DF_DTYPE_BF16, DF_DTYPE_F32, "no bf16 matrix products"},
        {NULL, DF_DTYPE_BF16, DF_DTYPE_F32, "does not say"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[512] = "";
        df_dtype got = df_dtype_auto(cases[i].rates, cases[i].weights, why, sizeof why);
        if (got != cases[i].want || !strstr(why, cases[i].why))
            fail_msg("case %zu: %s (%s), expected %s naming '%s'", i, df_dtype_name(got), why,
                     df_dtype_name(cases[i].want), cases[i].why);
    }
    assert_int_equal(df_dtype_auto(&epyc, DF_DTYPE_BF16, NULL, 0), DF_DTYPE_BF16);
}

static df_ctx *cpu_ctx(int threads)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.device = "cpu", .threads = threads}, &ctx),
                     DF_OK);
    return ctx;
}

static void test_rates_from_the_environment(void **state)
{
    (void)state;
    df_ctx *ctx = cpu_ctx(1);
    df_matmul_rates r;
    setenv("DIFFUSE_MATMUL_RATES", "f32=470,bf16=961", 1);
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
    assert_true(r.f32_gflops == 470 && r.bf16_gflops == 961);
    assert_non_null(strstr(r.how, "DIFFUSE_MATMUL_RATES"));
    setenv("DIFFUSE_MATMUL_RATES", "bf16=0,f32=12.5", 1);
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
    assert_true(r.f32_gflops == 12.5 && r.bf16_gflops == 0);
    const char *bad[] = {"f32=abc",       "f32=470;bf16=961",     "bf16=961",
                         "f32=-1,bf16=2", "f32=470,bf16=961,x=1", "f32=nan,bf16=1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DIFFUSE_MATMUL_RATES", bad[i], 1);
        r.f32_gflops = 1;
        assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_E_ARG);
        assert_true(r.f32_gflops == 0);
        if (!strstr(df_error_message(), "DIFFUSE_MATMUL_RATES"))
            fail_msg("'%s': %s", bad[i], df_error_message());
    }
    unsetenv("DIFFUSE_MATMUL_RATES");
    df_ctx_free(ctx);
}

/* A fresh cache folder under the test folder, set as DIFFUSE_CACHE_DIR. */
static const char *fresh_cache(const char *name)
{
    static char dir[1024];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(dir, sizeof dir, "%s/auto-dtype-%s-%d", DF_TEST_TMP, name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    setenv("DIFFUSE_CACHE_DIR", dir, 1);
    unsetenv("DIFFUSE_MATMUL_RATES");
    return dir;
}

/* The cache file a `how` names ("... cached in FILE"). */
static const char *cached_file(const df_matmul_rates *r, char *buf, size_t cap)
{
    const char *at = strstr(r->how, "cached in ");
    if (!at)
        fail_msg("no cache file in '%s'", r->how);
    snprintf(buf, cap, "%s", at + strlen("cached in "));
    return buf;
}

/* Rewrites the rates of a cache file, keeping its first two lines (magic and key). */
static void set_cached_rates(const char *path, double f32, double bf16)
{
    char head[2][1024];
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(head[0], sizeof head[0], f));
    assert_non_null(fgets(head[1], sizeof head[1], f));
    fclose(f);
    f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "%s%sf32 %.1f\nbf16 %.1f\n", head[0], head[1], f32, bf16);
    fclose(f);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_probe_is_cached_and_a_damaged_cache_measured_again(void **state)
{
    (void)state;
    fresh_cache("probe");
    df_ctx *ctx = cpu_ctx(1);
    df_matmul_rates r;
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
    char why[512];
    df_dtype pick = df_dtype_auto(&r, DF_DTYPE_BF16, why, sizeof why);
    printf("this CPU, 1 thread: f32 %.0f, bf16 %.0f GFLOP/s (%s); a bf16 checkpoint gets %s\n",
           r.f32_gflops, r.bf16_gflops, r.how, df_dtype_name(pick));
    assert_true(r.f32_gflops > 0);
    assert_non_null(strstr(r.how, "measured now on 1 threads"));
    char path[1024];
    cached_file(&r, path, sizeof path);

    set_cached_rates(path, 111, 222); /* a second ask reads the file, not the CPU */
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
    assert_true(r.f32_gflops == 111 && r.bf16_gflops == 222);
    assert_non_null(strstr(r.how, "measured earlier on 1 threads, cached in"));

    const char *damaged[] = {
        "garbage\n", "",
        "diffuse matmul rates 1\nkey another CPU|isa 0|oneDNN 0.0.0|threads 1\nf32 1\nbf16 2\n",
        NULL, /* the right key, rates cut off */
    };
    for (size_t i = 0; i < sizeof damaged / sizeof damaged[0]; i++) {
        if (damaged[i]) {
            write_file(path, damaged[i]);
        } else {
            set_cached_rates(path, 111, 222);
            FILE *f = fopen(path, "r");
            char text[2048];
            size_t n = fread(text, 1, sizeof text - 1, f);
            fclose(f);
            text[n > 6 ? n - 6 : 0] = '\0'; /* "bf16 222.0\n" loses its tail */
            write_file(path, text);
        }
        assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
        if (!strstr(r.how, "measured now") || r.f32_gflops == 111)
            fail_msg("damaged cache %zu was read: %s", i, r.how);
        assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK); /* and rewritten whole */
        if (!strstr(r.how, "cached in"))
            fail_msg("damaged cache %zu was not rewritten: %s", i, r.how);
    }
    df_ctx_free(ctx);

    /* Another thread count is another key: measured, in another file. */
    ctx = cpu_ctx(2);
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
    assert_non_null(strstr(r.how, "measured now on 2 threads"));
    char path2[1024];
    assert_string_not_equal(cached_file(&r, path2, sizeof path2), path);
    df_ctx_free(ctx);
    unsetenv("DIFFUSE_CACHE_DIR");
}

static void test_device_without_rates(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    if (df_ctx_create(&(df_ctx_opts){.device = "sim", .threads = 1}, &ctx) != DF_OK) {
        printf("no sim device in this build: %s\n", df_error_message());
        return;
    }
    df_matmul_rates r;
    assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "sim"));
    df_ctx_free(ctx);
}

#ifdef DF_DIFFUSE_BIN
/* DF_TEST_TMP/auto-dtype-<arch>-<dtype>: a tiny pipeline stored in dtype. */
static const char *tiny(const char *arch, const char *dtype)
{
    static char dir[4][1024];
    static int next;
    char *d = dir[next++ % 4];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(d, sizeof dir[0], "%s/auto-dtype-%s-%s", DF_TEST_TMP, arch, dtype);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' make-tiny --arch %s --dtype %s '%s' > /dev/null",
             DF_DIFFUSE_BIN, arch, dtype, d);
    assert_int_equal(system(cmd), 0);
    return d;
}

static void test_checkpoint_dtype_is_the_transformers(void **state)
{
    (void)state;
    assert_int_equal(df_pipeline_checkpoint_dtype(tiny("sd3", "bf16")), DF_DTYPE_BF16);
    assert_int_equal(df_pipeline_checkpoint_dtype(tiny("sd3", "f32")), DF_DTYPE_F32);
    assert_int_equal(df_pipeline_checkpoint_dtype(SD3_DIR), DF_DTYPE_F32);
    assert_int_equal(df_pipeline_checkpoint_dtype(DF_TEST_TMP "/no-such-pipeline"), DF_DTYPE_COUNT);
}

static void expect_load(const char *dir, const df_load_opts *o, df_dtype want, const char *why)
{
    df_pipeline *p;
    df_status s = df_pipeline_load(dir, o, &p);
    if (s != DF_OK)
        fail_msg("%s: %s", dir, df_error_message());
    const char *got_why;
    df_dtype got = df_pipeline_compute_dtype(p, &got_why);
    if (got != want || !strstr(got_why, why))
        fail_msg("%s under %s: %s (%s), expected %s naming '%s'", dir,
                 getenv("DIFFUSE_MATMUL_RATES"), df_dtype_name(got), got_why, df_dtype_name(want),
                 why);
    assert_int_equal(df_ctx_compute_dtype(df_pipeline_ctx(p)), want);
    printf("%s: %s (%s)\n", dir, df_dtype_name(got), got_why);
    df_pipeline_free(p);
}

static void test_pipelines_run_in_the_choice(void **state)
{
    (void)state;
    const df_load_opts autod = {.threads = 1, .auto_dtype = true};
    const char *bf16 = tiny("sd3", "bf16");
    setenv("DIFFUSE_MATMUL_RATES", "f32=470,bf16=961", 1); /* this EPYC */
    expect_load(bf16, &autod, DF_DTYPE_BF16, "2.04x faster here (961 against 470 GFLOP/s");
    expect_load(SD3_DIR, &autod, DF_DTYPE_F32, "weights are f32, not bf16");
    setenv("DIFFUSE_MATMUL_RATES", "f32=231,bf16=145", 1); /* the Xeon without AMX */
    expect_load(bf16, &autod, DF_DTYPE_F32, "145 against f32's 231");
    expect_load(bf16, &(df_load_opts){.threads = 1, .dtype = DF_DTYPE_BF16}, DF_DTYPE_BF16,
                "asked for");
    setenv("DIFFUSE_MATMUL_RATES", "f32=fast", 1);
    df_pipeline *p = (void *)1;
    assert_int_equal(df_pipeline_load(bf16, &autod, &p), DF_E_ARG);
    assert_null(p);
    assert_non_null(strstr(df_error_message(), "DIFFUSE_MATMUL_RATES='f32=fast'"));
    unsetenv("DIFFUSE_MATMUL_RATES");
}

/* On the sim device --dtype auto reads the sim's rates, not the host CPU's: the CPU's fake
 * rates say bf16 is slower, the sim's that it is 4x faster. */
static void test_pipelines_on_another_device_read_its_rates(void **state)
{
    (void)state;
    const char *bf16 = tiny("sd3", "bf16");
    setenv("DIFFUSE_MATMUL_RATES", "f32=231,bf16=145", 1);
    setenv("DIFFUSE_SIM_MATMUL_RATES", "f32=100,bf16=400", 1);
    expect_load(bf16, &(df_load_opts){.threads = 1, .auto_dtype = true, .device = "sim"},
                DF_DTYPE_BF16, "4.00x faster here (400 against 100 GFLOP/s; given by "
                "DIFFUSE_SIM_MATMUL_RATES)");
    expect_load(bf16, &(df_load_opts){.threads = 1, .auto_dtype = true, .device = "cpu"},
                DF_DTYPE_F32, "145 against f32's 231");
    unsetenv("DIFFUSE_SIM_MATMUL_RATES");
    expect_load(bf16, &(df_load_opts){.threads = 1, .auto_dtype = true, .device = "sim"},
                DF_DTYPE_F32, "does not say");
    unsetenv("DIFFUSE_MATMUL_RATES");
}

typedef struct rank_job {
    df_comm *comm;
    const char *dir;
    int threads;
    df_status s;
    df_dtype dtype;
    char why[512];
} rank_job;

static void *rank_load(void *arg)
{
    rank_job *j = arg;
    df_pipeline *p = NULL;
    j->s = df_pipeline_load(
        j->dir, &(df_load_opts){.threads = j->threads, .comm = j->comm, .auto_dtype = true}, &p);
    const char *why = df_error_message();
    if (j->s == DF_OK)
        j->dtype = df_pipeline_compute_dtype(p, &why);
    snprintf(j->why, sizeof j->why, "%s", why);
    df_pipeline_free(p);
    return NULL;
}

/* Two ranks, each on its own thread count, so each has its own cache file; they load `dir`
 * with --dtype auto. */
static void load_two_ranks(const char *dir, int threads0, int threads1, rank_job jobs[2])
{
    df_comm *comms[2];
    assert_int_equal(df_comm_create_threads(2, comms), DF_OK);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (rank_job){.comm = comms[r], .dir = dir, .threads = r ? threads1 : threads0};
        assert_int_equal(pthread_create(&th[r], NULL, rank_load, &jobs[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        df_comm_free(comms[r]);
        if (jobs[r].s != DF_OK)
            fail_msg("rank %d: %s", r, jobs[r].why);
    }
}

static void test_tensor_parallel_ranks_take_rank0s_choice(void **state)
{
    (void)state;
    const char *dir = tiny("flux", "bf16");
    fresh_cache("tp");
    /* Cache files that disagree: on 1 thread bf16 is slow, on 2 it is fast. */
    const double rates[2][2] = {{1000, 100}, {100, 1000}};
    for (int t = 1; t <= 2; t++) {
        df_ctx *ctx = cpu_ctx(t);
        df_matmul_rates r;
        assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
        char path[1024];
        set_cached_rates(cached_file(&r, path, sizeof path), rates[t - 1][0], rates[t - 1][1]);
        assert_int_equal(df_ctx_matmul_rates(ctx, &r), DF_OK);
        assert_true(r.f32_gflops == rates[t - 1][0]);
        df_ctx_free(ctx);
    }
    rank_job jobs[2];
    load_two_ranks(dir, 1, 2, jobs); /* rank 0's rates say f32 */
    for (int r = 0; r < 2; r++) {
        if (jobs[r].dtype != DF_DTYPE_F32 || !strstr(jobs[r].why, "100 against f32's 1000"))
            fail_msg("rank %d of a rank 0 with slow bf16: %s (%s)", r, df_dtype_name(jobs[r].dtype),
                     jobs[r].why);
    }
    load_two_ranks(dir, 2, 1, jobs); /* rank 0's rates say bf16 */
    for (int r = 0; r < 2; r++) {
        if (jobs[r].dtype != DF_DTYPE_BF16 || !strstr(jobs[r].why, "1000 against 100 GFLOP/s"))
            fail_msg("rank %d of a rank 0 with fast bf16: %s (%s)", r, df_dtype_name(jobs[r].dtype),
                     jobs[r].why);
    }
    assert_string_equal(jobs[0].why, jobs[1].why);
    unsetenv("DIFFUSE_CACHE_DIR");
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_choice_for_rates_and_checkpoint),
        cmocka_unit_test(test_rates_from_the_environment),
        cmocka_unit_test(test_probe_is_cached_and_a_damaged_cache_measured_again),
        cmocka_unit_test(test_device_without_rates),
#ifdef DF_DIFFUSE_BIN
        cmocka_unit_test(test_checkpoint_dtype_is_the_transformers),
        cmocka_unit_test(test_pipelines_run_in_the_choice),
        cmocka_unit_test(test_pipelines_on_another_device_read_its_rates),
        cmocka_unit_test(test_tensor_parallel_ranks_take_rank0s_choice),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
