/*
 * FLUX.2 reference images, as Flux2Pipeline.prepare_image_latents makes them.
 *
 * The picture goes through the image processor at its own size (the only case written:
 * sides already multiples of 16 and at most 1024 x 1024 pixels, where diffusers neither
 * resizes nor crops), the AutoencoderKLFlux2 encoder, the posterior's mode ("argmax": no
 * random numbers are drawn), the 2x2 patchify and the batch-norm normalisation. The result
 * [1, 128, h, w] becomes h * w tokens in row-major order, each with the id (t, y, x, 0)
 * where t = 10 for the first picture. The denoising loop joins these tokens after the
 * latents on the transformer's input and keeps only the latents' part of its output.
 */
#include "pipelines/flux2_reference.h"

#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/residency.h"
#include "pipelines/pipeline.h"

#define REFERENCE_MAX_AREA (1024 * 1024)
#define REFERENCE_T0       10 /* _prepare_image_ids' scale */

df_status df_flux2_reference_check(const df_image *img, int multiple)
{
    if ((int64_t)img->width * img->height > REFERENCE_MAX_AREA)
        return df_errorf(DF_E_UNSUPPORTED,
                         "reference image %dx%d: pictures over 1024x1024 pixels, which "
                         "Flux2ImageProcessor shrinks, are not supported yet",
                         img->width, img->height);
    if (img->width % multiple || img->height % multiple)
        return df_errorf(DF_E_UNSUPPORTED,
                         "reference image %dx%d: sides that are not multiples of %d, which "
                         "Flux2ImageProcessor crops, are not supported yet",
                         img->width, img->height, multiple);
    return DF_OK;
}

/* The picture's normalised, patchified latents [1, 4C, h, w] into lat. */
static df_status encode(df_pipeline *p, df_vae_encoder *enc, const df_image *img, int multiple,
                        float *lat)
{
    df_ctx *ctx = p->ctx;
    const df_vae_info *info = df_vae_encoder_config(enc);
    int64_t H = img->height, W = img->width, f = info->scale_factor;
    int64_t C2 = 2 * info->latent_channels, hl = H / f, wl = W / f;
    float *pixels = df_malloc((size_t)(3 * H * W) * sizeof *pixels);
    float *moments = df_malloc((size_t)(C2 * hl * wl) * sizeof *moments);
    float *mode = df_malloc((size_t)(C2 / 2 * hl * wl) * sizeof *mode);
    df_status s =
        pixels && moments && mode
            ? df_image_preprocess(img, (int)H, (int)W, multiple, DF_RESAMPLE_LANCZOS, pixels)
            : df_errorf(DF_E_OOM, "out of memory encoding the reference image");
    df_scope mark = df_scope_begin(ctx);
    df_tensor *m = NULL;
    if (s == DF_OK) {
        df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, 3, H, W), pixels);
        s = t ? df_vae_encode(ctx, enc, t, &m) : df_ctx_status(ctx);
    }
    if (s == DF_OK)
        s = df_tensor_read(ctx, m, DF_DTYPE_F32, moments, (size_t)(C2 * hl * wl) * sizeof *moments);
    df_scope_end(ctx, mark, NULL);
    if (s == DF_OK)
        s = df_vae_latent_dist(moments, 1, C2 / 2, hl, wl, NULL, mode);
    if (s == DF_OK)
        s = df_vae_encoder_flux2_normalize(enc, mode, 1, hl, wl, lat);
    df_free(pixels);
    df_free(moments);
    df_free(mode);
    return s;
}

df_status df_flux2_reference_make(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                                  const df_image *img, int multiple, df_flux2_reference *out)
{
    memset(out, 0, sizeof *out);
    DF_TRY(df_flux2_reference_check(img, multiple));
    if (!*enc)
        DF_TRY_CTX(df_vae_encoder_load(p->ctx, vae_dir, enc), "%s", vae_dir);
    const df_vae_info *info = df_vae_encoder_config(*enc);
    int64_t h = img->height / multiple, w = img->width / multiple, C = 4 * info->latent_channels;
    float *lat = df_malloc((size_t)(C * h * w) * sizeof *lat);
    out->tokens = df_malloc((size_t)(C * h * w) * sizeof *out->tokens);
    out->ids = df_malloc((size_t)(4 * h * w) * sizeof *out->ids);
    df_status s = lat && out->tokens && out->ids ? DF_OK
                                                 : df_errorf(DF_E_OOM, "out of memory for "
                                                                       "the reference image");
    df_pipeline_onload(p, df_vae_encoder_weight_set(*enc));
    if (s == DF_OK)
        s = encode(p, *enc, img, multiple, lat);
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_vae_encoder_weight_set(*enc));
    for (int64_t y = 0; s == DF_OK && y < h; y++)
        for (int64_t x = 0; x < w; x++) {
            int64_t tok = y * w + x;
            for (int64_t c = 0; c < C; c++) /* _pack_latents: [C, h*w] -> [h*w, C] */
                out->tokens[tok * C + c] = lat[c * h * w + tok];
            float *id = out->ids + tok * 4;
            id[0] = REFERENCE_T0, id[1] = (float)y, id[2] = (float)x, id[3] = 0;
        }
    df_free(lat);
    if (s != DF_OK) {
        df_flux2_reference_deinit(out);
        return s;
    }
    out->n_tokens = h * w;
    out->channels = C;
    return DF_OK;
}

void df_flux2_reference_deinit(df_flux2_reference *r)
{
    df_free(r->tokens);
    df_free(r->ids);
    memset(r, 0, sizeof *r);
}
