/*
 * 8-bit weights: the quantization int8 compute uses, and models saved quantized.
 *
 * A linear weight [n, k] is quantized symmetrically per output channel and per group of
 * `group` consecutive k (32 to 256; 0 or anything that does not divide k: the whole k):
 * q = round(w * 127 / max|w|) in [-127, 127], scale = max|w| / 127 per group. docs/int8.md
 * describes the scheme and the saved layout.
 */
#ifndef DIFFUSE_QUANTIZE_H
#define DIFFUSE_QUANTIZE_H

#include <stdbool.h>
#include <stdint.h>

#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The group size int8 compute uses by default: DIFFUSE_INT8_GROUP (32..256, or "k" for the
 * whole k: returned as 0), else 128. */
DF_API int64_t df_int8_default_group(void);

/* The number of scale groups of a row of k values with `group` (0: the whole k). */
DF_API int64_t df_int8_weight_groups(int64_t k, int64_t group);

/* Quantizes w [n, k] (f32, bf16 or f16, dense) into q [n, k] and scale [n, groups]. */
DF_API df_status df_int8_quantize(const void *w, df_dtype type, int64_t n, int64_t k,
                                  int64_t group, int8_t *q, float *scale);

/* Whether int8 compute quantizes the tensor `name` (ndim dimensions) of the component folder
 * `component` ("transformer", "text_encoder_2", "vae", ...): the linear weights of the
 * diffusion transformers and of T5, except the layers kept in higher precision. */
DF_API bool df_int8_quantizes(const char *component, const char *name, int ndim);

/* Writes the model folder `in` to `out` with the weights df_int8_quantizes names stored as
 * 8-bit ("<name>" I8 [n, k] and "<name>_scale" F32 [n, groups], in the int8 kernels' tiles:
 * df_quantize_model_layout's "tiles32") and the scheme recorded in each quantized
 * component's config.json ("quantization_config"); everything else is copied as it is. `group` as above (0: whole k). The folder loads directly: int8 products run
 * on the stored values, which equal what quantizing on load gives. */
DF_API df_status df_quantize_model(const char *in, const char *out, int64_t group);

/* The same with each component's weights in shards of at most `shard_bytes` (<= 0: 2 GiB,
 * DF_ST_SHARD_BYTES), named as the input's files with the diffusers index past one. Writing
 * streams: memory holds about the largest tensor and its 8-bit copy. */
DF_API df_status df_quantize_model_sharded(const char *in, const char *out, int64_t group,
                                           int64_t shard_bytes);

/* The same with the I8 weights in the layout `layout` names (docs/int8.md, "The saved
 * layout and its version"): "tiles32" (NULL: the default), the tiles the int8 kernels
 * read, which the loader uses where they are mapped; "tiles16" or "tiles64", tiles of
 * another width (loaded by repacking them to rows); "rows", row-major (the int8 product packs
 * them on first use). A weight whose shape is not whole tiles is row-major in any layout.
 * DF_E_ARG for another name. */
DF_API df_status df_quantize_model_layout(const char *in, const char *out, int64_t group,
                                          int64_t shard_bytes, const char *layout);

#ifdef __cplusplus
}
#endif
#endif
