/*
 * LINEAR and MATMUL kernels: each maps its shapes onto the GEMM interface (gemm.h).
 *
 * linear: x [..., K] is one [M, K] matrix; the weight [N, K] is the transposed B operand,
 * packed once when it is a weight (see df_gemm_linear). matmul: a [..., M, K] with a 2-D b
 * is also one [batch * M, K] product (a is dense); with batched b it is a batched product.
 * Operands that are not in the compute dtype are converted into the kernel's scratch.
 */
#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "core/status.h"

DF_CPU_KERNEL(linear)
{
    const df_view *x = &n->in[0], *w = &n->in[1];
    const df_view *bias = n->in[2].buf ? &n->in[2] : NULL;
    int64_t m = 1;
    for (int d = 0; d < x->ndim - 1; d++)
        m *= x->shape[d];
    /* The output's rows are dense, or evenly spaced rows of a wider tensor (defer-and-fuse
     * writes a concat's parts in place); f32, or bf16 where defer-and-fuse has only bf16
     * products read it. */
    const df_view *o = &n->out;
    int64_t ldc = o->ndim >= 2 && !df_view_is_dense(o) ? o->stride[o->ndim - 2] : 0;
    df_status s;
    if (n->a.gated) { /* out = residual + gate * product: in[3] the gate row, in[4] rows */
        const df_view *r = &n->in[4];
        s = df_gemm_linear_gated(env, x, m, w, bias, (df_dtype)n->a.compute, df_view_ptr(o), ldc,
                                 df_view_ptr(&n->in[3]), df_view_ptr(r),
                                 r->ndim >= 2 ? r->stride[r->ndim - 2] : 0);
    } else {
        s = df_gemm_linear(env, x, m, w, bias, (df_dtype)n->a.compute, (int)n->a.act,
                           df_view_ptr(o), ldc, o->dtype);
    }
    if (s != DF_OK)
        return df_error_context(s, "linear [%lld, %lld] x [%lld, %lld]^T", (long long)m,
                                (long long)w->shape[1], (long long)w->shape[0],
                                (long long)w->shape[1]);
    return DF_OK;
}

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

DF_CPU_KERNEL(matmul)
{
    const df_view *a = &n->in[0], *b = &n->in[1];
    df_dtype compute = df_gemm_compute_dtype((int)n->a.compute);
    bool bt = n->a.trans_b != 0;
    int na = a->ndim, nb = b->ndim;
    int64_t M = a->shape[na - 2], K = a->shape[na - 1], N = b->shape[nb - 1];
    int64_t batch = 1;
    for (int d = 0; d < na - 2; d++)
        batch *= a->shape[d];
    if (batch == 0 || M == 0 || N == 0)
        return DF_OK;

    size_t sa = round64(df_gemm_operand_scratch(a, compute));
    size_t sb = round64(df_gemm_operand_scratch(b, compute));
    char *scratch = NULL;
    if (sa + sb > 0 && !(scratch = df_env_scratch(env, sa + sb)))
        return df_errorf(DF_E_OOM, "matmul: out of memory for %zu bytes of scratch", sa + sb);
    const void *pa, *pb;
    DF_TRY(df_gemm_operand(a, compute, scratch, &pa));
    DF_TRY(df_gemm_operand(b, compute, scratch + sa, &pb));

    df_gemm_desc d = {.m = M, .n = N, .k = K, .type = compute, .b_trans = bt};
    if (nb == 2) {
        d.m = batch * M; /* a is dense: its batch rows stack into one matrix */
    } else {
        d.batch = batch;
        d.stride_a = M * K;
        d.stride_b = K * N;
        d.stride_c = M * N;
    }
    df_status s = df_gemm(&d, pa, pb, NULL, df_view_ptr(&n->out));
    if (s != DF_OK)
        return df_error_context(s, "matmul %lld x [%lld, %lld] @ [%lld, %lld]%s", (long long)batch,
                                (long long)M, (long long)K, (long long)K, (long long)N,
                                bt ? " (b transposed)" : "");
    return DF_OK;
}
