/*
 * RGB images and PNG files (libspng).
 *
 * Saving encodes the whole file in memory first, then writes it to "<path>.<pid>.<n>.tmp"
 * in the same folder, flushes it to disk and renames it over <path>: a failure at any
 * point (encoding, a full disk, an unwritable folder) removes the temporary file and
 * leaves <path> as it was. The generation parameters go in a text chunk "parameters":
 * tEXt (Latin-1) when every character fits, else iTXt (UTF-8), as the web UIs' writers do.
 * Loading accepts every PNG colour type and bit depth and converts to 8-bit RGB with
 * libspng's own conversion (alpha dropped); text chunks come back as UTF-8.
 * libspng allocates through df_malloc & co. so out-of-memory tests reach it.
 */
#include <diffuse/image.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <spng.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/spng_alloc.h"

/* ---- the image ------------------------------------------------------------------------ */

df_status df_image_create(int width, int height, df_image **out)
{
    *out = NULL;
    size_t bytes;
    if (width < 1 || height < 1 || !df_size_mul((size_t)width, (size_t)height, &bytes) ||
        !df_size_mul(bytes, 3, &bytes))
        return df_errorf(DF_E_ARG, "image size %dx%d is invalid", width, height);
    df_image *img = df_calloc(1, sizeof *img);
    uint8_t *pixels = df_calloc(bytes, 1);
    if (!img || !pixels) {
        df_free(img);
        df_free(pixels);
        return df_errorf(DF_E_OOM, "out of memory for a %dx%d image", width, height);
    }
    img->width = width;
    img->height = height;
    img->channels = 3;
    img->pixels = pixels;
    *out = img;
    return DF_OK;
}

void df_image_free(df_image *img)
{
    if (!img)
        return;
    df_free(img->pixels);
    df_free(img);
}

void df_image_text_free(char *text)
{
    df_free(text);
}

/* ---- UTF-8 and Latin-1 ------------------------------------------------------------------ */

/* Decodes one UTF-8 sequence at s[*i]; -1 when malformed (overlong, surrogate, > U+10FFFF). */
static int32_t utf8_next(const unsigned char *s, size_t len, size_t *i)
{
    unsigned char c = s[*i];
    int extra = c < 0x80             ? 0
                : (c & 0xe0) == 0xc0 ? 1
                : (c & 0xf0) == 0xe0 ? 2
                : (c & 0xf8) == 0xf0 ? 3
                                     : -1;
    if (extra < 0 || *i + (size_t)extra >= len)
        return -1;
    int32_t cp = extra == 0 ? c : c & (0x3f >> extra);
    for (int k = 1; k <= extra; k++) {
        if ((s[*i + k] & 0xc0) != 0x80)
            return -1;
        cp = (cp << 6) | (s[*i + k] & 0x3f);
    }
    static const int32_t min_cp[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[extra] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return -1;
    *i += (size_t)extra + 1;
    return cp;
}

/* A character tEXt may hold: Latin-1 printable, or a newline. */
static bool latin1_text_char(int32_t cp)
{
    return cp == '\n' || (cp >= 0x20 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xff);
}

/* Whether s[0..len) is UTF-8 (else *bad_at is the first bad byte), and whether every
 * character fits tEXt. */
static bool scan_utf8(const char *text, size_t len, bool *latin1, size_t *bad_at)
{
    const unsigned char *s = (const unsigned char *)text;
    *latin1 = true;
    for (size_t i = 0; i < len;) {
        *bad_at = i;
        int32_t cp = utf8_next(s, len, &i);
        if (cp < 0)
            return false;
        *latin1 = *latin1 && latin1_text_char(cp);
    }
    return true;
}

static char *utf8_to_latin1(const char *text, size_t *out_len)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t len = strlen(text), n = 0;
    char *out = df_malloc(len + 1);
    if (!out)
        return NULL;
    for (size_t i = 0; i < len;)
        out[n++] = (char)utf8_next(s, len, &i); /* scan_utf8 checked every code point */
    out[n] = '\0';
    *out_len = n;
    return out;
}

static char *latin1_to_utf8(const char *text, size_t len)
{
    char *out = df_malloc(2 * len + 1), *p = out;
    if (!out)
        return NULL;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x80) {
            *p++ = (char)c;
        } else {
            *p++ = (char)(0xc0 | (c >> 6));
            *p++ = (char)(0x80 | (c & 0x3f));
        }
    }
    *p = '\0';
    return out;
}

/* ---- saving -------------------------------------------------------------------------- */

/* `bad` is the status of a failure that is not for want of memory. */
static df_status spng_failure(int err, df_status bad, const char *path, const char *what)
{
    if (df_spng_out_of_memory(err))
        return df_errorf(DF_E_OOM, "%s: out of memory %s", path, what);
    return df_errorf(bad, "%s: %s: %s", path, what, spng_strerror(err));
}

/* Encodes the whole PNG into a buffer from df_malloc. */
static df_status encode_png(const df_image *img, const char *path, const char *parameters,
                            void **out, size_t *out_len)
{
    *out = NULL;
    bool latin1 = true;
    size_t bad_at;
    if (parameters && !scan_utf8(parameters, strlen(parameters), &latin1, &bad_at))
        return df_errorf(DF_E_ARG, "%s: the parameters text is not valid UTF-8 (byte %zu)", path,
                         bad_at);

    spng_ctx *ctx = df_spng_ctx_new(SPNG_CTX_ENCODER);
    if (!ctx)
        return df_errorf(DF_E_OOM, "%s: out of memory encoding the image", path);
    char *text = NULL;
    df_status st = DF_OK;
    struct spng_ihdr ihdr = {
        .width = (uint32_t)img->width,
        .height = (uint32_t)img->height,
        .bit_depth = 8,
        .color_type = SPNG_COLOR_TYPE_TRUECOLOR,
    };
    int err = spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
    if (!err)
        err = spng_set_ihdr(ctx, &ihdr);
    if (!err && parameters && parameters[0]) { /* libspng refuses an empty text chunk */
        struct spng_text chunk = {.keyword = "parameters"};
        if (latin1) {
            text = utf8_to_latin1(parameters, &chunk.length);
            chunk.type = SPNG_TEXT;
        } else {
            text = df_strdup(parameters);
            chunk.length = strlen(parameters);
            chunk.type = SPNG_ITXT;
            chunk.language_tag = "";
            chunk.translated_keyword = "";
        }
        chunk.text = text;
        err = text ? spng_set_text(ctx, &chunk, 1) : SPNG_EMEM;
    }
    size_t bytes = (size_t)img->width * (size_t)img->height * 3;
    if (!err)
        err = spng_encode_image(ctx, img->pixels, bytes, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
    if (!err) {
        *out = spng_get_png_buffer(ctx, out_len, &err);
        if (!*out && !err)
            err = SPNG_EMEM;
    }
    if (err)
        st = spng_failure(err, DF_E_ARG, path, "encoding the image");
    df_free(text);
    spng_ctx_free(ctx);
    return st;
}

static df_status write_all(int fd, const uint8_t *data, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, data, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return DF_E_IO;
        data += n;
        len -= (size_t)n;
    }
    return DF_OK;
}

/* Writes `data` to a fresh temporary file beside `path`, then renames it to `path`. */
static df_status replace_file(const char *path, const void *data, size_t len)
{
    static atomic_uint counter;
    size_t tmp_len = strlen(path) + 64;
    char *tmp = df_malloc(tmp_len);
    if (!tmp)
        return df_errorf(DF_E_OOM, "%s: out of memory", path);
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, tmp_len, "%s.%ld.%u.tmp", path, (long)getpid(),
                 atomic_fetch_add(&counter, 1));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        df_status st = df_errorf(DF_E_IO, "cannot write '%s': %s", path, strerror(errno));
        df_free(tmp);
        return st;
    }
    df_status st = DF_OK;
    const char *step = "write";
    if (write_all(fd, data, len) != DF_OK) {
        st = DF_E_IO;
    } else if (fsync(fd) != 0) {
        st = DF_E_IO;
        step = "fsync";
    }
    int saved = errno;
    if (close(fd) != 0 && st == DF_OK) {
        st = DF_E_IO;
        saved = errno;
        step = "close";
    }
    if (st == DF_OK && rename(tmp, path) != 0) {
        st = DF_E_IO;
        saved = errno;
        step = "rename from the temporary file";
    }
    if (st != DF_OK) {
        unlink(tmp);
        st = df_errorf(DF_E_IO, "cannot write '%s': %s failed: %s", path, step, strerror(saved));
    }
    df_free(tmp);
    return st;
}

df_status df_image_save_png(const df_image *img, const char *path, const char *parameters)
{
    if (!img || !img->pixels || img->channels != 3 || img->width < 1 || img->height < 1)
        return df_errorf(DF_E_ARG, "%s: can only save an 8-bit RGB image with pixels", path);
    void *png;
    size_t len;
    DF_TRY(encode_png(img, path, parameters, &png, &len));
    df_status st = replace_file(path, png, len);
    df_free(png);
    return st;
}

df_status df_image_encode_png(const df_image *img, const char *parameters, void **out,
                              size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (!img || !img->pixels || img->channels != 3 || img->width < 1 || img->height < 1)
        return df_errorf(DF_E_ARG, "PNG in memory: can only encode an 8-bit RGB image with "
                                   "pixels");
    return encode_png(img, "PNG in memory", parameters, out, out_len);
}

void df_image_png_free(void *png)
{
    df_free(png);
}

/* ---- loading ------------------------------------------------------------------------- */

/* The "parameters" chunk as UTF-8, or NULL (*out) when there is none. */
static df_status read_parameters(spng_ctx *ctx, const char *path, char **out)
{
    *out = NULL;
    uint32_t n = 0;
    int err = spng_get_text(ctx, NULL, &n);
    if (err == SPNG_ECHUNKAVAIL || (!err && n == 0))
        return DF_OK;
    if (err)
        return spng_failure(err, DF_E_FORMAT, path, "reading text chunks");
    struct spng_text *chunks = df_calloc(n, sizeof *chunks);
    if (!chunks)
        return df_errorf(DF_E_OOM, "%s: out of memory reading text chunks", path);
    df_status st = DF_OK;
    err = spng_get_text(ctx, chunks, &n);
    if (err)
        st = spng_failure(err, DF_E_FORMAT, path, "reading text chunks");
    for (uint32_t i = 0; st == DF_OK && i < n; i++) {
        if (strcmp(chunks[i].keyword, "parameters") != 0)
            continue;
        const char *t = chunks[i].text;
        size_t len = chunks[i].length;
        bool latin1;
        size_t bad_at;
        /* iTXt that is not UTF-8 after all is read as Latin-1, like tEXt and zTXt */
        bool is_utf8 = chunks[i].type == SPNG_ITXT && memchr(t, 0, len) == NULL &&
                       scan_utf8(t, len, &latin1, &bad_at);
        char *copy = is_utf8 ? df_strdup(t) : latin1_to_utf8(t, strnlen(t, len));
        if (!copy)
            st = df_errorf(DF_E_OOM, "%s: out of memory reading the parameters", path);
        *out = copy;
        break;
    }
    df_free(chunks);
    return st;
}

static df_status decode_png(spng_ctx *ctx, const char *path, df_image **out, char **params)
{
    struct spng_ihdr ihdr;
    int err = spng_get_ihdr(ctx, &ihdr);
    if (err)
        return spng_failure(err, DF_E_FORMAT, path, "reading the PNG header");
    if (ihdr.width > INT_MAX || ihdr.height > INT_MAX)
        return df_errorf(DF_E_FORMAT, "%s: %ux%u is too large", path, ihdr.width, ihdr.height);
    size_t bytes;
    err = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &bytes);
    if (err)
        return spng_failure(err, DF_E_FORMAT, path, "sizing the image");
    df_image *img;
    DF_TRY(df_image_create((int)ihdr.width, (int)ihdr.height, &img));
    if (bytes != (size_t)img->width * (size_t)img->height * 3) {
        df_image_free(img);
        return df_errorf(DF_E_INTERNAL, "%s: decoded size %zu disagrees with %ux%u RGB", path,
                         bytes, ihdr.width, ihdr.height);
    }
    err = spng_decode_image(ctx, img->pixels, bytes, SPNG_FMT_RGB8, 0);
    df_status st = err ? spng_failure(err, DF_E_FORMAT, path, "decoding the image") : DF_OK;
    if (st == DF_OK && params)
        st = read_parameters(ctx, path, params);
    if (st != DF_OK) {
        df_image_free(img);
        return st;
    }
    *out = img;
    return DF_OK;
}

df_status df_image_load_png(const char *path, df_image **out, char **parameters_out)
{
    *out = NULL;
    if (parameters_out)
        *parameters_out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return df_errorf(DF_E_IO, "cannot open '%s': %s", path, strerror(errno));
    spng_ctx *ctx = df_spng_ctx_new(0);
    df_status st;
    if (!ctx) {
        st = df_errorf(DF_E_OOM, "%s: out of memory", path);
    } else {
        /* bounds on what a hostile file can make us allocate for one chunk / metadata */
        spng_set_chunk_limits(ctx, (size_t)64 << 20, (size_t)256 << 20);
        int err = spng_set_png_file(ctx, f);
        st = err ? spng_failure(err, DF_E_FORMAT, path, "reading")
                 : decode_png(ctx, path, out, parameters_out);
    }
    spng_ctx_free(ctx);
    fclose(f);
    return st;
}
