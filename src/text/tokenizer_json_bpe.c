/*
 * The BPE model of tokenizer.json ("model": {"type": "BPE", ...}), as the Rust tokenizers
 * library runs it.
 *
 * A piece starts as its characters, each looked up in the vocabulary (a character the
 * vocabulary lacks becomes its <0xHH> byte tokens with byte_fallback, else unk_token, fused
 * with a previous unk under fuse_unk, else it is dropped, as the library does). Then the
 * lowest-ranked adjacent pair is merged, the leftmost first among equal ranks, until no
 * pair has a merge. A binary heap of candidate pairs keyed (rank, position) keeps that
 * O(n log n) for long pieces; a popped pair whose symbols have changed since it was pushed
 * is skipped. With ignore_merges a piece that is itself a vocabulary token is emitted whole.
 *
 * Loading checks what the library checks and a little more: every vocabulary id is unique
 * and the ids are 0..N-1; every merge is exactly two tokens of the vocabulary whose
 * concatenation is one too. Merges may be written "left right" or ["left", "right"]; a
 * merge listed twice keeps its later rank, as the library's map does.
 */
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "text/tokenizer_json_impl.h"

static bool optional_string(const cJSON *obj, const char *key, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = cJSON_IsString(v) ? v->valuestring : NULL;
    return !v || cJSON_IsNull(v) || cJSON_IsString(v);
}

static bool optional_bool(const cJSON *obj, const char *key, bool *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = cJSON_IsTrue(v);
    return !v || cJSON_IsNull(v) || cJSON_IsBool(v);
}

static df_status parse_vocab(tj_bpe *m, const cJSON *vocab, const char *file)
{
    if (!cJSON_IsObject(vocab))
        return df_errorf(DF_E_FORMAT, "%s: model.vocab must be an object of token -> id", file);
    int64_t n = cJSON_GetArraySize(vocab);
    m->id_to_token = df_calloc((size_t)(n > 0 ? n : 1), sizeof *m->id_to_token);
    if (!m->id_to_token)
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    m->id_limit = n;
    for (const cJSON *it = vocab->child; it; it = it->next) {
        int32_t id;
        if (n > INT32_MAX || !tj_json_id(it, (double)n, &id))
            return df_errorf(DF_E_FORMAT,
                             "%s: model.vocab['%.64s'] must be an integer id in [0, %lld) "
                             "(the vocabulary has %lld tokens)",
                             file, it->string, (long long)n, (long long)n);
        if (m->id_to_token[id])
            return df_errorf(DF_E_FORMAT, "%s: model.vocab: id %d is given to '%.64s' and '%.64s'",
                             file, id, m->id_to_token[id], it->string);
        size_t len = strlen(it->string), at;
        int32_t prev;
        if (df_str_map_get(&m->vocab, it->string, len, &prev))
            return df_errorf(DF_E_FORMAT, "%s: model.vocab: token '%.64s' appears twice", file,
                             it->string);
        if (!df_str_map_put(&m->vocab, it->string, len, id, &at))
            return df_errorf(DF_E_OOM, "%s: out of memory", file);
        m->id_to_token[id] = df_strdup(it->string);
        if (!m->id_to_token[id])
            return df_errorf(DF_E_OOM, "%s: out of memory", file);
    }
    return DF_OK;
}

static void merge_key(char key[8], int32_t left, int32_t right)
{
    memcpy(key, &left, 4);
    memcpy(key + 4, &right, 4);
}

static df_status merge_token(const tj_bpe *m, const char *s, size_t len, int64_t i, int side,
                             const char *file, int32_t *id)
{
    if (len > 0 && tj_bpe_token_id(m, s, len, id))
        return DF_OK;
    return df_errorf(DF_E_FORMAT, "%s: model.merges[%lld]: the %s token '%.*s' is not in the "
                     "vocabulary",
                     file, (long long)i, side == 0 ? "left" : "right", (int)(len < 64 ? len : 64),
                     s);
}

static df_status parse_merge(tj_bpe *m, const cJSON *it, int64_t i, const char *file)
{
    const char *a = NULL, *b = NULL;
    size_t alen = 0, blen = 0;
    if (cJSON_IsString(it)) {
        const char *s = it->valuestring, *sp = strchr(s, ' ');
        if (sp && !strchr(sp + 1, ' ')) {
            a = s;
            alen = (size_t)(sp - s);
            b = sp + 1;
            blen = strlen(b);
        }
    } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
               cJSON_IsString(it->child->next)) {
        a = it->child->valuestring;
        alen = strlen(a);
        b = it->child->next->valuestring;
        blen = strlen(b);
    }
    if (!a)
        return df_errorf(DF_E_FORMAT,
                         "%s: model.merges[%lld] must be two tokens (\"left right\" or "
                         "[\"left\", \"right\"])",
                         file, (long long)i);
    int32_t left, right, made;
    DF_TRY(merge_token(m, a, alen, i, 0, file, &left));
    DF_TRY(merge_token(m, b, blen, i, 1, file, &right));
    df_byte_buf joined = {0};
    bool ok = df_byte_buf_append(&joined, a, alen) && df_byte_buf_append(&joined, b, blen);
    bool found = ok && tj_bpe_token_id(m, joined.data, joined.len, &made);
    df_byte_buf_free(&joined);
    if (!ok)
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    if (!found)
        return df_errorf(DF_E_FORMAT,
                         "%s: model.merges[%lld]: '%.*s' + '%.*s' is not in the vocabulary", file,
                         (long long)i, (int)(alen < 64 ? alen : 64), a,
                         (int)(blen < 64 ? blen : 64), b);
    char key[8];
    merge_key(key, left, right);
    if (!df_str_map_put(&m->merges, key, sizeof key, (int32_t)i, NULL))
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    m->merge_new[i] = made;
    return DF_OK;
}

df_status tj_bpe_parse(tj_bpe *m, const cJSON *model, const char *file)
{
    memset(m, 0, sizeof *m);
    df_str_map_init(&m->vocab);
    df_str_map_init(&m->merges);
    m->unk_id = -1;
    if (!cJSON_IsObject(model))
        return df_errorf(DF_E_FORMAT, "%s: \"model\" must be an object", file);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type))
        return df_errorf(DF_E_FORMAT, "%s: model.type must be a string", file);
    if (strcmp(type->valuestring, "BPE") != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s: model type '%.64s' is not supported (only BPE)",
                         file, type->valuestring);

    const char *unk, *prefix, *suffix;
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) &&
        !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0))
        return df_errorf(DF_E_UNSUPPORTED, "%s: model.dropout (BPE dropout) is not supported",
                         file);
    if (!optional_string(model, "unk_token", &unk) ||
        !optional_string(model, "continuing_subword_prefix", &prefix) ||
        !optional_string(model, "end_of_word_suffix", &suffix) ||
        !optional_bool(model, "fuse_unk", &m->fuse_unk) ||
        !optional_bool(model, "byte_fallback", &m->byte_fallback) ||
        !optional_bool(model, "ignore_merges", &m->ignore_merges))
        return df_errorf(DF_E_FORMAT,
                         "%s: model: unk_token, continuing_subword_prefix and end_of_word_suffix "
                         "must be strings or null; fuse_unk, byte_fallback and ignore_merges "
                         "booleans",
                         file);
    if ((prefix && prefix[0]) || (suffix && suffix[0]))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: model.%s is not supported (only byte-level BPE without subword "
                         "markers)",
                         file, prefix && prefix[0] ? "continuing_subword_prefix"
                                                   : "end_of_word_suffix");

    DF_TRY(parse_vocab(m, cJSON_GetObjectItemCaseSensitive(model, "vocab"), file));
    if (unk) {
        if (!tj_bpe_token_id(m, unk, strlen(unk), &m->unk_id))
            return df_errorf(DF_E_FORMAT, "%s: model.unk_token '%.64s' is not in the vocabulary",
                             file, unk);
    }
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    if (merges && !cJSON_IsArray(merges))
        return df_errorf(DF_E_FORMAT, "%s: model.merges must be a list", file);
    m->nmerges = merges ? cJSON_GetArraySize(merges) : 0;
    m->merge_new = df_calloc((size_t)(m->nmerges > 0 ? m->nmerges : 1), sizeof *m->merge_new);
    if (!m->merge_new)
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    int64_t i = 0;
    for (const cJSON *it = merges ? merges->child : NULL; it; it = it->next, i++)
        DF_TRY(parse_merge(m, it, i, file));
    return DF_OK;
}

void tj_bpe_free(tj_bpe *m)
{
    df_str_map_deinit(&m->vocab);
    df_str_map_deinit(&m->merges);
    for (int64_t i = 0; m->id_to_token && i < m->id_limit; i++)
        df_free(m->id_to_token[i]);
    df_free(m->id_to_token);
    df_free(m->merge_new);
    memset(m, 0, sizeof *m);
}

bool tj_bpe_token_id(const tj_bpe *m, const char *s, size_t len, int32_t *id)
{
    return df_str_map_get(&m->vocab, s, len, id);
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct tj_symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
} symbol;

typedef struct tj_candidate {
    int32_t rank, pos, made;
} candidate;

typedef tj_bpe_work word;

void tj_bpe_work_free(tj_bpe_work *w)
{
    df_free(w->sym);
    df_free(w->heap);
    memset(w, 0, sizeof *w);
}

static bool before(candidate a, candidate b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static bool heap_push(word *w, candidate c)
{
    if (!df_array_reserve((void **)&w->heap, &w->heap_cap, w->nheap + 1, sizeof *w->heap))
        return false;
    size_t i = w->nheap++;
    while (i > 0 && before(c, w->heap[(i - 1) / 2])) {
        w->heap[i] = w->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    w->heap[i] = c;
    return true;
}

static candidate heap_pop(word *w)
{
    candidate top = w->heap[0], last = w->heap[--w->nheap];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        candidate best = last;
        if (l < w->nheap && before(w->heap[l], best)) {
            m = l;
            best = w->heap[l];
        }
        if (r < w->nheap && before(w->heap[r], best))
            m = r;
        if (m == i)
            break;
        w->heap[i] = w->heap[m];
        i = m;
    }
    if (w->nheap > 0)
        w->heap[i] = last;
    return top;
}

static bool sym_push(word *w, int32_t id)
{
    if (w->n >= INT32_MAX || !df_array_reserve((void **)&w->sym, &w->cap, w->n + 1, sizeof *w->sym))
        return false;
    int32_t i = (int32_t)w->n++;
    w->sym[i] = (symbol){id, i - 1, -1, true};
    if (i > 0)
        w->sym[i - 1].next = i;
    return true;
}

static bool find_merge(const tj_bpe *m, int32_t left, int32_t right, int32_t *rank, int32_t *made)
{
    char key[8];
    merge_key(key, left, right);
    if (!df_str_map_get(&m->merges, key, sizeof key, rank))
        return false;
    *made = m->merge_new[*rank];
    return true;
}

/* Queues the pair starting at `pos` when it has a merge. */
static bool consider(const tj_bpe *m, word *w, int32_t pos)
{
    if (pos < 0 || w->sym[pos].next < 0)
        return true;
    int32_t rank, made;
    if (!find_merge(m, w->sym[pos].id, w->sym[w->sym[pos].next].id, &rank, &made))
        return true;
    return heap_push(w, (candidate){rank, pos, made});
}

/* The symbols of one character: its token, its <0xHH> bytes, unk or nothing. */
static bool initial_symbols(const tj_bpe *m, word *w, const char *c, size_t n, bool *last_unk)
{
    int32_t id;
    if (tj_bpe_token_id(m, c, n, &id)) {
        *last_unk = false;
        return sym_push(w, id);
    }
    if (m->byte_fallback) {
        int32_t ids[4];
        bool all = true;
        for (size_t i = 0; i < n && all; i++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", (uint8_t)c[i]);
            all = tj_bpe_token_id(m, name, strlen(name), &ids[i]);
        }
        if (all) {
            for (size_t i = 0; i < n; i++)
                if (!sym_push(w, ids[i]))
                    return false;
            *last_unk = false;
            return true;
        }
    }
    if (m->unk_id < 0)
        return true;
    if (m->fuse_unk && *last_unk)
        return true;
    *last_unk = true;
    return sym_push(w, m->unk_id);
}

df_status tj_bpe_encode(const tj_bpe *m, const char *piece, size_t len, tj_bpe_work *wk,
                        df_i64_vec *out)
{
    int32_t id;
    if (len == 0)
        return DF_OK;
    if (m->ignore_merges && tj_bpe_token_id(m, piece, len, &id))
        return df_i64_vec_push(out, id) ? DF_OK : df_errorf(DF_E_OOM, "tokenize: out of memory");

    word *wp = wk, w = *wk; /* a local copy for speed; written back at the end */
    w.n = w.nheap = 0;
    bool ok = true, last_unk = false;
    for (size_t i = 0; i < len && ok;) {
        int32_t cp;
        size_t n = df_utf8_next(piece + i, len - i, &cp);
        ok = initial_symbols(m, &w, piece + i, n, &last_unk);
        i += n;
    }
    for (int32_t i = 0; i + 1 < (int32_t)w.n && ok; i++)
        ok = consider(m, &w, i);
    while (ok && w.nheap > 0) {
        candidate c = heap_pop(&w);
        symbol *s = &w.sym[c.pos];
        int32_t rank, made;
        if (!s->alive || s->next < 0 || !find_merge(m, s->id, w.sym[s->next].id, &rank, &made) ||
            made != c.made)
            continue; /* a neighbour changed since this pair was queued */
        symbol *right = &w.sym[s->next];
        s->id = made;
        right->alive = false;
        s->next = right->next;
        if (s->next >= 0)
            w.sym[s->next].prev = c.pos;
        ok = consider(m, &w, s->prev) && consider(m, &w, c.pos);
    }
    for (int32_t i = w.n ? 0 : -1; i >= 0 && ok; i = w.sym[i].next)
        ok = df_i64_vec_push(out, w.sym[i].id);
    *wp = w;
    return ok ? DF_OK : df_errorf(DF_E_OOM, "tokenize: out of memory");
}
