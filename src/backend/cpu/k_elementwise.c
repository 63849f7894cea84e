/*
 * Elementwise kernels: copy/cast, fill, binary arithmetic (add, sub, mul, div) and unary
 * activations (scale, silu, gelu, gelu_tanh, quick_gelu).
 *
 * Every kernel here walks its operands the same way. The shape rules hand the binary ops
 * inputs already broadcast to the output's shape (stride 0 where a dimension stretches),
 * so a walk sees only "operands with strides over one shape". The walk first drops
 * dimensions of size 1 and merges neighbours that every operand steps through evenly, so
 * dense tensors become one long row and a [B, S, D] x [B, 1, D] product becomes rows of D.
 * The flat index range is then cut into one block per thread (OpenMP `parallel for`,
 * static), and each block runs a segment function on runs of the innermost dimension. The
 * dtype and op are decided once per segment, never per element: a segment that is f32
 * with unit stride is read in place, a stride-0 operand becomes a scalar, anything else is
 * converted into a small f32 buffer first. The inner loops are plain C that gcc vectorises
 * (-mavx2 -mfma -mf16c), including the f32/bf16/f16 conversions and the exponential of
 * the sigmoid-based activations (k_common.h; about 1 ulp); those activations take 16 lanes
 * at a time with AVX-512 where the CPU has it (the same bits). GELU keeps libm's erfcf,
 * written as 0.5 x erfc(-x/sqrt 2) so that negative inputs keep their relative accuracy.
 *
 * Casts follow df_convert: f32 <-> bf16/f16 round to nearest even and keep NaN; integer to
 * integer copies are exact (narrowing wraps as C does); floats to integers truncate toward
 * zero and saturate (NaN -> 0) so that no input is undefined behaviour.
 */
#include <math.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/k_common.h"
#include "core/status.h"

/* ---- the walk ------------------------------------------------------------------------- */

#define WALK_OPS 3

typedef struct walk {
    int nd, nops;
    int64_t total;
    int64_t shape[DF_MAX_DIMS];
    int64_t stride[WALK_OPS][DF_MAX_DIMS]; /* elements */
    char *base[WALK_OPS];                  /* the element at each view's offset */
    size_t esize[WALK_OPS];
} walk;

/* A segment: `len` elements of the innermost dimension; p[k] points at operand k's first
 * element, s[k] is its stride in elements. Operand 0 is the destination. */
typedef void (*segment_fn)(const void *arg, char *const p[], const int64_t s[], int64_t len);

static void walk_init(walk *w, int nops, const df_view *const v[], int ndim, const int64_t *shape)
{
    w->nops = nops;
    w->nd = 0;
    w->total = 1;
    for (int k = 0; k < nops; k++) {
        w->base[k] = df_view_ptr(v[k]);
        w->esize[k] = df_dtype_size(v[k]->dtype);
    }
    for (int d = 0; d < ndim; d++) {
        w->total *= shape[d];
        if (shape[d] == 1)
            continue;
        bool merge = w->nd > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = w->stride[k][w->nd - 1] == v[k]->stride[d] * shape[d];
        if (merge) {
            w->shape[w->nd - 1] *= shape[d];
            for (int k = 0; k < nops; k++)
                w->stride[k][w->nd - 1] = v[k]->stride[d];
        } else {
            w->shape[w->nd] = shape[d];
            for (int k = 0; k < nops; k++)
                w->stride[k][w->nd] = v[k]->stride[d];
            w->nd++;
        }
    }
    if (w->nd == 0) { /* a single element */
        w->nd = 1;
        w->shape[0] = 1;
        for (int k = 0; k < nops; k++)
            w->stride[k][0] = 1;
    }
}

/* Runs fn over the walk: one block of the flat index range per thread; within a block an
 * odometer over the outer dimensions, so no division per segment. */
static void walk_run(const walk *w, int threads, segment_fn fn, const void *arg)
{
    if (w->total == 0)
        return;
    int nd = w->nd, nops = w->nops;
    int64_t inner = w->shape[nd - 1];
    int nblk = w->total >= DF_CPU_PAR_MIN ? threads : 1;
    int64_t chunk = (w->total + nblk - 1) / nblk;
    #pragma omp parallel for schedule(static) num_threads(nblk) if (nblk > 1)
    for (int b = 0; b < nblk; b++) {
        int64_t e = (int64_t)b * chunk, end = e + chunk < w->total ? e + chunk : w->total;
        int64_t idx[DF_MAX_DIMS], rest = e;
        for (int d = nd - 1; d >= 0; d--) {
            idx[d] = rest % w->shape[d];
            rest /= w->shape[d];
        }
        int64_t s[WALK_OPS];
        for (int k = 0; k < nops; k++)
            s[k] = w->stride[k][nd - 1];
        while (e < end) {
            char *p[WALK_OPS];
            for (int k = 0; k < nops; k++) {
                int64_t off = 0;
                for (int d = 0; d < nd; d++)
                    off += idx[d] * w->stride[k][d];
                p[k] = w->base[k] + off * (int64_t)w->esize[k];
            }
            int64_t len = inner - idx[nd - 1];
            if (len > end - e)
                len = end - e;
            fn(arg, p, s, len);
            e += len;
            idx[nd - 1] += len;
            for (int d = nd - 1; d > 0 && idx[d] == w->shape[d]; d--) {
                idx[d] = 0;
                idx[d - 1]++;
            }
        }
    }
}

/* ---- conversions ---------------------------------------------------------------------- */

/* Converts n elements from src (stride ss) to dst (stride ds), strides in elements. */
typedef void (*convert_fn)(const void *src, int64_t ss, void *dst, int64_t ds, int64_t n);

#define CONVERT_FN(name, ST, DT, EXPR)                                                             \
    static void name(const void *src_, int64_t ss, void *dst_, int64_t ds, int64_t n)              \
    {                                                                                              \
        const ST *restrict s = src_;                                                               \
        DT *restrict d = dst_;                                                                     \
        if (ss == 1 && ds == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                ST v = s[i];                                                                       \
                d[i] = EXPR;                                                                       \
            }                                                                                      \
        } else if (ds == 1) {                                                                      \
            for (int64_t i = 0; i < n; i++) {                                                      \
                ST v = s[i * ss];                                                                  \
                d[i] = EXPR;                                                                       \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                ST v = s[i * ss];                                                                  \
                d[i * ds] = EXPR;                                                                  \
            }                                                                                      \
        }                                                                                          \
    }

static inline int64_t sat_i64(double v)
{
    return v != v ? 0 : v <= -0x1p63 ? INT64_MIN : v >= 0x1p63 ? INT64_MAX : (int64_t)v;
}
static inline int32_t sat_i32(double v)
{
    return v != v ? 0 : v <= -0x1p31 ? INT32_MIN : v >= 0x1p31 ? INT32_MAX : (int32_t)v;
}
static inline uint8_t sat_u8(double v)
{
    return v != v || v <= 0 ? 0 : v >= 255 ? 255 : (uint8_t)v;
}

/* Each source dtype widens to f32 (the small floats), f64 or i64 without loss ... */
#define WIDEN_F32(v)  (v)
#define WIDEN_BF16(v) df_cpu_bf16_f32(v)
#define WIDEN_F16(v)  df_cpu_f16_f32(v)
#define WIDEN_F64(v)  (v)
#define WIDEN_I32(v)  ((int64_t)(v))
#define WIDEN_I64(v)  (v)
#define WIDEN_U8(v)   ((int64_t)(v))
#define KIND_F32      F
#define KIND_BF16     F
#define KIND_F16      F
#define KIND_F64      D
#define KIND_I32      I
#define KIND_I64      I
#define KIND_U8       I
/* ... and each destination narrows from those three (F: float, D: double, I: int64). */
#define NARROW_F32_F(x)  (x)
#define NARROW_F32_D(x)  ((float)(x))
#define NARROW_F32_I(x)  ((float)(x))
#define NARROW_BF16_F(x) df_cpu_f32_bf16(x)
#define NARROW_BF16_D(x) df_cpu_f32_bf16((float)(x))
#define NARROW_BF16_I(x) df_cpu_f32_bf16((float)(x))
#define NARROW_F16_F(x)  df_cpu_f32_f16(x)
#define NARROW_F16_D(x)  df_cpu_f32_f16((float)(x))
#define NARROW_F16_I(x)  df_cpu_f32_f16((float)(x))
#define NARROW_F64_F(x)  ((double)(x))
#define NARROW_F64_D(x)  (x)
#define NARROW_F64_I(x)  ((double)(x))
#define NARROW_I32_F(x)  sat_i32(x)
#define NARROW_I32_D(x)  sat_i32(x)
#define NARROW_I32_I(x)  ((int32_t)(x))
#define NARROW_I64_F(x)  sat_i64(x)
#define NARROW_I64_D(x)  sat_i64(x)
#define NARROW_I64_I(x)  (x)
#define NARROW_U8_F(x)   sat_u8(x)
#define NARROW_U8_D(x)   sat_u8(x)
#define NARROW_U8_I(x)   ((uint8_t)(x))

#define NARROW_(D, K, x) NARROW_##D##_##K(x)
#define NARROW(D, K, x)  NARROW_(D, K, x)

/* The dtypes, twice: a macro cannot expand itself, and the table is a list of lists. */
/* clang-format off */
#define DTYPES_OUTER(X, ...)                                                                       \
    X(F32, float, __VA_ARGS__)    X(BF16, uint16_t, __VA_ARGS__) X(F16, uint16_t, __VA_ARGS__)     \
    X(F64, double, __VA_ARGS__)   X(I32, int32_t, __VA_ARGS__)   X(I64, int64_t, __VA_ARGS__)      \
    X(U8, uint8_t, __VA_ARGS__)
#define DTYPES_INNER(X, ...)                                                                       \
    X(F32, float, __VA_ARGS__)    X(BF16, uint16_t, __VA_ARGS__) X(F16, uint16_t, __VA_ARGS__)     \
    X(F64, double, __VA_ARGS__)   X(I32, int32_t, __VA_ARGS__)   X(I64, int64_t, __VA_ARGS__)      \
    X(U8, uint8_t, __VA_ARGS__)
/* clang-format on */

#define DEF_CONVERT(D, DT, S, ST)                                                                  \
    CONVERT_FN(convert_##S##_##D, ST, DT, NARROW(D, KIND_##S, WIDEN_##S(v)))
#define DEF_CONVERTS_FROM(S, ST, unused) DTYPES_INNER(DEF_CONVERT, S, ST)
DTYPES_OUTER(DEF_CONVERTS_FROM, 0)

#define ROW_ENTRY(D, DT, S)      [DF_DTYPE_##D] = convert_##S##_##D,
#define TABLE_ROW(S, ST, unused) [DF_DTYPE_##S] = {DTYPES_INNER(ROW_ENTRY, S)},
static const convert_fn convert_table[DF_DTYPE_COUNT][DF_DTYPE_COUNT] = {
    DTYPES_OUTER(TABLE_ROW, 0)};

/* Same dtype: a copy by element size. */
#define COPY_FN(name, T)                                                                           \
    static void name(const void *src_, int64_t ss, void *dst_, int64_t ds, int64_t n)              \
    {                                                                                              \
        const T *restrict s = src_;                                                                \
        T *restrict d = dst_;                                                                      \
        if (ss == 1 && ds == 1)                                                                    \
            memcpy(d, s, (size_t)n * sizeof(T));                                                   \
        else if (ds == 1)                                                                          \
            for (int64_t i = 0; i < n; i++)                                                        \
                d[i] = s[i * ss];                                                                  \
        else                                                                                       \
            for (int64_t i = 0; i < n; i++)                                                        \
                d[i * ds] = s[i * ss];                                                             \
    }
COPY_FN(copy_1, uint8_t)
COPY_FN(copy_2, uint16_t)
COPY_FN(copy_4, uint32_t)
COPY_FN(copy_8, uint64_t)

#ifdef __F16C__
#include <immintrin.h>

/* f32 -> f16 with the F16C instruction, which rounds exactly as df_f32_to_f16 does (checked
 * over all 2^32 inputs, NaN payloads included). The other direction keeps the bit-exact C
 * version: the instruction quiets signalling NaNs, the library does not. */
static void convert_f32_f16_f16c(const void *src, int64_t ss, void *dst, int64_t ds, int64_t n)
{
    if (ss != 1 || ds != 1) {
        convert_F32_F16(src, ss, dst, ds, n);
        return;
    }
    const float *s = src;
    uint16_t *d = dst;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        d[i] = df_cpu_f32_f16(s[i]);
}
#endif

static convert_fn converter(df_dtype from, df_dtype to)
{
#ifdef __F16C__
    if (from == DF_DTYPE_F32 && to == DF_DTYPE_F16)
        return convert_f32_f16_f16c;
#endif
    if (from != to)
        return convert_table[from][to];
    switch (df_dtype_size(from)) {
    case 1:
        return copy_1;
    case 2:
        return copy_2;
    case 4:
        return copy_4;
    default:
        return copy_8;
    }
}

void df_cpu_load_f32(const void *src, df_dtype t, int64_t stride, float *dst, int64_t n)
{
    converter(t, DF_DTYPE_F32)(src, stride, dst, 1, n);
}

/* ---- copy ----------------------------------------------------------------------------- */

typedef struct copy_arg {
    convert_fn fn;
} copy_arg;

static void copy_segment(const void *arg, char *const p[], const int64_t s[], int64_t len)
{
    ((const copy_arg *)arg)->fn(p[1], s[1], p[0], s[0], len);
}

/* A transpose-like copy (the source's innermost stride is not 1 but another dimension's
 * is) reads one cache line per element when walked row by row; walking square tiles of
 * those two dimensions reuses every line it loads. */
#define TILE 32

typedef struct tiled {
    walk w;
    int dim; /* the dimension in which the source is unit-stride */
    convert_fn fn;
} tiled;

static bool tiled_plan(const walk *w, convert_fn fn, tiled *t)
{
    int nd = w->nd;
    if (nd < 2 || w->stride[1][nd - 1] == 1 || w->stride[0][nd - 1] != 1 || w->shape[nd - 1] < TILE)
        return false;
    for (int d = nd - 2; d >= 0; d--) {
        if (w->stride[1][d] == 1 && w->shape[d] >= TILE) {
            t->w = *w;
            t->dim = d;
            t->fn = fn;
            return true;
        }
    }
    return false;
}

static void tiled_run(const tiled *t, int threads)
{
    const walk *w = &t->w;
    int nd = w->nd, dim = t->dim, last = nd - 1;
    int64_t rows = w->shape[dim], cols = w->shape[last];
    int64_t row_tiles = (rows + TILE - 1) / TILE, col_tiles = (cols + TILE - 1) / TILE;
    int64_t outer = w->total / (rows * cols);
    int64_t tasks = outer * row_tiles * col_tiles;
    int nt = w->total >= DF_CPU_PAR_MIN ? threads : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t task = 0; task < tasks; task++) {
        int64_t ct = task % col_tiles, rt = task / col_tiles % row_tiles;
        int64_t o = task / col_tiles / row_tiles;
        int64_t off[2] = {0, 0};
        for (int d = nd - 1; d >= 0; d--) { /* the outer index, skipping the tile dims */
            if (d == dim || d == last)
                continue;
            int64_t i = o % w->shape[d];
            o /= w->shape[d];
            off[0] += i * w->stride[0][d];
            off[1] += i * w->stride[1][d];
        }
        int64_t r0 = rt * TILE, r1 = r0 + TILE < rows ? r0 + TILE : rows;
        int64_t c0 = ct * TILE, c1 = c0 + TILE < cols ? c0 + TILE : cols;
        for (int64_t r = r0; r < r1; r++) {
            char *dst = w->base[0] + (off[0] + r * w->stride[0][dim] + c0) * (int64_t)w->esize[0];
            char *src = w->base[1] + (off[1] + r * w->stride[1][dim] + c0 * w->stride[1][last]) *
                                         (int64_t)w->esize[1];
            t->fn(src, w->stride[1][last], dst, 1, c1 - c0);
        }
    }
}

void df_cpu_copy_view(const df_view *dst, const df_view *src, int threads)
{
    walk w;
    walk_init(&w, 2, (const df_view *const[]){dst, src}, src->ndim, src->shape);
    copy_arg arg = {converter(src->dtype, dst->dtype)};
    tiled t;
    if (tiled_plan(&w, arg.fn, &t))
        tiled_run(&t, threads);
    else
        walk_run(&w, threads, copy_segment, &arg);
}

DF_CPU_KERNEL(copy)
{
    df_cpu_copy_view(&n->out, &n->in[0], df_cpu_threads(env));
    return DF_OK;
}

/* ---- fill ----------------------------------------------------------------------------- */

#define FILL_FN(name, T)                                                                           \
    static void name(void *dst, const void *value, int64_t n)                                      \
    {                                                                                              \
        T v;                                                                                       \
        memcpy(&v, value, sizeof v);                                                               \
        T *restrict d = dst;                                                                       \
        for (int64_t i = 0; i < n; i++)                                                            \
            d[i] = v;                                                                              \
    }
FILL_FN(fill_1, uint8_t)
FILL_FN(fill_2, uint16_t)
FILL_FN(fill_4, uint32_t)
FILL_FN(fill_8, uint64_t)

DF_CPU_KERNEL(fill)
{
    const df_view *out = &n->out;
    int64_t total = df_view_numel(out);
    size_t es = df_dtype_size(out->dtype);
    uint8_t one[8] = {0};
    double value = n->a.value;
    convert_fn to_dtype = converter(DF_DTYPE_F64, out->dtype);
    to_dtype(&value, 1, one, 1, 1);
    void (*fill)(void *, const void *, int64_t) = es == 1   ? fill_1
                                                  : es == 2 ? fill_2
                                                  : es == 4 ? fill_4
                                                            : fill_8;
    char *base = df_view_ptr(out);
    int nblk = total >= DF_CPU_PAR_MIN ? df_cpu_threads(env) : 1;
    int64_t chunk = (total + nblk - 1) / nblk;
    #pragma omp parallel for schedule(static) num_threads(nblk) if (nblk > 1)
    for (int b = 0; b < nblk; b++) {
        int64_t e = (int64_t)b * chunk, len = e + chunk < total ? chunk : total - e;
        if (len > 0)
            fill(base + e * (int64_t)es, one, len);
    }
    return DF_OK;
}

/* ---- binary --------------------------------------------------------------------------- */

/* One op in three forms: vector-vector, vector-scalar, scalar-vector. */
#define BINARY_FNS(name, OP)                                                                       \
    static void name##_vv(float *restrict o, const float *restrict a, const float *restrict b,     \
                          int64_t n)                                                               \
    {                                                                                              \
        for (int64_t i = 0; i < n; i++)                                                            \
            o[i] = a[i] OP b[i];                                                                   \
    }                                                                                              \
    static void name##_vs(float *restrict o, const float *restrict a, float b, int64_t n)          \
    {                                                                                              \
        for (int64_t i = 0; i < n; i++)                                                            \
            o[i] = a[i] OP b;                                                                      \
    }                                                                                              \
    static void name##_sv(float *restrict o, float a, const float *restrict b, int64_t n)          \
    {                                                                                              \
        for (int64_t i = 0; i < n; i++)                                                            \
            o[i] = a OP b[i];                                                                      \
    }
BINARY_FNS(add, +)
BINARY_FNS(sub, -)
BINARY_FNS(mul, *)
BINARY_FNS(div, /)

typedef struct binary_fns {
    void (*vv)(float *restrict, const float *restrict, const float *restrict, int64_t);
    void (*vs)(float *restrict, const float *restrict, float, int64_t);
    void (*sv)(float *restrict, float, const float *restrict, int64_t);
} binary_fns;

typedef struct binary_arg {
    binary_fns f;
    df_dtype ta, tb;
    size_t ea, eb;
} binary_arg;

/* f32 elements per staging buffer: 4 KiB, two of them on the stack per segment. */
#define STAGE 1024

static float load_one(const char *p, df_dtype t)
{
    float v;
    df_cpu_load_f32(p, t, 1, &v, 1);
    return v;
}

static void binary_segment(const void *arg_, char *const p[], const int64_t s[], int64_t len)
{
    const binary_arg *arg = arg_;
    float *o = (float *)p[0];
    bool a_scalar = s[1] == 0, b_scalar = s[2] == 0;
    bool a_direct = !a_scalar && s[1] == 1 && arg->ta == DF_DTYPE_F32;
    bool b_direct = !b_scalar && s[2] == 1 && arg->tb == DF_DTYPE_F32;
    float xa = a_scalar ? load_one(p[1], arg->ta) : 0.0f;
    float xb = b_scalar ? load_one(p[2], arg->tb) : 0.0f;
    int64_t step = (a_scalar || a_direct) && (b_scalar || b_direct) ? len : STAGE;
    float stage_a[STAGE], stage_b[STAGE];
    for (int64_t i = 0; i < len; i += step) {
        int64_t cnt = len - i < step ? len - i : step;
        const float *a = NULL, *b = NULL;
        if (a_direct) {
            a = (const float *)p[1] + i;
        } else if (!a_scalar) {
            df_cpu_load_f32(p[1] + i * s[1] * (int64_t)arg->ea, arg->ta, s[1], stage_a, cnt);
            a = stage_a;
        }
        if (b_direct) {
            b = (const float *)p[2] + i;
        } else if (!b_scalar) {
            df_cpu_load_f32(p[2] + i * s[2] * (int64_t)arg->eb, arg->tb, s[2], stage_b, cnt);
            b = stage_b;
        }
        if (a && b)
            arg->f.vv(o + i, a, b, cnt);
        else if (a)
            arg->f.vs(o + i, a, xb, cnt);
        else if (b)
            arg->f.sv(o + i, xa, b, cnt);
        else { /* both scalars: one value repeated */
            float r;
            arg->f.vs(&r, &xa, xb, 1);
            fill_4(o + i, &r, cnt);
        }
    }
}

DF_CPU_KERNEL(binary)
{
    static const binary_fns fns[] = {
        {add_vv, add_vs, add_sv},
        {sub_vv, sub_vs, sub_sv},
        {mul_vv, mul_vs, mul_sv},
        {div_vv, div_vs, div_sv},
    };
    const df_view *out = &n->out;
    binary_arg arg = {
        .f = fns[n->op == DF_OP_ADD   ? 0
                 : n->op == DF_OP_SUB ? 1
                 : n->op == DF_OP_MUL ? 2
                                      : 3],
        .ta = n->in[0].dtype,
        .tb = n->in[1].dtype,
        .ea = df_dtype_size(n->in[0].dtype),
        .eb = df_dtype_size(n->in[1].dtype),
    };
    walk w;
    walk_init(&w, 3, (const df_view *const[]){out, &n->in[0], &n->in[1]}, out->ndim, out->shape);
    walk_run(&w, df_cpu_threads(env), binary_segment, &arg);
    return DF_OK;
}

/* ---- unary ---------------------------------------------------------------------------- */

static void act_scale(float *restrict o, const float *restrict x, int64_t n, float alpha,
                      float beta)
{
    for (int64_t i = 0; i < n; i++)
        o[i] = alpha * x[i] + beta;
}

/* The sigmoid-based activations, x * sigmoid(u(x)), 16 lanes at a time where the CPU has
 * AVX-512 (k_common.h's df_cpu_x_sigmoid16: the scalar loop's bits, which gcc vectorises
 * only to AVX2). The scalar loop finishes the tail. */
enum sigmoid_act { ACT_SILU, ACT_GELU_TANH, ACT_QUICK_GELU };

/* u(x) of each activation: silu x; gelu_tanh 2 sqrt(2/pi) (x + 0.044715 x^3), as
 * 0.5 x (1 + tanh(y)) = x sigmoid(2y); quick_gelu 1.702 x. */
static inline float sigmoid_arg(enum sigmoid_act a, float v)
{
    if (a == ACT_GELU_TANH)
        return 1.5957691216057308f * v * (1.0f + 0.044715f * v * v);
    return a == ACT_QUICK_GELU ? 1.702f * v : v;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static inline __m512 sigmoid_arg16(enum sigmoid_act a,
                                                                      __m512 v)
{
    if (a == ACT_GELU_TANH) { /* the scalar expression's order: (c v) (1 + (c' v) v) */
        __m512 cube = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.044715f), v), v);
        __m512 lin = _mm512_mul_ps(_mm512_set1_ps(1.5957691216057308f), v);
        return _mm512_mul_ps(lin, _mm512_add_ps(_mm512_set1_ps(1.0f), cube));
    }
    return a == ACT_QUICK_GELU ? _mm512_mul_ps(_mm512_set1_ps(1.702f), v) : v;
}

/* The first n - n % 16 elements; returns how many it did. */
__attribute__((target("avx512f"))) static int64_t x_sigmoid_avx512(enum sigmoid_act a,
                                                                   float *restrict o,
                                                                   const float *restrict x,
                                                                   int64_t n)
{
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(o + i, df_cpu_x_sigmoid16(v, sigmoid_arg16(a, v)));
    }
    return i;
}
#endif

static inline void x_sigmoid_row(enum sigmoid_act a, float *restrict o, const float *restrict x,
                                 int64_t n)
{
    int64_t i = 0;
#if defined(__x86_64__)
    if (n >= 16 && __builtin_cpu_supports("avx512f"))
        i = x_sigmoid_avx512(a, o, x, n);
#endif
    for (; i < n; i++)
        o[i] = df_cpu_x_sigmoid(x[i], sigmoid_arg(a, x[i]));
}

static void act_silu(float *restrict o, const float *restrict x, int64_t n, float alpha, float beta)
{
    x_sigmoid_row(ACT_SILU, o, x, n);
}

/* 0.5 x (1 + erf(x / sqrt 2)) = 0.5 x erfc(-x / sqrt 2) */
static void act_gelu(float *restrict o, const float *restrict x, int64_t n, float alpha, float beta)
{
    for (int64_t i = 0; i < n; i++) {
        float e = erfcf(-x[i] * 0.70710678118654752f);
        o[i] = e == 0.0f ? -0.0f : 0.5f * x[i] * e; /* the limit at -inf, not NaN */
    }
}

static void act_gelu_tanh(float *restrict o, const float *restrict x, int64_t n, float alpha,
                          float beta)
{
    x_sigmoid_row(ACT_GELU_TANH, o, x, n);
}

static void act_quick_gelu(float *restrict o, const float *restrict x, int64_t n, float alpha,
                           float beta)
{
    x_sigmoid_row(ACT_QUICK_GELU, o, x, n);
}

const df_cpu_unary_fn df_cpu_unary_fns[DF_OP_COUNT] = {
    [DF_OP_SCALE]      = act_scale,
    [DF_OP_SILU]       = act_silu,
    [DF_OP_GELU]       = act_gelu,
    [DF_OP_GELU_TANH]  = act_gelu_tanh,
    [DF_OP_QUICK_GELU] = act_quick_gelu,
};

typedef struct unary_arg {
    df_cpu_unary_fn f;
    float alpha, beta;
    df_dtype t;
    size_t es;
} unary_arg;

static void unary_segment(const void *arg_, char *const p[], const int64_t s[], int64_t len)
{
    const unary_arg *arg = arg_;
    float *o = (float *)p[0];
    if (s[1] == 1 && arg->t == DF_DTYPE_F32) {
        arg->f(o, (const float *)p[1], len, arg->alpha, arg->beta);
        return;
    }
    if (s[1] == 0) { /* an expanded input: one value */
        float x = load_one(p[1], arg->t), r;
        arg->f(&r, &x, 1, arg->alpha, arg->beta);
        fill_4(o, &r, len);
        return;
    }
    float stage[STAGE];
    for (int64_t i = 0; i < len; i += STAGE) {
        int64_t cnt = len - i < STAGE ? len - i : STAGE;
        df_cpu_load_f32(p[1] + i * s[1] * (int64_t)arg->es, arg->t, s[1], stage, cnt);
        arg->f(o + i, stage, cnt, arg->alpha, arg->beta);
    }
}

DF_CPU_KERNEL(unary)
{
    const df_view *out = &n->out;
    unary_arg arg = {
        .alpha = (float)n->a.alpha,
        .beta = (float)n->a.beta,
        .t = n->in[0].dtype,
        .es = df_dtype_size(n->in[0].dtype),
    };
    arg.f = (unsigned)n->op < DF_OP_COUNT ? df_cpu_unary_fns[n->op] : NULL;
    if (!arg.f)
        return df_errorf(DF_E_INTERNAL, "cpu: op '%s' is not a unary op", df_vocab_op_name(n->op));
    walk w;
    walk_init(&w, 2, (const df_view *const[]){out, &n->in[0]}, out->ndim, out->shape);
    walk_run(&w, df_cpu_threads(env), unary_segment, &arg);
    return DF_OK;
}
