/*
 * Safetensors reads: whole tensors, row ranges and column ranges, with dtype conversion,
 * and giving pages back after use.
 *
 * Offsets were checked at open, so a read only checks the caller's arguments. Every read
 * adds the number of stored bytes it touched to the handle's counter (atomically: reads may
 * run on several threads), which is how tests prove that a slice read touched only its
 * slice. Conversion goes through df_convert with two guards for files from the internet:
 * data whose address is not a multiple of its element size (possible when a writer left
 * the header length odd) is staged through an aligned buffer, and conversions to an integer
 * dtype check every value, because converting NaN or an out-of-range float to an integer
 * is undefined behaviour.
 *
 * fp8 tensors (F8_E4M3, F8_E5M2) read into float dtypes only: each element is widened to
 * f32 exactly, multiplied by its scale when the file has one (ComfyUI's "<m>.scale_weight"
 * or "<m>.weight_scale": one value, or one per row), and rounded once to the target, a few
 * KB at a time.
 */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "io/safetensors.h"

#define STAGE_BYTES 8192

static bool is_integer(df_dtype t)
{
    return t == DF_DTYPE_I32 || t == DF_DTYPE_I64 || t == DF_DTYPE_U8;
}

/* Whether v converts to integer dtype t without leaving its range (NaN does not). */
static bool fits(double v, df_dtype t)
{
    switch (t) {
    case DF_DTYPE_I32: return v > -2147483649.0 && v < 2147483648.0;
    case DF_DTYPE_I64: return v >= -9223372036854775808.0 && v < 9223372036854775808.0;
    case DF_DTYPE_U8:  return v > -1.0 && v < 256.0;
    default:           return true;
    }
}

/* Converts to an integer dtype through f64 with a range check per value. */
static df_status convert_checked(const df_safetensors *st, const char *name, const void *src,
                                 df_dtype from, void *dst, df_dtype to, int64_t n)
{
    _Alignas(8) double buf[STAGE_BYTES / sizeof(double)];
    const int64_t chunk = (int64_t)(sizeof buf / sizeof buf[0]);
    size_t in = df_dtype_size(from), outsz = df_dtype_size(to);
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        DF_TRY(df_convert((const uint8_t *)src + (size_t)i * in, from, buf, DF_DTYPE_F64, m));
        for (int64_t k = 0; k < m; k++) {
            if (!fits(buf[k], to))
                return df_errorf(DF_E_FORMAT, "%s: tensor '%s': element %lld (%g) does not "
                                 "fit in %s", st->path, name, (long long)(i + k), buf[k],
                                 df_dtype_name(to));
        }
        DF_TRY(df_convert(buf, DF_DTYPE_F64, (uint8_t *)dst + (size_t)i * outsz, to, m));
    }
    return DF_OK;
}

/* Copies n elements from the mapping to dst, converting from -> to. */
static df_status copy_convert(const df_safetensors *st, const char *name, const uint8_t *src,
                              df_dtype from, void *dst, df_dtype to, int64_t n)
{
    size_t in = df_dtype_size(from);
    if (n == 0)
        return DF_OK;
    if (from == to) {
        memcpy(dst, src, (size_t)n * in);
        return DF_OK;
    }
    /* Only widening integer conversions are safe without a look at each value. */
    bool checked = is_integer(to) && !(is_integer(from) && df_dtype_size(to) > in);
    if ((uintptr_t)src % in == 0) {
        if (checked)
            return convert_checked(st, name, src, from, dst, to, n);
        return df_convert(src, from, dst, to, n);
    }
    /* Unaligned source: stage through an aligned buffer. */
    _Alignas(16) uint8_t stage[STAGE_BYTES];
    const int64_t chunk = (int64_t)(STAGE_BYTES / in);
    size_t outsz = df_dtype_size(to);
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        memcpy(stage, src + (size_t)i * in, (size_t)m * in);
        void *d = (uint8_t *)dst + (size_t)i * outsz;
        if (checked)
            DF_TRY(convert_checked(st, name, stage, from, d, to, m));
        else
            DF_TRY(df_convert(stage, from, d, to, m));
    }
    return DF_OK;
}

/* ---- fp8 ---------------------------------------------------------------------------- */

/* The scale tensor of fp8 tensor `name`: ComfyUI's "<m>.scale_weight" beside "<m>.weight",
 * or "<name>_scale" ("<m>.weight_scale"). NULL when it has none. */
static const st_entry *f8_scale_entry(const df_safetensors *st, const char *name)
{
    char buf[1024];
    size_t n = strlen(name);
    if (n > 7 && n < sizeof buf - 16 && strcmp(name + n - 7, ".weight") == 0) {
        snprintf(buf, sizeof buf, "%.*s.scale_weight", (int)(n - 7), name);
        const st_entry *e = df_st_lookup(st, buf);
        if (e)
            return e;
    }
    if (n >= sizeof buf - 8)
        return NULL;
    snprintf(buf, sizeof buf, "%s_scale", name);
    return df_st_lookup(st, buf);
}

/* The scales of rows [r0, r1) of fp8 tensor e into s[0 .. r1 - r0): 1 without a scale
 * tensor; its one value; or its values r0 .. r1 when it has one per row. */
static df_status f8_scales(const df_safetensors *st, const char *name, const st_entry *e,
                           int64_t r0, int64_t r1, float *s)
{
    const st_entry *se = f8_scale_entry(st, name);
    int64_t rows = e->ndim ? e->shape[0] : 1;
    if (!se) {
        for (int64_t r = r0; r < r1; r++)
            s[r - r0] = 1.0f;
        return DF_OK;
    }
    if (se->dtype != DF_DTYPE_F32 && se->dtype != DF_DTYPE_BF16 && se->dtype != DF_DTYPE_F16)
        return df_errorf(DF_E_FORMAT, "%s: '%s', the scale of fp8 tensor '%s', is %s; "
                         "expected F32, BF16 or F16", st->path, se->name, name, se->dtype_name);
    if (se->numel == 1) {
        float one;
        DF_TRY(copy_convert(st, se->name, st->data + se->begin, se->dtype, &one, DF_DTYPE_F32,
                            1));
        for (int64_t r = r0; r < r1; r++)
            s[r - r0] = one;
        return DF_OK;
    }
    if (se->numel != rows)
        return df_errorf(DF_E_FORMAT, "%s: '%s', the scale of fp8 tensor '%s', has %lld values; "
                         "expected 1 or one per row (%lld)", st->path, se->name, name,
                         (long long)se->numel, (long long)rows);
    return copy_convert(st, se->name, st->data + se->begin + (size_t)r0 * se->elem_size,
                        se->dtype, s, DF_DTYPE_F32, r1 - r0);
}

/* Widens n fp8 elements of e starting at element `first` (in rows of row_len elements;
 * scales[r - r0] is row r's scale) and writes them to dst as `as`. */
static df_status copy_f8(const df_safetensors *st, const st_entry *e, int64_t first, int64_t n,
                         int64_t row_len, int64_t r0, const float *scales, void *dst,
                         df_dtype as)
{
    float lut[256]; /* every byte's value: a table beats decoding each element */
    for (int b = 0; b < 256; b++)
        lut[b] = e->f8 == ST_F8_E4M3 ? df_f8_e4m3_to_f32((uint8_t)b)
                                     : df_f8_e5m2_to_f32((uint8_t)b);
    float stage[STAGE_BYTES / sizeof(float)];
    const int64_t chunk = (int64_t)(sizeof stage / sizeof stage[0]);
    const uint8_t *src = st->data + e->begin;
    size_t outsz = df_dtype_size(as);
    for (int64_t i = 0; i < n; i += chunk) {
        int64_t m = n - i < chunk ? n - i : chunk;
        float *out = as == DF_DTYPE_F32 ? (float *)dst + i : stage;
        for (int64_t k = 0; k < m; k++) {
            int64_t at = first + i + k;
            out[k] = lut[src[at]] * scales[(row_len ? at / row_len : 0) - r0];
        }
        if (as != DF_DTYPE_F32)
            DF_TRY(df_convert(stage, DF_DTYPE_F32, (uint8_t *)dst + (size_t)i * outsz, as, m));
    }
    return DF_OK;
}

/* Reads elements [first, first + n) of fp8 tensor e, all inside rows [r0, r1). */
static df_status read_f8(const df_safetensors *st, const char *name, const st_entry *e,
                         int64_t r0, int64_t r1, int64_t first, int64_t n, void *dst,
                         df_dtype as)
{
    int64_t rows = e->ndim ? e->shape[0] : 1;
    int64_t row_len = rows ? e->numel / rows : 0;
    float *scales = df_malloc(sizeof *scales * (size_t)(r1 - r0 + 1));
    if (!scales)
        return df_errorf(DF_E_OOM, "%s: out of memory reading '%s'", st->path, name);
    df_status s = f8_scales(st, name, e, r0, r1, scales);
    if (s == DF_OK)
        s = copy_f8(st, e, first, n, row_len, r0, scales, dst, as);
    df_free(scales);
    return s;
}

/* Finds the tensor and checks that it can be read as `as` into dst_bytes for n elements. */
static df_status prepare(const df_safetensors *st, const char *name, df_dtype as, int64_t n,
                         size_t dst_bytes, const void *dst, const st_entry **out)
{
    *out = NULL;
    if (!st || !name)
        return df_errorf(DF_E_ARG, "safetensors read: NULL handle or name");
    const st_entry *e = df_st_lookup(st, name);
    if (!e)
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", st->path, name);
    if ((unsigned)as >= DF_DTYPE_COUNT)
        return df_errorf(DF_E_ARG, "%s: tensor '%s': invalid target dtype %d", st->path, name,
                         (int)as);
    if (e->f8 && as != DF_DTYPE_F32 && as != DF_DTYPE_BF16 && as != DF_DTYPE_F16 &&
        as != DF_DTYPE_F64)
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s' is stored as %s, which reads as a "
                         "float dtype, not %s", st->path, name, e->dtype_name,
                         df_dtype_name(as));
    if (e->dtype == DF_DTYPE_COUNT && !e->f8)
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s' is stored as %s, which diffuse "
                         "does not load", st->path, name, e->dtype_name);
    if (n < 0)
        n = e->numel;
    size_t need;
    if (!df_size_mul((size_t)n, df_dtype_size(as), &need))
        return df_errorf(DF_E_ARG, "%s: tensor '%s' is too large to read", st->path, name);
    if (dst_bytes < need)
        return df_errorf(DF_E_ARG, "%s: tensor '%s': the destination has %zu bytes; %zu are "
                         "needed", st->path, name, dst_bytes, need);
    if (need > 0 && !dst)
        return df_errorf(DF_E_ARG, "%s: tensor '%s': destination is NULL", st->path, name);
    *out = e;
    return DF_OK;
}

static void count_bytes(const df_safetensors *st, uint64_t n)
{
    atomic_fetch_add(&((df_safetensors *)st)->bytes_read, n);
}

df_status df_safetensors_read(const df_safetensors *st, const char *name, df_dtype as,
                              void *dst, size_t dst_bytes)
{
    const st_entry *e;
    DF_TRY(prepare(st, name, as, -1, dst_bytes, dst, &e));
    count_bytes(st, e->end - e->begin);
    if (e->f8)
        return read_f8(st, name, e, 0, e->ndim ? e->shape[0] : 1, 0, e->numel, dst, as);
    return copy_convert(st, name, st->data + e->begin, e->dtype, dst, as, e->numel);
}

df_status df_safetensors_read_rows(const df_safetensors *st, const char *name, int64_t r0,
                                   int64_t r1, df_dtype as, void *dst, size_t dst_bytes)
{
    const st_entry *e = df_st_lookup(st, name);
    if (e && e->ndim < 1)
        return df_errorf(DF_E_SHAPE, "%s: tensor '%s' is a scalar; it has no rows", st->path,
                         name);
    if (e && (r0 < 0 || r1 < r0 || r1 > e->shape[0]))
        return df_errorf(DF_E_ARG, "%s: tensor '%s': rows [%lld, %lld) are not inside its "
                         "%lld rows", st->path, name, (long long)r0, (long long)r1,
                         (long long)e->shape[0]);
    int64_t row = 0, n = 0;
    if (e) {
        row = e->shape[0] ? e->numel / e->shape[0] : 0;
        n = (r1 - r0) * row;
    }
    DF_TRY(prepare(st, name, as, n, dst_bytes, dst, &e));
    size_t first = (size_t)(r0 * row) * e->elem_size;
    count_bytes(st, (uint64_t)n * e->elem_size);
    if (e->f8)
        return read_f8(st, name, e, r0, r1, r0 * row, n, dst, as);
    return copy_convert(st, name, st->data + e->begin + first, e->dtype, dst, as, n);
}

df_status df_safetensors_read_cols(const df_safetensors *st, const char *name, int64_t c0,
                                   int64_t c1, df_dtype as, void *dst, size_t dst_bytes)
{
    const st_entry *e = df_st_lookup(st, name);
    if (e && e->ndim != 2)
        return df_errorf(DF_E_SHAPE, "%s: tensor '%s' has %d dimensions; column ranges are "
                         "read from 2-D tensors", st->path, name, e->ndim);
    if (e && (c0 < 0 || c1 < c0 || c1 > e->shape[1]))
        return df_errorf(DF_E_ARG, "%s: tensor '%s': columns [%lld, %lld) are not inside its "
                         "%lld columns", st->path, name, (long long)c0, (long long)c1,
                         (long long)e->shape[1]);
    int64_t rows = e ? e->shape[0] : 0, cols = e ? e->shape[1] : 0, w = c1 - c0;
    DF_TRY(prepare(st, name, as, rows * w, dst_bytes, dst, &e));
    size_t outsz = df_dtype_size(as);
    count_bytes(st, (uint64_t)(rows * w) * e->elem_size);
    for (int64_t r = 0; r < rows && w > 0 && e->f8; r++)
        DF_TRY(read_f8(st, name, e, r, r + 1, r * cols + c0, w,
                       (uint8_t *)dst + (size_t)(r * w) * outsz, as));
    for (int64_t r = 0; r < rows && w > 0 && !e->f8; r++) {
        const uint8_t *src = st->data + e->begin + (size_t)(r * cols + c0) * e->elem_size;
        DF_TRY(copy_convert(st, name, src, e->dtype, (uint8_t *)dst + (size_t)(r * w) * outsz,
                            as, w));
    }
    return DF_OK;
}

uint64_t df_safetensors_bytes_read(const df_safetensors *st)
{
    return st ? atomic_load(&((df_safetensors *)st)->bytes_read) : 0;
}

df_status df_safetensors_release_pages(const df_safetensors *st, const char *name)
{
    if (!st)
        return df_errorf(DF_E_ARG, "df_safetensors_release_pages: NULL handle");
    uint64_t begin = 0, end = st->size;
    if (name) {
        const st_entry *e = df_st_lookup(st, name);
        if (!e)
            return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", st->path, name);
        begin = (uint64_t)(st->data - st->base) + e->begin;
        end = (uint64_t)(st->data - st->base) + e->end;
    }
    if (!st->mapped || end <= begin)
        return DF_OK; /* the caller's memory is not ours to drop */
    if (!df_map_release_pages(st->base, st->size, begin, end))
        return df_errorf(DF_E_IO, "%s: cannot release pages of '%s'", st->path,
                         name ? name : "the file");
    return DF_OK;
}
