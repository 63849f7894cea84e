/*
 * The components of a tokenizer.json tokenizer, shared by tokenizer_json.c (the file, the
 * added tokens, the post-processor, truncation and padding), tokenizer_json_pre.c (the
 * normalizers and pre-tokenizers) and tokenizer_json_bpe.c (the BPE model). Not used
 * elsewhere.
 */
#ifndef DF_TEXT_TOKENIZER_JSON_IMPL_H
#define DF_TEXT_TOKENIZER_JSON_IMPL_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "text/str_map.h"
#include "text/text_util.h"

/* True when v is a JSON integer in [0, limit); the range is checked before any conversion. */
static inline bool tj_json_id(const cJSON *v, double limit, int32_t *out)
{
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0 && v->valuedouble < limit) ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
        return false;
    *out = (int32_t)v->valuedouble;
    return true;
}

/* ---- pieces: a text cut into byte ranges ------------------------------------------------ */

typedef struct tj_span {
    size_t begin, end;
} tj_span;

/* Pieces of `text`: each span is a range of text.data. */
typedef struct tj_pieces {
    df_byte_buf text;
    tj_span *spans;
    size_t n, cap;
} tj_pieces;

bool tj_pieces_push(tj_pieces *p, size_t begin, size_t end); /* false when out of memory */
void tj_pieces_free(tj_pieces *p);

/* ---- normalizers ------------------------------------------------------------------------- */

enum { TJ_MAX_STEPS = 16 }; /* components in one Sequence, nesting flattened */

typedef enum tj_norm_kind { TJ_NFC, TJ_NFD, TJ_NFKC, TJ_NFKD } tj_norm_kind;

typedef struct tj_normalizer {
    tj_norm_kind steps[TJ_MAX_STEPS];
    int n; /* 0 = none */
} tj_normalizer;

/* Reads the "normalizer" value (null, one normalizer or a Sequence). `file` names the file
 * in messages. */
df_status tj_normalizer_parse(tj_normalizer *n, const cJSON *v, const char *file);

/* Replaces out with the normalized form of text[0..len) (checked UTF-8). */
df_status tj_normalize(const tj_normalizer *n, const char *text, size_t len, df_byte_buf *out);

/* ---- pre-tokenizers ---------------------------------------------------------------------- */

typedef enum tj_split_behavior {
    TJ_REMOVED,
    TJ_ISOLATED,
    TJ_MERGED_WITH_PREVIOUS,
    TJ_MERGED_WITH_NEXT,
    TJ_CONTIGUOUS,
} tj_split_behavior;

typedef struct tj_pre_step {
    bool byte_level;  /* ByteLevel; otherwise Split */
    void *regex;      /* pcre2_code (Split with a Regex pattern, ByteLevel with use_regex) */
    char *literal;    /* Split with a String pattern */
    size_t literal_len;
    tj_split_behavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
} tj_pre_step;

typedef struct tj_pretok {
    tj_pre_step steps[TJ_MAX_STEPS];
    int n; /* 0 = none: the whole text is one piece */
} tj_pretok;

df_status tj_pretok_parse(tj_pretok *p, const cJSON *v, const char *file);
void tj_pretok_free(tj_pretok *p);

/* Cuts text[0..len) (checked UTF-8) into the pieces the model sees; *out is replaced. */
df_status tj_pretokenize(const tj_pretok *p, const char *text, size_t len, tj_pieces *out);

/* GPT-2's bytes_to_unicode(): the printable code point that stands for byte b. */
int32_t tj_byte_to_cp(uint8_t b);

/* ---- the BPE model ------------------------------------------------------------------------ */

typedef struct tj_bpe {
    df_str_map vocab;     /* token -> id */
    char **id_to_token;   /* [id_limit]; NULL where no vocabulary token has the id */
    int64_t id_limit;     /* largest vocabulary id + 1 */
    df_str_map merges;    /* 8-byte key (left id, right id) -> rank */
    int32_t *merge_new;   /* [nmerges]: the id a merge of that rank makes */
    int64_t nmerges;
    int32_t unk_id;       /* -1 = none */
    bool fuse_unk, byte_fallback, ignore_merges;
} tj_bpe;

/* Reads the "model" object. */
df_status tj_bpe_parse(tj_bpe *m, const cJSON *model, const char *file);
void tj_bpe_free(tj_bpe *m);

bool tj_bpe_token_id(const tj_bpe *m, const char *s, size_t len, int32_t *id);

/* Scratch space of tj_bpe_encode, reused from piece to piece; zero-initialise it. */
typedef struct tj_bpe_work {
    struct tj_symbol *sym;
    size_t n, cap;
    struct tj_candidate *heap;
    size_t nheap, heap_cap;
} tj_bpe_work;

void tj_bpe_work_free(tj_bpe_work *w);

/* Appends the ids of one pre-tokenized piece. */
df_status tj_bpe_encode(const tj_bpe *m, const char *piece, size_t len, tj_bpe_work *w,
                        df_i64_vec *out);

#endif
