/*
 * The T5 encoder: transformers' T5EncoderModel (v1.1: gated-GELU feed-forward).
 *
 * Embedding lookup (no scaling), then per block: RMS norm, self-attention without scaling
 * whose scores get the relative position bias (plus the padding mask), residual; RMS norm,
 * gelu_tanh(wi_0 x) * wi_1 x, wo, residual. A final RMS norm. No biases anywhere.
 *
 * Choices:
 * - The relative position bucket of every (query, key) pair is computed on the host,
 *   exactly as transformers does it (bidirectional: half the buckets for keys after the
 *   query; below max_exact exact, above it logarithmic, with the log and the divisions in
 *   float32 and truncation to an integer), and the bias rows are gathered from layer 0's
 *   table on the device: [S, S, H] -> [1, H, S, S], made dense once and passed to every
 *   layer's attention as its additive mask.
 * - The padding mask becomes (mask - 1) * FLT_MAX, i.e. 0 or the most negative float,
 *   added to the bias once ([B, H, S, S]); transformers adds finfo.min the same way.
 * - The tied embedding is `shared.weight` or `encoder.embed_tokens.weight`; a checkpoint
 *   holding both binds both (they must have the same shape) and uses the encoder's.
 * - Tensor parallelism: with a communicator of N > 1 ranks on the context, the encoder loads
 *   sharded by tp_plan: each rank runs num_heads/N heads (q, k, v colwise, o rowwise, and
 *   its heads' columns of the relative position bias table) and d_ff/N of the gated
 *   feed-forward (wi_0, wi_1 colwise, wo rowwise); an all-reduce after o and wo gives every
 *   rank the full hidden states. The embedding and the norms are replicated.
 * - Only "gated-gelu" feed-forwards are implemented (T5 v1.1, FLUX, SD3); "relu" (T5 v1.0)
 *   and the others are DF_E_UNSUPPORTED.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/dist.h>
#include <diffuse/json.h>
#include <diffuse/ops.h>
#include <diffuse/t5.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/loader.h"
#include "models/weight_sets.h"
#include "models/text_config.h"

/* The tensor-parallel plan (see the top of the file); T5 has no biases to place. */
static const df_tp_rule tp_plan[] = {
    {"encoder.block.*.layer.0.SelfAttention.q", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.k", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.v", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.0.SelfAttention.o", DF_SHARD_ROWWISE},
    /* [num_buckets, H]: colwise splits the last dimension, the heads */
    {"encoder.block.0.layer.0.SelfAttention.relative_attention_bias", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_0", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wi_1", DF_SHARD_COLWISE},
    {"encoder.block.*.layer.1.DenseReluDense.wo", DF_SHARD_ROWWISE},
};

typedef struct t5_block {
    df_tensor *attn_norm;             /* layer.0.layer_norm [d_model] */
    df_linear_weights q, k, v, o;     /* [H*d_kv, d_model] x3, [d_model, H*d_kv] */
    df_tensor *ff_norm;               /* layer.1.layer_norm [d_model] */
    df_linear_weights wi_0, wi_1, wo; /* [d_ff, d_model] x2, [d_model, d_ff] */
} t5_block;

struct df_t5 {
    df_t5_config cfg;
    int tp;        /* tensor-parallel ranks */
    int64_t heads; /* this rank's heads: num_heads / tp */
    df_weight_set *ws;
    df_tensor *embed;         /* [V, d_model] */
    df_tensor *relative_bias; /* [num_buckets, H], block 0 only */
    t5_block *blocks;
    df_tensor *final_norm; /* [d_model] */
};

/* --- config ------------------------------------------------------------------------------ */

static df_status read_config(const df_json *j, df_t5_config *c)
{
    *c = (df_t5_config){0};
    static const char *const classes[] = {"T5EncoderModel", "T5ForConditionalGeneration"};
    DF_TRY(df_text_config_class(j, classes, 2));
    const char *ff;
    DF_TRY(df_json_get_string_or(j, "feed_forward_proj", "relu", &ff));
    if (strcmp(ff, "gated-gelu") != 0 && strcmp(ff, "gated-gelu_new") != 0 &&
        strcmp(ff, "gated-gelu_pytorch_tanh") != 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key 'feed_forward_proj': '%s' is not implemented (only the T5 v1.1 "
                         "\"gated-gelu\" feed-forward is)",
                         df_json_source(j), ff);
    DF_TRY(df_text_config_int(j, "d_model", -1, DF_TEXT_MAX_WIDTH, &c->d_model));
    DF_TRY(df_text_config_int(j, "d_kv", 64, DF_TEXT_MAX_WIDTH, &c->d_kv));
    DF_TRY(df_text_config_int(j, "d_ff", -1, DF_TEXT_MAX_WIDTH, &c->d_ff));
    DF_TRY(df_text_config_int(j, "num_layers", -1, DF_TEXT_MAX_LAYERS, &c->num_layers));
    DF_TRY(df_text_config_int(j, "num_heads", -1, DF_TEXT_MAX_WIDTH, &c->num_heads));
    DF_TRY(df_text_config_int(j, "relative_attention_num_buckets", 32, DF_TEXT_MAX_POSITIONS,
                              &c->relative_attention_num_buckets));
    DF_TRY(df_text_config_int(j, "relative_attention_max_distance", 128, DF_TEXT_MAX_POSITIONS,
                              &c->relative_attention_max_distance));
    DF_TRY(df_text_config_int(j, "vocab_size", -1, DF_TEXT_MAX_VOCAB, &c->vocab_size));
    DF_TRY(df_text_config_eps(j, "layer_norm_epsilon", 1e-6, &c->layer_norm_epsilon));
    if (c->num_heads * c->d_kv > DF_TEXT_MAX_WIDTH)
        return df_errorf(DF_E_FORMAT,
                         "%s: keys 'num_heads' x 'd_kv': %" PRId64 " x %" PRId64
                         " is an impossible attention width",
                         df_json_source(j), c->num_heads, c->d_kv);
    /* Bidirectional buckets: half per direction, half of those exact; the logarithmic
     * range needs at least one exact bucket and a max distance beyond the exact ones. */
    int64_t max_exact = c->relative_attention_num_buckets / 4;
    if (max_exact < 1 || c->relative_attention_max_distance <= max_exact)
        return df_errorf(DF_E_FORMAT,
                         "%s: keys 'relative_attention_num_buckets' %" PRId64
                         " and 'relative_attention_max_distance' %" PRId64
                         ": need at least 4 buckets and a max distance above a quarter of them",
                         df_json_source(j), c->relative_attention_num_buckets,
                         c->relative_attention_max_distance);
    return DF_OK;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_block(df_weight_set *ws, const df_t5_config *c, int i, t5_block *b)
{
    int64_t d = c->d_model, inner = c->num_heads * c->d_kv, f = c->d_ff;
    const char *p = "encoder.block";
    DF_TRY(df_ws_tensor(ws, &b->attn_norm, 1, (int64_t[]){d}, "%s.%d.layer.0.layer_norm.weight", p,
                        i));
    DF_TRY(df_ws_linear(ws, &b->q, inner, d, false, "%s.%d.layer.0.SelfAttention.q", p, i));
    DF_TRY(df_ws_linear(ws, &b->k, inner, d, false, "%s.%d.layer.0.SelfAttention.k", p, i));
    DF_TRY(df_ws_linear(ws, &b->v, inner, d, false, "%s.%d.layer.0.SelfAttention.v", p, i));
    DF_TRY(df_ws_linear(ws, &b->o, d, inner, false, "%s.%d.layer.0.SelfAttention.o", p, i));
    DF_TRY(
        df_ws_tensor(ws, &b->ff_norm, 1, (int64_t[]){d}, "%s.%d.layer.1.layer_norm.weight", p, i));
    DF_TRY(df_ws_linear(ws, &b->wi_0, f, d, false, "%s.%d.layer.1.DenseReluDense.wi_0", p, i));
    DF_TRY(df_ws_linear(ws, &b->wi_1, f, d, false, "%s.%d.layer.1.DenseReluDense.wi_1", p, i));
    DF_TRY(df_ws_linear(ws, &b->wo, d, f, false, "%s.%d.layer.1.DenseReluDense.wo", p, i));
    return DF_OK;
}

static df_status bind_weights(df_t5 *m)
{
    const df_t5_config *c = &m->cfg;
    df_weight_set *ws = m->ws;
    int64_t emb_shape[2] = {c->vocab_size, c->d_model};
    bool has_shared = df_ws_has(ws, "shared.weight");
    if (df_ws_has(ws, "encoder.embed_tokens.weight") || !has_shared)
        DF_TRY(df_ws_tensor(ws, &m->embed, 2, emb_shape, "encoder.embed_tokens.weight"));
    if (has_shared) {
        df_tensor *shared;
        DF_TRY(df_ws_tensor(ws, &shared, 2, emb_shape, "shared.weight"));
        if (!m->embed)
            m->embed = shared;
    }
    DF_TRY(df_ws_tensor(ws, &m->relative_bias, 2,
                        (int64_t[]){c->relative_attention_num_buckets, c->num_heads},
                        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"));
    for (int i = 0; i < c->num_layers; i++)
        DF_TRY(bind_block(ws, c, i, &m->blocks[i]));
    DF_TRY(df_ws_tensor(ws, &m->final_norm, 1, (int64_t[]){c->d_model},
                        "encoder.final_layer_norm.weight"));
    return df_ws_check_all_used(ws);
}

/* Splits the encoder over the context's ranks, if it has several. */
static df_status shard(df_t5 *m, df_ctx *ctx, const char *name)
{
    df_comm *comm = df_ctx_comm(ctx);
    m->tp = df_comm_size(comm);
    m->heads = m->cfg.num_heads / m->tp;
    if (m->tp <= 1)
        return DF_OK;
    if (m->cfg.num_heads % m->tp || m->cfg.d_ff % m->tp)
        return df_errorf(DF_E_ARG, "%s: num_heads %" PRId64 " and d_ff %" PRId64 " must both be "
                         "divisible by the %d tensor-parallel ranks", name, m->cfg.num_heads,
                         m->cfg.d_ff, m->tp);
    df_ws_set_tp_plan(m->ws, tp_plan, (int)(sizeof tp_plan / sizeof *tp_plan),
                      df_comm_rank(comm), m->tp);
    return DF_OK;
}

df_status df_t5_load(df_ctx *ctx, const char *dir, df_t5 **out)
{
    return df_t5_load_file(ctx, dir, NULL, out);
}

df_status df_t5_load_file(df_ctx *ctx, const char *dir, const char *file, df_t5 **out)
{
    *out = NULL;
    df_t5 *m = df_calloc(1, sizeof *m);
    if (!m)
        return df_errorf(DF_E_OOM, "t5: out of memory");
    const df_json *cfg = NULL;
    char name[128];
    df_text_component_name(dir, "text_encoder", name, sizeof name);
    df_status s = file ? df_weight_set_open_single(ctx, dir, file, name, df_names_same, 0,
                                                   df_names_t5_probe(), &m->ws)
                       : df_weight_set_open(ctx, dir, name, &m->ws);
    /* A file without transformers' names may hold llama.cpp's (a T5 encoder GGUF). */
    if (s == DF_OK && file)
        df_ws_try_map(m->ws, df_names_t5_llamacpp, 0, df_names_t5_llamacpp_probe(), NULL);
    if (s == DF_OK)
        s = df_weight_set_config(m->ws, &cfg);
    if (s == DF_OK)
        s = read_config(cfg, &m->cfg);
    if (s == DF_OK) {
        m->blocks = df_calloc((size_t)m->cfg.num_layers, sizeof *m->blocks);
        if (!m->blocks)
            s = df_errorf(DF_E_OOM, "t5: out of memory");
    }
    if (s == DF_OK)
        s = shard(m, ctx, name);
    if (s == DF_OK)
        s = bind_weights(m);
    if (s != DF_OK) {
        df_t5_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

const df_t5_config *df_t5_get_config(const df_t5 *m)
{
    return &m->cfg;
}

void df_t5_free(df_t5 *m)
{
    if (!m)
        return;
    df_weight_set_free(m->ws);
    df_free(m->blocks);
    df_free(m);
}

/* --- relative position bias -------------------------------------------------------------- */

/* T5Attention._relative_position_bucket with bidirectional = true. rel = key - query. */
static int32_t position_bucket(int64_t rel, int64_t num_buckets, int64_t max_distance)
{
    int64_t half = num_buckets / 2;
    int64_t bucket = rel > 0 ? half : 0;
    int64_t n = rel < 0 ? -rel : rel;
    int64_t max_exact = half / 2;
    if (n < max_exact)
        return (int32_t)(bucket + n);
    /* float32 throughout, as torch computes it: log(n / max_exact) / log(max_distance /
     * max_exact) * (half - max_exact), the Python double divisor rounded to float32. */
    float ratio = (float)n / (float)max_exact;
    float denom = (float)log((double)max_distance / (double)max_exact);
    float scaled = logf(ratio) / denom * (float)(half - max_exact);
    int64_t large = half - 1;
    if (scaled < (float)(half - 1 - max_exact))
        large = max_exact + (int64_t)scaled;
    return (int32_t)(bucket + large);
}

/* T5Attention.compute_bias: [1, H, S, S] f32, dense (H: this rank's heads). */
static df_tensor *position_bias(df_ctx *ctx, const df_t5 *m, int64_t s)
{
    const df_t5_config *c = &m->cfg;
    int32_t *buckets = df_malloc((size_t)(s * s) * sizeof *buckets);
    if (!buckets) {
        df_errorf(DF_E_OOM, "t5: out of memory for the %" PRId64 "x%" PRId64 " bucket table", s, s);
        return NULL;
    }
    for (int64_t i = 0; i < s; i++)
        for (int64_t j = 0; j < s; j++)
            buckets[i * s + j] = position_bucket(j - i, c->relative_attention_num_buckets,
                                                 c->relative_attention_max_distance);
    df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I32, DF_SHAPE(s, s), buckets);
    df_free(buckets);
    df_tensor *bias = df_gather(ctx, m->relative_bias, ids);             /* [S, S, H] */
    bias = df_contiguous(ctx, df_permute(ctx, bias, DF_SHAPE(2, 0, 1))); /* [H, S, S] */
    return df_unsqueeze(ctx, bias, 0);                                   /* [1, H, S, S] */
}

/* --- forward ----------------------------------------------------------------------------- */

/* [B, S, H*Dh] -> [B, H, S, Dh] (a view) */
static df_tensor *split_heads(df_ctx *ctx, df_tensor *x, int64_t heads, int64_t dh)
{
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1);
    x = df_reshape(ctx, x, DF_SHAPE(b, s, heads, dh));
    return df_permute(ctx, x, DF_SHAPE(0, 2, 1, 3));
}

/* The sum over the ranks of a rowwise product's partial results (itself on one rank). */
static df_tensor *tp_sum(df_ctx *ctx, const df_t5 *m, df_tensor *x)
{
    return m->tp > 1 ? df_all_reduce(ctx, x) : x;
}

/* T5Block.forward (encoder). x: [B, S, d_model], bias: additive [1 or B, H, S, S], H this
 * rank's heads. */
static df_tensor *block_forward(df_ctx *ctx, const df_t5 *m, const t5_block *bl, df_tensor *x,
                                df_tensor *bias)
{
    const df_t5_config *c = &m->cfg;
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1), h = m->heads;
    float eps = (float)c->layer_norm_epsilon;
    df_tensor *n = df_rms_norm(ctx, x, bl->attn_norm, eps);
    df_tensor *q = split_heads(ctx, df_linear(ctx, n, &bl->q), h, c->d_kv);
    df_tensor *k = split_heads(ctx, df_linear(ctx, n, &bl->k), h, c->d_kv);
    df_tensor *v = split_heads(ctx, df_linear(ctx, n, &bl->v), h, c->d_kv);
    df_tensor *a = df_attention(ctx, q, k, v, bias, false, 1.0f); /* [B, H, S, d_kv], unscaled */
    a = df_reshape(ctx, df_transpose(ctx, a, 1, 2), DF_SHAPE(b, s, h * c->d_kv));
    x = df_add(ctx, x, tp_sum(ctx, m, df_linear(ctx, a, &bl->o)));
    n = df_rms_norm(ctx, x, bl->ff_norm, eps);
    df_tensor *gate = df_gelu_tanh(ctx, df_linear(ctx, n, &bl->wi_0)); /* [B, S, d_ff/tp] */
    df_tensor *up = df_linear(ctx, n, &bl->wi_1);                      /* [B, S, d_ff/tp] */
    df_tensor *ff = df_linear(ctx, df_mul(ctx, gate, up), &bl->wo);    /* [B, S, d_model] */
    return df_add(ctx, x, tp_sum(ctx, m, ff));
}

static df_status check_inputs(df_tensor *ids, df_tensor *mask)
{
    char di[96], dm[96];
    df_dtype t = df_tensor_dtype(ids);
    if (df_tensor_ndim(ids) != 2 || (t != DF_DTYPE_I64 && t != DF_DTYPE_I32) ||
        df_tensor_dim(ids, 0) < 1 || df_tensor_dim(ids, 1) < 1)
        return df_errorf(DF_E_ARG, "t5: input ids %s must be a [B, S] i32 or i64 tensor",
                         df_tensor_describe(ids, di, sizeof di));
    if (mask && (df_tensor_ndim(mask) != 2 || df_tensor_dim(mask, 0) != df_tensor_dim(ids, 0) ||
                 df_tensor_dim(mask, 1) != df_tensor_dim(ids, 1)))
        return df_errorf(DF_E_ARG, "t5: attention mask %s does not match input ids %s",
                         df_tensor_describe(mask, dm, sizeof dm),
                         df_tensor_describe(ids, di, sizeof di));
    return DF_OK;
}

df_status df_t5_encode(df_ctx *ctx, const df_t5 *m, df_tensor *ids, df_tensor *attention_mask,
                       df_tensor **out)
{
    *out = NULL;
    if (!ids)
        return df_ctx_status(ctx) != DF_OK ? df_ctx_status(ctx)
                                           : df_errorf(DF_E_ARG, "t5: no input ids");
    DF_TRY(check_inputs(ids, attention_mask));
    const df_t5_config *c = &m->cfg;
    int64_t b = df_tensor_dim(ids, 0), s = df_tensor_dim(ids, 1);

    df_scope base = df_scope_begin(ctx);
    df_tensor *bias = position_bias(ctx, m, s); /* [1, H, S, S] */
    if (!bias && df_ctx_status(ctx) == DF_OK) {
        df_scope_end(ctx, base, NULL);
        return DF_E_OOM; /* the message is set */
    }
    if (attention_mask) {
        /* 1 -> 0, 0 -> -FLT_MAX: (1 - mask) * finfo.min */
        df_tensor *add =
            df_scale(ctx, df_cast(ctx, attention_mask, DF_DTYPE_F32), FLT_MAX, -FLT_MAX);
        bias = df_add(ctx, bias, df_reshape(ctx, add, DF_SHAPE(b, 1, 1, s))); /* [B, H, S, S] */
    }
    df_tensor *x = df_gather(ctx, m->embed, ids); /* [B, S, d_model] */
    for (int i = 0; i < c->num_layers; i++) {
        x = block_forward(ctx, m, &m->blocks[i], x, bias);
        df_scope_end_n(ctx, base, (df_tensor *[]){bias, x}, 2);
    }
    x = df_rms_norm(ctx, x, m->final_norm, (float)c->layer_norm_epsilon);
    df_status st = df_ctx_status(ctx);
    df_scope_end(ctx, base, st == DF_OK ? x : NULL);
    if (st == DF_OK)
        *out = x;
    return st;
}

df_weight_set *df_t5_weight_set(const df_t5 *m)
{
    return m->ws;
}
