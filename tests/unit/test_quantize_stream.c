/*
 * `diffuse quantize` streams (tests/int8.cmake passes the diffuse program, a work folder and,
 * outside sanitizer builds, whose allocator holds freed memory back, "peak":
 * DF_TEST_NEEDS_ARGS). make-tiny writes a FLUX.1 folder whose transformer (width 1024, 3 + 6
 * blocks, bf16: about 420 MB) is many times its largest tensor. Quantizing it in a child
 * process must peak (ru_maxrss from wait4) below a bound set by the largest tensor (its
 * input bytes and its 8-bit copy, three times over, plus the program's own 48 MiB), a bound
 * smaller than the 8-bit transformer alone, so building a component in memory cannot pass
 * (run with "peak").
 * Written again in shards of 16 MiB, the folder holds the same tensors, byte for byte, and
 * its index names each shard.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

static const char *diffuse_bin, *work;
static char model[4096], whole[4096], sharded[4096];
static long long whole_peak; /* of the quantize into `whole` */

/* Runs diffuse with `argv` (after the program name) in a child; its exit status, and its
 * peak resident set in bytes into *peak. */
static int run_diffuse(const char *const *args, long long *peak)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char *argv[16];
        int n = 0;
        argv[n++] = (char *)diffuse_bin;
        for (; args[n - 1] && n < 15; n++)
            argv[n] = (char *)args[n - 1];
        argv[n] = NULL;
        if (!freopen("/dev/null", "w", stdout))
            _exit(126);
        execv(diffuse_bin, argv);
        _exit(127);
    }
    int status;
    struct rusage ru;
    assert_int_equal(wait4(pid, &status, 0, &ru), pid);
    *peak = (long long)ru.ru_maxrss * 1024;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static int setup(void **state)
{
    (void)state;
    snprintf(model, sizeof model, "%s/model", work);
    snprintf(whole, sizeof whole, "%s/int8", work);
    snprintf(sharded, sizeof sharded, "%s/int8-sharded", work);
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", work, work);
    if (system(cmd) != 0)
        return -1;
    long long peak;
    const char *args[] = {"make-tiny", "--arch",   "flux", "--dtype",  "bf16", "--heads",
                          "8",         "--head-dim", "128", "--double", "3",    "--single",
                          "6",         model,        NULL};
    if (run_diffuse(args, &peak) != 0)
        return -1;
    const char *quantize[] = {"quantize", "-m", model, "-o", whole, NULL};
    return run_diffuse(quantize, &whole_peak) == 0 ? 0 : -1;
}

/* Bytes of every tensor, and of the largest, of a component's weights. */
static void weight_bytes(const char *dir, long long *total, long long *largest)
{
    df_weights *w;
    assert_int_equal(df_weights_open(dir, &w), DF_OK);
    *total = *largest = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        assert_int_equal(df_weights_at(w, i, &info), DF_OK);
        *total += (long long)info.nbytes;
        if ((long long)info.nbytes > *largest)
            *largest = (long long)info.nbytes;
    }
    df_weights_free(w);
}

static void test_peak_is_a_tensor_not_the_model(void **state)
{
    (void)state;
    long long peak = whole_peak;
    char in[4200], out[4200];
    snprintf(in, sizeof in, "%s/transformer", model);
    snprintf(out, sizeof out, "%s/transformer", whole);
    long long in_total, in_largest, out_total, out_largest;
    weight_bytes(in, &in_total, &in_largest);
    weight_bytes(out, &out_total, &out_largest);
    long long bound = (48LL << 20) + 3 * (in_largest + out_largest);
    printf("quantize: peak RSS %.1f MiB; bound %.1f MiB; transformer %.1f MiB in bf16, "
           "%.1f MiB int8; largest tensor %.1f MiB\n",
           (double)peak / (1 << 20), (double)bound / (1 << 20), (double)in_total / (1 << 20),
           (double)out_total / (1 << 20), (double)in_largest / (1 << 20));
    assert_true(bound < out_total); /* holding the component would not fit */
    assert_true(peak < bound);
}

static void test_shards_hold_the_same_tensors(void **state)
{
    (void)state;
    long long peak;
    const char *args[] = {"quantize", "--shard-size", "16777216", "-m", model, "-o", sharded,
                          NULL};
    assert_int_equal(run_diffuse(args, &peak), 0);
    char a[4200], b[4200];
    snprintf(a, sizeof a, "%s/transformer", whole);
    snprintf(b, sizeof b, "%s/transformer/diffusion_pytorch_model.safetensors.index.json",
             sharded);
    df_weights *one, *many;
    assert_int_equal(df_weights_open(a, &one), DF_OK);
    assert_int_equal(df_weights_open(b, &many), DF_OK); /* checks the index against the shards */
    assert_true(df_weights_shard_count(one) == 1);
    assert_true(df_weights_shard_count(many) > 1);
    assert_int_equal(df_weights_count(one), df_weights_count(many));
    for (int64_t i = 0; i < df_weights_count(one); i++) {
        df_tensor_info x, y;
        assert_int_equal(df_weights_at(one, i, &x), DF_OK);
        assert_int_equal(df_weights_at(many, i, &y), DF_OK);
        assert_string_equal(x.name, y.name);
        assert_int_equal(x.dtype, y.dtype);
        assert_int_equal(x.nbytes, y.nbytes);
        assert_memory_equal(x.data, y.data, x.nbytes);
        assert_int_equal(df_weights_release_pages(one, x.name), DF_OK);
        assert_int_equal(df_weights_release_pages(many, y.name), DF_OK);
    }
    /* no shard is over the size, except one holding a single larger tensor */
    for (int i = 0; i < df_weights_shard_count(many); i++) {
        const df_safetensors *st = df_weights_shard(many, i);
        struct stat sb;
        assert_int_equal(stat(df_safetensors_path(st), &sb), 0);
        assert_true(sb.st_size <= (16 << 20) + (1 << 16) || df_safetensors_count(st) == 1);
    }
    df_weights_free(one);
    df_weights_free(many);
}

int main(int argc, char **argv)
{
    if (argc < 3 || (argc > 3 && strcmp(argv[3], "peak") != 0)) {
        fprintf(stderr, "usage: test_quantize_stream DIFFUSE_BIN WORK_DIR [peak]\n");
        return 2;
    }
    diffuse_bin = argv[1];
    work = argv[2];
    const struct CMUnitTest with_peak[] = {
        cmocka_unit_test(test_peak_is_a_tensor_not_the_model),
        cmocka_unit_test(test_shards_hold_the_same_tensors),
    };
    const struct CMUnitTest without[] = {
        cmocka_unit_test(test_shards_hold_the_same_tensors),
    };
    if (argc > 3)
        return cmocka_run_group_tests(with_peak, setup, NULL);
    return cmocka_run_group_tests(without, setup, NULL);
}
