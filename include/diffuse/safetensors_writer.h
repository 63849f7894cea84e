/*
 * Writing safetensors files (for tools that make models, and for tests).
 *
 * Tensors are added one by one (their bytes are copied), then df_st_writer_finish writes
 * the header (names sorted, offsets in order, the header padded with spaces to a multiple
 * of 8 bytes so that data is aligned) and the data to a temporary file beside `path`, and
 * renames it into place.
 */
#ifndef DIFFUSE_SAFETENSORS_WRITER_H
#define DIFFUSE_SAFETENSORS_WRITER_H

#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_st_writer df_st_writer;

DF_API df_status df_st_writer_create(df_st_writer **out);
/* Adds `name` with `shape` (ndim <= 8); `data` holds numel elements of `dtype`. */
DF_API df_status df_st_writer_add(df_st_writer *w, const char *name, df_dtype dtype,
                                  const int64_t *shape, int ndim, const void *data);
/* Adds an f32 array converted to `dtype` (f32, bf16 or f16). */
DF_API df_status df_st_writer_add_f32(df_st_writer *w, const char *name, df_dtype dtype,
                                      const int64_t *shape, int ndim, const float *data);
/* Writes the file; DF_E_IO naming the path on failure (no partial file is left). */
DF_API df_status df_st_writer_finish(df_st_writer *w, const char *path);
DF_API void df_st_writer_free(df_st_writer *w);

#ifdef __cplusplus
}
#endif
#endif
