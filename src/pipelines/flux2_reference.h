/*
 * FLUX.2's reference images (Flux2Pipeline / Flux2KleinPipeline with image=): the encoded
 * picture as extra tokens with their own ids, joined to the latents on the transformer's
 * input only (flux2_reference.c).
 */
#ifndef DF_PIPELINES_FLUX2_REFERENCE_H
#define DF_PIPELINES_FLUX2_REFERENCE_H

#include <diffuse/pipeline.h>
#include <diffuse/vae.h>

#include "pipelines/pipeline.h"

/*
 * Checks the picture before any model runs: Flux2ImageProcessor.check_image_input's rules
 * (sides of at least 64 pixels, aspect ratio at most 8:1: DF_E_ARG), naming the rule.
 */
df_status df_flux2_reference_check(const df_image *img);

/*
 * The size the picture is encoded at: over 1024 x 1024 pixels it is shrunk to that area
 * keeping its aspect ratio (sides int(side * sqrt(2^20 / (w * h)))), then its sides are
 * rounded down to `multiple` (the excess is cropped at the centre).
 */
void df_flux2_reference_size(const df_image *img, int multiple, int *height, int *width);

/*
 * prepare_image_latents for n pictures: each shrunk and cropped as df_flux2_reference_size
 * says (PIL's Lanczos), encoded, the
 * posterior's mode, patchified and batch-norm normalised, packed row by row into tokens
 * with ids (10 + 10 i, y, x, 0) for picture i (_prepare_image_ids), the pictures' tokens one
 * after the other. The encoder is loaded from vae_dir into *enc on first use; `tiled`
 * encodes with df_vae_encode_tiled (the pipeline's vae_tiling, as enable_tiling()). Ids
 * [Sr, 4] as (t, h, w, l), channels 128. Free with df_image_tokens_deinit; share to the
 * other ranks with df_image_tokens_share.
 */
df_status df_flux2_reference_make(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                                  const df_image *const *imgs, int n, int multiple, bool tiled,
                                  df_image_tokens *out);

#endif
