/*
 * Fuzz target: the T5 SentencePiece tokenizer, two ways, chosen by the first byte.
 *
 *  - even: the rest is a prompt for the golden tok-t5-512 tokenizer. It must encode, or
 *    fail with DF_E_ARG for invalid UTF-8 and a zeroed result; an encoding ends with EOS,
 *    every id is in the vocabulary, and the padded, truncated form (max_length 64) agrees
 *    with the unpadded one up to the cut.
 *  - odd: the rest is a spiece.model file for the protobuf reader and the model builder
 *    (text/t5_unigram.c). When it loads, a few fixed prompts are normalised and encoded
 *    through it: that must give ids within the model or DF_E_FORMAT (a character map that
 *    points outside itself), never a read outside the file's bytes.
 *
 * The golden folder is found as in fuzz_clip_tokenizer.c; without it, prompt inputs are
 * skipped (model inputs still run).
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/tokenizer.h>

#include "core/alloc.h"
#include "text/t5_unigram.h"

static const char *golden_root(char *buf, size_t cap)
{
    const char *env = getenv("DF_GOLDEN_DIR");
    if (env) {
        snprintf(buf, cap, "%s", env);
        return buf;
    }
#ifdef DF_GOLDEN_DIR
    snprintf(buf, cap, "%s", DF_GOLDEN_DIR);
    return buf;
#else
    snprintf(buf, cap, "%s", __FILE__); /* <repo>/tests/fuzz/x.c -> <repo>/tests/golden */
    char *cut = strstr(buf, "/tests/fuzz/");
    if (!cut)
        return NULL;
    snprintf(cut, cap - (size_t)(cut - buf), "/tests/golden");
    return buf;
#endif
}

static void check_prompt(const df_tokenizer *t, const uint8_t *data, size_t size)
{
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    df_tokens a, b;
    df_status s = df_tokenizer_encode(t, (const char *)data, size, NULL, &a);
    if (s != DF_OK) {
        if (s != DF_E_ARG || !strstr(df_error_message(), "invalid UTF-8") || a.ids || a.count)
            abort();
        return;
    }
    if (a.count < 1 || a.ids[a.count - 1] != info.eos_id)
        abort();
    for (int64_t k = 0; k < a.count; k++)
        if (a.ids[k] < 0 || a.ids[k] >= info.vocab_size)
            abort();
    df_tokenize_opts o = {.max_length = 64, .pad = true, .truncate = true};
    if (df_tokenizer_encode(t, (const char *)data, size, &o, &b) != DF_OK || b.count != 64)
        abort();
    int64_t real = 0;
    while (real < 64 && b.attention_mask[real] == 1)
        real++;
    if (real == 0 || b.ids[real - 1] != info.eos_id || (a.count <= 64 && real != a.count))
        abort();
    for (int64_t k = 0; k < 64; k++) {
        if (k < real - 1 && b.ids[k] != a.ids[k])
            abort();
        if (k >= real && (b.ids[k] != info.pad_id || b.attention_mask[k] != 0))
            abort();
    }
    df_tokens_deinit(&a);
    df_tokens_deinit(&b);
}

static void check_model(const uint8_t *data, size_t size)
{
    static const char *const prompts[] = {"a photo of a cat",
                                          "  Extra   spaces\tand\ttabs\n",
                                          "Caf\xC3\xA9 \xEF\xBC\xA1\xE2\x84\xA2",
                                          "\xE6\x9D\xB1\xE4\xBA\xAC \xF0\x9F\x90\xB1 <0x41>",
                                          "\x01\x7f\xC2\x85 x",
                                          ""};
    df_t5_unigram *m;
    if (df_t5_unigram_create(data, size, "fuzz.model", &m) != DF_OK)
        return;
    int32_t n = df_t5_unigram_piece_count(m);
    if (n < 1 || df_t5_unigram_unk_id(m) < 0 || df_t5_unigram_unk_id(m) >= n)
        abort();
    df_i64_vec ids = {0};
    df_byte_buf norm = {0};
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        size_t len = strlen(prompts[p]);
        df_status s = df_t5_unigram_normalize(m, prompts[p], len, &norm);
        if (s != DF_OK && s != DF_E_FORMAT)
            abort();
        ids.len = 0;
        s = df_t5_unigram_encode(m, prompts[p], len, NULL, &ids);
        if (s != DF_OK && s != DF_E_FORMAT)
            abort();
        for (size_t k = 0; s == DF_OK && k < ids.len; k++)
            if (ids.data[k] < 0 || ids.data[k] >= n || !df_t5_unigram_piece(m, ids.data[k]))
                abort();
    }
    df_i64_vec_free(&ids);
    df_byte_buf_free(&norm);
    df_t5_unigram_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static df_tokenizer *t5;
    static bool tried;
    if (!tried) {
        tried = true;
        char root[2048], dir[4096];
        if (golden_root(root, sizeof root)) {
            snprintf(dir, sizeof dir, "%s/tok-t5-512/tokenizer_2", root);
            if (df_tokenizer_load(dir, &t5) != DF_OK)
                t5 = NULL;
        }
        if (!t5)
            fprintf(stderr, "fuzz_t5_tokenizer: golden folder not found; prompts are skipped\n");
    }
    if (size == 0)
        return 0;
    if (data[0] & 1)
        check_model(data + 1, size - 1);
    else if (t5)
        check_prompt(t5, data + 1, size - 1);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
