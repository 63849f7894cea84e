/*
 * Inpainting for FLUX.1 and SD3 (FluxInpaintPipeline, StableDiffusion3InpaintPipeline, as
 * diffusers 0.42 runs them with a 16-channel transformer).
 *
 * The run is image to image (strength cuts the schedule as get_timesteps does, the loop
 * starts from the picture's latents noised to the first step's sigma) plus a blend after
 * every scheduler step: where the mask is 0 the latents are replaced by the picture's
 * latents noised to the next step's sigma with the run's own noise, so only the masked part
 * is painted. The mask is VaeImageProcessor's binarised grey picture (image_mask.c) at the
 * output size, nearest-resized to the latents' size; it is 0 or 1, so the blend selects
 * exactly.
 *
 * Random numbers, in diffusers' order from one generator: the picture's posterior sample(),
 * then the batch's noise. diffusers then encodes the masked picture too (another sample()),
 * but a 16-channel transformer never reads those latents and nothing is drawn after them,
 * so we do not compute them. The blend runs on the host, so the pipelines step on the host
 * when they inpaint.
 *
 * Under tensor parallelism (FLUX.1; SD3 has no plan) rank 0 alone encodes the picture,
 * draws the noise and keeps what the blend reads; the other ranks' blend data stay empty
 * (n = 0, the blend does nothing there) and they take rank 0's blended latents after every
 * step, as the loop shares them for any run under tensor parallelism.
 */
#include "pipelines/inpaint.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "pipelines/img2img.h"
#include "pipelines/pipeline.h"

static bool can_inpaint(const df_pipeline_kind *k)
{
    return k == &df_flux_pipeline_class || k == &df_flux_inpaint_pipeline_class ||
           k == &df_sd3_pipeline_class || k == &df_sd3_inpaint_pipeline_class;
}

df_status df_inpaint_check(const df_pipeline *p, const df_gen_params *g)
{
    bool inpaint_class = p->cls->role == DF_PIPELINE_INPAINT;
    if (!g->mask) {
        if (inpaint_class)
            return df_errorf(DF_E_ARG, "%s: %s needs an input image and a mask", p->dir,
                             p->cls->name);
        if (g->padding_mask_crop != 0)
            return df_errorf(DF_E_ARG,
                             "padding_mask_crop %d without a mask: it crops "
                             "around the mask",
                             g->padding_mask_crop);
        return DF_OK;
    }
    if (!can_inpaint(p->cls))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: a mask (inpainting) is implemented for "
                         "FLUX.1 and SD3 folders, not %s",
                         p->dir, p->cls->name);
    if (!g->image)
        return df_errorf(DF_E_ARG, "a mask needs an input image to paint into");
    if (g->mask->width != g->image->width || g->mask->height != g->image->height)
        return df_errorf(DF_E_ARG,
                         "the mask is %dx%d but the input image is %dx%d: they "
                         "must be the same size",
                         g->mask->width, g->mask->height, g->image->width, g->image->height);
    if (g->padding_mask_crop < 0)
        return df_errorf(DF_E_ARG, "padding_mask_crop must be >= 0, not %d", g->padding_mask_crop);
    return DF_OK;
}

/* torch.nn.functional.interpolate(mode="nearest") of one [in_h, in_w] plane: the source
 * of output index i is min(floor(i * (in / out) in float32), in - 1). */
static int64_t nearest_index(int64_t i, int64_t in, int64_t out)
{
    if (out == in)
        return i;
    if (out == 2 * in)
        return i >> 1;
    float scale = (float)in / (float)out;
    int64_t src = (int64_t)floorf((float)i * scale);
    return src < in - 1 ? src : in - 1;
}

/* The mask [B, C, h, w] (before the layout) from the mask picture. */
static df_status latent_mask(const df_gen_params *g, int B, int64_t C, int H, int W, int64_t h,
                             int64_t w, int multiple, float *out)
{
    float *full = df_malloc((size_t)H * W * sizeof *full);
    if (!full)
        return df_errorf(DF_E_OOM, "out of memory for the mask");
    df_status s = df_image_mask_preprocess(g->mask, H, W, multiple, DF_RESAMPLE_LANCZOS, full);
    if (s != DF_OK) {
        df_free(full);
        return df_error_context(s, "mask");
    }
    for (int64_t y = 0; y < h; y++)
        for (int64_t x = 0; x < w; x++)
            out[y * w + x] = full[nearest_index(y, H, h) * W + nearest_index(x, W, w)];
    for (int64_t k = 1; k < B * C; k++) /* mask.repeat over channels and the batch */
        memcpy(out + k * h * w, out, (size_t)(h * w) * sizeof *out);
    df_free(full);
    return DF_OK;
}

/* Applies the layout to buf (n floats) through tmp. */
static void to_layout(df_latent_layout_fn layout, float *buf, float *tmp, int B, int64_t C,
                      int64_t h, int64_t w)
{
    if (!layout)
        return;
    int64_t n = B * C * h * w;
    layout(buf, tmp, B, C, h, w);
    memcpy(buf, tmp, (size_t)n * sizeof *buf);
}

df_status df_inpaint_prepare(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                             const df_gen_params *g, int B, int H, int W, int multiple,
                             int64_t channels, float sigma, df_latent_layout_fn layout,
                             float *start, df_inpaint *ip)
{
    memset(ip, 0, sizeof *ip);
    df_rng rng;
    df_rng_init(&rng, g->n_seeds == 1 ? g->seeds[0] : g->seed);
    float *one = NULL;
    df_status s = DF_OK;
    /* the encoder is loaded by the first encode; its size comes after */
    if (!*enc)
        s = df_vae_encoder_load_file(p->ctx, vae_dir, p->opts.vae_file, enc);
    if (s != DF_OK)
        return df_error_context(s, "%s", vae_dir);
    const df_vae_info *info = df_vae_encoder_config(*enc);
    int64_t C = info->latent_channels, f = info->scale_factor, h = H / f, w = W / f;
    if (C != channels)
        return df_errorf(DF_E_UNSUPPORTED,
                         "inpainting: the transformer reads %lld latent "
                         "channels, the VAE makes %lld; transformers that take the mask and "
                         "the masked picture on their input are not implemented",
                         (long long)channels, (long long)C);
    int64_t per = C * h * w, n = B * per;
    one = df_malloc((size_t)per * sizeof *one);
    ip->n = n;
    ip->image = df_malloc((size_t)n * sizeof *ip->image);
    ip->noise = df_malloc((size_t)n * sizeof *ip->noise);
    ip->mask = df_malloc((size_t)n * sizeof *ip->mask);
    float *tmp = df_malloc((size_t)n * sizeof *tmp);
    if (!one || !ip->image || !ip->noise || !ip->mask || !tmp)
        s = df_errorf(DF_E_OOM, "out of memory for the inpainting latents");
    if (s == DF_OK)
        s = df_img2img_encode(p, vae_dir, enc, g, H, W, multiple, &rng, one);
    for (int64_t i = 0; s == DF_OK && i < n; i++)
        ip->image[i] = one[i % per];
    if (s == DF_OK && g->latents) { /* already in the layout: the start and the noise */
        memcpy(start, g->latents, (size_t)n * sizeof *start);
        memcpy(ip->noise, g->latents, (size_t)n * sizeof *start);
    } else if (s == DF_OK) {
        s = df_rng_randn_f32(&rng, ip->noise, n); /* after the posterior's */
        for (int64_t i = 0; s == DF_OK && i < n; i++)
            start[i] = sigma * ip->noise[i] + (1.0f - sigma) * ip->image[i]; /* scale_noise */
        if (s == DF_OK) {
            to_layout(layout, ip->noise, tmp, B, C, h, w);
            to_layout(layout, start, tmp, B, C, h, w);
        }
    }
    if (s == DF_OK)
        s = latent_mask(g, B, C, H, W, h, w, multiple, ip->mask);
    if (s == DF_OK) {
        to_layout(layout, ip->image, tmp, B, C, h, w);
        to_layout(layout, ip->mask, tmp, B, C, h, w);
    }
    df_free(one);
    df_free(tmp);
    return s;
}

void df_inpaint_blend(const df_inpaint *ip, const float *sigmas, int i, int steps, float *lat)
{
    bool last = i + 1 >= steps;
    float sigma = last ? 0.0f : sigmas[i + 1];
    for (int64_t k = 0; k < ip->n; k++) {
        float proper = ip->image[k];
        if (!last) /* scale_noise at the next timestep */
            proper = sigma * ip->noise[k] + (1.0f - sigma) * ip->image[k];
        float m = ip->mask[k];
        lat[k] = (1.0f - m) * proper + m * lat[k];
    }
}

void df_inpaint_deinit(df_inpaint *ip)
{
    df_free(ip->image);
    df_free(ip->noise);
    df_free(ip->mask);
    memset(ip, 0, sizeof *ip);
}

/* The outputs' images overlaid on the picture (apply_overlay), at the picture's size. */
static df_status overlay_outputs(const df_gen_params *g, const int box[4], df_gen_output *out)
{
    int W = g->image->width, H = g->image->height;
    size_t per = (size_t)W * H * 3;
    float *f32 = df_malloc((size_t)out->count * per * sizeof *f32);
    if (!f32)
        return df_errorf(DF_E_OOM, "out of memory for the overlaid images");
    for (int b = 0; b < out->count; b++) {
        df_image *o;
        df_status s = df_image_apply_overlay(g->mask, g->image, out->images[b], box, &o);
        if (s != DF_OK) {
            df_free(f32);
            return df_error_context(s, "padding_mask_crop");
        }
        df_image_free(out->images[b]);
        out->images[b] = o;
        for (size_t i = 0; i < per; i++)
            f32[(size_t)b * per + i] = (float)o->pixels[i] / 255.0f;
    }
    df_free(out->image_f32);
    out->image_f32 = f32;
    out->width = W, out->height = H;
    return DF_OK;
}

df_status df_inpaint_run_cropped(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    int H = g->height ? g->height : p->default_size, W = g->width ? g->width : p->default_size;
    int box[4];
    DF_TRY(df_image_mask_crop_region(g->mask, W, H, g->padding_mask_crop, box));
    df_image *image = NULL, *mask = NULL;
    df_status s = df_image_crop_fill(g->image, box, W, H, &image);
    if (s == DF_OK)
        s = df_image_crop_fill(g->mask, box, W, H, &mask);
    if (s != DF_OK)
        s = df_error_context(s, "padding_mask_crop %d", g->padding_mask_crop);
    df_gen_params cropped = *g;
    cropped.image = image;
    cropped.mask = mask;
    cropped.padding_mask_crop = 0;
    if (s == DF_OK)
        s = p->cls->ops->run(p, &cropped, out);
    if (s == DF_OK && out->count > 0) /* under tensor parallelism only rank 0 has images */
        s = overlay_outputs(g, box, out);
    df_image_free(image);
    df_image_free(mask);
    return s;
}
