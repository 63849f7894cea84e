/*
 * diffuse-bench load: opening and reading a sharded checkpoint.
 *
 *   diffuse-bench load [--size 2G] [--shards 4] [--dir /tmp]      (--quick: 64 MB)
 *
 * Writes a checkpoint of random bf16 weights (pairs of [rows, 2048] weights and [2048]
 * biases, like a transformer's linears) as N shards plus a *.safetensors.index.json into a
 * temporary folder, then measures:
 *   open-cold  df_weights_open after the files were dropped from the page cache
 *   open-warm  the same with the headers cached (goal: under 10 ms per GB, data untouched)
 *   read-cold  df_weights_read of every tensor as stored, from the disk (this fills the
 *              page cache for the rest)
 *   memcpy     mmap each shard and memcpy all of it: the page-cache copy rate, the ceiling
 *   read       df_weights_read of every tensor as stored
 *   read-f32   df_weights_read of every tensor converted to f32
 * Reads copy into one reused buffer, so memory stays at one tensor. Each measurement opens
 * the files afresh, so page faults are counted the same way as in the memcpy baseline; the
 * warm measurements report the best of 3 runs (1 with --quick). The folder is removed at
 * the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

#define COLS 2048

typedef struct plan {
    uint64_t total;     /* bytes of tensor data wanted */
    int shards;
    int64_t rows;       /* rows of each weight */
    int layers;         /* weight + bias pairs */
    char dir[512];
} plan;

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t next_random(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Random bf16 values of moderate magnitude (no NaN or infinity). */
static void fill_random(uint16_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 4) {
        uint64_t r = next_random();
        for (size_t k = 0; k < 4 && i + k < n; k++)
            p[i + k] = (uint16_t)(((r >> (16 * k)) & 0x807f) | 0x3c00);
    }
}

static bool parse_size(const char *s, uint64_t *out)
{
    char *end;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end == 'G' || *end == 'g')
        mul = 1 << 30;
    else if (*end == 'M' || *end == 'm')
        mul = 1 << 20;
    else if (*end == 'K' || *end == 'k')
        mul = 1 << 10;
    if (!(v > 0) || end == s)
        return false;
    *out = (uint64_t)(v * mul);
    return true;
}

static int shard_of_layer(const plan *p, int layer)
{
    return (int)((int64_t)layer * p->shards / p->layers);
}

/* Writes shard s: its header (padded to 8 bytes), then each layer's weight and bias. */
static int write_shard(const plan *p, int s, uint16_t *buf)
{
    size_t wbytes = (size_t)p->rows * COLS * 2, bbytes = COLS * 2;
    size_t cap = 4096 + (size_t)p->layers * 256, n = 0;
    char *h = malloc(cap);
    if (!h)
        return -1;
    uint64_t off = 0;
    n += (size_t)snprintf(h + n, cap - n, "{\"__metadata__\":{\"format\":\"pt\"}");
    for (int l = 0; l < p->layers; l++) {
        if (shard_of_layer(p, l) != s)
            continue;
        n += (size_t)snprintf(h + n, cap - n,
                              ",\"layers.%d.weight\":{\"dtype\":\"BF16\",\"shape\":[%lld,%d],"
                              "\"data_offsets\":[%llu,%llu]}",
                              l, (long long)p->rows, COLS, (unsigned long long)off,
                              (unsigned long long)(off + wbytes));
        off += wbytes;
        n += (size_t)snprintf(h + n, cap - n,
                              ",\"layers.%d.bias\":{\"dtype\":\"BF16\",\"shape\":[%d],"
                              "\"data_offsets\":[%llu,%llu]}",
                              l, COLS, (unsigned long long)off,
                              (unsigned long long)(off + bbytes));
        off += bbytes;
    }
    n += (size_t)snprintf(h + n, cap - n, "}");
    while (n % 8)
        h[n++] = ' ';
    char path[700];
    snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", p->dir, s + 1, p->shards);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    uint8_t len[8];
    for (int i = 0; i < 8; i++)
        len[i] = (uint8_t)((uint64_t)n >> (8 * i));
    bool ok = fd >= 0 && write(fd, len, 8) == 8 && write(fd, h, n) == (ssize_t)n;
    for (int l = 0; ok && l < p->layers; l++) {
        if (shard_of_layer(p, l) != s)
            continue;
        fill_random(buf, wbytes / 2 + COLS);
        ok = write(fd, buf, wbytes) == (ssize_t)wbytes &&
             write(fd, buf + wbytes / 2, bbytes) == (ssize_t)bbytes;
    }
    ok = ok && fsync(fd) == 0;
    if (fd >= 0)
        close(fd);
    free(h);
    if (!ok)
        fprintf(stderr, "load: cannot write %s: %s\n", path, strerror(errno));
    return ok ? 0 : -1;
}

static int write_index(const plan *p)
{
    char path[700];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", p->dir);
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fprintf(f, "{\"metadata\": {\"total_size\": %llu}, \"weight_map\": {",
            (unsigned long long)p->total);
    for (int l = 0; l < p->layers; l++) {
        int s = shard_of_layer(p, l) + 1;
        fprintf(f, "%s\n  \"layers.%d.weight\": \"model-%05d-of-%05d.safetensors\",\n"
                   "  \"layers.%d.bias\": \"model-%05d-of-%05d.safetensors\"",
                l ? "," : "", l, s, p->shards, l, s, p->shards);
    }
    fprintf(f, "\n}}\n");
    return fclose(f) == 0 ? 0 : -1;
}

/* Drops the shards from the page cache (clean pages only; they were fsynced). */
static void evict(const plan *p)
{
    for (int s = 0; s < p->shards; s++) {
        char path[700];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", p->dir, s + 1,
                 p->shards);
        int fd = open(path, O_RDONLY);
        if (fd >= 0) {
            posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
}

static void report(const bench_opts *o, const plan *p, const char *mode, const char *dtype,
                   double sec, bool rate)
{
    char shape[64], extra[160];
    double gb = (double)p->total / 1e9;
    snprintf(shape, sizeof shape, "%.2fGB/%dshards/%dtensors", gb, p->shards, 2 * p->layers);
    if (rate)
        snprintf(extra, sizeof extra, ",\"gb_per_s\":%.3f", gb / sec);
    else
        snprintf(extra, sizeof extra, ",\"ms_per_gb\":%.4f", sec * 1e3 / gb);
    bench_report(o, "load", shape, 1, dtype, mode, sec * 1e3, 0, 0, 0, extra);
}

static double time_open(const plan *p, const char *index)
{
    double t0 = bench_now();
    df_weights *w;
    if (df_weights_open(index, &w) != DF_OK) {
        fprintf(stderr, "load: %s\n", df_error_message());
        return -1;
    }
    double t = bench_now() - t0;
    df_weights_free(w);
    return t;
}

/* Maps each shard and copies all of it into buf (cap bytes at a time). */
static double time_memcpy(const plan *p, void *buf, size_t cap)
{
    double t0 = bench_now();
    for (int s = 0; s < p->shards; s++) {
        char path[700];
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", p->dir, s + 1,
                 p->shards);
        int fd = open(path, O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0)
            return -1;
        void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        close(fd);
        if (m == MAP_FAILED)
            return -1;
        for (size_t off = 0; off < (size_t)sb.st_size; off += cap) {
            size_t n = (size_t)sb.st_size - off < cap ? (size_t)sb.st_size - off : cap;
            memcpy(buf, (const char *)m + off, n);
        }
        munmap(m, (size_t)sb.st_size);
    }
    return bench_now() - t0;
}

/* Reads every tensor as `as` into buf. */
static double time_read(const char *index, df_dtype as, void *buf, size_t cap)
{
    df_weights *w;
    double t0 = bench_now();
    if (df_weights_open(index, &w) != DF_OK)
        return -1;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info t;
        if (df_weights_at(w, i, &t) != DF_OK ||
            df_weights_read(w, t.name, as == DF_DTYPE_COUNT ? t.dtype : as, buf, cap) != DF_OK) {
            fprintf(stderr, "load: %s\n", df_error_message());
            df_weights_free(w);
            return -1;
        }
    }
    df_weights_free(w); /* unmapping is part of the cost, as in the memcpy baseline */
    return bench_now() - t0;
}

/* The smaller of two times, where a negative time is a failure that sticks. */
static double best(double a, double b)
{
    if (b < 0 || a == -2)
        return -2;
    return a < 0 || b < a ? b : a;
}

static int run(const bench_opts *o, plan *p)
{
    size_t wbytes = (size_t)p->rows * COLS * 2;
    size_t cap = 2 * wbytes + 4 * COLS; /* one weight as f32 */
    uint16_t *buf = malloc(cap);
    if (!buf)
        return 1;
    printf("load: writing %.2f GB in %d shards (%d tensors) to %s\n", (double)p->total / 1e9,
           p->shards, 2 * p->layers, p->dir);
    int rc = 0;
    for (int s = 0; s < p->shards && rc == 0; s++)
        rc = write_shard(p, s, buf);
    if (rc == 0)
        rc = write_index(p);
    char index[700];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", p->dir);
    if (rc == 0) {
        evict(p);
        double cold = time_open(p, index), warm = time_open(p, index);
        double rcold = time_read(index, DF_DTYPE_COUNT, buf, cap); /* fills the page cache */
        double mc = -1, rd = -1, f32 = -1; /* the best of the repeats */
        for (int r = 0; r < (o->quick ? 1 : 3); r++) {
            mc = best(mc, time_memcpy(p, buf, wbytes)); /* chunks as large as a weight */
            rd = best(rd, time_read(index, DF_DTYPE_COUNT, buf, cap));
            f32 = best(f32, time_read(index, DF_DTYPE_F32, buf, cap));
        }
        rc = cold < 0 || warm < 0 || rcold < 0 || mc < 0 || rd < 0 || f32 < 0;
        if (rc == 0) {
            report(o, p, "open-cold", "bf16", cold, false);
            report(o, p, "open-warm", "bf16", warm, false);
            report(o, p, "read-cold", "bf16", rcold, true);
            report(o, p, "memcpy", "bf16", mc, true);
            report(o, p, "read", "bf16", rd, true);
            report(o, p, "read-f32", "f32", f32, true);
        }
    }
    free(buf);
    return rc;
}

static void cleanup(const plan *p)
{
    char path[700];
    for (int s = 0; s < p->shards; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", p->dir, s + 1,
                 p->shards);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", p->dir);
    unlink(path);
    rmdir(p->dir);
}

int bench_load(const bench_opts *o)
{
    plan p = {.total = o->quick ? (uint64_t)64 << 20 : (uint64_t)2 << 30, .shards = 4};
    const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    for (int i = 0; i < o->argc; i++) {
        const char *a = o->argv[i], *v = i + 1 < o->argc ? o->argv[i + 1] : NULL;
        if (strcmp(a, "--size") == 0 && v && parse_size(v, &p.total)) {
            i++;
        } else if (strcmp(a, "--shards") == 0 && v && atoi(v) > 0 && atoi(v) <= 1000) {
            p.shards = atoi(v);
            i++;
        } else if (strcmp(a, "--dir") == 0 && v) {
            base = v;
            i++;
        } else if (parse_size(a, &p.total)) {
            /* a bare size */
        } else {
            fprintf(stderr, "load: usage: load [--size 2G] [--shards 4] [--dir DIR]\n");
            return 2;
        }
    }
    /* Weights of at most 8 MB, and at least 16 per shard so headers look like real ones. */
    uint64_t target = p.total / ((uint64_t)p.shards * 16);
    if (target > (8u << 20))
        target = 8u << 20;
    p.rows = (int64_t)(target / (COLS * 2));
    if (p.rows < 1)
        p.rows = 1;
    p.layers = (int)(p.total / ((uint64_t)p.rows * COLS * 2 + COLS * 2));
    if (p.layers < p.shards)
        p.layers = p.shards;
    p.total = (uint64_t)p.layers * ((uint64_t)p.rows * COLS * 2 + COLS * 2);
    snprintf(p.dir, sizeof p.dir, "%s/diffuse-bench-load-XXXXXX", base);
    if (!mkdtemp(p.dir)) {
        fprintf(stderr, "load: cannot make a folder under %s: %s\n", base, strerror(errno));
        return 1;
    }
    int rc = run(o, &p);
    cleanup(&p);
    return rc;
}
