/*
 * Pieces shared by the diffusion transformers (FLUX.1, SD3, FLUX.2): the conditioning
 * embeddings and the adaptive layer norms, written once as diffusers writes them.
 *
 *   df_emb_mlp            TimestepEmbedding / PixArtAlphaTextProjection: linear, SiLU, linear
 *   df_emb_timestep       Timesteps(256, flip_sin_to_cos) then that MLP
 *   df_emb_modulation     the linear(silu(cond)) of AdaLayerNormZero(/Single/Continuous),
 *                         split into n vectors [B, 1, D]
 *   df_emb_modulate       LayerNorm without affine, then x * (1 + scale) + shift
 *   df_emb_ada_norm_continuous   AdaLayerNormContinuous (chunks in (scale, shift) order)
 *   df_emb_rope_table     RoPE cos/sin table of the joint sequence from txt and img ids
 *   df_emb_check_input    the forward's check of one input's rank, sizes and dtype
 *
 * All of them call the op API only; failures leave the context failed and return NULL
 * like any op.
 */
#ifndef DF_MODELS_EMBEDDINGS_H
#define DF_MODELS_EMBEDDINGS_H

#include <stdbool.h>

#include <diffuse/ops.h>

#include "models/loader.h"

/* Two linear layers with a SiLU between them. */
typedef struct df_emb_mlp {
    df_linear_weights linear_1; /* [hidden, in] */
    df_linear_weights linear_2; /* [out, hidden] */
} df_emb_mlp;

/* Binds "<prefix>.linear_1" [hidden, in] and "<prefix>.linear_2" [out, hidden]. */
df_status df_emb_mlp_bind(df_weight_set *ws, df_emb_mlp *out, int64_t in, int64_t hidden,
                          int64_t out_f, bool bias, const char *prefix);

/* linear_2(silu(linear_1(x))). x [..., in] -> [..., out]. */
df_tensor *df_emb_mlp_forward(df_ctx *ctx, const df_emb_mlp *mlp, df_tensor *x);

/* The sinusoidal features of diffusers' Timesteps(dim, flip_sin_to_cos=True,
 * downscale_freq_shift=0) of (scale * t), in f32, then the MLP. t [B] -> [B, out]. */
df_tensor *df_emb_timestep(df_ctx *ctx, const df_emb_mlp *mlp, df_tensor *t, int dim, float scale);

/* out[i] = chunk i of n of linear(silu(cond)) [B, n*D], each seen as [B, 1, D] so that it
 * broadcasts over the sequence. out must have room for n tensors; all NULL on failure. */
void df_emb_modulation(df_ctx *ctx, const df_linear_weights *linear, df_tensor *cond, int n,
                       df_tensor **out);

/* LayerNorm(x) without affine weights (eps), then * (1 + scale) + shift.
 * x [B, S, D], shift and scale [B, 1, D] -> [B, S, D]. */
df_tensor *df_emb_modulate(df_ctx *ctx, df_tensor *x, df_tensor *shift, df_tensor *scale,
                           float eps);

/* AdaLayerNormContinuous with elementwise_affine=False: linear(silu(cond)) split into
 * (scale, shift), then df_emb_modulate. x [B, S, D], cond [B, C] -> [B, S, D]. */
df_tensor *df_emb_ada_norm_continuous(df_ctx *ctx, const df_linear_weights *linear, df_tensor *x,
                                      df_tensor *cond, float eps);

/* The RoPE table of the joint sequence [text, image]: ids = cat(txt_ids, img_ids) [S, A]
 * (A = n_axes, at most DF_EMB_MAX_AXES; ids of another float or integer dtype are fine, two
 * different dtypes are both read as f64), then df_rope_table: [S_txt + S_img,
 * sum(axes_dim)/2, 2]. axes_dim: the config's axes_dims_rope. */
#define DF_EMB_MAX_AXES 16
df_tensor *df_emb_rope_table(df_ctx *ctx, df_tensor *txt_ids, df_tensor *img_ids,
                             const int64_t *axes_dim, int n_axes, double theta);

/* DF_OK when `t` has `ndim` dimensions of sizes `want` (-1: any positive size) and a float
 * dtype (or an integer one when `ids`); else DF_E_ARG (missing) or DF_E_SHAPE with a message
 * "<model> forward: input '<name>' is <found>; expected <shape> <dtype>". */
df_status df_emb_check_input(const char *model, const char *name, const df_tensor *t, int ndim,
                             const int64_t *want, bool ids);

#endif
