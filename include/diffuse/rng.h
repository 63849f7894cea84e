/*
 * Random numbers that match PyTorch's CPU generator.
 *
 * A df_rng holds what torch.Generator("cpu").manual_seed(seed) holds: an mt19937 engine
 * seeded with the low 32 bits of the seed, and the cached second value of the double-
 * precision Box-Muller path. df_rng_randn_f32/_bf16 draw exactly the numbers
 * torch.randn(n, generator=g, dtype=...) draws for a contiguous tensor of n elements, so
 * a seed gives diffusers' own starting noise. Draws continue the stream: two calls on one
 * generator give what two torch.randn calls on one generator give.
 *
 * The struct is plain data: declare one, df_rng_init() it, copy it to fork a stream.
 */
#ifndef DIFFUSE_RNG_H
#define DIFFUSE_RNG_H

#include <stdbool.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_RNG_MT_N 624

typedef struct df_rng {
    uint32_t mt[DF_RNG_MT_N]; /* mt19937 state */
    int mt_index;             /* next word of mt[] to temper; DF_RNG_MT_N = regenerate */
    bool has_normal;          /* a cached normal from the double path is waiting */
    double next_normal;
} df_rng;

/* Sets `rng` to the state of torch.Generator("cpu").manual_seed(seed). Only the low 32
 * bits of the seed matter (as in torch: 2**32 + 5 gives the numbers of 5). */
DF_API void df_rng_init(df_rng *rng, uint64_t seed);

/*
 * Fills out[0..n) with standard normal float32 values, as torch.randn((n,),
 * dtype=torch.float32) draws them: n >= 16 takes torch's block Box-Muller (float32 math,
 * the last 16 refilled when n % 16 != 0); n < 16 takes the double path, one value at a
 * time, with the cached second value. The shape does not matter, only the element count.
 * Fails with DF_E_ARG when n < 0 or out is NULL with n > 0.
 */
DF_API df_status df_rng_randn_f32(df_rng *rng, float *out, int64_t n);

/* Same for torch.randn(..., dtype=torch.bfloat16), which torch draws natively in bfloat16
 * (not the float32 stream rounded). out receives bf16 bit patterns. */
DF_API df_status df_rng_randn_bf16(df_rng *rng, uint16_t *out, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
