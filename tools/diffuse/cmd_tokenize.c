/*
 * `diffuse tokenize -m MODEL_DIR [--component NAME] [--max-length N] [--template T] [-v] TEXT`:
 * the token ids a model's tokenizer gives a text, to compare by hand with transformers'
 * `tokenizer(TEXT).input_ids` (or, with --max-length N, with
 * `tokenizer(TEXT, padding="max_length", max_length=N, truncation=True)`). With --template
 * flux2 or flux2-klein the text is a prompt formatted as Flux2Pipeline or
 * Flux2KleinPipeline formats it (chat template, padding to 512 or N, the tokenizer's
 * padding side): the ids those pipelines feed their text encoder; -v also prints the
 * rendered text.
 *
 * MODEL_DIR is a pipeline folder (the tokenizer is its `tokenizer/` subfolder, or the
 * --component given: tokenizer_2, tokenizer_3) or a tokenizer folder itself (vocab.json,
 * spiece.model or tokenizer.json), or a GGUF file carrying llama.cpp's T5 tokenizer
 * (tokenizer.ggml.*, as city96's T5 encoder files do), or a safetensors file carrying
 * Mistral's tekken.json as ComfyUI's FLUX.2 Mistral files do (tekken_model). TEXT "-" reads
 * the text from stdin (all of it, as is). Output: one line `input_ids: [...]`, with
 * --max-length also `attention_mask: [...]`; -v lists each id with its token, one per
 * line, with control characters escaped. Errors print one "error:" line and exit 1; usage
 * errors exit 2.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: diffuse tokenize -m MODEL_DIR [--component NAME] [--max-length N]\n"
            "                        [--template flux2|flux2-klein] [-v] TEXT\n"
            "  prints the token ids of TEXT (\"-\" reads stdin)\n"
            "  -m, --model DIR     a pipeline folder, a tokenizer folder, or a T5 GGUF\n"
            "                      carrying llama.cpp's tokenizer (tokenizer.ggml.*), or a\n"
            "                      .safetensors carrying tekken.json (tekken_model)\n"
            "  -c, --component N   the pipeline's tokenizer folder (default: tokenizer;\n"
            "                      tokenizer_2, tokenizer_3 for CLIP-G / T5)\n"
            "  -n, --max-length N  pad and truncate to N ids, as the pipelines do\n"
            "  -t, --template T    format TEXT as a prompt of Flux2Pipeline (flux2) or\n"
            "                      Flux2KleinPipeline (flux2-klein); pads to 512 unless -n\n"
            "  -v, --verbose       one line per id with its token\n"
            "  -h, --help          this text\n");
}

static bool is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool has_file(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static char *read_stdin(size_t *len)
{
    size_t cap = 4096, n = 0, r;
    char *buf = malloc(cap);
    while (buf && (r = fread(buf + n, 1, cap - n, stdin)) > 0) {
        n += r;
        if (n == cap) {
            char *bigger = realloc(buf, cap *= 2);
            if (!bigger)
                free(buf);
            buf = bigger;
        }
    }
    *len = n;
    return buf;
}

/* Prints a token with bytes below 0x20 and 0x7f escaped. */
static void put_piece(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
}

static void print_list(const char *name, const int64_t *v, int64_t n)
{
    printf("%s: [", name);
    for (int64_t i = 0; i < n; i++)
        printf(i ? ", %lld" : "%lld", (long long)v[i]);
    printf("]\n");
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *component = NULL, *text = NULL;
    df_prompt_format format = 0;
    long long max_length = 0;
    bool verbose = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) {
            model = argv[++i];
        } else if ((!strcmp(a, "-c") || !strcmp(a, "--component")) && has_value) {
            component = argv[++i];
        } else if ((!strcmp(a, "-n") || !strcmp(a, "--max-length")) && has_value) {
            char *end;
            max_length = strtoll(argv[++i], &end, 10);
            if (*end || max_length <= 0) {
                fprintf(stderr, "diffuse tokenize: --max-length needs a positive integer\n");
                return 2;
            }
        } else if ((!strcmp(a, "-t") || !strcmp(a, "--template")) && has_value) {
            const char *v = argv[++i];
            if (!strcmp(v, "flux2"))
                format = DF_PROMPT_FLUX2_MISTRAL;
            else if (!strcmp(v, "flux2-klein"))
                format = DF_PROMPT_FLUX2_QWEN3;
            else {
                fprintf(stderr, "diffuse tokenize: --template is flux2 or flux2-klein\n");
                return 2;
            }
        } else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) {
            verbose = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "diffuse tokenize: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        } else if (text) {
            fprintf(stderr, "diffuse tokenize: one TEXT only (quote it)\n");
            return 2;
        } else {
            text = a;
        }
    }
    if (!model || !text) {
        usage(stderr);
        return 2;
    }

    /* the component subfolder, unless MODEL_DIR is itself a tokenizer folder or a GGUF */
    char dir[4096];
    size_t mlen = strlen(model);
    bool gguf = !component && mlen > 5 && !strcmp(model + mlen - 5, ".gguf") && !is_dir(model);
    bool tekken = !component && mlen > 12 && !strcmp(model + mlen - 12, ".safetensors") &&
                  !is_dir(model);
    bool direct = !component && (has_file(model, "vocab.json") || has_file(model, "spiece.model") ||
                                 has_file(model, "tokenizer.json"));
    if (direct || gguf || tekken)
        snprintf(dir, sizeof dir, "%s", model);
    else
        snprintf(dir, sizeof dir, "%s/%s", model, component ? component : "tokenizer");
    if (!gguf && !tekken && !is_dir(dir)) {
        fprintf(stderr, "error: %s: no such tokenizer folder\n", dir);
        return 1;
    }

    size_t len = strlen(text);
    char *owned = NULL;
    if (!strcmp(text, "-")) {
        owned = read_stdin(&len);
        if (!owned) {
            fprintf(stderr, "error: out of memory reading stdin\n");
            return 1;
        }
        text = owned;
    }

    df_tokenizer *tok = NULL;
    df_tokens t = {0};
    df_tokenize_opts opts = {
        .max_length = max_length, .pad = max_length > 0, .truncate = max_length > 0};
    int rc = 0;
    df_status s = gguf     ? df_tokenizer_load_gguf(dir, &tok)
                  : tekken ? df_tokenizer_load_tekken(dir, &tok)
                           : df_tokenizer_load(dir, &tok);
    if (s == DF_OK && format)
        s = df_tokenizer_encode_prompt(tok, format, text, len, NULL, &opts, &t);
    else if (s == DF_OK)
        s = df_tokenizer_encode(tok, text, len, max_length > 0 ? &opts : NULL, &t);
    if (s != DF_OK) {
        fprintf(stderr, "error: %s\n", df_error_message());
        rc = 1;
    }
    if (rc == 0 && verbose && format) {
        char *rendered;
        size_t rlen;
        if (df_prompt_render(format, text, len, NULL, &rendered, &rlen) == DF_OK) {
            printf("# rendered: ");
            put_piece(rendered);
            putchar('\n');
            df_prompt_text_free(rendered);
        }
    }
    if (rc == 0 && verbose) {
        printf("# %s tokenizer, %s\n", df_tokenizer_type_name(df_tokenizer_kind(tok)), dir);
        for (int64_t i = 0; i < t.count; i++) {
            const char *piece = df_tokenizer_id_to_piece(tok, t.ids[i]);
            printf("%6lld  %lld  ", (long long)t.ids[i], (long long)t.attention_mask[i]);
            put_piece(piece ? piece : "(no token)");
            putchar('\n');
        }
    }
    if (rc == 0) {
        print_list("input_ids", t.ids, t.count);
        if (max_length > 0 || format)
            print_list("attention_mask", t.attention_mask, t.count);
        if (fflush(stdout) != 0) {
            fprintf(stderr, "error: writing the output failed\n");
            rc = 1;
        }
    }
    df_tokens_deinit(&t);
    df_tokenizer_free(tok);
    free(owned);
    return rc;
}
