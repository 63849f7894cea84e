/*
 * FluxKontextPipeline (FLUX.1 Kontext): the output size it fits to max_area, the size the
 * picture is encoded at, and the picture's tokens that join the latents on the transformer's
 * input (kontext.c). The denoising loop is FluxPipeline's (flux.c).
 */
#ifndef DF_PIPELINES_KONTEXT_H
#define DF_PIPELINES_KONTEXT_H

#include <diffuse/pipeline.h>
#include <diffuse/vae.h>

#include "pipelines/pipeline.h"

/*
 * The run's parameters as FluxKontextPipeline.__call__ sizes them, into *sized (a copy of g
 * that borrows g's pointers): height and width (0: default_size) keep their aspect ratio
 * and are fitted to g->max_area pixels (0: default_size squared, 1024 x 1024 for FLUX.1
 * Kontext's folders), width = round(sqrt(max_area * w / h)), rounded down to `multiple`
 * (vae_scale_factor * 2), as diffusers does. Refused before any model runs, naming the
 * rule: a list of pictures (the pipeline takes one: DF_E_ARG), a strength (it has none),
 * a max_area that leaves a side under `multiple`, a picture under `multiple` pixels.
 */
df_status df_kontext_params(const df_pipeline *p, const df_gen_params *g, int default_size,
                            int multiple, df_gen_params *sized);

/*
 * The size the picture is encoded at: its sides rounded down to `multiple` (the pipeline's
 * image processor's get_default_height_width, whose factor is vae_scale_factor * 2); with
 * auto_resize, the entry of PREFERRED_KONTEXT_RESOLUTIONS whose aspect ratio is nearest to
 * that (ties: the narrower). DF_E_ARG, naming the rule, when a side rounds to 0.
 */
df_status df_kontext_image_size(const df_image *img, int multiple, bool auto_resize, int *height,
                                int *width);

/*
 * FluxKontextPipeline.prepare_latents for the picture: resized to its encoding size with
 * PIL's Lanczos, normalised, encoded (the encoder loaded from vae_dir into *enc on first
 * use), the posterior's mode ("argmax": nothing drawn), (x - shift) * scale, packed 2x2 into
 * tokens in row-major order with ids [n_tokens, 3] = (1, y, x) (channels 64). Free with
 * df_image_tokens_deinit; share to the other ranks with df_image_tokens_share.
 */
df_status df_kontext_image_make(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                                const df_gen_params *g, int multiple, df_image_tokens *out);

#endif
