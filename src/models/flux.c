/*
 * The FLUX.1 transformer: diffusers' FluxTransformer2DModel (0.37), on the op API.
 *
 * Loading (the transformer base, transformer_base.h) reads config.json with diffusers' defaults
 * for absent keys and rejects values it cannot run before any weight is opened; then every weight
 * is bound by its diffusers name and expected shape through a weight set (loader.h), which keeps
 * the checkpoint's dtype and reports a missing, mis-shaped or unexpected tensor by name.
 *
 * The forward reads like FluxTransformer2DModel.forward, with two choices that do not
 * change the function computed:
 * - The single-stream blocks run on the joint sequence [text, image] from the first to
 *   the last: diffusers concatenates before and splits after each block, which moves the
 *   same numbers.
 * - Block outputs are kept with one fixed scope mark per block loop, so each block's end
 *   also releases the previous block's outputs: eager memory stays one block's working set.
 * Per-head RMS norms come before RoPE; attention runs over [text, image] with the RoPE
 * table of cat(txt_ids, img_ids) (conventions in ../shared/reference/conventions.md).
 *
 * Tensor parallelism: when the context has a communicator of N > 1 ranks (df_ctx_comm), the
 * model loads sharded by the plan below (tp_plan, diffusers' _tp_plan): each rank binds only
 * its slice of the split linears (loader.h) and runs H/N of the attention heads and 1/N of
 * every MLP; the forward is the same code with local head counts and an all-reduce after
 * each rowwise product (tp_sum), so every rank ends each block with the full hidden states.
 *
 * The repeated blocks run through blocks.h, which compiles them per class
 * (df_flux_compile_repeated_blocks) and, under sequential offload
 * (df_flux_set_sequential_offload), adds residency calls around each block (acquire reads
 * the next block ahead, release drops a block's pages and packed forms after its queued
 * kernels ran); the ops are the same.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/compile.h>
#include <diffuse/flux.h>
#include <diffuse/layout.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/embeddings.h"
#include "models/blocks.h"
#include "models/step_cache.h"
#include "models/loader.h"
#include "models/model_config.h"
#include "models/weight_sets.h"
#include "models/transformer_base.h"

#define FLUX_EPS           1e-6f   /* every LayerNorm and RMSNorm of the model */
#define FLUX_TIME_CHANNELS 256     /* sinusoidal features of timestep and guidance */
#define FLUX_TIME_SCALE    1000.0f /* the model embeds 1000 * sigma and 1000 * guidance */
#define FLUX_ROPE_THETA    10000.0
#define FLUX_MAX_SIZE      (INT64_C(1) << 24) /* larger config sizes are refused as implausible */

/*
 * The tensor-parallel plan (diffusers' FluxTransformer2DModel._tp_plan). Attention heads
 * are split across ranks: q, k, v colwise (each rank computes whole heads, as the rows of
 * to_q are head-major), the output projections rowwise followed by an all-reduce. The MLPs
 * run colwise then rowwise (GELU is elementwise, so each rank's slice of the hidden layer
 * is complete). The single block's proj_out reads cat[attn (D), mlp (4D)], so its columns
 * are split as two packed blocks, matching the rank's [attn heads, mlp slice]. Replicated:
 * the embedders, the AdaLN modulation linears (norm1*, norm.linear), the q/k RMS norms
 * (per head, shared by all heads), norm_out and proj_out.
 */
static const df_tp_rule tp_plan[] = {
    {"transformer_blocks.*.attn.to_q", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.to_k", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.to_v", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.to_out.0", DF_SHARD_ROWWISE},
    {"transformer_blocks.*.attn.add_q_proj", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.add_k_proj", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.add_v_proj", DF_SHARD_COLWISE},
    {"transformer_blocks.*.attn.to_add_out", DF_SHARD_ROWWISE},
    {"transformer_blocks.*.ff.net.0.proj", DF_SHARD_COLWISE},
    {"transformer_blocks.*.ff.net.2", DF_SHARD_ROWWISE},
    {"transformer_blocks.*.ff_context.net.0.proj", DF_SHARD_COLWISE},
    {"transformer_blocks.*.ff_context.net.2", DF_SHARD_ROWWISE},
    {"single_transformer_blocks.*.attn.to_q", DF_SHARD_COLWISE},
    {"single_transformer_blocks.*.attn.to_k", DF_SHARD_COLWISE},
    {"single_transformer_blocks.*.attn.to_v", DF_SHARD_COLWISE},
    {"single_transformer_blocks.*.proj_mlp", DF_SHARD_COLWISE},
    {"single_transformer_blocks.*.proj_out", DF_SHARD_ROWWISE, 2, {1, 4}}, /* [attn, mlp] */
};

/* FluxTransformerBlock: image stream (norm1, attn.to_*, ff) and text stream
 * (norm1_context, attn.add_*_proj, ff_context). */
typedef struct double_block {
    df_linear_weights norm1, norm1_context; /* [6D, D] */
    df_joint_attn_weights attn;
    df_linear_weights ff_in, ff_out; /* [4D, D], [D, 4D] */
    df_linear_weights ff_ctx_in, ff_ctx_out;
} double_block;

/* FluxSingleTransformerBlock. */
typedef struct single_block {
    df_linear_weights norm; /* [3D, D] */
    df_qkv_weights attn;
    df_linear_weights proj_mlp; /* [4D, D] */
    df_linear_weights proj_out; /* [D, 5D] */
} single_block;

struct df_flux {
    /* Context, weights, the split over ranks, the step cache and the repeated blocks in
     * forward order (double, then single): compiled per class and offloaded one at a time
     * (blocks.h). */
    df_transformer t;
    df_flux_cfg cfg;
    df_linear_weights x_embedder, context_embedder; /* [D, in], [D, joint] */
    df_emb_mlp time_embedder, guidance_embedder, text_embedder;
    double_block *blocks;
    single_block *singles;
    df_linear_weights norm_out, proj_out; /* [2D, D], [out, D] */
};

/* Sizes of one forward call. H: this rank's attention heads; tp: ranks. */
typedef struct dims {
    int64_t B, s_img, s_txt, H;
    int tp;
} dims;

/* --- config ------------------------------------------------------------------------------ */

static df_status get_size(const df_json *cfg, const char *key, int64_t dflt, int64_t min,
                          int64_t *out)
{
    return df_config_size(cfg, key, dflt, min, FLUX_MAX_SIZE, out);
}

static df_status check_config(const df_json *cfg, df_flux_cfg *c)
{
    const char *src = df_json_source(cfg);
    DF_TRY(df_config_class(cfg, "FluxTransformer2DModel"));

    DF_TRY(get_size(cfg, "patch_size", 1, 1, &c->patch_size));
    if (c->patch_size != 1)
        return df_errorf(DF_E_UNSUPPORTED, "%s: key 'patch_size' is %lld; only 1 is supported", src,
                         (long long)c->patch_size);
    DF_TRY(get_size(cfg, "in_channels", 64, 1, &c->in_channels));
    DF_TRY(get_size(cfg, "out_channels", c->in_channels, 1, &c->out_channels));
    DF_TRY(get_size(cfg, "num_layers", 19, 0, &c->num_layers));
    DF_TRY(get_size(cfg, "num_single_layers", 38, 0, &c->num_single_layers));
    DF_TRY(get_size(cfg, "attention_head_dim", 128, 1, &c->attention_head_dim));
    DF_TRY(get_size(cfg, "num_attention_heads", 24, 1, &c->num_attention_heads));
    DF_TRY(get_size(cfg, "joint_attention_dim", 4096, 1, &c->joint_attention_dim));
    DF_TRY(get_size(cfg, "pooled_projection_dim", 768, 1, &c->pooled_projection_dim));
    DF_TRY(df_json_get_bool_or(cfg, "guidance_embeds", false, &c->guidance_embeds));

    static const int64_t axes[] = {16, 56, 56};
    DF_TRY(df_config_rope_axes(cfg, axes, 3, DF_FLUX_MAX_AXES, FLUX_MAX_SIZE, c->attention_head_dim,
                               c->axes_dims_rope, &c->n_axes));
    c->inner_dim = c->num_attention_heads * c->attention_head_dim;
    return DF_OK;
}

static df_status configure(void *model, const df_json *cfg)
{
    df_flux *m = model;
    return check_config(cfg, &m->cfg);
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_double(df_weight_set *ws, double_block *b, int64_t D, int64_t Dh, int i)
{
    char p[64];
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
    DF_TRY(df_ws_linear(ws, &b->norm1, 6 * D, D, true, "%s.norm1.linear", p));
    DF_TRY(df_ws_linear(ws, &b->norm1_context, 6 * D, D, true, "%s.norm1_context.linear", p));
    DF_TRY(df_transformer_bind_joint_attn(ws, &b->attn, D, Dh, true, p));
    DF_TRY(df_ws_linear(ws, &b->ff_in, 4 * D, D, true, "%s.ff.net.0.proj", p));
    DF_TRY(df_ws_linear(ws, &b->ff_out, D, 4 * D, true, "%s.ff.net.2", p));
    DF_TRY(df_ws_linear(ws, &b->ff_ctx_in, 4 * D, D, true, "%s.ff_context.net.0.proj", p));
    DF_TRY(df_ws_linear(ws, &b->ff_ctx_out, D, 4 * D, true, "%s.ff_context.net.2", p));
    return DF_OK;
}

static df_status bind_single(df_weight_set *ws, single_block *b, int64_t D, int64_t Dh, int i)
{
    char p[64];
    snprintf(p, sizeof p, "single_transformer_blocks.%d", i);
    DF_TRY(df_ws_linear(ws, &b->norm, 3 * D, D, true, "%s.norm.linear", p));
    char a[80];
    snprintf(a, sizeof a, "%s.attn", p);
    DF_TRY(df_transformer_bind_qkv(ws, &b->attn, D, Dh, true, true, a, DF_QKV_IMAGE));
    DF_TRY(df_ws_linear(ws, &b->proj_mlp, 4 * D, D, true, "%s.proj_mlp", p));
    DF_TRY(df_ws_linear(ws, &b->proj_out, D, 5 * D, true, "%s.proj_out", p));
    return DF_OK;
}

static df_status bind_weights(void *model, const char *dir)
{
    df_flux *m = model;
    const df_flux_cfg *c = &m->cfg;
    df_weight_set *ws = m->t.ws;
    int64_t D = c->inner_dim, Dh = c->attention_head_dim;
    DF_TRY(df_blocks_check_depth(ws, dir, "num_layers", c->num_layers, "transformer_blocks",
                                 "norm1.linear.weight"));
    DF_TRY(df_blocks_check_depth(ws, dir, "num_single_layers", c->num_single_layers,
                                 "single_transformer_blocks", "norm.linear.weight"));

    DF_TRY(df_ws_linear(ws, &m->x_embedder, D, c->in_channels, true, "x_embedder"));
    DF_TRY(df_ws_linear(ws, &m->context_embedder, D, c->joint_attention_dim, true,
                        "context_embedder"));
    DF_TRY(df_emb_mlp_bind(ws, &m->time_embedder, FLUX_TIME_CHANNELS, D, D, true,
                           "time_text_embed.timestep_embedder"));
    if (c->guidance_embeds)
        DF_TRY(df_emb_mlp_bind(ws, &m->guidance_embedder, FLUX_TIME_CHANNELS, D, D, true,
                               "time_text_embed.guidance_embedder"));
    DF_TRY(df_emb_mlp_bind(ws, &m->text_embedder, c->pooled_projection_dim, D, D, true,
                           "time_text_embed.text_embedder"));
    for (int i = 0; i < c->num_layers; i++)
        DF_TRY(bind_double(ws, &m->blocks[i], D, Dh, i));
    for (int i = 0; i < c->num_single_layers; i++)
        DF_TRY(bind_single(ws, &m->singles[i], D, Dh, i));
    DF_TRY(df_ws_linear(ws, &m->norm_out, 2 * D, D, true, "norm_out.linear"));
    DF_TRY(df_ws_linear(ws, &m->proj_out, c->patch_size * c->patch_size * c->out_channels, D, true,
                        "proj_out"));
    return df_ws_check_all_used(ws);
}

/* Splits the model over the context's ranks (t.tp > 1). */
static df_status shard(void *model, const char *dir)
{
    df_flux *m = model;
    DF_TRY(df_transformer_check_heads(&m->t, dir, m->cfg.num_attention_heads));
    df_ws_set_tp_plan(m->t.ws, tp_plan, (int)(sizeof tp_plan / sizeof *tp_plan), m->t.rank,
                      m->t.tp);
    return DF_OK;
}

static df_status alloc_blocks(void *model)
{
    df_flux *m = model;
    int64_t n = m->cfg.num_layers, n_single = m->cfg.num_single_layers;
    m->blocks = df_calloc(n ? (size_t)n : 1, sizeof *m->blocks);
    m->singles = df_calloc(n_single ? (size_t)n_single : 1, sizeof *m->singles);
    if (!m->blocks || !m->singles)
        return df_errorf(DF_E_OOM, "transformer: out of memory");
    return DF_OK;
}

static void free_blocks(void *model)
{
    df_flux *m = model;
    df_free(m->blocks);
    df_free(m->singles);
}

static df_status list_blocks(void *model);

/* The forward on the inputs in df_flux_inputs order (the compiled module's). */
static df_tensor *forward_in(df_ctx *ctx, void *m, df_tensor *const *in)
{
    df_flux_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
    return df_flux_forward(ctx, m, &fi);
}

static const df_transformer_kind flux_kind = {
    .name = "flux",
    .cls = "FluxTransformer2DModel",
    .size = sizeof(df_flux),
    .n_in = 7,
    .forward = forward_in,
    .step_caches = true,
    .configure = configure,
    .alloc = alloc_blocks,
    .names = df_names_flux_bfl,
    .names_probe = df_names_flux_probe,
    .shard = shard,
    .bind = bind_weights,
    .list_blocks = list_blocks,
    .free_parts = free_blocks,
};

static df_status load(df_ctx *ctx, const char *dir, const char *file, df_flux **out)
{
    return df_transformer_load(&flux_kind, ctx, dir, file, (df_transformer **)out);
}

df_status df_flux_load(df_ctx *ctx, const char *dir, df_flux **out)
{
    return load(ctx, dir, NULL, out);
}

df_status df_flux_load_file(df_ctx *ctx, const char *config_dir, const char *file,
                            df_flux **out)
{
    if (!file) {
        if (out)
            *out = NULL;
        return df_errorf(DF_E_ARG, "df_flux_load_file: file is NULL");
    }
    return load(ctx, config_dir, file, out);
}

const df_flux_cfg *df_flux_config(const df_flux *m)
{
    return m ? &m->cfg : NULL;
}

int64_t df_flux_weight_bytes(const df_flux *m)
{
    return df_transformer_weight_bytes((const df_transformer *)m);
}

df_weight_set *df_flux_weight_set(const df_flux *m)
{
    return df_transformer_weight_set((const df_transformer *)m);
}

df_status df_flux_set_sequential_offload(df_flux *m, bool on)
{
    return df_transformer_set_sequential_offload(&flux_kind, (df_transformer *)m, on);
}

void df_flux_free(df_flux *m)
{
    df_transformer_free((df_transformer *)m);
}

/* --- inputs ------------------------------------------------------------------------------ */

static df_status check_inputs(const df_flux *m, const df_flux_inputs *in, dims *d)
{
    const df_flux_cfg *c = &m->cfg;
    const df_transformer *t = &m->t;
    DF_TRY(df_transformer_check_sequences(t, in->hidden_states, in->encoder_hidden_states,
                                          c->in_channels, c->joint_attention_dim, &d->B, &d->s_img,
                                          &d->s_txt));
    d->H = c->num_attention_heads / t->tp; /* this rank's heads */
    d->tp = t->tp;
    DF_TRY(df_transformer_check_input(t, "pooled_projections", in->pooled_projections, 2,
                                      (int64_t[]){d->B, c->pooled_projection_dim}, false));
    DF_TRY(df_transformer_check_per_batch(t, "timestep", in->timestep, d->B));
    DF_TRY(df_transformer_check_ids(t, "img_ids", in->img_ids, d->s_img, c->n_axes));
    DF_TRY(df_transformer_check_ids(t, "txt_ids", in->txt_ids, d->s_txt, c->n_axes));
    return df_transformer_check_guidance(t, c->guidance_embeds, in->guidance, d->B);
}

/* --- blocks ------------------------------------------------------------------------------ */

/* The sum over the ranks of a rowwise product's partial results (itself on one rank). */
static df_tensor *tp_sum(df_ctx *ctx, const dims *d, df_tensor *x)
{
    return df_transformer_tp_sum(ctx, d->tp, x);
}

/*
 * The block forwards open a scope for each part whose intermediates later parts do not read
 * (the attention module, a stream's feed-forward half, the single block's inputs to its
 * output projection) and keep only that part's results, so strict eager holds what the
 * block's later ops still read rather than its whole working set (the block's own scope,
 * df_blocks_run's, holds its inputs and outputs).
 */

/* FluxTransformerBlock.forward. x [B, S_img, D], c [B, S_txt, D], temb [B, D]; the new
 * streams are written back into *x and *c. `slot`: its attention module in `cache`. */
static void double_block_forward(df_ctx *ctx, const double_block *b, df_tensor **x, df_tensor **c,
                                 df_tensor *temb, df_tensor *pe, const dims *d,
                                 df_step_cache *cache, int slot)
{
    /* shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp: [B, 1, D] each */
    df_tensor *mx[6], *mc[6];
    df_emb_modulation(ctx, &b->norm1, temb, 6, mx);
    df_emb_modulation(ctx, &b->norm1_context, temb, 6, mc);

    df_tensor *a[2]; /* the attention module's outputs: image [B, S_img, D], text [B, S_txt, D] */
    df_scope mark = df_scope_begin(ctx); /* the modulated streams go once it has run */
    df_tensor *nx = df_emb_modulate(ctx, *x, mx[0], mx[1], FLUX_EPS); /* [B, S_img, D] */
    df_tensor *nc = df_emb_modulate(ctx, *c, mc[0], mc[1], FLUX_EPS); /* [B, S_txt, D] */
    if (!df_step_cache_predict(ctx, cache, slot, a, 2)) {
        df_transformer_joint_attention(ctx, &b->attn, nx, nc, pe, d->H, FLUX_EPS, d->tp, a);
        df_step_cache_update(ctx, cache, slot, a, 2);
    }
    df_scope_end_n(ctx, mark, a, 2);
    /* FeedForward(dim, activation "gelu-approximate") of each stream */
    *x = df_transformer_stream_feed_forward(ctx, &b->ff_in, &b->ff_out, df_gelu_tanh, d->tp, *x,
                                            a[0], mx, FLUX_EPS); /* image */
    *c = df_transformer_stream_feed_forward(ctx, &b->ff_ctx_in, &b->ff_ctx_out, df_gelu_tanh, d->tp,
                                            *c, a[1], mc, FLUX_EPS); /* text */
}

/* FluxSingleTransformerBlock.forward on the joint sequence. x [B, S, D] -> [B, S, D]. */
static df_tensor *single_block_forward(df_ctx *ctx, const single_block *b, df_tensor *x,
                                       df_tensor *temb, df_tensor *pe, const dims *d,
                                       df_step_cache *cache, int slot)
{
    df_tensor *mod[3]; /* shift, scale, gate: [B, 1, D] */
    df_emb_modulation(ctx, &b->norm, temb, 3, mod);
    df_scope mark = df_scope_begin(ctx); /* all but the joined [attn, mlp] go before proj_out */
    df_tensor *n = df_emb_modulate(ctx, x, mod[0], mod[1], FLUX_EPS); /* [B, S, D]  */
    df_scope up = df_scope_begin(ctx);
    df_tensor *mlp = df_scope_end(ctx, up, df_gelu_tanh(ctx, df_linear(ctx, n, &b->proj_mlp)));
    df_tensor *attn; /* the `attn` module's output (TaylorSeer's unit): [B, S, D/tp] */
    if (!df_step_cache_predict(ctx, cache, slot, &attn, 1)) {
        df_tensor *q, *k, *v;
        df_transformer_project_qkv(ctx, &b->attn, n, d->H, FLUX_EPS, &q, &k,
                                   &v);                    /* [B, S, H, Dh] */
        attn = df_transformer_attention(ctx, q, k, v, pe); /* [B, S, D/tp] */
        df_step_cache_update(ctx, cache, slot, &attn, 1);
    }
    df_tensor *h = df_scope_end(ctx, mark, df_concat(ctx, attn, mlp, 2)); /* [B, S, 5D/tp] */
    h = tp_sum(ctx, d, df_linear(ctx, h, &b->proj_out));                  /* [B, S, D] */
    return df_add(ctx, x, df_mul(ctx, mod[2], h));                        /* residual */
}

/* --- repeated blocks --------------------------------------------------------------------- */

/* The weights outside the blocks, resident for the whole forward under sequential offload. */
static const char *const outer_prefixes[] = {"x_embedder.", "context_embedder.", "time_text_embed.",
                                             "norm_out.", "proj_out."};

/* The sizes a block call needs, from its input x [B, S_x, D]. */
static dims block_dims(const df_flux *m, const df_tensor *x)
{
    return (dims){
        .B = df_tensor_dim(x, 0), .H = m->cfg.num_attention_heads / m->t.tp, .tp = m->t.tp};
}

/* in: x, c, temb, pe; out: x, c. */
static df_status double_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux *m = model;
    dims d = block_dims(m, in[0]);
    out[0] = in[0], out[1] = in[1];
    double_block_forward(ctx, &m->blocks[i], &out[0], &out[1], in[2], in[3], &d, m->t.cache, i);
    return df_ctx_status(ctx);
}

/* in: h (the joint sequence), temb, pe; out: h. */
static df_status single_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux *m = model;
    dims d = block_dims(m, in[0]);
    out[0] = single_block_forward(ctx, &m->singles[i], in[0], in[1], in[2], &d, m->t.cache,
                                  (int)m->cfg.num_layers + i);
    return df_ctx_status(ctx);
}

/* diffusers' FluxTransformer2DModel._repeated_blocks. */
static const df_block_class double_class = {.name = "FluxTransformerBlock", .n_in = 4,
                                            .n_out = 2, .forward = double_class_forward};
static const df_block_class single_class = {.name = "FluxSingleTransformerBlock", .n_in = 3,
                                            .n_out = 1, .forward = single_class_forward};

static df_status list_blocks(void *model)
{
    df_flux *m = model;
    return df_transformer_list_two_streams(
        &m->t, outer_prefixes, (int)(sizeof outer_prefixes / sizeof *outer_prefixes), &double_class,
        m->cfg.num_layers, &single_class, m->cfg.num_single_layers);
}

df_status df_flux_compile_repeated_blocks(df_flux *m, const df_compile_opts *opts)
{
    return df_transformer_compile_repeated_blocks(&flux_kind, (df_transformer *)m, opts);
}

int df_flux_compiled_programs(const df_flux *m)
{
    return df_transformer_compiled_programs((const df_transformer *)m);
}

/* --- forward ----------------------------------------------------------------------------- */

/* CombinedTimestep(Guidance)TextProjEmbeddings: [B, D] (or [1, D] broadcasting later). */
static df_tensor *conditioning(df_ctx *ctx, const df_flux *m, const df_flux_inputs *in)
{
    const int ch = FLUX_TIME_CHANNELS;
    const float k = FLUX_TIME_SCALE;
    df_tensor *temb = df_emb_timestep(ctx, &m->time_embedder, in->timestep, ch, k); /* [B, D] */
    if (m->cfg.guidance_embeds) {
        df_tensor *g =
            df_emb_timestep(ctx, &m->guidance_embedder, in->guidance, ch, k); /* [B, D] */
        temb = df_add(ctx, temb, g);
    }
    df_tensor *pooled = df_emb_mlp_forward(ctx, &m->text_embedder, in->pooled_projections);
    return df_add(ctx, temb, pooled); /* [B, D] */
}

/* FirstBlockCache after the first block (x0: its image input; x, c: its outputs): whether
 * the other blocks run; if not, *h is the joint sequence they are taken to make. */
static bool first_block_head(df_ctx *ctx, df_flux *m, df_tensor *x0, df_tensor *x, df_tensor *c,
                             df_tensor **h)
{
    df_tensor *head = df_concat(ctx, c, x, 1); /* [B, S, D] laid out as the last block's output */
    if (df_step_cache_head(ctx, m->t.cache, x0, x)) {
        df_step_cache_keep_head(ctx, m->t.cache, head);
        return true;
    }
    *h = df_step_cache_skip(ctx, m->t.cache, head);
    df_blocks_skip_rest(ctx, &m->t.rep);
    return false;
}

df_tensor *df_flux_forward(df_ctx *ctx, df_flux *m, const df_flux_inputs *in)
{
    if (!df_transformer_forward_ok(&flux_kind, ctx, (const df_transformer *)m, in))
        return NULL;
    dims d = {0};
    df_status s = check_inputs(m, in, &d);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s);

    df_scope outer = df_scope_begin(ctx);
    df_blocks_begin(ctx, &m->t.rep);
    df_tensor *x = df_linear(ctx, in->hidden_states, &m->x_embedder); /* [B, S_img, D] */
    df_tensor *temb = conditioning(ctx, m, in);                       /* [B, D] */
    df_tensor *txt = in->encoder_hidden_states;
    df_tensor *c = df_linear(ctx, txt, &m->context_embedder); /* [B, S_txt, D] */
    df_tensor *pe = df_emb_rope_table(
        ctx, df_transformer_ids_2d(ctx, in->txt_ids), df_transformer_ids_2d(ctx, in->img_ids),
        m->cfg.axes_dims_rope, m->cfg.n_axes, FLUX_ROPE_THETA); /* [S, Dh/2, 2] */

    df_step_cache_begin(m->t.cache);
    bool first_block = df_step_cache_first_block(m->t.cache);
    df_tensor *h = df_transformer_mag_skip(ctx, &m->t, c, x); /* [B, S, D] joint, text first */
    bool rest = !h;
    /* One fixed mark: df_blocks_run ends it after block i, releasing block i-1's outputs. */
    df_scope mark = df_scope_begin(ctx);
    for (int i = 0; i < m->cfg.num_layers && rest; i++) {
        df_tensor *x0 = x, *io[2];
        df_blocks_run(ctx, &m->t.rep, i, mark, (df_tensor *[]){x, c, temb, pe}, io);
        x = io[0], c = io[1];
        if (i == 0 && first_block)
            rest = first_block_head(ctx, m, x0, x, c, &h);
    }
    if (rest) {
        h = df_transformer_single_stream(ctx, &m->t, m->cfg.num_layers,
                                         m->cfg.num_single_layers, c, x, temb, pe);
        if (first_block)
            df_step_cache_tail(ctx, m->t.cache, h);
    }
    return df_transformer_two_stream_out(ctx, &m->t, outer, h, d.s_txt, temb, &m->norm_out,
                                         &m->proj_out, FLUX_EPS);
}
