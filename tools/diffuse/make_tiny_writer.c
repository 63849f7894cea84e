/*
 * make-tiny's weight writer: each tensor is drawn in f32, declared to and written through
 * the library's sharded writer (df_st_shards, which converts it and holds it until its shard
 * is laid out) and freed, so at most one shard plus one tensor is in memory. The shards, their
 * names and the index are df_st_shards': a shard closes when the next tensor would take it
 * past shard_bytes, and one shard's file is byte for byte what a single df_st_writer would
 * have written.
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

int tw_begin(tiny_writer *w, const char *dir, const char *base, df_dtype dtype, df_rng *rng,
             uint64_t seed, int64_t shard_bytes)
{
    memset(w, 0, sizeof *w);
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    df_rng_init(&w->own, seed);
    w->rng = rng ? rng : &w->own;
    w->dtype = dtype;
    if (tw_make_dir(w->dir))
        return -1;
    w->s = df_st_shards_create(w->dir, base, shard_bytes > 0 ? shard_bytes : TINY_SHARD_BYTES,
                               &w->w);
    if (w->s != DF_OK) {
        fprintf(stderr, "diffuse make-tiny: %s\n", df_error_message());
        return -1;
    }
    return 0;
}

void tw_add_values(tiny_writer *w, const char *name, const int64_t *shape, int ndim,
                   const float *v)
{
    if (w->s != DF_OK)
        return;
    int64_t id;
    w->s = df_st_shards_declare(w->w, name, w->dtype, shape, ndim, &id);
    if (w->s == DF_OK)
        w->s = df_st_shards_write_f32(w->w, id, v);
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

int tw_finish(tiny_writer *w)
{
    if (w->s == DF_OK && w->w)
        w->s = df_st_shards_finish(w->w);
    df_st_shards_free(w->w);
    w->w = NULL;
    if (w->s != DF_OK) {
        fprintf(stderr, "diffuse make-tiny: %s: %s\n", w->dir,
                w->s == DF_E_OOM ? "out of memory" : df_error_message());
        return -1;
    }
    return 0;
}
