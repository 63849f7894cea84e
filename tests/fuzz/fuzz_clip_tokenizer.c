/*
 * Fuzz target: prompt bytes through the CLIP tokenizers (CLIP-L and SD3's CLIP-G folders of
 * the golden tok-clip-* cases).
 *
 * Every input is a prompt. It must encode, or fail with DF_E_ARG for invalid UTF-8 and a
 * zeroed result; an encoding starts with BOS and ends with EOS, every id is in the
 * vocabulary, and the padded, truncated form (max_length 77) is the unpadded one cut to 76
 * ids plus EOS, then padding with mask 0. The golden folders are found through
 * $DF_GOLDEN_DIR, else DF_GOLDEN_DIR, else tests/golden of the repository; when
 * they are missing a minimal vocabulary written to a temporary folder stands in.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <diffuse/tokenizer.h>

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

static df_tokenizer *load_or_stand_in(const char *case_dir)
{
    char root[2048], dir[4096];
    df_tokenizer *t = NULL;
    if (golden_root(root, sizeof root)) {
        snprintf(dir, sizeof dir, "%s/%s", root, case_dir);
        if (df_tokenizer_load(dir, &t) == DF_OK)
            return t;
    }
    char tmp[] = "/tmp/fuzz_clip_XXXXXX";
    if (!mkdtemp(tmp))
        abort();
    const char *files[2][2] = {
        {"vocab.json", "{\"<|startoftext|>\": 0, \"<|endoftext|>\": 1, \"a</w>\": 2, \"a\": 3}"},
        {"merges.txt", "#version: 0.2\n"}};
    for (int i = 0; i < 2; i++) {
        snprintf(dir, sizeof dir, "%s/%s", tmp, files[i][0]);
        FILE *f = fopen(dir, "wb");
        if (!f)
            abort();
        fputs(files[i][1], f);
        fclose(f);
    }
    if (df_tokenizer_load(tmp, &t) != DF_OK)
        abort();
    fprintf(stderr, "fuzz_clip_tokenizer: golden folders not found; using a stand-in\n");
    return t;
}

static void check(const df_tokenizer *t, const uint8_t *data, size_t size)
{
    df_tokenizer_info info;
    df_tokenizer_get_info(t, &info);
    df_tokens a, b;
    df_status s = df_tokenizer_encode(t, (const char *)data, size, NULL, &a);
    if (s != DF_OK) {
        if (s != DF_E_ARG || !strstr(df_error_message(), "invalid UTF-8") || a.ids ||
            a.attention_mask || a.count)
            abort();
        return;
    }
    if (a.count < 2 || a.ids[0] != info.bos_id || a.ids[a.count - 1] != info.eos_id)
        abort();
    for (int64_t k = 0; k < a.count; k++)
        if (a.ids[k] < 0 || a.ids[k] >= info.vocab_size || a.attention_mask[k] != 1)
            abort();

    df_tokenize_opts o = {.max_length = 77, .pad = true, .truncate = true};
    if (df_tokenizer_encode(t, (const char *)data, size, &o, &b) != DF_OK || b.count != 77)
        abort();
    int64_t real = a.count < 77 ? a.count : 77;
    for (int64_t k = 0; k < 77; k++) {
        if (b.attention_mask[k] != (k < real))
            abort();
        if (k < real - 1 && b.ids[k] != a.ids[k])
            abort();
        if (k >= real && b.ids[k] != info.pad_id)
            abort();
    }
    if (b.ids[real - 1] != info.eos_id)
        abort();
    df_tokens_deinit(&a);
    df_tokens_deinit(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static df_tokenizer *clip_l, *clip_g;
    if (!clip_l) {
        clip_l = load_or_stand_in("tok-clip-l-77/tokenizer");
        clip_g = load_or_stand_in("tok-clip-g-77/tokenizer_2");
    }
    check(clip_l, data, size);
    check(clip_g, data, size);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
