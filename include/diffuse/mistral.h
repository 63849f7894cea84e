/*
 * Mistral as a text encoder: transformers' MistralModel, MistralForCausalLM and the language
 * model of Mistral3ForConditionalGeneration (FLUX.2-dev's text_encoder, Mistral Small 3.x).
 *
 *     df_decoder_lm *te;
 *     DF_CHECK(df_mistral_load(ctx, "FLUX.2-dev/text_encoder", &te));
 *     df_tensor *emb;                                               [B, S, 3 * 5120]
 *     DF_CHECK(df_decoder_lm_stacked(ctx, te, ids, mask, DF_MISTRAL_FLUX2_LAYERS, 3, &emb));
 *
 * The model runs through decoder_lm.h. A Mistral3 checkpoint's vision tower, multimodal
 * projector and lm_head are not needed for text-to-image: they are skipped without reading
 * their bytes (df_mistral_skips_tensor names them, for `diffuse inspect`).
 */
#ifndef DIFFUSE_MISTRAL_H
#define DIFFUSE_MISTRAL_H

#include <stdbool.h>

#include "decoder_lm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flux2Pipeline's hidden_states_layers (_get_mistral_3_small_prompt_embeds). */
#define DF_MISTRAL_FLUX2_LAYERS ((const int[]){10, 20, 30})

/*
 * Loads the component folder `dir` (config.json + model.safetensors or a sharded index) on
 * ctx's device. The config is MistralConfig, or Mistral3Config whose text_config is read.
 * Checkpoint names are transformers' own in every layout it has saved: `layers.N...`
 * (MistralModel), `model.layers.N...` (MistralForCausalLM), `model.language_model.layers.N...`
 * (Mistral3, transformers >= 4.52) and `language_model.model.layers.N...` (Mistral3, before).
 * Every language-model weight is checked against the config; any other tensor than the
 * skipped ones is an error. On success *out is owned by the caller (df_decoder_lm_free) and
 * keeps using ctx. DF_E_IO when a file cannot be read; DF_E_FORMAT for an impossible config
 * value (the message names the key) or a missing, misshapen or unexpected weight (the
 * message names the tensor); DF_E_UNSUPPORTED for a RoPE scaling other than the default, or
 * a hidden_act other than silu; DF_E_ARG when the heads, KV heads or intermediate size do
 * not divide by the context's tensor-parallel ranks.
 */
DF_API df_status df_mistral_load(df_ctx *ctx, const char *dir, df_decoder_lm **out);

/*
 * The same with the weights from one file (.safetensors or .gguf) and the config from
 * `dir`/config.json: transformers' names under whatever precedes `embed_tokens.weight`
 * (ComfyUI's mistral_3_small_flux2_*.safetensors: "model."; its all-in-one files:
 * "text_encoders.mistral3_24b.transformer.model."; transformers' own prefixes). Tensors
 * outside that prefix (the vision tower, the projector, ComfyUI's tekken_model) are not
 * read. A file that ends after some layer without the final norm (ComfyUI's pruned FLUX.2
 * Mistral) binds the layers it holds; a forward asking for a deeper hidden state, or for
 * last_hidden_state, is then DF_E_UNSUPPORTED. file NULL is df_mistral_load. Errors as
 * df_mistral_load.
 */
DF_API df_status df_mistral_load_file(df_ctx *ctx, const char *dir, const char *file,
                                      df_decoder_lm **out);

/* Whether a Mistral3ForConditionalGeneration checkpoint tensor is one the text encoder
 * skips (vision tower, multimodal projector, lm_head). */
DF_API bool df_mistral_skips_tensor(const char *name);

#ifdef __cplusplus
}
#endif
#endif
