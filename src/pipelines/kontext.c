/*
 * FLUX.1 Kontext, as diffusers 0.42's FluxKontextPipeline runs it.
 *
 * The pipeline is FluxPipeline with two changes, both here: the output size is fitted to an
 * area (max_area) keeping the requested aspect ratio, and the picture to edit is encoded
 * and joined to the latents as extra tokens. The picture is first rounded down to a
 * multiple of twice the VAE's scale factor (the pipeline's image processor's factor), then (with
 * _auto_resize, the default) replaced by the preferred Kontext resolution of the nearest aspect
 * ratio, rounded down to 16, resized with PIL's Lanczos, encoded with the posterior's mode (no
 * random numbers are drawn, so the latent noise is the same as without a picture), shifted and
 * scaled, and packed 2x2 into tokens whose ids are the latents' own with the first coordinate 1.
 * flux.c's loop puts them after the latents on the transformer's input and keeps only the latents'
 * part of the output; the scheduler's mu counts the latents' tokens only.
 *
 * Arithmetic follows Python's: the aspect ratio is a double, sqrt is pow(x, 0.5) and
 * round() rounds halves to even (rint under the default rounding mode).
 */
#include "pipelines/kontext.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/img2img.h"
#include "pipelines/pipeline.h"

/* PREFERRED_KONTEXT_RESOLUTIONS, (width, height) */
static const int preferred[][2] = {
    {672, 1568}, {688, 1504}, {720, 1456},  {752, 1392}, {800, 1328}, {832, 1248},
    {880, 1184}, {944, 1104}, {1024, 1024}, {1104, 944}, {1184, 880}, {1248, 832},
    {1328, 800}, {1392, 752}, {1456, 720},  {1504, 688}, {1568, 672},
};

df_status df_kontext_params(const df_pipeline *p, const df_gen_params *g, int default_size,
                            int multiple, df_gen_params *sized)
{
    *sized = *g;
    if (g->n_images != 0 || g->images)
        return df_errorf(DF_E_ARG, "%s: FluxKontextPipeline edits one picture, not a list of %d",
                         p->dir, g->n_images);
    if (g->strength != 0)
        return df_errorf(DF_E_ARG,
                         "%s: FluxKontextPipeline takes no strength (it always starts "
                         "from noise; the picture joins as extra tokens)",
                         p->dir);
    if (g->max_area < 0 || g->max_area > DF_IMAGE_MAX_PIXELS)
        return df_errorf(DF_E_ARG, "max_area %lld must be in [1, %lld] pixels (0: the default)",
                         (long long)g->max_area, (long long)DF_IMAGE_MAX_PIXELS);
    if (multiple <= 0)
        return DF_OK; /* a rank without the VAE: rank 0 decides the sizes */
    int height = g->height ? g->height : default_size, width = g->width ? g->width : default_size;
    if (height <= 0 || width <= 0)
        return df_errorf(DF_E_ARG, "height %d and width %d must be positive", height, width);
    double area = g->max_area ? (double)g->max_area : (double)default_size * default_size;
    double aspect = (double)width / height;
    int w = (int)rint(pow(area * aspect, 0.5)), h = (int)rint(pow(area / aspect, 0.5));
    w = w / multiple * multiple;
    h = h / multiple * multiple;
    if (w <= 0 || h <= 0)
        return df_errorf(DF_E_ARG,
                         "max_area %.0f at the aspect ratio of %dx%d gives %dx%d: both "
                         "sides must reach %d",
                         area, width, height, w, h, multiple);
    sized->height = h;
    sized->width = w;
    int ih, iw; /* the picture's encoding size, checked before any model runs */
    if (g->image)
        DF_TRY_CTX(df_kontext_image_size(g->image, multiple, !g->keep_image_size, &ih, &iw),
                   "input image");
    return DF_OK;
}

df_status df_kontext_image_size(const df_image *img, int multiple, bool auto_resize, int *height,
                                int *width)
{
    /* the pipeline's image processor has vae_scale_factor = 2 * the VAE's */
    int w = img->width - img->width % multiple, h = img->height - img->height % multiple;
    if (w <= 0 || h <= 0)
        return df_errorf(DF_E_ARG, "%dx%d is too small: both sides must be at least %d pixels",
                         img->width, img->height, multiple);
    if (auto_resize) {
        double aspect = (double)w / h, best = INFINITY;
        for (size_t i = 0; i < sizeof preferred / sizeof preferred[0]; i++) {
            /* min() over (|aspect - w/h|, w, h): the first of the list wins a tie, being
             * the narrowest */
            double d = fabs(aspect - (double)preferred[i][0] / preferred[i][1]);
            if (d < best)
                best = d, w = preferred[i][0], h = preferred[i][1];
        }
    }
    *height = h;
    *width = w;
    return DF_OK;
}

df_status df_kontext_image_make(df_pipeline *p, const char *vae_dir, df_vae_encoder **enc,
                                const df_gen_params *g, int multiple, df_image_tokens *out)
{
    memset(out, 0, sizeof *out);
    if (!*enc)
        DF_TRY_CTX(df_vae_encoder_load_file(p->ctx, vae_dir, p->opts.vae_file, enc), "%s", vae_dir);
    const df_vae_info *info = df_vae_encoder_config(*enc);
    int h, w;
    DF_TRY_CTX(df_kontext_image_size(g->image, multiple, !g->keep_image_size, &h, &w),
               "input image");
    int64_t C = info->latent_channels, hl = h / info->scale_factor, wl = w / info->scale_factor;
    int64_t hp = hl / 2, wp = wl / 2, n = hp * wp;
    float *lat = df_malloc((size_t)(C * hl * wl) * sizeof *lat);
    out->tokens = df_malloc((size_t)(n * 4 * C) * sizeof *out->tokens);
    out->ids = df_malloc((size_t)(n * 3) * sizeof *out->ids);
    df_status s =
        lat && out->tokens && out->ids
            ? DF_OK
            : df_errorf(DF_E_OOM, "out of memory for the picture's %lld tokens", (long long)n);
    df_pipeline_onload(p, df_vae_encoder_weight_set(*enc));
    if (s == DF_OK)
        s = df_img2img_encode_picture(p, *enc, g, h, w, (int)info->scale_factor, NULL, lat);
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_vae_encoder_weight_set(*enc));
    for (int64_t c = 0; s == DF_OK && c < C; c++) /* _pack_latents: channel c*4 + dy*2 + dx */
        for (int64_t y = 0; y < hl; y++)
            for (int64_t x = 0; x < wl; x++)
                out->tokens[((y / 2) * wp + x / 2) * 4 * C + c * 4 + (y % 2) * 2 + x % 2] =
                    lat[(c * hl + y) * wl + x];
    for (int64_t y = 0; s == DF_OK && y < hp; y++)
        for (int64_t x = 0; x < wp; x++) {
            float *id = out->ids + (y * wp + x) * 3;
            id[0] = 1, id[1] = (float)y, id[2] = (float)x; /* image_ids[..., 0] = 1 */
        }
    df_free(lat);
    if (s != DF_OK) {
        df_image_tokens_deinit(out);
        return s;
    }
    out->n_tokens = n;
    out->channels = 4 * C;
    return DF_OK;
}

