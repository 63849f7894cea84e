/*
 * Each model's weight set, for the pipelines' offload hooks and for writing weights out
 * (loader.h: df_ws_release, df_ws_acquire, df_ws_bound). Borrowed pointers, valid while
 * the model lives. (Residency itself is the runtime's: runtime/weight.h.)
 */
#ifndef DF_MODELS_WEIGHT_SETS_H
#define DF_MODELS_WEIGHT_SETS_H

#include <diffuse/clip.h>
#include <diffuse/decoder_lm.h>
#include <diffuse/flux.h>
#include <diffuse/flux2.h>
#include <diffuse/sd3.h>
#include <diffuse/t5.h>
#include <diffuse/vae.h>

#include "models/loader.h"

df_weight_set *df_clip_weight_set(const df_clip *m);
df_weight_set *df_t5_weight_set(const df_t5 *m);
df_weight_set *df_flux_weight_set(const df_flux *m);
df_weight_set *df_flux2_weight_set(const df_flux2 *m);
df_weight_set *df_vae_weight_set(const df_vae *m);
df_weight_set *df_vae_encoder_weight_set(const df_vae_encoder *m);
df_weight_set *df_sd3_weight_set(const df_sd3 *m);
df_weight_set *df_decoder_lm_weight_set(const df_decoder_lm *m);

#endif
