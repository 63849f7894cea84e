/*
 * ATTENTION kernel: softmax(q k^T * scale + mask) v, flash-style.
 *
 * Work is split into tasks of (batch, head, block of BQ query rows), shared dynamically
 * over the OpenMP team. A task walks the keys in blocks of BK: S = Q K^T for the block
 * (one GEMM), then an online softmax in f32 (running row max m and sum l; the output
 * accumulator is rescaled by exp(m_old - m_new) when the max grows), then O += P V (a
 * second GEMM that accumulates). Only a [BQ, BK] tile of scores exists at a time, per
 * thread. With a causal mask, key blocks wholly after a task's last query are skipped.
 *
 * The block products go through the GEMM interface with serial plans made before the
 * parallel region (one per full/tail block size); every thread passes its own GEMM
 * scratchpad, since the provider's shared one cannot serve two threads at once.
 * BQ x BK = 128 x 512 keeps a thread's tiles (scores, probabilities, accumulator) within
 * its L2 cache at head_dim 128; nearby sizes measured the same.
 *
 * Rows already in the compute dtype (f32 rows in f32 compute; bf16 rows in bf16 compute,
 * which the defer-and-fuse planner makes for q and k) are read in place through their
 * strides. Otherwise, in bf16 compute, K and V are converted once per call to dense bf16
 * copies and each task converts its Q rows; P is converted to bf16 (accumulation, the
 * softmax and the output stay f32). Other dtypes or overlapping rows go through copies.
 *
 * Under int8 compute both products come from k_attention_int8.c: the scores from Q and
 * smoothed K in int8, and P V from the block's probabilities in 14-bit fixed point as two u8
 * planes (quantized per row in softmax_block, whose denominator then sums the quantized
 * values) and smoothed V in int8, whose mean is added back to each output row.
 *
 * Rows whose every key is masked (all -inf) come out as zeros. The exp, max and scaling
 * loops use AVX-512 where the CPU has it (checked at run time), plain C elsewhere. The
 * output is [B, Sq, H, Dv], dense or with the strides of its view.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/k_attention_int8.h"
#include "core/status.h"

#define BQ 128 /* query rows per task */
#define BK 512 /* keys per block */

typedef struct attn {
    int64_t B, H, Sq, Sk, D, Dv, bq, bk;
    bool causal, bf16, avx512;
    float scale;
    const df_view *q, *k, *v;
    bool q_direct;        /* Q rows read in place (rows in the compute dtype) */
    const void *kd, *vd;  /* K, V in place (f32) or dense copies [B, H, Sk, D|Dv] */
    int64_t ks[3], vs[3]; /* element strides of kd / vd over (b, h, s) */
    const float *mask;    /* at element (0, 0, 0, 0) of the mask view, or NULL */
    int64_t ms[4];
    void *out;                                        /* [B, Sq, H, Dv], f32 or bf16 */
    bool out_bf16;
    int64_t os[3];                                    /* its strides of b, i, h */
    const df_gemm_plan *s_plan[2][2], *pv_plan[2][2]; /* [query tail?][key tail?] */
    size_t gemm_scratch;                              /* the most any plan needs per thread */
    const df_attn_i8_k *i8;                           /* int8 products, or NULL */
    const df_attn_i8_v *v8;                           /* V's int8 form (with i8) */
    int64_t ldu;                                      /* int8 P rows: 2 planes of bk to 4 */
} attn;

typedef struct task_buf {
    float *s;    /* [bq, bk] scores, then f32 probabilities */
    uint16_t *p; /* [bq, bk] bf16 probabilities (bf16 compute) */
    uint8_t *u;  /* [bq, ldu] probabilities, two u8 planes (int8 compute) */
    float *ps;   /* [bq] their scales */
    float *o;    /* [bq, Dv] accumulator */
    void *q;     /* [bq, D] Q rows (bf16, or f32 copies) */
    float *row;  /* [D] one Q row in f32 on its way to bf16 */
    void *gemm;  /* the GEMM plans' scratchpad */
    float *m, *l;
} task_buf;

/* --- row operations: AVX-512 and plain ---------------------------------------------------- */

__attribute__((target("avx512f"))) static inline __m512 exp512(__m512 x)
{
    /* e^x = 2^n e^r, |r| <= ln2/2; e^r by its Taylor series to r^7 (error < 1e-8). */
    __mmask16 zero = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps((__mmask16)~zero, _mm512_scalef_ps(p, n));
}

static inline __mmask16 tail_mask(int64_t left)
{
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
}

/* s[j] = s[j] * scale + mask[j * mstride] for j < n; returns the max (-inf if n <= 0). */
__attribute__((target("avx512f"))) static float scale_max_avx512(float *s, int64_t n, float scale,
                                                                 const float *mask, int64_t mstride)
{
    __m512 mx = _mm512_set1_ps(-INFINITY), sc = _mm512_set1_ps(scale);
    if (mask && mstride != 1 && mstride != 0) {
        for (int64_t j = 0; j < n; j++)
            s[j] = s[j] * scale + mask[j * mstride];
        sc = _mm512_set1_ps(1.0f);
        mask = NULL;
    }
    __m512 add = _mm512_set1_ps(mask && mstride == 0 ? mask[0] : 0.0f);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 v = _mm512_maskz_loadu_ps(k, s + j);
        __m512 a = mask && mstride == 1 ? _mm512_maskz_loadu_ps(k, mask + j) : add;
        v = _mm512_fmadd_ps(v, sc, a);
        _mm512_mask_storeu_ps(s + j, k, v);
        mx = _mm512_mask_max_ps(mx, k, mx, v);
    }
    return _mm512_reduce_max_ps(mx);
}

/* s[j] = exp(s[j] - mx) for j < n; returns their sum. */
__attribute__((target("avx512f"))) static float exp_sum_avx512(float *s, int64_t n, float mx)
{
    __m512 sum = _mm512_setzero_ps(), m = _mm512_set1_ps(mx);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), m));
        _mm512_mask_storeu_ps(s + j, k, p);
        sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(k, p));
    }
    return _mm512_reduce_add_ps(sum);
}

/* Int8 compute: p = exp(s[j] - m) for j < n written straight as P's two u8 planes, the
 * quantization of df_attn_i8_p_quantize against pmax = exp(mx - m) (mx the row's largest
 * s, its p computed the same way), so the probabilities never go back to memory as f32;
 * returns the row's sum as they give it. */
__attribute__((target("avx512f"))) static float exp_quantize_avx512(const float *s, int64_t n,
                                                                    int64_t n4, float m, float mx,
                                                                    uint8_t *u, float *scale)
{
    uint8_t *lo = u + n4;
    float pmax = n > 0 ? _mm512_cvtss_f32(exp512(_mm512_set1_ps(mx - m))) : 0.0f;
    __m512 vm = _mm512_set1_ps(m), inv = _mm512_set1_ps(pmax > 0 ? 16383.0f / pmax : 0.0f);
    __m512 top = _mm512_set1_ps(16383.0f);
    __m512i low = _mm512_set1_epi32(127);
    __m512i sum = _mm512_setzero_si512();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), vm));
        __m512i z = _mm512_maskz_cvtps_epi32(k, _mm512_min_ps(_mm512_mul_ps(p, inv), top));
        _mm512_mask_cvtepi32_storeu_epi8(u + j, k, _mm512_srli_epi32(z, 7));
        _mm512_mask_cvtepi32_storeu_epi8(lo + j, k, _mm512_and_si512(z, low));
        sum = _mm512_add_epi32(sum, z);
    }
    memset(u + n, 0, (size_t)(n4 - n));
    memset(lo + n, 0, (size_t)(n4 - n));
    *scale = pmax / 16383.0f;
    return (float)_mm512_reduce_add_epi32(sum) * *scale;
}

__attribute__((target("avx512f"))) static void scale_row_avx512(float *o, int64_t n, float a)
{
    __m512 va = _mm512_set1_ps(a);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 k = tail_mask(n - j);
        _mm512_mask_storeu_ps(o + j, k, _mm512_mul_ps(_mm512_maskz_loadu_ps(k, o + j), va));
    }
}

static float scale_max_plain(float *s, int64_t n, float scale, const float *mask, int64_t mstride)
{
    float mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        s[j] = s[j] * scale + (mask ? mask[j * mstride] : 0.0f);
        mx = s[j] > mx ? s[j] : mx;
    }
    return mx;
}

static float exp_sum_plain(float *s, int64_t n, float mx)
{
    float sum = 0;
    for (int64_t j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

static void scale_row_plain(float *o, int64_t n, float a)
{
    for (int64_t j = 0; j < n; j++)
        o[j] *= a;
}

/* --- one task ----------------------------------------------------------------------------- */

static const float *f32_row(const df_view *t, int64_t b, int64_t h, int64_t s)
{
    return (const float *)df_view_ptr(t) + b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
}

/* Row (b, h, s) of a [B, H, S, n] view in its own dtype. */
static const void *row_of(const df_view *t, int64_t b, int64_t h, int64_t s)
{
    int64_t off = b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
    return (const char *)df_view_ptr(t) + off * (int64_t)df_dtype_size(t->dtype);
}

/* Row (b, h, s) of a [B, H, S, n] view, as f32, into dst. */
static void load_row(const df_view *t, int64_t b, int64_t h, int64_t s, float *dst)
{
    int64_t n = t->shape[3];
    int64_t off = b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
    if (t->dtype == DF_DTYPE_F32) {
        memcpy(dst, (const float *)df_view_ptr(t) + off, (size_t)n * sizeof *dst);
        return;
    }
    for (int64_t j = 0; j < n; j++)
        dst[j] = df_load_f32(df_view_ptr(t), t->dtype, off + j);
}

/* Online softmax over one block of scores: rows [i0, i0 + mq), keys [j0, j0 + nk). */
static void softmax_block(const attn *a, const task_buf *t, int64_t b, int64_t h, int64_t i0,
                          int64_t mq, int64_t j0, int64_t nk)
{
    for (int64_t r = 0; r < mq; r++) {
        int64_t i = i0 + r;
        float *s = t->s + r * a->bk;
        int64_t lim = nk;
        if (a->causal && i - j0 + 1 < lim)
            lim = i - j0 + 1 > 0 ? i - j0 + 1 : 0;
        const float *mrow = NULL;
        if (a->mask)
            mrow = a->mask + b * a->ms[0] + h * a->ms[1] + i * a->ms[2] + j0 * a->ms[3];
        float mx = -INFINITY;
        if (lim > 0)
            mx = a->avx512 ? scale_max_avx512(s, lim, a->scale, mrow, a->ms[3])
                           : scale_max_plain(s, lim, a->scale, mrow, a->ms[3]);
        float m_new = mx > t->m[r] ? mx : t->m[r];
        float sum = 0;
        if (m_new == -INFINITY)
            lim = 0; /* every key so far is masked: nothing to add */
        if (a->i8) { /* the denominator sums what P V multiplies */
            int64_t n4 = (nk + 3) & ~(int64_t)3;
            uint8_t *u = t->u + r * a->ldu;
            if (a->avx512) {
                sum = exp_quantize_avx512(s, lim, n4, m_new, mx, u, &t->ps[r]);
            } else {
                if (lim > 0)
                    exp_sum_plain(s, lim, m_new);
                sum = df_attn_i8_p_quantize(s, lim, n4, lim > 0 ? expf(mx - m_new) : 0, u,
                                            &t->ps[r]);
            }
        } else if (lim > 0) {
            sum = a->avx512 ? exp_sum_avx512(s, lim, m_new) : exp_sum_plain(s, lim, m_new);
        }
        if (m_new != -INFINITY) {
            float alpha = t->m[r] == -INFINITY ? 0.0f : expf(t->m[r] - m_new);
            if (alpha != 1.0f) {
                if (a->avx512)
                    scale_row_avx512(t->o + r * a->Dv, a->Dv, alpha);
                else
                    scale_row_plain(t->o + r * a->Dv, a->Dv, alpha);
            }
            t->l[r] = t->l[r] * alpha + sum;
            t->m[r] = m_new;
        }
        if (a->i8)
            continue; /* P is in t->u */
        if (a->bf16) {
            uint16_t *p = t->p + r * a->bk;
            df_gemm_f32_to_bf16(s, p, lim);
            memset(p + lim, 0, (size_t)(nk - lim) * sizeof *p);
        } else {
            memset(s + lim, 0, (size_t)(nk - lim) * sizeof *s);
        }
    }
}

static df_status run_task(const attn *a, const task_buf *t, int64_t b, int64_t h, int64_t i0)
{
    int64_t mq = a->Sq - i0 < a->bq ? a->Sq - i0 : a->bq;
    int qsel = mq != a->bq;
    size_t qes = a->bf16 ? 2 : 4;

    const void *qa = t->q;
    if (a->i8) {
        df_attn_i8_q_load(a->i8, a->q, b, h, i0, mq, t->q);
    } else if (a->q_direct) {
        qa = row_of(a->q, b, h, i0);
    } else {
        for (int64_t r = 0; r < mq; r++) {
            float *row = a->bf16 ? t->row : (float *)t->q + r * a->D;
            load_row(a->q, b, h, i0 + r, row);
            if (a->bf16)
                df_gemm_f32_to_bf16(row, (uint16_t *)t->q + r * a->D, a->D);
        }
    }
    for (int64_t r = 0; r < mq; r++) {
        t->m[r] = -INFINITY;
        t->l[r] = 0;
    }
    memset(t->o, 0, (size_t)(mq * a->Dv) * sizeof *t->o);

    int64_t kend = a->causal && i0 + mq < a->Sk ? i0 + mq : a->Sk;
    for (int64_t j0 = 0; j0 < kend; j0 += a->bk) {
        int64_t nk = a->Sk - j0 < a->bk ? a->Sk - j0 : a->bk;
        int ksel = nk != a->bk;
        if (a->i8) {
            df_attn_i8_scores(a->i8, t->q, b, h, mq, j0, nk, t->s, a->bk);
            softmax_block(a, t, b, h, i0, mq, j0, nk);
            df_attn_i8_pv(a->i8, a->v8, b, h, t->u, a->ldu, t->ps, mq, j0, nk, t->o, a->Dv);
            continue;
        }
        const char *kp = (const char *)a->kd + (b * a->ks[0] + h * a->ks[1] + j0 * a->ks[2]) * qes;
        const char *vp = (const char *)a->vd + (b * a->vs[0] + h * a->vs[1] + j0 * a->vs[2]) * qes;
        DF_TRY(df_gemm_plan_run(a->s_plan[qsel][ksel], qa, kp, NULL, t->s, t->gemm));
        softmax_block(a, t, b, h, i0, mq, j0, nk);
        const void *p = a->bf16 ? (const void *)t->p : (const void *)t->s;
        DF_TRY(df_gemm_plan_run(a->pv_plan[qsel][ksel], p, vp, NULL, t->o, t->gemm));
    }

    for (int64_t r = 0; r < mq; r++) {
        float inv = t->l[r] > 0 ? 1.0f / t->l[r] : 0.0f;
        int64_t at = b * a->os[0] + (i0 + r) * a->os[1] + h * a->os[2];
        float *dst = a->out_bf16 ? t->row : (float *)a->out + at;
        const float *src = t->o + r * a->Dv;
        for (int64_t c = 0; c < a->Dv; c++)
            dst[c] = src[c] * inv;
        if (a->i8 && t->l[r] > 0) {
            const float *mean = a->v8->mean + (b * a->H + h) * a->Dv;
            for (int64_t c = 0; c < a->Dv; c++)
                dst[c] += mean[c];
        }
        if (a->out_bf16) /* for bf16 products only (defer-and-fuse) */
            df_gemm_f32_to_bf16(dst, (uint16_t *)a->out + at, a->Dv);
    }
    return DF_OK;
}

/* --- set-up ------------------------------------------------------------------------------- */

/* Dense copy of a [B, H, S, n] view in the compute dtype, into dst. */
static void dense_copy(const df_view *t, bool bf16, void *dst)
{
    int64_t B = t->shape[0], H = t->shape[1], S = t->shape[2], n = t->shape[3];
    int64_t rows = B * H * S;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (H * S), h = r / S % H, s = r % S;
        int64_t off = b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
        uint16_t *d16 = (uint16_t *)dst + r * n;
        if (!bf16)
            load_row(t, b, h, s, (float *)dst + r * n);
        else if (t->dtype == DF_DTYPE_F32)
            df_gemm_f32_to_bf16(f32_row(t, b, h, s), d16, n);
        else
            for (int64_t j = 0; j < n; j++)
                d16[j] = df_f32_to_bf16(df_load_f32(df_view_ptr(t), t->dtype, off + j));
    }
}

/* Rows that oneDNN can read in place: in the compute dtype, and not overlapping. */
static bool in_place(const df_view *t, bool bf16)
{
    return t->dtype == (bf16 ? DF_DTYPE_BF16 : DF_DTYPE_F32) && t->stride[2] >= t->shape[3];
}

static df_status get_plans(attn *a)
{
    df_dtype type = a->bf16 ? DF_DTYPE_BF16 : DF_DTYPE_F32;
    int64_t qm[2] = {a->bq, a->Sq % a->bq}, kn[2] = {a->bk, a->Sk % a->bk};
    for (int qi = 0; qi < 2; qi++) {
        for (int ki = 0; ki < 2; ki++) {
            if ((qi && qm[1] == 0) || (ki && kn[1] == 0))
                continue;
            df_gemm_desc s = {.m = qm[qi],
                              .n = kn[ki],
                              .k = a->D,
                              .type = type,
                              .b_trans = true,
                              .lda = a->q_direct ? a->q->stride[2] : a->D,
                              .ldb = a->ks[2],
                              .ldc = a->bk,
                              .serial = true};
            df_gemm_desc pv = {.m = qm[qi],
                               .n = a->Dv,
                               .k = kn[ki],
                               .type = type,
                               .lda = a->bk,
                               .ldb = a->vs[2],
                               .ldc = a->Dv,
                               .accumulate = true,
                               .serial = true};
            DF_TRY(df_gemm_plan_get(&s, &a->s_plan[qi][ki]));
            DF_TRY(df_gemm_plan_get(&pv, &a->pv_plan[qi][ki]));
            size_t need = df_gemm_plan_scratch(a->s_plan[qi][ki]);
            if (df_gemm_plan_scratch(a->pv_plan[qi][ki]) > need)
                need = df_gemm_plan_scratch(a->pv_plan[qi][ki]);
            if (need > a->gemm_scratch)
                a->gemm_scratch = need;
        }
    }
    return DF_OK;
}

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

DF_CPU_KERNEL(attention)
{
    const df_view *q = &n->in[0], *k = &n->in[1], *v = &n->in[2];
    attn a = {.B = q->shape[0],
              .H = q->shape[1],
              .Sq = q->shape[2],
              .Sk = k->shape[2],
              .D = q->shape[3],
              .Dv = v->shape[3],
              .causal = n->a.causal != 0,
              .bf16 = df_gemm_compute_dtype((int)n->a.compute) == DF_DTYPE_BF16,
              .scale = (float)n->a.scale,
              .avx512 = __builtin_cpu_supports("avx512f"),
              .q = q,
              .k = k,
              .v = v,
              .out = df_view_ptr(&n->out),
              .out_bf16 = n->out.dtype == DF_DTYPE_BF16,
              /* dense, or a part of a wider tensor (defer-and-fuse writes a concat's parts
               * in place); rows of Dv are always contiguous */
              .os = {n->out.stride[0], n->out.stride[1], n->out.stride[2]}};
    if (a.B == 0 || a.H == 0 || a.Sq == 0)
        return DF_OK;
    a.bq = a.Sq < BQ ? a.Sq : BQ;
    a.bk = a.Sk < BK ? (a.Sk > 0 ? a.Sk : 1) : BK;
    if (n->in[3].buf) {
        a.mask = df_view_ptr(&n->in[3]);
        memcpy(a.ms, n->in[3].stride, sizeof a.ms);
    }
    df_attn_i8_k k8;
    df_attn_i8_v v8;
    bool i8 = df_attn_i8_wanted((int)n->a.compute, a.D, a.Dv);
    if (i8)
        a.bf16 = false; /* no GEMM runs: Q, K and V go to their int8 forms */
    a.ldu = 2 * ((a.bk + 3) & ~(int64_t)3);
    a.q_direct = in_place(q, a.bf16);
    bool k_direct = in_place(k, a.bf16), v_direct = in_place(v, a.bf16);
    size_t es = a.bf16 ? 2 : 4;
    int threads = env->threads > 0 ? env->threads : 1;
    if (k_direct) {
        memcpy(a.ks, k->stride, sizeof a.ks);
    } else {
        a.ks[0] = a.H * a.Sk * a.D, a.ks[1] = a.Sk * a.D, a.ks[2] = a.D;
    }
    if (v_direct) {
        memcpy(a.vs, v->stride, sizeof a.vs);
    } else {
        a.vs[0] = a.H * a.Sk * a.Dv, a.vs[1] = a.Sk * a.Dv, a.vs[2] = a.Dv;
    }
    if (!i8)
        DF_TRY_CTX(get_plans(&a), "attention q [%lld, %lld, %lld, %lld]", (long long)a.B,
                   (long long)a.H, (long long)a.Sq, (long long)a.D);

    /* Scratch: K and V copies (when needed), then one task_buf per thread. */
    size_t kbytes = k_direct ? 0 : round64((size_t)(a.B * a.H * a.Sk * a.D) * es);
    if (i8)
        kbytes = df_attn_i8_k_bytes(a.B, a.H, a.Sk, a.D);
    size_t vbytes = v_direct ? 0 : round64((size_t)(a.B * a.H * a.Sk * a.Dv) * es);
    if (i8)
        vbytes = df_attn_i8_v_bytes(a.B, a.H, a.Sk, a.Dv);
    size_t s_b = round64((size_t)(a.bq * a.bk) * sizeof(float));
    size_t p_b = a.bf16 ? round64((size_t)(a.bq * a.bk) * 2) : 0;
    if (i8)
        p_b = round64((size_t)(a.bq * a.ldu));
    size_t o_b = round64((size_t)(a.bq * a.Dv) * sizeof(float));
    size_t q_b = a.q_direct ? 0 : round64((size_t)(a.bq * a.D) * es);
    if (i8)
        q_b = df_attn_i8_q_bytes(a.bq, a.D);
    size_t ml_b = round64((size_t)a.bq * sizeof(float));
    size_t row_b = round64((size_t)(a.D > a.Dv ? a.D : a.Dv) * sizeof(float));
    size_t g_b = round64(a.gemm_scratch);
    size_t per_thread = s_b + p_b + o_b + q_b + 3 * ml_b + row_b + g_b;
    size_t total = kbytes + vbytes + (size_t)threads * per_thread;
    char *scratch = df_env_scratch(env, total);
    if (!scratch)
        return df_errorf(DF_E_OOM, "attention: out of memory for %zu bytes of scratch", total);
    a.kd = k_direct ? df_view_ptr(k) : scratch;
    a.vd = v_direct ? df_view_ptr(v) : scratch + kbytes;
    if (i8) {
        df_attn_i8_k_prepare(&k8, k, (df_i8_path)env->int8_path, scratch);
        df_attn_i8_v_prepare(&v8, v, scratch + kbytes);
        a.i8 = &k8;
        a.v8 = &v8;
    } else {
        if (!k_direct)
            dense_copy(k, a.bf16, scratch);
        if (!v_direct)
            dense_copy(v, a.bf16, scratch + kbytes);
    }

    int64_t nqb = (a.Sq + a.bq - 1) / a.bq, tasks = a.B * a.H * nqb;
    df_status failed = DF_OK;
    char msg[512] = "";
    char *bufs = scratch + kbytes + vbytes;
#pragma omp parallel num_threads(threads)
    {
        char *mine = bufs + (size_t)omp_get_thread_num() * per_thread;
        task_buf t = {.s = (float *)mine,
                      .p = (uint16_t *)(mine + s_b),
                      .u = (uint8_t *)(mine + s_b),
                      .o = (float *)(mine + s_b + p_b),
                      .q = mine + s_b + p_b + o_b,
                      .m = (float *)(mine + s_b + p_b + o_b + q_b),
                      .l = (float *)(mine + s_b + p_b + o_b + q_b + ml_b),
                      .ps = (float *)(mine + s_b + p_b + o_b + q_b + 2 * ml_b),
                      .row = (float *)(mine + s_b + p_b + o_b + q_b + 3 * ml_b),
                      .gemm = mine + s_b + p_b + o_b + q_b + 3 * ml_b + row_b};
#pragma omp for schedule(dynamic)
        for (int64_t ti = 0; ti < tasks; ti++) {
            df_status s;
#pragma omp atomic read
            s = failed;
            if (s != DF_OK)
                continue;
            int64_t bh = ti / nqb;
            s = run_task(&a, &t, bh / a.H, bh % a.H, ti % nqb * a.bq);
            if (s != DF_OK) {
#pragma omp critical(df_attention_failure)
                {
                    if (failed == DF_OK) {
                        snprintf(msg, sizeof msg, "%s", df_error_message());
#pragma omp atomic write
                        failed = s;
                    }
                }
            }
        }
    }
    if (failed != DF_OK)
        return df_errorf(failed, "attention q [%lld, %lld, %lld, %lld]: %s", (long long)a.B,
                         (long long)a.H, (long long)a.Sq, (long long)a.D, msg);
    return DF_OK;
}
