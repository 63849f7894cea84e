/*
 * The transformer base (transformer_base.h): the load, accessors and input checks that
 * FLUX.1, FLUX.2 and SD3 share, written once.
 *
 * The load reads config.json and hands it to the model's configure before any weight is
 * opened, so a config the model cannot run fails before the checkpoint is touched; the
 * model struct itself is allocated first so that configure can write into it. Every later
 * failure frees the partial model through df_transformer_free, which copes with whatever
 * was built.
 */
#include <stdio.h>

#include <diffuse/dist.h>
#include <diffuse/layout.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/embeddings.h"
#include "models/transformer_base.h"
#include "runtime/runtime.h" /* df_ctx_fail: input errors fail the context like an op */

/* --- load -------------------------------------------------------------------------------- */

static df_status open_weights(df_transformer *t, const char *dir, const char *file)
{
    const df_transformer_kind *k = t->kind;
    if (!file)
        return df_weight_set_open(t->ctx, dir, "transformer", &t->ws);
    int arg = k->names_arg ? k->names_arg(t) : 0;
    DF_TRY(df_weight_set_open_single(t->ctx, dir, file, "transformer", k->names, arg,
                                     k->names_probe(), &t->ws));
    /* Not the original layout: diffusers' names, maybe under a prefix. */
    df_ws_try_map(t->ws, df_names_same, 0, df_names_diffusers_transformer_probe(), NULL);
    return DF_OK;
}

/* Splits the model over the context's ranks when it has several and the model can. */
static df_status shard(df_transformer *t, const char *dir)
{
    t->tp = 1;
    if (!t->kind->shard)
        return DF_OK;
    df_comm *comm = df_ctx_comm(t->ctx);
    t->tp = df_comm_size(comm);
    t->rank = df_comm_rank(comm);
    return t->tp > 1 ? t->kind->shard(t, dir) : DF_OK;
}

static df_status configure(df_transformer *t, const char *dir)
{
    df_json *cfg = NULL;
    DF_TRY(df_layout_open_config(dir, &cfg));
    df_status s = t->kind->configure(t, cfg);
    df_json_free(cfg);
    return s;
}

df_status df_transformer_load(const df_transformer_kind *kind, df_ctx *ctx, const char *dir,
                              const char *file, df_transformer **out)
{
    if (!out)
        return df_errorf(DF_E_ARG, "df_%s_load: out is NULL", kind->name);
    *out = NULL;
    if (!ctx || !dir)
        return df_errorf(DF_E_ARG, "df_%s_load: ctx and dir are required", kind->name);

    df_transformer *t = df_calloc(1, kind->size);
    if (!t)
        return df_errorf(DF_E_OOM, "transformer: out of memory");
    t->kind = kind;
    t->ctx = ctx;
    t->tp = 1;
    df_status s = configure(t, dir);
    if (s == DF_OK)
        s = kind->alloc(t);
    if (s == DF_OK)
        s = open_weights(t, dir, file);
    if (s == DF_OK)
        s = shard(t, dir);
    if (s == DF_OK)
        s = kind->bind(t, dir);
    if (s == DF_OK)
        s = kind->list_blocks(t);
    if (s != DF_OK) {
        df_transformer_free(t);
        return s;
    }
    *out = t;
    return DF_OK;
}

df_status df_transformer_check_heads(const df_transformer *t, const char *dir, int64_t heads)
{
    if (heads % t->tp)
        return df_errorf(DF_E_ARG,
                         "%s/config.json: num_attention_heads %lld is not divisible by "
                         "the %d tensor-parallel ranks (heads are split across ranks)",
                         dir, (long long)heads, t->tp);
    return DF_OK;
}

df_status df_transformer_bind_qkv(df_weight_set *ws, df_qkv_weights *w, int64_t D, int64_t Dh,
                                  bool bias, bool norms, const char *attn, df_qkv_stream stream)
{
    static const char *const names[2][5] = {
        [DF_QKV_IMAGE] = {"to_q", "to_k", "to_v", "norm_q", "norm_k"},
        [DF_QKV_CONTEXT] = {"add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q",
                            "norm_added_k"},
    };
    const char *const *n = names[stream];
    DF_TRY(df_ws_linear(ws, &w->to_q, D, D, bias, "%s.%s", attn, n[0]));
    DF_TRY(df_ws_linear(ws, &w->to_k, D, D, bias, "%s.%s", attn, n[1]));
    DF_TRY(df_ws_linear(ws, &w->to_v, D, D, bias, "%s.%s", attn, n[2]));
    if (norms) {
        DF_TRY(df_ws_tensor(ws, &w->norm_q, 1, (int64_t[]){Dh}, "%s.%s.weight", attn, n[3]));
        DF_TRY(df_ws_tensor(ws, &w->norm_k, 1, (int64_t[]){Dh}, "%s.%s.weight", attn, n[4]));
    }
    return DF_OK;
}

df_status df_transformer_bind_joint_attn(df_weight_set *ws, df_joint_attn_weights *w, int64_t D,
                                         int64_t Dh, bool bias, const char *block)
{
    char a[80];
    snprintf(a, sizeof a, "%s.attn", block);
    DF_TRY(df_transformer_bind_qkv(ws, &w->img, D, Dh, bias, true, a, DF_QKV_IMAGE));
    DF_TRY(df_transformer_bind_qkv(ws, &w->txt, D, Dh, bias, true, a, DF_QKV_CONTEXT));
    DF_TRY(df_ws_linear(ws, &w->to_out, D, D, bias, "%s.to_out.0", a));
    return df_ws_linear(ws, &w->to_add_out, D, D, bias, "%s.to_add_out", a);
}

df_status df_transformer_list_two_streams(df_transformer *t, const char *const *outer, int n_outer,
                                          const df_block_class *dbl, int64_t n_double,
                                          const df_block_class *single, int64_t n_single)
{
    df_blocks_init(&t->rep, t, t->ws, outer, n_outer);
    for (int i = 0; i < n_double; i++)
        DF_TRY(df_blocks_add(&t->rep, dbl, i, "transformer_blocks.%d", i));
    for (int i = 0; i < n_single; i++)
        DF_TRY(df_blocks_add(&t->rep, single, i, "single_transformer_blocks.%d", i));
    return DF_OK;
}

/* --- accessors --------------------------------------------------------------------------- */

int64_t df_transformer_weight_bytes(const df_transformer *t)
{
    return t && t->ws ? df_ws_bytes(t->ws) : 0;
}

df_weight_set *df_transformer_weight_set(const df_transformer *t)
{
    return t ? t->ws : NULL;
}

df_status df_transformer_set_sequential_offload(const df_transformer_kind *kind, df_transformer *t,
                                                bool on)
{
    if (!t)
        return df_errorf(DF_E_ARG, "df_%s_set_sequential_offload: model is NULL", kind->name);
    return df_blocks_set_sequential(&t->rep, on);
}

df_status df_transformer_compile_repeated_blocks(const df_transformer_kind *kind, df_transformer *t,
                                                 const df_compile_opts *opts)
{
    if (!t)
        return df_errorf(DF_E_ARG, "df_%s_compile_repeated_blocks: model is NULL", kind->name);
    return df_blocks_compile(&t->rep, opts);
}

int df_transformer_compiled_programs(const df_transformer *t)
{
    return t ? df_blocks_programs(&t->rep) : 0;
}

void df_transformer_free(df_transformer *t)
{
    if (!t)
        return;
    df_transformer_disable_cache(t);
    df_compiled_free(t->compiled);
    df_blocks_deinit(&t->rep);
    df_weight_set_free(t->ws);
    t->kind->free_parts(t);
    df_free(t);
}

/* --- the whole forward, and step caches -------------------------------------------------- */

/* The forward as a module's (df_module.forward), on the model `self`. */
static df_status module_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    df_transformer *t = self;
    out[0] = t->kind->forward(ctx, t, in);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

df_status df_transformer_compile(df_transformer *t)
{
    df_module m = {
        .name = t->kind->cls, .n_in = t->kind->n_in, .n_out = 1, .forward = module_forward};
    df_compiled_free(t->compiled);
    t->compiled = NULL;
    return df_compile(&m, &(df_compile_opts){.fullgraph = true}, &t->compiled);
}

df_status df_transformer_call(df_ctx *ctx, df_transformer *t, df_tensor *const *in, df_tensor **out)
{
    return t->compiled ? df_compiled_call(ctx, t->compiled, t, in, out)
                       : module_forward(ctx, t, in, out);
}

df_status df_transformer_enable_cache(df_transformer *t, const df_cache_config *cfg, int contexts)
{
    df_transformer_disable_cache(t);
    if (!cfg || cfg->kind == DF_CACHE_NONE)
        return DF_OK;
    if (!t->kind->step_caches)
        return df_errorf(DF_E_UNSUPPORTED, "--cache: %s takes no step cache", t->kind->cls);
    for (int k = 0; k < (contexts > 1 ? 2 : 1); k++) {
        df_status s = df_step_cache_create(cfg, t->kind->cls, t->rep.n, &t->caches[k]);
        if (s != DF_OK) {
            df_transformer_disable_cache(t);
            return s;
        }
    }
    t->cache = t->caches[0];
    return DF_OK;
}

void df_transformer_cache_context(df_transformer *t, int k)
{
    t->cache = k >= 0 && k < 2 ? t->caches[k] : NULL;
}

const df_step_cache *df_transformer_step_cache(const df_transformer *t)
{
    return t->caches[0];
}

void df_transformer_disable_cache(df_transformer *t)
{
    for (int k = 0; k < 2; k++) {
        df_step_cache_free(t->caches[k]);
        t->caches[k] = NULL;
    }
    t->cache = NULL;
}

/* --- inputs ------------------------------------------------------------------------------ */

bool df_transformer_forward_ok(const df_transformer_kind *kind, df_ctx *ctx,
                               const df_transformer *t, const void *in)
{
    if (!ctx || df_ctx_status(ctx) != DF_OK)
        return false;
    if (!t || !in) {
        df_ctx_fail(ctx,
                    df_errorf(DF_E_ARG, "%s forward: model and inputs are required", kind->name));
        return false;
    }
    if (ctx != t->ctx) {
        df_ctx_fail(ctx, df_errorf(DF_E_ARG,
                                   "%s forward: the model was loaded into another "
                                   "context",
                                   kind->name));
        return false;
    }
    return true;
}

df_status df_transformer_check_input(const df_transformer *t, const char *name, const df_tensor *x,
                                     int ndim, const int64_t *want, bool ids)
{
    return df_emb_check_input(t->kind->name, name, x, ndim, want, ids);
}

df_status df_transformer_check_sequences(const df_transformer *t, const df_tensor *hidden,
                                         const df_tensor *encoder, int64_t in, int64_t joint,
                                         int64_t *B, int64_t *s_img, int64_t *s_txt)
{
    DF_TRY(
        df_transformer_check_input(t, "hidden_states", hidden, 3, (int64_t[]){-1, -1, in}, false));
    *B = df_tensor_dim(hidden, 0);
    *s_img = df_tensor_dim(hidden, 1);
    DF_TRY(df_transformer_check_input(t, "encoder_hidden_states", encoder, 3,
                                      (int64_t[]){*B, -1, joint}, false));
    *s_txt = df_tensor_dim(encoder, 1);
    return DF_OK;
}

df_status df_transformer_check_per_batch(const df_transformer *t, const char *name,
                                         const df_tensor *x, int64_t B)
{
    bool one = x && df_tensor_ndim(x) == 1 && df_tensor_dim(x, 0) == 1;
    return df_transformer_check_input(t, name, x, 1, (int64_t[]){one ? 1 : B}, false);
}

df_status df_transformer_check_ids(const df_transformer *t, const char *name, const df_tensor *ids,
                                   int64_t S, int64_t A)
{
    if (ids && df_tensor_ndim(ids) == 3)
        return df_transformer_check_input(t, name, ids, 3, (int64_t[]){-1, S, A}, true);
    return df_transformer_check_input(t, name, ids, 2, (int64_t[]){S, A}, true);
}

df_status df_transformer_check_guidance(const df_transformer *t, bool embeds,
                                        const df_tensor *guidance, int64_t B)
{
    if (embeds)
        return df_transformer_check_per_batch(t, "guidance", guidance, B);
    if (guidance)
        return df_errorf(DF_E_ARG,
                         "%s forward: input 'guidance' given, but this model has no "
                         "guidance embedder (config.json guidance_embeds is false)",
                         t->kind->name);
    return DF_OK;
}

df_status df_transformer_check_layers(const char *what, const int *layers, int n,
                                      int64_t num_layers)
{
    if (n < 0 || (n > 0 && !layers))
        return df_errorf(DF_E_ARG, "%ss: %d given without a list", what, n);
    for (int i = 0; i < n; i++)
        if (layers[i] < 0 || layers[i] >= num_layers)
            return df_errorf(DF_E_ARG, "%s %d is not a block of this transformer (num_layers %lld)",
                             what, layers[i], (long long)num_layers);
    return DF_OK;
}

/* --- forward pieces ---------------------------------------------------------------------- */

df_tensor *df_transformer_ids_2d(df_ctx *ctx, df_tensor *ids)
{
    if (df_tensor_ndim(ids) == 2)
        return ids;
    int64_t S = df_tensor_dim(ids, 1), A = df_tensor_dim(ids, 2);
    return df_reshape(ctx, df_slice(ctx, ids, 0, 0, 1), DF_SHAPE(S, A)); /* row 0 */
}

df_tensor *df_transformer_tp_sum(df_ctx *ctx, int tp, df_tensor *x)
{
    return tp > 1 ? df_all_reduce(ctx, x) : x;
}

void df_transformer_project_qkv(df_ctx *ctx, const df_qkv_weights *w, df_tensor *x, int64_t H,
                                float eps, df_tensor **q, df_tensor **k, df_tensor **v)
{
    int64_t B = df_tensor_dim(x, 0), S = df_tensor_dim(x, 1);
    df_scope mark = df_scope_begin(ctx); /* the products before their norms go at the end */
    *q = df_reshape(ctx, df_linear(ctx, x, &w->to_q), DF_SHAPE(B, S, H, -1)); /* [B, S, H, Dh] */
    *k = df_reshape(ctx, df_linear(ctx, x, &w->to_k), DF_SHAPE(B, S, H, -1));
    *v = df_reshape(ctx, df_linear(ctx, x, &w->to_v), DF_SHAPE(B, S, H, -1));
    if (w->norm_q) {
        *q = df_rms_norm(ctx, *q, w->norm_q, eps); /* per head */
        *k = df_rms_norm(ctx, *k, w->norm_k, eps);
    }
    df_scope_end_n(ctx, mark, (df_tensor *[]){*q, *k, *v}, 3);
}

df_tensor *df_transformer_attention(df_ctx *ctx, df_tensor *q, df_tensor *k, df_tensor *v,
                                    df_tensor *pe)
{
    int64_t B = df_tensor_dim(q, 0), S = df_tensor_dim(q, 1);
    df_scope mark = df_scope_begin(ctx); /* the rotated q and k go at the end */
    q = df_permute(ctx, q, DF_SHAPE(0, 2, 1, 3)); /* [B, H, S, Dh] view */
    if (pe)
        q = df_rope(ctx, q, pe);
    k = df_permute(ctx, k, DF_SHAPE(0, 2, 1, 3));
    if (pe)
        k = df_rope(ctx, k, pe);
    v = df_permute(ctx, v, DF_SHAPE(0, 2, 1, 3));
    df_tensor *o = df_attention(ctx, q, k, v, NULL, false, 0.0f); /* [B, H, S, Dh], 1/sqrt(Dh) */
    o = df_transpose(ctx, o, 1, 2);                               /* [B, S, H, Dh] dense */
    return df_scope_end(ctx, mark, df_reshape(ctx, o, DF_SHAPE(B, S, -1))); /* [B, S, H*Dh] */
}

void df_transformer_joint_attention(df_ctx *ctx, const df_joint_attn_weights *w, df_tensor *nx,
                                    df_tensor *nc, df_tensor *pe, int64_t H, float eps, int tp,
                                    df_tensor **a)
{
    int64_t s_txt = df_tensor_dim(nc, 1), S = s_txt + df_tensor_dim(nx, 1);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *qx, *kx, *vx, *qc, *kc, *vc;
    df_transformer_project_qkv(ctx, &w->img, nx, H, eps, &qx, &kx, &vx); /* [B, S_img, H, Dh] */
    df_transformer_project_qkv(ctx, &w->txt, nc, H, eps, &qc, &kc, &vc); /* [B, S_txt, H, Dh] */
    df_tensor *q = df_concat(ctx, qc, qx, 1);                  /* [B, S, H, Dh] text first */
    df_tensor *k = df_concat(ctx, kc, kx, 1);                  /* [B, S, H, Dh] */
    df_tensor *v = df_concat(ctx, vc, vx, 1);                  /* [B, S, H, Dh] */
    df_tensor *o = df_transformer_attention(ctx, q, k, v, pe); /* [B, S, H*Dh] */
    df_tensor *oc = df_slice(ctx, o, 1, 0, s_txt);             /* [B, S_txt, H*Dh] */
    df_tensor *ox = df_slice(ctx, o, 1, s_txt, S);             /* [B, S_img, H*Dh] */
    a[0] = df_transformer_tp_sum(ctx, tp, df_linear(ctx, ox, &w->to_out));     /* [B, S_img, D] */
    a[1] = df_transformer_tp_sum(ctx, tp, df_linear(ctx, oc, &w->to_add_out)); /* [B, S_txt, D] */
    df_scope_end_n(ctx, mark, a, 2);
}

/* The feed-forward opens its own scope inside the stream's so that strict eager holds
 * what later ops still read rather than the whole working set. [B, S, D] -> [B, S, D]. */
static df_tensor *feed_forward(df_ctx *ctx, const df_linear_weights *in,
                               const df_linear_weights *out, df_transformer_act act, int tp,
                               df_tensor *x)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = act(ctx, df_linear(ctx, x, in)); /* [B, S, M/tp] */
    return df_scope_end(ctx, mark, df_transformer_tp_sum(ctx, tp, df_linear(ctx, h, out)));
}

df_tensor *df_transformer_stream_feed_forward(df_ctx *ctx, const df_linear_weights *in,
                                              const df_linear_weights *out, df_transformer_act act,
                                              int tp, df_tensor *x, df_tensor *a,
                                              df_tensor *const *m, float eps)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = df_add(ctx, x, df_mul(ctx, m[2], a)); /* [B, S, D] */
    df_tensor *f = feed_forward(ctx, in, out, act, tp, df_emb_modulate(ctx, h, m[3], m[4], eps));
    return df_scope_end(ctx, mark, df_add(ctx, h, df_mul(ctx, m[5], f))); /* [B, S, D] */
}

df_tensor *df_transformer_mag_skip(df_ctx *ctx, df_transformer *t, df_tensor *c, df_tensor *x)
{
    df_tensor *xs = df_step_cache_mag(t->cache) ? df_step_cache_mag_head(ctx, t->cache, x) : NULL;
    return xs ? df_concat(ctx, c, xs, 1) : NULL;
}

df_tensor *df_transformer_single_stream(df_ctx *ctx, df_transformer *t, int64_t n_double,
                                        int64_t n_single, df_tensor *c, df_tensor *x,
                                        df_tensor *mod, df_tensor *pe)
{
    int64_t s_txt = df_tensor_dim(c, 1);
    /* One fixed mark: df_blocks_run ends it after block i, releasing block i-1's outputs,
     * and after block 0 the joined sequence, made inside it. */
    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = df_concat(ctx, c, x, 1);
    for (int64_t i = 0; i < n_single; i++)
        df_blocks_run(ctx, &t->rep, (int)(n_double + i), mark, (df_tensor *[]){h, mod, pe}, &h);
    if (df_step_cache_mag(t->cache))
        df_step_cache_mag_tail(ctx, t->cache, df_slice(ctx, h, 1, s_txt, df_tensor_dim(h, 1)));
    return h;
}

df_tensor *df_transformer_two_stream_out(df_ctx *ctx, df_transformer *t, df_scope outer,
                                         df_tensor *h, int64_t s_txt, df_tensor *temb,
                                         const df_linear_weights *norm_out,
                                         const df_linear_weights *proj_out, float eps)
{
    df_step_cache_end(t->cache);
    df_tensor *x = df_slice(ctx, h, 1, s_txt, df_tensor_dim(h, 1)); /* [B, S_img, D] */
    x = df_emb_ada_norm_continuous(ctx, norm_out, x, temb, eps);    /* [B, S_img, D] */
    df_tensor *out = df_linear(ctx, x, proj_out);                   /* [B, S_img, out] */
    df_blocks_end(ctx, &t->rep);
    return df_scope_end(ctx, outer, out);
}
