/*
 * Text encoder names in single files. CLIP-L, CLIP-G and T5-XXL single files
 * (clip_l.safetensors, t5xxl_fp16.safetensors, ComfyUI's all-in-one files) hold
 * transformers' own names, under a prefix ("text_encoders.clip_l.transformer.",
 * "text_encoders.clip_g.transformer.", "text_encoders.t5xxl.transformer.") or none, as
 * diffusers' single-file loader reads them (it strips the prefix and loads the state dict
 * into the transformers class). Some CLIP-L files drop the "text_model." level; the bare map
 * takes it off every name but text_projection.
 *
 * T5 encoder GGUFs converted by llama.cpp (city96's t5-v1_1-xxl-encoder-*.gguf, and the same
 * names under stable-diffusion.cpp's "text_encoders.t5xxl.transformer." when its convert
 * copies such a file) use llama.cpp's tensor names for the t5encoder architecture (gguf-py's
 * MODEL_ARCH.T5ENCODER, which transformers' GGUF loader maps back the same way): one
 * llama.cpp tensor per transformers tensor, same shape, no fused or split rows. The
 * relative attention bias lives in block 0 only, as in transformers; the embedding is
 * token_embd (transformers' shared.weight; encoder.embed_tokens is its tied copy and has
 * no tensor of its own).
 *
 * OpenCLIP's own layout (open_clip's state dict, as SD 2.x and SDXL checkpoints and some
 * CLIP-G files hold it), read as diffusers' convert_open_clip_checkpoint reads it:
 * transformer.resblocks.N.{ln_1, ln_2, attn.out_proj, mlp.c_fc, mlp.c_proj} are the layers'
 * layer_norm1, layer_norm2, self_attn.out_proj, mlp.fc1, mlp.fc2; the fused
 * attn.in_proj_weight / in_proj_bias give q_proj, k_proj and v_proj as thirds of their rows;
 * token_embedding, positional_embedding and ln_final are the embeddings and the final norm;
 * text_projection is stored [width, projection] and is transformers' text_projection.weight
 * transposed.
 */
#include "models/names.h"

#include <stdio.h>
#include <string.h>

static bool whole(const char *name, df_name_src *out)
{
    memset(out, 0, sizeof *out);
    out->units = out->n = 1;
    out->part[0][1] = 1;
    return (size_t)snprintf(out->name, sizeof out->name, "%s", name) < sizeof out->name;
}

bool df_names_same(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    return whole(diffusers, out);
}

bool df_names_clip_bare(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    const char *level = "text_model.";
    size_t n = strlen(level);
    return whole(strncmp(diffusers, level, n) == 0 ? diffusers + n : diffusers, out);
}

const char *df_names_clip_probe(void)
{
    return "text_model.embeddings.token_embedding.weight";
}

const char *df_names_clip_bare_probe(void)
{
    return "embeddings.token_embedding.weight";
}

const char *df_names_t5_probe(void)
{
    return "encoder.block.0.layer.0.SelfAttention.q.weight";
}

/* clang-format off */
static const df_name_rule t5_llamacpp[] = {
    {"shared.weight",                                    "token_embd.weight",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.SelfAttention.q.",         "enc.blk.*.attn_q.",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.SelfAttention.k.",         "enc.blk.*.attn_k.",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.SelfAttention.v.",         "enc.blk.*.attn_v.",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.SelfAttention.o.",         "enc.blk.*.attn_o.",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.SelfAttention.relative_attention_bias.",
                                                         "enc.blk.*.attn_rel_b.",   DF_NAME_WHOLE},
    {"encoder.block.*.layer.0.layer_norm.",              "enc.blk.*.attn_norm.",    DF_NAME_WHOLE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_0.",     "enc.blk.*.ffn_gate.",     DF_NAME_WHOLE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_1.",     "enc.blk.*.ffn_up.",       DF_NAME_WHOLE},
    {"encoder.block.*.layer.1.DenseReluDense.wo.",       "enc.blk.*.ffn_down.",     DF_NAME_WHOLE},
    {"encoder.block.*.layer.1.layer_norm.",              "enc.blk.*.ffn_norm.",     DF_NAME_WHOLE},
    {"encoder.final_layer_norm.",                        "enc.output_norm.",        DF_NAME_WHOLE},
};
/* clang-format on */

bool df_names_t5_llamacpp(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    return df_names_lookup(t5_llamacpp, sizeof t5_llamacpp / sizeof *t5_llamacpp, diffusers, out);
}

const char *df_names_t5_llamacpp_probe(void)
{
    return "enc.blk.0.attn_q.weight";
}

const char *df_names_lm_probe(void)
{
    return "layers.0.post_attention_layernorm.weight";
}

const char *df_names_qwen3_probe(void)
{
    return "layers.0.self_attn.q_norm.weight";
}

const char *df_names_lm_class_prefix(int arg)
{
    static const char *const prefixes[] = {"", "model.", "model.language_model."};
    return arg >= 0 && arg < 3 ? prefixes[arg] : "";
}

bool df_names_lm(const char *diffusers, int arg, df_name_src *out)
{
    const char *prefix = df_names_lm_class_prefix(arg);
    size_t n = strlen(prefix);
    return strncmp(diffusers, prefix, n) == 0 && whole(diffusers + n, out);
}

/* clang-format off */
static const df_name_rule clip_openclip[] = {
    {"text_model.embeddings.token_embedding.weight",    "token_embedding.weight",  DF_NAME_WHOLE},
    {"text_model.embeddings.position_embedding.weight", "positional_embedding",    DF_NAME_WHOLE},
    {"text_model.final_layer_norm.",                    "ln_final.",               DF_NAME_WHOLE},
    {"text_model.encoder.layers.*.self_attn.q_proj.weight",
        "transformer.resblocks.*.attn.in_proj_weight", DF_NAME_THIRD(0)},
    {"text_model.encoder.layers.*.self_attn.k_proj.weight",
        "transformer.resblocks.*.attn.in_proj_weight", DF_NAME_THIRD(1)},
    {"text_model.encoder.layers.*.self_attn.v_proj.weight",
        "transformer.resblocks.*.attn.in_proj_weight", DF_NAME_THIRD(2)},
    {"text_model.encoder.layers.*.self_attn.q_proj.bias",
        "transformer.resblocks.*.attn.in_proj_bias", DF_NAME_THIRD(0)},
    {"text_model.encoder.layers.*.self_attn.k_proj.bias",
        "transformer.resblocks.*.attn.in_proj_bias", DF_NAME_THIRD(1)},
    {"text_model.encoder.layers.*.self_attn.v_proj.bias",
        "transformer.resblocks.*.attn.in_proj_bias", DF_NAME_THIRD(2)},
    {"text_model.encoder.layers.*.self_attn.out_proj.",
        "transformer.resblocks.*.attn.out_proj.", DF_NAME_WHOLE},
    {"text_model.encoder.layers.*.layer_norm1.", "transformer.resblocks.*.ln_1.",  DF_NAME_WHOLE},
    {"text_model.encoder.layers.*.layer_norm2.", "transformer.resblocks.*.ln_2.",  DF_NAME_WHOLE},
    {"text_model.encoder.layers.*.mlp.fc1.",
        "transformer.resblocks.*.mlp.c_fc.", DF_NAME_WHOLE},
    {"text_model.encoder.layers.*.mlp.fc2.",
        "transformer.resblocks.*.mlp.c_proj.", DF_NAME_WHOLE},
};
/* clang-format on */

bool df_names_clip_openclip(const char *diffusers, int arg, df_name_src *out)
{
    (void)arg;
    if (strcmp(diffusers, "text_projection.weight") == 0) {
        bool ok = whole("text_projection", out);
        out->transpose = true;
        return ok;
    }
    return df_names_lookup(clip_openclip, sizeof clip_openclip / sizeof *clip_openclip,
                           diffusers, out);
}

const char *df_names_clip_openclip_probe(void)
{
    return "transformer.resblocks.0.attn.in_proj_weight";
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* clang-format off */
static const df_name_rule mistral_consolidated[] = {
    {"embed_tokens.weight",                     "tok_embeddings.weight",      DF_NAME_WHOLE},
    {"norm.weight",                             "norm.weight",                DF_NAME_WHOLE},
    {"layers.*.input_layernorm.weight",         "layers.*.attention_norm.weight", DF_NAME_WHOLE},
    {"layers.*.post_attention_layernorm.weight", "layers.*.ffn_norm.weight",  DF_NAME_WHOLE},
    {"layers.*.self_attn.q_proj.weight",        "layers.*.attention.wq.weight", DF_NAME_WHOLE},
    {"layers.*.self_attn.k_proj.weight",        "layers.*.attention.wk.weight", DF_NAME_WHOLE},
    {"layers.*.self_attn.v_proj.weight",        "layers.*.attention.wv.weight", DF_NAME_WHOLE},
    {"layers.*.self_attn.o_proj.weight",        "layers.*.attention.wo.weight", DF_NAME_WHOLE},
    {"layers.*.mlp.gate_proj.weight",           "layers.*.feed_forward.w1.weight", DF_NAME_WHOLE},
    {"layers.*.mlp.down_proj.weight",           "layers.*.feed_forward.w2.weight", DF_NAME_WHOLE},
    {"layers.*.mlp.up_proj.weight",             "layers.*.feed_forward.w3.weight", DF_NAME_WHOLE},
};
/* clang-format on */

bool df_names_mistral_consolidated(const char *diffusers, int arg, df_name_src *out)
{
    const char *prefix = df_names_lm_class_prefix(arg & 15);
    size_t n = strlen(prefix);
    if (strncmp(diffusers, prefix, n) != 0 ||
        !df_names_lookup(mistral_consolidated,
                         sizeof mistral_consolidated / sizeof *mistral_consolidated,
                         diffusers + n, out))
        return false;
    /* Mistral's wq / wk keep each head's rotary pairs interleaved (rows 2i, 2i + 1); the
     * conversion's permute_for_rope puts them in halves (rows i, i + head_dim / 2). */
    if (ends_with(out->name, ".attention.wq.weight") ||
        ends_with(out->name, ".attention.wk.weight"))
        out->rope_head_dim = arg >> 4;
    return true;
}

const char *df_names_mistral_consolidated_probe(void)
{
    return "tok_embeddings.weight";
}
