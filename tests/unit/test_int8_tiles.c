/*
 * int8 weights saved in the kernels' tiles (core/int8_tiles.h, docs/int8.md "The saved
 * layout and its version"), on the tiny FLUX.1 pipeline that `diffuse make-tiny` writes
 * (tests/int8.cmake makes it first; the folder is the first argument: DF_TEST_NEEDS_ARGS):
 * - a weight read in place from its tiles is the packed weight of its row-major values, and
 *   every kernel path gives the same bits from either;
 * - a folder saved in tiles32 (the default) gives quantize-on-load's latents and image bit
 *   for bit, as the row-major folder does, without and with model offload, and its weights
 *   are used in place (a counter only that path moves); a folder in tiles of another width
 *   loads repacked, says so, and gives the same bits;
 * - two tensor-parallel ranks (threads) read their slices of the tiles and give the
 *   row-major folder's latents bit for bit;
 * - a layout tag or version this build does not read is refused, naming config.json and
 *   the field.
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

#include <diffuse/diffuse.h>

#include "backend/cpu/gemm_int8.h"
#include "core/alloc.h"
#include "core/int8_tiles.h"

static const char *model_dir;

/* ---- the weight: tiles against row-major values ----------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void) /* [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng_state >> 40) & 0xffffff) / 8388608.0f - 1.0f;
}

static void check_tiles_against_rows(int64_t n, int64_t k, int64_t group, int64_t m)
{
    float *w = df_malloc((size_t)(n * k) * sizeof(float));
    float *x = df_malloc((size_t)(m * k) * sizeof(float));
    for (int64_t i = 0; i < n * k; i++)
        w[i] = uniform() * (i % 7 == 0 ? 3.0f : 0.5f);
    for (int64_t i = 0; i < m * k; i++)
        x[i] = uniform();
    int64_t groups = df_int8_weight_groups(k, group);
    int8_t *q = df_malloc((size_t)(n * k)), *tq = df_malloc((size_t)(n * k));
    float *sc = df_malloc((size_t)(n * groups) * sizeof(float));
    float *ts = df_malloc((size_t)(n * groups) * sizeof(float));
    assert_int_equal(df_int8_quantize(w, DF_DTYPE_F32, n, k, group, q, sc), DF_OK);
    for (int64_t j = 0; j < n; j++) {
        for (int64_t kk = 0; kk < k; kk++)
            tq[df_i8_tiles_q_at(k, DF_I8_TILE_NR, j, kk)] = q[j * k + kk];
        for (int64_t g = 0; g < groups; g++)
            ts[df_i8_tiles_scale_at(groups, DF_I8_TILE_NR, j, g)] = sc[j * groups + g];
    }
    int64_t g_int = group ? group : INT64_MAX / 2;
    df_i8_weight *plain, *tiles;
    assert_int_equal(df_i8_weight_from_plain(q, sc, n, k, g_int, &plain), DF_OK);
    int64_t before = df_i8_tiles_in_place();
    assert_int_equal(df_i8_weight_from_tiles(tq, ts, n, k, g_int, &tiles), DF_OK);
    assert_int_equal(df_i8_tiles_in_place(), before + 1);
    assert_ptr_equal(tiles->q, tq); /* in place: not a copy */
    size_t per = (size_t)(plain->n_blocks * plain->n_groups * DF_I8_NR);
    assert_memory_equal(plain->q, tiles->q, (size_t)(n * k));
    assert_memory_equal(plain->scale, tiles->scale, per * sizeof(float));
    assert_memory_equal(plain->corr, tiles->corr, per * sizeof(int32_t));

    void *scratch = df_aligned_alloc(df_i8_act_bytes(plain, m));
    float *a_out = df_malloc((size_t)(m * n) * sizeof(float));
    float *b_out = df_malloc((size_t)(m * n) * sizeof(float));
    for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
        if (!df_i8_path_available((df_i8_path)p))
            continue;
        df_i8_act a;
        df_i8_act_quantize(plain, x, DF_DTYPE_F32, m, k, scratch, &a);
        df_i8_epilogue e = {.out = a_out, .ldc = n};
        assert_int_equal(df_i8_gemm(&a, plain, &e, (df_i8_path)p), DF_OK);
        e.out = b_out;
        assert_int_equal(df_i8_gemm(&a, tiles, &e, (df_i8_path)p), DF_OK);
        assert_memory_equal(a_out, b_out, (size_t)(m * n) * sizeof(float));
    }
    /* a shape that is not whole tiles is refused (the writer keeps such weights as rows) */
    df_i8_weight *bad = (void *)1;
    assert_int_equal(df_i8_weight_from_tiles(tq, ts, n - 1, k, g_int, &bad), DF_E_ARG);
    assert_null(bad);
    df_i8_weight_free(plain);
    df_i8_weight_free(tiles);
    df_aligned_free(scratch);
    df_free(a_out);
    df_free(b_out);
    df_free(w);
    df_free(x);
    df_free(q);
    df_free(tq);
    df_free(sc);
    df_free(ts);
}

static void test_tiles_are_the_packed_weight(void **state)
{
    (void)state;
    check_tiles_against_rows(96, 256, 32, 7); /* groups of 32 */
    check_tiles_against_rows(64, 132, 0, 5);  /* the whole k (132 = 33 quads) */
}

/* ---- folders --------------------------------------------------------------------------- */

static char lines[8192]; /* notes logged during a load */

static void capture(int level, const char *line, void *user)
{
    (void)level;
    (void)user;
    size_t at = strlen(lines);
    snprintf(lines + at, sizeof lines - at, "%s\n", line);
}

static df_status generate(const char *dir, df_offload offload, int64_t group, df_gen_output *out)
{
    df_pipeline *p = NULL;
    df_status s = df_pipeline_load(
        dir,
        &(df_load_opts){
            .threads = 2, .offload = offload, .dtype = DF_DTYPE_I8, .int8_group = group},
        &p);
    if (s == DF_OK)
        s = df_pipeline_run(
            p,
            &(df_gen_params){
                .prompt = "a red fox", .height = 64, .width = 64, .steps = 2, .seed = 7},
            out);
    df_pipeline_free(p);
    return s;
}

static void assert_same(const df_gen_output *a, const df_gen_output *b)
{
    size_t bytes = (size_t)a->width * (size_t)a->height * 3;
    assert_int_equal(a->width, b->width);
    assert_memory_equal(a->images[0]->pixels, b->images[0]->pixels, bytes);
    assert_memory_equal(a->latents, b->latents,
                        (size_t)a->latents_shape[1] * (size_t)a->latents_shape[2] * 4);
}

static void saved_dir(char *buf, size_t cap, const char *layout)
{
    snprintf(buf, cap, "%s/int8-tiles-%s", DF_TEST_TMP, layout);
}

static void save(const char *layout)
{
    char out[4096];
    saved_dir(out, sizeof out, layout);
    assert_int_equal(df_quantize_model_layout(model_dir, out, 32, 0, layout), DF_OK);
}

static void test_saved_layouts_agree(void **state)
{
    (void)state;
    save("tiles32");
    save("rows");
    save("tiles16");
    char tiles[4200], rows[4200], other[4200];
    saved_dir(tiles, sizeof tiles, "tiles32");
    saved_dir(rows, sizeof rows, "rows");
    saved_dir(other, sizeof other, "tiles16");
    static df_gen_output on_load, from_rows, from_tiles, tiles_offload, from_other;
    assert_int_equal(generate(model_dir, DF_OFFLOAD_NONE, 32, &on_load), DF_OK);
    int64_t in_place = df_i8_tiles_in_place();
    assert_int_equal(generate(rows, DF_OFFLOAD_NONE, 0, &from_rows), DF_OK);
    assert_int_equal(df_i8_tiles_in_place(), in_place); /* rows: packed on first use */
    assert_int_equal(generate(tiles, DF_OFFLOAD_NONE, 0, &from_tiles), DF_OK);
    assert_true(df_i8_tiles_in_place() > in_place); /* tiles: used where they are mapped */
    in_place = df_i8_tiles_in_place();
    /* model offload releases each weight (its sums and pages) and binds it again */
    assert_int_equal(generate(tiles, DF_OFFLOAD_MODEL, 0, &tiles_offload), DF_OK);
    assert_true(df_i8_tiles_in_place() > in_place);
    lines[0] = 0;
    df_set_log_fn(capture, NULL);
    in_place = df_i8_tiles_in_place();
    df_status s = generate(other, DF_OFFLOAD_NONE, 0, &from_other);
    df_set_log_fn(NULL, NULL);
    assert_int_equal(s, DF_OK);
    assert_int_equal(df_i8_tiles_in_place(), in_place); /* tiles16: repacked to rows */
    assert_non_null(strstr(lines, "transformer: int8 weights saved in tiles16"));
    assert_non_null(strstr(lines, "repacked"));
    assert_same(&on_load, &from_rows);
    assert_same(&on_load, &from_tiles);
    assert_same(&on_load, &tiles_offload);
    assert_same(&on_load, &from_other);
    df_gen_output_free(&on_load);
    df_gen_output_free(&from_rows);
    df_gen_output_free(&from_tiles);
    df_gen_output_free(&tiles_offload);
    df_gen_output_free(&from_other);
    /* a layout this build does not write is refused */
    assert_int_equal(df_quantize_model_layout(model_dir, rows, 32, 0, "tiles33"), DF_E_ARG);
}

/* ---- tensor parallelism: each rank's slice of the tiles --------------------------------- */

typedef struct rank_job {
    df_comm *comm;
    const char *dir;
    df_status s;
    char msg[512];
    df_gen_output out;
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    df_pipeline *p = NULL;
    j->s = df_pipeline_load(
        j->dir, &(df_load_opts){.threads = 1, .comm = j->comm, .dtype = DF_DTYPE_I8}, &p);
    if (j->s == DF_OK)
        j->s = df_pipeline_run(
            p,
            &(df_gen_params){.prompt = df_comm_rank(j->comm) == 0 ? "a red fox" : NULL,
                             .height = 64,
                             .width = 64,
                             .steps = 2,
                             .seed = 7},
            &j->out);
    if (j->s != DF_OK)
        snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
    df_pipeline_free(p);
    return NULL;
}

static void run_two_ranks(const char *dir, rank_job jobs[2])
{
    df_comm *comms[2];
    assert_int_equal(df_comm_create_threads(2, comms), DF_OK);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (rank_job){.comm = comms[r], .dir = dir};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        df_comm_free(comms[r]);
        if (jobs[r].s != DF_OK)
            fail_msg("rank %d of 2 (%s): %s", r, dir, jobs[r].msg);
    }
}

static void test_tensor_parallel_slices_of_tiles(void **state)
{
    (void)state;
    char tiles[4200], rows[4200];
    saved_dir(tiles, sizeof tiles, "tiles32");
    saved_dir(rows, sizeof rows, "rows");
    static rank_job a[2], b[2];
    int64_t in_place = df_i8_tiles_in_place();
    run_two_ranks(rows, a);
    run_two_ranks(tiles, b);
    assert_true(df_i8_tiles_in_place() > in_place);
    assert_same(&a[0].out, &b[0].out);
    for (int r = 0; r < 2; r++) {
        df_gen_output_free(&a[r].out);
        df_gen_output_free(&b[r].out);
    }
}

/* ---- hostile tags ---------------------------------------------------------------------- */

/* Rewrites `path` with the first `from` replaced by `to`. */
static void replace_in_file(const char *path, const char *from, const char *to)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    char *at = strstr(text, from);
    assert_non_null(at);
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    f = fopen(path, "wb");
    assert_non_null(f);
    fputs(out, f);
    fclose(f);
}

static void expect_refused(const char *from, const char *to, const char *field)
{
    char dir[4200], cfg[4300];
    saved_dir(dir, sizeof dir, "hostile");
    assert_int_equal(df_quantize_model_layout(model_dir, dir, 32, 0, "tiles32"), DF_OK);
    snprintf(cfg, sizeof cfg, "%s/transformer/config.json", dir);
    replace_in_file(cfg, from, to);
    df_pipeline *p = (void *)1;
    assert_int_equal(df_pipeline_load(dir, &(df_load_opts){.dtype = DF_DTYPE_I8}, &p), DF_E_FORMAT);
    assert_null(p);
    const char *msg = df_error_message();
    if (!strstr(msg, "transformer/config.json") || !strstr(msg, field))
        fail_msg("the message names neither the file nor %s: %s", field, msg);
}

static void test_hostile_layout_is_refused(void **state)
{
    (void)state;
    expect_refused("\"layout\": \"tiles32\"", "\"layout\": \"tiles33\"",
                   "quantization_config.layout is 'tiles33'");
    expect_refused("\"layout\": \"tiles32\"", "\"layout\": 32", "quantization_config.layout");
    expect_refused("\"layout_version\": 1", "\"layout_version\": 2",
                   "quantization_config.layout_version");
    expect_refused("\"layout_version\": 1", "\"layout_version\": \"1\"",
                   "quantization_config.layout_version");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_int8_tiles TINY_FLUX_DIR\n");
        return 2;
    }
    model_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiles_are_the_packed_weight),
        cmocka_unit_test(test_saved_layouts_agree),
        cmocka_unit_test(test_tensor_parallel_slices_of_tiles),
        cmocka_unit_test(test_hostile_layout_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
