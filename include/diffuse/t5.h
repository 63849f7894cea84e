/*
 * The T5 encoder: transformers' T5EncoderModel, v1.1 style (FLUX.1 text_encoder_2, SD3
 * text_encoder_3).
 *
 * Gated-GELU (tanh) feed-forward, RMS layer norms, no biases, no attention scaling, and a
 * bucketed relative position bias computed by layer 0 and shared by every layer. A model
 * is loaded from a component folder (config.json + model.safetensors with transformers'
 * names; checkpoints that store only `shared.weight` for the tied embedding are fine).
 *
 *     df_t5 *t5;
 *     DF_CHECK(df_t5_load(ctx, "model/text_encoder_2", &t5));
 *     df_tensor *h;                                          [B, S, d_model]
 *     DF_CHECK(df_t5_encode(ctx, t5, ids, NULL, &h));
 *     df_t5_free(t5);
 *
 * Weights stay in the checkpoint's dtype (f32, bf16 or f16); activations are f32 and matrix
 * products run in the context's compute dtype.
 */
#ifndef DIFFUSE_T5_H
#define DIFFUSE_T5_H

#include <stdint.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_t5 df_t5;

/* The config.json keys the model uses, with transformers' names. */
typedef struct df_t5_config {
    int64_t d_model;
    int64_t d_kv; /* width of one head; num_heads * d_kv is the attention width */
    int64_t d_ff;
    int64_t num_layers;
    int64_t num_heads;
    int64_t relative_attention_num_buckets;  /* 32 */
    int64_t relative_attention_max_distance; /* 128 */
    int64_t vocab_size;
    double layer_norm_epsilon; /* 1e-6 */
} df_t5_config;

/*
 * Loads the component folder `dir` on ctx's device. Every weight is checked against the
 * config and a checkpoint tensor the encoder does not use is an error. On success *out is
 * owned by the caller (free with df_t5_free) and keeps using ctx. DF_E_IO when a file cannot
 * be read; DF_E_FORMAT for an impossible config value (the message names the key) or a
 * missing, misshapen or unexpected weight (the message names the tensor); DF_E_UNSUPPORTED
 * for a feed_forward_proj other than "gated-gelu".
 */
DF_API df_status df_t5_load(df_ctx *ctx, const char *dir, df_t5 **out);
/* df_t5_load with the weights from the single file `file` (NULL: dir's), dir/config.json
 * as the config: transformers' names (t5xxl_fp16.safetensors), also under ComfyUI's
 * "text_encoders.t5xxl.transformer.". */
DF_API df_status df_t5_load_file(df_ctx *ctx, const char *dir, const char *file, df_t5 **out);

/* The model's configuration (borrowed). */
DF_API const df_t5_config *df_t5_get_config(const df_t5 *m);

/*
 * Encodes token ids [B, S] (i32 or i64). attention_mask is NULL (every token attends to
 * every token, as FLUX and SD3 call T5) or [B, S] of 1 (keep) and 0 (padding), any numeric
 * dtype; masked keys get the most negative float added to their scores. On success *out is
 * last_hidden_state [B, S, d_model] f32, owned by the current scope. DF_E_ARG for ids or a
 * mask of the wrong shape; otherwise the context's error (an id outside the vocabulary is
 * reported when the embedding lookup runs).
 */
DF_API df_status df_t5_encode(df_ctx *ctx, const df_t5 *m, df_tensor *ids,
                              df_tensor *attention_mask, df_tensor **out);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_t5_free(df_t5 *m);

#ifdef __cplusplus
}
#endif
#endif
