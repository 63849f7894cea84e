/*
 * The configs diffuse ships for the released models it recognises in a single checkpoint
 * file (checkpoint.h), so that `-m FILE` needs no folder of configs: model_index.json, each
 * component's config.json and the scheduler's scheduler_config.json, with the official
 * values (src/models/configs/<model>/, sources in src/models/configs/SOURCES.md). The files
 * are compiled in as bytes (cmake/embed_configs.cmake). Tokenizers are not shipped (they
 * are megabytes): a user gives them with --config DIR.
 *
 * A shipped set is used only for a file whose transformer has the set's sizes (a width and
 * the depth of both block stacks, read from the tensor shapes), never for another size of
 * the same layout (the tiny test models, a pruned fine-tune).
 */
#ifndef DF_MODELS_SHIPPED_H
#define DF_MODELS_SHIPPED_H

#include <stddef.h>
#include <stdint.h>

#include <diffuse/status.h>

#include "models/checkpoint.h"

/* One embedded file: "FLUX.1-schnell/vae/config.json", its text (NUL-terminated) and size. */
typedef struct df_shipped_blob {
    const char *path;
    const unsigned char *text;
    size_t size;
} df_shipped_blob;

/* Written by cmake/embed_configs.cmake, sorted by path. */
extern const df_shipped_blob df_shipped_blobs[];
extern const int df_shipped_blob_count;

/* One shipped config set. */
typedef struct df_shipped_config {
    const char *name;       /* "FLUX.1-schnell": the checkpoint model it serves (checkpoint.h) */
    const char *tokenizers; /* the tokenizer folders the user still gives, in words */
    /* The sizes it describes: `width_key` (a transformer key, no prefix) has shape
     * [width_rows, width_cols]; `last_key` (the last blocks) is there and `past_key` (one
     * block past them) is not. */
    const char *width_key;
    int64_t width_rows, width_cols;
    const char *last_key[2];
    const char *past_key[2];
} df_shipped_config;

/* The shipped sets, in a fixed order. */
int df_shipped_count(void);
const df_shipped_config *df_shipped_at(int i);
/* The set called `name`, or NULL. */
const df_shipped_config *df_shipped_find(const char *name);

/* Why the recognised model `model` has no shipped set, or NULL when it has one. Every model
 * name df_checkpoint_recognise can return is either shipped or listed with its reason. */
const char *df_shipped_missing_reason(const char *model);

/* The set for a file of `keys` recognised as `parts` (checkpoint.h), or NULL with `why`
 * (cap bytes) saying why none applies: no transformer, a model not shipped, other sizes. */
const df_shipped_config *df_shipped_match(const df_checkpoint_key *keys, int n,
                                          const df_checkpoint_parts *parts, char *why, size_t cap);

/* The text of the set's file `path` ("vae/config.json"), or NULL; *size gets its bytes. */
const char *df_shipped_file(const df_shipped_config *c, const char *path, size_t *size);

/* The set's files in order: the i-th relative path, or NULL past the last. */
const char *df_shipped_file_at(const df_shipped_config *c, int i);

/* Writes the set as a diffusers folder skeleton into `dir` (created if missing; its files
 * are overwritten): model_index.json and each component's config, no weights, no
 * tokenizers. DF_E_IO naming the path that could not be written. */
df_status df_shipped_write(const df_shipped_config *c, const char *dir);

/* Writes the set into a new private folder under $TMPDIR (or /tmp) and puts its path in
 * `out` (cap bytes). Remove it with df_shipped_remove. */
df_status df_shipped_write_temp(const df_shipped_config *c, char *out, size_t cap);

/* Removes what df_shipped_write wrote into `dir` and the folders it made, then `dir` itself
 * when it is empty. Never fails: what cannot be removed stays. */
void df_shipped_remove(const df_shipped_config *c, const char *dir);

#endif
