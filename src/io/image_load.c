/*
 * Input images: PNG (libspng) and JPEG (libjpeg-turbo) decoded to 8-bit RGB.
 *
 * This is the strict reader for pictures a pipeline takes as input (img2img, reference
 * images). The kind is told by the first bytes, never by the file name. Accepted: PNG of
 * 8 bits or fewer per sample in grey, grey + alpha, RGB, RGBA or palette form, and
 * baseline or progressive JPEG in grey or YCbCr. Grey is replicated and alpha dropped, as
 * PIL's Image.convert("RGB") does. Refused, each with a message naming the input and the
 * rule: anything else (DF_E_FORMAT), a truncated or corrupt file (DF_E_FORMAT), 16-bit PNG
 * and CMYK / YCCK JPEG (DF_E_UNSUPPORTED: converting them would guess at a colour model
 * diffusers leaves to PIL), and an image of more than DF_IMAGE_MAX_PIXELS pixels
 * (DF_E_ARG), refused from the header before any pixel memory is taken.
 *
 * df_image_load_png (png.c) stays the lenient reader for our own outputs (`diffuse info`).
 * libjpeg-turbo's warnings (a stream that ends early, which it pads with grey) are treated
 * as errors here: a truncated JPEG must not become a half-grey picture silently.
 */
#include <diffuse/image.h>

#include <limits.h>
#include <stdbool.h>
#include <string.h>

#include <spng.h>
#include <turbojpeg.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "io/spng_alloc.h"

/* The largest input file read whole: a PNG of DF_IMAGE_MAX_PIXELS stored uncompressed
 * with alpha is about 256 MiB. */
#define MAX_FILE_BYTES ((size_t)512 << 20)

static const uint8_t png_magic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static df_status check_size(const char *name, uint32_t width, uint32_t height)
{
    if (width == 0 || height == 0)
        return df_errorf(DF_E_FORMAT, "%s: the image is %ux%u (expected at least 1x1)", name, width,
                         height);
    if ((uint64_t)width * height > DF_IMAGE_MAX_PIXELS || width > INT_MAX || height > INT_MAX)
        return df_errorf(DF_E_ARG,
                         "%s: the image is %ux%u, more than the input limit of %lld pixels", name,
                         width, height, (long long)DF_IMAGE_MAX_PIXELS);
    return DF_OK;
}

/* ---- PNG ---------------------------------------------------------------------------------- */

static df_status png_error(int err, const char *name, const char *what)
{
    if (df_spng_out_of_memory(err))
        return df_errorf(DF_E_OOM, "%s: out of memory %s", name, what);
    return df_errorf(DF_E_FORMAT, "%s: %s: %s (a truncated or corrupt PNG)", name, what,
                     spng_strerror(err));
}

static df_status png_decode(spng_ctx *ctx, const void *data, size_t len, const char *name,
                            df_image **out)
{
    struct spng_ihdr ihdr;
    int err = spng_set_png_buffer(ctx, data, len);
    if (!err)
        err = spng_get_ihdr(ctx, &ihdr);
    if (err)
        return png_error(err, name, "reading the PNG header");
    if (ihdr.bit_depth > 8)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: %u-bit PNG samples are not supported (input images must have "
                         "8 bits or fewer per sample)",
                         name, ihdr.bit_depth);
    DF_TRY(check_size(name, ihdr.width, ihdr.height));
    size_t bytes;
    err = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &bytes);
    if (err)
        return png_error(err, name, "sizing the image");
    df_image *img;
    DF_TRY(df_image_create((int)ihdr.width, (int)ihdr.height, &img));
    if (bytes != (size_t)img->width * (size_t)img->height * 3) {
        df_image_free(img);
        return df_errorf(DF_E_INTERNAL, "%s: decoded size %zu disagrees with %ux%u RGB", name,
                         bytes, ihdr.width, ihdr.height);
    }
    err = spng_decode_image(ctx, img->pixels, bytes, SPNG_FMT_RGB8, 0);
    if (!err) /* the chunks after the image, to IEND: a file cut short there is refused too */
        err = spng_decode_chunks(ctx);
    if (err) {
        df_image_free(img);
        return png_error(err, name, "decoding the image");
    }
    *out = img;
    return DF_OK;
}

static df_status decode_png(const void *data, size_t len, const char *name, df_image **out)
{
    spng_ctx *ctx = df_spng_ctx_new(0);
    if (!ctx)
        return df_errorf(DF_E_OOM, "%s: out of memory", name);
    spng_set_chunk_limits(ctx, (size_t)64 << 20, (size_t)64 << 20);
    /* a wrong CRC is corruption, not something to read past */
    spng_set_crc_action(ctx, SPNG_CRC_ERROR, SPNG_CRC_ERROR);
    df_status st = png_decode(ctx, data, len, name, out);
    spng_ctx_free(ctx);
    return st;
}

/* ---- JPEG --------------------------------------------------------------------------------- */

/* Walks the marker segments from SOI to the frame header (SOFn) and checks that it lies
 * whole inside the data: libjpeg-turbo's header reader fills a stream that ends early with
 * a fake end marker and can then report a size the file never held. */
static df_status jpeg_find_frame(const uint8_t *b, size_t len, const char *name)
{
    size_t i = 2;
    while (i + 4 <= len) {
        if (b[i] != 0xff)
            break;
        uint8_t m = b[i + 1];
        if (m == 0xff) { /* fill byte */
            i++;
            continue;
        }
        size_t seg = (size_t)b[i + 2] << 8 | b[i + 3];
        if (seg < 2 || i + 2 + seg > len)
            break;
        bool sof = m >= 0xc0 && m <= 0xcf && m != 0xc4 && m != 0xc8 && m != 0xcc;
        if (sof)
            return seg >= 8 ? DF_OK
                            : df_errorf(DF_E_FORMAT,
                                        "%s: the JPEG frame header is "
                                        "%zu bytes (a corrupt JPEG)",
                                        name, seg);
        if (m == 0xd9 || m == 0xda) /* end of image, or scan data before any frame */
            break;
        i += 2 + seg;
    }
    return df_errorf(DF_E_FORMAT,
                     "%s: no complete JPEG frame header in the %zu bytes (a truncated or "
                     "corrupt JPEG)",
                     name, len);
}

static df_status jpeg_decode(tjhandle tj, const uint8_t *data, size_t len, const char *name,
                             df_image **out)
{
    int width, height, subsamp, colorspace;
    DF_TRY(jpeg_find_frame(data, len, name));
    if (len > ULONG_MAX || tjDecompressHeader3(tj, data, (unsigned long)len, &width, &height,
                                               &subsamp, &colorspace) != 0)
        return df_errorf(DF_E_FORMAT,
                         "%s: reading the JPEG header: %s (a truncated or "
                         "corrupt JPEG)",
                         name, tjGetErrorStr2(tj));
    if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: CMYK JPEG is not supported (input images must be RGB or grey)", name);
    if (width < 0 || height < 0)
        return df_errorf(DF_E_FORMAT, "%s: the JPEG header gives %dx%d", name, width, height);
    DF_TRY(check_size(name, (uint32_t)width, (uint32_t)height));
    df_image *img;
    DF_TRY(df_image_create(width, height, &img));
    int flags = TJFLAG_ACCURATEDCT | TJFLAG_STOPONWARNING;
    if (tjDecompress2(tj, data, (unsigned long)len, img->pixels, width, 0, height, TJPF_RGB,
                      flags) != 0) {
        df_status st = df_errorf(DF_E_FORMAT,
                                 "%s: decoding the JPEG: %s (a truncated or "
                                 "corrupt JPEG)",
                                 name, tjGetErrorStr2(tj));
        df_image_free(img);
        return st;
    }
    *out = img;
    return DF_OK;
}

static df_status decode_jpeg(const void *data, size_t len, const char *name, df_image **out)
{
    tjhandle tj = tjInitDecompress();
    if (!tj)
        return df_errorf(DF_E_OOM, "%s: cannot start the JPEG decoder: %s", name,
                         tjGetErrorStr2(NULL));
    df_status st = jpeg_decode(tj, data, len, name, out);
    tjDestroy(tj);
    return st;
}

/* ---- entry points ------------------------------------------------------------------------- */

df_status df_image_decode(const void *data, size_t len, const char *name, df_image **out)
{
    *out = NULL;
    if (!name)
        name = "image";
    if (!data && len > 0)
        return df_errorf(DF_E_ARG, "%s: no data", name);
    const uint8_t *b = data;
    if (len >= sizeof png_magic && memcmp(b, png_magic, sizeof png_magic) == 0)
        return decode_png(data, len, name, out);
    if (len >= 3 && b[0] == 0xff && b[1] == 0xd8 && b[2] == 0xff)
        return decode_jpeg(data, len, name, out);
    if (len == 0)
        return df_errorf(DF_E_FORMAT, "%s: the file is empty (expected a PNG or JPEG image)", name);
    return df_errorf(DF_E_FORMAT,
                     "%s: not a PNG or JPEG image (the first bytes are %02x %02x %02x %02x)", name,
                     b[0], len > 1 ? b[1] : 0, len > 2 ? b[2] : 0, len > 3 ? b[3] : 0);
}

df_status df_image_load(const char *path, df_image **out)
{
    *out = NULL;
    char *data;
    size_t len;
    DF_TRY(df_file_read_all(path, MAX_FILE_BYTES, &data, &len));
    df_status st = df_image_decode(data, len, path, out);
    df_free(data);
    return st;
}
