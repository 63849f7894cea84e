/*
 * What the Vulkan backend would otherwise take from the library: op and dtype names for
 * its messages, and the 16-bit float conversions of its host-side ops. The plugin is
 * self-contained, so that it loads into a program linked statically or dynamically alike.
 */
#include <string.h>

#include "backend/vulkan/vk_internal.h"

const char *dvk_op_name(df_op op)
{
    return df_vocab_op_name(op);
}

const char *dvk_dtype_name(df_dtype t)
{
    static const char *const names[] = {"f32", "bf16", "f16", "f64", "i32", "i64", "u8", "i8"};
    return t >= 0 && t < (int)(sizeof names / sizeof *names) ? names[t] : "?";
}

float dvk_bf16_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float dvk_f16_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, em = h & 0x7fffu, u;
    if (em < 0x400u) { /* zero or subnormal: em * 2^-24 */
        float f = (float)em * 0x1p-24f;
        memcpy(&u, &f, 4);
    } else {
        u = (em << 13) + 0x38000000u + (em >= 0x7c00u ? 0x38000000u : 0u);
    }
    u |= sign;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
