/*
 * make-tiny's streaming weight writer: each tensor is drawn in f32, converted into the
 * current shard (a df_st_writer, which copies it) and freed, so at most one shard plus one
 * tensor is in memory. A shard is closed when the next tensor would take it past
 * shard_bytes; shards are written as BASE.shard-N.tmp and renamed once their count is
 * known, and for more than one the index (metadata.total_size, weight_map) is written in
 * the layout save_pretrained gives it. One shard's file is byte for byte what a single
 * df_st_writer would have written.
 *
 * Drawing normals costs far more than writing them: a tensor of more than BIG_TENSOR
 * elements (only full-size models have them) repeats one draw of PERIOD values, a count
 * no row length divides (so rows differ by a shift), and a full-size model is written at
 * about disk speed. Smaller tensors, every tiny model's, are drawn whole.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "make_tiny_writer.h"

int tw_make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "diffuse make-tiny: cannot create %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int tw_write_file(const char *dir, const char *name, const char *text)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    bool ok = f && fputs(text, f) >= 0;
    if (f && fclose(f) != 0)
        ok = false;
    if (!ok) {
        fprintf(stderr, "diffuse make-tiny: cannot write %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

/* Shard i of n (n 0: its temporary name before the count is known). */
static void shard_path(const tiny_writer *w, int i, int n, char *buf, size_t cap)
{
    if (n == 0)
        snprintf(buf, cap, "%s/%s.shard-%d.tmp", w->dir, w->base, i);
    else if (n == 1)
        snprintf(buf, cap, "%s/%s.safetensors", w->dir, w->base);
    else
        snprintf(buf, cap, "%s/%s-%05d-of-%05d.safetensors", w->dir, w->base, i + 1, n);
}

static void flush_shard(tiny_writer *w)
{
    if (w->s != DF_OK || !w->w || w->in_shard == 0)
        return;
    char path[4400];
    shard_path(w, w->shards, 0, path, sizeof path);
    w->s = df_st_writer_finish(w->w, path);
    df_st_writer_free(w->w);
    w->w = NULL;
    w->shards++;
    w->in_shard = 0;
}

static void note_name(tiny_writer *w, const char *name)
{
    size_t need = strlen(name) + 32;
    if (w->map_len + need > w->map_cap) {
        size_t cap = (w->map_cap + need) * 2;
        char *m = realloc(w->map, cap);
        if (!m) {
            w->s = DF_E_OOM;
            return;
        }
        w->map = m;
        w->map_cap = cap;
    }
    w->map_len += (size_t)sprintf(w->map + w->map_len, "%s\n%d\n", name, w->shards);
}

int tw_begin(tiny_writer *w, const char *dir, const char *base, df_dtype dtype, df_rng *rng,
             uint64_t seed, int64_t shard_bytes)
{
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->base, sizeof w->base, "%s", base);
    df_rng_init(&w->own, seed);
    w->rng = rng ? rng : &w->own;
    w->dtype = dtype;
    w->shard_bytes = shard_bytes > 0 ? shard_bytes : TINY_SHARD_BYTES;
    return tw_make_dir(w->dir);
}

/* Makes room for `n` elements in the current shard (a new one past shard_bytes). */
static void reserve(tiny_writer *w, const char *name, int64_t n)
{
    int64_t bytes = n * (int64_t)df_dtype_size(w->dtype);
    if (w->in_shard > 0 && w->in_shard + bytes > w->shard_bytes)
        flush_shard(w);
    if (w->s == DF_OK && !w->w)
        w->s = df_st_writer_create(&w->w);
    if (w->s == DF_OK)
        note_name(w, name);
    w->in_shard += bytes;
    w->total += bytes;
}

void tw_add_values(tiny_writer *w, const char *name, const int64_t *shape, int ndim,
                   const float *v)
{
    if (w->s != DF_OK)
        return;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    reserve(w, name, n);
    if (w->s == DF_OK)
        w->s = df_st_writer_add_f32(w->w, name, w->dtype, shape, ndim, v);
}

enum { BIG_TENSOR = 1 << 22, PERIOD = 65521 /* prime */ };

void tw_add(tiny_writer *w, const char *name, const int64_t *shape, int ndim, float std,
            float mean)
{
    if (w->s != DF_OK)
        return;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        fprintf(stderr, "diffuse make-tiny: out of memory for '%s'\n", name);
        w->s = DF_E_OOM;
        return;
    }
    if (std > 0 && n > BIG_TENSOR) {
        df_rng_randn_f32(w->rng, v, PERIOD);
        for (int64_t i = PERIOD; i < n; i += PERIOD)
            memcpy(v + i, v, (size_t)(n - i < PERIOD ? n - i : PERIOD) * sizeof *v);
    } else if (std > 0) {
        df_rng_randn_f32(w->rng, v, n);
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = std > 0 ? mean + std * v[i] : mean;
    tw_add_values(w, name, shape, ndim, v);
    free(v);
}

void tw_linear(tiny_writer *w, const char *name, int64_t out, int64_t in, bool bias)
{
    char n[512];
    snprintf(n, sizeof n, "%s.weight", name);
    tw_add(w, n, SH(out, in), 1.0f / sqrtf((float)in), 0);
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", name);
        tw_add(w, n, SH(out), 0.02f, 0);
    }
}

void tw_norm(tiny_writer *w, const char *name, int64_t dim, bool bias)
{
    char n[512];
    snprintf(n, sizeof n, "%s.weight", name);
    tw_add(w, n, SH(dim), 0.05f, 1.0f);
    if (bias) {
        snprintf(n, sizeof n, "%s.bias", name);
        tw_add(w, n, SH(dim), 0.02f, 0);
    }
}

void tw_conv(tiny_writer *w, const char *name, int64_t out, int64_t in, int64_t k)
{
    char n[512];
    snprintf(n, sizeof n, "%s.weight", name);
    tw_add(w, n, SH(out, in, k, k), 1.0f / sqrtf((float)(in * k * k)), 0);
    snprintf(n, sizeof n, "%s.bias", name);
    tw_add(w, n, SH(out), 0.02f, 0);
}

/* BASE.safetensors.index.json for w->shards > 1 files. */
static void write_index(tiny_writer *w)
{
    /* each entry: its name (in the map) and a shard file name of under 64 bytes */
    size_t cap = w->map_len * 3 + 96 * (size_t)(w->map_len / 8 + 1) + 256;
    char *idx = malloc(cap), to[4400];
    if (!idx) {
        w->s = DF_E_OOM;
        return;
    }
    size_t len = (size_t)snprintf(idx, cap, "{\n  \"metadata\": {\"total_size\": %lld},\n"
                                  "  \"weight_map\": {", (long long)w->total);
    bool first = true;
    for (char *line = strtok(w->map, "\n"); line; line = strtok(NULL, "\n")) {
        char *shard = strtok(NULL, "\n");
        shard_path(w, atoi(shard), w->shards, to, sizeof to);
        len += (size_t)snprintf(idx + len, cap - len, "%s\n    \"%s\": \"%s\"",
                                first ? "" : ",", line, strrchr(to, '/') + 1);
        first = false;
    }
    if (len + 8 > cap) { /* cannot happen with the bound above */
        fprintf(stderr, "diffuse make-tiny: the shard index outgrew its buffer\n");
        w->s = DF_E_INTERNAL;
    }
    snprintf(idx + len, cap - len, "\n  }\n}\n");
    char name[128];
    snprintf(name, sizeof name, "%s.safetensors.index.json", w->base);
    if (w->s == DF_OK && tw_write_file(w->dir, name, idx))
        w->s = DF_E_IO;
    free(idx);
}

int tw_finish(tiny_writer *w)
{
    flush_shard(w);
    df_st_writer_free(w->w);
    w->w = NULL;
    char from[4400], to[4400];
    for (int i = 0; w->s == DF_OK && i < w->shards; i++) {
        shard_path(w, i, 0, from, sizeof from);
        shard_path(w, i, w->shards, to, sizeof to);
        if (rename(from, to) != 0) {
            fprintf(stderr, "diffuse make-tiny: cannot rename %s to %s: %s\n", from, to,
                    strerror(errno));
            w->s = DF_E_IO;
        }
    }
    if (w->s == DF_OK && w->shards > 1)
        write_index(w);
    free(w->map);
    w->map = NULL;
    if (w->s != DF_OK) {
        fprintf(stderr, "diffuse make-tiny: %s: %s\n", w->dir,
                w->s == DF_E_OOM ? "out of memory" : df_error_message());
        return -1;
    }
    return 0;
}
