/*
 * 8-bit products with K-grouped scales (gemm_int8.h): packing, activation quantization,
 * the portable micro-kernel, the epilogue and the dispatch. The x86 micro-kernels live in
 * gemm_int8_x86.c.
 *
 * Choices:
 * - Weights and activations are quantized by the one rule of the int8 format
 *   (core/int8_quant.h): df_i8_quantize_channel for a weight's channels, df_i8_round inline
 *   in the activations' loop.
 * - Work is split over (a chunk of up to DF_I8_MC rows, a block of DF_I8_NR channels), and
 *   k into pieces of DF_I8_KC quads: every tile of the chunk runs over one piece of the
 *   block's packed weights (NR * 4 * DF_I8_KC bytes, in L1) before the next piece, so the
 *   weights are read from memory once per chunk whatever k is, and the chunk's piece of
 *   activations (DF_I8_MC * 4 * DF_I8_KC bytes) stays in L2, shared by the threads working
 *   on its other blocks.
 */
#include <math.h>
#include <omp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/cpu.h>

#include "backend/cpu/gemm.h"
#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/gemm_int8_impl.h"
#include "backend/cpu/k_common.h"
#include "core/alloc.h"
#include "core/int8_quant.h"

/* rows per chunk of work, at most: each chunk reads every weight block once, so the larger
 * the chunk the less weight traffic; 512 rows measured about 2% faster than 256 at k = 12288
 * (the chunk's piece of activations, 512 KiB, still stays in L2) */
#define DF_I8_MC 512
#define DF_I8_KC 256 /* quads (4 k) per piece of k: a block's piece (32 KiB) stays in L1 */

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

typedef struct layout {
    int64_t group, kp, n_groups, n_blocks;
    size_t q_at, scale_at, corr_at, bytes;
} layout;

static layout layout_of(int64_t n, int64_t k, int64_t group)
{
    df_i8_groups g = df_i8_groups_of(k, group);
    layout l = {.group = g.group, .kp = g.kp, .n_groups = g.n_groups};
    l.n_blocks = (n + DF_I8_NR - 1) / DF_I8_NR;
    size_t per_block = (size_t)(l.n_groups * DF_I8_NR);
    l.q_at = round64(sizeof(df_i8_weight));
    l.scale_at = l.q_at + round64((size_t)(l.n_blocks * l.kp * DF_I8_NR));
    l.corr_at = l.scale_at + round64((size_t)l.n_blocks * per_block * sizeof(float));
    l.bytes = l.corr_at + round64((size_t)l.n_blocks * per_block * sizeof(int32_t));
    return l;
}

size_t df_i8_weight_bytes(int64_t n, int64_t k, int64_t group)
{
    return layout_of(n, k, group).bytes;
}

/* A zeroed packed weight of [n, k] laid out as l says, in one allocation (free with
 * df_i8_weight_free), or NULL when out of memory. */
static df_i8_weight *weight_new(int64_t n, int64_t k, const layout *l)
{
    char *mem = df_aligned_alloc(l->bytes);
    if (!mem)
        return NULL;
    memset(mem, 0, l->bytes);
    df_i8_weight *w = (df_i8_weight *)mem;
    *w = (df_i8_weight){.n = n,
                        .k = k,
                        .kp = l->kp,
                        .group = l->group,
                        .n_groups = l->n_groups,
                        .n_blocks = l->n_blocks,
                        .q = (int8_t *)(mem + l->q_at),
                        .scale = (float *)(mem + l->scale_at),
                        .corr = (int32_t *)(mem + l->corr_at)};
    return w;
}

void df_i8_weight_free(void *p)
{
    df_i8_weight *w = p;
    if (w)
        df_i8_dnnl_free(w->dnnl);
    df_aligned_free(w);
}

/* Channel c of block b from its quantized values (kp of them) and group scales. */
void df_i8_place_channel(df_i8_weight *w, int64_t b, int c, const int8_t *q, const float *scale)
{
    for (int64_t g = 0; g < w->n_groups; g++) {
        int32_t sum = 0;
        for (int64_t i = 0; i < w->group; i++) {
            int64_t kk = g * w->group + i;
            w->q[((b * (w->kp / 4) + kk / 4) * DF_I8_NR + c) * 4 + kk % 4] = q[kk];
            sum += q[kk];
        }
        w->scale[(b * w->n_groups + g) * DF_I8_NR + c] = scale[g];
        w->corr[(b * w->n_groups + g) * DF_I8_NR + c] = -128 * sum;
    }
}

static void pack_channel(df_i8_weight *w, int64_t b, int c, const float *row, int8_t *q,
                         float *scale)
{
    df_i8_quantize_channel(row, w->group, w->n_groups, q, scale);
    df_i8_place_channel(w, b, c, q, scale);
}

df_status df_i8_weight_pack(const void *src, df_dtype type, int64_t n, int64_t k, int64_t ldw,
                            int64_t group, df_i8_weight **out)
{
    *out = NULL;
    if (type != DF_DTYPE_F32 && type != DF_DTYPE_BF16 && type != DF_DTYPE_F16)
        return df_errorf(DF_E_UNSUPPORTED, "int8: cannot quantize a %s weight",
                         df_dtype_name(type));
    layout l = layout_of(n, k, group);
    df_i8_weight *w = weight_new(n, k, &l);
    if (!w)
        return df_errorf(DF_E_OOM, "int8: out of memory for a quantized [%lld, %lld] weight",
                         (long long)n, (long long)k);
    size_t es = df_dtype_size(type);
    bool failed = false;
#pragma omp parallel if (l.n_blocks > 1 && !omp_in_parallel())
    {
        float *row = df_malloc((size_t)l.kp * (sizeof(float) + 1) + (size_t)l.n_groups * 4);
        int8_t *q = row ? (int8_t *)(row + l.kp) : NULL;
        float *sc = row ? (float *)(q + l.kp + (4 - l.kp % 4) % 4) : NULL;
        if (!row) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t b = 0; b < l.n_blocks; b++) {
            if (!row)
                continue;
            for (int c = 0; c < DF_I8_NR && b * DF_I8_NR + c < n; c++) {
                const char *r = (const char *)src + (size_t)((b * DF_I8_NR + c) * ldw) * es;
                df_convert(r, type, row, DF_DTYPE_F32, k);
                memset(row + k, 0, (size_t)(l.kp - k) * sizeof(float));
                pack_channel(w, b, c, row, q, sc);
            }
        }
        df_free(row);
    }
    if (failed) {
        df_aligned_free(w);
        return df_errorf(DF_E_OOM, "int8: out of memory quantizing a [%lld, %lld] weight",
                         (long long)n, (long long)k);
    }
    *out = w;
    return DF_OK;
}

df_status df_i8_weight_from_plain(const int8_t *q, const float *scale, int64_t n, int64_t k,
                                  int64_t group, df_i8_weight **out)
{
    *out = NULL;
    layout l = layout_of(n, k, group);
    df_i8_weight *w = weight_new(n, k, &l);
    int8_t *row = df_calloc(1, (size_t)l.kp);
    if (!w || !row) {
        df_aligned_free(w);
        df_free(row);
        return df_errorf(DF_E_OOM, "int8: out of memory for a quantized [%lld, %lld] weight",
                         (long long)n, (long long)k);
    }
    for (int64_t j = 0; j < n; j++) {
        memcpy(row, q + j * k, (size_t)k);
        df_i8_place_channel(w, j / DF_I8_NR, (int)(j % DF_I8_NR), row, scale + j * l.n_groups);
    }
    df_free(row);
    *out = w;
    return DF_OK;
}

static _Atomic int64_t tiles_in_place; /* df_i8_tiles_in_place */

int64_t df_i8_tiles_in_place(void)
{
    return tiles_in_place;
}

size_t df_i8_tiles_bytes(int64_t n, int64_t k, int64_t group)
{
    layout l = layout_of(n, k, group);
    return l.q_at + round64((size_t)(l.n_blocks * l.n_groups * DF_I8_NR) * sizeof(int32_t));
}

df_status df_i8_weight_from_tiles(const int8_t *q, const float *scale, int64_t n, int64_t k,
                                  int64_t group, df_i8_weight **out)
{
    *out = NULL;
    layout l = layout_of(n, k, group);
    if (!df_i8_tiles_fit(n, k, DF_I8_NR) || l.kp != k)
        return df_errorf(DF_E_ARG, "int8: a [%lld, %lld] weight is not whole tiles of %d x 4",
                         (long long)n, (long long)k, DF_I8_NR);
    size_t bytes = df_i8_tiles_bytes(n, k, group);
    char *mem = df_aligned_alloc(bytes);
    if (!mem)
        return df_errorf(DF_E_OOM, "int8: out of memory for the sums of a [%lld, %lld] weight",
                         (long long)n, (long long)k);
    df_i8_weight *w = (df_i8_weight *)mem;
    *w = (df_i8_weight){.n = n,
                        .k = k,
                        .kp = l.kp,
                        .group = l.group,
                        .n_groups = l.n_groups,
                        .n_blocks = l.n_blocks,
                        .q = (int8_t *)q,
                        .scale = (float *)scale,
                        .corr = (int32_t *)(mem + l.q_at)};
    /* -128 x each (channel, group)'s sum: one pass over the bytes, in file order, which
     * also brings the pages in for the product that follows */
#pragma omp parallel for schedule(static) if (l.n_blocks > 1 && !omp_in_parallel())
    for (int64_t b = 0; b < l.n_blocks; b++) {
        for (int64_t g = 0; g < l.n_groups; g++) {
            int32_t sum[DF_I8_NR] = {0};
            const int8_t *bq = q + (b * (l.kp / 4) + g * l.group / 4) * DF_I8_NR * 4;
            for (int64_t quad = 0; quad < l.group / 4; quad++)
                for (int c = 0; c < DF_I8_NR; c++)
                    for (int i = 0; i < 4; i++)
                        sum[c] += bq[(quad * DF_I8_NR + c) * 4 + i];
            for (int c = 0; c < DF_I8_NR; c++)
                w->corr[(b * l.n_groups + g) * DF_I8_NR + c] = -128 * sum[c];
        }
    }
    tiles_in_place++;
    *out = w;
    return DF_OK;
}

/* --- activations ------------------------------------------------------------------------ */

size_t df_i8_act_bytes(const df_i8_weight *w, int64_t m)
{
    return round64((size_t)(m * w->kp)) + round64((size_t)(m * w->n_groups) * sizeof(float)) + 64;
}

static inline __attribute__((always_inline)) void
quantize_row(const void *x, bool bf16, int64_t k, const df_i8_weight *w, uint8_t *q, float *sc)
{
    float buf[256];
    for (int64_t g = 0; g < w->n_groups; g++) {
        int64_t k0 = g * w->group, len = w->group;
        /* the group's values, a piece of at most 256 at a time (a whole-k group is long) */
        float amax = 0;
        for (int64_t i = k0; i < k0 + len && i < k; i++) {
            float v = bf16 ? df_bf16_to_f32(((const uint16_t *)x)[i]) : ((const float *)x)[i];
            amax = fmaxf(amax, fabsf(v));
        }
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        sc[g] = amax / 127.0f;
        for (int64_t p = k0; p < k0 + len; p += 256) {
            int64_t pl = k0 + len - p < 256 ? k0 + len - p : 256;
            for (int64_t i = 0; i < pl; i++) {
                int64_t kk = p + i;
                buf[i] = kk >= k ? 0.0f
                         : bf16  ? df_bf16_to_f32(((const uint16_t *)x)[kk])
                                 : ((const float *)x)[kk];
            }
            for (int64_t i = 0; i < pl; i++)
                q[p + i] = (uint8_t)(df_i8_round(buf[i], inv) + 128);
        }
    }
}

void df_i8_act_quantize(const df_i8_weight *w, const void *x, df_dtype type, int64_t m, int64_t ldx,
                        void *scratch, df_i8_act *out)
{
    char *base = (char *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    *out = (df_i8_act){.m = m,
                       .kp = w->kp,
                       .group = w->group,
                       .n_groups = w->n_groups,
                       .q = (uint8_t *)base,
                       .scale = (float *)(base + round64((size_t)(m * w->kp)))};
    bool bf16 = type == DF_DTYPE_BF16;
    size_t es = df_dtype_size(type);
    df_i8_quantize_row_fn vec = df_i8_quantize_row_avx512_fn();
#pragma omp parallel for schedule(static) if (m * w->kp > (1 << 15) && !omp_in_parallel())
    for (int64_t r = 0; r < m; r++) {
        const char *row = (const char *)x + (size_t)(r * ldx) * es;
        if (vec)
            vec(row, bf16, w->k, w->group, w->n_groups, out->q + r * w->kp,
                out->scale + r * w->n_groups);
        else if (bf16)
            quantize_row(row, true, w->k, w, out->q + r * w->kp, out->scale + r * w->n_groups);
        else
            quantize_row(row, false, w->k, w, out->q + r * w->kp, out->scale + r * w->n_groups);
    }
}

/* --- the portable micro-kernel ---------------------------------------------------------- */

void df_i8_tile_portable(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR])
{
    const df_i8_weight *w = t->w;
    int64_t gq = w->group / 4;
    for (int64_t g = t->q0 / gq; g * gq < t->q1; g++) {
        int64_t qs, qe;
        df_i8_group_span(t, g, gq, &qs, &qe);
        const int8_t *bq = w->q + t->block * (w->kp / 4) * DF_I8_NR * 4;
        const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;
        const int32_t *wc = w->corr + (t->block * w->n_groups + g) * DF_I8_NR;
        for (int r = 0; r < DF_I8_MR; r++) {
            int32_t acc[DF_I8_NR];
            memcpy(acc, qs == g * gq ? wc : t->part[r], sizeof acc);
            for (int64_t quad = qs; quad < qe; quad++) {
                const int8_t *b = bq + quad * DF_I8_NR * 4;
                const uint8_t *aq = t->rows[r] + quad * 4;
                for (int c = 0; c < DF_I8_NR; c++)
                    acc[c] += aq[0] * b[c * 4] + aq[1] * b[c * 4 + 1] + aq[2] * b[c * 4 + 2] +
                              aq[3] * b[c * 4 + 3];
            }
            if (qe < (g + 1) * gq) {
                memcpy(t->part[r], acc, sizeof acc);
                continue;
            }
            float as = t->scales[r][g];
            for (int c = 0; c < DF_I8_NR; c++)
                tile[r][c] = fmaf((float)acc[c], ws[c] * as, tile[r][c]);
        }
    }
}

/* --- the epilogue ----------------------------------------------------------------------- */

/* The activations as the elementwise kernels compute them (k_common.h), vectorisable. */
static void activate(int act, float *v, int n)
{
    if (act == DF_GEMM_ACT_GELU_TANH) { /* x sigmoid(2y), y = sqrt(2/pi) (x + 0.044715 x^3) */
        for (int c = 0; c < n; c++)
            v[c] = df_cpu_x_sigmoid(v[c],
                                    1.5957691216057308f * v[c] * (1.0f + 0.044715f * v[c] * v[c]));
    } else if (act == DF_GEMM_ACT_SILU) {
        for (int c = 0; c < n; c++)
            v[c] = df_cpu_x_sigmoid(v[c], v[c]);
    } else if (act == DF_GEMM_ACT_GELU) {
        for (int c = 0; c < n; c++) {
            float e = erfcf(-v[c] * 0.70710678118654752f);
            v[c] = e == 0.0f ? -0.0f : 0.5f * v[c] * e;
        }
    }
}

static void epilogue(const df_i8_epilogue *e, int64_t n, int64_t row, int64_t n0, int cols,
                     const float *acc)
{
    /* f32 rows are computed where they go: a copy from a buffer on the stack would load
     * wide what was just stored narrow, which store forwarding cannot serve. Each value of
     * the residual is read before its place in out is written (the two may be one row). */
    int64_t ldc = e->ldc ? e->ldc : n;
    float buf[DF_I8_NR];
    float *v = e->out_bf16 ? buf : (float *)e->out + row * ldc + n0;
    if (e->gate) {
        const float *r = e->residual + row * e->ldr + n0;
        for (int c = 0; c < cols; c++)
            v[c] = r[c] + e->gate[n0 + c] * (acc[c] + (e->bias ? e->bias[n0 + c] : 0.0f));
    } else {
        for (int c = 0; c < cols; c++)
            v[c] = acc[c] + (e->bias ? e->bias[n0 + c] : 0.0f);
        if (e->act)
            activate(e->act, v, cols);
    }
    if (e->out_bf16)
        df_gemm_f32_to_bf16(v, (uint16_t *)e->out + row * ldc + n0, cols);
}

/* --- dispatch and the driver ------------------------------------------------------------ */

static const char *const path_names[DF_I8_PATH_COUNT] = {"auto",     "portable",    "avx2",
                                                         "avx-vnni", "avx512-vnni", "onednn"};

const char *df_i8_path_name(df_i8_path path)
{
    return (unsigned)path < DF_I8_PATH_COUNT ? path_names[path] : "?";
}

bool df_i8_path_available(df_i8_path path)
{
    switch (path) {
    case DF_I8_PATH_AUTO:
    case DF_I8_PATH_PORTABLE:
        return true;
    case DF_I8_PATH_AVX2:
        return df_i8_tile_avx2_fn() != NULL;
    case DF_I8_PATH_AVX_VNNI:
        return df_i8_tile_avxvnni_fn() != NULL;
    case DF_I8_PATH_AVX512_VNNI:
        return df_i8_tile_avx512vnni_fn() != NULL;
    case DF_I8_PATH_ONEDNN:
        return df_i8_dnnl_available();
    default:
        return false;
    }
}

df_status df_i8_path_parse(const char *name, df_i8_path *out)
{
    *out = DF_I8_PATH_AUTO;
    for (int p = DF_I8_PATH_PORTABLE; p < DF_I8_PATH_COUNT; p++) {
        if (strcmp(name, path_names[p]) != 0)
            continue;
        if (!df_i8_path_available((df_i8_path)p))
            return df_errorf(DF_E_UNSUPPORTED, "int8 path '%s': this CPU cannot run the %s kernel",
                             name, name);
        *out = (df_i8_path)p;
        return DF_OK;
    }
    return df_errorf(
        DF_E_ARG, "int8 path '%s': expected portable, avx2, avx-vnni, avx512-vnni or onednn", name);
}

static _Atomic int forced = -1; /* -1: not read from the environment yet */

df_status df_i8_force_path(df_i8_path path)
{
    if ((unsigned)path >= DF_I8_PATH_COUNT || !df_i8_path_available(path))
        return df_errorf(DF_E_UNSUPPORTED, "int8: this CPU cannot run the %s kernel",
                         df_i8_path_name(path));
    forced = (int)path;
    return DF_OK;
}

/* The forced path, or AUTO. */
static df_i8_path forced_path(void)
{
    if (forced < 0) {
        int f = DF_I8_PATH_AUTO;
        const char *env = getenv("DIFFUSE_INT8_PATH");
        for (int p = DF_I8_PATH_PORTABLE; env && *env && p < DF_I8_PATH_COUNT; p++)
            if (strcmp(env, path_names[p]) == 0 && df_i8_path_available((df_i8_path)p))
                f = p;
        forced = f;
    }
    return (df_i8_path)forced;
}

df_i8_path df_i8_path_best(void)
{
    df_i8_path f = forced_path();
    return f != DF_I8_PATH_AUTO ? f : df_i8_best_kernel();
}

df_i8_path df_i8_best_kernel(void)
{
    if (df_i8_path_available(DF_I8_PATH_AVX512_VNNI))
        return DF_I8_PATH_AVX512_VNNI;
    if (df_i8_path_available(DF_I8_PATH_AVX_VNNI))
        return DF_I8_PATH_AVX_VNNI;
    if (df_i8_path_available(DF_I8_PATH_AVX2))
        return DF_I8_PATH_AVX2;
    return DF_I8_PATH_PORTABLE;
}

/* The project's kernel: whole-k products may run oneDNN's instead where it measured faster
 * (df_i8_whole_k_path), which the cache file says. */
const char *df_cpu_int8_kernel(void)
{
    return df_i8_path_name(df_i8_path_best());
}

/* The oneDNN path: its product into f32 rows (out itself when f32), then each row's scale,
 * the bias and the epilogue. */
static df_status gemm_onednn(const df_i8_act *a, df_i8_weight *w, const df_i8_epilogue *e)
{
    int64_t n = w->n, ldc = e->ldc ? e->ldc : n;
    float *tmp = NULL, *o = e->out;
    /* oneDNN writes the whole product before the epilogue reads the residual: a residual
     * that is the output itself (the gated residual in place) needs the product apart. */
    bool aliased = e->residual && (const void *)e->residual == e->out;
    if (e->out_bf16 || aliased) {
        tmp = df_aligned_alloc((size_t)(a->m * n) * sizeof(float));
        if (!tmp)
            return df_errorf(DF_E_OOM, "int8: out of memory for a [%lld, %lld] product",
                             (long long)a->m, (long long)n);
        o = tmp;
        ldc = n;
    }
    df_status s = df_i8_gemm_dnnl(a, w, o, ldc);
#pragma omp parallel for schedule(static) if (s == DF_OK && a->m > 1 && !omp_in_parallel())
    for (int64_t r = 0; r < (s == DF_OK ? a->m : 0); r++) {
        for (int64_t n0 = 0; n0 < n; n0 += DF_I8_NR) {
            int cols = (int)(n - n0 < DF_I8_NR ? n - n0 : DF_I8_NR);
            float acc[DF_I8_NR];
            for (int c = 0; c < cols; c++)
                acc[c] = o[r * ldc + n0 + c] * a->scale[r];
            epilogue(e, n, r, n0, cols, acc);
        }
    }
    df_aligned_free(tmp);
    return s;
}

static _Atomic int64_t products[DF_I8_PATH_COUNT]; /* df_i8_products */

int64_t df_i8_products(df_i8_path path)
{
    return (unsigned)path < DF_I8_PATH_COUNT ? products[path] : 0;
}

/* The project's kernel for a product on `path` (AUTO: the dispatched one; oneDNN: the best
 * of our own). */
static df_i8_path own_path(df_i8_path path)
{
    if (path == DF_I8_PATH_AUTO)
        path = forced_path();
    return path == DF_I8_PATH_AUTO || path == DF_I8_PATH_ONEDNN ? df_i8_best_kernel() : path;
}

/* The micro-kernel of one of the project's paths. */
static df_i8_tile_fn tile_for(df_i8_path path)
{
    return path == DF_I8_PATH_AVX512_VNNI ? df_i8_tile_avx512vnni_fn()
           : path == DF_I8_PATH_AVX_VNNI  ? df_i8_tile_avxvnni_fn()
           : path == DF_I8_PATH_AVX2      ? df_i8_tile_avx2_fn()
                                          : df_i8_tile_portable;
}

/* A thread's tiles for one chunk of rows: the f32 sums and the sums of cut groups. */
typedef struct chunk_tiles {
    float f[DF_I8_MC / DF_I8_MR][DF_I8_MR][DF_I8_NR];
    int32_t part[DF_I8_MC / DF_I8_MR][DF_I8_MR][DF_I8_NR];
} chunk_tiles;

/* Rows [m0, m1) (at most DF_I8_MC) against block b of w, piece of k by piece, then the
 * epilogue, as the block of output channels from n0 (of n). */
static void run_chunk(df_i8_tile_fn fn, const df_i8_act *a, const df_i8_weight *w, int64_t b,
                      int64_t n, int64_t n0, int64_t m0, int64_t m1, const df_i8_epilogue *e,
                      chunk_tiles *ct)
{
    int64_t tiles = (m1 - m0 + DF_I8_MR - 1) / DF_I8_MR, quads = w->kp / 4;
    int cols = (int)(n - n0 < DF_I8_NR ? n - n0 : DF_I8_NR);
    memset(ct->f, 0, (size_t)tiles * sizeof ct->f[0]);
    for (int64_t q0 = 0; q0 < quads; q0 += DF_I8_KC) {
        int64_t q1 = q0 + DF_I8_KC < quads ? q0 + DF_I8_KC : quads;
        for (int64_t i = 0; i < tiles; i++) {
            df_i8_tile_args t = {.w = w, .block = b, .q0 = q0, .q1 = q1, .part = ct->part[i]};
            int64_t r0 = m0 + i * DF_I8_MR;
            int rows = (int)(m1 - r0 < DF_I8_MR ? m1 - r0 : DF_I8_MR);
            for (int r = 0; r < DF_I8_MR; r++) {
                int64_t at = r0 + (r < rows ? r : 0); /* missing rows repeat the first */
                t.rows[r] = a->q + at * a->kp;
                t.scales[r] = a->scale + at * a->n_groups;
            }
            fn(&t, ct->f[i]);
            /* a finished tile's rows are written at once, so that their stores (which
             * miss the cache) drain while the next tile computes */
            for (int r = 0; q1 == quads && r < rows; r++)
                epilogue(e, n, r0 + r, n0, cols, ct->f[i][r]);
        }
    }
}

/*
 * The product with a weight kept in its file's form: each thread packs one block of
 * DF_I8_NR channels into its own scratch (df_i8_blocks_pack) and runs every row against
 * it, so a block is packed once per call and the packed weight never exists whole.
 */
df_status df_i8_gemm_blocks(const df_i8_act *a, const df_i8_blocks *src, const df_i8_epilogue *e,
                            df_i8_path path)
{
    df_i8_weight shape = df_i8_blocks_shape(src);
    path = own_path(path);
    products[path]++;
    df_i8_tile_fn fn = tile_for(path);
    if (!fn)
        return df_errorf(DF_E_UNSUPPORTED, "int8: this CPU cannot run the %s kernel",
                         df_i8_path_name(path));
    if (a->kp != shape.kp || a->group != shape.group)
        return df_errorf(DF_E_ARG,
                         "int8: activations quantized for k %lld group %lld, weight "
                         "has k %lld group %lld",
                         (long long)a->kp, (long long)a->group, (long long)shape.kp,
                         (long long)shape.group);
    size_t scratch = df_i8_blocks_scratch(&shape);
    bool failed = false;
#pragma omp parallel if (shape.n_blocks > 1 && !omp_in_parallel())
    {
        char *mem = df_aligned_alloc(scratch);
        chunk_tiles *ct = df_aligned_alloc(sizeof *ct);
        if (!mem || !ct) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(dynamic)
        for (int64_t b = 0; b < shape.n_blocks; b++) {
            if (!mem || !ct)
                continue;
            df_i8_weight blk;
            df_i8_blocks_pack(src, b, &shape, mem, &blk);
            for (int64_t m0 = 0; m0 < a->m; m0 += DF_I8_MC) {
                int64_t m1 = m0 + DF_I8_MC < a->m ? m0 + DF_I8_MC : a->m;
                run_chunk(fn, a, &blk, 0, shape.n, b * DF_I8_NR, m0, m1, e, ct);
            }
        }
        df_aligned_free(ct);
        df_aligned_free(mem);
    }
    if (failed)
        return df_errorf(DF_E_OOM, "int8: out of memory for %zu bytes of packing scratch", scratch);
    return DF_OK;
}

df_status df_i8_gemm(const df_i8_act *a, const df_i8_weight *w, const df_i8_epilogue *e,
                     df_i8_path path)
{
    bool whole_k = w->n_groups == 1 && a->kp == w->kp && a->group == w->group;
    if (path == DF_I8_PATH_AUTO)
        path = forced_path();
    if (path == DF_I8_PATH_AUTO && whole_k) /* the faster of ours and oneDNN's, measured */
        DF_TRY(df_i8_whole_k_path(w, &path, NULL, 0));
    if (path != DF_I8_PATH_ONEDNN || !whole_k)
        path = own_path(path);
    products[path]++;
    return df_i8_gemm_run(a, w, e, path);
}

df_status df_i8_gemm_run(const df_i8_act *a, const df_i8_weight *w, const df_i8_epilogue *e,
                         df_i8_path path)
{
    if (path == DF_I8_PATH_ONEDNN) {
        if (w->n_groups != 1 || a->kp != w->kp || a->group != w->group)
            return df_errorf(DF_E_ARG, "int8: oneDNN's path takes whole-k weights only");
        return gemm_onednn(a, (df_i8_weight *)w, e); /* adds its form to w: see the header */
    }
    df_i8_tile_fn fn = tile_for(path);
    if (!fn)
        return df_errorf(DF_E_UNSUPPORTED, "int8: this CPU cannot run the %s kernel",
                         df_i8_path_name(path));
    if (a->kp != w->kp || a->group != w->group)
        return df_errorf(DF_E_ARG,
                         "int8: activations quantized for k %lld group %lld, weight "
                         "has k %lld group %lld",
                         (long long)a->kp, (long long)a->group, (long long)w->kp,
                         (long long)w->group);
    int64_t m = a->m, chunks = (m + DF_I8_MC - 1) / DF_I8_MC, work = chunks * w->n_blocks;
    bool failed = false;
#pragma omp parallel if (work > 1 && !omp_in_parallel())
    {
        chunk_tiles *ct = df_aligned_alloc(sizeof *ct);
        if (!ct) {
#pragma omp atomic write
            failed = true;
        }
#pragma omp for schedule(static)
        for (int64_t i = 0; i < work; i++) {
            int64_t chunk = i / w->n_blocks, b = i % w->n_blocks, m0 = chunk * DF_I8_MC;
            if (ct)
                run_chunk(fn, a, w, b, w->n, b * DF_I8_NR, m0,
                          m0 + DF_I8_MC < m ? m0 + DF_I8_MC : m, e, ct);
        }
        df_aligned_free(ct);
    }
    if (failed)
        return df_errorf(DF_E_OOM, "int8: out of memory for %zu bytes of tiles",
                         sizeof(chunk_tiles));
    return DF_OK;
}
