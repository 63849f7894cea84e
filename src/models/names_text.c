/*
 * Text encoder names in single files. CLIP-L, CLIP-G and T5-XXL single files
 * (clip_l.safetensors, t5xxl_fp16.safetensors, ComfyUI's all-in-one files) hold
 * transformers' own names, under a prefix ("text_encoders.clip_l.transformer.",
 * "text_encoders.clip_g.transformer.", "text_encoders.t5xxl.transformer.") or none, as
 * diffusers' single-file loader reads them (it strips the prefix and loads the state dict
 * into the transformers class). Some CLIP-L files drop the "text_model." level; the bare map
 * takes it off every name but text_projection.
 *
 * OpenCLIP's own layout (transformer.resblocks.N...) is not read: such a file has no name
 * ending in either probe, and the loader says so.
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
