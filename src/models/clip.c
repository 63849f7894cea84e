/*
 * CLIP text encoders: transformers' CLIPTextModel and CLIPTextModelWithProjection.
 *
 * Token + position embeddings, pre-LN transformer layers with causal attention (no padding
 * mask, as the pipelines call it), final layer norm, the pooled output at each row's EOS
 * position and, for the projection class, text_embeds = pooled @ text_projection^T.
 *
 * Choices:
 * - The class is the checkpoint's: `text_projection.weight` present means the projection
 *   class. stable-diffusion.cpp's `convert --convert-name` names it
 *   `text_model.text_projection` (no ".weight"), holding transformers' tensor unchanged (its
 *   CLIP multiplies by it as a linear weight), and is read under that name too.
 *   `position_ids` buffers some checkpoints carry are accepted and ignored (positions are
 *   always 0..S-1).
 * - The EOS position is found on the device from the ids (df_token_rows: the first EOS
 *   token, or the first largest id when eos_token_id is 2, as transformers does) and the
 *   pooled rows are gathered from last_hidden_state viewed as [B*S, D], so the ids are
 *   given once, as a tensor, and never read back. An id outside the vocabulary fails the
 *   stream in the token embedding's gather (the message names the id and its position).
 * - transformers' hidden_states tuple has n_layers + 1 entries; the caller asks for the
 *   indices it needs and only those are kept alive: the forward keeps one rolling scope
 *   that holds the requested states and the current one, so memory stays at one layer's
 *   working set plus the requested outputs.
 * - Config values are checked (positive, heads dividing the width, below generous bounds)
 *   before anything is sized from them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/clip.h>
#include <diffuse/json.h>
#include <diffuse/ops.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/loader.h"
#include "models/weight_sets.h"
#include "models/text_config.h"

typedef struct clip_layer {
    df_tensor *ln1_w, *ln1_b, *ln2_w, *ln2_b;
    df_linear_weights q, k, v, out, fc1, fc2;
} clip_layer;

struct df_clip {
    df_clip_config cfg;
    df_weight_set *ws;
    df_tensor *token_embedding;    /* [V, D] */
    df_tensor *position_embedding; /* [P, D] */
    clip_layer *layers;
    df_tensor *final_ln_w, *final_ln_b;
    df_linear_weights text_projection; /* [proj, D], no bias; projection class only */
};

/* --- config ------------------------------------------------------------------------------ */

static df_status read_act(const df_json *cfg, df_clip_act *out)
{
    const char *act;
    DF_TRY(df_json_get_string_or(cfg, "hidden_act", "quick_gelu", &act));
    if (strcmp(act, "quick_gelu") == 0)
        *out = DF_CLIP_ACT_QUICK_GELU;
    else if (strcmp(act, "gelu") == 0)
        *out = DF_CLIP_ACT_GELU;
    else if (strcmp(act, "gelu_new") == 0 || strcmp(act, "gelu_pytorch_tanh") == 0)
        *out = DF_CLIP_ACT_GELU_TANH;
    else
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key 'hidden_act': activation '%s' is not implemented (quick_gelu, "
                         "gelu, gelu_new, gelu_pytorch_tanh are)",
                         df_json_source(cfg), act);
    return DF_OK;
}

static df_status read_config(const df_json *j, bool with_projection, df_clip_config *c)
{
    *c = (df_clip_config){.with_projection = with_projection};
    static const char *const classes[] = {"CLIPTextModel", "CLIPTextModelWithProjection"};
    DF_TRY(df_text_config_class(j, classes, 2));
    DF_TRY(df_text_config_int(j, "hidden_size", -1, DF_TEXT_MAX_WIDTH, &c->hidden_size));
    DF_TRY(
        df_text_config_int(j, "intermediate_size", -1, DF_TEXT_MAX_WIDTH, &c->intermediate_size));
    DF_TRY(
        df_text_config_int(j, "num_hidden_layers", -1, DF_TEXT_MAX_LAYERS, &c->num_hidden_layers));
    DF_TRY(df_text_config_int(j, "num_attention_heads", -1, DF_TEXT_MAX_WIDTH,
                              &c->num_attention_heads));
    DF_TRY(df_text_config_int(j, "max_position_embeddings", 77, DF_TEXT_MAX_POSITIONS,
                              &c->max_position_embeddings));
    DF_TRY(df_text_config_int(j, "vocab_size", -1, DF_TEXT_MAX_VOCAB, &c->vocab_size));
    DF_TRY(df_text_config_int(j, "projection_dim", 512, DF_TEXT_MAX_WIDTH, &c->projection_dim));
    DF_TRY(df_json_get_int_or(j, "eos_token_id", 49407, &c->eos_token_id));
    DF_TRY(df_text_config_eps(j, "layer_norm_eps", 1e-5, &c->layer_norm_eps));
    DF_TRY(read_act(j, &c->hidden_act));
    if (c->hidden_size % c->num_attention_heads != 0)
        return df_errorf(DF_E_FORMAT,
                         "%s: key 'num_attention_heads': %" PRId64 " heads do not divide "
                         "hidden_size %" PRId64,
                         df_json_source(j), c->num_attention_heads, c->hidden_size);
    return DF_OK;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_layer(df_weight_set *ws, const df_clip_config *c, int i, clip_layer *l)
{
    int64_t d = c->hidden_size, f = c->intermediate_size;
    const char *p = "text_model.encoder.layers";
    DF_TRY(df_ws_tensor(ws, &l->ln1_w, 1, (int64_t[]){d}, "%s.%d.layer_norm1.weight", p, i));
    DF_TRY(df_ws_tensor(ws, &l->ln1_b, 1, (int64_t[]){d}, "%s.%d.layer_norm1.bias", p, i));
    DF_TRY(df_ws_linear(ws, &l->q, d, d, true, "%s.%d.self_attn.q_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->k, d, d, true, "%s.%d.self_attn.k_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->v, d, d, true, "%s.%d.self_attn.v_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->out, d, d, true, "%s.%d.self_attn.out_proj", p, i));
    DF_TRY(df_ws_tensor(ws, &l->ln2_w, 1, (int64_t[]){d}, "%s.%d.layer_norm2.weight", p, i));
    DF_TRY(df_ws_tensor(ws, &l->ln2_b, 1, (int64_t[]){d}, "%s.%d.layer_norm2.bias", p, i));
    DF_TRY(df_ws_linear(ws, &l->fc1, f, d, true, "%s.%d.mlp.fc1", p, i));
    DF_TRY(df_ws_linear(ws, &l->fc2, d, f, true, "%s.%d.mlp.fc2", p, i));
    return DF_OK;
}

/* The projection's name in the checkpoint, or NULL for the class without one. */
static const char *projection_name(df_weight_set *ws)
{
    if (df_ws_has(ws, "text_projection.weight"))
        return "text_projection.weight";
    if (df_ws_has(ws, "text_model.text_projection")) /* stable-diffusion.cpp's name */
        return "text_model.text_projection";
    return NULL;
}

static df_status bind_weights(df_clip *m)
{
    const df_clip_config *c = &m->cfg;
    df_weight_set *ws = m->ws;
    int64_t d = c->hidden_size;
    DF_TRY(df_ws_tensor(ws, &m->token_embedding, 2, (int64_t[]){c->vocab_size, d},
                        "text_model.embeddings.token_embedding.weight"));
    DF_TRY(df_ws_tensor(ws, &m->position_embedding, 2, (int64_t[]){c->max_position_embeddings, d},
                        "text_model.embeddings.position_embedding.weight"));
    for (int i = 0; i < c->num_hidden_layers; i++)
        DF_TRY(bind_layer(ws, c, i, &m->layers[i]));
    DF_TRY(
        df_ws_tensor(ws, &m->final_ln_w, 1, (int64_t[]){d}, "text_model.final_layer_norm.weight"));
    DF_TRY(df_ws_tensor(ws, &m->final_ln_b, 1, (int64_t[]){d}, "text_model.final_layer_norm.bias"));
    const char *proj = c->with_projection ? projection_name(ws) : NULL;
    if (proj && strcmp(proj, "text_projection.weight") == 0)
        DF_TRY(
            df_ws_linear(ws, &m->text_projection, c->projection_dim, d, false, "text_projection"));
    else if (proj) /* stable-diffusion.cpp's name: the weight alone, no bias */
        DF_TRY(df_ws_tensor(ws, &m->text_projection.weight, 2,
                            (int64_t[]){c->projection_dim, d}, "%s", proj));
    /* A buffer of 0..P-1 in older checkpoints; the forward makes its own positions. */
    df_ws_ignore_prefix(ws, "text_model.embeddings.position_ids");
    df_ws_ignore_prefix(ws, "embeddings.position_ids"); /* a file without "text_model." */
    return df_ws_check_all_used(ws);
}

df_status df_clip_load(df_ctx *ctx, const char *dir, df_clip **out)
{
    return df_clip_load_file(ctx, dir, NULL, out);
}

/* A single file: transformers' names under some prefix, without "text_model.", or
 * OpenCLIP's. */
static df_status open_file(df_ctx *ctx, const char *dir, const char *file, const char *name,
                           df_weight_set **out)
{
    /* SD3's second CLIP is CLIP-G: in an all-in-one file, the one under "clip_g". */
    const char *hint = strcmp(name, "text_encoder_2") == 0 ? "clip_g" : "clip_l";
    DF_TRY(df_weight_set_open_single(ctx, dir, file, name, NULL, 0, NULL, out));
    if (!df_ws_try_map(*out, df_names_same, 0, df_names_clip_probe(), hint) &&
        !df_ws_try_map(*out, df_names_clip_bare, 0, df_names_clip_bare_probe(), hint))
        df_ws_try_map(*out, df_names_clip_openclip, 0, df_names_clip_openclip_probe(), hint);
    return DF_OK;
}

df_status df_clip_load_file(df_ctx *ctx, const char *dir, const char *file, df_clip **out)
{
    *out = NULL;
    df_clip *m = df_calloc(1, sizeof *m);
    if (!m)
        return df_errorf(DF_E_OOM, "clip: out of memory");
    const df_json *cfg = NULL;
    char name[128];
    df_text_component_name(dir, "text_encoder", name, sizeof name);
    df_status s = file ? open_file(ctx, dir, file, name, &m->ws)
                       : df_weight_set_open(ctx, dir, name, &m->ws);
    if (s == DF_OK)
        s = df_weight_set_config(m->ws, &cfg);
    if (s == DF_OK)
        s = read_config(cfg, projection_name(m->ws) != NULL, &m->cfg);
    if (s == DF_OK) {
        m->layers = df_calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
        if (!m->layers)
            s = df_errorf(DF_E_OOM, "clip: out of memory");
    }
    if (s == DF_OK)
        s = bind_weights(m);
    if (s != DF_OK) {
        df_clip_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

const df_clip_config *df_clip_get_config(const df_clip *m)
{
    return &m->cfg;
}

void df_clip_free(df_clip *m)
{
    if (!m)
        return;
    df_weight_set_free(m->ws);
    df_free(m->layers);
    df_free(m);
}

/* --- forward ----------------------------------------------------------------------------- */

static df_tensor *activation(df_ctx *ctx, df_clip_act act, df_tensor *x)
{
    switch (act) {
    case DF_CLIP_ACT_GELU:
        return df_gelu(ctx, x);
    case DF_CLIP_ACT_GELU_TANH:
        return df_gelu_tanh(ctx, x);
    default:
        return df_quick_gelu(ctx, x);
    }
}

/* [B, S, H*Dh] -> [B, H, S, Dh] (a view) */
static df_tensor *split_heads(df_ctx *ctx, df_tensor *x, int64_t heads)
{
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1), d = df_tensor_dim(x, 2);
    x = df_reshape(ctx, x, DF_SHAPE(b, s, heads, d / heads));
    return df_permute(ctx, x, DF_SHAPE(0, 2, 1, 3));
}

/* CLIPEncoderLayer.forward. x: [B, S, D] */
static df_tensor *layer_forward(df_ctx *ctx, const df_clip_config *c, const clip_layer *l,
                                df_tensor *x)
{
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1), d = c->hidden_size;
    float eps = (float)c->layer_norm_eps;
    df_tensor *h = df_layer_norm(ctx, x, l->ln1_w, l->ln1_b, eps);
    df_tensor *q = split_heads(ctx, df_linear(ctx, h, &l->q), c->num_attention_heads);
    df_tensor *k = split_heads(ctx, df_linear(ctx, h, &l->k), c->num_attention_heads);
    df_tensor *v = split_heads(ctx, df_linear(ctx, h, &l->v), c->num_attention_heads);
    df_tensor *a = df_attention(ctx, q, k, v, NULL, true, 0.0f); /* [B, H, S, Dh], 1/sqrt(Dh) */
    a = df_reshape(ctx, df_transpose(ctx, a, 1, 2), DF_SHAPE(b, s, d)); /* free: [B, S, H, Dh] */
    x = df_add(ctx, x, df_linear(ctx, a, &l->out));
    h = df_layer_norm(ctx, x, l->ln2_w, l->ln2_b, eps);
    h = df_linear(ctx, activation(ctx, c->hidden_act, df_linear(ctx, h, &l->fc1)), &l->fc2);
    return df_add(ctx, x, h);
}

static df_status check_ids(const df_clip *m, df_tensor *ids)
{
    char desc[96];
    df_dtype t = df_tensor_dtype(ids);
    if (df_tensor_ndim(ids) != 2 || (t != DF_DTYPE_I64 && t != DF_DTYPE_I32) ||
        df_tensor_dim(ids, 0) < 1 || df_tensor_dim(ids, 1) < 1)
        return df_errorf(DF_E_ARG, "clip: input ids %s must be a [B, S] i32 or i64 tensor",
                         df_tensor_describe(ids, desc, sizeof desc));
    if (df_tensor_dim(ids, 1) > m->cfg.max_position_embeddings)
        return df_errorf(DF_E_ARG,
                         "clip: %" PRId64 " tokens exceed max_position_embeddings %" PRId64,
                         df_tensor_dim(ids, 1), m->cfg.max_position_embeddings);
    return DF_OK;
}

/* Python-style hidden-state indices -> 0..n_layers. */
static df_status resolve_request(const df_clip *m, const df_clip_request *req, int *idx)
{
    int n = req ? req->n_hidden_states : 0;
    int64_t count = m->cfg.num_hidden_layers + 1;
    if (n < 0 || n > DF_CLIP_MAX_HIDDEN)
        return df_errorf(DF_E_ARG, "clip: %d hidden states requested (at most %d)", n,
                         DF_CLIP_MAX_HIDDEN);
    for (int i = 0; i < n; i++) {
        int64_t j = req->hidden_states[i];
        if (j < 0)
            j += count;
        if (j < 0 || j >= count)
            return df_errorf(DF_E_ARG,
                             "clip: hidden_states[%d] does not exist (the model has %" PRId64
                             " hidden states)",
                             req->hidden_states[i], count);
        idx[i] = (int)j;
    }
    return DF_OK;
}

/* Keeps the requested states made so far and `cur` alive; releases the rest since `base`. */
static void roll_scope(df_ctx *ctx, df_scope base, df_clip_output *o, int n_req, df_tensor *cur)
{
    df_tensor *keep[DF_CLIP_MAX_HIDDEN + 1];
    int n = 0;
    for (int i = 0; i < n_req; i++)
        keep[n++] = o->hidden_states[i];
    keep[n++] = cur;
    df_scope_end_n(ctx, base, keep, n);
}

static void note_state(df_clip_output *o, const int *idx, int n_req, int at, df_tensor *x)
{
    for (int i = 0; i < n_req; i++)
        if (idx[i] == at)
            o->hidden_states[i] = x;
}

/* CLIPTextTransformer.forward (+ the projection of CLIPTextModelWithProjection). */
static df_status forward(df_ctx *ctx, const df_clip *m, df_tensor *ids, const int *idx, int n_req,
                         df_clip_output *o)
{
    const df_clip_config *c = &m->cfg;
    int64_t b = df_tensor_dim(ids, 0), s = df_tensor_dim(ids, 1);
    /* eos_token_id 2: the legacy argmax(input_ids); otherwise the first EOS (none: 0) */
    int64_t eos = c->eos_token_id == 2 ? -1 : c->eos_token_id < 0 ? INT64_MAX : c->eos_token_id;

    df_scope base = df_scope_begin(ctx);
    df_tensor *pos = df_slice(ctx, m->position_embedding, 0, 0, s);           /* [S, D] */
    df_tensor *x = df_add(ctx, df_gather(ctx, m->token_embedding, ids), pos); /* [B, S, D] */
    roll_scope(ctx, base, o, 0, x);
    note_state(o, idx, n_req, 0, x);
    for (int i = 0; i < c->num_hidden_layers; i++) {
        x = layer_forward(ctx, c, &m->layers[i], x);
        roll_scope(ctx, base, o, n_req, x);
        note_state(o, idx, n_req, i + 1, x);
    }
    o->last_hidden_state =
        df_layer_norm(ctx, x, m->final_ln_w, m->final_ln_b, (float)c->layer_norm_eps);
    df_tensor *flat = df_reshape(ctx, o->last_hidden_state, DF_SHAPE(b * s, c->hidden_size));
    df_tensor *at = df_token_rows(ctx, ids, eos); /* [B]: b * S + the EOS position */
    o->pooler_output = df_gather(ctx, flat, at);  /* [B, D] */
    if (c->with_projection)
        o->text_embeds = df_linear(ctx, o->pooler_output, &m->text_projection); /* [B, P] */

    df_tensor *keep[DF_CLIP_MAX_HIDDEN + 3] = {o->last_hidden_state, o->pooler_output,
                                               o->text_embeds};
    for (int i = 0; i < n_req; i++)
        keep[3 + i] = o->hidden_states[i];
    df_status st = df_ctx_status(ctx);
    df_scope_end_n(ctx, base, keep, st == DF_OK ? 3 + n_req : 0);
    return st;
}

df_status df_clip_encode(df_ctx *ctx, const df_clip *m, df_tensor *ids, const df_clip_request *req,
                         df_clip_output *out)
{
    *out = (df_clip_output){0};
    if (!ids)
        return df_ctx_status(ctx) != DF_OK ? df_ctx_status(ctx)
                                           : df_errorf(DF_E_ARG, "clip: no input ids");
    int idx[DF_CLIP_MAX_HIDDEN];
    DF_TRY(check_ids(m, ids));
    DF_TRY(resolve_request(m, req, idx));
    df_status s = forward(ctx, m, ids, idx, req ? req->n_hidden_states : 0, out);
    if (s != DF_OK)
        *out = (df_clip_output){0};
    return s;
}

df_weight_set *df_clip_weight_set(const df_clip *m)
{
    return m->ws;
}
