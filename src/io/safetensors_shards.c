/*
 * Streaming sharded safetensors writer (df_st_shards, safetensors_writer.h).
 *
 * Declarations place tensors: the open shard takes the next one unless it would pass
 * shard_bytes with something already in it, so a tensor larger than shard_bytes gets a shard
 * of its own. Laying out a shard sorts its tensors by name, writes the header (the same
 * function df_st_writer uses) to BASE.shard-N.tmp and sets the file to its full length;
 * from then on each tensor's bytes are written at their offset (pwrite), so the order of the
 * writes does not matter and nothing is copied. Bytes written before their shard is laid
 * out are held and written, in file order, when it is. Finish renames the shards once their
 * count is known and writes the index the way save_pretrained lays it out (weight_map in
 * declaration order). One file descriptor is kept open: the shard written last.
 */
#include <diffuse/safetensors_writer.h>

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/safetensors_write.h"

typedef struct sh_tensor {
    st_decl d;
    int shard;
    uint64_t offset; /* in its file, once the shard is laid out */
    void *held;      /* its bytes, written before the shard was laid out */
    bool written;
} sh_tensor;

typedef struct sh_file {
    int64_t first, count; /* tensors [first, first + count) */
    bool laid_out;
} sh_file;

struct df_st_shards {
    char dir[4096], base[256];
    int64_t shard_bytes, in_shard, total;
    sh_tensor *t;
    int64_t n;
    size_t cap;
    sh_file *f;
    int nf;
    size_t fcap;
    bool declared, finished;
    int fd, fd_shard; /* the open shard (fd -1: none) */
};

/* Shard i of n (n 0: its temporary name, before the count is known). */
static void shard_path(const df_st_shards *w, int i, int n, char *buf, size_t cap)
{
    if (n == 0)
        snprintf(buf, cap, "%s/%s.shard-%d.tmp", w->dir, w->base, i);
    else if (n == 1)
        snprintf(buf, cap, "%s/%s.safetensors", w->dir, w->base);
    else
        snprintf(buf, cap, "%s/%s-%05d-of-%05d.safetensors", w->dir, w->base, i + 1, n);
}

df_status df_st_shards_create(const char *dir, const char *base, int64_t shard_bytes,
                              df_st_shards **out)
{
    *out = NULL;
    if (strlen(dir) >= sizeof((df_st_shards *)0)->dir ||
        strlen(base) >= sizeof((df_st_shards *)0)->base || !*base || strchr(base, '/'))
        return df_errorf(DF_E_ARG, "safetensors shards: bad folder '%s' or base name '%s'", dir,
                         base);
    df_st_shards *w = df_calloc(1, sizeof *w);
    if (!w)
        return df_errorf(DF_E_OOM, "safetensors shards: out of memory");
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    snprintf(w->base, sizeof w->base, "%s", base);
    w->shard_bytes = shard_bytes > 0 ? shard_bytes : DF_ST_SHARD_BYTES;
    w->fd = -1;
    *out = w;
    return DF_OK;
}

static void close_fd(df_st_shards *w)
{
    if (w->fd >= 0)
        close(w->fd);
    w->fd = -1;
}

/* The open descriptor of shard i (laid out), opened if another one is open. */
static df_status shard_fd(df_st_shards *w, int i, int *fd, char *path, size_t cap)
{
    shard_path(w, i, 0, path, cap);
    if (w->fd >= 0 && w->fd_shard == i) {
        *fd = w->fd;
        return DF_OK;
    }
    close_fd(w);
    w->fd = open(path, O_WRONLY | O_CLOEXEC);
    if (w->fd < 0)
        return df_errorf(DF_E_IO, "%s: cannot open: %s", path, strerror(errno));
    w->fd_shard = i;
    *fd = w->fd;
    return DF_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const st_decl *const *)a)->name, (*(const st_decl *const *)b)->name);
}

/* Writes shard i's header, sizes its file and writes the tensors held for it. */
static df_status lay_out(df_st_shards *w, int i)
{
    sh_file *f = &w->f[i];
    const st_decl **order = df_malloc((size_t)(f->count ? f->count : 1) * sizeof *order);
    if (!order)
        return df_errorf(DF_E_OOM, "safetensors shards: out of memory");
    for (int64_t j = 0; j < f->count; j++)
        order[j] = &w->t[f->first + j].d;
    qsort(order, (size_t)f->count, sizeof *order, by_name);
    char *hdr = NULL, path[4400];
    size_t len = 0;
    df_status s = df_st_header(order, f->count, &hdr, &len);
    uint64_t at = 8 + len;
    for (int64_t j = 0; s == DF_OK && j < f->count; j++) {
        sh_tensor *t = (sh_tensor *)((char *)order[j] - offsetof(sh_tensor, d));
        t->offset = at;
        at += t->d.bytes;
    }
    shard_path(w, i, 0, path, sizeof path);
    close_fd(w);
    if (s == DF_OK) {
        w->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        w->fd_shard = i;
        if (w->fd < 0)
            s = df_errorf(DF_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    uint8_t lenbuf[8];
    for (int b = 0; b < 8; b++)
        lenbuf[b] = (uint8_t)((uint64_t)len >> (8 * b));
    if (s == DF_OK)
        s = df_st_pwrite(w->fd, path, lenbuf, 8, 0);
    if (s == DF_OK)
        s = df_st_pwrite(w->fd, path, hdr, len, 8);
    if (s == DF_OK && ftruncate(w->fd, (off_t)at) != 0)
        s = df_errorf(DF_E_IO, "%s: cannot size to %llu bytes: %s", path,
                      (unsigned long long)at, strerror(errno));
    f->laid_out = s == DF_OK;
    for (int64_t j = 0; s == DF_OK && j < f->count; j++) {
        sh_tensor *t = (sh_tensor *)((char *)order[j] - offsetof(sh_tensor, d));
        if (!t->held)
            continue;
        s = df_st_pwrite(w->fd, path, t->held, t->d.bytes, t->offset);
        df_free(t->held);
        t->held = NULL;
    }
    df_free(hdr);
    df_free(order);
    return s;
}

df_status df_st_shards_declare(df_st_shards *w, const char *name, df_dtype dtype,
                               const int64_t *shape, int ndim, int64_t *id)
{
    if (id)
        *id = -1;
    if (w->declared)
        return df_errorf(DF_E_ARG, "safetensors shards: '%s' declared after the declarations "
                         "ended", name ? name : "");
    st_decl d;
    DF_TRY(df_st_decl_init(&d, name, dtype, shape, ndim));
    df_status s = DF_OK;
    if (w->nf > 0 && w->in_shard > 0 && w->in_shard + (int64_t)d.bytes > w->shard_bytes) {
        s = lay_out(w, w->nf - 1);
        w->in_shard = 0;
    }
    /* room for a new file (taken when the last one is laid out) and the tensor */
    if (s == DF_OK &&
        (!df_array_reserve((void **)&w->f, &w->fcap, (size_t)w->nf + 1, sizeof *w->f) ||
         !df_array_reserve((void **)&w->t, &w->cap, (size_t)w->n + 1, sizeof *w->t)))
        s = df_errorf(DF_E_OOM, "safetensors shards: out of memory");
    if (s == DF_OK && (w->nf == 0 || w->f[w->nf - 1].laid_out))
        w->f[w->nf++] = (sh_file){.first = w->n};
    if (s != DF_OK) {
        df_free(d.name);
        return s;
    }
    w->t[w->n] = (sh_tensor){.d = d, .shard = w->nf - 1};
    w->f[w->nf - 1].count++;
    w->in_shard += (int64_t)d.bytes;
    w->total += (int64_t)d.bytes;
    if (id)
        *id = w->n;
    w->n++;
    return DF_OK;
}

df_status df_st_shards_end_declarations(df_st_shards *w)
{
    if (w->declared)
        return DF_OK;
    w->declared = true;
    return w->nf > 0 && !w->f[w->nf - 1].laid_out ? lay_out(w, w->nf - 1) : DF_OK;
}

static df_status check_id(const df_st_shards *w, int64_t id)
{
    if (id < 0 || id >= w->n)
        return df_errorf(DF_E_ARG, "safetensors shards: no tensor %lld (%lld declared)",
                         (long long)id, (long long)w->n);
    if (w->t[id].written)
        return df_errorf(DF_E_ARG, "safetensors shards: tensor '%s' written twice",
                         w->t[id].d.name);
    return DF_OK;
}

/* Writes tensor id's bytes; `own` (df_malloc'd, the tensor's size) is taken over. */
static df_status put(df_st_shards *w, int64_t id, const void *data, void *own)
{
    sh_tensor *t = &w->t[id];
    df_status s = DF_OK;
    if (w->f[t->shard].laid_out) {
        int fd = -1;
        char path[4400];
        s = shard_fd(w, t->shard, &fd, path, sizeof path);
        if (s == DF_OK)
            s = df_st_pwrite(fd, path, data, t->d.bytes, t->offset);
        df_free(own);
    } else if (own) {
        t->held = own;
    } else {
        t->held = df_malloc(t->d.bytes ? t->d.bytes : 1);
        if (!t->held)
            s = df_errorf(DF_E_OOM, "safetensors shards: out of memory holding '%s'",
                          t->d.name);
        else
            memcpy(t->held, data, t->d.bytes);
    }
    t->written = s == DF_OK;
    return s;
}

df_status df_st_shards_write(df_st_shards *w, int64_t id, const void *data)
{
    DF_TRY(check_id(w, id));
    return put(w, id, data, NULL);
}

df_status df_st_shards_write_f32(df_st_shards *w, int64_t id, const float *data)
{
    DF_TRY(check_id(w, id));
    const st_decl *d = &w->t[id].d;
    int64_t n = (int64_t)(d->bytes / df_dtype_size(d->dtype));
    void *tmp = df_malloc(d->bytes ? d->bytes : 1);
    if (!tmp)
        return df_errorf(DF_E_OOM, "safetensors shards: out of memory for '%s'", d->name);
    df_status s = df_convert(data, DF_DTYPE_F32, tmp, d->dtype, n);
    if (s != DF_OK) {
        df_free(tmp);
        return s;
    }
    return put(w, id, tmp, tmp);
}

/* BASE.safetensors.index.json for the w->nf shards. */
static df_status write_index(const df_st_shards *w)
{
    char path[4400], shard[4400];
    snprintf(path, sizeof path, "%s/%s.safetensors.index.json", w->dir, w->base);
    FILE *f = fopen(path, "wb");
    if (!f)
        return df_errorf(DF_E_IO, "%s: cannot create: %s", path, strerror(errno));
    fprintf(f, "{\n  \"metadata\": {\"total_size\": %lld},\n  \"weight_map\": {",
            (long long)w->total);
    for (int64_t i = 0; i < w->n; i++) {
        shard_path(w, w->t[i].shard, w->nf, shard, sizeof shard);
        fprintf(f, "%s\n    \"%s\": \"%s\"", i ? "," : "", w->t[i].d.name,
                strrchr(shard, '/') + 1);
    }
    fprintf(f, "\n  }\n}\n");
    bool ok = !ferror(f);
    if (fclose(f) != 0 || !ok)
        return df_errorf(DF_E_IO, "%s: cannot write: %s", path, strerror(errno));
    return DF_OK;
}

df_status df_st_shards_finish(df_st_shards *w)
{
    if (w->finished)
        return DF_OK;
    DF_TRY(df_st_shards_end_declarations(w));
    for (int64_t i = 0; i < w->n; i++)
        if (!w->t[i].written)
            return df_errorf(DF_E_ARG, "safetensors shards: %s: tensor '%s' was declared but "
                             "never written", w->dir, w->t[i].d.name);
    close_fd(w);
    char from[4400], to[4400];
    for (int i = 0; i < w->nf; i++) {
        shard_path(w, i, 0, from, sizeof from);
        shard_path(w, i, w->nf, to, sizeof to);
        if (rename(from, to) != 0)
            return df_errorf(DF_E_IO, "cannot rename %s to %s: %s", from, to, strerror(errno));
    }
    w->finished = true;
    return w->nf > 1 ? write_index(w) : DF_OK;
}

int df_st_shards_count(const df_st_shards *w)
{
    return w->nf;
}

int64_t df_st_shards_total_bytes(const df_st_shards *w)
{
    return w->total;
}

void df_st_shards_free(df_st_shards *w)
{
    if (!w)
        return;
    close_fd(w);
    char path[4400];
    for (int i = 0; !w->finished && i < w->nf; i++) {
        shard_path(w, i, 0, path, sizeof path);
        unlink(path); /* absent when its shard was never laid out */
    }
    for (int64_t i = 0; i < w->n; i++) {
        df_free(w->t[i].d.name);
        df_free(w->t[i].held);
    }
    df_free(w->t);
    df_free(w->f);
    df_free(w);
}
