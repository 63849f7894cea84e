/*
 * Tests for the Qwen3 text encoder (src/models/qwen3.c over src/models/decoder_lm.c): a tiny
 * random Qwen3 (GQA with 2 query heads per KV head, head_dim not hidden_size / heads, q/k
 * norm) written as a Qwen3ForCausalLM or Qwen3Model checkpoint, against the float64
 * reference of decoder_lm_ref.h: every hidden state with right padding, left padding
 * (rows that see no real token) and no mask, in eager and defer-and-fuse mode, bf16 weights
 * and attention biases; the klein-style
 * stacking; that lm_head is never read and that layers past the last requested one do not
 * run; tensor parallelism on 2 in-process ranks against 1, with the bytes each rank reads;
 * and config and request errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "unit/decoder_lm_ref.h"

#define TMP DF_TEST_TMP "/qwen3"

enum { B = 2, S = 7 };

static tiny_lm tiny_config(bool bias)
{
    return (tiny_lm){.d = 32,
                     .f = 48,
                     .layers = 3,
                     .heads = 4,
                     .kv = 2,
                     .dh = 12,
                     .vocab = 50,
                     .eps = 1e-6,
                     .theta = 1e6,
                     .qk_norm = true,
                     .bias = bias};
}

/* Writes m as a Qwen3ForCausalLM folder (`causal`: "model." prefix and an lm_head) or a
 * Qwen3Model one into TMP/name; returns the path in buf. */
static const char *write_qwen3(const tiny_lm *m, df_dtype dt, bool causal, const char *name,
                               char *buf, size_t cap)
{
    mkdir(DF_TEST_TMP, 0755);
    mkdir(TMP, 0755);
    snprintf(buf, cap, "%s/%s", TMP, name);
    char keys[1024], cfg[1400], path[1100];
    tiny_config_keys(m, keys, sizeof keys);
    snprintf(cfg, sizeof cfg,
             "{\"architectures\": [\"%s\"], \"model_type\": \"qwen3\", %s, "
             "\"tie_word_embeddings\": false, \"use_sliding_window\": false}",
             causal ? "Qwen3ForCausalLM" : "Qwen3Model", keys);
    tiny_write_text(buf, "config.json", cfg);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    tiny_add_lm(w, m, dt, causal ? "model." : "");
    if (causal)
        tiny_add(w, dt, m->embed, m->vocab, m->d, "%slm_head.weight", "", -1);
    snprintf(path, sizeof path, "%s/model.safetensors", buf);
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    return buf;
}

static const int64_t ids[B * S] = {3, 17, 5, 44, 9, 0, 0, /* */ 8, 21, 33, 2, 49, 12, 6};
static const int64_t right_pad[B * S] = {1, 1, 1, 1, 1, 0, 0, /* */ 1, 1, 1, 1, 1, 1, 1};
static const int64_t left_pad[B * S] = {0, 0, 0, 1, 1, 1, 1, /* */ 1, 1, 1, 1, 1, 1, 1};

static df_eager_mode mode = DF_DEFER_NEVER; /* of the contexts new_ctx makes */

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .mode = mode}, &ctx), DF_OK);
    return ctx;
}

/* Runs every hidden state (0..L) of the model in dir and compares with the reference. */
static void check_all_states(const tiny_lm *m, const char *dir, const int64_t *mask, double tol)
{
    int64_t n = B * S * m->d, L = m->layers;
    double *want = malloc((size_t)((L + 1) * n) * sizeof *want);
    ref_forward(m, ids, mask, B, S, want);
    df_ctx *ctx = new_ctx();
    df_decoder_lm *lm;
    if (df_qwen3_load(ctx, dir, &lm) != DF_OK)
        fail_msg("%s", df_error_message());
    df_tensor *t_ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), ids);
    df_tensor *t_mask = mask ? df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), mask) : NULL;
    df_decoder_lm_request req = {.n_hidden_states = (int)L + 1, .last_hidden_state = true};
    for (int k = 0; k <= L; k++)
        req.hidden_states[k] = k;
    df_decoder_lm_output out;
    if (df_decoder_lm_forward(ctx, lm, t_ids, t_mask, &req, &out) != DF_OK)
        fail_msg("%s", df_error_message());
    float *got = malloc((size_t)n * sizeof *got);
    for (int k = 0; k <= L + 1; k++) {
        df_tensor *t = k <= L ? out.hidden_states[k] : out.last_hidden_state;
        assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, got, (size_t)n * sizeof *got), DF_OK);
        double e = ref_max_err(got, want + (k <= L ? k : L) * n, n);
        printf("hidden state %d: max error %.3g (limit %.3g)\n", k, e, tol);
        assert_true(e <= tol);
    }
    free(got);
    free(want);
    df_decoder_lm_free(lm);
    df_ctx_free(ctx);
}

static void test_right_padding_matches_reference(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(false);
    tiny_init(&m, 1, DF_DTYPE_F32);
    char dir[512];
    check_all_states(&m, write_qwen3(&m, DF_DTYPE_F32, true, "right", dir, sizeof dir), right_pad,
                     2e-5);
    tiny_free(&m);
}

static void test_left_padding_and_no_mask_match_reference(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(false);
    tiny_init(&m, 2, DF_DTYPE_F32);
    char dir[512];
    write_qwen3(&m, DF_DTYPE_F32, false, "left", dir, sizeof dir);
    check_all_states(&m, dir, left_pad, 2e-5); /* row 0's first 3 queries see no token */
    check_all_states(&m, dir, NULL, 2e-5);
    mode = DF_DEFER_AND_FUSE; /* the fused plans must agree too */
    check_all_states(&m, dir, left_pad, 2e-5);
    check_all_states(&m, dir, NULL, 2e-5);
    mode = DF_DEFER_NEVER;
    tiny_free(&m);
}

static void test_bf16_weights_and_biases_match_reference(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(true);
    tiny_init(&m, 3, DF_DTYPE_BF16); /* the reference uses the bf16-rounded values */
    char dir[512];
    check_all_states(&m, write_qwen3(&m, DF_DTYPE_BF16, true, "bf16", dir, sizeof dir), right_pad,
                     2e-5);
    tiny_free(&m);
}

/* The klein stacking of hidden states 1 and 2 equals the two states side by side; lm_head
 * is never read; a request for state 1 runs fewer ops than one for all layers. */
static void test_stacking_skips_lm_head_and_later_layers(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(false);
    tiny_init(&m, 4, DF_DTYPE_F32);
    char dir[512];
    write_qwen3(&m, DF_DTYPE_F32, true, "stack", dir, sizeof dir);
    int64_t n = B * S * m.d, L = m.layers;
    double *want = malloc((size_t)((L + 1) * n) * sizeof *want);
    ref_forward(&m, ids, left_pad, B, S, want);

    lm_job jobs[1];
    int layers[2] = {1, -2}; /* -2 is hidden_states[L - 1] = 2 */
    lm_run_ranks(1,
                 &(lm_job){.load = df_qwen3_load,
                           .dir = dir,
                           .ids = ids,
                           .mask = left_pad,
                           .B = B,
                           .S = S,
                           .layers = layers,
                           .n_layers = 2},
                 jobs);
    if (jobs[0].s != DF_OK)
        fail_msg("%s", jobs[0].msg);
    assert_int_equal(jobs[0].n, 2 * n);
    double *stacked = malloc((size_t)(2 * n) * sizeof *stacked);
    for (int64_t t = 0; t < B * S; t++)
        for (int i = 0; i < 2; i++)
            memcpy(stacked + (t * 2 + i) * m.d, want + (i + 1) * n + t * m.d,
                   (size_t)m.d * sizeof *stacked);
    assert_true(ref_max_err(jobs[0].out, stacked, 2 * n) <= 2e-5);
    int64_t split, rep, extra;
    tiny_tp_bytes(&m, 4, &split, &rep, &extra);
    assert_int_equal(jobs[0].bytes_read, split + rep); /* not the lm_head's vocab x d */
    free(jobs[0].out);

    /* fewer kernels for hidden_states[1] than for hidden_states[L] */
    int64_t ops[2];
    for (int r = 0; r < 2; r++) {
        df_ctx *ctx = new_ctx();
        df_decoder_lm *lm;
        assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_OK);
        df_tensor *t_ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), ids);
        df_tensor *out;
        int k = r == 0 ? 1 : (int)L;
        assert_int_equal(df_decoder_lm_stacked(ctx, lm, t_ids, NULL, &k, 1, &out), DF_OK);
        assert_int_equal(df_sync(ctx), DF_OK);
        df_stats st;
        df_ctx_stats(ctx, &st);
        ops[r] = st.ops_enqueued;
        df_decoder_lm_free(lm);
        df_ctx_free(ctx);
    }
    printf("kernels for hidden_states[1]: %lld, for hidden_states[%lld]: %lld\n", (long long)ops[0],
           (long long)L, (long long)ops[1]);
    assert_true(ops[0] * 2 < ops[1]);
    free(stacked);
    free(want);
    tiny_free(&m);
}

static void test_two_ranks_match_one_and_read_their_share(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(true);
    tiny_init(&m, 5, DF_DTYPE_BF16);
    char dir[512];
    write_qwen3(&m, DF_DTYPE_BF16, true, "tp", dir, sizeof dir);
    int64_t split, rep, extra;
    tiny_tp_bytes(&m, 2, &split, &rep, &extra);
    lm_job one[1], two[2];
    int layers[3] = {1, 2, 3}; /* 3 = after the final norm */
    lm_job proto = {.load = df_qwen3_load,
                    .dir = dir,
                    .ids = ids,
                    .mask = left_pad,
                    .B = B,
                    .S = S,
                    .layers = layers,
                    .n_layers = 3};
    lm_run_ranks(1, &proto, one);
    lm_run_ranks(2, &proto, two);
    for (int r = 0; r < 2; r++)
        if (two[r].s != DF_OK)
            fail_msg("rank %d: %s", r, two[r].msg);
    assert_int_equal(one[0].s, DF_OK);
    assert_int_equal(one[0].bytes_read, split + rep + extra);
    for (int r = 0; r < 2; r++) {
        int64_t want = split / 2 + rep + (r == 0 ? extra : 0);
        printf("rank %d of 2 read %lld bytes (share %lld, whole model %lld)\n", r,
               (long long)two[r].bytes_read, (long long)want, (long long)(split + rep + extra));
        assert_int_equal(two[r].bytes_read, want);
        assert_int_equal(two[r].n, one[0].n);
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

    /* 3 ranks do not divide 4 heads / 2 KV heads */
    lm_job three[3];
    lm_run_ranks(3, &proto, three);
    assert_int_equal(three[0].s, DF_E_ARG);
    assert_non_null(strstr(three[0].msg, "num_key_value_heads"));
    for (int r = 0; r < 3; r++)
        free(three[r].out);
    tiny_free(&m);
}

/* config.json of m with `extra` keys appended. */
static void write_config(const char *dir, const tiny_lm *m, const char *extra)
{
    char keys[1024], cfg[1400];
    tiny_config_keys(m, keys, sizeof keys);
    snprintf(cfg, sizeof cfg, "{%s%s}", keys, extra);
    tiny_write_text(dir, "config.json", cfg);
}

static void test_config_and_request_errors(void **state)
{
    (void)state;
    tiny_lm m = tiny_config(false);
    tiny_init(&m, 6, DF_DTYPE_F32);
    char dir[512];
    write_qwen3(&m, DF_DTYPE_F32, true, "errors", dir, sizeof dir);
    df_ctx *ctx = new_ctx();
    df_decoder_lm *lm = NULL;
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_OK);
    df_tensor *t_ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, S), ids);
    df_tensor *out = (void *)1;
    int k = 4; /* the model has 3 layers: indices -4 .. 3 */
    assert_int_equal(df_decoder_lm_stacked(ctx, lm, t_ids, NULL, &k, 1, &out), DF_E_ARG);
    assert_null(out);
    assert_non_null(strstr(df_error_message(), "hidden state 4"));
    df_tensor *bad_mask = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(1, S), ids);
    k = 1;
    assert_int_equal(df_decoder_lm_stacked(ctx, lm, t_ids, bad_mask, &k, 1, &out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "attention mask"));
    df_decoder_lm_free(lm);

    /* a sliding window is not implemented */
    write_config(dir, &m, ", \"use_sliding_window\": true");
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "use_sliding_window"));
    /* a head_dim the checkpoint does not have names the tensor */
    tiny_lm other = m;
    other.dh = 16;
    write_config(dir, &other, "");
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "model.layers.0.self_attn.q_proj.weight"));
    /* heads that are not a multiple of the KV heads */
    other = m;
    other.kv = 3;
    write_config(dir, &other, "");
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "num_key_value_heads"));
    /* a RoPE scaling type */
    write_config(dir, &m, ", \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4}");
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "yarn"));
    df_ctx_free(ctx);
    tiny_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_right_padding_matches_reference),
        cmocka_unit_test(test_left_padding_and_no_mask_match_reference),
        cmocka_unit_test(test_bf16_weights_and_biases_match_reference),
        cmocka_unit_test(test_stacking_skips_lm_head_and_later_layers),
        cmocka_unit_test(test_two_ranks_match_one_and_read_their_share),
        cmocka_unit_test(test_config_and_request_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
