/*
 * Random bf16 checkpoints for the encoder workloads (bench_t5.c, bench_decoder_lm.c), and the
 * model folders that hold them (model.safetensors beside config.json) in a temporary folder.
 *
 * The file is written streaming: the header first, then each tensor generated and written
 * in chunks, so the weights of a full-width layer (hundreds of MB) never sit in memory at
 * once. Values are uniform in [-scale, scale) from one xorshift stream, reproducible from
 * run to run; a scale of 0 gives ones (norm weights).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int write_values(FILE *f, const bench_weight *w, uint64_t *rng)
{
    const int64_t n = w->rows * (w->cols ? w->cols : 1);
    uint16_t buf[8192];
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < 8192 ? n - done : 8192;
        for (int64_t i = 0; i < k; i++) {
            float u = (float)(next_random(rng) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
            buf[i] = df_f32_to_bf16(w->scale > 0 ? (2 * u - 1) * w->scale : 1.0f);
        }
        if (fwrite(buf, sizeof *buf, (size_t)k, f) != (size_t)k)
            return 1;
        done += k;
    }
    return 0;
}

/* The header's JSON: every tensor BF16, in list order. NULL when out of memory. */
static char *header_json(const bench_weight *w, int n, size_t *len_out)
{
    size_t cap = 64 + 256 * (size_t)n, len = 0;
    char *h = malloc(cap);
    if (!h)
        return NULL;
    uint64_t off = 0;
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 2 * (uint64_t)w[i].rows * (uint64_t)(w[i].cols ? w[i].cols : 1);
        char shape[64];
        if (w[i].cols)
            snprintf(shape, sizeof shape, "%" PRId64 ",%" PRId64, w[i].rows, w[i].cols);
        else
            snprintf(shape, sizeof shape, "%" PRId64, w[i].rows);
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],"
                                "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                i ? "," : "", w[i].name, shape, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8 && len < cap)
        h[len++] = ' ';
    *len_out = len;
    return h;
}

int bench_write_checkpoint(const char *path, const bench_weight *w, int n)
{
    size_t len = 0;
    char *h = header_json(w, n, &len);
    FILE *f = h ? fopen(path, "wb") : NULL;
    int bad = !f;
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    bad = bad || fwrite(hl, 1, 8, f) != 8 || fwrite(h, 1, len, f) != len;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; !bad && i < n; i++)
        bad = write_values(f, &w[i], &rng);
    if (f && fclose(f) != 0)
        bad = 1;
    free(h);
    return bad;
}

int bench_write_model(const char *dir, const bench_weight *w, int n, const char *config)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    int bad = bench_write_checkpoint(path, w, n);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = bad ? NULL : fopen(path, "w");
    if (!f)
        return 1;
    bad = fputs(config, f) < 0;
    return fclose(f) != 0 || bad;
}

void bench_remove_model(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int bench_temp_dir(const char *workload, char *dir, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, cap, "%s/diffuse-bench-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", workload);
    if (mkdtemp(dir))
        return 0;
    fprintf(stderr, "%s: cannot create a folder from %s\n", workload, dir);
    return 1;
}
