/*
 * The oneDNN path of the int8 products: u8 x s8 -> f32 through oneDNN's matmul, which uses
 * AMX-INT8 where the CPU has it and AVX512-VNNI or AVX-VNNI otherwise.
 *
 * oneDNN 2.6 takes scales per output channel (output scales) but not per row, so this path
 * serves whole-k groups only: out = acc * sw[n] + corr[n] * sw[n] (the u8 shift's
 * correction as a per-channel binary add post-op), and the driver (gemm_int8.c) then
 * multiplies by each row's scale and applies the bias and the epilogue. The weight's
 * oneDNN form (its s8 values reordered into the layout oneDNN prefers, its scales and
 * corrections, and a few primitives by row count) is made on first use and kept on the
 * df_i8_weight; the scales are constants of the primitives, so each form has its own.
 */
#include <omp.h>
#include <string.h>

#include <oneapi/dnnl/dnnl.h>

#include "backend/cpu/gemm_int8_impl.h"
#include "core/alloc.h"

#define FORM_PLANS 8

typedef struct form_plan {
    int64_t m, ldc;
    int threads;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t a_md, c_md;
} form_plan;

typedef struct dnnl_form {
    dnnl_memory_desc_t b_md, s1_md;
    void *b;      /* packed s8 weights */
    float *scale; /* [n] */
    float *corr;  /* [n]: corr * scale */
    form_plan plans[FORM_PLANS];
    int n_plans, next;
} dnnl_form;

/* Only with VNNI (AVX512-VNNI, AVX-VNNI) or AMX: below that oneDNN forms u8 x s8 pair sums
 * with vpmaddubsw, whose int16 result saturates (measured: 7.6e-2 relative error against the
 * exact quantized product on an AVX2 CPU), so the portable kernel is the exact one there. */
bool df_i8_dnnl_available(void)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned vnni512 = (unsigned)dnnl_cpu_isa_avx512_core_vnni;
    unsigned vnni256 = (unsigned)dnnl_cpu_isa_avx2_vnni;
    return (isa & vnni512) == vnni512 || (isa & vnni256) == vnni256;
}

void df_i8_dnnl_free(void *p)
{
    dnnl_form *f = p;
    if (!f)
        return;
    for (int i = 0; i < f->n_plans; i++)
        dnnl_primitive_destroy(f->plans[i].prim);
    df_aligned_free(f->b);
    df_free(f->scale);
    df_free(f->corr);
    df_free(f);
}

/* A primitive for m rows with ldc, scales and the correction post-op; its weight layout
 * becomes the form's when the form has none yet (b_md.ndims == 0). */
static df_status make_plan(dnnl_form *f, const df_i8_weight *w, int64_t m, int64_t ldc,
                           void *engine, form_plan *out)
{
    memset(out, 0, sizeof *out);
    out->m = m;
    out->ldc = ldc;
    out->threads = omp_get_max_threads();
    dnnl_memory_desc_t b_any;
    dnnl_memory_desc_init_by_strides(&out->a_md, 2, (dnnl_dims_t){m, w->kp}, dnnl_u8,
                                     (dnnl_dims_t){w->kp, 1});
    dnnl_memory_desc_init_by_strides(&out->c_md, 2, (dnnl_dims_t){m, w->n}, dnnl_f32,
                                     (dnnl_dims_t){ldc, 1});
    if (f->b_md.ndims == 0)
        dnnl_memory_desc_init_by_tag(&b_any, 2, (dnnl_dims_t){w->kp, w->n}, dnnl_s8,
                                     dnnl_format_tag_any);
    else
        b_any = f->b_md;
    dnnl_memory_desc_init_by_strides(&f->s1_md, 2, (dnnl_dims_t){1, w->n}, dnnl_f32,
                                     (dnnl_dims_t){w->n, 1});
    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t r = dnnl_matmul_desc_init(&desc, &out->a_md, &b_any, NULL, &out->c_md);
    if (r == dnnl_success)
        r = dnnl_primitive_attr_create(&attr);
    if (r == dnnl_success)
        r = dnnl_primitive_attr_set_output_scales(attr, w->n, 1 << 1, f->scale);
    if (r == dnnl_success)
        r = dnnl_post_ops_create(&ops);
    if (r == dnnl_success)
        r = dnnl_post_ops_append_binary(ops, dnnl_binary_add, &f->s1_md);
    if (r == dnnl_success)
        r = dnnl_primitive_attr_set_post_ops(attr, ops);
    if (r == dnnl_success)
        r = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
    if (r == dnnl_success && f->b_md.ndims == 0)
        f->b_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (r == dnnl_success)
        r = dnnl_primitive_create(&out->prim, pd);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return r == dnnl_success ? DF_OK : df_gemm_dnnl_failed(r, "creating an int8 matmul");
}

/* Reorders the weight's s8 values (from the driver's packed layout) into f->b_md. */
static df_status pack_weights(dnnl_form *f, const df_i8_weight *w)
{
    int64_t n = w->n, kp = w->kp;
    int8_t *plain = df_aligned_alloc((size_t)(n * kp)); /* [k, n] with n innermost */
    f->b = df_aligned_alloc(dnnl_memory_desc_get_size(&f->b_md));
    if (!plain || !f->b) {
        df_aligned_free(plain);
        return df_errorf(DF_E_OOM, "int8: out of memory packing a [%lld, %lld] weight for oneDNN",
                         (long long)n, (long long)kp);
    }
    for (int64_t j = 0; j < n; j++)
        for (int64_t kk = 0; kk < kp; kk++)
            plain[kk * n + j] =
                w->q[(((j / DF_I8_NR) * (kp / 4) + kk / 4) * DF_I8_NR + j % DF_I8_NR) * 4 + kk % 4];
    dnnl_memory_desc_t src_md;
    dnnl_memory_desc_init_by_strides(&src_md, 2, (dnnl_dims_t){kp, n}, dnnl_s8,
                                     (dnnl_dims_t){n, 1});
    df_status s = df_gemm_dnnl_reorder(&src_md, plain, &f->b_md, f->b, "packing an int8 weight");
    df_aligned_free(plain);
    return s;
}

static df_status form_of(df_i8_weight *w, void *engine, dnnl_form **out)
{
    if (w->dnnl) {
        *out = w->dnnl;
        return DF_OK;
    }
    dnnl_form *f = df_calloc(1, sizeof *f);
    if (f) {
        f->scale = df_malloc((size_t)w->n * sizeof(float));
        f->corr = df_malloc((size_t)w->n * sizeof(float));
    }
    if (!f || !f->scale || !f->corr) {
        df_i8_dnnl_free(f);
        return df_errorf(DF_E_OOM, "int8: out of memory");
    }
    for (int64_t j = 0; j < w->n; j++) { /* one group: index [block][0][channel] */
        int64_t at = (j / DF_I8_NR) * DF_I8_NR + j % DF_I8_NR;
        f->scale[j] = w->scale[at];
        f->corr[j] = (float)w->corr[at] * w->scale[at];
    }
    df_status s = make_plan(f, w, 1, w->n, engine, &f->plans[0]); /* fixes the layout */
    if (s == DF_OK) {
        f->n_plans = 1;
        s = pack_weights(f, w);
    }
    if (s != DF_OK) {
        df_i8_dnnl_free(f);
        return s;
    }
    w->dnnl = f;
    *out = f;
    return DF_OK;
}

df_status df_i8_gemm_dnnl(const df_i8_act *a, df_i8_weight *w, float *out, int64_t ldc)
{
    if (w->n_groups != 1)
        return df_errorf(DF_E_UNSUPPORTED,
                         "int8: oneDNN's path takes whole-k groups only, "
                         "this weight has %lld groups of %lld",
                         (long long)w->n_groups, (long long)w->group);
    void *engine = NULL, *stream = NULL;
    DF_TRY(df_gemm_dnnl_handles(&engine, &stream));
    dnnl_form *f = NULL;
    DF_TRY(form_of(w, engine, &f));
    form_plan *p = NULL;
    int threads = omp_get_max_threads();
    for (int i = 0; i < f->n_plans && !p; i++)
        if (f->plans[i].m == a->m && f->plans[i].ldc == ldc && f->plans[i].threads == threads)
            p = &f->plans[i];
    if (!p) {
        int at = f->n_plans < FORM_PLANS ? f->n_plans++ : (f->next++ % (FORM_PLANS - 1)) + 1;
        if (f->plans[at].prim)
            dnnl_primitive_destroy(f->plans[at].prim);
        f->plans[at].prim = NULL;
        df_status s = make_plan(f, w, a->m, ldc, engine, &f->plans[at]);
        if (s != DF_OK) {
            f->plans[at] = f->plans[--f->n_plans]; /* drop the empty slot */
            memset(&f->plans[f->n_plans], 0, sizeof f->plans[0]);
            return s;
        }
        p = &f->plans[at];
    }
    dnnl_memory_t mem[4] = {NULL};
    const dnnl_memory_desc_t *mds[4] = {&p->a_md, &f->b_md, &p->c_md, &f->s1_md};
    void *ptrs[4] = {a->q, f->b, out, f->corr};
    dnnl_status_t r = dnnl_success;
    for (int i = 0; i < 4 && r == dnnl_success; i++)
        r = dnnl_memory_create(&mem[i], mds[i], engine, ptrs[i]);
    if (r == dnnl_success)
        r = dnnl_primitive_execute(
            p->prim, stream, 4,
            (dnnl_exec_arg_t[]){{DNNL_ARG_SRC, mem[0]},
                                {DNNL_ARG_WEIGHTS, mem[1]},
                                {DNNL_ARG_DST, mem[2]},
                                {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, mem[3]}});
    if (r == dnnl_success)
        r = dnnl_stream_wait(stream);
    for (int i = 0; i < 4; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    return r == dnnl_success ? DF_OK : df_gemm_dnnl_failed(r, "running an int8 matmul");
}
