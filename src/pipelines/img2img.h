/*
 * Image to image, the part FluxImg2ImgPipeline and StableDiffusion3Img2ImgPipeline share
 * (img2img.c): how strength cuts the schedule, and the starting latents made from the
 * input picture.
 */
#ifndef DF_PIPELINES_IMG2IMG_H
#define DF_PIPELINES_IMG2IMG_H

#include <diffuse/pipeline.h>
#include <diffuse/vae.h>

#include <diffuse/rng.h>

/* diffusers' default strength. */
#define DF_IMG2IMG_DEFAULT_STRENGTH 0.6

/*
 * get_timesteps: with `steps` scheduled, the loop starts at step *first = int(max(steps -
 * min(steps * strength, steps), 0)) (in double, as Python computes it) and runs the rest.
 * DF_E_ARG, naming the rule, for strength outside (0, 1] (any strength above 0 leaves at
 * least one step; the check for none stays as diffusers has it).
 */
df_status df_img2img_first_step(const df_gen_params *g, int steps, int *first);

/*
 * The starting latents [B, C, H/f, W/f] of an img2img run, as prepare_latents makes them:
 * g->image through VaeImageProcessor.preprocess to H x W (a multiple of `multiple`), the VAE
 * encoder (loaded from vae_dir into *enc on first use, kept for later runs), the
 * posterior's sample() with the run's generator, (x - shift) * scale, repeated over the B
 * images; then noise drawn from the same generator (B, C, h, w) and the scheduler's
 * scale_noise at sigma: sigma * noise + (1 - sigma) * latents, in float32. One generator
 * only: a list of generators is DF_E_UNSUPPORTED.
 */
df_status df_img2img_latents(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                             const df_gen_params *g, int B, int H, int W, int multiple, float sigma,
                             float *out);

/*
 * The first half of df_img2img_latents, for the pipelines that keep the picture's latents
 * (inpainting): g->image preprocessed to H x W, encoded (the encoder loaded into *enc on
 * first use) and drawn from with `rng` (the posterior's sample()), (x - shift) * scale:
 * [1, C, h, w] into lat, df_img2img_latent_size floats.
 */
df_status df_img2img_encode(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                            const df_gen_params *g, int H, int W, int multiple, df_rng *rng,
                            float *lat);
/* The encoding itself with an encoder already loaded and resident: g->image as the encoder
 * reads it, [1, 3, H, W] (H and W multiples of `multiple`, else DF_E_ARG), encoded and
 * drawn from with `rng` (NULL: the posterior's mode), scaled, into lat. */
df_status df_img2img_encode_picture(df_pipeline *p, df_vae_encoder *enc, const df_gen_params *g,
                                    int H, int W, int multiple, df_rng *rng, float *lat);
int64_t df_img2img_latent_size(const df_vae_encoder *enc, int H, int W);

#endif
