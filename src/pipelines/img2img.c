/*
 * Image to image for FLUX.1 and SD3 (FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline).
 *
 * Both pipelines run their text-to-image loop from a later step, on latents made from the
 * input picture: strength s of n steps starts the loop at int(n - min(n * s, n)), and the
 * starting latents are the picture's encoded latents mixed with noise at that step's
 * sigma (the flow-match scheduler's scale_noise). The random numbers come from one torch
 * generator in diffusers' order: first the posterior's sample() for the encoded picture
 * (one picture, [1, C, h, w]), then the noise for the whole batch [B, C, h, w].
 *
 * The encoder is loaded the first time a run needs it and kept with the pipeline; with
 * model offload it is resident only while it encodes.
 */
#include "pipelines/img2img.h"

#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/pipeline.h"

df_status df_img2img_first_step(const df_gen_params *g, int steps, int *first)
{
    double s = g->strength != 0 ? g->strength : DF_IMG2IMG_DEFAULT_STRENGTH;
    *first = 0;
    if (!(s > 0 && s <= 1))
        return df_errorf(DF_E_ARG, "strength is %g; it must be in (0, 1]", s);
    double init = (double)steps * s < steps ? (double)steps * s : steps;
    double start = (double)steps - init;
    int t_start = (int)(start > 0 ? start : 0);
    if (steps - t_start < 1)
        return df_errorf(DF_E_ARG,
                         "strength %g of %d steps leaves no step to run (steps * strength "
                         "must reach 1)",
                         s, steps);
    *first = t_start;
    return DF_OK;
}

df_status df_img2img_encode_picture(df_pipeline *p, df_vae_encoder *enc, const df_gen_params *g,
                                    int H, int W, int multiple, df_rng *rng, float *lat)
{
    df_ctx *ctx = p->ctx;
    int ph, pw;
    DF_TRY_CTX(df_image_preprocess_size(g->image, H, W, multiple, &ph, &pw), "input image");
    if (ph != H || pw != W)
        return df_errorf(DF_E_ARG, "input image: %dx%d is not a multiple of %d", W, H, multiple);
    const df_vae_info *info = df_vae_encoder_config(enc);
    int64_t C = info->latent_channels, f = info->scale_factor;
    int64_t per = C * (H / f) * (W / f);
    float *pixels = df_malloc((size_t)3 * H * W * sizeof *pixels);
    float *moments = df_malloc((size_t)2 * per * sizeof *moments);
    df_status s = pixels && moments ? DF_OK
                                    : df_errorf(DF_E_OOM, "out of memory encoding "
                                                          "the input image");
    if (s == DF_OK)
        s = df_image_preprocess(g->image, H, W, multiple, DF_RESAMPLE_LANCZOS, pixels);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *m = NULL;
    if (s == DF_OK) {
        df_tensor *img = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 3, H, W), pixels);
        s = !img            ? df_ctx_status(ctx)
            : g->vae_tiling ? df_vae_encode_tiled(ctx, enc, img, 0, &m) /* enable_tiling() */
                            : df_vae_encode(ctx, enc, img, &m);
    }
    if (s == DF_OK)
        s = df_tensor_read(ctx, m, DF_DTYPE_F32, moments, (size_t)2 * per * sizeof *moments);
    df_scope_end(ctx, mark, NULL);
    if (s == DF_OK)
        s = df_vae_latent_dist(moments, 1, C, H / f, W / f, rng, lat);
    if (s == DF_OK)
        s = df_vae_scale_latents(info, lat, per);
    df_free(pixels);
    df_free(moments);
    return s;
}

/* The checks every run with a picture makes, and the encoder loaded on first use. */
static df_status ready_encoder(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                               const df_gen_params *g)
{
    if (!g->image)
        return df_errorf(DF_E_ARG, "image to image needs an input image");
    if (g->n_seeds > 1)
        return df_errorf(DF_E_UNSUPPORTED,
                         "image to image with a list of %d generators is "
                         "not implemented (give one seed)",
                         g->n_seeds);
    if (!*enc)
        DF_TRY_CTX(df_vae_encoder_load_file(p->ctx, vae_dir, p->opts.vae_file, enc), "%s",
                   vae_dir);
    return DF_OK;
}

int64_t df_img2img_latent_size(const df_vae_encoder *enc, int H, int W)
{
    const df_vae_info *info = df_vae_encoder_config(enc);
    int64_t f = info->scale_factor;
    return info->latent_channels * (H / f) * (W / f);
}

df_status df_img2img_encode(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                            const df_gen_params *g, int H, int W, int multiple, df_rng *rng,
                            float *lat)
{
    DF_TRY(ready_encoder(p, vae_dir, enc, g));
    df_pipeline_onload(p, df_vae_encoder_weight_set(*enc));
    df_status s = df_img2img_encode_picture(p, *enc, g, H, W, multiple, rng, lat);
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_vae_encoder_weight_set(*enc));
    return s;
}

df_status df_img2img_latents(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                             const df_gen_params *g, int B, int H, int W, int multiple, float sigma,
                             float *out)
{
    DF_TRY(ready_encoder(p, vae_dir, enc, g));
    int64_t per = df_img2img_latent_size(*enc, H, W);
    float *lat = df_malloc((size_t)per * sizeof *lat);
    if (!lat)
        return df_errorf(DF_E_OOM, "out of memory for the input image's latents");
    df_rng rng;
    df_rng_init(&rng, g->n_seeds == 1 ? g->seeds[0] : g->seed);
    df_status s = df_img2img_encode(p, vae_dir, enc, g, H, W, multiple, &rng, lat);
    if (s == DF_OK) /* the noise, after the posterior's, from the same generator */
        s = df_rng_randn_f32(&rng, out, (int64_t)B * per);
    for (int64_t i = 0; s == DF_OK && i < (int64_t)B * per; i++)
        out[i] = sigma * out[i] + (1.0f - sigma) * lat[i % per]; /* scale_noise */
    df_free(lat);
    return s;
}
