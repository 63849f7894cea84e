#version 450
/*
 * The positions of ops.def, as the CPU computes them (src/backend/cpu/k_position.c), one
 * invocation per output pair; OP (a specialisation constant) picks the op:
 *  - OP_TIMESTEP_EMBED: timestep_embed. For row b and frequency i < half: angle = f32(scale *
 *    t[b]) * freq[i] in f32, freq[i] the host's expf of the op's exponents (it depends on
 *    the attributes only, so it travels in the parameter block); [sin, cos] or with flip
 *    [cos, sin], and a zero column when dim is odd (invocation i == half);
 *  - OP_ROPE_TABLE: rope_table. For position s and pair k of axis a: the angle
 *    f32(ids[s, a]) * freq[k] with freq[k] = 1 / theta^(2k'/d) in f64, given as two f32
 *    (hi + lo), so the product is carried in two f32 as well; (cos, sin) rounded to f32.
 * Both angles go through sincos_dd (trig.glsl). Outputs are dense f32.
 */
#include "common.glsl"
#include "trig.glsl"

layout(constant_id = 0) const int OP = OP_TIMESTEP_EMBED;
layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer TimestepParams {
    uint64_t t, o;
    int64_t t_dtype, t_stride, batch, dim, half_d, flip, groups_x;
    float scale, pad;
    float freq[]; /* half_d of them */
};

layout(buffer_reference, std430, buffer_reference_align = 8) buffer RopeParams {
    uint64_t ids, o;
    int64_t ids_dtype, ids_s0, ids_s1, seq, pairs, n_axes, groups_x, pad;
    int64_t axis_of[8]; /* the first pair of each axis, then the end */
    float freq[];       /* pairs of (hi, lo) */
};

/* An f64 (its bits) rounded to the nearest f32, ties to even; subnormals included. */
float f64_bits_f32(uint64_t bits)
{
    uint sign = uint(bits >> 63) << 31;
    int e = int((bits >> 52) & 0x7fful);
    uint64_t m = bits & 0xffffffffffffful;
    if (e == 0x7ff) /* inf, NaN (kept quiet) */
        return uintBitsToFloat(sign | 0x7f800000u | (m != 0ul ? 0x400000u : 0u));
    if (e == 0)
        return uintBitsToFloat(sign); /* an f64 subnormal is far below f32's range */
    int fe = e - 1023 + 127;
    uint64_t full = m | (1ul << 52);
    int shift = fe > 0 ? 29 : 29 + 1 - fe;
    if (shift > 60)
        return uintBitsToFloat(sign);
    uint64_t kept = full >> shift, rest = full & ((1ul << shift) - 1ul);
    uint64_t halfway = 1ul << (shift - 1);
    kept += (rest > halfway || (rest == halfway && (kept & 1ul) != 0ul)) ? 1ul : 0ul;
    /* normal: the implicit bit adds 1 to the exponent field, so it goes in as fe - 1 */
    uint64_t f = fe > 0 ? (uint64_t(fe - 1) << 23) + kept : kept;
    return uintBitsToFloat(sign | (f >= 0x7f800000ul ? 0x7f800000u : uint(f)));
}

float load_pos(uint64_t base, int dt, int64_t i)
{
    if (dt == DT_F64)
        return f64_bits_f32(uint64_t(I64s(base + uint64_t(i) * 8ul).v[0]));
    return load_f(base, dt, i);
}

void main()
{
    int64_t id = int64_t(gl_WorkGroupID.y) * int64_t(gl_NumWorkGroups.x) * 64 +
                 int64_t(gl_GlobalInvocationID.x);
    if (OP == OP_TIMESTEP_EMBED) {
        TimestepParams p = TimestepParams(pc.params);
        int64_t width = p.half_d + p.dim % 2; /* the invocations of one row */
        if (id >= p.batch * width)
            return;
        int64_t b = id / width, i = id % width;
        uint64_t row = p.o + uint64_t(b * p.dim) * 4ul;
        if (i == p.half_d) { /* the zero column of an odd dim */
            F32s(row).v[int(p.dim) - 1] = 0.0;
            return;
        }
        precise float tb = p.scale * load_pos(p.t, int(p.t_dtype), b * p.t_stride);
        precise float angle = tb * p.freq[int(i)];
        float s, c;
        sincos_dd(angle, 0.0, s, c);
        int64_t si = p.flip != 0 ? p.half_d + i : i, ci = p.flip != 0 ? i : p.half_d + i;
        F32s(row).v[int(si)] = s;
        F32s(row).v[int(ci)] = c;
    } else {
        RopeParams p = RopeParams(pc.params);
        if (id >= p.seq * p.pairs)
            return;
        int64_t s = id / p.pairs, k = id % p.pairs;
        int a = 0;
        while (a + 1 < int(p.n_axes) && k >= p.axis_of[a + 1])
            a++;
        if (k >= p.axis_of[int(p.n_axes)])
            return; /* past the last axis: the CPU leaves it too */
        float pos = load_pos(p.ids, int(p.ids_dtype), s * p.ids_s0 + a * p.ids_s1);
        precise float fh = p.freq[2 * int(k)], fl = p.freq[2 * int(k) + 1];
        precise float ah, al;
        dd_mul(pos, fh, ah, al);
        al = al + pos * fl;
        precise float hi = ah + al, lo = al - (hi - ah);
        float sn, cs;
        sincos_dd(hi, lo, sn, cs);
        uint64_t at = p.o + uint64_t((s * p.pairs + k) * 2) * 4ul;
        F32s(at).v[0] = cs;
        F32s(at).v[1] = sn;
    }
}
