#version 450
/*
 * Elementwise ops over strided views of one shape (inputs already broadcast: stride 0
 * where a dimension stretches): copy/cast, fill, add/sub/mul/div, scale and the
 * activations. One invocation per element. The op (its df_op number) is a specialisation
 * constant.
 */
#include "common.glsl"

layout(local_size_x = 256) in;
layout(constant_id = 0) const int OP = OP_COPY; /* the df_op */

struct View {
    uint64_t addr;
    int64_t dtype;
    int64_t stride[6];
};

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    int64_t ndim;
    int64_t total;
    int64_t groups_x;
    int64_t pad;
    int64_t shape[6];
    View o, a, b;
    float f0, f1;
    int64_t fill_i;
    float fill_f;
};

void main()
{
    Params p = Params(pc.params);
    int64_t e = (int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x)) * 256 +
                int64_t(gl_LocalInvocationID.x);
    if (e >= p.total)
        return;
    int64_t oo = 0, oa = 0, ob = 0, rest = e;
    if (p.ndim == 1) { /* dense or evenly strided: no division */
        oo = e * p.o.stride[0];
        oa = e * p.a.stride[0];
        ob = e * p.b.stride[0];
        rest = 0;
    }
    for (int d = p.ndim == 1 ? -1 : int(p.ndim) - 1; d >= 0; d--) {
        int64_t n = p.shape[d];
        int64_t i = rest % n;
        rest /= n;
        oo += i * p.o.stride[d];
        oa += i * p.a.stride[d];
        ob += i * p.b.stride[d];
    }
    int to = int(p.o.dtype), ta = int(p.a.dtype);
    if (OP == OP_COPY) {
        if (dt_is_int(ta) && dt_is_int(to)) {
            store_i(p.o.addr, to, oo, load_i(p.a.addr, ta, oa));
        } else if (dt_is_int(to)) { /* float -> int: truncate, saturate, NaN -> 0 */
            float v = load_f(p.a.addr, ta, oa);
            float lo = to == DT_U8 ? 0.0 : to == DT_I8 ? -128.0 : to == DT_I32 ? -2147483648.0
                                                                          : -9.2233720e18;
            float hi = to == DT_U8 ? 255.0 : to == DT_I8 ? 127.0 : to == DT_I32 ? 2147483520.0
                                                                          : 9.2233715e18;
            int64_t x = isnan(v) ? 0l : v <= lo ? int64_t(lo) : v >= hi ? int64_t(hi)
                                                                           : int64_t(v);
            if (to == DT_I32 && v >= 2147483648.0)
                x = 2147483647l;
            store_i(p.o.addr, to, oo, x);
        } else {
            store_f(p.o.addr, to, oo, load_f(p.a.addr, ta, oa));
        }
        return;
    }
    if (OP == OP_FILL) {
        if (dt_is_int(to))
            store_i(p.o.addr, to, oo, p.fill_i);
        else
            store_f(p.o.addr, to, oo, p.fill_f);
        return;
    }
    float x = load_f(p.a.addr, ta, oa), r;
    if (OP >= OP_ADD && OP <= OP_DIV) {
        float y = load_f(p.b.addr, int(p.b.dtype), ob);
        r = OP == OP_ADD ? x + y : OP == OP_SUB ? x - y : OP == OP_MUL ? x * y : x / y;
    } else {
        r = unary_f(OP, x, p.f0, p.f1);
    }
    store_f(p.o.addr, to, oo, r);
}
