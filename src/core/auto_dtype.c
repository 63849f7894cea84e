/*
 * The compute dtype that `--dtype auto` picks, from the CPU's features (read at run time,
 * df_cpu_features_get) and the checkpoint's dtype.
 *
 * bf16 compute is only worth its lost precision where the hardware multiplies bf16 much
 * faster than f32: AMX-BF16 tiles (4-6x oneDNN's f32 rate). With AVX512-BF16 alone oneDNN's
 * bf16 products are not reliably faster (measured from 145 against 231 GFLOP/s for f32 to
 * about twice the f32 rate, by shape and load), and without either bf16 is emulated. bf16
 * compute is also chosen only for bf16 checkpoints: an f32 or f16 checkpoint asks for more
 * precision than bf16 keeps.
 */
#include <diffuse/cpu.h>

df_dtype df_cpu_auto_dtype(const df_cpu_features *cpu, df_dtype weights, const char **why)
{
    const char *reason;
    df_dtype pick = DF_DTYPE_F32;
    if (cpu->amx_bf16 && weights == DF_DTYPE_BF16) {
        pick = DF_DTYPE_BF16;
        reason = "the checkpoint stores bf16 weights and this CPU has AMX-BF16, where "
                 "bf16 products are several times faster than f32";
    } else if (cpu->amx_bf16) {
        reason = "this CPU has AMX-BF16, but the checkpoint's weights are not bf16 (bf16 "
                 "compute is chosen only for bf16 checkpoints)";
    } else if (cpu->avx512_bf16) {
        reason = "this CPU has AVX512-BF16 but no AMX-BF16; there bf16 products are not "
                 "reliably faster than f32 and lose precision";
    } else {
        reason = "this CPU has no native bf16 products (no AMX-BF16 or AVX512-BF16); "
                 "bf16 would be emulated and slower";
    }
    if (why)
        *why = reason;
    return pick;
}
