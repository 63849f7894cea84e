/*
 * A model's weights: one safetensors file or a sharded checkpoint.
 *
 * A sharded checkpoint is a *.safetensors.index.json whose "weight_map" maps each tensor
 * name to the shard file holding it, in the index's folder. df_weights opens every shard
 * and checks the index against them: each shard name stays inside the folder (no '..', no
 * absolute path) and names a regular file, every tensor of the map is in its shard, and
 * every tensor of a shard is in the map, in that shard. The same find and read calls then
 * work across shards as on one file.
 */
#ifndef DIFFUSE_WEIGHTS_H
#define DIFFUSE_WEIGHTS_H

#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_weights df_weights;

/*
 * Opens `path`: a .safetensors file, a *.safetensors.index.json, or a component folder
 * (where df_layout_find_weights picks the file). On success *out is owned by the caller
 * (free with df_weights_free). Failures as df_safetensors_open, and DF_E_FORMAT / DF_E_IO
 * for a bad index (the message names the index, the shard and the tensor).
 */
DF_API df_status df_weights_open(const char *path, df_weights **out);

/* The file opened: the .safetensors file or the index. */
DF_API const char *df_weights_path(const df_weights *w);

/* The shard files (1 for a single file) and shard i (borrowed). */
DF_API int df_weights_shard_count(const df_weights *w);
DF_API const df_safetensors *df_weights_shard(const df_weights *w, int i);

/* Tensors across all shards: count, tensor i in name order, lookup by name. */
DF_API int64_t df_weights_count(const df_weights *w);
DF_API df_status df_weights_at(const df_weights *w, int64_t i, df_tensor_info *out);
DF_API df_status df_weights_find(const df_weights *w, const char *name, df_tensor_info *out);
DF_API bool df_weights_contains(const df_weights *w, const char *name);

/* Total bytes of all tensors as stored. */
DF_API uint64_t df_weights_total_bytes(const df_weights *w);

/* df_safetensors_read / _read_rows / _read_cols on the shard that holds `name`. */
DF_API df_status df_weights_read(const df_weights *w, const char *name, df_dtype as, void *dst,
                                 size_t dst_bytes);
DF_API df_status df_weights_read_rows(const df_weights *w, const char *name, int64_t r0,
                                      int64_t r1, df_dtype as, void *dst, size_t dst_bytes);
DF_API df_status df_weights_read_cols(const df_weights *w, const char *name, int64_t c0,
                                      int64_t c1, df_dtype as, void *dst, size_t dst_bytes);

/* Sum of df_safetensors_bytes_read over the shards. */
DF_API uint64_t df_weights_bytes_read(const df_weights *w);

/* df_safetensors_release_pages on the shard holding `name`, or on every shard for NULL. */
DF_API df_status df_weights_release_pages(const df_weights *w, const char *name);

/* Closes every shard and frees. NULL is fine. */
DF_API void df_weights_free(df_weights *w);

#ifdef __cplusplus
}
#endif
#endif
