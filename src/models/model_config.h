/*
 * Reading model configs (config.json): the checks every model class makes the same way.
 */
#ifndef DF_MODELS_MODEL_CONFIG_H
#define DF_MODELS_MODEL_CONFIG_H

#include <diffuse/json.h>

/* Integer `key` (default `dflt` when absent) that must lie in [min, max]; the message names
 * the file, the key, the value and the range. */
df_status df_config_size(const df_json *cfg, const char *key, int64_t dflt, int64_t min,
                         int64_t max, int64_t *out);
/* When the config names its "_class_name", it must be `cls`: DF_E_FORMAT when it is not a
 * string, DF_E_UNSUPPORTED naming both classes when it is another class. */
df_status df_config_class(const df_json *cfg, const char *cls);
/* The list of names `key`, each of which must be `want` (nothing to check when the key is
 * absent or null): DF_E_FORMAT when it is not a list of strings or, for n >= 0, when it does
 * not have n entries (the count `n_key` gives); DF_E_UNSUPPORTED naming the first other
 * entry. */
df_status df_config_names_all(const df_json *cfg, const char *key, const char *want, int64_t n,
                              const char *n_key);
/* RoPE's "axes_dims_rope": at most `max_axes` positive even sizes of at most `max` that sum
 * to `head_dim` (RoPE covers the whole head); `dflt` (n_dflt sizes) when absent or null.
 * The sizes go to axes[], their count to *n. */
df_status df_config_rope_axes(const df_json *cfg, const int64_t *dflt, int n_dflt, int max_axes,
                              int64_t max, int64_t head_dim, int64_t *axes, int *n);

#endif
