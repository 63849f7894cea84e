/*
 * The FLUX.1 transformer (diffusers' FluxTransformer2DModel), as used by FLUX.1-schnell
 * and FLUX.1-dev.
 *
 * A model is loaded from a diffusers `transformer/` folder (config.json and the
 * safetensors weights, one file or sharded) into a context, and its forward is a sequence
 * of ops on that context: it returns at once with the output tensor while the device works
 * (strict eager), or records the ops (defer and fuse). Weights stay in the checkpoint's
 * dtype (a bf16 checkpoint stays bf16 in memory); matrix products compute in the context's
 * compute dtype.
 *
 *     df_flux *m;
 *     DF_CHECK(df_flux_load(ctx, "FLUX.1-schnell/transformer", &m));
 *     df_tensor *v = df_flux_forward(ctx, m, &(df_flux_inputs){
 *         .hidden_states = x, .encoder_hidden_states = t5, .pooled_projections = clip,
 *         .timestep = sigma, .img_ids = img_ids, .txt_ids = txt_ids});
 *     ...
 *     df_flux_free(m);
 */
#ifndef DIFFUSE_FLUX_H
#define DIFFUSE_FLUX_H

#include <stdbool.h>
#include <stdint.h>

#include "compile.h"
#include "runtime.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_flux df_flux;

/* Most RoPE axes a config may list. */
#define DF_FLUX_MAX_AXES 7

/* The values of config.json (diffusers' defaults where a key is absent), and sizes derived
 * from them. */
typedef struct df_flux_cfg {
    int64_t patch_size;        /* only 1 is supported */
    int64_t in_channels;       /* packed latent channels (64 for FLUX.1) */
    int64_t out_channels;      /* null in config.json: in_channels */
    int64_t num_layers;        /* double-stream blocks */
    int64_t num_single_layers; /* single-stream blocks */
    int64_t attention_head_dim;
    int64_t num_attention_heads;
    int64_t joint_attention_dim;   /* text encoder width (T5) */
    int64_t pooled_projection_dim; /* pooled text width (CLIP) */
    bool guidance_embeds;          /* FLUX.1-dev: a guidance input is required */
    int n_axes;                    /* entries of axes_dims_rope (3 for FLUX.1) */
    int64_t axes_dims_rope[DF_FLUX_MAX_AXES];
    int64_t inner_dim; /* num_attention_heads * attention_head_dim */
} df_flux_cfg;

/* The forward's inputs, all owned by the caller. Float tensors of any float dtype. */
typedef struct df_flux_inputs {
    df_tensor *hidden_states;         /* [B, S_img, in_channels] packed latents */
    df_tensor *encoder_hidden_states; /* [B, S_txt, joint_attention_dim] */
    df_tensor *pooled_projections;    /* [B, pooled_projection_dim] */
    df_tensor *timestep;              /* [B] or [1]: sigma (t / 1000); the model scales by 1000 */
    df_tensor *img_ids;               /* [S_img, n_axes] (rows [0, y, x]) */
    df_tensor *txt_ids;               /* [S_txt, n_axes] */
    df_tensor *guidance;              /* [B] or [1] when guidance_embeds, else NULL */
} df_flux_inputs;

/*
 * Loads the transformer in `dir` (the folder holding config.json and the weights) into
 * `ctx`; the model must be used with that context. The config is checked before anything
 * is allocated, then every weight is bound by its diffusers name and shape, and a tensor
 * the config does not call for is an error. On success *out is owned by the caller (free
 * with df_flux_free, before the context). Fails with DF_E_IO (files missing), DF_E_FORMAT
 * (a bad config value, a missing, mis-shaped or unexpected tensor, a depth the weights do
 * not have: the message names config.json and the key, or the tensor), DF_E_UNSUPPORTED
 * (patch_size != 1, a weight dtype other than f32/bf16/f16), DF_E_OOM.
 */
DF_API df_status df_flux_load(df_ctx *ctx, const char *dir, df_flux **out);

/*
 * Same with config_dir/config.json as the config and the weights of the single file `file`:
 * a .safetensors (diffusers' names, Black Forest Labs' original names as in
 * flux1-dev.safetensors, or ComfyUI's "model.diffusion_model." prefix; f32, bf16, f16 or
 * fp8 with optional scale_weight / weight_scale) or a .gguf (city96's layout; F32, F16,
 * BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K..Q6_K). Original names are mapped to diffusers' on
 * binding (fused qkv and linear1 split by row views, the final layer's shift/scale halves
 * swapped); fp8 and quantised weights are upcast block by block into the compute dtype
 * (f32 when the context computes in f32, else bf16). Fails as df_flux_load, and with
 * DF_E_UNSUPPORTED for tensor parallelism (use a diffusers folder).
 */
DF_API df_status df_flux_load_file(df_ctx *ctx, const char *config_dir, const char *file,
                                   df_flux **out);

/*
 * What a single file (.safetensors or .gguf) holds, as df_flux_load_file would read it:
 * writes one line into out (cap bytes) such as "FLUX.1 transformer in Black Forest Labs'
 * layout (prefix 'model.diffusion_model.'), dev (guidance_in), 19 double + 38 single
 * blocks", and sets *found. *found is false (and out says what is missing) when the file
 * is not a FLUX.1 transformer in the original layout. Fails as the readers' open.
 */
DF_API df_status df_flux_describe_file(const char *path, char *out, size_t cap, bool *found);

/* The model's configuration (borrowed, valid while the model lives). */
DF_API const df_flux_cfg *df_flux_config(const df_flux *m);

/* Bytes of weights the model holds, in their stored dtypes. */
DF_API int64_t df_flux_weight_bytes(const df_flux *m);

/*
 * FluxTransformer2DModel.forward(...)[0]: the predicted velocity [B, S_img, out_channels]
 * (f32), owned by the current scope. Returns NULL and leaves the context failed (see
 * df_ctx_status) on error: DF_E_ARG for a missing input or a context other than the
 * model's, DF_E_SHAPE for inputs whose shapes disagree with each other or the config (the
 * message names the input).
 */
DF_API df_tensor *df_flux_forward(df_ctx *ctx, df_flux *m, const df_flux_inputs *in);

/*
 * Sequential offload (diffusers' enable_sequential_cpu_offload): when on, every weight is
 * released now and each forward makes a block resident only while it runs (the next
 * block's pages are read ahead meanwhile), the other weights only during the forward; off
 * makes every weight resident again. The result does not change. DF_E_ARG for a NULL
 * model; a failure to release (DF_E_OOM) is returned.
 */
DF_API df_status df_flux_set_sequential_offload(df_flux *m, bool on);

/*
 * Compiles the repeated blocks (FluxTransformerBlock, FluxSingleTransformerBlock): one
 * program per block class and input shape, with each block's weights as arguments, so the
 * compile cost does not grow with depth. Works with sequential offload (weights move
 * between block calls). opts may be NULL. The model's forward uses them from then on.
 */
DF_API df_status df_flux_compile_repeated_blocks(df_flux *m, const df_compile_opts *opts);
/* Programs compiled so far by df_flux_compile_repeated_blocks (0 when not enabled). */
DF_API int df_flux_compiled_programs(const df_flux *m);

/* Frees the model and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_flux_free(df_flux *m);

#ifdef __cplusplus
}
#endif
#endif
