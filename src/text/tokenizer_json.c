/*
 * tokenizer.json tokenizers: the file, its added tokens and post-processor, and encoding as
 * transformers' PreTrainedTokenizerFast does it through the Rust tokenizers library.
 *
 * Encoding one text (Tokenizer::encode with the library's AddedVocabulary):
 *  1. added tokens with normalized=false are cut out of the raw text, leftmost first and
 *     longest at the same start (the library's leftmost-longest Aho-Corasick); lstrip /
 *     rstrip widen a match over the whitespace before / after it;
 *  2. every other stretch is normalized, then the added tokens with normalized=true are cut
 *     out of it the same way;
 *  3. what remains is pre-tokenized and each piece goes through BPE;
 *  4. with add_special_tokens, truncation keeps max_length minus the post-processor's
 *     tokens (from the right unless truncation_side is "left"), the post-processor's tokens
 *     go around the ids, and padding fills to max_length on the padding side with mask 0.
 * Every added token is matched, special or not (split_special_tokens=False); one whose
 * content is empty loads, as the library loads it, and never matches.
 *
 * From tokenizer_config.json, as transformers 5.x reads it: bos/eos/unk/pad_token (a string
 * or {"content": ...}; each must be a token of tokenizer.json), model_max_length,
 * padding_side and truncation_side. The class that tokenizer_class names decides the rest,
 * as AutoTokenizer resolves it:
 *  - LlamaTokenizer(Fast) over a tokenizer.json that is not byte-level (SentencePiece-style
 *    Metaspace) is LlamaTokenizer: left padding, and the post-processor rebuilt from
 *    add_bos_token (default true) and add_eos_token (default false);
 *  - every other class, LlamaTokenizer(Fast) over a byte-level tokenizer.json included (the
 *    tekken layout of Mistral 3 / FLUX.2 [dev]: AutoTokenizer loads it as the generic
 *    TokenizersBackend), pads on the side tokenizer.json's own "padding" names, else on the
 *    right (transformers 4.x padded the tekken layout on the left), truncates on the side
 *    its "truncation" names, else on the right, and keeps the file's post_processor unless
 *    the config names add_bos_token or add_eos_token: then both are rebuilt, a missing one
 *    false.
 * padding_side / truncation_side in the config override those defaults. The config's
 * added_tokens_decoder repeats tokenizer.json's added tokens and is not read.
 */
#include "text/tokenizer_json.h"

#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "io/path.h"
#include "text/tokenizer_json_impl.h"

typedef struct added_token {
    char *content;
    size_t len;
    int32_t id;
    bool lstrip, rstrip, normalized, special;
} added_token;

struct df_tok_json {
    tj_normalizer norm;
    tj_pretok pre;
    tj_bpe bpe;
    added_token *added;
    int nadded;
    df_str_map added_map;   /* content -> id */
    bool first_byte[2][256]; /* [normalized] bytes an added token can start with */
    df_i64_vec prefix, suffix; /* the post-processor's ids around a single sequence */
    df_tok_json_info info;
};

/* ---- reading tokenizer.json --------------------------------------------------------------- */

static bool token_id(const df_tok_json *t, const char *s, size_t len, int32_t *id)
{
    return df_str_map_get(&t->added_map, s, len, id) || tj_bpe_token_id(&t->bpe, s, len, id);
}

static df_status parse_added_one(df_tok_json *t, const cJSON *it, int i, const char *file)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
    added_token *a = &t->added[i];
    if (!tj_json_id(id, (double)INT32_MAX, &a->id) || !cJSON_IsString(content))
        return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d] needs an integer \"id\" >= 0 and a "
                         "string \"content\"", file, i);
    a->len = strlen(content->valuestring);
    static const char *const flags[] = {"lstrip", "rstrip", "normalized", "special",
                                        "single_word"};
    bool *dst[] = {&a->lstrip, &a->rstrip, &a->normalized, &a->special, NULL};
    for (int k = 0; k < 5; k++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(it, flags[k]);
        if (f && !cJSON_IsBool(f))
            return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d].%s must be a boolean", file, i,
                             flags[k]);
        if (dst[k])
            *dst[k] = cJSON_IsTrue(f);
        else if (cJSON_IsTrue(f))
            return df_errorf(DF_E_UNSUPPORTED, "%s: added_tokens[%d] ('%.64s'): single_word "
                             "added tokens are not supported", file, i, content->valuestring);
    }
    int32_t vid, prev;
    if (tj_bpe_token_id(&t->bpe, content->valuestring, a->len, &vid) && vid != a->id)
        return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d] '%.64s' has id %d but the "
                         "vocabulary gives it id %d", file, i, content->valuestring, a->id, vid);
    if (a->id < t->bpe.id_limit && t->bpe.id_to_token[a->id] &&
        strcmp(t->bpe.id_to_token[a->id], content->valuestring) != 0)
        return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d] '%.64s' has id %d, which the "
                         "vocabulary gives to '%.64s'", file, i, content->valuestring, a->id,
                         t->bpe.id_to_token[a->id]);
    for (int k = 0; k < i; k++)
        if (t->added[k].id == a->id)
            return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d] and [%d] share id %d", file, k,
                             i, a->id);
    if (df_str_map_get(&t->added_map, content->valuestring, a->len, &prev))
        return df_errorf(DF_E_FORMAT, "%s: added_tokens[%d]: '%.64s' is already added token "
                         "%d", file, i, content->valuestring, prev);
    a->content = df_strdup(content->valuestring);
    if (!a->content || !df_str_map_put(&t->added_map, a->content, a->len, a->id, NULL))
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    if (a->len > 0) /* an empty token is kept (its id stays taken) but never matches */
        t->first_byte[a->normalized][(uint8_t)a->content[0]] = true;
    return DF_OK;
}

static df_status parse_added(df_tok_json *t, const cJSON *list, const char *file)
{
    if (!list || cJSON_IsNull(list))
        return DF_OK;
    if (!cJSON_IsArray(list))
        return df_errorf(DF_E_FORMAT, "%s: added_tokens must be a list", file);
    int n = cJSON_GetArraySize(list);
    t->added = df_calloc((size_t)(n > 0 ? n : 1), sizeof *t->added);
    if (!t->added)
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    int i = 0;
    for (const cJSON *it = list->child; it; it = it->next, i++) {
        t->nadded = i + 1;
        DF_TRY(parse_added_one(t, it, i, file));
    }
    return DF_OK;
}

/* One TemplateProcessing "single" template: ids before and after $A. */
static df_status parse_template(df_tok_json *t, const cJSON *v, const char *file)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(v, "single");
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(v, "special_tokens");
    if (!cJSON_IsArray(single) || (specials && !cJSON_IsObject(specials)))
        return df_errorf(DF_E_FORMAT, "%s: post_processor TemplateProcessing needs a \"single\" "
                         "list and a \"special_tokens\" object", file);
    df_i64_vec before = {0}, after = {0};
    int nseq = 0, i = 0;
    df_status s = DF_OK;
    for (const cJSON *it = single->child; it && s == DF_OK; it = it->next, i++) {
        const cJSON *sp = cJSON_GetObjectItemCaseSensitive(it, "SpecialToken");
        const cJSON *seq = cJSON_GetObjectItemCaseSensitive(it, "Sequence");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(sp ? sp : seq, "id");
        if (!cJSON_IsString(name)) {
            s = df_errorf(DF_E_FORMAT, "%s: post_processor.single[%d] must be {\"SpecialToken\": "
                          "{\"id\": ...}} or {\"Sequence\": {\"id\": \"A\"}}", file, i);
        } else if (seq) {
            if (strcmp(name->valuestring, "A") != 0 || nseq++ > 0)
                s = df_errorf(DF_E_FORMAT, "%s: post_processor.single[%d]: a single template "
                              "holds sequence A once", file, i);
        } else {
            const cJSON *entry = cJSON_GetObjectItemCaseSensitive(specials, name->valuestring);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
            if (!cJSON_IsArray(ids) || cJSON_GetArraySize(ids) == 0)
                s = df_errorf(DF_E_FORMAT, "%s: post_processor.special_tokens['%.64s'] is "
                              "missing or has no \"ids\"", file, name->valuestring);
            for (const cJSON *x = ids ? ids->child : NULL; x && s == DF_OK; x = x->next) {
                int32_t id;
                if (!tj_json_id(x, (double)t->info.vocab_size, &id))
                    s = df_errorf(DF_E_FORMAT, "%s: post_processor.special_tokens['%.64s'].ids "
                                  "holds an id that is not a token", file, name->valuestring);
                else if (!df_i64_vec_push(nseq ? &after : &before, id))
                    s = df_errorf(DF_E_OOM, "%s: out of memory", file);
            }
        }
    }
    if (s == DF_OK && nseq != 1)
        s = df_errorf(DF_E_FORMAT, "%s: post_processor.single has no sequence $A", file);
    /* A later processor wraps what the earlier ones made. */
    for (size_t k = 0; k < t->prefix.len && s == DF_OK; k++)
        if (!df_i64_vec_push(&before, t->prefix.data[k]))
            s = df_errorf(DF_E_OOM, "%s: out of memory", file);
    for (size_t k = 0; k < after.len && s == DF_OK; k++)
        if (!df_i64_vec_push(&t->suffix, after.data[k]))
            s = df_errorf(DF_E_OOM, "%s: out of memory", file);
    df_i64_vec_free(&after);
    if (s != DF_OK) {
        df_i64_vec_free(&before);
        return s;
    }
    df_i64_vec_free(&t->prefix);
    t->prefix = before;
    return DF_OK;
}

static df_status parse_post(df_tok_json *t, const cJSON *v, const char *file, int depth)
{
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(v, "type");
    if (!cJSON_IsString(type))
        return df_errorf(DF_E_FORMAT, "%s: post_processor: expected an object with a \"type\"",
                         file);
    const char *name = type->valuestring;
    if (strcmp(name, "ByteLevel") == 0) /* moves offsets only */
        return DF_OK;
    if (strcmp(name, "TemplateProcessing") == 0)
        return parse_template(t, v, file);
    if (strcmp(name, "Sequence") == 0 && depth < 4) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(v, "processors");
        if (!cJSON_IsArray(list))
            return df_errorf(DF_E_FORMAT, "%s: post_processor Sequence: \"processors\" must be a "
                             "list", file);
        for (const cJSON *it = list->child; it; it = it->next)
            DF_TRY(parse_post(t, it, file, depth + 1));
        return DF_OK;
    }
    return df_errorf(DF_E_UNSUPPORTED, "%s: post_processor '%.64s' is not supported "
                     "(TemplateProcessing, ByteLevel and Sequence are)", file, name);
}

static df_status parse_tokenizer(df_tok_json *t, const cJSON *root, const char *file)
{
    DF_TRY(tj_bpe_parse(&t->bpe, cJSON_GetObjectItemCaseSensitive(root, "model"), file));
    DF_TRY(parse_added(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), file));
    t->info.vocab_size = t->bpe.id_limit;
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id >= t->info.vocab_size)
            t->info.vocab_size = t->added[i].id + 1;
    DF_TRY(tj_normalizer_parse(&t->norm, cJSON_GetObjectItemCaseSensitive(root, "normalizer"),
                               file));
    DF_TRY(tj_pretok_parse(&t->pre, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"),
                           file));
    return parse_post(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"), file, 0);
}

/* ---- reading tokenizer_config.json -------------------------------------------------------- */

/* The id of a special token named by key ("pad_token"): -1 when absent or null. */
static df_status config_token(const df_tok_json *t, const cJSON *cfg, const char *key,
                              const char *file, int64_t *out)
{
    *out = -1;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    if (!cJSON_IsString(v))
        return df_errorf(DF_E_FORMAT, "%s: \"%s\" must be a string, {\"content\": string} or "
                         "null", file, key);
    int32_t id;
    if (!token_id(t, v->valuestring, strlen(v->valuestring), &id))
        return df_errorf(DF_E_FORMAT, "%s: %s '%.64s' is not a token of tokenizer.json", file,
                         key, v->valuestring);
    *out = id;
    return DF_OK;
}

static df_status config_side(const cJSON *cfg, const char *key, bool dflt_left,
                             const char *file, bool *left)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    *left = dflt_left;
    if (!v || cJSON_IsNull(v))
        return DF_OK;
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    if (!strcmp(s, "left") || !strcmp(s, "right")) {
        *left = strcmp(s, "left") == 0;
        return DF_OK;
    }
    return df_errorf(DF_E_FORMAT, "%s: \"%s\" must be \"left\" or \"right\"", file, key);
}

static bool config_bool(const cJSON *cfg, const char *key, bool dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

/* tokenizer.json's own padding / truncation direction ({"direction": "Left"}): left? */
static bool json_side_left(const cJSON *root, const char *key, bool dflt)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, key);
    const cJSON *d = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, "direction") : NULL;
    return cJSON_IsString(d) ? strcmp(d->valuestring, "Left") == 0 : dflt;
}

static df_status read_config(df_tok_json *t, const cJSON *cfg, const cJSON *root,
                             bool byte_level, const char *file)
{
    df_tok_json_info *in = &t->info;
    DF_TRY(config_token(t, cfg, "bos_token", file, &in->bos_id));
    DF_TRY(config_token(t, cfg, "eos_token", file, &in->eos_id));
    DF_TRY(config_token(t, cfg, "unk_token", file, &in->unk_id));
    DF_TRY(config_token(t, cfg, "pad_token", file, &in->pad_id));
    const cJSON *cls = cJSON_GetObjectItemCaseSensitive(cfg, "tokenizer_class");
    bool llama = cJSON_IsString(cls) && !byte_level &&
                 (!strcmp(cls->valuestring, "LlamaTokenizerFast") ||
                  !strcmp(cls->valuestring, "LlamaTokenizer"));
    bool pad_left = llama || json_side_left(root, "padding", false);
    DF_TRY(config_side(cfg, "padding_side", pad_left, file, &in->padding_left));
    DF_TRY(config_side(cfg, "truncation_side", json_side_left(root, "truncation", false), file,
                       &in->truncation_left));
    const cJSON *mml = cJSON_GetObjectItemCaseSensitive(cfg, "model_max_length");
    if (cJSON_IsNumber(mml) && mml->valuedouble >= 1 && mml->valuedouble < 1e15)
        in->model_max_length = (int64_t)mml->valuedouble; /* larger: "no limit" */
    bool rebuild = llama || cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") ||
                   cJSON_GetObjectItemCaseSensitive(cfg, "add_eos_token");
    if (rebuild) { /* update_post_processor */
        bool bos = config_bool(cfg, "add_bos_token", llama);
        bool eos = config_bool(cfg, "add_eos_token", false);
        if (!llama) { /* TokenizersBackend drops a token the config does not define */
            bos = bos && in->bos_id >= 0;
            eos = eos && in->eos_id >= 0;
        }
        if ((bos && in->bos_id < 0) || (eos && in->eos_id < 0))
            return df_errorf(DF_E_FORMAT, "%s: add_%s_token is true but there is no %s_token",
                             file, bos && in->bos_id < 0 ? "bos" : "eos",
                             bos && in->bos_id < 0 ? "bos" : "eos");
        t->prefix.len = t->suffix.len = 0;
        if ((bos && !df_i64_vec_push(&t->prefix, in->bos_id)) ||
            (eos && !df_i64_vec_push(&t->suffix, in->eos_id)))
            return df_errorf(DF_E_OOM, "%s: out of memory", file);
    }
    return DF_OK;
}

/* ---- loading ------------------------------------------------------------------------------ */

static df_status parse_object(const char *text, size_t len, const char *file, cJSON **out)
{
    *out = cJSON_ParseWithLength(text, len);
    if (!*out)
        return df_errorf(DF_E_FORMAT, "%s: not valid JSON", file);
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return df_errorf(DF_E_FORMAT, "%s: expected a JSON object", file);
    }
    return DF_OK;
}

df_status df_tok_json_create(const char *json, size_t json_len, const char *config,
                             size_t config_len, const char *name, df_tok_json **out)
{
    *out = NULL;
    char file[4200], cfg_file[4200];
    snprintf(file, sizeof file, "%s/tokenizer.json", name ? name : ".");
    snprintf(cfg_file, sizeof cfg_file, "%s/tokenizer_config.json", name ? name : ".");
    df_tok_json *t = df_calloc(1, sizeof *t);
    if (!t)
        return df_errorf(DF_E_OOM, "%s: out of memory", file);
    df_str_map_init(&t->added_map);
    t->info.bos_id = t->info.eos_id = t->info.pad_id = t->info.unk_id = -1;

    cJSON *root = NULL, *cfg = NULL;
    df_status s = parse_object(json, json_len, file, &root);
    if (s == DF_OK)
        s = parse_tokenizer(t, root, file);
    if (s == DF_OK && config)
        s = parse_object(config, config_len, cfg_file, &cfg);
    if (s == DF_OK)
        s = read_config(t, cfg, root, memmem(json, json_len, "\"ByteLevel\"", 11) != NULL,
                        cfg_file); /* a missing config reads as {} */
    t->info.num_special = (int64_t)(t->prefix.len + t->suffix.len);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    if (s != DF_OK) {
        df_tok_json_free(t);
        return s;
    }
    *out = t;
    return DF_OK;
}

df_status df_tok_json_load(const char *dir, df_tok_json **out)
{
    *out = NULL;
    char path[4200], cfg_path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", dir);
    char *json = NULL, *cfg = NULL;
    size_t json_len = 0, cfg_len = 0;
    DF_TRY(df_read_file(path, &json, &json_len));
    df_status s = DF_OK;
    if (df_path_is_file(cfg_path))
        s = df_read_file(cfg_path, &cfg, &cfg_len);
    if (s == DF_OK)
        s = df_tok_json_create(json, json_len, cfg, cfg_len, dir, out);
    df_free(json);
    df_free(cfg);
    return s;
}

void df_tok_json_free(df_tok_json *t)
{
    if (!t)
        return;
    tj_bpe_free(&t->bpe);
    tj_pretok_free(&t->pre);
    for (int i = 0; i < t->nadded; i++)
        df_free(t->added[i].content);
    df_free(t->added);
    df_str_map_deinit(&t->added_map);
    df_i64_vec_free(&t->prefix);
    df_i64_vec_free(&t->suffix);
    df_free(t);
}

void df_tok_json_get_info(const df_tok_json *t, df_tok_json_info *out)
{
    *out = t->info;
}

const char *df_tok_json_id_to_piece(const df_tok_json *t, int64_t id)
{
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id == id)
            return t->added[i].content;
    if (id < 0 || id >= t->bpe.id_limit)
        return NULL;
    return t->bpe.id_to_token[id];
}

/* ---- encoding ----------------------------------------------------------------------------- */

/* Rust's char::is_whitespace: the Unicode White_Space property. */
static bool is_white(int32_t cp)
{
    return df_py_isspace(cp) && !(cp >= 0x1C && cp <= 0x1F);
}

/* Leftmost, then longest, match at or after `from` of an added token of the given kind
 * (normalized or not); -1 when none. */
static int find_added(const df_tok_json *t, bool normalized, const char *s, size_t len,
                      size_t from, size_t *at)
{
    for (size_t i = from; i < len; i++) {
        if (!t->first_byte[normalized][(uint8_t)s[i]])
            continue;
        int best = -1;
        for (int k = 0; k < t->nadded; k++) {
            const added_token *a = &t->added[k];
            if (a->normalized == normalized && a->len > 0 && a->len <= len - i &&
                memcmp(s + i, a->content, a->len) == 0 && (best < 0 || a->len > t->added[best].len))
                best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

typedef df_status (*text_fn)(const df_tok_json *t, const char *s, size_t len, df_i64_vec *ids,
                             void *scratch);

/* Cuts the added tokens of one kind out of s[0..len): their ids go to ids, the text between
 * them through fn. */
static df_status split_added(const df_tok_json *t, bool normalized, const char *s, size_t len,
                             text_fn fn, df_i64_vec *ids, void *scratch)
{
    size_t pos = 0;
    while (pos < len) {
        size_t at = 0;
        int k = t->nadded ? find_added(t, normalized, s, len, pos, &at) : -1;
        size_t text_end = k >= 0 ? at : len, next = k >= 0 ? at + t->added[k].len : len;
        if (k >= 0 && t->added[k].lstrip)
            text_end = df_utf8_rstrip(s, pos, text_end, is_white);
        if (k >= 0 && t->added[k].rstrip)
            next = df_utf8_lstrip(s, next, len, is_white);
        if (text_end > pos)
            DF_TRY(fn(t, s + pos, text_end - pos, ids, scratch));
        if (k < 0)
            break;
        if (!df_i64_vec_push(ids, t->added[k].id))
            return df_errorf(DF_E_OOM, "tokenize: out of memory");
        pos = next;
    }
    return DF_OK;
}

typedef struct scratch {
    df_byte_buf norm;
    tj_pieces pieces;
    tj_bpe_work bpe;
} scratch;

/* Text with no added tokens left: pre-tokenize, then BPE each piece. */
static df_status encode_plain(const df_tok_json *t, const char *s, size_t len, df_i64_vec *ids,
                              void *sc)
{
    scratch *w = sc;
    DF_TRY(tj_pretokenize(&t->pre, s, len, &w->pieces));
    for (size_t i = 0; i < w->pieces.n; i++) {
        tj_span sp = w->pieces.spans[i];
        DF_TRY(tj_bpe_encode(&t->bpe, w->pieces.text.data + sp.begin, sp.end - sp.begin, &w->bpe,
                             ids));
    }
    return DF_OK;
}

/* Raw text between non-normalized added tokens: normalize, then split the normalized ones. */
static df_status encode_raw(const df_tok_json *t, const char *s, size_t len, df_i64_vec *ids,
                            void *sc)
{
    scratch *w = sc;
    if (t->norm.n == 0)
        return split_added(t, true, s, len, encode_plain, ids, sc);
    DF_TRY(tj_normalize(&t->norm, s, len, &w->norm));
    df_byte_buf norm = w->norm; /* the next stretch reuses w->norm */
    w->norm = (df_byte_buf){0};
    df_status st = split_added(t, true, norm.data, norm.len, encode_plain, ids, sc);
    df_byte_buf_free(&norm);
    return st;
}

static df_status check_opts(const df_tok_json *t, const df_tokenize_opts *opts,
                            df_tokenize_opts *o)
{
    *o = opts ? *opts : (df_tokenize_opts){0};
    if ((o->pad || o->truncate) && o->max_length == 0) {
        o->max_length = t->info.model_max_length;
        if (o->max_length == 0)
            return df_errorf(DF_E_ARG, "tokenize: padding or truncation needs a max_length and "
                             "tokenizer_config.json gives no model_max_length");
    }
    if (o->max_length < 0 || o->max_length > DF_TOKENIZE_MAX_LENGTH)
        return df_errorf(DF_E_ARG, "tokenize: max_length %lld is outside [0, %lld]",
                         (long long)o->max_length, (long long)DF_TOKENIZE_MAX_LENGTH);
    if (o->pad && t->info.pad_id < 0)
        return df_errorf(DF_E_ARG, "tokenize: padding asked for but the tokenizer has no pad "
                         "token (tokenizer_config.json pad_token)");
    return DF_OK;
}

/* Truncation, the post-processor's ids and padding, into *out. */
static df_status finish(const df_tok_json *t, df_i64_vec *ids, const df_tokenize_opts *o,
                        bool special, df_tokens *out)
{
    const df_i64_vec *pre = special ? &t->prefix : NULL, *post = special ? &t->suffix : NULL;
    int64_t nspecial = special ? t->info.num_special : 0;
    if (o->truncate && (int64_t)ids->len + nspecial > o->max_length) {
        if (o->max_length < nspecial)
            return df_errorf(DF_E_ARG, "tokenize: max_length %lld cannot hold the %lld special "
                             "token(s)", (long long)o->max_length, (long long)nspecial);
        size_t keep = (size_t)(o->max_length - nspecial);
        if (t->info.truncation_left)
            memmove(ids->data, ids->data + (ids->len - keep), keep * sizeof *ids->data);
        ids->len = keep;
    }
    int64_t n = (int64_t)ids->len + nspecial;
    int64_t total = o->pad && o->max_length > n ? o->max_length : n;
    int64_t lead = t->info.padding_left ? total - n : 0;
    out->ids = df_malloc((size_t)(total > 0 ? total : 1) * sizeof *out->ids);
    out->attention_mask = df_malloc((size_t)(total > 0 ? total : 1) * sizeof *out->attention_mask);
    if (!out->ids || !out->attention_mask)
        return df_errorf(DF_E_OOM, "tokenize: out of memory");
    for (int64_t i = 0; i < total; i++) {
        out->ids[i] = t->info.pad_id;
        out->attention_mask[i] = i >= lead && i < lead + n;
    }
    int64_t k = lead;
    for (size_t i = 0; pre && i < pre->len; i++)
        out->ids[k++] = pre->data[i];
    for (size_t i = 0; i < ids->len; i++)
        out->ids[k++] = ids->data[i];
    for (size_t i = 0; post && i < post->len; i++)
        out->ids[k++] = post->data[i];
    out->count = total;
    return DF_OK;
}

df_status df_tok_json_encode(const df_tok_json *t, const char *text, size_t len,
                             const df_tokenize_opts *opts, bool add_special_tokens,
                             df_tokens *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!t || !out)
        return df_errorf(DF_E_ARG, "df_tokenizer_encode: tokenizer and out must not be NULL");
    if (!text && len > 0)
        return df_errorf(DF_E_ARG, "df_tokenizer_encode: text is NULL but len is %zu", len);
    df_tokenize_opts o;
    DF_TRY(check_opts(t, opts, &o));
    if (len > 0)
        DF_TRY(df_utf8_check(text, len, "prompt"));

    df_i64_vec ids = {0};
    scratch w = {0};
    df_status s = split_added(t, false, text, len, encode_raw, &ids, &w);
    df_byte_buf_free(&w.norm);
    tj_pieces_free(&w.pieces);
    tj_bpe_work_free(&w.bpe);
    if (s == DF_OK)
        s = finish(t, &ids, &o, add_special_tokens, out);
    df_i64_vec_free(&ids);
    if (s != DF_OK)
        df_tokens_deinit(out);
    return s;
}
