/*
 * Safetensors writer (see safetensors_writer.h).
 *
 * Entries are kept in memory until finish: the tiny models and test files this serves are
 * small, and holding them lets the header be written first in one piece. The declaration
 * checks, the header and positioned writes are shared with the sharded, streaming writer
 * (safetensors_shards.c).
 */
#include <diffuse/safetensors_writer.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/safetensors_write.h"

typedef struct entry {
    st_decl d;
    void *data;
} entry;

struct df_st_writer {
    entry *e;
    int n, cap;
};

static const char *st_dtype(df_dtype t)
{
    switch (t) {
    case DF_DTYPE_F32:  return "F32";
    case DF_DTYPE_BF16: return "BF16";
    case DF_DTYPE_F16:  return "F16";
    case DF_DTYPE_F64:  return "F64";
    case DF_DTYPE_I32:  return "I32";
    case DF_DTYPE_I64:  return "I64";
    case DF_DTYPE_U8:   return "U8";
    case DF_DTYPE_I8:   return "I8";
    default:            return NULL;
    }
}

df_status df_st_decl_init(st_decl *d, const char *name, df_dtype dtype, const int64_t *shape,
                          int ndim)
{
    *d = (st_decl){0};
    if (!st_dtype(dtype) || ndim < 0 || ndim > 8 || !name || !*name || strchr(name, '"') ||
        strchr(name, '\\'))
        return df_errorf(DF_E_ARG, "safetensors writer: bad tensor '%s'", name ? name : "");
    size_t bytes = df_dtype_size(dtype);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || !df_size_mul(bytes, (size_t)shape[i], &bytes))
            return df_errorf(DF_E_ARG, "safetensors writer: '%s' has a bad shape", name);
    *d = (st_decl){.dtype = dtype, .ndim = ndim, .bytes = bytes};
    memcpy(d->shape, shape, (size_t)ndim * sizeof *shape);
    d->name = df_strdup(name);
    return d->name ? DF_OK : df_errorf(DF_E_OOM, "safetensors writer: out of memory");
}

df_status df_st_header(const st_decl *const *e, int64_t n, char **out, size_t *out_len)
{
    *out = NULL;
    size_t cap = 256 + (size_t)n * 512, len = 0;
    char *hdr = df_malloc(cap);
    if (!hdr)
        return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
    len += (size_t)snprintf(hdr + len, cap - len, "{");
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const st_decl *d = e[i];
        if (cap - len < strlen(d->name) + 256) {
            cap = cap * 2 + strlen(d->name);
            char *nh = df_realloc(hdr, cap);
            if (!nh) {
                df_free(hdr);
                return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
            }
            hdr = nh;
        }
        len += (size_t)snprintf(hdr + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i ? "," : "", d->name, st_dtype(d->dtype));
        for (int k = 0; k < d->ndim; k++)
            len += (size_t)snprintf(hdr + len, cap - len, k ? ",%lld" : "%lld",
                                    (long long)d->shape[k]);
        len += (size_t)snprintf(hdr + len, cap - len, "],\"data_offsets\":[%llu,%llu]}",
                                (unsigned long long)off, (unsigned long long)(off + d->bytes));
        off += d->bytes;
    }
    len += (size_t)snprintf(hdr + len, cap - len, "}");
    while (len % 8 && len + 1 < cap)
        hdr[len++] = ' ';
    *out = hdr;
    *out_len = len;
    return DF_OK;
}

df_status df_st_pwrite(int fd, const char *path, const void *data, size_t bytes,
                       uint64_t offset)
{
    const char *p = data;
    while (bytes > 0) {
        ssize_t n = pwrite(fd, p, bytes, (off_t)offset);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return df_errorf(DF_E_IO, "%s: cannot write: %s", path,
                             n < 0 ? strerror(errno) : "no space written");
        p += n;
        bytes -= (size_t)n;
        offset += (uint64_t)n;
    }
    return DF_OK;
}

df_status df_st_writer_create(df_st_writer **out)
{
    *out = df_calloc(1, sizeof **out);
    return *out ? DF_OK : df_errorf(DF_E_OOM, "safetensors writer: out of memory");
}

void df_st_writer_free(df_st_writer *w)
{
    if (!w)
        return;
    for (int i = 0; i < w->n; i++) {
        df_free(w->e[i].d.name);
        df_free(w->e[i].data);
    }
    df_free(w->e);
    df_free(w);
}

df_status df_st_writer_add(df_st_writer *w, const char *name, df_dtype dtype,
                           const int64_t *shape, int ndim, const void *data)
{
    if (w->n == w->cap) {
        int cap = w->cap ? 2 * w->cap : 64;
        entry *e = df_realloc(w->e, (size_t)cap * sizeof *e);
        if (!e)
            return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
        w->e = e;
        w->cap = cap;
    }
    entry *e = &w->e[w->n];
    DF_TRY(df_st_decl_init(&e->d, name, dtype, shape, ndim));
    e->data = df_malloc(e->d.bytes);
    if (!e->data) {
        df_free(e->d.name);
        return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
    }
    memcpy(e->data, data, e->d.bytes);
    w->n++;
    return DF_OK;
}

df_status df_st_writer_add_f32(df_st_writer *w, const char *name, df_dtype dtype,
                               const int64_t *shape, int ndim, const float *data)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d] > 0 ? shape[d] : 0;
    void *tmp = df_malloc((size_t)(n ? n : 1) * df_dtype_size(dtype));
    if (!tmp)
        return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
    df_status s = df_convert(data, DF_DTYPE_F32, tmp, dtype, n);
    if (s == DF_OK)
        s = df_st_writer_add(w, name, dtype, shape, ndim, tmp);
    df_free(tmp);
    return s;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const entry *)a)->d.name, ((const entry *)b)->d.name);
}

df_status df_st_writer_finish(df_st_writer *w, const char *path)
{
    qsort(w->e, (size_t)w->n, sizeof *w->e, by_name);
    const st_decl **decls = df_malloc((size_t)(w->n ? w->n : 1) * sizeof *decls);
    if (!decls)
        return df_errorf(DF_E_OOM, "safetensors writer: out of memory");
    for (int i = 0; i < w->n; i++)
        decls[i] = &w->e[i].d;
    char *hdr;
    size_t len;
    df_status s = df_st_header(decls, w->n, &hdr, &len);
    df_free(decls);
    DF_TRY(s);

    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        s = df_errorf(DF_E_IO, "%s: cannot create: %s", path, strerror(errno));
    } else {
        uint8_t lenbuf[8];
        for (int b = 0; b < 8; b++)
            lenbuf[b] = (uint8_t)((uint64_t)len >> (8 * b));
        bool ok = fwrite(lenbuf, 1, 8, f) == 8 && fwrite(hdr, 1, len, f) == len;
        for (int i = 0; ok && i < w->n; i++)
            ok = fwrite(w->e[i].data, 1, w->e[i].d.bytes, f) == w->e[i].d.bytes;
        if (fclose(f) != 0)
            ok = false;
        if (!ok || rename(tmp, path) != 0) {
            s = df_errorf(DF_E_IO, "%s: cannot write: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    df_free(hdr);
    return s;
}
