/*
 * The Stable Diffusion 3 / 3.5 transformer (diffusers' SD3Transformer2DModel, the MMDiT).
 *
 * A model is loaded from a diffusers `transformer/` folder (config.json and the safetensors
 * weights, one file or sharded) into a context; its forward is a sequence of ops on that
 * context and returns at once with the output tensor while the device works (strict
 * eager), or records the ops (defer and fuse). Weights stay in the checkpoint's dtype;
 * matrix products compute in the context's compute dtype.
 *
 *     df_sd3 *m;
 *     DF_CHECK(df_sd3_load(ctx, "stable-diffusion-3.5-medium/transformer", &m));
 *     df_tensor *v = df_sd3_forward(ctx, m, &(df_sd3_inputs){
 *         .hidden_states = latents, .encoder_hidden_states = text, .pooled_projections = pooled,
 *         .timestep = t});
 *     ...
 *     df_sd3_free(m);
 *
 * Skip-layer guidance runs the same forward with some blocks left out (skip_layers).
 */
#ifndef DIFFUSE_SD3_H
#define DIFFUSE_SD3_H

#include <stdbool.h>
#include <stdint.h>

#include "compile.h"
#include "runtime.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_sd3 df_sd3;

/* Most entries dual_attention_layers may list. */
#define DF_SD3_MAX_DUAL 256

typedef enum df_sd3_qk_norm {
    DF_SD3_QK_NORM_NONE, /* qk_norm null (SD3-medium) */
    DF_SD3_QK_NORM_RMS,  /* "rms_norm" (SD3.5): per-head RMSNorm with weights, eps 1e-6 */
} df_sd3_qk_norm;

/* The values of config.json (diffusers' defaults where a key is absent), and sizes derived
 * from them. */
typedef struct df_sd3_cfg {
    int64_t sample_size; /* default latent side: the pipeline's default size / 8 */
    int64_t patch_size;
    int64_t in_channels;  /* latent channels (16) */
    int64_t out_channels; /* null in config.json: in_channels */
    int64_t num_layers;   /* joint transformer blocks; the last is context_pre_only */
    int64_t attention_head_dim;
    int64_t num_attention_heads;
    int64_t joint_attention_dim;    /* prompt embedding width (T5 d_model) */
    int64_t caption_projection_dim; /* context_embedder output; must equal inner_dim */
    int64_t pooled_projection_dim;  /* CLIP-L + CLIP-G pooled widths */
    int64_t pos_embed_max_size;     /* side of the stored sin-cos position grid */
    int n_dual_attention_layers;    /* SD3.5: blocks with the extra image self-attention */
    int64_t dual_attention_layers[DF_SD3_MAX_DUAL];
    df_sd3_qk_norm qk_norm;
    int64_t inner_dim; /* num_attention_heads * attention_head_dim */
} df_sd3_cfg;

/* The forward's inputs, all owned by the caller. Float tensors of any float dtype. */
typedef struct df_sd3_inputs {
    df_tensor *hidden_states;         /* [B, in_channels, H, W] latents (no packing) */
    df_tensor *encoder_hidden_states; /* [B, S_txt, joint_attention_dim] */
    df_tensor *pooled_projections;    /* [B, pooled_projection_dim] */
    df_tensor *timestep;              /* [B] or [1]: the scheduler timestep in [0, 1000] */
    const int *skip_layers;           /* block indices to leave out (skip-layer guidance) */
    int n_skip_layers;                /* 0: run every block */
} df_sd3_inputs;

/*
 * Loads the transformer in `dir` (the folder holding config.json and the weights) into
 * `ctx`; the model must be used with that context. The config is checked before anything
 * is allocated, then every weight is bound by its diffusers name and shape, and a tensor
 * the config does not call for is an error. On success *out is owned by the caller (free
 * with df_sd3_free, before the context). Fails with DF_E_IO (files missing), DF_E_FORMAT
 * (a bad config value, a missing, mis-shaped or unexpected tensor, a depth the weights do
 * not have: the message names config.json and the key, or the tensor), DF_E_UNSUPPORTED
 * (pos_embed_max_size null, a qk_norm other than null / "rms_norm", a weight dtype other
 * than f32/bf16/f16), DF_E_OOM.
 */
DF_API df_status df_sd3_load(df_ctx *ctx, const char *dir, df_sd3 **out);
/* df_sd3_load with the weights from the single file `file` (NULL: dir's), dir/config.json as
 * the config: Stability AI's original MMDiT names (joint_blocks.N.x_block / context_block,
 * also under ComfyUI's "model.diffusion_model."), or diffusers' own; safetensors (f32, bf16,
 * f16, fp8) or GGUF. Fused qkv tensors are split by row views, the last block's context
 * modulation and the final layer's halves swapped. Fails as df_sd3_load. */
DF_API df_status df_sd3_load_file(df_ctx *ctx, const char *dir, const char *file,
                                  df_sd3 **out);

/* The model's configuration (borrowed, valid while the model lives). */
DF_API const df_sd3_cfg *df_sd3_config(const df_sd3 *m);

/* Bytes of weights the model holds, in their stored dtypes. */
DF_API int64_t df_sd3_weight_bytes(const df_sd3 *m);

/*
 * SD3Transformer2DModel.forward(..., skip_layers=...)[0]: the predicted velocity
 * [B, out_channels, H, W] (f32), owned by the current scope. H and W must be multiples of
 * patch_size with H/patch_size and W/patch_size at most pos_embed_max_size. Returns NULL
 * and leaves the context failed (see df_ctx_status) on error: DF_E_ARG for a missing
 * input, a skip layer outside [0, num_layers) or a context other than the model's,
 * DF_E_SHAPE for inputs whose shapes disagree with each other or the config (the message
 * names the input).
 */
DF_API df_tensor *df_sd3_forward(df_ctx *ctx, df_sd3 *m, const df_sd3_inputs *in);

/*
 * Compiles the repeated blocks (JointTransformerBlock): one program per block variant
 * (with or without dual attention, context_pre_only or not) and input shape, with each
 * block's weights as arguments, so the compile cost does not grow with depth. opts may be
 * NULL. The model's forward uses them from then on (skip layers included).
 */
DF_API df_status df_sd3_compile_repeated_blocks(df_sd3 *m, const df_compile_opts *opts);
/* Programs compiled so far by df_sd3_compile_repeated_blocks (0 when not enabled). */
DF_API int df_sd3_compiled_programs(const df_sd3 *m);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_sd3_free(df_sd3 *m);

#ifdef __cplusplus
}
#endif
#endif
