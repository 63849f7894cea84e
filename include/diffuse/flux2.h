/*
 * The FLUX.2 transformer (diffusers' Flux2Transformer2DModel), as used by FLUX.2-dev and
 * FLUX.2 [klein] 4B / 9B.
 *
 * Loaded from a diffusers `transformer/` folder (config.json and the safetensors weights,
 * one file or sharded) into a context; its forward is a sequence of ops on that context,
 * run at once (strict eager) or recorded (defer and fuse), and it runs compiled whole or by
 * repeated blocks like the FLUX.1 transformer (flux.h). Weights stay in the checkpoint's
 * dtype; matrix products compute in the context's compute dtype.
 *
 *     df_flux2 *m;
 *     DF_CHECK(df_flux2_load(ctx, "FLUX.2-klein-4B/transformer", &m));
 *     df_tensor *v = df_flux2_forward(ctx, m, &(df_flux2_inputs){
 *         .hidden_states = x, .encoder_hidden_states = txt, .timestep = sigma,
 *         .img_ids = img_ids, .txt_ids = txt_ids});
 *     ...
 *     df_flux2_free(m);
 */
#ifndef DIFFUSE_FLUX2_H
#define DIFFUSE_FLUX2_H

#include <stdbool.h>
#include <stdint.h>

#include "compile.h"
#include "runtime.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_flux2 df_flux2;

/* Most RoPE axes a config may list (FLUX.2 uses 4: t, h, w, l). */
#define DF_FLUX2_MAX_AXES 8

/* The values of config.json (diffusers' defaults where a key is absent), and sizes derived
 * from them. */
typedef struct df_flux2_cfg {
    int64_t patch_size;        /* only 1 is supported */
    int64_t in_channels;       /* patchified latent channels (128) */
    int64_t out_channels;      /* null in config.json: in_channels */
    int64_t num_layers;        /* double-stream blocks */
    int64_t num_single_layers; /* single-stream blocks */
    int64_t attention_head_dim;
    int64_t num_attention_heads;
    int64_t joint_attention_dim;        /* text encoder width (stacked hidden states) */
    int64_t timestep_guidance_channels; /* sinusoidal features (256) */
    double mlp_ratio;                   /* SwiGLU hidden width / inner_dim (3.0) */
    double rope_theta;                  /* 2000 */
    double eps;                         /* every LayerNorm and RMSNorm (1e-6) */
    bool guidance_embeds;               /* FLUX.2-dev: a guidance input is required */
    int n_axes;                         /* entries of axes_dims_rope (4) */
    int64_t axes_dims_rope[DF_FLUX2_MAX_AXES];
    int64_t inner_dim;      /* num_attention_heads * attention_head_dim */
    int64_t mlp_hidden_dim; /* int(inner_dim * mlp_ratio) */
} df_flux2_cfg;

/* The forward's inputs, all owned by the caller. Float tensors of any float dtype. */
typedef struct df_flux2_inputs {
    df_tensor *hidden_states;         /* [B, S_img, in_channels] patchified, packed latents */
    df_tensor *encoder_hidden_states; /* [B, S_txt, joint_attention_dim] */
    df_tensor *timestep;              /* [B] or [1]: t / 1000; the model scales by 1000 */
    df_tensor *img_ids;               /* [S_img, n_axes] or [B, S_img, n_axes] (row 0 used) */
    df_tensor *txt_ids;               /* [S_txt, n_axes] or [B, S_txt, n_axes] */
    df_tensor *guidance;              /* [B] or [1] when guidance_embeds, else NULL */
} df_flux2_inputs;

/*
 * Loads the transformer in `dir` into `ctx`; the model must be used with that context. The
 * config is checked before anything is allocated, then every weight is bound by its
 * diffusers name and shape, and a tensor the config does not call for is an error. With a
 * communicator of N > 1 ranks on the context the model loads split across them (each rank
 * reads only its slice of the split weights). On success *out is owned by the caller (free
 * with df_flux2_free, before the context). Fails with DF_E_IO (files missing), DF_E_FORMAT
 * (a bad config value, a missing, mis-shaped or unexpected tensor, a depth the weights do
 * not have), DF_E_UNSUPPORTED (patch_size != 1), DF_E_ARG (heads or widths not divisible
 * by the ranks), DF_E_OOM.
 */
DF_API df_status df_flux2_load(df_ctx *ctx, const char *dir, df_flux2 **out);
/* df_flux2_load with the weights from the single file `file` (NULL: dir's), dir/config.json
 * as the config: Black Forest Labs' FLUX.2 names (also under "model.diffusion_model.") or
 * diffusers' own; safetensors (f32, bf16, f16, fp8) or GGUF. Fused qkv split by row views,
 * the final layer's halves swapped. Fails as df_flux2_load; DF_E_UNSUPPORTED for tensor
 * parallelism. */
DF_API df_status df_flux2_load_file(df_ctx *ctx, const char *dir, const char *file,
                                    df_flux2 **out);

/* The model's configuration (borrowed, valid while the model lives). */
DF_API const df_flux2_cfg *df_flux2_config(const df_flux2 *m);

/* Bytes of weights the model holds (this rank's), in their stored dtypes. */
DF_API int64_t df_flux2_weight_bytes(const df_flux2 *m);

/*
 * Flux2Transformer2DModel.forward(...)[0]: the predicted velocity [B, S_img, out_channels]
 * (f32), owned by the current scope. Returns NULL and leaves the context failed on error:
 * DF_E_ARG for a missing input, a guidance the model has no embedder for, or a context
 * other than the model's; DF_E_SHAPE for inputs whose shapes disagree with each other or
 * the config (the message names the input).
 */
DF_API df_tensor *df_flux2_forward(df_ctx *ctx, df_flux2 *m, const df_flux2_inputs *in);

/* Sequential offload, as df_flux_set_sequential_offload: blocks resident one at a time. */
DF_API df_status df_flux2_set_sequential_offload(df_flux2 *m, bool on);

/* Compiles the repeated blocks (Flux2TransformerBlock, Flux2SingleTransformerBlock): one
 * program per block class and input shape, each block's weights as arguments. */
DF_API df_status df_flux2_compile_repeated_blocks(df_flux2 *m, const df_compile_opts *opts);
/* Programs compiled so far by df_flux2_compile_repeated_blocks (0 when not enabled). */
DF_API int df_flux2_compiled_programs(const df_flux2 *m);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_flux2_free(df_flux2 *m);

#ifdef __cplusplus
}
#endif
#endif
