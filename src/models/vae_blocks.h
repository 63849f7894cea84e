/*
 * The building blocks AutoencoderKL's encoder and decoder share (diffusers' ResnetBlock2D
 * without time embedding, the mid block's one-head Attention, GroupNorm, Conv2d): their
 * weights, bound by checkpoint name, and their forwards on the op API. vae.c builds the
 * decoder from them, vae_encoder.c the encoder.
 */
#ifndef DF_MODELS_VAE_BLOCKS_H
#define DF_MODELS_VAE_BLOCKS_H

#include <diffuse/json.h>
#include <diffuse/ops.h>
#include <diffuse/runtime.h>
#include <diffuse/vae.h>

#include "models/loader.h"

#define DF_VAE_GN_EPS 1e-6f

typedef struct df_vae_conv {
    df_tensor *w, *b; /* [O, C, k, k], [O] */
} df_vae_conv;

typedef struct df_vae_norm {
    df_tensor *w, *b; /* [C], [C] */
} df_vae_norm;

/* ResnetBlock2D without time embedding. */
typedef struct df_vae_resnet {
    df_vae_norm norm1, norm2;
    df_vae_conv conv1, conv2;
    df_vae_conv shortcut; /* w == NULL when the channel count stays */
} df_vae_resnet;

/* The mid block's Attention: one head over all C channels. */
typedef struct df_vae_attention {
    df_vae_norm group_norm;
    df_linear_weights to_q, to_k, to_v, to_out;
} df_vae_attention;

/* Reads vae/config.json into *info (AutoencoderKL or AutoencoderKLFlux2), checking it as a
 * whole; errors name the key (vae.c). */
df_status df_vae_read_config(const df_json *cfg, df_vae_info *info);

/* The VAE's weights: the folder `dir`'s, or with `file` that single file (diffusers' or the
 * original LDM names, also under ComfyUI's "vae." / "first_stage_model."), with dir's
 * config.json either way. */
df_status df_vae_open_weights(df_ctx *ctx, const char *dir, const char *file,
                              df_weight_set **out);

/* AutoencoderKLFlux2's bn.running_mean and bn.running_var [info->bn_channels], read to the
 * host once: *mean, and *std = sqrt(var + batch_norm_eps) in float32 (both df_malloc'd into
 * the model's fields, which free them, also after a failure). DF_E_FORMAT when var + eps is
 * negative, or not positive when `divides` (the encoder divides by it). `who` names the
 * model in messages ("vae", "vae encoder"). bn.num_batches_tracked is marked as unused. */
df_status df_vae_read_batch_norm(df_ctx *ctx, df_weight_set *ws, const df_vae_info *info,
                                 bool divides, const char *who, float **mean, float **std);

/* Binding "<name>.weight" / ".bias" (and a block's parts under "<prefix>.") with the
 * shapes the config implies; errors name the tensor (loader.c). */
df_status df_vae_bind_conv(df_weight_set *ws, df_vae_conv *c, int64_t out_c, int64_t in_c,
                           int64_t k, const char *name);
df_status df_vae_bind_norm(df_weight_set *ws, df_vae_norm *n, int64_t ch, const char *name);
df_status df_vae_bind_resnet(df_weight_set *ws, df_vae_resnet *r, int64_t in_c, int64_t out_c,
                             const char *prefix);
df_status df_vae_bind_attention(df_weight_set *ws, df_vae_attention *a, int64_t ch,
                                const char *prefix);

/* Conv2d with stride 1 and "same" padding (k / 2). x: [B, C, H, W] */
df_tensor *df_vae_conv_fwd(df_ctx *ctx, const df_vae_conv *c, df_tensor *x);
df_tensor *df_vae_norm_fwd(df_ctx *ctx, const df_vae_norm *n, int groups, df_tensor *x);
df_tensor *df_vae_resnet_fwd(df_ctx *ctx, const df_vae_resnet *r, int groups, df_tensor *x);
df_tensor *df_vae_attention_fwd(df_ctx *ctx, const df_vae_attention *a, int groups, df_tensor *x);

/* Ends a block of a VAE pass: releases everything made since `mark` but h and waits for
 * the block to run (see vae_blocks.c). */
df_tensor *df_vae_end_block(df_ctx *ctx, df_scope mark, df_tensor *h);
/* The checks a VAE entry point `fn` starts with: *out NULL, then DF_E_ARG unless `given`
 * (its pointer arguments are all set) and ctx is, then ctx's status. */
df_status df_vae_start(const char *fn, df_ctx *ctx, bool given, df_tensor **out);
/* The status of the work queued so far, once a pass has given up or finished: *out is
 * result on success, NULL otherwise. */
df_status df_vae_finish(df_ctx *ctx, df_tensor *result, df_tensor **out);

#endif
