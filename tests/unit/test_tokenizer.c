/*
 * Tests of the tokenizers (src/text/): the CLIP byte mapping, BPE merge order and clean-up
 * rules on hand-made vocabularies; the protobuf reader; SentencePiece unigram Viterbi,
 * unknown runs, byte fallback and whitespace rules on tiny spiece.model files written here
 * with a small protobuf writer; invalid UTF-8, empty, long and control-character prompts;
 * truncation and padding; out-of-memory sweeps; and the golden tok-* cases through the
 * public API, compared with the ids transformers produced.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/json.h>
#include <diffuse/safetensors.h>
#include <diffuse/tokenizer.h>

#include "core/alloc.h"
#include "text/clip_bpe.h"
#include "text/protobuf.h"
#include "text/t5_unigram.h"

#define SP "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* ---- helpers ------------------------------------------------------------------------------ */

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

/* A fresh folder DF_TEST_TMP/tokenizer-<name>; returns its path (static buffer). */
static const char *tmp_dir(const char *name)
{
    static char dir[1024];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(dir, sizeof dir, "%s/tokenizer-%s", DF_TEST_TMP, name);
    mkdir(dir, 0755);
    return dir;
}

static void write_in(const char *dir, const char *file, const char *text)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    write_file(path, text, strlen(text));
}

static void golden_dir(char *buf, size_t cap, const char *case_name, const char *sub)
{
    snprintf(buf, cap, "%s/%s/%s", DF_GOLDEN_DIR, case_name, sub);
}

static df_tokenizer *load(const char *dir)
{
    df_tokenizer *t = NULL;
    if (df_tokenizer_load(dir, &t) != DF_OK)
        fail_msg("loading %s: %s", dir, df_error_message());
    return t;
}

/* Encodes and compares with `want` (n ids). */
static void expect_ids(const df_tokenizer *t, const char *text, size_t len,
                       const df_tokenize_opts *o, const int64_t *want, int64_t n)
{
    df_tokens tk;
    if (df_tokenizer_encode(t, text, len, o, &tk) != DF_OK)
        fail_msg("encoding '%.40s': %s", text, df_error_message());
    if (tk.count != n)
        fail_msg("'%.40s': %lld ids, expected %lld", text, (long long)tk.count, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (tk.ids[i] != want[i])
            fail_msg("'%.40s': id %lld is %lld, expected %lld", text, (long long)i,
                     (long long)tk.ids[i], (long long)want[i]);
    df_tokens_deinit(&tk);
}

#define EXPECT(t, text, ...)                                                                       \
    do {                                                                                           \
        const int64_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, text, strlen(text), NULL, want_, sizeof want_ / sizeof want_[0]);            \
    } while (0)

/* ---- a tiny protobuf writer for spiece.model files ----------------------------------- */

typedef struct pbw {
    uint8_t buf[1 << 16];
    size_t len;
} pbw;

static void pb_varint(pbw *w, uint64_t v)
{
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        w->buf[w->len++] = b | (v ? 0x80 : 0);
    } while (v);
}

static void pb_key(pbw *w, int field, int wire)
{
    pb_varint(w, (uint64_t)field << 3 | (uint64_t)wire);
}

static void pb_bytes(pbw *w, int field, const void *p, size_t n)
{
    pb_key(w, field, 2);
    pb_varint(w, n);
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}

static void pb_int(pbw *w, int field, int64_t v)
{
    pb_key(w, field, 0);
    pb_varint(w, (uint64_t)v);
}

static void pb_float(pbw *w, int field, float f)
{
    uint32_t bits;
    memcpy(&bits, &f, 4);
    pb_key(w, field, 5);
    for (int i = 0; i < 4; i++)
        w->buf[w->len++] = (uint8_t)(bits >> (8 * i));
}

static void add_piece(pbw *model, const char *piece, float score, int type)
{
    static pbw p;
    p.len = 0;
    pb_bytes(&p, 1, piece, strlen(piece));
    pb_float(&p, 2, score);
    if (type != DF_SP_NORMAL)
        pb_int(&p, 3, type);
    pb_bytes(model, 1, p.buf, p.len);
}

/* pad, eos, unk first, as T5 does; then `pieces` (NULL-terminated "piece", score pairs). */
static void t5_header(pbw *m)
{
    m->len = 0;
    add_piece(m, "<pad>", 0, DF_SP_CONTROL);
    add_piece(m, "</s>", 0, DF_SP_CONTROL);
    add_piece(m, "<unk>", 0, DF_SP_UNKNOWN);
}

static void normalizer_spec(pbw *m, bool dummy_prefix, bool remove_ws)
{
    static pbw n;
    n.len = 0;
    pb_bytes(&n, 1, "identity", 8);
    pb_int(&n, 3, dummy_prefix);
    pb_int(&n, 4, remove_ws);
    pb_bytes(m, 3, n.buf, n.len);
}

/* Builds a precompiled_charsmap (sentencepiece's compiled normalisation rules): a 4-byte
 * trie size, a darts-clone double array over the keys' bytes, then the NUL-terminated
 * replacements. Nodes are placed greedily: a node at index q with base b has its children
 * at b ^ label and its value unit (the replacement's offset) at b; no two nodes share a
 * base, so a label check is enough to tell whose child a unit is. */
typedef struct rule {
    const char *from, *to;
} rule;

enum { MAX_UNITS = 2048 };

static bool base_used[MAX_UNITS]; /* each node needs its own base, as darts-clone ensures */

/* strncmp(a, b, n) == 0, written out: gcc's inlined strncmp warns on the short literals. */
static bool same_prefix(const char *a, const char *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (a[i] != b[i])
            return false;
        if (!a[i])
            return true;
    }
    return true;
}

static void place(uint32_t *u, bool *used, uint32_t q, const char *prefix, size_t depth,
                  const rule *rules, int n, const uint32_t *value_of)
{
    bool child[256] = {false}, terminal = false;
    uint32_t value = 0;
    for (int i = 0; i < n; i++) {
        if (!same_prefix(rules[i].from, prefix, depth))
            continue;
        if (strlen(rules[i].from) == depth) {
            terminal = true;
            value = value_of[i];
        } else {
            child[(uint8_t)rules[i].from[depth]] = true;
        }
    }
    uint32_t b = 1;
    for (;; b++) {
        bool ok = !base_used[b] && (!terminal || !used[b]);
        for (int l = 1; l < 256 && ok; l++)
            ok = !child[l] || ((b ^ (uint32_t)l) < MAX_UNITS && !used[b ^ (uint32_t)l]);
        if (ok)
            break;
    }
    base_used[b] = true;
    u[q] |= (q ^ b) << 10 | (terminal ? 1u << 8 : 0);
    if (terminal) {
        used[b] = true;
        u[b] = 1u << 31 | value;
    }
    for (int l = 1; l < 256; l++)
        if (child[l]) {
            used[b ^ (uint32_t)l] = true;
            u[b ^ (uint32_t)l] = (uint32_t)l;
        }
    char next[64];
    memcpy(next, prefix, depth);
    for (int l = 1; l < 256; l++)
        if (child[l]) {
            next[depth] = (char)l;
            place(u, used, b ^ (uint32_t)l, next, depth + 1, rules, n, value_of);
        }
}

static size_t build_charsmap(const rule *rules, int n, uint8_t *out)
{
    static uint32_t u[MAX_UNITS];
    static bool used[MAX_UNITS];
    memset(u, 0, sizeof u);
    memset(used, 0, sizeof used);
    memset(base_used, 0, sizeof base_used);
    used[0] = true;
    uint32_t value_of[32];
    char strings[512];
    size_t slen = 0;
    for (int i = 0; i < n; i++) {
        value_of[i] = (uint32_t)slen;
        memcpy(strings + slen, rules[i].to, strlen(rules[i].to) + 1);
        slen += strlen(rules[i].to) + 1;
    }
    place(u, used, 0, "", 0, rules, n, value_of);
    uint32_t units = 0;
    for (uint32_t i = 0; i < MAX_UNITS; i++)
        if (used[i])
            units = i + 1;
    uint32_t bytes = units * 4;
    memcpy(out, &bytes, 4);
    memcpy(out + 4, u, bytes);
    memcpy(out + 4 + bytes, strings, slen);
    return 4 + bytes + slen;
}

/* The small model of the Viterbi tests: ids 3.. as listed. */
static void viterbi_model(pbw *m)
{
    t5_header(m);
    add_piece(m, SP, -2.0f, DF_SP_NORMAL);        /* 3 */
    add_piece(m, "a", -2.0f, DF_SP_NORMAL);       /* 4 */
    add_piece(m, "b", -2.0f, DF_SP_NORMAL);       /* 5 */
    add_piece(m, "c", -3.0f, DF_SP_NORMAL);       /* 6 */
    add_piece(m, SP "a", -1.0f, DF_SP_NORMAL);    /* 7 */
    add_piece(m, "bc", -1.0f, DF_SP_NORMAL);      /* 8 */
    add_piece(m, SP "ab", -1.5f, DF_SP_NORMAL);   /* 9 */
    add_piece(m, "<sep>", 0, DF_SP_USER_DEFINED); /* 10 */
    add_piece(m, "zz", -0.5f, DF_SP_UNUSED);      /* 11 */
    add_piece(m, "z", -4.0f, DF_SP_NORMAL);       /* 12 */
}

static df_t5_unigram *make_model(const pbw *m)
{
    df_t5_unigram *u = NULL;
    if (df_t5_unigram_create(m->buf, m->len, "tiny.model", &u) != DF_OK)
        fail_msg("tiny model: %s", df_error_message());
    return u;
}

static void expect_sp(const df_t5_unigram *u, const char *text, const int64_t *want, size_t n)
{
    df_i64_vec ids = {0};
    if (df_t5_unigram_encode(u, text, strlen(text), NULL, &ids) != DF_OK)
        fail_msg("'%s': %s", text, df_error_message());
    if (ids.len != n)
        fail_msg("'%s': %zu ids, expected %zu (first %lld)", text, ids.len, n,
                 ids.len ? (long long)ids.data[0] : -1LL);
    for (size_t i = 0; i < n; i++)
        if (ids.data[i] != want[i])
            fail_msg("'%s': id %zu is %lld, expected %lld", text, i, (long long)ids.data[i],
                     (long long)want[i]);
    df_i64_vec_free(&ids);
}

#define EXPECT_SP(u, text, ...)                                                                    \
    do {                                                                                           \
        const int64_t want_[] = {__VA_ARGS__};                                                     \
        expect_sp(u, text, want_, sizeof want_ / sizeof want_[0]);                                 \
    } while (0)

/* ---- CLIP: byte mapping, BPE, clean-up ------------------------------------------------ */

static void test_byte_mapping(void **state)
{
    (void)state;
    /* GPT-2's table: printable Latin-1 maps to itself, the rest to U+0100.. in byte order */
    assert_int_equal(df_clip_byte_to_cp('a'), 'a');
    assert_int_equal(df_clip_byte_to_cp('!'), '!');
    assert_int_equal(df_clip_byte_to_cp(0xE9), 0xE9);
    assert_int_equal(df_clip_byte_to_cp(0x00), 0x100);
    assert_int_equal(df_clip_byte_to_cp('\n'), 0x10A); /* 'Ċ' */
    assert_int_equal(df_clip_byte_to_cp(' '), 0x120);  /* 'Ġ' */
    assert_int_equal(df_clip_byte_to_cp(0x7F), 0x121);
    assert_int_equal(df_clip_byte_to_cp(0xAD), 0x143); /* 'Ń' */
    bool seen[0x200] = {false};
    for (int b = 0; b < 256; b++) { /* a bijection onto printable code points */
        int32_t cp = df_clip_byte_to_cp((uint8_t)b);
        assert_true(cp > 0x20 && cp < 0x200);
        assert_false(seen[cp]);
        seen[cp] = true;
    }
}

/* A hand-made CLIP folder: vocab (token -> id in listed order) and merges. */
static const char *clip_folder(const char *name, const char *const *tokens, int n,
                               const char *merges)
{
    const char *dir = tmp_dir(name);
    char json[8192];
    size_t len = 0;
    len += (size_t)snprintf(json + len, sizeof json - len, "{");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(json + len, sizeof json - len, "%s\"%s\": %d", i ? ", " : "",
                                tokens[i], i);
    snprintf(json + len, sizeof json - len, "}");
    write_in(dir, "vocab.json", json);
    write_in(dir, "merges.txt", merges);
    return dir;
}

static const char *const bpe_tokens[] = {
    "a",      "b",  "c",     "z",   "a</w>",  "b</w>",           "c</w>",         "z</w>",
    "bc</w>", "ab", "aa",    "aaa", "aa</w>", "<|startoftext|>", "<|endoftext|>", "abc</w>",
    "'s</w>", "'",  "s</w>",
};
enum {
    A,
    B,
    C,
    Z,
    A_W,
    B_W,
    C_W,
    Z_W,
    BC_W,
    AB,
    AA,
    AAA,
    AA_W,
    BOS,
    EOS,
    ABC_W,
    S_CONTR,
    APOS,
    S_W
};

static void test_bpe_merge_rank_order(void **state)
{
    (void)state;
    /* "b c</w>" outranks "a b": abc -> a + bc</w>, although "ab" comes first in the word */
    const char *dir = clip_folder("bpe-order", bpe_tokens, 19, "#version: 0.2\nb c</w>\na b\n");
    df_tokenizer *t = load(dir);
    EXPECT(t, "abc", BOS, A, BC_W, EOS);
    df_tokenizer_free(t);

    /* reversed ranks: ab first, then nothing joins "ab" and "c</w>" */
    dir = clip_folder("bpe-order2", bpe_tokens, 19, "#version: 0.2\na b\nb c</w>\n");
    t = load(dir);
    EXPECT(t, "abc", BOS, AB, C_W, EOS);
    df_tokenizer_free(t);
}

static void test_bpe_merges_every_occurrence_first(void **state)
{
    (void)state;
    /* "a a" (rank 1) is merged at both places in "aaaaz" before "aa a" (rank 0), which
     * only exists after the first merge, is considered: aa aa z</w>, not aaa a z</w>. */
    const char *dir = clip_folder("bpe-batch", bpe_tokens, 19, "#version: 0.2\naa a\na a\n");
    df_tokenizer *t = load(dir);
    EXPECT(t, "aaaaz", BOS, AA, AA, Z_W, EOS);
    /* non-overlapping, left to right: aaa -> aa a</w> (the pair (a, a</w>) is not a merge) */
    EXPECT(t, "aaa", BOS, AA, A_W, EOS);
    df_tokenizer_free(t);
}

static void test_bpe_specials_and_contractions(void **state)
{
    (void)state;
    const char *dir = clip_folder("bpe-special", bpe_tokens, 19, "#version: 0.2\n' s</w>\n");
    df_tokenizer *t = load(dir);
    /* special strings in the text map straight to their ids */
    EXPECT(t, "a<|endoftext|>b", BOS, A_W, EOS, B_W, EOS);
    /* "'s" is its own match (then merged), "z's" -> z, 's */
    EXPECT(t, "z's", BOS, Z_W, S_CONTR, EOS);
    /* unknown bytes become the unk token (<|endoftext|>) */
    EXPECT(t, "q", BOS, EOS, EOS);
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    assert_int_equal(info.bos_id, BOS);
    assert_int_equal(info.eos_id, EOS);
    assert_int_equal(info.pad_id, EOS);
    assert_int_equal(info.model_max_length, 77);
    assert_string_equal(df_tokenizer_id_to_piece(t, BC_W), "bc</w>");
    assert_null(df_tokenizer_id_to_piece(t, 1000));
    df_tokenizer_free(t);
}

static void expect_clean(const char *in, const char *want)
{
    df_byte_buf out = {0};
    assert_int_equal(df_clip_bpe_normalize(in, strlen(in), &out), DF_OK);
    if (strcmp(out.data, want) != 0)
        fail_msg("clean-up of '%s': '%s', expected '%s'", in, out.data, want);
    df_byte_buf_free(&out);
}

static void test_clip_cleanup_rules(void **state)
{
    (void)state;
    expect_clean("  Extra   spaces\tand\ttabs\nand a new line  ",
                 "extra spaces and tabs and a new line");
    expect_clean("bell\x07"
                 "char",
                 "bellchar");                           /* Cc removed */
    expect_clean("zero\xE2\x80\x8Bwidth", "zerowidth"); /* U+200B (Cf) removed */
    expect_clean("a\xEF\xBF\xBD"
                 "b",
                 "ab"); /* U+FFFD removed */
    expect_clean("a\xE3\x80\x80"
                 "b",
                 "a b"); /* U+3000 (Zs) is a space */
    expect_clean("a\xE2\x80\xA8"
                 "b",
                 "a b"); /* U+2028 splits words */
    expect_clean("\xE6\x9D\xB1\xE4\xBA\xAC"
                 "x",
                 "\xE6\x9D\xB1 \xE4\xBA\xAC x");            /* 東京x */
    expect_clean("Cafe\xCC\x81", "caf\xC3\xA9");            /* NFC: e + U+0301 -> é */
    expect_clean("\xC3\x9Cn\xC3\xAF", "\xC3\xBCn\xC3\xAF"); /* Ünï -> ünï */
    /* Python lower(): final sigma, and İ -> i + U+0307 */
    expect_clean("\xCE\x9F\xCE\x94\xCE\x9F\xCE\xA3 \xCE\xA3\xCE\x91",
                 "\xCE\xBF\xCE\xB4\xCE\xBF\xCF\x82 \xCF\x83\xCE\xB1");
    expect_clean("\xC4\xB0", "i\xCC\x87");
    expect_clean("", "");
    expect_clean("\x01\x02\x03", "");
}

/* ---- protobuf ------------------------------------------------------------------------------ */

static void test_protobuf_reader(void **state)
{
    (void)state;
    pbw w = {.len = 0};
    pb_int(&w, 1, 300);
    pb_bytes(&w, 2, "hey", 3);
    pb_float(&w, 3, 1.5f);
    pb_int(&w, 4, -1); /* proto2 int32 -1: a ten-byte varint */
    df_pb_reader r;
    df_pb_field f;
    df_pb_reader_init(&r, w.buf, w.len);
    assert_int_equal(df_pb_next(&r, &f), 1);
    assert_int_equal(f.number, 1);
    assert_int_equal(f.value, 300);
    assert_int_equal(df_pb_next(&r, &f), 1);
    assert_int_equal(f.len, 3);
    assert_memory_equal(f.data, "hey", 3);
    assert_int_equal(df_pb_next(&r, &f), 1);
    assert_true(df_pb_float(&f) == 1.5f);
    assert_int_equal(df_pb_next(&r, &f), 1);
    assert_int_equal(df_pb_int32(&f), -1);
    assert_int_equal(df_pb_next(&r, &f), 0);

    /* every truncation of the message is an error or a clean end, never a read past it */
    for (size_t cut = 0; cut < w.len; cut++) {
        df_pb_reader_init(&r, w.buf, cut);
        int got;
        while ((got = df_pb_next(&r, &f)) > 0)
            ;
        assert_true(got == 0 || r.error != NULL);
    }
    const uint8_t past_end[] = {0x12, 0x05, 'a'}; /* field 2, 5 bytes, only 1 there */
    df_pb_reader_init(&r, past_end, sizeof past_end);
    assert_int_equal(df_pb_next(&r, &f), -1);
    assert_non_null(strstr(r.error, "past the end"));
    const uint8_t group[] = {0x0B}; /* wire type 3 */
    df_pb_reader_init(&r, group, sizeof group);
    assert_int_equal(df_pb_next(&r, &f), -1);
}

/* ---- SentencePiece unigram ------------------------------------------------------------------ */

static void test_unigram_viterbi(void **state)
{
    (void)state;
    static pbw m;
    viterbi_model(&m);
    df_t5_unigram *u = make_model(&m);
    /* "▁abc": ▁a + bc scores -2, better than the longest first piece ▁ab + c (-4.5) */
    EXPECT_SP(u, "abc", 7, 8);
    /* "▁ab": ▁ab (-1.5) beats ▁a + b (-3) */
    EXPECT_SP(u, "ab", 9);
    /* unknown characters: x and y are one merged <unk>, the space before them is ▁ */
    EXPECT_SP(u, "a xy b", 7, 3, 2, 3, 5);
    /* a user-defined piece always wins and is not split */
    EXPECT_SP(u, "a<sep>b", 7, 10, 5);
    /* an unused piece never matches: zz is two z */
    EXPECT_SP(u, "zz", 3, 12, 12);
    /* leading, trailing and repeated spaces are dropped */
    EXPECT_SP(u, "   a    b  ", 7, 3, 5);
    EXPECT_SP(u, "");
    EXPECT_SP(u, "    ");
    assert_int_equal(df_t5_unigram_piece_to_id(u, "bc", 2), 8);
    assert_int_equal(df_t5_unigram_piece_to_id(u, "nope", 4), 2);
    assert_int_equal(df_t5_unigram_piece_to_id(u, "</s>", 4), 1);
    df_t5_unigram_free(u);
}

static void test_unigram_whitespace_options(void **state)
{
    (void)state;
    static pbw m;
    viterbi_model(&m);
    normalizer_spec(&m, false, false); /* no dummy prefix, keep extra spaces */
    df_t5_unigram *u = make_model(&m);
    df_byte_buf out = {0};
    assert_int_equal(df_t5_unigram_normalize(u, " a  b", 5, &out), DF_OK);
    assert_string_equal(out.data, SP "a" SP SP "b");
    df_byte_buf_free(&out);
    EXPECT_SP(u, "ab", 4, 5);
    df_t5_unigram_free(u);
}

static void test_unigram_byte_fallback(void **state)
{
    (void)state;
    static pbw m, spec;
    t5_header(&m);
    for (int b = 0; b < 256; b++) { /* ids 3..258 */
        char piece[8];
        snprintf(piece, sizeof piece, "<0x%02X>", b);
        add_piece(&m, piece, 0, DF_SP_BYTE);
    }
    add_piece(&m, SP, -1, DF_SP_NORMAL);  /* 259 */
    add_piece(&m, "a", -1, DF_SP_NORMAL); /* 260 */
    /* without byte_fallback in the trainer spec, byte pieces are refused */
    df_t5_unigram *u = (df_t5_unigram *)1;
    assert_int_equal(df_t5_unigram_create(m.buf, m.len, "bytes.model", &u), DF_E_FORMAT);
    assert_null(u);
    assert_non_null(strstr(df_error_message(), "byte_fallback"));

    spec.len = 0;
    pb_int(&spec, 35, 1);
    pb_bytes(&m, 2, spec.buf, spec.len);
    u = make_model(&m);
    /* é (C3 A9) and 😀 (F0 9F 98 80) are unknown: one byte piece per UTF-8 byte */
    EXPECT_SP(u,
              "a\xC3\xA9"
              "a",
              259, 260, 3 + 0xC3, 3 + 0xA9, 260);
    EXPECT_SP(u, "\xF0\x9F\x98\x80", 259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80);
    df_t5_unigram_free(u);
    char path[1200]; /* written out for the fuzz corpus (tests/fuzz/corpus/t5_tokenizer) */
    snprintf(path, sizeof path, "%s/bytes.model", tmp_dir("models"));
    write_file(path, m.buf, m.len);
}

static void test_unigram_rejects_broken_models(void **state)
{
    (void)state;
    static pbw m;
    df_t5_unigram *u = (df_t5_unigram *)1;
    /* no <unk> */
    m.len = 0;
    add_piece(&m, "a", -1, DF_SP_NORMAL);
    assert_int_equal(df_t5_unigram_create(m.buf, m.len, "x.model", &u), DF_E_FORMAT);
    assert_null(u);
    assert_non_null(strstr(df_error_message(), "unknown piece"));
    /* duplicate piece */
    t5_header(&m);
    add_piece(&m, "a", -1, DF_SP_NORMAL);
    add_piece(&m, "a", -2, DF_SP_NORMAL);
    assert_int_equal(df_t5_unigram_create(m.buf, m.len, "x.model", &u), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "already defined"));
    /* a BPE model */
    static pbw spec;
    t5_header(&m);
    spec.len = 0;
    pb_int(&spec, 3, 2);
    pb_bytes(&m, 2, spec.buf, spec.len);
    assert_int_equal(df_t5_unigram_create(m.buf, m.len, "x.model", &u), DF_E_UNSUPPORTED);
    /* garbage and truncations of a good model fail cleanly (or parse a prefix) */
    viterbi_model(&m);
    for (size_t cut = 0; cut < m.len; cut += 3) {
        u = NULL;
        df_status s = df_t5_unigram_create(m.buf, cut, "cut.model", &u);
        assert_true(s == DF_OK || s == DF_E_FORMAT);
        df_t5_unigram_free(u);
    }
    const char junk[] = "this is not a protobuf at all";
    assert_int_equal(df_t5_unigram_create(junk, sizeof junk, "junk.model", &u), DF_E_FORMAT);
    /* a character map whose rule for 'a' points outside its string table: unit 0 leads
     * to unit 0x61 ('a', a leaf whose value 0x161 is past the 2-byte table) */
    viterbi_model(&m);
    static pbw norm;
    static uint8_t charsmap[4 + 128 * 4 + 2];
    memset(charsmap, 0, sizeof charsmap);
    charsmap[1] = 2; /* trie size 512 bytes, little-endian */
    uint32_t leaf = 0x61 | 1u << 8;
    memcpy(charsmap + 4 + 0x61 * 4, &leaf, 4);
    norm.len = 0;
    pb_bytes(&norm, 2, charsmap, sizeof charsmap);
    pb_bytes(&m, 3, norm.buf, norm.len);
    u = make_model(&m);
    df_i64_vec ids = {0};
    assert_int_equal(df_t5_unigram_encode(u, "ba", 2, NULL, &ids), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "string table"));
    ids.len = 0;
    assert_int_equal(df_t5_unigram_encode(u, "bc", 2, NULL, &ids), DF_OK);
    assert_int_equal(ids.len, 2); /* ▁ + bc: no rule matched, text copied */
    df_i64_vec_free(&ids);
    df_t5_unigram_free(u);
}

static void test_unigram_charsmap_rules(void **state)
{
    (void)state;
    static pbw m, norm;
    static uint8_t charsmap[4 + MAX_UNITS * 4 + 512];
    const rule rules[] = {
        {"x", "a"}, /* the longest rule wins: xy -> b, a lone x -> a */
        {"xy", "b"},
        {"\t", " "},           /* a tab is a space, so it collapses with others */
        {"\x7f", ""},          /* deleted */
        {"\xEF\xBD\x81", "a"}, /* U+FF41 fullwidth a */
    };
    size_t len = build_charsmap(rules, 5, charsmap);
    viterbi_model(&m);
    norm.len = 0;
    pb_bytes(&norm, 1, "nmt_nfkc", 8);
    pb_bytes(&norm, 2, charsmap, len);
    pb_bytes(&m, 3, norm.buf, norm.len);
    df_t5_unigram *u = make_model(&m);
    df_byte_buf out = {0};
    assert_int_equal(df_t5_unigram_normalize(u, "xyx", 3, &out), DF_OK);
    assert_string_equal(out.data, SP "ba");
    assert_int_equal(df_t5_unigram_normalize(u,
                                             "\t a\t\t\x7f"
                                             "b \t",
                                             9, &out),
                     DF_OK);
    assert_string_equal(out.data, SP "a" SP "b");
    df_byte_buf_free(&out);
    EXPECT_SP(u, "xyx", 3, 5, 4);
    EXPECT_SP(u,
              "a\x7f"
              "b",
              9);                             /* ▁ab after the deletion */
    EXPECT_SP(u, "\xEF\xBD\x81\tb", 7, 3, 5); /* ａ\tb -> ▁a▁b */
    df_t5_unigram_free(u);

    /* written out for the fuzz corpus (tests/fuzz/corpus/t5_tokenizer) */
    char path[1200];
    snprintf(path, sizeof path, "%s/charsmap.model", tmp_dir("models"));
    write_file(path, m.buf, m.len);
}

/* A T5 folder holding the Viterbi model and no config: T5Tokenizer's defaults apply. */
static void test_t5_folder_defaults(void **state)
{
    (void)state;
    static pbw m;
    viterbi_model(&m);
    const char *dir = tmp_dir("t5-defaults");
    char path[1200];
    snprintf(path, sizeof path, "%s/spiece.model", dir);
    write_file(path, m.buf, m.len);
    df_tokenizer *t = load(dir);
    assert_int_equal(df_tokenizer_kind(t), DF_TOKENIZER_T5_UNIGRAM);
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    assert_int_equal(info.eos_id, 1);
    assert_int_equal(info.pad_id, 0);
    assert_int_equal(info.unk_id, 2);
    assert_int_equal(info.bos_id, -1);
    assert_int_equal(info.vocab_size, 13 + 100); /* 13 pieces + 100 extra ids */
    /* <extra_id_0> is the last id; extra ids eat the spaces around them */
    assert_string_equal(df_tokenizer_id_to_piece(t, 112), "<extra_id_0>");
    assert_string_equal(df_tokenizer_id_to_piece(t, 13), "<extra_id_99>");
    EXPECT(t, "ab <extra_id_0> ab", 9, 112, 9, 1);
    /* EOS is not doubled when the text ends with </s> */
    EXPECT(t, "ab</s>", 9, 1);
    EXPECT(t, "", 1);
    df_tokenizer_free(t);
}

/* ---- bad and extreme input through the public API ------------------------------------------ */

static df_tokenizer *golden_tokenizer(const char *case_name, const char *sub)
{
    char dir[1024];
    golden_dir(dir, sizeof dir, case_name, sub);
    return load(dir);
}

static void expect_invalid_utf8(const df_tokenizer *t, const char *text, size_t len,
                                const char *offset)
{
    df_tokens tk = {(int64_t *)1, (int64_t *)1, 5};
    assert_int_equal(df_tokenizer_encode(t, text, len, NULL, &tk), DF_E_ARG);
    assert_null(tk.ids);
    assert_null(tk.attention_mask);
    assert_int_equal(tk.count, 0);
    if (!strstr(df_error_message(), offset))
        fail_msg("message '%s' does not name '%s'", df_error_message(), offset);
}

static void test_invalid_utf8(void **state)
{
    (void)state;
    df_tokenizer *tk[2] = {golden_tokenizer("tok-clip-l-77", "tokenizer"),
                           golden_tokenizer("tok-t5-512", "tokenizer_2")};
    for (int i = 0; i < 2; i++) {
        expect_invalid_utf8(tk[i], "\xff", 1, "byte offset 0");
        expect_invalid_utf8(tk[i], "ab\xc3", 3, "byte offset 2");           /* truncated */
        expect_invalid_utf8(tk[i], "a\xc0\xaf", 3, "byte offset 1");        /* overlong */
        expect_invalid_utf8(tk[i], "abc\xed\xa0\x80", 6, "byte offset 3");  /* surrogate */
        expect_invalid_utf8(tk[i], "\xf4\x90\x80\x80", 4, "byte offset 0"); /* > U+10FFFF */
        df_tokens out;
        assert_int_equal(df_tokenizer_encode(tk[i], NULL, 3, NULL, &out), DF_E_ARG);
        df_tokenize_opts neg = {.max_length = -1};
        assert_int_equal(df_tokenizer_encode(tk[i], "a", 1, &neg, &out), DF_E_ARG);
        df_tokenize_opts tiny = {.max_length = 1, .truncate = true};
        assert_int_equal(df_tokenizer_encode(tk[i], "a photo", 7, &tiny, &out), DF_E_ARG);
        df_tokenizer_free(tk[i]);
    }
}

static void test_empty_and_control_prompts(void **state)
{
    (void)state;
    df_tokenizer *clip = golden_tokenizer("tok-clip-l-77", "tokenizer");
    df_tokenizer *t5 = golden_tokenizer("tok-t5-512", "tokenizer_2");
    df_tokenizer_info ci, ti;
    df_tokenizer_get_info(clip, &ci);
    df_tokenizer_get_info(t5, &ti);
    int64_t clip_empty[] = {ci.bos_id, ci.eos_id};
    int64_t t5_empty[] = {ti.eos_id};
    expect_ids(clip, NULL, 0, NULL, clip_empty, 2);
    expect_ids(clip, "\x01\x02\x7f \t\n", 6, NULL, clip_empty, 2); /* all removed */
    expect_ids(clip, "\0\0", 2, NULL, clip_empty, 2);              /* NUL characters too */
    expect_ids(t5, "", 0, NULL, t5_empty, 1);
    expect_ids(t5, "   \t  ", 6, NULL, t5_empty, 1);

    /* padded empty prompt: BOS EOS then pad, mask 1 1 0 ... */
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 77, .pad = true, .truncate = true};
    assert_int_equal(df_tokenizer_encode(clip, "", 0, &o, &tk), DF_OK);
    assert_int_equal(tk.count, 77);
    assert_int_equal(tk.ids[0], ci.bos_id);
    assert_int_equal(tk.ids[1], ci.eos_id);
    for (int i = 2; i < 77; i++) {
        assert_int_equal(tk.ids[i], ci.pad_id);
        assert_int_equal(tk.attention_mask[i], 0);
    }
    assert_int_equal(tk.attention_mask[0] + tk.attention_mask[1], 2);
    df_tokens_deinit(&tk);

    /* control characters in T5 text neither crash nor reach the ids as themselves */
    const char ctrl[] = "a\x01\x02photo\x1b[31m of\x7f a cat";
    assert_int_equal(df_tokenizer_encode(t5, ctrl, sizeof ctrl - 1, NULL, &tk), DF_OK);
    assert_true(tk.count >= 2);
    assert_int_equal(tk.ids[tk.count - 1], ti.eos_id);
    df_tokens_deinit(&tk);
    df_tokenizer_free(clip);
    df_tokenizer_free(t5);
}

static void test_long_prompt(void **state)
{
    (void)state;
    const char *words[] = {"a photo of a cat ", "東京の夜景 ", "naïve café ", "!!?? ",
                           "supercalifragilisticexpialidocious "};
    size_t cap = 60000, len = 0;
    char *text = malloc(cap + 64);
    for (int i = 0; len < cap; i++) {
        const char *w = words[i % 5];
        memcpy(text + len, w, strlen(w));
        len += strlen(w);
    }
    char *word = malloc(40001); /* one 40000-letter word: BPE on a single long symbol run */
    memset(word, 'x', 40000);
    word[40000] = 0;
    df_tokenizer *tk[2] = {golden_tokenizer("tok-clip-l-77", "tokenizer"),
                           golden_tokenizer("tok-t5-512", "tokenizer_2")};
    for (int i = 0; i < 2; i++) {
        df_tokenizer_info info;
        df_tokenizer_get_info(tk[i], &info);
        int64_t max = i == 0 ? 77 : 512;
        df_tokens full, cut;
        assert_int_equal(df_tokenizer_encode(tk[i], text, len, NULL, &full), DF_OK);
        assert_true(full.count > 10000);
        df_tokenize_opts o = {.max_length = max, .pad = true, .truncate = true};
        assert_int_equal(df_tokenizer_encode(tk[i], text, len, &o, &cut), DF_OK);
        assert_int_equal(cut.count, max);
        /* truncation keeps the first max-1 ids (BOS included) and closes with EOS */
        for (int64_t k = 0; k < max - 1; k++)
            assert_int_equal(cut.ids[k], full.ids[k]);
        assert_int_equal(cut.ids[max - 1], info.eos_id);
        for (int64_t k = 0; k < max; k++)
            assert_int_equal(cut.attention_mask[k], 1);
        df_tokens_deinit(&full);
        df_tokens_deinit(&cut);
        assert_int_equal(df_tokenizer_encode(tk[i], word, 40000, NULL, &full), DF_OK);
        assert_true(full.count > 2);
        df_tokens_deinit(&full);
        df_tokenizer_free(tk[i]);
    }
    free(text);
    free(word);
}

static void test_load_errors(void **state)
{
    (void)state;
    df_tokenizer *t = (df_tokenizer *)1;
    const char *dir = tmp_dir("empty");
    assert_int_equal(df_tokenizer_load(dir, &t), DF_E_IO);
    assert_null(t);
    assert_non_null(strstr(df_error_message(), "spiece.model"));

    dir = tmp_dir("bad-vocab");
    write_in(dir, "vocab.json", "{\"a\": 0, \"b\": \"one\"}");
    write_in(dir, "merges.txt", "#version: 0.2\n");
    assert_int_equal(df_tokenizer_load(dir, &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "vocab.json"));

    dir = tmp_dir("bad-merges");
    write_in(dir, "vocab.json", "{\"a\": 0}");
    write_in(dir, "merges.txt", "#version: 0.2\na \xff\n");
    assert_int_equal(df_tokenizer_load(dir, &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "merges.txt"));

    dir = tmp_dir("bad-config");
    write_in(dir, "vocab.json", "{\"<|startoftext|>\": 0, \"<|endoftext|>\": 1}");
    write_in(dir, "merges.txt", "#version: 0.2\n");
    write_in(dir, "tokenizer_config.json", "{\"added_tokens_decoder\": [1, 2]}");
    assert_int_equal(df_tokenizer_load(dir, &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "added_tokens_decoder"));

    dir = tmp_dir("fast-only"); /* tokenizer.json is read; its WordPiece model is not known */
    write_in(dir, "tokenizer.json", "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    assert_int_equal(df_tokenizer_load(dir, &t), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "WordPiece"));
    assert_null(t);
}

/* Each consistency rule of the tokenizer files, broken once: one message naming the file
 * and the line or key. */
static void test_consistency_rules(void **state)
{
    (void)state;
#define GOOD_VOCAB "{\"a\": 0, \"b\": 1, \"ab\": 2, \"<|startoftext|>\": 3, \"<|endoftext|>\": 4}"
#define GOOD_MERGES "#version: 0.2\na b\n"
    static const struct {
        const char *vocab, *merges, *config, *special_map, *added;
        const char *file, *word;
    } cases[] = {
        {"{}", GOOD_MERGES, NULL, NULL, NULL, "vocab.json", "the vocabulary is empty"},
        {"[\"a\"]", GOOD_MERGES, NULL, NULL, NULL, "vocab.json", "found array"},
        {"{\"a\": 0, \"b\": 0}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json",
         "tokens 'a' and 'b' both have id 0"},
        {"{\"a\": 0, \"b\": 7}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json",
         "token 'b' has id 7; the 2 tokens need ids in [0, 2)"},
        {"{\"a\": 0, \"b\": -1}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json", "id -1"},
        {"{\"a\": 0, \"b\": 1.5}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json: key 'b'",
         "expected an integer"},
        {"{\"a\": 0, \"b\": \"1\"}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json: key 'b'",
         "found string"},
        {"{\"a\": 0, \"a\": 1}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json",
         "duplicate key 'a'"},
        {"{\"a\": 0,}", "#version: 0.2\n", NULL, NULL, NULL, "vocab.json:1:", "invalid JSON"},
        {GOOD_VOCAB, "#version: 0.2\na b\na b ab\n", NULL, NULL, NULL, "merges.txt:3:",
         "more than two"},
        {GOOD_VOCAB, "#version: 0.2\nab\n", NULL, NULL, NULL, "merges.txt:2:", "has one"},
        {GOOD_VOCAB, "#version: 0.2\na b\n\nb a\n", NULL, NULL, NULL, "merges.txt:3:",
         "has none"},
        {GOOD_VOCAB, "#version: 0.2\na q\n", NULL, NULL, NULL, "merges.txt:2:",
         "token 'q' is not in vocab.json"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"eos_token\": \"<eos>\"}", NULL, NULL,
         "tokenizer_config.json", "eos_token '<eos>' is neither in the vocabulary"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"additional_special_tokens\": [\"a\", \"zz\"]}", NULL,
         NULL, "tokenizer_config.json", "additional_special_tokens[1] 'zz'"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"bos_token\": 3}", NULL, NULL,
         "tokenizer_config.json: key 'bos_token'", "found number"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"bos_token\": {\"content\": \"a\", \"lstrip\": 1}}", NULL,
         NULL, "tokenizer_config.json: key 'bos_token.lstrip'", "true or false"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"model_max_length\": \"77\"}", NULL, NULL,
         "tokenizer_config.json: key 'model_max_length'", "found string"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"model_max_length\": 0}", NULL, NULL,
         "tokenizer_config.json: key 'model_max_length'", "positive"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"legacy\": \"yes\"}", NULL, NULL,
         "tokenizer_config.json: key 'legacy'", "true or false"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"extra_ids\": 5000}", NULL, NULL, "tokenizer_config.json",
         "'extra_ids' is 5000"},
        {GOOD_VOCAB, GOOD_MERGES, "[]", NULL, NULL, "tokenizer_config.json",
         "expected a JSON object"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"a\": 1} x", NULL, NULL, "tokenizer_config.json:1:",
         "unexpected text"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"added_tokens_decoder\": {\"x\": {\"content\": \"a\"}}}",
         NULL, NULL, "tokenizer_config.json: key 'added_tokens_decoder.x'", "token id"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"added_tokens_decoder\": {\"5\": \"a\"}}", NULL, NULL,
         "tokenizer_config.json: key 'added_tokens_decoder.5'", "content"},
        {GOOD_VOCAB, GOOD_MERGES, NULL, "{\"pad_token\": \"<pad>\"", NULL,
         "special_tokens_map.json:1:", "invalid JSON"},
        {GOOD_VOCAB, GOOD_MERGES, NULL, "{\"pad_token\": \"<pad>\"}", NULL,
         "special_tokens_map.json", "pad_token '<pad>' is neither"},
        /* parsed even where added_tokens_decoder makes its names unused */
        {GOOD_VOCAB, GOOD_MERGES, "{\"added_tokens_decoder\": {}}", "{\"pad_token\": ", NULL,
         "special_tokens_map.json:1:", "invalid JSON"},
        {GOOD_VOCAB, GOOD_MERGES, "{\"added_tokens_decoder\": {}}", "[\"<pad>\"]", NULL,
         "special_tokens_map.json", "expected a JSON object, found array"},
        {GOOD_VOCAB, GOOD_MERGES, NULL, NULL, "{\"<new>\": \"5\"}",
         "added_tokens.json: key '<new>'", "found string"},
        {GOOD_VOCAB, GOOD_MERGES, NULL, NULL, "{\"<new>\": -5}", "added_tokens.json",
         "id -5"},
        {GOOD_VOCAB, GOOD_MERGES, NULL, NULL, "{\"<new>\": 5, \"<new>\": 6}",
         "added_tokens.json", "duplicate key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "rule-%zu", i);
        const char *dir = tmp_dir(name);
        write_in(dir, "vocab.json", cases[i].vocab);
        write_in(dir, "merges.txt", cases[i].merges);
        const char *files[3] = {"tokenizer_config.json", "special_tokens_map.json",
                                "added_tokens.json"};
        const char *texts[3] = {cases[i].config, cases[i].special_map, cases[i].added};
        for (int f = 0; f < 3; f++) {
            char path[1200];
            snprintf(path, sizeof path, "%s/%s", dir, files[f]);
            remove(path);
            if (texts[f])
                write_in(dir, files[f], texts[f]);
        }
        df_tokenizer *t = (df_tokenizer *)1;
        df_status s = df_tokenizer_load(dir, &t);
        const char *m = df_error_message();
        char want_file[1200];
        snprintf(want_file, sizeof want_file, "%s/%s", dir, cases[i].file);
        if (s != DF_E_FORMAT || !strstr(m, want_file) || !strstr(m, cases[i].word))
            fail_msg("case %zu: got %s '%s', expected DF_E_FORMAT with '%s' and '%s'", i,
                     df_status_name(s), m, want_file, cases[i].word);
        assert_null(t);
    }
    /* The good files load; a special token given as an added token need not be in vocab. */
    const char *dir = tmp_dir("rule-good");
    write_in(dir, "vocab.json", GOOD_VOCAB);
    write_in(dir, "merges.txt", GOOD_MERGES);
    write_in(dir, "tokenizer_config.json",
             "{\"pad_token\": \"<pad>\", \"model_max_length\": 1000000000000000019884624838656,"
             " \"added_tokens_decoder\": {\"5\": {\"content\": \"<pad>\"}}}");
    df_tokenizer *t = load(dir);
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    assert_int_equal(info.pad_id, 5);
    assert_int_equal(info.model_max_length, 0); /* "very large": no limit */
    df_tokenizer_free(t);
#undef GOOD_VOCAB
#undef GOOD_MERGES
}

/* A tokenizer.json folder parses special_tokens_map.json too, as transformers does: one that
 * is not a JSON object fails the load naming it; a good one changes nothing. */
static void test_special_tokens_map_of_a_tokenizer_json_folder(void **state)
{
    (void)state;
    char src[1024];
    golden_dir(src, sizeof src, "tok-qwen3", "tokenizer");
    const char *dir = tmp_dir("json-special-map");
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cp '%s/tokenizer.json' '%s/tokenizer_config.json' '%s/'", src,
             src, dir);
    assert_int_equal(system(cmd), 0);
    df_tokenizer *t = load(dir);
    df_tokens want;
    assert_int_equal(df_tokenizer_encode(t, "a red fox", 9, NULL, &want), DF_OK);
    df_tokenizer_free(t);
    static const char *const bad[][2] = {{"{\"pad_token\": \"<|endoftext|>\",", "invalid JSON"},
                                         {"\"<|endoftext|>\"", "expected a JSON object"},
                                         {"", "invalid JSON"}};
    char path[1200];
    snprintf(path, sizeof path, "%s/special_tokens_map.json", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_in(dir, "special_tokens_map.json", bad[i][0]);
        t = (df_tokenizer *)1;
        df_status s = df_tokenizer_load(dir, &t);
        if (s != DF_E_FORMAT || !strstr(df_error_message(), path) ||
            !strstr(df_error_message(), bad[i][1]))
            fail_msg("case %zu: got %s '%s', expected DF_E_FORMAT naming %s and '%s'", i,
                     df_status_name(s), df_error_message(), path, bad[i][1]);
        assert_null(t);
    }
    write_in(dir, "special_tokens_map.json", "{\"pad_token\": \"<|endoftext|>\"}");
    t = load(dir);
    df_tokens got;
    assert_int_equal(df_tokenizer_encode(t, "a red fox", 9, NULL, &got), DF_OK);
    assert_int_equal(got.count, want.count);
    assert_memory_equal(got.ids, want.ids, (size_t)want.count * sizeof *want.ids);
    df_tokens_deinit(&got);
    df_tokens_deinit(&want);
    df_tokenizer_free(t);
}

/* spiece.model: a piece whose score is not finite would poison every lattice sum. */
static void test_unigram_scores_must_be_finite(void **state)
{
    (void)state;
    static pbw m;
    t5_header(&m);
    add_piece(&m, "a", -1, DF_SP_NORMAL);
    add_piece(&m, "b", 0.0f / 0.0f, DF_SP_NORMAL);
    df_t5_unigram *u = (df_t5_unigram *)1;
    assert_int_equal(df_t5_unigram_create(m.buf, m.len, "x.model", &u), DF_E_FORMAT);
    assert_null(u);
    assert_non_null(strstr(df_error_message(), "x.model: piece"));
    assert_non_null(strstr(df_error_message(), "'b' has score"));
    assert_non_null(strstr(df_error_message(), "must be finite"));
}

/* Fails allocation 1, 2, 3, ... of `fn` until it succeeds; each failure must be DF_E_OOM and
 * leave nothing allocated. */
static void oom_sweep(df_status (*fn)(void *), void *arg)
{
    int64_t live = df_alloc_live();
    for (int n = 1;; n++) {
        df_alloc_fail_at(n);
        df_status s = fn(arg);
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

static df_status load_and_encode(void *arg)
{
    df_tokenizer *t;
    df_status s = df_tokenizer_load((const char *)arg, &t);
    if (s != DF_OK)
        return s;
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 20, .pad = true, .truncate = true};
    const char *text = "Caf\xC3\xA9 \xE6\x9D\xB1 photo <|endoftext|> </s>!! <extra_id_0>";
    s = df_tokenizer_encode(t, text, strlen(text), &o, &tk);
    df_tokens_deinit(&tk);
    df_tokenizer_free(t);
    return s;
}

/* The same from a GGUF's tokenizer.ggml.* (arg: the file). */
static df_status load_gguf_and_encode(void *arg)
{
    df_tokenizer *t;
    df_status s = df_tokenizer_load_gguf((const char *)arg, &t);
    if (s != DF_OK)
        return s;
    df_tokens tk;
    df_tokenize_opts o = {.max_length = 20, .pad = true, .truncate = true};
    const char *text = "Caf\xC3\xA9 \xE6\x9D\xB1 photo </s>!! <extra_id_0>";
    s = df_tokenizer_encode(t, text, strlen(text), &o, &tk);
    df_tokens_deinit(&tk);
    df_tokenizer_free(t);
    return s;
}

static void test_out_of_memory(void **state)
{
    (void)state;
    char dir[1024];
    golden_dir(dir, sizeof dir, "tok-clip-g-77", "tokenizer_2");
    oom_sweep(load_and_encode, dir);
    golden_dir(dir, sizeof dir, "tok-t5-512", "tokenizer_2");
    oom_sweep(load_and_encode, dir);
    snprintf(dir, sizeof dir, "%s/../cases/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf",
             DF_GOLDEN_DIR);
    oom_sweep(load_gguf_and_encode, dir);
}

/* ---- golden cases ---------------------------------------------------------------------------- */

typedef struct case_tensor {
    const void *data;
    int64_t numel;
} case_tensor;

static case_tensor tensor(const df_safetensors *st, const char *name, const char *dtype)
{
    df_tensor_info info;
    if (df_safetensors_find(st, name, &info) != DF_OK)
        fail_msg("%s: %s", name, df_error_message());
    assert_string_equal(info.dtype_name, dtype);
    return (case_tensor){info.data, info.numel};
}

static int64_t i64_at(case_tensor t, int64_t i)
{
    int64_t v;
    memcpy(&v, (const char *)t.data + 8 * i, 8);
    return v;
}

/* The golden case's ids from tokenizer `t`, or from the case's folder `sub` when t is NULL
 * (t is freed either way). */
static void check_golden_with(const char *case_name, const char *sub, df_tokenizer *t)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/case.json", DF_GOLDEN_DIR, case_name);
    df_json *cj;
    assert_int_equal(df_json_parse_file(path, &cj), DF_OK);
    int64_t max_length;
    assert_int_equal(df_json_get_int(df_json_get(cj, "args"), "max_length", &max_length), DF_OK);
    const df_json *prompts = df_json_get(df_json_get(cj, "args"), "prompts");

    snprintf(path, sizeof path, "%s/%s/case.safetensors", DF_GOLDEN_DIR, case_name);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(path, &st), DF_OK);
    case_tensor utf8 = tensor(st, "in.prompts_utf8", "U8");
    case_tensor offs = tensor(st, "in.prompts_offsets", "I64");
    case_tensor ids = tensor(st, "out.input_ids", "I64");
    case_tensor mask = tensor(st, "out.attention_mask", "I64");
    case_tensor nopad = tensor(st, "out.ids_nopad", "I64");
    case_tensor nopad_offs = tensor(st, "out.ids_nopad_offsets", "I64");
    int64_t n = offs.numel - 1;
    assert_int_equal(n, df_json_array_size(prompts));
    assert_int_equal(ids.numel, n * max_length);

    if (!t)
        t = golden_tokenizer(case_name, sub);
    for (int64_t p = 0; p < n; p++) {
        const char *text = (const char *)utf8.data + i64_at(offs, p);
        size_t len = (size_t)(i64_at(offs, p + 1) - i64_at(offs, p));
        const char *json_text = df_json_string(df_json_array_get(prompts, p));
        assert_int_equal(strlen(json_text), len);
        assert_memory_equal(json_text, text, len);

        df_tokens tk;
        df_tokenize_opts o = {.max_length = max_length, .pad = true, .truncate = true};
        assert_int_equal(df_tokenizer_encode(t, text, len, &o, &tk), DF_OK);
        assert_int_equal(tk.count, max_length);
        for (int64_t k = 0; k < max_length; k++) {
            if (tk.ids[k] != i64_at(ids, p * max_length + k) ||
                tk.attention_mask[k] != i64_at(mask, p * max_length + k))
                fail_msg("%s prompt %lld position %lld: id %lld mask %lld, expected %lld %lld",
                         case_name, (long long)p, (long long)k, (long long)tk.ids[k],
                         (long long)tk.attention_mask[k],
                         (long long)i64_at(ids, p * max_length + k),
                         (long long)i64_at(mask, p * max_length + k));
        }
        df_tokens_deinit(&tk);

        assert_int_equal(df_tokenizer_encode(t, text, len, NULL, &tk), DF_OK);
        int64_t b = i64_at(nopad_offs, p), e = i64_at(nopad_offs, p + 1);
        if (tk.count != e - b)
            fail_msg("%s prompt %lld: %lld ids without padding, expected %lld", case_name,
                     (long long)p, (long long)tk.count, (long long)(e - b));
        for (int64_t k = 0; k < tk.count; k++)
            if (tk.ids[k] != i64_at(nopad, b + k))
                fail_msg("%s prompt %lld unpadded id %lld: %lld, expected %lld", case_name,
                         (long long)p, (long long)k, (long long)tk.ids[k],
                         (long long)i64_at(nopad, b + k));
        df_tokens_deinit(&tk);
    }
    df_tokenizer_free(t);
    df_safetensors_free(st);
    df_json_free(cj);
}

static void check_golden(const char *case_name, const char *sub)
{
    check_golden_with(case_name, sub, NULL);
}

static void test_golden_clip_l(void **state)
{
    (void)state;
    check_golden("tok-clip-l-77", "tokenizer");
}

static void test_golden_clip_g(void **state)
{
    (void)state;
    check_golden("tok-clip-g-77", "tokenizer_2");
    /* CLIP-G pads with "!" (id 0), an added special token: "!" in text is that token */
    df_tokenizer *t = golden_tokenizer("tok-clip-g-77", "tokenizer_2");
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    assert_int_equal(info.pad_id, 0);
    assert_string_equal(df_tokenizer_id_to_piece(t, 0), "!");
    df_tokenizer_free(t);
}

static void test_golden_t5(void **state)
{
    (void)state;
    check_golden("tok-t5-512", "tokenizer_2");
    df_tokenizer *t = golden_tokenizer("tok-t5-512", "tokenizer_2");
    /* <extra_id_0> is id 4099 per the folder's config; with rstrip/lstrip */
    df_tokens a, b;
    assert_int_equal(df_tokenizer_encode(t, "cat <extra_id_0> dog", 20, NULL, &a), DF_OK);
    assert_int_equal(df_tokenizer_encode(t, "cat<extra_id_0>dog", 18, NULL, &b), DF_OK);
    assert_int_equal(a.count, b.count);
    assert_memory_equal(a.ids, b.ids, (size_t)a.count * 8);
    bool found = false;
    for (int64_t k = 0; k < a.count; k++)
        found |= a.ids[k] == 4099;
    assert_true(found);
    df_tokens_deinit(&a);
    df_tokens_deinit(&b);
    df_tokenizer_free(t);
}

/* ---- the T5 tokenizer a GGUF carries (llama.cpp's tokenizer.ggml.*) -------------------- */

#define T5_GGUF DF_GOLDEN_DIR "/../cases/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf"

static df_tokenizer *load_gguf(const char *path)
{
    df_tokenizer *t = NULL;
    if (df_tokenizer_load_gguf(path, &t) != DF_OK)
        fail_msg("loading %s: %s", path, df_error_message());
    return t;
}

/* Both give the same ids and mask for `text`, unpadded and padded to max_length. */
static void expect_same_ids(const df_tokenizer *a, const df_tokenizer *b, const char *text,
                            int64_t max_length)
{
    df_tokenize_opts opts[2] = {{0}, {.max_length = max_length, .pad = true, .truncate = true}};
    for (int k = 0; k < 2; k++) {
        df_tokens x, y;
        assert_int_equal(df_tokenizer_encode(a, text, strlen(text), &opts[k], &x), DF_OK);
        assert_int_equal(df_tokenizer_encode(b, text, strlen(text), &opts[k], &y), DF_OK);
        if (x.count != y.count || memcmp(x.ids, y.ids, (size_t)x.count * sizeof *x.ids) != 0 ||
            memcmp(x.attention_mask, y.attention_mask, (size_t)x.count * sizeof *x.ids) != 0)
            fail_msg("'%.60s' (max_length %lld): %lld ids from the folder, %lld from the GGUF, "
                     "or the ids differ", text, (long long)opts[k].max_length,
                     (long long)x.count, (long long)y.count);
        df_tokens_deinit(&x);
        df_tokens_deinit(&y);
    }
}

/* The case's GGUF holds the golden pipeline's tokenizer_2 as llama.cpp's converter writes it:
 * the tokenizer built from it gives the golden T5Tokenizer ids, and the folder's ids on the
 * golden prompts and on special tokens, extra ids, spacing and normalisation. */
static void test_t5_gguf_matches_folder(void **state)
{
    (void)state;
    check_golden_with("tok-t5-512", "tokenizer_2", load_gguf(T5_GGUF));

    char dir[1024];
    golden_dir(dir, sizeof dir, "tok-t5-512", "tokenizer_2");
    df_tokenizer *folder = load(dir), *file = load_gguf(T5_GGUF);
    df_tokenizer_info fi, gi;
    df_tokenizer_get_info(folder, &fi);
    df_tokenizer_get_info(file, &gi);
    assert_int_equal(gi.type, DF_TOKENIZER_T5_UNIGRAM);
    assert_int_equal(gi.eos_id, fi.eos_id);
    assert_int_equal(gi.pad_id, fi.pad_id);
    assert_int_equal(gi.unk_id, fi.unk_id);
    assert_int_equal(gi.bos_id, -1);
    assert_int_equal(gi.model_max_length, fi.model_max_length);
    assert_true(gi.vocab_size >= fi.vocab_size); /* the embedding's rows, [PADn] included */
    for (int64_t id = 0; id < fi.vocab_size; id++) {
        const char *a = df_tokenizer_id_to_piece(folder, id), *b = df_tokenizer_id_to_piece(file, id);
        if (!a || !b || strcmp(a, b) != 0)
            fail_msg("id %lld: '%s' in the folder, '%s' in the GGUF", (long long)id,
                     a ? a : "(none)", b ? b : "(none)");
    }
    static const char *const prompts[] = {
        "", "a photo of a cat", "cat <extra_id_0> dog", "cat<extra_id_0>dog<extra_id_99>",
        "<pad></s><unk> x </s>", "a </s>", "  leading and   inner\tspaces  ",
        "Ｆｕｌｌｗｉｄｔｈ ①②③ ﬁ ™ ½", "東京の夜景 and a 🐱 emoji", "<extra_id_100> [PAD1] <0x41>",
        "Café crème brûlée, naïve façade — Ünïcödé", "\xe2\x80\x8bzero\xc2\xa0width"};
    for (size_t i = 0; i < sizeof prompts / sizeof *prompts; i++) {
        expect_same_ids(folder, file, prompts[i], 16);
        expect_same_ids(folder, file, prompts[i], 512);
    }
    df_tokenizer_free(folder);
    df_tokenizer_free(file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_byte_mapping),
        cmocka_unit_test(test_bpe_merge_rank_order),
        cmocka_unit_test(test_bpe_merges_every_occurrence_first),
        cmocka_unit_test(test_bpe_specials_and_contractions),
        cmocka_unit_test(test_clip_cleanup_rules),
        cmocka_unit_test(test_protobuf_reader),
        cmocka_unit_test(test_unigram_viterbi),
        cmocka_unit_test(test_unigram_whitespace_options),
        cmocka_unit_test(test_unigram_byte_fallback),
        cmocka_unit_test(test_unigram_charsmap_rules),
        cmocka_unit_test(test_unigram_rejects_broken_models),
        cmocka_unit_test(test_t5_folder_defaults),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_empty_and_control_prompts),
        cmocka_unit_test(test_long_prompt),
        cmocka_unit_test(test_load_errors), cmocka_unit_test(test_consistency_rules),
        cmocka_unit_test(test_unigram_scores_must_be_finite),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_golden_clip_l),
        cmocka_unit_test(test_golden_clip_g),
        cmocka_unit_test(test_golden_t5),
        cmocka_unit_test(test_t5_gguf_matches_folder),
        cmocka_unit_test(test_special_tokens_map_of_a_tokenizer_json_folder),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
