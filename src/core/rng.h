/*
 * Internal side of the PyTorch-compatible generator: the raw draws the normal samplers are
 * built from, for code that needs torch's other distributions and for tests.
 */
#ifndef DF_CORE_RNG_H
#define DF_CORE_RNG_H

#include <diffuse/rng.h>

/* One mt19937 output (torch's generator->random()). */
uint32_t df_rng_u32(df_rng *rng);

/* Two outputs, the first in the high half (torch's generator->random64()). */
uint64_t df_rng_u64(df_rng *rng);

/* One value of torch's at::normal_distribution<double>(0, 1): the cached value if there is
 * one (clearing it), else a fresh Box-Muller pair whose sine half is cached. */
double df_rng_normal_f64(df_rng *rng);

#endif
