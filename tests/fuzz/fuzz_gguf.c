/*
 * Fuzz target: the GGUF parser and the reads that trust it.
 *
 * The input is taken as a whole file. When it opens, every tensor is looked up by index and
 * by name, every readable tensor up to 1 MB of f32 is read whole and by its last row (to
 * f32 and to bf16), and every metadata key is read through each getter, so that a header
 * the validator wrongly accepts shows up as an out-of-bounds read under AddressSanitizer.
 * A file carrying llama.cpp's tokenizer metadata also builds the T5 tokenizer and encodes a
 * prompt with it.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/gguf.h>
#include <diffuse/tokenizer.h>

static void exercise(const df_gguf *g)
{
    for (int64_t i = 0; i < df_gguf_count(g); i++) {
        df_gguf_tensor t, again;
        if (df_gguf_at(g, i, &t) != DF_OK)
            abort(); /* an index inside the count must be found */
        if (df_gguf_find(g, t.name, &again) != DF_OK || again.offset != t.offset)
            abort();
        if (!t.readable || t.numel > (1 << 18))
            continue;
        size_t bytes = (size_t)t.numel * 4;
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf)
            continue;
        if (df_gguf_read_rows(g, t.name, 0, -1, DF_DTYPE_F32, buf, bytes) != DF_OK)
            abort(); /* a readable tensor that opened must read */
        if (t.shape[0] > 0)
            df_gguf_read_rows(g, t.name, t.shape[0] - 1, t.shape[0], DF_DTYPE_BF16, buf, bytes);
        free(buf);
    }
    for (int64_t i = 0; i < df_gguf_kv_count(g); i++) {
        df_gguf_value_type type, elem;
        uint64_t count;
        const char *key = df_gguf_kv_key(g, i, &type, &elem, &count);
        if (!key)
            abort();
        int64_t v;
        double d;
        const char *s;
        df_gguf_get_int(g, key, &v);
        df_gguf_get_float(g, key, &d);
        df_gguf_get_string(g, key, &s);
        if (type == DF_GGUF_ARRAY && count > 0) {
            df_gguf_get_array_string(g, key, count - 1, &s);
            size_t len;
            if (df_gguf_get_array_bytes(g, key, 0, &s, &len) == DF_OK && (s[len] || strlen(s) > len))
                abort(); /* the length must end at the NUL that follows the bytes */
            df_gguf_get_array_number(g, key, count - 1, &d);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_gguf *g;
    if (df_gguf_open_memory(data, size, "fuzz.gguf", &g) == DF_OK) {
        exercise(g);
        df_tokenizer *t;
        if (df_tokenizer_from_gguf(g, &t) == DF_OK) {
            static const char prompt[] = "a <extra_id_0> photo </s> of \xC3\xA9 \xEF\xBC\xA6";
            df_tokens tk;
            df_tokenize_opts o = {.max_length = 16, .pad = true, .truncate = true};
            if (df_tokenizer_encode(t, prompt, sizeof prompt - 1, NULL, &tk) == DF_OK)
                df_tokens_deinit(&tk);
            if (df_tokenizer_encode(t, prompt, sizeof prompt - 1, &o, &tk) == DF_OK)
                df_tokens_deinit(&tk);
            df_tokenizer_free(t);
        }
        df_gguf_free(g);
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
