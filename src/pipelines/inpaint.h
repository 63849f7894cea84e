/*
 * Inpainting, the part FluxInpaintPipeline and StableDiffusion3InpaintPipeline share
 * (inpaint.c): the checks on the mask, the latents kept for the blend, and the blend after
 * every step. The pipelines' loops call these as hooks; they run on the host.
 */
#ifndef DF_PIPELINES_INPAINT_H
#define DF_PIPELINES_INPAINT_H

#include <diffuse/pipeline.h>
#include <diffuse/vae.h>

/* What the blend reads, each `n` floats in the pipeline's latent layout. */
typedef struct df_inpaint {
    int64_t n;
    float *image; /* the picture's latents, the same for every image of the batch */
    float *noise; /* the noise drawn, or the given latents */
    float *mask;  /* 1 where the model paints, 0 where the picture stays */
} df_inpaint;

/* Rearranges [B, C, h, w] into the pipeline's latent layout (FLUX.1's 2x2 packing); NULL
 * keeps it. */
typedef void (*df_latent_layout_fn)(const float *src, float *dst, int64_t B, int64_t C, int64_t h,
                                    int64_t w);

/*
 * df_pipeline_run's check for every pipeline class, before any model runs: a mask on a
 * class without inpainting, a mask without an image or of another size than it, an
 * inpaint class without a mask, a negative padding_mask_crop are refused (DF_E_ARG /
 * DF_E_UNSUPPORTED naming the rule). After it, a run inpaints when g->mask is set.
 */
df_status df_inpaint_check(const df_pipeline *p, const df_gen_params *g);

/*
 * prepare_latents and prepare_mask_latents: the picture encoded (one posterior sample()
 * from the run's generator), then the batch's noise from the same generator, and the
 * starting latents sigma * noise + (1 - sigma) * picture into start; with g->latents (in
 * the pipeline's layout) they are the start and the noise. The mask from
 * df_image_mask_preprocess at H x W, nearest-resized to the latents' h x w as
 * torch.nn.functional.interpolate does, over every channel. `multiple` is the processors'
 * vae_scale_factor; `channels` the latent channels the transformer reads (C), which must be
 * the VAE's (DF_E_UNSUPPORTED otherwise). start has B * C * h * w floats; ip is filled
 * (free with df_inpaint_deinit, also on failure).
 */
df_status df_inpaint_prepare(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                             const df_gen_params *g, int B, int H, int W, int multiple,
                             int64_t channels, float sigma, df_latent_layout_fn layout,
                             float *start, df_inpaint *ip);

/*
 * After the scheduler's step i of `steps` (sigmas the scheduler's): the kept part of lat
 * takes the picture's latents noised to the next step's sigma (the picture itself after
 * the last step): lat = (1 - mask) * proper + mask * lat, in float32.
 */
void df_inpaint_blend(const df_inpaint *ip, const float *sigmas, int i, int steps, float *lat);

void df_inpaint_deinit(df_inpaint *ip);

/*
 * A run with padding_mask_crop > 0 (df_pipeline_run calls it instead of the class's run):
 * the crop box around the mask (df_image_mask_crop_region for the output's size), the
 * picture and the mask cropped to it and fitted to the output's size, the class's run on
 * them, then every image put back over the picture (df_image_apply_overlay), so the
 * output has the picture's size; image_f32 holds those images' bytes / 255.
 */
df_status df_inpaint_run_cropped(df_pipeline *p, const df_gen_params *g, df_gen_output *out);

#endif
