/*
 * diffusers' mask processor for one decoded mask picture: VaeImageProcessor with
 * do_normalize=False, do_binarize=True, do_convert_grayscale=True, as the inpainting
 * pipelines make it.
 *
 * diffusers resizes the PIL picture first (Lanczos by default) and converts it to grey
 * after. Our pictures are RGB: the RGB resize treats each channel as PIL treats one, and
 * PIL's convert("L") of (v, v, v) is v, so a grey mask comes out as PIL's "L" resize gives
 * it, and an RGB mask as PIL's RGB resize then convert("L") does. Grey is PIL's fixed-point
 * (R * 19595 + G * 38470 + B * 7471 + 2^15) >> 16; then x / 255 in float32 and the
 * threshold at 0.5 (which puts 128 and above at 1).
 */
#include <diffuse/image.h>

#include "core/status.h"

df_status df_image_mask_preprocess(const df_image *mask, int height, int width, int multiple,
                                   df_resample filter, float *out)
{
    int h, w;
    DF_TRY(df_image_preprocess_size(mask, height, width, multiple, &h, &w));
    if (!out)
        return df_errorf(DF_E_ARG, "mask preprocess: NULL output");
    df_image *sized = NULL;
    const df_image *src = mask;
    if (h != mask->height || w != mask->width) {
        DF_TRY(df_image_resize(mask, w, h, filter, &sized));
        src = sized;
    }
    size_t plane = (size_t)h * (size_t)w;
    for (size_t i = 0; i < plane; i++) {
        const uint8_t *rgb = src->pixels + i * 3;
        uint32_t grey = ((uint32_t)rgb[0] * 19595 + (uint32_t)rgb[1] * 38470 +
                         (uint32_t)rgb[2] * 7471 + 0x8000) >>
                        16;
        float x = (float)grey / 255.0f;
        out[i] = x < 0.5f ? 0.0f : 1.0f;
    }
    df_image_free(sized);
    return DF_OK;
}
