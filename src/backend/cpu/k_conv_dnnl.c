/*
 * CONV2D through oneDNN's convolution primitive (direct convolution, not im2col + GEMM).
 *
 * The primitive is created with its layouts left to oneDNN (format_tag_any): on AVX-512 it
 * picks channel-blocked layouts (nChw16c, OIhw16i16o), whose inner loops read each input
 * pixel once per 16 output channels instead of materialising a 9x larger patch matrix. The
 * activations come and go as plain NCHW, reordered in and out around each convolution: a
 * reorder moves the tensor once, a 3x3 convolution reads it C*9 times, so the reorders are
 * a few percent of the work. The weight is reordered once into the primitive's layout and
 * kept on its storage as a derived form. Primitives and their reorders are cached per
 * calling thread, keyed by shape and dtype.
 *
 * Compute in f32, or bf16 where the provider has it (the source is converted by its
 * reorder; the output stays f32). Anything oneDNN cannot do here returns DF_E_UNSUPPORTED
 * without touching the output, and k_conv.c goes on with im2col + GEMM.
 */
#include <pthread.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/dnnl_weight.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/k_conv_dnnl.h"
#include "core/alloc.h"
#include "core/status.h"

#define CONV_CACHE 32 /* primitives kept per thread (the VAE decoder has about 15 shapes) */

typedef struct conv_key {
    int64_t n, c, h, w, o, kh, kw, ho, wo, stride, pad;
    int type; /* compute dtype */
    bool bias;
} conv_key;

typedef struct conv_plan {
    conv_key key;
    dnnl_primitive_t conv, src_in, dst_out; /* the reorders are NULL when not needed */
    dnnl_memory_desc_t src_md, wei_md, dst_md, bias_md;  /* the primitive's */
    dnnl_memory_desc_t user_src, user_dst;               /* plain NCHW f32 */
    size_t src_bytes, dst_bytes;                         /* blocked copies, 0 when plain */
} conv_plan;

typedef struct conv_cache {
    conv_plan *plans[CONV_CACHE];
    int next; /* slot replaced next when all are taken */
} conv_cache;

#define DNNL_COPIES_MAX ((size_t)512 << 20) /* input + output in oneDNN's layouts */

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t cache_key;
static dnnl_engine_t engine;
static bool ready;

static void plan_free(conv_plan *p)
{
    if (!p)
        return;
    if (p->conv)
        dnnl_primitive_destroy(p->conv);
    if (p->src_in)
        dnnl_primitive_destroy(p->src_in);
    if (p->dst_out)
        dnnl_primitive_destroy(p->dst_out);
    df_free(p);
}

static void cache_free(void *arg)
{
    conv_cache *c = arg;
    for (int i = 0; i < CONV_CACHE; i++)
        plan_free(c->plans[i]);
    df_free(c);
}

static void init_once(void)
{
    ready = dnnl_engine_create(&engine, dnnl_cpu, 0) == dnnl_success &&
            pthread_key_create(&cache_key, cache_free) == 0;
}

static df_status failed(dnnl_status_t r, const char *what)
{
    df_status s = r == dnnl_out_of_memory ? DF_E_OOM : DF_E_UNSUPPORTED;
    return df_errorf(s, "conv2d (oneDNN): %s failed (status %d)", what, (int)r);
}

/* A reorder primitive from `from` to `to`, or NULL in *out when the layouts are equal. */
static dnnl_status_t reorder_create(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                    dnnl_primitive_t *out)
{
    *out = NULL;
    if (dnnl_memory_desc_equal(from, to))
        return dnnl_success;
    dnnl_primitive_desc_t pd;
    dnnl_status_t r = dnnl_reorder_primitive_desc_create(&pd, from, engine, to, engine, NULL);
    if (r == dnnl_success) {
        r = dnnl_primitive_create(out, pd);
        dnnl_primitive_desc_destroy(pd);
    }
    return r;
}

static dnnl_status_t plan_build(conv_plan *p)
{
    const conv_key *k = &p->key;
    dnnl_data_type_t dt = k->type == DF_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    dnnl_dims_t src = {k->n, k->c, k->h, k->w}, dst = {k->n, k->o, k->ho, k->wo};
    dnnl_dims_t wei = {k->o, k->c, k->kh, k->kw}, bias = {k->o};
    dnnl_dims_t strides = {k->stride, k->stride}, pad_l = {k->pad, k->pad};
    /* oneDNN: ho = (h - kh + pad_l + pad_r) / stride + 1; the right pad makes it come out */
    dnnl_dims_t pad_r = {(k->ho - 1) * k->stride + k->kh - k->h - k->pad,
                         (k->wo - 1) * k->stride + k->kw - k->w - k->pad};
    if (pad_r[0] < 0 || pad_r[1] < 0)
        return dnnl_unimplemented;
    dnnl_memory_desc_t src_any, wei_any, dst_any;
    dnnl_memory_desc_init_by_tag(&src_any, 4, src, dt, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&wei_any, 4, wei, dt, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&dst_any, 4, dst, dnnl_f32, dnnl_format_tag_any);
    dnnl_memory_desc_init_by_tag(&p->bias_md, 1, bias, dnnl_f32, dnnl_x);
    dnnl_memory_desc_init_by_tag(&p->user_src, 4, src, dnnl_f32, dnnl_nchw);
    dnnl_memory_desc_init_by_tag(&p->user_dst, 4, dst, dnnl_f32, dnnl_nchw);

    dnnl_convolution_desc_t desc;
    dnnl_status_t r = dnnl_convolution_forward_desc_init(
        &desc, dnnl_forward_inference, dnnl_convolution_direct, &src_any, &wei_any,
        k->bias ? &p->bias_md : NULL, &dst_any, strides, pad_l, pad_r);
    dnnl_primitive_desc_t pd = NULL;
    if (r == dnnl_success)
        r = dnnl_primitive_desc_create(&pd, &desc, NULL, engine, NULL);
    if (r != dnnl_success)
        return r;
    /* oneDNN's reference kernels are far slower than im2col + GEMM: refuse them */
    const char *impl = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    if (!impl || strstr(impl, "ref")) {
        dnnl_primitive_desc_destroy(pd);
        return dnnl_unimplemented;
    }
    p->src_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    p->wei_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    p->dst_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    r = dnnl_primitive_create(&p->conv, pd);
    dnnl_primitive_desc_destroy(pd);
    if (r == dnnl_success)
        r = reorder_create(&p->user_src, &p->src_md, &p->src_in);
    if (r == dnnl_success)
        r = reorder_create(&p->dst_md, &p->user_dst, &p->dst_out);
    p->src_bytes = p->src_in ? dnnl_memory_desc_get_size(&p->src_md) : 0;
    p->dst_bytes = p->dst_out ? dnnl_memory_desc_get_size(&p->dst_md) : 0;
    return r;
}

/* This thread's plan for `key`, built on first use. */
static df_status plan_get(const conv_key *key, const conv_plan **out)
{
    conv_cache *c = pthread_getspecific(cache_key);
    if (!c) {
        if (!(c = df_calloc(1, sizeof *c)))
            return df_errorf(DF_E_OOM, "conv2d: out of memory for the plan cache");
        pthread_setspecific(cache_key, c);
    }
    int slot = -1;
    for (int i = 0; i < CONV_CACHE; i++) {
        if (c->plans[i] && !memcmp(&c->plans[i]->key, key, sizeof *key)) {
            *out = c->plans[i];
            return DF_OK;
        }
        if (!c->plans[i] && slot < 0)
            slot = i;
    }
    if (slot < 0) {
        slot = c->next;
        c->next = (c->next + 1) % CONV_CACHE;
        plan_free(c->plans[slot]);
        c->plans[slot] = NULL;
    }
    conv_plan *p = df_calloc(1, sizeof *p);
    if (!p)
        return df_errorf(DF_E_OOM, "conv2d: out of memory for a plan");
    p->key = *key;
    dnnl_status_t r = plan_build(p);
    if (r != dnnl_success) {
        /* kept without primitives, so that the refusal is not paid again */
        plan_free(p);
        if (!(p = df_calloc(1, sizeof *p)))
            return df_errorf(DF_E_OOM, "conv2d: out of memory for a plan");
        p->key = *key;
    }
    c->plans[slot] = p;
    *out = p;
    return DF_OK;
}


static dnnl_status_t run1(dnnl_stream_t s, dnnl_primitive_t prim, int nargs,
                          const dnnl_exec_arg_t *args)
{
    dnnl_status_t r = dnnl_primitive_execute(prim, s, nargs, args);
    return r == dnnl_success ? dnnl_stream_wait(s) : r;
}

/* Copies memory `src` (described by src_md) into dst (dst_md) with a one-off reorder. */
static dnnl_status_t reorder_once(dnnl_stream_t s, const dnnl_memory_desc_t *src_md,
                                  const void *src, const dnnl_memory_desc_t *dst_md, void *dst)
{
    dnnl_primitive_t prim;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_status_t r = reorder_create(src_md, dst_md, &prim);
    if (r == dnnl_success)
        r = dnnl_memory_create(&ms, src_md, engine, (void *)src);
    if (r == dnnl_success)
        r = dnnl_memory_create(&md, dst_md, engine, dst);
    if (r == dnnl_success && prim)
        r = run1(s, prim, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}});
    else if (r == dnnl_success)
        memcpy(dst, src, dnnl_memory_desc_get_size(dst_md));
    if (ms)
        dnnl_memory_destroy(ms);
    if (md)
        dnnl_memory_destroy(md);
    if (prim)
        dnnl_primitive_destroy(prim);
    return r;
}

typedef struct reorder_arg {
    dnnl_stream_t s;
    const dnnl_memory_desc_t *from;
} reorder_arg;

static df_status reorder_fill(const df_view *w, const dnnl_memory_desc_t *md, void *dst,
                              void *arg)
{
    const reorder_arg *a = arg;
    dnnl_status_t r = reorder_once(a->s, a->from, df_view_ptr(w), md, dst);
    return r == dnnl_success ? DF_OK : failed(r, "reordering a weight");
}

/* The weight in the plan's layout: reordered once (from f32 or bf16 OIHW) and kept on the
 * weight's storage when it is a constant, else reordered into `scratch`. */
static df_status weight_of(const df_view *w, const conv_plan *p, dnnl_stream_t s, void *scratch,
                           const void **out)
{
    dnnl_memory_desc_t from;
    dnnl_dims_t dims = {w->shape[0], w->shape[1], w->shape[2], w->shape[3]};
    dnnl_memory_desc_init_by_tag(&from, 4, dims,
                                 w->dtype == DF_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32, dnnl_oihw);
    reorder_arg a = {.s = s, .from = &from};
    if (!(w->flags & DF_VIEW_CONST)) {
        *out = scratch;
        return reorder_fill(w, &p->wei_md, scratch, &a);
    }
    uint64_t h = df_hash_mix(df_hash_mix(df_hash_mix(0x636f6e76ull /* "conv" */,
                                                     (uint64_t)p->key.type),
                                         (uint64_t)w->dtype),
                             (uint64_t)w->offset);
    for (int i = 0; i < 4; i++)
        h = df_hash_mix(h, (uint64_t)dims[i]);
    bool made;
    return df_dnnl_weight_kept(w, h, &p->wei_md, reorder_fill, &a, "conv2d", out, &made);
}

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Runs the plan: src in, convolution, dst out, on one stream made for the call. */
static dnnl_status_t plan_exec(const conv_plan *p, dnnl_stream_t s, const float *x,
                               const void *wei, const float *bias, float *out, void *src_tmp,
                               void *dst_tmp)
{
    dnnl_memory_t mx = NULL, ms = NULL, mw = NULL, mb = NULL, md = NULL, mo = NULL;
    void *src = p->src_in ? src_tmp : (void *)x;
    void *dst = p->dst_out ? dst_tmp : (void *)out;
    dnnl_status_t r = dnnl_memory_create(&mx, &p->user_src, engine, (void *)x);
    if (r == dnnl_success)
        r = dnnl_memory_create(&ms, &p->src_md, engine, src);
    if (r == dnnl_success)
        r = dnnl_memory_create(&mw, &p->wei_md, engine, (void *)wei);
    if (r == dnnl_success && bias)
        r = dnnl_memory_create(&mb, &p->bias_md, engine, (void *)bias);
    if (r == dnnl_success)
        r = dnnl_memory_create(&md, &p->dst_md, engine, dst);
    if (r == dnnl_success)
        r = dnnl_memory_create(&mo, &p->user_dst, engine, out);
    if (r == dnnl_success && p->src_in)
        r = run1(s, p->src_in, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, mx}, {DNNL_ARG_TO, ms}});
    if (r == dnnl_success) {
        dnnl_exec_arg_t args[4] = {
            {DNNL_ARG_SRC, ms}, {DNNL_ARG_WEIGHTS, mw}, {DNNL_ARG_DST, md}, {DNNL_ARG_BIAS, mb}};
        r = run1(s, p->conv, bias ? 4 : 3, args);
    }
    if (r == dnnl_success && p->dst_out)
        r = run1(s, p->dst_out, 2, (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, md}, {DNNL_ARG_TO, mo}});
    dnnl_memory_t all[] = {mx, ms, mw, mb, md, mo};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i])
            dnnl_memory_destroy(all[i]);
    return r;
}

df_status df_conv2d_dnnl(const df_node *n, df_kernel_env *env, df_dtype compute)
{
    const df_view *xv = &n->in[0], *wv = &n->in[1];
    const df_view *bv = n->in[2].buf ? &n->in[2] : NULL;
    pthread_once(&once, init_once);
    if (!ready)
        return df_errorf(DF_E_UNSUPPORTED, "conv2d: oneDNN engine unavailable");
    if (xv->dtype != DF_DTYPE_F32 || n->out.dtype != DF_DTYPE_F32 ||
        (wv->dtype != DF_DTYPE_F32 && wv->dtype != DF_DTYPE_BF16))
        return df_errorf(DF_E_UNSUPPORTED, "conv2d: oneDNN path takes f32 x and f32/bf16 w");
    /* bf16 compute stays on im2col + GEMM: oneDNN's bf16 convolutions round differently on
     * one thread and on two, and a tensor-parallel rank (one thread) must decode the image
     * the single process (two) decodes (matrix/flux2-klein-tp2: 5 levels apart). */
    if (compute != DF_DTYPE_F32)
        return DF_E_UNSUPPORTED;
    conv_key key = {.n = xv->shape[0],
                    .c = xv->shape[1],
                    .h = xv->shape[2],
                    .w = xv->shape[3],
                    .o = wv->shape[0],
                    .kh = wv->shape[2],
                    .kw = wv->shape[3],
                    .ho = n->out.shape[2],
                    .wo = n->out.shape[3],
                    .stride = n->a.stride,
                    .pad = n->a.padding,
                    .type = (int)compute,
                    .bias = bv != NULL};
    const conv_plan *p = NULL;
    DF_TRY(plan_get(&key, &p));
    if (!p->conv)
        return DF_E_UNSUPPORTED; /* no fast oneDNN convolution for this shape */

    size_t sw = (wv->flags & DF_VIEW_CONST) ? 0 : round64(dnnl_memory_desc_get_size(&p->wei_md));
    size_t sb = bv ? round64(df_gemm_operand_scratch(bv, DF_DTYPE_F32)) : 0;
    size_t ss = round64(p->src_bytes), sd = round64(p->dst_bytes);
    /* The copies in oneDNN's layouts live in the stream's scratch, which stays grown: past
     * this size (a 1024x1024 decode's full-resolution convs want 1-2 GiB) the im2col path,
     * whose scratch is a few MiB, runs instead. */
    if (ss + sd > DNNL_COPIES_MAX)
        return DF_E_UNSUPPORTED;
    char *scratch = NULL;
    if (sw + sb + ss + sd > 0 && !(scratch = df_env_scratch(env, sw + sb + ss + sd)))
        return df_errorf(DF_E_OOM, "conv2d: out of memory for %zu bytes of scratch",
                         sw + sb + ss + sd);
    dnnl_stream_t s;
    dnnl_status_t r = dnnl_stream_create(&s, engine, dnnl_stream_default_flags);
    if (r != dnnl_success)
        return failed(r, "creating a stream");
    const void *wei = NULL, *pb = NULL;
    df_status st = weight_of(wv, p, s, scratch, &wei);
    if (st == DF_OK && bv)
        st = df_gemm_operand(bv, DF_DTYPE_F32, scratch + sw, &pb);
    if (st == DF_OK) {
        r = plan_exec(p, s, df_view_ptr(xv), wei, pb, df_view_ptr(&n->out),
                      scratch + sw + sb, scratch + sw + sb + ss);
        if (r != dnnl_success)
            st = failed(r, "running the convolution");
    }
    dnnl_stream_destroy(s);
    return st;
}
