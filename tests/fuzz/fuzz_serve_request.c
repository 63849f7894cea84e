/*
 * Fuzz target: request bodies as diffuse serve reads them (tools/diffuse/serve_request.c,
 * compiled in here: the server is a program, not part of the library).
 *
 * The input goes through the AUTOMATIC1111 txt2img and img2img parsers and the OpenAI parser
 * with a small pixel limit, and, read as a form (parts split at "\n--\n", each a name line,
 * "@name" for a file, then its bytes), through the /v1/images/edits parser. Nothing may
 * crash, leak or read out of bounds; a parse that succeeds must give a request the server
 * can run (a prompt, a count in range, sizes that are multiples of 16 within the limit,
 * decoded pictures within the limit, a mask of the first picture's size), and a failure
 * must name a status and a message. The answer text is exercised too:
 * the prompt is written as a JSON string and as base64, which must decode back to itself.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/diffuse/serve_request.c"

static void check_request(const serve_request *r, const serve_limits *lim)
{
    if (!r->prompt || r->images < 1 || r->images > SERVE_MAX_IMAGES || r->width % 16 ||
        r->height % 16 || (int64_t)r->width * r->height > lim->max_pixels || r->steps < 0 ||
        r->n_inputs < 0 || r->n_inputs > SERVE_MAX_INPUT_IMAGES || r->strength < 0 ||
        r->strength > 1 || (r->mask && !r->n_inputs))
        abort();
    for (int i = 0; i < r->n_inputs; i++)
        if (!r->inputs[i] || (int64_t)r->inputs[i]->width * r->inputs[i]->height > lim->max_pixels)
            abort();
    if (r->mask &&
        (r->mask->width != r->inputs[0]->width || r->mask->height != r->inputs[0]->height))
        abort();
    serve_buf b = {0};
    serve_buf_json_str(&b, r->prompt);
    size_t n = strlen(r->prompt);
    serve_buf_base64(&b, r->prompt, n);
    uint8_t *back = malloc(n / 3 * 3 + 8);
    const char *coded = b.data + b.len - (n + 2) / 3 * 4;
    if (back && !b.failed &&
        (serve_base64_decode(coded, (n + 2) / 3 * 4, back) != (int64_t)n ||
         memcmp(back, r->prompt, n) != 0))
        abort();
    free(back);
    serve_buf_free(&b);
}

static void check_result(int st, serve_request *r, const serve_error *e, const serve_limits *lim)
{
    if (st == 0) {
        check_request(r, lim);
        serve_request_deinit(r);
    } else if ((st != 400 && st != 500) || !e->message[0]) {
        abort();
    }
}

/* The input as a form, as serve_http.c's post processor would hand it over. */
static void read_form(const uint8_t *data, size_t size, serve_form *f)
{
    memset(f, 0, sizeof *f);
    const char *p = (const char *)data, *end = p + size;
    while (p < end) {
        const char *sep = memmem(p, (size_t)(end - p), "\n--\n", 4);
        const char *stop = sep ? sep : end;
        const char *nl = memchr(p, '\n', (size_t)(stop - p));
        const char *name_end = nl ? nl : stop;
        if (f->n == SERVE_MAX_FORM_PARTS) {
            f->too_many = true;
            break;
        }
        serve_form_part *part = &f->parts[f->n++];
        part->is_file = name_end > p && *p == '@';
        const char *name = part->is_file ? p + 1 : p;
        size_t len = (size_t)(name_end - name);
        snprintf(part->name, sizeof part->name, "%.*s", (int)(len < 63 ? len : 63), name);
        if (nl)
            serve_buf_put(&part->data, nl + 1, (size_t)(stop - nl - 1));
        p = sep ? sep + 4 : end;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const serve_limits lim = {.max_pixels = 512 * 512};
    serve_request r;
    serve_error e;
    int (*parsers[3])(const char *, size_t, const serve_limits *, serve_request *,
                      serve_error *) = {serve_parse_a1111, serve_parse_openai,
                                        serve_parse_a1111_img2img};
    for (int i = 0; i < 3; i++)
        check_result(parsers[i]((const char *)data, size, &lim, &r, &e), &r, &e, &lim);
    serve_form form;
    read_form(data, size, &form);
    check_result(serve_parse_openai_edit(&form, &lim, &r, &e), &r, &e, &lim);
    serve_form_free(&form);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
