/*
 * Fuzz target: request bodies as diffuse serve reads them (tools/diffuse/serve_request.c,
 * compiled in here: the server is a program, not part of the library).
 *
 * The input goes through the AUTOMATIC1111 and the OpenAI parser with a small pixel limit.
 * Nothing may crash, leak or read out of bounds; a parse that succeeds must give a request
 * the server can run (a prompt, a count in range, sizes that are multiples of 16 within the
 * limit), and a failure must name a status and a message. The answer text is exercised too:
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
        r->height % 16 || (int64_t)r->width * r->height > lim->max_pixels || r->steps < 0)
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const serve_limits lim = {.max_pixels = 512 * 512};
    serve_request r;
    serve_error e;
    int (*parsers[2])(const char *, size_t, const serve_limits *, serve_request *,
                      serve_error *) = {serve_parse_a1111, serve_parse_openai};
    for (int i = 0; i < 2; i++) {
        int st = parsers[i]((const char *)data, size, &lim, &r, &e);
        if (st == 0) {
            check_request(&r, &lim);
            serve_request_deinit(&r);
        } else if ((st != 400 && st != 500) || !e.message[0]) {
            abort();
        }
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
