/*
 * The SD3 / SD3.5 transformer: diffusers' SD3Transformer2DModel (0.37), on the op API.
 *
 * Loading (the transformer base, transformer_base.h) reads config.json with diffusers' defaults
 * for absent keys and rejects values it cannot run before any weight is opened; then every weight
 * is bound by its diffusers name and expected shape through a weight set (loader.h), which keeps
 * the checkpoint's dtype and reports a missing, mis-shaped or unexpected tensor by name.
 *
 * The forward reads like SD3Transformer2DModel.forward:
 * - PatchEmbed: a conv with kernel = stride = patch_size, flattened to tokens (row-major
 *   over the patch grid), plus the stored sin-cos `pos_embed` buffer cropped at the centre
 *   of its pos_embed_max_size^2 grid. A config without pos_embed_max_size (no stored
 *   buffer) is refused: every SD3 / SD3.5 checkpoint has one.
 * - temb = TimestepEmbedding(Timesteps(256, flip_sin_to_cos, shift 0)(t)) +
 *   PixArtAlphaTextProjection(pooled); t is the scheduler timestep, not scaled.
 * - JointTransformerBlock: AdaLayerNormZero on both streams (six chunks: shift, scale,
 *   gate for attention, then for the MLP); the SD3.5 dual-attention blocks
 *   (SD35AdaLayerNormZeroX) have nine, the last three modulating the same LayerNorm output
 *   a second time for `attn2`, a plain self-attention over the image tokens whose gated
 *   output is added after the joint attention's. The joint attention runs over
 *   [image, text] (diffusers' order) with optional per-head RMS norms on q and k. The last
 *   block is context_pre_only: its context norm is AdaLayerNormContinuous and it has
 *   neither to_add_out nor a context MLP, so the text stream ends there.
 * - norm_out (AdaLayerNormContinuous, chunks (scale, shift)), proj_out, then unpatchify:
 *   token (y, x) channel (p, q, c) goes to pixel (c, y*P + p, x*P + q).
 * Skip-layer guidance leaves the listed blocks out, as diffusers' `skip_layers` does.
 * Compiled repeated blocks compile one program per block variant (dual attention or not,
 * context_pre_only or not: the weights and outputs differ), with the block's weights as
 * arguments, so all same-variant blocks share it.
 * Block outputs are kept with one fixed scope mark per block loop, so each block's end also
 * releases the previous block's outputs: eager memory stays one block's working set.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/compile.h>
#include <diffuse/sd3.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/blocks.h"
#include "models/embeddings.h"
#include "models/loader.h"
#include "models/model_config.h"
#include "models/weight_sets.h"
#include "models/transformer_base.h"

#define SD3_EPS           1e-6f              /* every LayerNorm and RMSNorm of the model */
#define SD3_TIME_CHANNELS 256                /* sinusoidal timestep features */
#define SD3_MAX_SIZE      (INT64_C(1) << 24) /* larger config sizes are refused as implausible */

/* JointTransformerBlock. */
typedef struct joint_block {
    bool dual;                               /* SD3.5 dual attention (attn2, nine-chunk norm1) */
    bool pre_only;                           /* context_pre_only: the last block */
    df_linear_weights norm1;                 /* [6D or 9D, D] */
    df_linear_weights norm1_context;         /* [6D, D], or [2D, D] when pre_only */
    df_qkv_weights img, txt;                 /* attn.to_*, attn.add_*_proj */
    df_linear_weights to_out;                /* attn.to_out.0 [D, D] */
    df_linear_weights to_add_out;            /* [D, D]; absent when pre_only */
    df_qkv_weights img2;                     /* attn2.to_* when dual */
    df_linear_weights to_out2;               /* attn2.to_out.0 */
    df_linear_weights ff_in, ff_out;         /* [4D, D], [D, 4D] */
    df_linear_weights ff_ctx_in, ff_ctx_out; /* absent when pre_only */
} joint_block;

struct df_sd3 {
    /* Context, weights and the repeated blocks, one class per variant (see variant()):
     * compiled per class (blocks.h). */
    df_transformer t;
    df_sd3_cfg cfg;
    df_tensor *proj_w, *proj_b; /* pos_embed.proj [D, C, P, P], [D] */
    df_tensor *pos_embed;       /* [1, M*M, D] */
    df_emb_mlp time_embedder, text_embedder;
    df_linear_weights context_embedder; /* [D, joint] */
    joint_block *blocks;
    df_linear_weights norm_out, proj_out; /* [2D, D], [P*P*out, D] */
};

/* Sizes of one forward call. */
typedef struct dims {
    int64_t B, h, w; /* batch, patch grid */
    int64_t s_img, s_txt, S, D, H;
} dims;

/* --- config ------------------------------------------------------------------------------ */

static df_status get_size(const df_json *cfg, const char *key, int64_t dflt, int64_t min,
                          int64_t *out)
{
    return df_config_size(cfg, key, dflt, min, SD3_MAX_SIZE, out);
}

static df_status check_config(const df_json *cfg, df_sd3_cfg *c)
{
    const char *src = df_json_source(cfg);
    DF_TRY(df_config_class(cfg, "SD3Transformer2DModel"));

    DF_TRY(get_size(cfg, "sample_size", 128, 1, &c->sample_size));
    DF_TRY(get_size(cfg, "patch_size", 2, 1, &c->patch_size));
    DF_TRY(get_size(cfg, "in_channels", 16, 1, &c->in_channels));
    /* diffusers: `out_channels: int = 16`, then `out_channels or in_channels` for null */
    int64_t out_default = df_json_get(cfg, "out_channels") ? c->in_channels : 16;
    DF_TRY(get_size(cfg, "out_channels", out_default, 1, &c->out_channels));
    DF_TRY(get_size(cfg, "num_layers", 18, 0, &c->num_layers));
    DF_TRY(get_size(cfg, "attention_head_dim", 64, 1, &c->attention_head_dim));
    DF_TRY(get_size(cfg, "num_attention_heads", 18, 1, &c->num_attention_heads));
    DF_TRY(get_size(cfg, "joint_attention_dim", 4096, 1, &c->joint_attention_dim));
    DF_TRY(get_size(cfg, "caption_projection_dim", 1152, 1, &c->caption_projection_dim));
    DF_TRY(get_size(cfg, "pooled_projection_dim", 2048, 1, &c->pooled_projection_dim));
    const df_json *pm = df_json_get(cfg, "pos_embed_max_size");
    if (pm && df_json_is_null(pm))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key 'pos_embed_max_size' is null; only models "
                         "with a stored position grid (pos_embed_max_size set, as in every "
                         "SD3 / SD3.5 checkpoint) are supported",
                         src);
    DF_TRY(get_size(cfg, "pos_embed_max_size", 96, 1, &c->pos_embed_max_size));
    c->inner_dim = c->num_attention_heads * c->attention_head_dim;
    if (c->inner_dim > SD3_MAX_SIZE)
        return df_errorf(DF_E_FORMAT,
                         "%s: num_attention_heads * attention_head_dim = %lld is "
                         "implausibly large",
                         src, (long long)c->inner_dim);
    if (c->caption_projection_dim != c->inner_dim)
        return df_errorf(DF_E_FORMAT,
                         "%s: key 'caption_projection_dim' is %lld but the blocks "
                         "are num_attention_heads * attention_head_dim = %lld wide; the text "
                         "stream must have the blocks' width",
                         src, (long long)c->caption_projection_dim, (long long)c->inner_dim);

    c->n_dual_attention_layers = 0;
    if (!df_json_is_null(df_json_get(cfg, "dual_attention_layers"))) {
        int64_t n = 0;
        DF_TRY(df_json_get_int_array(cfg, "dual_attention_layers", c->dual_attention_layers,
                                     DF_SD3_MAX_DUAL, &n));
        for (int64_t i = 0; i < n; i++)
            if (c->dual_attention_layers[i] < 0 || c->dual_attention_layers[i] >= c->num_layers)
                return df_errorf(DF_E_FORMAT,
                                 "%s: key 'dual_attention_layers[%lld]' is %lld; "
                                 "expected a block index in [0, %lld) (num_layers)",
                                 src, (long long)i, (long long)c->dual_attention_layers[i],
                                 (long long)c->num_layers);
        c->n_dual_attention_layers = (int)n;
    }

    const char *qk = NULL;
    DF_TRY(df_json_get_string_or(cfg, "qk_norm", NULL, &qk));
    if (!qk)
        c->qk_norm = DF_SD3_QK_NORM_NONE;
    else if (strcmp(qk, "rms_norm") == 0)
        c->qk_norm = DF_SD3_QK_NORM_RMS;
    else
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key 'qk_norm' is '%s'; supported: null, "
                         "\"rms_norm\"",
                         src, qk);
    return DF_OK;
}

static df_status configure(void *model, const df_json *cfg)
{
    df_sd3 *m = model;
    return check_config(cfg, &m->cfg);
}

static bool is_dual(const df_sd3_cfg *c, int64_t layer)
{
    for (int i = 0; i < c->n_dual_attention_layers; i++)
        if (c->dual_attention_layers[i] == layer)
            return true;
    return false;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_block(df_weight_set *ws, const df_sd3_cfg *c, joint_block *b, int i)
{
    int64_t D = c->inner_dim, Dh = c->attention_head_dim;
    bool qk = c->qk_norm == DF_SD3_QK_NORM_RMS;
    b->dual = is_dual(c, i);
    b->pre_only = i == c->num_layers - 1;
    char p[64], a[80];
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
    DF_TRY(df_ws_linear(ws, &b->norm1, (b->dual ? 9 : 6) * D, D, true, "%s.norm1.linear", p));
    DF_TRY(df_ws_linear(ws, &b->norm1_context, (b->pre_only ? 2 : 6) * D, D, true,
                        "%s.norm1_context.linear", p));
    snprintf(a, sizeof a, "%s.attn", p);
    DF_TRY(df_transformer_bind_qkv(ws, &b->img, D, Dh, true, qk, a, DF_QKV_IMAGE));
    DF_TRY(df_transformer_bind_qkv(ws, &b->txt, D, Dh, true, qk, a, DF_QKV_CONTEXT));
    DF_TRY(df_ws_linear(ws, &b->to_out, D, D, true, "%s.attn.to_out.0", p));
    if (!b->pre_only)
        DF_TRY(df_ws_linear(ws, &b->to_add_out, D, D, true, "%s.attn.to_add_out", p));
    if (b->dual) {
        snprintf(a, sizeof a, "%s.attn2", p);
        DF_TRY(df_transformer_bind_qkv(ws, &b->img2, D, Dh, true, qk, a, DF_QKV_IMAGE));
        DF_TRY(df_ws_linear(ws, &b->to_out2, D, D, true, "%s.attn2.to_out.0", p));
    }
    DF_TRY(df_ws_linear(ws, &b->ff_in, 4 * D, D, true, "%s.ff.net.0.proj", p));
    DF_TRY(df_ws_linear(ws, &b->ff_out, D, 4 * D, true, "%s.ff.net.2", p));
    if (!b->pre_only) {
        DF_TRY(df_ws_linear(ws, &b->ff_ctx_in, 4 * D, D, true, "%s.ff_context.net.0.proj", p));
        DF_TRY(df_ws_linear(ws, &b->ff_ctx_out, D, 4 * D, true, "%s.ff_context.net.2", p));
    }
    return DF_OK;
}

/* The config's depth must be what the checkpoint holds: block n-1 present, block n absent. */
static df_status check_depth(df_weight_set *ws, const char *dir, int64_t n)
{
    const char *probe = "norm1.linear.weight";
    if (n > 0 && !df_ws_has(ws, "transformer_blocks.%lld.%s", (long long)(n - 1), probe)) {
        int have = 0;
        while (have < n && df_ws_has(ws, "transformer_blocks.%d.%s", have, probe))
            have++;
        return df_errorf(DF_E_FORMAT,
                         "%s/config.json: key 'num_layers' is %lld but the weights "
                         "hold %d blocks (no tensor 'transformer_blocks.%d.%s')",
                         dir, (long long)n, have, have, probe);
    }
    if (df_ws_has(ws, "transformer_blocks.%lld.%s", (long long)n, probe))
        return df_errorf(DF_E_FORMAT,
                         "%s/config.json: key 'num_layers' is %lld but the weights "
                         "hold more blocks (tensor 'transformer_blocks.%lld.%s')",
                         dir, (long long)n, (long long)n, probe);
    return DF_OK;
}

static df_status bind_weights(void *model, const char *dir)
{
    df_sd3 *m = model;
    const df_sd3_cfg *c = &m->cfg;
    df_weight_set *ws = m->t.ws;
    int64_t D = c->inner_dim, P = c->patch_size, M = c->pos_embed_max_size;
    DF_TRY(check_depth(ws, dir, c->num_layers));

    DF_TRY(df_ws_tensor(ws, &m->proj_w, 4, (int64_t[]){D, c->in_channels, P, P},
                        "pos_embed.proj.weight"));
    DF_TRY(df_ws_tensor(ws, &m->proj_b, 1, (int64_t[]){D}, "pos_embed.proj.bias"));
    DF_TRY(df_ws_tensor(ws, &m->pos_embed, 3, (int64_t[]){1, M * M, D}, "pos_embed.pos_embed"));
    DF_TRY(df_emb_mlp_bind(ws, &m->time_embedder, SD3_TIME_CHANNELS, D, D, true,
                           "time_text_embed.timestep_embedder"));
    DF_TRY(df_emb_mlp_bind(ws, &m->text_embedder, c->pooled_projection_dim, D, D, true,
                           "time_text_embed.text_embedder"));
    DF_TRY(df_ws_linear(ws, &m->context_embedder, c->caption_projection_dim, c->joint_attention_dim,
                        true, "context_embedder"));
    for (int i = 0; i < c->num_layers; i++)
        DF_TRY(bind_block(ws, c, &m->blocks[i], i));
    DF_TRY(df_ws_linear(ws, &m->norm_out, 2 * D, D, true, "norm_out.linear"));
    DF_TRY(df_ws_linear(ws, &m->proj_out, P * P * c->out_channels, D, true, "proj_out"));
    return df_ws_check_all_used(ws);
}

static df_status alloc_blocks(void *model)
{
    df_sd3 *m = model;
    m->blocks = df_calloc(m->cfg.num_layers ? (size_t)m->cfg.num_layers : 1, sizeof *m->blocks);
    return m->blocks ? DF_OK : df_errorf(DF_E_OOM, "transformer: out of memory");
}

static void free_blocks(void *model)
{
    df_sd3 *m = model;
    df_free(m->blocks);
}

/* The original MMDiT layout names blocks by depth. */
static int names_arg(const void *model)
{
    const df_sd3 *m = model;
    return (int)m->cfg.num_layers;
}

static df_status list_blocks(void *model);

/* The forward on the inputs in df_sd3_inputs order (the compiled module's). */
static df_tensor *forward_in(df_ctx *ctx, void *m, df_tensor *const *in)
{
    df_sd3_inputs si = {.hidden_states = in[0],
                        .encoder_hidden_states = in[1],
                        .pooled_projections = in[2],
                        .timestep = in[3]};
    return df_sd3_forward(ctx, m, &si);
}

static const df_transformer_kind sd3_kind = {
    .name = "sd3",
    .cls = "SD3Transformer2DModel",
    .size = sizeof(df_sd3),
    .n_in = 4,
    .forward = forward_in,
    .configure = configure,
    .alloc = alloc_blocks,
    .names = df_names_sd3_mmdit,
    .names_arg = names_arg,
    .names_probe = df_names_sd3_probe,
    .bind = bind_weights,
    .list_blocks = list_blocks,
    .free_parts = free_blocks,
};

df_status df_sd3_load(df_ctx *ctx, const char *dir, df_sd3 **out)
{
    return df_sd3_load_file(ctx, dir, NULL, out);
}

df_status df_sd3_load_file(df_ctx *ctx, const char *dir, const char *file, df_sd3 **out)
{
    return df_transformer_load(&sd3_kind, ctx, dir, file, (df_transformer **)out);
}

const df_sd3_cfg *df_sd3_config(const df_sd3 *m)
{
    return m ? &m->cfg : NULL;
}

int64_t df_sd3_weight_bytes(const df_sd3 *m)
{
    return df_transformer_weight_bytes((const df_transformer *)m);
}

void df_sd3_free(df_sd3 *m)
{
    df_transformer_free((df_transformer *)m);
}

/* --- inputs ------------------------------------------------------------------------------ */

static df_status check_inputs(const df_sd3 *m, const df_sd3_inputs *in, dims *d)
{
    const df_sd3_cfg *c = &m->cfg;
    const df_transformer *t = &m->t;
    DF_TRY(df_transformer_check_input(t, "hidden_states", in->hidden_states, 4,
                                      (int64_t[]){-1, c->in_channels, -1, -1}, false));
    d->B = df_tensor_dim(in->hidden_states, 0);
    int64_t H = df_tensor_dim(in->hidden_states, 2), W = df_tensor_dim(in->hidden_states, 3);
    int64_t P = c->patch_size, M = c->pos_embed_max_size;
    if (H % P || W % P || H / P > M || W / P > M)
        return df_errorf(DF_E_SHAPE,
                         "sd3 forward: input 'hidden_states' is %lld x %lld latent "
                         "pixels; expected multiples of patch_size %lld of at most "
                         "pos_embed_max_size * patch_size = %lld",
                         (long long)H, (long long)W, (long long)P, (long long)(M * P));
    d->h = H / P;
    d->w = W / P;
    d->s_img = d->h * d->w;
    DF_TRY(df_transformer_check_input(t, "encoder_hidden_states", in->encoder_hidden_states, 3,
                                      (int64_t[]){d->B, -1, c->joint_attention_dim}, false));
    d->s_txt = df_tensor_dim(in->encoder_hidden_states, 1);
    d->S = d->s_img + d->s_txt;
    d->D = c->inner_dim;
    d->H = c->num_attention_heads;
    DF_TRY(df_transformer_check_input(t, "pooled_projections", in->pooled_projections, 2,
                                      (int64_t[]){d->B, c->pooled_projection_dim}, false));
    DF_TRY(df_transformer_check_per_batch(t, "timestep", in->timestep, d->B));
    return df_transformer_check_layers("sd3 forward: skip layer", in->skip_layers,
                                       in->n_skip_layers, c->num_layers);
}

/* --- blocks ------------------------------------------------------------------------------ */

/* A LayerNorm output modulated: n * (1 + scale) + shift. n [B, S, D], shift/scale [B, 1, D]. */
static df_tensor *modulate(df_ctx *ctx, df_tensor *n, df_tensor *shift, df_tensor *scale)
{
    return df_add(ctx, df_mul(ctx, n, df_scale(ctx, scale, 1.0f, 1.0f)), shift);
}

/* FeedForward(dim, activation "gelu-approximate"): [B, S, D] -> [B, S, D]. */
static df_tensor *feed_forward(df_ctx *ctx, const df_linear_weights *in,
                               const df_linear_weights *out, df_tensor *x)
{
    df_scope mark = df_scope_begin(ctx); /* the 4D-wide hidden goes at the end */
    return df_scope_end(ctx, mark, df_linear(ctx, df_gelu_tanh(ctx, df_linear(ctx, x, in)), out));
}

/* JointTransformerBlock.forward. x [B, S_img, D], c [B, S_txt, D], temb [B, D]; the new
 * streams are written back into *x and *c (*c becomes NULL after a context_pre_only block). */
static void joint_block_forward(df_ctx *ctx, const joint_block *b, df_tensor **x, df_tensor **c,
                                df_tensor *temb, const dims *d)
{
    /* norm1: shift, scale, gate (attention), shift, scale, gate (MLP)[, shift, scale, gate
     * (attn2)]: [B, 1, D] each */
    df_tensor *mx[9], *mc[6] = {0};
    df_emb_modulation(ctx, &b->norm1, temb, b->dual ? 9 : 6, mx);
    /* The attention part's scope: the normed and modulated streams, q, k, v and the image
     * half of its output go at its end (as in flux.c, strict eager then holds what later ops
     * still read, not the block's whole working set). */
    df_scope mark = df_scope_begin(ctx);
    df_tensor *lx = df_layer_norm(ctx, *x, NULL, NULL, SD3_EPS); /* [B, S_img, D] */
    df_tensor *nx = modulate(ctx, lx, mx[0], mx[1]);
    df_tensor *nc;
    if (b->pre_only) {
        nc = df_emb_ada_norm_continuous(ctx, &b->norm1_context, *c, temb, SD3_EPS);
    } else {
        df_emb_modulation(ctx, &b->norm1_context, temb, 6, mc);
        nc = df_emb_modulate(ctx, *c, mc[0], mc[1], SD3_EPS); /* [B, S_txt, D] */
    }

    /* Joint attention over [image, text]. */
    df_tensor *qx, *kx, *vx, *qc, *kc, *vc;
    df_transformer_project_qkv(ctx, &b->img, nx, d->H, SD3_EPS, &qx, &kx,
                               &vx); /* [B, S_img, H, Dh] */
    df_transformer_project_qkv(ctx, &b->txt, nc, d->H, SD3_EPS, &qc, &kc,
                               &vc); /* [B, S_txt, H, Dh] */
    df_tensor *o =
        df_transformer_attention(ctx, df_concat(ctx, qx, qc, 1), df_concat(ctx, kx, kc, 1),
                                 df_concat(ctx, vx, vc, 1), NULL); /* [B, S, D] */
    df_tensor *ox = df_slice(ctx, o, 1, 0, d->s_img);
    df_tensor *oc = df_slice(ctx, o, 1, d->s_img, d->S);

    df_tensor *hx = df_add(ctx, *x, df_mul(ctx, mx[2], df_linear(ctx, ox, &b->to_out)));
    if (b->dual) {
        df_tensor *nx2 = modulate(ctx, lx, mx[6], mx[7]);
        df_tensor *q2, *k2, *v2;
        df_transformer_project_qkv(ctx, &b->img2, nx2, d->H, SD3_EPS, &q2, &k2, &v2);
        df_tensor *o2 =
            df_linear(ctx, df_transformer_attention(ctx, q2, k2, v2, NULL), &b->to_out2);
        hx = df_add(ctx, hx, df_mul(ctx, mx[8], o2));
    }
    /* kept: the image stream, the text half of the attention and the text's modulation */
    df_scope_end_n(ctx, mark, (df_tensor *[]){hx, oc, mc[2], mc[3], mc[4], mc[5]},
                   b->pre_only ? 1 : 6);

    mark = df_scope_begin(ctx);
    nx = modulate(ctx, df_layer_norm(ctx, hx, NULL, NULL, SD3_EPS), mx[3], mx[4]);
    hx = df_add(ctx, hx, df_mul(ctx, mx[5], feed_forward(ctx, &b->ff_in, &b->ff_out, nx)));
    *x = df_scope_end(ctx, mark, hx);

    if (b->pre_only) {
        *c = NULL;
        return;
    }
    mark = df_scope_begin(ctx);
    df_tensor *hc = df_add(ctx, *c, df_mul(ctx, mc[2], df_linear(ctx, oc, &b->to_add_out)));
    nc = df_emb_modulate(ctx, hc, mc[3], mc[4], SD3_EPS);
    hc = df_add(ctx, hc, df_mul(ctx, mc[5], feed_forward(ctx, &b->ff_ctx_in, &b->ff_ctx_out, nc)));
    *c = df_scope_end(ctx, mark, hc);
}

/* --- compiled repeated blocks ------------------------------------------------------------ */

/* JointTransformerBlock comes in up to four shapes of weights and outputs: with or without
 * dual attention, context_pre_only or not. Each is its own module (and program). */
static int variant(const joint_block *b)
{
    return (b->dual ? 2 : 0) + (b->pre_only ? 1 : 0);
}

/* in: x [B, S_img, D], c [B, S_txt, D], temb [B, D]; out: x and (unless pre_only) c. */
static df_status block_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                     df_tensor **out)
{
    const df_sd3 *m = model;
    dims d = {.B = df_tensor_dim(in[0], 0), .D = m->cfg.inner_dim, .H = m->cfg.num_attention_heads};
    d.s_img = df_tensor_dim(in[0], 1);
    d.s_txt = df_tensor_dim(in[1], 1);
    d.S = d.s_img + d.s_txt;
    df_tensor *x = in[0], *c = in[1];
    const joint_block *b = &m->blocks[i];
    joint_block_forward(ctx, b, &x, &c, in[2], &d);
    out[0] = x;
    if (!b->pre_only)
        out[1] = c;
    return df_ctx_status(ctx);
}

/* diffusers' SD3Transformer2DModel._repeated_blocks, one class per variant. */
static const df_block_class block_classes[4] = {
    {.name = "JointTransformerBlock", .n_in = 3, .n_out = 2, .forward = block_class_forward},
    {.name = "JointTransformerBlock(context_pre_only)",
     .n_in = 3,
     .n_out = 1,
     .forward = block_class_forward},
    {.name = "JointTransformerBlock(dual_attention)",
     .n_in = 3,
     .n_out = 2,
     .forward = block_class_forward},
    {.name = "JointTransformerBlock(dual_attention, context_pre_only)",
     .n_in = 3,
     .n_out = 1,
     .forward = block_class_forward},
};

static df_status list_blocks(void *model)
{
    df_sd3 *m = model;
    df_blocks_init(&m->t.rep, m, m->t.ws, NULL, 0);
    for (int i = 0; i < m->cfg.num_layers; i++)
        DF_TRY(df_blocks_add(&m->t.rep, &block_classes[variant(&m->blocks[i])], i,
                             "transformer_blocks.%d", i));
    return DF_OK;
}

df_status df_sd3_compile_repeated_blocks(df_sd3 *m, const df_compile_opts *opts)
{
    return df_transformer_compile_repeated_blocks(&sd3_kind, (df_transformer *)m, opts);
}

int df_sd3_compiled_programs(const df_sd3 *m)
{
    return df_transformer_compiled_programs((const df_transformer *)m);
}

/* --- forward ----------------------------------------------------------------------------- */

/* PatchEmbed: [B, C, H, W] -> [B, h*w, D] tokens plus the centre crop of the position grid. */
static df_tensor *patch_embed(df_ctx *ctx, const df_sd3 *m, df_tensor *latents, const dims *d)
{
    int64_t P = m->cfg.patch_size, M = m->cfg.pos_embed_max_size, D = d->D;
    df_tensor *x = df_conv2d(ctx, latents, m->proj_w, m->proj_b, (int)P, 0);      /* [B, D, h, w] */
    x = df_transpose(ctx, df_reshape(ctx, x, DF_SHAPE(d->B, D, d->s_img)), 1, 2); /* [B, N, D] */
    int64_t top = (M - d->h) / 2, left = (M - d->w) / 2;
    df_tensor *pe = df_reshape(ctx, m->pos_embed, DF_SHAPE(M, M, D));
    pe = df_slice(ctx, df_slice(ctx, pe, 0, top, top + d->h), 1, left, left + d->w);
    pe = df_reshape(ctx, pe, DF_SHAPE(1, d->s_img, D)); /* [1, N, D] */
    return df_add(ctx, x, pe);
}

/* [B, h*w, P*P*C] -> [B, C, h*P, w*P]: einsum "nhwpqc->nchpwq". */
static df_tensor *unpatchify(df_ctx *ctx, const df_sd3 *m, df_tensor *x, const dims *d)
{
    int64_t P = m->cfg.patch_size, C = m->cfg.out_channels;
    x = df_reshape(ctx, x, DF_SHAPE(d->B, d->h, d->w, P, P, C));
    x = df_permute(ctx, x, DF_SHAPE(0, 5, 1, 3, 2, 4)); /* [B, C, h, P, w, P] */
    return df_reshape(ctx, x, DF_SHAPE(d->B, C, d->h * P, d->w * P));
}

static bool skipped(const df_sd3_inputs *in, int layer)
{
    for (int i = 0; i < in->n_skip_layers; i++)
        if (in->skip_layers[i] == layer)
            return true;
    return false;
}

df_tensor *df_sd3_forward(df_ctx *ctx, df_sd3 *m, const df_sd3_inputs *in)
{
    if (!df_transformer_forward_ok(&sd3_kind, ctx, (const df_transformer *)m, in))
        return NULL;
    dims d = {0};
    df_status s = check_inputs(m, in, &d);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s);

    df_scope outer = df_scope_begin(ctx);
    df_tensor *x = patch_embed(ctx, m, in->hidden_states, &d); /* [B, S_img, D] */
    df_tensor *temb =
        df_add(ctx, df_emb_timestep(ctx, &m->time_embedder, in->timestep, SD3_TIME_CHANNELS, 1.0f),
               df_emb_mlp_forward(ctx, &m->text_embedder, in->pooled_projections)); /* [B, D] */
    df_tensor *c =
        df_linear(ctx, in->encoder_hidden_states, &m->context_embedder); /* [B, S_txt, D] */

    /* One fixed mark: df_blocks_run ends it after block i, releasing block i-1's outputs. */
    df_scope mark = df_scope_begin(ctx);
    for (int i = 0; i < m->cfg.num_layers; i++) {
        if (skipped(in, i))
            continue;
        df_tensor *io[2] = {NULL, NULL};
        df_blocks_run(ctx, &m->t.rep, i, mark, (df_tensor *[]){x, c, temb}, io);
        x = io[0], c = m->blocks[i].pre_only ? NULL : io[1];
    }
    x = df_emb_ada_norm_continuous(ctx, &m->norm_out, x, temb, SD3_EPS); /* [B, S_img, D] */
    x = df_linear(ctx, x, &m->proj_out);                                 /* [B, S_img, P*P*C] */
    return df_scope_end(ctx, outer, unpatchify(ctx, m, x, &d));
}

df_weight_set *df_sd3_weight_set(const df_sd3 *m)
{
    return df_transformer_weight_set((const df_transformer *)m);
}
