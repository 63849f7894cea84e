/*
 * Fuzz target: Mistral's tekken.json (the bytes ComfyUI stores as tekken_model), then a
 * prompt.
 *
 * An input is "TEKKEN_JSON \0 PROMPT", or TEKKEN_JSON alone (prompt "a red fox"). The file
 * must load with df_tekken_create or fail with DF_E_FORMAT / DF_E_UNSUPPORTED and leave
 * nothing behind. When it loads, the prompt is encoded padded and truncated to 16 as FLUX.2
 * pads (on the left): every id is below the vocabulary size, the mask is 0 or 1 and its 1s
 * are one run ending the row. Invalid UTF-8 must fail with DF_E_ARG.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/tokenizer.h>

#include "text/tekken.h"

static void check_encode(const df_tok_json *t, const char *text, size_t len)
{
    df_tok_json_info info;
    df_tok_json_get_info(t, &info);
    df_tokenize_opts o = {.max_length = 16, .pad = true, .truncate = true};
    df_tokens r;
    df_status s = df_tok_json_encode(t, text, len, &o, false, &r);
    if (s == DF_E_ARG)
        return; /* invalid UTF-8, or no pad token in the file */
    if (s != DF_OK || r.count != 16)
        abort();
    bool real = false;
    for (int64_t k = 0; k < r.count; k++) {
        if (r.ids[k] < 0 || r.ids[k] >= info.vocab_size || (r.attention_mask[k] & ~1))
            abort();
        if (real && !r.attention_mask[k])
            abort(); /* left padding: once real, real to the end */
        real = r.attention_mask[k] != 0;
    }
    df_tokens_deinit(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t json_len = nul ? (size_t)(nul - data) : size;
    const char *text = nul ? (const char *)nul + 1 : "a red fox";
    size_t len = nul ? size - json_len - 1 : strlen(text);
    df_tok_json *t = (df_tok_json *)1;
    df_status s = df_tekken_create((const char *)data, json_len, "fuzz", &t);
    if (s == DF_OK) {
        check_encode(t, text, len);
        df_tok_json_free(t);
    } else if ((s != DF_E_FORMAT && s != DF_E_UNSUPPORTED) || t) {
        abort();
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
