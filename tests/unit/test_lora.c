/*
 * LoRA adapters (models/lora.c): the merge arithmetic and the row split of a fused
 * weight's B, the scale rule, and hostile adapter files refused with a message naming the
 * file and the key (ranks that disagree, a half-missing pair, a target the model lacks,
 * shapes that do not fit, keys of no layout, DoRA, a FLUX.1 layout on SD3).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/diffuse.h>
#include <diffuse/safetensors_writer.h>

#include "models/lora.h"

#define FLUX_DIR DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline"
#define SD3_DIR  DF_GOLDEN_DIR "/t2i-sd3/pipeline"

typedef struct tensor_spec {
    const char *name;
    int64_t rows, cols; /* cols 0: a scalar alpha of value `rows` */
} tensor_spec;

/* Writes DF_TEST_TMP/<file> with the tensors of `specs` (values 0.01 * (i % 7) - 0.03 for
 * element i of a matrix) and returns its path. */
static const char *write_adapter(const char *file, const tensor_spec *specs, int n)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", DF_TEST_TMP, file);
    df_st_writer *w;
    assert_int_equal(df_st_writer_create(&w), DF_OK);
    for (int i = 0; i < n; i++) {
        if (specs[i].cols == 0) {
            float a = (float)specs[i].rows;
            assert_int_equal(df_st_writer_add_f32(w, specs[i].name, DF_DTYPE_F32, NULL, 0, &a),
                             DF_OK);
            continue;
        }
        int64_t numel = specs[i].rows * specs[i].cols;
        float *v = malloc((size_t)numel * sizeof *v);
        for (int64_t k = 0; k < numel; k++)
            v[k] = 0.01f * (float)(k % 7) - 0.03f;
        assert_int_equal(df_st_writer_add_f32(w, specs[i].name, DF_DTYPE_F32,
                                              (int64_t[]){specs[i].rows, specs[i].cols}, 2, v),
                         DF_OK);
        free(v);
    }
    assert_int_equal(df_st_writer_finish(w, path), DF_OK);
    df_st_writer_free(w);
    return path;
}

static float value(int64_t k)
{
    return 0.01f * (float)(k % 7) - 0.03f;
}

/* w += s B A for a peft module, with s = weight x alpha / rank. */
static void test_merge_peft_scale(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.x_embedder.lora_A.weight", 2, 5},
                             {"transformer.x_embedder.lora_B.weight", 3, 2},
                             {"transformer.x_embedder.alpha", 1, 0}};
    const char *path = write_adapter("lora_peft.safetensors", t, 3);
    df_lora_set *set;
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 0.5f}, 1, true, &set),
                     DF_OK);
    assert_true(df_lora_touches(set, "transformer", "x_embedder.weight"));
    assert_false(df_lora_touches(set, "transformer", "x_embedder.bias"));
    assert_false(df_lora_touches(set, "text_encoder", "x_embedder.weight"));
    float w[15] = {0};
    assert_int_equal(df_lora_merge(set, "transformer", "x_embedder.weight", w, 3, 5), DF_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 5; j++) {
            float want = 0;
            for (int k = 0; k < 2; k++)
                want += value(i * 2 + k) * value(k * 5 + j);
            assert_float_equal(w[i * 5 + j], 0.5f * (1.0f / 2.0f) * want, 1e-7);
        }
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
}

/* kohya's fused qkv: to_k takes B's middle third, with A shared and s = alpha / rank. */
static void test_kohya_qkv_split(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", 4, 3},
                             {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", 6, 4},
                             {"lora_unet_double_blocks_0_img_attn_qkv.alpha", 8, 0}};
    const char *path = write_adapter("lora_kohya.safetensors", t, 3);
    df_lora_set *set;
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, true, &set),
                     DF_OK);
    assert_true(df_lora_touches(set, "transformer", "transformer_blocks.0.attn.to_k.weight"));
    assert_false(
        df_lora_touches(set, "transformer", "transformer_blocks.0.attn.add_k_proj.weight"));
    float w[6] = {0};
    assert_int_equal(
        df_lora_merge(set, "transformer", "transformer_blocks.0.attn.to_k.weight", w, 2, 3), DF_OK);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++) {
            float want = 0;
            for (int k = 0; k < 4; k++)
                want += value((2 + i) * 4 + k) * value(k * 3 + j);
            assert_float_equal(w[i * 3 + j], 2.0f * want, 1e-7);
        }
    /* to_q and to_v were not merged: the module counts as used all the same */
    assert_int_equal(df_lora_check_used(set, "transformer"), DF_OK);
    df_lora_set_free(set);
}

static void expect_load_error(const char *file, const tensor_spec *t, int n, df_status want,
                              const char *dir, const char *needle)
{
    const char *path = write_adapter(file, t, n);
    df_pipeline *p = (void *)1;
    df_status s =
        df_pipeline_load(dir,
                         &(df_load_opts){.threads = 1,
                                         .dtype = DF_DTYPE_F32,
                                         .loras = &(df_lora_spec){.path = path, .scale = 1},
                                         .n_loras = 1},
                         &p);
    assert_int_equal(s, want);
    assert_null(p);
    const char *msg = df_error_message();
    if (!strstr(msg, file) || !strstr(msg, needle))
        fail_msg("message '%s' should name %s and '%s'", msg, file, needle);
}

static void test_rank_mismatch_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 32},
                             {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 32, 3}};
    expect_load_error("bad_rank.safetensors", t, 2, DF_E_FORMAT, FLUX_DIR,
                      "transformer.transformer_blocks.0.attn.to_q");
    assert_non_null(strstr(df_error_message(), "rank 4"));
}

static void test_missing_half_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 32}};
    expect_load_error("half.safetensors", t, 1, DF_E_FORMAT, FLUX_DIR, "no lora_B");
}

static void test_unknown_target_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.transformer_blocks.7.attn.to_q.lora_A.weight", 4, 32},
                             {"transformer.transformer_blocks.7.attn.to_q.lora_B.weight", 32, 4}};
    expect_load_error("no_target.safetensors", t, 2, DF_E_FORMAT, FLUX_DIR,
                      "transformer.transformer_blocks.7.attn.to_q");
    assert_non_null(strstr(df_error_message(), "no such"));
}

static void test_shape_mismatch_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.transformer_blocks.1.attn.to_v.lora_A.weight", 4, 33},
                             {"transformer.transformer_blocks.1.attn.to_v.lora_B.weight", 32, 4}};
    expect_load_error("bad_shape.safetensors", t, 2, DF_E_FORMAT, FLUX_DIR, "[4, 33]");
    assert_non_null(strstr(df_error_message(), "[32, 32]"));
}

static void test_kohya_shape_mismatch_is_refused(void **state)
{
    (void)state; /* a qkv B of 95 rows cannot be cut in thirds */
    const tensor_spec t[] = {{"lora_unet_double_blocks_1_txt_attn_qkv.lora_down.weight", 4, 32},
                             {"lora_unet_double_blocks_1_txt_attn_qkv.lora_up.weight", 95, 4}};
    expect_load_error("bad_qkv.safetensors", t, 2, DF_E_FORMAT, FLUX_DIR,
                      "lora_unet_double_blocks_1_txt_attn_qkv");
}

static void test_foreign_keys_are_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"transformer.x_embedder.weight", 32, 64}};
    expect_load_error("not_lora.safetensors", t, 1, DF_E_FORMAT, FLUX_DIR,
                      "transformer.x_embedder.weight");
    const tensor_spec d[] = {{"transformer.x_embedder.lora_A.weight", 4, 64},
                             {"transformer.x_embedder.lora_B.weight", 32, 4},
                             {"transformer.x_embedder.lora_magnitude_vector", 1, 32}};
    expect_load_error("dora.safetensors", d, 3, DF_E_UNSUPPORTED, FLUX_DIR, "DoRA");
    const tensor_spec u[] = {{"unet.down.lora_A.weight", 4, 64},
                             {"unet.down.lora_B.weight", 32, 4}};
    expect_load_error("unet.safetensors", u, 2, DF_E_UNSUPPORTED, FLUX_DIR, "unet.down");
}

static void test_flux_layout_on_sd3_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 32},
                             {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 32, 4}};
    expect_load_error("kohya_sd3.safetensors", t, 2, DF_E_UNSUPPORTED, SD3_DIR, "not FLUX.1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_peft_scale),
        cmocka_unit_test(test_kohya_qkv_split),
        cmocka_unit_test(test_rank_mismatch_is_refused),
        cmocka_unit_test(test_missing_half_is_refused),
        cmocka_unit_test(test_unknown_target_is_refused),
        cmocka_unit_test(test_shape_mismatch_is_refused),
        cmocka_unit_test(test_kohya_shape_mismatch_is_refused),
        cmocka_unit_test(test_foreign_keys_are_refused),
        cmocka_unit_test(test_flux_layout_on_sd3_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
