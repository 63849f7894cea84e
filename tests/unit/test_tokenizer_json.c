/*
 * Tests of the tokenizer.json reader (src/text/tokenizer_json*.c) and the FLUX.2 prompt
 * formatting (src/text/chat_template.c), on small tokenizer.json files written here: BPE
 * merge order, ignore_merges, unk / fuse_unk / byte_fallback, both merge spellings; every
 * Split behaviour, invert, Unicode-category regexes, ByteLevel with and without its regex
 * and prefix space; NFC; added tokens (leftmost-longest, lstrip / rstrip, normalized);
 * TemplateProcessing, truncation and both padding sides; the load-time consistency checks
 * and the UNSUPPORTED components, each with the message that names the file and key; an
 * out-of-memory sweep; and the two chat templates, on the golden FLUX.2 tokenizers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/tokenizer.h>

#include "core/alloc.h"
#include "text/tokenizer_json.h"
#include "text/tokenizer_json_impl.h"

/* ---- helpers ------------------------------------------------------------------------------ */

typedef struct spec {
    const char *vocab;  /* JSON object body, without braces */
    const char *merges; /* JSON list body, without brackets */
    const char *pre, *norm, *post, *added; /* JSON values; NULL = null / [] */
    const char *model_extra;               /* more "key": value pairs of the model */
} spec;

static char *make_json(const spec *s)
{
    size_t cap = 1 << 16;
    char *buf = malloc(cap);
    assert_non_null(buf);
    int n = snprintf(buf, cap,
                     "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null, "
                     "\"added_tokens\": %s, \"normalizer\": %s, \"pre_tokenizer\": %s, "
                     "\"post_processor\": %s, \"decoder\": null, \"model\": {\"type\": \"BPE\", "
                     "\"vocab\": {%s}, \"merges\": [%s]%s%s}}",
                     s->added ? s->added : "[]", s->norm ? s->norm : "null",
                     s->pre ? s->pre : "null", s->post ? s->post : "null", s->vocab,
                     s->merges ? s->merges : "", s->model_extra ? ", " : "",
                     s->model_extra ? s->model_extra : "");
    assert_true(n > 0 && (size_t)n < cap);
    return buf;
}

static df_status create(const spec *s, const char *config, df_tok_json **out)
{
    char *json = make_json(s);
    df_status st = df_tok_json_create(json, strlen(json), config, config ? strlen(config) : 0,
                                      "mem", out);
    free(json);
    return st;
}

static df_tok_json *load(const spec *s, const char *config)
{
    df_tok_json *t = NULL;
    df_status st = create(s, config, &t);
    if (st != DF_OK)
        fail_msg("load failed: %s", df_error_message());
    return t;
}

/* Encodes text without padding and compares with the expected ids (-1 ends the list). */
static void expect_ids(const df_tok_json *t, const char *text, bool special, const int64_t *want)
{
    df_tokens tk;
    df_status s = df_tok_json_encode(t, text, strlen(text), NULL, special, &tk);
    if (s != DF_OK)
        fail_msg("encode '%s': %s", text, df_error_message());
    int64_t n = 0;
    while (want[n] >= 0)
        n++;
    if (tk.count != n)
        fail_msg("'%s': %lld ids, expected %lld", text, (long long)tk.count, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (tk.ids[i] != want[i])
            fail_msg("'%s': id %lld is %lld, expected %lld", text, (long long)i,
                     (long long)tk.ids[i], (long long)want[i]);
    df_tokens_deinit(&tk);
}

#define IDS(...) ((const int64_t[]){__VA_ARGS__, -1})
#define NONE ((const int64_t[]){-1})

static void expect_error(const spec *s, const char *config, df_status code, const char *what1,
                         const char *what2)
{
    df_tok_json *t = (df_tok_json *)1;
    df_status got = create(s, config, &t);
    if (got != code)
        fail_msg("expected status %d, got %d (%s)", (int)code, (int)got, df_error_message());
    assert_null(t);
    const char *msg = df_error_message();
    if (!strstr(msg, what1) || (what2 && !strstr(msg, what2)))
        fail_msg("message '%s' should name '%s'%s%s", msg, what1, what2 ? " and " : "",
                 what2 ? what2 : "");
    assert_non_null(strstr(msg, "mem/tokenizer")); /* names the file */
}

/* ---- BPE ------------------------------------------------------------------------------------ */

static void test_bpe_merge_order(void **state)
{
    (void)state;
    /* rank 0 = "b c" beats "a b": "abc" -> a + bc, never ab */
    spec s = {.vocab = "\"a\": 0, \"b\": 1, \"c\": 2, \"ab\": 3, \"bc\": 4, \"abc\": 5",
              .merges = "[\"b\", \"c\"], [\"a\", \"b\"]"};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, "abc", true, IDS(0, 4));
    expect_ids(t, "abcab", true, IDS(0, 4, 3));
    df_tok_json_free(t);

    /* equal pairs merge leftmost first: "aaa" -> aa + a */
    spec r = {.vocab = "\"a\": 0, \"aa\": 1", .merges = "\"a a\""};
    t = load(&r, NULL);
    expect_ids(t, "aaa", true, IDS(1, 0));
    expect_ids(t, "aaaa", true, IDS(1, 1));
    df_tok_json_free(t);
}

static void test_bpe_long_piece(void **state)
{
    (void)state;
    spec s = {.vocab = "\"a\": 0, \"aa\": 1, \"aaaa\": 2", .merges = "\"a a\", \"aa aa\""};
    df_tok_json *t = load(&s, NULL);
    size_t n = 200001; /* 50000 x aaaa + a: quadratic merging would take minutes */
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = 0;
    df_tokens tk;
    assert_int_equal(df_tok_json_encode(t, text, n, NULL, true, &tk), DF_OK);
    assert_int_equal(tk.count, 50001);
    assert_int_equal(tk.ids[0], 2);
    assert_int_equal(tk.ids[50000], 0);
    df_tokens_deinit(&tk);
    free(text);
    df_tok_json_free(t);
}

static void test_bpe_ignore_merges(void **state)
{
    (void)state;
    /* "abc" is a token but no merge reaches it */
    spec s = {.vocab = "\"a\": 0, \"b\": 1, \"c\": 2, \"abc\": 3", .merges = ""};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, "abc", true, IDS(0, 1, 2));
    df_tok_json_free(t);
    s.model_extra = "\"ignore_merges\": true";
    t = load(&s, NULL);
    expect_ids(t, "abc", true, IDS(3));
    expect_ids(t, "abca", true, IDS(0, 1, 2, 0));
    df_tok_json_free(t);
}

static void test_bpe_unknown_characters(void **state)
{
    (void)state;
    spec s = {.vocab = "\"<unk>\": 0, \"a\": 1, \"<0x78>\": 2", .merges = ""};
    df_tok_json *t = load(&s, NULL); /* no unk_token: unknown characters are dropped */
    expect_ids(t, "axya", true, IDS(1, 1));
    df_tok_json_free(t);
    s.model_extra = "\"unk_token\": \"<unk>\"";
    t = load(&s, NULL);
    expect_ids(t, "axya", true, IDS(1, 0, 0, 1));
    df_tok_json_free(t);
    s.model_extra = "\"unk_token\": \"<unk>\", \"fuse_unk\": true";
    t = load(&s, NULL);
    expect_ids(t, "axya", true, IDS(1, 0, 1));
    df_tok_json_free(t);
    s.model_extra = "\"unk_token\": \"<unk>\", \"byte_fallback\": true";
    t = load(&s, NULL); /* x has its byte token <0x78>; y has none */
    expect_ids(t, "axya", true, IDS(1, 2, 0, 1));
    df_tok_json_free(t);
}

/* ---- pre-tokenizers and normalizers -------------------------------------------------------- */

/* Pieces as whole tokens: every piece below is in the vocabulary and ignore_merges emits
 * it whole, so the ids spell the pieces. */
#define PIECE_VOCAB                                                                            \
    "\"a\": 0, \"-\": 1, \"b\": 2, \"a-\": 3, \"-b\": 4, \"--\": 5, \"a--\": 6, \"--b\": 7, "  \
    "\"ab\": 8, \"AB\": 9, \"c\": 10, \"D\": 11"

static void expect_split(const char *behavior, bool invert, const char *text, const int64_t *want)
{
    char pre[256];
    snprintf(pre, sizeof pre,
             "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\", "
             "\"invert\": %s}",
             behavior, invert ? "true" : "false");
    spec s = {.vocab = PIECE_VOCAB, .pre = pre, .model_extra = "\"ignore_merges\": true"};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, text, true, want);
    df_tok_json_free(t);
}

static void test_split_behaviors(void **state)
{
    (void)state;
    expect_split("Removed", false, "a-b", IDS(0, 2));
    expect_split("Isolated", false, "a-b", IDS(0, 1, 2));
    expect_split("MergedWithPrevious", false, "a-b", IDS(3, 2));
    expect_split("MergedWithNext", false, "a-b", IDS(0, 4));
    expect_split("Contiguous", false, "a--b", IDS(0, 5, 2));
    /* only a match after text merges: the second "-" stays alone */
    expect_split("MergedWithPrevious", false, "a--b", IDS(3, 1, 2));
    expect_split("MergedWithNext", false, "a--b", IDS(0, 1, 4));
    /* invert: the letters are the delimiters, "-" the text */
    expect_split("Removed", true, "a-b", IDS(1));
    expect_split("MergedWithPrevious", true, "a-b", IDS(0, 4));
}

static void test_split_regex_unicode_categories(void **state)
{
    (void)state;
    spec s = {.vocab = PIECE_VOCAB ", \"\xC3\x89\": 12, \"\xC3\xA9\": 13",
              .pre = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{Lu}+\"}, "
                     "\"behavior\": \"Isolated\", \"invert\": false}",
              .model_extra = "\"ignore_merges\": true"};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, "ABcD", true, IDS(9, 10, 11));
    expect_ids(t, "\xC3\x89\xC3\xA9", true, IDS(12, 13)); /* É is \p{Lu}, é is not */
    df_tok_json_free(t);

    s.pre = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:ab)\"}, \"behavior\": "
            "\"Removed\", \"invert\": false}";
    t = load(&s, NULL);
    expect_ids(t, "cABcab", true, IDS(10, 10));
    df_tok_json_free(t);
}

/* The GPT-2 characters of "a", " ", "é" (C3 A9 -> "Ã©"): "a"=0, "Ġ"=1, "Ã"=2, "©"=3 */
#define BYTE_VOCAB                                                                             \
    "\"a\": 0, \"\xC4\xA0\": 1, \"\xC3\x83\": 2, \"\xC2\xA9\": 3, \"\xC4\xA0" "a\": 4, "       \
    "\"\xC3\x83\xC2\xA9\": 5, \"b\": 6"
#define BYTE_MERGES "[\"\xC4\xA0\", \"a\"], [\"\xC3\x83\", \"\xC2\xA9\"]"

static void test_byte_level(void **state)
{
    (void)state;
    spec s = {.vocab = BYTE_VOCAB, .merges = BYTE_MERGES,
              .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": "
                     "false}"};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, "a a\xC3\xA9", true, IDS(0, 4, 5));
    df_tok_json_free(t);

    s.pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}";
    t = load(&s, NULL); /* GPT-2 regex: "a", " a", "é"... with a prefix space: " a" */
    expect_ids(t, "a a", true, IDS(4, 4));
    df_tok_json_free(t);

    assert_int_equal(tj_byte_to_cp(' '), 0x120);
    assert_int_equal(tj_byte_to_cp('a'), 'a');
    assert_int_equal(tj_byte_to_cp(0xAD), 0x143);
}

static void test_nfc(void **state)
{
    (void)state;
    spec s = {.vocab = BYTE_VOCAB, .merges = BYTE_MERGES,
              .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": "
                     "false}"};
    df_tok_json *t = load(&s, NULL); /* e + U+0301 stays decomposed: e is not in the vocab */
    expect_ids(t, "e\xCC\x81", true, NONE);
    df_tok_json_free(t);
    s.norm = "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}]}";
    t = load(&s, NULL);
    expect_ids(t, "e\xCC\x81", true, IDS(5));
    df_tok_json_free(t);
}

/* ---- added tokens, post-processor, truncation, padding ------------------------------------ */

#define ADDED(content, id, extra)                                                              \
    "{\"id\": " #id ", \"content\": \"" content "\", \"single_word\": false, \"special\": "    \
    "true" extra "}"

static void test_added_tokens(void **state)
{
    (void)state;
    spec s = {.vocab = "\"a\": 0, \"b\": 1, \" \": 2, \"<a>\": 3, \"<ab>\": 4, \"<x>\": 5",
              .added = "[" ADDED("<a>", 3, "") ", " ADDED("<ab>", 4, "") ", "
                       ADDED("<x>", 5, ", \"lstrip\": true, \"rstrip\": true") "]"};
    df_tok_json *t = load(&s, NULL);
    expect_ids(t, "a<ab>b", true, IDS(0, 4, 1));   /* longest at the same start */
    expect_ids(t, "<a<a>", true, IDS(0, 3));        /* "<a" (< is unknown), then <a> */
    expect_ids(t, "a <x> b", true, IDS(0, 5, 1));  /* the spaces go with <x> */
    expect_ids(t, "a <a> b", true, IDS(0, 2, 3, 2, 1));
    df_tok_json_free(t);

    /* a normalized added token matches the NFC text; a raw one only the raw text */
    spec n = {.vocab = "\"\xC3\xA9\": 0, \"e\": 1, \"\xCC\x81\": 2, \"[\xC3\xA9]\": 3",
              .norm = "{\"type\": \"NFC\"}",
              .added = "[" ADDED("[\xC3\xA9]", 3, ", \"normalized\": true") "]"};
    t = load(&n, NULL);
    expect_ids(t, "[e\xCC\x81]", true, IDS(3));
    df_tok_json_free(t);
    n.added = "[" ADDED("[\xC3\xA9]", 3, ", \"normalized\": false") "]";
    t = load(&n, NULL);
    expect_ids(t, "[e\xCC\x81]", true, IDS(0)); /* [ and ] are unknown and dropped */
    df_tok_json_free(t);
}

/* An added token whose content is empty loads (the Rust library loads it) and never
 * matches: every text encodes as without it, its id stays taken. */
static void test_empty_added_token(void **state)
{
    (void)state;
    spec s = {.vocab = "\"a\": 0, \"b\": 1, \" \": 2, \"<x>\": 3",
              .added = "[" ADDED("<x>", 3, "") "]"};
    spec e = s;
    e.added = "[" ADDED("", 4, ", \"normalized\": false, \"lstrip\": true") ", "
              ADDED("<x>", 3, "") "]";
    e.norm = "{\"type\": \"NFC\"}";
    s.norm = e.norm;
    df_tok_json *plain = load(&s, NULL), *empty = load(&e, NULL);
    static const char *const texts[] = {"", "a", "ab <x>b", "<x><x>", " a  b ", "c"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        df_tokens want, got;
        const char *t = texts[i];
        assert_int_equal(df_tok_json_encode(plain, t, strlen(t), NULL, true, &want), DF_OK);
        assert_int_equal(df_tok_json_encode(empty, t, strlen(t), NULL, true, &got), DF_OK);
        if (got.count != want.count ||
            memcmp(got.ids, want.ids, (size_t)want.count * sizeof *want.ids) != 0)
            fail_msg("'%s': %lld ids with the empty added tokens, %lld without", t,
                     (long long)got.count, (long long)want.count);
        df_tokens_deinit(&want);
        df_tokens_deinit(&got);
    }
    expect_ids(empty, "ab <x>b", true, IDS(0, 1, 2, 3, 1));
    assert_string_equal(df_tok_json_id_to_piece(empty, 4), "");
    df_tok_json_free(plain);
    df_tok_json_free(empty);
    /* its id is still its own: another token on it is refused */
    e.added = "[" ADDED("", 3, "") "]";
    expect_error(&e, NULL, DF_E_FORMAT, "added_tokens[0]", "'<x>'");
}

#define TEMPLATE_POST                                                                          \
    "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", "    \
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": "  \
    "{\"id\": \"</s>\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", "   \
    "\"ids\": [1]}, \"</s>\": {\"id\": \"</s>\", \"ids\": [2]}}}"
#define SMALL_VOCAB "\"<pad>\": 0, \"<s>\": 1, \"</s>\": 2, \"a\": 3, \"b\": 4"
#define SMALL_ADDED "[" ADDED("<pad>", 0, "") ", " ADDED("<s>", 1, "") ", " ADDED("</s>", 2, "") "]"

static void expect_padded(const df_tok_json *t, const char *text, int64_t max_length,
                          const int64_t *ids, const int64_t *mask)
{
    df_tokens tk;
    df_tokenize_opts o = {.max_length = max_length, .pad = true, .truncate = true};
    assert_int_equal(df_tok_json_encode(t, text, strlen(text), &o, true, &tk), DF_OK);
    assert_int_equal(tk.count, max_length);
    for (int64_t i = 0; i < max_length; i++) {
        if (tk.ids[i] != ids[i] || tk.attention_mask[i] != mask[i])
            fail_msg("'%s' [%lld]: id %lld mask %lld, expected %lld %lld", text, (long long)i,
                     (long long)tk.ids[i], (long long)tk.attention_mask[i], (long long)ids[i],
                     (long long)mask[i]);
    }
    df_tokens_deinit(&tk);
}

static void test_template_truncation_padding(void **state)
{
    (void)state;
    spec s = {.vocab = SMALL_VOCAB, .added = SMALL_ADDED, .post = TEMPLATE_POST};
    const char *qwen = "{\"tokenizer_class\": \"Qwen2Tokenizer\", \"pad_token\": \"<pad>\"}";
    df_tok_json *t = load(&s, qwen);
    df_tok_json_info info;
    df_tok_json_get_info(t, &info);
    assert_int_equal(info.num_special, 2);
    assert_false(info.padding_left); /* the Qwen2 classes keep the base default, right */
    expect_ids(t, "ab", true, IDS(1, 3, 4, 2));
    expect_ids(t, "ab", false, IDS(3, 4));
    expect_padded(t, "ab", 6, IDS(1, 3, 4, 2, 0, 0), IDS(1, 1, 1, 1, 0, 0));
    expect_padded(t, "abab", 4, IDS(1, 3, 4, 2), IDS(1, 1, 1, 1)); /* specials kept */
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 1, .truncate = true};
    assert_int_equal(df_tok_json_encode(t, "ab", 2, &o, true, &tk), DF_E_ARG);
    assert_null(tk.ids);
    df_tok_json_free(t);

    /* padding_side and truncation_side from the config */
    t = load(&s, "{\"pad_token\": \"<pad>\", \"padding_side\": \"left\", "
                 "\"truncation_side\": \"left\"}");
    expect_padded(t, "ab", 6, IDS(0, 0, 1, 3, 4, 2), IDS(0, 0, 1, 1, 1, 1));
    expect_padded(t, "aab", 4, IDS(1, 3, 4, 2), IDS(1, 1, 1, 1)); /* keeps the end: a b */
    df_tok_json_free(t);
}

static void test_llama_class(void **state)
{
    (void)state;
    /* LlamaTokenizerFast: padding on the left, and its post-processor comes from
     * add_bos_token / add_eos_token whatever the file's says */
    spec s = {.vocab = SMALL_VOCAB, .added = SMALL_ADDED, .post = TEMPLATE_POST};
    df_tok_json *t = load(&s, "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": "
                              "\"<s>\", \"eos_token\": \"</s>\", \"pad_token\": \"<pad>\"}");
    df_tok_json_info info;
    df_tok_json_get_info(t, &info);
    assert_true(info.padding_left);
    assert_int_equal(info.bos_id, 1);
    assert_int_equal(info.eos_id, 2);
    expect_ids(t, "ab", true, IDS(1, 3, 4));
    expect_padded(t, "a", 4, IDS(0, 0, 1, 3), IDS(0, 0, 1, 1));
    df_tok_json_free(t);
    t = load(&s, "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": \"<s>\", "
                 "\"eos_token\": \"</s>\", \"add_eos_token\": true, \"padding_side\": \"right\"}");
    expect_ids(t, "ab", true, IDS(1, 3, 4, 2));
    df_tok_json_get_info(t, &info);
    assert_false(info.padding_left);
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 8, .pad = true};
    assert_int_equal(df_tok_json_encode(t, "ab", 2, &o, true, &tk), DF_E_ARG); /* no pad */
    assert_non_null(strstr(df_error_message(), "pad"));
    df_tok_json_free(t);
}

/* LlamaTokenizerFast over a byte-level tokenizer.json (the tekken layout) loads as
 * transformers 5.x's generic class: the file's padding direction or right, the file's
 * post-processor unless the config names add_bos_token / add_eos_token (then both rebuilt,
 * a missing one false). */
static void test_byte_level_llama_class(void **state)
{
    (void)state;
    spec s = {.vocab = SMALL_VOCAB, .added = SMALL_ADDED, .post = TEMPLATE_POST,
              .pre = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                     "\"trim_offsets\": true, \"use_regex\": false}"};
    const char *cls = "{\"tokenizer_class\": \"LlamaTokenizerFast\", \"bos_token\": "
                      "\"<s>\", \"eos_token\": \"</s>\", \"pad_token\": \"<pad>\"";
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s}", cls);
    df_tok_json *t = load(&s, cfg);
    df_tok_json_info info;
    df_tok_json_get_info(t, &info);
    assert_false(info.padding_left);
    expect_ids(t, "ab", true, IDS(1, 3, 4, 2)); /* TEMPLATE_POST: <s> $A </s> */
    expect_padded(t, "a", 5, IDS(1, 3, 2, 0, 0), IDS(1, 1, 1, 0, 0));
    df_tok_json_free(t);
    /* add_bos_token alone: <s> $A, the eos gone */
    snprintf(cfg, sizeof cfg, "%s, \"add_bos_token\": true}", cls);
    t = load(&s, cfg);
    expect_ids(t, "ab", true, IDS(1, 3, 4));
    df_tok_json_free(t);
    /* add_eos_token alone: $A </s> (the bos default is false here, true for LlamaTokenizer) */
    snprintf(cfg, sizeof cfg, "%s, \"add_eos_token\": true, \"padding_side\": \"left\"}",
             cls);
    t = load(&s, cfg);
    expect_ids(t, "ab", true, IDS(3, 4, 2));
    df_tok_json_get_info(t, &info);
    assert_true(info.padding_left);
    df_tok_json_free(t);
}

/* ---- malformed and unsupported files ------------------------------------------------------- */

static void test_malformed(void **state)
{
    (void)state;
    df_tok_json *t = (df_tok_json *)1;
    assert_int_equal(df_tok_json_create("{\"model\": ", 10, NULL, 0, "mem", &t), DF_E_FORMAT);
    assert_null(t);
    assert_non_null(strstr(df_error_message(), "mem/tokenizer.json: not valid JSON"));

    spec s = {.vocab = "\"a\": 0, \"b\": 0"};
    expect_error(&s, NULL, DF_E_FORMAT, "model.vocab", "id 0");
    s.vocab = "\"a\": 0, \"b\": 5";
    expect_error(&s, NULL, DF_E_FORMAT, "model.vocab['b']", "[0, 2)");
    s.vocab = "\"a\": 0, \"b\": -1";
    expect_error(&s, NULL, DF_E_FORMAT, "model.vocab['b']", NULL);
    s.vocab = "\"a\": 0, \"b\": 1e300"; /* no conversion of an out-of-range number */
    expect_error(&s, NULL, DF_E_FORMAT, "model.vocab['b']", NULL);
    s.vocab = "\"a\": 0, \"b\": \"1\"";
    expect_error(&s, NULL, DF_E_FORMAT, "model.vocab['b']", NULL);

    s = (spec){.vocab = "\"a\": 0, \"b\": 1, \"ab\": 2", .merges = "[\"a\", \"c\"]"};
    expect_error(&s, NULL, DF_E_FORMAT, "model.merges[0]", "'c'");
    s.merges = "[\"a\", \"b\"], [\"b\", \"a\"]"; /* "ba" is not a token */
    expect_error(&s, NULL, DF_E_FORMAT, "model.merges[1]", "'b' + 'a'");
    s.merges = "[\"a\", \"b\", \"a\"]";
    expect_error(&s, NULL, DF_E_FORMAT, "model.merges[0]", "two tokens");
    s.merges = "\"a b a\"";
    expect_error(&s, NULL, DF_E_FORMAT, "model.merges[0]", "two tokens");

    s = (spec){.vocab = "\"a\": 0, \"<s>\": 1", .added = "[" ADDED("<s>", 0, "") "]"};
    expect_error(&s, NULL, DF_E_FORMAT, "added_tokens[0]", "id 1");
    s.added = "[" ADDED("<x>", 0, "") "]"; /* id 0 is "a" */
    expect_error(&s, NULL, DF_E_FORMAT, "added_tokens[0]", "'a'");
    s.added = "[" ADDED("<x>", 2, "") ", " ADDED("<y>", 2, "") "]";
    expect_error(&s, NULL, DF_E_FORMAT, "added_tokens[0] and [1]", NULL);
    s.added = "[{\"id\": 2}]";
    expect_error(&s, NULL, DF_E_FORMAT, "added_tokens[0]", "content");

    s = (spec){.vocab = "\"a\": 0", .model_extra = "\"unk_token\": \"<unk>\""};
    expect_error(&s, NULL, DF_E_FORMAT, "model.unk_token", "<unk>");
    s = (spec){.vocab = "\"a\": 0"};
    expect_error(&s, "{\"pad_token\": \"<pad>\"}", DF_E_FORMAT, "tokenizer_config.json",
                 "pad_token '<pad>'");
    expect_error(&s, "{\"padding_side\": \"middle\"}", DF_E_FORMAT, "tokenizer_config.json",
                 "padding_side");
    expect_error(&s, "[1]", DF_E_FORMAT, "tokenizer_config.json", "object");
    s.pre = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": "
            "\"Isolated\"}";
    expect_error(&s, NULL, DF_E_FORMAT, "pattern.Regex", "PCRE2");
    s.pre = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}";
    expect_error(&s, NULL, DF_E_FORMAT, "behavior", NULL);
    s.pre = NULL;
    s.post = "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": "
             "\"<s>\"}}], \"special_tokens\": {}}";
    expect_error(&s, NULL, DF_E_FORMAT, "special_tokens['<s>']", NULL);
}

static void test_unsupported(void **state)
{
    (void)state;
    df_tok_json *t = (df_tok_json *)1;
    const char *wp = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
    assert_int_equal(df_tok_json_create(wp, strlen(wp), NULL, 0, "mem", &t), DF_E_UNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(df_error_message(), "WordPiece"));

    spec s = {.vocab = "\"a\": 0", .pre = "{\"type\": \"Whitespace\"}"};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "pre_tokenizer 'Whitespace'", NULL);
    s = (spec){.vocab = "\"a\": 0", .norm = "{\"type\": \"Lowercase\"}"};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "normalizer 'Lowercase'", NULL);
    s = (spec){.vocab = "\"a\": 0", .post = "{\"type\": \"RobertaProcessing\"}"};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "post_processor 'RobertaProcessing'", NULL);
    s = (spec){.vocab = "\"a\": 0", .model_extra = "\"dropout\": 0.1"};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "model.dropout", NULL);
    s = (spec){.vocab = "\"a\": 0", .model_extra = "\"continuing_subword_prefix\": \"##\""};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "continuing_subword_prefix", NULL);
    s = (spec){.vocab = "\"a\": 0",
               .added = "[{\"id\": 1, \"content\": \"<x>\", \"single_word\": true}]"};
    expect_error(&s, NULL, DF_E_UNSUPPORTED, "single_word", NULL);
}

static df_status create_and_encode(void *arg)
{
    (void)arg;
    spec s = {.vocab = BYTE_VOCAB ", \"<pad>\": 7",
              .merges = BYTE_MERGES,
              .norm = "{\"type\": \"NFC\"}",
              .pre = "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
                     "\"pattern\": {\"Regex\": \"\\\\s+|\\\\p{L}+\"}, \"behavior\": "
                     "\"Isolated\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                     "\"use_regex\": false}]}",
              .added = "[" ADDED("<pad>", 7, "") "]"};
    df_tok_json *t;
    df_status st = create(&s, "{\"pad_token\": \"<pad>\"}", &t);
    if (st != DF_OK)
        return st;
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 8, .pad = true, .truncate = true};
    const char *text = "a a\xC3\xA9<pad>b";
    st = df_tok_json_encode(t, text, strlen(text), &o, true, &tk);
    df_tokens_deinit(&tk);
    df_tok_json_free(t);
    return st;
}

static void test_out_of_memory(void **state)
{
    (void)state;
    int64_t live = df_alloc_live();
    for (int n = 1;; n++) {
        df_alloc_fail_at(n);
        df_status s = create_and_encode(NULL);
        df_alloc_fail_at(0);
        if (s == DF_OK)
            break;
        if (s != DF_E_OOM)
            fail_msg("allocation %d failed: %s", n, df_error_message());
        assert_int_equal(df_alloc_live(), live);
        assert_true(n < 100000);
    }
    assert_int_equal(df_alloc_live(), live);
}

/* ---- FLUX.2 prompt formatting ----------------------------------------------------------- */

static void test_render(void **state)
{
    (void)state;
    char *text;
    size_t len;
    const char *p = "a [IMG]cat[IMG]";
    assert_int_equal(df_prompt_render(DF_PROMPT_FLUX2_MISTRAL, p, strlen(p), "SYS", &text, &len),
                     DF_OK);
    assert_string_equal(text, "<s>[SYSTEM_PROMPT]SYS[/SYSTEM_PROMPT][INST]a cat[/INST]");
    assert_int_equal(len, strlen(text));
    df_prompt_text_free(text);
    assert_int_equal(df_prompt_render(DF_PROMPT_FLUX2_MISTRAL, "x", 1, NULL, &text, &len), DF_OK);
    assert_non_null(strstr(text, "object relationships, object\nattribution and actions"));
    df_prompt_text_free(text);
    assert_int_equal(df_prompt_render(DF_PROMPT_FLUX2_QWEN3, p, strlen(p), "ignored", &text, &len),
                     DF_OK);
    assert_string_equal(text, "<|im_start|>user\na [IMG]cat[IMG]<|im_end|>\n<|im_start|>"
                              "assistant\n<think>\n\n</think>\n\n");
    df_prompt_text_free(text);
    assert_int_equal(df_prompt_render(DF_PROMPT_FLUX2_QWEN3, "\xC3", 1, NULL, &text, &len),
                     DF_E_ARG);
    assert_null(text);
    assert_int_equal(df_prompt_render((df_prompt_format)9, "x", 1, NULL, &text, &len), DF_E_ARG);
}

static df_tokenizer *golden(const char *case_dir)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%s", DF_GOLDEN_DIR, case_dir);
    df_tokenizer *t = NULL;
    if (df_tokenizer_load(dir, &t) != DF_OK)
        fail_msg("%s", df_error_message());
    return t;
}

static void test_encode_prompt_golden(void **state)
{
    (void)state;
    df_tokenizer *m = golden("tok-mistral-tekken/tokenizer");
    df_tokenizer_info info;
    df_tokenizer_get_info(m, &info);
    assert_int_equal(df_tokenizer_kind(m), DF_TOKENIZER_BPE_JSON);
    assert_false(info.padding_left); /* LlamaTokenizerFast over ByteLevel: right, as 5.x */
    assert_int_equal(info.pad_id, 11);
    df_tokens a, b;
    assert_int_equal(df_tokenizer_encode_prompt(m, DF_PROMPT_FLUX2_MISTRAL, "a cat", 5, NULL,
                                                NULL, &a), DF_OK);
    assert_int_equal(a.count, 512);
    assert_int_equal(a.ids[0], 1); /* the template's one <s> */
    assert_int_equal(a.ids[1], 17); /* [SYSTEM_PROMPT] */
    int64_t last = 511;
    while (a.attention_mask[last] == 0)
        assert_int_equal(a.ids[last--], 11);
    assert_int_equal(a.ids[last], 4); /* [/INST] */
    assert_int_equal(df_tokenizer_encode_prompt(m, DF_PROMPT_FLUX2_MISTRAL, "a [IMG]cat", 10,
                                                NULL, NULL, &b), DF_OK);
    assert_memory_equal(a.ids, b.ids, 512 * sizeof *a.ids);
    df_tokens_deinit(&a);
    df_tokens_deinit(&b);
    df_tokenizer_free(m);

    df_tokenizer *q = golden("tok-qwen3/tokenizer");
    df_tokenize_opts o = {.max_length = 20};
    assert_int_equal(df_tokenizer_encode_prompt(q, DF_PROMPT_FLUX2_QWEN3, "a cat", 5, NULL, &o,
                                                &a), DF_OK);
    assert_int_equal(a.count, 20);
    assert_int_equal(a.ids[0], 151644); /* <|im_start|> */
    assert_int_equal(a.ids[19], 151643); /* right padding with <|endoftext|> */
    assert_int_equal(a.attention_mask[19], 0);
    assert_int_equal(a.attention_mask[0], 1);
    df_tokens_deinit(&a);
    df_tokenizer_free(q);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_merge_order),
        cmocka_unit_test(test_bpe_long_piece),
        cmocka_unit_test(test_bpe_ignore_merges),
        cmocka_unit_test(test_bpe_unknown_characters),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_split_regex_unicode_categories),
        cmocka_unit_test(test_byte_level),
        cmocka_unit_test(test_nfc),
        cmocka_unit_test(test_added_tokens),
        cmocka_unit_test(test_empty_added_token),
        cmocka_unit_test(test_template_truncation_padding),
        cmocka_unit_test(test_llama_class),
        cmocka_unit_test(test_byte_level_llama_class),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_unsupported),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_encode_prompt_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
