/*
 * make-tiny's decoder-only text encoders: a tiny Mistral3ForConditionalGeneration
 * (FLUX.2-dev's text_encoder) and a tiny Qwen3ForCausalLM (FLUX.2 [klein]'s), each a
 * component folder with config.json and model.safetensors in exactly the layout and with
 * the names transformers' save_pretrained writes today.
 *
 * Mistral3 gets the nested text_config / vision_config of a Mistral3Config and the current
 * checkpoint prefixes (`model.language_model.`, `model.vision_tower.`,
 * `model.multi_modal_projector.`, `lm_head.`), with a one-layer Pixtral vision tower and the
 * projector (norm, patch merger, two linears), so that a loader that must skip them has
 * something to skip. Qwen3 gets `model.` and an untied lm_head (as Qwen3-8B; Qwen3-4B ties
 * it and stores none). Weights are normal draws scaled by 1/sqrt(fan_in), norms near 1.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "make_tiny_lm.h"
#include "make_tiny_writer.h"

/* `name` (printf-formatted) [rows, cols] (cols 0: a vector) of mean + std * N(0, 1). */
static void put(tiny_writer *w, int64_t rows, int64_t cols, float std, float mean,
                const char *fmt, const char *a, int i)
{
    char name[256];
    snprintf(name, sizeof name, fmt, a, i);
    if (cols)
        tw_add(w, name, SH(rows, cols), std, mean);
    else
        tw_add(w, name, SH(rows), std, mean);
}

static void linear(tiny_writer *w, int64_t out, int64_t in, const char *fmt, const char *p, int i)
{
    put(w, out, in, 1.0f / sqrtf((float)in), 0, fmt, p, i);
}

/* The language model's tensors under prefix p. */
static void language_model(tiny_writer *w, const tiny_lm_sizes *z, bool qk_norm, const char *p)
{
    int64_t d = z->hidden, f = z->intermediate, qw = z->heads * z->head_dim;
    int64_t kvw = z->kv_heads * z->head_dim;
    put(w, z->vocab, d, 1.0f, 0, "%sembed_tokens.weight", p, 0);
    put(w, d, 0, 0.05f, 1.0f, "%snorm.weight", p, 0);
    for (int i = 0; i < z->layers; i++) {
        put(w, d, 0, 0.05f, 1.0f, "%slayers.%d.input_layernorm.weight", p, i);
        put(w, d, 0, 0.05f, 1.0f, "%slayers.%d.post_attention_layernorm.weight", p, i);
        linear(w, qw, d, "%slayers.%d.self_attn.q_proj.weight", p, i);
        linear(w, kvw, d, "%slayers.%d.self_attn.k_proj.weight", p, i);
        linear(w, kvw, d, "%slayers.%d.self_attn.v_proj.weight", p, i);
        linear(w, d, qw, "%slayers.%d.self_attn.o_proj.weight", p, i);
        if (qk_norm) {
            put(w, z->head_dim, 0, 0.05f, 1.0f, "%slayers.%d.self_attn.q_norm.weight", p, i);
            put(w, z->head_dim, 0, 0.05f, 1.0f, "%slayers.%d.self_attn.k_norm.weight", p, i);
        }
        linear(w, f, d, "%slayers.%d.mlp.gate_proj.weight", p, i);
        linear(w, f, d, "%slayers.%d.mlp.up_proj.weight", p, i);
        linear(w, d, f, "%slayers.%d.mlp.down_proj.weight", p, i);
    }
}

enum { VT_D = 16, VT_FF = 32, VT_PATCH = 4, VT_MERGE = 2 };

/* A one-layer Pixtral vision tower and Mistral3's projector (never read by diffuse). */
static void vision(tiny_writer *w, const tiny_lm_sizes *z)
{
    const char *vt = "model.vision_tower.", *mp = "model.multi_modal_projector.";
    put(w, VT_D, 3 * VT_PATCH * VT_PATCH, 0.1f, 0, "%spatch_conv.weight", vt, 0);
    put(w, VT_D, 0, 0.05f, 1.0f, "%sln_pre.weight", vt, 0);
    put(w, VT_D, 0, 0.05f, 1.0f, "%stransformer.layers.%d.attention_norm.weight", vt, 0);
    put(w, VT_D, 0, 0.05f, 1.0f, "%stransformer.layers.%d.ffn_norm.weight", vt, 0);
    static const char *const attn[] = {"q", "k", "v", "o"};
    char fmt[128];
    for (int k = 0; k < 4; k++) {
        snprintf(fmt, sizeof fmt, "%%stransformer.layers.%%d.attention.%s_proj.weight", attn[k]);
        linear(w, VT_D, VT_D, fmt, vt, 0);
    }
    linear(w, VT_FF, VT_D, "%stransformer.layers.%d.feed_forward.gate_proj.weight", vt, 0);
    linear(w, VT_FF, VT_D, "%stransformer.layers.%d.feed_forward.up_proj.weight", vt, 0);
    linear(w, VT_D, VT_FF, "%stransformer.layers.%d.feed_forward.down_proj.weight", vt, 0);
    put(w, VT_D, 0, 0.05f, 1.0f, "%snorm.weight", mp, 0);
    linear(w, VT_D, VT_D * VT_MERGE * VT_MERGE, "%spatch_merger.merging_layer.weight", mp, 0);
    linear(w, z->hidden, VT_D, "%slinear_1.weight", mp, 0);
    linear(w, z->hidden, z->hidden, "%slinear_2.weight", mp, 0);
}

/* The config keys of the language model (no braces), indented by `ind`. */
static void lm_keys(char *buf, size_t cap, const tiny_lm_sizes *z, const char *ind, double theta,
                    double eps)
{
    snprintf(buf, cap,
             "%s\"head_dim\": %d,\n%s\"hidden_act\": \"silu\",\n%s\"hidden_size\": %d,\n"
             "%s\"intermediate_size\": %d,\n%s\"max_position_embeddings\": 131072,\n"
             "%s\"num_attention_heads\": %d,\n%s\"num_hidden_layers\": %d,\n"
             "%s\"num_key_value_heads\": %d,\n%s\"rms_norm_eps\": %g,\n%s\"rope_theta\": %.1f,\n"
             "%s\"vocab_size\": %d",
             ind, z->head_dim, ind, ind, z->hidden, ind, z->intermediate, ind, ind, z->heads, ind,
             z->layers, ind, z->kv_heads, ind, eps, ind, theta, ind, z->vocab);
}

static int write_component(const char *dir, const tiny_lm_sizes *z, df_dtype dtype, uint64_t seed,
                           bool mistral3)
{
    tiny_writer w;
    if (tw_begin(&w, dir, "model", dtype, NULL, seed, z->shard_bytes))
        return -1;
    const char *dt = dtype == DF_DTYPE_BF16  ? "bfloat16"
                     : dtype == DF_DTYPE_F16 ? "float16"
                                             : "float32";
    char keys[2048], cfg[4096];
    if (mistral3) {
        lm_keys(keys, sizeof keys, z, "    ", 1e9, 1e-5);
        snprintf(cfg, sizeof cfg,
                 "{\n  \"architectures\": [\"Mistral3ForConditionalGeneration\"],\n"
                 "  \"image_token_index\": 10,\n  \"model_type\": \"mistral3\",\n"
                 "  \"multimodal_projector_bias\": false,\n  \"projector_hidden_act\": \"gelu\",\n"
                 "  \"spatial_merge_size\": %d,\n  \"text_config\": {\n%s,\n"
                 "    \"model_type\": \"mistral\",\n    \"sliding_window\": null\n  },\n"
                 "  \"torch_dtype\": \"%s\",\n  \"transformers_version\": \"4.57.1\",\n"
                 "  \"vision_config\": {\n    \"head_dim\": %d,\n    \"hidden_act\": \"silu\",\n"
                 "    \"hidden_size\": %d,\n    \"image_size\": 64,\n"
                 "    \"intermediate_size\": %d,\n    \"model_type\": \"pixtral\",\n"
                 "    \"num_attention_heads\": 2,\n    \"num_channels\": 3,\n"
                 "    \"num_hidden_layers\": 1,\n    \"patch_size\": %d,\n"
                 "    \"rope_theta\": 10000.0\n  },\n  \"vision_feature_layer\": -1\n}\n",
                 VT_MERGE, keys, dt, VT_D / 2, VT_D, VT_FF, VT_PATCH);
    } else {
        lm_keys(keys, sizeof keys, z, "  ", 1e6, 1e-6);
        snprintf(cfg, sizeof cfg,
                 "{\n  \"architectures\": [\"Qwen3ForCausalLM\"],\n  \"attention_bias\": false,\n"
                 "  \"bos_token_id\": 151643,\n  \"eos_token_id\": 151645,\n%s,\n"
                 "  \"model_type\": \"qwen3\",\n  \"tie_word_embeddings\": false,\n"
                 "  \"torch_dtype\": \"%s\",\n  \"transformers_version\": \"4.57.1\",\n"
                 "  \"use_sliding_window\": false\n}\n",
                 keys, dt);
    }
    if (tw_write_file(dir, "config.json", cfg)) {
        tw_finish(&w);
        return -1;
    }
    language_model(&w, z, !mistral3, mistral3 ? "model.language_model." : "model.");
    if (mistral3)
        vision(&w, z);
    linear(&w, z->vocab, z->hidden, "%slm_head.weight", "", 0);
    return tw_finish(&w);
}

int tiny_write_mistral3(const char *dir, const tiny_lm_sizes *z, df_dtype dtype, uint64_t seed)
{
    return write_component(dir, z, dtype, seed, true);
}

int tiny_write_qwen3(const char *dir, const tiny_lm_sizes *z, df_dtype dtype, uint64_t seed)
{
    return write_component(dir, z, dtype, seed, false);
}
