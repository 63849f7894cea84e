/*
 * Step caches inside a transformer's forward (include/diffuse/step_cache.h has the configs).
 *
 * The transformer base makes the caches of a run (df_transformer_enable_cache, from the
 * model's class and attention modules) and frees them after the loop. The transformer's
 * forward brackets each call with df_step_cache_begin / df_step_cache_end and asks, at the
 * places diffusers hooks:
 *
 * - FirstBlockCache, around the repeated blocks (diffusers' FBCHeadBlockHook and the tail's
 *   FBCBlockHook): df_step_cache_head after the first block says whether the rest run; if
 *   they do, df_step_cache_keep_head takes the first block's output (laid out as the last
 *   block's output is) and df_step_cache_tail the last block's output, whose difference is
 *   the cached residual; if not, df_step_cache_skip adds that residual to the first
 *   block's output instead.
 * - MagCache, around all the blocks (MagCacheHeadHook, the tail's MagCacheBlockHook):
 *   df_step_cache_mag_head before the first block decides; df_step_cache_mag_tail after the
 *   last takes the residual.
 * - TaylorSeer, around each attention module (TaylorSeerCacheHook on "*blocks.*attn"):
 *   df_step_cache_predict fills the module's outputs from its Taylor factors on a
 *   predicted step; otherwise the module computes and df_step_cache_update takes them.
 *
 * Cached tensors live across calls (df_tensor_persist) until the cache is freed. Failures
 * fail the context, like ops.
 */
#ifndef DF_MODELS_STEP_CACHE_H
#define DF_MODELS_STEP_CACHE_H

#include <stdbool.h>

#include <diffuse/runtime.h>
#include <diffuse/step_cache.h>

typedef struct df_step_cache df_step_cache;

/* A cache for one run of `steps` transformer calls of `model` (its class name, for
 * messages) with `n_modules` attention modules. NULL config or DF_CACHE_NONE: *out NULL. */
df_status df_step_cache_create(const df_cache_config *cfg, const char *model, int n_modules,
                               df_step_cache **out);

const df_cache_config *df_step_cache_config(const df_step_cache *c);

/* A transformer call begins / ends (its letter goes into the trace). */
void df_step_cache_begin(df_step_cache *c);
void df_step_cache_end(df_step_cache *c);
/* One letter per call so far ('C', 'S', 'P'); the first-block cache's relative change per
 * call (NAN where it was not measured) in diffs[0..n) (may be NULL). */
const char *df_step_cache_trace(const df_step_cache *c);
const double *df_step_cache_diffs(const df_step_cache *c, int *n);

/* FirstBlockCache. x_in, x_out: the hidden states [B, S, D] before and after the first
 * block. Returns whether the remaining blocks run (false on a failure, which fails ctx). */
bool df_step_cache_first_block(const df_step_cache *c);
bool df_step_cache_head(df_ctx *ctx, df_step_cache *c, df_tensor *x_in, df_tensor *x_out);
void df_step_cache_keep_head(df_ctx *ctx, df_step_cache *c, df_tensor *head_out);
df_tensor *df_step_cache_skip(df_ctx *ctx, df_step_cache *c, df_tensor *head_out);
void df_step_cache_tail(df_ctx *ctx, df_step_cache *c, df_tensor *tail_out);

/* MagCache, before the first block: x_in [B, S_img, D] the image stream. NULL when the
 * blocks run (then df_step_cache_mag_tail takes the last block's image output); otherwise
 * the image stream the skipped blocks are taken to make (the text stream is unchanged). */
bool df_step_cache_mag(const df_step_cache *c);
df_tensor *df_step_cache_mag_head(df_ctx *ctx, df_step_cache *c, df_tensor *x_in);
void df_step_cache_mag_tail(df_ctx *ctx, df_step_cache *c, df_tensor *x_out);

/* TaylorSeer. Module `module` (0..n_modules) with n outputs: true when this call predicts
 * them (written to out[0..n)); false when the module computes, and then
 * df_step_cache_update takes its outputs. */
bool df_step_cache_predict(df_ctx *ctx, df_step_cache *c, int module, df_tensor **out, int n);
void df_step_cache_update(df_ctx *ctx, df_step_cache *c, int module, df_tensor *const *out, int n);

void df_step_cache_free(df_step_cache *c);

#endif
