/*
 * GGUF reader: open, validate, look up, read rows with dequantisation.
 *
 * The file is mapped and parsed through a cursor that knows how many bytes are left, so
 * every count and length is checked against the file before anything is allocated for
 * it: a key-value count needs at least 13 bytes per pair, a tensor count 28 bytes per
 * tensor, an array n times its element size (8 bytes per string). Keys, tensor names and
 * string values are copied out NUL-terminated (a key or a name holding a NUL byte is
 * refused: it would read as a shorter, different name). Numeric arrays stay in the mapping.
 * Tensor data is never touched at open: the data section begins at the first multiple of
 * the alignment after the tensor descriptions, each tensor's offset must be a multiple of
 * the alignment, its bytes (numel / block x block bytes, checked arithmetic) must lie in
 * the data section, and, sorted by offset, no two may overlap. Padding between tensors is
 * allowed, as writers align each one.
 *
 * Version 3 is what every current writer produces; version 2 has the same layout and is
 * read too. Version 1 (32-bit counts) and byte-swapped (big-endian) files are refused as
 * unsupported.
 */
#include <diffuse/gguf.h>

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/quant_blocks.h"
#include "core/status.h"
#include "io/path.h"

#define DEFAULT_ALIGNMENT 32
#define MAX_NAME          4096 /* bytes of a key or tensor name */
#define STAGE_FLOATS      4096 /* f32 values dequantised at a time */

typedef struct gg_kv {
    char *key;
    df_gguf_value_type type;
    df_gguf_value_type elem_type; /* arrays */
    uint64_t count;               /* arrays: elements */
    union {
        uint64_t u;
        int64_t i;
        double f;
    } v;                   /* scalars, widened */
    char *str;             /* a string value */
    const uint8_t *arr;    /* a numeric array's first element in the mapping */
    char *arr_strings;     /* a string array's elements, each NUL-terminated */
    uint64_t *arr_offsets; /* ... and where each begins in arr_strings */
    size_t arr_strings_end; /* where the last one's NUL ends */
} gg_kv;

typedef struct gg_tensor {
    char *name;
    uint32_t type;
    const df_qblock_info *info;
    int ndim;
    int64_t shape[DF_GGUF_MAX_DIMS]; /* outermost first */
    int64_t numel;
    uint64_t offset; /* within the data section */
    uint64_t nbytes;
} gg_tensor;

struct df_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version, alignment;
    uint64_t data_start, data_size;
    int64_t n_kv;
    gg_kv *kv;
    int64_t n_tensors;
    gg_tensor *tensors; /* sorted by name */
};

/* A read position in the file. */
typedef struct cursor {
    const df_gguf *g;
    const uint8_t *p;
    size_t left;
} cursor;

static size_t cursor_pos(const cursor *c)
{
    return (size_t)(c->p - c->g->base);
}

static df_status take(cursor *c, size_t n, const char *what, const void **out)
{
    if (n > c->left)
        return df_errorf(DF_E_FORMAT,
                         "%s: truncated: %s needs %zu bytes at offset %zu but "
                         "the file has %zu left",
                         c->g->path, what, n, cursor_pos(c), c->left);
    *out = c->p;
    c->p += n;
    c->left -= n;
    return DF_OK;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static df_status read_u32(cursor *c, const char *what, uint32_t *out)
{
    const void *p = NULL;
    DF_TRY(take(c, 4, what, &p));
    *out = (uint32_t)le(p, 4);
    return DF_OK;
}

static df_status read_u64(cursor *c, const char *what, uint64_t *out)
{
    const void *p = NULL;
    DF_TRY(take(c, 8, what, &p));
    *out = le(p, 8);
    return DF_OK;
}

/* A string: u64 length, then the bytes. *out is a df_malloc'd NUL-terminated copy. When
 * `name` is set, NUL bytes inside are an error and the length is capped. */
static df_status read_string(cursor *c, const char *what, bool name, char **out)
{
    *out = NULL;
    uint64_t n;
    DF_TRY(read_u64(c, what, &n));
    if (name && n > MAX_NAME)
        return df_errorf(DF_E_FORMAT,
                         "%s: %s at offset %zu is %llu bytes long; names are at "
                         "most %d",
                         c->g->path, what, cursor_pos(c) - 8, (unsigned long long)n, MAX_NAME);
    if (n > c->left)
        return df_errorf(DF_E_FORMAT,
                         "%s: truncated: %s at offset %zu claims %llu bytes but "
                         "the file has %zu left",
                         c->g->path, what, cursor_pos(c) - 8, (unsigned long long)n, c->left);
    const void *p = NULL;
    DF_TRY(take(c, (size_t)n, what, &p));
    if (name && memchr(p, 0, (size_t)n))
        return df_errorf(DF_E_FORMAT, "%s: %s at offset %zu contains a NUL byte", c->g->path, what,
                         cursor_pos(c) - (size_t)n);
    char *s = df_malloc((size_t)n + 1);
    if (!s)
        return df_errorf(DF_E_OOM, "%s: out of memory for %s", c->g->path, what);
    memcpy(s, p, (size_t)n);
    s[n] = '\0';
    *out = s;
    return DF_OK;
}

/* Bytes of one scalar value of `type`; 0 for strings, arrays and unknown types. */
static size_t scalar_size(uint32_t type)
{
    switch (type) {
    case DF_GGUF_UINT8:
    case DF_GGUF_INT8:
    case DF_GGUF_BOOL:
        return 1;
    case DF_GGUF_UINT16:
    case DF_GGUF_INT16:
        return 2;
    case DF_GGUF_UINT32:
    case DF_GGUF_INT32:
    case DF_GGUF_FLOAT32:
        return 4;
    case DF_GGUF_UINT64:
    case DF_GGUF_INT64:
    case DF_GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static const char *type_name(uint32_t type)
{
    static const char *const names[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                        "int32",  "float32", "bool",   "string", "array",
                                        "uint64", "int64",   "float64"};
    return type < sizeof names / sizeof names[0] ? names[type] : "unknown";
}

/* A scalar at p as the union's widest member of its kind. */
static void widen(gg_kv *kv, uint32_t type, const uint8_t *p)
{
    uint64_t raw = le(p, (int)scalar_size(type));
    switch (type) {
    case DF_GGUF_INT8:
        kv->v.i = (int8_t)raw;
        break;
    case DF_GGUF_INT16:
        kv->v.i = (int16_t)raw;
        break;
    case DF_GGUF_INT32:
        kv->v.i = (int32_t)raw;
        break;
    case DF_GGUF_INT64:
        kv->v.i = (int64_t)raw;
        break;
    case DF_GGUF_FLOAT32: {
        uint32_t u = (uint32_t)raw;
        float f;
        memcpy(&f, &u, 4);
        kv->v.f = f;
        break;
    }
    case DF_GGUF_FLOAT64:
        memcpy(&kv->v.f, &raw, 8);
        break;
    default:
        kv->v.u = raw;
        break;
    }
}

static df_status read_array(cursor *c, gg_kv *kv)
{
    const df_gguf *g = c->g;
    uint32_t et;
    DF_TRY(read_u32(c, "an array's element type", &et));
    DF_TRY(read_u64(c, "an array's length", &kv->count));
    kv->elem_type = (df_gguf_value_type)et;
    if (et == DF_GGUF_ARRAY)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key '%s' is an array of arrays, which diffuse "
                         "does not read",
                         g->path, kv->key);
    size_t es = et == DF_GGUF_STRING ? 8 : scalar_size(et);
    if (es == 0)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': unknown array element type %u", g->path,
                         kv->key, et);
    size_t bytes;
    if (!df_size_mul((size_t)kv->count, es, &bytes) || kv->count > SIZE_MAX / 8 || bytes > c->left)
        return df_errorf(DF_E_FORMAT,
                         "%s: key '%s': an array of %llu %s needs at least %llu "
                         "bytes but the file has %zu left",
                         g->path, kv->key, (unsigned long long)kv->count, type_name(et),
                         (unsigned long long)kv->count * es, c->left);
    if (et != DF_GGUF_STRING) {
        const void *p = NULL;
        DF_TRY(take(c, bytes, "an array", &p));
        kv->arr = p;
        return DF_OK;
    }
    /* Strings: every element is a u64 length and its bytes. One pass to find the total,
     * which is below the bytes they occupy (each length field is 8 bytes, the NUL 1). */
    cursor probe = *c;
    for (uint64_t i = 0; i < kv->count; i++) {
        uint64_t n;
        const void *p = NULL;
        DF_TRY(read_u64(&probe, "an array string's length", &n));
        if (n > probe.left)
            return df_errorf(DF_E_FORMAT,
                             "%s: key '%s': element %llu claims %llu bytes but "
                             "the file has %zu left",
                             g->path, kv->key, (unsigned long long)i, (unsigned long long)n,
                             probe.left);
        DF_TRY(take(&probe, (size_t)n, "an array string", &p));
    }
    size_t total = (size_t)(probe.p - c->p);
    kv->arr_strings = df_malloc(total ? total : 1);
    kv->arr_offsets = df_malloc(sizeof *kv->arr_offsets * (size_t)(kv->count ? kv->count : 1));
    if (!kv->arr_strings || !kv->arr_offsets)
        return df_errorf(DF_E_OOM, "%s: out of memory for the array '%s'", g->path, kv->key);
    size_t at = 0;
    for (uint64_t i = 0; i < kv->count; i++) {
        uint64_t n = le(c->p, 8);
        memcpy(kv->arr_strings + at, c->p + 8, (size_t)n);
        kv->arr_offsets[i] = at;
        kv->arr_strings[at + n] = '\0';
        at += (size_t)n + 1;
        c->p += 8 + n;
        c->left -= 8 + (size_t)n;
    }
    kv->arr_strings_end = at;
    return DF_OK;
}

static df_status read_kv(cursor *c, gg_kv *kv)
{
    DF_TRY(read_string(c, "a metadata key", true, &kv->key));
    uint32_t type;
    DF_TRY(read_u32(c, "a value type", &type));
    kv->type = (df_gguf_value_type)type;
    if (type == DF_GGUF_STRING)
        return read_string(c, "a string value", false, &kv->str);
    if (type == DF_GGUF_ARRAY)
        return read_array(c, kv);
    size_t n = scalar_size(type);
    if (n == 0)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': unknown value type %u", c->g->path, kv->key,
                         type);
    const void *p = NULL;
    DF_TRY(take(c, n, "a value", &p));
    widen(kv, type, p);
    if (type == DF_GGUF_BOOL && kv->v.u > 1)
        return df_errorf(DF_E_FORMAT, "%s: key '%s': a bool must be 0 or 1, found %llu", c->g->path,
                         kv->key, (unsigned long long)kv->v.u);
    return DF_OK;
}

static int kv_by_key(const void *a, const void *b)
{
    return strcmp((*(const gg_kv *const *)a)->key, (*(const gg_kv *const *)b)->key);
}

/* Duplicate keys, and general.alignment: a uint32 power of two. */
static df_status check_kv(df_gguf *g)
{
    const gg_kv **order = df_malloc(sizeof *order * (size_t)(g->n_kv ? g->n_kv : 1));
    if (!order)
        return df_errorf(DF_E_OOM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_kv; i++)
        order[i] = &g->kv[i];
    qsort(order, (size_t)g->n_kv, sizeof *order, kv_by_key);
    df_status s = DF_OK;
    for (int64_t i = 1; i < g->n_kv && s == DF_OK; i++)
        if (strcmp(order[i - 1]->key, order[i]->key) == 0)
            s = df_errorf(DF_E_FORMAT, "%s: metadata key '%s' appears twice", g->path,
                          order[i]->key);
    df_free(order);
    DF_TRY(s);
    g->alignment = DEFAULT_ALIGNMENT;
    int64_t k = df_gguf_kv_find(g, "general.alignment");
    if (k >= 0) {
        const gg_kv *a = &g->kv[k];
        if (a->type != DF_GGUF_UINT32 || a->v.u == 0 || (a->v.u & (a->v.u - 1)) != 0)
            return df_errorf(DF_E_FORMAT,
                             "%s: general.alignment must be a uint32 power of two, "
                             "found %s %llu",
                             g->path, type_name(a->type), (unsigned long long)a->v.u);
        g->alignment = (uint32_t)a->v.u;
    }
    return DF_OK;
}

static df_status read_tensor_info(cursor *c, gg_tensor *t)
{
    const df_gguf *g = c->g;
    DF_TRY(read_string(c, "a tensor name", true, &t->name));
    uint32_t ndim;
    DF_TRY(read_u32(c, "a tensor's dimension count", &ndim));
    if (ndim == 0 || ndim > DF_GGUF_MAX_DIMS)
        return df_errorf(ndim ? DF_E_UNSUPPORTED : DF_E_FORMAT,
                         "%s: tensor '%s' has %u "
                         "dimensions; GGUF tensors have 1 to %d",
                         g->path, t->name, ndim, DF_GGUF_MAX_DIMS);
    t->ndim = (int)ndim;
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t ne;
        DF_TRY(read_u64(c, "a tensor dimension", &ne));
        if (ne > (uint64_t)INT64_MAX || !df_i64_mul(t->numel, (int64_t)ne, &t->numel))
            return df_errorf(DF_E_FORMAT,
                             "%s: tensor '%s': dimension %d (%llu) makes it too "
                             "large to address",
                             g->path, t->name, d, (unsigned long long)ne);
        t->shape[t->ndim - 1 - d] = (int64_t)ne; /* ggml lists the innermost first */
    }
    DF_TRY(read_u32(c, "a tensor type", &t->type));
    DF_TRY(read_u64(c, "a tensor offset", &t->offset));
    t->info = df_qblock_info_of(t->type);
    if (!t->info)
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s' has unknown ggml type %u", g->path, t->name,
                         t->type);
    int64_t inner = t->shape[t->ndim - 1];
    if (inner % t->info->block != 0)
        return df_errorf(DF_E_FORMAT,
                         "%s: tensor '%s': its innermost dimension %lld is not a "
                         "multiple of %s's block of %d",
                         g->path, t->name, (long long)inner, t->info->name, t->info->block);
    size_t nbytes;
    if (!df_size_mul((size_t)(t->numel / t->info->block), (size_t)t->info->bytes, &nbytes))
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s' is too large to address", g->path, t->name);
    t->nbytes = nbytes;
    return DF_OK;
}

static int tensor_by_name(const void *a, const void *b)
{
    return strcmp(((const gg_tensor *)a)->name, ((const gg_tensor *)b)->name);
}

static int tensor_by_offset(const void *a, const void *b)
{
    const gg_tensor *x = *(const gg_tensor *const *)a, *y = *(const gg_tensor *const *)b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Offsets against the alignment and the data section; no overlaps; unique names. */
static df_status check_tensors(df_gguf *g)
{
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const gg_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return df_errorf(DF_E_FORMAT,
                             "%s: tensor '%s': offset %llu is not a multiple of "
                             "the alignment %u",
                             g->path, t->name, (unsigned long long)t->offset, g->alignment);
        if (t->offset > g->data_size || t->nbytes > g->data_size - t->offset)
            return df_errorf(DF_E_FORMAT,
                             "%s: tensor '%s' spans bytes [%llu, %llu) of the data "
                             "section but it has %llu bytes: truncated?",
                             g->path, t->name, (unsigned long long)t->offset,
                             (unsigned long long)(t->offset + t->nbytes),
                             (unsigned long long)g->data_size);
    }
    qsort(g->tensors, (size_t)g->n_tensors, sizeof *g->tensors, tensor_by_name);
    for (int64_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->tensors[i - 1].name, g->tensors[i].name) == 0)
            return df_errorf(DF_E_FORMAT, "%s: tensor '%s' appears twice", g->path,
                             g->tensors[i].name);
    const gg_tensor **order = df_malloc(sizeof *order * (size_t)(g->n_tensors + 1));
    if (!order)
        return df_errorf(DF_E_OOM, "%s: out of memory", g->path);
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = &g->tensors[i];
    qsort(order, (size_t)g->n_tensors, sizeof *order, tensor_by_offset);
    df_status s = DF_OK;
    const gg_tensor *a = NULL; /* the non-empty tensor that ends last so far */
    for (int64_t i = 0; i < g->n_tensors && s == DF_OK; i++) {
        const gg_tensor *b = order[i];
        if (b->nbytes == 0)
            continue;
        if (a && a->offset + a->nbytes > b->offset)
            s = df_errorf(DF_E_FORMAT,
                          "%s: tensors '%s' [%llu, %llu) and '%s' [%llu, %llu) "
                          "overlap",
                          g->path, a->name, (unsigned long long)a->offset,
                          (unsigned long long)(a->offset + a->nbytes), b->name,
                          (unsigned long long)b->offset,
                          (unsigned long long)(b->offset + b->nbytes));
        if (!a || b->offset + b->nbytes > a->offset + a->nbytes)
            a = b;
    }
    df_free(order);
    return s;
}

static df_status parse(df_gguf *g)
{
    cursor c = {g, g->base, g->size};
    const void *magic = NULL;
    DF_TRY(take(&c, 4, "the magic \"GGUF\"", &magic));
    if (memcmp(magic, "GGUF", 4) != 0)
        return df_errorf(DF_E_FORMAT, "%s: does not begin with \"GGUF\" (not a GGUF file?)",
                         g->path);
    DF_TRY(read_u32(&c, "the version", &g->version));
    if (g->version == 0x02000000u || g->version == 0x03000000u)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: a big-endian GGUF file; diffuse reads "
                         "little-endian ones",
                         g->path);
    if (g->version == 1)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: GGUF version 1 is not supported (convert it "
                         "to version 3)",
                         g->path);
    if (g->version != 2 && g->version != 3)
        return df_errorf(DF_E_FORMAT, "%s: unknown GGUF version %u (expected 3)", g->path,
                         g->version);
    uint64_t n_tensors, n_kv;
    DF_TRY(read_u64(&c, "the tensor count", &n_tensors));
    DF_TRY(read_u64(&c, "the metadata count", &n_kv));
    if (n_kv > c.left / 13 || n_tensors > c.left / 28)
        return df_errorf(
            DF_E_FORMAT,
            "%s: truncated or corrupt: %llu metadata entries and %llu tensors cannot fit "
            "in the %zu bytes that follow the header",
            g->path, (unsigned long long)n_kv, (unsigned long long)n_tensors, c.left);
    g->kv = df_calloc((size_t)(n_kv ? n_kv : 1), sizeof *g->kv);
    g->tensors = df_calloc((size_t)(n_tensors ? n_tensors : 1), sizeof *g->tensors);
    if (!g->kv || !g->tensors)
        return df_errorf(DF_E_OOM, "%s: out of memory for %llu tensors", g->path,
                         (unsigned long long)n_tensors);
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv++; /* counted before reading so that free releases a partial entry */
        DF_TRY_CTX(read_kv(&c, &g->kv[i]), "metadata entry %llu", (unsigned long long)i);
    }
    DF_TRY(check_kv(g));
    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors++;
        DF_TRY(read_tensor_info(&c, &g->tensors[i]));
    }
    uint64_t pos = cursor_pos(&c);
    g->data_start = (pos + g->alignment - 1) / g->alignment * g->alignment;
    g->data_size = g->data_start < g->size ? g->size - g->data_start : 0;
    return check_tensors(g);
}

static df_gguf *new_handle(const char *name)
{
    df_gguf *g = df_calloc(1, sizeof *g);
    if (g)
        g->path = df_strdup(name);
    if (!g || !g->path) {
        df_free(g);
        df_errorf(DF_E_OOM, "out of memory opening %s", name);
        return NULL;
    }
    g->base = (const uint8_t *)"";
    return g;
}

df_status df_gguf_open_memory(const void *buf, size_t len, const char *name, df_gguf **out)
{
    if (!out)
        return df_errorf(DF_E_ARG, "df_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!buf && len)
        return df_errorf(DF_E_ARG, "df_gguf_open_memory: buffer is NULL");
    df_gguf *g = new_handle(name ? name : "<memory>");
    if (!g)
        return DF_E_OOM;
    if (buf)
        g->base = buf;
    g->size = len;
    df_status s = parse(g);
    if (s != DF_OK) {
        df_gguf_free(g);
        return s;
    }
    *out = g;
    return DF_OK;
}

df_status df_gguf_open(const char *path, df_gguf **out)
{
    if (!out || !path)
        return df_errorf(DF_E_ARG, "df_gguf_open: NULL argument");
    *out = NULL;
    int fd;
    size_t size;
    DF_TRY(df_file_open_mappable(path, &fd, &size));
    df_gguf *g = new_handle(path);
    if (!g) {
        close(fd);
        return DF_E_OOM;
    }
    g->size = size;
    df_status s = size > 0 ? df_file_map(fd, size, path, &g->base) : DF_OK;
    g->mapped = s == DF_OK && size > 0;
    close(fd);
    if (s == DF_OK)
        s = parse(g);
    if (s != DF_OK) {
        df_gguf_free(g);
        return s;
    }
    *out = g;
    return DF_OK;
}

void df_gguf_free(df_gguf *g)
{
    if (!g)
        return;
    if (g->mapped)
        munmap((void *)g->base, g->size);
    for (int64_t i = 0; i < g->n_kv; i++) {
        df_free(g->kv[i].key);
        df_free(g->kv[i].str);
        df_free(g->kv[i].arr_strings);
        df_free(g->kv[i].arr_offsets);
    }
    for (int64_t i = 0; i < g->n_tensors; i++)
        df_free(g->tensors[i].name);
    df_free(g->kv);
    df_free(g->tensors);
    df_free(g->path);
    df_free(g);
}

/* ---- looking up ------------------------------------------------------------------- */

const char *df_gguf_path(const df_gguf *g)
{
    return g ? g->path : "";
}

uint32_t df_gguf_version(const df_gguf *g)
{
    return g ? g->version : 0;
}

uint32_t df_gguf_alignment(const df_gguf *g)
{
    return g ? g->alignment : 0;
}

int64_t df_gguf_count(const df_gguf *g)
{
    return g ? g->n_tensors : 0;
}

uint64_t df_gguf_tensor_bytes(const df_gguf *g)
{
    uint64_t total = 0;
    for (int64_t i = 0; g && i < g->n_tensors; i++)
        total += g->tensors[i].nbytes;
    return total;
}

static const gg_tensor *lookup(const df_gguf *g, const char *name)
{
    if (!g || !name)
        return NULL;
    gg_tensor probe = {.name = (char *)name};
    return bsearch(&probe, g->tensors, (size_t)g->n_tensors, sizeof *g->tensors, tensor_by_name);
}

static void fill(const df_gguf *g, const gg_tensor *t, df_gguf_tensor *out)
{
    memset(out, 0, sizeof *out);
    out->name = t->name;
    out->type = t->type;
    out->type_name = t->info->name;
    out->readable = t->info->dequant;
    out->ndim = t->ndim;
    memcpy(out->shape, t->shape, sizeof t->shape);
    out->numel = t->numel;
    out->block = t->info->block;
    out->offset = g->data_start + t->offset;
    out->nbytes = (size_t)t->nbytes;
    out->data = g->base + g->data_start + t->offset;
}

df_status df_gguf_at(const df_gguf *g, int64_t i, df_gguf_tensor *out)
{
    if (!g || i < 0 || i >= g->n_tensors)
        return df_errorf(DF_E_ARG, "%s: tensor index %lld out of range", df_gguf_path(g),
                         (long long)i);
    fill(g, &g->tensors[i], out);
    return DF_OK;
}

df_status df_gguf_find(const df_gguf *g, const char *name, df_gguf_tensor *out)
{
    const gg_tensor *t = lookup(g, name);
    if (!t) {
        memset(out, 0, sizeof *out);
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_gguf_path(g),
                         name ? name : "(null)");
    }
    fill(g, t, out);
    return DF_OK;
}

bool df_gguf_contains(const df_gguf *g, const char *name)
{
    return lookup(g, name) != NULL;
}

/* ---- metadata --------------------------------------------------------------------- */

int64_t df_gguf_kv_count(const df_gguf *g)
{
    return g ? g->n_kv : 0;
}

const char *df_gguf_kv_key(const df_gguf *g, int64_t i, df_gguf_value_type *type,
                           df_gguf_value_type *elem_type, uint64_t *count)
{
    if (!g || i < 0 || i >= g->n_kv)
        return NULL;
    if (type)
        *type = g->kv[i].type;
    if (elem_type)
        *elem_type = g->kv[i].elem_type;
    if (count)
        *count = g->kv[i].type == DF_GGUF_ARRAY ? g->kv[i].count : 1;
    return g->kv[i].key;
}

int64_t df_gguf_kv_find(const df_gguf *g, const char *key)
{
    for (int64_t i = 0; g && key && i < g->n_kv; i++)
        if (strcmp(g->kv[i].key, key) == 0)
            return i;
    return -1;
}

static df_status find_kv(const df_gguf *g, const char *key, const char *want, const gg_kv **out)
{
    int64_t i = df_gguf_kv_find(g, key);
    *out = i >= 0 ? &g->kv[i] : NULL;
    if (i < 0)
        return df_errorf(DF_E_FORMAT, "%s: no metadata key '%s' (expected %s)", df_gguf_path(g),
                         key ? key : "(null)", want);
    return DF_OK;
}

static bool is_int(uint32_t t)
{
    return t <= DF_GGUF_INT32 || t == DF_GGUF_BOOL || t == DF_GGUF_UINT64 || t == DF_GGUF_INT64;
}

static bool is_signed(uint32_t t)
{
    return t == DF_GGUF_INT8 || t == DF_GGUF_INT16 || t == DF_GGUF_INT32 || t == DF_GGUF_INT64;
}

df_status df_gguf_get_int(const df_gguf *g, const char *key, int64_t *out)
{
    const gg_kv *kv;
    DF_TRY(find_kv(g, key, "an integer", &kv));
    if (!is_int(kv->type))
        return df_errorf(DF_E_FORMAT, "%s: metadata '%s' is a %s; expected an integer", g->path,
                         key, type_name(kv->type));
    if (!is_signed(kv->type) && kv->v.u > (uint64_t)INT64_MAX)
        return df_errorf(DF_E_FORMAT, "%s: metadata '%s' (%llu) does not fit in int64", g->path,
                         key, (unsigned long long)kv->v.u);
    *out = is_signed(kv->type) ? kv->v.i : (int64_t)kv->v.u;
    return DF_OK;
}

df_status df_gguf_get_float(const df_gguf *g, const char *key, double *out)
{
    const gg_kv *kv;
    DF_TRY(find_kv(g, key, "a number", &kv));
    if (kv->type == DF_GGUF_FLOAT32 || kv->type == DF_GGUF_FLOAT64)
        *out = kv->v.f;
    else if (is_int(kv->type))
        *out = is_signed(kv->type) ? (double)kv->v.i : (double)kv->v.u;
    else
        return df_errorf(DF_E_FORMAT, "%s: metadata '%s' is a %s; expected a number", g->path, key,
                         type_name(kv->type));
    return DF_OK;
}

df_status df_gguf_get_string(const df_gguf *g, const char *key, const char **out)
{
    const gg_kv *kv;
    DF_TRY(find_kv(g, key, "a string", &kv));
    if (kv->type != DF_GGUF_STRING)
        return df_errorf(DF_E_FORMAT, "%s: metadata '%s' is a %s; expected a string", g->path, key,
                         type_name(kv->type));
    *out = kv->str;
    return DF_OK;
}

static df_status array_elem(const df_gguf *g, const char *key, uint64_t i, bool strings,
                            const gg_kv **out)
{
    DF_TRY(find_kv(g, key, "an array", out));
    const gg_kv *kv = *out;
    if (kv->type != DF_GGUF_ARRAY || (kv->elem_type == DF_GGUF_STRING) != strings)
        return df_errorf(DF_E_FORMAT, "%s: metadata '%s' is not an array of %s", g->path, key,
                         strings ? "strings" : "numbers");
    if (i >= kv->count)
        return df_errorf(DF_E_ARG, "%s: metadata '%s': index %llu past its %llu elements", g->path,
                         key, (unsigned long long)i, (unsigned long long)kv->count);
    return DF_OK;
}

df_status df_gguf_get_array_string(const df_gguf *g, const char *key, uint64_t i, const char **out)
{
    const gg_kv *kv;
    DF_TRY(array_elem(g, key, i, true, &kv));
    *out = kv->arr_strings + kv->arr_offsets[i];
    return DF_OK;
}

df_status df_gguf_get_array_bytes(const df_gguf *g, const char *key, uint64_t i,
                                  const char **out, size_t *len)
{
    const gg_kv *kv;
    DF_TRY(array_elem(g, key, i, true, &kv));
    uint64_t end = i + 1 < kv->count ? kv->arr_offsets[i + 1] : kv->arr_strings_end;
    *out = kv->arr_strings + kv->arr_offsets[i];
    *len = (size_t)(end - kv->arr_offsets[i] - 1);
    return DF_OK;
}

df_status df_gguf_get_array_number(const df_gguf *g, const char *key, uint64_t i, double *out)
{
    const gg_kv *kv;
    DF_TRY(array_elem(g, key, i, false, &kv));
    gg_kv one = {0};
    size_t es = scalar_size(kv->elem_type);
    widen(&one, kv->elem_type, kv->arr + i * es);
    if (kv->elem_type == DF_GGUF_FLOAT32 || kv->elem_type == DF_GGUF_FLOAT64)
        *out = one.v.f;
    else
        *out = is_signed(kv->elem_type) ? (double)one.v.i : (double)one.v.u;
    return DF_OK;
}

/* ---- reads ------------------------------------------------------------------------ */

df_status df_gguf_read_rows(const df_gguf *g, const char *name, int64_t r0, int64_t r1, df_dtype as,
                            void *dst, size_t dst_bytes)
{
    const gg_tensor *t = lookup(g, name);
    if (!t)
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_gguf_path(g),
                         name ? name : "(null)");
    if (as != DF_DTYPE_F32 && as != DF_DTYPE_BF16 && as != DF_DTYPE_F16)
        return df_errorf(DF_E_ARG, "%s: tensor '%s' can be read as f32, bf16 or f16, not %s",
                         g->path, name, df_dtype_name(as));
    if (!t->info->dequant)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: tensor '%s' is stored as %s, which diffuse "
                         "does not dequantise",
                         g->path, name, t->info->name);
    if (r1 < 0)
        r1 = t->shape[0];
    if (r0 < 0 || r1 < r0 || r1 > t->shape[0])
        return df_errorf(DF_E_ARG,
                         "%s: tensor '%s': rows [%lld, %lld) are not inside its "
                         "%lld rows",
                         g->path, name, (long long)r0, (long long)r1, (long long)t->shape[0]);
    int64_t row = t->shape[0] ? t->numel / t->shape[0] : 0;
    int64_t n = (r1 - r0) * row;
    size_t need = (size_t)n * df_dtype_size(as);
    if (dst_bytes < need || (need && !dst))
        return df_errorf(DF_E_ARG,
                         "%s: tensor '%s': the destination has %zu bytes; %zu are "
                         "needed",
                         g->path, name, dst ? dst_bytes : 0, need);
    const int block = t->info->block;
    const size_t bbytes = (size_t)t->info->bytes;
    /* A row of two or more dimensions is a whole number of blocks (the innermost dimension
     * is, and a row is a product that includes it); a 1-D tensor's rows are single values,
     * so its row ranges must start and end on a block. */
    if ((r0 * row) % block != 0 || n % block != 0)
        return df_errorf(DF_E_ARG,
                         "%s: tensor '%s': rows [%lld, %lld) do not start and end on a %s "
                         "block (%d values)",
                         g->path, name, (long long)r0, (long long)r1, t->info->name, block);
    const uint8_t *src = g->base + g->data_start + t->offset + (size_t)(r0 * row / block) * bbytes;
    if (as == DF_DTYPE_F32)
        return df_qblock_dequant(t->type, src, n / block, dst);
    float stage[STAGE_FLOATS];
    const int64_t per = STAGE_FLOATS / block; /* blocks per chunk; block <= 256 */
    for (int64_t b = 0; b < n / block; b += per) {
        int64_t m = n / block - b < per ? n / block - b : per;
        DF_TRY(df_qblock_dequant(t->type, src + (size_t)b * bbytes, m, stage));
        DF_TRY(df_convert(stage, DF_DTYPE_F32, (uint8_t *)dst + (size_t)(b * block) * 2, as,
                          m * block));
    }
    return DF_OK;
}

df_status df_gguf_release_pages(const df_gguf *g, const char *name)
{
    const gg_tensor *t = lookup(g, name);
    if (!t)
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_gguf_path(g),
                         name ? name : "(null)");
    if (!g->mapped || t->nbytes == 0)
        return DF_OK;
    uint64_t begin = g->data_start + t->offset;
    if (!df_map_release_pages(g->base, g->size, begin, begin + t->nbytes))
        return df_errorf(DF_E_IO, "%s: cannot release the pages of '%s'", g->path, name);
    return DF_OK;
}
