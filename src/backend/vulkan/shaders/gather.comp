#version 450
/* Rows of a table by id: out[i, :] = table[ids[i], :] as f32. An id outside the table
 * gives a row of zeros and is reported in the device's fault record (the first one wins),
 * which the host turns into the stream's error. */
#include "common.glsl"

layout(local_size_x = 256) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t table, ids, o, fault;
    int64_t table_dtype, ids_dtype, rows, dim, count, groups_x;
};

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Fault {
    uint kind, pad;
    int64_t a, b, c;
};

void main()
{
    Params p = Params(pc.params);
    int64_t e = (int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x)) * 256 +
                int64_t(gl_LocalInvocationID.x);
    if (e >= p.count * p.dim)
        return;
    int64_t i = e / p.dim, j = e % p.dim;
    int64_t id = load_i(p.ids, int(p.ids_dtype), i);
    bool inside = id >= 0 && id < p.rows;
    if (!inside && j == 0) {
        Fault f = Fault(p.fault);
        if (atomicCompSwap(f.kind, 0u, 1u) == 0u) {
            f.a = id;
            f.b = i;
            f.c = p.rows;
        }
    }
    float v = inside ? load_f(p.table, int(p.table_dtype), id * p.dim + j) : 0.0;
    store_f(p.o, DT_F32, e, v);
}
