/*
 * The generation-parameters text stored in PNG files, in the web UIs' form:
 *
 *     <prompt, any number of lines>
 *     Negative prompt: <text, any number of lines>          (optional)
 *     Steps: 4, Sampler: Euler, CFG scale: 0, Seed: 42, Size: 512x512, Model: NAME
 *
 * An image-to-image run adds "Denoising strength: 0.6" (the web UIs' key) and the input
 * picture as "Init image: in.png, Init image hash: <SHA-256 in hex>" (our keys); inpainting
 * adds "Mask image: mask.png, Mask image hash: <hex>" and, with a crop around the mask,
 * "Masked area padding: N" (the web UIs' key for their own crop padding).
 *
 * The last line is a list of "Key: value" pairs separated by commas; a value holding a
 * comma, colon or newline is written as a JSON string. Reading follows the web UIs' rule:
 * the last line counts as the parameters line only when at least three pairs parse from
 * it, otherwise the whole text is prompt. Prompt lines are kept byte for byte (the web
 * UIs strip them; keeping them makes our own files round-trip exactly).
 */
#include <diffuse/image.h>

#include <ctype.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"

/* ---- a growing string ---------------------------------------------------------------- */

typedef struct strbuf {
    char *s;
    size_t len, cap;
    bool failed;
} strbuf;

static void sb_append(strbuf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 128;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = df_realloc(b->s, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->s = grown;
        b->cap = cap;
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_puts(strbuf *b, const char *s)
{
    sb_append(b, s, strlen(s));
}

static void sb_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(strbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_append(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* ---- formatting ----------------------------------------------------------------------- */

/* A value as the web UIs write it: bare, or a JSON string when it would break the line. */
static void put_value(strbuf *b, const char *v)
{
    if (!strpbrk(v, ",:\n")) {
        sb_puts(b, v);
        return;
    }
    sb_puts(b, "\"");
    for (const char *p = v; *p; p++) {
        unsigned char c = (unsigned char)*p;
        switch (c) {
        case '"':
            sb_puts(b, "\\\"");
            break;
        case '\\':
            sb_puts(b, "\\\\");
            break;
        case '\n':
            sb_puts(b, "\\n");
            break;
        case '\r':
            sb_puts(b, "\\r");
            break;
        case '\t':
            sb_puts(b, "\\t");
            break;
        default:
            if (c < 0x20)
                sb_printf(b, "\\u%04x", c);
            else
                sb_append(b, p, 1);
        }
    }
    sb_puts(b, "\"");
}

/* The shortest decimal form that reads back as the same double. */
static void put_number(strbuf *b, double x)
{
    char tmp[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*g", prec, x);
        if (strtod(tmp, NULL) == x)
            break;
    }
    sb_puts(b, tmp);
}

df_status df_image_format_parameters(const df_image_params *p, char **out)
{
    *out = NULL;
    strbuf b = {0};
    sb_puts(&b, p->prompt ? p->prompt : "");
    sb_puts(&b, "\n");
    if (p->negative_prompt) {
        sb_puts(&b, "Negative prompt: ");
        sb_puts(&b, p->negative_prompt);
        sb_puts(&b, "\n");
    }
    if (p->steps > 0)
        sb_printf(&b, "Steps: %d, ", p->steps);
    sb_puts(&b, "Sampler: ");
    put_value(&b, p->sampler ? p->sampler : "Euler");
    sb_puts(&b, ", CFG scale: ");
    put_number(&b, p->cfg_scale);
    sb_printf(&b, ", Seed: %" PRIu64, p->seed);
    if (p->width > 0 && p->height > 0)
        sb_printf(&b, ", Size: %dx%d", p->width, p->height);
    if (p->model) {
        sb_puts(&b, ", Model: ");
        put_value(&b, p->model);
    }
    if (p->denoising_strength > 0) {
        sb_puts(&b, ", Denoising strength: ");
        put_number(&b, p->denoising_strength);
    }
    if (p->init_image) {
        sb_puts(&b, ", Init image: ");
        put_value(&b, p->init_image);
    }
    if (p->init_image_hash) {
        sb_puts(&b, ", Init image hash: ");
        put_value(&b, p->init_image_hash);
    }
    if (p->mask_image) {
        sb_puts(&b, ", Mask image: ");
        put_value(&b, p->mask_image);
    }
    if (p->mask_image_hash) {
        sb_puts(&b, ", Mask image hash: ");
        put_value(&b, p->mask_image_hash);
    }
    if (p->mask_padding > 0)
        sb_printf(&b, ", Masked area padding: %d", p->mask_padding);
    if (b.failed) {
        df_free(b.s);
        return df_errorf(DF_E_OOM, "out of memory formatting the image parameters");
    }
    *out = b.s;
    return DF_OK;
}

/* ---- parsing -------------------------------------------------------------------------- */

typedef struct kv {
    const char *key;
    size_t key_len;
    char *value; /* unquoted, owned */
} kv;

static bool key_char(char c)
{
    return isalnum((unsigned char)c) || c == '_' || c == ' ' || c == '-' || c == '/' ||
           (unsigned char)c >= 0x80;
}

/* Reads a JSON string starting at the opening quote *s; returns its decoded value (ASCII
 * escapes; \u00XX below 0x80) or NULL when it is not a complete string. */
static char *read_quoted(const char **s, bool *oom)
{
    const char *p = *s + 1;
    strbuf b = {0};
    sb_puts(&b, "");
    for (; *p && *p != '"'; p++) {
        if (*p != '\\') {
            sb_append(&b, p, 1);
            continue;
        }
        p++;
        char c = *p;
        switch (c) {
        case 'n':
            sb_puts(&b, "\n");
            break;
        case 'r':
            sb_puts(&b, "\r");
            break;
        case 't':
            sb_puts(&b, "\t");
            break;
        case 'u': {
            unsigned v = 0;
            int k = 0;
            for (; k < 4 && isxdigit((unsigned char)p[1 + k]); k++)
                v = v * 16 + (unsigned)(isdigit((unsigned char)p[1 + k])
                                            ? p[1 + k] - '0'
                                            : (tolower((unsigned char)p[1 + k]) - 'a' + 10));
            if (k < 4 || v >= 0x80) { /* not something we write: keep the text as it is */
                sb_append(&b, p - 1, 2);
                break;
            }
            char ch = (char)v;
            sb_append(&b, &ch, 1);
            p += 4;
            break;
        }
        case '\0':
            p--;
            break;
        default:
            sb_append(&b, &c, 1);
        }
    }
    if (b.failed || *p != '"') {
        *oom = b.failed;
        df_free(b.s);
        return NULL;
    }
    *s = p + 1;
    return b.s;
}

/* Parses "Key: value, Key: value" pairs from one line. Returns the number found; *pairs
 * (owned, values owned) holds them. -1 when memory runs out. */
static int parse_pairs(const char *line, size_t len, kv **pairs)
{
    *pairs = NULL;
    int n = 0, cap = 0;
    const char *p = line, *end = line + len;
    while (p < end) {
        while (p < end && isspace((unsigned char)*p))
            p++;
        const char *key = p;
        if (p >= end || !(isalnum((unsigned char)*p) || *p == '_'))
            break;
        while (p < end && key_char(*p))
            p++;
        if (p >= end || *p != ':')
            break;
        size_t key_len = (size_t)(p - key);
        p++;
        while (p < end && isspace((unsigned char)*p))
            p++;
        char *value = NULL;
        bool oom = false;
        if (p < end && *p == '"')
            value = read_quoted(&p, &oom);
        if (!value && !oom) {
            const char *v = p;
            while (p < end && *p != ',')
                p++;
            const char *v_end = p;
            while (v_end > v && isspace((unsigned char)v_end[-1]))
                v_end--;
            value = df_malloc((size_t)(v_end - v) + 1);
            if (value) {
                memcpy(value, v, (size_t)(v_end - v));
                value[v_end - v] = '\0';
            }
        }
        if (value && n == cap) {
            cap = cap ? cap * 2 : 8;
            kv *grown = df_realloc(*pairs, (size_t)cap * sizeof **pairs);
            if (grown) {
                *pairs = grown;
            } else {
                df_free(value);
                value = NULL;
            }
        }
        if (!value) {
            for (int i = 0; i < n; i++)
                df_free((*pairs)[i].value);
            df_free(*pairs);
            *pairs = NULL;
            return -1;
        }
        (*pairs)[n++] = (kv){key, key_len, value};
        while (p < end && isspace((unsigned char)*p))
            p++;
        if (p < end && *p == ',')
            p++;
    }
    return n;
}

static bool key_is(const kv *pair, const char *name)
{
    return pair->key_len == strlen(name) && memcmp(pair->key, name, pair->key_len) == 0;
}

static char *dup_range(const char *s, size_t n)
{
    char *out = df_malloc(n + 1);
    if (out) {
        memcpy(out, s, n);
        out[n] = '\0';
    }
    return out;
}

/* Takes the known keys out of the pairs (moving the strings it keeps). */
static void apply_pairs(kv *pairs, int n, df_image_params *out)
{
    for (int i = 0; i < n; i++) {
        char *v = pairs[i].value;
        if (key_is(&pairs[i], "Steps")) {
            out->steps = atoi(v);
        } else if (key_is(&pairs[i], "CFG scale")) {
            out->cfg_scale = strtod(v, NULL);
        } else if (key_is(&pairs[i], "Seed")) {
            out->seed = strtoull(v, NULL, 10);
        } else if (key_is(&pairs[i], "Size")) {
            int w = 0, h = 0;
            if (sscanf(v, "%dx%d", &w, &h) == 2) {
                out->width = w;
                out->height = h;
            }
        } else if (key_is(&pairs[i], "Sampler") && !out->sampler) {
            out->sampler = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Model") && !out->model) {
            out->model = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Denoising strength")) {
            out->denoising_strength = strtod(v, NULL);
        } else if (key_is(&pairs[i], "Init image") && !out->init_image) {
            out->init_image = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Init image hash") && !out->init_image_hash) {
            out->init_image_hash = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Mask image") && !out->mask_image) {
            out->mask_image = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Mask image hash") && !out->mask_image_hash) {
            out->mask_image_hash = v;
            pairs[i].value = NULL;
        } else if (key_is(&pairs[i], "Masked area padding")) {
            out->mask_padding = atoi(v);
        }
    }
}

df_status df_image_parse_parameters(const char *text, df_image_params *out)
{
    memset(out, 0, sizeof *out);
    size_t len = strlen(text);
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        len--;
    const char *last = text + len;
    while (last > text && last[-1] != '\n')
        last--;

    kv *pairs = NULL;
    int n = parse_pairs(last, (size_t)(text + len - last), &pairs);
    if (n < 0)
        goto oom;
    size_t body = len;
    if (n >= 3) {
        apply_pairs(pairs, n, out);
        body = last > text ? (size_t)(last - text) - 1 : 0; /* without the '\n' before it */
    }
    for (int i = 0; i < n; i++)
        df_free(pairs[i].value);
    df_free(pairs);

    /* prompt lines, then "Negative prompt:" and the lines after it */
    const char *neg = NULL;
    for (const char *line = text; line < text + body;) {
        if (strncmp(line, "Negative prompt:", 16) == 0) {
            neg = line;
            break;
        }
        const char *nl = memchr(line, '\n', (size_t)(text + body - line));
        line = nl ? nl + 1 : text + body;
    }
    size_t prompt_len = neg ? (size_t)(neg - text) : body;
    if (neg && prompt_len > 0)
        prompt_len--; /* the '\n' before "Negative prompt:" */
    out->prompt = dup_range(text, prompt_len);
    if (!out->prompt)
        goto oom;
    if (neg) {
        const char *v = neg + 16;
        while (*v == ' ')
            v++;
        out->negative_prompt = dup_range(v, (size_t)(text + body - v));
        if (!out->negative_prompt)
            goto oom;
    }
    return DF_OK;
oom:
    df_image_params_deinit(out);
    return df_errorf(DF_E_OOM, "out of memory parsing image parameters");
}

void df_image_params_deinit(df_image_params *p)
{
    df_free((char *)p->prompt);
    df_free((char *)p->negative_prompt);
    df_free((char *)p->sampler);
    df_free((char *)p->model);
    df_free((char *)p->init_image);
    df_free((char *)p->init_image_hash);
    df_free((char *)p->mask_image);
    df_free((char *)p->mask_image_hash);
    memset(p, 0, sizeof *p);
}
