/*
 * The FLUX.2 pipelines' prompt formatting, as fixed renderings of the two chat templates
 * they use (there is no Jinja engine: each template is reduced to the one conversation shape
 * its pipeline builds, and that shape is written out here).
 *
 * Flux2Pipeline (diffusers pipelines/flux2/pipeline_flux2.py, format_text_input and
 * _get_mistral_3_small_prompt_embeds): every "[IMG]" is removed from the prompt (Pixtral's
 * processor would otherwise count image tokens), then the messages [system: SYSTEM_MESSAGE,
 * user: prompt] go through the Mistral-Small-3 chat template with add_generation_prompt=False:
 *     "<s>[SYSTEM_PROMPT]" system "[/SYSTEM_PROMPT][INST]" prompt "[/INST]"
 * Because the rendered text starts with the bos token, the processor tokenizes it with
 * add_special_tokens=False: the one <s> is the template's. Then padding="max_length",
 * truncation=True, max_length=max_sequence_length (512), on the tokenizer's padding side
 * (LlamaTokenizerFast: left).
 *
 * Flux2KleinPipeline (pipeline_flux2_klein.py, _get_qwen3_prompt_embeds): Qwen3's chat
 * template over [user: prompt] with add_generation_prompt=True, enable_thinking=False. With
 * one user message and no tools the template reduces to
 *     "<|im_start|>user\n" prompt "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
 * (no system block, no bos), tokenized with add_special_tokens=True (Qwen3's ByteLevel
 * post-processor adds nothing) and padded on the right to 512.
 *
 * Prompt text is inserted verbatim: special-token spellings inside a prompt become those
 * tokens, as they do in the pipelines.
 */
#include <diffuse/tokenizer.h>

#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "text/text_util.h"
#include "text/tokenizer_json.h"

/* diffusers pipelines/flux2/system_messages.py SYSTEM_MESSAGE (one newline after "object"). */
static const char flux2_system_message[] =
    "You are an AI that reasons about image descriptions. You give structured responses "
    "focusing on object relationships, object\nattribution and actions without speculation.";

/* The pipelines' default max_sequence_length. */
enum { FLUX2_MAX_SEQUENCE_LENGTH = 512 };

const char *df_prompt_flux2_system_message(void)
{
    return flux2_system_message;
}

static bool put(df_byte_buf *b, const char *s)
{
    return df_byte_buf_append(b, s, strlen(s));
}

/* Appends p[0..len) without any "[IMG]". */
static bool put_without_img(df_byte_buf *b, const char *p, size_t len)
{
    static const char img[] = "[IMG]";
    size_t pos = 0;
    while (pos < len) {
        const char *hit = memmem(p + pos, len - pos, img, sizeof img - 1);
        size_t end = hit ? (size_t)(hit - p) : len;
        if (!df_byte_buf_append(b, p + pos, end - pos))
            return false;
        pos = hit ? end + sizeof img - 1 : len;
    }
    return true;
}

static df_status render(df_prompt_format format, const char *prompt, size_t len,
                        const char *system_message, df_byte_buf *b)
{
    if (!prompt && len > 0)
        return df_errorf(DF_E_ARG, "prompt: text is NULL but len is %zu", len);
    if (len > 0)
        DF_TRY(df_utf8_check(prompt, len, "prompt"));
    bool ok;
    switch (format) {
    case DF_PROMPT_FLUX2_MISTRAL:
        if (!system_message)
            system_message = flux2_system_message;
        DF_TRY(df_utf8_check(system_message, strlen(system_message), "system message"));
        ok = put(b, "<s>[SYSTEM_PROMPT]") && put(b, system_message) &&
             put(b, "[/SYSTEM_PROMPT][INST]") && put_without_img(b, prompt, len) &&
             put(b, "[/INST]");
        break;
    case DF_PROMPT_FLUX2_QWEN3:
        ok = put(b, "<|im_start|>user\n") && df_byte_buf_append(b, prompt, len) &&
             put(b, "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
        break;
    default:
        return df_errorf(DF_E_ARG, "prompt: unknown prompt format %d", (int)format);
    }
    if (!ok || !df_byte_buf_append(b, "", 1)) /* the NUL, not counted */
        return df_errorf(DF_E_OOM, "prompt: out of memory");
    b->len--;
    return DF_OK;
}

df_status df_prompt_render(df_prompt_format format, const char *prompt, size_t len,
                           const char *system_message, char **out_text, size_t *out_len)
{
    if (!out_text || !out_len)
        return df_errorf(DF_E_ARG, "df_prompt_render: out_text and out_len must not be NULL");
    *out_text = NULL;
    *out_len = 0;
    df_byte_buf b = {0};
    df_status s = render(format, prompt, len, system_message, &b);
    if (s != DF_OK) {
        df_byte_buf_free(&b);
        return s;
    }
    *out_text = b.data;
    *out_len = b.len;
    return DF_OK;
}

void df_prompt_text_free(char *text)
{
    df_free(text);
}

df_status df_tokenizer_encode_prompt(const df_tokenizer *tok, df_prompt_format format,
                                     const char *prompt, size_t len, const char *system_message,
                                     const df_tokenize_opts *opts, df_tokens *out)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!tok || !out)
        return df_errorf(DF_E_ARG, "df_tokenizer_encode_prompt: tokenizer and out must not be "
                         "NULL");
    const df_tok_json *tj = df_tokenizer_json_model(tok);
    if (!tj)
        return df_errorf(DF_E_UNSUPPORTED, "prompt formatting for FLUX.2 needs a tokenizer.json "
                         "tokenizer, not a %s one", df_tokenizer_type_name(df_tokenizer_kind(tok)));
    df_tokenize_opts o = {
        .max_length = opts && opts->max_length ? opts->max_length : FLUX2_MAX_SEQUENCE_LENGTH,
        .pad = true,
        .truncate = true,
    };
    df_byte_buf b = {0};
    df_status s = render(format, prompt, len, system_message, &b);
    if (s == DF_OK)
        s = df_tok_json_encode(tj, b.data, b.len, &o, format != DF_PROMPT_FLUX2_MISTRAL, out);
    df_byte_buf_free(&b);
    return s;
}
