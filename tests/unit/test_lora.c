/*
 * LoRA adapters (models/lora.c): the merge arithmetic and the row split of a fused
 * weight's B, the scale rule, and hostile adapter files refused with a message naming the
 * file and the key (ranks that disagree, a half-missing pair, a target the model lacks,
 * shapes that do not fit, keys of no layout, DoRA, a FLUX.1 layout on SD3, what diffusers
 * does not load), the FLUX.2 BFL and kohya names, FLUX.1's dropped T5 modules, and a GGUF
 * Q8_0 transformer with its adapter unmerged against the merged f32 one.
 */
#include <math.h>
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

#include "models/loader.h"
#include "core/alloc.h"
#include "models/lora.h"
#include "models/weight_sets.h"
#include "runtime/runtime.h"

#define FLUX_DIR  DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline"
#define SD3_DIR   DF_GOLDEN_DIR "/t2i-sd3/pipeline"
#define MODEL_DIR DF_GOLDEN_DIR "/flux-transformer/model"
#define Q8_CASE   DF_GOLDEN_DIR "/../cases/flux-gguf-q8_0"

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
            assert_int_equal(
                df_st_writer_add_f32(w, specs[i].name, DF_DTYPE_F32, (int64_t[]){1}, 0, &a), DF_OK);
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
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 0.5f}, 1, NULL, &set),
                     DF_OK);
    assert_true(df_lora_touches(set, "transformer", "x_embedder.weight"));
    assert_false(df_lora_touches(set, "transformer", "x_embedder.bias"));
    assert_false(df_lora_touches(set, "text_encoder", "x_embedder.weight"));
    float w[15] = {0};
    assert_int_equal(df_lora_merge(set, "transformer", "x_embedder.weight", w, 3, 5, 2), DF_OK);
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

/* peft without metadata: a module's own alpha; one without takes the most common. */
static void test_peft_alpha_tensors(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"transformer.a.lora_A.weight", 2, 1}, {"transformer.a.lora_B.weight", 1, 2},
        {"transformer.a.alpha", 8, 0},         {"transformer.b.lora_A.weight", 2, 1},
        {"transformer.b.lora_B.weight", 1, 2}, {"transformer.b.alpha", 4, 0},
        {"transformer.c.lora_A.weight", 2, 1}, {"transformer.c.lora_B.weight", 1, 2},
        {"transformer.c.alpha", 4, 0},         {"transformer.d.lora_A.weight", 2, 1},
        {"transformer.d.lora_B.weight", 1, 2}};
    const char *path = write_adapter("lora_alphas.safetensors", t, 11);
    df_lora_set *set;
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, NULL, &set),
                     DF_OK);
    /* B A = v0 v0 + v1 v1 = 0.0009 + 0.0004 for every module; scales 4, 2, 2 and 2 */
    static const char *const names[] = {"a.weight", "b.weight", "c.weight", "d.weight"};
    static const float scales[] = {4, 2, 2, 2};
    for (int i = 0; i < 4; i++) {
        float w = 0;
        assert_int_equal(df_lora_merge(set, "transformer", names[i], &w, 1, 1, 1), DF_OK);
        assert_float_equal(w, scales[i] * (value(0) * value(0) + value(1) * value(1)), 1e-8);
    }
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
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, NULL, &set),
                     DF_OK);
    assert_true(df_lora_touches(set, "transformer", "transformer_blocks.0.attn.to_k.weight"));
    assert_false(
        df_lora_touches(set, "transformer", "transformer_blocks.0.attn.add_k_proj.weight"));
    float w[6] = {0};
    assert_int_equal(
        df_lora_merge(set, "transformer", "transformer_blocks.0.attn.to_k.weight", w, 2, 3, 1),
        DF_OK);
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

/* kohya keys over diffusers' names ("lora_transformer_*") update that module whole. */
static void test_kohya_diffusers_names(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.lora_down.weight", 2, 3},
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.lora_up.weight", 4, 2},
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.alpha", 1, 0}};
    const char *path = write_adapter("lora_kohya_diffusers.safetensors", t, 3);
    df_lora_set *set;
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, NULL, &set),
                     DF_OK);
    assert_true(
        df_lora_touches(set, "transformer", "single_transformer_blocks.1.attn.to_q.weight"));
    assert_false(
        df_lora_touches(set, "transformer", "single_transformer_blocks.1.attn.to_k.weight"));
    float w[12] = {0};
    assert_int_equal(df_lora_merge(set, "transformer",
                                   "single_transformer_blocks.1.attn.to_q.weight", w, 4, 3, 1),
                     DF_OK);
    float want = 0.5f * (value(3 * 2 + 0) * value(0 * 3 + 2) + value(3 * 2 + 1) * value(1 * 3 + 2));
    assert_float_equal(w[3 * 3 + 2], want, 1e-7);
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

/* FluxPipeline loads adapters into the transformer and CLIP only (diffusers'
 * _lora_loadable_modules): a T5 module is read, checked and left out, not an error. */
static void test_text_encoder_2_is_left_out_on_flux(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_A.weight", 2, 32},
        {"text_encoder_2.encoder.block.0.layer.0.SelfAttention.q.lora_B.weight", 32, 2}};
    const char *path = write_adapter("t5.safetensors", t, 2);
    df_pipeline *p = NULL;
    assert_int_equal(df_pipeline_load(FLUX_DIR,
                                      &(df_load_opts){.threads = 1,
                                                      .dtype = DF_DTYPE_F32,
                                                      .loras = &(df_lora_spec){path, 1},
                                                      .n_loras = 1},
                                      &p),
                     DF_OK);
    df_pipeline_free(p);
    const tensor_spec bad[] = {{"text_encoder_2.x.lora_A.weight", 2, 32},
                               {"text_encoder_2.x.lora_B.weight", 32, 3}};
    expect_load_error("t5_bad.safetensors", bad, 2, DF_E_FORMAT, FLUX_DIR,
                      "rank"); /* still checked */
}

static void test_flux_layout_on_sd3_is_refused(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 4, 32},
                             {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 32, 4}};
    expect_load_error("kohya_sd3.safetensors", t, 2, DF_E_UNSUPPORTED, SD3_DIR,
                      "converts no kohya");
}

/* The update of merging module rows [r0, r0 + rows) of B [b_rows, rank] times A [rank, cols]
 * (both filled by write_adapter), times `scale`, at element (i, j). */
static float delta(int64_t r0, int64_t i, int64_t j, int64_t rank, int64_t cols, float scale)
{
    float want = 0;
    for (int64_t k = 0; k < rank; k++)
        want += value((r0 + i) * rank + k) * value(k * cols + j);
    return scale * want;
}

/* Merges weight `name` [rows, cols] of the transformer from zero and checks it against rows
 * r0.. of the module's B times its A, times `scale`. */
static void expect_merge(df_lora_set *set, const char *name, int64_t rows, int64_t cols, int64_t r0,
                         int64_t rank, float scale)
{
    assert_true(df_lora_touches(set, "transformer", name));
    float *w = calloc((size_t)(rows * cols), sizeof *w);
    assert_int_equal(df_lora_merge(set, "transformer", name, w, rows, cols, 1), DF_OK);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++)
            assert_float_equal(w[i * cols + j], delta(r0, i, j, rank, cols, scale), 1e-7);
    free(w);
}

/* FLUX.2's BFL / ai-toolkit names (diffusers' _convert_non_diffusers_flux2_lora_to_diffusers):
 * the txt qkv's last third is add_v_proj, linear1 is the fused to_qkv_mlp_proj whole,
 * final_layer's adaLN goes to norm_out.linear unswapped, "sformer_blocks." is
 * "transformer_blocks.", and no alphas: scale = weight. */
static void test_flux2_bfl_names(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"diffusion_model.double_blocks.0.txt_attn.qkv.lora_A.weight", 2, 3},
        {"diffusion_model.double_blocks.0.txt_attn.qkv.lora_B.weight", 6, 2},
        {"diffusion_model.single_blocks.1.linear1.lora_A.weight", 2, 3},
        {"diffusion_model.single_blocks.1.linear1.lora_B.weight", 5, 2},
        {"diffusion_model.final_layer.adaLN_modulation.1.lora_A.weight", 1, 3},
        {"diffusion_model.final_layer.adaLN_modulation.1.lora_B.weight", 4, 1},
        {"diffusion_model.sformer_blocks.0.attn.to_add_out.lora_A.weight", 2, 3},
        {"diffusion_model.sformer_blocks.0.attn.to_add_out.lora_B.weight", 3, 2}};
    const char *path = write_adapter("lora_bfl2.safetensors", t, 8);
    df_lora_set *set;
    assert_int_equal(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 0.5f}, 1,
                                      "Flux2KleinPipeline", &set),
                     DF_OK);
    assert_false(df_lora_touches(set, "transformer", "transformer_blocks.0.attn.to_v.weight"));
    expect_merge(set, "transformer_blocks.0.attn.add_v_proj.weight", 2, 3, 4, 2, 0.5f);
    expect_merge(set, "single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight", 5, 3, 0, 2, 0.5f);
    expect_merge(set, "norm_out.linear.weight", 4, 3, 0, 1, 0.5f);
    expect_merge(set, "transformer_blocks.0.attn.to_add_out.weight", 3, 3, 0, 2, 0.5f);
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
    /* peft's "base_model.model." prefix, which diffusers renames to "diffusion_model." */
    const tensor_spec p[] = {{"base_model.model.single_blocks.0.linear2.lora_A.weight", 2, 4},
                             {"base_model.model.single_blocks.0.linear2.lora_B.weight", 3, 2}};
    path = write_adapter("lora_bfl2_peft.safetensors", p, 2);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2Pipeline", &set),
        DF_OK);
    expect_merge(set, "single_transformer_blocks.0.attn.to_out.weight", 3, 4, 0, 2, 1.0f);
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
}

/* FLUX.2's kohya names (_convert_kohya_flux2_lora_to_diffusers): qkv cut in thirds with
 * s = alpha / rank; a module the converter does not map (a shared modulation, a text
 * encoder's) is dropped, not an error. */
static void test_flux2_kohya_names(void **state)
{
    (void)state;
    const tensor_spec t[] = {{"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight", 2, 3},
                             {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight", 6, 2},
                             {"lora_unet_double_blocks_0_img_attn_qkv.alpha", 3, 0},
                             {"lora_unet_single_blocks_0_linear2.lora_down.weight", 2, 4},
                             {"lora_unet_single_blocks_0_linear2.lora_up.weight", 3, 2},
                             {"lora_unet_double_stream_modulation_img_lin.lora_down.weight", 2, 3},
                             {"lora_unet_double_stream_modulation_img_lin.lora_up.weight", 6, 2},
                             {"lora_te1_model_layers_0_mlp_up_proj.lora_down.weight", 2, 3},
                             {"lora_te1_model_layers_0_mlp_up_proj.lora_up.weight", 6, 2}};
    const char *path = write_adapter("lora_kohya2.safetensors", t, 9);
    df_lora_set *set;
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2Pipeline", &set),
        DF_OK);
    expect_merge(set, "transformer_blocks.0.attn.to_k.weight", 2, 3, 2, 2, 1.5f);
    expect_merge(set, "single_transformer_blocks.0.attn.to_out.weight", 3, 4, 0, 2, 1.0f);
    assert_false(df_lora_touches(set, "transformer", "double_stream_modulation_img.linear.weight"));
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
}

/* FLUX.1 kohya: lora_te2_ and text_encoders.t5xxl modules are dropped as diffusers drops
 * them; ComfyUI's diffusion_model.* and text_encoders.clip_l names are sd-scripts'. */
static void test_flux1_kohya_t5_and_comfy(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight", 2, 3},
        {"lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight", 3, 2},
        {"text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.k.lora_down.weight",
         2, 3},
        {"text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.k.lora_up.weight",
         3, 2},
        {"diffusion_model.double_blocks.0.img_attn.proj.lora_down.weight", 2, 3},
        {"diffusion_model.double_blocks.0.img_attn.proj.lora_up.weight", 3, 2},
        {"diffusion_model.double_blocks.0.img_attn.proj.alpha", 1, 0},
        {"text_encoders.clip_l.transformer.text_model.encoder.layers.0.mlp.fc1.lora_down.weight", 2,
         3},
        {"text_encoders.clip_l.transformer.text_model.encoder.layers.0.mlp.fc1.lora_up.weight", 3,
         2}};
    const char *path = write_adapter("lora_te2.safetensors", t, 9);
    df_lora_set *set;
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_OK);
    assert_false(
        df_lora_touches(set, "text_encoder_2", "encoder.block.0.layer.0.SelfAttention.q.weight"));
    assert_false(
        df_lora_touches(set, "text_encoder_2", "encoder.block.0.layer.0.SelfAttention.k.weight"));
    expect_merge(set, "transformer_blocks.0.attn.to_out.0.weight", 3, 3, 0, 2, 0.5f);
    float w[9] = {0};
    assert_int_equal(df_lora_merge(set, "text_encoder",
                                   "text_model.encoder.layers.0.mlp.fc1.weight", w, 3, 3, 1),
                     DF_OK);
    assert_float_equal(w[4], delta(0, 1, 1, 2, 3, 1.0f), 1e-7);
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
}

/* FLUX.1 kohya: bias and norm differences, position embeddings and text projections are
 * filtered out as diffusers' converter filters them. */
static void test_flux1_kohya_filtered_keys(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"diffusion_model.double_blocks.0.img_attn.proj.lora_down.weight", 2, 3},
        {"diffusion_model.double_blocks.0.img_attn.proj.lora_up.weight", 3, 2},
        {"diffusion_model.double_blocks.0.img_attn.proj.diff_b", 3, 0},
        {"diffusion_model.double_blocks.0.img_attn.norm.key_norm.diff", 3, 0},
        {"lora_te1_text_projection.lora_down.weight", 2, 3},
        {"lora_te1_text_projection.lora_up.weight", 3, 2},
        {"lora_te1_text_model_embeddings_position_embedding.lora_down.weight", 2, 3},
        {"lora_te1_text_model_embeddings_position_embedding.lora_up.weight", 3, 2}};
    const char *path = write_adapter("lora_filtered.safetensors", t, 8);
    df_lora_set *set;
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_OK);
    expect_merge(set, "transformer_blocks.0.attn.to_out.0.weight", 3, 3, 0, 2, 1.0f);
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
    /* on FLUX.2 diffusers' kohya converter maps none of these modules and drops them all */
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2KleinPipeline", &set),
        DF_OK);
    assert_false(df_lora_touches(set, "transformer", "transformer_blocks.0.attn.to_out.0.weight"));
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
    /* DoRA's dora_scale keys are filtered out as diffusers filters them */
    const tensor_spec d[] = {{"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 2, 3},
                             {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 3, 2},
                             {"lora_unet_double_blocks_0_img_attn_proj.dora_scale", 3, 0}};
    path = write_adapter("lora_dora_scale.safetensors", d, 3);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_OK);
    expect_merge(set, "transformer_blocks.0.attn.to_out.0.weight", 3, 3, 0, 2, 1.0f);
    df_lora_set_free(set);
}

/* Beside lora_transformer_ modules, diffusers drops lora_unet_ ones and refuses the rest but
 * lora_te1_. */
static void test_kohya_mixture(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.lora_down.weight", 2, 3},
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.lora_up.weight", 4, 2},
        {"lora_transformer_single_transformer_blocks_1_attn_to_q.alpha", 4, 0},
        {"lora_unet_double_blocks_0_img_attn_proj.lora_down.weight", 2, 3},
        {"lora_unet_double_blocks_0_img_attn_proj.lora_up.weight", 3, 2},
        {"lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_down.weight", 2, 3},
        {"lora_te2_encoder_block_0_layer_0_SelfAttention_q.lora_up.weight", 3, 2}};
    const char *path = write_adapter("lora_mixture.safetensors", t, 5);
    df_lora_set *set;
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_OK);
    assert_false(df_lora_touches(set, "transformer", "transformer_blocks.0.attn.to_out.0.weight"));
    expect_merge(set, "single_transformer_blocks.1.attn.to_q.weight", 4, 3, 0, 2, 2.0f);
    assert_int_equal(df_lora_check_used(set, NULL), DF_OK);
    df_lora_set_free(set);
    path = write_adapter("lora_mixture_te2.safetensors", t, 7);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "lora_te2_encoder_block_0_layer_0_SelfAttention_q"));
    path = write_adapter("lora_mixture_no_alpha.safetensors", t, 2);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "no .alpha"));
}

/* What diffusers 0.42 does not load stays refused, naming why. */
static void test_layouts_diffusers_refuses(void **state)
{
    (void)state;
    const tensor_spec alpha[] = {{"diffusion_model.img_in.lora_A.weight", 2, 3},
                                 {"diffusion_model.img_in.lora_B.weight", 3, 2},
                                 {"diffusion_model.img_in.alpha", 2, 0}};
    const char *path = write_adapter("bfl2_alpha.safetensors", alpha, 3);
    df_lora_set *set = (void *)1;
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2KleinPipeline", &set),
        DF_E_FORMAT);
    assert_null(set);
    assert_non_null(strstr(df_error_message(), "diffusion_model.img_in.alpha"));
    const tensor_spec bfl[] = {{"diffusion_model.img_in.lora_A.weight", 2, 3},
                               {"diffusion_model.img_in.lora_B.weight", 3, 2}};
    path = write_adapter("bfl2_on_flux1.safetensors", bfl, 2);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "FLUX.2"));
    const tensor_spec lokr[] = {{"lycoris_double_blocks_0_img_attn_qkv.lokr_w1", 2, 2},
                                {"lycoris_double_blocks_0_img_attn_qkv.lokr_w2", 3, 3}};
    path = write_adapter("lokr.safetensors", lokr, 2);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2KleinPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "LoKr"));
    const tensor_spec xlabs[] = {{"double_blocks.0.processor.proj_lora1.down.weight", 2, 3},
                                 {"double_blocks.0.processor.proj_lora1.up.weight", 3, 2}};
    path = write_adapter("xlabs_flux2.safetensors", xlabs, 2);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "Flux2KleinPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "converts no XLabs"));
    const tensor_spec control[] = {{"double_blocks.0.img_attn.norm.query_norm.scale", 3, 0},
                                   {"double_blocks.0.img_attn.qkv.lora_A.weight", 2, 3},
                                   {"double_blocks.0.img_attn.qkv.lora_B.weight", 6, 2}};
    path = write_adapter("control.safetensors", control, 3);
    assert_int_equal(
        df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, "FluxPipeline", &set),
        DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "Control"));
}

/* The transformer of `file` (NULL: MODEL_DIR's weights) with the adapter at `lora` (NULL:
 * none) on the inputs of the flux-gguf-q8_0 case: sample [1, 16, 64] into out. */
static void forward(const char *file, const char *lora, df_dtype compute, float *out)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1, .compute = compute}, &ctx), DF_OK);
    if (lora)
        assert_int_equal(
            df_lora_set_load(&(df_lora_spec){.path = lora, .scale = 0.7f}, 1, NULL, &ctx->lora),
            DF_OK);
    df_flux *m;
    df_status s =
        file ? df_flux_load_file(ctx, MODEL_DIR, file, &m) : df_flux_load(ctx, MODEL_DIR, &m);
    if (s != DF_OK)
        fail_msg("%s", df_error_message());
    assert_int_equal(df_lora_check_used(ctx->lora, NULL), DF_OK);
    /* unmerged (int8 compute): the factors are bound beside the weight */
    int sides =
        df_ws_collect(df_flux_weight_set(m), "transformer_blocks.0.attn.to_q.lora_", NULL, 0);
    assert_int_equal(sides, lora && compute == DF_DTYPE_I8 ? 2 : 0);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(Q8_CASE "/case.safetensors", &st), DF_OK);
    static const char *const names[] = {
        "hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids",
        "txt_ids"};
    df_tensor *t[6];
    for (int i = 0; i < 6; i++) {
        char key[64];
        snprintf(key, sizeof key, "in.%s", names[i]);
        df_tensor_info info;
        assert_int_equal(df_safetensors_find(st, key, &info), DF_OK);
        float *v = malloc((size_t)info.numel * sizeof *v);
        assert_int_equal(df_safetensors_read(st, key, DF_DTYPE_F32, v, (size_t)info.numel * 4),
                         DF_OK);
        t[i] = df_tensor_from_host(ctx, DF_DTYPE_F32, info.shape, info.ndim, v);
        free(v);
    }
    df_flux_inputs in = {.hidden_states = t[0],
                         .encoder_hidden_states = t[1],
                         .pooled_projections = t[2],
                         .timestep = t[3],
                         .img_ids = t[4],
                         .txt_ids = t[5]};
    df_tensor *y = df_flux_forward(ctx, m, &in);
    assert_non_null(y);
    assert_int_equal(df_tensor_read(ctx, y, DF_DTYPE_F32, out, 16 * 64 * sizeof *out), DF_OK);
    df_safetensors_free(st);
    df_flux_free(m);
    df_lora_set_free(ctx->lora);
    ctx->lora = NULL;
    df_ctx_free(ctx);
}

static double rel_l2(const float *a, const float *b, int n)
{
    double d = 0, r = 0;
    for (int i = 0; i < n; i++)
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d / r);
}

/* A GGUF Q8_0 transformer under int8 compute: its adapters run beside the 8-bit weights
 * (unmerged, in f32) and must give the merged f32 model's result within the int8 bound
 * (docs/int8.md: rel_l2 0.035 for a model forward), while moving it by much more. */
static void test_gguf_q8_0_int8_unmerged_matches_merged(void **state)
{
    (void)state;
    const int64_t D = 32;
    const tensor_spec t[] = {
        {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, D},
        {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", D, 4},
        {"transformer.transformer_blocks.1.ff.net.0.proj.lora_A.weight", 4, D},
        {"transformer.transformer_blocks.1.ff.net.0.proj.lora_B.weight", 4 * D, 4},
        {"transformer.single_transformer_blocks.0.proj_out.lora_A.weight", 2, 5 * D},
        {"transformer.single_transformer_blocks.0.proj_out.lora_B.weight", D, 2},
        {"transformer.single_transformer_blocks.1.attn.to_v.lora_A.weight", 3, D},
        {"transformer.single_transformer_blocks.1.attn.to_v.lora_B.weight", D, 3},
        {"transformer.transformer_blocks.0.attn.to_q.alpha", 400, 0}, /* s = 0.7 x 400 / 4 */
        {"transformer.transformer_blocks.1.ff.net.0.proj.alpha", 400, 0},
        {"transformer.single_transformer_blocks.0.proj_out.alpha", 200, 0},
        {"transformer.single_transformer_blocks.1.attn.to_v.alpha", 300, 0}};
    char lora[600];
    snprintf(lora, sizeof lora, "%s", write_adapter("lora_q8.safetensors", t, 12));
    enum { N = 16 * 64 };
    float *merged = malloc(N * 4), *base = malloc(N * 4), *q8 = malloc(N * 4);
    forward(NULL, lora, DF_DTYPE_F32, merged);
    forward(NULL, NULL, DF_DTYPE_F32, base);
    forward(Q8_CASE "/flux1-tiny-q8_0.gguf", lora, DF_DTYPE_I8, q8);
    double err = rel_l2(q8, merged, N), effect = rel_l2(base, merged, N);
    print_message(
        "Q8_0, int8 compute + LoRA: rel_l2 %.3g against merged f32; the adapter's effect %.3g\n",
        err, effect);
    if (!(err <= 0.035) || !(effect > 4 * err))
        fail_msg("Q8_0 + LoRA against merged f32: rel_l2 %.3g (bound 0.035); the adapter "
                 "moves the output by %.3g",
                 err, effect);
    free(merged);
    free(base);
    free(q8);
}

/* Out of memory at every allocation of reading two adapters (one with metadata) and of
 * loading a transformer with an adapter merged (f32) and unmerged (int8 compute):
 * DF_E_OOM each time, and nothing leaks. */
static void test_out_of_memory_sweep(void **state)
{
    (void)state;
    const tensor_spec t[] = {
        {"transformer.transformer_blocks.0.attn.to_q.lora_A.weight", 4, 32},
        {"transformer.transformer_blocks.0.attn.to_q.lora_B.weight", 32, 4},
        {"transformer.single_transformer_blocks.1.proj_out.lora_A.weight", 2, 160},
        {"transformer.single_transformer_blocks.1.proj_out.lora_B.weight", 32, 2}};
    char lora[600];
    snprintf(lora, sizeof lora, "%s", write_adapter("lora_oom.safetensors", t, 4));
    const df_lora_spec specs[] = {{DF_GOLDEN_DIR "/../cases/lora-flux-peft/a.safetensors", 0.8f},
                                  {DF_GOLDEN_DIR "/../cases/lora-flux-peft/b.safetensors", 1}};
    for (int pass = 0; pass < 3; pass++) {
        df_ctx *ctx;
        assert_int_equal(
            df_ctx_create(
                &(df_ctx_opts){.threads = 1, .compute = pass == 2 ? DF_DTYPE_I8 : DF_DTYPE_F32},
                &ctx),
            DF_OK);
        int64_t live = 0;
        int failures = 0;
        for (int64_t nth = -1; nth < 100000; nth++) { /* -1: warms caches, then counts */
            if (nth == 0) {
                live = df_alloc_live();
                continue;
            }
            df_lora_set *set = NULL;
            df_flux *m = NULL;
            df_alloc_fail_at(nth < 0 ? 0 : nth);
            df_status s = pass == 0 ? df_lora_set_load(specs, 2, NULL, &set)
                                    : df_lora_set_load(&(df_lora_spec){lora, 1}, 1, NULL, &set);
            if (s == DF_OK && pass > 0) {
                ctx->lora = set;
                s = df_flux_load(ctx, MODEL_DIR, &m);
                ctx->lora = NULL;
            }
            df_alloc_fail_at(0);
            df_flux_free(m);
            df_lora_set_free(set);
            if (s == DF_OK && nth < 0)
                continue;
            if (s == DF_OK && (pass == 0 || m))
                break;
            failures++;
            if (s != DF_E_OOM)
                fail_msg("pass %d, allocation %lld: %s instead of DF_E_OOM: %s", pass,
                         (long long)nth, df_status_name(s), df_error_message());
            df_ctx_reset_error(ctx);
            if (df_alloc_live() != live)
                fail_msg("pass %d, allocation %lld: %lld allocations live, %lld before", pass,
                         (long long)nth, (long long)df_alloc_live(), (long long)live);
        }
        assert_true(failures > 3);
        assert_int_equal(df_alloc_live(), live);
        df_ctx_free(ctx);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_merge_peft_scale),
        cmocka_unit_test(test_peft_alpha_tensors),
        cmocka_unit_test(test_kohya_qkv_split),
        cmocka_unit_test(test_kohya_diffusers_names),
        cmocka_unit_test(test_rank_mismatch_is_refused),
        cmocka_unit_test(test_missing_half_is_refused),
        cmocka_unit_test(test_unknown_target_is_refused),
        cmocka_unit_test(test_shape_mismatch_is_refused),
        cmocka_unit_test(test_kohya_shape_mismatch_is_refused),
        cmocka_unit_test(test_foreign_keys_are_refused),
        cmocka_unit_test(test_text_encoder_2_is_left_out_on_flux),
        cmocka_unit_test(test_flux_layout_on_sd3_is_refused),
        cmocka_unit_test(test_flux2_bfl_names),
        cmocka_unit_test(test_flux2_kohya_names),
        cmocka_unit_test(test_flux1_kohya_t5_and_comfy),
        cmocka_unit_test(test_flux1_kohya_filtered_keys),
        cmocka_unit_test(test_kohya_mixture),
        cmocka_unit_test(test_layouts_diffusers_refuses),
        cmocka_unit_test(test_gguf_q8_0_int8_unmerged_matches_merged),
        cmocka_unit_test(test_out_of_memory_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
