/*
 * Workload "tokenizer": tokens per second of the CLIP BPE and T5 unigram tokenizers on the
 * golden cases' vocabularies (tok-clip-l-77/tokenizer, tok-t5-512/tokenizer_2).
 *
 * Two shapes per tokenizer, one thread (encoding is single-threaded; a tokenizer may be
 * shared by threads, each encoding its own prompt):
 *   short  the pipelines' case: a set of typical prompts (10 to 60 words, some accents and
 *          CJK), each padded and truncated to the tokenizer's max length (77 / 512);
 *   long   one prompt of about 20 000 bytes without truncation (BPE on long words, Viterbi on a
 *          long text).
 * Each shape runs for about a second (0.2 s with --quick) after one warm-up call; tokens/s
 * counts the ids the text produced (special tokens included, padding not).
 *
 * The golden folder is the first of: the workload argument, $DF_GOLDEN_DIR,
 * tests/golden, ../tests/golden (relative to the working directory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench.h"

static const char *const prompts[] = {
    "a photo of a cat sitting on a wooden table, soft light, high detail",
    "An astronaut riding a horse on the moon, cinematic lighting, 4K, trending on ArtStation",
    "a watercolor painting of a lighthouse at sunset with seagulls flying over the ocean",
    "portrait of an old man with a long white beard, oil painting, dramatic shadows",
    "a futuristic city skyline at night, neon lights, rain, reflections on the street, "
    "flying cars between the towers, a giant holographic koi fish above the main avenue",
    "a bowl of fresh fruit: apples, oranges, bananas and grapes, still life photograph",
    "Café crème brûlée, naïve façade — Ünïcödé, Zürich, São Paulo, déjà vu",
    "東京の夜景 and a 🐱 emoji, 一只可爱的猫 在 窗边",
    "A sign that says \"Hello, World!\" -- it's 100% real; price: $3.50 (cheap)...",
    "a medieval castle on a hill surrounded by a misty forest, fantasy illustration, "
    "highly detailed, volumetric light, epic composition, matte painting, artstation, "
    "concept art by a famous illustrator, golden hour, 8k resolution, ultra realistic",
};

static const char *find_golden(const bench_opts *o, char *buf, size_t cap)
{
    const char *cands[4] = {o->argc > 0 ? o->argv[0] : NULL, getenv("DF_GOLDEN_DIR"),
                            "tests/golden", "../tests/golden"};
    for (int i = 0; i < 4; i++) {
        struct stat st;
        if (!cands[i])
            continue;
        snprintf(buf, cap, "%s/tok-clip-l-77/tokenizer", cands[i]);
        if (stat(buf, &st) == 0 && S_ISDIR(st.st_mode)) {
            snprintf(buf, cap, "%s", cands[i]);
            return buf;
        }
    }
    return NULL;
}

/* Encodes `texts` round-robin for about `seconds`; returns calls made, ids made, seconds. */
static int run(const df_tokenizer *tok, const char *const *texts, int ntexts,
               const df_tokenize_opts *opts, double seconds, int64_t *calls, int64_t *ids,
               double *elapsed)
{
    df_tokens t;
    if (df_tokenizer_encode(tok, texts[0], strlen(texts[0]), opts, &t) != DF_OK) {
        fprintf(stderr, "tokenizer: %s\n", df_error_message());
        return 1;
    }
    df_tokens_deinit(&t);
    *calls = *ids = 0;
    double t0 = bench_now(), now = t0;
    while (now - t0 < seconds) {
        for (int i = 0; i < ntexts; i++) {
            if (df_tokenizer_encode(tok, texts[i], strlen(texts[i]), opts, &t) != DF_OK) {
                fprintf(stderr, "tokenizer: %s\n", df_error_message());
                return 1;
            }
            for (int64_t k = 0; k < t.count; k++)
                *ids += t.attention_mask[k];
            df_tokens_deinit(&t);
            (*calls)++;
        }
        now = bench_now();
    }
    *elapsed = now - t0;
    return 0;
}

static int bench_one(const bench_opts *o, const char *golden, const char *name, const char *sub,
                     const char *long_text)
{
    char dir[2048];
    snprintf(dir, sizeof dir, "%s/%s", golden, sub);
    df_tokenizer *tok;
    if (df_tokenizer_load(dir, &tok) != DF_OK) {
        fprintf(stderr, "tokenizer: %s\n", df_error_message());
        return 1;
    }
    df_tokenizer_info info;
    df_tokenizer_get_info(tok, &info);
    double seconds = o->quick ? 0.2 : 1.0;
    int64_t calls, ids;
    double sec;
    char shape[96], extra[160];

    df_tokenize_opts padded = {.max_length = info.model_max_length, .pad = true, .truncate = true};
    int rc = run(tok, prompts, (int)(sizeof prompts / sizeof *prompts), &padded, seconds, &calls,
                 &ids, &sec);
    if (rc == 0) {
        snprintf(shape, sizeof shape, "%s/short/max%lld", name, (long long)info.model_max_length);
        snprintf(extra, sizeof extra, ",\"tokens_per_s\":%.0f,\"prompts_per_s\":%.1f",
                 (double)ids / sec, (double)calls / sec);
        bench_report(o, "tokenizer", shape, 1, "-", "-", sec * 1e3 / (double)calls, 0, 0, 0, extra);
    }
    const char *const one[1] = {long_text};
    if (rc == 0)
        rc = run(tok, one, 1, NULL, seconds, &calls, &ids, &sec);
    if (rc == 0) {
        snprintf(shape, sizeof shape, "%s/long/%zubytes", name, strlen(long_text));
        snprintf(extra, sizeof extra, ",\"tokens_per_s\":%.0f,\"ids_per_call\":%lld",
                 (double)ids / sec, (long long)(ids / (calls ? calls : 1)));
        bench_report(o, "tokenizer", shape, 1, "-", "-", sec * 1e3 / (double)calls, 0, 0, 0, extra);
    }
    df_tokenizer_free(tok);
    return rc;
}

int bench_tokenizer(const bench_opts *o)
{
    char golden[1024];
    if (!find_golden(o, golden, sizeof golden)) {
        fprintf(stderr, "tokenizer: golden cases not found; pass the golden folder as the "
                        "workload's argument or set DF_GOLDEN_DIR\n");
        return 1;
    }
    enum { LONG_CHARS = 20000 };
    char *long_text = malloc(LONG_CHARS + 256);
    if (!long_text)
        return 1;
    size_t len = 0;
    for (int i = 0; len < LONG_CHARS; i++) {
        const char *p = prompts[i % (int)(sizeof prompts / sizeof *prompts)];
        size_t n = strlen(p);
        memcpy(long_text + len, p, n);
        long_text[len + n] = ' ';
        len += n + 1;
    }
    long_text[len] = '\0';
    int rc = bench_one(o, golden, "clip-l", "tok-clip-l-77/tokenizer", long_text);
    if (rc == 0)
        rc = bench_one(o, golden, "t5", "tok-t5-512/tokenizer_2", long_text);
    free(long_text);
    return rc;
}
