/*
 * Every op of backend/ops.def (but the collective) run by the Vulkan backend's core and by
 * the CPU backend's kernels on the same inputs, compared element by element:
 * |vk - cpu| <= atol + rtol * |cpu|. The CPU kernels are themselves checked against the
 * float64 references by tests/ops; this test checks the shaders against them.
 *
 * Each row builds one node whose views point at "twins": a storage with host memory (the
 * CPU reads and writes it) and a device allocation holding the same input bytes. The
 * device runs the node into its own output, which is read back and compared with the CPU's.
 * Inputs are strided, broadcast and in 16-bit dtypes where the op allows, so the shaders'
 * address arithmetic and conversions are exercised, not only dense f32.
 *
 * The device is Vulkan device 0 named by index (lavapipe in CI). Run under
 * VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation: any validation message fails the test.
 * Without a Vulkan loader or device the test exits 77 (skipped), naming why.
 *
 * Prints one line per row: the op, the largest absolute and relative error, the tolerance.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "core/alloc.h"
#include "vk_test.h"

/* ---- twins --------------------------------------------------------------------------------- */

typedef struct twin {
    struct df_dev_buffer cpu; /* first: a view's buf points here (the CPU kernels read it) */
    size_t bytes;
    dvk_alloc *dev;
    struct twin *next;
} twin;

static twin *g_twins;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static double rnd(double lo, double hi)
{
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) * 0x1p-53;
}

static VkDeviceAddress addr_of(void *user, const df_view *v)
{
    const twin *t = (const twin *)v->buf;
    return t->dev->addr + v->offset;
}

static twin *twin_new(size_t bytes)
{
    twin *t = calloc(1, sizeof *t);
    df_cpu_buffer_init(&t->cpu, calloc(1, bytes + 8), bytes);
    t->bytes = bytes;
    if (dvk_alloc_make(g_dev, bytes ? bytes : 1, &t->dev) != DF_OK) {
        fprintf(stderr, "alloc: %s\n", df_error_message());
        exit(1);
    }
    t->next = g_twins;
    g_twins = t;
    return t;
}

static void twins_free(void)
{
    while (g_twins) {
        twin *n = g_twins->next;
        dvk_alloc_free(g_dev, g_twins->dev);
        free(g_twins->cpu.ptr);
        free(g_twins);
        g_twins = n;
    }
}

static void dense(df_view *v)
{
    int64_t s = 1;
    for (int d = v->ndim - 1; d >= 0; d--) {
        v->stride[d] = s;
        s *= v->shape[d];
    }
}

static int64_t numel(const df_view *v)
{
    int64_t n = 1;
    for (int d = 0; d < v->ndim; d++)
        n *= v->shape[d];
    return n;
}

static void put(void *p, df_dtype t, int64_t i, double x)
{
    switch (t) {
    case DF_DTYPE_F32: ((float *)p)[i] = (float)x; break;
    case DF_DTYPE_BF16: ((uint16_t *)p)[i] = df_f32_to_bf16((float)x); break;
    case DF_DTYPE_F16: ((uint16_t *)p)[i] = df_f32_to_f16((float)x); break;
    case DF_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)floor(x); break;
    case DF_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)floor(x); break;
    case DF_DTYPE_U8: ((uint8_t *)p)[i] = (uint8_t)floor(x); break;
    default: ((int8_t *)p)[i] = (int8_t)floor(x); break;
    }
}

static double get(const void *p, df_dtype t, int64_t i)
{
    switch (t) {
    case DF_DTYPE_F32: return ((const float *)p)[i];
    case DF_DTYPE_BF16: return df_bf16_to_f32(((const uint16_t *)p)[i]);
    case DF_DTYPE_F16: return df_f16_to_f32(((const uint16_t *)p)[i]);
    case DF_DTYPE_I32: return ((const int32_t *)p)[i];
    case DF_DTYPE_I64: return (double)((const int64_t *)p)[i];
    case DF_DTYPE_U8: return ((const uint8_t *)p)[i];
    default: return ((const int8_t *)p)[i];
    }
}

/* A dense input of `shape` with values in [lo, hi), on both sides. */
static df_view input(df_dtype t, int ndim, const int64_t *shape, double lo, double hi)
{
    df_view v = {.dtype = t, .ndim = ndim};
    memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
    dense(&v);
    int64_t n = numel(&v);
    twin *tw = twin_new((size_t)n * df_dtype_size(t));
    for (int64_t i = 0; i < n; i++)
        put(tw->cpu.ptr, t, i, rnd(lo, hi));
    if (dvk_upload(g_dev, tw->dev->addr, tw->cpu.ptr, tw->bytes) != DF_OK) {
        fprintf(stderr, "upload: %s\n", df_error_message());
        exit(1);
    }
    v.buf = &tw->cpu;
    return v;
}

/* A dense output of `shape` (both sides start as zeros). */
static df_view output(df_dtype t, int ndim, const int64_t *shape)
{
    df_view v = {.dtype = t, .ndim = ndim};
    memcpy(v.shape, shape, (size_t)ndim * sizeof *shape);
    dense(&v);
    twin *tw = twin_new((size_t)numel(&v) * df_dtype_size(t));
    dvk_upload(g_dev, tw->dev->addr, tw->cpu.ptr, tw->bytes);
    v.buf = &tw->cpu;
    return v;
}

/* v with its dimensions a and b swapped (a strided view of the same storage). */
static df_view swapped(df_view v, int a, int b)
{
    int64_t s = v.shape[a], st = v.stride[a];
    v.shape[a] = v.shape[b], v.stride[a] = v.stride[b];
    v.shape[b] = s, v.stride[b] = st;
    return v;
}

/* ---- running and comparing ------------------------------------------------------------------ */

typedef struct row {
    const char *name;
    double atol, rtol;
} row;

/* Compares the CPU's output (host memory of out's storage) with the device's, over the
 * elements out addresses (its own strides). */
static void compare(const row *r, const df_view *out)
{
    const twin *t = (const twin *)out->buf;
    void *got = malloc(t->bytes + 8);
    df_status s = dvk_download(g_dev, got, t->dev->addr, t->bytes);
    if (s != DF_OK) {
        printf("FAIL %-34s download: %s\n", r->name, df_error_message());
        g_failures++;
        free(got);
        return;
    }
    double max_abs = 0, max_rel = 0;
    int64_t bad = -1, n = numel(out);
    for (int64_t e = 0; e < n; e++) {
        int64_t off = (int64_t)(out->offset / df_dtype_size(out->dtype)), rest = e;
        for (int d = out->ndim - 1; d >= 0; d--) {
            off += rest % out->shape[d] * out->stride[d];
            rest /= out->shape[d];
        }
        double want = get(t->cpu.ptr, out->dtype, off), have = get(got, out->dtype, off);
        double err = fabs(have - want);
        if (isnan(want) != isnan(have) || (!isnan(want) && err > r->atol + r->rtol * fabs(want))) {
            if (bad < 0)
                bad = e;
        }
        if (!isnan(err)) {
            max_abs = err > max_abs ? err : max_abs;
            double rel = err / (fabs(want) > 1e-30 ? fabs(want) : 1e-30);
            if (fabs(want) > 1e-3)
                max_rel = rel > max_rel ? rel : max_rel;
        }
        if (bad == e)
            printf("  first mismatch at element %lld: cpu %.9g, vulkan %.9g\n", (long long)e,
                   want, have);
    }
    printf("%s %-34s max abs %.3g  max rel %.3g  (atol %.0e rtol %.0e)\n", bad < 0 ? "ok  " : "FAIL",
           r->name, max_abs, max_rel, r->atol, r->rtol);
    if (bad >= 0)
        g_failures++;
    free(got);
}

static void run(const row *r, const df_node *n)
{
    df_kernel_env env = {.threads = 1};
    df_status s = df_cpu_run_node(n, &env);
    df_aligned_free(env.scratch);
    if (s != DF_OK) {
        printf("FAIL %-34s cpu: %s\n", r->name, df_error_message());
        g_failures++;
        return;
    }
    dvk_env e = {.d = g_dev, .addr = addr_of};
    s = dvk_run_node(&e, n);
    if (s != DF_OK) {
        printf("FAIL %-34s vulkan: %s\n", r->name, df_error_message());
        g_failures++;
        return;
    }
    compare(r, &n->out);
}

/* The bound for a product computed in bf16. On a CPU whose GEMM provider has bf16 products
 * both sides round the same operands and agree to `t`; on one without (AVX2: the CPU computes
 * such a product in f32), the CPU's f32 result is the reference and the device's bf16 one is
 * within bf16's input rounding: 2^-8 relative per operand over k <= 70 terms of |x| <= 1. */
static double bf16_atol(double t)
{
    return df_gemm_compute_dtype(DF_DTYPE_BF16) == DF_DTYPE_BF16 ? t : 0.08;
}

static df_node node(df_op op, int n_in, const df_view *in, df_view out)
{
    df_node n = {.op = op, .n_in = n_in, .out = out};
    for (int i = 0; i < n_in; i++)
        n.in[i] = in[i];
    return n;
}

#define SHAPE(...) (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

/* ---- the rows --------------------------------------------------------------------------------- */

static void elementwise_rows(void)
{
    df_view x = input(DF_DTYPE_F32, SHAPE(3, 5, 7), -4, 4);
    df_view xt = swapped(x, 0, 2); /* [7, 5, 3], strided */
    struct { df_dtype from, to; const char *name; } casts[] = {
        {DF_DTYPE_F32, DF_DTYPE_F32, "copy strided f32"},
        {DF_DTYPE_F32, DF_DTYPE_BF16, "cast f32 -> bf16"},
        {DF_DTYPE_F32, DF_DTYPE_F16, "cast f32 -> f16"},
        {DF_DTYPE_F32, DF_DTYPE_I32, "cast f32 -> i32"},
        {DF_DTYPE_BF16, DF_DTYPE_F32, "cast bf16 -> f32"},
        {DF_DTYPE_F16, DF_DTYPE_F32, "cast f16 -> f32"},
        {DF_DTYPE_I64, DF_DTYPE_I32, "cast i64 -> i32"},
        {DF_DTYPE_I32, DF_DTYPE_F32, "cast i32 -> f32"},
    };
    for (size_t i = 0; i < sizeof casts / sizeof *casts; i++) {
        df_view src = input(casts[i].from, SHAPE(3, 5, 7), -300, 300);
        df_view in = swapped(src, 0, 2);
        df_node n = node(DF_OP_COPY, 1, &in, output(casts[i].to, SHAPE(7, 5, 3)));
        run(&(row){casts[i].name, 0, 0}, &n);
    }
    df_node fill = node(DF_OP_FILL, 0, NULL, output(DF_DTYPE_F32, SHAPE(1000)));
    fill.a.value = 0.3;
    run(&(row){"fill f32", 0, 0}, &fill);
    df_node filli = node(DF_OP_FILL, 0, NULL, output(DF_DTYPE_I64, SHAPE(77)));
    filli.a.value = -12345;
    run(&(row){"fill i64", 0, 0}, &filli);

    df_view b = input(DF_DTYPE_BF16, SHAPE(7, 1, 3), 0.5, 2);
    df_view bb = b; /* broadcast over the middle dimension */
    bb.shape[1] = 5;
    bb.stride[1] = 0;
    const df_op ops[] = {DF_OP_ADD, DF_OP_SUB, DF_OP_MUL, DF_OP_DIV};
    for (int i = 0; i < 4; i++) {
        df_view in[2] = {xt, bb};
        df_node n = node(ops[i], 2, in, output(DF_DTYPE_F32, SHAPE(7, 5, 3)));
        char name[64];
        snprintf(name, sizeof name, "%s strided x broadcast bf16", df_vocab_op_name(ops[i]));
        run(&(row){name, 0, 1e-7}, &n);
    }
    const df_op un[] = {DF_OP_SCALE, DF_OP_SILU, DF_OP_GELU, DF_OP_GELU_TANH, DF_OP_QUICK_GELU};
    df_view big = input(DF_DTYPE_F32, SHAPE(4, 1031), -9, 9);
    for (int i = 0; i < 5; i++) {
        df_node n = node(un[i], 1, &big, output(DF_DTYPE_F32, SHAPE(4, 1031)));
        n.a.alpha = 1.5;
        n.a.beta = -0.25;
        run(&(row){df_vocab_op_name(un[i]), 1e-6, 2e-6}, &n);
    }
}

static void norm_rows(void)
{
    df_view x = input(DF_DTYPE_F32, SHAPE(5, 37), -6, 6);
    df_node sm = node(DF_OP_SOFTMAX, 1, &x, output(DF_DTYPE_F32, SHAPE(5, 37)));
    run(&(row){"softmax", 1e-7, 2e-6}, &sm);
    df_view y = input(DF_DTYPE_F32, SHAPE(7, 300), 2, 4); /* a large mean */
    df_view w = input(DF_DTYPE_BF16, SHAPE(300), 0.5, 1.5), bias = input(DF_DTYPE_F32, SHAPE(300), -1, 1);
    df_view ln_in[3] = {y, w, bias};
    df_node ln = node(DF_OP_LAYER_NORM, 3, ln_in, output(DF_DTYPE_F32, SHAPE(7, 300)));
    ln.a.eps = 1e-6;
    run(&(row){"layer_norm bf16 weight + bias", 2e-5, 2e-5}, &ln);
    df_view ln0_in[3] = {y};
    df_node ln0 = node(DF_OP_LAYER_NORM, 3, ln0_in, output(DF_DTYPE_F32, SHAPE(7, 300)));
    ln0.a.eps = 1e-6;
    run(&(row){"layer_norm no affine", 2e-5, 2e-5}, &ln0);
    df_view rms_in[2] = {y, w};
    df_node rms = node(DF_OP_RMS_NORM, 2, rms_in, output(DF_DTYPE_F32, SHAPE(7, 300)));
    rms.a.eps = 1e-6;
    run(&(row){"rms_norm bf16 weight", 1e-6, 3e-6}, &rms);
    df_view g = input(DF_DTYPE_F32, SHAPE(2, 8, 5, 6), -3, 5);
    df_view gw = input(DF_DTYPE_F32, SHAPE(8), 0.5, 1.5), gb = input(DF_DTYPE_F16, SHAPE(8), -1, 1);
    df_view gn_in[3] = {g, gw, gb};
    df_node gn = node(DF_OP_GROUP_NORM, 3, gn_in, output(DF_DTYPE_F32, SHAPE(2, 8, 5, 6)));
    gn.a.groups = 4;
    gn.a.eps = 1e-5;
    run(&(row){"group_norm 4 groups", 2e-5, 2e-5}, &gn);
}

/* The positions against the CPU's libm: timestep angles up to 1000 (FLUX's x1000 of t in
 * [0, 1]) and 10^4 (guidance x1000), and RoPE angles up to 512 radians (FLUX.2's text
 * positions); within 2 ulp of sinf / cosf and of double sin / cos rounded to f32. */
static void position_rows(void)
{
    struct { const char *name; int64_t batch, dim, flip; double shift, scale, lo, hi; } ts[] = {
        {"timestep_embed odd dim", 3, 33, 1, 1, 1000, 0, 1},
        {"timestep_embed flux t x1000", 64, 256, 1, 0, 1000, 0, 1},
        {"timestep_embed guidance x1000", 64, 256, 1, 0, 1000, 0, 10},
        {"timestep_embed sd3 t in [0, 1000]", 64, 256, 1, 0, 1, 0, 1000},
    };
    for (size_t i = 0; i < sizeof ts / sizeof *ts; i++) {
        df_view t = input(DF_DTYPE_F32, SHAPE(ts[i].batch), ts[i].lo, ts[i].hi);
        df_node te = node(DF_OP_TIMESTEP_EMBED, 1, &t,
                          output(DF_DTYPE_F32, SHAPE(ts[i].batch, ts[i].dim)));
        te.a.dim = ts[i].dim;
        te.a.flip = ts[i].flip;
        te.a.shift = ts[i].shift;
        te.a.scale = ts[i].scale;
        te.a.max_period = 10000;
        run(&(row){ts[i].name, 1.2e-7, 0}, &te);
    }
    df_view t16 = input(DF_DTYPE_BF16, SHAPE(5), 0, 1);
    df_node te16 = node(DF_OP_TIMESTEP_EMBED, 1, &t16, output(DF_DTYPE_F32, SHAPE(5, 16)));
    te16.a.dim = 16;
    te16.a.shift = 0.5;
    te16.a.scale = 1;
    te16.a.max_period = 100;
    run(&(row){"timestep_embed bf16 t [sin, cos]", 1.2e-7, 0}, &te16);
    df_view fids = input(DF_DTYPE_F32, SHAPE(300, 3), 0, 128);
    df_node frt = node(DF_OP_ROPE_TABLE, 1, &fids, output(DF_DTYPE_F32, SHAPE(300, 64, 2)));
    frt.a.n_axes = 3;
    frt.a.axes_dim[0] = 16;
    frt.a.axes_dim[1] = 56;
    frt.a.axes_dim[2] = 56;
    frt.a.theta = 10000;
    run(&(row){"rope_table flux ids < 128", 1.2e-7, 0}, &frt);
    df_view kids = input(DF_DTYPE_I32, SHAPE(300, 4), 0, 512);
    df_node krt = node(DF_OP_ROPE_TABLE, 1, &kids, output(DF_DTYPE_F32, SHAPE(300, 64, 2)));
    krt.a.n_axes = 4;
    for (int a = 0; a < 4; a++)
        krt.a.axes_dim[a] = 32;
    krt.a.theta = 2000;
    run(&(row){"rope_table flux2 i32 ids < 512", 1.2e-7, 0}, &krt);
    df_view ids = input(DF_DTYPE_F32, SHAPE(9, 3), 0, 40);
    df_node rt = node(DF_OP_ROPE_TABLE, 1, &ids, output(DF_DTYPE_F32, SHAPE(9, 8, 2)));
    rt.a.n_axes = 3;
    rt.a.axes_dim[0] = 4;
    rt.a.axes_dim[1] = 6;
    rt.a.axes_dim[2] = 6;
    rt.a.theta = 10000;
    run(&(row){"rope_table small", 1.2e-7, 0}, &rt);
    df_view table = rt.out;
    df_view x = input(DF_DTYPE_F32, SHAPE(2, 9, 3, 16), -2, 2);
    df_view xp = swapped(x, 1, 2); /* [2, 3, 9, 16] strided */
    df_view rope_in[2] = {xp, table};
    df_node rope = node(DF_OP_ROPE, 2, rope_in, output(DF_DTYPE_F32, SHAPE(2, 3, 9, 16)));
    run(&(row){"rope strided x", 1e-6, 1e-6}, &rope);
    df_view w = input(DF_DTYPE_BF16, SHAPE(16), 0.5, 1.5);
    df_view nr_in[3] = {x, w, table};
    df_view o = output(DF_DTYPE_F32, SHAPE(2, 3, 9, 16));
    df_node nr = node(DF_OP_RMS_NORM_ROPE, 3, nr_in, o);
    nr.a.eps = 1e-6;
    run(&(row){"rms_norm_rope", 1e-6, 3e-6}, &nr);
    df_view ob = output(DF_DTYPE_BF16, SHAPE(2, 3, 9, 16));
    df_node nrb = node(DF_OP_RMS_NORM_ROPE, 3, nr_in, ob);
    nrb.a.eps = 1e-6;
    run(&(row){"rms_norm_rope bf16 out", 1e-6, 8e-3}, &nrb);
}

static void matmul_rows(void)
{
    df_view x = input(DF_DTYPE_F32, SHAPE(2, 13, 70), -1, 1);
    df_view w = input(DF_DTYPE_F32, SHAPE(33, 70), -1, 1);
    df_view wb = input(DF_DTYPE_BF16, SHAPE(33, 70), -1, 1);
    df_view wh = input(DF_DTYPE_F16, SHAPE(33, 70), -1, 1);
    df_view bias = input(DF_DTYPE_F32, SHAPE(33), -1, 1);
    struct { df_view w; int compute, act; const char *name; double rtol; } lin[] = {
        {w, DF_DTYPE_F32, DF_ACT_NONE, "linear f32", 1e-5},
        {wb, DF_DTYPE_F32, DF_ACT_GELU_TANH, "linear bf16 weight + gelu_tanh", 1e-5},
        {wh, DF_DTYPE_F32, DF_ACT_SILU, "linear f16 weight + silu", 1e-5},
        {w, DF_DTYPE_BF16, DF_ACT_GELU, "linear bf16 compute + gelu", -1},
    };
    for (size_t i = 0; i < sizeof lin / sizeof *lin; i++) {
        df_view in[3] = {x, lin[i].w, bias};
        df_node n = node(DF_OP_LINEAR, 3, in, output(DF_DTYPE_F32, SHAPE(2, 13, 33)));
        n.a.compute = lin[i].compute;
        n.a.act = lin[i].act;
        if (lin[i].rtol < 0) /* computed in bf16 */
            run(&(row){lin[i].name, bf16_atol(1e-5), 1e-5}, &n);
        else
            run(&(row){lin[i].name, 1e-5, lin[i].rtol}, &n);
    }
    df_view gate = input(DF_DTYPE_F32, SHAPE(33), -1, 1);
    df_view resid = input(DF_DTYPE_F32, SHAPE(2, 13, 33), -1, 1);
    df_view gin[5] = {x, w, bias, gate, resid};
    df_node gl = node(DF_OP_LINEAR, 5, gin, output(DF_DTYPE_F32, SHAPE(2, 13, 33)));
    gl.a.gated = 1;
    run(&(row){"linear gated residual", 1e-5, 1e-5}, &gl);
    df_view bin[3] = {x, wb, bias};
    df_node bo = node(DF_OP_LINEAR, 3, bin, output(DF_DTYPE_BF16, SHAPE(2, 13, 33)));
    bo.a.compute = DF_DTYPE_BF16;
    run(&(row){"linear bf16 compute, bf16 out", bf16_atol(1e-5), 8e-3}, &bo);

    df_view a = input(DF_DTYPE_F32, SHAPE(2, 3, 17, 29), -1, 1);
    df_view b = input(DF_DTYPE_F32, SHAPE(2, 3, 29, 19), -1, 1);
    df_view mm_in[2] = {a, b};
    df_node mm = node(DF_OP_MATMUL, 2, mm_in, output(DF_DTYPE_F32, SHAPE(2, 3, 17, 19)));
    run(&(row){"matmul batched", 1e-5, 1e-5}, &mm);
    df_view bt = input(DF_DTYPE_F32, SHAPE(2, 3, 19, 29), -1, 1);
    df_view mt_in[2] = {a, swapped(bt, 2, 3)};
    df_node mt = node(DF_OP_MATMUL, 2, mt_in, output(DF_DTYPE_F32, SHAPE(2, 3, 17, 19)));
    mt.a.trans_b = 1;
    run(&(row){"matmul b transposed", 1e-5, 1e-5}, &mt);
    df_view b2 = input(DF_DTYPE_BF16, SHAPE(29, 19), -1, 1);
    df_view m2_in[2] = {a, b2};
    df_node m2 = node(DF_OP_MATMUL, 2, m2_in, output(DF_DTYPE_F32, SHAPE(2, 3, 17, 19)));
    m2.a.compute = DF_DTYPE_BF16;
    run(&(row){"matmul 2-d bf16 b, bf16 compute", bf16_atol(1e-5), 1e-5}, &m2);

    df_view cx = input(DF_DTYPE_F32, SHAPE(2, 5, 9, 11), -1, 1);
    df_view cw = input(DF_DTYPE_F32, SHAPE(7, 5, 3, 3), -1, 1);
    df_view cb = input(DF_DTYPE_F32, SHAPE(7), -1, 1);
    df_view c_in[3] = {cx, cw, cb};
    df_node c1 = node(DF_OP_CONV2D, 3, c_in, output(DF_DTYPE_F32, SHAPE(2, 7, 9, 11)));
    c1.a.stride = 1;
    c1.a.padding = 1;
    run(&(row){"conv2d 3x3 pad 1", 1e-5, 1e-5}, &c1);
    df_node c2 = node(DF_OP_CONV2D, 3, c_in, output(DF_DTYPE_F32, SHAPE(2, 7, 4, 5)));
    c2.a.stride = 2;
    c2.a.padding = 0;
    run(&(row){"conv2d 3x3 stride 2", 1e-5, 1e-5}, &c2);
    df_view cwb = input(DF_DTYPE_BF16, SHAPE(7, 5, 1, 1), -1, 1);
    df_view c3_in[3] = {cx, cwb};
    df_node c3 = node(DF_OP_CONV2D, 3, c3_in, output(DF_DTYPE_F32, SHAPE(2, 7, 9, 11)));
    c3.a.stride = 1;
    c3.a.compute = DF_DTYPE_BF16;
    run(&(row){"conv2d 1x1 bf16", bf16_atol(1e-5), 1e-5}, &c3);
}

static void attention_rows(void)
{
    df_view q = input(DF_DTYPE_F32, SHAPE(2, 3, 37, 16), -1, 1);
    df_view k = input(DF_DTYPE_F32, SHAPE(2, 3, 150, 16), -1, 1);
    df_view v = input(DF_DTYPE_F32, SHAPE(2, 3, 150, 24), -1, 1);
    df_view in[4] = {q, k, v};
    df_node a = node(DF_OP_ATTENTION, 4, in, output(DF_DTYPE_F32, SHAPE(2, 37, 3, 24)));
    a.a.scale = 0.25;
    run(&(row){"attention", 1e-6, 1e-5}, &a);
    df_view mask = input(DF_DTYPE_F32, SHAPE(2, 1, 1, 150), -2, 0);
    mask.shape[1] = 3, mask.stride[1] = 0, mask.shape[2] = 37, mask.stride[2] = 0;
    df_view min[4] = {q, k, v, mask};
    df_node am = node(DF_OP_ATTENTION, 4, min, output(DF_DTYPE_F32, SHAPE(2, 37, 3, 24)));
    am.a.scale = 0.25;
    run(&(row){"attention broadcast mask", 1e-6, 1e-5}, &am);
    df_view qs = input(DF_DTYPE_F32, SHAPE(2, 70, 3, 16), -1, 1); /* [B, S, H, D] seen permuted */
    df_view qp = swapped(qs, 1, 2);
    df_view ks = input(DF_DTYPE_F32, SHAPE(2, 70, 3, 16), -1, 1);
    df_view kp = swapped(ks, 1, 2);
    df_view cin[4] = {qp, kp, kp};
    df_node ac = node(DF_OP_ATTENTION, 4, cin, output(DF_DTYPE_F32, SHAPE(2, 70, 3, 16)));
    ac.a.causal = 1;
    ac.a.scale = 0.25;
    run(&(row){"attention causal strided", 1e-6, 1e-5}, &ac);
    df_node ab = node(DF_OP_ATTENTION, 4, in, output(DF_DTYPE_F32, SHAPE(2, 37, 3, 24)));
    ab.a.compute = DF_DTYPE_BF16;
    ab.a.scale = 0.25;
    /* bf16 probabilities are rounded per block of keys relative to the running max: the
     * CPU's blocks are 512 keys, the shader's 64, so the two round different values */
    run(&(row){"attention bf16 compute", 1e-3, 1e-2}, &ab);
}

static void data_rows(void)
{
    df_view x = input(DF_DTYPE_F32, SHAPE(2, 3, 4, 5), -1, 1);
    df_node up = node(DF_OP_UPSAMPLE2X, 1, &x, output(DF_DTYPE_F32, SHAPE(2, 3, 8, 10)));
    run(&(row){"upsample_nearest2x", 0, 0}, &up);
    df_view a = input(DF_DTYPE_F32, SHAPE(2, 3, 5), -1, 1);
    df_view b = input(DF_DTYPE_BF16, SHAPE(2, 4, 5), -1, 1);
    df_view in[2] = {a, b};
    df_node cat = node(DF_OP_CONCAT, 2, in, output(DF_DTYPE_F32, SHAPE(2, 7, 5)));
    cat.a.axis = 1;
    run(&(row){"concat dim 1", 0, 0}, &cat);
    df_view table = input(DF_DTYPE_BF16, SHAPE(20, 12), -1, 1);
    df_view ids = input(DF_DTYPE_I32, SHAPE(2, 9), 0, 20);
    df_view gin[2] = {table, ids};
    df_node g = node(DF_OP_GATHER, 2, gin, output(DF_DTYPE_F32, SHAPE(2, 9, 12)));
    run(&(row){"gather bf16 table, i32 ids", 0, 0}, &g);
    df_view ids64 = input(DF_DTYPE_I64, SHAPE(11), 0, 20);
    df_view g64in[2] = {table, ids64};
    df_node g64 = node(DF_OP_GATHER, 2, g64in, output(DF_DTYPE_F32, SHAPE(11, 12)));
    run(&(row){"gather i64 ids", 0, 0}, &g64);
    df_view tok = input(DF_DTYPE_I64, SHAPE(5, 77), 0, 6);
    df_node tr = node(DF_OP_TOKEN_ROWS, 1, &tok, output(DF_DTYPE_I64, SHAPE(5)));
    tr.a.token = 3;
    run(&(row){"token_rows first match", 0, 0}, &tr);
    df_view tok32 = input(DF_DTYPE_I32, SHAPE(4, 77), 0, 50000);
    df_node am = node(DF_OP_TOKEN_ROWS, 1, &tok32, output(DF_DTYPE_I64, SHAPE(4)));
    am.a.token = -1;
    run(&(row){"token_rows argmax", 0, 0}, &am);
}

/* An id outside the table: the CPU's error (DF_E_ARG, naming the id, its position and the
 * table's rows) from the device's next wait, not a row of garbage; then it runs again. */
static void gather_out_of_range(void)
{
    df_status s = dvk_finish(g_dev); /* nothing pending from the rows before */
    df_view table = input(DF_DTYPE_F32, SHAPE(6, 4), -1, 1);
    df_view ids = input(DF_DTYPE_I32, SHAPE(5), 0, 6);
    twin *tw = (twin *)ids.buf;
    ((int32_t *)tw->cpu.ptr)[3] = 6;
    if (s == DF_OK)
        s = dvk_upload(g_dev, tw->dev->addr, tw->cpu.ptr, tw->bytes);
    df_view gin[2] = {table, ids};
    df_node g = node(DF_OP_GATHER, 2, gin, output(DF_DTYPE_F32, SHAPE(5, 4)));
    dvk_env e = {.d = g_dev, .addr = addr_of};
    if (s == DF_OK)
        s = dvk_run_node(&e, &g);
    if (s == DF_OK)
        s = dvk_finish(g_dev);
    const char *msg = df_error_message();
    bool ok = s == DF_E_ARG && strstr(msg, "id 6 at position 3") && strstr(msg, "6 rows");
    printf("%s gather id out of range: %s: %s\n", ok ? "ok  " : "FAIL", df_status_name(s), msg);
    g_failures += !ok;
    g_dev->failed = DF_OK; /* as stream_reset */
}

static void fused_rows(void)
{
    for (int variant = 0; variant < 3; variant++) {
        df_fused f = {.n_in = 3};
        df_view x = input(DF_DTYPE_F32, SHAPE(3, 4, 200), -2, 2);
        df_view s = input(DF_DTYPE_BF16, SHAPE(3, 1, 200), -1, 1);
        s.shape[1] = 4, s.stride[1] = 0; /* broadcast over the rows of a sample */
        df_view hx = input(DF_DTYPE_F32, SHAPE(3, 4, 200), 1, 3);
        f.in[0] = x;
        f.in[1] = s;
        f.in[2] = swapped(input(DF_DTYPE_F32, SHAPE(3, 200, 4), -1, 1), 1, 2);
        f.head_op = variant == 0 ? -1 : variant == 1 ? DF_OP_LAYER_NORM : DF_OP_RMS_NORM;
        f.head_x = hx;
        f.head_eps = 1e-6;
        if (variant == 2)
            f.head_w = input(DF_DTYPE_F32, SHAPE(200), 0.5, 1.5);
        const df_fused_insn prog[] = {
            {DF_FI_LOAD, 0, 0, 0, 0, 0},    {DF_FI_LOAD, 1, 1, 0, 0, 0},
            {DF_OP_SCALE, 2, 1, 0, 1, 1},   {DF_OP_MUL, 3, 0, 2, 0, 0},
            {DF_OP_SILU, 4, 3, 0, 0, 0},    {DF_FI_LOAD, 5, 2, 0, 0, 0},
            {DF_OP_GELU_TANH, 6, 5, 0, 0, 0}, {DF_OP_ADD, 7, 4, 6, 0, 0},
            {DF_FI_HEAD, 8, 0, 0, 0, 0},    {DF_OP_SUB, 9, 7, 8, 0, 0},
            {DF_OP_GELU, 10, 9, 0, 0, 0},   {DF_OP_DIV, 11, 10, 2, 0, 0},
        };
        int n_insn = (int)(sizeof prog / sizeof *prog);
        if (f.head_op < 0) { /* no head: replace HEAD by a QUICK_GELU of register 0 */
            memcpy(f.insn, prog, sizeof prog);
            f.insn[8] = (df_fused_insn){DF_OP_QUICK_GELU, 8, 0, 0, 0, 0};
        } else {
            memcpy(f.insn, prog, sizeof prog);
        }
        f.n_insn = n_insn;
        f.n_regs = 12;
        f.out_reg = 11;
        f.out = output(variant == 2 ? DF_DTYPE_BF16 : DF_DTYPE_F32, SHAPE(3, 4, 200));
        const char *names[] = {"fused program", "fused program, layer-norm head",
                               "fused program, rms head, bf16 out"};
        row r = {names[variant], 1e-5, variant == 2 ? 8e-3 : 2e-5};
        df_kernel_env env = {.threads = 1};
        df_status st = df_cpu_run_fused(&f, &env);
        df_aligned_free(env.scratch);
        dvk_env e = {.d = g_dev, .addr = addr_of};
        if (st == DF_OK)
            st = dvk_run_fused(&e, &f);
        if (st != DF_OK) {
            printf("FAIL %-34s %s\n", r.name, df_error_message());
            g_failures++;
            continue;
        }
        compare(&r, &f.out);
    }
}

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec * 1e-6;
}

/* GFLOP/s of an [n, n] x [n, n] f32 product on the device and on the CPU kernels (2
 * threads), after one warm-up each; the results are compared too. */
static void bench(int64_t n)
{
    df_view a = input(DF_DTYPE_F32, SHAPE(n, n), -1, 1), b = input(DF_DTYPE_F32, SHAPE(n, n), -1, 1);
    df_view in[2] = {a, b};
    df_node mm = node(DF_OP_MATMUL, 2, in, output(DF_DTYPE_F32, SHAPE(n, n)));
    dvk_env e = {.d = g_dev, .addr = addr_of};
    double flop = 2.0 * (double)n * (double)n * (double)n, t_vk = 0, t_cpu = 0;
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now_ms();
        if (dvk_run_node(&e, &mm) != DF_OK || dvk_finish(g_dev) != DF_OK) {
            printf("FAIL bench: %s\n", df_error_message());
            g_failures++;
            return;
        }
        t_vk = now_ms() - t0;
        df_kernel_env env = {.threads = 2};
        t0 = now_ms();
        df_cpu_run_node(&mm, &env);
        t_cpu = now_ms() - t0;
        df_aligned_free(env.scratch);
    }
    printf("bench matmul %lld^3 f32: vulkan %.2f GFLOP/s (%.1f ms), cpu %.2f GFLOP/s (%.1f ms)\n",
           (long long)n, flop / t_vk * 1e-6, t_vk, flop / t_cpu * 1e-6, t_cpu);
    compare(&(row){"bench matmul", 1e-4, 1e-4}, &mm.out);
}

int main(int argc, char **argv)
{
    bool expect_cache = argc > 1 && strcmp(argv[1], "--expect-cache") == 0;
    int64_t bench_n = argc > 2 && strcmp(argv[1], "--bench") == 0 ? atoll(argv[2]) : 0;
    double t_open = now_ms();
    df_status s = dvk_device_open(0, &g_dev);
    t_open = now_ms() - t_open;
    if (argc > 1 && strcmp(argv[1], "--expect-no-driver") == 0) {
        /* run with the loader pointed at no driver: a clear DF_E_UNSUPPORTED, no crash */
        const char *msg = df_error_message();
        bool ok = s == DF_E_UNSUPPORTED && strstr(msg, "driver");
        printf("%s open without a driver: %s: %s\n", ok ? "ok  " : "FAIL", df_status_name(s), msg);
        if (s == DF_OK)
            dvk_device_close(g_dev);
        return ok ? 0 : 1;
    }
    if (vk_test_skipped(s))
        return 77;
    printf("device: %s (%s), subgroup %u, fp16 %d, int8 %d, coopmat %d\n", g_dev->info.name,
           g_dev->info.driver, g_dev->info.subgroup_size, g_dev->info.fp16, g_dev->info.int8,
           g_dev->info.coopmat);
    printf("open %.1f ms, pipeline cache %s: %zu bytes loaded\n", t_open, g_dev->cache_path,
           g_dev->cache_loaded_bytes);
    if (bench_n > 0) {
        bench(bench_n);
        twins_free();
        dvk_device_close(g_dev);
        return g_failures ? 1 : 0;
    }
    double t_rows = now_ms();
    elementwise_rows();
    norm_rows();
    position_rows();
    matmul_rows();
    attention_rows();
    data_rows();
    gather_out_of_range();
    fused_rows();
    t_rows = now_ms() - t_rows;
    /* positions: everything recorded so far is reached once waited for */
    uint64_t at = dvk_position(g_dev);
    if (at == 0 || !dvk_reached(g_dev, at, true) || !dvk_reached(g_dev, at, false)) {
        printf("FAIL position %llu not reached after waiting\n", (unsigned long long)at);
        g_failures++;
    }
    twins_free();
    s = dvk_finish(g_dev);
    if (s != DF_OK) {
        printf("FAIL finish: %s\n", df_error_message());
        g_failures++;
    }
    printf("dispatches %lld, submits %lld, barriers %lld, bytes up %lld, down %lld, "
           "pipelines %lld\n",
           (long long)g_dev->stats.dispatches, (long long)g_dev->stats.submits,
           (long long)g_dev->stats.barriers, (long long)g_dev->stats.bytes_up,
           (long long)g_dev->stats.bytes_down, (long long)g_dev->stats.pipelines_created);
    printf("rows %.0f ms, of which making %lld pipelines %.1f ms\n", t_rows,
           (long long)g_dev->stats.pipelines_created, g_dev->stats.pipeline_ms);
    if (expect_cache && g_dev->cache_loaded_bytes == 0) {
        printf("FAIL --expect-cache: no pipeline cache was loaded from %s\n", g_dev->cache_path);
        g_failures++;
    }
    return vk_test_finish();
}
