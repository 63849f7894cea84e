/*
 * Hugging Face tokenizer.json (the "fast" tokenizers' file), with tokenizer_config.json beside
 * it, encoded as transformers' PreTrainedTokenizerFast calls the Rust tokenizers library.
 *
 * Covered: normalizers NFC / NFD / NFKC / NFKD and Sequence; pre-tokenizers Split (regex or
 * string, every split behaviour, invert), ByteLevel and Sequence; model BPE (byte-level,
 * with or without ignore_merges, unk_token, fuse_unk, byte_fallback); post-processors
 * TemplateProcessing (single sequences), ByteLevel and Sequence; added tokens with their
 * lstrip / rstrip / normalized flags. Anything else is DF_E_UNSUPPORTED naming the component
 * and the file. The decoder is never used (we do not decode ids) and is not read. The
 * file's own "truncation" and "padding" are ignored, as transformers resets them on every
 * call; truncation and padding come from the call, with the sides of tokenizer_config.json
 * (see tokenizer_json.c).
 *
 * The pipelines reach this through the public df_tokenizer API (tokenizer.c dispatches a
 * folder with only tokenizer.json here) and df_tokenizer_encode_prompt (chat_template.c).
 */
#ifndef DF_TEXT_TOKENIZER_JSON_H
#define DF_TEXT_TOKENIZER_JSON_H

#include <diffuse/tokenizer.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef struct df_tok_json df_tok_json;

typedef struct df_tok_json_info {
    int64_t vocab_size; /* largest id + 1 over the vocabulary and the added tokens */
    int64_t bos_id, eos_id, pad_id, unk_id; /* -1 when the config names none */
    int64_t model_max_length;               /* 0 = no limit given */
    int64_t num_special;  /* ids the post-processor adds around a single sequence */
    bool padding_left;    /* padding_side "left" */
    bool truncation_left; /* truncation_side "left" */
} df_tok_json_info;

/*
 * Builds a tokenizer from the text of tokenizer.json and, when config is not NULL, of
 * tokenizer_config.json. `name` (usually the folder) names the files in messages. On success
 * *out is owned by the caller (df_tok_json_free). DF_E_FORMAT for malformed JSON or an
 * inconsistent file (duplicate or out-of-range ids, merges of unknown tokens, special tokens
 * the files do not define), naming the file and the key; DF_E_UNSUPPORTED for a component
 * this reader does not implement, naming it; DF_E_OOM.
 */
df_status df_tok_json_create(const char *json, size_t json_len, const char *config,
                             size_t config_len, const char *name, df_tok_json **out);

/* Reads dir/tokenizer.json and, when present, dir/tokenizer_config.json. DF_E_IO when
 * tokenizer.json cannot be read. */
df_status df_tok_json_load(const char *dir, df_tok_json **out);

/*
 * Encodes `len` bytes of UTF-8 text as tokenizer(text, add_special_tokens=..., padding=...,
 * truncation=..., max_length=...) does. opts may be NULL. Padding and truncation follow the
 * tokenizer's sides; the attention mask is 0 on padding. Errors as df_tokenizer_encode.
 */
df_status df_tok_json_encode(const df_tok_json *t, const char *text, size_t len,
                             const df_tokenize_opts *opts, bool add_special_tokens,
                             df_tokens *out);

void df_tok_json_get_info(const df_tok_json *t, df_tok_json_info *out);

/* The token string of `id` (byte-level spelling, "Ġcat"), borrowed; NULL for no token. */
const char *df_tok_json_id_to_piece(const df_tok_json *t, int64_t id);

/* NULL is fine. */
void df_tok_json_free(df_tok_json *t);

/* The tokenizer.json model behind a public tokenizer, or NULL when it is another kind
 * (defined in tokenizer.c). */
const df_tok_json *df_tokenizer_json_model(const df_tokenizer *tok);

#endif
