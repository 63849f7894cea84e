/*
 * PyTorch-compatible random numbers (torch 1.13 CPU generator, what diffusers users get
 * from torch.Generator("cpu")).
 *
 * The engine is the standard mt19937 (32-bit, standard tempering) seeded with the low 32
 * bits of the seed. torch.randn on a contiguous tensor of n elements takes one of two
 * paths, and so do we:
 *   - n >= 16: every element first gets a uniform drawn from one 32-bit output (24 bits
 *     for float32, 8 bits for bfloat16); each full block of 16 is then turned into
 *     normals by Box-Muller, pairing element j with j+8. When n % 16 != 0 the last 16
 *     elements are drawn again and transformed again, overwriting the tail of the last
 *     full block, exactly as torch's normal_fill does.
 *   - n < 16: element by element from at::normal_distribution<double>, whose uniforms take
 *     53 bits of a 64-bit draw and whose second Box-Muller value is cached in the
 *     generator. The cache survives across calls, also across n >= 16 calls, which do
 *     not touch it.
 * float32 follows torch's AVX2 kernel (the one that produced the reference values): theta
 * = float32(2 pi) * u2 in float32; log, sqrt, cos and sin are float32 libm, which may
 * differ from torch's vectorised versions in the last bit. bfloat16 follows torch's scalar
 * kernel, rounding to bfloat16 after each operation as c10::BFloat16 arithmetic does.
 */
#include "core/rng.h"

#include <math.h>

#include <diffuse/dtype.h>

#include "core/status.h"

#define PI_D 3.14159265358979323846

/* ---- mt19937 ---------------------------------------------------------------------- */

void df_rng_init(df_rng *rng, uint64_t seed)
{
    rng->mt[0] = (uint32_t)(seed & 0xffffffffu);
    for (int i = 1; i < DF_RNG_MT_N; i++) {
        uint32_t prev = rng->mt[i - 1];
        rng->mt[i] = 1812433253u * (prev ^ (prev >> 30)) + (uint32_t)i;
    }
    rng->mt_index = DF_RNG_MT_N;
    rng->has_normal = false;
    rng->next_normal = 0.0;
}

static void regenerate(df_rng *rng)
{
    enum { N = DF_RNG_MT_N, M = 397 };
    uint32_t *mt = rng->mt;
    for (int i = 0; i < N; i++) {
        uint32_t y = (mt[i] & 0x80000000u) | (mt[(i + 1) % N] & 0x7fffffffu);
        mt[i] = mt[(i + M) % N] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    rng->mt_index = 0;
}

uint32_t df_rng_u32(df_rng *rng)
{
    if (rng->mt_index >= DF_RNG_MT_N)
        regenerate(rng);
    uint32_t y = rng->mt[rng->mt_index++];
    y ^= y >> 11;
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= y >> 18;
    return y;
}

uint64_t df_rng_u64(df_rng *rng)
{
    uint64_t hi = df_rng_u32(rng);
    uint64_t lo = df_rng_u32(rng);
    return (hi << 32) | lo;
}

/* ---- the double path (n < 16) ------------------------------------------------------ */

static double uniform_f64(df_rng *rng)
{
    return (double)(df_rng_u64(rng) & ((UINT64_C(1) << 53) - 1)) * 0x1p-53;
}

double df_rng_normal_f64(df_rng *rng)
{
    if (rng->has_normal) {
        rng->has_normal = false;
        return rng->next_normal;
    }
    double u1 = uniform_f64(rng);
    double u2 = uniform_f64(rng);
    double r = sqrt(-2.0 * log1p(-u2));
    double theta = 2.0 * PI_D * u1;
    rng->next_normal = r * sin(theta);
    rng->has_normal = true;
    return r * cos(theta);
}

/* ---- the block path (n >= 16), float32 ---------------------------------------------- */

static float uniform_f32(df_rng *rng)
{
    return (float)(df_rng_u32(rng) & 0xffffffu) * 0x1p-24f;
}

/* d[0..16): uniforms in, normals out; d[j] pairs with d[j+8]. */
static void box_muller16_f32(float *d)
{
    const float two_pi = (float)(2.0 * PI_D);
    for (int j = 0; j < 8; j++) {
        float u1 = 1.0f - d[j]; /* [0, 1) -> (0, 1] for the log */
        float u2 = d[j + 8];
        float radius = sqrtf(-2.0f * logf(u1));
        float theta = two_pi * u2;
        d[j] = radius * cosf(theta);
        d[j + 8] = radius * sinf(theta);
    }
}

df_status df_rng_randn_f32(df_rng *rng, float *out, int64_t n)
{
    if (n < 0 || (n > 0 && !out))
        return df_errorf(DF_E_ARG, "df_rng_randn_f32: %lld elements into %p", (long long)n,
                         (void *)out);
    if (n < 16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = (float)df_rng_normal_f64(rng);
        return DF_OK;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = uniform_f32(rng);
    for (int64_t i = 0; i + 16 <= n; i += 16)
        box_muller16_f32(out + i);
    if (n % 16 != 0) {
        float *tail = out + n - 16;
        for (int i = 0; i < 16; i++)
            tail[i] = uniform_f32(rng);
        box_muller16_f32(tail);
    }
    return DF_OK;
}

/* ---- the block path, bfloat16 -------------------------------------------------------- */

static uint16_t bf16(float x)
{
    return df_f32_to_bf16(x);
}

static float f32(uint16_t x)
{
    return df_bf16_to_f32(x);
}

/* k/256 with k < 256 has at most 8 significant bits: exact in bfloat16. */
static uint16_t uniform_bf16(df_rng *rng)
{
    return bf16((float)(df_rng_u32(rng) & 0xffu) / 256.0f);
}

static void box_muller16_bf16(uint16_t *d)
{
    for (int j = 0; j < 8; j++) {
        float u1 = f32(bf16(1.0f - f32(d[j])));
        float u2 = f32(d[j + 8]);
        float lg = f32(bf16(logf(u1)));
        float radius = f32(bf16(sqrtf(f32(bf16(-2.0f * lg)))));
        float theta = f32(bf16((float)(2.0 * PI_D * (double)u2)));
        d[j] = bf16(radius * f32(bf16(cosf(theta))));
        d[j + 8] = bf16(radius * f32(bf16(sinf(theta))));
    }
}

df_status df_rng_randn_bf16(df_rng *rng, uint16_t *out, int64_t n)
{
    if (n < 0 || (n > 0 && !out))
        return df_errorf(DF_E_ARG, "df_rng_randn_bf16: %lld elements into %p", (long long)n,
                         (void *)out);
    if (n < 16) {
        for (int64_t i = 0; i < n; i++)
            out[i] = bf16((float)df_rng_normal_f64(rng));
        return DF_OK;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = uniform_bf16(rng);
    for (int64_t i = 0; i + 16 <= n; i += 16)
        box_muller16_bf16(out + i);
    if (n % 16 != 0) {
        uint16_t *tail = out + n - 16;
        for (int i = 0; i < 16; i++)
            tail[i] = uniform_bf16(rng);
        box_muller16_bf16(tail);
    }
    return DF_OK;
}
