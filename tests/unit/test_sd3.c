/*
 * Tests for the SD3 transformer (src/models/sd3.c) and StableDiffusion3Pipeline
 * (src/pipelines/sd3.c) through the public API:
 * - the sd3-transformer golden case in f32 (its own tolerance, eager and defer-and-fuse) and
 *   in bf16 compute;
 * - skip layers: an empty list is the plain forward bit for bit, skipping a block changes
 *   the output, and skipping block 1 of 3 equals a 2-block model made of blocks 0 and 2
 *   (the independent meaning of "leave the block out");
 * - a batch of two rows equals each row run alone (CFG batches [uncond, cond]);
 * - compiled repeated blocks: one program per block variant, the plain forward's output;
 * - forward input errors and malformed model folders (config values, depth, tensors
 *   missing, unexpected or mis-shaped), and an out-of-memory sweep of the loader;
 * - a tiny SD3.5-architecture pipeline written by `diffuse make-tiny --arch sd3` generates
 *   images end to end (CFG with a negative prompt, several images, seeds, skip-layer
 *   guidance, a folder without T5), and the pipeline's parameter errors.
 *
 * Modified model folders are written under DF_TEST_TMP with the library's safetensors reader
 * and writer; references come from the golden case files.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "models/loader.h"

#define CASE_DIR  DF_GOLDEN_DIR "/sd3-transformer"
#define MODEL_DIR CASE_DIR "/model"
#define PIPE_DIR  DF_GOLDEN_DIR "/pipe-sd3/pipeline"

/* ---- files ------------------------------------------------------------------------------ */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    return buf;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_true(fputs(text, f) >= 0);
    assert_int_equal(fclose(f), 0);
}

/* dst = src with the first `from` replaced by `to` (dst may be src). */
static void replace(const char *src, char *dst, size_t cap, const char *from, const char *to)
{
    const char *at = strstr(src, from);
    if (!at)
        fail_msg("no '%s' in the text", from);
    char *tmp = malloc(cap);
    snprintf(tmp, cap, "%.*s%s%s", (int)(at - src), src, to, at + strlen(from));
    snprintf(dst, cap, "%s", tmp);
    free(tmp);
}

/* A fresh folder DF_TEST_TMP/sd3-<name> in buf. */
static const char *make_dir(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/sd3-%s", DF_TEST_TMP, name);
    mkdir(DF_TEST_TMP, 0755);
    if (mkdir(buf, 0755) != 0)
        assert_int_equal(errno, EEXIST);
    return buf;
}

/* The golden config.json with the first `from` replaced by `to` (from NULL: unchanged). */
static void write_config(const char *dir, const char *from, const char *to)
{
    char *cfg = read_text(MODEL_DIR "/config.json");
    char out[4096], path[1024];
    const char *at = from ? strstr(cfg, from) : NULL;
    if (from && !at)
        fail_msg("config.json has no '%s'", from);
    if (at)
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    else
        snprintf(out, sizeof out, "%s", cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, out);
    free(cfg);
}

/* The golden weights copied into dir: tensors whose name starts with `drop` are left out,
 * names starting with `from` are renamed to start with `to` instead, and `extra` (when not
 * NULL) is added as a vector of extra_n zeros. */
static void write_weights(const char *dir, const char *drop, const char *from, const char *to,
                          const char *extra, int64_t extra_n)
{
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(MODEL_DIR "/diffusion_pytorch_model.safetensors", &st),
                     DF_OK);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    for (int64_t i = 0; i < df_safetensors_count(st); i++) {
        df_tensor_info info;
        assert_int_equal(df_safetensors_at(st, i, &info), DF_OK);
        if (drop && strncmp(info.name, drop, strlen(drop)) == 0)
            continue;
        char name[256];
        if (from && strncmp(info.name, from, strlen(from)) == 0)
            snprintf(name, sizeof name, "%s%s", to, info.name + strlen(from));
        else
            snprintf(name, sizeof name, "%s", info.name);
        float *v = malloc((size_t)info.numel * sizeof *v);
        assert_int_equal(
            df_safetensors_read(st, info.name, DF_DTYPE_F32, v, (size_t)info.numel * sizeof *v),
            DF_OK);
        assert_int_equal(df_st_writer_add_f32(w, name, DF_DTYPE_F32, info.shape, info.ndim, v),
                         DF_OK);
        free(v);
    }
    if (extra) {
        float *z = calloc((size_t)extra_n, sizeof *z);
        assert_int_equal(df_st_writer_add_f32(w, extra, DF_DTYPE_F32, &extra_n, 1, z), DF_OK);
        free(z);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    df_safetensors_free(st);
}

/* ---- the golden case -------------------------------------------------------------------- */

typedef struct golden {
    df_safetensors *st;     /* case.safetensors */
    double max_abs, rel_l2; /* the case's tolerance for out.sample */
} golden;

static golden golden_load(void)
{
    golden g = {0};
    assert_int_equal(df_safetensors_open(CASE_DIR "/case.safetensors", &g.st), DF_OK);
    df_json *root;
    assert_int_equal(df_json_parse_file(CASE_DIR "/case.json", &root), DF_OK);
    const df_json *tol = df_json_get(df_json_get(root, "tolerance"), "sample");
    assert_int_equal(df_json_get_double(tol, "max_abs", &g.max_abs), DF_OK);
    assert_int_equal(df_json_get_double(tol, "rel_l2", &g.rel_l2), DF_OK);
    assert_true(g.max_abs > 0 && g.rel_l2 > 0);
    df_json_free(root);
    return g;
}

/* Tensor `name` of case.safetensors as f32 (malloc'd), its shape in info. */
static float *golden_f32(golden *g, const char *name, df_tensor_info *info)
{
    assert_int_equal(df_safetensors_find(g->st, name, info), DF_OK);
    float *v = malloc((size_t)info->numel * sizeof *v);
    assert_int_equal(
        df_safetensors_read(g->st, name, DF_DTYPE_F32, v, (size_t)info->numel * sizeof *v), DF_OK);
    return v;
}

static df_tensor *upload(df_ctx *ctx, golden *g, const char *name)
{
    df_tensor_info info;
    float *v = golden_f32(g, name, &info);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, info.shape, info.ndim, v);
    free(v);
    assert_non_null(t);
    return t;
}

static df_sd3_inputs golden_inputs(df_ctx *ctx, golden *g)
{
    return (df_sd3_inputs){
        .hidden_states = upload(ctx, g, "in.hidden_states"),
        .encoder_hidden_states = upload(ctx, g, "in.encoder_hidden_states"),
        .pooled_projections = upload(ctx, g, "in.pooled_projections"),
        .timestep = upload(ctx, g, "in.timestep"),
    };
}

/* Runs the forward and reads the result (malloc'd f32, *n values). */
static float *forward(df_ctx *ctx, df_sd3 *m, const df_sd3_inputs *in, int64_t *n)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *out = df_sd3_forward(ctx, m, in);
    if (!out) {
        df_sync(ctx);
        fail_msg("forward failed: %s", df_error_message());
    }
    *n = df_tensor_numel(out);
    float *v = malloc((size_t)*n * sizeof *v);
    if (df_tensor_read(ctx, out, DF_DTYPE_F32, v, (size_t)*n * sizeof *v) != DF_OK)
        fail_msg("read failed: %s", df_error_message());
    df_scope_end(ctx, mark, NULL);
    return v;
}

typedef struct errs {
    double max_abs, rel_l2;
} errs;

static errs compare(const float *got, const double *ref, int64_t n)
{
    double num = 0, den = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        mx = isnan(got[i]) ? INFINITY : fmax(mx, fabs(d));
    }
    return (errs){mx, sqrt(num / den)};
}

static double max_diff(const float *a, const float *b, int64_t n)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx;
}

/* The case run with the model in `dir`: errors against out.sample. */
static errs run_golden(const char *dir, df_dtype compute, df_eager_mode mode)
{
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(
        df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = compute, .mode = mode}, &ctx), DF_OK);
    df_sd3 *m = NULL;
    if (df_sd3_load(ctx, dir, &m) != DF_OK)
        fail_msg("load failed: %s", df_error_message());
    df_sd3_inputs in = golden_inputs(ctx, &g);
    int64_t n;
    float *got = forward(ctx, m, &in, &n);
    df_tensor_info info;
    assert_int_equal(df_safetensors_find(g.st, "out.sample", &info), DF_OK);
    assert_int_equal(info.numel, n);
    double *ref = malloc((size_t)n * sizeof *ref);
    assert_int_equal(
        df_safetensors_read(g.st, "out.sample", DF_DTYPE_F64, ref, (size_t)n * sizeof *ref), DF_OK);
    errs e = compare(got, ref, n);
    free(got);
    free(ref);
    df_sd3_free(m);
    df_ctx_free(ctx);
    df_safetensors_free(g.st);
    return e;
}

static void test_golden_f32_within_the_case_tolerance(void **state)
{
    (void)state;
    golden g = golden_load();
    df_safetensors_free(g.st);
    errs e = run_golden(MODEL_DIR, DF_DTYPE_F32, DF_DEFER_NEVER);
    errs f = run_golden(MODEL_DIR, DF_DTYPE_F32, DF_DEFER_AND_FUSE);
    printf("sd3-transformer f32: max-abs %.3g (limit %.3g), rel-L2 %.3g (limit %.3g); "
           "fuse %.3g / %.3g\n",
           e.max_abs, g.max_abs, e.rel_l2, g.rel_l2, f.max_abs, f.rel_l2);
    assert_true(e.max_abs <= g.max_abs && e.rel_l2 <= g.rel_l2);
    assert_true(f.max_abs <= g.max_abs && f.rel_l2 <= g.rel_l2);
}

static void test_golden_bf16_compute_within_2e_2(void **state)
{
    (void)state;
    errs e = run_golden(MODEL_DIR, DF_DTYPE_BF16, DF_DEFER_NEVER);
    printf("sd3-transformer bf16 compute: max-abs %.3g, rel-L2 %.3g (limit 2e-2)\n", e.max_abs,
           e.rel_l2);
    assert_true(e.rel_l2 <= 2e-2);
}

/* ---- skip layers and batches ------------------------------------------------------------ */

static void test_skip_layers(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_sd3 *m = NULL;
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &m), DF_OK);
    df_sd3_inputs in = golden_inputs(ctx, &g);
    int64_t n, k;
    float *plain = forward(ctx, m, &in, &n);

    static const int none[1] = {1};
    df_sd3_inputs s = in;
    s.skip_layers = none, s.n_skip_layers = 0; /* a list, but empty */
    float *y = forward(ctx, m, &s, &k);
    assert_int_equal(k, n);
    assert_memory_equal(y, plain, (size_t)n * sizeof *y);
    free(y);

    static const int lists[3][3] = {{1}, {2}, {0, 1, 2}};
    static const int counts[3] = {1, 1, 3};
    float *skip1 = NULL;
    for (int i = 0; i < 3; i++) {
        s.skip_layers = lists[i], s.n_skip_layers = counts[i];
        y = forward(ctx, m, &s, &k);
        double d = max_diff(y, plain, n);
        printf("skip %d block(s) from %d: max change %.3g\n", counts[i], lists[i][0], d);
        assert_true(d > 1e-2);
        for (int64_t j = 0; j < n; j++)
            assert_true(isfinite(y[j]));
        if (i == 0)
            skip1 = y;
        else
            free(y);
    }

    /* Skipping block 1 = the model made of blocks 0 and 2 only. */
    char dir[1024];
    make_dir("two-blocks", dir, sizeof dir);
    write_config(dir, "\"num_layers\": 3", "\"num_layers\": 2");
    write_weights(dir, "transformer_blocks.1.", "transformer_blocks.2.", "transformer_blocks.1.",
                  NULL, 0);
    df_sd3 *two = NULL;
    if (df_sd3_load(ctx, dir, &two) != DF_OK)
        fail_msg("2-block model: %s", df_error_message());
    y = forward(ctx, two, &in, &k);
    assert_int_equal(k, n);
    printf("skip block 1 vs the 2-block model: max diff %.3g\n", max_diff(y, skip1, n));
    assert_true(max_diff(y, skip1, n) <= 1e-6);
    free(y);
    free(skip1);
    free(plain);
    df_sd3_free(two);
    df_sd3_free(m);
    df_ctx_free(ctx);
    df_safetensors_free(g.st);
}

/* Compiled repeated blocks: one program per block variant (here dual, plain and
 * context_pre_only), the same output as the plain forward, skip layers included, and no new
 * program on a second call. */
static void test_compiled_repeated_blocks(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_sd3 *m = NULL, *c = NULL;
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &m), DF_OK);
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &c), DF_OK);
    assert_int_equal(df_sd3_compiled_programs(c), 0);
    assert_int_equal(df_sd3_compile_repeated_blocks(c, &(df_compile_opts){.fullgraph = true}),
                     DF_OK);
    df_sd3_inputs in = golden_inputs(ctx, &g), skip = in;
    static const int one[1] = {1};
    skip.skip_layers = one, skip.n_skip_layers = 1;
    int64_t n, k;
    float *want = forward(ctx, m, &in, &n), *want_skip = forward(ctx, m, &skip, &n);
    for (int call = 0; call < 2; call++) {
        float *got = forward(ctx, c, &in, &k), *got_skip = forward(ctx, c, &skip, &k);
        assert_int_equal(k, n);
        printf("compiled blocks, call %d: max diff %.3g, with skip layer 1 %.3g, %d programs\n",
               call, max_diff(got, want, n), max_diff(got_skip, want_skip, n),
               df_sd3_compiled_programs(c));
        assert_true(max_diff(got, want, n) <= 1e-5);
        assert_true(max_diff(got_skip, want_skip, n) <= 1e-5);
        assert_int_equal(df_sd3_compiled_programs(c), 3);
        free(got);
        free(got_skip);
    }
    free(want);
    free(want_skip);
    df_sd3_free(c);
    df_sd3_free(m);
    df_ctx_free(ctx);
    df_safetensors_free(g.st);
}

/* Row 0 = the golden inputs, row 1 = other inputs: each row must equal its own B = 1 run;
 * a [1] timestep serves both rows. */
static void test_batch_of_two_rows_matches_single_rows(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_sd3 *m = NULL;
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &m), DF_OK);

    static const char *const names[3] = {"in.hidden_states", "in.encoder_hidden_states",
                                         "in.pooled_projections"};
    df_tensor *row1[3], *both[3];
    for (int i = 0; i < 3; i++) {
        df_tensor_info info;
        float *v = golden_f32(&g, names[i], &info);
        int64_t n = info.numel;
        float *w = malloc((size_t)n * sizeof *w), *b = malloc(2 * (size_t)n * sizeof *b);
        for (int64_t k = 0; k < n; k++)
            w[k] = -0.75f * v[n - 1 - k] + 0.1f;
        memcpy(b, v, (size_t)n * sizeof *b);
        memcpy(b + n, w, (size_t)n * sizeof *b);
        row1[i] = df_tensor_from_host(ctx, DF_DTYPE_F32, info.shape, info.ndim, w);
        info.shape[0] = 2;
        both[i] = df_tensor_from_host(ctx, DF_DTYPE_F32, info.shape, info.ndim, b);
        free(v);
        free(w);
        free(b);
    }
    df_sd3_inputs in0 = golden_inputs(ctx, &g), in1 = in0, in2 = in0;
    in1.hidden_states = row1[0], in1.encoder_hidden_states = row1[1];
    in1.pooled_projections = row1[2];
    in2.hidden_states = both[0], in2.encoder_hidden_states = both[1];
    in2.pooled_projections = both[2];
    int64_t n0, n1, n2;
    float *y0 = forward(ctx, m, &in0, &n0);
    float *y1 = forward(ctx, m, &in1, &n1);
    float *y2 = forward(ctx, m, &in2, &n2);
    assert_int_equal(n2, 2 * n0);
    double d0 = max_diff(y2, y0, n0), d1 = max_diff(y2 + n0, y1, n0);
    printf("batch 2: row 0 max diff %.3g, row 1 max diff %.3g, rows differ by %.3g\n", d0, d1,
           max_diff(y0, y1, n0));
    assert_true(d0 <= 1e-5 && d1 <= 1e-5);
    assert_true(max_diff(y0, y1, n0) > 1e-2);
    free(y0);
    free(y1);
    free(y2);
    df_sd3_free(m);
    df_ctx_free(ctx);
    df_safetensors_free(g.st);
}

/* ---- errors ----------------------------------------------------------------------------- */

static void expect_forward_error(df_ctx *ctx, df_sd3 *m, const df_sd3_inputs *in, df_status want,
                                 const char *needle)
{
    assert_null(df_sd3_forward(ctx, m, in));
    df_status s = df_sync(ctx);
    if (s != want || !strstr(df_error_message(), needle))
        fail_msg("expected %s naming '%s', got %s: %s", df_status_name(want), needle,
                 df_status_name(s), df_error_message());
    df_ctx_reset_error(ctx);
}

static void test_bad_inputs_fail_the_context_naming_the_input(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_sd3 *m = NULL;
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &m), DF_OK);
    df_sd3_inputs in = golden_inputs(ctx, &g), bad;

    bad = in; /* 15 channels */
    bad.hidden_states = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 15, 8, 8));
    expect_forward_error(ctx, m, &bad, DF_E_SHAPE, "hidden_states");
    bad = in; /* an odd side with patch size 2 */
    bad.hidden_states = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 16, 8, 7));
    expect_forward_error(ctx, m, &bad, DF_E_SHAPE, "patch_size");
    bad = in; /* 34 / 2 = 17 patches > pos_embed_max_size 16 */
    bad.hidden_states = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 16, 34, 8));
    expect_forward_error(ctx, m, &bad, DF_E_SHAPE, "pos_embed_max_size");
    bad = in;
    bad.pooled_projections = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(2, 24));
    expect_forward_error(ctx, m, &bad, DF_E_SHAPE, "pooled_projections");
    bad = in;
    bad.encoder_hidden_states = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(1, 6, 41));
    expect_forward_error(ctx, m, &bad, DF_E_SHAPE, "encoder_hidden_states");
    bad = in;
    bad.timestep = NULL;
    expect_forward_error(ctx, m, &bad, DF_E_ARG, "timestep");
    static const int three[1] = {3};
    bad = in;
    bad.skip_layers = three, bad.n_skip_layers = 1;
    expect_forward_error(ctx, m, &bad, DF_E_ARG, "skip layer 3");

    /* The context works again after each error. */
    int64_t n;
    free(forward(ctx, m, &in, &n));
    df_sd3_free(m);
    df_ctx_free(ctx);
    df_safetensors_free(g.st);
}

/* Loads dir and expects failure `want` with a message containing `needle`; for DF_OK, a load
 * with the warning line naming `needle` (tensors the config does not call for). */
static void expect_load_error(const char *dir, df_status want, const char *needle)
{
    if (want == DF_OK) {
        df_ctx *ctx;
        assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
        df_sd3 *m = NULL;
        if (df_sd3_load(ctx, dir, &m) != DF_OK || !strstr(df_ws_last_warning(), needle))
            fail_msg("%s: expected a load warning naming '%s', got '%s' / '%s'", dir, needle,
                     df_error_message(), df_ws_last_warning());
        df_sd3_free(m);
        df_ctx_free(ctx);
        return;
    }
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_sd3 *m = (df_sd3 *)1;
    df_status s = df_sd3_load(ctx, dir, &m);
    if (s != want || !strstr(df_error_message(), needle))
        fail_msg("%s: expected %s naming '%s', got %s: %s", dir, df_status_name(want), needle,
                 df_status_name(s), df_error_message());
    assert_null(m);
    df_ctx_free(ctx);
}

static void test_bad_configs_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *from, *to;
        df_status want;
        const char *needle;
    } cases[] = {
        {"\"num_layers\": 3", "\"num_layers\": 4", DF_E_FORMAT, "num_layers"},
        {"\"num_layers\": 3", "\"num_layers\": 2", DF_E_FORMAT, "more blocks"},
        {"\"num_layers\": 3", "\"num_layers\": -1", DF_E_FORMAT, "num_layers"},
        {"\"patch_size\": 2", "\"patch_size\": \"2\"", DF_E_FORMAT, "patch_size"},
        {"\"caption_projection_dim\": 32", "\"caption_projection_dim\": 40", DF_E_FORMAT,
         "caption_projection_dim"},
        {"\"qk_norm\": \"rms_norm\"", "\"qk_norm\": \"layer_norm\"", DF_E_UNSUPPORTED, "qk_norm"},
        {"\"qk_norm\": \"rms_norm\"", "\"qk_norm\": null", DF_OK, "norm_"}, /* a warning */
        {"\"pos_embed_max_size\": 16", "\"pos_embed_max_size\": null", DF_E_UNSUPPORTED,
         "pos_embed_max_size"},
        {"\"pos_embed_max_size\": 16", "\"pos_embed_max_size\": 12", DF_E_FORMAT,
         "pos_embed.pos_embed"},
        {"\"dual_attention_layers\": [\n    0\n  ]", "\"dual_attention_layers\": [5]", DF_E_FORMAT,
         "dual_attention_layers"},
        {"\"dual_attention_layers\": [\n    0\n  ]", "\"dual_attention_layers\": []", DF_E_FORMAT,
         "transformer_blocks.0.norm1.linear.weight"},
        {"\"dual_attention_layers\": [\n    0\n  ]", "\"dual_attention_layers\": [1]", DF_E_FORMAT,
         "transformer_blocks.0.norm1.linear.weight"},
        {"\"joint_attention_dim\": 40", "\"joint_attention_dim\": 41", DF_E_FORMAT,
         "context_embedder.weight"},
        {"\"_class_name\": \"SD3Transformer2DModel\"",
         "\"_class_name\": \"FluxTransformer2DModel\"", DF_E_UNSUPPORTED, "_class_name"},
    };
    char dir[1024];
    make_dir("bad-config", dir, sizeof dir);
    write_weights(dir, NULL, NULL, NULL, NULL, 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(dir, cases[i].from, cases[i].to);
        expect_load_error(dir, cases[i].want, cases[i].needle);
    }
    /* The unchanged copy loads. */
    write_config(dir, NULL, NULL);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_sd3 *m = NULL;
    assert_int_equal(df_sd3_load(ctx, dir, &m), DF_OK);
    assert_int_equal(df_sd3_config(m)->n_dual_attention_layers, 1);
    assert_int_equal(df_sd3_config(m)->qk_norm, DF_SD3_QK_NORM_RMS);
    assert_int_equal(df_sd3_config(m)->out_channels, 16);
    df_sd3_free(m);
    df_ctx_free(ctx);
}

static void test_bad_weights_are_named(void **state)
{
    (void)state;
    char dir[1024];
    make_dir("bad-weights", dir, sizeof dir);
    write_config(dir, NULL, NULL);
    write_weights(dir, "transformer_blocks.1.attn.to_add_out.weight", NULL, NULL, NULL, 0);
    expect_load_error(dir, DF_E_FORMAT, "transformer_blocks.1.attn.to_add_out.weight");
    write_weights(dir, NULL, NULL, NULL, "transformer_blocks.2.attn.to_add_out.weight", 32);
    expect_load_error(dir, DF_OK, "transformer_blocks.2.attn.to_add_out.weight"); /* warned */
    write_weights(dir, "proj_out.weight", NULL, NULL, "proj_out.weight", 64);
    expect_load_error(dir, DF_E_FORMAT, "proj_out.weight");
    write_weights(dir, "pos_embed.pos_embed", NULL, NULL, NULL, 0);
    expect_load_error(dir, DF_E_FORMAT, "pos_embed.pos_embed");
}

static void test_loader_out_of_memory_sweep(void **state)
{
    (void)state;
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    /* One load first, so that what the context keeps (its tensor table) exists. */
    df_sd3 *warm = NULL;
    assert_int_equal(df_sd3_load(ctx, MODEL_DIR, &warm), DF_OK);
    df_sd3_free(warm);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        df_sd3 *m = NULL;
        df_alloc_fail_at(nth);
        df_status s = df_sd3_load(ctx, MODEL_DIR, &m);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            df_sd3_free(m);
            break;
        }
        failures++;
        if (s != DF_E_OOM)
            fail_msg("allocation %lld: %s instead of DF_E_OOM: %s", (long long)nth,
                     df_status_name(s), df_error_message());
        assert_null(m);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(failures > 3);
    assert_int_equal(df_alloc_live(), live);
    df_ctx_free(ctx);
}

/* ---- the pipeline ----------------------------------------------------------------------- */

#ifdef DF_DIFFUSE_BIN
/* DF_TEST_TMP/sd3-tiny written by `diffuse make-tiny --arch sd3` (once per run). */
static const char *tiny_pipeline(void)
{
    static char dir[1024];
    if (!dir[0]) {
        mkdir(DF_TEST_TMP, 0755);
        snprintf(dir, sizeof dir, "%s/sd3-tiny", DF_TEST_TMP);
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "'%s' make-tiny --arch sd3 '%s' > /dev/null", DF_DIFFUSE_BIN,
                 dir);
        assert_int_equal(system(cmd), 0);
    }
    return dir;
}

static df_gen_output generate(df_pipeline *p, const df_gen_params *g)
{
    df_gen_output out;
    if (df_pipeline_run(p, g, &out) != DF_OK)
        fail_msg("generate: %s", df_error_message());
    return out;
}

static double image_diff(const df_gen_output *a, const df_gen_output *b)
{
    assert_int_equal(a->count, b->count);
    return max_diff(a->image_f32, b->image_f32, (int64_t)a->count * a->width * a->height * 3);
}

static void test_tiny_pipeline_generates_end_to_end(void **state)
{
    (void)state;
    const char *dir = tiny_pipeline();
    df_pipeline *p;
    if (df_pipeline_load(dir, &(df_load_opts){.threads = 2}, &p) != DF_OK)
        fail_msg("load %s: %s", dir, df_error_message());
    assert_string_equal(df_pipeline_class(p), "StableDiffusion3Pipeline");
    int steps, seq, size;
    float guidance;
    df_pipeline_defaults(p, &steps, &guidance, &seq, &size);
    assert_int_equal(steps, 28);
    assert_true(guidance == 7.0f);
    assert_int_equal(seq, 256);
    assert_int_equal(size, 256); /* sample_size 32 x 8 */

    df_gen_params g = {.prompt = "a red fox in the snow",
                       .negative_prompt = "blurry",
                       .height = 64,
                       .width = 48,
                       .steps = 3,
                       .guidance = 4.5f,
                       .guidance_set = true,
                       .seed = 7,
                       .max_sequence_length = 32};
    df_gen_output a = generate(p, &g);
    assert_int_equal(a.count, 1);
    assert_int_equal(a.width, 48);
    assert_int_equal(a.height, 64);
    assert_int_equal(a.latents_ndim, 4);
    assert_int_equal(a.latents_shape[1], 16);
    assert_int_equal(a.latents_shape[2], 8);
    assert_int_equal(a.latents_shape[3], 6);
    double lo = 1, hi = 0;
    for (int64_t i = 0; i < 64 * 48 * 3; i++) {
        assert_true(a.image_f32[i] >= 0 && a.image_f32[i] <= 1);
        lo = fmin(lo, a.image_f32[i]), hi = fmax(hi, a.image_f32[i]);
    }
    assert_true(hi - lo > 0.1); /* not a flat image */
    assert_non_null(a.images[0]);

    df_gen_output same = generate(p, &g);
    assert_memory_equal(same.image_f32, a.image_f32, 64 * 48 * 3 * sizeof(float));
    df_gen_params h = g;
    h.seed = 8;
    df_gen_output other_seed = generate(p, &h);
    h = g;
    h.negative_prompt = NULL; /* "" */
    df_gen_output no_negative = generate(p, &h);
    h = g;
    h.guidance = 1.0f; /* no CFG: one forward per step */
    df_gen_output no_cfg = generate(p, &h);
    static const int layers[1] = {1};
    h = g;
    h.slg_layers = layers, h.n_slg_layers = 1, h.slg_start = 0.2, h.slg_stop = 0.9;
    df_gen_output slg = generate(p, &h);
    h.slg_start = 0.5, h.slg_stop = 0.6; /* no step i with 1.5 < i < 1.8 */
    df_gen_output slg_never = generate(p, &h);
    h = g;
    h.clip_skip = 1;
    df_gen_output skip = generate(p, &h);
    printf("tiny sd3: seed %.3g, negative %.3g, no cfg %.3g, slg %.3g, slg never %.3g, "
           "clip_skip %.3g\n",
           image_diff(&a, &other_seed), image_diff(&a, &no_negative), image_diff(&a, &no_cfg),
           image_diff(&a, &slg), image_diff(&a, &slg_never), image_diff(&a, &skip));
    assert_true(image_diff(&a, &other_seed) > 1e-2);
    assert_true(image_diff(&a, &no_negative) > 1e-4);
    assert_true(image_diff(&a, &no_cfg) > 1e-3);
    assert_true(image_diff(&a, &slg) > 1e-4);
    assert_true(image_diff(&a, &slg_never) == 0);
    assert_true(image_diff(&a, &skip) > 1e-4);

    h = g; /* two prompts x two images: four images, rows of one prompt differ by noise only */
    const char *prompts[2] = {"a red fox in the snow", "a lighthouse"};
    h.prompt = NULL, h.prompts = prompts, h.n_prompts = 2, h.num_images = 2;
    df_gen_output four = generate(p, &h);
    assert_int_equal(four.count, 4);
    assert_int_equal(four.latents_shape[0], 4);
    /* the first image draws the same noise as the single run (its rows come first) */
    assert_true(max_diff(four.image_f32, a.image_f32, 64 * 48 * 3) <= 1e-5);

    df_gen_output outs[] = {a, same, other_seed, no_negative, no_cfg, slg, slg_never, skip, four};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++)
        df_gen_output_free(&outs[i]);
    df_pipeline_free(p);
}

/* A folder without T5 (text_encoder_3 / tokenizer_3 null) runs with zeros for it, as the
 * full folder does with no_text_encoder_3. */
static void test_tiny_pipeline_without_t5(void **state)
{
    (void)state;
    const char *src = tiny_pipeline();
    char dir[1024], path[2048], target[2048];
    make_dir("tiny-no-t5", dir, sizeof dir);
    if (strlen(src) > 900 || strlen(dir) > 900)
        fail_msg("test folders too deep");
    static const char *const parts[] = {"scheduler", "text_encoder", "text_encoder_2",
                                        "tokenizer", "tokenizer_2",  "transformer",
                                        "vae"};
    /* Component folders of its own whose files link to the full pipeline's (a folder that
     * is itself a link out of the pipeline folder is refused). */
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char from[1200];
        snprintf(from, sizeof from, "%s/%s", src, parts[i]);
        snprintf(path, sizeof path, "%s/%s", dir, parts[i]);
        unlink(path); /* a folder link left by an older run of this test */
        mkdir(path, 0755);
        DIR *d = opendir(from);
        assert_non_null(d);
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s/%s", dir, parts[i], e->d_name);
            snprintf(target, sizeof target, "%s/%s", from, e->d_name);
            unlink(path);
            assert_int_equal(symlink(target, path), 0);
        }
        closedir(d);
    }
    snprintf(path, sizeof path, "%s/model_index.json", src);
    char *idx = read_text(path), out[4096];
    replace(idx, out, sizeof out, "[\"transformers\", \"T5EncoderModel\"]", "[null, null]");
    replace(out, out, sizeof out, "[\"transformers\", \"T5Tokenizer\"]", "[null, null]");
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    write_text(path, out);
    free(idx);

    df_pipeline *p, *full, *none;
    if (df_pipeline_load(dir, &(df_load_opts){.threads = 2}, &p) != DF_OK)
        fail_msg("load %s: %s", dir, df_error_message());
    assert_int_equal(df_pipeline_load(src, &(df_load_opts){.threads = 2}, &full), DF_OK);
    assert_int_equal(
        df_pipeline_load(src, &(df_load_opts){.threads = 2, .no_text_encoder_3 = true}, &none),
        DF_OK);
    assert_true(df_pipeline_t5_off(p) && df_pipeline_t5_off(none));
    assert_false(df_pipeline_t5_off(full));
    df_gen_params g = {.prompt = "a red fox", .height = 32, .width = 32, .steps = 2, .seed = 3};
    df_gen_output a = generate(p, &g), b = generate(full, &g), c = generate(none, &g);
    assert_true(max_diff(a.image_f32, c.image_f32, 32 * 32 * 3) == 0);
    double lo = 1, hi = 0;
    for (int64_t i = 0; i < 32 * 32 * 3; i++)
        lo = fmin(lo, a.image_f32[i]), hi = fmax(hi, a.image_f32[i]);
    printf("tiny sd3 without T5: range %.3g..%.3g, differs from with T5 by %.3g\n", lo, hi,
           image_diff(&a, &b));
    assert_true(hi - lo > 0.1 && lo >= 0 && hi <= 1);
    assert_true(image_diff(&a, &b) > 1e-4);
    df_gen_output_free(&a);
    df_gen_output_free(&b);
    df_gen_output_free(&c);
    df_pipeline_free(p);
    df_pipeline_free(full);
    df_pipeline_free(none);
}
#endif

/* Parameter errors name the parameter; the pipe-sd3 folder has no text encoders. */
static void test_pipeline_parameter_errors(void **state)
{
    (void)state;
    df_pipeline *p;
    if (df_pipeline_load(PIPE_DIR, &(df_load_opts){.threads = 1}, &p) != DF_OK)
        fail_msg("load: %s", df_error_message());
    static float embeds[1 * 4 * 40], pooled[24];
    df_gen_params base = {.prompt_embeds = embeds,
                          .prompt_embeds_len = 4,
                          .pooled_prompt_embeds = pooled,
                          .negative_prompt_embeds = embeds,
                          .negative_pooled_prompt_embeds = pooled,
                          .height = 64,
                          .width = 64,
                          .steps = 1};
    static const int layer9[1] = {9};
    struct {
        df_gen_params g;
        df_status want;
        const char *needle;
    } cases[] = {
        {{.prompt = "a fox", .height = 64, .width = 64, .steps = 1}, DF_E_ARG, "text encoders"},
        {base, DF_OK, ""},
        {base, DF_E_ARG, "multiples of 16"},
        {base, DF_E_ARG, "steps"},
        {base, DF_E_ARG, "negative prompt embeddings"},
        {base, DF_E_ARG, "skip-layer guidance layer 9"},
        {base, DF_E_ARG, "clip_skip"},
    };
    cases[2].g.width = 40;
    cases[3].g.steps = 1001;
    cases[4].g.negative_prompt_embeds = NULL;
    cases[4].g.negative_pooled_prompt_embeds = NULL;
    cases[5].g.slg_layers = layer9, cases[5].g.n_slg_layers = 1;
    cases[6].g.clip_skip = -1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        df_gen_output out;
        df_status s = df_pipeline_run(p, &cases[i].g, &out);
        if (s != cases[i].want || (s != DF_OK && !strstr(df_error_message(), cases[i].needle)))
            fail_msg("case %zu: expected %s naming '%s', got %s: %s", i,
                     df_status_name(cases[i].want), cases[i].needle, df_status_name(s),
                     df_error_message());
        if (s == DF_OK) {
            assert_int_equal(out.count, 1);
            assert_int_equal(out.latents_ndim, 4);
        }
        df_gen_output_free(&out);
    }
    df_pipeline_free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_f32_within_the_case_tolerance),
        cmocka_unit_test(test_golden_bf16_compute_within_2e_2),
        cmocka_unit_test(test_skip_layers),
        cmocka_unit_test(test_batch_of_two_rows_matches_single_rows),
        cmocka_unit_test(test_compiled_repeated_blocks),
        cmocka_unit_test(test_bad_inputs_fail_the_context_naming_the_input),
        cmocka_unit_test(test_bad_configs_are_refused),
        cmocka_unit_test(test_bad_weights_are_named),
        cmocka_unit_test(test_loader_out_of_memory_sweep),
        cmocka_unit_test(test_pipeline_parameter_errors),
#ifdef DF_DIFFUSE_BIN
        cmocka_unit_test(test_tiny_pipeline_generates_end_to_end),
        cmocka_unit_test(test_tiny_pipeline_without_t5),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
