/*
 * The blocks AutoencoderKL's encoder and decoder share: binding their weights and their
 * forwards (vae_blocks.h). Every GroupNorm uses eps 1e-6; a ResNet has a 1x1 conv_shortcut
 * where it changes the channel count; the attention is one head of width C over the H*W
 * positions with a residual.
 */
#include <math.h>
#include <stdio.h>

#include <diffuse/layout.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/vae_blocks.h"

/* --- weights ----------------------------------------------------------------------------- */

df_status df_vae_bind_conv(df_weight_set *ws, df_vae_conv *c, int64_t out_c, int64_t in_c,
                           int64_t k, const char *name)
{
    DF_TRY(df_ws_tensor(ws, &c->w, 4, (int64_t[]){out_c, in_c, k, k}, "%s.weight", name));
    return df_ws_tensor(ws, &c->b, 1, (int64_t[]){out_c}, "%s.bias", name);
}

df_status df_vae_bind_norm(df_weight_set *ws, df_vae_norm *n, int64_t ch, const char *name)
{
    DF_TRY(df_ws_tensor(ws, &n->w, 1, (int64_t[]){ch}, "%s.weight", name));
    return df_ws_tensor(ws, &n->b, 1, (int64_t[]){ch}, "%s.bias", name);
}

df_status df_vae_bind_resnet(df_weight_set *ws, df_vae_resnet *r, int64_t in_c, int64_t out_c,
                             const char *prefix)
{
    char name[256];
    snprintf(name, sizeof name, "%s.norm1", prefix);
    DF_TRY(df_vae_bind_norm(ws, &r->norm1, in_c, name));
    snprintf(name, sizeof name, "%s.conv1", prefix);
    DF_TRY(df_vae_bind_conv(ws, &r->conv1, out_c, in_c, 3, name));
    snprintf(name, sizeof name, "%s.norm2", prefix);
    DF_TRY(df_vae_bind_norm(ws, &r->norm2, out_c, name));
    snprintf(name, sizeof name, "%s.conv2", prefix);
    DF_TRY(df_vae_bind_conv(ws, &r->conv2, out_c, out_c, 3, name));
    if (in_c != out_c) {
        snprintf(name, sizeof name, "%s.conv_shortcut", prefix);
        DF_TRY(df_vae_bind_conv(ws, &r->shortcut, out_c, in_c, 1, name));
    }
    return DF_OK;
}

df_status df_vae_bind_attention(df_weight_set *ws, df_vae_attention *a, int64_t ch,
                                const char *prefix)
{
    char name[256];
    snprintf(name, sizeof name, "%s.group_norm", prefix);
    DF_TRY(df_vae_bind_norm(ws, &a->group_norm, ch, name));
    DF_TRY(df_ws_linear(ws, &a->to_q, ch, ch, true, "%s.to_q", prefix));
    DF_TRY(df_ws_linear(ws, &a->to_k, ch, ch, true, "%s.to_k", prefix));
    DF_TRY(df_ws_linear(ws, &a->to_v, ch, ch, true, "%s.to_v", prefix));
    return df_ws_linear(ws, &a->to_out, ch, ch, true, "%s.to_out.0", prefix);
}

/* --- forward ----------------------------------------------------------------------------- */

df_tensor *df_vae_conv_fwd(df_ctx *ctx, const df_vae_conv *c, df_tensor *x)
{
    int64_t k = df_tensor_dim(c->w, 2);
    return df_conv2d(ctx, x, c->w, c->b, 1, (int)(k / 2)); /* "same" padding: 1 for 3x3 */
}

df_tensor *df_vae_norm_fwd(df_ctx *ctx, const df_vae_norm *n, int groups, df_tensor *x)
{
    return df_group_norm(ctx, x, groups, n->w, n->b, DF_VAE_GN_EPS);
}

/* One op of a ResNet done. The block is the decoder's largest working set (at the first
 * ResNet of the last up block x is 1 GiB at 1024 x 1024 in f32). Strict eager mode
 * allocates an op's output when the op is queued, so there the ResNet ends its scope and
 * waits after each op: every activation is released once its one reader has run, and at
 * most x and two others are alive at once instead of all nine. Defer-and-fuse mode plans
 * the block's intermediates into one arena by their lifetimes already, and keeps the ops
 * in one graph so that a norm and its SiLU still fuse. */
static df_tensor *op_done(df_ctx *ctx, df_scope mark, df_tensor *h)
{
    return df_get_eager_mode(ctx) == DF_DEFER_NEVER ? df_vae_end_block(ctx, mark, h) : h;
}

/* ResnetBlock2D.forward (no temb, output_scale_factor 1). x: [B, Cin, H, W] */
df_tensor *df_vae_resnet_fwd(df_ctx *ctx, const df_vae_resnet *r, int groups, df_tensor *x)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = op_done(ctx, mark, df_vae_norm_fwd(ctx, &r->norm1, groups, x));
    h = op_done(ctx, mark, df_silu(ctx, h));
    h = op_done(ctx, mark, df_vae_conv_fwd(ctx, &r->conv1, h)); /* [B, Cout, H, W] */
    h = op_done(ctx, mark, df_vae_norm_fwd(ctx, &r->norm2, groups, h));
    h = op_done(ctx, mark, df_silu(ctx, h));
    h = op_done(ctx, mark, df_vae_conv_fwd(ctx, &r->conv2, h));
    if (r->shortcut.w)
        x = df_vae_conv_fwd(ctx, &r->shortcut, x); /* 1x1: Cin -> Cout */
    return df_scope_end(ctx, mark, df_add(ctx, x, h));
}

/* Attention with one head of width C over the H*W positions, plus the residual.
 * x: [B, C, H, W] */
df_tensor *df_vae_attention_fwd(df_ctx *ctx, const df_vae_attention *a, int groups, df_tensor *x)
{
    int64_t B = df_tensor_dim(x, 0), C = df_tensor_dim(x, 1);
    int64_t H = df_tensor_dim(x, 2), W = df_tensor_dim(x, 3);
    df_tensor *h = df_vae_norm_fwd(ctx, &a->group_norm, groups, x);
    h = df_reshape(ctx, h, DF_SHAPE(B, C, H * W));
    h = df_transpose(ctx, h, 1, 2);                                   /* [B, HW, C] */
    df_tensor *q = df_unsqueeze(ctx, df_linear(ctx, h, &a->to_q), 1); /* [B, 1, HW, C] */
    df_tensor *k = df_unsqueeze(ctx, df_linear(ctx, h, &a->to_k), 1);
    df_tensor *v = df_unsqueeze(ctx, df_linear(ctx, h, &a->to_v), 1);
    df_tensor *o = df_attention(ctx, q, k, v, NULL, false, 0.0f); /* scale 1/sqrt(C) */
    o = df_reshape(ctx, o, DF_SHAPE(B, H * W, C));
    o = df_linear(ctx, o, &a->to_out);
    o = df_transpose(ctx, o, 1, 2); /* [B, C, HW] */
    o = df_reshape(ctx, o, DF_SHAPE(B, C, H, W));
    return df_add(ctx, o, x);
}

/* Ends a block: releases everything made since `mark` but h, and waits for the block to
 * run. The decode reuses one mark for all its blocks, so each end also releases the
 * previous block's output. The wait matters in strict eager mode, which allocates each
 * op's output when the op is queued: without it the host would queue the whole decoder
 * at once and all its activations would be allocated together; with it, the memory in
 * use stays near one block's working set. */
df_tensor *df_vae_end_block(df_ctx *ctx, df_scope mark, df_tensor *h)
{
    h = df_scope_end(ctx, mark, h);
    df_sync(ctx); /* a failure stays on the context; df_vae_finish() reports it */
    return h;
}

df_status df_vae_start(const char *fn, df_ctx *ctx, bool given, df_tensor **out)
{
    *out = NULL;
    if (!ctx || !given)
        return df_errorf(DF_E_ARG, "%s: NULL argument", fn);
    return df_ctx_status(ctx);
}

/* The status of the work queued so far, once the decode has given up or finished. */
df_status df_vae_finish(df_ctx *ctx, df_tensor *result, df_tensor **out)
{
    df_status s = df_ctx_status(ctx);
    if (s == DF_OK && !result)
        s = df_errorf(DF_E_INTERNAL, "vae: an op returned no tensor without an error");
    *out = s == DF_OK ? result : NULL;
    return s;
}

df_status df_vae_read_batch_norm(df_ctx *ctx, df_weight_set *ws, const df_vae_info *info,
                                 bool divides, const char *who, float **mean, float **std)
{
    int64_t n = info->bn_channels;
    df_tensor *m, *var;
    DF_TRY(df_ws_tensor(ws, &m, 1, (int64_t[]){n}, "bn.running_mean"));
    DF_TRY(df_ws_tensor(ws, &var, 1, (int64_t[]){n}, "bn.running_var"));
    df_ws_ignore_prefix(ws, "bn.num_batches_tracked");
    *mean = df_malloc((size_t)n * sizeof **mean);
    *std = df_malloc((size_t)n * sizeof **std);
    if (!*mean || !*std)
        return df_errorf(DF_E_OOM, "%s: out of memory", who);
    DF_TRY(df_tensor_read(ctx, m, DF_DTYPE_F32, *mean, (size_t)n * sizeof(float)));
    DF_TRY(df_tensor_read(ctx, var, DF_DTYPE_F32, *std, (size_t)n * sizeof(float)));
    float eps = (float)info->batch_norm_eps;
    for (int64_t i = 0; i < n; i++) {
        float v = (*std)[i] + eps;
        if (divides ? !(v > 0.0f) : !(v >= 0.0f))
            return df_errorf(DF_E_FORMAT, "vae: bn.running_var[%lld] + batch_norm_eps is %g (%s)",
                             (long long)i, (double)v,
                             divides ? "the encoder divides by its square root"
                                     : "a variance cannot be negative");
        (*std)[i] = sqrtf(v);
    }
    return DF_OK;
}

df_status df_vae_open_weights(df_ctx *ctx, const char *dir, const char *file,
                              df_weight_set **out)
{
    if (!file)
        return df_weight_set_open(ctx, dir, "vae", out);
    /* LDM numbers the up blocks from the bottom: the map needs how many there are. */
    df_json *cfg;
    df_vae_info info;
    DF_TRY(df_layout_open_config(dir, &cfg));
    df_status s = df_vae_read_config(cfg, &info);
    df_json_free(cfg);
    DF_TRY(s);
    /* BFL's FLUX.2 ae.safetensors nests the quant convolutions in their halves; other files
     * (ComfyUI's re-saved ones, SD's VAEs) keep them at the top. */
    int arg = info.n_blocks;
    if (info.flux2 && info.use_post_quant_conv) {
        DF_TRY(df_weight_set_open_single(ctx, dir, file, "vae", df_names_vae_ldm,
                                         arg | DF_NAMES_VAE_NESTED_QUANT, df_names_vae_probe(),
                                         out));
        if (df_ws_has(*out, "post_quant_conv.weight"))
            return DF_OK;
        df_weight_set_free(*out);
        *out = NULL;
    }
    DF_TRY(df_weight_set_open_single(ctx, dir, file, "vae", df_names_vae_ldm, arg,
                                     df_names_vae_probe(), out));
    /* Not the LDM layout: diffusers' names, maybe under a prefix. */
    df_ws_try_map(*out, df_names_same, 0, df_names_diffusers_vae_probe(), NULL);
    return DF_OK;
}
