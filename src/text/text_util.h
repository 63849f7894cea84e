/*
 * Small helpers shared by the tokenizers: growable arrays, UTF-8 checks and encoding, the
 * whitespace rule of Python's str.isspace(), and reading a whole file.
 */
#ifndef DF_TEXT_TEXT_UTIL_H
#define DF_TEXT_TEXT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h" /* df_array_reserve */
#include "core/status.h"

typedef struct df_i64_vec {
    int64_t *data;
    size_t len, cap;
} df_i64_vec;

typedef struct df_cp_vec {
    int32_t *data;
    size_t len, cap;
} df_cp_vec;

typedef struct df_byte_buf {
    char *data;
    size_t len, cap;
} df_byte_buf;

/* Each returns false when memory ran out (the array is unchanged then). */
bool df_i64_vec_push(df_i64_vec *v, int64_t x);
bool df_cp_vec_push(df_cp_vec *v, int32_t cp);
bool df_cp_vec_reserve(df_cp_vec *v, size_t n);
bool df_byte_buf_append(df_byte_buf *b, const void *p, size_t n);
bool df_byte_buf_put_cp(df_byte_buf *b, int32_t cp); /* UTF-8 encoded */
void df_i64_vec_free(df_i64_vec *v);
void df_cp_vec_free(df_cp_vec *v);
void df_byte_buf_free(df_byte_buf *b);

/* DF_OK when s[0..len) is valid UTF-8 (no overlong forms, surrogates or values past
 * U+10FFFF); otherwise DF_E_ARG with "<what>: invalid UTF-8 at byte offset N". */
df_status df_utf8_check(const char *s, size_t len, const char *what);

/* Decodes one code point from valid UTF-8 (checked before); returns its byte length. */
size_t df_utf8_next(const char *s, size_t len, int32_t *cp);

/* Appends the code points of valid UTF-8 text. */
bool df_utf8_to_cps(const char *s, size_t len, df_cp_vec *out);

/* Python's str.isspace() for one character (the fixed list of the Unicode White_Space
 * property plus U+001C..U+001F). */
bool df_py_isspace(int32_t cp);

/* The bounds of valid UTF-8 text s[b, e) without the code points `strip` holds for at its
 * start (df_utf8_lstrip: the new b) or at its end (df_utf8_rstrip: the new e). */
size_t df_utf8_lstrip(const char *s, size_t b, size_t e, bool (*strip)(int32_t cp));
size_t df_utf8_rstrip(const char *s, size_t b, size_t e, bool (*strip)(int32_t cp));

/* Reads a whole file into a df_malloc'd, NUL-terminated buffer. DF_E_IO when it cannot. */
df_status df_read_file(const char *path, char **out, size_t *out_len);

#endif
