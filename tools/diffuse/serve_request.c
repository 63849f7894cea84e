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
 * Pictures in (img2img's base64 init_images and mask, the edits form's files) are decoded
 * here with the library's reader (df_image_decode: PNG or JPEG), so that a bad one is a 400
 * naming its field before anything is queued. The edits form's text fields are turned into
 * one JSON object and read by the generations parser, so both routes check them alike.
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
    for (int i = 0; i < r->n_inputs; i++)
        df_image_free(r->inputs[i]);
    df_image_free(r->mask);
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

/* ---- pictures in ------------------------------------------------------------------ */

/* The picture in `field` from its file bytes: PNG or JPEG, no more pixels than the server
 * makes. */
static int decode_picture(const char *field, const void *data, size_t n, const serve_limits *lim,
                          df_image **out, serve_error *err)
{
    if (n == 0)
        return fail(err, 400, field, "'%s' is empty: expected a PNG or JPEG picture", field);
    if (df_image_decode(data, n, field, out) != DF_OK)
        return fail(err, 400, field, "'%s' is not a picture diffuse reads: %s", field,
                    df_error_message());
    int64_t px = (int64_t)(*out)->width * (*out)->height;
    if (px > lim->max_pixels) {
        int w = (*out)->width, h = (*out)->height;
        df_image_free(*out);
        *out = NULL;
        return fail(err, 400, field,
                    "'%s' is %dx%d, %lld pixels; this server takes at most %lld (--max-pixels)",
                    field, w, h, (long long)px, (long long)lim->max_pixels);
    }
    return 0;
}

/* The picture in a base64 string (A1111 sends "data:image/png;base64,..." or bare base64). */
static int decode_picture_b64(const char *field, const char *s, const serve_limits *lim,
                              df_image **out, serve_error *err)
{
    const char *comma = strncmp(s, "data:", 5) == 0 ? strchr(s, ',') : NULL;
    if (comma)
        s = comma + 1;
    size_t n = strlen(s);
    uint8_t *bytes = malloc(n / 4 * 3 + 3);
    if (!bytes)
        return fail(err, 500, NULL, "out of memory");
    int64_t len = serve_base64_decode(s, n, bytes);
    int rc = len < 0 ? fail(err, 400, field, "'%s' is not base64", field)
                     : decode_picture(field, bytes, (size_t)len, lim, out, err);
    free(bytes);
    return rc;
}

/* After the pictures are read: the output size defaults to the first picture's (whose
 * sides must then be multiples of 16), and a mask has the first picture's size. */
static int check_pictures(serve_request *r, const serve_limits *lim, const char *image_field,
                          const char *size_field, serve_error *err)
{
    const df_image *first = r->inputs[0];
    if (!r->width && !r->height && (first->width % 16 || first->height % 16))
        return fail(err, 400, image_field,
                    "'%s' is %dx%d; without a size its sides must be multiples of 16 (give %s)",
                    image_field, first->width, first->height,
                    size_field ? "'size'" : "'width' and 'height'");
    if (!r->width && !r->height) {
        r->width = first->width;
        r->height = first->height;
        int rc = check_size(r, lim, size_field, err);
        if (rc)
            return rc;
    }
    if (r->mask && (r->mask->width != first->width || r->mask->height != first->height))
        return fail(err, 400, "mask", "'mask' is %dx%d but the picture is %dx%d: they must match",
                    r->mask->width, r->mask->height, first->width, first->height);
    return 0;
}

static int parse_strength(const df_json *root, const char *key, serve_request *r, serve_error *err)
{
    const df_json *j = df_json_get(root, key);
    if (df_json_is_null(j))
        return 0;
    double v;
    if (df_json_to_double(j, &v) != DF_OK)
        return fail_json(err, key);
    if (!(v > 0 && v <= 1))
        return fail(err, 400, key, "'%s' must be in (0, 1], not %g", key, v);
    r->strength = v;
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

static int parse_img2img_fields(const df_json *root, const serve_limits *lim, serve_request *r,
                                serve_error *err)
{
    int rc = parse_a1111_fields(root, lim, r, err);
    if (rc)
        return rc;
    const df_json *init = df_json_get(root, "init_images");
    if (df_json_type_of(init) != DF_JSON_ARRAY || df_json_array_size(init) < 1)
        return fail(err, 400, "init_images",
                    "'init_images' is required: a list of base64 PNG or JPEG pictures");
    if (df_json_array_size(init) > SERVE_MAX_INPUT_IMAGES)
        return fail(err, 400, "init_images", "'init_images' holds %d pictures; at most %d",
                    (int)df_json_array_size(init), SERVE_MAX_INPUT_IMAGES);
    for (int i = 0; i < (int)df_json_array_size(init); i++) {
        const char *s;
        if (df_json_to_string(df_json_array_get(init, i), &s) != DF_OK)
            return fail(err, 400, "init_images", "'init_images'[%d] must be a base64 string", i);
        if ((rc = decode_picture_b64("init_images", s, lim, &r->inputs[i], err)))
            return rc;
        r->n_inputs = i + 1;
    }
    r->strength = 0.75; /* A1111's default denoising_strength */
    if ((rc = parse_strength(root, "denoising_strength", r, err)))
        return rc;
    const char *mask = NULL;
    if ((rc = get_str(root, "mask", &mask, err)))
        return rc;
    if (mask && mask[0] && (rc = decode_picture_b64("mask", mask, lim, &r->mask, err)))
        return rc;
    const df_json *full = df_json_get(root, "inpaint_full_res");
    bool only_masked = (df_json_type_of(full) == DF_JSON_BOOL && df_json_bool(full)) ||
                       (df_json_type_of(full) == DF_JSON_NUMBER && df_json_number(full) != 0);
    int64_t padding = 32; /* A1111's default */
    if ((rc = get_int(root, "inpaint_full_res_padding", 0, 4096, &padding, err)))
        return rc;
    r->padding_mask_crop = r->mask && only_masked ? (int)padding : 0;
    return check_pictures(r, lim, "init_images", NULL, err);
}

int serve_parse_a1111_img2img(const char *body, size_t len, const serve_limits *lim,
                              serve_request *out, serve_error *err)
{
    memset(out, 0, sizeof *out);
    df_json *root;
    int rc = parse_root(body, len, &root, err);
    if (rc)
        return rc;
    rc = parse_img2img_fields(root, lim, out, err);
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

/* The form's text fields as one JSON object, so that they go through the generations
 * parser: a numeric field whose value reads whole as a number is a number, anything else a
 * string (whose type error then names the field). */
static const char *const edit_numbers[] = {
    "n", "seed", "steps", "guidance", "guidance_scale", "strength", NULL};

static bool is_number_text(const char *s, size_t n)
{
    if (n == 0 || n > 64)
        return false;
    char tmp[65], *end;
    memcpy(tmp, s, n);
    tmp[n] = '\0';
    strtod(tmp, &end);
    return *end == '\0' && strspn(tmp, "0123456789+-.eE") == n;
}

static const char *const edit_files[] = {"image", "image[]", "mask", NULL};

static int form_to_json(const serve_form *f, serve_buf *json, serve_error *err)
{
    serve_buf_puts(json, "{");
    int fields = 0;
    for (int i = 0; i < f->n; i++) {
        const serve_form_part *p = &f->parts[i];
        if (in_list(p->name, edit_files))
            continue;
        if (p->is_file)
            return fail(err, 400, p->name, "'%s' must be a text field, not a file", p->name);
        for (int k = 0; k < i; k++)
            if (!strcmp(f->parts[k].name, p->name))
                return fail(err, 400, p->name, "'%s' is given twice", p->name);
        const char *v = p->data.data ? p->data.data : "";
        if (memchr(v, '\0', p->data.len))
            return fail(err, 400, p->name, "'%s' holds a NUL byte", p->name);
        serve_buf_puts(json, fields++ ? ", " : "");
        serve_buf_json_str(json, p->name);
        serve_buf_puts(json, ": ");
        if (in_list(p->name, edit_numbers) && is_number_text(v, p->data.len))
            serve_buf_put(json, v, p->data.len);
        else
            serve_buf_json_str(json, v);
    }
    serve_buf_puts(json, "}");
    return json->failed ? fail(err, 500, NULL, "out of memory") : 0;
}

static int parse_edit_fields(const serve_form *f, const df_json *root, const serve_limits *lim,
                             serve_request *r, serve_error *err)
{
    int rc = parse_openai_fields(root, lim, r, err);
    if (!rc)
        rc = parse_strength(root, "strength", r, err);
    for (int i = 0; !rc && i < f->n; i++) {
        const serve_form_part *p = &f->parts[i];
        bool mask = !strcmp(p->name, "mask");
        if (!in_list(p->name, edit_files))
            continue;
        if (mask && r->mask)
            return fail(err, 400, "mask", "'mask' is given twice");
        if (!mask && r->n_inputs == SERVE_MAX_INPUT_IMAGES)
            return fail(err, 400, "image", "more than %d pictures in 'image'",
                        SERVE_MAX_INPUT_IMAGES);
        df_image **slot = mask ? &r->mask : &r->inputs[r->n_inputs];
        rc = decode_picture(mask ? "mask" : "image", p->data.data, p->data.len, lim, slot, err);
        if (!rc && !mask)
            r->n_inputs++;
    }
    if (!rc && r->n_inputs == 0)
        rc = fail(err, 400, "image", "'image' is required: a PNG or JPEG file");
    if (!rc)
        rc = check_pictures(r, lim, "image", "size", err);
    return rc;
}

int serve_parse_openai_edit(const serve_form *form, const serve_limits *lim, serve_request *out,
                            serve_error *err)
{
    memset(out, 0, sizeof *out);
    if (form->too_many)
        return fail(err, 400, NULL, "the form has more than %d parts", SERVE_MAX_FORM_PARTS);
    serve_buf json = {0};
    int rc = form_to_json(form, &json, err);
    df_json *root = NULL;
    if (!rc)
        rc = parse_root(json.data, json.len, &root, err);
    serve_buf_free(&json);
    if (!rc)
        rc = parse_edit_fields(form, root, lim, out, err);
    df_json_free(root);
    if (rc)
        serve_request_deinit(out);
    return rc;
}

void serve_form_free(serve_form *f)
{
    for (int i = 0; i < f->n; i++)
        serve_buf_free(&f->parts[i].data);
    memset(f, 0, sizeof *f);
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
