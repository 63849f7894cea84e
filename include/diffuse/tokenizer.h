/*
 * Tokenizers: prompt text to the token ids the text encoders take.
 *
 * A tokenizer is loaded from a diffusers tokenizer folder and behaves as the transformers
 * class the pipelines use:
 *   - CLIP byte-level BPE (vocab.json + merges.txt): the slow CLIPTokenizer without ftfy.
 *     Ids are <|startoftext|> text... <|endoftext|>; padding uses the folder's pad token
 *     (CLIP-L: <|endoftext|>, SD3's CLIP-G tokenizer_2: "!").
 *   - T5 SentencePiece unigram (spiece.model): the slow T5Tokenizer with legacy=True.
 *     Ids are text... </s>; padding uses <pad> (id 0).
 *   - tokenizer.json (a "fast" tokenizer; FLUX.2's Mistral and Qwen3 tokenizers): byte-level
 *     BPE as transformers' PreTrainedTokenizerFast runs it, with tokenizer_config.json's
 *     special tokens and padding side (left for LlamaTokenizerFast). Read only when the
 *     folder has neither of the files above.
 * For CLIP and T5, tokenizer_config.json, special_tokens_map.json and added_tokens.json name
 * the special tokens and the added tokens (e.g. T5's <extra_id_N>); added-token strings in
 * the text are matched before anything else (leftmost, longest first) and map straight to
 * their ids.
 *
 * Text is UTF-8 with an explicit length (it may contain NUL characters). Invalid UTF-8 is an
 * error (DF_E_ARG naming the byte offset), never silently replaced. Empty text gives just
 * the special tokens. A tokenizer is immutable after loading: one may encode from several
 * threads at once.
 */
#ifndef DIFFUSE_TOKENIZER_H
#define DIFFUSE_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_tokenizer df_tokenizer;

typedef enum df_tokenizer_type {
    DF_TOKENIZER_CLIP_BPE = 1,   /* vocab.json + merges.txt */
    DF_TOKENIZER_T5_UNIGRAM = 2, /* spiece.model */
    DF_TOKENIZER_BPE_JSON = 3,   /* tokenizer.json with a byte-level BPE model */
} df_tokenizer_type;

/* The largest max_length df_tokenizer_encode accepts (2^30). */
#define DF_TOKENIZE_MAX_LENGTH ((int64_t)1 << 30)

/* Options for df_tokenizer_encode; zero fields mean the default. */
typedef struct df_tokenize_opts {
    int64_t max_length; /* 0 = the folder's model_max_length (CLIP 77; T5 as configured) */
    bool pad;           /* pad with the pad token up to max_length */
    bool truncate;      /* keep at most max_length ids, the closing special token included */
} df_tokenize_opts;

/* One encoded text. Fill with df_tokenizer_encode, release with df_tokens_deinit. */
typedef struct df_tokens {
    int64_t *ids;            /* [count] */
    int64_t *attention_mask; /* [count]: 1 for a token, 0 for padding */
    int64_t count;
} df_tokens;

typedef struct df_tokenizer_info {
    df_tokenizer_type type;
    int64_t vocab_size; /* base vocabulary plus added tokens (largest id + 1) */
    int64_t bos_id;     /* -1 when the tokenizer adds none (T5) */
    int64_t eos_id;
    int64_t pad_id;
    int64_t unk_id;
    int64_t model_max_length; /* from tokenizer_config.json; CLIP defaults to 77 */
    bool padding_left;        /* padding goes before the ids (padding_side "left") */
} df_tokenizer_info;

/*
 * Loads the tokenizer in `dir` (e.g. "<model>/tokenizer"). A folder with vocab.json and
 * merges.txt is CLIP BPE; one with spiece.model is T5 unigram; one with only tokenizer.json
 * is read as that file says. On success *out is owned by the caller; free it with
 * df_tokenizer_free(). Fails with DF_E_IO when the files cannot be read, DF_E_FORMAT when
 * one is malformed, DF_E_UNSUPPORTED for a sentencepiece model that is not unigram or a
 * tokenizer.json component diffuse does not implement (the message names it).
 */
DF_API df_status df_tokenizer_load(const char *dir, df_tokenizer **out);

/*
 * Loads the T5 tokenizer a GGUF carries as llama.cpp's metadata (tokenizer.ggml.model "t5":
 * tokens, scores, token_type, precompiled_charsmap, add_space_prefix,
 * remove_extra_whitespaces, eos/padding/unknown_token_id), as city96's T5 encoder GGUFs
 * hold it. It behaves as the T5Tokenizer of the folder the file was converted from: control
 * and unknown pieces and user-defined ones are added tokens, and when no piece is
 * <extra_id_0> the first 100 [PADn] rows are the extra ids (the last one <extra_id_0>).
 * model_max_length is the file's <architecture>.context_length. Fails with DF_E_FORMAT
 * naming the file and key for malformed metadata (a missing or mistyped key, arrays whose
 * lengths disagree, a type or token id out of range, what df_tokenizer_load refuses in a
 * spiece.model), DF_E_UNSUPPORTED for another tokenizer.ggml.model.
 */
DF_API df_status df_tokenizer_load_gguf(const char *path, df_tokenizer **out);

/* The same from an open GGUF, which may be freed afterwards. */
DF_API df_status df_tokenizer_from_gguf(const df_gguf *g, df_tokenizer **out);

/*
 * Loads the Mistral tokenizer a safetensors file carries as ComfyUI's FLUX.2 Mistral 3 files
 * do: Mistral's tekken.json, as the bytes of a 1-D uint8 tensor named "tekken_model" (or
 * "<prefix>.tekken_model"). It behaves as FLUX.2-dev's tokenizer folder (transformers'
 * conversion of tekken.json, left padding). DF_E_IO when the file has no such tensor (or is
 * not a safetensors file); DF_E_FORMAT when the tensor is not 1-D U8, is larger than 64 MiB
 * or is not a tekken.json (the message names the file, the tensor and the key);
 * DF_E_UNSUPPORTED for tekken.json's old layout without "special_tokens".
 */
DF_API df_status df_tokenizer_load_tekken(const char *path, df_tokenizer **out);

/* Whether `path` is a safetensors file holding a tensor df_tokenizer_load_tekken reads. */
DF_API bool df_tokenizer_file_has_tekken(const char *path);

/* Which kind of tokenizer this is. */
DF_API df_tokenizer_type df_tokenizer_kind(const df_tokenizer *tok);

/* "clip-bpe", "t5-unigram" or "bpe-json". */
DF_API const char *df_tokenizer_type_name(df_tokenizer_type type);

/* Special ids and sizes; *out is filled in. */
DF_API void df_tokenizer_get_info(const df_tokenizer *tok, df_tokenizer_info *out);

/*
 * Encodes `len` bytes of UTF-8 `text` (text may be NULL when len is 0) into *out, which the
 * caller releases with df_tokens_deinit(). opts may be NULL (no truncation, no padding).
 * Without truncation the result may be longer than max_length; with truncation the text's
 * ids are cut so that the result, special tokens included, has max_length ids (as
 * transformers' truncation=True). Fails with DF_E_ARG for invalid UTF-8 (the message gives
 * the byte offset), a max_length outside [0, DF_TOKENIZE_MAX_LENGTH], truncation to a
 * max_length too small to hold the special tokens, or padding without a pad token;
 * DF_E_OOM when memory runs out. *out is zeroed on failure.
 */
DF_API df_status df_tokenizer_encode(const df_tokenizer *tok, const char *text, size_t len,
                                     const df_tokenize_opts *opts, df_tokens *out);

/*
 * How a pipeline formats a prompt before tokenizing it:
 *  - DF_PROMPT_FLUX2_MISTRAL (Flux2Pipeline, FLUX.2 [dev]): the Mistral-Small-3 chat template
 *    over a system message and the prompt with every "[IMG]" removed:
 *    "<s>[SYSTEM_PROMPT]" system "[/SYSTEM_PROMPT][INST]" prompt "[/INST]", tokenized
 *    without adding special tokens (the text carries its <s>).
 *  - DF_PROMPT_FLUX2_QWEN3 (Flux2KleinPipeline): Qwen3's chat template over one user
 *    message with the generation prompt and thinking disabled:
 *    "<|im_start|>user\n" prompt "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n".
 */
typedef enum df_prompt_format {
    DF_PROMPT_FLUX2_MISTRAL = 1,
    DF_PROMPT_FLUX2_QWEN3 = 2,
} df_prompt_format;

/* FLUX.2 [dev]'s system message (diffusers' system_messages.py SYSTEM_MESSAGE). */
DF_API const char *df_prompt_flux2_system_message(void);

/*
 * Renders `len` bytes of UTF-8 prompt as the pipeline's chat template does. system_message
 * is used by DF_PROMPT_FLUX2_MISTRAL only; NULL means df_prompt_flux2_system_message().
 * On success *out_text (NUL-terminated, *out_len bytes) is owned by the caller: free it with
 * df_prompt_text_free(). DF_E_ARG for invalid UTF-8 or an unknown format; DF_E_OOM.
 */
DF_API df_status df_prompt_render(df_prompt_format format, const char *prompt, size_t len,
                                  const char *system_message, char **out_text, size_t *out_len);
DF_API void df_prompt_text_free(char *text);

/*
 * The ids and mask a FLUX.2 pipeline feeds its text encoder: the rendered prompt (see
 * df_prompt_render) tokenized with padding="max_length", truncation=True and max_length
 * (opts->max_length; 0 = 512, the pipelines' max_sequence_length), on the tokenizer's
 * padding side. opts->pad and opts->truncate are ignored (both on). Needs a tokenizer.json
 * tokenizer (DF_E_UNSUPPORTED otherwise). Errors as df_tokenizer_encode.
 */
DF_API df_status df_tokenizer_encode_prompt(const df_tokenizer *tok, df_prompt_format format,
                                            const char *prompt, size_t len,
                                            const char *system_message,
                                            const df_tokenize_opts *opts, df_tokens *out);

/* Releases the arrays of *t and zeroes it. Safe on a zeroed struct. */
DF_API void df_tokens_deinit(df_tokens *t);

/* The token string of `id` (the vocabulary's own spelling: "photo</w>", "▁photo",
 * "<extra_id_0>"), borrowed from the tokenizer; NULL when no token has that id. */
DF_API const char *df_tokenizer_id_to_piece(const df_tokenizer *tok, int64_t id);

/* NULL is fine. */
DF_API void df_tokenizer_free(df_tokenizer *tok);

#ifdef __cplusplus
}
#endif
#endif
