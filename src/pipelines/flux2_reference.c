/*
 * FLUX.2 reference images, as Flux2Pipeline.prepare_image_latents makes them.
 *
 * The picture goes through Flux2ImageProcessor's rules: one over 1024 x 1024 pixels is
 * shrunk to that area keeping its aspect ratio (_resize_to_target_area: scale = sqrt(2^20 /
 * (w * h)), sides int(side * scale), PIL's Lanczos), its sides are rounded down to 16 and the
 * excess is cropped at the centre (Flux2ImageProcessor._resize_and_crop, which only crops:
 * left = (w - w16) / 2, top = (h - h16) / 2, integer division). Then the AutoencoderKLFlux2
 * encoder, the posterior's mode ("argmax": no
 * random numbers are drawn), the 2x2 patchify and the batch-norm normalisation. The result
 * [1, 128, h, w] becomes h * w tokens in row-major order, each with the id (t, y, x, 0)
 * where t = 10 + 10 i for picture i; the pictures' tokens follow each other. The denoising loop
 * joins these tokens after the latents on the transformer's input and keeps only the latents' part
 * of its output.
 */
#include "pipelines/flux2_reference.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/pipeline.h"

#define REFERENCE_MAX_AREA (1024 * 1024)
#define REFERENCE_T0       10 /* _prepare_image_ids' scale */

df_status df_flux2_reference_check(const df_image *img)
{
    /* Flux2ImageProcessor.check_image_input's rules (diffusers' ValueError) */
    if (img->width < 64 || img->height < 64)
        return df_errorf(DF_E_ARG,
                         "%dx%d is too small: both sides must be at "
                         "least 64 pixels",
                         img->width, img->height);
    if ((double)img->width / img->height > 8 || (double)img->height / img->width > 8)
        return df_errorf(DF_E_ARG, "%dx%d: the aspect ratio is over 8:1", img->width, img->height);
    return DF_OK;
}

/* The size _resize_to_target_area gives (the picture's own at most 1024 x 1024 pixels). */
static void shrunk_size(const df_image *img, int *width, int *height)
{
    *width = img->width, *height = img->height;
    if ((int64_t)img->width * img->height <= REFERENCE_MAX_AREA)
        return;
    /* Python: math.sqrt(target_area / (w * h)), then int(w * scale) */
    double scale = sqrt((double)REFERENCE_MAX_AREA / ((double)img->width * img->height));
    *width = (int)(img->width * scale);
    *height = (int)(img->height * scale);
}

void df_flux2_reference_size(const df_image *img, int multiple, int *height, int *width)
{
    shrunk_size(img, width, height);
    *width = *width / multiple * multiple;
    *height = *height / multiple * multiple;
}

/* The picture as the encoder takes it: shrunk, then cropped at the centre to multiples. */
static df_status prepare(const df_image *img, int multiple, df_image **out)
{
    int sw, sh, w, h;
    shrunk_size(img, &sw, &sh);
    df_flux2_reference_size(img, multiple, &h, &w);
    df_image *shrunk = NULL;
    if (sw != img->width || sh != img->height)
        DF_TRY(df_image_resize(img, sw, sh, DF_RESAMPLE_LANCZOS, &shrunk));
    const df_image *src = shrunk ? shrunk : img;
    df_status s = df_image_create(w, h, out);
    int left = (sw - w) / 2, top = (sh - h) / 2;
    for (int y = 0; s == DF_OK && y < h; y++)
        memcpy((*out)->pixels + (size_t)y * w * 3,
               src->pixels + ((size_t)(top + y) * sw + left) * 3, (size_t)w * 3);
    df_image_free(shrunk);
    return s;
}

/* The prepared picture's normalised, patchified latents [1, 4C, h, w] into lat. */
static df_status encode(df_pipeline *p, df_vae_encoder *enc, const df_image *img, int multiple,
                        bool tiled, float *lat)
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
        s = !t      ? df_ctx_status(ctx)
            : tiled ? df_vae_encode_tiled(ctx, enc, t, 0, &m) /* enable_tiling() */
                    : df_vae_encode(ctx, enc, t, &m);
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
                                  const df_image *const *imgs, int n, int multiple, bool tiled,
                                  df_image_tokens *out)
{
    memset(out, 0, sizeof *out);
    int64_t total = 0;
    for (int i = 0; i < n; i++) {
        DF_TRY_CTX(df_flux2_reference_check(imgs[i]), "reference image %d", i);
        int h, w;
        df_flux2_reference_size(imgs[i], multiple, &h, &w);
        total += (int64_t)(h / multiple) * (w / multiple);
    }
    if (!*enc)
        DF_TRY_CTX(df_vae_encoder_load_file(p->ctx, vae_dir, p->opts.vae_file, enc), "%s", vae_dir);
    int64_t C = 4 * df_vae_encoder_config(*enc)->latent_channels;
    out->tokens = df_malloc((size_t)(C * total) * sizeof *out->tokens);
    out->ids = df_malloc((size_t)(4 * total) * sizeof *out->ids);
    df_status s = out->tokens && out->ids ? DF_OK
                                          : df_errorf(DF_E_OOM, "out of memory for the "
                                                                "reference images");
    df_pipeline_onload(p, df_vae_encoder_weight_set(*enc));
    int64_t at = 0; /* tokens written so far */
    for (int i = 0; s == DF_OK && i < n; i++) {
        df_image *ready = NULL;
        s = prepare(imgs[i], multiple, &ready);
        int64_t h = ready ? ready->height / multiple : 0, w = ready ? ready->width / multiple : 0;
        float *lat = df_malloc((size_t)(C * h * w) * sizeof *lat);
        if (s == DF_OK)
            s = lat ? encode(p, *enc, ready, multiple, tiled, lat)
                    : df_errorf(DF_E_OOM, "out of memory for reference image %d", i);
        df_image_free(ready);
        for (int64_t y = 0; s == DF_OK && y < h; y++)
            for (int64_t x = 0; x < w; x++) {
                int64_t tok = y * w + x;
                for (int64_t c = 0; c < C; c++) /* _pack_latents: [C, h*w] -> [h*w, C] */
                    out->tokens[(at + tok) * C + c] = lat[c * h * w + tok];
                float *id = out->ids + (at + tok) * 4;
                id[0] = (float)(REFERENCE_T0 + REFERENCE_T0 * i); /* _prepare_image_ids */
                id[1] = (float)y, id[2] = (float)x, id[3] = 0;
            }
        at += h * w;
        df_free(lat);
    }
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_vae_encoder_weight_set(*enc));
    if (s != DF_OK) {
        df_image_tokens_deinit(out);
        return s;
    }
    out->n_tokens = total;
    out->channels = C;
    return DF_OK;
}

