/*
 * The whole-k int8 products' choice between the project's kernel and oneDNN's
 * (int8_choice.c): measured once per CPU and shape class, the verdict written to the cache
 * folder and read back, a damaged file measured over, the verdict in the file honoured,
 * DIFFUSE_INT8_GEMM's override, and the two paths within the int8 bounds of each other.
 * Nothing here depends on which path wins on the machine running the tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/gemm_int8_impl.h"
#include "core/int8_quant.h"

#define M     37
#define N     96
#define K     520
#define GROUP 104 /* 5 groups of k */

static float *x_values, *w_values;

static float *random_matrix(int64_t rows, int64_t cols, uint64_t seed)
{
    float *x = malloc((size_t)(rows * cols) * sizeof *x);
    for (int64_t i = 0; i < rows * cols; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((seed >> 40) * (1.0 / (double)(1ull << 23)) - 1.0);
    }
    return x;
}

/* A fresh cache folder under the test folder, set as DIFFUSE_CACHE_DIR; no verdict kept in
 * the process. */
static void fresh_cache(const char *name)
{
    char dir[1024], cmd[1200];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(dir, sizeof dir, "%s/int8-choice-%s-%d", DF_TEST_TMP, name, (int)getpid());
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    setenv("DIFFUSE_CACHE_DIR", dir, 1);
    unsetenv("DIFFUSE_INT8_GEMM");
    df_i8_choice_forget();
}

static df_i8_weight *weight(int64_t n, int64_t group)
{
    df_i8_weight *w;
    assert_int_equal(df_i8_weight_pack(w_values, DF_DTYPE_F32, n, K, K, group, &w), DF_OK);
    return w;
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char text[4096];
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    return text;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The choice for w, checking that `how` says `expect`. */
static df_i8_path choice(const df_i8_weight *w, const char *expect)
{
    df_i8_path p;
    char how[4200];
    assert_int_equal(df_i8_whole_k_path(w, &p, how, sizeof how), DF_OK);
    if (!strstr(how, expect))
        fail_msg("expected \"%s\" in \"%s\"", expect, how);
    assert_true(p == df_i8_best_kernel() || p == DF_I8_PATH_ONEDNN);
    return p;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Measured once, written, read back by a later process (here: after forgetting), kept in
 * the process after that. */
static void test_verdict_is_cached(void **state)
{
    (void)state;
    fresh_cache("cached");
    df_i8_weight *w = weight(N, K);
    char path[4096];
    df_i8_choice_file(w->kp, N, omp_get_max_threads(), path, sizeof path);
    assert_true(path[0] != '\0');
    if (!df_i8_path_available(DF_I8_PATH_ONEDNN)) { /* nothing to choose: no probe, no file */
        assert_int_equal(choice(w, "oneDNN has no exact int8"), df_i8_best_kernel());
        assert_false(exists(path));
        df_i8_weight_free(w);
        return;
    }
    df_i8_path first = choice(w, "measured now");
    char *text = read_text(path);
    assert_non_null(text);
    assert_non_null(strstr(text, "diffuse int8 choice 1\nkey "));
    assert_non_null(strstr(text, "|int8 k 520 n 96 whole-k\n"));
    assert_non_null(strstr(text, first == DF_I8_PATH_ONEDNN ? "choice onednn" : "choice own"));
    assert_int_equal(choice(w, "decided earlier in this process"), first);
    df_i8_choice_forget();
    assert_int_equal(choice(w, "measured earlier"), first);
    /* another shape class, another file; a grouped weight has no choice and writes none */
    df_i8_weight *other = weight(N + 32, K), *grouped = weight(N + 64, GROUP);
    choice(other, "measured now");
    char other_path[4096], grouped_path[4096];
    df_i8_choice_file(other->kp, N + 32, omp_get_max_threads(), other_path, sizeof other_path);
    df_i8_choice_file(grouped->kp, N + 64, omp_get_max_threads(), grouped_path,
                      sizeof grouped_path);
    assert_string_not_equal(path, other_path);
    assert_true(exists(other_path));
    assert_int_equal(choice(grouped, "grouped"), df_i8_best_kernel());
    assert_false(exists(grouped_path));
    df_i8_weight_free(grouped);
    df_i8_weight_free(other);
    df_i8_weight_free(w);
}

/* A file that does not read back exactly is measured over and replaced. */
static void test_damaged_file_is_replaced(void **state)
{
    (void)state;
    if (!df_i8_path_available(DF_I8_PATH_ONEDNN))
        skip();
    fresh_cache("damaged");
    df_i8_weight *w = weight(N, K);
    char path[4096], good[4096];
    df_i8_choice_file(w->kp, N, omp_get_max_threads(), path, sizeof path);
    choice(w, "measured now");
    snprintf(good, sizeof good, "%s", read_text(path));
    char *choice_line = strstr(good, "\nchoice ");
    assert_non_null(choice_line);
    choice_line++;
    const char *damaged[4];
    char unknown[4096], other_key[4096];
    snprintf(unknown, sizeof unknown, "%.*schoice fastest\n", (int)(choice_line - good), good);
    snprintf(other_key, sizeof other_key, "%s", good);
    char *k = strstr(other_key, "|int8 k 520");
    k[8] = '7'; /* "k 720": the key of another class */
    damaged[0] = "\x01\x02garbage";
    damaged[1] = unknown;
    damaged[2] = other_key;
    damaged[3] = "";
    for (int i = 0; i < 4; i++) {
        write_text(path, damaged[i]);
        df_i8_choice_forget();
        choice(w, "measured now");
        char *text = read_text(path);
        assert_non_null(strstr(text, "|int8 k 520 n 96 whole-k\n"));
        assert_true(strstr(text, "choice own\n") || strstr(text, "choice onednn\n"));
        df_i8_choice_forget();
        choice(w, "measured earlier");
    }
    df_i8_weight_free(w);
}

/* The products that ran on each path for one product of w with AUTO. */
static void products_of(const df_i8_weight *w, int64_t out[DF_I8_PATH_COUNT], float *y)
{
    int64_t before[DF_I8_PATH_COUNT];
    for (int p = 0; p < DF_I8_PATH_COUNT; p++)
        before[p] = df_i8_products((df_i8_path)p);
    void *scratch = malloc(df_i8_act_bytes(w, M));
    df_i8_act a;
    df_i8_act_quantize(w, x_values, DF_DTYPE_F32, M, K, scratch, &a);
    assert_int_equal(df_i8_gemm(&a, w, &(df_i8_epilogue){.out = y}, DF_I8_PATH_AUTO), DF_OK);
    free(scratch);
    for (int p = 0; p < DF_I8_PATH_COUNT; p++)
        out[p] = df_i8_products((df_i8_path)p) - before[p];
}

/* The verdict a file holds is the path the products take, whichever it is. */
static void test_verdict_in_file_is_honoured(void **state)
{
    (void)state;
    if (!df_i8_path_available(DF_I8_PATH_ONEDNN))
        skip();
    fresh_cache("honoured");
    df_i8_weight *w = weight(N, K);
    char path[4096], text[4096];
    df_i8_choice_file(w->kp, N, omp_get_max_threads(), path, sizeof path);
    choice(w, "measured now");
    snprintf(text, sizeof text, "%s", read_text(path));
    char *c = strstr(text, "\nchoice ");
    assert_non_null(c);
    c++;
    float *y = malloc((size_t)(M * N) * sizeof *y);
    static const char *const verdicts[2] = {"onednn", "own"};
    for (int v = 0; v < 2; v++) {
        snprintf(c, sizeof text - (size_t)(c - text), "choice %s\n", verdicts[v]);
        write_text(path, text);
        df_i8_choice_forget();
        int64_t ran[DF_I8_PATH_COUNT];
        products_of(w, ran, y);
        df_i8_path want = v == 0 ? DF_I8_PATH_ONEDNN : df_i8_best_kernel();
        for (int p = 0; p < DF_I8_PATH_COUNT; p++)
            if (ran[p] != (p == (int)want ? 1 : 0))
                fail_msg("file says %s: %lld products on %s", verdicts[v], (long long)ran[p],
                         df_i8_path_name((df_i8_path)p));
    }
    free(y);
    df_i8_weight_free(w);
}

/* DIFFUSE_INT8_GEMM: own and onednn without measuring, auto measures, others refused. */
static void test_override(void **state)
{
    (void)state;
    fresh_cache("override");
    df_i8_weight *w = weight(N, K), *grouped = weight(N, GROUP);
    char path[4096];
    df_i8_choice_file(w->kp, N, omp_get_max_threads(), path, sizeof path);
    float *y = malloc((size_t)(M * N) * sizeof *y);
    int64_t ran[DF_I8_PATH_COUNT];

    setenv("DIFFUSE_INT8_GEMM", "own", 1);
    assert_int_equal(choice(w, "DIFFUSE_INT8_GEMM=own"), df_i8_best_kernel());
    products_of(w, ran, y);
    assert_int_equal(ran[df_i8_best_kernel()], 1);
    assert_int_equal(ran[DF_I8_PATH_ONEDNN], 0);

    setenv("DIFFUSE_INT8_GEMM", "onednn", 1);
    df_i8_path p;
    if (df_i8_path_available(DF_I8_PATH_ONEDNN)) {
        assert_int_equal(choice(w, "DIFFUSE_INT8_GEMM=onednn"), DF_I8_PATH_ONEDNN);
        products_of(w, ran, y);
        assert_int_equal(ran[DF_I8_PATH_ONEDNN], 1);
        assert_int_equal(ran[df_i8_best_kernel()], 0);
        /* grouped weights stay on the project's kernel */
        assert_int_equal(choice(grouped, "grouped: own"), df_i8_best_kernel());
        products_of(grouped, ran, y);
        assert_int_equal(ran[DF_I8_PATH_ONEDNN], 0);
    } else {
        assert_int_equal(df_i8_whole_k_path(w, &p, NULL, 0), DF_E_UNSUPPORTED);
    }
    assert_false(exists(path)); /* neither override measured */

    setenv("DIFFUSE_INT8_GEMM", "fastest", 1);
    assert_int_equal(df_i8_whole_k_path(w, &p, NULL, 0), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "DIFFUSE_INT8_GEMM"));
    void *scratch = malloc(df_i8_act_bytes(w, M));
    df_i8_act a;
    df_i8_act_quantize(w, x_values, DF_DTYPE_F32, M, K, scratch, &a);
    assert_int_equal(df_i8_gemm(&a, w, &(df_i8_epilogue){.out = y}, DF_I8_PATH_AUTO), DF_E_ARG);
    free(scratch);

    setenv("DIFFUSE_INT8_GEMM", "auto", 1);
    if (df_i8_path_available(DF_I8_PATH_ONEDNN)) {
        choice(w, "measured now");
        assert_true(exists(path));
    }
    unsetenv("DIFFUSE_INT8_GEMM");
    free(y);
    df_i8_weight_free(grouped);
    df_i8_weight_free(w);
}

static double rel_l2(const float *ref, const float *got, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Either verdict gives the same product to f32 rounding (test_int8_gemm's bound against the
 * quantized reference, 1e-5), and both are within int8's error of the unquantized one. */
static void test_paths_agree(void **state)
{
    (void)state;
    if (!df_i8_path_available(DF_I8_PATH_ONEDNN))
        skip();
    fresh_cache("agree");
    df_i8_weight *w = weight(N, K);
    float *y[2], *exact = malloc((size_t)(M * N) * sizeof *exact);
    static const char *const modes[2] = {"own", "onednn"};
    int64_t ran[DF_I8_PATH_COUNT];
    for (int i = 0; i < 2; i++) {
        setenv("DIFFUSE_INT8_GEMM", modes[i], 1);
        y[i] = malloc((size_t)(M * N) * sizeof *y[i]);
        products_of(w, ran, y[i]);
    }
    unsetenv("DIFFUSE_INT8_GEMM");
    for (int64_t r = 0; r < M; r++)
        for (int64_t c = 0; c < N; c++) {
            double e = 0;
            for (int64_t kk = 0; kk < K; kk++)
                e += (double)x_values[r * K + kk] * w_values[c * K + kk];
            exact[r * N + c] = (float)e;
        }
    double between = rel_l2(y[0], y[1], M * N);
    if (between > 1e-5)
        fail_msg("own and onednn differ by %.3g", between);
    for (int i = 0; i < 2; i++) {
        double err = rel_l2(exact, y[i], M * N);
        if (err > 2.5e-2)
            fail_msg("%s: %.3g from the unquantized product", modes[i], err);
        free(y[i]);
    }
    free(exact);
    df_i8_weight_free(w);
}

int main(void)
{
    unsetenv("DIFFUSE_INT8_PATH"); /* a forced path would come before the choice */
    x_values = random_matrix(M, K, 11);
    w_values = random_matrix(N + 64, K, 12);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verdict_is_cached),
        cmocka_unit_test(test_damaged_file_is_replaced),
        cmocka_unit_test(test_verdict_in_file_is_honoured),
        cmocka_unit_test(test_override),
        cmocka_unit_test(test_paths_agree),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    free(x_values);
    free(w_values);
    return failed;
}
