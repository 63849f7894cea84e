/*
 * Linear layers in int8 compute: the weight quantized once and kept on its storage (or,
 * for a weight in a compact file format, packed block by block in every product; or, for
 * one saved in the kernels' tiles, used where it is mapped with only its group sums made),
 * the activations quantized per call (gemm_int8.h).
 */
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_int8.h"
#include "core/alloc.h"

bool df_i8_linear_applies(const df_view *w)
{
    if (w->dtype == DF_DTYPE_I8) /* saved quantized: int8 products in any compute dtype */
        return w->buf && w->ndim == 2 && df_view_is_dense(w);
    return w->buf && (w->flags & DF_VIEW_CONST) && !(w->flags & DF_VIEW_KEEP_PRECISION) &&
           w->ndim == 2 &&
           df_view_is_dense(w) && w->shape[1] > 0 &&
           (w->dtype == DF_DTYPE_F32 || w->dtype == DF_DTYPE_BF16 || w->dtype == DF_DTYPE_F16);
}

/* An I8 weight saved quantized: its packed form from the stored values and scales. */
static df_status from_saved(const df_view *w, df_i8_weight **out)
{
    int64_t n = w->shape[0], k = w->shape[1], groups = w->scale_groups;
    if (!w->scale_buf || groups <= 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "int8: an I8 [%lld, %lld] weight without its scales "
                         "(only whole weights saved by df_quantize_model are read)",
                         (long long)n, (long long)k);
    int64_t group = groups == 1 ? DF_I8_WHOLE_K : k / groups;
    const float *scale = (const float *)((char *)w->scale_buf->ptr + w->scale_offset);
    if (w->block_type == DF_QBLOCK_I8_TILES) { /* already the kernels' layout: in place */
        df_cpu_read_ahead(w, df_view_ptr(w), (size_t)(n * k));
        return df_i8_weight_from_tiles(df_view_ptr(w), scale, n, k, group, out);
    }
    return df_i8_weight_from_plain(df_view_ptr(w), scale, n, k, group, out);
}

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

/* w quantized with `group`, made once and kept on w's storage. */
static df_status quantized_weight_of(const df_view *w, int64_t group, const df_i8_weight **out)
{
    *out = NULL;
    int64_t n = w->shape[0], k = w->shape[1];
    uint64_t h = mix(mix(mix(mix(0x696e7438ull /* "int8" */, (uint64_t)group), (uint64_t)w->dtype),
                         (uint64_t)w->offset),
                     (uint64_t)n * 0x100000001ull + (uint64_t)k);
    df_derived *d = df_cpu_find_derived(w->buf, (int64_t)h);
    if (d) {
        *out = d->data;
        return DF_OK;
    }
    d = df_calloc(1, sizeof *d);
    if (!d)
        return df_errorf(DF_E_OOM, "int8: out of memory");
    df_i8_weight *q;
    df_status s = w->dtype == DF_DTYPE_I8
                      ? from_saved(w, &q)
                      : df_i8_weight_pack(df_view_ptr(w), w->dtype, n, k, k, group, &q);
    if (s != DF_OK) {
        df_free(d);
        return s;
    }
    bool in_place = w->block_type == DF_QBLOCK_I8_TILES;
    *d = (df_derived){.key = (int64_t)h,
                      .data = q,
                      .bytes = in_place ? df_i8_tiles_bytes(n, k, q->group)
                                        : df_i8_weight_bytes(n, k, q->group),
                      .free = df_i8_weight_free};
    df_cpu_add_derived(w->buf, d);
    /* From now on the quantized copy is what runs: the file's pages need not stay (a tiled
     * weight runs on them). */
    if (!in_place)
        df_cpu_drop_pages(w, df_view_ptr(w), (size_t)(n * k) * df_dtype_size(w->dtype));
    *out = q;
    return DF_OK;
}

df_status df_i8_linear(df_kernel_env *env, const df_view *x, int64_t m, const df_view *w,
                       const df_view *bias, const df_i8_epilogue *e)
{
    int64_t k = w->shape[1];
    const df_i8_weight *q = NULL;
    df_i8_blocks blocks;
    df_i8_weight shape;
    bool blocks_form = w->block_type && w->block_type != DF_QBLOCK_I8_TILES;
    if (blocks_form) { /* kept in its file's form: packed block by block in the product */
        DF_TRY(df_i8_blocks_of(df_view_ptr(w), w->block_type, w->block_scale, w->shape[0], k,
                               &blocks));
        shape = df_i8_blocks_shape(&blocks);
        q = &shape;
    } else {
        int64_t group = env->int8_group > 0   ? env->int8_group
                        : env->int8_group < 0 ? DF_I8_WHOLE_K
                                              : df_i8_default_group();
        DF_TRY(quantized_weight_of(w, group, &q));
    }
    /* activations: f32 or bf16 as they are; anything else through f32 */
    df_dtype xt = x->dtype == DF_DTYPE_BF16 ? DF_DTYPE_BF16 : DF_DTYPE_F32;
    size_t sx = (df_gemm_operand_scratch(x, xt) + 63) & ~(size_t)63;
    size_t sb = bias ? (df_gemm_operand_scratch(bias, DF_DTYPE_F32) + 63) & ~(size_t)63 : 0;
    size_t sa = df_i8_act_bytes(q, m);
    char *scratch = df_env_scratch(env, sx + sb + sa);
    if (!scratch)
        return df_errorf(DF_E_OOM, "linear: out of memory for %zu bytes of scratch", sx + sb + sa);
    const void *xa, *bb = NULL;
    DF_TRY(df_gemm_operand(x, xt, scratch, &xa));
    if (bias)
        DF_TRY(df_gemm_operand(bias, DF_DTYPE_F32, scratch + sx, &bb));
    df_i8_act a;
    df_i8_act_quantize(q, xa, xt, m, k, scratch + sx + sb, &a);
    df_i8_epilogue ep = *e;
    ep.bias = bb;
    if (blocks_form)
        return df_i8_gemm_blocks(&a, &blocks, &ep, (df_i8_path)env->int8_path);
    return df_i8_gemm(&a, q, &ep, (df_i8_path)env->int8_path);
}
