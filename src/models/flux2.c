/*
 * The FLUX.2 transformer: diffusers' Flux2Transformer2DModel (0.37), on the op API.
 *
 * Loading (the transformer base, transformer_base.h) reads config.json with diffusers' defaults
 * for absent keys and rejects values it cannot run before any weight is opened; then every weight
 * is bound by its diffusers name and expected shape through a weight set (loader.h). No layer of
 * the model has a bias.
 *
 * What differs from FLUX.1 (flux.c):
 * - Modulation is computed once per forward and shared: double_stream_modulation_img/_txt
 *   (two sets of shift, scale, gate each) by every double block, single_stream_modulation
 *   (one set) by every single block. The blocks take the modulation linear's output
 *   [B, n*D] as an input and chunk it themselves.
 * - Feed-forwards are SwiGLU: linear_in [2M, D], silu(first half) * second half,
 *   linear_out [D, M] (M = int(D * mlp_ratio)), composed of slice, silu and mul.
 * - The single block fuses q, k, v and the MLP input into one projection (to_qkv_mlp_proj,
 *   [3D + 2M, D]) and the attention and MLP outputs into one (to_out, [D, D + M]).
 * - The conditioning is the timestep (and, with guidance_embeds, the guidance) embedding
 *   only: no pooled text input. Both are scaled by 1000 inside, as diffusers does.
 * - RoPE has 4 axes (t, h, w, l) and theta 2000 (config.json).
 * As in flux.c the single blocks run on the joint sequence [text, image] from first to
 * last, and block outputs are kept with one fixed scope mark per block loop.
 *
 * Tensor parallelism (a communicator of N > 1 ranks on the context): the plan of diffusers'
 * Flux2Transformer2DModel._tp_plan, built at load time because the packed block sizes come
 * from the config (see make_tp_plan). Each rank runs H/N heads and 1/N of every MLP; the
 * rowwise products are all-reduced (tp_sum).
 *
 * Compiled repeated blocks and sequential offload come from blocks.h.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/dist.h>
#include <diffuse/flux2.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/blocks.h"
#include "models/step_cache.h"
#include "models/embeddings.h"
#include "models/loader.h"
#include "models/model_config.h"
#include "models/weight_sets.h"
#include "models/transformer_base.h"
#include "runtime/runtime.h" /* df_ctx_fail: input errors fail the context like an op */

#define FLUX2_TIME_SCALE 1000.0f /* the model embeds 1000 * t and 1000 * guidance */
#define FLUX2_MAX_SIZE   (INT64_C(1) << 24) /* larger config sizes are refused as implausible */
#define FLUX2_TP_RULES   18 /* diffusers' 14, context_embedder and the 3 modulations */

/* Flux2TransformerBlock: image stream (attn.to_*, ff) and text stream (attn.add_*_proj,
 * ff_context). */
typedef struct double_block {
    df_joint_attn_weights attn;
    df_linear_weights ff_in, ff_out; /* [2M, D], [D, M] */
    df_linear_weights ff_ctx_in, ff_ctx_out;
} double_block;

/* Flux2SingleTransformerBlock. */
typedef struct single_block {
    df_linear_weights qkv_mlp;  /* attn.to_qkv_mlp_proj [3D + 2M, D] */
    df_tensor *norm_q, *norm_k; /* [Dh] */
    df_linear_weights to_out;   /* attn.to_out [D, D + M] */
} single_block;

struct df_flux2 {
    df_transformer t; /* context, weights, ranks, step cache, double then single blocks */
    df_flux2_cfg cfg;
    df_linear_weights x_embedder, context_embedder; /* [D, in], [D, joint] */
    df_emb_mlp time_embedder, guidance_embedder;    /* 256 -> D -> D */
    df_linear_weights mod_img, mod_txt, mod_single; /* [6D, D], [6D, D], [3D, D] */
    double_block *blocks;
    single_block *singles;
    df_linear_weights norm_out, proj_out; /* [2D, D], [out, D] */
    bool tp_ctx_rows, tp_mod_rows;        /* context_embedder / modulations split rowwise */
    df_tp_rule tp_plan[FLUX2_TP_RULES];   /* the ws borrows it: lives as long as the model */
};

/* Sizes of one block call. H: this rank's heads; tp: ranks. */
typedef struct dims {
    int64_t B, H;
    int tp;
    float eps;
} dims;

/* --- config ------------------------------------------------------------------------------ */

static df_status get_size(const df_json *cfg, const char *key, int64_t dflt, int64_t min,
                          int64_t *out)
{
    return df_config_size(cfg, key, dflt, min, FLUX2_MAX_SIZE, out);
}

static df_status check_config(const df_json *cfg, df_flux2_cfg *c)
{
    const char *src = df_json_source(cfg);
    DF_TRY(df_config_class(cfg, "Flux2Transformer2DModel"));

    DF_TRY(get_size(cfg, "patch_size", 1, 1, &c->patch_size));
    if (c->patch_size != 1)
        return df_errorf(DF_E_UNSUPPORTED, "%s: key 'patch_size' is %lld; only 1 is supported", src,
                         (long long)c->patch_size);
    DF_TRY(get_size(cfg, "in_channels", 128, 1, &c->in_channels));
    DF_TRY(get_size(cfg, "out_channels", c->in_channels, 1, &c->out_channels));
    DF_TRY(get_size(cfg, "num_layers", 8, 0, &c->num_layers));
    DF_TRY(get_size(cfg, "num_single_layers", 48, 0, &c->num_single_layers));
    DF_TRY(get_size(cfg, "attention_head_dim", 128, 1, &c->attention_head_dim));
    DF_TRY(get_size(cfg, "num_attention_heads", 48, 1, &c->num_attention_heads));
    DF_TRY(get_size(cfg, "joint_attention_dim", 15360, 1, &c->joint_attention_dim));
    DF_TRY(get_size(cfg, "timestep_guidance_channels", 256, 2, &c->timestep_guidance_channels));
    if (c->timestep_guidance_channels % 2)
        return df_errorf(DF_E_FORMAT, "%s: key 'timestep_guidance_channels' is %lld; expected an "
                         "even size (cos and sin halves)", src,
                         (long long)c->timestep_guidance_channels);
    DF_TRY(df_json_get_double_or(cfg, "mlp_ratio", 3.0, &c->mlp_ratio));
    DF_TRY(df_json_get_double_or(cfg, "rope_theta", 2000.0, &c->rope_theta));
    DF_TRY(df_json_get_double_or(cfg, "eps", 1e-6, &c->eps));
    DF_TRY(df_json_get_bool_or(cfg, "guidance_embeds", true, &c->guidance_embeds));
    if (!(c->rope_theta > 0) || !(c->eps > 0) || !(c->eps < 1))
        return df_errorf(DF_E_FORMAT, "%s: keys 'rope_theta' (%g) and 'eps' (%g) must be positive "
                         "(eps below 1)", src, c->rope_theta, c->eps);

    static const int64_t axes[] = {32, 32, 32, 32};
    DF_TRY(df_config_rope_axes(cfg, axes, 4, DF_FLUX2_MAX_AXES, FLUX2_MAX_SIZE,
                               c->attention_head_dim, c->axes_dims_rope, &c->n_axes));
    c->inner_dim = c->num_attention_heads * c->attention_head_dim;
    double mlp = (double)c->inner_dim * c->mlp_ratio;
    if (!(mlp >= 1) || mlp > (double)FLUX2_MAX_SIZE)
        return df_errorf(DF_E_FORMAT, "%s: key 'mlp_ratio' is %g; expected a ratio that gives an "
                         "MLP width in [1, %lld]", src, c->mlp_ratio, (long long)FLUX2_MAX_SIZE);
    c->mlp_hidden_dim = (int64_t)mlp; /* int(dim * mlp_ratio) */
    return DF_OK;
}

static df_status configure(void *model, const df_json *cfg)
{
    df_flux2 *m = model;
    return check_config(cfg, &m->cfg);
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_double(df_weight_set *ws, double_block *b, const df_flux2_cfg *c, int i)
{
    int64_t D = c->inner_dim, Dh = c->attention_head_dim, M = c->mlp_hidden_dim;
    char p[64];
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
    DF_TRY(df_transformer_bind_joint_attn(ws, &b->attn, D, Dh, false, p));
    DF_TRY(df_ws_linear(ws, &b->ff_in, 2 * M, D, false, "%s.ff.linear_in", p));
    DF_TRY(df_ws_linear(ws, &b->ff_out, D, M, false, "%s.ff.linear_out", p));
    DF_TRY(df_ws_linear(ws, &b->ff_ctx_in, 2 * M, D, false, "%s.ff_context.linear_in", p));
    DF_TRY(df_ws_linear(ws, &b->ff_ctx_out, D, M, false, "%s.ff_context.linear_out", p));
    return DF_OK;
}

static df_status bind_single(df_weight_set *ws, single_block *b, const df_flux2_cfg *c, int i)
{
    int64_t D = c->inner_dim, Dh = c->attention_head_dim, M = c->mlp_hidden_dim;
    char p[64];
    snprintf(p, sizeof p, "single_transformer_blocks.%d.attn", i);
    DF_TRY(df_ws_linear(ws, &b->qkv_mlp, 3 * D + 2 * M, D, false, "%s.to_qkv_mlp_proj", p));
    DF_TRY(df_ws_tensor(ws, &b->norm_q, 1, (int64_t[]){Dh}, "%s.norm_q.weight", p));
    DF_TRY(df_ws_tensor(ws, &b->norm_k, 1, (int64_t[]){Dh}, "%s.norm_k.weight", p));
    DF_TRY(df_ws_linear(ws, &b->to_out, D, D + M, false, "%s.to_out", p));
    return DF_OK;
}

static df_status bind_weights(void *model, const char *dir)
{
    df_flux2 *m = model;
    const df_flux2_cfg *c = &m->cfg;
    df_weight_set *ws = m->t.ws;
    int64_t D = c->inner_dim, T = c->timestep_guidance_channels;
    DF_TRY(df_blocks_check_depth(ws, dir, "num_layers", c->num_layers, "transformer_blocks",
                                 "attn.to_q.weight"));
    DF_TRY(df_blocks_check_depth(ws, dir, "num_single_layers", c->num_single_layers,
                                 "single_transformer_blocks", "attn.to_qkv_mlp_proj.weight"));
    if (!c->guidance_embeds &&
        df_ws_has(ws, "time_guidance_embed.guidance_embedder.linear_1.weight"))
        return df_errorf(DF_E_FORMAT, "%s/config.json: key 'guidance_embeds' is false but the "
                         "weights hold a guidance embedder (tensor "
                         "'time_guidance_embed.guidance_embedder.linear_1.weight')", dir);

    DF_TRY(df_ws_linear(ws, &m->x_embedder, D, c->in_channels, false, "x_embedder"));
    DF_TRY(df_ws_linear(ws, &m->context_embedder, D, c->joint_attention_dim, false,
                        "context_embedder"));
    DF_TRY(df_emb_mlp_bind(ws, &m->time_embedder, T, D, D, false,
                           "time_guidance_embed.timestep_embedder"));
    if (c->guidance_embeds)
        DF_TRY(df_emb_mlp_bind(ws, &m->guidance_embedder, T, D, D, false,
                               "time_guidance_embed.guidance_embedder"));
    DF_TRY(df_ws_linear(ws, &m->mod_img, 6 * D, D, false, "double_stream_modulation_img.linear"));
    DF_TRY(df_ws_linear(ws, &m->mod_txt, 6 * D, D, false, "double_stream_modulation_txt.linear"));
    DF_TRY(df_ws_linear(ws, &m->mod_single, 3 * D, D, false, "single_stream_modulation.linear"));
    for (int i = 0; i < c->num_layers; i++)
        DF_TRY(bind_double(ws, &m->blocks[i], c, i));
    for (int i = 0; i < c->num_single_layers; i++)
        DF_TRY(bind_single(ws, &m->singles[i], c, i));
    DF_TRY(df_ws_linear(ws, &m->norm_out, 2 * D, D, false, "norm_out.linear"));
    DF_TRY(df_ws_linear(ws, &m->proj_out, c->out_channels, D, false, "proj_out"));
    return df_ws_check_all_used(ws);
}

static int64_t gcd(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b, b = t;
    }
    return a;
}

/*
 * The tensor-parallel plan (diffusers' Flux2Transformer2DModel._tp_plan). Attention heads
 * are split: q, k, v colwise (rows are head-major, so each rank has whole heads), the
 * output projections rowwise. The SwiGLU input projections are packed column blocks
 * [gate (M), up (M)], so each rank holds matching slices of both halves; the single
 * block's fused projection is packed as [q (D), k (D), v (D), gate (M), up (M)] and its
 * to_out reads cat[attn (D), mlp (M)], split as two packed row blocks. Replicated: x_embedder,
 * the time embedder, the q/k norms (per head), norm_out and proj_out.
 *
 * Beyond diffusers' plan, two products whose input every rank holds whole are split rowwise
 * (each rank multiplies its slice of the input features and an all-reduce adds the partial
 * sums), so that no rank repeats them: context_embedder (the largest product outside the
 * blocks: joint 7680 -> D for klein, 15360 for dev) and the three modulation linears (D ->
 * 15D in all, read once per forward). Either stays replicated when its input width does not
 * divide by the ranks.
 */
static int make_tp_plan(df_flux2 *m)
{
    int64_t g = gcd(m->cfg.inner_dim, m->cfg.mlp_hidden_dim);
    int a = (int)(m->cfg.inner_dim / g), b = (int)(m->cfg.mlp_hidden_dim / g);
    const df_tp_rule plan[] = {
        {"transformer_blocks.*.attn.to_q", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.to_k", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.to_v", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.to_out.0", DF_SHARD_ROWWISE},
        {"transformer_blocks.*.attn.add_q_proj", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.add_k_proj", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.add_v_proj", DF_SHARD_COLWISE},
        {"transformer_blocks.*.attn.to_add_out", DF_SHARD_ROWWISE},
        {"transformer_blocks.*.ff.linear_in", DF_SHARD_COLWISE, 2, {1, 1}},
        {"transformer_blocks.*.ff.linear_out", DF_SHARD_ROWWISE},
        {"transformer_blocks.*.ff_context.linear_in", DF_SHARD_COLWISE, 2, {1, 1}},
        {"transformer_blocks.*.ff_context.linear_out", DF_SHARD_ROWWISE},
        {"single_transformer_blocks.*.attn.to_qkv_mlp_proj", DF_SHARD_COLWISE, 5,
         {a, a, a, b, b}},
        {"single_transformer_blocks.*.attn.to_out", DF_SHARD_ROWWISE, 2, {a, b}},
    };
    int n = (int)(sizeof plan / sizeof *plan);
    memcpy(m->tp_plan, plan, sizeof plan);
    m->tp_ctx_rows = m->cfg.joint_attention_dim % m->t.tp == 0;
    if (m->tp_ctx_rows)
        m->tp_plan[n++] = (df_tp_rule){"context_embedder", DF_SHARD_ROWWISE};
    m->tp_mod_rows = m->cfg.inner_dim % m->t.tp == 0;
    if (m->tp_mod_rows) {
        m->tp_plan[n++] = (df_tp_rule){"double_stream_modulation_img.linear", DF_SHARD_ROWWISE};
        m->tp_plan[n++] = (df_tp_rule){"double_stream_modulation_txt.linear", DF_SHARD_ROWWISE};
        m->tp_plan[n++] = (df_tp_rule){"single_stream_modulation.linear", DF_SHARD_ROWWISE};
    }
    return n;
}

/* Splits the model over the context's ranks (t.tp > 1). */
static df_status shard(void *model, const char *dir)
{
    df_flux2 *m = model;
    DF_TRY(df_transformer_check_heads(&m->t, dir, m->cfg.num_attention_heads));
    if (m->cfg.mlp_hidden_dim % m->t.tp)
        return df_errorf(DF_E_ARG,
                         "%s/config.json: the MLP width %lld (inner_dim * mlp_ratio) "
                         "is not divisible by the %d tensor-parallel ranks",
                         dir, (long long)m->cfg.mlp_hidden_dim, m->t.tp);
    int n = make_tp_plan(m);
    df_ws_set_tp_plan(m->t.ws, m->tp_plan, n, m->t.rank, m->t.tp);
    return DF_OK;
}

static df_status alloc_blocks(void *model)
{
    df_flux2 *m = model;
    int64_t n = m->cfg.num_layers, n_single = m->cfg.num_single_layers;
    m->blocks = df_calloc(n ? (size_t)n : 1, sizeof *m->blocks);
    m->singles = df_calloc(n_single ? (size_t)n_single : 1, sizeof *m->singles);
    if (!m->blocks || !m->singles)
        return df_errorf(DF_E_OOM, "transformer: out of memory");
    return DF_OK;
}

static void free_blocks(void *model)
{
    df_flux2 *m = model;
    df_free(m->blocks);
    df_free(m->singles);
}

static df_status list_blocks(void *model);

/* The forward on the inputs in df_flux2_inputs order (the compiled module's). */
static df_tensor *forward_in(df_ctx *ctx, void *m, df_tensor *const *in)
{
    df_flux2_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5]};
    return df_flux2_forward(ctx, m, &fi);
}

static const df_transformer_kind flux2_kind = {
    .name = "flux2",
    .cls = "Flux2Transformer2DModel",
    .size = sizeof(df_flux2),
    .n_in = 6,
    .forward = forward_in,
    .step_caches = true,
    .configure = configure,
    .alloc = alloc_blocks,
    .names = df_names_flux2_bfl,
    .names_probe = df_names_flux2_probe,
    .shard = shard,
    .bind = bind_weights,
    .list_blocks = list_blocks,
    .free_parts = free_blocks,
};

df_status df_flux2_load(df_ctx *ctx, const char *dir, df_flux2 **out)
{
    return df_flux2_load_file(ctx, dir, NULL, out);
}

df_status df_flux2_load_file(df_ctx *ctx, const char *dir, const char *file, df_flux2 **out)
{
    return df_transformer_load(&flux2_kind, ctx, dir, file, (df_transformer **)out);
}

const df_flux2_cfg *df_flux2_config(const df_flux2 *m)
{
    return m ? &m->cfg : NULL;
}

int64_t df_flux2_weight_bytes(const df_flux2 *m)
{
    return df_transformer_weight_bytes((const df_transformer *)m);
}

df_weight_set *df_flux2_weight_set(const df_flux2 *m)
{
    return df_transformer_weight_set((const df_transformer *)m);
}

df_status df_flux2_set_sequential_offload(df_flux2 *m, bool on)
{
    return df_transformer_set_sequential_offload(&flux2_kind, (df_transformer *)m, on);
}

void df_flux2_free(df_flux2 *m)
{
    df_transformer_free((df_transformer *)m);
}

/* --- inputs ------------------------------------------------------------------------------ */

static df_status check_inputs(const df_flux2 *m, const df_flux2_inputs *in)
{
    const df_flux2_cfg *c = &m->cfg;
    const df_transformer *t = &m->t;
    int64_t B, s_img, s_txt;
    DF_TRY(df_transformer_check_sequences(t, in->hidden_states, in->encoder_hidden_states,
                                          c->in_channels, c->joint_attention_dim, &B, &s_img,
                                          &s_txt));
    DF_TRY(df_transformer_check_per_batch(t, "timestep", in->timestep, B));
    DF_TRY(df_transformer_check_ids(t, "img_ids", in->img_ids, s_img, c->n_axes));
    DF_TRY(df_transformer_check_ids(t, "txt_ids", in->txt_ids, s_txt, c->n_axes));
    return df_transformer_check_guidance(t, c->guidance_embeds, in->guidance, B);
}

/* --- blocks ------------------------------------------------------------------------------ */

/* The sum over the ranks of a rowwise product's partial results (itself on one rank). */
static df_tensor *tp_sum(df_ctx *ctx, const dims *d, df_tensor *x)
{
    return df_transformer_tp_sum(ctx, d->tp, x);
}

/* Part i of n of a shared modulation [B, n*D], as [B, 1, D] (broadcast over the sequence). */
static df_tensor *mod_part(df_ctx *ctx, df_tensor *mod, int n, int i)
{
    return df_unsqueeze(ctx, df_chunk(ctx, mod, n, 1, i), 1);
}

/* [B, S, H*Dh] -> heads [B, S, H, Dh], RMS-normed per head when norm is given. */
static df_tensor *heads(df_ctx *ctx, df_tensor *x, df_tensor *norm, const dims *d)
{
    x = df_reshape(ctx, x, DF_SHAPE(d->B, df_tensor_dim(x, 1), d->H, -1));
    return norm ? df_rms_norm(ctx, x, norm, d->eps) : x;
}

/* Flux2SwiGLU: silu(first half) * second half of the last dimension. */
static df_tensor *swiglu(df_ctx *ctx, df_tensor *h)
{
    int64_t n = df_tensor_dim(h, 2) / 2;
    return df_mul(ctx, df_silu(ctx, df_slice(ctx, h, 2, 0, n)), df_slice(ctx, h, 2, n, 2 * n));
}

/*
 * As in flux.c, the block forwards open a scope for each part whose intermediates later parts
 * do not read and keep only its results, so strict eager holds what the block's later ops
 * still read rather than its whole working set.
 */

/* Flux2TransformerBlock.forward. x [B, S_img, D], c [B, S_txt, D]; mod_img, mod_txt
 * [B, 6D] (shift, scale, gate of attention, then of the MLP); the new streams are written
 * back into *x and *c. */
static void double_block_forward(df_ctx *ctx, const double_block *b, df_tensor **x, df_tensor **c,
                                 df_tensor *mod_img, df_tensor *mod_txt, df_tensor *pe,
                                 const dims *d, df_step_cache *cache, int slot)
{
    df_tensor *mx[6], *mc[6];
    for (int i = 0; i < 6; i++)
        mx[i] = mod_part(ctx, mod_img, 6, i), mc[i] = mod_part(ctx, mod_txt, 6, i);

    df_tensor *a[2]; /* the attention module's outputs: image, text */
    df_scope mark = df_scope_begin(ctx); /* the modulated streams go once it has run */
    df_tensor *nx = df_emb_modulate(ctx, *x, mx[0], mx[1], d->eps); /* [B, S_img, D] */
    df_tensor *nc = df_emb_modulate(ctx, *c, mc[0], mc[1], d->eps); /* [B, S_txt, D] */
    if (!df_step_cache_predict(ctx, cache, slot, a, 2)) {
        df_transformer_joint_attention(ctx, &b->attn, nx, nc, pe, d->H, d->eps, d->tp, a);
        df_step_cache_update(ctx, cache, slot, a, 2);
    }
    df_scope_end_n(ctx, mark, a, 2);
    /* Flux2FeedForward (SwiGLU) of each stream */
    *x = df_transformer_stream_feed_forward(ctx, &b->ff_in, &b->ff_out, swiglu, d->tp, *x, a[0],
                                            mx, d->eps); /* image */
    *c = df_transformer_stream_feed_forward(ctx, &b->ff_ctx_in, &b->ff_ctx_out, swiglu, d->tp, *c,
                                            a[1], mc, d->eps); /* text */
}

/* Flux2ParallelSelfAttention (the single block's `attn` module, what TaylorSeer hooks): one
 * projection to q, k, v and the SwiGLU MLP, attention, one output projection of both.
 * n [B, S, D] -> [B, S, D]. */
static df_tensor *parallel_attention(df_ctx *ctx, const single_block *b, df_tensor *n,
                                     df_tensor *pe, const dims *d)
{
    df_scope mark = df_scope_begin(ctx); /* all but the joined [attn, mlp] go before to_out */
    df_tensor *p = df_linear(ctx, n, &b->qkv_mlp);                /* [B, S, (3D + 2M)/tp] */
    int64_t Dl = d->H * (df_tensor_dim(b->norm_q, 0)), W = df_tensor_dim(p, 2);
    df_tensor *q = heads(ctx, df_slice(ctx, p, 2, 0, Dl), b->norm_q, d);
    df_tensor *k = heads(ctx, df_slice(ctx, p, 2, Dl, 2 * Dl), b->norm_k, d);
    df_tensor *v = heads(ctx, df_slice(ctx, p, 2, 2 * Dl, 3 * Dl), NULL, d);
    df_tensor *attn = df_transformer_attention(ctx, q, k, v, pe);  /* [B, S, D/tp] */
    df_tensor *mlp = swiglu(ctx, df_slice(ctx, p, 2, 3 * Dl, W));  /* [B, S, M/tp] */
    df_tensor *j = df_scope_end(ctx, mark, df_concat(ctx, attn, mlp, 2));
    return tp_sum(ctx, d, df_linear(ctx, j, &b->to_out));          /* [B, S, D] */
}

/* Flux2SingleTransformerBlock.forward on the joint sequence: h [B, S, D], mod [B, 3D]
 * (shift, scale, gate) -> [B, S, D]. */
static df_tensor *single_block_forward(df_ctx *ctx, const single_block *b, df_tensor *h,
                                       df_tensor *mod, df_tensor *pe, const dims *d,
                                       df_step_cache *cache, int slot)
{
    df_tensor *shift = mod_part(ctx, mod, 3, 0), *scale = mod_part(ctx, mod, 3, 1);
    df_scope mark = df_scope_begin(ctx); /* the modulated input goes once the module ran */
    df_tensor *n = df_emb_modulate(ctx, h, shift, scale, d->eps); /* [B, S, D] */
    df_tensor *o; /* Flux2ParallelSelfAttention (attention and MLP): [B, S, D] */
    if (!df_step_cache_predict(ctx, cache, slot, &o, 1)) {
        o = parallel_attention(ctx, b, n, pe, d);
        df_step_cache_update(ctx, cache, slot, &o, 1);
    }
    o = df_scope_end(ctx, mark, o);
    return df_add(ctx, h, df_mul(ctx, mod_part(ctx, mod, 3, 2), o)); /* residual */
}

/* --- repeated blocks --------------------------------------------------------------------- */

/* The weights outside the blocks, resident for the whole forward under sequential offload. */
static const char *const outer_prefixes[] = {
    "x_embedder.", "context_embedder.", "time_guidance_embed.", "double_stream_modulation_img.",
    "double_stream_modulation_txt.", "single_stream_modulation.", "norm_out.", "proj_out."};

/* The sizes a block call needs. x [B, S_x, D]. */
static dims block_dims(const df_flux2 *m, const df_tensor *x)
{
    return (dims){.B = df_tensor_dim(x, 0),
                  .H = m->cfg.num_attention_heads / m->t.tp,
                  .tp = m->t.tp,
                  .eps = (float)m->cfg.eps};
}

/* in: x, c, mod_img, mod_txt, pe; out: x, c. */
static df_status double_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux2 *m = model;
    dims d = block_dims(m, in[0]);
    out[0] = in[0], out[1] = in[1];
    double_block_forward(ctx, &m->blocks[i], &out[0], &out[1], in[2], in[3], in[4], &d, m->t.cache,
                         i);
    return df_ctx_status(ctx);
}

/* in: h (the joint sequence), mod, pe; out: h. */
static df_status single_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux2 *m = model;
    dims d = block_dims(m, in[0]);
    out[0] = single_block_forward(ctx, &m->singles[i], in[0], in[1], in[2], &d, m->t.cache,
                                  (int)m->cfg.num_layers + i);
    return df_ctx_status(ctx);
}

/* diffusers' Flux2Transformer2DModel._repeated_blocks. */
static const df_block_class double_class = {.name = "Flux2TransformerBlock", .n_in = 5,
                                            .n_out = 2, .forward = double_class_forward};
static const df_block_class single_class = {.name = "Flux2SingleTransformerBlock", .n_in = 3,
                                            .n_out = 1, .forward = single_class_forward};

static df_status list_blocks(void *model)
{
    df_flux2 *m = model;
    return df_transformer_list_two_streams(
        &m->t, outer_prefixes, (int)(sizeof outer_prefixes / sizeof *outer_prefixes), &double_class,
        m->cfg.num_layers, &single_class, m->cfg.num_single_layers);
}

df_status df_flux2_compile_repeated_blocks(df_flux2 *m, const df_compile_opts *opts)
{
    return df_transformer_compile_repeated_blocks(&flux2_kind, (df_transformer *)m, opts);
}

int df_flux2_compiled_programs(const df_flux2 *m)
{
    return df_transformer_compiled_programs((const df_transformer *)m);
}

/* --- forward ----------------------------------------------------------------------------- */

/* Flux2TimestepGuidanceEmbeddings: [B, D] (or [1, D], broadcasting later). */
static df_tensor *conditioning(df_ctx *ctx, const df_flux2 *m, const df_flux2_inputs *in)
{
    int ch = (int)m->cfg.timestep_guidance_channels;
    df_tensor *temb = df_emb_timestep(ctx, &m->time_embedder, in->timestep, ch, FLUX2_TIME_SCALE);
    if (m->cfg.guidance_embeds)
        temb = df_add(ctx, temb, df_emb_timestep(ctx, &m->guidance_embedder, in->guidance, ch,
                                                 FLUX2_TIME_SCALE));
    return temb;
}

/* x [..., K] times a linear split rowwise although every rank holds x whole: this rank's
 * slice of the input features, the partial products summed over the ranks. */
static df_tensor *row_split_linear(df_ctx *ctx, const df_flux2 *m, df_tensor *x,
                                   const df_linear_weights *w)
{
    int last = df_tensor_ndim(x) - 1;
    int64_t k = df_tensor_dim(x, last) / m->t.tp;
    x = df_slice(ctx, x, last, m->t.rank * k, (m->t.rank + 1) * k); /* [..., K/tp] */
    return df_all_reduce(ctx, df_linear(ctx, x, w));
}

/* Flux2Modulation of the double streams and the single stream: silu(temb) [B, D] ->
 * [B, 6D], [B, 6D], [B, 3D]. Split over the ranks, the three partial products travel in one
 * all-reduce. */
static void modulations(df_ctx *ctx, const df_flux2 *m, df_tensor *act, df_tensor **img,
                        df_tensor **txt, df_tensor **single)
{
    if (!m->tp_mod_rows || m->t.tp <= 1) {
        *img = df_linear(ctx, act, &m->mod_img);
        *txt = df_linear(ctx, act, &m->mod_txt);
        *single = df_linear(ctx, act, &m->mod_single);
        return;
    }
    int64_t D = m->cfg.inner_dim, k = D / m->t.tp;
    act = df_slice(ctx, act, 1, m->t.rank * k, (m->t.rank + 1) * k); /* [B, D/tp] */
    df_tensor *all = df_concat(ctx, df_linear(ctx, act, &m->mod_img),
                               df_linear(ctx, act, &m->mod_txt), 1);
    all = df_all_reduce(ctx, df_concat(ctx, all, df_linear(ctx, act, &m->mod_single), 1));
    *img = df_slice(ctx, all, 1, 0, 6 * D);          /* [B, 6D] */
    *txt = df_slice(ctx, all, 1, 6 * D, 12 * D);     /* [B, 6D] */
    *single = df_slice(ctx, all, 1, 12 * D, 15 * D); /* [B, 3D] */
}

df_tensor *df_flux2_forward(df_ctx *ctx, df_flux2 *m, const df_flux2_inputs *in)
{
    if (!df_transformer_forward_ok(&flux2_kind, ctx, (const df_transformer *)m, in))
        return NULL;
    df_status s = check_inputs(m, in);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s);
    int64_t s_txt = df_tensor_dim(in->encoder_hidden_states, 1);

    df_scope outer = df_scope_begin(ctx);
    df_blocks_begin(ctx, &m->t.rep);
    df_tensor *temb = conditioning(ctx, m, in);               /* [B, D] */
    df_tensor *act = df_silu(ctx, temb);                      /* Flux2Modulation's SiLU */
    df_tensor *mod_img, *mod_txt, *mod_single;                /* [B, 6D], [B, 6D], [B, 3D] */
    modulations(ctx, m, act, &mod_img, &mod_txt, &mod_single);
    df_tensor *x = df_linear(ctx, in->hidden_states, &m->x_embedder);          /* [B, S_img, D] */
    df_tensor *txt = in->encoder_hidden_states;
    df_tensor *c = m->tp_ctx_rows ? row_split_linear(ctx, m, txt, &m->context_embedder)
                                  : df_linear(ctx, txt, &m->context_embedder); /* [B,S_txt,D] */
    df_tensor *pe = df_emb_rope_table(
        ctx, df_transformer_ids_2d(ctx, in->txt_ids), df_transformer_ids_2d(ctx, in->img_ids),
        m->cfg.axes_dims_rope, m->cfg.n_axes, m->cfg.rope_theta); /* [S,Dh/2,2] */

    df_step_cache_begin(m->t.cache);
    df_tensor *h = df_transformer_mag_skip(ctx, &m->t, c, x); /* [B, S, D] joint, text first */
    if (!h) {
        /* One fixed mark: df_blocks_run ends it after block i, releasing block i-1's
         * outputs. */
        df_scope mark = df_scope_begin(ctx);
        for (int i = 0; i < m->cfg.num_layers; i++) {
            df_tensor *io[2];
            df_blocks_run(ctx, &m->t.rep, i, mark, (df_tensor *[]){x, c, mod_img, mod_txt, pe}, io);
            x = io[0], c = io[1];
        }
        h = df_transformer_single_stream(ctx, &m->t, m->cfg.num_layers,
                                         m->cfg.num_single_layers, c, x, mod_single, pe);
    }
    return df_transformer_two_stream_out(ctx, &m->t, outer, h, s_txt, temb, &m->norm_out,
                                         &m->proj_out, (float)m->cfg.eps);
}
