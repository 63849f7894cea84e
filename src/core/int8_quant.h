/*
 * The int8 weight format: how a value becomes an 8-bit integer and a scale, and how a row of
 * k values is cut into scale groups (docs/int8.md, "The scheme").
 *
 * A row of k values is quantized per group of `group` consecutive values: q =
 * round_half_even(x * 127 / max|x|), clamped to [-127, 127], and scale = max|x| / 127 (0 for
 * a group of zeros). A group that is not a multiple of 4 dividing k gives one group of the
 * whole k, padded with zeros to a multiple of 4.
 *
 * This is the one rule: the CPU backend's products quantize with it (weights on first use,
 * GGUF and fp8 weights requantized block by block, activations on every call), and the
 * public df_int8_quantize, which models/quant_save.c writes saved folders with, is it, so a
 * saved folder holds the same bytes as quantizing on load. The saved tiles are
 * core/int8_tiles.h; how a backend packs the values for its kernels is its own.
 */
#ifndef DF_CORE_INT8_QUANT_H
#define DF_CORE_INT8_QUANT_H

#include <math.h>
#include <stdint.h>

/* A group larger than any k: the whole k (what a public group of 0 means). */
#define DF_I8_WHOLE_K (INT64_MAX / 2)

/* How a row of k values is grouped: the group size, k padded to whole groups (kp, a multiple
 * of 4), and the number of groups. */
typedef struct df_i8_groups {
    int64_t group, kp, n_groups;
} df_i8_groups;

/* The grouping of k for a requested group (<= 0: 128; DF_I8_WHOLE_K: the whole k): `group`
 * when it is a multiple of 4 below k that divides it, else the whole k. */
df_i8_groups df_i8_groups_of(int64_t k, int64_t group);

/* The group size alone (df_i8_groups_of's .group). */
int64_t df_i8_group_for(int64_t k, int64_t group);

/* The group int8 compute uses when no setting names one: DIFFUSE_INT8_GROUP (32 to 256, a
 * multiple of 4; "k": DF_I8_WHOLE_K), else 128. Read once. */
int64_t df_i8_default_group(void);

/* One value with the inverse scale of its group (127 / max|x|, or 0): the rounding rule.
 * Inline, for the activation quantizers' loops. */
static inline int df_i8_round(float x, float inv)
{
    float q = nearbyintf(x * inv);
    q = q > 127.0f ? 127.0f : q < -127.0f ? -127.0f : q;
    return (int)q;
}

/* One row: `row` (kp f32 values, zero past k) into q (kp values) and the n_groups scales. */
void df_i8_quantize_channel(const float *row, int64_t group, int64_t n_groups, int8_t *q,
                            float *scale);

#endif
