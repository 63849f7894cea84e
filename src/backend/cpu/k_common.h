/*
 * Helpers shared by the CPU kernels outside the matrix products: element conversions
 * written so that the compiler vectorises them, an f32 exponential that vectorises, the
 * strided copy every data-moving kernel uses, and the size below which a kernel stays on
 * one thread.
 *
 * Everything here is branch-free on purpose: the selects are integer masks or ternaries
 * on integers, which gcc turns into vector blends, where a float comparison feeding a
 * branch would stop the loop from vectorising.
 */
#ifndef DF_CPU_K_COMMON_H
#define DF_CPU_K_COMMON_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/cpu_device.h"

/* Work (elements touched) below which a kernel does not start OpenMP threads: a fork and
 * join costs a few microseconds, about what one core needs for this many elements. */
#define DF_CPU_PAR_MIN ((int64_t)1 << 15)

/* Threads a kernel may use. */
static inline int df_cpu_threads(const df_kernel_env *env)
{
    return env->threads > 0 ? env->threads : 1;
}

static inline float df_as_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline uint32_t df_as_u32(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* The same results as df_bf16_to_f32 / df_f32_to_bf16 / df_f16_to_f32 / df_f32_to_f16
 * (core/dtype.c), bit for bit, NaN payloads included, but without branches. */
static inline float df_cpu_bf16_f32(uint16_t h)
{
    return df_as_f32((uint32_t)h << 16);
}

static inline uint16_t df_cpu_f32_bf16(float f)
{
    uint32_t u = df_as_u32(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float df_cpu_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + 0x38000000u;              /* rebias 15 -> 127 */
    normal += em >= 0x7c00u ? 0x38000000u : 0u;              /* inf / NaN: exponent all ones */
    uint32_t sub = df_as_u32((float)(int32_t)em * 0x1p-24f); /* subnormal: em * 2^-24 */
    return df_as_f32((em < 0x400u ? sub : normal) | sign);
}

static inline uint16_t df_cpu_f32_f16(float f)
{
    uint32_t u = df_as_u32(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* normal: drop 13 mantissa bits, round to nearest even */
    uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* subnormal: adding 0.5 leaves the value in units of 2^-24, rounded by the FPU */
    uint32_t sub = df_as_u32(df_as_f32(a) + 0.5f) - 0x3f000000u;
    uint32_t h = a < 0x38800000u ? sub : normal;
    h = a >= 0x477ff000u ? 0x7c00u : h;                         /* rounds past 65504 */
    h = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : h; /* quiet NaN */
    return (uint16_t)(h | sign);
}

/*
 * e^x in f32, within about 1 ulp of the exact value over the whole range (measured: at
 * most 1.01 ulp), with correct overflow to inf and gradual underflow to 0. Cody-Waite
 * reduction x = n ln2 + r, |r| <= ln2/2, a degree-7 polynomial for e^r (the classic
 * single-precision minimax coefficients), then 2^n applied in two halves so that
 * subnormal results are rounded once. It vectorises, which libm's expf does not.
 */
static inline float df_cpu_expf(float x)
{
    uint32_t lo = -(uint32_t)(x < -104.0f), hi = -(uint32_t)(x > 89.0f);
    x = df_as_f32((df_as_u32(x) & ~(lo | hi)) | (df_as_u32(-104.0f) & lo) |
                  (df_as_u32(89.0f) & hi));
    float t = fmaf(x, 1.44269504088896341f, 12582912.0f); /* + 1.5 * 2^23 rounds to integer */
    int32_t n = (int32_t)(df_as_u32(t) - 0x4b400000u);
    float nf = t - 12582912.0f;
    float r = fmaf(nf, -0.693359375f, x);
    r = fmaf(nf, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t n1 = n >> 1, n2 = n - n1;
    return p * df_as_f32((uint32_t)(n1 + 127) << 23) * df_as_f32((uint32_t)(n2 + 127) << 23);
}

/* x * sigmoid(u), accurate for every sign of u: e^-|u| never overflows. Callers have u of
 * the sign of x, so a sigmoid that underflows to 0 means the limit -0 (also for x = -inf,
 * where the product would be NaN). */
static inline float df_cpu_x_sigmoid(float x, float u)
{
    float e = df_cpu_expf(-__builtin_fabsf(u));
    float num = u >= 0.0f ? 1.0f : e;
    float s = num / (1.0f + e);
    uint32_t zero = -(uint32_t)(s == 0.0f); /* a mask, not a branch: keeps it vectorised */
    return df_as_f32((df_as_u32(x * s) & ~zero) | (0x80000000u & zero));
}

#if defined(__x86_64__)
#include <immintrin.h>

/* df_cpu_expf on 16 lanes with AVX-512: the same operations in the same order (the build
 * contracts nothing, so the scalar code rounds each step as written), so the same bits. gcc
 * vectorises the scalar form only to the build's AVX2; this is the 16-wide path where the
 * CPU has AVX-512, checked at run time by the caller. */
__attribute__((target("avx512f"))) static inline __m512 df_cpu_expf16(__m512 x)
{
    __mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-104.0f), _CMP_LT_OQ);
    __mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_set1_ps(89.0f), _CMP_GT_OQ);
    x = _mm512_mask_mov_ps(x, lo, _mm512_set1_ps(-104.0f));
    x = _mm512_mask_mov_ps(x, hi, _mm512_set1_ps(89.0f));
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                               _mm512_set1_ps(12582912.0f));
    __m512i n = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4b400000));
    __m512 nf = _mm512_sub_ps(t, _mm512_set1_ps(12582912.0f));
    __m512 r = _mm512_fmadd_ps(nf, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(nf, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    __m512i n1 = _mm512_srai_epi32(n, 1), n2 = _mm512_sub_epi32(n, n1);
    __m512i bias = _mm512_set1_epi32(127);
    __m512 s1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n1, bias), 23));
    __m512 s2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(n2, bias), 23));
    return _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
}

/* df_cpu_x_sigmoid on 16 lanes, the same bits. */
__attribute__((target("avx512f"))) static inline __m512 df_cpu_x_sigmoid16(__m512 x, __m512 u)
{
    __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 e = df_cpu_expf16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(u), sign)));
    __mmask16 neg = _mm512_cmp_ps_mask(u, _mm512_setzero_ps(), _CMP_NGE_UQ); /* !(u >= 0) */
    __m512 num = _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), neg, e);
    __m512 s = _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    __mmask16 zero = _mm512_cmp_ps_mask(s, _mm512_setzero_ps(), _CMP_EQ_OQ);
    return _mm512_mask_mov_ps(_mm512_mul_ps(x, s), zero, _mm512_set1_ps(-0.0f));
}
#endif

/* Converts n elements of any dtype, `stride` elements apart, to dense f32. */
void df_cpu_load_f32(const void *src, df_dtype t, int64_t stride, float *dst, int64_t n);

/* Copies src into dst, two views of the same shape with any strides and dtypes (converted
 * as df_convert does; floats to integers truncate and saturate, NaN -> 0). Uses up to
 * `threads` OpenMP threads. */
void df_cpu_copy_view(const df_view *dst, const df_view *src, int threads);

/* Row statistics of the norms, shared by the standalone norm kernels and the fused kernel's
 * normalisation head so that both give the same bits. */

/* Mean and biased variance of n values, from sums shifted by the first value. */
static inline void df_cpu_row_moments(const float *x, int64_t n, double *mean, double *var)
{
    double k = n > 0 ? x[0] : 0, s = 0, q = 0;
    #pragma omp simd reduction(+ : s, q)
    for (int64_t i = 0; i < n; i++) {
        double v = (double)x[i] - k;
        s += v;
        q += v * v;
    }
    double ms = s / (double)n;
    *mean = k + ms;
    double v = q / (double)n - ms * ms;
    *var = v > 0 ? v : 0;
}

/* 1 / sqrt(mean of squares + eps) of a row: the squares summed in double, the mean
 * rounded to f32, the rest in f32. */
static inline float df_cpu_rms_inverse(const float *restrict x, int64_t d, float eps)
{
    double q = 0;
    #pragma omp simd reduction(+ : q)
    for (int64_t i = 0; i < d; i++)
        q += (double)x[i] * x[i];
    float var = (float)(q / (double)d);
    return 1.0f / sqrtf(var + eps);
}

#endif
