/*
 * CLIP text encoders: transformers' CLIPTextModel and CLIPTextModelWithProjection.
 *
 * FLUX.1 takes CLIP-L's pooled output; SD3 takes the penultimate hidden states of CLIP-L and
 * CLIP-G and the projected pooled output (text_embeds). A model is loaded from a component
 * folder (config.json + model.safetensors with transformers' tensor names); the class is the
 * checkpoint's own: a folder holding `text_projection.weight` is a
 * CLIPTextModelWithProjection and its outputs include text_embeds.
 *
 *     df_clip *clip;
 *     DF_CHECK(df_clip_load(ctx, "model/text_encoder", &clip));
 *     df_clip_output o;
 *     DF_CHECK(df_clip_encode(ctx, clip, ids,
 *                             &(df_clip_request){.hidden_states = {-2}, .n_hidden_states = 1},
 *                             &o));
 *     ... o.pooler_output [B, D], o.hidden_states[0] [B, S, D] ...
 *     df_clip_free(clip);
 *
 * Weights stay in the checkpoint's dtype (f32, bf16 or f16); activations are f32 and matrix
 * products run in the context's compute dtype.
 */
#ifndef DIFFUSE_CLIP_H
#define DIFFUSE_CLIP_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_clip df_clip;

typedef enum df_clip_act {
    DF_CLIP_ACT_GELU,       /* "gelu": exact, with erf */
    DF_CLIP_ACT_GELU_TANH,  /* "gelu_new", "gelu_pytorch_tanh" */
    DF_CLIP_ACT_QUICK_GELU, /* "quick_gelu": x * sigmoid(1.702 x) */
} df_clip_act;

/* The config.json keys the model uses, with transformers' names. */
typedef struct df_clip_config {
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t max_position_embeddings;
    int64_t vocab_size;
    int64_t projection_dim; /* width of text_embeds (projection class only) */
    int64_t eos_token_id;   /* 2 selects the legacy argmax(input_ids) pooling */
    double layer_norm_eps;
    df_clip_act hidden_act;
    bool with_projection; /* CLIPTextModelWithProjection */
} df_clip_config;

/* At most this many hidden states per request. */
#define DF_CLIP_MAX_HIDDEN 8

/* Which of transformers' `hidden_states` to return besides the usual outputs. */
typedef struct df_clip_request {
    /* Indices as in Python: 0 = the embeddings, i = the output of layer i-1, n_layers = the
     * last layer's output (before final_layer_norm); negative counts from the end, so -2 is
     * the penultimate layer's output (SD3, clip_skip). */
    int hidden_states[DF_CLIP_MAX_HIDDEN];
    int n_hidden_states;
} df_clip_request;

/* Results of df_clip_encode: tensors owned by the scope that was current at the call. */
typedef struct df_clip_output {
    df_tensor *last_hidden_state;                 /* [B, S, D], after final_layer_norm */
    df_tensor *pooler_output;                     /* [B, D], at each row's EOS position */
    df_tensor *text_embeds;                       /* [B, P]; NULL without projection */
    df_tensor *hidden_states[DF_CLIP_MAX_HIDDEN]; /* [B, S, D], in request order */
} df_clip_output;

/*
 * Loads the component folder `dir` (config.json, model.safetensors or a sharded index) on
 * ctx's device. Every weight is checked against the config, and a checkpoint tensor that
 * the model does not use is an error (`position_ids` buffers are accepted and ignored). On
 * success *out is owned by the caller (free with df_clip_free) and keeps using ctx.
 * DF_E_IO when a file cannot be read; DF_E_FORMAT for a config value that cannot be right
 * (the message names the key) or a weight that is missing, misshapen or unexpected (the
 * message names the tensor); DF_E_UNSUPPORTED for an activation diffuse does not implement.
 */
DF_API df_status df_clip_load(df_ctx *ctx, const char *dir, df_clip **out);
/* df_clip_load with the weights from the single file `file` (NULL: dir's), dir/config.json
 * as the config: transformers' names (clip_l.safetensors, with or without "text_model."),
 * also under ComfyUI's "text_encoders.clip_l.transformer." / "...clip_g.transformer.". */
DF_API df_status df_clip_load_file(df_ctx *ctx, const char *dir, const char *file,
                                   df_clip **out);

/* The model's configuration (borrowed). */
DF_API const df_clip_config *df_clip_get_config(const df_clip *m);

/*
 * Runs the text model on token ids [B, S] (an i32 or i64 tensor, S <= max_position_embeddings).
 * The pooled output is each row's EOS position, found on the device (df_token_rows;
 * eos_token_id == 2: the first largest id, as transformers' argmax; otherwise the first id
 * equal to eos_token_id, or position 0 when there is none, as argmax of an all-zero row
 * gives): the ids are never read back. `req` may be NULL (no hidden states). Attention is
 * causal; there is no padding mask (as the pipelines call CLIP).
 * On success *out holds tensors owned by the current scope; on failure it is zeroed.
 * DF_E_ARG for ids of the wrong shape or a hidden-state index out of range; otherwise the
 * context's error. An id outside the vocabulary fails the stream (DF_E_ARG at the next
 * wait: df_sync or a read, naming the id), as every check of tensor data does.
 */
DF_API df_status df_clip_encode(df_ctx *ctx, const df_clip *m, df_tensor *ids,
                                const df_clip_request *req, df_clip_output *out);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_clip_free(df_clip *m);

#ifdef __cplusplus
}
#endif
#endif
