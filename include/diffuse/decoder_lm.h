/*
 * Decoder-only language models used as text encoders: the layers FLUX.2 reads its prompt
 * embeddings from (mistral.h: Mistral / the language model of Mistral3; qwen3.h: Qwen3).
 *
 * transformers' MistralModel / Qwen3Model forward with output_hidden_states: embedding
 * lookup, then per layer RMS norm, grouped-query self-attention (RoPE, causal, padding
 * mask), residual, RMS norm, SwiGLU MLP, residual; a final RMS norm. Qwen3 adds a per-head
 * RMS norm of q and k before RoPE. A model is loaded by mistral.h / qwen3.h and used here:
 *
 *     df_decoder_lm *te;
 *     DF_CHECK(df_mistral_load(ctx, "FLUX.2-dev/text_encoder", &te));
 *     df_tensor *emb;                                             [B, S, 3 * hidden_size]
 *     DF_CHECK(df_decoder_lm_stacked(ctx, te, ids, mask, DF_MISTRAL_FLUX2_LAYERS, 3, &emb));
 *     df_decoder_lm_free(te);
 *
 * Hidden-state indices are transformers': hidden_states[0] is the embedding output,
 * hidden_states[k] the output of decoder layer k, and hidden_states[num_hidden_layers] the
 * output after the final norm. Only the layers up to the last one asked for run: FLUX.2-dev
 * (layers 10, 20, 30 of 40) and klein (9, 18, 27 of 36) skip the rest and the final norm.
 *
 * Weights stay in the checkpoint's dtype (f32, bf16 or f16); activations are f32 and matrix
 * products run in the context's compute dtype. With a communicator of N > 1 ranks on the
 * context, the model loads split over the ranks (heads, KV heads and MLP widths; see
 * decoder_lm.c) and every rank gets the full hidden states.
 */
#ifndef DIFFUSE_DECODER_LM_H
#define DIFFUSE_DECODER_LM_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_decoder_lm df_decoder_lm;

/* The config.json keys the model uses, with transformers' names (for Mistral3, those of
 * its text_config). */
typedef struct df_decoder_lm_config {
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads; /* GQA: each KV head serves heads / kv_heads query heads */
    int64_t head_dim;            /* may differ from hidden_size / num_attention_heads */
    int64_t vocab_size;
    double rms_norm_eps;
    double rope_theta;
    bool attention_bias; /* Qwen3's q, k, v, o biases (false in every released model) */
    bool qk_norm;        /* Qwen3: RMS norm of each head of q and k */
} df_decoder_lm_config;

#define DF_DECODER_LM_MAX_OUTPUTS 8

/* What df_decoder_lm_forward returns. */
typedef struct df_decoder_lm_request {
    int hidden_states[DF_DECODER_LM_MAX_OUTPUTS]; /* indices as above; negative from the end */
    int n_hidden_states;
    bool last_hidden_state; /* after the final norm (runs every layer) */
} df_decoder_lm_request;

typedef struct df_decoder_lm_output {
    df_tensor *hidden_states[DF_DECODER_LM_MAX_OUTPUTS]; /* [B, S, hidden_size] each */
    df_tensor *last_hidden_state;                        /* [B, S, hidden_size] or NULL */
} df_decoder_lm_output;

/* The model's configuration (borrowed). */
DF_API const df_decoder_lm_config *df_decoder_lm_get_config(const df_decoder_lm *m);

/*
 * Runs token ids [B, S] (i32 or i64) with attention_mask NULL (every position real) or
 * [B, S] of 1 (token) and 0 (padding), any numeric dtype, padding on either side. Positions
 * are 0..S-1 in every row, as transformers numbers them when the pipelines pass no
 * position ids. Attention is causal; a padded key gets the most negative float added to its
 * score, as transformers' eager and CPU SDPA attention do, so a query that sees no real key
 * (left padding) averages the values of all S keys. On success *out holds f32 tensors owned
 * by the current scope. DF_E_ARG for inputs of the wrong shape or an index outside
 * [-(num_hidden_layers + 1), num_hidden_layers]; otherwise the context's error (an id outside
 * the vocabulary is reported when the embedding lookup runs).
 */
DF_API df_status df_decoder_lm_forward(df_ctx *ctx, const df_decoder_lm *m, df_tensor *ids,
                                       df_tensor *attention_mask, const df_decoder_lm_request *req,
                                       df_decoder_lm_output *out);

/*
 * The FLUX.2 prompt embeddings: hidden_states[layers[i]] for i < n (1 <= n <= 8), stacked
 * per token: torch.stack(hs, 1).permute(0, 2, 1, 3).reshape(B, S, n * hidden_size), i.e.
 * [B, S, n * hidden_size] with layer i's state in columns [i * hidden_size, ...). Errors as
 * for df_decoder_lm_forward.
 */
DF_API df_status df_decoder_lm_stacked(df_ctx *ctx, const df_decoder_lm *m, df_tensor *ids,
                                       df_tensor *attention_mask, const int *layers, int n,
                                       df_tensor **out);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_decoder_lm_free(df_decoder_lm *m);

#ifdef __cplusplus
}
#endif
#endif
