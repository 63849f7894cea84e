/*
 * Single-file checkpoints: the FLUX.1 name map, and binding through it from hand-made
 * files — a row block of a fused tensor is a view of the mapping holding the right rows,
 * the final layer's halves come back swapped, a prefix is found from the keys, and a fused
 * tensor whose rows do not split is refused with a message naming both names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "core/quant_blocks.h"
#include "models/checkpoint.h"
#include "models/names.h"
#include "models/weight_sets.h"
#include "models/single_file.h"
#include "unit/gguf_bytes.h"
#include "unit/io_files.h"

static void test_name_map(void **state)
{
    (void)state;
    df_name_src s;
    assert_true(df_names_flux_bfl("transformer_blocks.13.attn.add_k_proj.bias", 0, &s));
    assert_string_equal(s.name, "double_blocks.13.txt_attn.qkv.bias");
    assert_int_equal(s.units, 3);
    assert_int_equal(s.n, 1);
    assert_int_equal(s.part[0][0], 1);
    assert_int_equal(s.part[0][1], 2);
    assert_true(df_names_flux_bfl("single_transformer_blocks.0.proj_mlp.weight", 0, &s));
    assert_string_equal(s.name, "single_blocks.0.linear1.weight");
    assert_int_equal(s.units, 7);
    assert_int_equal(s.part[0][0], 3);
    assert_int_equal(s.part[0][1], 7);
    assert_true(df_names_flux_bfl("norm_out.linear.weight", 0, &s));
    assert_string_equal(s.name, "final_layer.adaLN_modulation.1.weight");
    assert_int_equal(s.n, 2);
    assert_int_equal(s.part[0][0], 1); /* [scale; shift] = second half, then first */
    assert_int_equal(s.part[1][0], 0);
    assert_true(df_names_flux_bfl("single_transformer_blocks.1.attn.norm_k.weight", 0, &s));
    assert_string_equal(s.name, "single_blocks.1.norm.key_norm.scale");
    assert_true(df_names_flux_bfl("x_embedder.bias", 0, &s));
    assert_string_equal(s.name, "img_in.bias");
    assert_false(df_names_flux_bfl("transformer_blocks.x.norm1.linear.weight", 0, &s));
    assert_false(df_names_flux_bfl("transformer_blocks.0.norm1.linear.scale", 0, &s));
    assert_false(df_names_flux_bfl("x_embedder.weightx", 0, &s));
    assert_false(df_names_flux_bfl("no_such.weight", 0, &s));
}

/* A file with the probe (double_blocks.0.img_attn.qkv.weight [6, 2] = 0..11), the final
 * layer [4, 2] = 100..107 and linear1 of block 0 [7, 1] = 200..206, under `prefix`. */
static const char *write_bfl(const char *prefix, char *path, size_t cap)
{
    char dir[512], header[1024];
    test_dir("single-file", dir, sizeof dir);
    path_in(dir, "bfl.safetensors", path, cap);
    float data[6 * 2 + 4 * 2 + 7];
    for (int i = 0; i < 12; i++)
        data[i] = (float)i;
    for (int i = 0; i < 8; i++)
        data[12 + i] = (float)(100 + i);
    for (int i = 0; i < 7; i++)
        data[20 + i] = (float)(200 + i);
    snprintf(header, sizeof header,
             "{\"%sdouble_blocks.0.img_attn.qkv.weight\":{\"dtype\":\"F32\",\"shape\":[6,2],"
             "\"data_offsets\":[0,48]},"
             "\"%sfinal_layer.adaLN_modulation.1.weight\":{\"dtype\":\"F32\",\"shape\":[4,2],"
             "\"data_offsets\":[48,80]},"
             "\"%ssingle_blocks.0.linear1.weight\":{\"dtype\":\"F32\",\"shape\":[7,1],"
             "\"data_offsets\":[80,108]}}",
             prefix, prefix, prefix);
    while (strlen(header) % 8) /* data aligned, as writers keep it: tensors can be views */
        strcat(header, " ");
    size_t len;
    uint8_t *file = st_bytes(header, data, sizeof data, &len);
    assert_int_equal(write_file(path, file, len), 0);
    free(file);
    return path;
}

static void read_all(df_ctx *ctx, df_tensor *t, float *out, size_t n)
{
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, out, n * sizeof *out), DF_OK);
}

static void test_bind_views_and_swaps(void **state)
{
    (void)state;
    char path[600];
    write_bfl("model.diffusion_model.", path, sizeof path);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    df_single_file *sf;
    assert_int_equal(
        df_single_file_open(path, "transformer", df_names_flux_bfl, 0, df_names_flux_probe(), &sf),
        DF_OK);
    assert_true(df_single_file_mapped(sf));
    assert_string_equal(df_single_file_prefix(sf), "model.diffusion_model.");
    assert_true(df_single_file_has(sf, "transformer_blocks.0.attn.to_v.weight"));
    assert_false(df_single_file_has(sf, "transformer_blocks.1.attn.to_v.weight"));

    df_tensor *t;
    const void *data;
    size_t bytes;
    float got[8];
    assert_int_equal(df_single_file_bind(sf, ctx, "transformer_blocks.0.attn.to_k.weight", 2,
                                         (int64_t[]){2, 2}, &t, &data, &bytes),
                     DF_OK);
    assert_non_null(data); /* a view of the mapping, not a copy */
    assert_int_equal(bytes, 16);
    read_all(ctx, t, got, 4);
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == (float)(4 + i));
    df_tensor_free(t);

    assert_int_equal(df_single_file_bind(sf, ctx, "norm_out.linear.weight", 2, (int64_t[]){4, 2},
                                         &t, &data, &bytes),
                     DF_OK);
    assert_null(data); /* two blocks of rows: read into memory */
    read_all(ctx, t, got, 8);
    static const float swapped[8] = {104, 105, 106, 107, 100, 101, 102, 103};
    assert_memory_equal(got, swapped, sizeof swapped);
    df_tensor_free(t);

    /* linear1 has 7 rows: proj_mlp is rows 3..6 */
    assert_int_equal(df_single_file_bind(sf, ctx, "single_transformer_blocks.0.proj_mlp.weight", 2,
                                         (int64_t[]){4, 1}, &t, &data, &bytes),
                     DF_OK);
    read_all(ctx, t, got, 4);
    for (int i = 0; i < 4; i++)
        assert_true(got[i] == (float)(203 + i));
    df_tensor_free(t);

    /* a shape the config does not agree with names both tensors */
    assert_int_equal(df_single_file_bind(sf, ctx, "transformer_blocks.0.attn.to_q.weight", 2,
                                         (int64_t[]){3, 2}, &t, &data, &bytes),
                     DF_E_FORMAT);
    assert_non_null(
        strstr(df_error_message(), "model.diffusion_model.double_blocks.0.img_attn.qkv.weight"));
    assert_non_null(strstr(df_error_message(), "transformer_blocks.0.attn.to_q.weight"));
    assert_int_equal(
        df_single_file_bind(sf, ctx, "proj_out.weight", 2, (int64_t[]){4, 2}, &t, &data, &bytes),
        DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "missing tensor"));
    assert_non_null(strstr(df_error_message(), "final_layer.linear.weight"));

    for (int64_t i = 0; i < df_single_file_count(sf); i++)
        assert_null(df_single_file_unused(sf, i)); /* all three tensors were bound */
    df_single_file_free(sf);
    df_ctx_free(ctx);
}

static void test_rows_that_do_not_split(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("single-file-bad", dir, sizeof dir);
    path_in(dir, "bad.safetensors", path, sizeof path);
    float data[10] = {0};
    size_t len;
    uint8_t *file = st_bytes("{\"double_blocks.0.img_attn.qkv.weight\":{\"dtype\":\"F32\","
                             "\"shape\":[5,2],\"data_offsets\":[0,40]}}",
                             data, sizeof data, &len);
    assert_int_equal(write_file(path, file, len), 0);
    free(file);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    df_single_file *sf;
    assert_int_equal(
        df_single_file_open(path, "transformer", df_names_flux_bfl, 0, df_names_flux_probe(), &sf),
        DF_OK);
    assert_string_equal(df_single_file_prefix(sf), "");
    df_tensor *t = (df_tensor *)1;
    const void *d;
    size_t bytes;
    assert_int_equal(df_single_file_bind(sf, ctx, "transformer_blocks.0.attn.to_q.weight", 2,
                                         (int64_t[]){-1, 2}, &t, &d, &bytes),
                     DF_E_FORMAT);
    assert_null(t);
    assert_non_null(strstr(df_error_message(), "row blocks"));
    assert_non_null(df_single_file_unused(sf, 0)); /* a refused tensor stays unbound */
    df_single_file_free(sf);
    df_ctx_free(ctx);
}

/* The LDM VAE map, as convert_ldm_vae_checkpoint renames (4 up blocks: LDM counts them from
 * the bottom), and the text encoders' maps. */
static void test_vae_and_text_name_maps(void **state)
{
    (void)state;
    static const char *const pairs[][2] = {
        {"decoder.up_blocks.0.resnets.2.conv1.weight", "decoder.up.3.block.2.conv1.weight"},
        {"decoder.up_blocks.3.resnets.0.conv_shortcut.bias",
         "decoder.up.0.block.0.nin_shortcut.bias"},
        {"decoder.up_blocks.1.upsamplers.0.conv.weight", "decoder.up.2.upsample.conv.weight"},
        {"encoder.down_blocks.1.resnets.1.norm2.bias", "encoder.down.1.block.1.norm2.bias"},
        {"encoder.down_blocks.2.downsamplers.0.conv.bias", "encoder.down.2.downsample.conv.bias"},
        {"decoder.mid_block.resnets.1.conv2.weight", "decoder.mid.block_2.conv2.weight"},
        {"encoder.mid_block.attentions.0.to_out.0.weight", "encoder.mid.attn_1.proj_out.weight"},
        {"decoder.mid_block.attentions.0.group_norm.bias", "decoder.mid.attn_1.norm.bias"},
        {"decoder.conv_norm_out.weight", "decoder.norm_out.weight"},
        {"decoder.conv_in.bias", "decoder.conv_in.bias"},
        {"post_quant_conv.weight", "post_quant_conv.weight"},
    };
    df_name_src s;
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        assert_true(df_names_vae_ldm(pairs[i][0], 4, &s));
        assert_string_equal(s.name, pairs[i][1]);
        assert_int_equal(s.units, 1);
    }
    assert_false(df_names_vae_ldm("decoder.up_blocks.4.resnets.0.conv1.weight", 4, &s));
    assert_false(df_names_vae_ldm("decoder.up_blocks.-1.resnets.0.conv1.weight", 4, &s));
    assert_false(df_names_vae_ldm("decoder.mid_block.attentions.1.to_q.weight", 4, &s));
    assert_false(df_names_vae_ldm("encoder.down_blocks.0.resnets.0.conv9.weight", 4, &s));
    /* BFL's FLUX.2 ae.safetensors: the quant convs nested in their halves, bn.* as is */
    int nested = 4 | DF_NAMES_VAE_NESTED_QUANT;
    assert_true(df_names_vae_ldm("post_quant_conv.bias", nested, &s));
    assert_string_equal(s.name, "decoder.post_quant_conv.bias");
    assert_true(df_names_vae_ldm("quant_conv.weight", nested, &s));
    assert_string_equal(s.name, "encoder.quant_conv.weight");
    assert_true(df_names_vae_ldm("bn.running_var", nested, &s));
    assert_string_equal(s.name, "bn.running_var");
    assert_true(df_names_vae_ldm("decoder.up_blocks.0.resnets.2.conv1.weight", nested, &s));
    assert_string_equal(s.name, "decoder.up.3.block.2.conv1.weight");
    assert_false(df_names_vae_ldm("decoder.up_blocks.4.resnets.0.conv1.weight", nested, &s));

    /* SD3's MMDiT names: thirds of qkv; the last block's context modulation swapped */
    assert_true(df_names_sd3_mmdit("transformer_blocks.1.attn.add_v_proj.bias", 3, &s));
    assert_string_equal(s.name, "joint_blocks.1.context_block.attn.qkv.bias");
    assert_int_equal(s.units, 3);
    assert_int_equal(s.part[0][0], 2);
    assert_true(df_names_sd3_mmdit("transformer_blocks.1.norm1_context.linear.weight", 3, &s));
    assert_int_equal(s.n, 1);
    assert_true(df_names_sd3_mmdit("transformer_blocks.2.norm1_context.linear.weight", 3, &s));
    assert_string_equal(s.name, "joint_blocks.2.context_block.adaLN_modulation.1.weight");
    assert_int_equal(s.n, 2);
    assert_int_equal(s.part[0][0], 1);
    assert_true(df_names_sd3_mmdit("transformer_blocks.0.attn2.norm_k.weight", 3, &s));
    assert_string_equal(s.name, "joint_blocks.0.x_block.attn2.ln_k.weight");
    assert_true(df_names_flux2_bfl("single_transformer_blocks.1.attn.to_qkv_mlp_proj.weight", 0,
                                   &s));
    assert_string_equal(s.name, "single_blocks.1.linear1.weight");
    assert_int_equal(s.units, 1);
    assert_true(df_names_flux2_bfl("double_stream_modulation_txt.linear.weight", 0, &s));
    assert_string_equal(s.name, "double_stream_modulation_txt.lin.weight");
    assert_true(df_names_flux2_bfl("norm_out.linear.weight", 0, &s));
    assert_int_equal(s.n, 2);
    assert_true(df_names_sd3_mmdit("pos_embed.pos_embed", 3, &s));
    assert_string_equal(s.name, "pos_embed");

    assert_true(df_names_clip_bare("text_model.encoder.layers.0.mlp.fc1.weight", 0, &s));
    assert_string_equal(s.name, "encoder.layers.0.mlp.fc1.weight");
    assert_true(df_names_clip_bare("text_projection.weight", 0, &s));
    assert_string_equal(s.name, "text_projection.weight");
    assert_true(df_names_same("shared.weight", 0, &s));
    assert_string_equal(s.name, "shared.weight");
}

/* A VAE attention projection saved as a 1x1 convolution [2, 2, 1, 1] binds as the [2, 2]
 * linear diffusers makes of it, under ComfyUI's "vae." prefix; the all-in-one file's
 * other tensors are not reported unused, the VAE's own are until bound or ignored. */
static void test_vae_file_squeezes_and_prefix(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("single-file-vae", dir, sizeof dir);
    path_in(dir, "comfy.safetensors", path, sizeof path);
    float data[4 + 1 + 1 + 1] = {1, 2, 3, 4, 5, 6, 7};
    char header[1024];
    snprintf(header, sizeof header,
             "{\"model.diffusion_model.x\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[16,20]},"
             "\"vae.decoder.mid.attn_1.q.weight\":{\"dtype\":\"F32\",\"shape\":[2,2,1,1],"
             "\"data_offsets\":[0,16]},"
             "\"vae.decoder.mid.block_1.conv1.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[20,24]},"
             "\"vae.encoder.conv_in.weight\":{\"dtype\":\"F32\",\"shape\":[1],"
             "\"data_offsets\":[24,28]}}");
    while (strlen(header) % 8)
        strcat(header, " ");
    size_t len;
    uint8_t *file = st_bytes(header, data, sizeof data, &len);
    assert_int_equal(write_file(path, file, len), 0);
    free(file);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    df_single_file *sf;
    assert_int_equal(
        df_single_file_open(path, "vae", df_names_vae_ldm, 4, df_names_vae_probe(), &sf), DF_OK);
    assert_string_equal(df_single_file_prefix(sf), "vae.");
    df_tensor *t;
    const void *d;
    size_t bytes;
    assert_int_equal(df_single_file_bind(sf, ctx, "decoder.mid_block.attentions.0.to_q.weight", 2,
                                         (int64_t[]){2, 2}, &t, &d, &bytes),
                     DF_OK);
    assert_int_equal(df_tensor_ndim(t), 2);
    float got[4];
    read_all(ctx, t, got, 4);
    assert_memory_equal(got, data, sizeof got);
    df_tensor_free(t);
    int unused = 0;
    for (int64_t i = 0; i < df_single_file_count(sf); i++)
        unused += df_single_file_unused(sf, i) != NULL;
    assert_int_equal(unused, 2); /* block_1.conv1 and encoder.conv_in, not the transformer's */
    df_single_file_ignore_prefix(sf, "encoder.");
    unused = 0;
    for (int64_t i = 0; i < df_single_file_count(sf); i++)
        unused += df_single_file_unused(sf, i) != NULL;
    assert_int_equal(unused, 1);
    df_single_file_free(sf);
    df_ctx_free(ctx);
}

/* The model and components of a checkpoint, from key names and shapes alone (diffusers'
 * infer_diffusers_model_type rules). */
static const char *model_of(const df_checkpoint_key *keys, int n, df_checkpoint_parts *parts)
{
    df_checkpoint_recognise_keys(keys, n, parts);
    return parts->model;
}

static void test_recognise_known_models(void **state)
{
    (void)state;
    df_checkpoint_parts c;
    df_checkpoint_key dev[] = {
        {"model.diffusion_model.double_blocks.0.img_attn.norm.key_norm.scale", 1, {128}},
        {"model.diffusion_model.guidance_in.in_layer.bias", 1, {3072}},
        {"model.diffusion_model.img_in.weight", 2, {3072, 64}},
        {"vae.decoder.mid.block_1.conv1.weight", 4, {512, 512, 3, 3}},
        {"text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight", 2,
         {49408, 768}},
        {"text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight", 2,
         {4096, 4096}},
    };
    assert_string_equal(model_of(dev, 6, &c), "FLUX.1-dev");
    assert_string_equal(c.transformer_prefix, "model.diffusion_model.");
    assert_true(c.transformer && c.vae && c.clip_l && c.t5);
    assert_false(c.clip_g);
    dev[2].shape[1] = 384;
    assert_string_equal(model_of(dev, 6, &c), "FLUX.1-fill");
    df_checkpoint_key schnell[] = {{"double_blocks.0.img_attn.norm.key_norm.scale", 1, {128}},
                                   {"img_in.weight", 2, {3072, 64}}};
    assert_string_equal(model_of(schnell, 2, &c), "FLUX.1-schnell");
    assert_string_equal(c.transformer_prefix, "");
    assert_false(c.vae || c.clip_l || c.t5);

    df_checkpoint_key sd3[] = {
        {"model.diffusion_model.joint_blocks.0.context_block.adaLN_modulation.1.bias", 1, {9216}},
        {"model.diffusion_model.pos_embed", 3, {1, 36864, 1536}},
        {"text_encoders.clip_g.transformer.text_model.embeddings.token_embedding.weight", 2,
         {49408, 1280}},
        {"text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight", 2,
         {49408, 768}},
        {"first_stage_model.decoder.mid.block_1.conv1.weight", 4, {512, 512, 3, 3}},
    };
    assert_string_equal(model_of(sd3, 5, &c), "SD3-medium");
    assert_true(c.clip_g && c.clip_l && c.vae);
    assert_false(c.t5);
    sd3[1].shape[1] = 147456;
    assert_string_equal(model_of(sd3, 5, &c), "SD3.5-medium");
    sd3[0].shape[0] = 2432 * 6; /* not 9216: the SD3 rule does not hold */
    assert_string_equal(model_of(sd3, 5, &c), "");
    assert_false(c.transformer);
    df_checkpoint_key tiny[] = {{"joint_blocks.0.x_block.attn.qkv.weight", 2, {96, 32}}};
    assert_non_null(strstr(model_of(tiny, 1, &c), "SD3-like"));
    assert_true(c.transformer);
    df_checkpoint_key large[] = {{"joint_blocks.37.x_block.mlp.fc1.weight", 2, {9728, 2432}},
                                 {"joint_blocks.0.context_block.adaLN_modulation.1.bias", 1,
                                  {14592}}};
    assert_string_equal(model_of(large, 2, &c), "SD3.5-large");
    df_checkpoint_key flux2[] = {{"single_stream_modulation.lin.weight", 2, {18432, 6144}},
                                 {"double_blocks.0.img_attn.norm.key_norm.scale", 1, {128}}};
    assert_string_equal(model_of(flux2, 2, &c), "FLUX.2-klein");
    df_checkpoint_key flux2_dev[] = {{"single_stream_modulation.lin.weight", 2, {18432, 6144}},
                                     {"guidance_in.in_layer.weight", 2, {6144, 256}}};
    assert_string_equal(model_of(flux2_dev, 2, &c), "FLUX.2-dev");
    /* diffusers' names under stable-diffusion.cpp's prefixes; llama.cpp's T5 */
    df_checkpoint_key dn[] = {
        {"model.diffusion_model.transformer_blocks.0.attn.to_q.weight", 2, {3072, 3072}},
        {"model.diffusion_model.single_transformer_blocks.0.proj_mlp.weight", 2, {12288, 3072}},
        {"vae.decoder.mid_block.resnets.0.conv1.weight", 4, {512, 512, 3, 3}},
        {"text_encoders.t5xxl.transformer.enc.blk.0.attn_q.weight", 2, {4096, 4096}},
        {"model.diffusion_model.time_text_embed.guidance_embedder.linear_1.weight", 2,
         {3072, 256}},
    };
    assert_string_equal(model_of(dn, 4, &c), "FLUX.1-schnell (diffusers names)");
    assert_string_equal(c.transformer_prefix, "model.diffusion_model.");
    assert_true(c.transformer && c.vae && c.vae_diffusers && c.t5 && c.t5_llamacpp);
    assert_string_equal(model_of(dn, 5, &c), "FLUX.1-dev (diffusers names)");
    df_checkpoint_key dn_sd3[] = {{"transformer_blocks.0.attn.to_q.weight", 2, {1536, 1536}},
                                  {"pos_embed.proj.weight", 4, {1536, 16, 2, 2}}};
    assert_string_equal(model_of(dn_sd3, 2, &c), "SD3 (diffusers names)");
    assert_false(c.vae || c.t5_llamacpp);
    df_checkpoint_key dn_none[] = {{"transformer_blocks.0.attn.to_q.weight", 2, {8, 8}}};
    assert_string_equal(model_of(dn_none, 1, &c), "");
    assert_false(c.transformer);
    /* FLUX.2 klein all-in-one: BFL's FLUX.2 VAE (its batch norm beside the LDM names) and
     * Qwen3 (its q_norm beside the layer) under ComfyUI's prefixes */
    df_checkpoint_key klein[] = {
        {"model.diffusion_model.single_stream_modulation.lin.weight", 2, {9216, 3072}},
        {"vae.decoder.mid.block_1.conv1.weight", 4, {512, 512, 3, 3}},
        {"vae.bn.running_mean", 1, {128}},
        {"text_encoders.qwen3_4b.transformer.model.layers.0.post_attention_layernorm.weight",
         1,
         {2560}},
        {"text_encoders.qwen3_4b.transformer.model.layers.0.self_attn.q_norm.weight", 1, {128}},
    };
    assert_string_equal(model_of(klein, 5, &c), "FLUX.2-klein");
    assert_true(c.vae && c.vae_flux2 && c.qwen3 && !c.mistral && !c.clip_l && !c.t5);
    /* ComfyUI's mistral_3_small_flux2 file: no q_norm, a vision tower beside */
    df_checkpoint_key mistral[] = {
        {"model.layers.0.post_attention_layernorm.weight", 1, {5120}},
        {"model.layers.1.self_attn.q_norm.weight", 1, {128}}, /* not layer 0's: no sibling */
        {"vision_tower.transformer.layers.0.attention_norm.weight", 1, {1024}},
    };
    assert_string_equal(model_of(mistral, 3, &c), "");
    assert_true(c.mistral && !c.qwen3 && !c.vae && !c.transformer);
    /* FLUX.1's VAE is not FLUX.2's; CLIP and T5 are not language models */
    model_of(dev, 6, &c);
    assert_true(c.vae && !c.vae_flux2 && c.clip_l && c.t5 && !c.qwen3 && !c.mistral);
    /* a lone CLIP: CLIP-G by its width */
    df_checkpoint_key clip[] = {{"text_model.embeddings.token_embedding.weight", 2, {49408, 1280}}};
    model_of(clip, 1, &c);
    assert_true(c.clip_g && !c.clip_l && !c.transformer);
}

/* An all-in-one file with both CLIPs: the hint picks each one's prefix, whichever sorts
 * first; a file with one CLIP takes it whatever the hint. */
static void test_clip_prefix_hint(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("single-file-clips", dir, sizeof dir);
    path_in(dir, "sd3.safetensors", path, sizeof path);
    float data[2] = {1, 2};
    char header[1024];
    snprintf(header, sizeof header,
             "{\"text_encoders.clip_g.transformer.text_model.embeddings.token_embedding.weight\":"
             "{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[0,4]},"
             "\"text_encoders.clip_l.transformer.text_model.embeddings.token_embedding.weight\":"
             "{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[4,8]}}");
    while (strlen(header) % 8)
        strcat(header, " ");
    size_t len;
    uint8_t *file = st_bytes(header, data, sizeof data, &len);
    assert_int_equal(write_file(path, file, len), 0);
    free(file);
    static const char *const hints[][2] = {{"clip_l", "text_encoders.clip_l.transformer."},
                                           {"clip_g", "text_encoders.clip_g.transformer."},
                                           {"t5xxl", "text_encoders.clip_g.transformer."}};
    for (int i = 0; i < 3; i++) {
        df_single_file *sf;
        assert_int_equal(df_single_file_open(path, "clip", NULL, 0, NULL, &sf), DF_OK);
        assert_true(df_single_file_try_map(sf, df_names_same, 0, df_names_clip_probe(),
                                           hints[i][0]));
        assert_string_equal(df_single_file_prefix(sf), hints[i][1]);
        /* a second map is not taken over the first */
        assert_false(df_single_file_try_map(sf, df_names_clip_bare, 0,
                                            df_names_clip_bare_probe(), NULL));
        df_single_file_free(sf);
    }
}

/* Q8_0 blocks of 32 int8 codes q = i % 32 - 16 under scales 1, 0.5, 1, 0.5, ... (f16 0x3C00,
 * 0x3800): value i is its code times its block's scale. */
static void q8_0_blocks(buf *f, int nblocks)
{
    for (int b = 0; b < nblocks; b++) {
        uint8_t scale[2] = {0x00, (uint8_t)(b % 2 ? 0x38 : 0x3C)};
        put(f, scale, 2);
        for (int i = 0; i < 32; i++) {
            int8_t q = (int8_t)(i - 16);
            put(f, &q, 1);
        }
    }
}

static float q8_0_value(int i)
{
    return (float)(i % 32 - 16) * (i / 32 % 2 ? 0.5f : 1.0f);
}

/*
 * A T5 encoder GGUF in llama.cpp's names under stable-diffusion.cpp's prefix: the
 * transformers map finds nothing, the llama.cpp map finds the prefix, a 1-D Q8_0 norm (as
 * sd.cpp writes norms whose width is a multiple of 32) binds through it on two threads with
 * every value right (its rows are single values, so the chunks must be whole blocks), and a
 * name the map does not have is reported as such.
 */
static void test_t5_llamacpp_gguf(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("single-file-t5-gguf", dir, sizeof dir);
    path_in(dir, "t5.gguf", path, sizeof path);
    buf f;
    header(&f, 3, 2, 0);
    tinfo(&f, "text_encoders.t5xxl.transformer.enc.blk.0.attn_norm.weight", 1,
          (uint64_t[]){96}, DF_GGML_Q8_0, 0);
    tinfo(&f, "text_encoders.t5xxl.transformer.enc.blk.0.attn_q.weight", 2,
          (uint64_t[]){32, 2}, DF_GGML_Q8_0, 128);
    data(&f, 32, 0);
    q8_0_blocks(&f, 3); /* 102 bytes, then padding to 128 */
    put(&f, (uint8_t[26]){0}, 26);
    q8_0_blocks(&f, 2);
    assert_int_equal(write_file(path, f.b, f.n), 0);

    df_ctx *ctx;
    assert_int_equal(
        df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = DF_DTYPE_F32}, &ctx), DF_OK);
    df_single_file *sf;
    assert_int_equal(df_single_file_open(path, "text_encoder_2", df_names_same, 0,
                                         df_names_t5_probe(), &sf),
                     DF_OK);
    assert_false(df_single_file_mapped(sf));
    assert_true(df_single_file_try_map(sf, df_names_t5_llamacpp, 0,
                                       df_names_t5_llamacpp_probe(), NULL));
    assert_string_equal(df_single_file_prefix(sf), "text_encoders.t5xxl.transformer.");
    assert_true(df_single_file_has(sf, "encoder.block.0.layer.0.SelfAttention.q.weight"));
    assert_false(df_single_file_has(sf, "encoder.embed_tokens.weight"));
    df_tensor *t;
    const void *d;
    size_t bytes;
    assert_int_equal(df_single_file_bind(sf, ctx, "encoder.block.0.layer.0.layer_norm.weight", 1,
                                         (int64_t[]){96}, &t, &d, &bytes),
                     DF_OK);
    float got[96];
    read_all(ctx, t, got, 96);
    for (int i = 0; i < 96; i++)
        if (got[i] != q8_0_value(i))
            fail_msg("value %d: %g, expected %g", i, got[i], q8_0_value(i));
    df_tensor_free(t);
    assert_int_equal(df_single_file_bind(sf, ctx, "encoder.block.0.layer.1.layer_norm.weight", 1,
                                         (int64_t[]){96}, &t, &d, &bytes),
                     DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(),
                           "missing tensor 'text_encoders.t5xxl.transformer.enc.blk.0.ffn_norm."
                           "weight'"));
    df_ctx_reset_error(ctx);
    df_single_file_free(sf);
    df_ctx_free(ctx);
}

/* A file holding the same T5 tensor in both transformers' and llama.cpp's names: the
 * transformers layout is taken, and the llama.cpp copy is reported unused, never bound
 * for the same weight. */
static void test_t5_both_layouts(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("single-file-t5-both", dir, sizeof dir);
    path_in(dir, "both.gguf", path, sizeof path);
    buf f;
    header(&f, 3, 2, 0);
    tinfo(&f, "enc.blk.0.attn_q.weight", 2, (uint64_t[]){2, 2}, DF_GGML_F32, 0);
    tinfo(&f, "encoder.block.0.layer.0.SelfAttention.q.weight", 2, (uint64_t[]){2, 2},
          DF_GGML_F32, 32);
    data(&f, 32, 48);
    assert_int_equal(write_file(path, f.b, f.n), 0);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    df_single_file *sf;
    assert_int_equal(df_single_file_open(path, "text_encoder_2", df_names_same, 0,
                                         df_names_t5_probe(), &sf),
                     DF_OK);
    assert_false(df_single_file_try_map(sf, df_names_t5_llamacpp, 0,
                                        df_names_t5_llamacpp_probe(), NULL));
    df_tensor *t;
    const void *d;
    size_t bytes;
    assert_int_equal(df_single_file_bind(sf, ctx, "encoder.block.0.layer.0.SelfAttention.q.weight",
                                         2, (int64_t[]){2, 2}, &t, &d, &bytes),
                     DF_OK);
    df_tensor_free(t);
    const char *unused = NULL;
    for (int64_t i = 0; i < df_single_file_count(sf); i++)
        if (df_single_file_unused(sf, i))
            unused = df_single_file_unused(sf, i);
    assert_non_null(unused);
    assert_string_equal(unused, "enc.blk.0.attn_q.weight");
    df_single_file_free(sf);
    df_ctx_free(ctx);
}

#define CASES       DF_GOLDEN_DIR "/../cases"
#define FLUX_CONFIG DF_GOLDEN_DIR "/flux-transformer/model"

/* Every allocation of a single-file load fails in turn (a GGUF with Q8_0 blocks, and an
 * fp8 ComfyUI file with its halves swapped; in f32, and in int8 where they stay compact):
 * DF_E_OOM each time, and nothing leaks. */
static void sweep(const char *file, df_dtype compute)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1, .compute = compute}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load_file(ctx, FLUX_CONFIG, file, &m), DF_OK); /* warm caches */
    df_flux_free(m);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        m = NULL;
        df_alloc_fail_at(nth);
        df_status s = df_flux_load_file(ctx, FLUX_CONFIG, file, &m);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            df_flux_free(m);
            break;
        }
        failures++;
        if (s != DF_E_OOM)
            fail_msg("%s: allocation %lld: %s instead of DF_E_OOM: %s", file, (long long)nth,
                     df_status_name(s), df_error_message());
        assert_null(m);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(failures > 3);
    assert_int_equal(df_alloc_live(), live);
    df_ctx_free(ctx);
}

static void test_load_out_of_memory_sweep(void **state)
{
    (void)state;
    sweep(CASES "/flux-gguf-q8_0/flux1-tiny-q8_0.gguf", DF_DTYPE_F32);
    sweep(CASES "/flux-single-comfy/flux1-tiny-comfy-fp8.safetensors", DF_DTYPE_F32);
    /* int8: the quantized weights stay in the file's bytes */
    sweep(CASES "/flux-gguf-q4_k/flux1-tiny-q4_k.gguf", DF_DTYPE_I8);
    sweep(CASES "/flux-single-comfy/flux1-tiny-comfy-fp8.safetensors", DF_DTYPE_I8);
}

/* True for a FLUX.1 layer (original names) that the int8 policy keeps in higher
 * precision: the embedders and the final layer (models/quant_policy.c). */
static bool kept_layer(const char *name)
{
    static const char *const kept[] = {"img_in.",    "txt_in.",      "time_in.",
                                       "vector_in.", "guidance_in.", "final_layer."};
    const char *p = strncmp(name, "model.diffusion_model.", 22) == 0 ? name + 22 : name;
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (strncmp(p, kept[i], strlen(kept[i])) == 0)
            return true;
    return false;
}

/* What a tensor of the file should hold resident under int8 compute: its own bytes when it
 * stays in the file's form (a quantized or fp8 2-D weight of a quantized layer) or is a
 * float tensor the int8 policy keeps (wrapped, or read as it is), 2 bytes a value when a
 * kept layer's quantized weight is upcast to bf16, the 8-bit form of a float weight
 * quantized on load, nothing for an fp8 scale (read into its weight). */
static int64_t expected_resident(const char *name, bool quantized, int ndim, int64_t k,
                                 int64_t numel, size_t nbytes)
{
    size_t n = strlen(name);
    if (n > 13 && strcmp(name + n - 13, ".scale_weight") == 0)
        return 0;
    bool int8 = ndim == 2 && !kept_layer(name) && strcmp(name + n - 7, ".weight") == 0;
    if (!quantized && int8) /* a float weight quantized on load: df_quant_bind's size */
        return numel + numel / k * df_int8_weight_groups(k, df_int8_default_group()) * 8;
    if (!quantized)
        return (int64_t)nbytes;
    return int8 ? (int64_t)nbytes : 2 * numel;
}

/* Under int8 compute, GGUF block types and fp8 weights stay in the file's bytes: the
 * resident weight bytes after loading are those of the file's tensors (plus the kept
 * layers' bf16 upcast), not of a bf16 copy; in stable-diffusion.cpp's file the kept
 * layers are BF16 already and stay as stored. */
static void test_compact_residency(void **state)
{
    (void)state;
    const char *files[] = {CASES "/flux-gguf-q8_0/flux1-tiny-q8_0.gguf",
                           CASES "/flux-gguf-q4_k/flux1-tiny-q4_k.gguf",
                           CASES "/flux-single-comfy/flux1-tiny-comfy-fp8.safetensors",
                           CASES "/flux-gguf-sdcpp/flux1-tiny-sdcpp-q8_0.gguf"};
    for (int f = 0; f < 4; f++) {
        int64_t expect = 0, compact = 0;
        if (strstr(files[f], ".gguf")) {
            df_gguf *g;
            assert_int_equal(df_gguf_open(files[f], &g), DF_OK);
            for (int64_t i = 0; i < df_gguf_count(g); i++) {
                df_gguf_tensor t;
                assert_int_equal(df_gguf_at(g, i, &t), DF_OK);
                if (strncmp(t.name, "first_stage_model.", 18) == 0)
                    continue; /* the sd.cpp file's VAE: not the transformer's */
                bool q = t.type != 0 && t.type != 1 && t.type != 30; /* F32, F16, BF16 */
                int64_t k = t.ndim ? t.shape[t.ndim - 1] : 1;
                int64_t r = expected_resident(t.name, q, t.ndim, k, t.numel, t.nbytes);
                expect += r;
                compact += q && r == (int64_t)t.nbytes ? r : 0;
            }
            df_gguf_free(g);
        } else {
            df_weights *w;
            assert_int_equal(df_weights_open(files[f], &w), DF_OK);
            for (int64_t i = 0; i < df_weights_count(w); i++) {
                df_tensor_info t;
                assert_int_equal(df_weights_at(w, i, &t), DF_OK);
                bool q = strncmp(t.dtype_name, "F8_", 3) == 0;
                int64_t k = t.ndim ? t.shape[t.ndim - 1] : 1;
                int64_t r = expected_resident(t.name, q, t.ndim, k, t.numel, t.nbytes);
                expect += r;
                compact += q && r == (int64_t)t.nbytes ? r : 0;
            }
            df_weights_free(w);
        }
        print_message("%s: %lld of %lld bytes compact\n", files[f], (long long)compact,
                      (long long)expect);
        assert_true(compact > expect / 4);
        df_ctx *ctx;
        assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1, .compute = DF_DTYPE_I8}, &ctx),
                         DF_OK);
        df_flux *m = NULL;
        assert_int_equal(df_flux_load_file(ctx, FLUX_CONFIG, files[f], &m), DF_OK);
        df_stats st;
        df_ctx_stats(ctx, &st);
        if (st.resident_weight_bytes != expect)
            fail_msg("%s: %lld resident weight bytes under int8, expected %lld", files[f],
                     (long long)st.resident_weight_bytes, (long long)expect);
        df_flux_free(m);
        /* in f32 the same file is upcast: 4 bytes a value */
        df_ctx_free(ctx);
        assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
        assert_int_equal(df_flux_load_file(ctx, FLUX_CONFIG, files[f], &m), DF_OK);
        df_ctx_stats(ctx, &st);
        assert_true(st.resident_weight_bytes > expect);
        df_flux_free(m);
        df_ctx_free(ctx);
    }
}

/* A forward of the tiny FLUX.1 on fixed inputs, into out (n floats). */
static void forward(df_ctx *ctx, df_flux *m, float *out, size_t n)
{
    const df_flux_cfg *c = df_flux_config(m);
    int64_t s_img = 16, s_txt = 8;
    float *buf = malloc((size_t)(s_img * c->joint_attention_dim * 2) * sizeof *buf);
    for (int64_t i = 0; i < s_img * c->joint_attention_dim * 2; i++)
        buf[i] = (float)((i * 7919) % 201 - 100) / 100.0f;
    float ids[16 * 3] = {0}, tids[8 * 3] = {0};
    for (int i = 0; i < 16; i++)
        ids[i * 3 + 1] = (float)(i / 4), ids[i * 3 + 2] = (float)(i % 4);
    df_scope mark = df_scope_begin(ctx);
    df_flux_inputs in = {
        .hidden_states =
            df_tensor_from_host(ctx, DF_DTYPE_F32, (int64_t[]){1, s_img, c->in_channels}, 3, buf),
        .encoder_hidden_states = df_tensor_from_host(
            ctx, DF_DTYPE_F32, (int64_t[]){1, s_txt, c->joint_attention_dim}, 3, buf),
        .pooled_projections = df_tensor_from_host(ctx, DF_DTYPE_F32,
                                                  (int64_t[]){1, c->pooled_projection_dim}, 2, buf),
        .timestep = df_full(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1, 0.5),
        .img_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, (int64_t[]){s_img, 3}, 2, ids),
        .txt_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, (int64_t[]){s_txt, 3}, 2, tids),
        .guidance = c->guidance_embeds ? df_full(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1, 3.5) : NULL,
    };
    df_tensor *o = df_flux_forward(ctx, m, &in);
    assert_non_null(o);
    assert_int_equal(df_tensor_numel(o), (int64_t)n);
    assert_int_equal(df_tensor_read(ctx, o, DF_DTYPE_F32, out, n * sizeof *out), DF_OK);
    df_scope_end(ctx, mark, NULL);
    free(buf);
}

/* Offloading a compact model (its pages given back, then read again) gives the same
 * output bit for bit, and the resident weight bytes fall to zero and come back. */
static void test_compact_offload(void **state)
{
    (void)state;
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = DF_DTYPE_I8}, &ctx),
                     DF_OK);
    df_flux *m = NULL;
    assert_int_equal(
        df_flux_load_file(ctx, FLUX_CONFIG, CASES "/flux-gguf-q4_k/flux1-tiny-q4_k.gguf", &m),
        DF_OK);
    size_t n = 16 * (size_t)df_flux_config(m)->out_channels;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    forward(ctx, m, a, n);
    df_stats st;
    df_ctx_stats(ctx, &st);
    int64_t resident = st.resident_weight_bytes;
    df_weight_set *ws = df_flux_weight_set(m);
    assert_int_equal(df_ws_release(ws, NULL), DF_OK);
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, 0);
    df_ws_acquire(ws, NULL);
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, resident);
    forward(ctx, m, b, n);
    assert_memory_equal(a, b, n * sizeof *a);
    free(a);
    free(b);
    df_flux_free(m);
    df_ctx_free(ctx);
}

/* The same sweep over the component loaders: an LDM VAE (its 1x1 convolutions and up-block
 * order) and a ComfyUI fp8 CLIP-L, and the SD3 MMDiT file with its swapped halves. */
typedef df_status (*load_fn)(df_ctx *ctx, const char *dir, const char *file, void **out);
static df_status load_vae(df_ctx *c, const char *d, const char *f, void **o)
{
    return df_vae_load_file(c, d, f, (df_vae **)o);
}
static df_status load_t5(df_ctx *c, const char *d, const char *f, void **o)
{
    return df_t5_load_file(c, d, f, (df_t5 **)o);
}
static df_status load_clip(df_ctx *c, const char *d, const char *f, void **o)
{
    return df_clip_load_file(c, d, f, (df_clip **)o);
}
static df_status load_sd3(df_ctx *c, const char *d, const char *f, void **o)
{
    return df_sd3_load_file(c, d, f, (df_sd3 **)o);
}

static void sweep_component(load_fn load, void (*free_fn)(void *), const char *dir,
                            const char *file)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    void *m = NULL;
    assert_int_equal(load(ctx, dir, file, &m), DF_OK);
    free_fn(m);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        m = NULL;
        df_alloc_fail_at(nth);
        df_status s = load(ctx, dir, file, &m);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            free_fn(m);
            break;
        }
        failures++;
        if (s != DF_E_OOM)
            fail_msg("%s: allocation %lld: %s instead of DF_E_OOM: %s", file, (long long)nth,
                     df_status_name(s), df_error_message());
        assert_null(m);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(failures > 3);
    df_ctx_free(ctx);
}

static df_status load_mistral(df_ctx *c, const char *d, const char *f, void **o)
{
    return df_mistral_load_file(c, d, f, (df_decoder_lm **)o);
}
static void free_lm(void *m)
{
    df_decoder_lm_free(m);
}
static void free_vae(void *m)
{
    df_vae_free(m);
}
static void free_clip(void *m)
{
    df_clip_free(m);
}
static void free_t5(void *m)
{
    df_t5_free(m);
}
static void free_sd3(void *m)
{
    df_sd3_free(m);
}

static void test_component_load_out_of_memory_sweep(void **state)
{
    (void)state;
    sweep_component(load_vae, free_vae, DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline/vae",
                    CASES "/vae-single-flux/ae.safetensors");
    sweep_component(load_clip, free_clip, DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline/text_encoder",
                    CASES "/te-single-clip-comfy/clip_l-comfy-fp8.safetensors");
    sweep_component(load_sd3, free_sd3, DF_GOLDEN_DIR "/sd3-transformer/model",
                    CASES "/sd3-single-comfy/sd3-tiny-comfy-fp8.safetensors");
    /* llama.cpp's names (the second map tried), and sd.cpp's CLIP projection name */
    sweep_component(load_t5, free_t5, DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline/text_encoder_2",
                    CASES "/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf");
    sweep_component(load_clip, free_clip, DF_GOLDEN_DIR "/t2i-sd3/pipeline/text_encoder_2",
                    CASES "/te-gguf-clip-sdcpp/clip_g-sdcpp-q8_0.gguf");
    /* FLUX.2: BFL's ae.safetensors (nested quant convs: the first try's set is freed) and
     * a pruned ComfyUI Mistral */
    sweep_component(load_vae, free_vae, DF_GOLDEN_DIR "/vae-decode-flux2/vae",
                    CASES "/vae-single-flux2/flux2-ae.safetensors");
    sweep_component(load_mistral, free_lm, DF_GOLDEN_DIR "/t2i-flux2/pipeline/text_encoder",
                    CASES "/te-single-mistral-pruned-comfy/"
                          "mistral_3_small_flux2-tiny-pruned-fp8.safetensors");
}

/* A pruned Mistral file (layers 0-29 of 31, no final norm) gives hidden states up to 30;
 * a deeper one, or last_hidden_state, is refused naming the pruning. */
static void test_pruned_language_model(void **state)
{
    (void)state;
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_decoder_lm *m;
    assert_int_equal(df_mistral_load_file(ctx, DF_GOLDEN_DIR "/t2i-flux2/pipeline/text_encoder",
                                          CASES "/te-single-mistral-pruned-comfy/"
                                                "mistral_3_small_flux2-tiny-pruned-fp8.safetensors",
                                          &m),
                     DF_OK);
    int64_t ids[4] = {1, 40, 41, 42};
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(1, 4), ids);
    assert_non_null(t);
    df_decoder_lm_output o;
    df_decoder_lm_request ok = {.n_hidden_states = 2, .hidden_states = {10, 30}};
    assert_int_equal(df_decoder_lm_forward(ctx, m, t, NULL, &ok, &o), DF_OK);
    assert_non_null(o.hidden_states[1]);
    df_decoder_lm_request deeper = {.n_hidden_states = 1, .hidden_states = {31}};
    assert_int_equal(df_decoder_lm_forward(ctx, m, t, NULL, &deeper, &o), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "30 of the config's 31 layers"));
    assert_int_equal(df_decoder_lm_forward(ctx, m, t, NULL,
                                           &(df_decoder_lm_request){.last_hidden_state = true}, &o),
                     DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "pruned"));
    df_decoder_lm_free(m);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_map),
        cmocka_unit_test(test_bind_views_and_swaps),
        cmocka_unit_test(test_rows_that_do_not_split),
        cmocka_unit_test(test_vae_and_text_name_maps),
        cmocka_unit_test(test_vae_file_squeezes_and_prefix),
        cmocka_unit_test(test_recognise_known_models),
        cmocka_unit_test(test_clip_prefix_hint),
        cmocka_unit_test(test_t5_llamacpp_gguf),
        cmocka_unit_test(test_t5_both_layouts),
        cmocka_unit_test(test_load_out_of_memory_sweep),
        cmocka_unit_test(test_compact_residency),
        cmocka_unit_test(test_compact_offload),
        cmocka_unit_test(test_component_load_out_of_memory_sweep),
        cmocka_unit_test(test_pruned_language_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
