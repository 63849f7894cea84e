/*
 * tekken.json -> the tokenizer.json transformers' MistralConverter builds from it:
 *  - special tokens: "special_tokens" sorted by rank (ranks 0..n-1), then "<SPECIAL_i>"
 *    fillers up to config.default_num_special_tokens; ids 0..n-1, added tokens;
 *  - vocabulary: "vocab" in file order (cut to default_vocab_size - the special count), each
 *    entry's base64 token_bytes spelled byte-level (GPT-2's bytes_to_unicode), id = its
 *    index + the special count;
 *  - merges: for each token in rank order, every split into two tokens of the vocabulary,
 *    ordered by the left piece's rank then the right's (tiktoken merges the pair whose
 *    concatenation ranks lowest; that order gives the same result), with ignore_merges;
 *  - pre-tokenizer: Split on config.pattern (isolated), then ByteLevel without its regex.
 * What a FLUX.2 folder's tokenizer_config.json adds (the pipelines encode through the chat
 * template with add_special_tokens=False, so only padding matters to them) is written as
 * its config; the post-processor is the folder's "<s> A".
 */
#include "text/tekken.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "text/str_map.h"
#include "text/text_util.h"
#include "text/tokenizer_json_impl.h"

/* Bound on the merge search (the sum of squared token lengths): Mistral's own vocabulary
 * needs about 1e7; a file of long tokens would otherwise take minutes. */
#define MERGE_WORK_MAX ((uint64_t)1 << 31)

typedef struct tekken {
    const char *name;
    df_byte_buf bytes;   /* every token's bytes, back to back */
    size_t *off;         /* token i is bytes[off[i], off[i + 1]) */
    int64_t n;           /* tokens */
    df_str_map rank;     /* bytes -> rank */
    df_str_map specials; /* special token -> id */
    const char **special; /* borrowed from the document; NULL for a filler */
    int64_t nspecial;
    df_byte_buf out;
    bool oom;
} tekken;

static void put(tekken *t, const char *s)
{
    t->oom |= !df_byte_buf_append(&t->out, s, strlen(s));
}

static void putf(tekken *t, const char *fmt, long long v)
{
    char buf[64];
    snprintf(buf, sizeof buf, fmt, v);
    put(t, buf);
}

/* A JSON string of UTF-8 text. */
static void put_string(tekken *t, const char *s, size_t len)
{
    put(t, "\"");
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\' || c < 0x20)
            putf(t, "\\u%04llx", c);
        else
            t->oom |= !df_byte_buf_append(&t->out, s + i, 1);
    }
    put(t, "\"");
}

/* A JSON string of bytes spelled byte-level. */
static void put_byte_level(tekken *t, const char *s, size_t len)
{
    put(t, "\"");
    for (size_t i = 0; i < len; i++) {
        int32_t cp = tj_byte_to_cp((uint8_t)s[i]);
        if (cp == '"' || cp == '\\')
            putf(t, "\\u%04llx", cp);
        else
            t->oom |= !df_byte_buf_put_cp(&t->out, cp);
    }
    put(t, "\"");
}

static int b64_value(char c)
{
    return c >= 'A' && c <= 'Z'   ? c - 'A'
           : c >= 'a' && c <= 'z' ? c - 'a' + 26
           : c >= '0' && c <= '9' ? c - '0' + 52
           : c == '+'             ? 62
           : c == '/'             ? 63
                                  : -1;
}

/* Standard base64 with its padding ('=' only at the end), appended to b. Returns false for
 * anything else (*oom when memory ran out). */
static bool b64_decode(const char *s, df_byte_buf *b, bool *oom)
{
    size_t len = strlen(s);
    if (len == 0 || len % 4)
        return false;
    for (size_t i = 0; i < len; i += 4) {
        int pad = i + 4 == len ? (s[i + 3] == '=') + (s[i + 3] == '=' && s[i + 2] == '=') : 0;
        uint32_t v = 0;
        for (int k = 0; k < 4; k++) {
            int d = k < 4 - pad ? b64_value(s[i + k]) : 0;
            if (d < 0)
                return false;
            v = v << 6 | (uint32_t)d;
        }
        unsigned char out[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8),
                                (unsigned char)v};
        if (!df_byte_buf_append(b, out, (size_t)(3 - pad))) {
            *oom = true;
            return false;
        }
    }
    return true;
}

static const char *special_string(const tekken *t, int64_t i, char *buf, size_t cap);

/* Member `key` of `obj` as an integer in [0, limit); absent or null: dflt. */
static df_status get_count(const tekken *t, const cJSON *obj, const char *key, int64_t dflt,
                           int64_t limit, int64_t *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = dflt;
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    int32_t x;
    if (!tj_json_id(v, (double)limit, &x))
        return df_errorf(DF_E_FORMAT, "%s: %s must be an integer from 0 to %lld", t->name, key,
                         (long long)limit - 1);
    *out = x;
    return DF_OK;
}

static df_status read_specials(tekken *t, const cJSON *root, const cJSON *cfg)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "special_tokens");
    if (!list || cJSON_IsNull(list))
        return df_errorf(DF_E_UNSUPPORTED, "%s: a tekken.json without \"special_tokens\" (the "
                         "old layout, whose defaults only mistral-common knows) is not read",
                         t->name);
    if (!cJSON_IsArray(list))
        return df_errorf(DF_E_FORMAT, "%s: \"special_tokens\" is not an array", t->name);
    int64_t n = cJSON_GetArraySize(list), total;
    DF_TRY(get_count(t, cfg, "default_num_special_tokens", n, 1 << 20, &total));
    if (total < n)
        return df_errorf(DF_E_FORMAT, "%s: config.default_num_special_tokens is %lld, for %lld "
                         "special tokens", t->name, (long long)total, (long long)n);
    t->special = df_calloc((size_t)total + 1, sizeof *t->special);
    if (!t->special)
        return df_errorf(DF_E_OOM, "%s: out of memory", t->name);
    t->nspecial = total;
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        const cJSON *str = cJSON_GetObjectItemCaseSensitive(e, "token_str");
        int32_t rank;
        if (!tj_json_id(cJSON_GetObjectItemCaseSensitive(e, "rank"), (double)n, &rank) ||
            !cJSON_IsString(str) || t->special[rank])
            return df_errorf(DF_E_FORMAT, "%s: special_tokens[%lld] needs a string \"token_str\" "
                             "and a \"rank\" (the ranks 0 to %lld, each once)", t->name,
                             (long long)i, (long long)n - 1);
        t->special[rank] = str->valuestring;
        i++;
    }
    for (i = 0; i < total; i++) {
        char filler[48];
        const char *sp = special_string(t, i, filler, sizeof filler);
        if (!df_str_map_put(&t->specials, sp, strlen(sp), (int32_t)i, NULL))
            return df_errorf(DF_E_OOM, "%s: out of memory", t->name);
    }
    return DF_OK;
}

static df_status read_vocab(tekken *t, const cJSON *root, const cJSON *cfg)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    if (!cJSON_IsArray(list))
        return df_errorf(DF_E_FORMAT, "%s: \"vocab\" is missing or not an array", t->name);
    int64_t n = cJSON_GetArraySize(list), size;
    DF_TRY(get_count(t, cfg, "default_vocab_size", n + t->nspecial, INT32_MAX, &size));
    if (size < t->nspecial)
        return df_errorf(DF_E_FORMAT, "%s: config.default_vocab_size %lld is below the %lld "
                         "special tokens", t->name, (long long)size, (long long)t->nspecial);
    if (size - t->nspecial < n)
        n = size - t->nspecial; /* the padded rows mistral-common drops */
    t->off = df_malloc(((size_t)n + 1) * sizeof *t->off);
    if (!t->off)
        return df_errorf(DF_E_OOM, "%s: out of memory", t->name);
    t->off[0] = 0;
    int64_t i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        if (i == n)
            break;
        const cJSON *b64 = cJSON_GetObjectItemCaseSensitive(e, "token_bytes");
        bool oom = false;
        if (!cJSON_IsString(b64) || !b64_decode(b64->valuestring, &t->bytes, &oom))
            return oom ? df_errorf(DF_E_OOM, "%s: out of memory", t->name)
                       : df_errorf(DF_E_FORMAT, "%s: vocab[%lld].token_bytes is not base64 of "
                                   "one or more bytes", t->name, (long long)i);
        t->off[++i] = t->bytes.len;
    }
    t->n = n;
    for (i = 0; i < n; i++) {
        const char *b = t->bytes.data + t->off[i];
        size_t len = t->off[i + 1] - t->off[i];
        int32_t seen;
        if (df_str_map_get(&t->rank, b, len, &seen))
            return df_errorf(DF_E_FORMAT, "%s: vocab[%lld] repeats vocab[%d]'s bytes", t->name,
                             (long long)i, seen);
        if (!df_str_map_put(&t->rank, b, len, (int32_t)i, NULL))
            return df_errorf(DF_E_OOM, "%s: out of memory", t->name);
    }
    return DF_OK;
}

static bool rank_of(const tekken *t, const char *s, size_t len, int32_t *r)
{
    return df_str_map_get(&t->rank, s, len, r);
}

typedef struct split {
    int32_t left, right; /* ranks */
    size_t at;
} split;

static int split_cmp(const void *a, const void *b)
{
    const split *x = a, *y = b;
    if (x->left != y->left)
        return x->left < y->left ? -1 : 1;
    return (x->right > y->right) - (x->right < y->right);
}

/* Every merge of the vocabulary, in MistralConverter's order. */
static df_status put_merges(tekken *t)
{
    uint64_t work = 0;
    for (int64_t i = 0; i < t->n; i++) {
        size_t len = t->off[i + 1] - t->off[i];
        work += (uint64_t)len * len;
    }
    if (work > MERGE_WORK_MAX)
        return df_errorf(DF_E_FORMAT, "%s: the vocabulary's tokens are too long to derive its "
                         "merges (sum of squared lengths %llu, at most %llu)", t->name,
                         (unsigned long long)work, (unsigned long long)MERGE_WORK_MAX);
    split *local = NULL;
    size_t cap = 0;
    bool first = true;
    put(t, "[");
    for (int64_t i = 0; i < t->n && !t->oom; i++) {
        const char *s = t->bytes.data + t->off[i];
        size_t len = t->off[i + 1] - t->off[i], n = 0;
        if (len > cap) {
            split *grown = df_realloc(local, len * sizeof *local);
            if (!grown) {
                t->oom = true;
                break;
            }
            local = grown;
            cap = len;
        }
        for (size_t at = 1; at < len; at++) {
            split sp = {.at = at};
            if (rank_of(t, s, at, &sp.left) && rank_of(t, s + at, len - at, &sp.right))
                local[n++] = sp;
        }
        qsort(local, n, sizeof *local, split_cmp);
        for (size_t k = 0; k < n; k++) {
            put(t, first ? "[" : ",[");
            first = false;
            put_byte_level(t, s, local[k].at);
            put(t, ",");
            put_byte_level(t, s + local[k].at, len - local[k].at);
            put(t, "]");
        }
    }
    df_free(local);
    put(t, "]");
    return DF_OK;
}

/* Special token i: the file's, or the converter's filler. */
static const char *special_string(const tekken *t, int64_t i, char *buf, size_t cap)
{
    if (t->special[i])
        return t->special[i];
    snprintf(buf, cap, "<SPECIAL_%lld>", (long long)i);
    return buf;
}

static void put_added(tekken *t)
{
    put(t, "[");
    for (int64_t i = 0; i < t->nspecial; i++) {
        char filler[48];
        const char *s = special_string(t, i, filler, sizeof filler);
        putf(t, i ? ",{\"id\":%lld,\"content\":" : "{\"id\":%lld,\"content\":", i);
        put_string(t, s, strlen(s));
        put(t, ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,"
               "\"normalized\":false,\"special\":true}");
    }
    put(t, "]");
}

static int64_t special_id(const tekken *t, const char *s)
{
    for (int64_t i = 0; i < t->nspecial; i++)
        if (t->special[i] && strcmp(t->special[i], s) == 0)
            return i;
    return -1;
}

static void put_tokenizer_json(tekken *t, const char *pattern)
{
    put(t, "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":");
    put_added(t);
    put(t, ",\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
           "{\"type\":\"Split\",\"pattern\":{\"Regex\":");
    put_string(t, pattern, strlen(pattern));
    put(t, "},\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\","
           "\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":false}]},");
    int64_t bos = special_id(t, "<s>");
    if (bos >= 0) {
        put(t, "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":["
               "{\"SpecialToken\":{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\","
               "\"type_id\":0}}],\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[");
        putf(t, "%lld],\"tokens\":[\"<s>\"]}}},", bos);
    } else {
        put(t, "\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,"
               "\"trim_offsets\":false,\"use_regex\":true},");
    }
    put(t, "\"decoder\":null,\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
           "\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":false,"
           "\"byte_fallback\":false,\"ignore_merges\":true,\"vocab\":{");
    /* The special tokens are in the vocabulary too, and win over a token spelled the same
     * (the converter writes them into the same dict after the tokens). */
    df_byte_buf spelled = {0};
    for (int64_t i = 0; i < t->nspecial; i++) {
        char filler[48];
        const char *sp = special_string(t, i, filler, sizeof filler);
        put(t, i ? "," : "");
        put_string(t, sp, strlen(sp));
        putf(t, ":%lld", i);
    }
    for (int64_t i = 0; i < t->n && !t->oom; i++) {
        spelled.len = 0;
        const char *b = t->bytes.data + t->off[i];
        for (size_t k = 0; k < t->off[i + 1] - t->off[i]; k++)
            t->oom |= !df_byte_buf_put_cp(&spelled, tj_byte_to_cp((uint8_t)b[k]));
        int32_t id;
        if (t->oom || df_str_map_get(&t->specials, spelled.data, spelled.len, &id))
            continue;
        put(t, t->nspecial || i ? "," : "");
        put_byte_level(t, b, t->off[i + 1] - t->off[i]);
        putf(t, ":%lld", i + t->nspecial);
    }
    df_byte_buf_free(&spelled);
    put(t, "},\"merges\":");
}

/* FLUX.2's tokenizer_config.json, naming only the special tokens the file has. */
static void put_config(tekken *t)
{
    static const char *const keys[][2] = {{"bos_token", "<s>"}, {"eos_token", "</s>"},
                                          {"pad_token", "<pad>"}, {"unk_token", "<unk>"}};
    put(t, "{\"tokenizer_class\":\"LlamaTokenizerFast\",\"padding_side\":\"left\"");
    for (int i = 0; i < 4; i++)
        if (special_id(t, keys[i][1]) >= 0) {
            put(t, ",\"");
            put(t, keys[i][0]);
            put(t, "\":\"");
            put(t, keys[i][1]);
            put(t, "\"");
        }
    put(t, "}");
}

static df_status build(tekken *t, const char *text, size_t len, df_tok_json **out)
{
    if (len > DF_TEKKEN_MAX_BYTES)
        return df_errorf(DF_E_FORMAT, "%s: %zu bytes; a tekken.json is read up to %zu",
                         t->name, len, DF_TEKKEN_MAX_BYTES);
    /* cJSON, not df_json: tekken.json spells byte 0's token_str "\u0000", which df_json
     * refuses (token_str is not read; a NUL would end a special token's string early). */
    cJSON *root = cJSON_ParseWithLength(text, len);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return df_errorf(DF_E_FORMAT, "%s: not a JSON object", t->name);
    }
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(cfg, "pattern");
    df_status s = cJSON_IsObject(cfg) && cJSON_IsString(pattern)
                      ? DF_OK
                      : df_errorf(DF_E_FORMAT, "%s: not a tekken.json (no \"config\" object "
                                  "with a string \"pattern\")", t->name);
    if (s == DF_OK)
        s = read_specials(t, root, cfg);
    if (s == DF_OK)
        s = read_vocab(t, root, cfg);
    if (s == DF_OK) {
        put_tokenizer_json(t, pattern->valuestring);
        s = put_merges(t);
        put(t, "}}");
    }
    size_t json_len = t->out.len;
    if (s == DF_OK && !t->oom)
        put_config(t);
    if (s == DF_OK && t->oom)
        s = df_errorf(DF_E_OOM, "%s: out of memory", t->name);
    if (s == DF_OK)
        s = df_tok_json_create(t->out.data, json_len, t->out.data + json_len,
                               t->out.len - json_len, t->name, out);
    cJSON_Delete(root);
    return s;
}

df_status df_tekken_create(const char *text, size_t len, const char *name, df_tok_json **out)
{
    *out = NULL;
    tekken t = {.name = name ? name : "tekken.json"};
    df_str_map_init(&t.rank);
    df_str_map_init(&t.specials);
    df_status s = build(&t, text, len, out);
    df_byte_buf_free(&t.bytes);
    df_byte_buf_free(&t.out);
    df_str_map_deinit(&t.rank);
    df_str_map_deinit(&t.specials);
    df_free(t.off);
    df_free(t.special);
    return s;
}
