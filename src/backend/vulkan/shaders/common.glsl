/*
 * Shared by every shader: operands addressed by device address, loads and stores of every
 * dtype diffuse uses, the unary pointwise ops, the bf16 rounding. The numbers (DT_*, OP_*,
 * FI_*, ACT_*) come from vocab.glsl, which the build generates from the C definitions.
 *
 * A shader gets one push constant, the address of its parameter block; the block holds
 * the addresses (element 0 of each view), dtypes and strides of the operands.
 */
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_8bit_storage : require

#include "vocab.glsl"

layout(buffer_reference, std430, buffer_reference_align = 4) buffer F32s { float v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer U32s { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 4) buffer I32s { int v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) buffer I64s { int64_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer U16s { uint16_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer U8s { uint8_t v[]; };
layout(buffer_reference, std430, buffer_reference_align = 1) buffer I8s { int8_t v[]; };

layout(push_constant) uniform Push { uint64_t params; } pc;

uint64_t dt_size(int dt)
{
    return dt == DT_F32 || dt == DT_I32 ? 4ul : dt == DT_I64 || dt == DT_F64 ? 8ul
         : dt == DT_U8 || dt == DT_I8 ? 1ul : 2ul;
}

bool dt_is_int(int dt)
{
    return dt >= DT_I32;
}

float bf16_f32(uint h)
{
    return uintBitsToFloat(h << 16);
}

/* f16 bits -> f32, exact (subnormals included). */
float f16_f32(uint h)
{
    uint sign = (h & 0x8000u) << 16;
    uint em = h & 0x7fffu;
    uint normal = (em << 13) + 0x38000000u;
    normal += em >= 0x7c00u ? 0x38000000u : 0u;
    float sub = float(em) * 5.9604644775390625e-8; /* 2^-24 */
    uint bits = em < 0x400u ? floatBitsToUint(sub) : normal;
    return uintBitsToFloat(bits | sign);
}

/* f32 -> bf16 bits, round to nearest even, NaN kept quiet. */
uint f32_bf16(float f)
{
    uint u = floatBitsToUint(f);
    uint rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint quiet = (u >> 16) | 0x40u;
    return (u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded;
}

/* f32 -> f16 bits, round to nearest even, overflow to inf, NaN kept quiet. */
uint f32_f16(float f)
{
    uint u = floatBitsToUint(f);
    uint sign = (u >> 16) & 0x8000u;
    uint a = u & 0x7fffffffu;
    uint normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
    uint sub = floatBitsToUint(uintBitsToFloat(a) + 0.5) - 0x3f000000u;
    uint h = a < 0x38800000u ? sub : normal;
    h = a >= 0x477ff000u ? 0x7c00u : h;
    h = a > 0x7f800000u ? (0x7e00u | ((a >> 13) & 0x3ffu)) : h;
    return h | sign;
}

/* The value rounded to bf16 and back (the operands of bf16 products). */
float round_bf16(float f)
{
    return bf16_f32(f32_bf16(f));
}

/* Element i of a float view (f32, bf16, f16, or an integer dtype read as float). */
float load_f(uint64_t base, int dt, int64_t i)
{
    if (dt == DT_F32)
        return F32s(base + uint64_t(i) * 4ul).v[0];
    if (dt == DT_BF16)
        return bf16_f32(uint(U16s(base + uint64_t(i) * 2ul).v[0]));
    if (dt == DT_F16)
        return f16_f32(uint(U16s(base + uint64_t(i) * 2ul).v[0]));
    if (dt == DT_I32)
        return float(I32s(base + uint64_t(i) * 4ul).v[0]);
    if (dt == DT_I64)
        return float(I64s(base + uint64_t(i) * 8ul).v[0]);
    if (dt == DT_U8)
        return float(uint(U8s(base + uint64_t(i)).v[0]));
    return float(int(I8s(base + uint64_t(i)).v[0]));
}

int64_t load_i(uint64_t base, int dt, int64_t i)
{
    if (dt == DT_I32)
        return int64_t(I32s(base + uint64_t(i) * 4ul).v[0]);
    if (dt == DT_I64)
        return I64s(base + uint64_t(i) * 8ul).v[0];
    if (dt == DT_U8)
        return int64_t(uint(U8s(base + uint64_t(i)).v[0]));
    return int64_t(int(I8s(base + uint64_t(i)).v[0]));
}

void store_f(uint64_t base, int dt, int64_t i, float x)
{
    if (dt == DT_F32)
        F32s(base + uint64_t(i) * 4ul).v[0] = x;
    else if (dt == DT_BF16)
        U16s(base + uint64_t(i) * 2ul).v[0] = uint16_t(f32_bf16(x));
    else if (dt == DT_F16)
        U16s(base + uint64_t(i) * 2ul).v[0] = uint16_t(f32_f16(x));
}

void store_i(uint64_t base, int dt, int64_t i, int64_t x)
{
    if (dt == DT_I32)
        I32s(base + uint64_t(i) * 4ul).v[0] = int(x);
    else if (dt == DT_I64)
        I64s(base + uint64_t(i) * 8ul).v[0] = x;
    else if (dt == DT_U8)
        U8s(base + uint64_t(i)).v[0] = uint8_t(uint(x));
    else
        I8s(base + uint64_t(i)).v[0] = int8_t(int(x));
}

/* x * sigmoid(u) for every sign of u; a sigmoid that underflows gives -0. */
float x_sigmoid(float x, float u)
{
    float e = exp(-abs(u));
    float s = (u >= 0.0 ? 1.0 : e) / (1.0 + e);
    return s == 0.0 ? -0.0 : x * s;
}

/* erfc(x), fractional error below 1.2e-7 everywhere (a Chebyshev fit of exp(-z^2) erfc). */
float erfc_f(float x)
{
    float z = abs(x);
    float t = 1.0 / (1.0 + 0.5 * z);
    float p = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
              t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
              t * (-0.82215223 + t * 0.17087277))))))));
    float r = t * exp(p);
    return x >= 0.0 ? r : 2.0 - r;
}

float gelu_f(float x)
{
    float e = erfc_f(-x * 0.70710678118654752);
    return e == 0.0 ? -0.0 : 0.5 * x * e;
}

float gelu_tanh_f(float x)
{
    return x_sigmoid(x, 1.5957691216057308 * x * (1.0 + 0.044715 * x * x));
}

/* The unary pointwise ops (ops.def's fuse column), by their op number: elementwise kernels,
 * fused programs and the products' epilogues all compute them here. alpha, beta: SCALE's. */
float unary_f(int op, float x, float alpha, float beta)
{
    if (op == OP_SCALE)
        return alpha * x + beta;
    if (op == OP_SILU)
        return x_sigmoid(x, x);
    if (op == OP_GELU)
        return gelu_f(x);
    if (op == OP_GELU_TANH)
        return gelu_tanh_f(x);
    if (op == OP_QUICK_GELU)
        return x_sigmoid(x, 1.702 * x);
    return x;
}

/* A product's epilogue activation (ACT_*; ACT_NONE leaves x). */
float activate(int act, float x)
{
    return unary_f(act_op(act), x, 1.0, 0.0);
}

/* Element i (a 32-bit index) of a float row that starts at address `row`. */
float load_fi(uint64_t row, int dt, int i)
{
    if (dt == DT_F32)
        return F32s(row).v[i];
    if (dt == DT_BF16)
        return bf16_f32(uint(U16s(row).v[i]));
    return f16_f32(uint(U16s(row).v[i]));
}

/* The address of element `off` of a view whose element 0 is at `base`. */
uint64_t elem_addr(uint64_t base, int dt, int64_t off)
{
    return base + uint64_t(off) * dt_size(dt);
}
