/*
 * Helpers for the tokenizers (see text_util.h). UTF-8 validation is utf8proc's strict
 * decoder, so overlong forms and surrogates are errors like any other invalid byte.
 */
#include "text/text_util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"

bool df_i64_vec_push(df_i64_vec *v, int64_t x)
{
    if (!df_array_reserve((void **)&v->data, &v->cap, v->len + 1, sizeof *v->data))
        return false;
    v->data[v->len++] = x;
    return true;
}

bool df_cp_vec_reserve(df_cp_vec *v, size_t n)
{
    size_t need;
    if (!df_size_add(v->len, n, &need))
        return false;
    return df_array_reserve((void **)&v->data, &v->cap, need, sizeof *v->data);
}

bool df_cp_vec_push(df_cp_vec *v, int32_t cp)
{
    if (!df_array_reserve((void **)&v->data, &v->cap, v->len + 1, sizeof *v->data))
        return false;
    v->data[v->len++] = cp;
    return true;
}

bool df_byte_buf_append(df_byte_buf *b, const void *p, size_t n)
{
    size_t need;
    if (!df_size_add(b->len, n + 1, &need) ||
        !df_array_reserve((void **)&b->data, &b->cap, need, 1))
        return false;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

bool df_byte_buf_put_cp(df_byte_buf *b, int32_t cp)
{
    uint8_t tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, tmp);
    return n > 0 && df_byte_buf_append(b, tmp, (size_t)n);
}

void df_i64_vec_free(df_i64_vec *v)
{
    df_free(v->data);
    memset(v, 0, sizeof *v);
}

void df_cp_vec_free(df_cp_vec *v)
{
    df_free(v->data);
    memset(v, 0, sizeof *v);
}

void df_byte_buf_free(df_byte_buf *b)
{
    df_free(b->data);
    memset(b, 0, sizeof *b);
}

df_status df_utf8_check(const char *s, size_t len, const char *what)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = (uint8_t)s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        size_t left = len - i < 4 ? len - i : 4;
        utf8proc_ssize_t n = utf8proc_iterate((const uint8_t *)s + i, (utf8proc_ssize_t)left, &cp);
        if (n <= 0 || cp < 0)
            return df_errorf(DF_E_ARG,
                             "%s: invalid UTF-8 at byte offset %zu (byte 0x%02X); text must be "
                             "UTF-8 encoded",
                             what, i, c);
        i += (size_t)n;
    }
    return DF_OK;
}

size_t df_utf8_next(const char *s, size_t len, int32_t *cp)
{
    uint8_t c = (uint8_t)s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    utf8proc_int32_t v;
    utf8proc_ssize_t n =
        utf8proc_iterate((const uint8_t *)s, (utf8proc_ssize_t)(len < 4 ? len : 4), &v);
    if (n <= 0) { /* not reached for checked text; consume one byte as U+FFFD */
        *cp = 0xFFFD;
        return 1;
    }
    *cp = v;
    return (size_t)n;
}

bool df_utf8_to_cps(const char *s, size_t len, df_cp_vec *out)
{
    if (!df_cp_vec_reserve(out, len))
        return false;
    size_t i = 0;
    while (i < len) {
        int32_t cp;
        i += df_utf8_next(s + i, len - i, &cp);
        out->data[out->len++] = cp;
    }
    return true;
}

size_t df_utf8_lstrip(const char *s, size_t b, size_t e, bool (*strip)(int32_t cp))
{
    while (b < e) {
        int32_t cp;
        size_t n = df_utf8_next(s + b, e - b, &cp);
        if (!strip(cp))
            break;
        b += n;
    }
    return b;
}

size_t df_utf8_rstrip(const char *s, size_t b, size_t e, bool (*strip)(int32_t cp))
{
    while (e > b) {
        size_t k = e - 1;
        while (k > b && ((uint8_t)s[k] & 0xC0) == 0x80) /* back to the lead byte */
            k--;
        int32_t cp;
        df_utf8_next(s + k, e - k, &cp);
        if (!strip(cp))
            break;
        e = k;
    }
    return e;
}

bool df_py_isspace(int32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20);
    switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

df_status df_read_file(const char *path, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    FILE *f = fopen(path, "rb");
    if (!f)
        return df_errorf(DF_E_IO, "%s: cannot open: %s", path, strerror(errno));
    df_byte_buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (!df_byte_buf_append(&b, chunk, n)) {
            fclose(f);
            df_byte_buf_free(&b);
            return df_errorf(DF_E_OOM, "%s: out of memory reading the file", path);
        }
    }
    bool failed = ferror(f) != 0;
    fclose(f);
    if (failed) {
        df_byte_buf_free(&b);
        return df_errorf(DF_E_IO, "%s: read error", path);
    }
    if (!b.data && !df_byte_buf_append(&b, "", 0))
        return df_errorf(DF_E_OOM, "%s: out of memory reading the file", path);
    *out = b.data;
    *out_len = b.len;
    return DF_OK;
}
