/*
 * `diffuse generate --tp 2` under mpirun, against the single-process image (built and
 * registered by tests/tp.cmake only when MPI and mpirun exist; DF_DIFFUSE_BIN, DF_MPIRUN and
 * DF_TEST_TMP come from there). The argument picks the group: `flux` (ctest tp/mpirun) or
 * `flux2` (tp/mpirun-flux2).
 *
 * flux: a tiny FLUX pipeline (diffuse make-tiny: 2 transformer heads, 4 T5 heads) is
 * generated once; the same prompt and seed then run in one process and as 2 ranks (eager,
 * defer and fuse with compiled repeated blocks, the compiled transformer). Failures: --tp 3
 * on 2 processes, a model folder missing on rank 1 only, and --tp without mpirun must end
 * every process with a non-zero status well within the time limit, the message printed once.
 * int8: a folder saved by `diffuse quantize --group 32` (each rank reads its slice of the I8
 * weights and of their scales) and --dtype int8 on a bf16 folder (each rank quantizes its
 * slice) against one process; groups of 64, which a rank's slice of k would cut, stop every
 * process with one message.
 *
 * flux2: make-tiny writes a Flux2Pipeline (Mistral 3 encoder: 4 heads, 2 KV heads) and a
 * distilled Flux2KleinPipeline (Qwen3) folder; both transformers have 2 heads. Each runs in
 * one process and as 2 ranks with the same options, strict eager and with compiled repeated
 * blocks (klein also compiled with model offload). Three ranks, over which the 2
 * transformer heads do not split, stop every process with one message. A klein folder at 4
 * heads of 32 in bf16 runs int8, saved with groups of 32 and quantized on load.
 *
 * vulkan (ctest vulkan/tp2_same_image, registered by tests/vulkan.cmake): the tiny FLUX
 * pipeline on `--device vulkan` (lavapipe with DIFFUSE_VULKAN_ALLOW_CPU=1 in CI), strict
 * eager and compiled with model offload, at the smaller sizes of the flux2 group (lavapipe
 * is slow), in one process and as 2 ranks whose all-reduces the Vulkan backend stages
 * through host memory.
 *
 * The PNGs must agree within one level per channel and carry the same parameters.
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
#define DEV   DF_TEST_TMP "/tp-flux2"
#define KLEIN DF_TEST_TMP "/tp-flux2-klein"
#define VK_TINY DF_TEST_TMP "/tp-vk-tiny"
#define TINY_I8  DF_TEST_TMP "/tp-tiny-int8"
#define TINY_BF16 DF_TEST_TMP "/tp-tiny-bf16"
#define KLEIN4   DF_TEST_TMP "/tp-flux2-klein-4x32"
#define KLEIN4_I8 DF_TEST_TMP "/tp-flux2-klein-4x32-int8"
#define LIMIT "300" /* seconds: a hang fails the test instead of the whole suite */
#define ARGS  "-p 'a lighthouse at dusk' -W 64 -H 48 --steps 3 --seed 7"
#define ARGS2 "-p 'a lighthouse at dusk' -W 48 -H 32 --steps 2 --seed 7 --max-sequence-length 48"
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

static int setup_flux(void **state)
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

static int setup_flux2(void **state)
{
    (void)state;
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' '%s' '%s' && '%s' make-tiny --arch flux2 '%s' && "
             "'%s' make-tiny --arch flux2-klein '%s' && "
             "'%s' make-tiny --arch flux2-klein --dtype bf16 --heads 4 --head-dim 32 '%s'",
             DEV, KLEIN, KLEIN4, DF_DIFFUSE_BIN, DEV, DF_DIFFUSE_BIN, KLEIN, DF_DIFFUSE_BIN,
             KLEIN4);
    return run(cmd, DF_TEST_TMP "/tp-flux2-make-tiny.err") == 0 ? 0 : -1;
}

static int setup_vulkan(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' make-tiny '%s'", VK_TINY, DF_DIFFUSE_BIN,
             VK_TINY);
    return run(cmd, DF_TEST_TMP "/tp-vk-make-tiny.err") == 0 ? 0 : -1;
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

/* `model` with `args` and `extra` as 2 ranks against the one-process image `ref`; ref NULL:
 * made first, in one process with the same options. `name` names the files. */
/* Two ranks against one process: at most `levels` levels apart anywhere in the image. */
static void two_ranks_within(const char *model, const char *args, const char *ref,
                             const char *extra, const char *name, int levels)
{
    char own_ref[1024], out[1024], err[1024], cmd[4096];
    snprintf(out, sizeof out, "%s/tp-%s.png", DF_TEST_TMP, name);
    snprintf(err, sizeof err, "%s/tp-%s.err", DF_TEST_TMP, name);
    remove(out);
    if (!ref) {
        snprintf(own_ref, sizeof own_ref, "%s/tp-%s-ref.png", DF_TEST_TMP, name);
        remove(own_ref);
        snprintf(cmd, sizeof cmd, ENV "'%s' generate -m '%s' %s --threads 2 %s -o '%s'",
                 DF_DIFFUSE_BIN, model, args, extra, own_ref);
        if (run(cmd, err) != 0) {
            print_file(err);
            fail_msg("diffuse generate %s on %s failed", extra, model);
        }
        assert_int_equal(count_lines(err, "vulkan validation:"), 0);
        ref = own_ref;
    }
    snprintf(cmd, sizeof cmd, MPIRUN "-np 2 '%s' generate --tp 2 -m '%s' %s --threads 1 %s -o '%s'",
             DF_DIFFUSE_BIN, model, args, extra, out);
    int rc = run(cmd, err);
    if (rc != 0) {
        print_file(err);
        fail_msg("mpirun -np 2 diffuse generate --tp 2 %s on %s: exit status %d", extra, model,
                 rc);
    }
    assert_int_equal(count_lines(err, "vulkan validation:"), 0);
    char *pa = NULL, *pb = NULL;
    int d = max_level_diff(ref, out, &pa, &pb);
    printf("%s --tp 2 %s: largest pixel difference from one process: %d level(s)\n", name,
           extra, d);
    assert_true(d <= levels);
    assert_non_null(pa);
    assert_non_null(pb);
    assert_string_equal(pa, pb); /* the same prompt, seed and sizes in tEXt */
    df_image_text_free(pa);
    df_image_text_free(pb);
}

static void two_ranks_match(const char *model, const char *args, const char *ref,
                            const char *extra, const char *name)
{
    two_ranks_within(model, args, ref, extra, name, 1);
}

/* ---- FluxPipeline ---------------------------------------------------------------------- */

static void test_two_ranks_eager(void **state)
{
    (void)state;
    two_ranks_match(TINY, ARGS, DF_TEST_TMP "/tp-ref.png", "", "eager");
}

static void test_two_ranks_fuse_compiled_blocks(void **state)
{
    (void)state;
    two_ranks_match(TINY, ARGS, DF_TEST_TMP "/tp-ref.png", "--mode fuse --compile-blocks",
                    "blocks");
}

static void test_two_ranks_compiled_transformer(void **state)
{
    (void)state;
    two_ranks_match(TINY, ARGS, DF_TEST_TMP "/tp-ref.png", "--mode compile", "compile");
}

/* ---- int8 ------------------------------------------------------------------------------ */

/* `diffuse quantize` with `args` from `in` to `out` (replaced). */
static void quantize(const char *in, const char *out, const char *args)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' quantize %s -m '%s' -o '%s'", out,
             DF_DIFFUSE_BIN, args, in, out);
    if (run(cmd, DF_TEST_TMP "/tp-quantize.err") != 0) {
        print_file(DF_TEST_TMP "/tp-quantize.err");
        fail_msg("diffuse quantize %s %s failed", args, in);
    }
}

/* A folder saved int8 with scale groups of 32: every split of k (64 over 2 ranks, the single
 * blocks' [attn 64, mlp 256] halves) falls on a group boundary, so each rank quantizes and
 * multiplies exactly what one process does. */
static void test_int8_saved(void **state)
{
    (void)state;
    quantize(TINY, TINY_I8, "--group 32");
    two_ranks_match(TINY_I8, ARGS, NULL, "", "int8-saved");
}

/* --dtype int8 on a bf16 folder: each rank quantizes its slice on load (with groups of 32,
 * the groups one process uses). */
static void test_int8_on_load(void **state)
{
    (void)state;
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && '%s' make-tiny --dtype bf16 '%s'", TINY_BF16,
             DF_DIFFUSE_BIN, TINY_BF16);
    assert_int_equal(run(cmd, DF_TEST_TMP "/tp-make-tiny-bf16.err"), 0);
    setenv("DIFFUSE_INT8_GROUP", "32", 1);
    two_ranks_match(TINY_BF16, ARGS, NULL, "--dtype int8", "int8-load");
    unsetenv("DIFFUSE_INT8_GROUP");
}

/* Groups of 64 of the single blocks' proj_out (k 320) do not fall on rank 0's slice end at
 * 32: every process stops, one message naming the tensor, k, the group and the ranks. */
static void test_int8_groups_across_the_split(void **state)
{
    (void)state;
    quantize(TINY, TINY_I8 "-64", "--group 64");
    char cmd[4096];
    const char *err = DF_TEST_TMP "/tp-int8-misaligned.err";
    snprintf(cmd, sizeof cmd, MPIRUN "-np 2 '%s' generate --tp 2 -m '%s' " ARGS " -o '%s'",
             DF_DIFFUSE_BIN, TINY_I8 "-64", DF_TEST_TMP "/tp-never.png");
    int rc = run(cmd, err);
    if (rc == 0 || rc == 124)
        print_file(err);
    assert_true(rc != 0 && rc != 124);
    assert_int_equal(count_lines(err, "diffuse generate: "), 1);
    assert_int_equal(count_lines(err, "'single_transformer_blocks.0.proj_out.weight' is saved "
                                      "int8 with k 320 in scale groups of 64"),
                     1);
    assert_int_equal(count_lines(err, "of 2 tensor-parallel ranks"), 1);
}

/* ---- --device vulkan --------------------------------------------------------------------- */

static void test_vulkan_eager(void **state)
{
    (void)state;
    two_ranks_match(VK_TINY, ARGS2, NULL, "--device vulkan", "vk-eager");
}

static void test_vulkan_compiled_offloaded(void **state)
{
    (void)state;
    two_ranks_match(VK_TINY, ARGS2, NULL, "--device vulkan --mode compile --offload model",
                    "vk-compile");
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

/* ---- Flux2Pipeline, Flux2KleinPipeline -------------------------------------------------- */

static void test_dev_eager(void **state)
{
    (void)state;
    two_ranks_match(DEV, ARGS2, NULL, "", "flux2-dev-eager");
}

static void test_dev_blocks(void **state)
{
    (void)state;
    two_ranks_match(DEV, ARGS2, NULL, "--mode fuse --compile-blocks", "flux2-dev-blocks");
}

static void test_klein_eager(void **state)
{
    (void)state;
    two_ranks_match(KLEIN, ARGS2, NULL, "", "flux2-klein-eager");
}

static void test_klein_compiled_offloaded(void **state)
{
    (void)state;
    two_ranks_match(KLEIN, ARGS2, NULL, "--mode compile --offload model", "flux2-klein-compile");
}

/* klein at 4 heads of 32 in bf16 (width 128, MLP 384; Qwen3 attention 64, MLP 64): every k
 * a rank gets splits on groups of 32, saved and quantized on load. */
static void test_klein_int8_saved(void **state)
{
    (void)state;
    quantize(KLEIN4, KLEIN4_I8, "--group 32");
    two_ranks_match(KLEIN4_I8, ARGS2, NULL, "", "flux2-klein-int8-saved");
}

static void test_klein_int8_on_load(void **state)
{
    (void)state;
    setenv("DIFFUSE_INT8_GROUP", "32", 1);
    /* Two levels: the split products' sums (all-reduce) differ from one process's in the
     * last bits, and int8 compute rounds activations, attention's scores, P and V to 8 bits
     * at every layer, so a few of those roundings move (5 of 4608 values by 2 levels here). */
    two_ranks_within(KLEIN4, ARGS2, NULL, "--dtype int8", "flux2-klein-int8-load", 2);
    unsetenv("DIFFUSE_INT8_GROUP");
}

/* Heads that cannot be split over 3 ranks: every rank stops, one message. */
static void test_indivisible_heads(void **state)
{
    (void)state;
    char cmd[4096];
    const char *err = DF_TEST_TMP "/tp-flux2-indivisible.err";
    snprintf(cmd, sizeof cmd,
             MPIRUN "-np 3 '%s' generate --tp 3 -m '%s' " ARGS2 " --threads 1 -o '%s'",
             DF_DIFFUSE_BIN, KLEIN, DF_TEST_TMP "/tp-flux2-never.png");
    int rc = run(cmd, err);
    if (rc == 0 || rc == 124)
        print_file(err);
    assert_true(rc != 0 && rc != 124);
    assert_int_equal(count_lines(err, "diffuse generate: "), 1);
    assert_int_equal(count_lines(err, "not divisible by the 3 tensor-parallel ranks"), 1);
}

int main(int argc, char **argv)
{
    const struct CMUnitTest flux[] = {
        cmocka_unit_test(test_two_ranks_eager),
        cmocka_unit_test(test_two_ranks_fuse_compiled_blocks),
        cmocka_unit_test(test_two_ranks_compiled_transformer),
        cmocka_unit_test(test_rank_count_mismatch),
        cmocka_unit_test(test_missing_model_on_one_rank),
        cmocka_unit_test(test_tp_without_mpirun),
        cmocka_unit_test(test_int8_saved),
        cmocka_unit_test(test_int8_on_load),
        cmocka_unit_test(test_int8_groups_across_the_split),
    };
    const struct CMUnitTest flux2[] = {
        cmocka_unit_test(test_dev_eager),
        cmocka_unit_test(test_dev_blocks),
        cmocka_unit_test(test_klein_eager),
        cmocka_unit_test(test_klein_compiled_offloaded),
        cmocka_unit_test(test_klein_int8_saved),
        cmocka_unit_test(test_klein_int8_on_load),
        cmocka_unit_test(test_indivisible_heads),
    };
    const struct CMUnitTest vulkan[] = {
        cmocka_unit_test(test_vulkan_eager),
        cmocka_unit_test(test_vulkan_compiled_offloaded),
    };
    const char *group = argc > 1 ? argv[1] : "flux";
    if (strcmp(group, "flux") == 0)
        return cmocka_run_group_tests_name("flux", flux, setup_flux, NULL);
    if (strcmp(group, "flux2") == 0)
        return cmocka_run_group_tests_name("flux2", flux2, setup_flux2, NULL);
    if (strcmp(group, "vulkan") == 0)
        return cmocka_run_group_tests_name("vulkan", vulkan, setup_vulkan, NULL);
    fprintf(stderr, "usage: test_tp_mpi [flux|flux2|vulkan]\n");
    return 2;
}
