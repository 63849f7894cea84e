/*
 * Writing safetensors files (for tools that make models, and for tests).
 *
 * df_st_writer builds one file in memory: tensors are added one by one (their bytes are
 * copied), then df_st_writer_finish writes the header (names sorted, offsets in order, the
 * header padded with spaces to a multiple of 8 bytes so that data is aligned) and the data
 * to a temporary file beside `path`, and renames it into place. df_st_shards (below) streams a whole component into shards.
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

/*
 * A component's weights streamed into safetensors shards, named as diffusers and
 * transformers name them: one file, BASE.safetensors; more, BASE-0000N-of-0000M.safetensors
 * with BASE.safetensors.index.json (metadata.total_size, weight_map). Each shard file is
 * byte for byte what df_st_writer would write for its tensors.
 *
 * Tensors are declared in order (df_st_shards_declare), which places them: a shard is laid
 * out (its header written) when the next tensor would take it past shard_bytes, or when the
 * declarations end. Each tensor's bytes then come once (df_st_shards_write), in any order: a
 * tensor of a laid-out shard goes straight to its place in the file; one whose shard is still
 * open is held in memory until its shard is laid out. So a caller that declares everything
 * first streams in a tensor's memory, and one that declares and writes each tensor in turn
 * holds at most one shard.
 */
typedef struct df_st_shards df_st_shards;

/* Shards of this size unless a writer is given another. */
#define DF_ST_SHARD_BYTES ((int64_t)1 << 31)

/* Starts writing BASE*.safetensors into the folder `dir` (which must exist). shard_bytes
 * <= 0: DF_ST_SHARD_BYTES. On success *out is the caller's (df_st_shards_free). */
DF_API df_status df_st_shards_create(const char *dir, const char *base, int64_t shard_bytes,
                                     df_st_shards **out);
/* Declares the next tensor (checks as df_st_writer_add); *id (may be NULL) is its number for
 * df_st_shards_write: 0, 1, 2, ... in declaration order. DF_E_ARG after
 * df_st_shards_end_declarations. */
DF_API df_status df_st_shards_declare(df_st_shards *w, const char *name, df_dtype dtype,
                                      const int64_t *shape, int ndim, int64_t *id);
/* Lays out the last shard: every tensor written from here on goes straight to its file. */
DF_API df_status df_st_shards_end_declarations(df_st_shards *w);
/* Tensor `id`'s bytes (all of them, in its dtype). DF_E_ARG for an unknown id or a second
 * write, DF_E_IO naming the file. */
DF_API df_status df_st_shards_write(df_st_shards *w, int64_t id, const void *data);
/* The same from f32 values, converted to the tensor's dtype (f32, bf16 or f16). */
DF_API df_status df_st_shards_write_f32(df_st_shards *w, int64_t id, const float *data);
/* Ends the declarations if needed, checks that every tensor was written (DF_E_ARG naming
 * the first that was not), gives the shards their names and writes the index for more than
 * one. Until this succeeds the shards exist only under temporary names. */
DF_API df_status df_st_shards_finish(df_st_shards *w);
/* The shards written (valid after finish) and the bytes of all tensors. */
DF_API int df_st_shards_count(const df_st_shards *w);
DF_API int64_t df_st_shards_total_bytes(const df_st_shards *w);
/* Frees; an unfinished writer's temporary files are removed. NULL is fine. */
DF_API void df_st_shards_free(df_st_shards *w);

#ifdef __cplusplus
}
#endif
#endif
