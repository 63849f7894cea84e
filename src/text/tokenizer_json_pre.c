/*
 * The normalizers and pre-tokenizers of tokenizer.json.
 *
 * Normalizers: the Unicode forms NFC, NFD, NFKC, NFKD (utf8proc, which follows the same
 * Unicode tables as the library's unicode-normalization crate up to the Unicode version of
 * each) and Sequence of them.
 *
 * Pre-tokenizers turn the text into pieces, step by step, each step applied to every piece
 * of the previous one:
 *  - Split: a regex ({"Regex": ...}, compiled by PCRE2 with UTF and UCP, so \p{L}, \s and
 *    case folding are Unicode's, as in the library's Oniguruma; JIT-compiled where PCRE2
 *    can) or a literal ({"String": ...}). Matches are found left to right; an empty match
 *    is skipped (the library keeps it, but empty pieces are dropped there too). `invert`
 *    swaps matches and the text between them; the behaviour (Removed, Isolated,
 *    MergedWithPrevious, MergedWithNext, Contiguous) decides how they become pieces,
 *    exactly as the library's SplitDelimiterBehavior does.
 *  - ByteLevel: optionally a space in front of a piece that does not start with one
 *    (add_prefix_space), optionally GPT-2's split regex (use_regex), then every byte of a
 *    piece written as its printable GPT-2 character (bytes_to_unicode()). trim_offsets only
 *    moves offsets, which we do not report.
 *  - Sequence of the above (nesting flattened).
 * Other pre-tokenizers or normalizers are DF_E_UNSUPPORTED naming their type.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "text/tokenizer_json_impl.h"

/* GPT-2's pattern, what ByteLevel with use_regex splits with. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

bool tj_pieces_push(tj_pieces *p, size_t begin, size_t end)
{
    if (!df_array_reserve((void **)&p->spans, &p->cap, p->n + 1, sizeof *p->spans))
        return false;
    p->spans[p->n++] = (tj_span){begin, end};
    return true;
}

void tj_pieces_free(tj_pieces *p)
{
    df_byte_buf_free(&p->text);
    df_free(p->spans);
    memset(p, 0, sizeof *p);
}

/* ---- normalizers --------------------------------------------------------------------------- */

static df_status norm_add(tj_normalizer *n, const cJSON *v, const char *file, int depth)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsObject(v) || !cJSON_IsString(type))
        return df_errorf(DF_E_FORMAT, "%s: normalizer: expected an object with a \"type\"", file);
    const char *t = type->valuestring;
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "normalizers");
        if (!cJSON_IsArray(list))
            return df_errorf(DF_E_FORMAT, "%s: normalizer Sequence: \"normalizers\" must be a "
                             "list", file);
        if (depth > 4)
            return df_errorf(DF_E_UNSUPPORTED, "%s: normalizer Sequences nested too deeply", file);
        for (const cJSON *it = list->child; it; it = it->next)
            DF_TRY(norm_add(n, it, file, depth + 1));
        return DF_OK;
    }
    static const char *const names[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int k = 0; k < 4; k++) {
        if (strcmp(t, names[k]) != 0)
            continue;
        if (n->n == TJ_MAX_STEPS)
            return df_errorf(DF_E_UNSUPPORTED, "%s: more than %d normalizers", file,
                             TJ_MAX_STEPS);
        n->steps[n->n++] = (tj_norm_kind)k;
        return DF_OK;
    }
    return df_errorf(DF_E_UNSUPPORTED, "%s: normalizer '%.64s' is not supported (NFC, NFD, NFKC, "
                     "NFKD and Sequence are)", file, t);
}

df_status tj_normalizer_parse(tj_normalizer *n, const cJSON *v, const char *file)
{
    memset(n, 0, sizeof *n);
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    return norm_add(n, v, file, 0);
}

df_status tj_normalize(const tj_normalizer *n, const char *text, size_t len, df_byte_buf *out)
{
    out->len = 0;
    if (!df_byte_buf_append(out, text, len))
        return df_errorf(DF_E_OOM, "tokenize: out of memory");
    for (int i = 0; i < n->n; i++) {
        static const utf8proc_option_t opts[] = {
            UTF8PROC_STABLE | UTF8PROC_COMPOSE,
            UTF8PROC_STABLE | UTF8PROC_DECOMPOSE,
            UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
            UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT,
        };
        utf8proc_uint8_t *mapped = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)out->data,
                                          (utf8proc_ssize_t)out->len, &mapped, opts[n->steps[i]]);
        if (m < 0) {
            free(mapped); /* utf8proc allocates with malloc */
            return df_errorf(m == UTF8PROC_ERROR_NOMEM ? DF_E_OOM : DF_E_ARG,
                             "tokenize: normalizing the text: %s", utf8proc_errmsg(m));
        }
        out->len = 0;
        bool ok = df_byte_buf_append(out, mapped, (size_t)m);
        free(mapped);
        if (!ok)
            return df_errorf(DF_E_OOM, "tokenize: out of memory");
    }
    return DF_OK;
}

/* ---- pre-tokenizers: reading ------------------------------------------------------------- */

static df_status compile_regex(const char *pattern, size_t len, const char *file,
                               const char *key, void **out)
{
    int err;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, len, PCRE2_UTF | PCRE2_UCP, &err, &at,
                                   NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return df_errorf(err == PCRE2_ERROR_HEAPLIMIT ? DF_E_OOM : DF_E_FORMAT,
                         "%s: %s: the regex does not compile (PCRE2: %s, at offset %zu)", file,
                         key, (const char *)msg, (size_t)at);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* when JIT is unavailable, matching interprets */
    *out = re;
    return DF_OK;
}

static df_status parse_behavior(const cJSON *v, const char *file, tj_split_behavior *out)
{
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(v, "behavior");
    for (int k = 0; cJSON_IsString(b) && k < 5; k++) {
        if (strcmp(b->valuestring, names[k]) == 0) {
            *out = (tj_split_behavior)k;
            return DF_OK;
        }
    }
    return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer Split: \"behavior\" must be one of Removed, "
                     "Isolated, MergedWithPrevious, MergedWithNext, Contiguous", file);
}

static df_status parse_split(tj_pre_step *s, const cJSON *v, const char *file)
{
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(v, "pattern");
    const cJSON *re = cJSON_GetObjectItemCaseSensitive(pat, "Regex");
    const cJSON *str = cJSON_GetObjectItemCaseSensitive(pat, "String");
    const cJSON *invert = cJSON_GetObjectItemCaseSensitive(v, "invert");
    if (invert && !cJSON_IsBool(invert))
        return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer Split: \"invert\" must be a boolean",
                         file);
    s->invert = cJSON_IsTrue(invert);
    DF_TRY(parse_behavior(v, file, &s->behavior));
    if (cJSON_IsString(re))
        return compile_regex(re->valuestring, strlen(re->valuestring), file,
                             "pre_tokenizer Split pattern.Regex", &s->regex);
    if (cJSON_IsString(str)) {
        s->literal_len = strlen(str->valuestring);
        s->literal = df_strdup(str->valuestring);
        if (!s->literal)
            return df_errorf(DF_E_OOM, "%s: out of memory", file);
        return DF_OK;
    }
    return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer Split: \"pattern\" must be {\"Regex\": "
                     "string} or {\"String\": string}", file);
}

static df_status parse_byte_level(tj_pre_step *s, const cJSON *v, const char *file)
{
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(v, "add_prefix_space");
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(v, "use_regex");
    if ((prefix && !cJSON_IsBool(prefix)) || (use_regex && !cJSON_IsBool(use_regex)))
        return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer ByteLevel: add_prefix_space and "
                         "use_regex must be booleans", file);
    s->byte_level = true;
    s->behavior = TJ_ISOLATED;
    s->add_prefix_space = !prefix || cJSON_IsTrue(prefix); /* the library's defaults: true */
    if (!use_regex || cJSON_IsTrue(use_regex))
        return compile_regex(gpt2_pattern, sizeof gpt2_pattern - 1, file,
                             "pre_tokenizer ByteLevel", &s->regex);
    return DF_OK;
}

static df_status pre_add(tj_pretok *p, const cJSON *v, const char *file, int depth)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsObject(v) || !cJSON_IsString(type))
        return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer: expected an object with a \"type\"",
                         file);
    const char *t = type->valuestring;
    if (strcmp(t, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "pretokenizers");
        if (!cJSON_IsArray(list))
            return df_errorf(DF_E_FORMAT, "%s: pre_tokenizer Sequence: \"pretokenizers\" must "
                             "be a list", file);
        if (depth > 4)
            return df_errorf(DF_E_UNSUPPORTED, "%s: pre_tokenizer Sequences nested too deeply",
                             file);
        for (const cJSON *it = list->child; it; it = it->next)
            DF_TRY(pre_add(p, it, file, depth + 1));
        return DF_OK;
    }
    bool split = strcmp(t, "Split") == 0, byte_level = strcmp(t, "ByteLevel") == 0;
    if (!split && !byte_level)
        return df_errorf(DF_E_UNSUPPORTED, "%s: pre_tokenizer '%.64s' is not supported (Split, "
                         "ByteLevel and Sequence are)", file, t);
    if (p->n == TJ_MAX_STEPS)
        return df_errorf(DF_E_UNSUPPORTED, "%s: more than %d pre-tokenizers", file, TJ_MAX_STEPS);
    tj_pre_step *s = &p->steps[p->n++];
    memset(s, 0, sizeof *s);
    return split ? parse_split(s, v, file) : parse_byte_level(s, v, file);
}

df_status tj_pretok_parse(tj_pretok *p, const cJSON *v, const char *file)
{
    memset(p, 0, sizeof *p);
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    return pre_add(p, v, file, 0);
}

void tj_pretok_free(tj_pretok *p)
{
    for (int i = 0; i < p->n; i++) {
        pcre2_code_free(p->steps[i].regex);
        df_free(p->steps[i].literal);
    }
    memset(p, 0, sizeof *p);
}

/* ---- pre-tokenizers: running --------------------------------------------------------------- */

int32_t tj_byte_to_cp(uint8_t b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)
        return b;
    int n = 0; /* the others take 256, 257, ... in byte order */
    for (int c = 0; c < b; c++)
        n += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
    return 256 + n;
}

typedef struct mark {
    size_t begin, end;
    bool match;
} mark;

typedef struct mark_list {
    mark *data;
    size_t n, cap;
} mark_list;

static bool mark_push(mark_list *l, size_t begin, size_t end, bool match)
{
    if (begin == end)
        return true;
    if (!df_array_reserve((void **)&l->data, &l->cap, l->n + 1, sizeof *l->data))
        return false;
    l->data[l->n++] = (mark){begin, end, match};
    return true;
}

/* Matches and the text between them, in order, covering s[0..len). */
static df_status find_marks(const tj_pre_step *st, pcre2_match_data *md, const char *s,
                            size_t len, mark_list *out)
{
    out->n = 0;
    size_t prev = 0, pos = 0;
    bool ok = true;
    df_status status = DF_OK;
    while (pos <= len && ok) {
        size_t b, e;
        if (st->regex) {
            int rc = pcre2_match(st->regex, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH)
                break;
            if (rc < 0) {
                PCRE2_UCHAR msg[160];
                pcre2_get_error_message(rc, msg, sizeof msg);
                status = df_errorf(DF_E_ARG, "tokenize: the split regex failed on the text "
                                   "(PCRE2: %s)", (const char *)msg);
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            b = ov[0];
            e = ov[1];
        } else {
            if (st->literal_len == 0 || len - pos < st->literal_len)
                break;
            const char *hit = memmem(s + pos, len - pos, st->literal, st->literal_len);
            if (!hit)
                break;
            b = (size_t)(hit - s);
            e = b + st->literal_len;
        }
        if (e == b) { /* empty match: step one character on */
            if (b >= len)
                break;
            int32_t cp;
            pos = b + df_utf8_next(s + b, len - b, &cp);
            continue;
        }
        ok = mark_push(out, prev, b, false) && mark_push(out, b, e, true);
        prev = pos = e;
    }
    if (status != DF_OK)
        return status;
    if (!ok || !mark_push(out, prev, len, false))
        return df_errorf(DF_E_OOM, "tokenize: out of memory");
    return DF_OK;
}

/* Appends the pieces one split step makes of s[0..len) (offsets relative to base). */
static df_status split_piece(const tj_pre_step *st, pcre2_match_data *md, const char *s,
                             size_t len, size_t base, mark_list *marks, tj_pieces *out)
{
    DF_TRY(find_marks(st, md, s, len, marks));
    bool ok = true, prev_match = false;
    size_t first = out->n;
    for (size_t i = 0; i < marks->n && ok; i++) {
        mark m = marks->data[i];
        bool match = m.match != st->invert;
        size_t b = base + m.begin, e = base + m.end;
        bool have = out->n > first;
        switch (st->behavior) {
        case TJ_REMOVED:
            if (!match)
                ok = tj_pieces_push(out, b, e);
            break;
        case TJ_ISOLATED:
            ok = tj_pieces_push(out, b, e);
            break;
        case TJ_MERGED_WITH_PREVIOUS:
            if (match && !prev_match && have)
                out->spans[out->n - 1].end = e;
            else
                ok = tj_pieces_push(out, b, e);
            break;
        case TJ_MERGED_WITH_NEXT: /* a match joins the piece after it */
            if (prev_match && !match && have) {
                out->spans[out->n - 1].end = e;
            } else {
                ok = tj_pieces_push(out, b, e);
            }
            break;
        case TJ_CONTIGUOUS:
            if (match == prev_match && have)
                out->spans[out->n - 1].end = e;
            else
                ok = tj_pieces_push(out, b, e);
            break;
        }
        prev_match = match;
    }
    return ok ? DF_OK : df_errorf(DF_E_OOM, "tokenize: out of memory");
}

/* ByteLevel's character mapping of every piece, into a new text. */
static df_status map_bytes(const tj_pieces *in, tj_pieces *out)
{
    for (size_t i = 0; i < in->n; i++) {
        size_t b = out->text.len;
        for (size_t k = in->spans[i].begin; k < in->spans[i].end; k++)
            if (!df_byte_buf_put_cp(&out->text, tj_byte_to_cp((uint8_t)in->text.data[k])))
                return df_errorf(DF_E_OOM, "tokenize: out of memory");
        if (!tj_pieces_push(out, b, out->text.len))
            return df_errorf(DF_E_OOM, "tokenize: out of memory");
    }
    return DF_OK;
}

/* One step over all pieces: *p is replaced by the result. */
static df_status run_step(const tj_pre_step *st, tj_pieces *p, mark_list *marks)
{
    tj_pieces next = {0};
    df_status s = DF_OK;
    if (st->byte_level && st->add_prefix_space) { /* a space before each piece lacking one */
        for (size_t i = 0; i < p->n && s == DF_OK; i++) {
            tj_span sp = p->spans[i];
            size_t b = next.text.len;
            bool ok = (p->text.data[sp.begin] == ' ' || df_byte_buf_append(&next.text, " ", 1)) &&
                      df_byte_buf_append(&next.text, p->text.data + sp.begin, sp.end - sp.begin) &&
                      tj_pieces_push(&next, b, next.text.len);
            if (!ok)
                s = df_errorf(DF_E_OOM, "tokenize: out of memory");
        }
        tj_pieces_free(p);
        *p = next;
        next = (tj_pieces){0};
    }
    if (s == DF_OK && (st->regex || st->literal)) {
        pcre2_match_data *md = NULL;
        if (st->regex && !(md = pcre2_match_data_create_from_pattern(st->regex, NULL)))
            s = df_errorf(DF_E_OOM, "tokenize: out of memory");
        next.text = p->text; /* the same text, cut finer */
        p->text = (df_byte_buf){0};
        for (size_t i = 0; i < p->n && s == DF_OK; i++)
            s = split_piece(st, md, next.text.data + p->spans[i].begin,
                            p->spans[i].end - p->spans[i].begin, p->spans[i].begin, marks, &next);
        pcre2_match_data_free(md);
        tj_pieces_free(p);
        *p = next;
        next = (tj_pieces){0};
    }
    if (s == DF_OK && st->byte_level) {
        s = map_bytes(p, &next);
        tj_pieces_free(p);
        *p = next;
        next = (tj_pieces){0};
    }
    tj_pieces_free(&next);
    return s;
}

df_status tj_pretokenize(const tj_pretok *p, const char *text, size_t len, tj_pieces *out)
{
    tj_pieces_free(out);
    if (len == 0)
        return DF_OK;
    if (!df_byte_buf_append(&out->text, text, len) || !tj_pieces_push(out, 0, len))
        return df_errorf(DF_E_OOM, "tokenize: out of memory");
    mark_list marks = {0};
    df_status s = DF_OK;
    for (int i = 0; i < p->n && s == DF_OK; i++)
        s = run_step(&p->steps[i], out, &marks);
    df_free(marks.data);
    return s;
}
