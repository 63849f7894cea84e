/*
 * LoRA adapters: low-rank updates W' = W + sum_i s_i B_i A_i read from adapter files and
 * merged into the weights they target while a model binds them (loader.c).
 *
 * An adapter file holds, per target module, A [rank, in] and B [out, rank] in one of four
 * layouts, recognised from the keys as diffusers' load_lora_weights recognises them:
 *   diffusers / peft   "<component>.<module>.lora_A.weight", ".lora_B.weight", with alpha
 *                      in the safetensors metadata (lora_adapter_metadata: r, lora_alpha,
 *                      rank_pattern, alpha_pattern, use_rslora per component) or as
 *                      "<component>.<module>.alpha" tensors
 *   kohya / sd-scripts "lora_unet_<BFL module, '.' -> '_'>.lora_down.weight", ".lora_up
 *                      .weight", ".alpha"; "lora_transformer_<diffusers module, '_'>" the
 *                      same with diffusers' names; "lora_te1_<CLIP-L module>" for CLIP-L;
 *                      "lora_te2_*" (T5) read and dropped, as diffusers drops them; on
 *                      FLUX.1 also ComfyUI's "diffusion_model." / "text_encoders.clip_l."
 *   XLabs              "double_blocks.N.processor.{qkv,proj}_lora{1,2}.{down,up}.weight",
 *                      "single_blocks.N.processor.{qkv,proj}_lora.{down,up}.weight"
 *   BFL / ai-toolkit   "diffusion_model.<BFL FLUX.2 module>.lora_A.weight", ".lora_B.weight"
 * On FLUX.1 the kohya and XLabs names are Black Forest Labs' modules: a fused weight's B
 * (qkv, linear1) is cut into the rows of the split diffusers weights with the single-file
 * name map (names_flux.c), as diffusers' converters split lora_up. On FLUX.2 the kohya and
 * BFL names map as diffusers' FLUX.2 converters map them (a table in lora.c). Keys that
 * diffusers filters out before converting are read past with a warning line.
 *
 * Scale rule (peft's): s = adapter weight x alpha / rank (alpha / sqrt(rank) with
 * use_rslora), alpha defaulting to the rank; several adapters add up, as set_adapters does.
 */
#ifndef DF_MODELS_LORA_H
#define DF_MODELS_LORA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/pipeline.h>

typedef struct df_lora_set df_lora_set;

/* Opens and checks the adapter files of `specs` for a pipeline of class `pipeline`
 * ("FluxPipeline", ...; NULL: any, without warning lines), which decides what takes adapters as
 * diffusers' _lora_loadable_modules does: FLUX.1 the transformer and text_encoder, SD3 also
 * text_encoder_2, FLUX.2 the transformer only (modules of the others are read, not applied,
 * with a warning line); kohya is read for FLUX.1 and FLUX.2, XLabs for FLUX.1, BFL /
 * ai-toolkit for FLUX.2, and each is refused where diffusers' loader converts no such file. On
 * success *out is owned by the caller (df_lora_set_free). DF_E_IO, DF_E_FORMAT (the message names
 * the file and the key: a lora_A without its lora_B, ranks that disagree, a key that is not a LoRA
 * tensor), DF_E_UNSUPPORTED (peft DoRA, LoRA biases, LoKr, other layouts, tensor dtypes). */
df_status df_lora_set_load(const df_lora_spec *specs, int n, const char *pipeline,
                           df_lora_set **out);
void df_lora_set_free(df_lora_set *set);

/* As df_lora_set_load for one adapter file held in memory (`buf`, `len`, kept alive and
 * unchanged until the set is freed), called `name` in messages, with weight `scale`. For
 * tests and fuzzing. */
df_status df_lora_set_load_memory(const void *buf, size_t len, const char *name, float scale,
                                  const char *pipeline, df_lora_set **out);

/* Whether an adapter updates weight `name` of `component` ("transformer", "text_encoder"). */
bool df_lora_touches(const df_lora_set *set, const char *component, const char *name);

/* Adds sum s B A to the 2-D weight `name` of `component`, w [rows, cols] in f32, on
 * `threads` threads. DF_E_FORMAT
 * when an adapter's A or B does not fit the weight (naming the file, key and shapes). */
df_status df_lora_merge(df_lora_set *set, const char *component, const char *name, float *w,
                        int64_t rows, int64_t cols, int threads);

/* The adapters' updates of weight `name` [rows, cols] of `component` in factored form, for
 * applying them beside the weight instead of into it: *down [R, cols] (each adapter's A
 * times its scale) and *up [rows, R] (its B, cut to the weight's rows), R the summed ranks.
 * Both are the caller's (df_free); *r is 0 and both NULL when no adapter updates the
 * weight. DF_E_FORMAT as df_lora_merge. */
df_status df_lora_factors(df_lora_set *set, const char *component, const char *name, int64_t rows,
                          int64_t cols, float **down, float **up, int64_t *r);

/* DF_E_FORMAT naming the first adapter key that updated no weight (a target the model does
 * not have); `component` NULL: of any component, else of that one only. */
df_status df_lora_check_used(const df_lora_set *set, const char *component);

#endif
