/*
 * The x86 micro-kernels of the int8 products (see gemm_int8_impl.h for what a tile is).
 *
 * vpdpbusd adds, in each 32-bit lane, the four products of u8 activations (one 4-byte
 * broadcast per row) with s8 weights (a packed quad of 4 k for each of 16 or 8 channels).
 * - AVX512-VNNI: an 8 x 32 tile, 16 int32 accumulators in zmm registers, the f32 tile in L1.
 * - AVX-VNNI (256-bit): two rows at a time, 8 int32 accumulators in ymm registers (there
 *   are 16), the f32 tile in memory. Compiled twice: VEX-encoded for CPUs with AVX-VNNI,
 *   and EVEX-encoded (AVX512-VNNI + VL) so that it is also tested on AVX-512 CPUs.
 * - AVX2 (no VNNI): vpmaddubsw + vpmaddwd on signed activations, two rows at a time.
 * Each is chosen only when cpuid says the CPU has its instructions.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "backend/cpu/gemm_int8_impl.h"

#if defined(__x86_64__) || defined(__i386__)

/*
 * 8 rows x 32 channels: 16 int32 accumulators, so that each pair of weight loads feeds 16
 * vpdpbusd and 16 independent chains hide its latency on both vector ports. The f32 tile
 * (16 more registers would spill) is added to once per group, in L1.
 */
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
tile_avx512vnni(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR])
{
    const df_i8_weight *w = t->w;
    const int8_t *bq = w->q + t->block * (w->kp / 4) * DF_I8_NR * 4;
    int64_t gq = w->group / 4;
    for (int64_t g = t->q0 / gq; g * gq < t->q1; g++) {
        int64_t qs, qe;
        df_i8_group_span(t, g, gq, &qs, &qe);
        const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;
        const int32_t *wc = w->corr + (t->block * w->n_groups + g) * DF_I8_NR;
        __m512i acc[DF_I8_MR][2];
#pragma GCC unroll 8
        for (int r = 0; r < DF_I8_MR; r++) {
            const int32_t *from = qs == g * gq ? wc : t->part[r];
            acc[r][0] = _mm512_loadu_si512(from), acc[r][1] = _mm512_loadu_si512(from + 16);
        }
        const uint8_t *a[DF_I8_MR];
#pragma GCC unroll 8
        for (int r = 0; r < DF_I8_MR; r++)
            a[r] = t->rows[r];
#pragma GCC unroll 2 /* two quads a step: measured 2-4% faster */
        for (int64_t q = qs; q < qe; q++) {
            __m512i b0 = _mm512_loadu_si512(bq + q * 128);
            __m512i b1 = _mm512_loadu_si512(bq + q * 128 + 64);
#pragma GCC unroll 8
            for (int r = 0; r < DF_I8_MR; r++) {
                int32_t x;
                memcpy(&x, a[r] + q * 4, 4);
                __m512i v = _mm512_set1_epi32(x);
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], v, b0);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], v, b1);
            }
        }
        if (qe < (g + 1) * gq) { /* the group goes on in the next piece */
#pragma GCC unroll 8
            for (int r = 0; r < DF_I8_MR; r++) {
                _mm512_storeu_si512(t->part[r], acc[r][0]);
                _mm512_storeu_si512(t->part[r] + 16, acc[r][1]);
            }
            continue;
        }
        __m512 s0 = _mm512_loadu_ps(ws), s1 = _mm512_loadu_ps(ws + 16);
#pragma GCC unroll 8
        for (int r = 0; r < DF_I8_MR; r++) {
            __m512 as = _mm512_set1_ps(t->scales[r][g]);
            _mm512_storeu_ps(tile[r], _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]),
                                                      _mm512_mul_ps(s0, as),
                                                      _mm512_loadu_ps(tile[r])));
            _mm512_storeu_ps(tile[r] + 16, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]),
                                                           _mm512_mul_ps(s1, as),
                                                           _mm512_loadu_ps(tile[r] + 16)));
        }
    }
}

/* The 256-bit kernel's body; DPBUSD is the VEX or the EVEX form. */
#define TILE_256(DPBUSD)                                                                           \
    const df_i8_weight *w = t->w;                                                                  \
    const int8_t *bq = w->q + t->block * (w->kp / 4) * DF_I8_NR * 4;                               \
    int64_t gq = w->group / 4;                                                                     \
    for (int rp = 0; rp < DF_I8_MR; rp += 2) {                                                     \
        for (int64_t g = t->q0 / gq; g * gq < t->q1; g++) {                                        \
            int64_t qs, qe;                                                                        \
            df_i8_group_span(t, g, gq, &qs, &qe);                                                  \
            const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;                  \
            const int32_t *wc = w->corr + (t->block * w->n_groups + g) * DF_I8_NR;                 \
            __m256i acc[2][4];                                                                     \
            for (int r = 0; r < 2; r++)                                                            \
                for (int j = 0; j < 4; j++)                                                        \
                    acc[r][j] = _mm256_loadu_si256(                                                \
                        (const __m256i *)((qs == g * gq ? wc : t->part[rp + r]) + 8 * j));         \
            const uint8_t *a0 = t->rows[rp], *a1 = t->rows[rp + 1];                                \
            for (int64_t q = qs; q < qe; q++) {                                                    \
                const int8_t *b = bq + q * 128;                                                    \
                __m256i b0 = _mm256_loadu_si256((const __m256i *)b);                               \
                __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + 32));                        \
                __m256i b2 = _mm256_loadu_si256((const __m256i *)(b + 64));                        \
                __m256i b3 = _mm256_loadu_si256((const __m256i *)(b + 96));                        \
                int32_t x0, x1;                                                                    \
                memcpy(&x0, a0 + q * 4, 4);                                                        \
                memcpy(&x1, a1 + q * 4, 4);                                                        \
                __m256i v = _mm256_set1_epi32(x0);                                                 \
                acc[0][0] = DPBUSD(acc[0][0], v, b0);                                              \
                acc[0][1] = DPBUSD(acc[0][1], v, b1);                                              \
                acc[0][2] = DPBUSD(acc[0][2], v, b2);                                              \
                acc[0][3] = DPBUSD(acc[0][3], v, b3);                                              \
                v = _mm256_set1_epi32(x1);                                                         \
                acc[1][0] = DPBUSD(acc[1][0], v, b0);                                              \
                acc[1][1] = DPBUSD(acc[1][1], v, b1);                                              \
                acc[1][2] = DPBUSD(acc[1][2], v, b2);                                              \
                acc[1][3] = DPBUSD(acc[1][3], v, b3);                                              \
            }                                                                                      \
            END_GROUP_256(acc)                                                                     \
        }                                                                                          \
    }

/* A 256-bit kernel's group end: its sums into part when the piece cut it, else into the
 * f32 tile. */
#define END_GROUP_256(acc)                                                                         \
    for (int r = 0; r < 2; r++) {                                                                  \
        if (qe < (g + 1) * gq) {                                                                   \
            for (int j = 0; j < 4; j++)                                                            \
                _mm256_storeu_si256((__m256i *)(t->part[rp + r] + 8 * j), acc[r][j]);              \
            continue;                                                                              \
        }                                                                                          \
        __m256 as = _mm256_set1_ps(t->scales[rp + r][g]);                                          \
        for (int j = 0; j < 4; j++) {                                                              \
            float *o = tile[rp + r] + 8 * j;                                                       \
            __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * j), as);                             \
            _mm256_storeu_ps(                                                                      \
                o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][j]), s, _mm256_loadu_ps(o)));         \
        }                                                                                          \
    }

#if defined(__GNUC__) && __GNUC__ >= 11
__attribute__((target("avx2,fma,avxvnni"))) static void
tile_avxvnni_vex(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR])
{
    TILE_256(_mm256_dpbusd_avx_epi32)
}
#define HAVE_VEX_VNNI 1
#endif

__attribute__((target("avx2,fma,avx512f,avx512vl,avx512vnni"))) static void
tile_avxvnni_evex(const df_i8_tile_args *t,
                  float tile[DF_I8_MR][DF_I8_NR]){TILE_256(_mm256_dpbusd_epi32)}

/*
 * AVX2 without VNNI. vpmaddubsw multiplies u8 by s8 and adds pairs into saturating s16,
 * which the shifted activations (up to 255 x 127, twice) would overflow, so the kernel
 * takes the activations back to signed (a - 128, in [-127, 127]) and multiplies |w| (as
 * u8, so a stored -128 is 128) by a with w's sign (vpsignb): a pair is at most
 * 2 x 128 x 127 = 32512, exact. vpmaddwd by ones adds the pairs into each channel's int32
 * lane. The sum of (a - 128) w is the VNNI kernels' corr + sum of a w, the same integer,
 * so no correction is added and the f32 part is theirs, in the same order: the results
 * are the same bits.
 */
__attribute__((target("avx2,fma"))) static void tile_avx2(const df_i8_tile_args *t,
                                                          float tile[DF_I8_MR][DF_I8_NR])
{
    const df_i8_weight *w = t->w;
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    const int8_t *bq = w->q + t->block * (w->kp / 4) * DF_I8_NR * 4;
    int64_t gq = w->group / 4;
    for (int rp = 0; rp < DF_I8_MR; rp += 2) {
        for (int64_t g = t->q0 / gq; g * gq < t->q1; g++) {
            int64_t qs, qe;
            df_i8_group_span(t, g, gq, &qs, &qe);
            const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;
            /* the sum of (a - 128) w is corr + the sum of a w: a group starts from 0, and
             * the sums it leaves in part are the VNNI kernels' less corr */
            __m256i acc[2][4];
            for (int r = 0; r < 2; r++)
                for (int j = 0; j < 4; j++) {
                    const __m256i *carried = (const __m256i *)(t->part[rp + r] + 8 * j);
                    acc[r][j] = qs == g * gq ? _mm256_setzero_si256() : _mm256_loadu_si256(carried);
                }
            const uint8_t *a0 = t->rows[rp], *a1 = t->rows[rp + 1];
            for (int64_t q = qs; q < qe; q++) {
                const int8_t *b = bq + q * 128;
                __m256i bv[4], ba[4];
                for (int j = 0; j < 4; j++) {
                    bv[j] = _mm256_loadu_si256((const __m256i *)(b + 32 * j));
                    ba[j] = _mm256_abs_epi8(bv[j]); /* |w| as u8: -128 gives 128 */
                }
                int32_t x[2];
                memcpy(&x[0], a0 + q * 4, 4);
                memcpy(&x[1], a1 + q * 4, 4);
                for (int r = 0; r < 2; r++) {
                    __m256i v = _mm256_xor_si256(_mm256_set1_epi32(x[r]), flip); /* a - 128 */
                    for (int j = 0; j < 4; j++) {
                        __m256i p = _mm256_maddubs_epi16(ba[j], _mm256_sign_epi8(v, bv[j]));
                        acc[r][j] = _mm256_add_epi32(acc[r][j], _mm256_madd_epi16(p, ones));
                    }
                }
            }
            END_GROUP_256(acc)
        }
    }
}

/*
 * One row of activations quantized by the rule of df_i8_round, 16 values at a time: the
 * same max|x| (max is exact in any order; a NaN is skipped as fmaxf skips it), the same
 * scale and inverse computed by the scalar code, nearbyint as vrndscaleps in the current
 * rounding mode, the clamp ordered so that a NaN reaches the conversion as it does in C,
 * and the low byte of q + 128 stored: the same bytes as the scalar loop.
 */
/* Bytes ahead of the values being read that the quantizer asks for: the activations come
 * from memory (a [1536, 12288] f32 input is 75 MB), and the hardware prefetcher alone left
 * the loop waiting on them (1.5 G values/s from memory, 3.2 from L1); prefetching 4 KiB
 * ahead gave 2.8-3.0 G values/s on one core of the AVX512-VNNI Xeon. A prefetch past the end
 * of x is harmless (it never faults). */
#define QUANT_PREFETCH 4096

__attribute__((target("avx512f,avx512bw,avx512vl"))) static void
quantize_row_avx512(const void *x, bool bf16, int64_t k, int64_t group, int64_t n_groups,
                    uint8_t *q, float *sc)
{
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    const __m512i shift = _mm512_set1_epi32(128);
    for (int64_t g = 0; g < n_groups; g++) {
        int64_t k0 = g * group, end = k0 + group;
        __m512 vmax = _mm512_setzero_ps();
        for (int64_t i = k0; i < end; i += 16) {
            int64_t valid = k - i < 16 ? k - i : 16;
            __mmask16 m = valid <= 0 ? 0 : (__mmask16)((1u << valid) - 1);
            __m512 v = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                      m, (const uint16_t *)x + i)),
                                  16))
                            : _mm512_maskz_loadu_ps(m, (const float *)x + i);
            vmax = _mm512_max_ps(_mm512_abs_ps(v), vmax);
            uintptr_t ahead = (uintptr_t)x + (uintptr_t)i * (bf16 ? 2 : 4) + QUANT_PREFETCH;
            _mm_prefetch((const char *)ahead, _MM_HINT_T0);
        }
        float amax = _mm512_reduce_max_ps(vmax);
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        sc[g] = amax / 127.0f;
        __m512 vinv = _mm512_set1_ps(inv);
        for (int64_t i = k0; i < end; i += 16) {
            int64_t valid = k - i < 16 ? k - i : 16, n = end - i < 16 ? end - i : 16;
            __mmask16 m = valid <= 0 ? 0 : (__mmask16)((1u << valid) - 1);
            __m512 v = bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                  _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(
                                      m, (const uint16_t *)x + i)),
                                  16))
                            : _mm512_maskz_loadu_ps(m, (const float *)x + i);
            __m512 r = _mm512_roundscale_ps(_mm512_mul_ps(v, vinv),
                                            _MM_FROUND_CUR_DIRECTION | _MM_FROUND_NO_EXC);
            r = _mm512_min_ps(hi, _mm512_max_ps(lo, r));
            __m512i u = _mm512_add_epi32(_mm512_cvttps_epi32(r), shift);
            _mm_mask_storeu_epi8(q + i, (__mmask16)((1u << n) - 1), _mm512_cvtepi32_epi8(u));
        }
    }
}

df_i8_quantize_row_fn df_i8_quantize_row_avx512_fn(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vl")
               ? quantize_row_avx512
               : NULL;
}

df_i8_tile_fn df_i8_tile_avx2_fn(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? tile_avx2 : NULL;
}

df_i8_tile_fn df_i8_tile_avx512vnni_fn(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                   __builtin_cpu_supports("avx512vnni")
               ? tile_avx512vnni
               : NULL;
}

df_i8_tile_fn df_i8_tile_avxvnni_fn(void)
{
    __builtin_cpu_init();
#ifdef HAVE_VEX_VNNI
    if (__builtin_cpu_supports("avxvnni"))
        return tile_avxvnni_vex;
#endif
    if (__builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
        return tile_avxvnni_evex;
    return NULL;
}

#else

df_i8_quantize_row_fn df_i8_quantize_row_avx512_fn(void)
{
    return NULL;
}

df_i8_tile_fn df_i8_tile_avx2_fn(void)
{
    return NULL;
}

df_i8_tile_fn df_i8_tile_avx512vnni_fn(void)
{
    return NULL;
}

df_i8_tile_fn df_i8_tile_avxvnni_fn(void)
{
    return NULL;
}

#endif
