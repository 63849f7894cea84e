/*
 * The FLUX.1 transformer: diffusers' FluxTransformer2DModel (0.37), on the op API.
 *
 * Loading reads config.json with diffusers' defaults for absent keys and rejects values
 * it cannot run before anything is allocated; then every weight is bound by its diffusers
 * name and expected shape through a weight set (loader.h), which keeps the checkpoint's
 * dtype and reports a missing, mis-shaped or unexpected tensor by name.
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
#include "models/residency.h"

#include <diffuse/dist.h>

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

/* q, k, v projections of one stream with their per-head RMS norms. */
typedef struct qkv_weights {
    df_linear_weights to_q, to_k, to_v; /* [D, D] */
    df_tensor *norm_q, *norm_k;         /* [Dh] */
} qkv_weights;

/* FluxTransformerBlock: image stream (norm1, attn.to_*, ff) and text stream
 * (norm1_context, attn.add_*_proj, ff_context). */
typedef struct double_block {
    df_linear_weights norm1, norm1_context; /* [6D, D] */
    qkv_weights img, txt;
    df_linear_weights to_out, to_add_out; /* [D, D] */
    df_linear_weights ff_in, ff_out;      /* [4D, D], [D, 4D] */
    df_linear_weights ff_ctx_in, ff_ctx_out;
} double_block;

/* FluxSingleTransformerBlock. */
typedef struct single_block {
    df_linear_weights norm; /* [3D, D] */
    qkv_weights attn;
    df_linear_weights proj_mlp; /* [4D, D] */
    df_linear_weights proj_out; /* [D, 5D] */
} single_block;

struct df_flux {
    df_ctx *ctx;
    df_flux_cfg cfg;
    int axes[DF_FLUX_MAX_AXES];
    df_weight_set *ws;
    df_linear_weights x_embedder, context_embedder; /* [D, in], [D, joint] */
    df_emb_mlp time_embedder, guidance_embedder, text_embedder;
    double_block *blocks;
    single_block *singles;
    df_linear_weights norm_out, proj_out; /* [2D, D], [out, D] */
    int tp;                               /* tensor-parallel ranks the model is split over */
    /* The repeated blocks in forward order (double, then single): compiled per class and
     * offloaded one at a time (blocks.h). */
    df_blocks rep;
    df_step_cache *cache; /* a run's step cache (step_cache.h), or NULL */
};

/* Sizes of one forward call. H: this rank's attention heads; tp: ranks. */
typedef struct dims {
    int64_t B, s_img, s_txt, S, D, H;
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

    if (df_json_is_null(df_json_get(cfg, "axes_dims_rope"))) {
        c->n_axes = 3;
        c->axes_dims_rope[0] = 16, c->axes_dims_rope[1] = 56, c->axes_dims_rope[2] = 56;
    } else {
        int64_t n = 0;
        DF_TRY(
            df_json_get_int_array(cfg, "axes_dims_rope", c->axes_dims_rope, DF_FLUX_MAX_AXES, &n));
        if (n < 1)
            return df_errorf(DF_E_FORMAT, "%s: key 'axes_dims_rope' is empty", src);
        c->n_axes = (int)n;
    }
    int64_t sum = 0;
    for (int a = 0; a < c->n_axes; a++) {
        int64_t d = c->axes_dims_rope[a];
        if (d <= 0 || d % 2 || d > FLUX_MAX_SIZE)
            return df_errorf(DF_E_FORMAT,
                             "%s: key 'axes_dims_rope[%d]' is %lld; expected a "
                             "positive even size (RoPE rotates pairs)",
                             src, a, (long long)d);
        sum += d;
    }
    if (sum != c->attention_head_dim)
        return df_errorf(DF_E_FORMAT,
                         "%s: key 'axes_dims_rope' sums to %lld but "
                         "'attention_head_dim' is %lld; RoPE must cover the whole head",
                         src, (long long)sum, (long long)c->attention_head_dim);
    c->inner_dim = c->num_attention_heads * c->attention_head_dim;
    return DF_OK;
}

static df_status read_config(const char *dir, df_flux_cfg *c)
{
    df_json *cfg = NULL;
    DF_TRY(df_layout_open_config(dir, &cfg));
    df_status s = check_config(cfg, c);
    df_json_free(cfg);
    return s;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_qkv(df_weight_set *ws, qkv_weights *w, int64_t D, int64_t Dh, const char *p,
                          const char *q, const char *k, const char *v, const char *nq,
                          const char *nk)
{
    DF_TRY(df_ws_linear(ws, &w->to_q, D, D, true, "%s.%s", p, q));
    DF_TRY(df_ws_linear(ws, &w->to_k, D, D, true, "%s.%s", p, k));
    DF_TRY(df_ws_linear(ws, &w->to_v, D, D, true, "%s.%s", p, v));
    DF_TRY(df_ws_tensor(ws, &w->norm_q, 1, (int64_t[]){Dh}, "%s.%s.weight", p, nq));
    DF_TRY(df_ws_tensor(ws, &w->norm_k, 1, (int64_t[]){Dh}, "%s.%s.weight", p, nk));
    return DF_OK;
}

static df_status bind_double(df_weight_set *ws, double_block *b, int64_t D, int64_t Dh, int i)
{
    char p[64];
    snprintf(p, sizeof p, "transformer_blocks.%d", i);
    DF_TRY(df_ws_linear(ws, &b->norm1, 6 * D, D, true, "%s.norm1.linear", p));
    DF_TRY(df_ws_linear(ws, &b->norm1_context, 6 * D, D, true, "%s.norm1_context.linear", p));
    char a[80];
    snprintf(a, sizeof a, "%s.attn", p);
    DF_TRY(bind_qkv(ws, &b->img, D, Dh, a, "to_q", "to_k", "to_v", "norm_q", "norm_k"));
    DF_TRY(bind_qkv(ws, &b->txt, D, Dh, a, "add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q",
                    "norm_added_k"));
    DF_TRY(df_ws_linear(ws, &b->to_out, D, D, true, "%s.attn.to_out.0", p));
    DF_TRY(df_ws_linear(ws, &b->to_add_out, D, D, true, "%s.attn.to_add_out", p));
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
    DF_TRY(bind_qkv(ws, &b->attn, D, Dh, a, "to_q", "to_k", "to_v", "norm_q", "norm_k"));
    DF_TRY(df_ws_linear(ws, &b->proj_mlp, 4 * D, D, true, "%s.proj_mlp", p));
    DF_TRY(df_ws_linear(ws, &b->proj_out, D, 5 * D, true, "%s.proj_out", p));
    return DF_OK;
}

static df_status bind_weights(df_flux *m, const char *dir)
{
    const df_flux_cfg *c = &m->cfg;
    df_weight_set *ws = m->ws;
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

/* Splits the model over the context's ranks, if it has several. */
static df_status shard(df_flux *m, const char *dir)
{
    df_comm *comm = df_ctx_comm(m->ctx);
    m->tp = df_comm_size(comm);
    if (m->tp <= 1)
        return DF_OK;
    if (m->cfg.num_attention_heads % m->tp)
        return df_errorf(DF_E_ARG, "%s/config.json: num_attention_heads %lld is not divisible by "
                         "the %d tensor-parallel ranks (heads are split across ranks)", dir,
                         (long long)m->cfg.num_attention_heads, m->tp);
    df_ws_set_tp_plan(m->ws, tp_plan, (int)(sizeof tp_plan / sizeof *tp_plan),
                      df_comm_rank(comm), m->tp);
    return DF_OK;
}

static df_status list_blocks(df_flux *m);

/* Loads with dir's config and the weights of dir, or of `file` (a single file) when set. */
static df_status load(df_ctx *ctx, const char *dir, const char *file, df_flux **out)
{
    if (!out)
        return df_errorf(DF_E_ARG, "df_flux_load: out is NULL");
    *out = NULL;
    if (!ctx || !dir)
        return df_errorf(DF_E_ARG, "df_flux_load: ctx and dir are required");
    df_flux_cfg cfg = {0};
    DF_TRY(read_config(dir, &cfg));

    df_flux *m = df_calloc(1, sizeof *m);
    if (!m)
        return df_errorf(DF_E_OOM, "transformer: out of memory");
    m->ctx = ctx;
    m->cfg = cfg;
    for (int a = 0; a < cfg.n_axes; a++)
        m->axes[a] = (int)cfg.axes_dims_rope[a];
    df_status s = DF_OK;
    m->blocks = df_calloc(cfg.num_layers ? (size_t)cfg.num_layers : 1, sizeof *m->blocks);
    m->singles =
        df_calloc(cfg.num_single_layers ? (size_t)cfg.num_single_layers : 1, sizeof *m->singles);
    if (!m->blocks || !m->singles)
        s = df_errorf(DF_E_OOM, "transformer: out of memory");
    if (s == DF_OK && file)
        s = df_weight_set_open_single(ctx, dir, file, "transformer", df_names_flux_bfl, 0,
                                      df_names_flux_probe(), &m->ws);
    else if (s == DF_OK)
        s = df_weight_set_open(ctx, dir, "transformer", &m->ws);
    if (s == DF_OK)
        s = shard(m, dir);
    if (s == DF_OK)
        s = bind_weights(m, dir);
    if (s == DF_OK)
        s = list_blocks(m);
    if (s != DF_OK) {
        df_flux_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
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
    return m && m->ws ? df_ws_bytes(m->ws) : 0;
}

df_weight_set *df_flux_weight_set(const df_flux *m)
{
    return m ? m->ws : NULL;
}

df_status df_flux_set_sequential_offload(df_flux *m, bool on)
{
    if (!m)
        return df_errorf(DF_E_ARG, "df_flux_set_sequential_offload: model is NULL");
    return df_blocks_set_sequential(&m->rep, on);
}

void df_flux_free(df_flux *m)
{
    if (!m)
        return;
    df_blocks_deinit(&m->rep);
    df_weight_set_free(m->ws);
    df_free(m->blocks);
    df_free(m->singles);
    df_free(m);
}

/* --- inputs ------------------------------------------------------------------------------ */

static df_status check_input(const char *name, const df_tensor *t, int ndim, const int64_t *want,
                             bool ids)
{
    return df_emb_check_input("flux", name, t, ndim, want, ids);
}

/* [S, A] ids, or the deprecated [N, S, A] form of which diffusers uses row 0. */
static df_status check_ids(const char *name, const df_tensor *t, int64_t S, int64_t A)
{
    if (t && df_tensor_ndim(t) == 3)
        return check_input(name, t, 3, (int64_t[]){-1, S, A}, true);
    return check_input(name, t, 2, (int64_t[]){S, A}, true);
}

/* A [B] or [1] tensor (timestep, guidance). */
static df_status check_per_batch(const char *name, const df_tensor *t, int64_t B)
{
    if (t && df_tensor_ndim(t) == 1 && df_tensor_dim(t, 0) == 1)
        return check_input(name, t, 1, (int64_t[]){1}, false);
    return check_input(name, t, 1, (int64_t[]){B}, false);
}

static df_status check_inputs(const df_flux *m, const df_flux_inputs *in, dims *d)
{
    const df_flux_cfg *c = &m->cfg;
    DF_TRY(check_input("hidden_states", in->hidden_states, 3, (int64_t[]){-1, -1, c->in_channels},
                       false));
    d->B = df_tensor_dim(in->hidden_states, 0);
    d->s_img = df_tensor_dim(in->hidden_states, 1);
    DF_TRY(check_input("encoder_hidden_states", in->encoder_hidden_states, 3,
                       (int64_t[]){d->B, -1, c->joint_attention_dim}, false));
    d->s_txt = df_tensor_dim(in->encoder_hidden_states, 1);
    d->S = d->s_txt + d->s_img;
    d->D = c->inner_dim;
    d->H = c->num_attention_heads / m->tp; /* this rank's heads */
    d->tp = m->tp;
    DF_TRY(check_input("pooled_projections", in->pooled_projections, 2,
                       (int64_t[]){d->B, c->pooled_projection_dim}, false));
    DF_TRY(check_per_batch("timestep", in->timestep, d->B));
    DF_TRY(check_ids("img_ids", in->img_ids, d->s_img, c->n_axes));
    DF_TRY(check_ids("txt_ids", in->txt_ids, d->s_txt, c->n_axes));
    if (c->guidance_embeds)
        DF_TRY(check_per_batch("guidance", in->guidance, d->B));
    else if (in->guidance)
        return df_errorf(DF_E_ARG, "flux forward: input 'guidance' given, but this model has "
                                   "no guidance embedder (config.json guidance_embeds is false)");
    return DF_OK;
}

/* [S, A] view of ids given as [S, A] or [N, S, A]. */
static df_tensor *ids_2d(df_ctx *ctx, df_tensor *ids)
{
    if (df_tensor_ndim(ids) == 2)
        return ids;
    int64_t S = df_tensor_dim(ids, 1), A = df_tensor_dim(ids, 2);
    return df_reshape(ctx, df_slice(ctx, ids, 0, 0, 1), DF_SHAPE(S, A)); /* row 0 */
}

/* --- blocks ------------------------------------------------------------------------------ */

/* One stream's q, k, v as heads [B, S, H, Dh]; q and k RMS-normed per head. x [B, S, D]. */
static void project_qkv(df_ctx *ctx, const qkv_weights *w, df_tensor *x, const dims *d, int64_t S,
                        df_tensor **q, df_tensor **k, df_tensor **v)
{
    *q = df_reshape(ctx, df_linear(ctx, x, &w->to_q), DF_SHAPE(d->B, S, d->H, -1)); /* [B,S,H,Dh] */
    *k = df_reshape(ctx, df_linear(ctx, x, &w->to_k), DF_SHAPE(d->B, S, d->H, -1)); /* [B,S,H,Dh] */
    *v = df_reshape(ctx, df_linear(ctx, x, &w->to_v), DF_SHAPE(d->B, S, d->H, -1)); /* [B,S,H,Dh] */
    *q = df_rms_norm(ctx, *q, w->norm_q, FLUX_EPS); /* per head, [B, S, H, Dh] */
    *k = df_rms_norm(ctx, *k, w->norm_k, FLUX_EPS); /* per head, [B, S, H, Dh] */
}

/* Attention over the joint sequence with RoPE on q and k.
 * q, k, v [B, S, H, Dh], pe [S, Dh/2, 2] -> [B, S, H*Dh] (H*Dh = D on one rank). */
static df_tensor *rope_attention(df_ctx *ctx, df_tensor *q, df_tensor *k, df_tensor *v,
                                 df_tensor *pe, const dims *d)
{
    q = df_rope(ctx, df_permute(ctx, q, DF_SHAPE(0, 2, 1, 3)), pe); /* [B, H, S, Dh] */
    k = df_rope(ctx, df_permute(ctx, k, DF_SHAPE(0, 2, 1, 3)), pe); /* [B, H, S, Dh] */
    v = df_permute(ctx, v, DF_SHAPE(0, 2, 1, 3));                   /* [B, H, S, Dh] view */
    df_tensor *o = df_attention(ctx, q, k, v, NULL, false, 0.0f);   /* [B, H, S, Dh], 1/sqrt(Dh) */
    o = df_transpose(ctx, o, 1, 2);                                 /* [B, S, H, Dh] dense */
    return df_reshape(ctx, o, DF_SHAPE(d->B, d->S, -1));            /* [B, S, H*Dh] */
}

/* The sum over the ranks of a rowwise product's partial results (itself on one rank). */
static df_tensor *tp_sum(df_ctx *ctx, const dims *d, df_tensor *x)
{
    return d->tp > 1 ? df_all_reduce(ctx, x) : x;
}

/* FeedForward(dim, activation "gelu-approximate"): [B, S, D] -> [B, S, D]. */
static df_tensor *feed_forward(df_ctx *ctx, const df_linear_weights *in,
                               const df_linear_weights *out, df_tensor *x, const dims *d)
{
    df_tensor *h = df_gelu_tanh(ctx, df_linear(ctx, x, in)); /* [B, S, 4D/tp] */
    return tp_sum(ctx, d, df_linear(ctx, h, out));           /* [B, S, D]  */
}

/* FluxAttention of a double block (diffusers' `attn` module, what TaylorSeer hooks): the
 * modulated streams nx [B, S_img, D], nc [B, S_txt, D] -> a[0] image, a[1] text, after
 * to_out and to_add_out. */
static void double_attention(df_ctx *ctx, const double_block *b, df_tensor *nx, df_tensor *nc,
                             df_tensor *pe, const dims *d, df_tensor **a)
{
    df_tensor *qx, *kx, *vx, *qc, *kc, *vc;
    project_qkv(ctx, &b->img, nx, d, d->s_img, &qx, &kx, &vx); /* [B, S_img, H, Dh] */
    project_qkv(ctx, &b->txt, nc, d, d->s_txt, &qc, &kc, &vc); /* [B, S_txt, H, Dh] */
    df_tensor *q = df_concat(ctx, qc, qx, 1);                  /* [B, S, H, Dh] text first */
    df_tensor *k = df_concat(ctx, kc, kx, 1);                  /* [B, S, H, Dh] */
    df_tensor *v = df_concat(ctx, vc, vx, 1);                  /* [B, S, H, Dh] */
    df_tensor *o = rope_attention(ctx, q, k, v, pe, d);        /* [B, S, H*Dh] */
    df_tensor *oc = df_slice(ctx, o, 1, 0, d->s_txt);          /* [B, S_txt, H*Dh] */
    df_tensor *ox = df_slice(ctx, o, 1, d->s_txt, d->S);       /* [B, S_img, H*Dh] */
    a[0] = tp_sum(ctx, d, df_linear(ctx, ox, &b->to_out));     /* [B, S_img, D] */
    a[1] = tp_sum(ctx, d, df_linear(ctx, oc, &b->to_add_out)); /* [B, S_txt, D] */
}

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
    df_tensor *nx = df_emb_modulate(ctx, *x, mx[0], mx[1], FLUX_EPS); /* [B, S_img, D] */
    df_tensor *nc = df_emb_modulate(ctx, *c, mc[0], mc[1], FLUX_EPS); /* [B, S_txt, D] */

    df_tensor *a[2]; /* the attention module's outputs: image [B, S_img, D], text [B, S_txt, D] */
    if (!df_step_cache_predict(ctx, cache, slot, a, 2)) {
        double_attention(ctx, b, nx, nc, pe, d, a);
        df_step_cache_update(ctx, cache, slot, a, 2);
    }
    df_tensor *ax = a[0], *ac = a[1];
    df_tensor *hx = df_add(ctx, *x, df_mul(ctx, mx[2], ax));      /* [B, S_img, D] */
    nx = df_emb_modulate(ctx, hx, mx[3], mx[4], FLUX_EPS);        /* [B, S_img, D] */
    df_tensor *fx = feed_forward(ctx, &b->ff_in, &b->ff_out, nx, d); /* [B, S_img, D] */
    *x = df_add(ctx, hx, df_mul(ctx, mx[5], fx));                 /* [B, S_img, D] */

    df_tensor *hc = df_add(ctx, *c, df_mul(ctx, mc[2], ac));              /* [B, S_txt, D] */
    nc = df_emb_modulate(ctx, hc, mc[3], mc[4], FLUX_EPS);                /* [B, S_txt, D] */
    df_tensor *fc = feed_forward(ctx, &b->ff_ctx_in, &b->ff_ctx_out, nc, d); /* [B, S_txt, D] */
    *c = df_add(ctx, hc, df_mul(ctx, mc[5], fc));                         /* [B, S_txt, D] */
}

/* FluxSingleTransformerBlock.forward on the joint sequence. x [B, S, D] -> [B, S, D]. */
static df_tensor *single_block_forward(df_ctx *ctx, const single_block *b, df_tensor *x,
                                       df_tensor *temb, df_tensor *pe, const dims *d,
                                       df_step_cache *cache, int slot)
{
    df_tensor *mod[3]; /* shift, scale, gate: [B, 1, D] */
    df_emb_modulation(ctx, &b->norm, temb, 3, mod);
    df_tensor *n = df_emb_modulate(ctx, x, mod[0], mod[1], FLUX_EPS);    /* [B, S, D]  */
    df_tensor *mlp = df_gelu_tanh(ctx, df_linear(ctx, n, &b->proj_mlp)); /* [B, S, 4D/tp] */
    df_tensor *attn; /* the `attn` module's output (TaylorSeer's unit): [B, S, D/tp] */
    if (!df_step_cache_predict(ctx, cache, slot, &attn, 1)) {
        df_tensor *q, *k, *v;
        project_qkv(ctx, &b->attn, n, d, d->S, &q, &k, &v); /* [B, S, H, Dh] */
        attn = rope_attention(ctx, q, k, v, pe, d);         /* [B, S, D/tp] */
        df_step_cache_update(ctx, cache, slot, &attn, 1);
    }
    df_tensor *h = df_concat(ctx, attn, mlp, 2);                 /* [B, S, 5D/tp] */
    h = tp_sum(ctx, d, df_linear(ctx, h, &b->proj_out));         /* [B, S, D] */
    return df_add(ctx, x, df_mul(ctx, mod[2], h));               /* residual */
}

/* --- repeated blocks --------------------------------------------------------------------- */

/* The weights outside the blocks, resident for the whole forward under sequential offload. */
static const char *const outer_prefixes[] = {"x_embedder.", "context_embedder.", "time_text_embed.",
                                             "norm_out.", "proj_out."};

/* The sizes a block call needs, from its inputs. x [B, S_x, D], c [B, S_c, D] or NULL. */
static dims block_dims(const df_flux *m, const df_tensor *x, const df_tensor *c)
{
    dims d = {.B = df_tensor_dim(x, 0), .D = m->cfg.inner_dim,
              .H = m->cfg.num_attention_heads / m->tp, .tp = m->tp};
    d.s_img = df_tensor_dim(x, 1);
    d.s_txt = c ? df_tensor_dim(c, 1) : 0;
    d.S = d.s_img + d.s_txt;
    return d;
}

/* in: x, c, temb, pe; out: x, c. */
static df_status double_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux *m = model;
    dims d = block_dims(m, in[0], in[1]);
    out[0] = in[0], out[1] = in[1];
    double_block_forward(ctx, &m->blocks[i], &out[0], &out[1], in[2], in[3], &d, m->cache, i);
    return df_ctx_status(ctx);
}

/* in: h (the joint sequence), temb, pe; out: h. */
static df_status single_class_forward(df_ctx *ctx, void *model, int i, df_tensor *const *in,
                                      df_tensor **out)
{
    const df_flux *m = model;
    dims d = block_dims(m, in[0], NULL);
    out[0] = single_block_forward(ctx, &m->singles[i], in[0], in[1], in[2], &d, m->cache,
                                  (int)m->cfg.num_layers + i);
    return df_ctx_status(ctx);
}

/* diffusers' FluxTransformer2DModel._repeated_blocks. */
static const df_block_class double_class = {.name = "FluxTransformerBlock", .n_in = 4,
                                            .n_out = 2, .forward = double_class_forward};
static const df_block_class single_class = {.name = "FluxSingleTransformerBlock", .n_in = 3,
                                            .n_out = 1, .forward = single_class_forward};

static df_status list_blocks(df_flux *m)
{
    df_blocks_init(&m->rep, m, m->ws, outer_prefixes,
                   (int)(sizeof outer_prefixes / sizeof *outer_prefixes));
    for (int i = 0; i < m->cfg.num_layers; i++)
        DF_TRY(df_blocks_add(&m->rep, &double_class, i, "transformer_blocks.%d", i));
    for (int i = 0; i < m->cfg.num_single_layers; i++)
        DF_TRY(df_blocks_add(&m->rep, &single_class, i, "single_transformer_blocks.%d", i));
    return DF_OK;
}

df_status df_flux_compile_repeated_blocks(df_flux *m, const df_compile_opts *opts)
{
    if (!m)
        return df_errorf(DF_E_ARG, "df_flux_compile_repeated_blocks: model is NULL");
    return df_blocks_compile(&m->rep, opts);
}

int df_flux_compiled_programs(const df_flux *m)
{
    return m ? df_blocks_programs(&m->rep) : 0;
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
    if (df_step_cache_head(ctx, m->cache, x0, x)) {
        df_step_cache_keep_head(ctx, m->cache, head);
        return true;
    }
    *h = df_step_cache_skip(ctx, m->cache, head);
    df_blocks_skip_rest(ctx, &m->rep);
    return false;
}

void df_flux_set_step_cache(df_flux *m, df_step_cache *c)
{
    m->cache = c;
}

int df_flux_attention_modules(const df_flux *m)
{
    return (int)(m->cfg.num_layers + m->cfg.num_single_layers);
}

df_tensor *df_flux_forward(df_ctx *ctx, df_flux *m, const df_flux_inputs *in)
{
    if (!ctx)
        return NULL;
    if (df_ctx_status(ctx) != DF_OK)
        return NULL;
    if (!m || !in)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "flux forward: model and inputs are required"));
    if (ctx != m->ctx)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "flux forward: the model was loaded into "
                                                    "another context"));
    dims d = {0};
    df_status s = check_inputs(m, in, &d);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s);

    df_scope outer = df_scope_begin(ctx);
    df_blocks_begin(ctx, &m->rep);
    df_tensor *x = df_linear(ctx, in->hidden_states, &m->x_embedder); /* [B, S_img, D] */
    df_tensor *temb = conditioning(ctx, m, in);                       /* [B, D] */
    df_tensor *txt = in->encoder_hidden_states;
    df_tensor *c = df_linear(ctx, txt, &m->context_embedder); /* [B, S_txt, D] */
    df_tensor *pe = df_emb_rope_table(ctx, ids_2d(ctx, in->txt_ids), ids_2d(ctx, in->img_ids),
                                      m->axes, m->cfg.n_axes, FLUX_ROPE_THETA); /* [S, Dh/2, 2] */

    /* One fixed mark: df_blocks_run ends it after block i, releasing block i-1's outputs. */
    df_step_cache_begin(m->cache);
    bool first_block = df_step_cache_first_block(m->cache), rest = true;
    df_tensor *h = NULL; /* [B, S, D] joint sequence, text first */
    if (df_step_cache_mag(m->cache)) {
        df_tensor *xs = df_step_cache_mag_head(ctx, m->cache, x); /* the blocks skipped? */
        if (xs)
            h = df_concat(ctx, c, xs, 1), rest = false;
    }
    df_scope mark = df_scope_begin(ctx);
    for (int i = 0; i < m->cfg.num_layers && rest; i++) {
        df_tensor *x0 = x, *io[2];
        df_blocks_run(ctx, &m->rep, i, mark, (df_tensor *[]){x, c, temb, pe}, io);
        x = io[0], c = io[1];
        if (i == 0 && first_block)
            rest = first_block_head(ctx, m, x0, x, c, &h);
    }
    if (rest) {
        h = df_concat(ctx, c, x, 1);
        mark = df_scope_begin(ctx);
        for (int i = 0; i < m->cfg.num_single_layers; i++) {
            df_blocks_run(ctx, &m->rep, (int)m->cfg.num_layers + i, mark,
                          (df_tensor *[]){h, temb, pe}, &h);
        }
        if (first_block)
            df_step_cache_tail(ctx, m->cache, h);
        if (df_step_cache_mag(m->cache))
            df_step_cache_mag_tail(ctx, m->cache, df_slice(ctx, h, 1, d.s_txt, d.S));
    }
    df_step_cache_end(m->cache);
    x = df_slice(ctx, h, 1, d.s_txt, d.S);                                /* [B, S_img, D] */
    x = df_emb_ada_norm_continuous(ctx, &m->norm_out, x, temb, FLUX_EPS); /* [B, S_img, D] */
    df_tensor *out = df_linear(ctx, x, &m->proj_out);                     /* [B, S_img, out] */
    df_blocks_end(ctx, &m->rep);
    return df_scope_end(ctx, outer, out);
}
