/*
 * Public tokenizer API (include/diffuse/tokenizer.h): loading a tokenizer folder, the
 * special and added tokens, and the steps transformers' slow tokenizers share around the
 * model-specific encoders (clip_bpe.c, t5_unigram.c).
 *
 * Special tokens are resolved as PreTrainedTokenizer.from_pretrained does:
 *  - tokenizer_config.json gives bos/eos/unk/sep/pad/cls/mask_token,
 *    additional_special_tokens, model_max_length and, in current files, added_tokens_decoder
 *    (id -> {content, lstrip, rstrip, ...});
 *  - only when it has no added_tokens_decoder (older folders) do special_tokens_map.json
 *    (overriding the config's names) and added_tokens.json (content -> id) count; but
 *    special_tokens_map.json, where there is one, must be a JSON object in every folder
 *    (tokenizer.json ones too), since transformers parses it whenever it is there;
 *  - T5Tokenizer first places <extra_id_0..extra_ids-1> at ids piece_count-1+extra_ids-i
 *    (lstrip and rstrip), unless additional_special_tokens names none of them;
 *  - every special token not yet an added token becomes one: its vocabulary id when the
 *    vocabulary has it, else the next free id.
 * The class defaults fill what the files leave out (CLIP: <|startoftext|>, <|endoftext|>
 * for eos/unk/pad; T5: </s>, <unk>, <pad>, 100 extra ids); a JSON null means "none".
 *
 * Encoding (PreTrainedTokenizer.tokenize + prepare_for_model):
 *  1. added-token strings are cut out of the text, leftmost first and longest at the same
 *     start (transformers' trie split); an added token with rstrip/lstrip eats the Python
 *     whitespace after/before it; single_word is not supported (no tokenizer here sets it);
 *  2. every other piece of text goes through the model's encoder;
 *  3. truncation keeps max_length - (number of special tokens) text ids, the special tokens
 *     are added (CLIP: BOS + ids + EOS; T5: ids + EOS unless the last id already is EOS, as
 *     T5Tokenizer does), and padding appends the pad id with attention mask 0.
 * Where transformers would only log an error (truncation that cannot fit the special
 * tokens), we return DF_E_ARG instead.
 */
#include <diffuse/gguf.h>
#include <diffuse/json.h>
#include <diffuse/safetensors.h>
#include <diffuse/tokenizer.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "text/clip_bpe.h"
#include "text/str_map.h"
#include "text/t5_unigram.h"
#include "text/tekken.h"
#include "text/text_util.h"
#include "text/tokenizer_json.h"

typedef struct added_token {
    char *content;
    size_t len;
    int64_t id;
    bool lstrip, rstrip;
} added_token;

struct df_tokenizer {
    df_tokenizer_type type;
    df_clip_bpe *clip;
    df_t5_unigram *t5;
    df_tok_json *json; /* DF_TOKENIZER_BPE_JSON: it does everything itself */
    added_token *added; /* in the order transformers adds them */
    int nadded;
    df_str_map added_map; /* content -> id */
    bool first_byte[256]; /* bytes an added token can start with */
    int64_t bos_id, eos_id, pad_id, unk_id;
    int64_t model_max_length;
    int64_t vocab_size;
};

/* ---- special-token names ---------------------------------------------------------------- */

enum { SP_BOS, SP_EOS, SP_UNK, SP_SEP, SP_PAD, SP_CLS, SP_MASK, SP_COUNT };
static const char *const sp_keys[SP_COUNT] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

typedef struct token_spec {
    const char *content; /* NULL = none */
    bool lstrip, rstrip;
    const char *from; /* the file (or default) that names it, for messages */
} token_spec;

typedef struct config {
    df_json *tok_config, *special_map, *added_json; /* owned; each may be NULL */
    token_spec sp[SP_COUNT];
    token_spec *extra; /* additional_special_tokens */
    int nextra;
    bool extra_given;
    const df_json *added_decoder; /* tokenizer_config's added_tokens_decoder */
    int64_t model_max_length;     /* 0 = not given */
    int64_t extra_ids;            /* T5 */
    bool legacy;                  /* T5 */
} config;

static void config_free(config *c)
{
    df_json_free(c->tok_config);
    df_json_free(c->special_map);
    df_json_free(c->added_json);
    df_free(c->extra);
}

/* Parses dir/file (strict JSON, an object at the top) into *out; NULL when there is none. */
static df_status read_json(const char *dir, const char *file, df_json **out)
{
    *out = NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    if (!df_path_is_file(path))
        return DF_OK;
    DF_TRY(df_json_parse_file(path, out));
    if (df_json_type_of(*out) != DF_JSON_OBJECT) {
        df_status s = df_errorf(DF_E_FORMAT, "%s: expected a JSON object, found %s", path,
                                df_json_type_name(df_json_type_of(*out)));
        df_json_free(*out);
        *out = NULL;
        return s;
    }
    return DF_OK;
}

/* "<file>: key 'path'" of a node, for messages. */
static const char *where(const df_json *v, char *buf, size_t cap)
{
    char path[256];
    snprintf(buf, cap, "%s: key '%s'", df_json_source(v), df_json_path(v, path, sizeof path));
    return buf;
}

/* A token given as "string", {"content": "string", "lstrip": bool, "rstrip": bool} or null. */
static df_status parse_token(const df_json *v, token_spec *out)
{
    memset(out, 0, sizeof *out);
    out->from = df_json_source(v);
    if (df_json_type_of(v) == DF_JSON_STRING) {
        out->content = df_json_string(v);
        return DF_OK;
    }
    if (df_json_type_of(v) == DF_JSON_OBJECT) {
        DF_TRY(df_json_get_string(v, "content", &out->content));
        DF_TRY(df_json_get_bool_or(v, "lstrip", false, &out->lstrip));
        return df_json_get_bool_or(v, "rstrip", false, &out->rstrip);
    }
    if (df_json_type_of(v) == DF_JSON_NULL)
        return DF_OK;
    char w[512];
    return df_errorf(DF_E_FORMAT, "%s: a token is a string, an object with \"content\", or "
                     "null; found %s", where(v, w, sizeof w),
                     df_json_type_name(df_json_type_of(v)));
}

/* Reads the special names of one JSON object into c (later files override earlier). */
static df_status read_names(config *c, const df_json *obj)
{
    for (int k = 0; k < SP_COUNT; k++) {
        const df_json *v = df_json_get(obj, sp_keys[k]);
        if (v)
            DF_TRY(parse_token(v, &c->sp[k]));
    }
    const df_json *list = df_json_get(obj, "additional_special_tokens");
    if (df_json_is_null(list))
        return DF_OK;
    DF_TRY(df_json_get_array(obj, "additional_special_tokens", &list));
    int64_t n = df_json_array_size(list);
    if (n > 100000)
        return df_errorf(DF_E_FORMAT, "%s: key 'additional_special_tokens': %lld tokens; at "
                         "most 100000", df_json_source(obj), (long long)n);
    token_spec *extra = df_calloc((size_t)(n > 0 ? n : 1), sizeof *extra);
    if (!extra)
        return df_errorf(DF_E_OOM, "%s: out of memory", df_json_source(obj));
    for (int64_t i = 0; i < n; i++) {
        const df_json *it = df_json_array_get(list, i);
        df_status s = parse_token(it, &extra[i]);
        if (s == DF_OK && !extra[i].content) {
            char w[512];
            s = df_errorf(DF_E_FORMAT, "%s: expected a token, found null", where(it, w, sizeof w));
        }
        if (s != DF_OK) {
            df_free(extra);
            return s;
        }
    }
    df_free(c->extra);
    c->extra = extra;
    c->nextra = (int)n;
    c->extra_given = true;
    return DF_OK;
}

/* model_max_length: a positive integer; "very large" (transformers writes 1e30) = no limit. */
static df_status read_max_length(const df_json *tc, int64_t *out)
{
    const df_json *v = df_json_get(tc, "model_max_length");
    if (df_json_is_null(v))
        return DF_OK;
    double d;
    DF_TRY(df_json_to_double(v, &d));
    if (d > 1e15) {
        *out = 0;
        return DF_OK;
    }
    DF_TRY(df_json_to_int(v, out));
    if (*out < 1) {
        char w[512];
        return df_errorf(DF_E_FORMAT, "%s: %lld; expected a positive integer",
                         where(v, w, sizeof w), (long long)*out);
    }
    return DF_OK;
}

static df_status read_config(config *c, const char *dir, df_tokenizer_type type)
{
    const char *dflt = type == DF_TOKENIZER_CLIP_BPE ? "CLIPTokenizer's defaults"
                                                     : "T5Tokenizer's defaults";
    if (type == DF_TOKENIZER_CLIP_BPE) {
        c->sp[SP_BOS].content = "<|startoftext|>";
        c->sp[SP_EOS].content = c->sp[SP_UNK].content = c->sp[SP_PAD].content = "<|endoftext|>";
        c->model_max_length = 77;
    } else {
        c->sp[SP_EOS].content = "</s>";
        c->sp[SP_UNK].content = "<unk>";
        c->sp[SP_PAD].content = "<pad>";
    }
    for (int k = 0; k < SP_COUNT; k++)
        c->sp[k].from = dflt;
    c->extra_ids = 100;
    c->legacy = true;

    DF_TRY(read_json(dir, "tokenizer_config.json", &c->tok_config));
    if (c->tok_config) {
        const df_json *tc = c->tok_config;
        DF_TRY(read_names(c, tc));
        DF_TRY(read_max_length(tc, &c->model_max_length));
        DF_TRY(df_json_get_int_or(tc, "extra_ids", 100, &c->extra_ids));
        DF_TRY(df_json_get_bool_or(tc, "legacy", true, &c->legacy));
        const df_json *dec = df_json_get(tc, "added_tokens_decoder");
        if (!df_json_is_null(dec)) {
            if (df_json_type_of(dec) != DF_JSON_OBJECT)
                return df_errorf(DF_E_FORMAT,
                                 "%s/tokenizer_config.json: \"added_tokens_decoder\" must be an "
                                 "object of id -> token, found %s",
                                 dir, df_json_type_name(df_json_type_of(dec)));
            c->added_decoder = dec;
        }
    }
    /* transformers reads special_tokens_map.json whenever it is there, so one that is not a
     * JSON object fails the load; its names count only without added_tokens_decoder */
    DF_TRY(read_json(dir, "special_tokens_map.json", &c->special_map));
    if (!c->added_decoder) { /* the legacy files count only without added_tokens_decoder */
        if (c->special_map)
            DF_TRY(read_names(c, c->special_map));
        DF_TRY(read_json(dir, "added_tokens.json", &c->added_json));
    }
    if (c->extra_ids < 0 || c->extra_ids > 1000)
        return df_errorf(DF_E_FORMAT, "%s/tokenizer_config.json: key 'extra_ids' is %lld; "
                         "expected 0 to 1000", dir, (long long)c->extra_ids);
    return DF_OK;
}

/* ---- added tokens ------------------------------------------------------------------------ */

/* Sets (or replaces) the added token with this id; a later definition of the same content
 * wins the content -> id lookup. */
static df_status add_token(df_tokenizer *t, const char *content, int64_t id, bool lstrip,
                           bool rstrip)
{
    size_t len = strlen(content);
    if (len == 0)
        return DF_OK;
    int slot = -1;
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].id == id)
            slot = i;
    if (slot < 0) {
        added_token *a = df_realloc(t->added, (size_t)(t->nadded + 1) * sizeof *a);
        if (!a)
            return df_errorf(DF_E_OOM, "tokenizer: out of memory");
        t->added = a;
        slot = t->nadded++;
        memset(&t->added[slot], 0, sizeof *t->added);
    }
    added_token *a = &t->added[slot];
    char *copy = df_strdup(content);
    if (!copy)
        return df_errorf(DF_E_OOM, "tokenizer: out of memory");
    df_free(a->content);
    *a = (added_token){copy, len, id, lstrip, rstrip};
    return DF_OK;
}

static bool added_lookup(const df_tokenizer *t, const char *s, size_t len, int64_t *id)
{
    int32_t v;
    if (!df_str_map_get(&t->added_map, s, len, &v))
        return false;
    *id = v;
    return true;
}

static df_status rebuild_added_map(df_tokenizer *t)
{
    df_str_map_deinit(&t->added_map);
    df_str_map_init(&t->added_map);
    memset(t->first_byte, 0, sizeof t->first_byte);
    for (int i = 0; i < t->nadded; i++) {
        if (!df_str_map_put(&t->added_map, t->added[i].content, t->added[i].len,
                            (int32_t)t->added[i].id, NULL))
            return df_errorf(DF_E_OOM, "tokenizer: out of memory");
        t->first_byte[(uint8_t)t->added[i].content[0]] = true;
    }
    return DF_OK;
}

/* The base vocabulary's id of a token string, or -1. */
static int64_t base_id(const df_tokenizer *t, const char *s)
{
    size_t len = strlen(s);
    if (t->type == DF_TOKENIZER_CLIP_BPE) {
        int32_t id;
        return df_clip_bpe_token_id(t->clip, s, len, &id) ? id : -1;
    }
    int32_t id = df_t5_unigram_piece_to_id(t->t5, s, len);
    const char *p = df_t5_unigram_piece(t->t5, id);
    return p && strcmp(p, s) == 0 ? id : -1;
}

static int64_t base_count(const df_tokenizer *t)
{
    return t->type == DF_TOKENIZER_CLIP_BPE ? df_clip_bpe_vocab_count(t->clip)
                                            : df_t5_unigram_piece_count(t->t5);
}

/* Makes a special token an added token. `key` names it for messages; NULL for a token the
 * class itself adds (T5's extra ids), which gets the next free id when the vocabulary does
 * not have it. Any other special token must be in the vocabulary or an added token already:
 * transformers would give it an id past the vocabulary, which no embedding row holds. */
static df_status ensure_special(df_tokenizer *t, const token_spec *spec, const char *key,
                                int64_t *next_id)
{
    int64_t id;
    if (!spec->content || !spec->content[0] ||
        added_lookup(t, spec->content, strlen(spec->content), &id))
        return DF_OK;
    id = base_id(t, spec->content);
    if (id < 0 && key)
        return df_errorf(DF_E_FORMAT, "%s: %s '%.64s' is neither in the vocabulary (%s) nor an "
                         "added token", spec->from ? spec->from : "tokenizer", key,
                         spec->content,
                         t->type == DF_TOKENIZER_CLIP_BPE ? "vocab.json" : "spiece.model");
    if (id < 0)
        id = (*next_id)++;
    int before = t->nadded;
    DF_TRY(add_token(t, spec->content, id, spec->lstrip, spec->rstrip));
    if (t->nadded == before) /* replaced the token that had this id */
        return rebuild_added_map(t);
    if (!df_str_map_put(&t->added_map, spec->content, strlen(spec->content), (int32_t)id, NULL))
        return df_errorf(DF_E_OOM, "tokenizer: out of memory");
    t->first_byte[(uint8_t)spec->content[0]] = true;
    return DF_OK;
}

static df_status read_added(df_tokenizer *t, const config *c, const char *dir)
{
    if (t->type == DF_TOKENIZER_T5_UNIGRAM) { /* T5Tokenizer.__init__'s extra ids */
        int nextra_named = 0;
        for (int i = 0; i < c->nextra; i++)
            nextra_named += strstr(c->extra[i].content, "<extra_id_") != NULL;
        if (c->extra_given && nextra_named > 0 && c->extra_ids > 0 && nextra_named != c->extra_ids)
            return df_errorf(DF_E_FORMAT,
                             "%s: extra_ids is %lld but additional_special_tokens names %d "
                             "<extra_id_N> tokens",
                             dir, (long long)c->extra_ids, nextra_named);
        int64_t n = c->extra_given ? nextra_named : c->extra_ids;
        int64_t pieces = df_t5_unigram_piece_count(t->t5);
        for (int64_t i = 0; i < n; i++) {
            char name[32];
            snprintf(name, sizeof name, "<extra_id_%lld>", (long long)i);
            DF_TRY(add_token(t, name, pieces - 1 + c->extra_ids - i, true, true));
        }
    }
    if (c->added_decoder) {
        for (int64_t i = 0; i < df_json_object_size(c->added_decoder); i++) {
            const char *key;
            const df_json *it = df_json_object_at(c->added_decoder, i, &key);
            char *end;
            errno = 0;
            long long id = strtoll(key, &end, 10);
            if (*end || end == key || key[0] == '-' || key[0] == '+' || errno || id > INT32_MAX)
                return df_errorf(DF_E_FORMAT,
                                 "%s/tokenizer_config.json: key 'added_tokens_decoder.%.32s': "
                                 "expected a token id (a decimal integer in [0, 2^31))",
                                 dir, key);
            token_spec spec;
            DF_TRY(parse_token(it, &spec));
            if (!spec.content || df_json_type_of(it) != DF_JSON_OBJECT)
                return df_errorf(DF_E_FORMAT,
                                 "%s/tokenizer_config.json: key 'added_tokens_decoder.%.32s': "
                                 "expected {\"content\": ...}", dir, key);
            DF_TRY(add_token(t, spec.content, id, spec.lstrip, spec.rstrip));
        }
    } else if (c->added_json) {
        for (int64_t i = 0; i < df_json_object_size(c->added_json); i++) {
            const char *content;
            const df_json *it = df_json_object_at(c->added_json, i, &content);
            int64_t id;
            DF_TRY(df_json_to_int(it, &id));
            if (id < 0 || id > INT32_MAX) {
                char w[512];
                return df_errorf(DF_E_FORMAT, "%s: id %lld; expected an integer in [0, 2^31)",
                                 where(it, w, sizeof w), (long long)id);
            }
            DF_TRY(add_token(t, content, id, false, false));
        }
    }
    DF_TRY(rebuild_added_map(t));

    /* Special tokens that are not added tokens yet become ones (PreTrainedTokenizer.__init__,
     * in the order bos, eos, unk, sep, pad, cls, mask, additional_special_tokens). */
    int64_t next_id = base_count(t);
    for (int i = 0; i < t->nadded; i++)
        next_id += base_id(t, t->added[i].content) < 0;
    for (int k = 0; k < SP_COUNT; k++)
        DF_TRY(ensure_special(t, &c->sp[k], sp_keys[k], &next_id));
    bool named = false;
    for (int i = 0; i < c->nextra; i++) {
        named |= strstr(c->extra[i].content, "<extra_id_") != NULL;
        char key[48];
        snprintf(key, sizeof key, "additional_special_tokens[%d]", i);
        DF_TRY(ensure_special(t, &c->extra[i], key, &next_id));
    }
    if (t->type == DF_TOKENIZER_T5_UNIGRAM && c->extra_given && !named) {
        for (int64_t i = 0; i < c->extra_ids; i++) { /* appended to additional_special_tokens */
            char name[32];
            snprintf(name, sizeof name, "<extra_id_%lld>", (long long)i);
            token_spec spec = {name, false, false, NULL};
            DF_TRY(ensure_special(t, &spec, NULL, &next_id));
        }
    }
    return DF_OK;
}

static int64_t special_id(const df_tokenizer *t, const char *content)
{
    int64_t id;
    if (!content)
        return -1;
    if (added_lookup(t, content, strlen(content), &id))
        return id;
    return base_id(t, content);
}

/* ---- loading ------------------------------------------------------------------------------ */

df_status df_tokenizer_load(const char *dir, df_tokenizer **out)
{
    *out = NULL;
    if (!dir)
        return df_errorf(DF_E_ARG, "df_tokenizer_load: dir is NULL");
    char vocab[4096], merges[4096], spiece[4096], fast[4096];
    snprintf(vocab, sizeof vocab, "%s/vocab.json", dir);
    snprintf(merges, sizeof merges, "%s/merges.txt", dir);
    snprintf(spiece, sizeof spiece, "%s/spiece.model", dir);
    snprintf(fast, sizeof fast, "%s/tokenizer.json", dir);

    df_tokenizer *t = df_calloc(1, sizeof *t);
    if (!t)
        return df_errorf(DF_E_OOM, "%s: out of memory", dir);
    df_str_map_init(&t->added_map);
    df_status s;
    if (df_path_is_file(vocab) && df_path_is_file(merges)) {
        t->type = DF_TOKENIZER_CLIP_BPE;
        s = df_clip_bpe_load(dir, &t->clip);
    } else if (df_path_is_file(spiece)) {
        t->type = DF_TOKENIZER_T5_UNIGRAM;
        s = df_t5_unigram_load(spiece, &t->t5);
    } else if (df_path_is_file(fast)) {
        t->type = DF_TOKENIZER_BPE_JSON;
        s = df_tok_json_load(dir, &t->json);
        df_json *special_map = NULL; /* read and checked as the slow tokenizers read it */
        if (s == DF_OK)
            s = read_json(dir, "special_tokens_map.json", &special_map);
        df_json_free(special_map);
        if (s == DF_OK) {
            *out = t;
            return DF_OK;
        }
    } else {
        s = df_errorf(DF_E_IO,
                      "%s: no tokenizer files (expected vocab.json + merges.txt, "
                      "spiece.model or tokenizer.json)",
                      dir);
    }

    config c = {0};
    if (s == DF_OK && t->type != DF_TOKENIZER_BPE_JSON)
        s = read_config(&c, dir, t->type);
    if (s == DF_OK && t->type == DF_TOKENIZER_T5_UNIGRAM && !c.legacy)
        s = df_errorf(DF_E_UNSUPPORTED,
                      "%s/tokenizer_config.json: \"legacy\": false (the non-legacy T5Tokenizer "
                      "handling of spaces after special tokens) is not supported",
                      dir);
    if (s == DF_OK)
        s = read_added(t, &c, dir);
    if (s == DF_OK) {
        t->bos_id = t->type == DF_TOKENIZER_CLIP_BPE ? special_id(t, c.sp[SP_BOS].content) : -1;
        t->eos_id = special_id(t, c.sp[SP_EOS].content);
        t->pad_id = special_id(t, c.sp[SP_PAD].content);
        t->unk_id = special_id(t, c.sp[SP_UNK].content);
        if (t->type == DF_TOKENIZER_T5_UNIGRAM && t->unk_id < 0)
            t->unk_id = df_t5_unigram_unk_id(t->t5);
        t->model_max_length = c.model_max_length;
        if (t->eos_id < 0 || (t->type == DF_TOKENIZER_CLIP_BPE && t->bos_id < 0))
            s = df_errorf(DF_E_FORMAT, "%s: the tokenizer has no %s token", dir,
                          t->eos_id < 0 ? "eos" : "bos");
    }
    if (s == DF_OK) {
        t->vocab_size = base_count(t);
        if (t->type == DF_TOKENIZER_CLIP_BPE && df_clip_bpe_id_limit(t->clip) > t->vocab_size)
            t->vocab_size = df_clip_bpe_id_limit(t->clip);
        for (int i = 0; i < t->nadded; i++)
            if (t->added[i].id + 1 > t->vocab_size)
                t->vocab_size = t->added[i].id + 1;
    }
    config_free(&c);
    if (s != DF_OK) {
        df_tokenizer_free(t);
        return s;
    }
    *out = t;
    return DF_OK;
}

/* ---- llama.cpp's tokenizer in a GGUF (tokenizer.ggml.*) ------------------------------------ */

#define GGML_KEY(k) "tokenizer.ggml." k

static const char *gguf_type_name(df_gguf_value_type t)
{
    static const char *const names[] = {"uint8",  "int8",   "uint16", "int16", "uint32",
                                        "int32",  "float32", "bool",  "string", "array",
                                        "uint64", "int64",  "float64"};
    return (unsigned)t < sizeof names / sizeof *names ? names[t] : "unknown";
}

static bool gguf_type_is_int(df_gguf_value_type t)
{
    return t <= DF_GGUF_INT32 || t == DF_GGUF_UINT64 || t == DF_GGUF_INT64;
}

/* The array `key` holds: *count elements, each of a type `ok` accepts. Absent: *count = 0
 * when `optional`, else DF_E_FORMAT. */
static df_status gguf_array(const df_gguf *g, const char *key, bool (*ok)(df_gguf_value_type),
                            const char *expected, bool optional, uint64_t *count)
{
    *count = 0;
    int64_t i = df_gguf_kv_find(g, key);
    if (i < 0)
        return optional ? DF_OK
                        : df_errorf(DF_E_FORMAT, "%s: key '%s' is missing", df_gguf_path(g), key);
    df_gguf_value_type type, elem = DF_GGUF_UINT8;
    uint64_t n = 0;
    df_gguf_kv_key(g, i, &type, &elem, &n);
    if (type != DF_GGUF_ARRAY || !ok(elem))
        return df_errorf(DF_E_FORMAT, "%s: key '%s': expected an array of %s, found %s%s",
                         df_gguf_path(g), key, expected,
                         type == DF_GGUF_ARRAY ? "an array of " : "",
                         gguf_type_name(type == DF_GGUF_ARRAY ? elem : type));
    *count = n;
    return DF_OK;
}

static bool is_string(df_gguf_value_type t) { return t == DF_GGUF_STRING; }
static bool is_float(df_gguf_value_type t) { return t == DF_GGUF_FLOAT32 || t == DF_GGUF_FLOAT64; }
static bool is_byte(df_gguf_value_type t) { return t == DF_GGUF_UINT8; }

/* A boolean key, `def` when absent. */
static df_status gguf_bool(const df_gguf *g, const char *key, bool def, bool *out)
{
    *out = def;
    int64_t i = df_gguf_kv_find(g, key);
    if (i < 0)
        return DF_OK;
    df_gguf_value_type type;
    df_gguf_kv_key(g, i, &type, NULL, NULL);
    int64_t v = 0;
    if (type != DF_GGUF_BOOL || df_gguf_get_int(g, key, &v) != DF_OK)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': expected a bool, found %s", df_gguf_path(g),
                         key, gguf_type_name(type));
    *out = v != 0;
    return DF_OK;
}

/* A token id key: an integer in [0, n); -1 when absent and `optional`. */
static df_status gguf_token_id(const df_gguf *g, const char *key, uint64_t n, bool optional,
                               int64_t *out)
{
    *out = -1;
    int64_t i = df_gguf_kv_find(g, key);
    if (i < 0)
        return optional ? DF_OK
                        : df_errorf(DF_E_FORMAT, "%s: key '%s' is missing", df_gguf_path(g), key);
    df_gguf_value_type type;
    df_gguf_kv_key(g, i, &type, NULL, NULL);
    int64_t v = -1;
    if (!gguf_type_is_int(type) || df_gguf_get_int(g, key, &v) != DF_OK)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': expected a token id (an integer), found %s",
                         df_gguf_path(g), key, gguf_type_name(type));
    if (v < 0 || (uint64_t)v >= n)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': token id %lld is outside the %llu tokens",
                         df_gguf_path(g), key, (long long)v, (unsigned long long)n);
    *out = v;
    return DF_OK;
}

/* "[PAD123]": the rows llama.cpp's converter pads the vocabulary with. */
static bool is_placeholder(const char *s)
{
    size_t len = strlen(s);
    if (len < 6 || memcmp(s, "[PAD", 4) != 0 || s[len - 1] != ']')
        return false;
    for (size_t k = 4; k + 1 < len; k++)
        if (s[k] < '0' || s[k] > '9')
            return false;
    return true;
}

/* The pieces, the normalizer and the model. */
static df_status gguf_t5_model(df_tokenizer *t, const df_gguf *g, uint64_t *out_n)
{
    const char *path = df_gguf_path(g);
    uint64_t n, nscores, ntypes, ncharsmap;
    DF_TRY(gguf_array(g, GGML_KEY("tokens"), is_string, "strings", false, &n));
    DF_TRY(gguf_array(g, GGML_KEY("scores"), is_float, "float32", false, &nscores));
    DF_TRY(gguf_array(g, GGML_KEY("token_type"), gguf_type_is_int, "integers", false, &ntypes));
    DF_TRY(gguf_array(g, GGML_KEY("precompiled_charsmap"), is_byte, "uint8", true, &ncharsmap));
    if (n == 0 || n > INT32_MAX / 2)
        return df_errorf(DF_E_FORMAT, "%s: key '" GGML_KEY("tokens") "': %llu tokens; expected "
                         "1 to 2^30", path, (unsigned long long)n);
    if (nscores != n || ntypes != n)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': %llu values for %llu tokens", path,
                         nscores != n ? GGML_KEY("scores") : GGML_KEY("token_type"),
                         (unsigned long long)(nscores != n ? nscores : ntypes),
                         (unsigned long long)n);
    bool prefix, remove_ws;
    DF_TRY(gguf_bool(g, GGML_KEY("add_space_prefix"), true, &prefix));
    DF_TRY(gguf_bool(g, GGML_KEY("remove_extra_whitespaces"), true, &remove_ws));

    df_sp_piece *pieces = df_malloc(n * sizeof *pieces);
    uint8_t *charsmap = df_malloc(ncharsmap ? ncharsmap : 1);
    df_status s = pieces && charsmap ? DF_OK : df_errorf(DF_E_OOM, "%s: out of memory", path);
    for (uint64_t i = 0; s == DF_OK && i < n; i++) {
        const char *str = NULL;
        size_t len = 0;
        double score = 0, type = 0;
        s = df_gguf_get_array_bytes(g, GGML_KEY("tokens"), i, &str, &len);
        if (s == DF_OK && memchr(str, 0, len))
            s = df_errorf(DF_E_FORMAT, "%s: key '" GGML_KEY("tokens") "': token %llu holds a NUL "
                          "byte", path, (unsigned long long)i);
        if (s == DF_OK)
            s = df_gguf_get_array_number(g, GGML_KEY("scores"), i, &score);
        if (s == DF_OK)
            s = df_gguf_get_array_number(g, GGML_KEY("token_type"), i, &type);
        if (s == DF_OK && (type < DF_SP_NORMAL || type > DF_SP_BYTE))
            s = df_errorf(DF_E_FORMAT, "%s: key '" GGML_KEY("token_type") "': token %llu has type "
                          "%g; expected 1 (normal) to 6 (byte)", path, (unsigned long long)i, type);
        if (s == DF_OK)
            pieces[i] = (df_sp_piece){str, len, (float)score, (int32_t)type};
    }
    for (uint64_t i = 0; s == DF_OK && i < ncharsmap; i++) {
        double b = 0;
        s = df_gguf_get_array_number(g, GGML_KEY("precompiled_charsmap"), i, &b);
        if (s == DF_OK)
            charsmap[i] = (uint8_t)b;
    }
    /* sentencepiece's layout: a little-endian trie size, the trie, the replacements. */
    uint64_t trie = s == DF_OK && ncharsmap > 4
                        ? (uint64_t)charsmap[0] | (uint64_t)charsmap[1] << 8 |
                              (uint64_t)charsmap[2] << 16 | (uint64_t)charsmap[3] << 24
                        : 0; /* charsmap is NULL when its allocation failed */
    if (s == DF_OK && ncharsmap > 0 && (ncharsmap <= 4 || trie > ncharsmap - 4))
        s = df_errorf(DF_E_FORMAT, "%s: key '" GGML_KEY("precompiled_charsmap") "': %llu bytes "
                      "do not hold the trie they announce (%llu bytes after the first 4)", path,
                      (unsigned long long)ncharsmap, (unsigned long long)trie);
    char name[4200];
    snprintf(name, sizeof name, "%s: key '" GGML_KEY("tokens") "'", path);
    if (s == DF_OK)
        s = df_t5_unigram_create_from_pieces(pieces, n, charsmap, ncharsmap, prefix, remove_ws,
                                             name, &t->t5);
    df_free(pieces);
    df_free(charsmap);
    *out_n = n;
    return s;
}

/* The added tokens T5Tokenizer has over this vocabulary: control and unknown pieces
 * (<pad>, </s>, <unk>), user-defined ones (added_tokens.json's, which llama.cpp's converter
 * writes so) and, when no piece is <extra_id_0>, the extra ids in the first 100 [PADn]
 * rows, the last id being <extra_id_0> (transformers' GGUF conversion names them so). The
 * extra ids strip whitespace on both sides, as T5Tokenizer makes them. */
static df_status gguf_t5_added(df_tokenizer *t, uint64_t n)
{
    bool named = df_t5_unigram_piece_to_id(t->t5, "<extra_id_0>", 12) !=
                 df_t5_unigram_unk_id(t->t5);
    int64_t blanks[100];
    int nblanks = 0;
    for (uint64_t i = 0; i < n; i++) {
        const char *piece = df_t5_unigram_piece(t->t5, (int64_t)i);
        df_sp_type type = df_t5_unigram_piece_type(t->t5, (int32_t)i);
        bool extra = strncmp(piece, "<extra_id_", 10) == 0;
        if (type == DF_SP_CONTROL || type == DF_SP_UNKNOWN || type == DF_SP_USER_DEFINED)
            DF_TRY(add_token(t, piece, (int64_t)i, extra, extra));
        else if (!named && type == DF_SP_UNUSED && nblanks < 100 && is_placeholder(piece))
            blanks[nblanks++] = (int64_t)i;
    }
    for (int k = 0; k < nblanks; k++) {
        char name[32];
        snprintf(name, sizeof name, "<extra_id_%d>", nblanks - 1 - k);
        DF_TRY(add_token(t, name, blanks[k], true, true));
    }
    return rebuild_added_map(t);
}

df_status df_tokenizer_from_gguf(const df_gguf *g, df_tokenizer **out)
{
    *out = NULL;
    if (!g)
        return df_errorf(DF_E_ARG, "df_tokenizer_from_gguf: g is NULL");
    const char *path = df_gguf_path(g);
    df_tokenizer *t = df_calloc(1, sizeof *t);
    if (!t)
        return df_errorf(DF_E_OOM, "%s: out of memory", path);
    df_str_map_init(&t->added_map);
    t->type = DF_TOKENIZER_T5_UNIGRAM;
    t->bos_id = -1;
    const char *model = NULL;
    df_status s = df_gguf_kv_find(g, GGML_KEY("model")) < 0
                      ? df_errorf(DF_E_FORMAT, "%s: no tokenizer (no key '" GGML_KEY("model")
                                  "')", path)
                      : df_gguf_get_string(g, GGML_KEY("model"), &model);
    if (s == DF_OK && strcmp(model, "t5") != 0)
        s = df_errorf(DF_E_UNSUPPORTED, "%s: key '" GGML_KEY("model") "' is '%.32s'; diffuse "
                      "reads only llama.cpp's T5 tokenizer ('t5') from a GGUF", path, model);
    uint64_t n = 0;
    if (s == DF_OK)
        s = gguf_t5_model(t, g, &n);
    if (s == DF_OK)
        s = gguf_t5_added(t, n);
    if (s == DF_OK)
        s = gguf_token_id(g, GGML_KEY("eos_token_id"), n, false, &t->eos_id);
    if (s == DF_OK)
        s = gguf_token_id(g, GGML_KEY("padding_token_id"), n, true, &t->pad_id);
    if (s == DF_OK)
        s = gguf_token_id(g, GGML_KEY("unknown_token_id"), n, true, &t->unk_id);
    if (s == DF_OK && t->unk_id < 0)
        t->unk_id = df_t5_unigram_unk_id(t->t5);
    if (s == DF_OK && t->pad_id < 0)
        t->pad_id = special_id(t, "<pad>");
    if (s == DF_OK) { /* the encoder's context (llama.cpp writes T5's n_positions there) */
        const char *arch = NULL;
        char key[160];
        int64_t ctx = 0;
        if (df_gguf_kv_find(g, "general.architecture") >= 0 &&
            df_gguf_get_string(g, "general.architecture", &arch) == DF_OK &&
            snprintf(key, sizeof key, "%.100s.context_length", arch) > 0 &&
            df_gguf_kv_find(g, key) >= 0 && df_gguf_get_int(g, key, &ctx) == DF_OK && ctx > 0)
            t->model_max_length = ctx;
        t->vocab_size = (int64_t)n;
    }
    if (s != DF_OK) {
        df_tokenizer_free(t);
        return s;
    }
    *out = t;
    return DF_OK;
}

df_status df_tokenizer_load_gguf(const char *path, df_tokenizer **out)
{
    *out = NULL;
    if (!path)
        return df_errorf(DF_E_ARG, "df_tokenizer_load_gguf: path is NULL");
    df_gguf *g;
    DF_TRY(df_gguf_open(path, &g));
    df_status s = df_tokenizer_from_gguf(g, out);
    df_gguf_free(g);
    return s;
}

/* ---- Mistral's tekken.json inside a safetensors file (ComfyUI's tekken_model) -------------- */

/* The tekken_model tensor of `st`: the exact name first, else the first "*.tekken_model". */
static bool find_tekken(const df_safetensors *st, df_tensor_info *info)
{
    if (df_safetensors_find(st, "tekken_model", info) == DF_OK)
        return true;
    for (int64_t i = 0; i < df_safetensors_count(st); i++)
        if (df_safetensors_at(st, i, info) == DF_OK &&
            df_str_ends_with(info->name, ".tekken_model"))
            return true;
    return false;
}

bool df_tokenizer_file_has_tekken(const char *path)
{
    df_safetensors *st = NULL;
    df_tensor_info info;
    bool has = path && df_str_ends_with(path, ".safetensors") &&
               df_safetensors_open(path, &st) == DF_OK && find_tekken(st, &info);
    df_safetensors_free(st);
    return has;
}

df_status df_tokenizer_load_tekken(const char *path, df_tokenizer **out)
{
    *out = NULL;
    if (!path)
        return df_errorf(DF_E_ARG, "df_tokenizer_load_tekken: path is NULL");
    if (!df_str_ends_with(path, ".safetensors"))
        return df_errorf(DF_E_IO, "%s: not a .safetensors file (tekken_model is looked for "
                         "in ComfyUI's safetensors files)", path);
    df_safetensors *st;
    DF_TRY(df_safetensors_open(path, &st));
    df_tensor_info info;
    char name[4200];
    df_status s = DF_OK;
    if (!find_tekken(st, &info))
        s = df_errorf(DF_E_IO, "%s: no tekken_model tensor (the Mistral tokenizer ComfyUI's "
                      "FLUX.2 text encoder files carry)", path);
    else if (strcmp(info.dtype_name, "U8") != 0 || info.ndim != 1)
        s = df_errorf(DF_E_FORMAT, "%s: tensor '%s' is %s with %d dimensions; a tokenizer's "
                      "bytes are a 1-D U8 tensor", path, info.name, info.dtype_name, info.ndim);
    else if (info.nbytes > DF_TEKKEN_MAX_BYTES)
        s = df_errorf(DF_E_FORMAT, "%s: tensor '%s' holds %zu bytes; a tekken.json is read up "
                      "to %zu", path, info.name, info.nbytes, DF_TEKKEN_MAX_BYTES);
    df_tokenizer *t = NULL;
    if (s == DF_OK && !(t = df_calloc(1, sizeof *t)))
        s = df_errorf(DF_E_OOM, "%s: out of memory", path);
    if (s == DF_OK) {
        df_str_map_init(&t->added_map);
        t->type = DF_TOKENIZER_BPE_JSON;
        snprintf(name, sizeof name, "%s: tensor '%s' (tekken.json)", path, info.name);
        s = df_tekken_create(info.data, info.nbytes, name, &t->json);
    }
    df_safetensors_free(st);
    if (s != DF_OK) {
        df_tokenizer_free(t);
        return s;
    }
    *out = t;
    return DF_OK;
}

void df_tokenizer_free(df_tokenizer *tok)
{
    if (!tok)
        return;
    df_clip_bpe_free(tok->clip);
    df_t5_unigram_free(tok->t5);
    df_tok_json_free(tok->json);
    for (int i = 0; i < tok->nadded; i++)
        df_free(tok->added[i].content);
    df_free(tok->added);
    df_str_map_deinit(&tok->added_map);
    df_free(tok);
}

df_tokenizer_type df_tokenizer_kind(const df_tokenizer *tok)
{
    return tok->type;
}

const char *df_tokenizer_type_name(df_tokenizer_type type)
{
    switch (type) {
    case DF_TOKENIZER_CLIP_BPE:
        return "clip-bpe";
    case DF_TOKENIZER_T5_UNIGRAM:
        return "t5-unigram";
    case DF_TOKENIZER_BPE_JSON:
        return "bpe-json";
    }
    return "unknown";
}

void df_tokenizer_get_info(const df_tokenizer *tok, df_tokenizer_info *out)
{
    if (tok->json) {
        df_tok_json_info j;
        df_tok_json_get_info(tok->json, &j);
        *out = (df_tokenizer_info){tok->type, j.vocab_size, j.bos_id, j.eos_id, j.pad_id,
                                   j.unk_id, j.model_max_length, j.padding_left};
        return;
    }
    *out = (df_tokenizer_info){
        .type = tok->type,
        .vocab_size = tok->vocab_size,
        .bos_id = tok->bos_id,
        .eos_id = tok->eos_id,
        .pad_id = tok->pad_id,
        .unk_id = tok->unk_id,
        .model_max_length = tok->model_max_length,
    };
}

const df_tok_json *df_tokenizer_json_model(const df_tokenizer *tok)
{
    return tok ? tok->json : NULL;
}

const char *df_tokenizer_id_to_piece(const df_tokenizer *tok, int64_t id)
{
    if (tok->json)
        return df_tok_json_id_to_piece(tok->json, id);
    for (int i = 0; i < tok->nadded; i++)
        if (tok->added[i].id == id)
            return tok->added[i].content;
    if (tok->type == DF_TOKENIZER_CLIP_BPE)
        return df_clip_bpe_id_to_token(tok->clip, id);
    return df_t5_unigram_piece(tok->t5, id);
}

/* ---- encoding ------------------------------------------------------------------------------ */

typedef struct segment {
    size_t begin, end; /* bytes of the text */
    int added;         /* index into tok->added, or -1 for text */
} segment;

typedef struct seg_list {
    segment *data;
    size_t len, cap;
} seg_list;

static bool seg_push(seg_list *l, segment s)
{
    if (!df_array_reserve((void **)&l->data, &l->cap, l->len + 1, sizeof *l->data))
        return false;
    l->data[l->len++] = s;
    return true;
}

/* Leftmost, then longest, added-token match at or after `from`; -1 when none. */
static int find_added(const df_tokenizer *t, const char *text, size_t len, size_t from, size_t *at)
{
    for (size_t i = from; i < len; i++) {
        if (!t->first_byte[(uint8_t)text[i]])
            continue;
        int best = -1;
        for (int k = 0; k < t->nadded; k++) {
            const added_token *a = &t->added[k];
            if (a->len <= len - i && memcmp(text + i, a->content, a->len) == 0 &&
                (best < 0 || a->len > t->added[best].len))
                best = k;
        }
        if (best >= 0) {
            *at = i;
            return best;
        }
    }
    return -1;
}

static df_status split_added(const df_tokenizer *t, const char *text, size_t len, seg_list *out)
{
    size_t pos = 0, at;
    int k;
    while (pos < len) {
        k = t->nadded ? find_added(t, text, len, pos, &at) : -1;
        size_t text_end = k >= 0 ? at : len;
        if (text_end > pos && !seg_push(out, (segment){pos, text_end, -1}))
            return df_errorf(DF_E_OOM, "tokenizer: out of memory");
        if (k < 0)
            break;
        if (!seg_push(out, (segment){at, at + t->added[k].len, k}))
            return df_errorf(DF_E_OOM, "tokenizer: out of memory");
        pos = at + t->added[k].len;
    }
    for (size_t i = 0; i < out->len; i++) { /* lstrip / rstrip eat the neighbours' spaces */
        if (out->data[i].added < 0)
            continue;
        const added_token *a = &t->added[out->data[i].added];
        if (a->rstrip && i + 1 < out->len && out->data[i + 1].added < 0)
            out->data[i + 1].begin = df_utf8_lstrip(text, out->data[i + 1].begin,
                                                    out->data[i + 1].end, df_py_isspace);
        if (a->lstrip && i > 0 && out->data[i - 1].added < 0)
            out->data[i - 1].end = df_utf8_rstrip(text, out->data[i - 1].begin,
                                                  out->data[i - 1].end, df_py_isspace);
    }
    return DF_OK;
}

void df_tokens_deinit(df_tokens *t)
{
    if (!t)
        return;
    df_free(t->ids);
    df_free(t->attention_mask);
    memset(t, 0, sizeof *t);
}

df_status df_tokenizer_encode(const df_tokenizer *tok, const char *text, size_t len,
                              const df_tokenize_opts *opts, df_tokens *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!tok || !out)
        return df_errorf(DF_E_ARG, "df_tokenizer_encode: tokenizer and out must not be NULL");
    if (tok->json)
        return df_tok_json_encode(tok->json, text, len, opts, true, out);
    if (!text && len > 0)
        return df_errorf(DF_E_ARG, "df_tokenizer_encode: text is NULL but len is %zu", len);
    df_tokenize_opts o = opts ? *opts : (df_tokenize_opts){0};
    if ((o.pad || o.truncate) && o.max_length == 0) {
        o.max_length = tok->model_max_length;
        if (o.max_length == 0)
            return df_errorf(DF_E_ARG, "tokenize: padding or truncation needs a max_length and "
                                       "tokenizer_config.json gives no model_max_length");
    }
    if (o.max_length < 0 || o.max_length > DF_TOKENIZE_MAX_LENGTH)
        return df_errorf(DF_E_ARG, "tokenize: max_length %lld is outside [0, %lld]",
                         (long long)o.max_length, (long long)DF_TOKENIZE_MAX_LENGTH);
    if (o.pad && tok->pad_id < 0)
        return df_errorf(DF_E_ARG,
                         "tokenize: padding asked for but the tokenizer has no pad token");
    if (len > 0)
        DF_TRY(df_utf8_check(text, len, "prompt"));

    seg_list segs = {0};
    df_i64_vec ids = {0};
    df_status s = split_added(tok, text, len, &segs);
    for (size_t i = 0; i < segs.len && s == DF_OK; i++) {
        const segment *g = &segs.data[i];
        if (g->added >= 0) {
            if (!df_i64_vec_push(&ids, tok->added[g->added].id))
                s = df_errorf(DF_E_OOM, "tokenize: out of memory");
        } else if (g->end > g->begin) {
            if (tok->type == DF_TOKENIZER_CLIP_BPE)
                s = df_clip_bpe_encode(tok->clip, text + g->begin, g->end - g->begin,
                                       &tok->added_map, tok->unk_id, &ids);
            else
                s = df_t5_unigram_encode(tok->t5, text + g->begin, g->end - g->begin,
                                         &tok->added_map, &ids);
        }
    }
    df_free(segs.data);

    /* truncation, special tokens, padding */
    const int64_t nspecial = tok->type == DF_TOKENIZER_CLIP_BPE ? 2 : 1;
    if (s == DF_OK && o.truncate && (int64_t)ids.len + nspecial > o.max_length) {
        if (o.max_length <= nspecial)
            s = df_errorf(DF_E_ARG,
                          "tokenize: max_length %lld leaves no room for text beside the %lld "
                          "special token(s)",
                          (long long)o.max_length, (long long)nspecial);
        else
            ids.len = (size_t)(o.max_length - nspecial);
    }
    int64_t n = 0, total = 0;
    if (s == DF_OK) {
        bool add_eos = tok->type == DF_TOKENIZER_CLIP_BPE || ids.len == 0 ||
                       ids.data[ids.len - 1] != tok->eos_id;
        n = (int64_t)ids.len + (tok->bos_id >= 0 ? 1 : 0) + (add_eos ? 1 : 0);
        total = o.pad && o.max_length > n ? o.max_length : n;
        out->ids = df_malloc((size_t)total * sizeof *out->ids);
        out->attention_mask = df_malloc((size_t)total * sizeof *out->attention_mask);
        if (!out->ids || !out->attention_mask) {
            s = df_errorf(DF_E_OOM, "tokenize: out of memory");
        } else {
            int64_t k = 0;
            if (tok->bos_id >= 0)
                out->ids[k++] = tok->bos_id;
            for (size_t i = 0; i < ids.len; i++)
                out->ids[k++] = ids.data[i];
            if (add_eos)
                out->ids[k++] = tok->eos_id;
            for (int64_t i = 0; i < total; i++) {
                if (i >= n)
                    out->ids[i] = tok->pad_id;
                out->attention_mask[i] = i < n;
            }
            out->count = total;
        }
    }
    df_i64_vec_free(&ids);
    if (s != DF_OK)
        df_tokens_deinit(out);
    return s;
}
