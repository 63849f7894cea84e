#version 450
/*
 * The defer-and-fuse mode's fused elementwise program (df_fused in device.h), as an
 * interpreter: one workgroup per output row; an optional normalisation head (layer or RMS
 * norm of head_x's row, statistics by workgroup reduction); then each invocation runs the
 * straight-line program for its columns with the registers in private memory. Inputs are
 * strided views broadcast to the output's shape; the last dimension is the row.
 */
#include "common.glsl"

#define WG 128
layout(local_size_x = WG) in;
#include "reduce.glsl"

#define MAX_IN 16
#define MAX_INSN 48
#define MAX_REGS 64

struct FView {
    uint64_t addr;
    int64_t dtype;
    int64_t stride[6];
};

struct Insn {
    int op, dst, a, b;
    float f0, f1;
};

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t o;
    int64_t o_dtype, ndim, rows, w, groups_x;
    int64_t shape[6];
    int64_t n_in, n_insn, out_reg, head_op;
    uint64_t head_x, head_w, head_b;
    int64_t head_x_dtype, head_w_dtype, head_b_dtype;
    float head_eps, pad;
    FView inp[MAX_IN];
    Insn insn[MAX_INSN];
};

void main()
{
    Params p = Params(pc.params);
    int64_t row = int64_t(gl_WorkGroupID.y) * p.groups_x + int64_t(gl_WorkGroupID.x);
    if (row >= p.rows)
        return;
    int t = int(gl_LocalInvocationID.x);
    int64_t w = p.w, nd = p.ndim;
    int n_in = int(p.n_in), n_insn = int(p.n_insn);
    int64_t roff[MAX_IN];
    for (int k = 0; k < n_in; k++) {
        int64_t off = 0, rr = row;
        for (int64_t d = nd - 2; d >= 0; d--) {
            off += (rr % p.shape[int(d)]) * p.inp[k].stride[int(d)];
            rr /= p.shape[int(d)];
        }
        roff[k] = off;
    }
    float mean = 0.0, rs = 1.0;
    int hxt = int(p.head_x_dtype);
    int64_t hbase = row * w;
    if (p.head_op == OP_LAYER_NORM) {
        float k0 = load_f(p.head_x, hxt, hbase), s = 0.0, q = 0.0;
        for (int64_t j = t; j < w; j += WG) {
            float v = load_f(p.head_x, hxt, hbase + j) - k0;
            s += v;
            q += v * v;
        }
        s = wg_sum(s);
        q = wg_sum(q);
        float ms = s / float(w);
        mean = k0 + ms;
        rs = 1.0 / sqrt(max(q / float(w) - ms * ms, 0.0) + p.head_eps);
    } else if (p.head_op == OP_RMS_NORM) {
        float q = 0.0;
        for (int64_t j = t; j < w; j += WG) {
            float v = load_f(p.head_x, hxt, hbase + j);
            q += v * v;
        }
        q = wg_sum(q);
        rs = 1.0 / sqrt(q / float(w) + p.head_eps);
    }
    float r[MAX_REGS];
    for (int64_t j = t; j < w; j += WG) {
        for (int k = 0; k < n_insn; k++) {
            Insn in_ = p.insn[k];
            float x = r[in_.a], y = r[in_.b], v;
            switch (in_.op) {
            case FI_LOAD: {
                FView fv = p.inp[in_.a];
                v = load_f(fv.addr, int(fv.dtype), roff[in_.a] + j * fv.stride[int(nd) - 1]);
                break;
            }
            case FI_HEAD:
                v = (load_f(p.head_x, hxt, hbase + j) - mean) * rs;
                if (p.head_op == OP_RMS_NORM)
                    v = load_f(p.head_x, hxt, hbase + j) * rs;
                if (p.head_w != 0ul)
                    v *= load_f(p.head_w, int(p.head_w_dtype), j);
                if (p.head_b != 0ul)
                    v += load_f(p.head_b, int(p.head_b_dtype), j);
                break;
            case OP_ADD: v = x + y; break;
            case OP_SUB: v = x - y; break;
            case OP_MUL: v = x * y; break;
            case OP_DIV: v = x / y; break;
            default: v = unary_f(in_.op, x, in_.f0, in_.f1); break; /* COPY: x */
            }
            r[in_.dst] = v;
        }
        store_f(p.o, int(p.o_dtype), row * w + j, r[int(p.out_reg)]);
    }
}
