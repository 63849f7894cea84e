/*
 * Fuzz target: spiece.model alone, through the protobuf reader and the unigram model
 * builder (text/protobuf.c, text/t5_unigram.c).
 *
 * fuzz_t5_tokenizer.c reaches the same code for half of its inputs, between prompts for the
 * golden tokenizer that cost far more per run; this target spends every run on the file.
 * When the input loads, a few fixed prompts are normalised and encoded through it: ids must
 * be pieces of the model, or the encoding fails with DF_E_FORMAT (a character map that
 * points outside itself); never a read outside the file's bytes.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "text/t5_unigram.h"
#include "text/text_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const prompts[] = {"a photo of a cat", "  Extra   spaces\tand\ttabs\n",
                                          "Caf\xC3\xA9 \xEF\xBC\xA1\xE2\x84\xA2",
                                          "\xE6\x9D\xB1 \xF0\x9F\x90\xB1 <0x41>", ""};
    df_t5_unigram *m;
    if (df_t5_unigram_create(data, size, "fuzz.model", &m) != DF_OK)
        return 0;
    int32_t n = df_t5_unigram_piece_count(m);
    if (n < 1 || df_t5_unigram_unk_id(m) < 0 || df_t5_unigram_unk_id(m) >= n)
        abort();
    df_i64_vec ids = {0};
    df_byte_buf norm = {0};
    for (size_t p = 0; p < sizeof prompts / sizeof *prompts; p++) {
        size_t len = strlen(prompts[p]);
        df_status s = df_t5_unigram_normalize(m, prompts[p], len, &norm);
        if (s != DF_OK && s != DF_E_FORMAT && s != DF_E_OOM)
            abort();
        ids.len = 0;
        s = df_t5_unigram_encode(m, prompts[p], len, NULL, &ids);
        if (s != DF_OK && s != DF_E_FORMAT && s != DF_E_OOM)
            abort();
        for (size_t k = 0; s == DF_OK && k < ids.len; k++)
            if (ids.data[k] < 0 || ids.data[k] >= n || !df_t5_unigram_piece(m, ids.data[k]))
                abort();
    }
    df_i64_vec_free(&ids);
    df_byte_buf_free(&norm);
    df_t5_unigram_free(m);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
