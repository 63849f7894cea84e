/*
 * Qwen3 as a text encoder: transformers' Qwen3Model and Qwen3ForCausalLM (FLUX.2 [klein]'s
 * text_encoder). Mistral's architecture plus an RMS norm of each head of q and k before RoPE.
 *
 *     df_decoder_lm *te;
 *     DF_CHECK(df_qwen3_load(ctx, "FLUX.2-klein-4B/text_encoder", &te));
 *     df_tensor *emb;                                               [B, S, 3 * 2560]
 *     DF_CHECK(df_decoder_lm_stacked(ctx, te, ids, mask, DF_QWEN3_KLEIN_LAYERS, 3, &emb));
 *
 * The model runs through decoder_lm.h. lm_head (absent when tied) is not needed and is
 * skipped without reading its bytes.
 */
#ifndef DIFFUSE_QWEN3_H
#define DIFFUSE_QWEN3_H

#include "decoder_lm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Flux2KleinPipeline's hidden_states_layers (_get_qwen3_prompt_embeds). */
#define DF_QWEN3_KLEIN_LAYERS ((const int[]){9, 18, 27})

/*
 * Loads the component folder `dir` (config.json + model.safetensors or a sharded index):
 * Qwen3Config, names `layers.N...` (Qwen3Model) or `model.layers.N...` (Qwen3ForCausalLM).
 * Ownership and errors as df_mistral_load (mistral.h); DF_E_UNSUPPORTED also for
 * use_sliding_window true.
 */
DF_API df_status df_qwen3_load(df_ctx *ctx, const char *dir, df_decoder_lm **out);

/* The same with the weights from one file (ComfyUI's qwen_3_4b.safetensors: "model.", with
 * lm_head.weight beside it; its all-in-one files: "text_encoders.qwen3_4b.transformer.model."),
 * read as df_mistral_load_file reads a file. */
DF_API df_status df_qwen3_load_file(df_ctx *ctx, const char *dir, const char *file,
                                    df_decoder_lm **out);

#ifdef __cplusplus
}
#endif
#endif
