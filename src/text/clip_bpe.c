/*
 * CLIP byte-level BPE (transformers' slow CLIPTokenizer without ftfy).
 *
 * One segment of text goes through, in order:
 *  1. BERT BasicTokenizer clean-up (strip_accents=False, no punctuation split): U+0000,
 *     U+FFFD and every "C*" category character except \t \n \r are dropped; \t \n \r, space
 *     and "Zs" become a space; CJK ideographs get a space on each side; NFC; the text is
 *     split on Python whitespace and each word lower-cased with Python's str.lower() (full
 *     mapping of U+0130, final sigma); the words are joined by single spaces.
 *  2. CLIP's pattern, tried in this order at each position (case-insensitive):
 *     <|startoftext|>, <|endoftext|>, 's 't 're 've 'm 'll 'd, \p{L}+, one \p{N},
 *     [^\s\p{L}\p{N}]+; anything else (whitespace) is skipped. U+0345 is skipped too: its
 *     case variants are Greek letters, so the case-insensitive pattern matches it with
 *     neither the letter class nor the negated symbol class.
 *  3. Each match's UTF-8 bytes map to printable code points (GPT-2's bytes_to_unicode), the
 *     last symbol gets "</w>", and BPE merges adjacent pairs by merges.txt rank: the lowest
 *     ranked pair is merged at every (non-overlapping, left to right) occurrence, then the
 *     next. A heap ordered by (rank, position) gives the same result as rescanning the word
 *     after each merge, so long words cost O(n log n) rather than O(n^2). A match that is
 *     exactly "<|startoftext|>" or "<|endoftext|>" skips BPE (transformers' cache holds them).
 *
 * Unicode categories, case mapping and NFC come from utf8proc; its Unicode version may differ
 * from the Python that made a reference for characters assigned in recent versions.
 */
#include "text/clip_bpe.h"

#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include <diffuse/json.h>

#include "core/alloc.h"

struct df_clip_bpe {
    df_str_map vocab;  /* token -> id */
    df_str_map ranks;  /* "left right" -> merge rank */
    int32_t *id_entry; /* id -> vocab entry index, -1 where no token has the id */
    int64_t id_count;  /* largest id + 1 */
};

/* ---- bytes_to_unicode --------------------------------------------------------------- */

static bool byte_is_printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

int32_t df_clip_byte_to_cp(uint8_t b)
{
    if (byte_is_printable(b))
        return b;
    int n = 0; /* the others get 256, 257, ... in byte order */
    for (int i = 0; i < b; i++)
        n += !byte_is_printable(i);
    return 256 + n;
}

/* ---- Unicode classes ---------------------------------------------------------------- */

static bool cat_is_letter(utf8proc_category_t c)
{
    return c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
}

static bool cat_is_number(utf8proc_category_t c)
{
    return c >= UTF8PROC_CATEGORY_ND && c <= UTF8PROC_CATEGORY_NO;
}

/* BasicTokenizer._is_control: \t \n \r are whitespace, every other "C*" is control. */
static bool bert_is_control(int32_t cp)
{
    if (cp == '\t' || cp == '\n' || cp == '\r')
        return false;
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_CS || c == UTF8PROC_CATEGORY_CO;
}

static bool bert_is_whitespace(int32_t cp)
{
    if (cp == ' ' || cp == '\t' || cp == '\n' || cp == '\r')
        return true;
    return utf8proc_category(cp) == UTF8PROC_CATEGORY_ZS;
}

/* BasicTokenizer._is_chinese_char: the CJK Unified Ideographs blocks. */
static bool bert_is_cjk(int32_t cp)
{
    return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
           (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
           (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B820 && cp <= 0x2CEAF) ||
           (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

/* Python's Cased and Case_Ignorable properties, as far as utf8proc exposes them; used only
 * for the final-sigma rule of str.lower(). */
static bool is_cased(int32_t cp)
{
    /* Other_Lowercase / Other_Uppercase letters without a case mapping */
    if (cp == 0xAA || cp == 0xBA || (cp >= 0x1F130 && cp <= 0x1F149) ||
        (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return true;
    utf8proc_category_t c = utf8proc_category(cp);
    if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT)
        return true;
    return utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp;
}

static bool is_case_ignorable(int32_t cp)
{
    switch (cp) {
    case '\'':
    case '.':
    case ':':
    case '^':
    case '`':
    case 0xA8:
    case 0xAD:
    case 0xAF:
    case 0xB4:
    case 0xB7:
    case 0xB8:
    case 0x387:
    case 0x55F:
    case 0x5F4:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
    case 0xFE13:
    case 0xFE52:
    case 0xFE55:
    case 0xFF07:
    case 0xFF0E:
    case 0xFF1A:
        return true;
    default:
        break;
    }
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_MN || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_CF ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_SK;
}

/* U+03A3 lower-cases to final sigma when a cased letter precedes it and none follows
 * (case-ignorable characters in between are skipped), as in CPython. */
static int32_t lower_sigma(const int32_t *w, size_t n, size_t i)
{
    size_t j = i;
    while (j > 0 && is_case_ignorable(w[j - 1]))
        j--;
    if (j == 0 || !is_cased(w[j - 1]))
        return 0x3C3;
    for (j = i + 1; j < n && is_case_ignorable(w[j]); j++)
        ;
    return (j == n || !is_cased(w[j])) ? 0x3C2 : 0x3C3;
}

/* ---- clean-up (BasicTokenizer) ------------------------------------------------------ */

/* NFC of `in` into `out` (replacing its contents). */
static df_status nfc(const df_cp_vec *in, df_cp_vec *out)
{
    df_byte_buf utf8 = {0};
    df_status s = DF_OK;
    for (size_t i = 0; i < in->len && s == DF_OK; i++)
        if (!df_byte_buf_put_cp(&utf8, in->data[i]))
            s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
    out->len = 0;
    if (s == DF_OK && utf8.len > 0) {
        utf8proc_option_t opt = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
        const uint8_t *src = (const uint8_t *)utf8.data;
        utf8proc_ssize_t n = utf8proc_decompose(src, (utf8proc_ssize_t)utf8.len, NULL, 0, opt);
        if (n < 0)
            s = df_errorf(DF_E_INTERNAL, "clip tokenizer: NFC failed: %s", utf8proc_errmsg(n));
        else if (!df_cp_vec_reserve(out, (size_t)n))
            s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
        else {
            n = utf8proc_decompose(src, (utf8proc_ssize_t)utf8.len, out->data, n, opt);
            if (n >= 0)
                n = utf8proc_normalize_utf32(out->data, n, opt);
            if (n < 0)
                s = df_errorf(DF_E_INTERNAL, "clip tokenizer: NFC failed: %s", utf8proc_errmsg(n));
            else
                out->len = (size_t)n;
        }
    }
    df_byte_buf_free(&utf8);
    return s;
}

df_status df_clip_bpe_normalize(const char *text, size_t len, df_byte_buf *out)
{
    df_cp_vec cleaned = {0}, composed = {0};
    df_status s = DF_OK;
    out->len = 0;
    if (!df_byte_buf_append(out, "", 0) || !df_cp_vec_reserve(&cleaned, len))
        s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");

    /* _clean_text and _tokenize_chinese_chars */
    for (size_t i = 0; i < len && s == DF_OK;) {
        int32_t cp;
        i += df_utf8_next(text + i, len - i, &cp);
        if (cp == 0 || cp == 0xFFFD || bert_is_control(cp))
            continue;
        bool ok = true;
        if (bert_is_whitespace(cp))
            ok = df_cp_vec_push(&cleaned, ' ');
        else if (bert_is_cjk(cp))
            ok = df_cp_vec_push(&cleaned, ' ') && df_cp_vec_push(&cleaned, cp) &&
                 df_cp_vec_push(&cleaned, ' ');
        else
            ok = df_cp_vec_push(&cleaned, cp);
        if (!ok)
            s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
    }
    if (s == DF_OK)
        s = nfc(&cleaned, &composed);

    /* whitespace_tokenize, lower() per word, " ".join */
    const int32_t *w = composed.data;
    size_t n = composed.len;
    bool first = true;
    for (size_t i = 0; i < n && s == DF_OK;) {
        while (i < n && df_py_isspace(w[i]))
            i++;
        size_t j = i;
        while (j < n && !df_py_isspace(w[j]))
            j++;
        if (j > i) {
            bool ok = first || df_byte_buf_append(out, " ", 1);
            for (size_t k = i; k < j && ok; k++) {
                int32_t c = w[k];
                if (c == 0x130) /* İ -> i + combining dot above */
                    ok = df_byte_buf_put_cp(out, 'i') && df_byte_buf_put_cp(out, 0x307);
                else if (c == 0x3A3)
                    ok = df_byte_buf_put_cp(out, lower_sigma(w + i, j - i, k - i));
                else
                    ok = df_byte_buf_put_cp(out, utf8proc_tolower(c));
            }
            if (!ok)
                s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
            first = false;
        }
        i = j;
    }
    df_cp_vec_free(&cleaned);
    df_cp_vec_free(&composed);
    return s;
}

/* ---- the pre-tokenisation pattern --------------------------------------------------- */

static int32_t fold(int32_t cp)
{
    if (cp == 0x17F) /* long s folds to s */
        return 's';
    if (cp == 0x212A) /* Kelvin sign folds to k */
        return 'k';
    if (cp >= 'A' && cp <= 'Z')
        return cp + 32;
    return cp;
}

/* Length of `lit` when it matches (case-insensitively) at w[i..n), else 0. */
static size_t match_ascii(const int32_t *w, size_t n, size_t i, const char *lit)
{
    size_t k = 0;
    for (; lit[k]; k++)
        if (i + k >= n || fold(w[i + k]) != lit[k])
            return 0;
    return k;
}

static bool is_letter(int32_t cp)
{
    return cat_is_letter(utf8proc_category(cp));
}

static bool is_number(int32_t cp)
{
    return cat_is_number(utf8proc_category(cp));
}

static bool is_symbol(int32_t cp)
{
    return !df_py_isspace(cp) && !is_letter(cp) && !is_number(cp) && cp != 0x345;
}

typedef enum { MATCH_NONE, MATCH_TEXT, MATCH_SPECIAL } match_kind;

/* The pattern's match at w[i..n): its length and whether it is a special literal. */
static match_kind next_match(const int32_t *w, size_t n, size_t i, size_t *len)
{
    static const char *const specials[] = {"<|startoftext|>", "<|endoftext|>"};
    static const char *const contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
    for (int k = 0; k < 2; k++)
        if ((*len = match_ascii(w, n, i, specials[k])) > 0)
            return MATCH_SPECIAL;
    if (w[i] == '\'')
        for (int k = 0; k < 7; k++)
            if ((*len = match_ascii(w, n, i, contractions[k])) > 0)
                return MATCH_TEXT;
    size_t j = i;
    if (is_letter(w[i])) {
        while (j < n && is_letter(w[j]))
            j++;
    } else if (is_number(w[i])) {
        j = i + 1;
    } else if (is_symbol(w[i])) {
        while (j < n && is_symbol(w[j]))
            j++;
    }
    *len = j - i;
    return j > i ? MATCH_TEXT : MATCH_NONE;
}

/* ---- BPE ------------------------------------------------------------------------------ */

typedef struct bpe_sym {
    int32_t start, len; /* bytes of the word buffer */
    int32_t prev, next; /* -1 at the ends */
    uint32_t ver;       /* bumped when the symbol grows; len 0 = merged away */
} bpe_sym;

typedef struct bpe_pair {
    int32_t rank, left, right;
    uint32_t lver, rver;
} bpe_pair;

typedef struct bpe_work {
    df_byte_buf word; /* mapped bytes of the match, then "</w>" */
    df_byte_buf key;  /* "left right" for rank lookups */
    bpe_sym *sym;
    size_t sym_cap;
    bpe_pair *heap;
    size_t nheap, heap_cap;
    int32_t *touched;
    size_t ntouched, touched_cap;
} bpe_work;

static void work_free(bpe_work *wk)
{
    df_byte_buf_free(&wk->word);
    df_byte_buf_free(&wk->key);
    df_free(wk->sym);
    df_free(wk->heap);
    df_free(wk->touched);
}

static bool pair_less(const bpe_pair *a, const bpe_pair *b)
{
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static bool heap_push(bpe_work *wk, bpe_pair p)
{
    if (!df_array_reserve((void **)&wk->heap, &wk->heap_cap, wk->nheap + 1, sizeof p))
        return false;
    size_t i = wk->nheap++;
    while (i > 0 && pair_less(&p, &wk->heap[(i - 1) / 2])) {
        wk->heap[i] = wk->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    wk->heap[i] = p;
    return true;
}

static bpe_pair heap_pop(bpe_work *wk)
{
    bpe_pair top = wk->heap[0], last = wk->heap[--wk->nheap];
    size_t i = 0, n = wk->nheap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && pair_less(&wk->heap[c + 1], &wk->heap[c]))
            c++;
        if (!pair_less(&wk->heap[c], &last))
            break;
        wk->heap[i] = wk->heap[c];
        i = c;
    }
    if (n > 0)
        wk->heap[i] = last;
    return top;
}

/* Rank of the pair (left, right), or -1 when merges.txt does not list it. */
static int32_t pair_rank(const df_clip_bpe *m, bpe_work *wk, int32_t left, int32_t right, bool *oom)
{
    const bpe_sym *a = &wk->sym[left], *b = &wk->sym[right];
    wk->key.len = 0;
    if (!df_byte_buf_append(&wk->key, wk->word.data + a->start, (size_t)a->len) ||
        !df_byte_buf_append(&wk->key, " ", 1) ||
        !df_byte_buf_append(&wk->key, wk->word.data + b->start, (size_t)b->len)) {
        *oom = true;
        return -1;
    }
    int32_t rank;
    return df_str_map_get(&m->ranks, wk->key.data, wk->key.len, &rank) ? rank : -1;
}

static bool push_pair(const df_clip_bpe *m, bpe_work *wk, int32_t left)
{
    if (left < 0)
        return true;
    int32_t right = wk->sym[left].next;
    if (right < 0)
        return true;
    bool oom = false;
    int32_t rank = pair_rank(m, wk, left, right, &oom);
    if (oom)
        return false;
    if (rank < 0)
        return true;
    bpe_pair p = {rank, left, right, wk->sym[left].ver, wk->sym[right].ver};
    return heap_push(wk, p);
}

static bool pair_valid(const bpe_work *wk, const bpe_pair *p)
{
    const bpe_sym *a = &wk->sym[p->left], *b = &wk->sym[p->right];
    return a->len > 0 && b->len > 0 && a->next == p->right && a->ver == p->lver &&
           b->ver == p->rver;
}

static void merge(bpe_work *wk, const bpe_pair *p)
{
    bpe_sym *a = &wk->sym[p->left], *b = &wk->sym[p->right];
    a->len += b->len;
    a->ver++;
    a->next = b->next;
    if (b->next >= 0)
        wk->sym[b->next].prev = p->left;
    b->len = 0;
}

static df_status token_to_id(const df_clip_bpe *m, const df_str_map *added, int64_t unk_id,
                             const char *tok, size_t len, df_i64_vec *out)
{
    int32_t id;
    int64_t v = unk_id;
    if (added && df_str_map_get(added, tok, len, &id))
        v = id;
    else if (df_str_map_get(&m->vocab, tok, len, &id))
        v = id;
    else if (unk_id < 0)
        return df_errorf(DF_E_FORMAT,
                         "clip tokenizer: token '%.*s' is not in vocab.json and the tokenizer "
                         "has no unk_token",
                         (int)(len > 64 ? 64 : len), tok);
    if (!df_i64_vec_push(out, v))
        return df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
    return DF_OK;
}

/* BPE of one match (its UTF-8 bytes), appending ids. */
static df_status bpe_match(const df_clip_bpe *m, bpe_work *wk, const uint8_t *bytes, size_t n,
                           const df_str_map *added, int64_t unk_id, df_i64_vec *out)
{
    const df_status oom = DF_E_OOM;
    wk->word.len = 0;
    wk->nheap = 0;
    if (!df_array_reserve((void **)&wk->sym, &wk->sym_cap, n, sizeof *wk->sym))
        return df_errorf(oom, "clip tokenizer: out of memory");
    for (size_t i = 0; i < n; i++) {
        bpe_sym *s = &wk->sym[i];
        s->start = (int32_t)wk->word.len;
        if (!df_byte_buf_put_cp(&wk->word, df_clip_byte_to_cp(bytes[i])))
            return df_errorf(oom, "clip tokenizer: out of memory");
        s->len = (int32_t)wk->word.len - s->start;
        s->prev = (int32_t)i - 1;
        s->next = i + 1 < n ? (int32_t)i + 1 : -1;
        s->ver = 0;
    }
    if (!df_byte_buf_append(&wk->word, "</w>", 4))
        return df_errorf(oom, "clip tokenizer: out of memory");
    wk->sym[n - 1].len += 4;

    for (size_t i = 0; i + 1 < n; i++)
        if (!push_pair(m, wk, (int32_t)i))
            return df_errorf(oom, "clip tokenizer: out of memory");

    while (wk->nheap > 0) {
        /* Every occurrence of the lowest-ranked pair is merged before the pairs these
         * merges create are considered (they are pushed afterwards). */
        int32_t rank = wk->heap[0].rank;
        wk->ntouched = 0;
        while (wk->nheap > 0 && wk->heap[0].rank == rank) {
            bpe_pair p = heap_pop(wk);
            if (!pair_valid(wk, &p))
                continue;
            merge(wk, &p);
            if (!df_array_reserve((void **)&wk->touched, &wk->touched_cap, wk->ntouched + 1,
                                  sizeof *wk->touched))
                return df_errorf(oom, "clip tokenizer: out of memory");
            wk->touched[wk->ntouched++] = p.left;
        }
        for (size_t t = 0; t < wk->ntouched; t++) {
            int32_t s = wk->touched[t];
            if (!push_pair(m, wk, wk->sym[s].prev) || !push_pair(m, wk, s))
                return df_errorf(oom, "clip tokenizer: out of memory");
        }
    }

    for (int32_t s = 0; s >= 0; s = wk->sym[s].next)
        DF_TRY(token_to_id(m, added, unk_id, wk->word.data + wk->sym[s].start,
                           (size_t)wk->sym[s].len, out));
    return DF_OK;
}

df_status df_clip_bpe_encode(const df_clip_bpe *m, const char *text, size_t len,
                             const df_str_map *added, int64_t unk_id, df_i64_vec *out)
{
    df_byte_buf norm = {0}, match = {0};
    df_cp_vec w = {0};
    bpe_work wk = {0};
    df_status s = df_clip_bpe_normalize(text, len, &norm);

    for (size_t i = 0; s == DF_OK && i < norm.len;) {
        size_t j = i;
        while (j < norm.len && norm.data[j] != ' ')
            j++;
        w.len = 0;
        if (!df_utf8_to_cps(norm.data + i, j - i, &w))
            s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
        for (size_t k = 0; s == DF_OK && k < w.len;) {
            size_t mlen;
            match_kind kind = next_match(w.data, w.len, k, &mlen);
            if (kind == MATCH_NONE) {
                k++;
                continue;
            }
            match.len = 0;
            for (size_t q = k; q < k + mlen && s == DF_OK; q++)
                if (!df_byte_buf_put_cp(&match, w.data[q]))
                    s = df_errorf(DF_E_OOM, "clip tokenizer: out of memory");
            if (s == DF_OK) {
                bool exact = kind == MATCH_SPECIAL && (strcmp(match.data, "<|startoftext|>") == 0 ||
                                                       strcmp(match.data, "<|endoftext|>") == 0);
                if (exact)
                    s = token_to_id(m, added, unk_id, match.data, match.len, out);
                else
                    s = bpe_match(m, &wk, (const uint8_t *)match.data, match.len, added, unk_id,
                                  out);
            }
            k += mlen;
        }
        i = j + 1;
    }
    df_byte_buf_free(&norm);
    df_byte_buf_free(&match);
    df_cp_vec_free(&w);
    work_free(&wk);
    return s;
}

/* ---- loading ---------------------------------------------------------------------------- */

/*
 * vocab.json: a non-empty object of token -> id, strict JSON (no duplicate token), each id
 * an integer in [0, number of tokens) and no id given twice, so ids and tokens map one to one.
 */
static df_status read_vocab(df_clip_bpe *m, const char *json, size_t len, const char *name)
{
    char file[1100];
    snprintf(file, sizeof file, "%s/vocab.json", name);
    df_json *root;
    DF_TRY(df_json_parse_string(json, len, file, &root));
    int64_t n = df_json_object_size(root);
    df_status s = DF_OK;
    if (df_json_type_of(root) != DF_JSON_OBJECT)
        s = df_errorf(DF_E_FORMAT, "%s: expected an object of token -> id, found %s", file,
                      df_json_type_name(df_json_type_of(root)));
    else if (n == 0)
        s = df_errorf(DF_E_FORMAT, "%s: the vocabulary is empty", file);
    else if (n >= (1 << 30))
        s = df_errorf(DF_E_FORMAT, "%s: %lld tokens; at most 2^30 are supported", file,
                      (long long)n);
    if (s == DF_OK) {
        m->id_count = n;
        m->id_entry = df_malloc((size_t)n * sizeof *m->id_entry);
        if (!m->id_entry)
            s = df_errorf(DF_E_OOM, "%s: out of memory", file);
    }
    for (int64_t i = 0; i < n && s == DF_OK; i++)
        m->id_entry[i] = -1;
    for (int64_t i = 0; i < n && s == DF_OK; i++) {
        const char *tok;
        const df_json *v = df_json_object_at(root, i, &tok);
        int64_t id;
        s = df_json_to_int(v, &id);
        if (s == DF_OK && (id < 0 || id >= n))
            s = df_errorf(DF_E_FORMAT, "%s: token '%.64s' has id %lld; the %lld tokens need "
                          "ids in [0, %lld)", file, tok, (long long)id, (long long)n,
                          (long long)n);
        size_t k;
        if (s == DF_OK && !df_str_map_put(&m->vocab, tok, strlen(tok), (int32_t)id, &k))
            s = df_errorf(DF_E_OOM, "%s: out of memory", file);
        if (s == DF_OK && m->id_entry[id] >= 0)
            s = df_errorf(DF_E_FORMAT, "%s: tokens '%.64s' and '%.64s' both have id %lld", file,
                          df_str_map_key(&m->vocab, &m->vocab.entries[m->id_entry[id]]), tok,
                          (long long)id);
        if (s == DF_OK)
            m->id_entry[id] = (int32_t)k;
    }
    df_json_free(root);
    return s;
}

/* The 1-based line of text[pos]. */
static int64_t line_of(const char *text, size_t pos)
{
    int64_t line = 1;
    for (size_t i = 0; i < pos; i++)
        line += text[i] == '\n';
    return line;
}

/* Python str.strip() / str.split() whitespace, on valid UTF-8. */
static size_t space_len(const char *s, size_t len)
{
    int32_t cp;
    size_t n = df_utf8_next(s, len, &cp);
    return df_py_isspace(cp) ? n : 0;
}

static df_status read_merges(df_clip_bpe *m, const char *text, size_t len, const char *name)
{
    char what[1024];
    snprintf(what, sizeof what, "%s/merges.txt", name);
    if (df_utf8_check(text, len, what) != DF_OK) { /* a file, not an argument: DF_E_FORMAT */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", df_error_message());
        return df_errorf(DF_E_FORMAT, "%s", msg);
    }
    /* read().strip().split("\n")[1 : 1 + DF_CLIP_MAX_MERGES] */
    size_t b = 0, e = len, n;
    while (b < e && (n = space_len(text + b, e - b)) > 0)
        b += n;
    while (e > b) {
        size_t k = e - 1;
        while (k > b && ((uint8_t)text[k] & 0xC0) == 0x80)
            k--;
        if (space_len(text + k, e - k) == 0)
            break;
        e = k;
    }
    df_byte_buf key = {0};
    df_status s = DF_OK;
    int64_t line = 0;
    for (size_t i = b; i <= e && s == DF_OK && line <= DF_CLIP_MAX_MERGES; line++) {
        size_t j = i;
        while (j < e && text[j] != '\n')
            j++;
        if (line > 0) {
            /* tuple(merge.split()): transformers ignores a line that is not two parts (it
             * can never match a pair); we refuse it, and a part that is no token */
            const char *part[3];
            size_t plen[3];
            int parts = 0;
            for (size_t k = i; k < j && parts < 3;) {
                if ((n = space_len(text + k, j - k)) > 0) {
                    k += n;
                    continue;
                }
                size_t q = k;
                while (q < j && space_len(text + q, j - q) == 0)
                    q += df_utf8_next(text + q, j - q, &(int32_t){0});
                part[parts] = text + k;
                plen[parts++] = q - k;
                k = q;
            }
            if (parts != 2) {
                s = df_errorf(DF_E_FORMAT, "%s:%lld: a merge is two tokens separated by a "
                              "space; this line has %s", what, (long long)line_of(text, i),
                              parts == 0 ? "none" : parts == 1 ? "one" : "more than two");
                break;
            }
            for (int k = 0; k < 2; k++) {
                if (!df_str_map_get(&m->vocab, part[k], plen[k], &(int32_t){0})) {
                    s = df_errorf(DF_E_FORMAT, "%s:%lld: token '%.*s' is not in vocab.json",
                                  what, (long long)line_of(text, i),
                                  (int)(plen[k] > 64 ? 64 : plen[k]), part[k]);
                    break;
                }
            }
            if (s == DF_OK) {
                key.len = 0;
                if (!df_byte_buf_append(&key, part[0], plen[0]) ||
                    !df_byte_buf_append(&key, " ", 1) ||
                    !df_byte_buf_append(&key, part[1], plen[1]) ||
                    !df_str_map_put(&m->ranks, key.data, key.len, (int32_t)(line - 1), NULL))
                    s = df_errorf(DF_E_OOM, "%s/merges.txt: out of memory", name);
            }
        }
        i = j + 1;
    }
    df_byte_buf_free(&key);
    return s;
}

df_status df_clip_bpe_create(const char *vocab_json, size_t vocab_len, const char *merges,
                             size_t merges_len, const char *name, df_clip_bpe **out)
{
    *out = NULL;
    df_clip_bpe *m = df_calloc(1, sizeof *m);
    if (!m)
        return df_errorf(DF_E_OOM, "%s: out of memory", name);
    df_str_map_init(&m->vocab);
    df_str_map_init(&m->ranks);
    df_status s = read_vocab(m, vocab_json, vocab_len, name);
    if (s == DF_OK)
        s = read_merges(m, merges, merges_len, name);
    if (s != DF_OK) {
        df_clip_bpe_free(m);
        return s;
    }
    *out = m;
    return DF_OK;
}

df_status df_clip_bpe_load(const char *dir, df_clip_bpe **out)
{
    *out = NULL;
    char path[4096];
    char *vocab = NULL, *merges = NULL;
    size_t vocab_len = 0, merges_len = 0;
    snprintf(path, sizeof path, "%s/vocab.json", dir);
    df_status s = df_read_file(path, &vocab, &vocab_len);
    if (s == DF_OK) {
        snprintf(path, sizeof path, "%s/merges.txt", dir);
        s = df_read_file(path, &merges, &merges_len);
    }
    if (s == DF_OK)
        s = df_clip_bpe_create(vocab, vocab_len, merges, merges_len, dir, out);
    df_free(vocab);
    df_free(merges);
    return s;
}

void df_clip_bpe_free(df_clip_bpe *m)
{
    if (!m)
        return;
    df_str_map_deinit(&m->vocab);
    df_str_map_deinit(&m->ranks);
    df_free(m->id_entry);
    df_free(m);
}

bool df_clip_bpe_token_id(const df_clip_bpe *m, const char *tok, size_t len, int32_t *id)
{
    return df_str_map_get(&m->vocab, tok, len, id);
}

const char *df_clip_bpe_id_to_token(const df_clip_bpe *m, int64_t id)
{
    if (id < 0 || id >= m->id_count || m->id_entry[id] < 0)
        return NULL;
    return df_str_map_key(&m->vocab, &m->vocab.entries[m->id_entry[id]]);
}

int64_t df_clip_bpe_vocab_count(const df_clip_bpe *m)
{
    return (int64_t)m->vocab.count;
}

int64_t df_clip_bpe_id_limit(const df_clip_bpe *m)
{
    return m->id_count;
}
