/*
 * FLUX.2's starting latents and position ids on the host (Flux2Pipeline.prepare_latents,
 * _prepare_latent_ids, _prepare_text_ids, _pack_latents), shared by Flux2Pipeline and
 * Flux2KleinPipeline.
 *
 * FLUX.2 draws its noise in the VAE's patchified, normalised space: randn of shape
 * (B, 4C, H/16, W/16) (4C = 128), one draw from one generator for the whole batch, then
 * packs it to tokens (B, (H/16)(W/16), 4C) with ids (0, h, w, 0) in raster order. (FLUX.1
 * draws (B, C, H/8, W/8) instead, so a seed gives different numbers to the two.)
 */
#ifndef DF_SCHED_FLUX2_LATENTS_H
#define DF_SCHED_FLUX2_LATENTS_H

#include <stdint.h>

#include <diffuse/rng.h>
#include <diffuse/status.h>

/* _pack_latents on the host: [B, C, h, w] -> [B, h*w, C]. in and out must not overlap. */
void df_flux2_pack_latents(const float *in, int64_t B, int64_t C, int64_t h, int64_t w,
                           float *out);

/* The same inverted: [B, h*w, C] -> [B, C, h, w]. */
void df_flux2_unpack_latents(const float *in, int64_t B, int64_t C, int64_t h, int64_t w,
                             float *out);

/*
 * prepare_latents' noise: B * C * h * w standard normals drawn from rng as
 * torch.randn((B, C, h, w), generator=g, dtype=float32) draws them, written packed
 * ([B, h*w, C]). `scratch` holds as many floats (the unpacked draw). DF_E_ARG for sizes
 * below 1 or NULL buffers.
 */
df_status df_flux2_noise(df_rng *rng, int64_t B, int64_t C, int64_t h, int64_t w, float *scratch,
                         float *out);

/* _prepare_latent_ids: [B, h*w, 4] with token y*w + x = (0, y, x, 0). */
void df_flux2_latent_ids(int64_t B, int64_t h, int64_t w, int64_t *ids);

/* _prepare_text_ids: [B, L, 4] with token l = (0, 0, 0, l). */
void df_flux2_text_ids(int64_t B, int64_t L, int64_t *ids);

#endif
