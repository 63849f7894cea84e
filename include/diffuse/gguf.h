/*
 * GGUF files: llama.cpp's container, which city96's and stable-diffusion.cpp's quantised
 * diffusion models use.
 *
 * A file is a header ("GGUF", version 2 or 3, tensor and key-value counts, all
 * little-endian), key-value metadata (strings, numbers, booleans and arrays of them),
 * tensor descriptions (name, dimensions, ggml type, offset) and, from the next multiple
 * of the alignment (`general.alignment`, default 32), the tensor data. Opening maps the
 * file and validates all of it: every count and length against the bytes left, every
 * string, every value type, each tensor's type, its dimensions against the type's block
 * size, its offset against the alignment and its bytes against the data section, and that
 * no two tensors overlap or share a name. After that, reads need no checks.
 *
 * Shapes are given outermost first, as torch and safetensors write them (ggml lists them
 * innermost first; the reader reverses them), so a linear weight is [out, in] in both
 * containers. Reads dequantise (F32, F16, BF16, F64, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
 * Q3_K, Q4_K, Q5_K, Q6_K) block by block into the caller's buffer in f32, bf16 or f16;
 * a row range touches only its rows' blocks and never holds more than a few KB in f32.
 */
#ifndef DIFFUSE_GGUF_H
#define DIFFUSE_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_gguf df_gguf;

/* ggml allows 4 dimensions. */
#define DF_GGUF_MAX_DIMS 4

/* The value types of metadata, as the file numbers them. */
typedef enum df_gguf_value_type {
    DF_GGUF_UINT8 = 0,  DF_GGUF_INT8 = 1,    DF_GGUF_UINT16 = 2,  DF_GGUF_INT16 = 3,
    DF_GGUF_UINT32 = 4, DF_GGUF_INT32 = 5,   DF_GGUF_FLOAT32 = 6, DF_GGUF_BOOL = 7,
    DF_GGUF_STRING = 8, DF_GGUF_ARRAY = 9,   DF_GGUF_UINT64 = 10, DF_GGUF_INT64 = 11,
    DF_GGUF_FLOAT64 = 12,
} df_gguf_value_type;

/* One tensor. Pointers are borrowed from the open file. */
typedef struct df_gguf_tensor {
    const char *name;
    uint32_t type;          /* ggml type id */
    const char *type_name;  /* "Q4_K", "F16", ... */
    bool readable;          /* df_gguf_read_rows can dequantise this type */
    int ndim;
    int64_t shape[DF_GGUF_MAX_DIMS]; /* outermost first (ggml's ne reversed) */
    int64_t numel;
    int block;              /* values per block of the type; blocks run along the last dim */
    uint64_t offset;        /* byte offset of the data within the file */
    size_t nbytes;
    const void *data;       /* the bytes in the mapping (aligned as the file says) */
} df_gguf_tensor;

/*
 * Maps and validates the file at `path`. On success *out is owned by the caller (free with
 * df_gguf_free). Fails with DF_E_IO (cannot open or map), DF_E_FORMAT (the message names
 * the file, the key or tensor, and what is wrong), DF_E_UNSUPPORTED (version 1, nested
 * arrays, more than DF_GGUF_MAX_DIMS dimensions), DF_E_OOM.
 */
DF_API df_status df_gguf_open(const char *path, df_gguf **out);

/* Same over `len` bytes at `buf`, which the caller keeps alive and unchanged until the
 * handle is freed; `name` stands for the file in messages. For tests and fuzzing. */
DF_API df_status df_gguf_open_memory(const void *buf, size_t len, const char *name,
                                     df_gguf **out);

DF_API const char *df_gguf_path(const df_gguf *g);
DF_API uint32_t df_gguf_version(const df_gguf *g);
DF_API uint32_t df_gguf_alignment(const df_gguf *g);

/* Tensors: count, tensor i in name order, lookup by name (DF_E_FORMAT when absent). */
DF_API int64_t df_gguf_count(const df_gguf *g);
DF_API df_status df_gguf_at(const df_gguf *g, int64_t i, df_gguf_tensor *out);
DF_API df_status df_gguf_find(const df_gguf *g, const char *name, df_gguf_tensor *out);
DF_API bool df_gguf_contains(const df_gguf *g, const char *name);

/* Total bytes of tensor data, and the sum over tensors of their own bytes. */
DF_API uint64_t df_gguf_tensor_bytes(const df_gguf *g);

/*
 * Metadata. Keys in file order: count, key i and its type (for an array, *elem_type and
 * *count describe its elements; either may be NULL). The getters convert: get_int takes
 * any integer or bool type, get_float any number; get_string a string. Each fails with
 * DF_E_FORMAT naming the key when it is absent or of another type.
 */
DF_API int64_t df_gguf_kv_count(const df_gguf *g);
DF_API const char *df_gguf_kv_key(const df_gguf *g, int64_t i, df_gguf_value_type *type,
                                  df_gguf_value_type *elem_type, uint64_t *count);
DF_API int64_t df_gguf_kv_find(const df_gguf *g, const char *key); /* -1 when absent */
DF_API df_status df_gguf_get_int(const df_gguf *g, const char *key, int64_t *out);
DF_API df_status df_gguf_get_float(const df_gguf *g, const char *key, double *out);
DF_API df_status df_gguf_get_string(const df_gguf *g, const char *key, const char **out);
/* Element i of an array of strings (borrowed, NUL-terminated), or of numbers as double. */
DF_API df_status df_gguf_get_array_string(const df_gguf *g, const char *key, uint64_t i,
                                          const char **out);
DF_API df_status df_gguf_get_array_number(const df_gguf *g, const char *key, uint64_t i,
                                          double *out);
/* Element i of an array of strings with its length in bytes (it may hold NUL bytes; a NUL
 * follows it). */
DF_API df_status df_gguf_get_array_bytes(const df_gguf *g, const char *key, uint64_t i,
                                         const char **out, size_t *len);

/*
 * Reads rows [r0, r1) along the first dimension of tensor `name` (a row is the product of
 * the other dimensions) dequantised into dst as `as` (F32, BF16 or F16); r0 = 0, r1 = -1
 * reads the whole tensor. Dequantises a few blocks at a time, never the whole range to f32.
 * DF_E_ARG for a bad range (of a 1-D block type, one that does not start and end on a
 * block), a destination smaller than (r1 - r0) * row * size(as) or another `as`; DF_E_FORMAT when the tensor is absent; DF_E_UNSUPPORTED for a type with no
 * dequantiser (the message names it).
 */
DF_API df_status df_gguf_read_rows(const df_gguf *g, const char *name, int64_t r0, int64_t r1,
                                   df_dtype as, void *dst, size_t dst_bytes);

/* Gives back the pages holding tensor `name` after it was read (as
 * df_safetensors_release_pages): they leave the resident set and are read from the file
 * again if touched. Does nothing for a handle over memory. DF_E_FORMAT when absent. */
DF_API df_status df_gguf_release_pages(const df_gguf *g, const char *name);

/* Unmaps and frees. NULL is fine. */
DF_API void df_gguf_free(df_gguf *g);

#ifdef __cplusplus
}
#endif
#endif
