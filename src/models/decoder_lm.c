/*
 * Decoder-only language models as text encoders: transformers' MistralModel and Qwen3Model
 * forward, returning hidden states (decoder_lm.h). mistral.c and qwen3.c read their configs
 * and name their checkpoints' prefixes; everything else is here.
 *
 * Per layer: x += o(attn(rope(q(n)), rope(k(n)), v(n))) with n = rms_norm(x);
 * x += down(silu(gate(n)) * up(n)) with n = rms_norm(x). Qwen3 applies an RMS norm to each
 * head of q and k (over head_dim) before RoPE. No biases unless attention_bias.
 *
 * Choices:
 * - RoPE is transformers' rotate_half form: dimension i of a head pairs with i + D/2, at
 *   frequency inv_freq[i] = 1 / theta^(2i/D). The cos/sin table is computed on the host in
 *   float32 exactly as MistralRotaryEmbedding does it (the exponent, the power, the
 *   reciprocal, position * inv_freq and cos/sin each rounded to float32). To reuse the
 *   interleaved df_rope, q and k are reordered per head so that pair (i, i + D/2) becomes
 *   (2i, 2i + 1) (the copy that also moves heads before positions); q and k get the same
 *   order, so q.k and the attention output are unchanged.
 * - Grouped-query attention: each KV head is repeated for its heads / kv_heads query heads
 *   (transformers' repeat_kv: query head h reads KV head h / G).
 * - Masks: with an attention mask, one additive [B, 1, S, S] mask holds 0 where key j <= query
 *   i is a real token and -FLT_MAX elsewhere (causal and padding together, never summed
 *   into -inf), as transformers' 4-D causal mask with finfo.min. A query row with no real
 *   key (the pad rows before the first token of a left-padded prompt) gets attention output
 *   0, as transformers 5.x computes it (torch >= 2.5's SDPA with a boolean mask returns 0
 *   for a fully masked row): the layer then adds o_proj(0) = 0 and such a row carries the
 *   embedding and the MLP path only. The row's factor, exactly 1 or 0, is count / (count +
 *   1e-30) of its real-key count (one small product), so no kernel needs a new rule.
 *   transformers 4.x averaged all S values over such a row instead (docs/flux2.md).
 *   Without a mask, the kernel's causal flag does the same work.
 * - Positions are 0..S-1 in every row, whatever the padding: the pipelines pass no
 *   position_ids and transformers then uses cache_position.
 * - Only layers up to the deepest requested hidden state run; the final norm runs only when
 *   hidden_states[num_hidden_layers] or last_hidden_state is asked for. So a single file
 *   pruned after the deepest layer a pipeline reads (ComfyUI's pruned FLUX.2 Mistral: 30 of
 *   40 layers, no final norm) serves that pipeline: binding stops at its first missing
 *   layer when the final norm is missing too, and a deeper request is DF_E_UNSUPPORTED.
 * - Tensor parallelism: with a communicator of N > 1 ranks, q, k, v (with their biases),
 *   gate and up are split colwise and o and down rowwise (an all-reduce after each), so a
 *   rank runs num_attention_heads / N heads over num_key_value_heads / N KV heads, which are
 *   exactly the KV heads its query heads read, and intermediate_size / N of the MLP. The
 *   embedding, the norms (q_norm and k_norm are per head_dim) are replicated. Each rank
 *   binds only its rows/columns, so it reads only its slice of the split weights.
 */
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/dist.h>
#include <diffuse/ops.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/decoder_lm.h"
#include "models/names.h"
#include "models/weight_sets.h"
#include "models/text_config.h"

typedef struct lm_layer {
    df_tensor *input_norm;            /* input_layernorm [D] */
    df_linear_weights q, k, v, o;     /* [H*Dh, D], [KV*Dh, D] x2, [D, H*Dh] */
    df_tensor *q_norm, *k_norm;       /* Qwen3: [Dh] */
    df_tensor *post_norm;             /* post_attention_layernorm [D] */
    df_linear_weights gate, up, down; /* [F, D] x2, [D, F] */
} lm_layer;

enum { N_TP_RULES = 7 };

struct df_decoder_lm {
    df_decoder_lm_config cfg;
    const df_decoder_lm_class *cls;
    char component[128];
    char prefix[64];         /* of the language model's tensors in the checkpoint */
    int64_t sliding_window;  /* 0: none */
    int tp;                  /* tensor-parallel ranks */
    int64_t heads, kv_heads; /* this rank's */
    df_weight_set *ws;
    df_tensor *embed; /* [V, D] */
    lm_layer *layers;
    df_tensor *norm; /* [D]; NULL in a pruned file */
    /* Layers bound: num_hidden_layers, or fewer for a single file pruned after the last
     * layer its pipeline reads (ComfyUI's pruned FLUX.2 Mistral: 30 of 40, no final norm). */
    int n_bound;
    bool from_file;
    /* the plan, spelled with this checkpoint's prefix (borrowed by ws, so it lives here) */
    char rule_names[N_TP_RULES][128];
    df_tp_rule rules[N_TP_RULES];
};

/* --- config ------------------------------------------------------------------------------ */

static df_status check_rope_type(const df_json *j, const char *key)
{
    const df_json *r = df_json_get(j, key);
    if (df_json_is_null(r))
        return DF_OK;
    const char *type = NULL;
    DF_TRY(df_json_get_string_or(r, "rope_type", NULL, &type));
    if (!type)
        DF_TRY(df_json_get_string_or(r, "type", "default", &type));
    if (strcmp(type, "default") != 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key '%s': RoPE type '%s' is not implemented (only \"default\")",
                         df_json_source(j), key, type);
    return DF_OK;
}

df_status df_decoder_lm_read_common(const df_json *j, double default_theta,
                                    int64_t default_head_dim, double default_eps,
                                    df_decoder_lm_config *c)
{
    const char *act;
    DF_TRY(df_json_get_string_or(j, "hidden_act", "silu", &act));
    if (strcmp(act, "silu") != 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key 'hidden_act': '%s' is not implemented (only \"silu\")",
                         df_json_source(j), act);
    DF_TRY(check_rope_type(j, "rope_scaling"));
    DF_TRY(check_rope_type(j, "rope_parameters"));
    DF_TRY(df_text_config_int(j, "hidden_size", -1, DF_TEXT_MAX_WIDTH, &c->hidden_size));
    DF_TRY(
        df_text_config_int(j, "intermediate_size", -1, DF_TEXT_MAX_WIDTH, &c->intermediate_size));
    DF_TRY(
        df_text_config_int(j, "num_hidden_layers", -1, DF_TEXT_MAX_LAYERS, &c->num_hidden_layers));
    DF_TRY(df_text_config_int(j, "num_attention_heads", -1, DF_TEXT_MAX_WIDTH,
                              &c->num_attention_heads));
    DF_TRY(df_text_config_int(j, "num_key_value_heads", c->num_attention_heads, DF_TEXT_MAX_WIDTH,
                              &c->num_key_value_heads));
    int64_t dh = default_head_dim ? default_head_dim : c->hidden_size / c->num_attention_heads;
    DF_TRY(df_text_config_int(j, "head_dim", dh > 0 ? dh : 1, DF_TEXT_MAX_WIDTH, &c->head_dim));
    DF_TRY(df_text_config_int(j, "vocab_size", -1, DF_TEXT_MAX_VOCAB, &c->vocab_size));
    DF_TRY(df_text_config_eps(j, "rms_norm_eps", default_eps, &c->rms_norm_eps));
    const df_json *params = df_json_get(j, "rope_parameters");
    double theta = default_theta;
    if (!df_json_is_null(params))
        DF_TRY(df_json_get_double_or(params, "rope_theta", theta, &theta));
    DF_TRY(df_json_get_double_or(j, "rope_theta", theta, &c->rope_theta));
    DF_TRY(df_json_get_bool_or(j, "attention_bias", false, &c->attention_bias));
    if (!(c->rope_theta > 1))
        return df_errorf(DF_E_FORMAT, "%s: key 'rope_theta': %g is impossible (expected > 1)",
                         df_json_source(j), c->rope_theta);
    if (c->num_attention_heads % c->num_key_value_heads || c->head_dim % 2)
        return df_errorf(
            DF_E_FORMAT,
            "%s: keys 'num_attention_heads' %" PRId64 ", 'num_key_value_heads' %" PRId64
            ", 'head_dim' %" PRId64 ": the heads must be a multiple of the KV heads "
            "and head_dim even",
            df_json_source(j), c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    if (c->num_attention_heads * c->head_dim > DF_TEXT_MAX_WIDTH)
        return df_errorf(DF_E_FORMAT,
                         "%s: keys 'num_attention_heads' x 'head_dim': %" PRId64 " x %" PRId64
                         " is an impossible attention width",
                         df_json_source(j), c->num_attention_heads, c->head_dim);
    return DF_OK;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_layer(df_decoder_lm *m, int i, lm_layer *l)
{
    const df_decoder_lm_config *c = &m->cfg;
    df_weight_set *ws = m->ws;
    const char *p = m->prefix;
    int64_t d = c->hidden_size, f = c->intermediate_size, dh = c->head_dim;
    int64_t qw = c->num_attention_heads * dh, kvw = c->num_key_value_heads * dh;
    bool bias = c->attention_bias;
    DF_TRY(df_ws_tensor(ws, &l->input_norm, 1, (int64_t[]){d}, "%slayers.%d.input_layernorm.weight",
                        p, i));
    DF_TRY(df_ws_linear(ws, &l->q, qw, d, bias, "%slayers.%d.self_attn.q_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->k, kvw, d, bias, "%slayers.%d.self_attn.k_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->v, kvw, d, bias, "%slayers.%d.self_attn.v_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->o, d, qw, bias, "%slayers.%d.self_attn.o_proj", p, i));
    if (c->qk_norm) {
        DF_TRY(df_ws_tensor(ws, &l->q_norm, 1, (int64_t[]){dh},
                            "%slayers.%d.self_attn.q_norm.weight", p, i));
        DF_TRY(df_ws_tensor(ws, &l->k_norm, 1, (int64_t[]){dh},
                            "%slayers.%d.self_attn.k_norm.weight", p, i));
    }
    DF_TRY(df_ws_tensor(ws, &l->post_norm, 1, (int64_t[]){d},
                        "%slayers.%d.post_attention_layernorm.weight", p, i));
    DF_TRY(df_ws_linear(ws, &l->gate, f, d, false, "%slayers.%d.mlp.gate_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->up, f, d, false, "%slayers.%d.mlp.up_proj", p, i));
    DF_TRY(df_ws_linear(ws, &l->down, d, f, false, "%slayers.%d.mlp.down_proj", p, i));
    return DF_OK;
}

static df_status bind_weights(df_decoder_lm *m)
{
    const df_decoder_lm_config *c = &m->cfg;
    DF_TRY(df_ws_tensor(m->ws, &m->embed, 2, (int64_t[]){c->vocab_size, c->hidden_size},
                        "%sembed_tokens.weight", m->prefix));
    m->n_bound = (int)c->num_hidden_layers;
    for (int i = 0; i < c->num_hidden_layers; i++) {
        /* a single file may end after some layer, without the final norm: a pruned file */
        if (m->from_file && i > 0 &&
            !df_ws_has(m->ws, "%slayers.%d.input_layernorm.weight", m->prefix, i) &&
            !df_ws_has(m->ws, "%snorm.weight", m->prefix)) {
            m->n_bound = i;
            break;
        }
        DF_TRY(bind_layer(m, i, &m->layers[i]));
    }
    if (m->n_bound == c->num_hidden_layers)
        DF_TRY(df_ws_tensor(m->ws, &m->norm, 1, (int64_t[]){c->hidden_size}, "%snorm.weight",
                            m->prefix));
    return df_ws_check_all_used(m->ws);
}

/* The first candidate prefix under which the checkpoint holds the embedding. */
static df_status find_prefix(df_decoder_lm *m)
{
    for (const char *const *p = m->cls->prefixes; *p; p++)
        if (df_ws_has(m->ws, "%sembed_tokens.weight", *p)) {
            snprintf(m->prefix, sizeof m->prefix, "%s", *p);
            return DF_OK;
        }
    return df_errorf(DF_E_FORMAT,
                     "%s: no %s language model in the checkpoint: expected '%sembed_tokens.weight'"
                     " (or the same under another of transformers' prefixes)",
                     m->component, m->cls->name, m->cls->prefixes[0]);
}

/* Splits the model over the context's ranks, if it has several. */
static df_status shard(df_decoder_lm *m, df_ctx *ctx)
{
    const df_decoder_lm_config *c = &m->cfg;
    df_comm *comm = df_ctx_comm(ctx);
    m->tp = df_comm_size(comm);
    if (m->tp < 1)
        m->tp = 1;
    m->heads = c->num_attention_heads / m->tp;
    m->kv_heads = c->num_key_value_heads / m->tp;
    if (m->tp <= 1)
        return DF_OK;
    if (c->num_attention_heads % m->tp || c->num_key_value_heads % m->tp ||
        c->intermediate_size % m->tp)
        return df_errorf(DF_E_ARG,
                         "%s: num_attention_heads %" PRId64 ", num_key_value_heads %" PRId64
                         " and intermediate_size %" PRId64
                         " must all be divisible by the %d tensor-parallel ranks",
                         m->component, c->num_attention_heads, c->num_key_value_heads,
                         c->intermediate_size, m->tp);
    static const struct {
        const char *module;
        df_shard_style style;
    } plan[N_TP_RULES] = {
        {"self_attn.q_proj", DF_SHARD_COLWISE}, {"self_attn.k_proj", DF_SHARD_COLWISE},
        {"self_attn.v_proj", DF_SHARD_COLWISE}, {"self_attn.o_proj", DF_SHARD_ROWWISE},
        {"mlp.gate_proj", DF_SHARD_COLWISE},    {"mlp.up_proj", DF_SHARD_COLWISE},
        {"mlp.down_proj", DF_SHARD_ROWWISE},
    };
    for (int i = 0; i < N_TP_RULES; i++) {
        snprintf(m->rule_names[i], sizeof m->rule_names[i], "%slayers.*.%s", m->prefix,
                 plan[i].module);
        m->rules[i] = (df_tp_rule){.module = m->rule_names[i], .style = plan[i].style};
    }
    df_ws_set_tp_plan(m->ws, m->rules, N_TP_RULES, df_comm_rank(comm), m->tp);
    return DF_OK;
}

/* Where the config's class keeps its language model (names.h's DF_NAMES_LM_*): under
 * "model.language_model." for Mistral3ForConditionalGeneration (a text_config), "model." for
 * *ForCausalLM, at the root for MistralModel / Qwen3Model. */
static int class_layout(const df_json *cfg)
{
    if (!df_json_is_null(df_json_get(cfg, "text_config")))
        return DF_NAMES_LM_LANGUAGE_MODEL;
    const df_json *arch = df_json_get(cfg, "architectures");
    const char *cls = df_json_is_null(arch) ? NULL : df_json_string(df_json_array_get(arch, 0));
    size_t n = cls ? strlen(cls) : 0;
    return n >= 11 && strcmp(cls + n - 11, "ForCausalLM") == 0 ? DF_NAMES_LM_MODEL
                                                               : DF_NAMES_LM_ROOT;
}

static df_status load_parts(df_decoder_lm *m, df_ctx *ctx, const char *dir, const char *file)
{
    const df_json *cfg;
    if (file)
        DF_TRY(df_weight_set_open_single(ctx, dir, file, m->component, NULL, 0, NULL, &m->ws));
    else
        DF_TRY(df_weight_set_open(ctx, dir, m->component, &m->ws));
    DF_TRY(df_weight_set_config(m->ws, &cfg));
    DF_TRY(m->cls->read_config(cfg, &m->cfg, &m->sliding_window));
    /* A single file: its own prefix is whatever precedes the first layer there ("model.",
     * ComfyUI's "text_encoders.<name>.transformer.model."), and the model is bound under
     * the names transformers gives the config's class, as a folder of it holds them. */
    if (file && !df_ws_try_map(m->ws, df_names_lm, class_layout(cfg), df_names_lm_probe(), NULL))
        df_ws_try_map(m->ws, df_names_mistral_consolidated,
                      DF_NAMES_MISTRAL_ARG(class_layout(cfg), m->cfg.head_dim),
                      df_names_mistral_consolidated_probe(), NULL);
    m->layers = df_calloc((size_t)m->cfg.num_hidden_layers, sizeof *m->layers);
    if (!m->layers)
        return df_errorf(DF_E_OOM, "%s: out of memory", m->component);
    if (file)
        DF_TRY_CTX(find_prefix(m), "%s", file);
    else
        DF_TRY(find_prefix(m));
    for (const char *const *p = m->cls->skipped; p && *p; p++)
        df_ws_ignore_prefix(m->ws, *p);
    DF_TRY(shard(m, ctx));
    return bind_weights(m);
}

df_status df_decoder_lm_load(df_ctx *ctx, const char *dir, const df_decoder_lm_class *cls,
                             df_decoder_lm **out)
{
    return df_decoder_lm_load_file(ctx, dir, NULL, cls, out);
}

df_status df_decoder_lm_load_file(df_ctx *ctx, const char *dir, const char *file,
                                  const df_decoder_lm_class *cls, df_decoder_lm **out)
{
    *out = NULL;
    df_decoder_lm *m = df_calloc(1, sizeof *m);
    if (!m)
        return df_errorf(DF_E_OOM, "%s: out of memory", cls->name);
    m->cls = cls;
    m->from_file = file != NULL;
    df_text_component_name(dir, "text_encoder", m->component, sizeof m->component);
    df_status s = load_parts(m, ctx, dir, file);
    if (s != DF_OK) {
        df_decoder_lm_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

const df_decoder_lm_config *df_decoder_lm_get_config(const df_decoder_lm *m)
{
    return &m->cfg;
}

df_weight_set *df_decoder_lm_weight_set(const df_decoder_lm *m)
{
    return m->ws;
}

void df_decoder_lm_free(df_decoder_lm *m)
{
    if (!m)
        return;
    df_weight_set_free(m->ws);
    df_free(m->layers);
    df_free(m);
}

/* --- positions and masks ----------------------------------------------------------------- */

/* MistralRotaryEmbedding's cos/sin for positions 0..S-1, all in float32, as the pairs
 * (cos, sin) of df_rope: [S, Dh/2, 2]. */
static df_tensor *rope_table(df_ctx *ctx, const df_decoder_lm *m, int64_t s)
{
    int64_t half = m->cfg.head_dim / 2;
    float *t = df_malloc((size_t)(s * half * 2) * sizeof *t);
    float *inv = df_malloc((size_t)half * sizeof *inv);
    if (!t || !inv) {
        df_free(t);
        df_free(inv);
        df_errorf(DF_E_OOM, "%s: out of memory for the RoPE table", m->component);
        return NULL;
    }
    float base = (float)m->cfg.rope_theta, dim = (float)m->cfg.head_dim;
    for (int64_t i = 0; i < half; i++)
        inv[i] = 1.0f / powf(base, (float)(2 * i) / dim);
    for (int64_t p = 0; p < s; p++)
        for (int64_t i = 0; i < half; i++) {
            float angle = (float)p * inv[i];
            t[(p * half + i) * 2 + 0] = cosf(angle);
            t[(p * half + i) * 2 + 1] = sinf(angle);
        }
    df_tensor *table = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s, half, 2), t);
    df_free(t);
    df_free(inv);
    return table;
}

/* The causal table [S, S] of 1 (key j visible to query i: j <= i) and 0, indexed [i, j], or
 * [j, i] with by_key (the form that counts a row's keys as a product). */
static df_tensor *causal_table(df_ctx *ctx, const df_decoder_lm *m, int64_t s, bool by_key)
{
    float *t = df_malloc((size_t)(s * s) * sizeof *t);
    if (!t) {
        df_errorf(DF_E_OOM, "%s: out of memory for the %" PRId64 "x%" PRId64 " causal mask",
                  m->component, s, s);
        return NULL;
    }
    for (int64_t r = 0; r < s; r++)
        for (int64_t c = 0; c < s; c++)
            t[r * s + c] = (by_key ? r <= c : c <= r) ? 1.0f : 0.0f;
    df_tensor *table = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s, s), t);
    df_free(t);
    return table;
}

/* Per query row, 1 when it has at least one real key j <= i and 0 when it has none: [B, 1, S, 1]
 * (count / (count + 1e-30) is exactly 1 for any count >= 1 in float32). */
static df_tensor *attended_rows(df_ctx *ctx, const df_decoder_lm *m, df_tensor *mask)
{
    int64_t b = df_tensor_dim(mask, 0), s = df_tensor_dim(mask, 1);
    df_tensor *keys_before = causal_table(ctx, m, s, true); /* [key j, query i] */
    if (!keys_before)
        return NULL;
    df_tensor *key = df_reshape(ctx, df_cast(ctx, mask, DF_DTYPE_F32), DF_SHAPE(b, 1, 1, s));
    df_tensor *count = df_matmul(ctx, key, keys_before); /* [B, 1, 1, S] real keys per row */
    count = df_reshape(ctx, count, DF_SHAPE(b, 1, s, 1));
    return df_div(ctx, count, df_scale(ctx, count, 1.0f, 1e-30f));
}

/* The additive causal + padding mask [B, 1, S, S]: 0 where key j <= query i and key j is a
 * token, -FLT_MAX elsewhere. */
static df_tensor *attention_mask_add(df_ctx *ctx, const df_decoder_lm *m, df_tensor *mask)
{
    int64_t b = df_tensor_dim(mask, 0), s = df_tensor_dim(mask, 1);
    df_tensor *keep = causal_table(ctx, m, s, false);
    if (!keep)
        return NULL;
    keep = df_reshape(ctx, keep, DF_SHAPE(1, 1, s, s));
    df_tensor *key = df_reshape(ctx, df_cast(ctx, mask, DF_DTYPE_F32), DF_SHAPE(b, 1, 1, s));
    keep = df_mul(ctx, keep, key);                 /* [B, 1, S, S] of 1 (attend) and 0 */
    return df_scale(ctx, keep, FLT_MAX, -FLT_MAX); /* 1 -> 0, 0 -> -FLT_MAX */
}

/* --- forward ----------------------------------------------------------------------------- */

/* [B, S, N, Dh] in rotate_half order -> [B, N, S, Dh] with pair (i, i + Dh/2) at (2i, 2i+1),
 * dense, for df_rope. */
static df_tensor *heads_for_rope(df_ctx *ctx, df_tensor *x)
{
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1), n = df_tensor_dim(x, 2);
    int64_t dh = df_tensor_dim(x, 3);
    x = df_reshape(ctx, x, DF_SHAPE(b, s, n, 2, dh / 2));
    x = df_contiguous(ctx, df_permute(ctx, x, DF_SHAPE(0, 2, 1, 4, 3))); /* [B, N, S, Dh/2, 2] */
    return df_reshape(ctx, x, DF_SHAPE(b, n, s, dh));
}

/* repeat_kv: [B, KV, S, Dh] -> [B, KV * g, S, Dh], KV head j serving heads j*g .. j*g+g-1. */
static df_tensor *repeat_kv(df_ctx *ctx, df_tensor *x, int64_t g)
{
    if (g == 1)
        return x;
    int64_t b = df_tensor_dim(x, 0), kv = df_tensor_dim(x, 1), s = df_tensor_dim(x, 2);
    int64_t dh = df_tensor_dim(x, 3);
    x = df_expand(ctx, df_unsqueeze(ctx, x, 2), DF_SHAPE(b, kv, g, s, dh));
    return df_reshape(ctx, df_contiguous(ctx, x), DF_SHAPE(b, kv * g, s, dh));
}

/* The sum over the ranks of a rowwise product's partial results (itself on one rank). */
static df_tensor *tp_sum(df_ctx *ctx, const df_decoder_lm *m, df_tensor *x)
{
    return m->tp > 1 ? df_all_reduce(ctx, x) : x;
}

/* MistralDecoderLayer / Qwen3DecoderLayer.forward. x: [B, S, D]; rope [S, Dh/2, 2]; mask
 * NULL (causal) or additive [B, 1, S, S], with rows [B, 1, S, 1] (attended_rows). */
static df_tensor *layer_forward(df_ctx *ctx, const df_decoder_lm *m, const lm_layer *l,
                                df_tensor *x, df_tensor *rope, df_tensor *mask,
                                df_tensor *rows)
{
    const df_decoder_lm_config *c = &m->cfg;
    int64_t b = df_tensor_dim(x, 0), s = df_tensor_dim(x, 1), dh = c->head_dim;
    int64_t h = m->heads, kv = m->kv_heads;
    float eps = (float)c->rms_norm_eps;
    df_tensor *n = df_rms_norm(ctx, x, l->input_norm, eps);
    df_tensor *q = df_reshape(ctx, df_linear(ctx, n, &l->q), DF_SHAPE(b, s, h, dh));
    df_tensor *k = df_reshape(ctx, df_linear(ctx, n, &l->k), DF_SHAPE(b, s, kv, dh));
    df_tensor *v = df_reshape(ctx, df_linear(ctx, n, &l->v), DF_SHAPE(b, s, kv, dh));
    if (c->qk_norm) {
        q = df_rms_norm(ctx, q, l->q_norm, eps); /* per head, over Dh */
        k = df_rms_norm(ctx, k, l->k_norm, eps);
    }
    q = df_rope(ctx, heads_for_rope(ctx, q), rope); /* [B, H, S, Dh]  */
    k = repeat_kv(ctx, df_rope(ctx, heads_for_rope(ctx, k), rope), h / kv);
    v = repeat_kv(ctx, df_permute(ctx, v, DF_SHAPE(0, 2, 1, 3)), h / kv); /* [B, H, S, Dh] */
    df_tensor *a = df_attention(ctx, q, k, v, mask, mask == NULL, 0.0f);  /* 1/sqrt(Dh) */
    if (rows)
        a = df_mul(ctx, a, rows); /* rows without a real key: 0 */
    a = df_reshape(ctx, df_transpose(ctx, a, 1, 2), DF_SHAPE(b, s, h * dh));
    x = df_add(ctx, x, tp_sum(ctx, m, df_linear(ctx, a, &l->o)));
    n = df_rms_norm(ctx, x, l->post_norm, eps);
    df_tensor *gate = df_silu(ctx, df_linear(ctx, n, &l->gate));      /* [B, S, F/tp] */
    df_tensor *up = df_linear(ctx, n, &l->up);                        /* [B, S, F/tp] */
    df_tensor *mlp = df_linear(ctx, df_mul(ctx, gate, up), &l->down); /* [B, S, D]  */
    return df_add(ctx, x, tp_sum(ctx, m, mlp));
}

static df_status check_inputs(const df_decoder_lm *m, df_tensor *ids, df_tensor *mask)
{
    char di[96], dm[96];
    df_dtype t = df_tensor_dtype(ids);
    if (df_tensor_ndim(ids) != 2 || (t != DF_DTYPE_I64 && t != DF_DTYPE_I32) ||
        df_tensor_dim(ids, 0) < 1 || df_tensor_dim(ids, 1) < 1)
        return df_errorf(DF_E_ARG, "%s: input ids %s must be a [B, S] i32 or i64 tensor",
                         m->component, df_tensor_describe(ids, di, sizeof di));
    if (mask && (df_tensor_ndim(mask) != 2 || df_tensor_dim(mask, 0) != df_tensor_dim(ids, 0) ||
                 df_tensor_dim(mask, 1) != df_tensor_dim(ids, 1)))
        return df_errorf(DF_E_ARG, "%s: attention mask %s does not match input ids %s",
                         m->component, df_tensor_describe(mask, dm, sizeof dm),
                         df_tensor_describe(ids, di, sizeof di));
    int64_t s = df_tensor_dim(ids, 1);
    if (m->sliding_window && s > m->sliding_window)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: %" PRId64 " tokens exceed the sliding window of %" PRId64
                         "; windowed attention is not implemented",
                         m->component, s, m->sliding_window);
    return DF_OK;
}

/* The request's indices made non-negative in *idx; the deepest one in *deepest. */
static df_status resolve(const df_decoder_lm *m, const df_decoder_lm_request *req, int *idx,
                         int *deepest)
{
    int64_t L = m->cfg.num_hidden_layers;
    if (req->n_hidden_states < 0 || req->n_hidden_states > DF_DECODER_LM_MAX_OUTPUTS)
        return df_errorf(DF_E_ARG, "%s: %d hidden states asked for (0 to %d)", m->component,
                         req->n_hidden_states, DF_DECODER_LM_MAX_OUTPUTS);
    *deepest = req->last_hidden_state ? (int)L : -1;
    for (int i = 0; i < req->n_hidden_states; i++) {
        int64_t k = req->hidden_states[i];
        if (k < -(L + 1) || k > L)
            return df_errorf(DF_E_ARG,
                             "%s: hidden state %" PRId64 " does not exist (the model has %" PRId64
                             " layers: indices %" PRId64 " to %" PRId64 ")",
                             m->component, k, L, -(L + 1), L);
        idx[i] = (int)(k < 0 ? k + L + 1 : k);
        if (idx[i] > *deepest)
            *deepest = idx[i];
    }
    if (*deepest > m->n_bound || (*deepest == L && !m->norm))
        return df_errorf(
            DF_E_UNSUPPORTED,
            "%s: the checkpoint holds %d of the config's %" PRId64 " layers and no "
            "final norm (a pruned file); %s %d needs %s",
            m->component, m->n_bound, L,
            req->last_hidden_state ? "last_hidden_state, hidden state" : "hidden state", *deepest,
            *deepest == L ? "every layer and the final norm" : "the layers before it");
    return DF_OK;
}

/* Stores x as every requested hidden state of index k. */
static void collect(const df_decoder_lm_request *req, const int *idx, int k, df_tensor *x,
                    df_decoder_lm_output *out)
{
    for (int i = 0; i < req->n_hidden_states; i++)
        if (idx[i] == k)
            out->hidden_states[i] = x;
}

df_status df_decoder_lm_forward(df_ctx *ctx, const df_decoder_lm *m, df_tensor *ids,
                                df_tensor *attention_mask, const df_decoder_lm_request *req,
                                df_decoder_lm_output *out)
{
    *out = (df_decoder_lm_output){0};
    if (!ids)
        return df_ctx_status(ctx) != DF_OK ? df_ctx_status(ctx)
                                           : df_errorf(DF_E_ARG, "%s: no input ids", m->component);
    DF_TRY(check_inputs(m, ids, attention_mask));
    int idx[DF_DECODER_LM_MAX_OUTPUTS] = {0}, deepest = -1;
    DF_TRY(resolve(m, req, idx, &deepest));
    int64_t L = m->cfg.num_hidden_layers, s = df_tensor_dim(ids, 1);
    int run = deepest < L ? deepest : (int)L; /* layers that run */

    df_decoder_lm_output o = {0};
    df_scope base = df_scope_begin(ctx);
    df_tensor *rope = NULL, *mask = NULL, *rows = NULL;
    if (run > 0) {
        rope = rope_table(ctx, m, s);
        if (rope && attention_mask) {
            mask = attention_mask_add(ctx, m, attention_mask);
            rows = mask ? attended_rows(ctx, m, attention_mask) : NULL;
        }
        if (df_ctx_status(ctx) == DF_OK && (!rope || (attention_mask && (!mask || !rows)))) {
            df_scope_end(ctx, base, NULL);
            return DF_E_OOM; /* the message is set */
        }
    }
    df_tensor *x = df_gather(ctx, m->embed, ids); /* [B, S, D] */
    collect(req, idx, 0, x, &o);
    for (int i = 0; i < run && df_ctx_status(ctx) == DF_OK; i++) {
        df_scope mark = df_scope_begin(ctx);
        x = df_scope_end(ctx, mark, layer_forward(ctx, m, &m->layers[i], x, rope, mask, rows));
        if (i + 1 < L)
            collect(req, idx, i + 1, x, &o);
    }
    if (deepest == L) {
        x = df_rms_norm(ctx, x, m->norm, (float)m->cfg.rms_norm_eps);
        collect(req, idx, (int)L, x, &o);
        if (req->last_hidden_state)
            o.last_hidden_state = x;
    }
    df_status st = df_ctx_status(ctx);
    /* each distinct output once */
    df_tensor *keep[DF_DECODER_LM_MAX_OUTPUTS + 1];
    int n_keep = 0;
    for (int i = 0; st == DF_OK && i <= DF_DECODER_LM_MAX_OUTPUTS; i++) {
        df_tensor *t = i < DF_DECODER_LM_MAX_OUTPUTS ? o.hidden_states[i] : o.last_hidden_state;
        bool seen = !t;
        for (int j = 0; j < n_keep && !seen; j++)
            seen = keep[j] == t;
        if (!seen)
            keep[n_keep++] = t;
    }
    if (n_keep > 0)
        df_scope_end_n(ctx, base, keep, n_keep);
    else
        df_scope_end(ctx, base, NULL);
    if (st == DF_OK)
        *out = o;
    return st;
}

df_status df_decoder_lm_stacked(df_ctx *ctx, const df_decoder_lm *m, df_tensor *ids,
                                df_tensor *attention_mask, const int *layers, int n,
                                df_tensor **out)
{
    *out = NULL;
    if (n < 1 || n > DF_DECODER_LM_MAX_OUTPUTS)
        return df_errorf(DF_E_ARG, "%s: %d layers to stack (1 to %d)", m->component, n,
                         DF_DECODER_LM_MAX_OUTPUTS);
    df_decoder_lm_request req = {.n_hidden_states = n};
    memcpy(req.hidden_states, layers, (size_t)n * sizeof *layers);
    df_scope base = df_scope_begin(ctx);
    df_decoder_lm_output o;
    df_status st = df_decoder_lm_forward(ctx, m, ids, attention_mask, &req, &o);
    df_tensor *x = st == DF_OK ? o.hidden_states[0] : NULL;
    for (int i = 1; i < n && st == DF_OK; i++)
        x = df_concat(ctx, x, o.hidden_states[i], 2); /* [B, S, (i+1) D] */
    if (st == DF_OK)
        st = df_ctx_status(ctx);
    df_scope_end(ctx, base, st == DF_OK ? x : NULL);
    if (st == DF_OK)
        *out = x;
    return st;
}
