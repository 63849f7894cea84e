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

#include <stdbool.h>
#include <string.h>

#include "core/status.h"

/* ITU-R 601 luma as PIL's convert("L") rounds it. */
static uint8_t grey_of(const uint8_t *rgb)
{
    return (uint8_t)(((uint32_t)rgb[0] * 19595 + (uint32_t)rgb[1] * 38470 +
                      (uint32_t)rgb[2] * 7471 + 0x8000) >>
                     16);
}

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
        float x = (float)grey_of(src->pixels + i * 3) / 255.0f;
        out[i] = x < 0.5f ? 0.0f : 1.0f;
    }
    df_image_free(sized);
    return DF_OK;
}

/* --- padding_mask_crop ------------------------------------------------------------------- */

static bool column_empty(const df_image *m, int x)
{
    for (int y = 0; y < m->height; y++)
        if (grey_of(m->pixels + ((size_t)y * m->width + x) * 3))
            return false;
    return true;
}

static bool row_empty(const df_image *m, int y)
{
    for (int x = 0; x < m->width; x++)
        if (grey_of(m->pixels + ((size_t)y * m->width + x) * 3))
            return false;
    return true;
}

/* Grows [*a, *b) to `want` more pixels, centred, kept inside [0, size) as diffusers does. */
static void grow_span(int *a, int *b, int want, int size)
{
    *a -= want / 2;
    *b += want - want / 2;
    if (*b >= size) {
        int diff = *b - size;
        *b -= diff;
        *a -= diff;
    }
    if (*a < 0) {
        *b -= *a;
        *a = 0;
    }
    if (*b >= size)
        *b = size;
}

df_status df_image_mask_crop_region(const df_image *mask, int width, int height, int pad,
                                    int box[4])
{
    if (!mask || !mask->pixels || width < 1 || height < 1 || pad < 0)
        return df_errorf(DF_E_ARG, "mask crop region: NULL mask, a size below 1 or a "
                                   "negative padding");
    int w = mask->width, h = mask->height, left = 0, right = 0, top = 0, bottom = 0;
    while (left < w && column_empty(mask, left))
        left++;
    while (right < w && column_empty(mask, w - 1 - right))
        right++;
    while (top < h && row_empty(mask, top))
        top++;
    while (bottom < h && row_empty(mask, h - 1 - bottom))
        bottom++;
    if (left == w)
        return df_errorf(DF_E_ARG, "padding_mask_crop: the mask is all black, so there is "
                                   "nothing to crop around");
    int x1 = left - pad > 0 ? left - pad : 0, y1 = top - pad > 0 ? top - pad : 0;
    int x2 = w - right + pad < w ? w - right + pad : w;
    int y2 = h - bottom + pad < h ? h - bottom + pad : h;
    /* the region grown to the output's aspect ratio, in Python's doubles */
    double ratio_crop = (double)(x2 - x1) / (y2 - y1), ratio = (double)width / height;
    if (ratio_crop > ratio) {
        double desired = (x2 - x1) / ratio;
        grow_span(&y1, &y2, (int)(desired - (y2 - y1)), h);
    } else {
        double desired = (y2 - y1) * ratio;
        grow_span(&x1, &x2, (int)(desired - (x2 - x1)), w);
    }
    box[0] = x1, box[1] = y1, box[2] = x2, box[3] = y2;
    return DF_OK;
}

/* dst <- src at (x0, y0), clipped. */
static void paste(df_image *dst, const df_image *src, int x0, int y0)
{
    for (int y = 0; y < src->height; y++) {
        int yy = y0 + y;
        if (yy < 0 || yy >= dst->height)
            continue;
        for (int x = 0; x < src->width; x++) {
            int xx = x0 + x;
            if (xx >= 0 && xx < dst->width)
                memcpy(dst->pixels + ((size_t)yy * dst->width + xx) * 3,
                       src->pixels + ((size_t)y * src->width + x) * 3, 3);
        }
    }
}

/* img's part box[0..4) as a new image. */
static df_status crop(const df_image *img, const int box[4], df_image **out)
{
    if (box[0] < 0 || box[1] < 0 || box[2] > img->width || box[3] > img->height ||
        box[2] <= box[0] || box[3] <= box[1])
        return df_errorf(DF_E_ARG, "crop: box (%d, %d, %d, %d) is not inside the %dx%d image",
                         box[0], box[1], box[2], box[3], img->width, img->height);
    DF_TRY(df_image_create(box[2] - box[0], box[3] - box[1], out));
    paste(*out, img, -box[0], -box[1]);
    return DF_OK;
}

/* Resizes `src` over its box and pastes the result into dst at (x, y); with PIL's default
 * filter (bicubic), as diffusers calls Image.resize for the bands. */
static df_status paste_resized(df_image *dst, const df_image *src, int w, int h, double b0,
                               double b1, double b2, double b3, int x, int y)
{
    df_image *part;
    DF_TRY(df_image_resize_box(src, w, h, DF_RESAMPLE_BICUBIC, (double[4]){b0, b1, b2, b3}, &part));
    paste(dst, part, x, y);
    df_image_free(part);
    return DF_OK;
}

/* VaeImageProcessor._resize_and_fill: the picture fitted inside width x height keeping its
 * aspect ratio, centred, and the bands left over filled with its edges stretched. */
static df_status resize_fill(const df_image *img, int width, int height, df_image *res)
{
    double ratio = (double)width / height, src_ratio = (double)img->width / img->height;
    int src_w = ratio < src_ratio ? width : (int)((int64_t)img->width * height / img->height);
    int src_h = ratio >= src_ratio ? height : (int)((int64_t)img->height * width / img->width);
    if (src_w < 1 || src_h < 1)
        return df_errorf(DF_E_ARG,
                         "padding_mask_crop: the %dx%d crop cannot be fitted into "
                         "%dx%d",
                         img->width, img->height, width, height);
    df_image *r;
    DF_TRY(df_image_resize(img, src_w, src_h, DF_RESAMPLE_LANCZOS, &r));
    paste(res, r, width / 2 - src_w / 2, height / 2 - src_h / 2);
    df_status s = DF_OK;
    if (ratio < src_ratio) {
        int fill = height / 2 - src_h / 2;
        if (fill > 0)
            s = paste_resized(res, r, width, fill, 0, 0, width, 0, 0, 0);
        if (fill > 0 && s == DF_OK)
            s = paste_resized(res, r, width, fill, 0, r->height, width, r->height, 0, fill + src_h);
    } else if (ratio > src_ratio) {
        int fill = width / 2 - src_w / 2;
        if (fill > 0)
            s = paste_resized(res, r, fill, height, 0, 0, 0, height, 0, 0);
        if (fill > 0 && s == DF_OK)
            s = paste_resized(res, r, fill, height, r->width, 0, r->width, height, fill + src_w, 0);
    }
    df_image_free(r);
    return s;
}

df_status df_image_crop_fill(const df_image *img, const int box[4], int width, int height,
                             df_image **out)
{
    *out = NULL;
    if (!img || !img->pixels || width < 1 || height < 1)
        return df_errorf(DF_E_ARG, "crop and fill: NULL image or a size below 1");
    df_image *part = NULL, *res = NULL;
    DF_TRY(crop(img, box, &part));
    df_status s = df_image_create(width, height, &res);
    if (s == DF_OK)
        s = resize_fill(part, width, height, res);
    df_image_free(part);
    if (s != DF_OK) {
        df_image_free(res);
        return s;
    }
    *out = res;
    return DF_OK;
}

/* PIL's rounded division by 255. */
static uint32_t div255(uint32_t v)
{
    v += 128;
    return (v + (v >> 8)) >> 8;
}

/* VaeImageProcessor._resize_and_crop: fitted to cover width x height, centred, cropped. */
static df_status resize_crop(const df_image *img, int width, int height, df_image **out)
{
    double ratio = (double)width / height, src_ratio = (double)img->width / img->height;
    int src_w = ratio > src_ratio ? width : (int)((int64_t)img->width * height / img->height);
    int src_h = ratio <= src_ratio ? height : (int)((int64_t)img->height * width / img->width);
    df_image *r;
    DF_TRY(df_image_resize(img, src_w, src_h, DF_RESAMPLE_LANCZOS, &r));
    df_status s = df_image_create(width, height, out);
    if (s == DF_OK)
        paste(*out, r, width / 2 - src_w / 2, height / 2 - src_h / 2);
    df_image_free(r);
    return s;
}

df_status df_image_apply_overlay(const df_image *mask, const df_image *init, const df_image *image,
                                 const int *box, df_image **out)
{
    *out = NULL;
    if (!mask || !init || !image)
        return df_errorf(DF_E_ARG, "overlay: NULL mask or image");
    int W = init->width, H = init->height;
    if (mask->width != W || mask->height != H)
        return df_errorf(DF_E_ARG, "overlay: the mask is %dx%d but the picture %dx%d", mask->width,
                         mask->height, W, H);
    if (!box && (image->width != W || image->height != H))
        return df_errorf(DF_E_ARG, "overlay: the result is %dx%d but the picture %dx%d",
                         image->width, image->height, W, H);
    df_image *base = NULL, *fitted = NULL;
    DF_TRY(df_image_create(W, H, &base));
    df_status s = DF_OK;
    if (box) { /* the result fitted back into the crop box, black elsewhere */
        s = resize_crop(image, box[2] - box[0], box[3] - box[1], &fitted);
        if (s == DF_OK)
            paste(base, fitted, box[0], box[1]);
        df_image_free(fitted);
    } else {
        memcpy(base->pixels, image->pixels, (size_t)W * H * 3);
    }
    for (size_t i = 0; s == DF_OK && i < (size_t)W * H; i++) {
        /* the picture premultiplied by the inverted mask (RGBa), back to RGBA, composited
         * over the result: PIL's fixed-point alpha_composite with 7 extra bits */
        uint32_t a = 255u - grey_of(mask->pixels + i * 3);
        if (a == 0)
            continue;
        uint32_t coef1 = a * 128, coef2 = 255 * 128 - coef1;
        for (int c = 0; c < 3; c++) {
            uint32_t pre = div255(init->pixels[i * 3 + c] * a);
            uint32_t src = a == 255 ? pre : (255 * pre / a > 255 ? 255 : 255 * pre / a);
            uint32_t t = src * coef1 + base->pixels[i * 3 + c] * coef2 + (0x80u << 7);
            base->pixels[i * 3 + c] = (uint8_t)((((t >> 8) + t) >> 8) >> 7);
        }
    }
    if (s != DF_OK) {
        df_image_free(base);
        return s;
    }
    *out = base;
    return DF_OK;
}
