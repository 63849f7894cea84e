/*
 * diffusers' VaeImageProcessor.preprocess for one decoded picture.
 *
 * The size is the one asked for (or the picture's own) rounded down to the processor's
 * vae_scale_factor; the picture is resized with PIL's filter (df_image_resize, Lanczos by
 * default) only when its size differs; the bytes become float32 x / 255 and then 2x - 1,
 * both in float32 as numpy and torch compute them. The result is channel-first
 * [3, height, width], the layout the VAE encoder reads.
 *
 * diffusers resizes the PIL image before converting it to RGB: for opaque RGB and grey
 * pictures that is the same as resizing the RGB bytes; PIL resizes palette pictures with
 * NEAREST whatever the filter and RGBA ones with premultiplied alpha, which we do not
 * reproduce (docs/pipelines.md).
 */
#include <diffuse/image.h>

#include "core/alloc.h"
#include "core/status.h"

df_status df_image_preprocess_size(const df_image *img, int height, int width, int multiple,
                                   int *out_height, int *out_width)
{
    *out_height = *out_width = 0;
    if (!img || multiple < 1 || height < 0 || width < 0)
        return df_errorf(DF_E_ARG, "image preprocess: NULL image, a negative size or a "
                                   "multiple below 1");
    int h = height ? height : img->height, w = width ? width : img->width;
    h -= h % multiple;
    w -= w % multiple;
    if (h < 1 || w < 1)
        return df_errorf(DF_E_ARG,
                         "image preprocess: %dx%d rounded down to a multiple of %d is empty",
                         width ? width : img->width, height ? height : img->height, multiple);
    *out_height = h;
    *out_width = w;
    return DF_OK;
}

df_status df_image_preprocess(const df_image *img, int height, int width, int multiple,
                              df_resample filter, float *out)
{
    int h, w;
    DF_TRY(df_image_preprocess_size(img, height, width, multiple, &h, &w));
    if (!out)
        return df_errorf(DF_E_ARG, "image preprocess: NULL output");
    df_image *sized = NULL;
    const df_image *src = img;
    if (h != img->height || w != img->width) {
        DF_TRY(df_image_resize(img, w, h, filter, &sized));
        src = sized;
    }
    size_t plane = (size_t)h * (size_t)w;
    for (size_t i = 0; i < plane; i++)
        for (int c = 0; c < 3; c++) {
            float x = (float)src->pixels[i * 3 + c] / 255.0f;
            out[(size_t)c * plane + i] = 2.0f * x - 1.0f;
        }
    df_image_free(sized);
    return DF_OK;
}
