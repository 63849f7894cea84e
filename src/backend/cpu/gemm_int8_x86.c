/*
 * The x86 micro-kernels of the int8 products (see gemm_int8_impl.h for what a tile is).
 *
 * vpdpbusd adds, in each 32-bit lane, the four products of u8 activations (one 4-byte
 * broadcast per row) with s8 weights (a packed quad of 4 k for each of 16 or 8 channels).
 * - AVX512-VNNI: a 4 x 32 tile, 8 int32 and 8 f32 accumulators in zmm registers.
 * - AVX-VNNI (256-bit): two rows at a time, 8 int32 accumulators in ymm registers (there
 *   are 16), the f32 tile in memory. Compiled twice: VEX-encoded for CPUs with AVX-VNNI,
 *   and EVEX-encoded (AVX512-VNNI + VL) so that it is also tested on AVX-512 CPUs.
 * - AVX2 (no VNNI): vpmaddubsw + vpmaddwd on signed activations, two rows at a time.
 * Each is chosen only when cpuid says the CPU has its instructions.
 */
#include <immintrin.h>
#include <string.h>

#include "backend/cpu/gemm_int8_impl.h"

#if defined(__x86_64__) || defined(__i386__)

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void
tile_avx512vnni(const df_i8_tile_args *t, float tile[DF_I8_MR][DF_I8_NR])
{
    const df_i8_weight *w = t->w;
    __m512 f[DF_I8_MR][2];
#pragma GCC unroll 4
    for (int r = 0; r < DF_I8_MR; r++)
        f[r][0] = f[r][1] = _mm512_setzero_ps();
    int64_t quads = w->group / 4;
    for (int64_t g = 0; g < w->n_groups; g++) {
        const int8_t *bq = w->q + (t->block * (w->kp / 4) + g * quads) * DF_I8_NR * 4;
        const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;
        const int32_t *wc = w->corr + (t->block * w->n_groups + g) * DF_I8_NR;
        __m512i c0 = _mm512_loadu_si512(wc), c1 = _mm512_loadu_si512(wc + 16);
        __m512i acc[DF_I8_MR][2];
#pragma GCC unroll 4
        for (int r = 0; r < DF_I8_MR; r++)
            acc[r][0] = c0, acc[r][1] = c1;
        const uint8_t *a0 = t->rows[0] + g * w->group, *a1 = t->rows[1] + g * w->group;
        const uint8_t *a2 = t->rows[2] + g * w->group, *a3 = t->rows[3] + g * w->group;
        for (int64_t q = 0; q < quads; q++) {
            __m512i b0 = _mm512_loadu_si512(bq + q * 128);
            __m512i b1 = _mm512_loadu_si512(bq + q * 128 + 64);
            int32_t x0, x1, x2, x3;
            memcpy(&x0, a0 + q * 4, 4);
            memcpy(&x1, a1 + q * 4, 4);
            memcpy(&x2, a2 + q * 4, 4);
            memcpy(&x3, a3 + q * 4, 4);
            __m512i v = _mm512_set1_epi32(x0);
            acc[0][0] = _mm512_dpbusd_epi32(acc[0][0], v, b0);
            acc[0][1] = _mm512_dpbusd_epi32(acc[0][1], v, b1);
            v = _mm512_set1_epi32(x1);
            acc[1][0] = _mm512_dpbusd_epi32(acc[1][0], v, b0);
            acc[1][1] = _mm512_dpbusd_epi32(acc[1][1], v, b1);
            v = _mm512_set1_epi32(x2);
            acc[2][0] = _mm512_dpbusd_epi32(acc[2][0], v, b0);
            acc[2][1] = _mm512_dpbusd_epi32(acc[2][1], v, b1);
            v = _mm512_set1_epi32(x3);
            acc[3][0] = _mm512_dpbusd_epi32(acc[3][0], v, b0);
            acc[3][1] = _mm512_dpbusd_epi32(acc[3][1], v, b1);
        }
        __m512 s0 = _mm512_loadu_ps(ws), s1 = _mm512_loadu_ps(ws + 16);
#pragma GCC unroll 4
        for (int r = 0; r < DF_I8_MR; r++) {
            __m512 as = _mm512_set1_ps(t->scales[r][g]);
            f[r][0] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][0]), _mm512_mul_ps(s0, as), f[r][0]);
            f[r][1] =
                _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][1]), _mm512_mul_ps(s1, as), f[r][1]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < DF_I8_MR; r++) {
        _mm512_storeu_ps(tile[r], f[r][0]);
        _mm512_storeu_ps(tile[r] + 16, f[r][1]);
    }
}

/* The 256-bit kernel's body; DPBUSD is the VEX or the EVEX form. */
#define TILE_256(DPBUSD)                                                                           \
    const df_i8_weight *w = t->w;                                                                  \
    memset(tile, 0, sizeof(float) * DF_I8_MR * DF_I8_NR);                                          \
    int64_t quads = w->group / 4;                                                                  \
    for (int rp = 0; rp < DF_I8_MR; rp += 2) {                                                     \
        for (int64_t g = 0; g < w->n_groups; g++) {                                                \
            const int8_t *bq = w->q + (t->block * (w->kp / 4) + g * quads) * DF_I8_NR * 4;         \
            const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;                  \
            const int32_t *wc = w->corr + (t->block * w->n_groups + g) * DF_I8_NR;                 \
            __m256i acc[2][4];                                                                     \
            for (int j = 0; j < 4; j++)                                                            \
                acc[0][j] = acc[1][j] = _mm256_loadu_si256((const __m256i *)(wc + 8 * j));         \
            const uint8_t *a0 = t->rows[rp] + g * w->group;                                        \
            const uint8_t *a1 = t->rows[rp + 1] + g * w->group;                                    \
            for (int64_t q = 0; q < quads; q++) {                                                  \
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
            for (int r = 0; r < 2; r++) {                                                          \
                __m256 as = _mm256_set1_ps(t->scales[rp + r][g]);                                  \
                for (int j = 0; j < 4; j++) {                                                      \
                    float *o = tile[rp + r] + 8 * j;                                               \
                    __m256 s = _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * j), as);                     \
                    _mm256_storeu_ps(                                                              \
                        o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][j]), s, _mm256_loadu_ps(o))); \
                }                                                                                  \
            }                                                                                      \
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
    memset(tile, 0, sizeof(float) * DF_I8_MR * DF_I8_NR);
    const __m256i ones = _mm256_set1_epi16(1), flip = _mm256_set1_epi8((char)0x80);
    int64_t quads = w->group / 4;
    for (int rp = 0; rp < DF_I8_MR; rp += 2) {
        for (int64_t g = 0; g < w->n_groups; g++) {
            const int8_t *bq = w->q + (t->block * (w->kp / 4) + g * quads) * DF_I8_NR * 4;
            const float *ws = w->scale + (t->block * w->n_groups + g) * DF_I8_NR;
            __m256i acc[2][4];
            for (int j = 0; j < 4; j++)
                acc[0][j] = acc[1][j] = _mm256_setzero_si256();
            const uint8_t *a0 = t->rows[rp] + g * w->group;
            const uint8_t *a1 = t->rows[rp + 1] + g * w->group;
            for (int64_t q = 0; q < quads; q++) {
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
            for (int r = 0; r < 2; r++) {
                __m256 as = _mm256_set1_ps(t->scales[rp + r][g]);
                for (int j = 0; j < 4; j++) {
                    float *o = tile[rp + r] + 8 * j;
                    __m256 sc = _mm256_mul_ps(_mm256_loadu_ps(ws + 8 * j), as);
                    _mm256_storeu_ps(
                        o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r][j]), sc, _mm256_loadu_ps(o)));
                }
            }
        }
    }
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
