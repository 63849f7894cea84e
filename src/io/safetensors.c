/*
 * Safetensors reader: open, validate, look up.
 *
 * A file is an 8-byte little-endian header length, a JSON header, then raw tensor bytes.
 * We read the header with pread, map the file, and keep only offsets: tensor data is never
 * copied or touched here. The header is validated completely before the handle is
 * returned, as strictly as the format's reference implementation: the length fits the file
 * and the format's 100 MB cap; the header is a JSON object and its first byte is '{' (the
 * rule the reference reader states; no leading whitespace); each tensor has a string dtype
 * it knows, dimensions and [begin, end] offsets written as non-negative integer literals
 * (serde reads them as usize: 2.0 or 8.5 is an error, never rounded); shape x dtype size equals
 * end - begin (checked arithmetic); and the byte ranges, sorted, tile the data section
 * exactly - an overlap, a hole or bytes after the last tensor are errors (holes would let
 * one file be two formats at once). Duplicate names are refused by the JSON layer. Dtypes
 * that diffuse cannot load (I8, BOOL, F8, ...) are accepted and listed, so inspect can show
 * them; reading them is DF_E_UNSUPPORTED, except fp8 (F8_E4M3, F8_E5M2), which reads
 * upcast to a float dtype (safetensors_read.c).
 */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <diffuse/json.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/json.h"
#include "io/path.h"

static const struct {
    const char *name;
    uint8_t size;
    df_dtype dtype;
} dtypes[] = {
    {"F64", 8, DF_DTYPE_F64},       {"F32", 4, DF_DTYPE_F32},       {"F16", 2, DF_DTYPE_F16},
    {"BF16", 2, DF_DTYPE_BF16},     {"I64", 8, DF_DTYPE_I64},       {"I32", 4, DF_DTYPE_I32},
    {"I16", 2, DF_DTYPE_COUNT},     {"I8", 1, DF_DTYPE_I8},         {"U8", 1, DF_DTYPE_U8},
    {"U16", 2, DF_DTYPE_COUNT},     {"U32", 4, DF_DTYPE_COUNT},     {"U64", 8, DF_DTYPE_COUNT},
    {"BOOL", 1, DF_DTYPE_COUNT},    {"F8_E4M3", 1, DF_DTYPE_COUNT}, {"F8_E5M2", 1, DF_DTYPE_COUNT},
    {"F8_E8M0", 1, DF_DTYPE_COUNT}, {"C64", 8, DF_DTYPE_COUNT},
};

/*
 * A JSON integer literal in [0, limit]; false otherwise. As in the reference reader (serde
 * reads shapes and offsets as usize), 2.0, 2e0 and -0 are not integers here, nor rounded.
 */
static bool whole(const df_json *j, uint64_t limit, uint64_t *out)
{
    if (df_json_type_of(j) != DF_JSON_NUMBER || !j->v.number.integer ||
        j->v.number.negative || j->v.number.magnitude > limit)
        return false;
    *out = j->v.number.magnitude;
    return true;
}

/* A short description of a JSON value for messages: the number as written, or its type. */
static const char *describe(const df_json *j, char *buf, size_t cap)
{
    if (df_json_type_of(j) == DF_JSON_NUMBER && j->v.number.integer)
        snprintf(buf, cap, "%s%llu", j->v.number.negative ? "-" : "",
                 (unsigned long long)j->v.number.magnitude);
    else if (df_json_type_of(j) == DF_JSON_NUMBER)
        snprintf(buf, cap, "%.17g (not an integer literal)", df_json_number(j));
    else
        snprintf(buf, cap, "%s", df_json_type_name(df_json_type_of(j)));
    return buf;
}

static df_status parse_shape(const df_safetensors *st, const char *name, const df_json *t,
                             st_entry *e)
{
    const df_json *shape = df_json_get(t, "shape");
    if (df_json_type_of(shape) != DF_JSON_ARRAY)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': 'shape' must be an array, found %s",
                         st->path, name, shape ? df_json_type_name(df_json_type_of(shape))
                                                : "nothing");
    int64_t ndim = df_json_array_size(shape);
    if (ndim > DF_SAFETENSORS_MAX_DIMS)
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s' has %lld dimensions; diffuse "
                         "reads at most %d", st->path, name, (long long)ndim,
                         DF_SAFETENSORS_MAX_DIMS);
    e->ndim = (int)ndim;
    e->numel = 1;
    for (int d = 0; d < e->ndim; d++) {
        uint64_t v;
        const df_json *dim = df_json_array_get(shape, d);
        if (!whole(dim, (uint64_t)1 << 62, &v)) {
            char buf[64];
            return df_errorf(DF_E_FORMAT, "%s: tensor '%s': shape[%d] is %s; dimensions must "
                             "be non-negative integers", st->path, name, d,
                             describe(dim, buf, sizeof buf));
        }
        e->shape[d] = (int64_t)v;
        if (!df_i64_mul(e->numel, e->shape[d], &e->numel))
            return df_errorf(DF_E_FORMAT, "%s: tensor '%s': shape has too many elements to "
                             "address", st->path, name);
    }
    return DF_OK;
}

static df_status parse_offsets(const df_safetensors *st, const char *name, const df_json *t,
                               st_entry *e)
{
    const df_json *off = df_json_get(t, "data_offsets");
    if (df_json_type_of(off) != DF_JSON_ARRAY)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': data_offsets must be an array [begin, "
                         "end], found %s", st->path, name,
                         off ? df_json_type_name(df_json_type_of(off)) : "nothing");
    if (df_json_array_size(off) != 2)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': data_offsets must be [begin, end], "
                         "found %lld entries", st->path, name, (long long)df_json_array_size(off));
    for (int i = 0; i < 2; i++) {
        const df_json *v = df_json_array_get(off, i);
        uint64_t *dst = i == 0 ? &e->begin : &e->end;
        if (!whole(v, (uint64_t)1 << 63, dst)) {
            char buf[64];
            return df_errorf(DF_E_FORMAT, "%s: tensor '%s': data_offsets[%d] is %s; offsets "
                             "must be non-negative integers", st->path, name, i,
                             describe(v, buf, sizeof buf));
        }
    }
    if (e->end < e->begin)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] end before "
                         "they begin", st->path, name, (unsigned long long)e->begin,
                         (unsigned long long)e->end);
    if (e->end > st->data_size)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s' spans bytes [%llu, %llu) but the data "
                         "section has %llu bytes", st->path, name,
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)st->data_size);
    size_t nbytes;
    if (!df_size_mul((size_t)e->numel, e->elem_size, &nbytes) ||
        nbytes != e->end - e->begin) {
        char shape[160];
        size_t n = 0;
        shape[0] = '\0';
        for (int d = 0; d < e->ndim && n < sizeof shape - 24; d++)
            n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", d ? ", " : "",
                                  (long long)e->shape[d]);
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': shape [%s] of %s needs %lld x %d "
                         "bytes but data_offsets [%llu, %llu] hold %llu", st->path, name,
                         shape, e->dtype_name, (long long)e->numel, e->elem_size,
                         (unsigned long long)e->begin, (unsigned long long)e->end,
                         (unsigned long long)(e->end - e->begin));
    }
    return DF_OK;
}

static df_status parse_tensor(const df_safetensors *st, const char *name, const df_json *t,
                              st_entry *e)
{
    if (df_json_type_of(t) != DF_JSON_OBJECT)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': expected an object with dtype, shape "
                         "and data_offsets, found %s", st->path, name,
                         df_json_type_name(df_json_type_of(t)));
    const char *dt = df_json_string(df_json_get(t, "dtype"));
    if (!dt)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': 'dtype' must be a string",
                         st->path, name);
    e->dtype_name = NULL;
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        if (strcmp(dt, dtypes[i].name) == 0) {
            e->dtype_name = dtypes[i].name;
            e->elem_size = dtypes[i].size;
            e->dtype = dtypes[i].dtype;
            e->f8 = strcmp(dt, "F8_E4M3") == 0   ? ST_F8_E4M3
                    : strcmp(dt, "F8_E5M2") == 0 ? ST_F8_E5M2
                                                 : ST_F8_NONE;
        }
    }
    if (!e->dtype_name)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s': unknown dtype '%.32s'", st->path, name,
                         dt);
    DF_TRY(parse_shape(st, name, t, e));
    return parse_offsets(st, name, t, e);
}

static df_status check_metadata(const df_safetensors *st, const df_json *meta)
{
    if (df_json_type_of(meta) == DF_JSON_NULL)
        return DF_OK;
    if (df_json_type_of(meta) != DF_JSON_OBJECT)
        return df_errorf(DF_E_FORMAT, "%s: __metadata__ must be an object of strings, found %s",
                         st->path, df_json_type_name(df_json_type_of(meta)));
    for (int64_t i = 0; i < df_json_object_size(meta); i++) {
        const char *key;
        const df_json *v = df_json_object_at(meta, i, &key);
        if (df_json_type_of(v) != DF_JSON_STRING)
            return df_errorf(DF_E_FORMAT, "%s: __metadata__ entry '%s' is a %s; metadata "
                             "values must be strings", st->path, key,
                             df_json_type_name(df_json_type_of(v)));
    }
    return DF_OK;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

static int meta_by_key(const void *a, const void *b)
{
    return strcmp(((const st_meta *)a)->key, ((const st_meta *)b)->key);
}

static int by_offset(const void *a, const void *b)
{
    const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/* The sorted byte ranges must cover [0, data_size) exactly once. */
static df_status check_tiling(df_safetensors *st)
{
    const st_entry **order = df_malloc(sizeof *order * (size_t)(st->count ? st->count : 1));
    if (!order)
        return df_errorf(DF_E_OOM, "%s: out of memory", st->path);
    for (int64_t i = 0; i < st->count; i++)
        order[i] = &st->entries[i];
    qsort(order, (size_t)st->count, sizeof *order, by_offset);
    uint64_t covered = 0;
    const st_entry *prev = NULL;
    df_status s = DF_OK;
    for (int64_t i = 0; i < st->count && s == DF_OK; i++) {
        const st_entry *e = order[i];
        if (e->begin < covered)
            s = df_errorf(DF_E_FORMAT, "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) "
                          "overlap", st->path, prev->name, (unsigned long long)prev->begin,
                          (unsigned long long)prev->end, e->name,
                          (unsigned long long)e->begin, (unsigned long long)e->end);
        else if (e->begin > covered)
            s = df_errorf(DF_E_FORMAT, "%s: bytes [%llu, %llu) of the data section belong to "
                          "no tensor (a hole before '%s')", st->path,
                          (unsigned long long)covered, (unsigned long long)e->begin, e->name);
        if (e->end > covered || !prev) {
            covered = e->end;
            prev = e;
        }
    }
    if (s == DF_OK && covered != st->data_size)
        s = df_errorf(DF_E_FORMAT, "%s: the data section has %llu bytes but the tensors end at "
                      "byte %llu; the rest belongs to no tensor", st->path,
                      (unsigned long long)st->data_size, (unsigned long long)covered);
    df_free(order);
    return s;
}

/* Copies names and metadata out of the header into the handle. */
static df_status build(df_safetensors *st, const df_json *root)
{
    const df_json *meta = df_json_get(root, "__metadata__");
    DF_TRY(check_metadata(st, meta));
    int64_t members = df_json_object_size(root);
    st->count = members - (meta ? 1 : 0);
    st->meta_count = df_json_object_size(meta);
    size_t chars = 1;
    for (int64_t i = 0; i < members; i++) {
        const char *key;
        df_json_object_at(root, i, &key);
        chars += strlen(key) + 1;
    }
    for (int64_t i = 0; i < st->meta_count; i++) {
        const char *key;
        const df_json *v = df_json_object_at(meta, i, &key);
        chars += strlen(key) + strlen(df_json_string(v)) + 2;
    }
    st->entries = df_calloc((size_t)(st->count ? st->count : 1), sizeof *st->entries);
    st->names = df_malloc(chars);
    st->meta = df_malloc(sizeof *st->meta * (size_t)(st->meta_count + 1));
    if (!st->entries || !st->names || !st->meta)
        return df_errorf(DF_E_OOM, "%s: out of memory for %lld tensors", st->path,
                         (long long)st->count);
    char *p = st->names;
    int64_t n = 0;
    for (int64_t i = 0; i < members; i++) {
        const char *key;
        const df_json *t = df_json_object_at(root, i, &key);
        if (t == meta)
            continue;
        st_entry *e = &st->entries[n++];
        e->name = strcpy(p, key);
        p += strlen(key) + 1;
        DF_TRY(parse_tensor(st, key, t, e));
    }
    for (int64_t i = 0; i < st->meta_count; i++) {
        const char *key;
        const char *v = df_json_string(df_json_object_at(meta, i, &key));
        st->meta[i].key = strcpy(p, key);
        p += strlen(key) + 1;
        st->meta[i].value = strcpy(p, v);
        p += strlen(v) + 1;
    }
    qsort(st->entries, (size_t)st->count, sizeof *st->entries, by_name);
    qsort(st->meta, (size_t)st->meta_count, sizeof *st->meta, meta_by_key);
    return check_tiling(st);
}

/* Checks the 8-byte header length `first` against the file size; *n receives it. */
static df_status check_length(const df_safetensors *st, const uint8_t *first, uint64_t *n)
{
    *n = 0;
    if (st->size < 8)
        return df_errorf(DF_E_FORMAT, "%s: truncated: the file has %zu bytes, fewer than the "
                         "8-byte header length that starts a safetensors file", st->path,
                         st->size);
    for (int i = 7; i >= 0; i--)
        *n = (*n << 8) | first[i];
    if (*n > DF_SAFETENSORS_MAX_HEADER)
        return df_errorf(DF_E_FORMAT, "%s: header length %llu is larger than the format's "
                         "100 MB limit (not a safetensors file?)", st->path,
                         (unsigned long long)*n);
    if (*n > st->size - 8)
        return df_errorf(DF_E_FORMAT, "%s: header length %llu runs past the end of the file "
                         "(%zu bytes): truncated?", st->path, (unsigned long long)*n, st->size);
    return DF_OK;
}

/* Parses the n header bytes at `text`; st->data and st->data_size are already set. */
static df_status parse_header(df_safetensors *st, const char *text, uint64_t n)
{
    if (n == 0 || text[0] != '{') {
        unsigned char c = n ? (unsigned char)text[0] : 0;
        char first[24];
        snprintf(first, sizeof first, c >= 0x20 && c < 0x7f ? "'%c'" : "byte 0x%02x", c);
        return df_errorf(DF_E_FORMAT, "%s: the header %s%s; a safetensors header is a JSON "
                         "object and begins with '{' (not a safetensors file?)", st->path,
                         n ? "begins with " : "is empty", n ? first : "");
    }
    df_json *root;
    DF_TRY_CTX(df_json_parse_string(text, (size_t)n, st->path, &root), "safetensors header");
    df_status s = DF_OK;
    if (df_json_type_of(root) != DF_JSON_OBJECT)
        s = df_errorf(DF_E_FORMAT, "%s: the header is a JSON %s; it must be an object of "
                      "tensors", st->path, df_json_type_name(df_json_type_of(root)));
    if (s == DF_OK)
        s = build(st, root);
    df_json_free(root);
    return s;
}

/* A new handle named `name` (NULL and a message on out-of-memory). */
static df_safetensors *new_handle(const char *name)
{
    df_safetensors *st = df_calloc(1, sizeof *st);
    if (st)
        st->path = df_strdup(name);
    if (!st || !st->path) {
        df_free(st);
        df_errorf(DF_E_OOM, "out of memory opening %s", name);
        return NULL;
    }
    st->base = (const uint8_t *)"";
    return st;
}

df_status df_safetensors_open_memory(const void *buf, size_t len, const char *name,
                                     df_safetensors **out)
{
    if (!out)
        return df_errorf(DF_E_ARG, "df_safetensors_open_memory: out is NULL");
    *out = NULL;
    if (!buf && len)
        return df_errorf(DF_E_ARG, "df_safetensors_open_memory: buffer is NULL");
    df_safetensors *st = new_handle(name ? name : "<memory>");
    if (!st)
        return DF_E_OOM;
    if (buf)
        st->base = buf;
    st->size = len;
    uint64_t n;
    df_status s = check_length(st, st->base, &n);
    if (s == DF_OK) {
        st->data = st->base + 8 + n;
        st->data_size = st->size - 8 - n;
        s = parse_header(st, (const char *)st->base + 8, n);
    }
    if (s != DF_OK) {
        df_safetensors_free(st);
        return s;
    }
    *out = st;
    return DF_OK;
}

/* Reads len bytes at offset into buf. */
static df_status read_at(int fd, const char *path, void *buf, size_t len, uint64_t offset)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return df_errorf(DF_E_IO, "%s: cannot read the header: %s", path,
                             r < 0 ? strerror(errno) : "the file shrank");
        got += (size_t)r;
    }
    return DF_OK;
}

/*
 * The header is read with pread rather than through the mapping: a page fault on a cold
 * mapping makes the kernel read far around it (megabytes, with a large read-ahead), which
 * would make opening cost what reading the first tensors costs.
 */
static df_status open_fd(df_safetensors *st, int fd)
{
    uint8_t first[8];
    uint64_t n = 0;
    if (st->size >= 8)
        DF_TRY(read_at(fd, st->path, first, 8, 0));
    DF_TRY(check_length(st, first, &n));
    char *text = df_malloc((size_t)n + 1);
    if (!text)
        return df_errorf(DF_E_OOM, "%s: out of memory for a %llu-byte header", st->path,
                         (unsigned long long)n);
    df_status s = read_at(fd, st->path, text, (size_t)n, 8);
    if (s == DF_OK)
        s = df_file_map(fd, st->size, st->path, &st->base);
    if (s == DF_OK) {
        st->mapped = true;
        st->data = st->base + 8 + n;
        st->data_size = st->size - 8 - n;
        s = parse_header(st, text, n);
    }
    df_free(text);
    return s;
}

df_status df_safetensors_open(const char *path, df_safetensors **out)
{
    if (!out || !path)
        return df_errorf(DF_E_ARG, "df_safetensors_open: NULL argument");
    *out = NULL;
    int fd;
    size_t size;
    DF_TRY(df_file_open_mappable(path, &fd, &size));
    df_safetensors *st = new_handle(path);
    if (!st) {
        close(fd);
        return DF_E_OOM;
    }
    st->size = size;
    df_status s = open_fd(st, fd);
    close(fd);
    if (s != DF_OK) {
        df_safetensors_free(st);
        return s;
    }
    *out = st;
    return DF_OK;
}

void df_safetensors_free(df_safetensors *st)
{
    if (!st)
        return;
    if (st->mapped)
        munmap((void *)st->base, st->size);
    df_free(st->entries);
    df_free(st->names);
    df_free(st->meta);
    df_free(st->path);
    df_free(st);
}

/* ---- looking up ------------------------------------------------------------------- */

const st_entry *df_st_lookup(const df_safetensors *st, const char *name)
{
    if (!st || !name)
        return NULL;
    int64_t lo = 0, hi = st->count;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(st->entries[mid].name, name);
        if (c == 0)
            return &st->entries[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void df_st_info(const df_safetensors *st, const st_entry *e, df_tensor_info *out)
{
    memset(out, 0, sizeof *out);
    out->name = e->name;
    out->dtype = e->dtype;
    out->dtype_name = e->dtype_name;
    out->elem_size = e->elem_size;
    out->ndim = e->ndim;
    memcpy(out->shape, e->shape, sizeof e->shape);
    out->numel = e->numel;
    out->offset = (uint64_t)(st->data - st->base) + e->begin;
    out->nbytes = (size_t)(e->end - e->begin);
    out->data = st->data + e->begin;
}

const char *df_safetensors_path(const df_safetensors *st)
{
    return st ? st->path : "";
}

int64_t df_safetensors_count(const df_safetensors *st)
{
    return st ? st->count : 0;
}

df_status df_safetensors_at(const df_safetensors *st, int64_t i, df_tensor_info *out)
{
    if (!st || i < 0 || i >= st->count)
        return df_errorf(DF_E_ARG, "%s: tensor index %lld out of range", df_safetensors_path(st),
                         (long long)i);
    df_st_info(st, &st->entries[i], out);
    return DF_OK;
}

df_status df_safetensors_find(const df_safetensors *st, const char *name, df_tensor_info *out)
{
    const st_entry *e = df_st_lookup(st, name);
    if (!e) {
        memset(out, 0, sizeof *out);
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_safetensors_path(st),
                         name ? name : "(null)");
    }
    df_st_info(st, e, out);
    return DF_OK;
}

bool df_safetensors_contains(const df_safetensors *st, const char *name)
{
    return df_st_lookup(st, name) != NULL;
}

int64_t df_safetensors_metadata_count(const df_safetensors *st)
{
    return st ? st->meta_count : 0;
}

void df_safetensors_metadata_at(const df_safetensors *st, int64_t i, const char **key,
                                const char **value)
{
    bool ok = st && i >= 0 && i < st->meta_count;
    if (key)
        *key = ok ? st->meta[i].key : NULL;
    if (value)
        *value = ok ? st->meta[i].value : NULL;
}

const char *df_safetensors_metadata(const df_safetensors *st, const char *key)
{
    if (!st || !key || st->meta_count == 0)
        return NULL;
    st_meta probe = {.key = key};
    const st_meta *m = bsearch(&probe, st->meta, (size_t)st->meta_count, sizeof *st->meta,
                               meta_by_key);
    return m ? m->value : NULL;
}
