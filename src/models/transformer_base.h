/*
 * What every diffusion transformer shares (FLUX.1 flux.c, FLUX.2 flux2.c, SD3 sd3.c).
 *
 * A model struct starts with a df_transformer: its context, its weight set, its repeated
 * blocks (blocks.h), the step cache of the run and the tensor-parallel split. Because it
 * is the first member, a model pointer is also a pointer to its df_transformer (C11
 * 6.7.2.1), so each model's public accessors are one line that hands its pointer here.
 *
 * A model file describes itself with one const df_transformer_kind (its size, how it reads
 * its config, allocates, shards, binds and lists its blocks) and df_transformer_load runs
 * the load every model has: argument checks, config, weights from the folder or from a
 * single file, shard, bind, blocks, and one cleanup on failure.
 *
 * The kind also names the model's diffusers class and orders its forward's inputs, so the
 * base runs what a pipeline asks of any transformer: its forward compiled whole
 * (df_transformer_compile, df_transformer_call) and a run's step caches (diffusers'
 * enable_cache and cache_context), made with the class name and the attention modules.
 *
 * The input checks that several forwards make (sequences, per-batch scalars, position ids,
 * guidance) are here too, with the model's name in their messages.
 */
#ifndef DF_MODELS_TRANSFORMER_BASE_H
#define DF_MODELS_TRANSFORMER_BASE_H

#include <stdbool.h>
#include <stddef.h>

#include <diffuse/compile.h>
#include <diffuse/json.h>
#include <diffuse/ops.h>

#include "models/blocks.h"
#include "models/loader.h"
#include "models/step_cache.h"

typedef struct df_transformer_kind df_transformer_kind;

/* The first member of every transformer struct. */
typedef struct df_transformer {
    const df_transformer_kind *kind;
    df_ctx *ctx;
    df_weight_set *ws;
    df_blocks rep;            /* the repeated blocks in forward order (blocks.h) */
    df_step_cache *cache;     /* the step cache the forward uses (step_cache.h), or NULL */
    df_step_cache *caches[2]; /* a run's caches, one per cache context, or NULL */
    df_compiled *compiled;    /* the whole forward compiled (df_transformer_compile), or NULL */
    int tp, rank;             /* tensor-parallel ranks the model is split over, and this one */
} df_transformer;

/* One transformer class, as its model file describes it to df_transformer_load. Each
 * function gets the model (its df_transformer first); `dir` names the config folder in
 * messages. */
struct df_transformer_kind {
    const char *name; /* "flux": messages say "df_flux_load: ..." and "flux forward: ..." */
    const char *cls;  /* diffusers' class, "FluxTransformer2DModel": the compiled module's name */
    size_t size;      /* of the model struct */
    /* The forward on in[0..n_in), the model's inputs struct in its order (NULL entries for
     * inputs not given), as a module's forward calls it. */
    int n_in;
    df_tensor *(*forward)(df_ctx *ctx, void *m, df_tensor *const *in);
    /* Whether the model takes step caches; a TaylorSeer cache's attention modules are then
     * its repeated blocks, one each. */
    bool step_caches;
    /* Reads config.json into the model, refusing what it cannot run. */
    df_status (*configure)(void *m, const df_json *cfg);
    /* The per-block arrays, sized by the config. */
    df_status (*alloc)(void *m);
    /* A single file's name map (names.h), its argument and the name every such file holds. */
    df_name_map names;
    int (*names_arg)(const void *m); /* NULL: 0 */
    const char *(*names_probe)(void);
    /* Sets the tensor-parallel plan when the context has several ranks (t->tp > 1); NULL:
     * the model runs whole on every rank. */
    df_status (*shard)(void *m, const char *dir);
    df_status (*bind)(void *m, const char *dir);
    df_status (*list_blocks)(void *m);
    void (*free_parts)(void *m); /* the per-block arrays */
};

/* Loads a model of `kind` with dir's config and the weights of dir, or of the single file
 * `file` when it is not NULL. On success *out (a kind->size struct) is owned by the caller:
 * free it with df_transformer_free. Fails as the model's df_<name>_load says. */
df_status df_transformer_load(const df_transformer_kind *kind, df_ctx *ctx, const char *dir,
                              const char *file, df_transformer **out);

/* Checks that `heads` (the config's num_attention_heads) split over t's ranks, as the
 * tensor-parallel plans split attention heads: DF_E_ARG otherwise. */
df_status df_transformer_check_heads(const df_transformer *t, const char *dir, int64_t heads);

/* Accessors shared by the models' public functions; each takes NULL (`kind` names the
 * model's public function in the message then). */
int64_t df_transformer_weight_bytes(const df_transformer *t);
df_weight_set *df_transformer_weight_set(const df_transformer *t);
df_status df_transformer_set_sequential_offload(const df_transformer_kind *kind, df_transformer *t,
                                                bool on);
df_status df_transformer_compile_repeated_blocks(const df_transformer_kind *kind, df_transformer *t,
                                                 const df_compile_opts *opts);
int df_transformer_compiled_programs(const df_transformer *t);
void df_transformer_free(df_transformer *t);

/* --- the whole forward, and step caches -------------------------------------------------- */

/* Compiles the whole forward (fullgraph; df_compile with the kind's class name): later
 * df_transformer_call runs the compiled program. */
df_status df_transformer_compile(df_transformer *t);
/* One forward on in[0..kind->n_in): compiled where df_transformer_compile ran, else eager.
 * The output [B, S_img, out] in *out. */
df_status df_transformer_call(df_ctx *ctx, df_transformer *t, df_tensor *const *in,
                              df_tensor **out);

/* diffusers' transformer.enable_cache(cfg) for one run: `contexts` caches (0 or 1: one; 2 for
 * the cache contexts "cond" and "uncond"), each made with the class name and the attention
 * modules, context 0 in use. NULL cfg or DF_CACHE_NONE: none (nothing to do).
 * DF_E_UNSUPPORTED where the model takes no step cache. */
df_status df_transformer_enable_cache(df_transformer *t, const df_cache_config *cfg, int contexts);
/* diffusers' cache_context: the forwards from now on use context k's cache (0 "cond",
 * 1 "uncond"); a context without a cache, or k outside 0..1, runs uncached. */
void df_transformer_cache_context(df_transformer *t, int k);
/* Context 0's cache, for its trace (NULL when none is enabled). */
const df_step_cache *df_transformer_step_cache(const df_transformer *t);
/* Frees the run's caches: the forwards run uncached again. */
void df_transformer_disable_cache(df_transformer *t);

/* q, k, v projections of one attention stream with their per-head RMS norms. */
typedef struct df_qkv_weights {
    df_linear_weights to_q, to_k, to_v; /* [D, D] */
    df_tensor *norm_q, *norm_k;         /* [Dh], or NULL without qk norms */
} df_qkv_weights;

/* Which stream's names an attention module gives its q, k, v and norms. */
typedef enum df_qkv_stream {
    DF_QKV_IMAGE,   /* to_q, to_k, to_v, norm_q, norm_k */
    DF_QKV_CONTEXT, /* add_q_proj, add_k_proj, add_v_proj, norm_added_q, norm_added_k */
} df_qkv_stream;

/* Binds the stream's "<attn>.to_q" ... [D, D] (with biases when `bias`) and, when `norms`,
 * "<attn>.norm_q.weight" ... [Dh]; `attn` is the module's prefix ("transformer_blocks.3.attn"). */
df_status df_transformer_bind_qkv(df_weight_set *ws, df_qkv_weights *w, int64_t D, int64_t Dh,
                                  bool bias, bool norms, const char *attn, df_qkv_stream stream);

/* A FLUX double block's attention module: each stream's q, k, v with their norms, and each
 * stream's output projection. */
typedef struct df_joint_attn_weights {
    df_qkv_weights img, txt;              /* to_*, add_*_proj */
    df_linear_weights to_out, to_add_out; /* [D, D] */
} df_joint_attn_weights;

/* Binds "<block>.attn.to_q" ..., "<block>.attn.add_q_proj" ... with their q/k norms, then
 * to_out.0 and to_add_out (with biases when `bias`); `block` is "transformer_blocks.3". */
df_status df_transformer_bind_joint_attn(df_weight_set *ws, df_joint_attn_weights *w, int64_t D,
                                         int64_t Dh, bool bias, const char *block);

/* The blocks list of the FLUX models: `n_double` blocks "transformer_blocks.N" of class
 * `dbl`, then `n_single` "single_transformer_blocks.N" of `single`, with `outer` the
 * weights outside them. */
df_status df_transformer_list_two_streams(df_transformer *t, const char *const *outer, int n_outer,
                                          const df_block_class *dbl, int64_t n_double,
                                          const df_block_class *single, int64_t n_single);

/* --- forward ----------------------------------------------------------------------------- */

/* The checks every forward starts with. False when ctx is NULL or already failed, or when
 * (failing ctx with the message) the model or the inputs are missing or the model belongs
 * to another context. */
bool df_transformer_forward_ok(const df_transformer_kind *kind, df_ctx *ctx,
                               const df_transformer *t, const void *in);

/* Input `name` with `ndim` dimensions of `want` (-1: any); see df_emb_check_input. */
df_status df_transformer_check_input(const df_transformer *t, const char *name, const df_tensor *x,
                                     int ndim, const int64_t *want, bool ids);
/* hidden_states [B, S_img, in] and encoder_hidden_states [B, S_txt, joint]: B, S_img and
 * S_txt come back. */
df_status df_transformer_check_sequences(const df_transformer *t, const df_tensor *hidden,
                                         const df_tensor *encoder, int64_t in, int64_t joint,
                                         int64_t *B, int64_t *s_img, int64_t *s_txt);
/* A [B] or [1] tensor (timestep, guidance). */
df_status df_transformer_check_per_batch(const df_transformer *t, const char *name,
                                         const df_tensor *x, int64_t B);
/* [S, A] ids, or the [N, S, A] form of which the model uses row 0. */
df_status df_transformer_check_ids(const df_transformer *t, const char *name, const df_tensor *ids,
                                   int64_t S, int64_t A);
/* guidance [B] or [1] when the model embeds it, else none. */
df_status df_transformer_check_guidance(const df_transformer *t, bool embeds,
                                        const df_tensor *guidance, int64_t B);

/* A list of n block indices (skip-layer guidance's) of a model with num_layers blocks:
 * DF_E_ARG naming `what` ("sd3 forward: skip layer") when the list is missing or an index
 * is not a block. */
df_status df_transformer_check_layers(const char *what, const int *layers, int n,
                                      int64_t num_layers);

/* [S, A] view of ids given as [S, A] or [N, S, A]. */
df_tensor *df_transformer_ids_2d(df_ctx *ctx, df_tensor *ids);
/* The sum over the ranks of a rowwise product's partial results (x itself on one rank). */
df_tensor *df_transformer_tp_sum(df_ctx *ctx, int tp, df_tensor *x);
/* One stream's q, k, v as H heads [B, S, H, Dh] of x [B, S, D]; q and k RMS-normed per head
 * (`eps`) when w has norms. */
void df_transformer_project_qkv(df_ctx *ctx, const df_qkv_weights *w, df_tensor *x, int64_t H,
                                float eps, df_tensor **q, df_tensor **k, df_tensor **v);
/* Attention of heads q, k, v [B, S, H, Dh] with RoPE table pe [S, Dh/2, 2] on q and k
 * (NULL: none) -> [B, S, H*Dh]. */
df_tensor *df_transformer_attention(df_ctx *ctx, df_tensor *q, df_tensor *k, df_tensor *v,
                                    df_tensor *pe);

/* A FLUX double block's attention on the modulated streams nx [B, S_img, D] and
 * nc [B, S_txt, D], text first in one attention of H heads (q, k normed with eps; pe the RoPE
 * table) -> a[0] image [B, S_img, D] after to_out, a[1] text [B, S_txt, D] after to_add_out,
 * each summed over the tp ranks. */
void df_transformer_joint_attention(df_ctx *ctx, const df_joint_attn_weights *w, df_tensor *nx,
                                    df_tensor *nc, df_tensor *pe, int64_t H, float eps, int tp,
                                    df_tensor **a);
/* A feed-forward's activation between its two linears (gelu-tanh, SwiGLU). */
typedef df_tensor *(*df_transformer_act)(df_ctx *ctx, df_tensor *x);
/* One FLUX double-block stream's second half, on x [B, S, D] and its attention output a:
 * h = x + gate_msa * a, then h + gate_mlp * FF(modulated h), with m the stream's six
 * modulation vectors [B, 1, D] and FF the linears `in`, `out` around `act` (`out` split
 * rowwise over tp ranks) -> [B, S, D]. */
df_tensor *df_transformer_stream_feed_forward(df_ctx *ctx, const df_linear_weights *in,
                                              const df_linear_weights *out, df_transformer_act act,
                                              int tp, df_tensor *x, df_tensor *a,
                                              df_tensor *const *m, float eps);

/* MagCache before the FLUX models' first block, on the streams c [B, S_txt, D] and
 * x [B, S_img, D]: the joint sequence [c, x'] the skipped blocks are taken to make
 * (x' the image stream they would give), or NULL when the blocks run. */
df_tensor *df_transformer_mag_skip(df_ctx *ctx, df_transformer *t, df_tensor *c, df_tensor *x);
/* The FLUX models' single-stream blocks: the joint sequence [c, x] (text first, s_txt tokens)
 * through the n_single blocks that follow the n_double double ones, each given `mod` (its
 * conditioning) and pe; MagCache's tail then takes the image part. -> [B, S, D]. */
df_tensor *df_transformer_single_stream(df_ctx *ctx, df_transformer *t, int64_t n_double,
                                        int64_t n_single, df_tensor *c, df_tensor *x,
                                        df_tensor *mod, df_tensor *pe);
/* The end of a FLUX forward on the joint sequence h [B, S, D]: the step cache's call ends;
 * the image part (after s_txt text tokens) through AdaLayerNormContinuous (norm_out with
 * temb, eps) and proj_out, the blocks ended, kept past the forward's scope `outer`
 * -> [B, S_img, out]. */
df_tensor *df_transformer_two_stream_out(df_ctx *ctx, df_transformer *t, df_scope outer,
                                         df_tensor *h, int64_t s_txt, df_tensor *temb,
                                         const df_linear_weights *norm_out,
                                         const df_linear_weights *proj_out, float eps);

#endif
