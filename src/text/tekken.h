/*
 * Mistral's tekken.json (mistral-common's tiktoken-style byte-level BPE: ranked token bytes,
 * special tokens first), read as transformers 5 reads it (integrations/mistral/tokenizer.py,
 * MistralConverter): the file becomes the tokenizer.json the conversion builds, with the
 * settings of FLUX.2-dev's tokenizer folder (LlamaTokenizerFast over a byte-level
 * tokenizer.json: bos <s>, eos </s>, pad <pad>, unk <unk>, left padding, "<s> A").
 *
 * ComfyUI's Mistral 3 text encoder files for FLUX.2 carry the file's bytes as a uint8 tensor
 * named tekken_model; df_tokenizer_load_tekken reads it from there.
 */
#ifndef DF_TEXT_TEKKEN_H
#define DF_TEXT_TEKKEN_H

#include <stddef.h>

#include "core/status.h"
#include "text/tokenizer_json.h"

/* Largest tekken.json read (Mistral's own are about 15-20 MB). */
#define DF_TEKKEN_MAX_BYTES ((size_t)64 << 20)

/*
 * Builds a tokenizer from `len` bytes of tekken.json. `name` names the source in messages.
 * DF_E_FORMAT for text that is not a tekken.json (not JSON, a missing or mistyped key, bad
 * base64, duplicate or empty tokens, special-token ranks that are not 0..n-1, a vocabulary
 * too large for its own default_vocab_size), naming the key; DF_E_UNSUPPORTED for the old
 * layout without "special_tokens" (transformers needs mistral-common for it); DF_E_OOM.
 */
df_status df_tekken_create(const char *text, size_t len, const char *name, df_tok_json **out);

#endif
