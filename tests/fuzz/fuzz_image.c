/*
 * Fuzz target: input images (PNG and JPEG) as df_image_decode reads them.
 *
 * Whatever the bytes, decoding either fails with a status and a NULL image or gives an
 * image of 1 to DF_IMAGE_MAX_PIXELS pixels; a decoded image is then resized down and up
 * (the windows of PIL's Lanczos filter at the image's own size), which must not read
 * outside it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <diffuse/image.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_image *img = (df_image *)1;
    df_status st = df_image_decode(data, size, "fuzz", &img);
    if (st != DF_OK) {
        if (img)
            abort();
        return 0;
    }
    if (!img || img->width < 1 || img->height < 1 ||
        (int64_t)img->width * img->height > DF_IMAGE_MAX_PIXELS)
        abort();
    if ((int64_t)img->width * img->height <= 4096) {
        df_image *r = NULL;
        int w = img->width / 2 + 1, h = img->height * 2;
        if (df_image_resize(img, w, h, DF_RESAMPLE_LANCZOS, &r) == DF_OK)
            df_image_free(r);
    }
    df_image_free(img);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
