/*
 * Config checks shared by the text encoders (clip.c, t5.c): sizes read from config.json
 * must be positive and below bounds no real model comes near, so that nothing is sized
 * from an impossible value. Messages name the file and the key.
 */
#ifndef DF_MODELS_TEXT_CONFIG_H
#define DF_MODELS_TEXT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include <diffuse/json.h>

#define DF_TEXT_MAX_WIDTH     (INT64_C(1) << 20) /* hidden sizes, heads, FFN widths */
#define DF_TEXT_MAX_LAYERS    INT64_C(1024)
#define DF_TEXT_MAX_POSITIONS (INT64_C(1) << 20)
#define DF_TEXT_MAX_VOCAB     (INT64_C(1) << 26)

/* Integer `key` of `cfg` in [1, max]. dflt < 0: the key is required; otherwise its value
 * when the key is absent or null. DF_E_FORMAT naming the file and the key. */
df_status df_text_config_int(const df_json *cfg, const char *key, int64_t dflt, int64_t max,
                             int64_t *out);

/* A normalisation epsilon: a number in [0, 1), dflt when absent or null. */
df_status df_text_config_eps(const df_json *cfg, const char *key, double dflt, double *out);

/* The class a transformers config names ("architectures"[0], or "_class_name" where a file
 * has one) must be one of `classes` (n of them): DF_E_UNSUPPORTED naming the file, the key and
 * the class otherwise, DF_E_FORMAT when the key is not a list of strings / a string. */
df_status df_text_config_class(const df_json *cfg, const char *const *classes, int n);

/* The last part of the folder path `dir` ("a/text_encoder_2/" -> "text_encoder_2"), which
 * names the component in messages; `fallback` when there is none. */
void df_text_component_name(const char *dir, const char *fallback, char *buf, size_t cap);

#endif
