/*
 * Weight sets: a component's checkpoint bound by name (see loader.h).
 *
 * Tensors wrap the mapping, so binding costs no copy and no page is touched until a kernel
 * reads it. A weight whose bytes are not aligned to its element size (possible in a
 * hand-made file) is copied into aligned memory instead. Which tensors were bound is kept
 * in a bitmap over the checkpoint's name order, so the unexpected-tensor check is one pass.
 */
#include <stdarg.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/layout.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/loader.h"
#include "runtime/runtime.h"

typedef struct bound {
    char *name;
    df_tensor *t;
    const void *data; /* the bytes in the mapping */
    size_t bytes;
    bool resident;
} bound;

struct df_weight_set {
    df_ctx *ctx;
    df_weights *w;
    df_json *config;
    char dir[1024];
    char component[64];
    bound *tensors;
    int n, cap;
    uint8_t *used; /* per tensor of the checkpoint, in df_weights_at order */
    int64_t count;
    int64_t bytes;
};

df_status df_weight_set_open(df_ctx *ctx, const char *dir, const char *component,
                             df_weight_set **out)
{
    *out = NULL;
    df_weight_set *ws = df_calloc(1, sizeof *ws);
    if (!ws)
        return df_errorf(DF_E_OOM, "%s: out of memory", component);
    ws->ctx = ctx;
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

void df_weight_set_free(df_weight_set *ws)
{
    if (!ws)
        return;
    if (ws->n)
        df_sync(ws->ctx); /* queued kernels may still read the mapping */
    for (int i = 0; i < ws->n; i++) {
        if (ws->tensors[i].resident)
            df_stats_add_weights(ws->ctx, 0, -(int64_t)ws->tensors[i].bytes);
        df_tensor_free(ws->tensors[i].t);
        df_free(ws->tensors[i].name);
    }
    df_free(ws->tensors);
    df_free(ws->used);
    df_json_free(ws->config);
    df_weights_free(ws->w);
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

static df_status bind(df_weight_set *ws, const char *name, int ndim, const int64_t *shape,
                      df_tensor **out)
{
    *out = NULL;
    df_tensor_info info;
    if (!df_weights_contains(ws->w, name))
        return df_errorf(DF_E_FORMAT, "%s: %s: missing tensor '%s'", ws->component,
                         df_weights_path(ws->w), name);
    DF_TRY(df_weights_find(ws->w, name, &info));
    bool fits = info.ndim == ndim;
    for (int d = 0; fits && d < ndim; d++)
        fits = shape[d] < 0 || info.shape[d] == shape[d];
    if (!fits) {
        char want[160], got[160];
        shape_str(want, sizeof want, ndim, shape);
        shape_str(got, sizeof got, info.ndim, info.shape);
        return df_errorf(DF_E_FORMAT, "%s: tensor '%s' has shape %s, expected %s",
                         ws->component, name, got, want);
    }
    if (info.dtype != DF_DTYPE_F32 && info.dtype != DF_DTYPE_BF16 && info.dtype != DF_DTYPE_F16)
        return df_errorf(DF_E_UNSUPPORTED, "%s: tensor '%s' is stored as %s; weights must be "
                         "F32, BF16 or F16", ws->component, name, info.dtype_name);
    if (ws->n == ws->cap) {
        int cap = ws->cap ? 2 * ws->cap : 256;
        bound *t = df_realloc(ws->tensors, (size_t)cap * sizeof *t);
        if (!t)
            return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
        ws->tensors = t;
        ws->cap = cap;
    }
    df_tensor *t;
    if ((uintptr_t)info.data % info.elem_size == 0)
        t = df_tensor_wrap(ws->ctx, info.dtype, info.shape, info.ndim, info.data);
    else
        t = df_tensor_from_host(ws->ctx, info.dtype, info.shape, info.ndim, info.data);
    if (!t)
        return df_error_context(df_ctx_status(ws->ctx), "%s: tensor '%s'", ws->component, name);
    char *copy = df_strdup(name);
    if (!copy) {
        df_tensor_free(t);
        return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
    }
    ws->tensors[ws->n++] = (bound){.name = copy, .t = df_tensor_persist(t), .data = info.data,
                                   .bytes = info.nbytes, .resident = true};
    ws->bytes += (int64_t)info.nbytes;
    df_stats_add_weights(ws->ctx, (int64_t)info.nbytes, (int64_t)info.nbytes);
    int64_t i = index_of(ws, name);
    if (i >= 0)
        ws->used[i] = 1;
    *out = t;
    return DF_OK;
}

df_status df_ws_tensor(df_weight_set *ws, df_tensor **out, int ndim, const int64_t *shape,
                       const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return bind(ws, name, ndim, shape, out);
}

df_status df_ws_linear(df_weight_set *ws, df_linear_weights *out, int64_t out_f, int64_t in_f,
                       bool bias, const char *fmt, ...)
{
    char base[480], name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(base, sizeof base, fmt, ap);
    va_end(ap);
    *out = (df_linear_weights){0};
    snprintf(name, sizeof name, "%s.weight", base);
    DF_TRY(bind(ws, name, 2, (int64_t[]){out_f, in_f}, &out->weight));
    if (bias) {
        snprintf(name, sizeof name, "%s.bias", base);
        DF_TRY(bind(ws, name, 1, (int64_t[]){out_f}, &out->bias));
    }
    return DF_OK;
}

bool df_ws_has(df_weight_set *ws, const char *fmt, ...)
{
    char name[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return df_weights_contains(ws->w, name);
}

df_status df_ws_check_all_used(df_weight_set *ws)
{
    for (int64_t i = 0; i < ws->count; i++) {
        if (ws->used[i])
            continue;
        df_tensor_info info;
        DF_TRY(df_weights_at(ws->w, i, &info));
        return df_errorf(DF_E_FORMAT, "%s: %s: unexpected tensor '%s' (the config does not "
                         "call for it)", ws->component, df_weights_path(ws->w), info.name);
    }
    return DF_OK;
}

int64_t df_ws_bytes(const df_weight_set *ws)
{
    return ws->bytes;
}

void df_ws_ignore_prefix(df_weight_set *ws, const char *prefix)
{
    size_t n = strlen(prefix);
    for (int64_t i = 0; i < ws->count; i++) {
        df_tensor_info info;
        if (df_weights_at(ws->w, i, &info) == DF_OK && strncmp(info.name, prefix, n) == 0)
            ws->used[i] = 1;
    }
}

/* ---- residency ------------------------------------------------------------------------- */

static bool matches(const bound *b, const char *prefix)
{
    return !prefix || strncmp(b->name, prefix, strlen(prefix)) == 0;
}

static void advise(const void *data, size_t bytes, int advice)
{
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t begin = (uintptr_t)data / page * page;
    uintptr_t end = ((uintptr_t)data + bytes + page - 1) / page * page;
    if (end > begin)
        madvise((void *)begin, end - begin, advice); /* advice only: failure changes nothing */
}

typedef struct release_job {
    df_weight_set *ws;
    char prefix[256];
    bool all;
} release_job;

static df_status release_run(void *arg, df_kernel_env *env)
{
    (void)env;
    release_job *j = arg;
    for (int i = 0; i < j->ws->n; i++) {
        bound *b = &j->ws->tensors[i];
        if (!matches(b, j->all ? NULL : j->prefix))
            continue;
        df_storage_drop_derived(b->t->v.st); /* packed / converted forms */
        if (b->t->v.st->external)
            advise(b->data, b->bytes, MADV_DONTNEED);
    }
    return DF_OK;
}

static void release_done(void *arg, df_status s)
{
    (void)s;
    df_free(arg);
}

df_status df_ws_release(df_weight_set *ws, const char *prefix)
{
    df_ctx *ctx = ws->ctx;
    release_job *j = df_calloc(1, sizeof *j);
    if (!j)
        return df_errorf(DF_E_OOM, "%s: out of memory", ws->component);
    j->ws = ws;
    j->all = prefix == NULL;
    if (prefix)
        snprintf(j->prefix, sizeof j->prefix, "%s", prefix);
    /* After every kernel already asked for: flush pending graphs, then queue the job. */
    df_status s = ctx->exec->flush(ctx);
    if (s == DF_OK)
        s = ctx->dev->ops->stream_submit(
            ctx->stream, &(df_work){.run = release_run, .done = release_done, .arg = j});
    else
        df_free(j);
    if (s != DF_OK)
        return s;
    for (int i = 0; i < ws->n; i++) {
        bound *b = &ws->tensors[i];
        if (b->resident && matches(b, prefix)) {
            b->resident = false;
            df_stats_add_weights(ctx, 0, -(int64_t)b->bytes);
        }
    }
    return DF_OK;
}

void df_ws_acquire(df_weight_set *ws, const char *prefix)
{
    for (int i = 0; i < ws->n; i++) {
        bound *b = &ws->tensors[i];
        if (!matches(b, prefix))
            continue;
        if (b->t->v.st->external)
            advise(b->data, b->bytes, MADV_WILLNEED); /* read ahead while other work runs */
        if (!b->resident) {
            b->resident = true;
            df_stats_add_weights(ws->ctx, (int64_t)b->bytes, (int64_t)b->bytes);
        }
    }
}

int64_t df_ws_resident_bytes(const df_weight_set *ws)
{
    int64_t n = 0;
    for (int i = 0; i < ws->n; i++)
        n += ws->tensors[i].resident ? (int64_t)ws->tensors[i].bytes : 0;
    return n;
}
