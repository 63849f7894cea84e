/*
 * View functions: new handles over the same storage with another shape, order or range.
 * Only reshape of a tensor whose layout cannot express the new shape copies (through
 * df_contiguous), as torch.reshape does.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "runtime/runtime.h"

static df_tensor *view_of(df_ctx *ctx, df_tensor *x, const df_gview *v)
{
    df_storage_retain(x->v.st);
    df_gview nv = *v;
    nv.st = x->v.st;
    return df_handle_new(ctx, &nv);
}

/* As ops.c's ready(): a NULL x in a context that has not failed fails it here. */
static bool ok(df_ctx *ctx, const char *op, df_tensor *x)
{
    if (ctx->status != DF_OK)
        return false;
    if (!x)
        df_ctx_fail(ctx, df_errorf(DF_E_ARG, "%s: the input is NULL (the call that made it "
                                   "failed without an error)", op));
    return x != NULL;
}

static int norm_dim(int d, int ndim)
{
    return d < 0 ? d + ndim : d;
}

static df_tensor *shape_error(df_ctx *ctx, const char *op, df_tensor *x, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static df_tensor *shape_error(df_ctx *ctx, const char *op, df_tensor *x, const char *fmt, ...)
{
    char desc[128], why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    return df_ctx_fail(ctx, df_errorf(DF_E_SHAPE, "%s of %s: %s", op,
                                      df_tensor_describe(x, desc, sizeof desc), why));
}

df_tensor *df_reshape(df_ctx *ctx, df_tensor *x, const int64_t *shape, int ndim)
{
    if (!ok(ctx, "reshape", x))
        return NULL;
    if (ndim < 0 || ndim > DF_MAX_DIMS)
        return shape_error(ctx, "reshape", x, "%d dimensions", ndim);
    int64_t numel = df_tensor_numel(x), known = 1;
    int infer = -1;
    df_gview v = x->v;
    v.ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        v.shape[d] = shape[d];
        if (shape[d] == -1 && infer < 0)
            infer = d;
        else if (shape[d] < 0)
            return shape_error(ctx, "reshape", x, "bad size %lld", (long long)shape[d]);
        else
            known *= shape[d];
    }
    if (infer >= 0) {
        if (known == 0 || numel % known)
            return shape_error(ctx, "reshape", x, "cannot infer dimension %d", infer);
        v.shape[infer] = numel / known;
        known = numel;
    }
    if (known != numel)
        return shape_error(ctx, "reshape", x, "%lld elements cannot take a shape of %lld",
                           (long long)numel, (long long)known);
    if (!df_gview_is_dense(&x->v)) {
        df_tensor *c = df_contiguous(ctx, x);
        if (!c)
            return NULL;
        x = c;
        v.offset = c->v.offset;
    }
    int64_t s = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        v.stride[d] = s;
        s *= v.shape[d];
    }
    return view_of(ctx, x, &v);
}

df_tensor *df_permute(df_ctx *ctx, df_tensor *x, const int64_t *dims, int ndim)
{
    if (!ok(ctx, "permute", x))
        return NULL;
    if (ndim != x->v.ndim)
        return shape_error(ctx, "permute", x, "%d dimensions given", ndim);
    df_gview v = x->v;
    unsigned seen = 0;
    for (int d = 0; d < ndim; d++) {
        int s = norm_dim((int)dims[d], ndim);
        if (s < 0 || s >= ndim || (seen & (1u << s)))
            return shape_error(ctx, "permute", x, "invalid order");
        seen |= 1u << s;
        v.shape[d] = x->v.shape[s];
        v.stride[d] = x->v.stride[s];
    }
    return view_of(ctx, x, &v);
}

df_tensor *df_transpose(df_ctx *ctx, df_tensor *x, int d0, int d1)
{
    if (!ok(ctx, "transpose", x))
        return NULL;
    int64_t dims[DF_MAX_DIMS];
    for (int d = 0; d < x->v.ndim; d++)
        dims[d] = d;
    d0 = norm_dim(d0, x->v.ndim);
    d1 = norm_dim(d1, x->v.ndim);
    if (d0 < 0 || d1 < 0 || d0 >= x->v.ndim || d1 >= x->v.ndim)
        return shape_error(ctx, "transpose", x, "dimensions %d, %d", d0, d1);
    dims[d0] = d1;
    dims[d1] = d0;
    return df_permute(ctx, x, dims, x->v.ndim);
}

df_tensor *df_slice(df_ctx *ctx, df_tensor *x, int dim, int64_t start, int64_t end)
{
    if (!ok(ctx, "slice", x))
        return NULL;
    int d = norm_dim(dim, x->v.ndim);
    if (d < 0 || d >= x->v.ndim)
        return shape_error(ctx, "slice", x, "no dimension %d", dim);
    if (start < 0 || end < start || end > x->v.shape[d])
        return shape_error(ctx, "slice", x, "range [%lld, %lld) of dimension %d",
                           (long long)start, (long long)end, dim);
    df_gview v = x->v;
    v.offset += start * v.stride[d];
    v.shape[d] = end - start;
    return view_of(ctx, x, &v);
}

df_tensor *df_chunk(df_ctx *ctx, df_tensor *x, int n, int dim, int i)
{
    if (!ok(ctx, "chunk", x))
        return NULL;
    int d = norm_dim(dim, x->v.ndim);
    if (d < 0 || d >= x->v.ndim || n <= 0 || i < 0 || i >= n || x->v.shape[d] % n)
        return shape_error(ctx, "chunk", x, "part %d of %d along dimension %d", i, n, dim);
    int64_t size = x->v.shape[d] / n;
    return df_slice(ctx, x, d, i * size, (i + 1) * size);
}

df_tensor *df_expand(df_ctx *ctx, df_tensor *x, const int64_t *shape, int ndim)
{
    if (!ok(ctx, "expand", x))
        return NULL;
    if (ndim < x->v.ndim || ndim > DF_MAX_DIMS)
        return shape_error(ctx, "expand", x, "to %d dimensions", ndim);
    df_gview v = x->v;
    v.ndim = ndim;
    int lead = ndim - x->v.ndim;
    for (int d = 0; d < ndim; d++) {
        int64_t have = d < lead ? 1 : x->v.shape[d - lead];
        int64_t stride = d < lead ? 0 : x->v.stride[d - lead];
        int64_t want = shape[d] == -1 ? have : shape[d];
        if (have != want && have != 1)
            return shape_error(ctx, "expand", x, "dimension %d of size %lld to %lld", d,
                               (long long)have, (long long)want);
        v.shape[d] = want;
        v.stride[d] = have == want ? stride : 0;
    }
    return view_of(ctx, x, &v);
}

df_tensor *df_unsqueeze(df_ctx *ctx, df_tensor *x, int dim)
{
    if (!ok(ctx, "unsqueeze", x))
        return NULL;
    int nd = x->v.ndim + 1;
    int d = norm_dim(dim, nd);
    if (d < 0 || d >= nd || nd > DF_MAX_DIMS)
        return shape_error(ctx, "unsqueeze", x, "at %d", dim);
    df_gview v = x->v;
    v.ndim = nd;
    for (int k = nd - 1; k > d; k--) {
        v.shape[k] = x->v.shape[k - 1];
        v.stride[k] = x->v.stride[k - 1];
    }
    v.shape[d] = 1;
    v.stride[d] = d + 1 < nd ? v.shape[d + 1] * v.stride[d + 1] : 1;
    return view_of(ctx, x, &v);
}

df_tensor *df_squeeze(df_ctx *ctx, df_tensor *x, int dim)
{
    if (!ok(ctx, "squeeze", x))
        return NULL;
    int d = norm_dim(dim, x->v.ndim);
    if (d < 0 || d >= x->v.ndim || x->v.shape[d] != 1)
        return shape_error(ctx, "squeeze", x, "dimension %d is not of size 1", dim);
    df_gview v = x->v;
    v.ndim--;
    for (int k = d; k < v.ndim; k++) {
        v.shape[k] = x->v.shape[k + 1];
        v.stride[k] = x->v.stride[k + 1];
    }
    return view_of(ctx, x, &v);
}
