/*
 * `diffuse generate --tp 2` under mpirun, against the single-process image (built and
 * registered by tests/tp.cmake only when MPI and mpirun exist; DF_DIFFUSE_BIN, DF_MPIRUN and
 * DF_TEST_TMP come from there).
 *
 * A tiny FLUX pipeline (diffuse make-tiny: 2 transformer heads, 4 T5 heads) is generated
 * once; the same prompt and seed then run in one process and as 2 ranks (eager, defer and
 * fuse with compiled repeated blocks, the compiled transformer). The PNGs must agree
 * within one level per channel. Failures: --tp 3 on 2 processes, a model folder missing on
 * rank 1 only, and --tp without mpirun must end every process with a non-zero status well
 * within the time limit, the message printed once.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <diffuse/diffuse.h>

#define TINY  DF_TEST_TMP "/tp-tiny"
#define LIMIT "120" /* seconds: a hang fails the test instead of the whole suite */
#define ARGS  "-p 'a lighthouse at dusk' -W 64 -H 48 --steps 3 --seed 7"
/* Leak checking would report MPI's own allocations; the unit tests check ours. */
#define ENV "ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_rmaps_base_oversubscribe=1 "
#define MPIRUN                                                                                     \
    ENV "timeout " LIMIT " '" DF_MPIRUN "' --oversubscribe --allow-run-as-root "                   \
        "-x ASAN_OPTIONS "

/* Runs a shell command; its exit status (124: timed out), stderr into `err` (path). */
static int run(const char *cmd, const char *err)
{
    char full[8192];
    int len = snprintf(full, sizeof full, "%s > /dev/null 2> '%s'", cmd, err);
    assert_true(len > 0 && len < (int)sizeof full);
    int st = system(full);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Lines of the file that contain `needle`. */
static int count_lines(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void print_file(const char *path)
{
    FILE *f = fopen(path, "r");
    char line[4096];
    while (f && fgets(line, sizeof line, f))
        fputs(line, stderr);
    if (f)
        fclose(f);
}

static int setup(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' make-tiny '%s'", TINY, DF_DIFFUSE_BIN, TINY);
    if (run(cmd, DF_TEST_TMP "/tp-make-tiny.err") != 0)
        return -1;
    snprintf(cmd, sizeof cmd, ENV "'%s' generate -m '%s' " ARGS " --threads 2 -o '%s'",
             DF_DIFFUSE_BIN, TINY, DF_TEST_TMP "/tp-ref.png");
    return run(cmd, DF_TEST_TMP "/tp-ref.err") == 0 ? 0 : -1;
}

/* Largest per-channel difference between two PNGs of the same size. */
static int max_level_diff(const char *a, const char *b, char **params_a, char **params_b)
{
    df_image *ia = NULL, *ib = NULL;
    if (df_image_load_png(a, &ia, params_a) != DF_OK ||
        df_image_load_png(b, &ib, params_b) != DF_OK)
        fail_msg("%s", df_error_message());
    assert_int_equal(ia->width, ib->width);
    assert_int_equal(ia->height, ib->height);
    int worst = 0;
    for (size_t i = 0; i < (size_t)ia->width * (size_t)ia->height * 3; i++) {
        int d = abs((int)ia->pixels[i] - (int)ib->pixels[i]);
        worst = d > worst ? d : worst;
    }
    df_image_free(ia);
    df_image_free(ib);
    return worst;
}

static void two_ranks_match(const char *extra, const char *name)
{
    char out[1024], err[1024], cmd[4096];
    snprintf(out, sizeof out, "%s/tp-%s.png", DF_TEST_TMP, name);
    snprintf(err, sizeof err, "%s/tp-%s.err", DF_TEST_TMP, name);
    remove(out);
    snprintf(cmd, sizeof cmd,
             MPIRUN "-np 2 '%s' generate --tp 2 -m '%s' " ARGS " --threads 1 %s -o '%s'",
             DF_DIFFUSE_BIN, TINY, extra, out);
    int rc = run(cmd, err);
    if (rc != 0) {
        print_file(err);
        fail_msg("mpirun -np 2 diffuse generate --tp 2 %s: exit status %d", extra, rc);
    }
    char *pa = NULL, *pb = NULL;
    int d = max_level_diff(DF_TEST_TMP "/tp-ref.png", out, &pa, &pb);
    printf("--tp 2 %s: largest pixel difference from one process: %d level(s)\n", extra, d);
    assert_true(d <= 1);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_string_equal(pa, pb); /* the same prompt, seed and sizes in tEXt */
    df_image_text_free(pa);
    df_image_text_free(pb);
}

static void test_two_ranks_eager(void **state)
{
    (void)state;
    two_ranks_match("", "eager");
}

static void test_two_ranks_fuse_compiled_blocks(void **state)
{
    (void)state;
    two_ranks_match("--mode fuse --compile-blocks", "blocks");
}

static void test_two_ranks_compiled_transformer(void **state)
{
    (void)state;
    two_ranks_match("--mode compile", "compile");
}

static void test_rank_count_mismatch(void **state)
{
    (void)state;
    char cmd[4096];
    const char *err = DF_TEST_TMP "/tp-mismatch.err";
    snprintf(cmd, sizeof cmd, MPIRUN "-np 2 '%s' generate --tp 3 -m '%s' " ARGS " -o '%s'",
             DF_DIFFUSE_BIN, TINY, DF_TEST_TMP "/tp-never.png");
    int rc = run(cmd, err);
    assert_true(rc != 0 && rc != 124);
    assert_int_equal(count_lines(err, "--tp 3, but mpirun started 2 processes"), 1);
}

static void test_missing_model_on_one_rank(void **state)
{
    (void)state;
    char cmd[4096];
    const char *err = DF_TEST_TMP "/tp-missing.err";
    snprintf(cmd, sizeof cmd,
             MPIRUN "-np 1 '%s' generate --tp 2 -m '%s' " ARGS " --threads 1 -o '%s' : "
                    "-np 1 '%s' generate --tp 2 -m '%s' " ARGS " --threads 1 -o '%s'",
             DF_DIFFUSE_BIN, TINY, DF_TEST_TMP "/tp-never.png", DF_DIFFUSE_BIN,
             DF_TEST_TMP "/tp-no-such-model", DF_TEST_TMP "/tp-never.png");
    int rc = run(cmd, err);
    if (rc == 0 || rc == 124)
        print_file(err);
    assert_true(rc != 0 && rc != 124);
    /* rank 0 prints rank 1's message, once */
    assert_int_equal(count_lines(err, "rank 1: "), 1);
    assert_int_equal(count_lines(err, "tp-no-such-model/model_index.json"), 1);
}

static void test_tp_without_mpirun(void **state)
{
    (void)state;
    char cmd[4096];
    const char *err = DF_TEST_TMP "/tp-nompi.err";
    snprintf(cmd, sizeof cmd, ENV "timeout " LIMIT " '%s' generate --tp 2 -m '%s' " ARGS " -o '%s'",
             DF_DIFFUSE_BIN, TINY, DF_TEST_TMP "/tp-never.png");
    assert_int_equal(run(cmd, err), 2);
    assert_int_equal(count_lines(err, "start it as mpirun -np 2"), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_ranks_eager),
        cmocka_unit_test(test_two_ranks_fuse_compiled_blocks),
        cmocka_unit_test(test_two_ranks_compiled_transformer),
        cmocka_unit_test(test_rank_count_mismatch),
        cmocka_unit_test(test_missing_model_on_one_rank),
        cmocka_unit_test(test_tp_without_mpirun),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
