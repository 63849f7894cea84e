/*
 * The GEMM interface (gemm.h) over oneDNN's matmul primitive.
 *
 * Choices:
 * - One oneDNN engine for the process. Each thread that runs products gets its own oneDNN
 *   stream and its own plan cache, kept in thread-specific slots and freed when the thread
 *   exits; the stream threads of contexts are the only threads that make plans, so a
 *   context's plans go away with it. No lock is needed anywhere.
 * - A plan is a created primitive plus the memory descriptors to run it with; the cache
 *   evicts the least recently used plan when full. The plan key holds the OpenMP thread
 *   count, because oneDNN divides work by the count it saw when the primitive was made;
 *   serial plans are made with the count set to 1 so that they may run inside a parallel
 *   region (oneDNN runs nested calls on the calling thread).
 * - Weights of linear layers are reordered once into the layout oneDNN prefers for
 *   weights in `any` format. On the machines measured (AVX-512, AVX512-BF16) that layout
 *   does not depend on M, but nothing here assumes so: the derived form is keyed by the
 *   layout itself, so a layout that changes with M costs one more packing for that
 *   layout, and calls with the usual token counts keep hitting the first one.
 * - f32 -> bf16 conversion of activations rounds to nearest even (AVX512-BF16's
 *   vcvtneps2bf16 where present, which also treats subnormal inputs as zero).
 * - Products with k == 0 (and empty ones) never reach oneDNN: C gets bias or zeros.
 * - bf16 compute needs a CPU where oneDNN handles bf16 (AVX-512 and up, emulated where
 *   there is no AVX512-BF16); elsewhere the kernels compute in f32 (df_gemm_compute_dtype).
 */
#include <immintrin.h>
#include <omp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <math.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "backend/cpu/dnnl_weight.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/gemm_int8_impl.h"
#include "core/alloc.h"
#include "core/status.h"

/* --- the provider: one engine; per thread a stream and a plan cache ------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static bool init_ok;
static dnnl_engine_t engine;
static pthread_key_t stream_key, cache_key;
static atomic_llong pack_count;

struct df_gemm_plan;
typedef struct plan_cache {
    struct df_gemm_plan *plans[DF_GEMM_PLAN_CACHE];
    int n;
    uint64_t clock;
} plan_cache;

static void free_stream(void *s)
{
    dnnl_stream_destroy(s);
}

static void free_cache(void *p);

static void init_provider(void)
{
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
        return;
    if (pthread_key_create(&stream_key, free_stream) != 0 ||
        pthread_key_create(&cache_key, free_cache) != 0)
        return;
    init_ok = true;
}

static df_status provider_ready(void)
{
    pthread_once(&init_once, init_provider);
    return init_ok ? DF_OK : df_errorf(DF_E_DEVICE, "oneDNN: could not create the CPU engine");
}

static df_status dnnl_failed(dnnl_status_t r, const char *what)
{
    df_status s = r == dnnl_out_of_memory   ? DF_E_OOM
                  : r == dnnl_unimplemented ? DF_E_UNSUPPORTED
                                            : DF_E_DEVICE;
    return df_errorf(s, "oneDNN: %s failed (dnnl status %d)", what, (int)r);
}

static df_status thread_stream(dnnl_stream_t *out)
{
    *out = NULL;
    dnnl_stream_t s = pthread_getspecific(stream_key);
    if (!s) {
        dnnl_status_t r = dnnl_stream_create(&s, engine, dnnl_stream_default_flags);
        if (r != dnnl_success)
            return dnnl_failed(r, "creating a stream");
        if (pthread_setspecific(stream_key, s) != 0) {
            dnnl_stream_destroy(s);
            return df_errorf(DF_E_OOM, "oneDNN: no room to keep this thread's stream");
        }
    }
    *out = s;
    return DF_OK;
}

int64_t df_gemm_pack_count(void)
{
    return atomic_load(&pack_count);
}

/* oneDNN 2.6 computes and reorders bf16 only from AVX-512 (natively or emulated) up. */
static bool provider_has_bf16(void)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned core = (unsigned)dnnl_cpu_isa_avx512_core;
    return (isa & core) == core;
}

df_dtype df_gemm_compute_dtype(int requested)
{
    return requested == DF_DTYPE_BF16 && provider_has_bf16() ? DF_DTYPE_BF16 : DF_DTYPE_F32;
}

bool df_cpu_has_fast_bf16(void)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & bf16) == bf16; /* AMX levels include the AVX512-BF16 bits */
}

void df_cpu_features_get(df_cpu_features *out)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned core = (unsigned)dnnl_cpu_isa_avx512_core;
    unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    unsigned amx = (unsigned)dnnl_cpu_isa_avx512_core_amx; /* AMX-INT8 and AMX-BF16 */
    *out = (df_cpu_features){.avx512 = (isa & core) == core,
                             .avx512_bf16 = (isa & bf16) == bf16,
                             .amx_bf16 = (isa & amx) == amx};
}

/* --- plans ---------------------------------------------------------------------------- */

typedef enum b_layout { B_PLAIN, B_TRANS, B_PACKED } b_layout;

typedef struct plan_key {
    int64_t batch, m, n, k, lda, ldb, ldc, sa, sb, sc;
    int32_t type, layout, threads, serial, bias, accumulate, act, c_bf16, gated;
    int64_t ldr;
} plan_key;

struct df_gemm_plan {
    plan_key key;
    dnnl_primitive_t prim; /* NULL for an empty product (m, n or k is 0) */
    dnnl_memory_desc_t a_md, b_md, bias_md, c_md, scratch_md, gate_md, res_md;
    size_t scratch_bytes; /* serial plans: the caller's scratchpad */
    uint64_t used;
};

static void free_cache(void *p)
{
    plan_cache *c = p;
    for (int i = 0; i < c->n; i++) {
        if (c->plans[i]->prim)
            dnnl_primitive_destroy(c->plans[i]->prim);
        df_free(c->plans[i]);
    }
    df_free(c);
}

/* The key of d with every default filled in, so that equal products have equal keys. */
static plan_key key_of(const df_gemm_desc *d, b_layout layout)
{
    plan_key k;
    memset(&k, 0, sizeof k); /* padding too: keys are compared with memcmp */
    k.batch = d->batch > 1 ? d->batch : 1;
    k.m = d->m;
    k.n = d->n;
    k.k = d->k;
    k.lda = d->lda ? d->lda : d->k;
    k.ldb = layout == B_PACKED ? 0 : d->ldb ? d->ldb : (d->b_trans ? d->k : d->n);
    k.ldc = d->ldc ? d->ldc : d->n;
    if (k.batch > 1) {
        k.sa = d->stride_a ? d->stride_a : d->m * k.lda;
        k.sb = d->stride_b;
        k.sc = d->stride_c ? d->stride_c : d->m * k.ldc;
    }
    k.type = d->type == DF_DTYPE_BF16 || d->type == DF_DTYPE_I8 ? d->type : DF_DTYPE_F32;
    k.layout = layout;
    k.threads = d->serial ? 1 : omp_get_max_threads();
    k.serial = d->serial;
    k.bias = d->bias;
    k.accumulate = d->accumulate;
    k.act = d->act;
    k.c_bf16 = d->c_bf16;
    k.gated = d->gated_residual;
    k.ldr = d->gated_residual ? (d->ldr ? d->ldr : d->n) : 0;
    return k;
}

/* A [rows, cols] matrix (or a batch of them) with the given element strides. */
static void matrix_md(dnnl_memory_desc_t *md, const plan_key *k, int64_t batch, int64_t rows,
                      int64_t cols, dnnl_data_type_t dt, int64_t sbatch, int64_t srow, int64_t scol)
{
    if (k->batch > 1)
        dnnl_memory_desc_init_by_strides(md, 3, (dnnl_dims_t){batch, rows, cols}, dt,
                                         (dnnl_dims_t){sbatch, srow, scol});
    else
        dnnl_memory_desc_init_by_strides(md, 2, (dnnl_dims_t){rows, cols}, dt,
                                         (dnnl_dims_t){srow, scol});
}

static df_status plan_create(const plan_key *k, df_gemm_plan **out)
{
    *out = NULL;
    df_gemm_plan *p = df_calloc(1, sizeof *p);
    if (!p)
        return df_errorf(DF_E_OOM, "gemm: out of memory for a plan");
    p->key = *k;
    if (k->m == 0 || k->n == 0 || k->k == 0) {
        *out = p;
        return DF_OK;
    }
    /* int8 (only for df_cpu_gemm_rate's ceiling): u8 x s8 -> s32 */
    bool s8 = k->type == DF_DTYPE_I8;
    dnnl_data_type_t dt = s8 ? dnnl_s8 : k->type == DF_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32;
    int nd = k->batch > 1 ? 3 : 2;
    int64_t bb = k->sb ? k->batch : 1; /* B's batch: 1 when shared */
    matrix_md(&p->a_md, k, k->batch, k->m, k->k, s8 ? dnnl_u8 : dt, k->sa, k->lda, 1);
    if (k->layout == B_PACKED) {
        dnnl_dims_t dims = {k->k, k->n};
        if (nd == 3)
            dims[0] = bb, dims[1] = k->k, dims[2] = k->n;
        dnnl_memory_desc_init_by_tag(&p->b_md, nd, dims, dt, dnnl_format_tag_any);
    } else if (k->layout == B_TRANS) {
        matrix_md(&p->b_md, k, bb, k->k, k->n, dt, k->sb ? k->sb : k->n * k->ldb, 1, k->ldb);
    } else {
        matrix_md(&p->b_md, k, bb, k->k, k->n, dt, k->sb ? k->sb : k->k * k->ldb, k->ldb, 1);
    }
    matrix_md(&p->bias_md, k, 1, 1, k->n, dnnl_f32, k->n, k->n, 1);
    matrix_md(&p->c_md, k, k->batch, k->m, k->n,
              s8 ? dnnl_s32 : k->c_bf16 ? dnnl_bf16 : dnnl_f32, k->sc, k->ldc, 1);

    dnnl_matmul_desc_t desc;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t ops = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t r =
        dnnl_matmul_desc_init(&desc, &p->a_md, &p->b_md, k->bias ? &p->bias_md : NULL, &p->c_md);
    const char *what = "describing a matmul";
    if (r == dnnl_success)
        r = dnnl_primitive_attr_create(&attr);
    /* Serial plans run on several threads at once, each with its own scratchpad. */
    if (r == dnnl_success && k->serial)
        r = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (k->gated) {
        matrix_md(&p->gate_md, k, 1, 1, k->n, dnnl_f32, k->n, k->n, 1);
        matrix_md(&p->res_md, k, 1, k->m, k->n, dnnl_f32, k->m * k->ldr, k->ldr, 1);
    }
    if (r == dnnl_success && (k->accumulate || k->act || k->gated)) {
        what = "setting up post-ops";
        r = dnnl_post_ops_create(&ops);
        if (r == dnnl_success && k->accumulate)
            r = dnnl_post_ops_append_sum(ops, 1.0f);
        /* swish with alpha 1 is x * sigmoid(x), i.e. SiLU */
        dnnl_alg_kind_t alg = k->act == DF_GEMM_ACT_GELU_TANH ? dnnl_eltwise_gelu_tanh
                              : k->act == DF_GEMM_ACT_SILU    ? dnnl_eltwise_swish
                                                              : dnnl_eltwise_gelu_erf;
        if (r == dnnl_success && k->act)
            r = dnnl_post_ops_append_eltwise(ops, 1.0f, alg, 1.0f, 0.0f);
        /* the gated residual: post-ops 0 (times the gate row) and 1 (plus the residual) */
        if (r == dnnl_success && k->gated)
            r = dnnl_post_ops_append_binary(ops, dnnl_binary_mul, &p->gate_md);
        if (r == dnnl_success && k->gated)
            r = dnnl_post_ops_append_binary(ops, dnnl_binary_add, &p->res_md);
        if (r == dnnl_success)
            r = dnnl_primitive_attr_set_post_ops(attr, ops);
    }
    if (r == dnnl_success) {
        /* oneDNN sizes its work split by the thread count it sees now. */
        int prev = omp_get_max_threads();
        if (k->threads != prev)
            omp_set_num_threads(k->threads);
        what = "creating a matmul";
        r = dnnl_primitive_desc_create(&pd, &desc, attr, engine, NULL);
        if (r == dnnl_success) {
            p->b_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
            if (k->serial) {
                p->scratch_md = *dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
                p->scratch_bytes = dnnl_memory_desc_get_size(&p->scratch_md);
            }
            r = dnnl_primitive_create(&p->prim, pd);
        }
        if (k->threads != prev)
            omp_set_num_threads(prev);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (ops)
        dnnl_post_ops_destroy(ops);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    if (r != dnnl_success) {
        df_free(p);
        return df_error_context(dnnl_failed(r, what), "gemm %lldx%lldx%lld (batch %lld, %s)",
                                (long long)k->m, (long long)k->n, (long long)k->k,
                                (long long)k->batch, df_dtype_name((df_dtype)k->type));
    }
    *out = p;
    return DF_OK;
}

static df_status plan_lookup(const plan_key *key, const df_gemm_plan **out)
{
    *out = NULL;
    DF_TRY(provider_ready());
    plan_cache *c = pthread_getspecific(cache_key);
    if (!c) {
        c = df_calloc(1, sizeof *c);
        if (!c || pthread_setspecific(cache_key, c) != 0) {
            df_free(c);
            return df_errorf(DF_E_OOM, "gemm: out of memory for the plan cache");
        }
    }
    c->clock++;
    for (int i = 0; i < c->n; i++) {
        if (memcmp(&c->plans[i]->key, key, sizeof *key) == 0) {
            c->plans[i]->used = c->clock;
            *out = c->plans[i];
            return DF_OK;
        }
    }
    df_gemm_plan *p;
    DF_TRY(plan_create(key, &p));
    p->used = c->clock;
    int slot = c->n;
    if (c->n == DF_GEMM_PLAN_CACHE) {
        slot = 0;
        for (int i = 1; i < c->n; i++)
            if (c->plans[i]->used < c->plans[slot]->used)
                slot = i;
        if (c->plans[slot]->prim)
            dnnl_primitive_destroy(c->plans[slot]->prim);
        df_free(c->plans[slot]);
    } else {
        c->n++;
    }
    c->plans[slot] = p;
    *out = p;
    return DF_OK;
}

df_status df_gemm_plan_get(const df_gemm_desc *d, const df_gemm_plan **out)
{
    plan_key key = key_of(d, d->b_trans ? B_TRANS : B_PLAIN);
    return plan_lookup(&key, out);
}

/* k == 0: C = bias (or 0), plus C itself when accumulating. */
static float activate(int act, float x)
{
    switch (act) {
    case DF_GEMM_ACT_GELU_TANH:
        return 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case DF_GEMM_ACT_SILU: return x / (1.0f + expf(-x));
    case DF_GEMM_ACT_GELU: return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
    default: return x;
    }
}

static void run_empty(const plan_key *k, const float *bias, void *c, const float *gate,
                      const float *residual)
{
    if (k->k != 0)
        return; /* m or n is 0: nothing to write */
    for (int64_t b = 0; b < k->batch; b++) {
        for (int64_t i = 0; i < k->m; i++) {
            int64_t at = b * k->sc + i * k->ldc;
            for (int64_t j = 0; j < k->n; j++) {
                float acc = k->accumulate ? ((float *)c)[at + j] : 0.0f; /* f32 C only */
                float v = activate(k->act, acc + (bias ? bias[j] : 0.0f));
                if (k->gated)
                    v = residual[i * k->ldr + j] + v * gate[j];
                if (k->c_bf16)
                    ((uint16_t *)c)[at + j] = df_f32_to_bf16(v);
                else
                    ((float *)c)[at + j] = v;
            }
        }
    }
}

size_t df_gemm_plan_scratch(const df_gemm_plan *p)
{
    return p->scratch_bytes;
}

static df_status plan_exec(const df_gemm_plan *p, const void *a, const void *b,
                           const float *bias, void *c, void *scratch, const float *gate,
                           const float *residual);

df_status df_gemm_plan_run(const df_gemm_plan *p, const void *a, const void *b, const float *bias,
                           void *c, void *scratch)
{
    DF_ASSERT(!p->key.gated);
    return plan_exec(p, a, b, bias, c, scratch, NULL, NULL);
}

df_status df_gemm_plan_run_gated(const df_gemm_plan *p, const void *a, const void *b,
                                 const float *bias, void *c, const float *gate,
                                 const float *residual)
{
    DF_ASSERT(p->key.gated);
    return plan_exec(p, a, b, bias, c, NULL, gate, residual);
}

static df_status plan_exec(const df_gemm_plan *p, const void *a, const void *b,
                           const float *bias, void *c, void *scratch, const float *gate,
                           const float *residual)
{
    if (!p->prim) {
        run_empty(&p->key, p->key.bias ? bias : NULL, c, gate, residual);
        return DF_OK;
    }
    dnnl_stream_t s;
    DF_TRY(thread_stream(&s));
    struct {
        int arg;
        const dnnl_memory_desc_t *md;
        const void *ptr;
    } in[7] = {{DNNL_ARG_SRC, &p->a_md, a},
               {DNNL_ARG_WEIGHTS, &p->b_md, b},
               {DNNL_ARG_DST, &p->c_md, c}};
    int na = 3;
    if (p->key.gated) {
        int first = p->key.accumulate + (p->key.act != 0); /* index of the mul post-op */
        in[na++] = (typeof(in[0])){DNNL_ARG_ATTR_MULTIPLE_POST_OP(first) | DNNL_ARG_SRC_1,
                                   &p->gate_md, gate};
        in[na++] = (typeof(in[0])){DNNL_ARG_ATTR_MULTIPLE_POST_OP(first + 1) | DNNL_ARG_SRC_1,
                                   &p->res_md, residual};
    }
    if (p->key.bias)
        in[na++] = (typeof(in[0])){DNNL_ARG_BIAS, &p->bias_md, bias};
    if (p->scratch_bytes) {
        DF_ASSERT(scratch != NULL);
        in[na++] = (typeof(in[0])){DNNL_ARG_SCRATCHPAD, &p->scratch_md, scratch};
    }
    dnnl_memory_t mem[7] = {NULL};
    dnnl_exec_arg_t args[7];
    dnnl_status_t r = dnnl_success;
    for (int i = 0; i < na && r == dnnl_success; i++) {
        r = dnnl_memory_create(&mem[i], in[i].md, engine, (void *)in[i].ptr);
        args[i].arg = in[i].arg;
        args[i].memory = mem[i];
    }
    if (r == dnnl_success)
        r = dnnl_primitive_execute(p->prim, s, na, args);
    if (r == dnnl_success)
        r = dnnl_stream_wait(s);
    for (int i = 0; i < na; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    return r == dnnl_success ? DF_OK : dnnl_failed(r, "running a matmul");
}

df_status df_gemm(const df_gemm_desc *d, const void *a, const void *b, const float *bias, void *c)
{
    DF_ASSERT(!d->serial);
    const df_gemm_plan *p;
    DF_TRY(df_gemm_plan_get(d, &p));
    return df_gemm_plan_run(p, a, b, bias, c, NULL);
}

/* --- conversions ------------------------------------------------------------------------ */

__attribute__((target("avx512f,avx512bf16"))) static void
to_bf16_avx512bf16(const float *src, uint16_t *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + i));
        _mm256_storeu_si256((__m256i *)(dst + i), (__m256i)h);
    }
    for (; i < n; i++)
        dst[i] = df_f32_to_bf16(src[i]);
}

/* The same rounding as df_f32_to_bf16, sixteen at a time. */
__attribute__((target("avx512f"))) static void to_bf16_avx512(const float *src, uint16_t *dst,
                                                              int64_t n)
{
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i bias = _mm512_set1_epi32(0x7fff), one = _mm512_set1_epi32(1);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(src + i);
        __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs_mask), inf);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
        r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), quiet);
        _mm256_storeu_si256((__m256i *)(dst + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++)
        dst[i] = df_f32_to_bf16(src[i]);
}

void df_gemm_f32_to_bf16(const float *src, uint16_t *dst, int64_t n)
{
    if (__builtin_cpu_supports("avx512bf16"))
        to_bf16_avx512bf16(src, dst, n);
    else if (__builtin_cpu_supports("avx512f"))
        to_bf16_avx512(src, dst, n);
    else
        for (int64_t i = 0; i < n; i++)
            dst[i] = df_f32_to_bf16(src[i]);
}

/* n elements from one float dtype to another, split over the thread's OpenMP team. */
static void convert(const void *src, df_dtype st, void *dst, df_dtype dt, int64_t n)
{
    const int64_t chunk = 1 << 14;
    int64_t chunks = (n + chunk - 1) / chunk;
    size_t ss = df_dtype_size(st), ds = df_dtype_size(dt);
#pragma omp parallel for schedule(static) if (chunks > 1 && !omp_in_parallel())
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i0 = c * chunk, len = n - i0 < chunk ? n - i0 : chunk;
        const char *s = (const char *)src + (size_t)i0 * ss;
        char *d = (char *)dst + (size_t)i0 * ds;
        if (st == DF_DTYPE_F32 && dt == DF_DTYPE_BF16)
            df_gemm_f32_to_bf16((const float *)s, (uint16_t *)d, len);
        else if (st == DF_DTYPE_BF16 && dt == DF_DTYPE_F32)
            for (int64_t i = 0; i < len; i++)
                ((float *)d)[i] = df_bf16_to_f32(((const uint16_t *)s)[i]);
        else
            df_convert(s, st, d, dt, len);
    }
}

/* --- derived forms of weights ----------------------------------------------------------- */


size_t df_gemm_operand_scratch(const df_view *v, df_dtype type)
{
    if (v->dtype == type || (v->flags & DF_VIEW_CONST))
        return 0;
    return (size_t)df_view_numel(v) * df_dtype_size(type);
}

df_status df_gemm_operand(const df_view *v, df_dtype type, void *scratch, const void **out)
{
    const void *src = df_view_ptr(v);
    int64_t n = df_view_numel(v);
    if (v->dtype == type || n == 0) {
        *out = src;
        return DF_OK;
    }
    if (!(v->flags & DF_VIEW_CONST)) {
        convert(src, v->dtype, scratch, type, n);
        *out = scratch;
        return DF_OK;
    }
    uint64_t h = df_hash_mix(
        df_hash_mix(df_hash_mix(df_hash_mix(0x706c61696eull /* "plain" */, (uint64_t)type),
                                (uint64_t)v->dtype),
                    (uint64_t)v->offset),
        (uint64_t)n);
    df_derived *d = df_cpu_find_derived(v->buf, (int64_t)h);
    if (!d) {
        size_t bytes = (size_t)n * df_dtype_size(type);
        void *buf = df_aligned_alloc(bytes);
        d = df_calloc(1, sizeof *d);
        if (!buf || !d) {
            df_aligned_free(buf);
            df_free(d);
            return df_errorf(DF_E_OOM,
                             "gemm: out of memory converting a %lld-element weight "
                             "to %s",
                             (long long)n, df_dtype_name(type));
        }
        convert(src, v->dtype, buf, type, n);
        *d = (df_derived){.key = (int64_t)h, .data = buf, .bytes = bytes, .free = df_aligned_free};
        df_cpu_add_derived(v->buf, d);
        atomic_fetch_add(&pack_count, 1);
    }
    *out = d->data;
    return DF_OK;
}

typedef struct kept_weight {
    dnnl_memory_desc_t md;
    void *data;
} kept_weight;

static void kept_free(void *p)
{
    kept_weight *kw = p;
    df_aligned_free(kw->data);
    df_free(kw);
}

df_status df_dnnl_weight_kept(const df_view *w, uint64_t key, const dnnl_memory_desc_t *md,
                              df_dnnl_fill_fn fill, void *arg, const char *what,
                              const void **out, bool *made)
{
    *made = false;
    df_derived *d = df_cpu_find_derived(w->buf, (int64_t)key);
    if (d && dnnl_memory_desc_equal(&((kept_weight *)d->data)->md, md)) {
        *out = ((kept_weight *)d->data)->data;
        return DF_OK;
    }
    size_t bytes = dnnl_memory_desc_get_size(md);
    kept_weight *kw = df_calloc(1, sizeof *kw);
    d = df_calloc(1, sizeof *d);
    if (kw)
        kw->data = df_aligned_alloc(bytes);
    if (!kw || !d || !kw->data) {
        if (kw)
            df_aligned_free(kw->data);
        df_free(kw);
        df_free(d);
        return df_errorf(DF_E_OOM, "%s: out of memory for a %zu-byte form of a weight", what,
                         bytes);
    }
    kw->md = *md;
    df_status s = fill(w, md, kw->data, arg);
    if (s != DF_OK) {
        kept_free(kw);
        df_free(d);
        return s;
    }
    *d = (df_derived){.key = (int64_t)key, .data = kw, .bytes = bytes, .free = kept_free};
    df_cpu_add_derived(w->buf, d);
    *out = kw->data;
    *made = true;
    return DF_OK;
}

static uint64_t md_hash(const dnnl_memory_desc_t *md)
{
    uint64_t h = df_hash_mix(df_hash_mix(0x7061636bull /* "pack" */, (uint64_t)md->ndims),
                             (uint64_t)md->data_type);
    for (int i = 0; i < md->ndims; i++)
        h = df_hash_mix(df_hash_mix(h, (uint64_t)md->dims[i]), (uint64_t)md->padded_dims[i]);
    h = df_hash_mix(h, (uint64_t)md->format_kind);
    if (md->format_kind == dnnl_blocked) {
        const dnnl_blocking_desc_t *b = &md->format_desc.blocking;
        for (int i = 0; i < md->ndims; i++)
            h = df_hash_mix(h, (uint64_t)b->strides[i]);
        for (int i = 0; i < b->inner_nblks; i++)
            h = df_hash_mix(df_hash_mix(h, (uint64_t)b->inner_blks[i]), (uint64_t)b->inner_idxs[i]);
    }
    return h;
}

/* Copies src, laid out as src_md, into dst laid out as dst_md (oneDNN's reorder, on this
 * thread's stream, waited for); `what` names the work in a failure's message. */
static df_status reorder(const dnnl_memory_desc_t *src_md, const void *src,
                         const dnnl_memory_desc_t *dst_md, void *dst, const char *what)
{
    dnnl_stream_t s;
    DF_TRY(thread_stream(&s));
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    dnnl_memory_t ms = NULL, md = NULL;
    dnnl_status_t r = dnnl_reorder_primitive_desc_create(&pd, src_md, engine, dst_md, engine, NULL);
    if (r == dnnl_success)
        r = dnnl_primitive_create(&prim, pd);
    if (r == dnnl_success)
        r = dnnl_memory_create(&ms, src_md, engine, (void *)src);
    if (r == dnnl_success)
        r = dnnl_memory_create(&md, dst_md, engine, dst);
    if (r == dnnl_success)
        r = dnnl_primitive_execute(prim, s, 2,
                                   (dnnl_exec_arg_t[]){{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}});
    if (r == dnnl_success)
        r = dnnl_stream_wait(s);
    if (ms)
        dnnl_memory_destroy(ms);
    if (md)
        dnnl_memory_destroy(md);
    if (prim)
        dnnl_primitive_destroy(prim);
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    return r == dnnl_success ? DF_OK : dnnl_failed(r, what);
}

/* Reorders w [n, k] (the [k, n] B operand, transposed) into `md`, the plan's layout. */
static df_status pack(const df_view *w, const dnnl_memory_desc_t *md, void *dst)
{
    int64_t n = w->shape[0], k = w->shape[1];
    const void *src = df_view_ptr(w);
    df_dtype st = w->dtype;
    void *tmp = NULL;
    if (st != DF_DTYPE_F32 && (st != DF_DTYPE_BF16 || !provider_has_bf16())) {
        /* f16, f64, or bf16 the provider cannot read: through f32 */
        tmp = df_aligned_alloc((size_t)(n * k) * sizeof(float));
        if (!tmp)
            return df_errorf(DF_E_OOM, "gemm: out of memory packing a weight");
        convert(src, st, tmp, DF_DTYPE_F32, n * k);
        src = tmp;
        st = DF_DTYPE_F32;
    }
    dnnl_memory_desc_t src_md;
    dnnl_memory_desc_init_by_strides(&src_md, 2, (dnnl_dims_t){k, n},
                                     st == DF_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32,
                                     (dnnl_dims_t){1, k});
    df_status status = reorder(&src_md, src, md, dst, "packing a weight");
    df_aligned_free(tmp);
    return status;
}

static df_status pack_fill(const df_view *w, const dnnl_memory_desc_t *md, void *dst, void *arg)
{
    (void)arg;
    return pack(w, md, dst);
}

/* The weight w packed into the layout of plan p, made once and kept on w's storage. */
static df_status packed_weight_of(const df_view *w, const df_gemm_plan *p, const void **out)
{
    uint64_t h = df_hash_mix(
        df_hash_mix(df_hash_mix(md_hash(&p->b_md), (uint64_t)w->dtype), (uint64_t)w->offset),
        (uint64_t)w->shape[0] * 0x100000001ull + (uint64_t)w->shape[1]);
    bool made;
    DF_TRY(df_dnnl_weight_kept(w, h, &p->b_md, pack_fill, NULL, "gemm", out, &made));
    if (!made)
        return DF_OK;
    atomic_fetch_add(&pack_count, 1);
    /* The packed copy is what runs from now on: the file's pages need not stay in memory
     * too (they are read again if the packed copy is ever dropped). */
    df_cpu_drop_pages(w, df_view_ptr(w),
                      (size_t)(w->shape[0] * w->shape[1]) * df_dtype_size(w->dtype));
    return DF_OK;
}

/* --- linear ------------------------------------------------------------------------------ */

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* x [m, k] w^T (+ bias) with the rest of the product (epilogue, output) as d says. */
static df_status linear_run(df_kernel_env *env, const df_view *x, const df_view *w,
                            const df_view *bias, df_gemm_desc d, void *out, const float *gate,
                            const float *residual)
{
    d.n = w->shape[0];
    d.k = w->shape[1];
    if ((d.type == DF_DTYPE_I8 || w->dtype == DF_DTYPE_I8) && d.m > 0 && d.n > 0 &&
        df_i8_linear_applies(w)) {
        df_i8_epilogue e = {.act = d.act, .gate = gate, .residual = residual,
                            .ldr = d.ldr ? d.ldr : d.n, .out = out, .ldc = d.ldc,
                            .out_bf16 = d.c_bf16};
        return df_i8_linear(env, x, d.m, w, bias, &e);
    }
    d.type = df_gemm_compute_dtype(d.type);
    d.b_trans = true;
    d.bias = bias != NULL;
    if (d.m == 0 || d.n == 0)
        return DF_OK;
    /* oneDNN writes bf16 only where it computes bf16 (AVX-512 and up): elsewhere a bf16
     * output is computed in f32 into scratch and rounded to nearest even row by row. */
    bool round_out = d.c_bf16 && d.type == DF_DTYPE_F32;
    int64_t ldc_out = d.ldc ? d.ldc : d.n;
    if (round_out) {
        d.c_bf16 = false;
        d.ldc = 0;
    }
    /* A weight runs through the packed plan whether it stays resident (packed once, kept)
     * or is streamed (packed into scratch for this call): one primitive for both, so
     * offloading never changes a bit of the result. */
    bool packed = (w->flags & DF_VIEW_CONST) && d.k > 0;
    bool streamed = packed && (w->flags & DF_VIEW_STREAMED);
    const df_gemm_plan *p;
    if (packed) {
        plan_key key = key_of(&d, B_PACKED);
        DF_TRY(plan_lookup(&key, &p));
        streamed = streamed && p->prim;
    }
    size_t sx = round64(df_gemm_operand_scratch(x, d.type));
    size_t sw = streamed ? round64(dnnl_memory_desc_get_size(&p->b_md))
                : packed ? 0 : round64(df_gemm_operand_scratch(w, d.type));
    size_t sb = bias ? round64(df_gemm_operand_scratch(bias, DF_DTYPE_F32)) : 0;
    size_t sc = round_out ? round64((size_t)(d.m * d.n) * sizeof(float)) : 0;
    char *scratch = NULL;
    if (sx + sw + sb + sc > 0 && !(scratch = df_env_scratch(env, sx + sw + sb + sc)))
        return df_errorf(DF_E_OOM, "linear: out of memory for %zu bytes of scratch",
                         sx + sw + sb + sc);

    const void *xa, *wb = NULL, *bb = NULL;
    DF_TRY(df_gemm_operand(x, d.type, scratch, &xa));
    if (bias)
        DF_TRY(df_gemm_operand(bias, DF_DTYPE_F32, scratch + sx + sw, &bb));
    if (streamed) {
        DF_TRY(pack(w, &p->b_md, scratch + sx));
        wb = scratch + sx;
    } else if (packed) {
        if (p->prim)
            DF_TRY(packed_weight_of(w, p, &wb));
    } else {
        DF_TRY(df_gemm_operand(w, d.type, scratch + sx, &wb));
        DF_TRY(df_gemm_plan_get(&d, &p));
    }
    if (!round_out)
        return plan_exec(p, xa, wb, bb, out, NULL, gate, residual);
    float *c = (float *)(scratch + sx + sw + sb);
    DF_TRY(plan_exec(p, xa, wb, bb, c, NULL, gate, residual));
    for (int64_t i = 0; i < d.m; i++)
        df_gemm_f32_to_bf16(c + i * d.n, (uint16_t *)out + i * ldc_out, d.n);
    return DF_OK;
}

df_status df_gemm_linear(df_kernel_env *env, const df_view *x, int64_t m, const df_view *w,
                         const df_view *bias, df_dtype compute, int act, void *out,
                         int64_t ldc, df_dtype out_type)
{
    df_gemm_desc d = {.m = m, .type = compute, .ldc = ldc, .act = act,
                      .c_bf16 = out_type == DF_DTYPE_BF16};
    return linear_run(env, x, w, bias, d, out, NULL, NULL);
}

df_status df_gemm_linear_gated(df_kernel_env *env, const df_view *x, int64_t m,
                               const df_view *w, const df_view *bias, df_dtype compute,
                               float *out, int64_t ldc, const float *gate,
                               const float *residual, int64_t ldr)
{
    df_gemm_desc d = {.m = m, .type = compute, .ldc = ldc, .gated_residual = true, .ldr = ldr};
    return linear_run(env, x, w, bias, d, out, gate, residual);
}

/* --- the provider's own rate ------------------------------------------------------------ */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

df_status df_cpu_gemm_rate(df_dtype dtype, int threads, int64_t m, int64_t n, int64_t k, int reps,
                           double *out_gflops)
{
    *out_gflops = 0;
    if ((dtype != DF_DTYPE_F32 && dtype != DF_DTYPE_BF16 && dtype != DF_DTYPE_I8) || m <= 0 ||
        n <= 0 || k <= 0 || threads < 0)
        return df_errorf(DF_E_ARG,
                         "gemm rate: need f32, bf16 or i8 and positive sizes, got %s "
                         "%lldx%lldx%lld on %d threads",
                         df_dtype_name(dtype), (long long)m, (long long)n, (long long)k, threads);
    DF_TRY(provider_ready());
    int prev = omp_get_max_threads();
    omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
    df_gemm_desc d = {.m = m, .n = n, .k = k, .type = dtype};
    plan_key key = key_of(&d, B_PACKED);
    df_gemm_plan *p = NULL;
    df_status s = plan_create(&key, &p);
    void *a = NULL, *b = NULL;
    float *c = NULL;
    if (s == DF_OK) {
        size_t es = df_dtype_size(dtype);
        size_t bbytes = dnnl_memory_desc_get_size(&p->b_md);
        a = df_aligned_alloc((size_t)(m * k) * es);
        b = df_aligned_alloc(bbytes);
        c = df_aligned_alloc((size_t)(m * n) * sizeof(float));
        if (!a || !b || !c)
            s = df_errorf(DF_E_OOM, "gemm rate: out of memory for %lldx%lldx%lld", (long long)m,
                          (long long)n, (long long)k);
        if (s == DF_OK) {
            /* Values of moderate size: the rate must not depend on subnormals. */
            float one = 1.0f / 64;
            uint16_t one16 = df_f32_to_bf16(one);
            if (dtype == DF_DTYPE_I8) { /* u8 x s8: small integers */
                memset(a, 3, (size_t)(m * k));
                memset(b, 1, bbytes);
            }
            for (size_t i = 0; i < (size_t)(m * k) && dtype != DF_DTYPE_I8; i++)
                if (dtype == DF_DTYPE_BF16)
                    ((uint16_t *)a)[i] = one16;
                else
                    ((float *)a)[i] = one;
            for (size_t i = 0; i < bbytes / es && dtype != DF_DTYPE_I8; i++)
                if (dtype == DF_DTYPE_BF16)
                    ((uint16_t *)b)[i] = one16;
                else
                    ((float *)b)[i] = one;
        }
    }
    double best = 0;
    for (int r = -1; s == DF_OK && r < (reps > 0 ? reps : 1); r++) {
        double t0 = now_seconds();
        s = df_gemm_plan_run(p, a, b, NULL, c, NULL);
        double t = now_seconds() - t0;
        if (r >= 0 && t > 0 && 2.0 * (double)m * (double)n * (double)k / t * 1e-9 > best)
            best = 2.0 * (double)m * (double)n * (double)k / t * 1e-9;
    }
    df_aligned_free(a);
    df_aligned_free(b);
    df_aligned_free(c);
    if (p && p->prim)
        dnnl_primitive_destroy(p->prim);
    df_free(p);
    omp_set_num_threads(prev);
    if (s == DF_OK)
        *out_gflops = best;
    return s;
}

/* --- for the int8 products' oneDNN path (gemm_int8_dnnl.c) ------------------------------ */

df_status df_gemm_dnnl_handles(void **out_engine, void **out_stream)
{
    DF_TRY(provider_ready());
    dnnl_stream_t s = NULL;
    DF_TRY(thread_stream(&s));
    *out_engine = engine;
    *out_stream = s;
    return DF_OK;
}

df_status df_gemm_dnnl_failed(int status, const char *what)
{
    return dnnl_failed((dnnl_status_t)status, what);
}

df_status df_gemm_dnnl_reorder(const void *src_md, const void *src, const void *dst_md, void *dst,
                               const char *what)
{
    DF_TRY(provider_ready());
    return reorder(src_md, src, dst_md, dst, what);
}

bool df_cpu_has_amx_int8(void)
{
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return (isa & amx) == amx;
}
