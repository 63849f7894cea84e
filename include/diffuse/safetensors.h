/*
 * Safetensors files: the weights of every model, read in place.
 *
 * A file is an 8-byte little-endian header length, a JSON header naming each tensor's
 * dtype, shape and byte range, then the tensor bytes. Opening maps the file and validates
 * the whole header: the length, the JSON, every dtype, every shape against its byte range,
 * that the ranges tile the data section exactly (no overlaps, no holes, nothing after the
 * last tensor), unique names and a `__metadata__` map of strings. After that, reads need no
 * checks and no tensor byte has been touched.
 *
 * Reads copy a tensor (or a range of rows or columns of one, for tensor parallelism) into
 * the caller's buffer, converting the dtype on the way. Each handle counts the tensor bytes
 * its reads touched (df_safetensors_bytes_read), so a test can prove that a slice read
 * touched only its slice. For several files behind a *.safetensors.index.json, see
 * <diffuse/weights.h>.
 */
#ifndef DIFFUSE_SAFETENSORS_H
#define DIFFUSE_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_safetensors df_safetensors;

/* Tensors with more dimensions are refused (DF_E_UNSUPPORTED) at open. */
#define DF_SAFETENSORS_MAX_DIMS 8

/* Everything known about one tensor. Pointers are borrowed from the open file. */
typedef struct df_tensor_info {
    const char *name;
    df_dtype dtype;         /* DF_DTYPE_COUNT when the file's dtype is not one diffuse loads */
    const char *dtype_name; /* the file's own spelling: "BF16", "F32", "I8", "BOOL", ... */
    size_t elem_size;       /* bytes per element of the stored dtype */
    int ndim;               /* 0 for a scalar */
    int64_t shape[DF_SAFETENSORS_MAX_DIMS];
    int64_t numel;
    uint64_t offset;        /* byte offset of the data within the file */
    size_t nbytes;
    const void *data;       /* the bytes in the mapping; may be unaligned in odd files.
                               Reading through it is not counted in bytes_read. */
    int shard;              /* df_weights: index of the file holding it; else 0 */
} df_tensor_info;

/*
 * Maps and validates the file at `path`. On success *out is owned by the caller (free with
 * df_safetensors_free); no tensor data has been read. Fails with DF_E_IO (cannot open, not
 * a regular file, cannot map), DF_E_FORMAT (the message names the file, the tensor and what
 * is wrong), DF_E_UNSUPPORTED (more than DF_SAFETENSORS_MAX_DIMS dimensions), DF_E_OOM.
 */
DF_API df_status df_safetensors_open(const char *path, df_safetensors **out);

/*
 * Same over `len` bytes at `buf`, which the caller keeps alive and unchanged until the
 * handle is freed. `name` stands for the file in messages. For tests and fuzzing.
 */
DF_API df_status df_safetensors_open_memory(const void *buf, size_t len, const char *name,
                                            df_safetensors **out);

/* The path (or name) the handle was opened with. */
DF_API const char *df_safetensors_path(const df_safetensors *st);

/* Number of tensors, and tensor i in name order (DF_E_ARG when i is out of range). */
DF_API int64_t df_safetensors_count(const df_safetensors *st);
DF_API df_status df_safetensors_at(const df_safetensors *st, int64_t i, df_tensor_info *out);

/* Looks a tensor up by name. DF_E_FORMAT ("<file>: no tensor '<name>'") when absent. */
DF_API df_status df_safetensors_find(const df_safetensors *st, const char *name,
                                     df_tensor_info *out);
DF_API bool df_safetensors_contains(const df_safetensors *st, const char *name);

/* The `__metadata__` entries: count, entry i (keys in name order), and lookup (NULL when
 * absent). Strings are borrowed from the handle. */
DF_API int64_t df_safetensors_metadata_count(const df_safetensors *st);
DF_API void df_safetensors_metadata_at(const df_safetensors *st, int64_t i, const char **key,
                                       const char **value);
DF_API const char *df_safetensors_metadata(const df_safetensors *st, const char *key);

/*
 * Copies tensor `name` into dst converted to dtype `as` (numel * size(as) bytes; dst_bytes
 * must be at least that). DF_E_ARG when dst is too small or `as` is invalid, DF_E_FORMAT
 * when the tensor is absent or a value does not fit an integer `as` (dst is then partly
 * written), DF_E_UNSUPPORTED when the stored dtype is not one diffuse loads.
 */
DF_API df_status df_safetensors_read(const df_safetensors *st, const char *name, df_dtype as,
                                     void *dst, size_t dst_bytes);

/*
 * Reads rows [r0, r1) along the first dimension (a row is the product of the other
 * dimensions; for a 1-D tensor, elements) into dst as [r1 - r0, ...]. Touches only those
 * rows' bytes. DF_E_ARG when the range is not inside the tensor; otherwise as above.
 */
DF_API df_status df_safetensors_read_rows(const df_safetensors *st, const char *name,
                                          int64_t r0, int64_t r1, df_dtype as, void *dst,
                                          size_t dst_bytes);

/*
 * Reads columns [c0, c1) of a 2-D tensor [R, C] into dst as [R, c1 - c0]. Touches only
 * those columns' bytes of each row. DF_E_SHAPE when the tensor is not 2-D; DF_E_ARG when the
 * range is not inside it; otherwise as above.
 */
DF_API df_status df_safetensors_read_cols(const df_safetensors *st, const char *name,
                                          int64_t c0, int64_t c1, df_dtype as, void *dst,
                                          size_t dst_bytes);

/* Tensor bytes touched by reads through this handle since it was opened. */
DF_API uint64_t df_safetensors_bytes_read(const df_safetensors *st);

/*
 * Gives back the memory pages that hold tensor `name` (every tensor when name is NULL)
 * after it has been read: the pages leave the process's resident set and are read from the
 * file again if touched later. The range is widened to whole pages, which may drop parts of
 * neighbouring tensors; that is harmless, as they are reloaded on demand. Does nothing for
 * a handle opened over memory. DF_E_FORMAT when the tensor is absent, DF_E_IO when the
 * system refuses.
 */
DF_API df_status df_safetensors_release_pages(const df_safetensors *st, const char *name);

/* Unmaps and frees. NULL is fine. */
DF_API void df_safetensors_free(df_safetensors *st);

#ifdef __cplusplus
}
#endif
#endif
