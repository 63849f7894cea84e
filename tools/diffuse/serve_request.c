/*
 * diffuse serve: request bodies to one serve_request, and the text the answers are made of.
 *
 * Both APIs come down to the same few fields (prompt, size, steps, guidance, seed, count,
 * model). Parsing goes through the library's JSON layer, whose typed getters already write
 * messages that name the key and the type found; this file adds the range checks and the
 * protocol's own rules (A1111's seed -1, batch_size x n_iter; OpenAI's "WxH" size and
 * response_format). Fields a client sends that diffuse has no use for (A1111 sends dozens:
 * restore_faces, styles, subseed, ...) are ignored, as the original servers ignore
 * unknown ones; fields that would change the image in a way diffuse cannot (hires fix) are
 * a 400 rather than silently dropped.
 *
 * No I/O here: tests/fuzz/fuzz_serve_request.c runs arbitrary bytes through both parsers.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "serve.h"

const char *const serve_samplers[] = {"Euler", NULL};
/* "automatic": the scheduler the model folder's scheduler_config.json names (flow-match
 * Euler for every pipeline diffuse runs). */
const char *const serve_schedulers[] = {"automatic", "flow_match_euler", NULL};

static int fail(serve_error *err, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(serve_error *err, int status, const char *param, const char *fmt, ...)
{
    err->status = status;
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return status;
}

/* A library message about a field, as the 400's message. */
static int fail_json(serve_error *err, const char *param)
{
    return fail(err, 400, param, "%s", df_error_message());
}

void serve_request_deinit(serve_request *r)
{
    free(r->prompt);
    free(r->negative_prompt);
    free(r->model);
    memset(r, 0, sizeof *r);
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* An optional integer field in [lo, hi]; absent or null leaves *out. */
static int get_int(const df_json *root, const char *key, int64_t lo, int64_t hi, int64_t *out,
                   serve_error *err)
{
    const df_json *j = df_json_get(root, key);
    if (df_json_is_null(j))
        return 0;
    int64_t v;
    if (df_json_to_int(j, &v) != DF_OK)
        return fail_json(err, key);
    if (v < lo || v > hi)
        return fail(err, 400, key, "'%s' must be in [%lld, %lld], not %lld", key, (long long)lo,
                    (long long)hi, (long long)v);
    *out = v;
    return 0;
}

/* An optional string field; absent or null leaves *out. */
static int get_str(const df_json *root, const char *key, const char **out, serve_error *err)
{
    const df_json *j = df_json_get(root, key);
    if (df_json_is_null(j))
        return 0;
    if (df_json_to_string(j, out) != DF_OK)
        return fail_json(err, key);
    return 0;
}

/* `size_field`: the field that carried both (OpenAI's "size"), or NULL for width/height. */
static int check_size(serve_request *r, const serve_limits *lim, const char *size_field,
                      serve_error *err)
{
    const char *names[2] = {"width", "height"};
    if (size_field)
        names[0] = names[1] = size_field;
    int v[2] = {r->width, r->height};
    for (int i = 0; i < 2; i++)
        if (v[i] && v[i] % 16)
            return fail(err, 400, names[i], "'%s': the %s must be a multiple of 16, not %d",
                        names[i], i ? "height" : "width", v[i]);
    if ((int64_t)r->width * r->height > lim->max_pixels)
        return fail(err, 400, names[0],
                    "%dx%d is %lld pixels; this server allows at most %lld "
                    "(--max-pixels)",
                    r->width, r->height, (long long)r->width * r->height,
                    (long long)lim->max_pixels);
    return 0;
}

/* The fields both APIs share under the same names. */
static int parse_common(const df_json *root, serve_request *r, serve_error *err)
{
    const char *prompt = NULL, *neg = NULL;
    int rc = get_str(root, "prompt", &prompt, err);
    if (!rc && !prompt)
        rc = fail(err, 400, "prompt", "'prompt' is required (a string)");
    if (!rc)
        rc = get_str(root, "negative_prompt", &neg, err);
    int64_t steps = 0, seed = -1;
    if (!rc)
        rc = get_int(root, "steps", 1, 1000, &steps, err);
    if (!rc)
        rc = get_int(root, "seed", -1, INT64_MAX, &seed, err);
    if (rc)
        return rc;
    r->prompt = dup_str(prompt);
    r->negative_prompt = neg && neg[0] ? dup_str(neg) : NULL;
    if (!r->prompt || (neg && neg[0] && !r->negative_prompt))
        return fail(err, 500, NULL, "out of memory");
    r->steps = (int)steps;
    r->seed_random = seed < 0;
    r->seed = seed < 0 ? 0 : (uint64_t)seed;
    return 0;
}

static int parse_guidance(const df_json *root, const char *key, serve_request *r, serve_error *err)
{
    const df_json *j = df_json_get(root, key);
    if (df_json_is_null(j))
        return 0;
    double g;
    if (df_json_to_double(j, &g) != DF_OK)
        return fail_json(err, key);
    if (!(g >= 0 && g <= 100))
        return fail(err, 400, key, "'%s' must be in [0, 100], not %g", key, g);
    r->guidance = (float)g;
    r->guidance_set = true;
    return 0;
}

static int parse_root(const char *body, size_t len, df_json **root, serve_error *err)
{
    if (df_json_parse_string(body, len, "request", root) != DF_OK)
        return fail(err, 400, NULL, "the body is not valid JSON: %s", df_error_message());
    if (df_json_type_of(*root) != DF_JSON_OBJECT) {
        df_json_free(*root);
        *root = NULL;
        return fail(err, 400, NULL, "the body must be a JSON object");
    }
    return 0;
}

static bool in_list(const char *name, const char *const *list)
{
    for (int i = 0; list[i]; i++)
        if (!strcasecmp(name, list[i]))
            return true;
    return false;
}

static void list_text(const char *const *list, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; list[i] && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s'%s'", i ? ", " : "", list[i]);
}

static int parse_a1111_fields(const df_json *root, const serve_limits *lim, serve_request *r,
                              serve_error *err)
{
    int rc = parse_common(root, r, err);
    int64_t w = 0, h = 0, batch = 1, iters = 1;
    if (!rc)
        rc = get_int(root, "width", 16, 16384, &w, err);
    if (!rc)
        rc = get_int(root, "height", 16, 16384, &h, err);
    if (!rc)
        rc = get_int(root, "batch_size", 1, SERVE_MAX_IMAGES, &batch, err);
    if (!rc)
        rc = get_int(root, "n_iter", 1, SERVE_MAX_IMAGES, &iters, err);
    if (!rc)
        rc = parse_guidance(root, "cfg_scale", r, err);
    if (rc)
        return rc;
    r->width = (int)w;
    r->height = (int)h;
    if (batch * iters > SERVE_MAX_IMAGES)
        return fail(err, 400, "batch_size", "batch_size x n_iter is %lld images; at most %d",
                    (long long)(batch * iters), SERVE_MAX_IMAGES);
    r->images = (int)(batch * iters);
    if ((rc = check_size(r, lim, NULL, err)))
        return rc;

    const char *sampler = NULL, *scheduler = NULL;
    char names[256];
    if ((rc = get_str(root, "sampler_name", &sampler, err)) ||
        (!sampler && (rc = get_str(root, "sampler_index", &sampler, err))))
        return rc;
    if (sampler && sampler[0] && !in_list(sampler, serve_samplers)) {
        list_text(serve_samplers, names, sizeof names);
        return fail(err, 400, "sampler_name", "unknown sampler_name '%s'; available: %s", sampler,
                    names);
    }
    if ((rc = get_str(root, "scheduler", &scheduler, err)))
        return rc;
    if (scheduler && scheduler[0] && !in_list(scheduler, serve_schedulers)) {
        list_text(serve_schedulers, names, sizeof names);
        return fail(err, 400, "scheduler", "unknown scheduler '%s'; available: %s", scheduler,
                    names);
    }
    const df_json *hr = df_json_get(root, "enable_hr");
    if (df_json_type_of(hr) == DF_JSON_BOOL && df_json_bool(hr))
        return fail(err, 400, "enable_hr", "'enable_hr' (hires fix) is not supported");

    const df_json *ov = df_json_get(root, "override_settings");
    if (!df_json_is_null(ov)) {
        if (df_json_type_of(ov) != DF_JSON_OBJECT)
            return fail(err, 400, "override_settings", "'override_settings' must be an object");
        const char *ckpt = NULL;
        if ((rc = get_str(ov, "sd_model_checkpoint", &ckpt, err)))
            return rc;
        if (ckpt && ckpt[0] && !(r->model = dup_str(ckpt)))
            return fail(err, 500, NULL, "out of memory");
    }
    return 0;
}

int serve_parse_a1111(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                      serve_error *err)
{
    memset(out, 0, sizeof *out);
    df_json *root;
    int rc = parse_root(body, len, &root, err);
    if (rc)
        return rc;
    rc = parse_a1111_fields(root, lim, out, err);
    df_json_free(root);
    if (rc)
        serve_request_deinit(out);
    return rc;
}

static int parse_openai_fields(const df_json *root, const serve_limits *lim, serve_request *r,
                               serve_error *err)
{
    int rc = parse_common(root, r, err);
    int64_t n = 1;
    if (!rc)
        rc = get_int(root, "n", 1, SERVE_MAX_IMAGES, &n, err);
    if (!rc)
        rc = parse_guidance(root, "guidance", r, err);
    if (!rc && !r->guidance_set)
        rc = parse_guidance(root, "guidance_scale", r, err);
    if (rc)
        return rc;
    r->images = (int)n;

    const char *size = NULL, *format = NULL, *model = NULL;
    if ((rc = get_str(root, "size", &size, err)))
        return rc;
    if (size && strcmp(size, "auto") != 0) {
        int w, h, used = 0;
        if (sscanf(size, "%5dx%5d%n", &w, &h, &used) != 2 || size[used] || w < 16 || h < 16)
            return fail(err, 400, "size",
                        "'size' must be \"WIDTHxHEIGHT\" (e.g. \"1024x1024\") "
                        "or \"auto\", not \"%.64s\"",
                        size);
        r->width = w;
        r->height = h;
        if ((rc = check_size(r, lim, "size", err)))
            return rc;
    }
    if ((rc = get_str(root, "response_format", &format, err)))
        return rc;
    if (format && strcmp(format, "b64_json") && strcmp(format, "url"))
        return fail(err, 400, "response_format",
                    "'response_format' must be \"b64_json\" or \"url\", not \"%.64s\"", format);
    r->want_url = format && !strcmp(format, "url");
    if ((rc = get_str(root, "model", &model, err)))
        return rc;
    if (model && model[0] && !(r->model = dup_str(model)))
        return fail(err, 500, NULL, "out of memory");
    return 0;
}

int serve_parse_openai(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                       serve_error *err)
{
    memset(out, 0, sizeof *out);
    df_json *root;
    int rc = parse_root(body, len, &root, err);
    if (rc)
        return rc;
    rc = parse_openai_fields(root, lim, out, err);
    df_json_free(root);
    if (rc)
        serve_request_deinit(out);
    return rc;
}

/* ---- text buffers ---------------------------------------------------------------- */

static bool reserve(serve_buf *b, size_t more)
{
    if (b->failed)
        return false;
    if (b->len + more + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) {
        if (cap > SIZE_MAX / 2) {
            b->failed = true;
            return false;
        }
        cap *= 2;
    }
    char *d = realloc(b->data, cap);
    if (!d) {
        b->failed = true;
        return false;
    }
    b->data = d;
    b->cap = cap;
    return true;
}

void serve_buf_put(serve_buf *b, const char *s, size_t n)
{
    if (!reserve(b, n))
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void serve_buf_puts(serve_buf *b, const char *s)
{
    serve_buf_put(b, s, strlen(s));
}

void serve_buf_printf(serve_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || !reserve(b, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void serve_buf_json_str(serve_buf *b, const char *s)
{
    serve_buf_put(b, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        char esc[8];
        switch (*p) {
        case '"':
            serve_buf_put(b, "\\\"", 2);
            break;
        case '\\':
            serve_buf_put(b, "\\\\", 2);
            break;
        case '\n':
            serve_buf_put(b, "\\n", 2);
            break;
        case '\r':
            serve_buf_put(b, "\\r", 2);
            break;
        case '\t':
            serve_buf_put(b, "\\t", 2);
            break;
        default:
            if (*p < 0x20) {
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                serve_buf_put(b, esc, 6);
            } else {
                serve_buf_put(b, (const char *)p, 1);
            }
        }
    }
    serve_buf_put(b, "\"", 1);
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

void serve_buf_base64(serve_buf *b, const void *data, size_t n)
{
    if (!reserve(b, (n + 2) / 3 * 4))
        return;
    const uint8_t *s = data;
    char *o = b->data + b->len;
    size_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
        *o++ = b64[v >> 18];
        *o++ = b64[(v >> 12) & 63];
        *o++ = b64[(v >> 6) & 63];
        *o++ = b64[v & 63];
    }
    if (i < n) {
        uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0);
        *o++ = b64[v >> 18];
        *o++ = b64[(v >> 12) & 63];
        *o++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        *o++ = '=';
    }
    b->len = (size_t)(o - b->data);
    b->data[b->len] = '\0';
}

int64_t serve_base64_decode(const char *s, size_t n, uint8_t *out)
{
    while (n > 0 && s[n - 1] == '=')
        n--;
    if (n % 4 == 1)
        return -1;
    int64_t len = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        const char *p = s[i] ? strchr(b64, s[i]) : NULL;
        if (!p)
            return -1;
        acc = acc << 6 | (uint32_t)(p - b64);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[len++] = (uint8_t)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    return len;
}

void serve_buf_free(serve_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}
