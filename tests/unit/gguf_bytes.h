/*
 * A byte builder for hand-made GGUF files in the unit tests (test_gguf.c, test_single_file.c):
 * a header, metadata, tensor descriptions and data written field by field, so that a test
 * can write a good file or break exactly one field. Include after <cmocka.h>.
 */
#ifndef DF_TESTS_GGUF_BYTES_H
#define DF_TESTS_GGUF_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct buf {
    uint8_t b[8192];
    size_t n;
} buf;

static inline void put(buf *f, const void *p, size_t n)
{
    assert_true(f->n + n <= sizeof f->b);
    memcpy(f->b + f->n, p, n);
    f->n += n;
}

static inline void u32(buf *f, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(f, b, 4);
}

static inline void u64(buf *f, uint64_t v)
{
    u32(f, (uint32_t)v);
    u32(f, (uint32_t)(v >> 32));
}

static inline void str(buf *f, const char *s)
{
    u64(f, strlen(s));
    put(f, s, strlen(s));
}

static inline void header(buf *f, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    f->n = 0;
    put(f, "GGUF", 4);
    u32(f, version);
    u64(f, n_tensors);
    u64(f, n_kv);
}

/* A tensor description: name, dims (innermost first, as ggml writes them), type, offset. */
static inline void tinfo(buf *f, const char *name, int ndim, const uint64_t *ne, uint32_t type,
                  uint64_t offset)
{
    str(f, name);
    u32(f, (uint32_t)ndim);
    for (int i = 0; i < ndim; i++)
        u64(f, ne[i]);
    u32(f, type);
    u64(f, offset);
}

/* Pads to `align` with zeros, then appends n data bytes of a pattern. */
static inline void data(buf *f, size_t align, size_t n)
{
    while (f->n % align)
        put(f, "", 1);
    for (size_t i = 0; i < n; i++) {
        uint8_t v = (uint8_t)(i * 37 + 11);
        put(f, &v, 1);
    }
}

#endif
