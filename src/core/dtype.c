/*
 * Element types.
 *
 * bf16 is the upper half of an f32; rounding adds 0x7fff plus the lowest kept bit, which
 * rounds to nearest even, and NaNs are kept quiet instead of rounding into infinity.
 * f16 conversion is done bit by bit so that subnormals and overflow are exact without
 * depending on the compiler's _Float16 support. The fp8 formats are widened by value
 * (e4m3fn) or as the upper byte of an f16 (e5m2), both exact.
 */
#include <diffuse/dtype.h>

#include <math.h>
#include <string.h>

#include "core/status.h"

size_t df_dtype_size(df_dtype t)
{
    switch (t) {
    case DF_DTYPE_F32:  return 4;
    case DF_DTYPE_BF16: return 2;
    case DF_DTYPE_F16:  return 2;
    case DF_DTYPE_F64:  return 8;
    case DF_DTYPE_I32:  return 4;
    case DF_DTYPE_I64:  return 8;
    case DF_DTYPE_U8:   return 1;
    case DF_DTYPE_I8:   return 1;
    case DF_DTYPE_COUNT: break;
    }
    return 0;
}

static const char *const names[DF_DTYPE_COUNT] = {"f32", "bf16", "f16", "f64",
                                                   "i32", "i64",  "u8",  "i8"};

const char *df_dtype_name(df_dtype t)
{
    return (unsigned)t < DF_DTYPE_COUNT ? names[t] : "?";
}

int df_dtype_parse(const char *name, df_dtype *out)
{
    static const struct {
        const char *name;
        df_dtype t;
    } aliases[] = {{"float32", DF_DTYPE_F32}, {"bfloat16", DF_DTYPE_BF16},
                   {"float16", DF_DTYPE_F16}, {"float64", DF_DTYPE_F64},
                   {"int8", DF_DTYPE_I8}};
    for (int i = 0; i < DF_DTYPE_COUNT; i++) {
        if (strcmp(name, names[i]) == 0) {
            *out = (df_dtype)i;
            return 1;
        }
    }
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++) {
        if (strcmp(name, aliases[i].name) == 0) {
            *out = aliases[i].t;
            return 1;
        }
    }
    return 0;
}

uint16_t df_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN, sign kept */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float df_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t df_f32_to_f16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((abs >> 13) & 0x3ffu)); /* NaN */
    if (abs >= 0x477ff000u)                                        /* rounds to >= 65520 */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) { /* below the smallest normal f16: subnormal or zero */
        if (abs < 0x33000000u)
            return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
        int shift = 113 - (int)(abs >> 23) + 13; /* 126 - exp + 1 ... into 10 bits */
        uint32_t r = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t h = ((abs - 0x38000000u) >> 13); /* rebias 127 -> 15 */
    uint32_t rem = abs & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

float df_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exp = (x >> 10) & 0x1fu;
    uint32_t mant = x & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: value = mant * 2^-24 */
            float f = (float)mant * 0x1p-24f;
            memcpy(&u, &f, 4);
            u |= sign;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float df_f8_e4m3_to_f32(uint8_t x)
{
    float sign = (x & 0x80u) ? -1.0f : 1.0f;
    unsigned exp = (x >> 3) & 0x0fu, mant = x & 0x07u;
    if (exp == 0x0f && mant == 0x07)
        return sign * NAN;
    if (exp == 0) /* subnormal: mant * 2^-9 */
        return sign * (float)mant * 0x1p-9f;
    return sign * ldexpf(1.0f + (float)mant * 0.125f, (int)exp - 7);
}

float df_f8_e5m2_to_f32(uint8_t x)
{
    return df_f16_to_f32((uint16_t)(x << 8));
}

static double load_one(const void *src, df_dtype t, int64_t i)
{
    switch (t) {
    case DF_DTYPE_F32:  return ((const float *)src)[i];
    case DF_DTYPE_BF16: return df_bf16_to_f32(((const uint16_t *)src)[i]);
    case DF_DTYPE_F16:  return df_f16_to_f32(((const uint16_t *)src)[i]);
    case DF_DTYPE_F64:  return ((const double *)src)[i];
    case DF_DTYPE_I32:  return ((const int32_t *)src)[i];
    case DF_DTYPE_I64:  return (double)((const int64_t *)src)[i];
    case DF_DTYPE_U8:   return ((const uint8_t *)src)[i];
    case DF_DTYPE_I8:   return ((const int8_t *)src)[i];
    case DF_DTYPE_COUNT: break;
    }
    return 0;
}

/* Float to integer: truncation toward zero, NaN to 0, out-of-range values clamped (a plain
 * cast would be undefined behaviour there). */
static double to_int_range(double v, double lo, double hi)
{
    if (v != v)
        return 0;
    return v < lo ? lo : v > hi ? hi : v;
}

static void store_one(void *dst, df_dtype t, int64_t i, double v)
{
    switch (t) {
    case DF_DTYPE_F32:  ((float *)dst)[i] = (float)v; break;
    case DF_DTYPE_BF16: ((uint16_t *)dst)[i] = df_f32_to_bf16((float)v); break;
    case DF_DTYPE_F16:  ((uint16_t *)dst)[i] = df_f32_to_f16((float)v); break;
    case DF_DTYPE_F64:  ((double *)dst)[i] = v; break;
    case DF_DTYPE_I32:  ((int32_t *)dst)[i] = (int32_t)to_int_range(v, -2147483648.0, 2147483647.0); break;
    case DF_DTYPE_I64:
        ((int64_t *)dst)[i] = (int64_t)to_int_range(v, -9223372036854775808.0, 9223372036854774784.0);
        break;
    case DF_DTYPE_U8:   ((uint8_t *)dst)[i] = (uint8_t)to_int_range(v, 0, 255); break;
    case DF_DTYPE_I8:   ((int8_t *)dst)[i] = (int8_t)to_int_range(v, -128, 127); break;
    case DF_DTYPE_COUNT: break;
    }
}

df_status df_convert(const void *src, df_dtype st, void *dst, df_dtype dt, int64_t n)
{
    if ((unsigned)st >= DF_DTYPE_COUNT || (unsigned)dt >= DF_DTYPE_COUNT || n < 0)
        return df_errorf(DF_E_ARG, "df_convert: invalid dtype or count");
    if (st == dt) {
        memcpy(dst, src, (size_t)n * df_dtype_size(st));
        return DF_OK;
    }
    /* The common paths, written out so they vectorise. */
    if (st == DF_DTYPE_BF16 && dt == DF_DTYPE_F32) {
        const uint16_t *s = src;
        float *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = df_bf16_to_f32(s[i]);
        return DF_OK;
    }
    if (st == DF_DTYPE_F32 && dt == DF_DTYPE_BF16) {
        const float *s = src;
        uint16_t *d = dst;
        for (int64_t i = 0; i < n; i++)
            d[i] = df_f32_to_bf16(s[i]);
        return DF_OK;
    }
    if (st == DF_DTYPE_I64 && dt == DF_DTYPE_I32) {
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int32_t)((const int64_t *)src)[i];
        return DF_OK;
    }
    if (st == DF_DTYPE_I32 && dt == DF_DTYPE_I64) {
        for (int64_t i = 0; i < n; i++)
            ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
        return DF_OK;
    }
    for (int64_t i = 0; i < n; i++)
        store_one(dst, dt, i, load_one(src, st, i));
    return DF_OK;
}
