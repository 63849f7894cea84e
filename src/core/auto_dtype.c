/*
 * The compute dtype that `--dtype auto` picks, from the device's measured matrix product
 * rates (df_ctx_matmul_rates) and the checkpoint's dtype.
 *
 * Feature flags do not say whether bf16 pays: oneDNN's bf16 products run about twice its
 * f32 rate on an AMD EPYC with AVX512-BF16 and no AMX, but 0.6x on an Intel Xeon with the
 * same flags, and 4-6x with AMX. So the device measures, and bf16 is chosen only where it is
 * clearly faster - at least 1.25x, since it costs precision and a product is only part of a
 * step - and only for bf16 checkpoints: an f32 or f16 checkpoint asks for more precision
 * than bf16 keeps (the user can still ask for --dtype bf16).
 */
#include <stdio.h>

#include <diffuse/runtime.h>

#define BF16_WORTH 1.25 /* the least bf16 / f32 rate ratio that picks bf16 */

df_dtype df_dtype_auto(const df_matmul_rates *r, df_dtype weights, char *why, size_t cap)
{
    char dummy[8];
    if (!why || cap == 0) {
        why = dummy;
        cap = sizeof dummy;
    }
    if (!r || !(r->f32_gflops > 0)) {
        snprintf(why, cap, "the device does not say how fast its bf16 products are");
        return DF_DTYPE_F32;
    }
    double f32 = r->f32_gflops, bf16 = r->bf16_gflops, ratio = bf16 / f32;
    if (!(bf16 > 0)) {
        snprintf(why, cap, "the device has no bf16 matrix products (f32 %.0f GFLOP/s; %s)", f32,
                 r->how);
        return DF_DTYPE_F32;
    }
    if (!(ratio >= BF16_WORTH)) {
        snprintf(why, cap,
                 "bf16 products are not clearly faster here: %.0f against f32's "
                 "%.0f GFLOP/s (%.2fx, under %.2fx; %s)",
                 bf16, f32, ratio, BF16_WORTH, r->how);
        return DF_DTYPE_F32;
    }
    if (weights != DF_DTYPE_BF16) {
        snprintf(why, cap,
                 "bf16 products are %.2fx faster here (%.0f against %.0f GFLOP/s; "
                 "%s), but the checkpoint's weights are %s, not bf16 (bf16 compute is chosen "
                 "only for bf16 checkpoints)",
                 ratio, bf16, f32, r->how,
                 weights == DF_DTYPE_COUNT ? "of unknown dtype" : df_dtype_name(weights));
        return DF_DTYPE_F32;
    }
    snprintf(why, cap,
             "the checkpoint stores bf16 weights and bf16 products are %.2fx faster "
             "here (%.0f against %.0f GFLOP/s; %s)",
             ratio, bf16, f32, r->how);
    return DF_DTYPE_BF16;
}
