/*
 * One component's weights in a single file that is not a diffusers folder: a safetensors
 * file (BFL's original names, ComfyUI's prefixed all-in-one files, fp8) or a GGUF file
 * (city96's quantisations), read through a model's name map (names.h).
 *
 * The layout is recognised from the keys: when a name ending in the map's probe is found,
 * whatever precedes it is the prefix ("model.diffusion_model." in ComfyUI's files) and
 * every name is mapped; otherwise the names are taken to be diffusers' own. Binding checks
 * the shape the model asks for against the rows the map selects, then wraps the file's
 * bytes when they can be used as they are (f32, bf16 or f16, one block of rows) and
 * otherwise reads them into memory: several blocks of rows, fp8 (upcast), and GGUF's
 * quantised types (dequantised block by block into the compute dtype: f32 when the context
 * computes in f32, else bf16).
 */
#ifndef DF_MODELS_SINGLE_FILE_H
#define DF_MODELS_SINGLE_FILE_H

#include <stdbool.h>
#include <stddef.h>

#include <diffuse/runtime.h>

#include "models/names.h"

typedef struct df_single_file df_single_file;

/* Opens `path` (.gguf, else safetensors) for `component` (named in messages) with `map`
 * (given `arg`) and its `probe` name. DF_E_IO, DF_E_FORMAT (from the readers), DF_E_OOM. */
df_status df_single_file_open(const char *path, const char *component, df_name_map map, int arg,
                              const char *probe, df_single_file **out);
/* When no map was taken yet and a name ends in `probe`, takes `map` (and that prefix, one
 * holding `hint` when there is such: "clip_g" in an all-in-one file with two CLIPs):
 * true. For a model whose files come in more than one layout. */
bool df_single_file_try_map(df_single_file *sf, df_name_map map, int arg, const char *probe,
                            const char *hint);
void df_single_file_free(df_single_file *sf);

const char *df_single_file_path(const df_single_file *sf);
/* The prefix found before the probe ("" when none), and whether the names are mapped. */
const char *df_single_file_prefix(const df_single_file *sf);
bool df_single_file_mapped(const df_single_file *sf);

/* Whether diffusers tensor `name` can be found. */
bool df_single_file_has(const df_single_file *sf, const char *name);

/*
 * Makes diffusers tensor `name` (ndim dims of `shape`, -1 = any) in ctx. *data is the
 * wrapped bytes of the file (NULL when the tensor was read into memory) and *bytes its size.
 * DF_E_FORMAT for a missing or mis-shaped tensor (naming the diffusers and the file's name),
 * DF_E_UNSUPPORTED for a dtype that cannot be a weight, DF_E_OOM.
 */
df_status df_single_file_bind(df_single_file *sf, df_ctx *ctx, const char *name, int ndim,
                              const int64_t *shape, df_tensor **out, const void **data,
                              size_t *bytes);

/* Tensors of the file, and the name of tensor i when nothing bound it and it lies under
 * the prefix (else NULL: in an all-in-one file the other components' tensors are not
 * this one's). */
int64_t df_single_file_count(const df_single_file *sf);
const char *df_single_file_unused(const df_single_file *sf, int64_t i);
/* Marks the file's tensors named prefix + `prefix` (in the file's names) as not wanted. */
void df_single_file_ignore_prefix(df_single_file *sf, const char *prefix);

#endif
