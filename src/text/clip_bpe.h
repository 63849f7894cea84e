/*
 * CLIP byte-level BPE, as transformers' slow CLIPTokenizer behaves when ftfy is not
 * installed (the text clean-up then comes from BERT's BasicTokenizer).
 *
 * This module encodes one text segment: the special-token splitting, BOS/EOS, truncation
 * and padding live in tokenizer.c, shared with the T5 tokenizer.
 */
#ifndef DF_TEXT_CLIP_BPE_H
#define DF_TEXT_CLIP_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "text/str_map.h"
#include "text/text_util.h"

typedef struct df_clip_bpe df_clip_bpe;

/* CLIPTokenizer reads at most this many merges (49152 - 256 - 2). */
#define DF_CLIP_MAX_MERGES 48894

/* Builds the model from the contents of vocab.json (a JSON object token -> id) and
 * merges.txt (a header line, then "left right" per line). `name` prefixes messages.
 * DF_E_FORMAT when either is malformed. *out is owned by the caller. */
df_status df_clip_bpe_create(const char *vocab_json, size_t vocab_len, const char *merges,
                             size_t merges_len, const char *name, df_clip_bpe **out);

/* Reads dir/vocab.json and dir/merges.txt. */
df_status df_clip_bpe_load(const char *dir, df_clip_bpe **out);

void df_clip_bpe_free(df_clip_bpe *m);

/* vocab.json lookup. */
bool df_clip_bpe_token_id(const df_clip_bpe *m, const char *tok, size_t len, int32_t *id);

/* The vocab.json token of `id` (a byte-level string such as "photo</w>"), or NULL. */
const char *df_clip_bpe_id_to_token(const df_clip_bpe *m, int64_t id);

/* Number of vocab.json entries, and the largest id + 1 (the same: ids are 0 .. count - 1). */
int64_t df_clip_bpe_vocab_count(const df_clip_bpe *m);
int64_t df_clip_bpe_id_limit(const df_clip_bpe *m);

/* Appends the ids of one segment of checked UTF-8 text (no special-token splitting, no
 * BOS/EOS). Token strings are looked up in `added` (may be NULL) first, then in the vocab;
 * a token in neither becomes unk_id (DF_E_FORMAT when unk_id < 0). */
df_status df_clip_bpe_encode(const df_clip_bpe *m, const char *text, size_t len,
                             const df_str_map *added, int64_t unk_id, df_i64_vec *out);

/* The clean-up alone, for tests: what BasicTokenizer.tokenize() makes of the text, the words
 * joined by single spaces (control characters removed, whitespace collapsed, CJK ideographs
 * split off, NFC, Python lower-casing). */
df_status df_clip_bpe_normalize(const char *text, size_t len, df_byte_buf *out);

/* GPT-2's bytes_to_unicode(): the printable code point that stands for byte b. */
int32_t df_clip_byte_to_cp(uint8_t b);

#endif
