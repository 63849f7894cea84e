/*
 * Things that concern every model class at once.
 */
#ifndef DIFFUSE_MODELS_H
#define DIFFUSE_MODELS_H

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Registers, for `diffuse inspect` (df_model_check_find), a checker for every model class
 * diffuse implements: FluxTransformer2DModel, SD3Transformer2DModel, CLIPTextModel(
 * WithProjection), T5EncoderModel, AutoencoderKL, MistralModel, MistralForCausalLM,
 * Mistral3ForConditionalGeneration, Qwen3Model, Qwen3ForCausalLM. Each loads the folder as a
 * pipeline would and reports the first missing, unexpected or mis-shaped tensor or bad config
 * key. */
DF_API df_status df_models_register_checks(void);

#ifdef __cplusplus
}
#endif
#endif
