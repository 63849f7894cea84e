/*
 * Images: 8-bit RGB pixels, PNG files, and the generation parameters stored in them.
 *
 * A df_image owns height * width * 3 bytes, row by row, R G B per pixel. PNG files carry
 * the generation parameters in a text chunk with the keyword "parameters", in the form
 * the common web UIs write and read:
 *
 *     a golden retriever surfing a wave
 *     Steps: 4, Sampler: Euler, CFG scale: 0, Seed: 42, Size: 512x512, Model: FLUX.1-schnell
 *
 * Files are written to a temporary name in the same folder and renamed, so a failed save
 * never leaves a half-written file and never replaces a good one.
 */
#ifndef DIFFUSE_IMAGE_H
#define DIFFUSE_IMAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_image {
    int width, height;
    int channels;    /* always 3 (RGB) */
    uint8_t *pixels; /* [height][width][channels], owned by the image */
} df_image;

/* A width x height RGB image with all pixels 0; free it with df_image_free(). Fails with
 * DF_E_ARG for a size below 1 or above 2^31 - 1, DF_E_OOM when memory runs out. */
DF_API df_status df_image_create(int width, int height, df_image **out);

/*
 * Writes `img` to `path` as an 8-bit RGB PNG. When `parameters` is not NULL or empty it is
 * stored in a text chunk named "parameters": tEXt when it is all Latin-1 text, iTXt (UTF-8)
 * otherwise. The file is written under a temporary name in the same folder and renamed
 * over `path` only when complete. Fails with DF_E_ARG for a malformed image or
 * parameters that are not valid UTF-8, DF_E_IO (naming the path) when the folder is not
 * writable or the disk fails; `path` is then untouched.
 */
DF_API df_status df_image_save_png(const df_image *img, const char *path, const char *parameters);

/*
 * Encodes `img` as an 8-bit RGB PNG in memory, with the same "parameters" text chunk as
 * df_image_save_png. On success *out (free with df_image_png_free) holds *out_len bytes.
 * Fails with DF_E_ARG for a malformed image or parameters that are not valid UTF-8, DF_E_OOM;
 * *out is then NULL.
 */
DF_API df_status df_image_encode_png(const df_image *img, const char *parameters, void **out,
                                     size_t *out_len);

/* Frees a buffer from df_image_encode_png. NULL is fine. */
DF_API void df_image_png_free(void *png);

/*
 * Reads a PNG of any colour type and bit depth as 8-bit RGB (grey is replicated, palettes
 * expanded, 16-bit samples keep their high byte, alpha is dropped). When parameters_out
 * is not NULL it receives the "parameters" text as UTF-8 (free with df_image_text_free),
 * or NULL when the file has none. Fails with DF_E_IO when the file cannot be read,
 * DF_E_FORMAT when it is not a valid PNG.
 */
DF_API df_status df_image_load_png(const char *path, df_image **out, char **parameters_out);

DF_API void df_image_free(df_image *img); /* NULL is fine */

/* ---- input images ---- */

/* The most pixels an input image may have (8192 x 8192). */
#define DF_IMAGE_MAX_PIXELS ((int64_t)1 << 26)

/*
 * Decodes a PNG or JPEG held in memory (the kind is told by its first bytes) to 8-bit RGB,
 * as PIL's Image.convert("RGB") gives it: grey replicated, palettes expanded, alpha
 * dropped. `name` (a file name, "image" when NULL) starts every message. Fails with
 * DF_E_FORMAT for data that is neither, or is truncated or corrupt, or a 0x0 image;
 * DF_E_UNSUPPORTED for 16-bit PNG and CMYK / YCCK JPEG; DF_E_ARG for more than
 * DF_IMAGE_MAX_PIXELS pixels (judged from the header); DF_E_OOM. *out is owned by the
 * caller (df_image_free).
 */
DF_API df_status df_image_decode(const void *data, size_t len, const char *name, df_image **out);

/* df_image_decode on the file at `path` (DF_E_IO when it cannot be read). */
DF_API df_status df_image_load(const char *path, df_image **out);

/* PIL's resampling filters (Image.Resampling). */
typedef enum df_resample {
    DF_RESAMPLE_LANCZOS, /* VaeImageProcessor's default */
    DF_RESAMPLE_BICUBIC,
    DF_RESAMPLE_BILINEAR,
    DF_RESAMPLE_NEAREST,
} df_resample;

/*
 * PIL's Image.resize((width, height), filter) on an RGB image: a separable convolution,
 * horizontal pass first, each pass rounded to 8 bits, with PIL's coefficients and its
 * fixed-point arithmetic, so the bytes are PIL's own (docs/pipelines.md gives the bound
 * tested). A resize to the same size copies. *out is owned by the caller. DF_E_ARG for a
 * size below 1 or over DF_IMAGE_MAX_PIXELS, DF_E_OOM.
 */
DF_API df_status df_image_resize(const df_image *img, int width, int height, df_resample filter,
                                 df_image **out);

/* The same with Image.resize's box (x0, y0, x1, y1): the part of img that is resized, in
 * pixels, inside the image; an empty span along an axis repeats the edge as PIL filters it.
 * DF_E_UNSUPPORTED for a box with DF_RESAMPLE_NEAREST. */
DF_API df_status df_image_resize_box(const df_image *img, int width, int height, df_resample filter,
                                     const double box[4], df_image **out);

/*
 * VaeImageProcessor.preprocess for one picture. The size is height x width (0: the
 * picture's own) rounded down to a multiple of `multiple` (the processor's
 * vae_scale_factor); _size gives it. df_image_preprocess writes [3, h, w] floats to out:
 * the picture resized with `filter` when its size differs (diffusers' default is
 * DF_RESAMPLE_LANCZOS), then 2 * (x / 255) - 1 in float32. DF_E_ARG for a size that rounds
 * to 0 or bad arguments, DF_E_OOM.
 */
DF_API df_status df_image_preprocess_size(const df_image *img, int height, int width, int multiple,
                                          int *out_height, int *out_width);
DF_API df_status df_image_preprocess(const df_image *img, int height, int width, int multiple,
                                     df_resample filter, float *out);

/*
 * The inpainting pipelines' mask processor (VaeImageProcessor with do_normalize=False,
 * do_binarize=True, do_convert_grayscale=True) for one mask picture: the size as
 * df_image_preprocess_size gives it, the picture resized with `filter` when its size
 * differs, grey as PIL's convert("L"), x / 255, then 0 below 0.5 and 1 from 0.5 on: [h, w]
 * floats into out (1 where the model paints, 0 where the picture stays). DF_E_ARG for a
 * size that rounds to 0 or bad arguments, DF_E_OOM.
 */
DF_API df_status df_image_mask_preprocess(const df_image *mask, int height, int width,
                                          int multiple, df_resample filter, float *out);

/*
 * padding_mask_crop, as VaeImageProcessor does it. df_image_mask_crop_region is
 * get_crop_region(mask, width, height, pad): the box (x0, y0, x1, y1) around the mask's
 * non-black pixels, grown by pad and then to the aspect ratio of width x height, inside the
 * mask (DF_E_ARG for an all-black mask). df_image_crop_fill is preprocess's crop then
 * resize_mode "fill": img's box fitted into width x height (Lanczos), centred, the bands
 * left over filled with its edges stretched. df_image_apply_overlay is apply_overlay:
 * `image` (the result; with a box, fitted to cover the box and pasted there over black)
 * under `init` wherever the mask is not white, weighted by the mask's grey as PIL's
 * alpha_composite does; mask and init are the same size, and so is the output. *out is
 * owned by the caller.
 */
DF_API df_status df_image_mask_crop_region(const df_image *mask, int width, int height, int pad,
                                           int box[4]);
DF_API df_status df_image_crop_fill(const df_image *img, const int box[4], int width, int height,
                                    df_image **out);
DF_API df_status df_image_apply_overlay(const df_image *mask, const df_image *init,
                                        const df_image *image, const int *box, df_image **out);

/* Frees a string returned by the functions of this header. NULL is fine. */
DF_API void df_image_text_free(char *text);

/* ---- generation parameters ---- */

/* The fields of the parameters text. Strings are UTF-8; NULL (or 0) fields are left out
 * when formatting, except sampler, which defaults to "Euler". */
typedef struct df_image_params {
    const char *prompt;
    const char *negative_prompt; /* "Negative prompt: ..." line; NULL = none */
    int steps;
    const char *sampler;
    double cfg_scale;
    uint64_t seed;
    int width, height;
    const char *model;
    /* Image to image: "Denoising strength: X" (0: left out), "Init image: NAME" and
     * "Init image hash: HEX", the file's SHA-256 (NULL: left out). */
    double denoising_strength;
    const char *init_image;
    const char *init_image_hash;
    /* Inpainting: "Mask image: NAME", "Mask image hash: HEX" (NULL: left out) and
     * "Masked area padding: N", the padding_mask_crop (0: left out). */
    const char *mask_image;
    const char *mask_image_hash;
    int mask_padding;
} df_image_params;

/*
 * Formats `p` in the web-UI form: the prompt, an optional "Negative prompt:" line, then
 * "Steps: N, Sampler: S, CFG scale: G, Seed: N, Size: WxH, Model: M". Values that hold a
 * comma, colon or newline are quoted as JSON strings, as the web UIs do. *out is owned by
 * the caller (df_image_text_free). Fails only with DF_E_OOM.
 */
DF_API df_status df_image_format_parameters(const df_image_params *p, char **out);

/*
 * Parses text in that form into *out, whose strings it allocates; release them with
 * df_image_params_deinit(). Keys it does not know are skipped; missing ones stay 0/NULL.
 * Text without a parameters line is all prompt. Fails only with DF_E_OOM.
 */
DF_API df_status df_image_parse_parameters(const char *text, df_image_params *out);

/*
 * The SHA-256 of the file at `path` as 64 lowercase hex digits (what `sha256sum` prints),
 * for the "Init image hash" of an image-to-image run. DF_E_IO when the file cannot be read.
 */
DF_API df_status df_file_sha256(const char *path, char out[65]);

/* Frees the strings df_image_parse_parameters() allocated and zeroes *p. */
DF_API void df_image_params_deinit(df_image_params *p);

#ifdef __cplusplus
}
#endif
#endif
