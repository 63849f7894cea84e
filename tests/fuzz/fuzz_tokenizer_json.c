/*
 * Fuzz target: tokenizer.json files and prompts.
 *
 * An input is "TOKENIZER_JSON \0 PROMPT" or "TOKENIZER_JSON \0 CONFIG_JSON \0 PROMPT" (the
 * second when the part after the first NUL starts with '{'), or a PROMPT alone when it holds
 * no NUL byte. The files are loaded with df_tok_json_create; they must load or
 * fail with DF_E_FORMAT / DF_E_UNSUPPORTED and leave nothing behind. When it loads, the
 * prompt is encoded with and without padding and truncation (max_length 16) and the results
 * are checked: every id is a token, the unpadded ids are the padded row's real part when they
 * fit, the mask is 1 exactly there. A PROMPT alone goes through a golden FLUX.2 tokenizer
 * instead, the lowest bit of its first byte choosing which (tok-mistral-tekken or tok-qwen3,
 * found through $DF_GOLDEN_DIR, else DF_GOLDEN_DIR, else tests/golden), formatted as its
 * pipeline does: 512 ids, one run of real ids on that tokenizer's padding side. (The golden files' plain calls are checked by
 * diffuse-check; here each input does one kind of work, which keeps the target fast.)
 * Invalid UTF-8 must fail with DF_E_ARG and a zeroed result.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/tokenizer.h>

#include "text/tokenizer_json.h"

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

static df_tokenizer *load_golden(const char *case_dir)
{
    char root[2048], dir[4096];
    df_tokenizer *t = NULL;
    if (golden_root(root, sizeof root)) {
        snprintf(dir, sizeof dir, "%s/%s", root, case_dir);
        if (df_tokenizer_load(dir, &t) == DF_OK)
            return t;
    }
    fprintf(stderr, "fuzz_tokenizer_json: %s not found; prompts run only through the fuzzed "
                    "files\n", case_dir);
    return NULL;
}

static bool failed_cleanly(df_status s, const df_tokens *t)
{
    return s == DF_E_ARG && strstr(df_error_message(), "invalid UTF-8") && !t->ids &&
           !t->attention_mask && !t->count;
}

/* Real part of a padded row: where the mask is 1, which must be one run. */
static void check_row(const df_tokens *t, int64_t vocab, int64_t *begin, int64_t *n)
{
    *begin = -1;
    *n = 0;
    for (int64_t k = 0; k < t->count; k++) {
        if (t->ids[k] < 0 || t->ids[k] >= vocab || (t->attention_mask[k] & ~1))
            abort();
        if (t->attention_mask[k]) {
            if (*begin < 0)
                *begin = k;
            else if (t->attention_mask[k - 1] == 0)
                abort(); /* two runs of real ids */
            (*n)++;
        }
    }
}

/* For a fuzzed file the unpadded ids, then the padded, truncated ones; for a golden tokenizer
 * the pipeline's formatting of the text. */
static void check_encode(const df_tok_json *tj, const df_tokenizer *tok, df_prompt_format format,
                         const char *text, size_t len)
{
    int64_t vocab, pad;
    bool left = false;
    if (tj) {
        df_tok_json_info info;
        df_tok_json_get_info(tj, &info);
        vocab = info.vocab_size;
        pad = info.pad_id;
    } else {
        df_tokenizer_info info;
        df_tokenizer_get_info(tok, &info);
        vocab = info.vocab_size;
        pad = info.pad_id;
        left = info.padding_left; /* the golden tokenizer's own side */
    }
    df_tokens a, b;
    df_status s;
    int64_t begin, n;
    if (tok) {
        df_tokens p;
        s = df_tokenizer_encode_prompt(tok, format, text, len, NULL, NULL, &p);
        if (s != DF_OK) {
            if (!failed_cleanly(s, &p))
                abort();
            return;
        }
        if (p.count != 512)
            abort();
        check_row(&p, vocab, &begin, &n);
        if (n == 0 || (left ? begin + n != 512 : begin != 0))
            abort();
        df_tokens_deinit(&p);
        return;
    }
    s = df_tok_json_encode(tj, text, len, NULL, true, &a);
    if (s != DF_OK) {
        if (!failed_cleanly(s, &a))
            abort();
        return;
    }
    check_row(&a, vocab, &begin, &n);
    if (n != a.count)
        abort();
    df_tokenize_opts o = {.max_length = 16, .pad = true, .truncate = true};
    s = df_tok_json_encode(tj, text, len, &o, true, &b);
    if (s == DF_E_ARG && (pad < 0 || strstr(df_error_message(), "special"))) {
        df_tokens_deinit(&a);
        return; /* no pad token, or too many special tokens for 16 */
    }
    if (s != DF_OK || b.count != 16)
        abort();
    check_row(&b, vocab, &begin, &n);
    if (a.count <= 16 && (n != a.count || memcmp(b.ids + begin, a.ids, (size_t)n * 8) != 0))
        abort();
    if (a.count > 16 && n != 16)
        abort();
    df_tokens_deinit(&a);
    df_tokens_deinit(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static df_tokenizer *mistral, *qwen;
    static bool loaded;
    if (!loaded) {
        mistral = load_golden("tok-mistral-tekken/tokenizer");
        qwen = load_golden("tok-qwen3/tokenizer");
        loaded = true;
    }
    const char *text = (const char *)data;
    size_t len = size;
    const uint8_t *nul = memchr(data, 0, size);
    if (nul) {
        size_t json_len = (size_t)(nul - data);
        text = (const char *)nul + 1;
        len = size - json_len - 1;
        const char *cfg = NULL;
        size_t cfg_len = 0;
        const char *second = len > 0 && text[0] == '{' ? memchr(text, 0, len) : NULL;
        if (second) { /* JSON \0 CONFIG \0 PROMPT */
            cfg = text;
            cfg_len = (size_t)(second - text);
            len -= cfg_len + 1;
            text = second + 1;
        }
        df_tok_json *tj = (df_tok_json *)1;
        df_status s = df_tok_json_create((const char *)data, json_len, cfg, cfg_len, "fuzz", &tj);
        if (s == DF_OK) {
            check_encode(tj, NULL, 0, text, len);
            df_tok_json_free(tj);
        } else if ((s != DF_E_FORMAT && s != DF_E_UNSUPPORTED) || tj) {
            abort();
        }
        return 0;
    }
    bool use_qwen = size > 0 && (data[0] & 1); /* one golden per input, chosen by a bit */
    if (use_qwen ? qwen : mistral)
        check_encode(NULL, use_qwen ? qwen : mistral,
                     use_qwen ? DF_PROMPT_FLUX2_QWEN3 : DF_PROMPT_FLUX2_MISTRAL, text, len);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
