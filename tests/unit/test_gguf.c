/*
 * GGUF reader: hand-made files (good ones, and one hostile file per check), the file the
 * `gguf` package writes in tests/cases/gguf-dequant (its metadata of every type), and
 * dequantisation of every supported type against gguf.quants.dequantize. Then llama.cpp's
 * T5 tokenizer metadata (tokenizer.ggml.*) read by df_tokenizer_load_gguf: a hand-made
 * vocabulary, and one broken key at a time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include <diffuse/gguf.h>
#include <diffuse/safetensors.h>
#include <diffuse/tokenizer.h>

#include "core/alloc.h"
#include "core/quant_blocks.h"
#include "unit/gguf_bytes.h"

#define CASE_DIR DF_GOLDEN_DIR "/../cases/gguf-dequant"

/* Two F32 tensors: "a" [2, 3] at 0 and "b" [4] at 32; one string key. */
static void good_file(buf *f)
{
    header(f, 3, 2, 1);
    str(f, "general.name");
    u32(f, DF_GGUF_STRING);
    str(f, "tiny");
    tinfo(f, "a", 2, (uint64_t[]){3, 2}, DF_GGML_F32, 0);
    tinfo(f, "b", 1, (uint64_t[]){4}, DF_GGML_F32, 32);
    data(f, 32, 48);
}

static df_status open_buf(const buf *f, df_gguf **g)
{
    *g = (df_gguf *)1; /* must come back NULL on failure */
    return df_gguf_open_memory(f->b, f->n, "t.gguf", g);
}

/* Opens f, expects `want` and a message containing `needle` (and the file's name). */
static void expect_refused(const buf *f, df_status want, const char *needle)
{
    df_gguf *g;
    df_status s = open_buf(f, &g);
    if (s != want || !strstr(df_error_message(), needle))
        fail_msg("status %d, message '%s'; wanted %d and '%s'", s, df_error_message(), want,
                 needle);
    assert_null(g);
    assert_non_null(strstr(df_error_message(), "t.gguf"));
}

static void test_good_file_opens(void **state)
{
    (void)state;
    buf f;
    good_file(&f);
    df_gguf *g;
    assert_int_equal(open_buf(&f, &g), DF_OK);
    assert_int_equal(df_gguf_version(g), 3);
    assert_int_equal(df_gguf_alignment(g), 32);
    assert_int_equal(df_gguf_count(g), 2);
    df_gguf_tensor t;
    assert_int_equal(df_gguf_find(g, "a", &t), DF_OK);
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0], 2); /* ggml's ne = {3, 2} is [2, 3] outermost first */
    assert_int_equal(t.shape[1], 3);
    assert_int_equal(t.nbytes, 24);
    assert_string_equal(t.type_name, "F32");
    assert_true(t.readable);
    assert_int_equal(t.offset % 32, 0);
    const char *name;
    assert_int_equal(df_gguf_get_string(g, "general.name", &name), DF_OK);
    assert_string_equal(name, "tiny");
    float rows[3];
    assert_int_equal(df_gguf_read_rows(g, "a", 1, 2, DF_DTYPE_F32, rows, sizeof rows), DF_OK);
    assert_memory_equal(rows, (const uint8_t *)t.data + 12, 12);
    assert_int_equal(df_gguf_read_rows(g, "a", 1, 3, DF_DTYPE_F32, rows, sizeof rows), DF_E_ARG);
    assert_int_equal(df_gguf_find(g, "c", &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "'c'"));
    df_gguf_free(g);
}

static void test_bad_magic_and_versions(void **state)
{
    (void)state;
    buf f;
    good_file(&f);
    f.b[0] = 'X';
    expect_refused(&f, DF_E_FORMAT, "GGUF");
    good_file(&f);
    f.b[4] = 1;
    expect_refused(&f, DF_E_UNSUPPORTED, "version 1");
    good_file(&f);
    f.b[4] = 9;
    expect_refused(&f, DF_E_FORMAT, "version 9");
    good_file(&f);
    f.b[4] = 0;
    f.b[7] = 3;
    expect_refused(&f, DF_E_UNSUPPORTED, "big-endian");
}

static void test_truncated_everywhere(void **state)
{
    (void)state;
    buf f;
    good_file(&f);
    size_t full = f.n;
    /* Every cut before the data is refused with a message; none reads past the end (the
     * sanitised build checks that). */
    for (size_t n = 0; n < full; n++) {
        df_gguf *g;
        df_status s = df_gguf_open_memory(f.b, n, "t.gguf", &g);
        if (s == DF_OK)
            fail_msg("a file cut to %zu of %zu bytes opened", n, full);
        assert_null(g);
        assert_non_null(strstr(df_error_message(), "t.gguf"));
    }
}

static void test_counts_larger_than_file(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 0, UINT64_MAX / 2);
    expect_refused(&f, DF_E_FORMAT, "cannot fit");
    header(&f, 3, (uint64_t)1 << 40, 0);
    expect_refused(&f, DF_E_FORMAT, "cannot fit");
}

static void test_string_length_past_end(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 0, 1);
    u64(&f, (uint64_t)1 << 62); /* key length */
    put(&f, "abcdefghijklmnop", 16);
    expect_refused(&f, DF_E_FORMAT, "metadata key");
    header(&f, 3, 0, 1);
    str(&f, "k");
    u32(&f, DF_GGUF_STRING);
    u64(&f, 1000);
    put(&f, "abcdefghijklmnop", 16);
    expect_refused(&f, DF_E_FORMAT, "claims 1000 bytes");
}

static void test_bad_values(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 0, 1);
    str(&f, "k");
    u32(&f, 13); /* no such value type */
    u64(&f, 0);
    expect_refused(&f, DF_E_FORMAT, "unknown value type 13");
    header(&f, 3, 0, 1);
    str(&f, "k");
    u32(&f, DF_GGUF_ARRAY);
    u32(&f, DF_GGUF_UINT64);
    u64(&f, (uint64_t)1 << 61); /* x 8 bytes overflows */
    u64(&f, 0);
    expect_refused(&f, DF_E_FORMAT, "array");
    header(&f, 3, 0, 1);
    str(&f, "k");
    u32(&f, DF_GGUF_ARRAY);
    u32(&f, DF_GGUF_ARRAY);
    u64(&f, 0);
    expect_refused(&f, DF_E_UNSUPPORTED, "array of arrays");
    header(&f, 3, 0, 1);
    str(&f, "k");
    u32(&f, DF_GGUF_BOOL);
    put(&f, "\x02", 1);
    expect_refused(&f, DF_E_FORMAT, "bool");
    header(&f, 3, 0, 2);
    str(&f, "k");
    u32(&f, DF_GGUF_UINT8);
    put(&f, "\x02", 1);
    str(&f, "k");
    u32(&f, DF_GGUF_UINT8);
    put(&f, "\x03", 1);
    expect_refused(&f, DF_E_FORMAT, "'k' appears twice");
    header(&f, 3, 0, 1);
    u64(&f, 3);
    put(&f, "a\0b", 3);
    u32(&f, DF_GGUF_UINT8);
    put(&f, "\x02", 1);
    expect_refused(&f, DF_E_FORMAT, "NUL");
}

static void test_bad_alignment(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 0, 1);
    str(&f, "general.alignment");
    u32(&f, DF_GGUF_UINT32);
    u32(&f, 24);
    expect_refused(&f, DF_E_FORMAT, "power of two");
    header(&f, 3, 0, 1);
    str(&f, "general.alignment");
    u32(&f, DF_GGUF_UINT64);
    u64(&f, 64);
    expect_refused(&f, DF_E_FORMAT, "uint32");
}

static void test_bad_tensors(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 5, (uint64_t[]){1, 1, 1, 1, 1}, DF_GGML_F32, 0);
    data(&f, 32, 4);
    expect_refused(&f, DF_E_UNSUPPORTED, "5 dimensions");
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 1, (uint64_t[]){4}, 77, 0);
    data(&f, 32, 16);
    expect_refused(&f, DF_E_FORMAT, "unknown ggml type 77");
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 2, (uint64_t[]){48, 2}, DF_GGML_Q8_0, 0);
    data(&f, 32, 102);
    expect_refused(&f, DF_E_FORMAT, "not a multiple of Q8_0's block of 32");
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 2, (uint64_t[]){(uint64_t)1 << 40, (uint64_t)1 << 40}, DF_GGML_F32, 0);
    data(&f, 32, 16);
    expect_refused(&f, DF_E_FORMAT, "too large");
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 1, (uint64_t[]){4}, DF_GGML_F32, 8);
    data(&f, 32, 64);
    expect_refused(&f, DF_E_FORMAT, "not a multiple of the alignment");
    header(&f, 3, 1, 0);
    tinfo(&f, "a", 1, (uint64_t[]){64}, DF_GGML_F32, 0);
    data(&f, 32, 100);
    expect_refused(&f, DF_E_FORMAT, "truncated");
    header(&f, 3, 2, 0);
    tinfo(&f, "a", 1, (uint64_t[]){16}, DF_GGML_F32, 0);
    tinfo(&f, "b", 1, (uint64_t[]){4}, DF_GGML_F32, 32);
    data(&f, 32, 64);
    expect_refused(&f, DF_E_FORMAT, "overlap");
    header(&f, 3, 2, 0);
    tinfo(&f, "a", 1, (uint64_t[]){4}, DF_GGML_F32, 0);
    tinfo(&f, "a", 1, (uint64_t[]){4}, DF_GGML_F32, 32);
    data(&f, 32, 64);
    expect_refused(&f, DF_E_FORMAT, "'a' appears twice");
}

static void test_unsupported_type_is_listed_but_not_read(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 1, 0);
    tinfo(&f, "iq", 1, (uint64_t[]){256}, 23 /* IQ4_XS */, 0);
    data(&f, 32, 136);
    df_gguf *g;
    assert_int_equal(open_buf(&f, &g), DF_OK);
    df_gguf_tensor t;
    assert_int_equal(df_gguf_find(g, "iq", &t), DF_OK);
    assert_string_equal(t.type_name, "IQ4_XS");
    assert_false(t.readable);
    float out[256];
    assert_int_equal(df_gguf_read_rows(g, "iq", 0, -1, DF_DTYPE_F32, out, sizeof out),
                     DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "IQ4_XS"));
    df_gguf_free(g);
}

/* ---- the gguf package's own file --------------------------------------------------- */

/* A 1-D block type's rows are single values: a row range must start and end on a block,
 * or the read is refused (never a silent partial read); whole blocks read right. */
static void test_rows_of_1d_blocks(void **state)
{
    (void)state;
    buf f;
    header(&f, 3, 1, 0);
    tinfo(&f, "n", 1, (uint64_t[]){64}, DF_GGML_Q8_0, 0);
    data(&f, 32, 0);
    for (int b = 0; b < 2; b++) {
        put(&f, (uint8_t[2]){0x00, 0x3C}, 2); /* scale 1.0 */
        for (int i = 0; i < 32; i++)
            put(&f, &(int8_t){(int8_t)(b * 32 + i - 20)}, 1);
    }
    df_gguf *g;
    assert_int_equal(open_buf(&f, &g), DF_OK);
    float out[64];
    assert_int_equal(df_gguf_read_rows(g, "n", 0, 16, DF_DTYPE_F32, out, sizeof out), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "Q8_0 block"));
    assert_int_equal(df_gguf_read_rows(g, "n", 32, 48, DF_DTYPE_BF16, out, sizeof out), DF_E_ARG);
    assert_int_equal(df_gguf_read_rows(g, "n", 32, 64, DF_DTYPE_F32, out, sizeof out), DF_OK);
    for (int i = 0; i < 32; i++)
        assert_true(out[i] == (float)(32 + i - 20));
    assert_int_equal(df_gguf_read_rows(g, "n", 0, -1, DF_DTYPE_F32, out, sizeof out), DF_OK);
    for (int i = 0; i < 64; i++)
        assert_true(out[i] == (float)(i - 20));
    df_gguf_free(g);
}

static void test_metadata_of_every_type(void **state)
{
    (void)state;
    df_gguf *g;
    assert_int_equal(df_gguf_open(CASE_DIR "/model.gguf", &g), DF_OK);
    int64_t i;
    double d;
    const char *s;
    static const struct {
        const char *key;
        int64_t v;
    } ints[] = {{"test.u8", 200},        {"test.i8", -100},          {"test.u16", 60000},
                {"test.i16", -30000},    {"test.u32", 4000000000},   {"test.i32", -2000000000},
                {"test.u64", 1LL << 40}, {"test.i64", -(1LL << 40)}, {"test.bool", 1}};
    for (size_t k = 0; k < sizeof ints / sizeof ints[0]; k++) {
        assert_int_equal(df_gguf_get_int(g, ints[k].key, &i), DF_OK);
        assert_int_equal(i, ints[k].v);
    }
    assert_int_equal(df_gguf_get_float(g, "test.f32", &d), DF_OK);
    assert_true(d == 0.25);
    assert_int_equal(df_gguf_get_float(g, "test.f64", &d), DF_OK);
    assert_true(d == -1.5);
    assert_int_equal(df_gguf_get_string(g, "test.str", &s), DF_OK);
    assert_string_equal(s, "h\xc3\xa9llo");
    assert_int_equal(df_gguf_get_string(g, "general.architecture", &s), DF_OK);
    assert_string_equal(s, "flux");
    assert_int_equal(df_gguf_get_array_string(g, "test.strs", 2, &s), DF_OK);
    assert_string_equal(s, "ccc");
    assert_int_equal(df_gguf_get_array_string(g, "test.strs", 1, &s), DF_OK);
    assert_string_equal(s, "");
    assert_int_equal(df_gguf_get_array_string(g, "test.strs", 3, &s), DF_E_ARG);
    size_t len = 9;
    assert_int_equal(df_gguf_get_array_bytes(g, "test.strs", 2, &s, &len), DF_OK);
    assert_int_equal(len, 3); /* the last element: its length from the end of the strings */
    assert_memory_equal(s, "ccc", 4);
    assert_int_equal(df_gguf_get_array_bytes(g, "test.strs", 1, &s, &len), DF_OK);
    assert_int_equal(len, 0);
    assert_int_equal(df_gguf_get_array_bytes(g, "test.strs", 3, &s, &len), DF_E_ARG);
    assert_int_equal(df_gguf_get_array_bytes(g, "test.ints", 0, &s, &len), DF_E_FORMAT);
    assert_int_equal(df_gguf_get_array_number(g, "test.ints", 1, &d), DF_OK);
    assert_true(d == -2);
    assert_int_equal(df_gguf_get_int(g, "test.str", &i), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "test.str"));
    assert_int_equal(df_gguf_get_int(g, "nope", &i), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "'nope'"));
    df_gguf_free(g);
}

/* Every tensor of the case dequantised (whole, by single rows, and to bf16) against the
 * gguf package's result. */
static void test_dequant_matches_gguf_package(void **state)
{
    (void)state;
    df_gguf *g;
    df_safetensors *ref;
    assert_int_equal(df_gguf_open(CASE_DIR "/model.gguf", &g), DF_OK);
    assert_int_equal(df_safetensors_open(CASE_DIR "/case.safetensors", &ref), DF_OK);
    int checked = 0;
    for (int64_t k = 0; k < df_gguf_count(g); k++) {
        df_gguf_tensor t;
        assert_int_equal(df_gguf_at(g, k, &t), DF_OK);
        char name[128];
        snprintf(name, sizeof name, "out.%s", t.name);
        df_tensor_info ri;
        assert_int_equal(df_safetensors_find(ref, name, &ri), DF_OK);
        assert_int_equal(ri.numel, t.numel);
        float *want = malloc((size_t)t.numel * 4), *got = malloc((size_t)t.numel * 4);
        uint16_t *half = malloc((size_t)t.numel * 2);
        assert_int_equal(df_safetensors_read(ref, name, DF_DTYPE_F32, want, (size_t)t.numel * 4),
                         DF_OK);
        assert_int_equal(
            df_gguf_read_rows(g, t.name, 0, -1, DF_DTYPE_F32, got, (size_t)t.numel * 4), DF_OK);
        for (int64_t i = 0; i < t.numel; i++)
            if (got[i] != want[i])
                fail_msg("%s [%lld]: %.9g, gguf package %.9g", t.name, (long long)i, got[i],
                         want[i]);
        int64_t row = t.numel / t.shape[0];
        for (int64_t r = 0; r < t.shape[0]; r++) {
            memset(got, 0, (size_t)row * 4);
            assert_int_equal(
                df_gguf_read_rows(g, t.name, r, r + 1, DF_DTYPE_F32, got, (size_t)row * 4), DF_OK);
            assert_memory_equal(got, want + r * row, (size_t)row * 4);
        }
        assert_int_equal(
            df_gguf_read_rows(g, t.name, 0, -1, DF_DTYPE_BF16, half, (size_t)t.numel * 2), DF_OK);
        for (int64_t i = 0; i < t.numel; i++)
            assert_int_equal(half[i], df_f32_to_bf16(want[i]));
        free(want);
        free(got);
        free(half);
        checked++;
    }
    assert_int_equal(checked, 14);
    df_safetensors_free(ref);
    df_gguf_free(g);
}

/* Fail allocation 1, 2, 3, ... of opening the gguf package's file until it opens: each
 * failure is DF_E_OOM and leaks nothing. */
static void test_out_of_memory(void **state)
{
    (void)state;
    int64_t live = df_alloc_live();
    for (int64_t n = 1;; n++) {
        df_gguf *g = (df_gguf *)1;
        df_alloc_fail_at(n);
        df_status s = df_gguf_open(CASE_DIR "/model.gguf", &g);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            assert_int_equal(df_gguf_count(g), 14);
            df_gguf_free(g);
            assert_true(n > 20); /* keys, strings, arrays and names all allocate */
            break;
        }
        if (s != DF_E_OOM)
            fail_msg("allocation %lld: %s '%s'", (long long)n, df_status_name(s),
                     df_error_message());
        assert_null(g);
        assert_int_equal(df_alloc_live(), live);
        assert_true(n < 5000);
    }
    assert_int_equal(df_alloc_live(), live);
}

/* ---- llama.cpp's T5 tokenizer metadata -------------------------------------------------- */

/* What tok_file breaks: one key at a time. */
typedef enum tok_break {
    TB_NONE, TB_TOKENS_NOT_STRINGS, TB_SCORES_SHORT, TB_TYPE_OUT_OF_RANGE, TB_EOS_OUT_OF_RANGE,
    TB_EOS_STRING, TB_MODEL_LLAMA, TB_PREFIX_NOT_BOOL, TB_CHARSMAP_STRINGS, TB_NO_TYPES,
    TB_DUPLICATE, TB_NO_UNKNOWN, TB_CHARSMAP_SHORT, TB_CHARSMAP_TRIE, TB_NO_EOS,
    TB_PAD_NEGATIVE, TB_TOKEN_NUL,
} tok_break;

#define TOK_N 9
static const char *const tok_pieces[TOK_N] = {"<pad>", "</s>", "<unk>", "\xe2\x96\x81\x61", "a",
                                              "b", "\xe2\x96\x81", "[PAD1]", "[PAD2]"};

static void kv_str(buf *f, const char *key, const char *v)
{
    str(f, key);
    u32(f, DF_GGUF_STRING);
    str(f, v);
}

static void kv_u32(buf *f, const char *key, uint32_t v)
{
    str(f, key);
    u32(f, DF_GGUF_UINT32);
    u32(f, v);
}

static void array_head(buf *f, const char *key, df_gguf_value_type elem, uint64_t n)
{
    str(f, key);
    u32(f, DF_GGUF_ARRAY);
    u32(f, elem);
    u64(f, n);
}

/* A GGUF with no tensors holding a 9-piece T5 vocabulary as llama.cpp writes one (no
 * charsmap: no normalisation), broken as `b` says. */
static void tok_file(buf *f, tok_break b)
{
    int nkv = 10;
    header(f, 3, 0, (uint64_t)(nkv - (b == TB_NO_TYPES) - (b == TB_NO_EOS) +
                               (b == TB_CHARSMAP_STRINGS || b == TB_CHARSMAP_SHORT ||
                                b == TB_CHARSMAP_TRIE)));
    kv_str(f, "general.architecture", "t5encoder");
    kv_u32(f, "t5encoder.context_length", 8);
    kv_str(f, "tokenizer.ggml.model", b == TB_MODEL_LLAMA ? "llama" : "t5");
    if (b == TB_TOKENS_NOT_STRINGS) {
        array_head(f, "tokenizer.ggml.tokens", DF_GGUF_INT32, TOK_N);
        for (int i = 0; i < TOK_N; i++)
            u32(f, (uint32_t)i);
    } else {
        array_head(f, "tokenizer.ggml.tokens", DF_GGUF_STRING, TOK_N);
        for (int i = 0; i < TOK_N; i++)
            if (b == TB_TOKEN_NUL && i == 5) { /* "b\0a": a NUL inside a token */
                u64(f, 3);
                put(f, "b\0a", 3);
            } else {
                str(f, b == TB_DUPLICATE && i == 5 ? "a" : tok_pieces[i]);
            }
    }
    static const float scores[TOK_N] = {0, 0, 0, -1, -2, -2, -3, -1000, -1000};
    int nscores = b == TB_SCORES_SHORT ? TOK_N - 1 : TOK_N;
    array_head(f, "tokenizer.ggml.scores", DF_GGUF_FLOAT32, (uint64_t)nscores);
    for (int i = 0; i < nscores; i++) {
        uint32_t bits;
        memcpy(&bits, &scores[i], 4);
        u32(f, bits);
    }
    if (b != TB_NO_TYPES) {
        static const int32_t types[TOK_N] = {3, 3, 2, 1, 1, 1, 1, 5, 5};
        array_head(f, "tokenizer.ggml.token_type", DF_GGUF_INT32, TOK_N);
        for (int i = 0; i < TOK_N; i++)
            u32(f, (uint32_t)(b == TB_TYPE_OUT_OF_RANGE && i == 4 ? 9
                              : b == TB_NO_UNKNOWN && i == 2   ? 1
                                                               : types[i]));
    }
    if (b == TB_PREFIX_NOT_BOOL) {
        str(f, "tokenizer.ggml.add_space_prefix");
        u32(f, DF_GGUF_UINT8);
        put(f, "\x01", 1);
    } else {
        str(f, "tokenizer.ggml.add_space_prefix");
        u32(f, DF_GGUF_BOOL);
        put(f, "\x01", 1);
    }
    if (b == TB_CHARSMAP_STRINGS) {
        array_head(f, "tokenizer.ggml.precompiled_charsmap", DF_GGUF_STRING, 1);
        str(f, "x");
    } else if (b == TB_CHARSMAP_SHORT) {
        array_head(f, "tokenizer.ggml.precompiled_charsmap", DF_GGUF_UINT8, 3);
        put(f, "\x01\x02\x03", 3);
    } else if (b == TB_CHARSMAP_TRIE) { /* announces 3 trie bytes where 2 follow */
        array_head(f, "tokenizer.ggml.precompiled_charsmap", DF_GGUF_UINT8, 6);
        put(f, "\x03\x00\x00\x00\x00\x00", 6);
    }
    if (b == TB_EOS_STRING)
        kv_str(f, "tokenizer.ggml.eos_token_id", "</s>");
    else if (b != TB_NO_EOS)
        kv_u32(f, "tokenizer.ggml.eos_token_id", b == TB_EOS_OUT_OF_RANGE ? 99 : 1);
    str(f, "tokenizer.ggml.padding_token_id");
    u32(f, DF_GGUF_INT32);
    u32(f, b == TB_PAD_NEGATIVE ? 0xffffffffu : 0);
    kv_u32(f, "tokenizer.ggml.unknown_token_id", 2);
    data(f, 32, 0);
}

static const char *tok_path(void)
{
    static char path[1024];
    mkdir(DF_TEST_TMP, 0755);
    snprintf(path, sizeof path, "%s/gguf-tokenizer.gguf", DF_TEST_TMP);
    return path;
}

static df_status load_tok_file(tok_break b, df_tokenizer **t)
{
    buf f;
    tok_file(&f, b);
    FILE *fp = fopen(tok_path(), "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(f.b, 1, f.n, fp), f.n);
    assert_int_equal(fclose(fp), 0);
    *t = (df_tokenizer *)1; /* must come back NULL on failure */
    return df_tokenizer_load_gguf(tok_path(), t);
}

static void test_t5_tokenizer_from_metadata(void **state)
{
    (void)state;
    df_tokenizer *t;
    if (load_tok_file(TB_NONE, &t) != DF_OK)
        fail_msg("%s", df_error_message());
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    assert_int_equal(info.type, DF_TOKENIZER_T5_UNIGRAM);
    assert_int_equal(info.vocab_size, TOK_N);
    assert_int_equal(info.eos_id, 1);
    assert_int_equal(info.pad_id, 0);
    assert_int_equal(info.unk_id, 2);
    assert_int_equal(info.bos_id, -1);
    assert_int_equal(info.model_max_length, 8); /* t5encoder.context_length */
    /* "a b" -> "\u2581a\u2581b": "\u2581a" (-1) beats "\u2581" + "a" (-5); no "\u2581b".
     * The two [PADn] rows are the extra ids, the last one <extra_id_0>; </s> is special. */
    static const char text[] = "a b<extra_id_0> <extra_id_1></s>";
    static const int64_t want[] = {3, 6, 5, 8, 7, 1, 0, 0};
    df_tokens tk;
    df_tokenize_opts o = {.pad = true, .truncate = true}; /* to model_max_length */
    assert_int_equal(df_tokenizer_encode(t, text, strlen(text), &o, &tk), DF_OK);
    assert_int_equal(tk.count, 8);
    assert_memory_equal(tk.ids, want, sizeof want);
    df_tokens_deinit(&tk);
    df_tokenizer_free(t);
}

static void test_t5_tokenizer_metadata_refused(void **state)
{
    (void)state;
    static const struct {
        tok_break b;
        df_status want;
        const char *needle;
    } cases[] = {
        {TB_TOKENS_NOT_STRINGS, DF_E_FORMAT,
         "key 'tokenizer.ggml.tokens': expected an array of strings, found an array of int32"},
        {TB_SCORES_SHORT, DF_E_FORMAT, "key 'tokenizer.ggml.scores': 8 values for 9 tokens"},
        {TB_TYPE_OUT_OF_RANGE, DF_E_FORMAT,
         "key 'tokenizer.ggml.token_type': token 4 has type 9; expected 1 (normal) to 6"},
        {TB_EOS_OUT_OF_RANGE, DF_E_FORMAT,
         "key 'tokenizer.ggml.eos_token_id': token id 99 is outside the 9 tokens"},
        {TB_EOS_STRING, DF_E_FORMAT,
         "key 'tokenizer.ggml.eos_token_id': expected a token id (an integer), found string"},
        {TB_NO_EOS, DF_E_FORMAT, "key 'tokenizer.ggml.eos_token_id' is missing"},
        {TB_PAD_NEGATIVE, DF_E_FORMAT,
         "key 'tokenizer.ggml.padding_token_id': token id -1 is outside the 9 tokens"},
        {TB_MODEL_LLAMA, DF_E_UNSUPPORTED,
         "key 'tokenizer.ggml.model' is 'llama'; diffuse reads only llama.cpp's T5 tokenizer"},
        {TB_PREFIX_NOT_BOOL, DF_E_FORMAT,
         "key 'tokenizer.ggml.add_space_prefix': expected a bool, found uint8"},
        {TB_CHARSMAP_STRINGS, DF_E_FORMAT,
         "key 'tokenizer.ggml.precompiled_charsmap': expected an array of uint8"},
        {TB_CHARSMAP_SHORT, DF_E_FORMAT,
         "key 'tokenizer.ggml.precompiled_charsmap': 3 bytes do not hold the trie"},
        {TB_CHARSMAP_TRIE, DF_E_FORMAT,
         "precompiled_charsmap': 6 bytes do not hold the trie they announce (3 bytes after"},
        {TB_NO_TYPES, DF_E_FORMAT, "key 'tokenizer.ggml.token_type' is missing"},
        {TB_TOKEN_NUL, DF_E_FORMAT, "key 'tokenizer.ggml.tokens': token 5 holds a NUL byte"},
        {TB_DUPLICATE, DF_E_FORMAT, "key 'tokenizer.ggml.tokens': piece 5 'a' is already defined"},
        {TB_NO_UNKNOWN, DF_E_FORMAT,
         "key 'tokenizer.ggml.tokens': the model defines no unknown piece"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        df_tokenizer *t;
        df_status s = load_tok_file(cases[i].b, &t);
        if (s != cases[i].want || !strstr(df_error_message(), cases[i].needle) ||
            !strstr(df_error_message(), tok_path()))
            fail_msg("case %zu: status %d, message '%s'; wanted %d and '%s' naming the file", i,
                     s, df_error_message(), cases[i].want, cases[i].needle);
        assert_null(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_file_opens),
        cmocka_unit_test(test_bad_magic_and_versions),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_counts_larger_than_file),
        cmocka_unit_test(test_string_length_past_end),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_bad_alignment),
        cmocka_unit_test(test_bad_tensors),
        cmocka_unit_test(test_unsupported_type_is_listed_but_not_read),
        cmocka_unit_test(test_rows_of_1d_blocks),
        cmocka_unit_test(test_metadata_of_every_type),
        cmocka_unit_test(test_dequant_matches_gguf_package),
        cmocka_unit_test(test_out_of_memory),
        cmocka_unit_test(test_t5_tokenizer_from_metadata),
        cmocka_unit_test(test_t5_tokenizer_metadata_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
