/*
 * The decoder-only core behind mistral.c and qwen3.c (decoder_lm.c): each class file
 * describes how its config.json reads and where its language model's tensors live in the
 * checkpoint; the core loads, shards and runs it.
 */
#ifndef DF_MODELS_DECODER_LM_H
#define DF_MODELS_DECODER_LM_H

#include <diffuse/decoder_lm.h>
#include <diffuse/json.h>

#include "models/loader.h"

typedef struct df_decoder_lm_class {
    const char *name; /* "Mistral", "Qwen3": for messages */
    /* Fills c (and *sliding_window, 0 for none) from config.json's root. */
    df_status (*read_config)(const df_json *root, df_decoder_lm_config *c, int64_t *sliding_window);
    /* Candidate prefixes of the language model's tensors ("model.language_model."), NULL
     * terminated: the first under which `<prefix>embed_tokens.weight` exists is used. */
    const char *const *prefixes;
    /* Prefixes of tensors the text encoder does not use (vision tower, lm_head), NULL
     * terminated: they are marked used without being bound or read. */
    const char *const *skipped;
} df_decoder_lm_class;

/* Loads `dir` as a model of class `cls` (see df_mistral_load for the errors). */
df_status df_decoder_lm_load(df_ctx *ctx, const char *dir, const df_decoder_lm_class *cls,
                             df_decoder_lm **out);
/* The same with the weights from the single file `file` (NULL: the folder's): transformers'
 * names under whatever precedes df_names_lm_probe()'s layer name there (see
 * df_mistral_load_file). */
df_status df_decoder_lm_load_file(df_ctx *ctx, const char *dir, const char *file,
                                  const df_decoder_lm_class *cls, df_decoder_lm **out);

/*
 * The keys both classes share, from `j` (the root, or Mistral3's text_config): sizes,
 * rms_norm_eps, rope_theta (top level, else rope_parameters.rope_theta, else
 * `default_theta`), a rope_scaling / rope_parameters type other than "default" is
 * DF_E_UNSUPPORTED, as is a hidden_act other than "silu". head_dim absent or null is
 * `default_head_dim`, or hidden_size / num_attention_heads when that is 0.
 */
df_status df_decoder_lm_read_common(const df_json *j, double default_theta,
                                    int64_t default_head_dim, double default_eps,
                                    df_decoder_lm_config *c);

#endif
