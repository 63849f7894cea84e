/*
 * SentencePiece unigram model, read from spiece.model, as the slow T5Tokenizer (legacy)
 * uses it through sentencepiece's Encode().
 *
 * This module encodes one text segment: normalisation (the model's compiled character map
 * and whitespace rules), Viterbi segmentation, merging of unknown runs or byte fallback.
 * Special tokens, EOS, truncation and padding live in tokenizer.c.
 */
#ifndef DF_TEXT_T5_UNIGRAM_H
#define DF_TEXT_T5_UNIGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "text/str_map.h"
#include "text/text_util.h"

typedef struct df_t5_unigram df_t5_unigram;

/* ModelProto.SentencePiece.Type */
typedef enum df_sp_type {
    DF_SP_NORMAL = 1,
    DF_SP_UNKNOWN = 2,
    DF_SP_CONTROL = 3,
    DF_SP_USER_DEFINED = 4,
    DF_SP_UNUSED = 5,
    DF_SP_BYTE = 6,
} df_sp_type;

/* Parses a serialized ModelProto. `name` (the file) prefixes messages. DF_E_FORMAT for
 * malformed bytes or a model sentencepiece itself would refuse (empty or duplicate pieces,
 * no <unk>, byte pieces without byte_fallback, a broken character map); DF_E_UNSUPPORTED
 * for model types other than unigram. *out is owned by the caller. */
df_status df_t5_unigram_create(const void *data, size_t len, const char *name, df_t5_unigram **out);

/* One piece as a vocabulary lists it: bytes (not NUL-terminated), score, type. */
typedef struct df_sp_piece {
    const char *str;
    size_t len;
    float score;
    int32_t type; /* df_sp_type */
} df_sp_piece;

/* Builds the same model from arrays, as llama.cpp's GGUF metadata holds it (the pieces,
 * the normalizer's precompiled_charsmap, which may be empty, and its two flags; spaces
 * are always escaped, and byte_fallback holds when a piece has type DF_SP_BYTE). The
 * checks and messages are df_t5_unigram_create's; `name` prefixes them. */
df_status df_t5_unigram_create_from_pieces(const df_sp_piece *pieces, size_t n,
                                           const void *charsmap, size_t charsmap_len,
                                           bool add_dummy_prefix, bool remove_extra_ws,
                                           const char *name, df_t5_unigram **out);

/* Reads a spiece.model file. */
df_status df_t5_unigram_load(const char *path, df_t5_unigram **out);

void df_t5_unigram_free(df_t5_unigram *m);

int32_t df_t5_unigram_piece_count(const df_t5_unigram *m);
const char *df_t5_unigram_piece(const df_t5_unigram *m, int64_t id); /* NULL if out of range */
df_sp_type df_t5_unigram_piece_type(const df_t5_unigram *m, int32_t id);
float df_t5_unigram_piece_score(const df_t5_unigram *m, int32_t id);
int32_t df_t5_unigram_unk_id(const df_t5_unigram *m);

/* sentencepiece's PieceToId: control / unknown / byte pieces first, then the others;
 * the unk id when the string is no piece. */
int32_t df_t5_unigram_piece_to_id(const df_t5_unigram *m, const char *piece, size_t len);

/* The normalizer alone, for tests: what sentencepiece makes of the text before
 * segmentation (U+2581 for spaces when the spec escapes them). */
df_status df_t5_unigram_normalize(const df_t5_unigram *m, const char *text, size_t len,
                                  df_byte_buf *out);

/* Appends the ids of one segment of checked UTF-8 text (no special-token splitting, no
 * EOS). Each piece string is looked up in `added` (may be NULL) first, as transformers'
 * convert_tokens_to_ids does. */
df_status df_t5_unigram_encode(const df_t5_unigram *m, const char *text, size_t len,
                               const df_str_map *added, df_i64_vec *out);

#endif
