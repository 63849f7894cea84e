/*
 * Element types and exact conversions between them.
 *
 * f32 <-> bf16 and f32 <-> f16 round to nearest even and keep NaN and infinities; the
 * conversions to f32 are exact. Integer types hold token ids and positions.
 */
#ifndef DIFFUSE_DTYPE_H
#define DIFFUSE_DTYPE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum df_dtype {
    DF_DTYPE_F32,
    DF_DTYPE_BF16,
    DF_DTYPE_F16,
    DF_DTYPE_F64,
    DF_DTYPE_I32,
    DF_DTYPE_I64,
    DF_DTYPE_U8,
    DF_DTYPE_I8, /* int8 weights; as a compute dtype: 8-bit products (see df_load_opts) */
    DF_DTYPE_COUNT,
} df_dtype;

/* Bytes per element; 0 for an invalid value. */
DF_API size_t df_dtype_size(df_dtype t);

/* Lower-case name ("f32", "bf16"); "?" for an invalid value. */
DF_API const char *df_dtype_name(df_dtype t);

/* Parses "f32", "bf16", "f16", "f64", "i32", "i64", "u8", "i8" (also "float32", "bfloat16",
 * "float16", "int8"). Returns false when the name is unknown. */
DF_API int df_dtype_parse(const char *name, df_dtype *out);

DF_API uint16_t df_f32_to_bf16(float x);
DF_API float    df_bf16_to_f32(uint16_t x);
DF_API uint16_t df_f32_to_f16(float x);
DF_API float    df_f16_to_f32(uint16_t x);

/*
 * fp8 storage formats (safetensors F8_E4M3 and F8_E5M2, torch's float8_e4m3fn and
 * float8_e5m2) widened to f32, exactly. e4m3fn has no infinities: 0x7f and 0xff are NaN,
 * the largest value is 448. e5m2 is the upper byte of an f16 (infinities and NaN as f16).
 * They are storage dtypes only: readers upcast them, nothing computes in them.
 */
DF_API float df_f8_e4m3_to_f32(uint8_t x);
DF_API float df_f8_e5m2_to_f32(uint8_t x);

/* Converts n elements between any two numeric dtypes (to or from f32 exactly as above;
 * integers convert by value, floats to integers truncate toward zero). */
DF_API df_status df_convert(const void *src, df_dtype src_type, void *dst, df_dtype dst_type,
                            int64_t n);

#ifdef __cplusplus
}
#endif
#endif
