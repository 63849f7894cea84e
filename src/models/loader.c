/*
 * Weight sets: a component's checkpoint bound by name (see loader.h).
 *
 * Tensors wrap the mapping, so binding costs no copy and no page is touched until a kernel
 * reads it. A weight whose bytes are not aligned to its element size (possible in a
 * hand-made file) is copied into aligned memory instead. Which tensors were bound is kept
 * in a bitmap over the checkpoint's name order, so the unexpected-tensor check is one pass.
 *
 * Tensor parallelism (loader.h): a model's plan is a short table of name patterns; binding
 * consults it, so model code binds every weight by its full shape and gets this rank's part.
 * A single row range wraps the mapping like a whole tensor; column ranges and packed row
 * ranges are read through df_weights into a buffer and copied into a tensor the set owns.
 * A weight saved int8 takes the matching part of its scales: the rows of its output
 * channels, or for a split of k the scale groups of its columns (the split must fall on
 * group boundaries, unless a row has one scale).
 * Bytes read are counted per slice, so df_stats shows what this rank touched.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/layout.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/int8_tiles.h"
#include "core/status.h"
#include "models/loader.h"
#include "models/lora.h"
#include "models/quant_policy.h"
#include "models/single_file.h"
#include "runtime/runtime.h"
#include "runtime/weight.h"

struct df_weight_set {
    df_ctx *ctx;
    df_weights *w;
    df_single_file *sf; /* instead of w: a single file read through a name map */
    df_json *config;
    char dir[1024];
    char component[64];
    df_weight_ref *tensors; /* the bound weights, in binding order */
    int n, cap;
    uint8_t *used; /* per tensor of the checkpoint, in df_weights_at order */
    int64_t count;
    int64_t bytes;
    /* Tensor-parallel plan (df_ws_set_tp_plan); tp_shard is the last rule's shard. */
    const df_tp_rule *tp_rules;
    int tp_n, tp_rank, tp_world;
    df_shard tp_shard;
    /* The tile width of the saved int8 weights (0: row-major); -1 until config.json is read. */
    int i8_nr;
};

df_status df_weight_set_open(df_ctx *ctx, const char *dir, const char *component,
                             df_weight_set **out)
{
    *out = NULL;
    df_weight_set *ws = df_calloc(1, sizeof *ws);
    if (!ws)
        return df_errorf(DF_E_OOM, "%s: out of memory", component);
    ws->ctx = ctx;
    ws->i8_nr = -1;
    snprintf(ws->dir, sizeof ws->dir, "%s", dir);
    snprintf(ws->component, sizeof ws->component, "%s", component);
    char path[1200];
    df_status s = df_layout_find_weights(dir, path, sizeof path);
    if (s == DF_OK)
        s = df_weights_open(path, &ws->w);
    if (s == DF_OK) {
        ws->count = df_weights_count(ws->w);
        ws->used = df_calloc((size_t)(ws->count ? ws->count : 1), 1);
        if (!ws->used)
            s = df_errorf(DF_E_OOM, "%s: out of memory", component);
    }
    if (s != DF_OK) {
        df_weight_set_free(ws);
        return s;
    }
    *out = ws;
    return DF_OK;
}

df_status df_weight_set_open_single(df_ctx *ctx, const char *config_dir, const char *file,
                                    const char *component, df_name_map map, int arg,
                                    const char *probe, df_weight_set **out)
{
    *out = NULL;
    df_weight_set *ws = df_calloc(1, sizeof *ws);
    if (!ws)
        return df_errorf(DF_E_OOM, "%s: out of memory", component);
    ws->ctx = ctx;
    snprintf(ws->dir, sizeof ws->dir, "%s", config_dir);
    snprintf(ws->component, sizeof ws->component, "%s", component);
    df_status s = df_single_file_open(file, component, map, arg, probe, &ws->sf);
    if (s != DF_OK) {
        df_weight_set_free(ws);
        return s;
    }
    *out = ws;
    return DF_OK;
}

void df_weight_set_free(df_weight_set *ws)
{
    if (!ws)
        return;
    if (ws->n)
        df_sync(ws->ctx); /* queued kernels may still read the mapping */
    for (int i = 0; i < ws->n; i++) {
        df_weight_unbind(ws->ctx, ws->tensors[i].t);
        df_tensor_free(ws->tensors[i].t);
        df_free(ws->tensors[i].name);
    }
    df_free(ws->tensors);
    df_free(ws->used);
    df_json_free(ws->config);
    df_weights_free(ws->w);
    df_single_file_free(ws->sf);
    df_free(ws);
}

df_status df_weight_set_config(df_weight_set *ws, const df_json **out)
{
    *out = NULL;
    if (!ws->config)
        DF_TRY(df_layout_open_config(ws->dir, &ws->config));
    *out = ws->config;
    return DF_OK;
}

/* Index of `name` in the checkpoint's order, by binary search over df_weights_at. */
static int64_t index_of(const df_weight_set *ws, const char *name)
{
    int64_t lo = 0, hi = ws->count - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        df_tensor_info info;
        if (df_weights_at(ws->w, mid, &info) != DF_OK)
            return -1;
        int c = strcmp(info.name, name);
        if (c == 0)
            return mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && used < cap; d++)
        used += (size_t)snprintf(buf + used, cap - used, d ? ", %lld" : "%lld", (long long)shape[d]);
    if (used < cap)
        snprintf(buf + used, cap - used, "]");
}

/* The file holding a tensor: its shard of a sharded checkpoint. */
static const char *tensor_file(const df_weight_set *ws, const df_tensor_info *info)
{
    const df_safetensors *st = df_weights_shard(ws->w, info->shard);
    return st ? df_safetensors_path(st) : df_weights_path(ws->w);
}

/* Looks `name` up and checks it against the expected shape and the weight dtypes. */
static df_status find_checked(df_weight_set *ws, const char *name, int ndim, const int64_t *shape,
                              df_tensor_info *info)
{
    if (!df_weights_contains(ws->w, name))
        return df_errorf(DF_E_FORMAT, "%s: %s: missing tensor '%s'", ws->component,
                         df_weights_path(ws->w), name);
    DF_TRY(df_weights_find(ws->w, name, info));
    bool fits = info->ndim == ndim;
    for (int d = 0; fits && d < ndim; d++)
        fits = shape[d] < 0 || info->shape[d] == shape[d];
    if (!fits) {
        char want[160], got[160];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, info->ndim, info->shape);
        return df_errorf(DF_E_FORMAT, "%s: %s: tensor '%s' has shape %s, expected %s",
                         ws->component, tensor_file(ws, info), name, got, want);
    }
    if (info->dtype != DF_DTYPE_F32 && info->dtype != DF_DTYPE_BF16 &&
        info->dtype != DF_DTYPE_F16 && info->dtype != DF_DTYPE_I8)
        return df_errorf(DF_E_UNSUPPORTED, "%s: %s: tensor '%s' is stored as %s; weights "
                         "must be F32, BF16, F16 or I8 (saved quantized)", ws->component,
                         tensor_file(ws, info), name,
                         info->dtype_name);
    return DF_OK;
}

static void mark_used(df_weight_set *ws, const char *name)
{
    int64_t i = index_of(ws, name);
    if (i >= 0)
        ws->used[i] = 1;
}

/* Keeps `t` (made over `data`, `bytes` of it) as the bound tensor `name`; `read` bytes of the
 * file were read for it. Frees `t` on failure. */
static df_status keep(df_weight_set *ws, const char *name, df_tensor *t, const void *data,
                      size_t bytes, size_t read)
{
    if (!t)
        return df_error_context(df_ctx_status(ws->ctx), "%s: tensor '%s'", ws->component, name);
    if (ws->n == ws->cap) {
        int cap = ws->cap ? 2 * ws->cap : 256;
        df_weight_ref *b = df_realloc(ws->tensors, (size_t)cap * sizeof *b);
        if (!b) {
            df_tensor_free(t);
            return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
        }
        ws->tensors = b;
        ws->cap = cap;
    }
    char *copy = df_strdup(name);
    if (!copy) {
        df_tensor_free(t);
        return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
    }
    size_t resident;
    df_status s = df_quant_bind(ws->ctx, ws->component, name, t, bytes, &resident);
    if (s == DF_OK)
        s = df_weight_bind(ws->ctx, t, data, bytes, read, resident);
    if (s != DF_OK) {
        df_free(copy);
        df_tensor_free(t);
        return df_error_context(s, "%s: tensor '%s'", ws->component, name);
    }
    ws->tensors[ws->n++] = (df_weight_ref){.name = copy, .t = df_tensor_persist(t)};
    ws->bytes += (int64_t)bytes;
    mark_used(ws, name);
    return DF_OK;
}

/* LoRA (lora.h): a weight an adapter updates is replaced by a merged copy in its dtype;
 * the file's mapping is left as it is. */
static df_status merge_lora(df_weight_set *ws, const char *name, df_tensor **t)
{
    df_tensor *w = *t;
    df_dtype dt = w->v.dtype;
    if (w->v.ndim != 2 || (dt != DF_DTYPE_F32 && dt != DF_DTYPE_BF16 && dt != DF_DTYPE_F16))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: tensor '%s' is held as %d-D %s: LoRA adapters "
                         "are merged into 2-D F32, BF16 or F16 weights only",
                         ws->component, name, w->v.ndim, df_dtype_name(dt));
    int64_t n = w->v.shape[0] * w->v.shape[1];
    float *f = df_malloc((size_t)n * sizeof *f + 1);
    void *narrow = df_malloc((size_t)n * df_dtype_size(dt) + 1);
    df_status s = f && narrow ? DF_OK
                              : df_errorf(DF_E_OOM,
                                          "%s: out of memory merging LoRA "
                                          "into '%s'",
                                          ws->component, name);
    if (s == DF_OK)
        s = df_tensor_read(ws->ctx, w, DF_DTYPE_F32, f, (size_t)n * sizeof *f);
    if (s == DF_OK)
        s = df_lora_merge(ws->ctx->lora, ws->component, name, f, w->v.shape[0], w->v.shape[1],
                          df_ctx_threads(ws->ctx));
    if (s == DF_OK)
        s = df_convert(f, DF_DTYPE_F32, narrow, dt, n);
    df_tensor *merged = NULL;
    if (s == DF_OK && !(merged = df_tensor_from_host(ws->ctx, dt, w->v.shape, 2, narrow)))
        s = df_ctx_status(ws->ctx);
    df_free(f);
    df_free(narrow);
    if (s != DF_OK)
        return s;
    df_tensor_free(w);
    *t = merged;
    return DF_OK;
}

static bool lora_updates(const df_weight_set *ws, const char *name)
{
    return ws->ctx->lora && df_lora_touches(ws->ctx->lora, ws->component, name);
}

/* Whether the adapters of weight t stay beside it (df_linear_weights.lora_down / lora_up)
 * instead of merged into it: under int8 compute, where the weight is quantized from the
 * file and a merged copy would stay resident in f32, and for weights held 8-bit (saved
 * int8, GGUF), which cannot be merged into. */
static bool lora_unmerged(const df_weight_set *ws, const df_tensor *t)
{
    df_dtype dt = t->v.dtype;
    return df_ctx_compute_dtype(ws->ctx) == DF_DTYPE_I8 ||
           (dt != DF_DTYPE_F32 && dt != DF_DTYPE_BF16 && dt != DF_DTYPE_F16);
}

/* Weight *t (NULL: nothing to do) replaced by its merged copy where adapters update it and
 * are merged into it; *merged then says *t no longer holds the file's bytes. On failure *t
 * is freed. */
static df_status merge_lora_updates(df_weight_set *ws, const char *name, df_tensor **t,
                                    bool *merged)
{
    *merged = false;
    if (!*t || !lora_updates(ws, name) || lora_unmerged(ws, *t))
        return DF_OK;
    df_status s = merge_lora(ws, name, t);
    if (s != DF_OK) {
        df_tensor_free(*t);
        *t = NULL;
        return s;
    }
    *merged = true;
    return DF_OK;
}

/* Binds the unmerged adapters of linear `base` (its weight [rows, cols] bound in *lw) as
 * "<base>.lora_down" / ".lora_up" in f32, kept at full precision under int8 compute. */
static df_status attach_lora(df_weight_set *ws, const char *base, df_linear_weights *lw)
{
    char name[600];
    snprintf(name, sizeof name, "%s.weight", base);
    int64_t rows = lw->weight->v.shape[0], cols = lw->weight->v.shape[1], r;
    float *down, *up;
    DF_TRY(df_lora_factors(ws->ctx->lora, ws->component, name, rows, cols, &down, &up, &r));
    df_tensor *td = df_tensor_from_host(ws->ctx, DF_DTYPE_F32, (int64_t[]){r, cols}, 2, down);
    df_tensor *tu = df_tensor_from_host(ws->ctx, DF_DTYPE_F32, (int64_t[]){rows, r}, 2, up);
    df_free(down);
    df_free(up);
    snprintf(name, sizeof name, "%s.lora_down", base);
    df_status s = keep(ws, name, td, NULL, (size_t)(r * cols) * 4, 0);
    snprintf(name, sizeof name, "%s.lora_up", base);
    if (s == DF_OK)
        s = keep(ws, name, tu, NULL, (size_t)(rows * r) * 4, 0);
    else
        df_tensor_free(tu);
    DF_TRY(s);
    DF_TRY(df_weight_keep_precision(td, true));
    DF_TRY(df_weight_keep_precision(tu, true));
    lw->lora_down = td;
    lw->lora_up = tu;
    return DF_OK;
}

/* ---- int8 weights saved in tiles -------------------------------------------------------- */

/* The tile width of this component's saved int8 weights (0: row-major), from config.json's
 * quantization_config.layout and layout_version (absent: row-major, as in folders written
 * before the tiles). A tag this build does not read fails naming the file and the field. */
static df_status saved_int8_layout(df_weight_set *ws, int *nr)
{
    if (ws->i8_nr >= 0) {
        *nr = ws->i8_nr;
        return DF_OK;
    }
    *nr = 0;
    const df_json *cfg;
    DF_TRY(df_weight_set_config(ws, &cfg));
    const df_json *q = df_json_get(cfg, "quantization_config");
    const df_json *tag = df_json_type_of(q) == DF_JSON_OBJECT ? df_json_get(q, "layout") : NULL;
    if (tag && !df_json_is_null(tag)) {
        const char *name = df_json_type_of(tag) == DF_JSON_STRING ? df_json_string(tag) : NULL;
        int v = name ? df_i8_layout_nr(name) : -1;
        if (v < 0)
            return df_errorf(DF_E_FORMAT,
                             "%s: %s/config.json: quantization_config.layout is %s%.40s%s; "
                             "this build reads \"rows\", \"tiles16\", \"tiles32\" or "
                             "\"tiles64\"",
                             ws->component, ws->dir, name ? "'" : "a ",
                             name ? name : df_json_type_name(df_json_type_of(tag)),
                             name ? "'" : "");
        const df_json *ver = df_json_get(q, "layout_version");
        double version = df_json_type_of(ver) == DF_JSON_NUMBER ? df_json_number(ver) : -1;
        if (v > 0 && version != DF_I8_TILES_VERSION)
            return df_errorf(DF_E_FORMAT,
                             "%s: %s/config.json: quantization_config.layout_version is not "
                             "%d, the version of the int8 tile layout this build reads; "
                             "quantize the model again (diffuse quantize)",
                             ws->component, ws->dir, DF_I8_TILES_VERSION);
        *nr = v;
    }
    if (*nr && *nr != DF_I8_TILE_NR)
        df_logf(1,
                "%s: int8 weights saved in %s, not the kernels' tiles of %d channels: "
                "repacked to rows at load (the product packs them on first use)",
                ws->component, df_json_string(tag), DF_I8_TILE_NR);
    ws->i8_nr = *nr;
    return DF_OK;
}

/* Binds the ranges of `dim` of `info`, saved in tiles of nr (q, or its scales when
 * `scales`), as a row-major part: for a cut that is not on whole tiles (a rank's rows not
 * whole blocks), or tiles of another width. Reads only the part's bytes from the mapping;
 * the product packs the part on first use, as for a row-major folder. */
static df_status bind_detiled(df_weight_set *ws, const df_tensor_info *info, int nr, bool scales,
                              int dim, int64_t ranges[][2], int n, df_tensor **out)
{
    int64_t rows = info->shape[0], cols = info->shape[1], local = 0;
    for (int p = 0; p < n; p++)
        local += ranges[p][1] - ranges[p][0];
    int64_t lr = dim == 0 ? local : rows, lc = dim == 1 ? local : cols;
    size_t es = info->elem_size, bytes = (size_t)(lr * lc) * es;
    uint8_t *buf = df_malloc(bytes ? bytes : 1), *dst = buf;
    if (!buf)
        return df_errorf(DF_E_OOM, "%s: out of memory for tensor '%s'", ws->component,
                         info->name);
    const uint8_t *src = info->data;
    for (int64_t i = 0; i < (dim == 0 ? n : rows); i++) { /* a range of rows, or a row */
        int64_t j0 = dim == 0 ? ranges[i][0] : i, j1 = dim == 0 ? ranges[i][1] : i + 1;
        for (int64_t j = j0; j < j1; j++) {
            for (int p = 0; p < (dim == 1 ? n : 1); p++) {
                int64_t c0 = dim == 1 ? ranges[p][0] : 0, c1 = dim == 1 ? ranges[p][1] : cols;
                for (int64_t c = c0; c < c1; c++, dst += es) {
                    size_t at = scales ? df_i8_tiles_scale_at(cols, nr, j, c)
                                       : df_i8_tiles_q_at(cols, nr, j, c);
                    memcpy(dst, src + at * es, es);
                }
            }
        }
    }
    df_tensor *t = df_tensor_from_host(ws->ctx, info->dtype, (int64_t[]){lr, lc}, 2, buf);
    df_free(buf);
    DF_TRY(keep(ws, info->name, t, NULL, bytes, bytes));
    *out = t;
    return DF_OK;
}

/* The saved int8 weight `info` (q and its scales in tiles of nr, another width than the
 * kernels') repacked into row-major copies: the layout of folders saved before the tiles,
 * which the product packs on first use. */
static df_status bind_other_tiles(df_weight_set *ws, const df_tensor_info *info, int nr,
                                  df_tensor **out)
{
    char scale_name[600];
    snprintf(scale_name, sizeof scale_name, "%s_scale", info->name);
    df_tensor_info si;
    DF_TRY(find_checked(ws, scale_name, 2, (int64_t[]){info->shape[0], -1}, &si));
    if (si.dtype != DF_DTYPE_F32)
        return df_errorf(DF_E_FORMAT, "%s: %s: tensor '%s' is %s, expected F32", ws->component,
                         tensor_file(ws, &si), scale_name, si.dtype_name);
    int64_t all[1][2] = {{0, info->shape[0]}}; /* every row: the whole weight */
    df_tensor *t = NULL, *scale = NULL;
    DF_TRY(bind_detiled(ws, info, nr, false, 0, all, 1, &t));
    DF_TRY(bind_detiled(ws, &si, nr, true, 0, all, 1, &scale));
    DF_TRY(df_quant_attach_int8(info->name, t, scale, false));
    *out = t;
    return DF_OK;
}

static df_status bind(df_weight_set *ws, const char *name, int ndim, const int64_t *shape,
                      df_tensor **out)
{
    *out = NULL;
    if (ws->sf) {
        const void *data;
        size_t bytes;
        df_tensor *t;
        DF_TRY(df_single_file_bind(ws->sf, ws->ctx, name, ndim, shape, &t, &data, &bytes));
        size_t read = bytes;
        bool merged;
        DF_TRY(merge_lora_updates(ws, name, &t, &merged));
        if (merged) {
            data = NULL;
            bytes = (size_t)(t->v.shape[0] * t->v.shape[1]) * df_dtype_size(t->v.dtype);
        }
        DF_TRY(keep(ws, name, t, data, bytes, read));
        *out = t;
        return DF_OK;
    }
    df_tensor_info info;
    DF_TRY(find_checked(ws, name, ndim, shape, &info));
    if (info.dtype == DF_DTYPE_I8 && !df_dev_has(ws->ctx->dev, DF_CAP_INT8))
        return df_errorf(DF_E_UNSUPPORTED, "%s: %s: tensor '%s' is saved quantized (int8) and "
                         "%s has no int8 products; int8 products run on the CPU backend only "
                         "(--device cpu)", ws->component, tensor_file(ws, &info), name,
                         ws->ctx->dev->name);
    int nr = 0;
    if (info.dtype == DF_DTYPE_I8) {
        DF_TRY(saved_int8_layout(ws, &nr));
        if (!df_i8_tiles_fit(info.shape[0], info.shape[1], nr))
            nr = 0; /* stored row-major */
        if (nr && nr != DF_I8_TILE_NR)
            return bind_other_tiles(ws, &info, nr, out);
    }
    df_tensor *t;
    if ((uintptr_t)info.data % info.elem_size == 0)
        t = df_tensor_wrap(ws->ctx, info.dtype, info.shape, info.ndim, info.data);
    else
        t = df_tensor_from_host(ws->ctx, info.dtype, info.shape, info.ndim, info.data);
    bool merged;
    DF_TRY(merge_lora_updates(ws, name, &t, &merged));
    DF_TRY(keep(ws, name, t, merged ? NULL : info.data, info.nbytes, info.nbytes));
    if (info.dtype == DF_DTYPE_I8) { /* its scales, saved beside it */
        char scale_name[600];
        df_tensor *scale;
        snprintf(scale_name, sizeof scale_name, "%s_scale", name);
        DF_TRY(bind(ws, scale_name, 2, (int64_t[]){info.shape[0], -1}, &scale));
        DF_TRY(df_quant_attach_int8(name, t, scale, nr != 0));
    }
    *out = t;
    return DF_OK;
}

/* ---- tensor parallelism ---------------------------------------------------------------- */

/* This rank's ranges [lo, hi) of a dimension of `size`: one per packed block. */
static df_status shard_ranges(const df_weight_set *ws, const char *name, int dim, int64_t size,
                              const df_shard *sh, int64_t ranges[][2], int *n_ranges)
{
    int np = sh->n_parts > 1 ? sh->n_parts : 1;
    if (np > DF_SHARD_MAX_PARTS)
        return df_errorf(DF_E_ARG, "%s: tensor '%s': %d packed parts (at most %d)",
                         ws->component, name, np, DF_SHARD_MAX_PARTS);
    int64_t units = 0;
    for (int p = 0; p < np; p++)
        units += np > 1 ? sh->parts[p] : 1;
    if (units < 1 || size % units)
        return df_errorf(DF_E_ARG, "%s: tensor '%s': dimension %d of size %lld does not split "
                         "into %d packed blocks of %lld units", ws->component, name, dim,
                         (long long)size, np, (long long)units);
    int64_t off = 0;
    for (int p = 0; p < np; p++) {
        int64_t len = size / units * (np > 1 ? sh->parts[p] : 1);
        if (len % sh->world)
            return df_errorf(DF_E_ARG, "%s: tensor '%s': dimension %d%s has size %lld, which is "
                             "not divisible by the %d tensor-parallel ranks", ws->component,
                             name, dim, np > 1 ? " (one packed block)" : "", (long long)len,
                             sh->world);
        ranges[p][0] = off + len / sh->world * sh->rank;
        ranges[p][1] = ranges[p][0] + len / sh->world;
        off += len;
    }
    *n_ranges = np;
    return DF_OK;
}

/* Reads the ranges of `dim` (0: rows, 1: columns of a 2-D tensor) into dst, concatenated
 * along `dim`; dst is [local rows, local cols] for dim 1. */
static df_status read_ranges(df_weight_set *ws, const df_tensor_info *info, int dim,
                             int64_t ranges[][2], int n, int64_t local, uint8_t *dst)
{
    size_t es = info->elem_size;
    if (dim == 0) {
        int64_t row = info->shape[0] ? info->numel / info->shape[0] : 0;
        for (int p = 0; p < n; p++) {
            size_t bytes = (size_t)((ranges[p][1] - ranges[p][0]) * row) * es;
            DF_TRY(df_weights_read_rows(ws->w, info->name, ranges[p][0], ranges[p][1],
                                        info->dtype, dst, bytes));
            dst += bytes;
        }
        return DF_OK;
    }
    int64_t rows = info->shape[0], col0 = 0;
    for (int p = 0; p < n; p++) {
        int64_t w = ranges[p][1] - ranges[p][0];
        size_t bytes = (size_t)(rows * w) * es;
        uint8_t *part = n == 1 ? dst : df_malloc(bytes ? bytes : 1);
        if (!part)
            return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
        df_status s = df_weights_read_cols(ws->w, info->name, ranges[p][0], ranges[p][1],
                                           info->dtype, part, bytes);
        for (int64_t r = 0; s == DF_OK && n > 1 && r < rows; r++)
            memcpy(dst + (size_t)(r * local + col0) * es, part + (size_t)(r * w) * es,
                   (size_t)w * es);
        if (n > 1)
            df_free(part);
        DF_TRY(s);
        col0 += w;
    }
    return DF_OK;
}

/* Binds the ranges of `dim` of the tensor `info` (checked), concatenated along `dim`. */
static df_status bind_ranges(df_weight_set *ws, const df_tensor_info *info, int dim,
                             int64_t ranges[][2], int n, df_tensor **out)
{
    const char *name = info->name;
    int64_t local_shape[DF_SAFETENSORS_MAX_DIMS], local = 0;
    memcpy(local_shape, info->shape, sizeof local_shape);
    for (int p = 0; p < n; p++)
        local += ranges[p][1] - ranges[p][0];
    local_shape[dim] = local;
    int64_t numel = 1;
    for (int d = 0; d < info->ndim; d++)
        numel *= local_shape[d];
    size_t bytes = (size_t)numel * info->elem_size;

    if (dim == 0 && n == 1) { /* contiguous: wrap that part of the mapping */
        int64_t row = info->shape[0] ? info->numel / info->shape[0] : 0;
        const uint8_t *data =
            (const uint8_t *)info->data + (size_t)(ranges[0][0] * row) * info->elem_size;
        df_tensor *t = (uintptr_t)data % info->elem_size == 0
                           ? df_tensor_wrap(ws->ctx, info->dtype, local_shape, info->ndim, data)
                           : df_tensor_from_host(ws->ctx, info->dtype, local_shape, info->ndim,
                                                 data);
        DF_TRY(keep(ws, name, t, data, bytes, bytes));
        *out = t;
        return DF_OK;
    }
    uint8_t *buf = df_malloc(bytes ? bytes : 1);
    if (!buf)
        return df_errorf(DF_E_OOM, "%s: out of memory for tensor '%s'", ws->component, name);
    uint64_t before = df_weights_bytes_read(ws->w);
    df_status s = read_ranges(ws, info, dim, ranges, n, local, buf);
    size_t read = (size_t)(df_weights_bytes_read(ws->w) - before);
    df_tensor *t = s == DF_OK
                       ? df_tensor_from_host(ws->ctx, info->dtype, local_shape, info->ndim, buf)
                       : NULL;
    df_free(buf);
    DF_TRY(s);
    DF_TRY(keep(ws, name, t, NULL, bytes, read));
    *out = t;
    return DF_OK;
}

/* Binds the columns `ranges` of `info`, a tensor [rows, cols] saved in the int8 tiles
 * (core/int8_tiles.h: blocks of DF_I8_TILE_NR rows, in each block a column's values one run
 * of DF_I8_TILE_NR elements, runs of 4 columns interleaved for q): each block's ranges,
 * concatenated, are the tiles of the part. Reads only those bytes of the mapping. */
static df_status bind_tile_cols(df_weight_set *ws, const df_tensor_info *info, int64_t ranges[][2],
                                int n, df_tensor **out)
{
    size_t unit = (size_t)DF_I8_TILE_NR * info->elem_size;
    int64_t rows = info->shape[0], cols = info->shape[1], local = 0;
    for (int p = 0; p < n; p++)
        local += ranges[p][1] - ranges[p][0];
    size_t bytes = (size_t)(rows * local) * info->elem_size;
    uint8_t *buf = df_malloc(bytes ? bytes : 1), *dst = buf;
    if (!buf)
        return df_errorf(DF_E_OOM, "%s: out of memory for tensor '%s'", ws->component, info->name);
    const uint8_t *src = info->data;
    for (int64_t b = 0; b < rows / DF_I8_TILE_NR; b++) {
        for (int p = 0; p < n; p++) {
            size_t len = (size_t)(ranges[p][1] - ranges[p][0]) * unit;
            memcpy(dst, src + (size_t)(b * cols + ranges[p][0]) * unit, len);
            dst += len;
        }
    }
    df_tensor *t = df_tensor_from_host(ws->ctx, info->dtype, (int64_t[]){rows, local}, 2, buf);
    df_free(buf);
    DF_TRY(keep(ws, info->name, t, NULL, bytes, bytes));
    *out = t;
    return DF_OK;
}

/* Whether this rank's cut of a weight saved in tiles of nr falls on the kernels' whole
 * tiles: its rows on blocks of DF_I8_TILE_NR channels, its k on runs of 4. */
static bool cuts_whole_tiles(int nr, int dim, int64_t ranges[][2], int n)
{
    int64_t unit = dim == 0 ? DF_I8_TILE_NR : 4;
    for (int p = 0; p < n; p++)
        if (nr != DF_I8_TILE_NR || ranges[p][0] % unit || ranges[p][1] % unit)
            return false;
    return true;
}

/* The scales of the saved int8 weight `w` (its part t, split along `dim` into `ranges`):
 * the same rows of output channels (dim 0), or the scale groups of its k ranges (dim 1),
 * which must start and end on group boundaries. w and its scales are saved in tiles of nr
 * (0: row-major); `whole`: the part is cut on the kernels' whole tiles and stays in them,
 * else a tiled part is made row-major. */
static df_status bind_scale_split(df_weight_set *ws, const df_tensor_info *w, df_tensor *t, int dim,
                                  int64_t ranges[][2], int n, int world, int nr, bool whole)
{
    char name[600];
    snprintf(name, sizeof name, "%s_scale", w->name);
    df_tensor_info info;
    DF_TRY(find_checked(ws, name, 2, (int64_t[]){w->shape[0], -1}, &info));
    df_tensor *scale = NULL;
    int64_t k = w->shape[1], groups = info.shape[1];
    bool tiled = nr && whole;
    if (dim == 0) {
        if (nr && !whole)
            DF_TRY(bind_detiled(ws, &info, nr, true, 0, ranges, n, &scale));
        else
            DF_TRY(bind_ranges(ws, &info, 0, ranges, n, &scale));
    } else if (groups == 1) { /* one scale per channel: every slice of k keeps it */
        DF_TRY(bind(ws, name, 2, info.shape, &scale));
    } else {
        int64_t group = k / groups, granges[DF_SHARD_MAX_PARTS][2];
        for (int p = 0; p < n; p++) {
            if (group * groups != k || ranges[p][0] % group || ranges[p][1] % group)
                return df_errorf(DF_E_UNSUPPORTED,
                                 "%s: tensor '%s' is saved int8 with k %lld in scale groups "
                                 "of %lld, which do not split at the slice boundaries of %d "
                                 "tensor-parallel ranks (columns [%lld, %lld) of a rank); "
                                 "quantize it with a group that divides each rank's slice "
                                 "(diffuse quantize --group), or load the unquantized "
                                 "checkpoint with --dtype int8",
                                 ws->component, w->name, (long long)k, (long long)group, world,
                                 (long long)ranges[p][0], (long long)ranges[p][1]);
            granges[p][0] = ranges[p][0] / group;
            granges[p][1] = ranges[p][1] / group;
        }
        if (tiled)
            DF_TRY(bind_tile_cols(ws, &info, granges, n, &scale));
        else if (nr)
            DF_TRY(bind_detiled(ws, &info, nr, true, 1, granges, n, &scale));
        else
            DF_TRY(bind_ranges(ws, &info, 1, granges, n, &scale));
    }
    return df_quant_attach_int8(w->name, t, scale, tiled);
}

/* Binds this rank's part of `name` split along `dim`; a weight saved int8 brings the part
 * of its scales that goes with it. */
static df_status bind_split(df_weight_set *ws, const char *name, int ndim, const int64_t *shape,
                            int dim, const df_shard *sh, df_tensor **out)
{
    *out = NULL;
    df_tensor_info info;
    DF_TRY(find_checked(ws, name, ndim, shape, &info));
    if (dim > 1 || (dim == 1 && info.ndim != 2) || (info.dtype == DF_DTYPE_I8 && info.ndim != 2))
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s': only rows, or the columns of a 2-D "
                         "tensor, can be split across ranks", ws->component, name);
    int64_t ranges[DF_SHARD_MAX_PARTS][2];
    int n = 0;
    DF_TRY(shard_ranges(ws, name, dim, info.shape[dim], sh, ranges, &n));
    int nr = 0; /* the tile width of a weight saved int8 in tiles, else 0 */
    if (info.dtype == DF_DTYPE_I8) {
        DF_TRY(saved_int8_layout(ws, &nr));
        if (!df_i8_tiles_fit(info.shape[0], info.shape[1], nr))
            nr = 0;
    }
    bool whole = nr && cuts_whole_tiles(nr, dim, ranges, n);
    df_tensor *t = NULL;
    if (nr && !whole)
        DF_TRY(bind_detiled(ws, &info, nr, false, dim, ranges, n, &t));
    else if (nr && dim == 1)
        DF_TRY(bind_tile_cols(ws, &info, ranges, n, &t));
    else
        DF_TRY(bind_ranges(ws, &info, dim, ranges, n, &t));
    if (info.dtype == DF_DTYPE_I8)
        DF_TRY(bind_scale_split(ws, &info, t, dim, ranges, n, sh->world, nr, whole));
    *out = t;
    return DF_OK;
}

static bool splits(const df_shard *sh)
{
    return sh && sh->style != DF_SHARD_REPLICATE && sh->world > 1;
}

static df_status check_shard(const df_weight_set *ws, const char *name, const df_shard *sh)
{
    if (ws->sf && sh && sh->world > 1)
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s': tensor parallelism over a "
                         "single-file checkpoint (%s) is not supported; use a diffusers "
                         "folder", ws->component, name, df_single_file_path(ws->sf));
    if (sh && sh->world > 1 && (sh->rank < 0 || sh->rank >= sh->world))
        return df_errorf(DF_E_ARG, "%s: tensor '%s': rank %d of %d", ws->component, name,
                         sh->rank, sh->world);
    return DF_OK;
}

static df_status linear_sharded(df_weight_set *ws, df_linear_weights *out, int64_t out_f,
                                int64_t in_f, bool bias, const df_shard *sh, const char *base)
{
    char name[512];
    *out = (df_linear_weights){0};
    snprintf(name, sizeof name, "%s.weight", base);
    DF_TRY(check_shard(ws, name, sh));
    if (!splits(sh)) {
        DF_TRY(bind(ws, name, 2, (int64_t[]){out_f, in_f}, &out->weight));
        if (lora_updates(ws, name) && lora_unmerged(ws, out->weight))
            DF_TRY(attach_lora(ws, base, out));
    } else {
        int dim = sh->style == DF_SHARD_COLWISE ? 0 : 1;
        DF_TRY(bind_split(ws, name, 2, (int64_t[]){out_f, in_f}, dim, sh, &out->weight));
    }
    if (!bias)
        return DF_OK;
    snprintf(name, sizeof name, "%s.bias", base);
    if (splits(sh) && sh->style == DF_SHARD_COLWISE)
        return bind_split(ws, name, 1, (int64_t[]){out_f}, 0, sh, &out->bias);
    if (splits(sh) && sh->rank != 0) { /* rowwise: rank 0 adds the bias once */
        df_tensor_info info;
        DF_TRY(find_checked(ws, name, 1, (int64_t[]){out_f}, &info));
        mark_used(ws, name);
        return DF_OK;
    }
    return bind(ws, name, 1, (int64_t[]){out_f}, &out->bias);
}

static df_status tensor_sharded(df_weight_set *ws, df_tensor **out, int ndim,
                                const int64_t *shape, const df_shard *sh, const char *name)
{
    DF_TRY(check_shard(ws, name, sh));
    if (!splits(sh))
        return bind(ws, name, ndim, shape, out);
    if (ndim < 1)
        return df_errorf(DF_E_ARG, "%s: tensor '%s' is a scalar and cannot be split",
                         ws->component, name);
    int dim = sh->style == DF_SHARD_COLWISE ? ndim - 1 : 0;
    return bind_split(ws, name, ndim, shape, dim, sh, out);
}

/* '*' matches one or more digits (a block index); everything else literally. */
static bool plan_match(const char *pattern, const char *name, size_t name_len)
{
    const char *end = name + name_len;
    for (; *pattern; pattern++) {
        if (*pattern == '*') {
            if (name == end || *name < '0' || *name > '9')
                return false;
            while (name < end && *name >= '0' && *name <= '9')
                name++;
        } else if (name == end || *name++ != *pattern) {
            return false;
        }
    }
    return name == end;
}

/* The plan's shard for module `name` (its first `len` characters); NULL: replicated. */
static const df_shard *plan_shard(df_weight_set *ws, const char *name, size_t len)
{
    if (ws->tp_world <= 1)
        return NULL;
    for (int i = 0; i < ws->tp_n; i++) {
        const df_tp_rule *r = &ws->tp_rules[i];
        if (!plan_match(r->module, name, len))
            continue;
        ws->tp_shard = (df_shard){.style = r->style, .rank = ws->tp_rank,
                                  .world = ws->tp_world, .n_parts = r->n_parts};
        memcpy(ws->tp_shard.parts, r->parts, sizeof r->parts);
        return &ws->tp_shard;
    }
    return NULL;
}

void df_ws_set_tp_plan(df_weight_set *ws, const df_tp_rule *rules, int n, int rank, int world)
{
    ws->tp_rules = rules;
    ws->tp_n = n;
    ws->tp_rank = rank;
    ws->tp_world = world;
}

df_status df_ws_linear_sharded(df_weight_set *ws, df_linear_weights *out, int64_t out_f,
                               int64_t in_f, bool bias, const df_shard *sh, const char *fmt, ...)
{
    char base[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    return linear_sharded(ws, out, out_f, in_f, bias, sh, base);
}

df_status df_ws_tensor_sharded(df_weight_set *ws, df_tensor **out, int ndim, const int64_t *shape,
                               const df_shard *sh, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    return tensor_sharded(ws, out, ndim, shape, sh, name);
}

df_status df_ws_tensor(df_weight_set *ws, df_tensor **out, int ndim, const int64_t *shape,
                       const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    *out = NULL;
    size_t len = strlen(name), suffix = strlen(".weight");
    if (len > suffix && strcmp(name + len - suffix, ".weight") == 0)
        len -= suffix; /* plans name modules */
    return tensor_sharded(ws, out, ndim, shape, plan_shard(ws, name, len), name);
}

df_status df_ws_linear(df_weight_set *ws, df_linear_weights *out, int64_t out_f, int64_t in_f,
                       bool bias, const char *fmt, ...)
{
    char base[480];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    return linear_sharded(ws, out, out_f, in_f, bias, plan_shard(ws, base, strlen(base)), base);
}

bool df_ws_has(df_weight_set *ws, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    if (ws->sf)
        return df_single_file_has(ws->sf, name);
    return df_weights_contains(ws->w, name);
}

static _Thread_local char last_warning[1024];

const char *df_ws_last_warning(void)
{
    return last_warning;
}

df_status df_ws_check_all_used(df_weight_set *ws)
{
    if (ws->ctx->lora) /* a module no weight of this component took */
        DF_TRY(df_lora_check_used(ws->ctx->lora, ws->component));
    enum { NAMED = 4 };
    int64_t unused = 0;
    size_t n = 0;
    char *w = last_warning;
    size_t cap = sizeof last_warning;
    int64_t count = ws->sf ? df_single_file_count(ws->sf) : ws->count;
    for (int64_t i = 0; i < count; i++) {
        const char *name = NULL;
        if (ws->sf) {
            name = df_single_file_unused(ws->sf, i);
        } else if (!ws->used[i]) {
            df_tensor_info info;
            DF_TRY(df_weights_at(ws->w, i, &info));
            name = info.name;
        }
        if (!name)
            continue;
        if (unused == 0)
            n = (size_t)snprintf(w, cap, "warning: %s: %s: tensors the config does not call "
                                 "for were not loaded:", ws->component,
                                 ws->sf ? df_single_file_path(ws->sf) : df_weights_path(ws->w));
        if (unused < NAMED && n < cap)
            n += (size_t)snprintf(w + n, cap - n, " '%s'", name);
        unused++;
    }
    if (unused == 0)
        return DF_OK;
    if (unused > NAMED && n < cap)
        snprintf(w + n, cap - n, " and %lld more", (long long)(unused - NAMED));
    /* diffusers warns and loads the rest; so do we (one line, as it prints one) */
    if (ws->tp_rank == 0)
        df_logf(0, "%s", last_warning);
    return DF_OK;
}

int64_t df_ws_bytes(const df_weight_set *ws)
{
    return ws->bytes;
}

int df_ws_bound_count(const df_weight_set *ws)
{
    return ws->n;
}

df_tensor *df_ws_bound(const df_weight_set *ws, int i, const char **name)
{
    *name = ws->tensors[i].name;
    return ws->tensors[i].t;
}

int df_ws_collect(const df_weight_set *ws, const char *prefix, df_tensor **out, int cap)
{
    int n = 0;
    size_t len = strlen(prefix);
    for (int i = 0; i < ws->n; i++)
        if (strncmp(ws->tensors[i].name, prefix, len) == 0) {
            if (n < cap)
                out[n] = ws->tensors[i].t;
            n++;
        }
    return n;
}

bool df_ws_try_map(df_weight_set *ws, df_name_map map, int arg, const char *probe,
                   const char *hint)
{
    return ws->sf && df_single_file_try_map(ws->sf, map, arg, probe, hint);
}

void df_ws_ignore_prefix(df_weight_set *ws, const char *prefix)
{
    if (ws->sf)
        df_single_file_ignore_prefix(ws->sf, prefix);
    size_t n = strlen(prefix);
    for (int64_t i = 0; i < ws->count; i++) {
        df_tensor_info info;
        if (df_weights_at(ws->w, i, &info) == DF_OK && strncmp(info.name, prefix, n) == 0)
            ws->used[i] = 1;
    }
}

/* ---- residency (runtime/weight.h) ------------------------------------------------------ */

df_status df_ws_release(df_weight_set *ws, const char *prefix)
{
    return df_weight_release(ws->ctx, ws->tensors, ws->n, prefix);
}

void df_ws_acquire(df_weight_set *ws, const char *prefix)
{
    df_weight_acquire(ws->ctx, ws->tensors, ws->n, prefix);
}

int64_t df_ws_resident_bytes(const df_weight_set *ws)
{
    return df_weight_resident_bytes(ws->tensors, ws->n);
}
