/*
 * Golden kind "tokenizer": CLIPTokenizer / T5Tokenizer / a tokenizer.json tokenizer from the
 * case's tokenizer folder.
 *
 * As the case's "call" does: the prompts are encoded together with
 * padding=args.padding, max_length=args.max_length, truncation=args.truncation (outputs
 * input_ids and attention_mask, [N, max_length]), and each prompt alone without padding or
 * truncation (ids_nopad, ragged, with ids_nopad_offsets). The prompt bytes come from
 * in.prompts_utf8 / in.prompts_offsets, which hold exactly the UTF-8 of args.prompts; the
 * two are checked against each other. All outputs are compared exactly. Tokenizing runs on
 * the host, so the execution mode does not change the result.
 *
 * A case with templated outputs (args.templated, FLUX.2's tokenizer cases) also formats each
 * prompt as its pipeline does: args.system_message names Flux2Pipeline's Mistral template
 * (with that system message), an args.template naming _get_qwen3_prompt_embeds
 * Flux2KleinPipeline's Qwen3 template. The rendered text must equal in.templated_utf8
 * byte for byte, and df_tokenizer_encode_prompt at args.max_sequence_length must give
 * templated_input_ids and templated_attention_mask.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

typedef struct prompts {
    char *bytes;      /* all prompts, back to back */
    int64_t *offsets; /* [n + 1] */
    int64_t n;
} prompts;

static void prompts_free(prompts *p)
{
    free(p->bytes);
    free(p->offsets);
}

/* Ragged UTF-8 strings: the tensors `bytes_name` (U8) and `offsets_name` (n + 1 offsets). */
static int read_ragged(check_case *c, const char *bytes_name, const char *offsets_name,
                       prompts *p, int64_t *out_nbytes)
{
    int64_t shape[8], *utf8 = NULL;
    int ndim;
    if (check_read_i64(c, offsets_name, &p->offsets, shape, &ndim) != DF_OK)
        return check_fail(c, "%s: %s", offsets_name, df_error_message());
    p->n = shape[0] - 1;
    if (ndim != 1 || p->n < 0)
        return check_fail(c, "%s: expected a vector of n + 1 offsets", offsets_name);
    if (check_read_i64(c, bytes_name, &utf8, shape, &ndim) != DF_OK)
        return check_fail(c, "%s: %s", bytes_name, df_error_message());
    int64_t nbytes = shape[0];
    p->bytes = malloc((size_t)nbytes + 1);
    if (!p->bytes) {
        free(utf8);
        return check_fail(c, "out of memory");
    }
    for (int64_t i = 0; i < nbytes; i++)
        p->bytes[i] = (char)(uint8_t)utf8[i];
    free(utf8);
    for (int64_t i = 0; i < p->n; i++)
        if (p->offsets[i] < 0 || p->offsets[i + 1] < p->offsets[i] || p->offsets[i + 1] > nbytes)
            return check_fail(c, "%s[%lld] is out of range", offsets_name, (long long)i);
    *out_nbytes = nbytes;
    return 0;
}

static int read_prompts(check_case *c, prompts *p)
{
    int64_t nbytes;
    if (read_ragged(c, "in.prompts_utf8", "in.prompts_offsets", p, &nbytes) != 0)
        return 1;

    const df_json *list = df_json_get(c->args, "prompts");
    if (df_json_array_size(list) != p->n)
        return check_fail(c, "args.prompts has %lld prompts, in.prompts_offsets %lld",
                          (long long)df_json_array_size(list), (long long)p->n);
    for (int64_t i = 0; i < p->n; i++) {
        int64_t b = p->offsets[i], e = p->offsets[i + 1];
        const char *s = df_json_string(df_json_array_get(list, i));
        if (b < 0 || e < b || e > nbytes)
            return check_fail(c, "in.prompts_offsets[%lld] is out of range", (long long)i);
        if (!s || strlen(s) != (size_t)(e - b) || memcmp(s, p->bytes + b, (size_t)(e - b)) != 0)
            return check_fail(c, "args.prompts[%lld] differs from its bytes in in.prompts_utf8",
                              (long long)i);
    }
    return 0;
}

/* args.padding: "max_length" pads to max_length, true / "longest" to the longest prompt,
 * false / "do_not_pad" / absent not at all. */
static int padding_arg(check_case *c, bool *to_max, bool *to_longest)
{
    const df_json *v = df_json_get(c->args, "padding");
    const char *s = df_json_string(v);
    *to_max = s && strcmp(s, "max_length") == 0;
    *to_longest =
        (s && strcmp(s, "longest") == 0) || (df_json_type_of(v) == DF_JSON_BOOL && df_json_bool(v));
    if (s && !*to_max && !*to_longest && strcmp(s, "do_not_pad") != 0)
        return check_fail(c, "args.padding '%s' is not max_length, longest or do_not_pad", s);
    return 0;
}

static bool truncation_arg(const check_case *c)
{
    const df_json *v = df_json_get(c->args, "truncation");
    const char *s = df_json_string(v);
    if (s)
        return strcmp(s, "do_not_truncate") != 0;
    return df_json_type_of(v) == DF_JSON_BOOL && df_json_bool(v);
}

/* The batch call: rows of `width` ids (padded to the longest row when width is 0). */
static int encode_batch(check_case *c, const df_tokenizer *tok, const prompts *p,
                        const df_tokenize_opts *o, int64_t **ids, int64_t **mask, int64_t *width)
{
    df_tokens *rows = calloc((size_t)(p->n > 0 ? p->n : 1), sizeof *rows);
    if (!rows)
        return check_fail(c, "out of memory");
    int rc = 0;
    int64_t w = 0;
    for (int64_t i = 0; i < p->n && rc == 0; i++) {
        const char *text = p->bytes + p->offsets[i];
        size_t len = (size_t)(p->offsets[i + 1] - p->offsets[i]);
        if (df_tokenizer_encode(tok, text, len, o, &rows[i]) != DF_OK)
            rc = check_fail(c, "prompt %lld: %s", (long long)i, df_error_message());
        else if (rows[i].count > w)
            w = rows[i].count;
    }
    df_tokenizer_info info;
    df_tokenizer_get_info(tok, &info);
    if (rc == 0) {
        *ids = malloc((size_t)(p->n * w + 1) * sizeof **ids);
        *mask = malloc((size_t)(p->n * w + 1) * sizeof **mask);
        if (!*ids || !*mask)
            rc = check_fail(c, "out of memory");
    }
    for (int64_t i = 0; i < p->n && rc == 0; i++) {
        for (int64_t k = 0; k < w; k++) { /* rows shorter than w: padding="longest" */
            bool real = k < rows[i].count;
            (*ids)[i * w + k] = real ? rows[i].ids[k] : info.pad_id;
            (*mask)[i * w + k] = real ? rows[i].attention_mask[k] : 0;
        }
    }
    for (int64_t i = 0; i < p->n; i++)
        df_tokens_deinit(&rows[i]);
    free(rows);
    *width = w;
    return rc;
}

/* Each prompt alone, without padding or truncation, concatenated, with n + 1 offsets. */
static int encode_each(check_case *c, const df_tokenizer *tok, const prompts *p, int64_t **ids,
                       int64_t *count, int64_t **offsets)
{
    int64_t cap = 1024, n = 0;
    *ids = malloc((size_t)cap * sizeof **ids);
    *offsets = malloc((size_t)(p->n + 1) * sizeof **offsets);
    if (!*ids || !*offsets)
        return check_fail(c, "out of memory");
    (*offsets)[0] = 0;
    for (int64_t i = 0; i < p->n; i++) {
        df_tokens t;
        const char *text = p->bytes + p->offsets[i];
        size_t len = (size_t)(p->offsets[i + 1] - p->offsets[i]);
        if (df_tokenizer_encode(tok, text, len, NULL, &t) != DF_OK)
            return check_fail(c, "prompt %lld alone: %s", (long long)i, df_error_message());
        if (n + t.count > cap) {
            while (n + t.count > cap)
                cap *= 2;
            int64_t *grown = realloc(*ids, (size_t)cap * sizeof *grown);
            if (!grown) {
                df_tokens_deinit(&t);
                return check_fail(c, "out of memory");
            }
            *ids = grown;
        }
        memcpy(*ids + n, t.ids, (size_t)t.count * sizeof *t.ids);
        n += t.count;
        (*offsets)[i + 1] = n;
        df_tokens_deinit(&t);
    }
    *count = n;
    return 0;
}

/* Which pipeline's formatting the case's templated outputs use; 0 for none. */
static int template_arg(check_case *c, df_prompt_format *format, const char **system_message)
{
    *format = 0;
    *system_message = NULL;
    if (df_json_is_null(df_json_get(c->args, "templated")))
        return 0;
    const char *sys = df_json_string(df_json_get(c->args, "system_message"));
    const char *tmpl = df_json_string(df_json_get(c->args, "template"));
    if (sys) {
        *format = DF_PROMPT_FLUX2_MISTRAL;
        *system_message = sys;
    } else if (tmpl && strstr(tmpl, "_get_qwen3_prompt_embeds")) {
        *format = DF_PROMPT_FLUX2_QWEN3;
    } else {
        return check_fail(c, "args.templated is given but neither args.system_message "
                             "(Flux2Pipeline) nor an args.template of _get_qwen3_prompt_embeds "
                             "(Flux2KleinPipeline) says how");
    }
    return 0;
}

/* Each prompt rendered and tokenized as the pipeline does, [n, max_sequence_length]. */
static int encode_templated(check_case *c, const df_tokenizer *tok, const prompts *p,
                            df_prompt_format format, const char *system_message)
{
    int64_t msl = 0, nbytes;
    if (df_json_get_int(c->args, "max_sequence_length", &msl) != DF_OK || msl <= 0)
        return check_fail(c, "args.max_sequence_length: a positive integer is needed");
    prompts want = {0};
    int rc = read_ragged(c, "in.templated_utf8", "in.templated_offsets", &want, &nbytes);
    if (rc == 0 && want.n != p->n)
        rc = check_fail(c, "in.templated_offsets holds %lld texts for %lld prompts",
                        (long long)want.n, (long long)p->n);
    int64_t *ids = rc == 0 ? malloc((size_t)(p->n * msl + 1) * sizeof *ids) : NULL;
    int64_t *mask = rc == 0 ? malloc((size_t)(p->n * msl + 1) * sizeof *mask) : NULL;
    if (rc == 0 && (!ids || !mask))
        rc = check_fail(c, "out of memory");
    for (int64_t i = 0; i < p->n && rc == 0; i++) {
        const char *text = p->bytes + p->offsets[i];
        size_t len = (size_t)(p->offsets[i + 1] - p->offsets[i]);
        size_t wlen = (size_t)(want.offsets[i + 1] - want.offsets[i]), rlen;
        char *rendered;
        if (df_prompt_render(format, text, len, system_message, &rendered, &rlen) != DF_OK) {
            rc = check_fail(c, "prompt %lld: rendering: %s", (long long)i, df_error_message());
            break;
        }
        if (rlen != wlen || memcmp(rendered, want.bytes + want.offsets[i], wlen) != 0)
            rc = check_fail(c, "prompt %lld: the rendered text differs from in.templated_utf8 "
                               "(%zu bytes, expected %zu)", (long long)i, rlen, wlen);
        df_prompt_text_free(rendered);
        df_tokens t;
        df_tokenize_opts o = {.max_length = msl};
        if (rc == 0 && df_tokenizer_encode_prompt(tok, format, text, len, system_message, &o,
                                                  &t) != DF_OK)
            rc = check_fail(c, "prompt %lld templated: %s", (long long)i, df_error_message());
        else if (rc == 0 && t.count != msl)
            rc = check_fail(c, "prompt %lld templated: %lld ids, expected %lld", (long long)i,
                            (long long)t.count, (long long)msl);
        if (rc == 0) {
            memcpy(ids + i * msl, t.ids, (size_t)msl * sizeof *ids);
            memcpy(mask + i * msl, t.attention_mask, (size_t)msl * sizeof *mask);
            df_tokens_deinit(&t);
        }
    }
    if (rc == 0) {
        rc |= check_compare_i64(c, "templated_input_ids", ids, p->n * msl);
        rc |= check_compare_i64(c, "templated_attention_mask", mask, p->n * msl);
    }
    free(ids);
    free(mask);
    prompts_free(&want);
    return rc;
}

int check_kind_tokenizer(check_case *c)
{
    if (!c->model_dir)
        return check_fail(c, "the case names no tokenizer folder (\"dir\" is null)");
    int64_t max_length = 0;
    if (!df_json_is_null(df_json_get(c->args, "max_length")) &&
        df_json_get_int(c->args, "max_length", &max_length) != DF_OK)
        return check_fail(c, "args.max_length: %s", df_error_message());
    bool to_max, to_longest;
    if (padding_arg(c, &to_max, &to_longest) != 0)
        return 1;
    df_prompt_format format;
    const char *system_message;
    if (template_arg(c, &format, &system_message) != 0)
        return 1;

    df_tokenizer *tok;
    if (df_tokenizer_load(c->model_dir, &tok) != DF_OK)
        return check_fail(c, "loading the tokenizer: %s", df_error_message());
    if (c->verbose)
        printf("%s: %s tokenizer from %s\n", c->name,
               df_tokenizer_type_name(df_tokenizer_kind(tok)), c->model_dir);

    prompts p = {0};
    int64_t *ids = NULL, *mask = NULL, *nopad = NULL, *nopad_offsets = NULL;
    int64_t width = 0, nopad_count = 0;
    df_tokenize_opts o = {.max_length = max_length, .pad = to_max, .truncate = truncation_arg(c)};
    int rc = read_prompts(c, &p);
    if (rc == 0)
        rc = encode_batch(c, tok, &p, &o, &ids, &mask, &width);
    if (rc == 0)
        rc = encode_each(c, tok, &p, &nopad, &nopad_count, &nopad_offsets);
    if (rc == 0) {
        rc |= check_compare_i64(c, "input_ids", ids, p.n * width);
        rc |= check_compare_i64(c, "attention_mask", mask, p.n * width);
        rc |= check_compare_i64(c, "ids_nopad", nopad, nopad_count);
        rc |= check_compare_i64(c, "ids_nopad_offsets", nopad_offsets, p.n + 1);
    }
    if (rc == 0 && format)
        rc = encode_templated(c, tok, &p, format, system_message);
    free(ids);
    free(mask);
    free(nopad);
    free(nopad_offsets);
    prompts_free(&p);
    df_tokenizer_free(tok);
    return rc;
}
