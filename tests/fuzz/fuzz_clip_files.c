/*
 * Fuzz target: the CLIP tokenizer's files, vocab.json and merges.txt (text/clip_bpe.c).
 *
 * The input is vocab.json, a NUL byte, then merges.txt (no NUL: all of it is vocab.json and
 * merges.txt is empty). When the pair loads, the consistency rules held (ids unique and in
 * [0, count), every merge two known tokens), so a few fixed prompts must encode to ids below
 * the vocabulary's id limit, every id naming a token, or fail only for a token without an
 * unk id; never a read outside the files' bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/clip_bpe.h"
#include "text/text_util.h"

static void encode_all(const df_clip_bpe *m)
{
    static const char *const prompts[] = {"a photo of a cat", "abc aaa z's", "q", "",
                                          "th the then an in on of at st re",
                                          "\xc3\xa9t\xc3\xa9 \xe6\x9d\xb1 !!"};
    int64_t limit = df_clip_bpe_id_limit(m);
    if (limit != df_clip_bpe_vocab_count(m))
        abort(); /* ids are 0 .. count - 1 */
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++) {
        df_i64_vec ids = {0};
        df_status s = df_clip_bpe_encode(m, prompts[i], strlen(prompts[i]), NULL, 0, &ids);
        if (s != DF_OK && s != DF_E_OOM)
            abort(); /* with an unk id every token has an id */
        for (size_t k = 0; s == DF_OK && k < ids.len; k++)
            if (ids.data[k] < 0 || ids.data[k] >= limit || !df_clip_bpe_id_to_token(m, ids.data[k]))
                abort();
        df_i64_vec_free(&ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    const char *nul = memchr(text, '\0', size);
    size_t vocab_len = nul ? (size_t)(nul - text) : size;
    const char *merges = nul ? nul + 1 : text + size;
    size_t merges_len = nul ? size - vocab_len - 1 : 0;
    df_clip_bpe *m;
    if (df_clip_bpe_create(text, vocab_len, merges, merges_len, "fuzz", &m) == DF_OK) {
        encode_all(m);
        df_clip_bpe_free(m);
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
