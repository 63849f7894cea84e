/*
 * The diffusers folder layout.
 *
 * A pipeline folder holds model_index.json, which maps each component name ("transformer",
 * "vae", "text_encoder_2", ...) to [library, class] - [null, null] for a component left out
 * - and one folder per component holding config.json (scheduler_config.json for
 * schedulers) and its weights: diffusion_pytorch_model.safetensors (diffusers),
 * model.safetensors (transformers), or a sharded *.safetensors.index.json of either name.
 * Component names come from a file, so they must be plain names inside the pipeline folder.
 *
 * Model code registers a checker per class (df_model_check_register) that validates a
 * component folder's weights against its config; `diffuse inspect` calls it for every
 * component of a known class.
 */
#ifndef DIFFUSE_LAYOUT_H
#define DIFFUSE_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"
#include "status.h"
#include "weights.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Buffer size that holds any path these functions write. */
#define DF_PATH_MAX 4096

/* ---- model_index.json ------------------------------------------------------------- */

typedef struct df_model_index df_model_index;

typedef struct df_component {
    const char *name;    /* "transformer" */
    const char *library; /* "diffusers", "transformers"; NULL for [null, null] */
    const char *cls;     /* "FluxTransformer2DModel"; NULL for [null, null] */
} df_component;

/*
 * Reads `dir`/model_index.json. On success *out is owned by the caller (free with
 * df_model_index_free). Members whose value is an array are components and must be
 * [library, class] pairs of strings or nulls; other members ("_class_name",
 * "requires_safety_checker", ...) are settings and are kept in the JSON only. Fails with
 * DF_E_IO when the file cannot be read, DF_E_FORMAT when it is malformed, its root is not an
 * object, or a component name or class is not a Python identifier (a name becomes a folder
 * name, so "../x" is refused).
 */
DF_API df_status df_model_index_load(const char *dir, df_model_index **out);

/* Same from a parsed document (which must outlive the index). */
DF_API df_status df_model_index_from_json(const df_json *root, df_model_index **out);

/* The whole document, "_class_name" (NULL when absent) and the components in file order. */
DF_API const df_json *df_model_index_json(const df_model_index *idx);
DF_API const char *df_model_index_class(const df_model_index *idx);
DF_API int df_model_index_count(const df_model_index *idx);
DF_API const df_component *df_model_index_at(const df_model_index *idx, int i);
/* The component called `name`, or NULL. */
DF_API const df_component *df_model_index_find(const df_model_index *idx, const char *name);

DF_API void df_model_index_free(df_model_index *idx);

/* ---- component folders ------------------------------------------------------------ */

/*
 * Writes `root`/`component` into buf (cap bytes). DF_E_FORMAT when `component` is not a
 * plain name (empty, '/', '.', '..'), DF_E_IO when the folder does not exist, DF_E_ARG
 * when the path does not fit in cap.
 */
DF_API df_status df_layout_component_dir(const char *root, const char *component, char *buf,
                                         size_t cap);

/*
 * Finds the weights of the component folder `dir` and writes their path into buf:
 * diffusion_pytorch_model.safetensors, model.safetensors, then the .index.json form of
 * each. DF_E_IO when there is none (DF_E_UNSUPPORTED when only PyTorch .bin files are
 * there), DF_E_ARG when the path does not fit.
 */
DF_API df_status df_layout_find_weights(const char *dir, char *buf, size_t cap);

/* Parses `dir`/`file` (a plain file name such as "config.json"); as df_json_parse_file,
 * and DF_E_FORMAT naming the file when its root is not a JSON object (every JSON file of a
 * diffusers folder is one). */
DF_API df_status df_layout_open_json(const char *dir, const char *file, df_json **out);

/* df_layout_open_json(dir, "config.json", out). */
DF_API df_status df_layout_open_config(const char *dir, df_json **out);

/* ---- model checks ----------------------------------------------------------------- */

/*
 * Validates a component folder of one class: every weight present with the shape and dtype
 * the config implies. Returns DF_OK or a failure whose message names the file and tensor.
 */
typedef df_status (*df_model_check_fn)(const char *dir, const df_json *config,
                                       const df_weights *weights);

/* Registers (or replaces) the checker of class `cls` (e.g. "FluxTransformer2DModel").
 * DF_E_ARG for NULL arguments, DF_E_OOM when the registry (64 classes) is full. */
DF_API df_status df_model_check_register(const char *cls, df_model_check_fn fn);

/* The checker of class `cls`, or NULL when none is registered. */
DF_API df_model_check_fn df_model_check_find(const char *cls);

/* The registered classes as "A, B, C" in buf (cap bytes, cut short if it must); returns buf. */
DF_API const char *df_model_check_classes(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
