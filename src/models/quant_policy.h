/*
 * The int8 quantization policy: which weights int8 compute quantizes, in one place.
 *
 * Under compute dtype DF_DTYPE_I8 every linear weight a model binds is quantized on first
 * use (the CPU backend keeps the 8-bit form and drops the file's pages), except those this
 * policy keeps in f32: the VAE and CLIP (small, and outside the scope), and in the
 * diffusion transformers the embedders and the output layers (each class's int8_keep row
 * in the model table, model_classes.c: x_embedder, context_embedder, time_text_embed,
 * norm_out, proj_out: a few percent of the weights and the largest share of the error;
 * docs/int8.md has the measurements).
 * DIFFUSE_INT8_KEEP=none (or df_load_opts.int8_keep = -1) quantizes those too.
 */
#ifndef DF_MODELS_QUANT_POLICY_H
#define DF_MODELS_QUANT_POLICY_H

#include <stdbool.h>
#include <stddef.h>

#include <diffuse/runtime.h>

/* Whether int8 compute keeps tensor `name` of `component` in higher precision; `keep` as
 * df_load_opts.int8_keep (1 the policy, -1 the transformer keeps nothing, 0
 * DIFFUSE_INT8_KEEP decides). */
bool df_quant_keeps_precision(const char *component, const char *name, int keep);

/* Tells the runtime the precision t (the bound tensor `name`, `bytes` in the file) keeps
 * under the policy, and gives in *resident the bytes it will hold resident under ctx's
 * compute dtype: the 8-bit form and its scales for a quantized linear weight, else
 * `bytes`. DF_E_OOM when the weight's record cannot be made. */
df_status df_quant_bind(df_ctx *ctx, const char *component, const char *name, df_tensor *t,
                        size_t bytes, size_t *resident);

/* For a weight saved quantized (I8, from df_quantize_model) bound as t (the whole tensor,
 * or a rank's part): hands `scale`, its bound "<name>_scale" (or the part that goes with
 * t), to the weight's storage for the int8 products; `tiled`: both are in the kernels'
 * tiles (core/int8_tiles.h), which the products read in place. DF_E_FORMAT when the scales
 * do not fit t's rows and groups, DF_E_OOM when the weight's record cannot be made. */
df_status df_quant_attach_int8(const char *name, df_tensor *t, df_tensor *scale, bool tiled);

#endif
