/*
 * Single-file checkpoints: a safetensors or GGUF file read through a name map (see
 * single_file.h).
 *
 * Both readers list tensors in name order, so a lookup is a binary search over their "at"
 * calls and the bound tensors are marked in a bitmap over that order (the loader's
 * unexpected-tensor warning reads it). A tensor is wrapped in place only when its bytes are
 * the weight as the model computes it: one block of rows of an f32, bf16 or f16 tensor (a
 * GGUF F32/F16/BF16 tensor too; GGUF aligns data to 32 bytes). Everything else is read
 * block of rows by block of rows into one buffer of the final size and dtype, which the
 * tensor copies; fp8 and GGUF-quantised weights are upcast while being read, a few KB at a
 * time, so nothing the size of the whole tensor exists in f32 unless f32 is the compute
 * dtype, on the context's threads. (The buffer and the tensor's copy exist together for
 * one tensor at a time.) The
 * pages of a tensor read this way are given back after the read, so the resident set holds
 * the weights once, not the file's bytes beside them.
 *
 * Under int8 compute, a layer that int8 quantizes and whose weight is fp8 or a GGUF block
 * type is not read at all: one block of its rows is wrapped as an I8 tensor over the
 * file's bytes (df_tensor_wrap_blocks), which the int8 products pack as they run, so its
 * resident bytes are the file's (docs/int8.md).
 */
#include "models/single_file.h"

#include <stdio.h>
#include <string.h>

#include <diffuse/gguf.h>
#include <diffuse/quantize.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/quant_blocks.h"
#include "core/status.h"
#include "io/path.h"
#include "runtime/runtime.h"

struct df_single_file {
    char component[64];
    df_gguf *gguf; /* one of these two */
    df_weights *st;
    df_name_map map; /* NULL: the names are diffusers' own */
    int map_arg;
    char prefix[128];
    int64_t count;
    uint8_t *used;
};

/* What both readers say about a tensor. */
typedef struct src_info {
    const char *name;
    int ndim;
    int64_t shape[DF_SAFETENSORS_MAX_DIMS];
    int64_t numel;
    size_t nbytes;          /* stored bytes */
    df_dtype dtype;         /* stored float dtype when usable as is, else DF_DTYPE_COUNT */
    const char *dtype_name; /* the file's spelling */
    bool upcast;            /* fp8 or a GGUF block type: read as the compute dtype */
    uint32_t block_type;    /* its df_view.block_type when kept compact (ggml id, fp8) */
    size_t elem_size;       /* stored bytes per element when dtype is set */
    const void *data;
} src_info;

static int64_t reader_count(const df_single_file *sf)
{
    return sf->gguf ? df_gguf_count(sf->gguf) : df_weights_count(sf->st);
}

static df_status reader_at(const df_single_file *sf, int64_t i, src_info *out)
{
    memset(out, 0, sizeof *out);
    if (sf->gguf) {
        df_gguf_tensor t;
        DF_TRY(df_gguf_at(sf->gguf, i, &t));
        out->name = t.name;
        out->ndim = t.ndim;
        memcpy(out->shape, t.shape, sizeof t.shape);
        out->numel = t.numel;
        out->nbytes = t.nbytes;
        out->dtype_name = t.type_name;
        out->data = t.data;
        out->dtype = strcmp(t.type_name, "F32") == 0    ? DF_DTYPE_F32
                     : strcmp(t.type_name, "F16") == 0  ? DF_DTYPE_F16
                     : strcmp(t.type_name, "BF16") == 0 ? DF_DTYPE_BF16
                                                        : DF_DTYPE_COUNT;
        out->elem_size = out->dtype == DF_DTYPE_COUNT ? 0 : df_dtype_size(out->dtype);
        out->upcast = out->dtype == DF_DTYPE_COUNT && t.readable;
        out->block_type = out->upcast ? t.type : 0;
        return DF_OK;
    }
    df_tensor_info t;
    DF_TRY(df_weights_at(sf->st, i, &t));
    out->name = t.name;
    out->ndim = t.ndim;
    memcpy(out->shape, t.shape, sizeof t.shape);
    out->numel = t.numel;
    out->nbytes = t.nbytes;
    out->dtype_name = t.dtype_name;
    out->data = t.data;
    bool fl = t.dtype == DF_DTYPE_F32 || t.dtype == DF_DTYPE_BF16 || t.dtype == DF_DTYPE_F16;
    out->dtype = fl ? t.dtype : DF_DTYPE_COUNT;
    out->elem_size = t.elem_size;
    out->upcast = strcmp(t.dtype_name, "F8_E4M3") == 0 || strcmp(t.dtype_name, "F8_E5M2") == 0;
    out->block_type = !out->upcast                           ? 0
                      : strcmp(t.dtype_name, "F8_E4M3") == 0 ? DF_QBLOCK_F8_E4M3
                                                             : DF_QBLOCK_F8_E5M2;
    return DF_OK;
}

/* Index of the file's tensor `name`, or -1. */
static int64_t index_of(const df_single_file *sf, const char *name, src_info *info)
{
    int64_t lo = 0, hi = sf->count - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (reader_at(sf, mid, info) != DF_OK)
            return -1;
        int c = strcmp(info->name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* The prefix of the first name that ends in `probe`, preferring one that holds `hint`
 * (NULL: none; "clip_g" picks CLIP-G among an all-in-one file's two CLIPs); false when no
 * name ends in probe. */
static bool find_prefix(df_single_file *sf, const char *probe, const char *hint)
{
    size_t pn = strlen(probe);
    bool found = false;
    for (int64_t i = 0; i < sf->count; i++) {
        src_info t;
        if (reader_at(sf, i, &t) != DF_OK)
            return false;
        size_t n = strlen(t.name);
        if (n >= pn && strcmp(t.name + n - pn, probe) == 0 && n - pn < sizeof sf->prefix &&
            (n == pn || t.name[n - pn - 1] == '.')) {
            bool hinted = hint && memmem(t.name, n - pn, hint, strlen(hint));
            if (!found || hinted) {
                memcpy(sf->prefix, t.name, n - pn);
                sf->prefix[n - pn] = '\0';
            }
            found = true;
            if (!hint || hinted)
                return true;
        }
    }
    return found;
}

df_status df_single_file_open(const char *path, const char *component, df_name_map map, int arg,
                              const char *probe, df_single_file **out)
{
    *out = NULL;
    df_single_file *sf = df_calloc(1, sizeof *sf);
    if (!sf)
        return df_errorf(DF_E_OOM, "%s: out of memory", component);
    snprintf(sf->component, sizeof sf->component, "%s", component);
    df_status s = df_str_ends_with(path, ".gguf") ? df_gguf_open(path, &sf->gguf)
                                                  : df_weights_open(path, &sf->st);
    if (s == DF_OK) {
        sf->count = reader_count(sf);
        sf->used = df_calloc((size_t)(sf->count ? sf->count : 1), 1);
        if (!sf->used)
            s = df_errorf(DF_E_OOM, "%s: out of memory", component);
    }
    if (s == DF_OK)
        df_single_file_try_map(sf, map, arg, probe, NULL);
    if (s != DF_OK) {
        df_single_file_free(sf);
        return s;
    }
    *out = sf;
    return DF_OK;
}

bool df_single_file_try_map(df_single_file *sf, df_name_map map, int arg, const char *probe,
                            const char *hint)
{
    if (sf->map || !map || !probe || !find_prefix(sf, probe, hint))
        return false;
    sf->map = map;
    sf->map_arg = arg;
    return true;
}

void df_single_file_free(df_single_file *sf)
{
    if (!sf)
        return;
    df_gguf_free(sf->gguf);
    df_weights_free(sf->st);
    df_free(sf->used);
    df_free(sf);
}

const char *df_single_file_path(const df_single_file *sf)
{
    return sf->gguf ? df_gguf_path(sf->gguf) : df_weights_path(sf->st);
}

const char *df_single_file_prefix(const df_single_file *sf)
{
    return sf->prefix;
}

bool df_single_file_mapped(const df_single_file *sf)
{
    return sf->map != NULL;
}

/* Where diffusers tensor `name` is: the file's full name and its rows. */
static bool resolve(const df_single_file *sf, const char *name, df_name_src *src)
{
    df_name_src m = {.units = 1, .n = 1, .part = {{0, 1}}};
    if (sf->map) {
        if (!sf->map(name, sf->map_arg, &m))
            return false;
    } else {
        snprintf(m.name, sizeof m.name, "%s", name);
    }
    *src = m;
    int n = snprintf(src->name, sizeof src->name, "%s%s", sf->prefix, m.name);
    return n > 0 && (size_t)n < sizeof src->name;
}

bool df_single_file_has(const df_single_file *sf, const char *name)
{
    df_name_src src;
    src_info info;
    return resolve(sf, name, &src) && index_of(sf, src.name, &info) >= 0;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used +=
            (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* The file's dimensions as the model sees them: trailing 1s beyond the `ndim` it asks for
 * are dropped (LDM's 1x1 convolutions [C, C, 1, 1] are diffusers' linears [C, C]). */
static int file_ndim(const src_info *info, int ndim)
{
    int n = info->ndim;
    while (n > ndim && n > 1 && info->shape[n - 1] == 1)
        n--;
    return n;
}

/* Checks the file's tensor against the shape the model asks for, given the rows the map
 * takes; *rows receives that row count. */
static df_status check_shape(const df_single_file *sf, const char *name, const df_name_src *src,
                             const src_info *info, int ndim, const int64_t *shape, int64_t *rows)
{
    int64_t have = info->ndim ? info->shape[0] : 1;
    bool fits = file_ndim(info, ndim) == ndim && ndim >= 1 && have % src->units == 0;
    *rows = 0;
    for (int p = 0; fits && p < src->n; p++)
        *rows += have / src->units * (src->part[p][1] - src->part[p][0]);
    fits = fits && (shape[0] < 0 || shape[0] == *rows);
    for (int d = 1; fits && d < ndim; d++)
        fits = shape[d] < 0 || info->shape[d] == shape[d];
    if (fits)
        return DF_OK;
    char want[160], got[160];
    shape_str(want, sizeof want, ndim, shape);
    shape_str(got, sizeof got, info->ndim, info->shape);
    if (src->units > 1)
        return df_errorf(DF_E_FORMAT,
                         "%s: %s: tensor '%s' (for diffusers' '%s', %d of its %d "
                         "row blocks) has shape %s; expected %s for that part",
                         sf->component, df_single_file_path(sf), src->name, name,
                         src->part[0][1] - src->part[0][0], src->units, got, want);
    return df_errorf(DF_E_FORMAT,
                     "%s: %s: tensor '%s' (diffusers' '%s') has shape %s, "
                     "expected %s",
                     sf->component, df_single_file_path(sf), src->name, name, got, want);
}

/* Reads rows [r0, r1) of the file's tensor into dst as `as`. */
static df_status read_rows(const df_single_file *sf, const src_info *info, int64_t r0, int64_t r1,
                           df_dtype as, void *dst, size_t bytes)
{
    if (sf->gguf)
        return df_gguf_read_rows(sf->gguf, info->name, r0, r1, as, dst, bytes);
    return df_weights_read_rows(sf->st, info->name, r0, r1, as, dst, bytes);
}

/* The index of an fp8 weight's scale tensor (safetensors_read.c's names), or -1. */
static int64_t scale_index(const df_single_file *sf, const char *name, src_info *info)
{
    char buf[300];
    size_t n = strlen(name);
    int64_t i = -1;
    if (n > 7 && n < 250 && strcmp(name + n - 7, ".weight") == 0) {
        snprintf(buf, sizeof buf, "%.*s.scale_weight", (int)(n - 7), name);
        i = index_of(sf, buf, info);
    }
    if (i < 0 && n < 250) {
        snprintf(buf, sizeof buf, "%s_scale", name);
        i = index_of(sf, buf, info);
    }
    return i;
}

/* An fp8 weight's scale is read with it (safetensors_read.c): mark it bound too. */
static void mark_scale_used(df_single_file *sf, const char *name)
{
    src_info info;
    int64_t i = scale_index(sf, name, &info);
    if (i >= 0)
        sf->used[i] = 1;
}

/*
 * Whether diffusers tensor `name` stays in the file's bytes (int8 compute only): a weight
 * the int8 policy quantizes, one block of rows of a GGUF block type the int8 products can
 * pack, or of fp8 with no scale or one for the whole tensor (*scale receives it). Anything
 * else is upcast on load.
 */
static bool stays_compact(df_single_file *sf, df_ctx *ctx, const char *name, int ndim,
                          const df_name_src *src, const src_info *info, float *scale)
{
    *scale = 1.0f;
    if (!info->block_type || src->n != 1 || ndim != 2 || info->ndim != 2 ||
        df_ctx_compute_dtype(ctx) != DF_DTYPE_I8 || !df_dev_has(ctx->dev, DF_CAP_INT8) ||
        !df_int8_quantizes(sf->component, name, ndim))
        return false;
    if (sf->gguf) {
        const df_qblock_info *q = df_qblock_info_of(info->block_type);
        return q && q->dequant && q->block > 1 && info->shape[1] % q->block == 0;
    }
    src_info sc;
    if (scale_index(sf, info->name, &sc) < 0)
        return true;
    return sc.numel == 1 &&
           df_weights_read(sf->st, sc.name, DF_DTYPE_F32, scale, sizeof *scale) == DF_OK;
}

/*
 * Reads rows [r0, r1) into dst (row_bytes each in `as`) on the context's threads: the
 * upcast or dequantisation is the cost of loading, and rows are independent. A chunk that
 * fails on a worker is read again on this thread, so the failure (and its message, which
 * is per thread) is this thread's.
 */
static df_status read_rows_threaded(const df_single_file *sf, const src_info *info, int64_t r0,
                                    int64_t r1, df_dtype as, uint8_t *dst, size_t row_bytes,
                                    int threads)
{
    int64_t rows = r1 - r0;
    int64_t per = rows / (threads > 1 ? 4 * threads : 1);
    if (per < 1)
        per = 1;
    /* A chunk starts on a block of the GGUF type: a row of a 1-D tensor is one value (sd.cpp
     * quantizes 1-D norm weights), so chunks of it are whole blocks of rows. */
    const df_qblock_info *q = sf->gguf && info->upcast ? df_qblock_info_of(info->block_type) : NULL;
    int64_t row = info->shape[0] ? info->numel / info->shape[0] : 0;
    if (q && row > 0 && row % q->block != 0) {
        int64_t g = row, b = q->block; /* g = gcd(row, block) */
        while (b) {
            int64_t t = g % b;
            g = b, b = t;
        }
        int64_t align = q->block / g; /* the fewest rows that make whole blocks */
        per = (per + align - 1) / align * align;
    }
    int64_t chunks = (rows + per - 1) / per;
    int64_t failed = -1;
#pragma omp parallel for num_threads(threads > 1 && chunks > 1 ? threads : 1) schedule(dynamic)
    for (int64_t c = 0; c < chunks; c++) {
        int64_t a = r0 + c * per, b = a + per < r1 ? a + per : r1;
        if (read_rows(sf, info, a, b, as, dst + (size_t)(a - r0) * row_bytes,
                      (size_t)(b - a) * row_bytes) != DF_OK) {
#pragma omp critical(single_file_failed)
            if (failed < 0 || c < failed)
                failed = c;
        }
    }
    if (failed < 0)
        return DF_OK;
    int64_t a = r0 + failed * per, b = a + per < r1 ? a + per : r1;
    DF_TRY(read_rows(sf, info, a, b, as, dst + (size_t)(a - r0) * row_bytes,
                     (size_t)(b - a) * row_bytes));
    for (int64_t c = failed + 1; c < chunks; c++) { /* the rest, on this thread */
        a = r0 + c * per, b = a + per < r1 ? a + per : r1;
        DF_TRY(read_rows(sf, info, a, b, as, dst + (size_t)(a - r0) * row_bytes,
                         (size_t)(b - a) * row_bytes));
    }
    return DF_OK;
}

/* How a copy's element or row `d` is found in the file's order (the rearrangements below). */
typedef struct rearrange {
    int64_t r, c;   /* bind_transposed: the file's rows and columns */
    int64_t hd;     /* bind_rope_permuted: a head's rows */
    bool transpose; /* else the per-head rotary permutation */
} rearrange;

/* The dtype a tensor stored in the file is copied in: its own, or the compute dtype's
 * where the file's has no host form (DF_DTYPE_COUNT). */
static df_dtype copy_dtype(df_ctx *ctx, const src_info *info)
{
    if (info->dtype != DF_DTYPE_COUNT)
        return info->dtype;
    return df_ctx_compute_dtype(ctx) == DF_DTYPE_F32 ? DF_DTYPE_F32 : DF_DTYPE_BF16;
}

static void rearrange_into(const rearrange *a, const uint8_t *stored, uint8_t *t, int64_t rows,
                           size_t row, size_t es)
{
    if (a->transpose) {
        for (int64_t i = 0; i < a->r; i++)
            for (int64_t j = 0; j < a->c; j++)
                memcpy(t + (size_t)(j * a->r + i) * es, stored + (size_t)(i * a->c + j) * es, es);
        return;
    }
    int64_t half = a->hd / 2;
    for (int64_t h = 0; h < rows; h += a->hd)
        for (int64_t i = 0; i < half; i++)
            for (int64_t k = 0; k < 2; k++)
                memcpy(t + (size_t)(h + k * half + i) * row, stored + (size_t)(h + 2 * i + k) * row,
                       row);
}

/* Reads a tensor whole (`rows` rows of `row` bytes in dtype `as`), rearranges it into a
 * copy of shape `shape` as `a` says and binds the copy; the file's pages are released. */
static df_status bind_rearranged(df_single_file *sf, df_ctx *ctx, const char *name,
                                 const src_info *info, df_dtype as, int64_t rows, size_t row,
                                 const rearrange *a, const int64_t *shape, int ndim,
                                 df_tensor **out, size_t *bytes)
{
    size_t total = (size_t)rows * row;
    uint8_t *stored = df_malloc(total ? total : 1), *t = df_malloc(total ? total : 1);
    df_status s = stored && t ? DF_OK
                              : df_errorf(DF_E_OOM, "%s: out of memory for tensor '%s'",
                                          sf->component, name);
    if (s == DF_OK)
        s = read_rows_threaded(sf, info, 0, rows, as, stored, row, df_ctx_threads(ctx));
    if (s == DF_OK)
        rearrange_into(a, stored, t, rows, row, df_dtype_size(as));
    if (s == DF_OK && !(*out = df_tensor_from_host(ctx, as, shape, ndim, t)))
        s = df_ctx_status(ctx);
    df_free(stored);
    df_free(t);
    if (s == DF_OK)
        s = sf->gguf ? df_gguf_release_pages(sf->gguf, info->name)
                     : df_weights_release_pages(sf->st, info->name);
    *bytes = total;
    return s;
}

/* A 2-D tensor the file stores transposed (OpenCLIP's text_projection): read whole in the
 * dtype the model computes with, transposed into a copy. */
static df_status bind_transposed(df_single_file *sf, df_ctx *ctx, const char *name,
                                 const df_name_src *src, const src_info *info, int ndim,
                                 const int64_t *shape, df_tensor **out, size_t *bytes)
{
    int64_t r = info->ndim == 2 ? info->shape[0] : -1, c = info->ndim == 2 ? info->shape[1] : -1;
    if (ndim != 2 || r < 0 || (shape[0] >= 0 && shape[0] != c) ||
        (shape[1] >= 0 && shape[1] != r)) {
        char want[160], got[160];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, info->ndim, info->shape);
        return df_errorf(DF_E_FORMAT, "%s: %s: tensor '%s' (diffusers' '%s', stored "
                         "transposed) has shape %s; expected %s transposed", sf->component,
                         df_single_file_path(sf), src->name, name, got, want);
    }
    df_dtype as = copy_dtype(ctx, info);
    rearrange a = {.r = r, .c = c, .transpose = true};
    return bind_rearranged(sf, ctx, name, info, as, r, (size_t)c * df_dtype_size(as), &a,
                           (int64_t[]){c, r}, 2, out, bytes);
}

/* Mistral's wq / wk (consolidated.safetensors): each head's rows hold the rotary pairs
 * interleaved (2i, 2i + 1) where transformers holds them in halves (i, i + head_dim / 2).
 * Read whole, then row i + t * head_dim / 2 of a head is the file's row 2i + t. */
static df_status bind_rope_permuted(df_single_file *sf, df_ctx *ctx, const char *name,
                                    const df_name_src *src, const src_info *info,
                                    const int64_t *shape, int ndim, df_tensor **out,
                                    size_t *bytes)
{
    int64_t rows = info->shape[0], hd = src->rope_head_dim;
    if (hd % 2 || rows % hd || src->n != 1 || src->units != 1)
        return df_errorf(DF_E_FORMAT, "%s: %s: tensor '%s' (diffusers' '%s') has %lld rows, "
                         "not whole heads of %lld", sf->component, df_single_file_path(sf),
                         src->name, name, (long long)rows, (long long)hd);
    df_dtype as = copy_dtype(ctx, info);
    rearrange a = {.hd = hd};
    return bind_rearranged(sf, ctx, name, info, as, rows,
                           (size_t)(info->numel / rows) * df_dtype_size(as), &a, shape, ndim,
                           out, bytes);
}

df_status df_single_file_bind(df_single_file *sf, df_ctx *ctx, const char *name, int ndim,
                              const int64_t *shape, df_tensor **out, const void **data,
                              size_t *bytes)
{
    *out = NULL;
    *data = NULL;
    *bytes = 0;
    df_name_src src;
    src_info info;
    if (!resolve(sf, name, &src))
        return df_errorf(DF_E_FORMAT, "%s: %s: no tensor for diffusers' '%s' in this layout",
                         sf->component, df_single_file_path(sf), name);
    int64_t idx = index_of(sf, src.name, &info);
    if (idx < 0)
        return df_errorf(DF_E_FORMAT, "%s: %s: missing tensor '%s' (diffusers' '%s')",
                         sf->component, df_single_file_path(sf), src.name, name);
    if (info.dtype == DF_DTYPE_COUNT && !info.upcast)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: %s: tensor '%s' is stored as %s; single-file "
                         "weights must be F32, BF16, F16, F8_E4M3, F8_E5M2 or a GGUF type "
                         "diffuse dequantises",
                         sf->component, df_single_file_path(sf), src.name, info.dtype_name);
    if (src.transpose) {
        sf->used[idx] = 1;
        if (info.upcast && !sf->gguf)
            mark_scale_used(sf, src.name);
        return bind_transposed(sf, ctx, name, &src, &info, ndim, shape, out, bytes);
    }
    int64_t rows;
    DF_TRY(check_shape(sf, name, &src, &info, ndim, shape, &rows));
    int64_t local[DF_SAFETENSORS_MAX_DIMS];
    memcpy(local, info.shape, sizeof local);
    local[0] = rows;
    int local_ndim = file_ndim(&info, ndim);
    int64_t row = info.shape[0] ? info.numel / info.shape[0] : 0;
    int64_t block = info.shape[0] / src.units; /* rows per unit */
    df_dtype as = info.dtype;
    if (as == DF_DTYPE_COUNT)
        as = df_ctx_compute_dtype(ctx) == DF_DTYPE_F32 ? DF_DTYPE_F32 : DF_DTYPE_BF16;
    size_t es = df_dtype_size(as);
    size_t total = (size_t)(rows * row) * es;
    sf->used[idx] = 1;
    if (info.upcast && !sf->gguf)
        mark_scale_used(sf, src.name);

    float scale;
    if (src.rope_head_dim > 0)
        return bind_rope_permuted(sf, ctx, name, &src, &info, local, local_ndim, out, bytes);
    if (stays_compact(sf, ctx, name, ndim, &src, &info, &scale)) {
        size_t row_bytes = info.shape[0] ? info.nbytes / (size_t)info.shape[0] : 0;
        const uint8_t *p =
            (const uint8_t *)info.data + (size_t)(src.part[0][0] * block) * row_bytes;
        *bytes = (size_t)rows * row_bytes;
        *out = df_tensor_wrap_blocks(ctx, rows, info.shape[1], p, *bytes, info.block_type, scale);
        *data = p;
        return *out ? DF_OK : df_ctx_status(ctx);
    }
    if (src.n == 1 && info.dtype != DF_DTYPE_COUNT) {
        const uint8_t *p =
            (const uint8_t *)info.data + (size_t)(src.part[0][0] * block * row) * info.elem_size;
        if ((uintptr_t)p % info.elem_size == 0) {
            *out = df_tensor_wrap(ctx, as, local, local_ndim, p);
            *data = p;
            *bytes = total;
            return *out ? DF_OK : df_ctx_status(ctx);
        }
    }
    uint8_t *buf = df_malloc(total ? total : 1);
    if (!buf)
        return df_errorf(DF_E_OOM, "%s: out of memory for tensor '%s'", sf->component, name);
    df_status s = DF_OK;
    size_t at = 0;
    for (int p = 0; p < src.n && s == DF_OK; p++) {
        int64_t r0 = src.part[p][0] * block, r1 = src.part[p][1] * block;
        size_t n = (size_t)((r1 - r0) * row) * es;
        s = read_rows_threaded(sf, &info, r0, r1, as, buf + at, (size_t)row * es,
                               df_ctx_threads(ctx));
        at += n;
    }
    if (s == DF_OK) {
        *out = df_tensor_from_host(ctx, as, local, local_ndim, buf);
        if (!*out)
            s = df_ctx_status(ctx);
    }
    df_free(buf);
    /* The file's bytes were only a source: drop their pages from the resident set (they
     * are read again if another part of the same tensor is bound later). */
    if (s == DF_OK)
        s = sf->gguf ? df_gguf_release_pages(sf->gguf, info.name)
                     : df_weights_release_pages(sf->st, info.name);
    *bytes = total;
    return s;
}

int64_t df_single_file_count(const df_single_file *sf)
{
    return sf->count;
}

const char *df_single_file_unused(const df_single_file *sf, int64_t i)
{
    src_info info;
    if (i < 0 || i >= sf->count || sf->used[i] || reader_at(sf, i, &info) != DF_OK)
        return NULL;
    /* In an all-in-one file the other components' tensors are theirs, not unused. */
    if (strncmp(info.name, sf->prefix, strlen(sf->prefix)) != 0)
        return NULL;
    return info.name;
}

void df_single_file_ignore_prefix(df_single_file *sf, const char *prefix)
{
    size_t np = strlen(sf->prefix), n = strlen(prefix);
    for (int64_t i = 0; i < sf->count; i++) {
        src_info info;
        if (reader_at(sf, i, &info) == DF_OK && strncmp(info.name, sf->prefix, np) == 0 &&
            strncmp(info.name + np, prefix, n) == 0)
            sf->used[i] = 1;
    }
}
