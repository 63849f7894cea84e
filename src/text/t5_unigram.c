/*
 * SentencePiece unigram tokenizer read from spiece.model (see t5_unigram.h).
 *
 * The file is a serialized ModelProto, parsed with our own wire-format reader
 * (text/protobuf.c): pieces (string, score, type), trainer_spec (model type, byte_fallback,
 * treat_whitespace_as_suffix) and normalizer_spec (name, precompiled_charsmap,
 * add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces).
 *
 * Normalisation follows sentencepiece's Normalizer exactly rather than re-deriving NFKC:
 * the model carries its rules compiled as precompiled_charsmap (for nmt_nfkc: NFKC plus the
 * NMT clean-ups), a darts-clone double-array trie over UTF-8 byte strings whose values point
 * into a table of NUL-terminated replacements. At each position the longest rule wins
 * (user-defined pieces first, copied unchanged); text no rule covers is copied one character
 * at a time. A model with an empty charsmap is not normalised, as in sentencepiece. Then
 * leading, trailing and repeated spaces are dropped (remove_extra_whitespaces), a space is
 * prepended (add_dummy_prefix) and spaces become U+2581 (escape_whitespaces).
 *
 * Segmentation is sentencepiece's optimised Viterbi: at each character start every piece
 * that matches is a candidate (scored by its log-probability; user-defined pieces get
 * length * max_score - 0.1 so they always win); when no single-character piece covers the
 * character an <unk> node of score min_score - 10 does. The arithmetic mirrors the
 * reference's float/double mix so ties break the same way. Consecutive unknown characters
 * are merged into one piece (one <unk> id) unless the model has byte pieces
 * (byte_fallback), in which case each unknown character becomes its UTF-8 bytes' <0xXX>
 * pieces. Piece strings map to ids through PieceToId, as transformers converts them.
 */
#include "text/t5_unigram.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "text/protobuf.h"

#define SPACE_SYMBOL     "\xE2\x96\x81" /* U+2581 */
#define MAX_TRIE_RESULTS 32             /* sentencepiece's kMaxTrieResultsSize */

struct df_t5_unigram {
    char *name;
    int32_t npieces;
    uint32_t *piece_off; /* into arena */
    uint32_t *piece_len;
    float *score;
    uint8_t *type;
    df_byte_buf arena;     /* piece strings, NUL-terminated */
    df_str_map pieces;     /* normal, user-defined, unused -> id */
    df_str_map reserved;   /* control, unknown, byte -> id */
    df_str_map prefixes;   /* every byte prefix of a `pieces` key -> id, or -1 if no piece */
    int32_t *user_defined; /* ids of user-defined pieces (the normalizer keeps them as is) */
    int32_t nuser;
    float min_score, max_score;
    int32_t unk_id;
    bool byte_fallback;
    bool treat_ws_as_suffix;

    /* normalizer_spec */
    bool add_dummy_prefix, remove_extra_ws, escape_ws;
    uint32_t *trie; /* darts-clone units */
    size_t trie_units;
    char *repl; /* replacement strings */
    size_t repl_len;
};

/* ---- parsing ------------------------------------------------------------------------- */

typedef struct raw_piece {
    const uint8_t *str;
    size_t len;
    float score;
    int32_t type;
} raw_piece;

/* parse_state.raw holds pieces as parsed or as df_t5_unigram_create_from_pieces gets them. */

typedef struct parse_state {
    df_t5_unigram *m;
    raw_piece *raw;
    size_t nraw, raw_cap;
    const uint8_t *charsmap;
    size_t charsmap_len;
    int32_t model_type;
} parse_state;

static df_status malformed(const df_t5_unigram *m, const df_pb_reader *r, const char *where)
{
    return df_errorf(DF_E_FORMAT, "%s: malformed protobuf in %s at byte %zu: %s", m->name, where,
                     df_pb_offset(r), r->error ? r->error : "unexpected wire type");
}

static df_status parse_piece(parse_state *ps, const uint8_t *data, size_t len)
{
    df_pb_reader r;
    df_pb_field f;
    raw_piece p = {.str = NULL, .len = 0, .score = 0.0f, .type = DF_SP_NORMAL};
    df_pb_reader_init(&r, data, len);
    int got;
    while ((got = df_pb_next(&r, &f)) > 0) {
        if (f.number == 1 && f.wire_type == DF_PB_BYTES) {
            p.str = f.data;
            p.len = f.len;
        } else if (f.number == 2 && f.wire_type == DF_PB_FIXED32) {
            p.score = df_pb_float(&f);
        } else if (f.number == 3 && f.wire_type == DF_PB_VARINT) {
            p.type = df_pb_int32(&f);
        } else if (f.number <= 3) {
            r.error = "field 1 (piece), 2 (score) or 3 (type) has the wrong wire type";
            return malformed(ps->m, &r, "a piece");
        }
    }
    if (got < 0)
        return malformed(ps->m, &r, "a piece");
    if (!df_array_reserve((void **)&ps->raw, &ps->raw_cap, ps->nraw + 1, sizeof *ps->raw))
        return df_errorf(DF_E_OOM, "%s: out of memory", ps->m->name);
    ps->raw[ps->nraw++] = p;
    return DF_OK;
}

static df_status parse_trainer_spec(parse_state *ps, const uint8_t *data, size_t len)
{
    df_pb_reader r;
    df_pb_field f;
    df_pb_reader_init(&r, data, len);
    int got;
    while ((got = df_pb_next(&r, &f)) > 0) {
        if (f.wire_type != DF_PB_VARINT)
            continue;
        if (f.number == 3)
            ps->model_type = df_pb_int32(&f);
        else if (f.number == 24)
            ps->m->treat_ws_as_suffix = df_pb_bool(&f);
        else if (f.number == 35)
            ps->m->byte_fallback = df_pb_bool(&f);
    }
    return got < 0 ? malformed(ps->m, &r, "trainer_spec") : DF_OK;
}

static df_status parse_normalizer_spec(parse_state *ps, const uint8_t *data, size_t len)
{
    df_t5_unigram *m = ps->m;
    df_pb_reader r;
    df_pb_field f;
    df_pb_reader_init(&r, data, len);
    int got;
    while ((got = df_pb_next(&r, &f)) > 0) {
        if (f.number == 2 && f.wire_type == DF_PB_BYTES) {
            ps->charsmap = f.data;
            ps->charsmap_len = f.len;
        } else if (f.wire_type == DF_PB_VARINT && f.number == 3) {
            m->add_dummy_prefix = df_pb_bool(&f);
        } else if (f.wire_type == DF_PB_VARINT && f.number == 4) {
            m->remove_extra_ws = df_pb_bool(&f);
        } else if (f.wire_type == DF_PB_VARINT && f.number == 5) {
            m->escape_ws = df_pb_bool(&f);
        }
    }
    return got < 0 ? malformed(m, &r, "normalizer_spec") : DF_OK;
}

static df_status parse_model(parse_state *ps, const void *data, size_t len)
{
    df_pb_reader r;
    df_pb_field f;
    df_pb_reader_init(&r, data, len);
    int got;
    while ((got = df_pb_next(&r, &f)) > 0) {
        if (f.number > 3)
            continue; /* self_test_data, denormalizer_spec: not used to encode */
        if (f.wire_type != DF_PB_BYTES) {
            r.error = "pieces, trainer_spec and normalizer_spec must be messages";
            return malformed(ps->m, &r, "ModelProto");
        }
        if (f.number == 1)
            DF_TRY(parse_piece(ps, f.data, f.len));
        else if (f.number == 2)
            DF_TRY(parse_trainer_spec(ps, f.data, f.len));
        else
            DF_TRY(parse_normalizer_spec(ps, f.data, f.len));
    }
    return got < 0 ? malformed(ps->m, &r, "ModelProto") : DF_OK;
}

/* ---- building the model ---------------------------------------------------------------- */

/* "<0x41>" -> 0x41, or -1 (sentencepiece's PieceToByte). */
static int piece_to_byte(const uint8_t *s, size_t len)
{
    static const char hex[] = "0123456789ABCDEF";
    if (len != 6 || memcmp(s, "<0x", 3) != 0 || s[5] != '>')
        return -1;
    const char *hi = memchr(hex, s[3], 16), *lo = memchr(hex, s[4], 16);
    if (!hi || !lo || !s[3] || !s[4])
        return -1;
    return (int)((hi - hex) * 16 + (lo - hex));
}

static df_status add_pieces(parse_state *ps)
{
    df_t5_unigram *m = ps->m;
    if (ps->nraw == 0)
        return df_errorf(DF_E_FORMAT, "%s: the model has no pieces", m->name);
    if (ps->nraw > INT32_MAX / 2)
        return df_errorf(DF_E_FORMAT, "%s: too many pieces (%zu)", m->name, ps->nraw);
    size_t n = ps->nraw;
    m->npieces = (int32_t)n;
    m->piece_off = df_malloc(n * sizeof *m->piece_off);
    m->piece_len = df_malloc(n * sizeof *m->piece_len);
    m->score = df_malloc(n * sizeof *m->score);
    m->type = df_malloc(n);
    m->user_defined = df_malloc(n * sizeof *m->user_defined);
    if (!m->piece_off || !m->piece_len || !m->score || !m->type || !m->user_defined)
        return df_errorf(DF_E_OOM, "%s: out of memory", m->name);

    m->min_score = 3.402823466e+38f; /* FLT_MAX and FLT_MIN, as sentencepiece starts */
    m->max_score = 1.175494351e-38f;
    m->unk_id = -1;
    for (size_t i = 0; i < n; i++) {
        const raw_piece *p = &ps->raw[i];
        if (p->len == 0)
            return df_errorf(DF_E_FORMAT, "%s: piece %zu is empty", m->name, i);
        if (p->type < DF_SP_NORMAL || p->type > DF_SP_BYTE)
            return df_errorf(DF_E_FORMAT, "%s: piece %zu has unknown type %d", m->name, i, p->type);
        if (!isfinite(p->score)) /* the lattice compares sums of scores */
            return df_errorf(DF_E_FORMAT, "%s: piece %zu '%.*s' has score %g; scores must be "
                             "finite", m->name, i, (int)(p->len > 64 ? 64 : p->len), p->str,
                             (double)p->score);
        if (m->arena.len + p->len + 1 > UINT32_MAX)
            return df_errorf(DF_E_FORMAT, "%s: pieces too large", m->name);
        m->piece_off[i] = (uint32_t)m->arena.len;
        m->piece_len[i] = (uint32_t)p->len;
        m->score[i] = p->score;
        m->type[i] = (uint8_t)p->type;
        if (!df_byte_buf_append(&m->arena, p->str, p->len) || !df_byte_buf_append(&m->arena, "", 0))
            return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
        m->arena.len++; /* keep the NUL */

        bool normal =
            p->type == DF_SP_NORMAL || p->type == DF_SP_USER_DEFINED || p->type == DF_SP_UNUSED;
        df_str_map *map = normal ? &m->pieces : &m->reserved;
        if (df_str_map_get(map, (const char *)p->str, p->len, NULL))
            return df_errorf(DF_E_FORMAT, "%s: piece %zu '%.*s' is already defined", m->name, i,
                             (int)(p->len > 64 ? 64 : p->len), (const char *)p->str);
        if (!df_str_map_put(map, (const char *)p->str, p->len, (int32_t)i, NULL))
            return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
        if (p->type == DF_SP_NORMAL) {
            if (p->score < m->min_score)
                m->min_score = p->score;
            if (p->score > m->max_score)
                m->max_score = p->score;
        }
        if (p->type == DF_SP_USER_DEFINED)
            m->user_defined[m->nuser++] = (int32_t)i;
        if (p->type == DF_SP_UNKNOWN) {
            if (m->unk_id >= 0)
                return df_errorf(DF_E_FORMAT, "%s: more than one unknown piece (%d and %zu)",
                                 m->name, m->unk_id, i);
            m->unk_id = (int32_t)i;
        }
        if (p->type == DF_SP_BYTE) {
            if (!m->byte_fallback)
                return df_errorf(DF_E_FORMAT,
                                 "%s: byte piece '%.*s' found although byte_fallback is false",
                                 m->name, (int)(p->len > 64 ? 64 : p->len), (const char *)p->str);
            if (piece_to_byte(p->str, p->len) < 0)
                return df_errorf(DF_E_FORMAT, "%s: byte piece '%.*s' is invalid", m->name,
                                 (int)(p->len > 64 ? 64 : p->len), (const char *)p->str);
        }
    }
    if (m->unk_id < 0)
        return df_errorf(DF_E_FORMAT, "%s: the model defines no unknown piece (<unk>)", m->name);
    if (m->pieces.count == 0) /* sentencepiece: "no entry is found in the trie" */
        return df_errorf(DF_E_FORMAT, "%s: the model has no normal or user-defined pieces",
                         m->name);

    /* Prefix table for the Viterbi walk: the role of sentencepiece's piece trie. */
    for (size_t k = 0; k < m->pieces.count; k++) {
        const df_str_map_entry *e = &m->pieces.entries[k];
        const char *key = m->arena.data + m->piece_off[e->value];
        for (uint32_t l = 1; l < e->len; l++)
            if (!df_str_map_get(&m->prefixes, key, l, NULL) &&
                !df_str_map_put(&m->prefixes, key, l, -1, NULL))
                return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
        if (!df_str_map_put(&m->prefixes, key, e->len, e->value, NULL))
            return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
    }
    return DF_OK;
}

static df_status add_charsmap(parse_state *ps)
{
    df_t5_unigram *m = ps->m;
    const uint8_t *b = ps->charsmap;
    size_t len = ps->charsmap_len;
    if (len == 0)
        return DF_OK;
    if (len <= 4)
        return df_errorf(DF_E_FORMAT, "%s: precompiled_charsmap is broken (%zu bytes)", m->name,
                         len);
    uint32_t trie_size =
        (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    if (trie_size > len - 4)
        return df_errorf(DF_E_FORMAT,
                         "%s: precompiled_charsmap trie (%u bytes) exceeds the blob (%zu bytes)",
                         m->name, trie_size, len);
    m->trie_units = trie_size / 4;
    m->repl_len = len - 4 - trie_size;
    m->trie = df_malloc(m->trie_units ? m->trie_units * 4 : 1);
    m->repl = df_malloc(m->repl_len + 1);
    if (!m->trie || !m->repl)
        return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
    for (size_t i = 0; i < m->trie_units; i++) {
        const uint8_t *u = b + 4 + 4 * i;
        m->trie[i] =
            (uint32_t)u[0] | (uint32_t)u[1] << 8 | (uint32_t)u[2] << 16 | (uint32_t)u[3] << 24;
    }
    memcpy(m->repl, b + 4 + trie_size, m->repl_len);
    m->repl[m->repl_len] = '\0';
    return DF_OK;
}

df_status df_t5_unigram_create(const void *data, size_t len, const char *name, df_t5_unigram **out)
{
    *out = NULL;
    df_t5_unigram *m = df_calloc(1, sizeof *m);
    if (!m || !(m->name = df_strdup(name ? name : "spiece.model"))) {
        df_free(m);
        return df_errorf(DF_E_OOM, "%s: out of memory", name ? name : "spiece.model");
    }
    m->add_dummy_prefix = m->remove_extra_ws = m->escape_ws = true; /* proto defaults */
    df_str_map_init(&m->pieces);
    df_str_map_init(&m->reserved);
    df_str_map_init(&m->prefixes);

    parse_state ps = {.m = m, .model_type = 1};
    df_status s = parse_model(&ps, data, len);
    if (s == DF_OK && ps.model_type != 1)
        s = df_errorf(DF_E_UNSUPPORTED,
                      "%s: sentencepiece model type %d (only unigram, type 1, is supported)",
                      m->name, ps.model_type);
    if (s == DF_OK)
        s = add_pieces(&ps);
    if (s == DF_OK)
        s = add_charsmap(&ps);
    df_free(ps.raw);
    if (s != DF_OK) {
        df_t5_unigram_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

df_status df_t5_unigram_create_from_pieces(const df_sp_piece *pieces, size_t n,
                                           const void *charsmap, size_t charsmap_len,
                                           bool add_dummy_prefix, bool remove_extra_ws,
                                           const char *name, df_t5_unigram **out)
{
    *out = NULL;
    df_t5_unigram *m = df_calloc(1, sizeof *m);
    raw_piece *raw = df_malloc((n ? n : 1) * sizeof *raw);
    if (!m || !raw || !(m->name = df_strdup(name ? name : "tokenizer"))) {
        df_free(m);
        df_free(raw);
        return df_errorf(DF_E_OOM, "%s: out of memory", name ? name : "tokenizer");
    }
    m->add_dummy_prefix = add_dummy_prefix;
    m->remove_extra_ws = remove_extra_ws;
    m->escape_ws = true;
    df_str_map_init(&m->pieces);
    df_str_map_init(&m->reserved);
    df_str_map_init(&m->prefixes);
    for (size_t i = 0; i < n; i++) {
        raw[i] = (raw_piece){(const uint8_t *)pieces[i].str, pieces[i].len, pieces[i].score,
                             pieces[i].type};
        m->byte_fallback |= pieces[i].type == DF_SP_BYTE;
    }
    parse_state ps = {.m = m, .raw = raw, .nraw = n, .raw_cap = n,
                      .charsmap = charsmap, .charsmap_len = charsmap_len, .model_type = 1};
    df_status s = add_pieces(&ps);
    if (s == DF_OK)
        s = add_charsmap(&ps);
    df_free(raw);
    if (s != DF_OK) {
        df_t5_unigram_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

df_status df_t5_unigram_load(const char *path, df_t5_unigram **out)
{
    *out = NULL;
    char *data;
    size_t len;
    DF_TRY(df_read_file(path, &data, &len));
    df_status s = df_t5_unigram_create(data, len, path, out);
    df_free(data);
    return s;
}

void df_t5_unigram_free(df_t5_unigram *m)
{
    if (!m)
        return;
    df_free(m->name);
    df_free(m->piece_off);
    df_free(m->piece_len);
    df_free(m->score);
    df_free(m->type);
    df_free(m->user_defined);
    df_byte_buf_free(&m->arena);
    df_str_map_deinit(&m->pieces);
    df_str_map_deinit(&m->reserved);
    df_str_map_deinit(&m->prefixes);
    df_free(m->trie);
    df_free(m->repl);
    df_free(m);
}

int32_t df_t5_unigram_piece_count(const df_t5_unigram *m)
{
    return m->npieces;
}

const char *df_t5_unigram_piece(const df_t5_unigram *m, int64_t id)
{
    if (id < 0 || id >= m->npieces)
        return NULL;
    return m->arena.data + m->piece_off[id];
}

df_sp_type df_t5_unigram_piece_type(const df_t5_unigram *m, int32_t id)
{
    return (df_sp_type)m->type[id];
}

float df_t5_unigram_piece_score(const df_t5_unigram *m, int32_t id)
{
    return m->score[id];
}

int32_t df_t5_unigram_unk_id(const df_t5_unigram *m)
{
    return m->unk_id;
}

int32_t df_t5_unigram_piece_to_id(const df_t5_unigram *m, const char *piece, size_t len)
{
    int32_t id;
    if (df_str_map_get(&m->reserved, piece, len, &id) ||
        df_str_map_get(&m->pieces, piece, len, &id))
        return id;
    return m->unk_id;
}

/* ---- normalizer ------------------------------------------------------------------------ */

/* darts-clone DoubleArray::commonPrefixSearch; returns the longest match's length and its
 * value, or 0. Positions outside the array end the walk (a broken map cannot read past). */
static size_t trie_longest(const df_t5_unigram *m, const uint8_t *key, size_t len, uint32_t *value)
{
    const uint32_t *u = m->trie;
    size_t units = m->trie_units, best = 0, found = 0;
    if (units == 0)
        return 0;
    uint32_t unit = u[0];
    size_t pos = (unit >> 10) << ((unit & (1u << 9)) >> 6);
    for (size_t i = 0; i < len; i++) {
        pos ^= key[i];
        if (pos >= units)
            break;
        unit = u[pos];
        if ((unit & ((1u << 31) | 0xFF)) != key[i])
            break;
        pos ^= (unit >> 10) << ((unit & (1u << 9)) >> 6);
        if (pos >= units)
            break;
        if ((unit >> 8) & 1) {
            if (found++ < MAX_TRIE_RESULTS) {
                best = i + 1;
                *value = u[pos] & ((1u << 31) - 1);
            }
        }
    }
    return best;
}

static size_t one_char_len(uint8_t c)
{
    static const uint8_t len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

/* Normalizer::NormalizePrefix: the replacement for the start of `in` and how many bytes of
 * the input it consumes. */
static df_status norm_prefix(const df_t5_unigram *m, const char *in, size_t len, const char **repl,
                             size_t *repl_len, size_t *consumed)
{
    size_t best = 0;
    for (int32_t k = 0; k < m->nuser; k++) { /* user-defined pieces: longest, unchanged */
        int32_t id = m->user_defined[k];
        size_t l = m->piece_len[id];
        if (l > best && l <= len && memcmp(in, m->arena.data + m->piece_off[id], l) == 0)
            best = l;
    }
    if (best > 0) {
        *repl = in;
        *repl_len = *consumed = best;
        return DF_OK;
    }
    uint32_t value = 0;
    best = trie_longest(m, (const uint8_t *)in, len, &value);
    if (best == 0) {
        int32_t cp;
        *repl = in;
        *repl_len = *consumed = df_utf8_next(in, len, &cp);
        return DF_OK;
    }
    if (value >= m->repl_len)
        return df_errorf(DF_E_FORMAT,
                         "%s: precompiled_charsmap points at byte %u of a %zu-byte string table",
                         m->name, value, m->repl_len);
    *repl = m->repl + value;
    *repl_len = strnlen(*repl, m->repl_len - value);
    *consumed = best;
    return DF_OK;
}

df_status df_t5_unigram_normalize(const df_t5_unigram *m, const char *text, size_t len,
                                  df_byte_buf *out)
{
    const char *space = m->escape_ws ? SPACE_SYMBOL : " ";
    const size_t space_len = strlen(space);
    const char *repl;
    size_t rlen, used, pos = 0;
    out->len = 0;
    if (!df_byte_buf_append(out, "", 0))
        return df_errorf(DF_E_OOM, "%s: out of memory", m->name);

    if (m->remove_extra_ws) { /* leading whitespace */
        while (pos < len) {
            DF_TRY(norm_prefix(m, text + pos, len - pos, &repl, &rlen, &used));
            if (!(rlen == 1 && repl[0] == ' '))
                break;
            pos += used;
        }
    }
    if (pos >= len)
        return DF_OK;
    bool ok = true;
    if (!m->treat_ws_as_suffix && m->add_dummy_prefix)
        ok = df_byte_buf_append(out, space, space_len);

    bool prev_space = m->remove_extra_ws;
    while (pos < len && ok) {
        DF_TRY(norm_prefix(m, text + pos, len - pos, &repl, &rlen, &used));
        while (prev_space && rlen > 0 && repl[0] == ' ') {
            repl++;
            rlen--;
        }
        if (rlen > 0) {
            for (size_t k = 0; k < rlen && ok; k++)
                ok = (m->escape_ws && repl[k] == ' ') ? df_byte_buf_append(out, space, space_len)
                                                      : df_byte_buf_append(out, repl + k, 1);
            prev_space = repl[rlen - 1] == ' ';
        }
        pos += used;
        if (!m->remove_extra_ws)
            prev_space = false;
    }
    if (ok && m->remove_extra_ws) { /* trailing whitespace */
        while (out->len >= space_len &&
               memcmp(out->data + out->len - space_len, space, space_len) == 0)
            out->len -= space_len;
        out->data[out->len] = '\0';
    }
    if (ok && m->treat_ws_as_suffix && m->add_dummy_prefix)
        ok = df_byte_buf_append(out, space, space_len);
    return ok ? DF_OK : df_errorf(DF_E_OOM, "%s: out of memory", m->name);
}

/* ---- Viterbi ---------------------------------------------------------------------------- */

typedef struct best_node {
    float score;   /* best path score ending here */
    int32_t start; /* where the last piece starts; -1 = unset */
    int32_t id;
} best_node;

static df_status emit(const df_t5_unigram *m, const df_str_map *added, const char *piece,
                      size_t len, df_i64_vec *out)
{
    int32_t id;
    if (!(added && df_str_map_get(added, piece, len, &id)))
        id = df_t5_unigram_piece_to_id(m, piece, len);
    if (!df_i64_vec_push(out, id))
        return df_errorf(DF_E_OOM, "%s: out of memory", m->name);
    return DF_OK;
}

static void viterbi(const df_t5_unigram *m, const char *s, size_t n, best_node *best)
{
    const float unk_score = m->min_score - 10.0f;
    for (size_t i = 0; i <= n; i++)
        best[i] = (best_node){0.0f, -1, -1};
    for (size_t start = 0; start < n;) {
        const float till = best[start].score;
        size_t mblen = one_char_len((uint8_t)s[start]);
        if (mblen > n - start)
            mblen = n - start;
        bool has_single = false;
        uint32_t h = DF_STR_HASH_INIT;
        for (size_t end = start + 1; end <= n; end++) {
            h = df_str_hash_step(h, (uint8_t)s[end - 1]);
            const df_str_map_entry *e = df_str_map_find(&m->prefixes, s + start, end - start, h);
            if (!e)
                break;
            int32_t id = e->value;
            if (id < 0 || m->type[id] == DF_SP_UNUSED)
                continue;
            size_t length = end - start;
            double score = m->type[id] == DF_SP_USER_DEFINED
                               ? (double)((float)length * m->max_score) - 0.1
                               : (double)m->score[id];
            double cand = score + (double)till;
            best_node *t = &best[end];
            if (t->start == -1 || cand > (double)t->score) {
                t->score = (float)cand;
                t->start = (int32_t)start;
                t->id = id;
            }
            if (length == mblen)
                has_single = true;
        }
        if (!has_single) {
            best_node *t = &best[start + mblen];
            float cand = unk_score + till;
            if (t->start == -1 || cand > t->score) {
                t->score = cand;
                t->start = (int32_t)start;
                t->id = m->unk_id;
            }
        }
        start += mblen;
    }
}

df_status df_t5_unigram_encode(const df_t5_unigram *m, const char *text, size_t len,
                               const df_str_map *added, df_i64_vec *out)
{
    df_byte_buf norm = {0};
    best_node *best = NULL;
    int32_t *ends = NULL;
    df_status s = df_t5_unigram_normalize(m, text, len, &norm);
    size_t n = norm.len;
    if (s == DF_OK && n > INT32_MAX - 1)
        s = df_errorf(DF_E_ARG, "%s: text too long (%zu normalized bytes)", m->name, n);
    if (s == DF_OK && n > 0) {
        best = df_malloc((n + 1) * sizeof *best);
        ends = df_malloc((n + 1) * sizeof *ends);
        if (!best || !ends)
            s = df_errorf(DF_E_OOM, "%s: out of memory", m->name);
    }
    if (s == DF_OK && n > 0) {
        viterbi(m, norm.data, n, best);
        size_t count = 0; /* piece end positions, last first */
        for (int32_t e = (int32_t)n; e > 0; e = best[e].start)
            ends[count++] = e;

        df_byte_buf run = {0}; /* a run of unknown pieces, merged into one */
        bool in_run = false;
        for (size_t k = count; k-- > 0 && s == DF_OK;) {
            int32_t e = ends[k], b = best[e].start, id = best[e].id;
            const char *piece = norm.data + b;
            size_t plen = (size_t)(e - b);
            bool unk = m->type[id] == DF_SP_UNKNOWN;
            if (unk && m->byte_fallback) {
                for (size_t q = 0; q < plen && s == DF_OK; q++) {
                    char hex[8];
                    snprintf(hex, sizeof hex, "<0x%02X>", (uint8_t)piece[q]);
                    s = emit(m, added, hex, 6, out);
                }
                continue;
            }
            if (in_run && !unk) {
                s = emit(m, added, run.data, run.len, out);
                in_run = false;
            }
            if (s != DF_OK)
                break;
            if (unk) {
                if (!in_run)
                    run.len = 0;
                in_run = true;
                if (!df_byte_buf_append(&run, piece, plen))
                    s = df_errorf(DF_E_OOM, "%s: out of memory", m->name);
            } else {
                s = emit(m, added, piece, plen, out);
            }
        }
        if (s == DF_OK && in_run)
            s = emit(m, added, run.data, run.len, out);
        df_byte_buf_free(&run);
    }
    df_free(best);
    df_free(ends);
    df_byte_buf_free(&norm);
    return s;
}
