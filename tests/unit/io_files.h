/*
 * Test helpers for the io tests: building safetensors bytes from a header string, and
 * writing files into a fresh folder under DF_TEST_TMP.
 *
 * The builder writes exactly what the test says (the 8-byte length, the header text, the
 * data bytes), so malformed files are as easy to make as good ones.
 */
#ifndef DF_TESTS_IO_FILES_H
#define DF_TESTS_IO_FILES_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* 8-byte little-endian `hlen` (which need not be the truth), then `header` (strlen bytes),
 * then data_len bytes of `data` (or a byte pattern when data is NULL). malloc'd; *out_len
 * receives the size. */
static inline uint8_t *st_bytes_len(uint64_t hlen, const char *header, const void *data,
                                    size_t data_len, size_t *out_len)
{
    size_t body = strlen(header);
    size_t n = 8 + body + data_len;
    uint8_t *b = malloc(n + 1);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(hlen >> (8 * i));
    memcpy(b + 8, header, body);
    for (size_t i = 0; i < data_len; i++)
        b[8 + body + i] = data ? ((const uint8_t *)data)[i] : (uint8_t)(i * 7 + 1);
    *out_len = n;
    return b;
}

/* The usual case: the header length is the header's own length. */
static inline uint8_t *st_bytes(const char *header, const void *data, size_t data_len,
                                size_t *out_len)
{
    return st_bytes_len(strlen(header), header, data, data_len, out_len);
}

static inline int write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(buf, 1, len, f);
    return fclose(f) == 0 && w == len ? 0 : -1;
}

static inline int write_text(const char *path, const char *text)
{
    return write_file(path, text, strlen(text));
}

/* A new empty folder DF_TEST_TMP/<name>-<pid> (removed first if it exists), written into
 * buf. Returns buf. */
static inline const char *test_dir(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/%s-%d", DF_TEST_TMP, name, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", buf);
    if (system(cmd) != 0)
        return buf;
    mkdir(DF_TEST_TMP, 0755);
    mkdir(buf, 0755);
    return buf;
}

/* buf = dir "/" name. */
static inline const char *path_in(const char *dir, const char *name, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap) {
        fprintf(stderr, "test path too long: %s/%s\n", dir, name);
        abort();
    }
    return buf;
}

static inline bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static inline bool is_dir(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static inline void remove_tree(const char *dir)
{
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
}

#endif
