/*
 * Tests for the Mistral text encoder (src/models/mistral.c over src/models/decoder_lm.c):
 * the te-mistral golden case through the library API (FLUX.2-dev's stacking of three hidden
 * states); a tiny random Mistral3ForConditionalGeneration (nested text_config, GQA,
 * head_dim not hidden_size / heads) in both of transformers' checkpoint layouts, with a
 * vision tower, a projector and an lm_head that must be skipped unread, against the float64
 * reference of decoder_lm_ref.h with left padding; bf16 weights; tensor parallelism on 2
 * in-process ranks against 1 with the bytes each rank reads; and config errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/alloc.h"
#include "unit/decoder_lm_ref.h"
#include "unit/golden_tensors.h"

#define TMP DF_TEST_TMP "/mistral"

enum { B = 2, S = 9 };

static const int64_t ids[B * S] = {11,      11, 11, 1,  17, 5,  44, 9, 30,
                                   /* */ 1, 8,  21, 33, 2,  49, 12, 6, 40};
static const int64_t left_pad[B * S] = {0, 0, 0, 1, 1, 1, 1, 1, 1, /* */ 1, 1, 1, 1, 1, 1, 1, 1, 1};

static tiny_lm tiny_config(void)
{
    return (tiny_lm){.d = 32,
                     .f = 40,
                     .layers = 3,
                     .heads = 4,
                     .kv = 2,
                     .dh = 10,
                     .vocab = 50,
                     .eps = 1e-5,
                     .theta = 1e9};
}

typedef enum layout { MISTRAL3_NEW, MISTRAL3_OLD } layout;

/* Bytes of the vision tower, projector and lm_head written beside the language model. */
static int64_t write_extras(df_st_writer *w, const tiny_lm *m, df_dtype dt, layout lay)
{
    const char *vt = lay == MISTRAL3_NEW ? "model.vision_tower." : "vision_tower.";
    const char *mp =
        lay == MISTRAL3_NEW ? "model.multi_modal_projector." : "multi_modal_projector.";
    const char *head = lay == MISTRAL3_NEW ? "lm_head.weight" : "language_model.lm_head.weight";
    char name[256];
    int64_t n = 0, es = df_dtype_size(dt);
    snprintf(name, sizeof name, "%stransformer.layers.0.attention.q_proj.weight", vt);
    tiny_add(w, dt, m->embed, 16, 16, "%s", name, -1);
    snprintf(name, sizeof name, "%spatch_conv.weight", vt);
    tiny_add(w, dt, m->embed, 16, 12, "%s", name, -1);
    snprintf(name, sizeof name, "%slinear_1.weight", mp);
    tiny_add(w, dt, m->embed, m->d, 16, "%s", name, -1);
    snprintf(name, sizeof name, "%snorm.weight", mp);
    tiny_add(w, dt, m->embed, 16, 0, "%s", name, -1);
    tiny_add(w, dt, m->embed, m->vocab, m->d, "%s", head, -1);
    n = (16 * 16 + 16 * 12 + m->d * 16 + 16 + m->vocab * m->d) * es;
    return n;
}

/* A Mistral3ForConditionalGeneration folder in TMP/name; *extra_bytes: the skipped ones. */
static const char *write_mistral3(const tiny_lm *m, df_dtype dt, layout lay, const char *name,
                                  char *buf, size_t cap, int64_t *extra_bytes)
{
    mkdir(DF_TEST_TMP, 0755);
    mkdir(TMP, 0755);
    snprintf(buf, cap, "%s/%s", TMP, name);
    char keys[1024], cfg[2048], path[1100];
    tiny_config_keys(m, keys, sizeof keys);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"Mistral3ForConditionalGeneration\"], "
             "\"model_type\": \"mistral3\", \"image_token_index\": 10, "
             "\"text_config\": {\"model_type\": \"mistral\", %s, \"sliding_window\": null}, "
             "\"vision_config\": {\"model_type\": \"pixtral\", \"hidden_size\": 16, "
             "\"num_hidden_layers\": 1, \"head_dim\": 8, \"rope_theta\": 10000.0}}",
             keys);
    tiny_write_text(buf, "config.json", cfg);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    tiny_add_lm(w, m, dt, lay == MISTRAL3_NEW ? "model.language_model." : "language_model.model.");
    *extra_bytes = write_extras(w, m, dt, lay);
    snprintf(path, sizeof path, "%s/model.safetensors", buf);
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    return buf;
}

/* hidden states 1, 2 and 3 (after the final norm) of the reference, stacked per token. */
static double *ref_stacked(const tiny_lm *m, const int64_t *mask)
{
    int64_t n = B * S * m->d, L = m->layers;
    double *hs = malloc((size_t)((L + 1) * n) * sizeof *hs);
    ref_forward(m, ids, mask, B, S, hs);
    double *st = malloc((size_t)(3 * n) * sizeof *st);
    for (int64_t t = 0; t < B * S; t++)
        for (int i = 0; i < 3; i++)
            memcpy(st + (t * 3 + i) * m->d, hs + (i + 1) * n + t * m->d, (size_t)m->d * sizeof *st);
    free(hs);
    return st;
}

static void check_layout(layout lay, df_dtype dt, const char *name)
{
    tiny_lm m = tiny_config();
    tiny_init(&m, 11 + (uint64_t)lay, dt);
    char dir[512];
    int64_t extra;
    write_mistral3(&m, dt, lay, name, dir, sizeof dir, &extra);
    int layers[3] = {1, 2, 3};
    lm_job job[1];
    lm_run_ranks(1,
                 &(lm_job){.load = df_mistral_load,
                           .dir = dir,
                           .ids = ids,
                           .mask = left_pad,
                           .B = B,
                           .S = S,
                           .layers = layers,
                           .n_layers = 3},
                 job);
    if (job[0].s != DF_OK)
        fail_msg("%s", job[0].msg);
    double *want = ref_stacked(&m, left_pad);
    assert_int_equal(job[0].n, 3 * B * S * m.d);
    double e = ref_max_err(job[0].out, want, job[0].n);
    printf("%s: max error %.3g against the float64 reference\n", name, e);
    assert_true(e <= 2e-5);
    int64_t split, rep, r0;
    tiny_tp_bytes(&m, df_dtype_size(dt), &split, &rep, &r0);
    printf("%s: read %lld weight bytes, skipped %lld\n", name, (long long)job[0].bytes_read,
           (long long)extra);
    assert_int_equal(job[0].bytes_read, split + rep); /* nothing of the vision tower */
    free(job[0].out);
    free(want);
    tiny_free(&m);
}

static void test_mistral3_layout_of_new_transformers(void **state)
{
    (void)state;
    check_layout(MISTRAL3_NEW, DF_DTYPE_F32, "new");
}

static void test_mistral3_layout_of_old_transformers_bf16(void **state)
{
    (void)state;
    check_layout(MISTRAL3_OLD, DF_DTYPE_BF16, "old-bf16");
}

static void test_skipped_tensor_names(void **state)
{
    (void)state;
    assert_true(df_mistral_skips_tensor("model.vision_tower.transformer.layers.0.feed_forward."
                                        "gate_proj.weight"));
    assert_true(df_mistral_skips_tensor("multi_modal_projector.linear_2.weight"));
    assert_true(df_mistral_skips_tensor("lm_head.weight"));
    assert_true(df_mistral_skips_tensor("language_model.lm_head.weight"));
    assert_false(df_mistral_skips_tensor("model.language_model.layers.0.mlp.up_proj.weight"));
    assert_false(df_mistral_skips_tensor("language_model.model.norm.weight"));
}

static void test_two_ranks_match_one_and_read_their_share(void **state)
{
    (void)state;
    tiny_lm m = tiny_config();
    tiny_init(&m, 21, DF_DTYPE_BF16);
    char dir[512];
    int64_t extra;
    write_mistral3(&m, DF_DTYPE_BF16, MISTRAL3_NEW, "tp", dir, sizeof dir, &extra);
    int layers[3] = {1, 2, 3};
    lm_job proto = {.load = df_mistral_load,
                    .dir = dir,
                    .ids = ids,
                    .mask = left_pad,
                    .B = B,
                    .S = S,
                    .layers = layers,
                    .n_layers = 3};
    lm_job one[1], two[2];
    lm_run_ranks(1, &proto, one);
    lm_run_ranks(2, &proto, two);
    assert_int_equal(one[0].s, DF_OK);
    int64_t split, rep, r0;
    tiny_tp_bytes(&m, 2, &split, &rep, &r0);
    for (int r = 0; r < 2; r++) {
        if (two[r].s != DF_OK)
            fail_msg("rank %d: %s", r, two[r].msg);
        int64_t want = split / 2 + rep;
        printf("rank %d of 2 read %lld bytes (share %lld, whole language model %lld)\n", r,
               (long long)two[r].bytes_read, (long long)want, (long long)(split + rep));
        assert_int_equal(two[r].bytes_read, want);
        double *ref = malloc((size_t)one[0].n * sizeof *ref);
        for (int64_t i = 0; i < one[0].n; i++)
            ref[i] = one[0].out[i];
        double e = ref_max_err(two[r].out, ref, one[0].n);
        printf("rank %d of 2 vs 1 rank: max error %.3g\n", r, e);
        assert_true(e <= 1e-5);
        free(ref);
        free(two[r].out);
    }
    free(one[0].out);
    tiny_free(&m);
}

/* te-mistral through df_decoder_lm_stacked (diffuse-check runs it too, in every mode). */
static void test_golden_te_mistral(void **state)
{
    (void)state;
    const char *dir = DF_GOLDEN_DIR "/te-mistral";
    char path[512];
    snprintf(path, sizeof path, "%s/case.safetensors", dir);
    df_safetensors *st;
    if (df_safetensors_open(path, &st) != DF_OK)
        fail_msg("%s", df_error_message());
    int64_t gids[2 * 24], gmask[2 * 24];
    assert_int_equal(df_safetensors_read(st, "in.input_ids", DF_DTYPE_I64, gids, sizeof gids),
                     DF_OK);
    assert_int_equal(
        df_safetensors_read(st, "in.attention_mask", DF_DTYPE_I64, gmask, sizeof gmask), DF_OK);
    df_safetensors_free(st);
    int64_t n;
    double *want = golden_read_f64("te-mistral", "out.prompt_embeds", &n);
    assert_non_null(want);
    int layers[3] = {1, 2, 3};
    lm_job job[1];
    lm_run_ranks(1,
                 &(lm_job){.load = df_mistral_load,
                           .dir = DF_GOLDEN_DIR "/te-mistral/text_encoder",
                           .ids = gids,
                           .mask = gmask,
                           .B = 2,
                           .S = 24,
                           .layers = layers,
                           .n_layers = 3},
                 job);
    if (job[0].s != DF_OK)
        fail_msg("%s", job[0].msg);
    assert_int_equal(job[0].n, n);
    double e = 0, num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(job[0].out[i] - want[i]);
        e = d > e ? d : e;
        num += d * d;
        den += want[i] * want[i];
    }
    printf("te-mistral prompt_embeds: max_abs %.3g (<= 1e-4), rel_l2 %.3g (<= 1.1e-5)\n", e,
           sqrt(num / den));
    assert_true(e <= 1e-4);
    assert_true(sqrt(num / den) <= 1.1e-5);
    free(job[0].out);
    free(want);
}

static void test_config_errors(void **state)
{
    (void)state;
    tiny_lm m = tiny_config();
    tiny_init(&m, 31, DF_DTYPE_F32);
    char dir[512], keys[1024], cfg[1400];
    int64_t extra;
    write_mistral3(&m, DF_DTYPE_F32, MISTRAL3_NEW, "errors", dir, sizeof dir, &extra);
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_decoder_lm *lm = NULL;
    tiny_config_keys(&m, keys, sizeof keys);
    snprintf(cfg, sizeof cfg,
             "{\"text_config\": {%s, \"rope_parameters\": {\"rope_type\": "
             "\"linear\", \"rope_theta\": 1e9}}}",
             keys);
    tiny_write_text(dir, "config.json", cfg);
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "linear"));
    /* a longer input than the sliding window is refused, not run unwindowed */
    snprintf(cfg, sizeof cfg, "{\"text_config\": {%s, \"sliding_window\": 4}}", keys);
    tiny_write_text(dir, "config.json", cfg);
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_OK);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), ids), *out;
    int k = 1;
    assert_int_equal(df_decoder_lm_stacked(ctx, lm, t, NULL, &k, 1, &out), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "sliding window"));
    df_decoder_lm_free(lm);
    /* an unknown tensor beside the language model loads with a warning */
    snprintf(cfg, sizeof cfg, "{%s}", keys); /* a MistralModel config: no vision parts */
    tiny_write_text(dir, "config.json", cfg);
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_OK); /* skipped parts are still fine */
    df_decoder_lm_free(lm);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    tiny_add_lm(w, &m, DF_DTYPE_F32, "model.language_model.");
    tiny_add(w, DF_DTYPE_F32, m.embed, 4, 0, "%sextra.weight", "model.language_model.", -1);
    char path[600];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    /* A tensor the config does not call for loads with a warning, as diffusers does. */
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_OK);
    df_decoder_lm_free(lm);
    df_ctx_free(ctx);
    tiny_free(&m);
}

/* Failing allocation 1, 2, 3, ... of a load (a Mistral3 folder with parts to skip) returns
 * DF_E_OOM and leaks nothing, until the load succeeds; then the same for a forward. */
static void test_load_and_forward_survive_every_failed_allocation(void **state)
{
    (void)state;
    tiny_lm m = tiny_config();
    tiny_init(&m, 41, DF_DTYPE_F32);
    char dir[512];
    int64_t extra;
    write_mistral3(&m, DF_DTYPE_F32, MISTRAL3_NEW, "oom", dir, sizeof dir, &extra);
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_decoder_lm *lm = NULL;
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_OK); /* the context's tables grow */
    df_decoder_lm_free(lm);
    int64_t live = df_alloc_live();
    for (int k = 1;; k++) {
        lm = NULL;
        df_alloc_fail_at(k);
        df_status s = df_mistral_load(ctx, dir, &lm);
        df_alloc_fail_at(0);
        df_decoder_lm_free(lm);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
        if (s == DF_OK)
            break;
        assert_int_equal(s, DF_E_OOM);
        assert_true(k < 100000);
    }
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_OK);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), ids);
    df_tensor *mk = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), left_pad);
    int layers[2] = {1, 3};
    for (int k = 1;; k++) {
        df_tensor *out = NULL;
        df_scope mark = df_scope_begin(ctx);
        df_alloc_fail_at(k);
        df_status s = df_decoder_lm_stacked(ctx, lm, t, mk, layers, 2, &out);
        if (s == DF_OK)
            s = df_sync(ctx);
        df_alloc_fail_at(0);
        df_scope_end(ctx, mark, NULL);
        df_ctx_reset_error(ctx);
        if (s == DF_OK) {
            printf("the forward succeeds once %d allocations may fail\n", k - 1);
            assert_true(k > 1);
            break;
        }
        assert_int_equal(s, DF_E_OOM);
        assert_true(k < 100000);
    }
    df_decoder_lm_free(lm);
    df_ctx_free(ctx);
    tiny_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mistral3_layout_of_new_transformers),
        cmocka_unit_test(test_mistral3_layout_of_old_transformers_bf16),
        cmocka_unit_test(test_skipped_tensor_names),
        cmocka_unit_test(test_two_ranks_match_one_and_read_their_share),
        cmocka_unit_test(test_golden_te_mistral),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_load_and_forward_survive_every_failed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
