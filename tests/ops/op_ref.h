/*
 * The op table's shared machinery, for tests/ops/test_ops.c and the other test_ops_*.c
 * files: everything is static inline so each test program includes its own copy.
 *
 * A row of the table (op_case) names the op through two functions: `run` calls the
 * library on device tensors, `ref` computes the same result on the host in float64. The
 * row also lists its inputs (shape, dtype, value range, and how the tensor is presented
 * to the op: dense, permuted, sliced or expanded), attributes and a tolerance. The driver
 * (ref_run_case) draws the inputs from a generator seeded by the row's name, rounds them
 * to their dtype, computes the reference once, and then runs the op on every device the
 * library lists (cpu, sim, and vulkan where a driver answers; only $DIFFUSE_DEVICE when it
 * names one) and in every execution mode the context accepts, comparing each result with
 * |got - want| <= atol + rtol * |want|. A run on a device that keeps counters (sim, vulkan)
 * must move its dispatch counter, which proves the kernels ran there and not on the CPU.
 *
 * To add rows for another op (say in test_ops_matmul.c):
 *
 *     static df_tensor *run_mm(df_ctx *ctx, const op_case *c, df_tensor *const in[])
 *     {
 *         return df_matmul(ctx, in[0], in[1]);
 *     }
 *     static void ref_mm(const op_case *c, const ref_tensor in[], ref_tensor *out)
 *     {
 *         *out = ref_alloc(2, (int64_t[]){in[0].shape[0], in[1].shape[1]}, DF_DTYPE_F32);
 *         ...  (float64 loops over in[k].data, row-major)
 *     }
 *     static const op_case cases[] = {
 *         {"matmul permuted b", run_mm, ref_mm, 2,
 *          {REF_IN(5, 7), REF_IN_VIEW(REF_PERMUTED, 7, 3)}, .atol = 1e-5, .rtol = 1e-5},
 *         {"matmul bf16 b", run_mm, ref_mm, 2,
 *          {REF_IN(5, 7), REF_IN_T(DF_DTYPE_BF16, REF_DENSE, 7, 3)}, .atol = 1e-5},
 *     };
 *     int main(void)
 *     {
 *         ref_print_modes("test_ops_matmul");
 *         return ref_run_table("matmul", cases, sizeof cases / sizeof *cases) ? 1 : 0;
 *     }
 *
 * Inputs are f32 unless .dtype says otherwise, with values in [-1, 1) unless .lo/.hi
 * say otherwise (integer dtypes: whole numbers in [lo, hi)). Attributes go in .i[] and
 * .f[], which run and ref read as they like.
 */
#ifndef DF_TESTS_OP_REF_H
#define DF_TESTS_OP_REF_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/ops.h>
#include <diffuse/runtime.h>

/* ---- a seeded generator (splitmix64) ------------------------------------------------- */

typedef struct ref_rng {
    uint64_t s;
} ref_rng;

static inline uint64_t ref_next(ref_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi). */
static inline double ref_uniform(ref_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(ref_next(r) >> 11) * 0x1p-53;
}

static inline uint64_t ref_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* ---- rounding to a dtype, written independently of the library ------------------------ */

/* v rounded to nearest even with `bits` significant bits, exponent at least emin, and
 * infinity beyond `max`. */
static inline double ref_round_float(double v, int bits, int emin, double max)
{
    if (v == 0 || !isfinite(v))
        return v;
    int e = ilogb(v);
    if (e < emin)
        e = emin;
    double q = ldexp(1.0, e - (bits - 1));
    double r = nearbyint(v / q) * q;
    return fabs(r) > max ? copysign(INFINITY, v) : r;
}

static inline double ref_round(double v, df_dtype t)
{
    switch (t) {
    case DF_DTYPE_F32:
        return (double)(float)v;
    case DF_DTYPE_BF16:
        return ref_round_float(v, 8, -126, 0x1.fep127);
    case DF_DTYPE_F16:
        return ref_round_float(v, 11, -14, 65504.0);
    case DF_DTYPE_I32:
    case DF_DTYPE_I64:
    case DF_DTYPE_U8:
        return trunc(v);
    default:
        return v;
    }
}

static inline bool ref_is_int(df_dtype t)
{
    return t == DF_DTYPE_I32 || t == DF_DTYPE_I64 || t == DF_DTYPE_U8;
}

/* ---- host tensors ----------------------------------------------------------------------- */

/* Logical shape and float64 values (already rounded to dtype), row-major. */
typedef struct ref_tensor {
    int ndim;
    int64_t shape[DF_MAX_DIMS];
    df_dtype dtype;
    double *data;
} ref_tensor;

static inline int64_t ref_count(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

static inline int64_t ref_numel(const ref_tensor *t)
{
    return ref_count(t->ndim, t->shape);
}

/* A zeroed host tensor. */
static inline ref_tensor ref_alloc(int ndim, const int64_t *shape, df_dtype dtype)
{
    ref_tensor t = {.ndim = ndim, .dtype = dtype};
    memcpy(t.shape, shape, (size_t)ndim * sizeof *shape);
    int64_t n = ref_count(ndim, shape);
    t.data = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    assert_non_null(t.data);
    return t;
}

static inline void ref_free(ref_tensor *t)
{
    free(t->data);
    t->data = NULL;
}

/* Row-major index i of `shape` as a multi-index. */
static inline void ref_unravel(int64_t i, int ndim, const int64_t *shape, int64_t *idx)
{
    for (int d = ndim - 1; d >= 0; d--) {
        idx[d] = shape[d] ? i % shape[d] : 0;
        i = shape[d] ? i / shape[d] : 0;
    }
}

/* The element of t that broadcasting (NumPy rules) maps to output index idx of ndim dims. */
static inline double ref_at_bcast(const ref_tensor *t, int ndim, const int64_t *idx)
{
    int64_t off = 0;
    int lead = ndim - t->ndim;
    for (int d = 0; d < t->ndim; d++)
        off = off * t->shape[d] + (t->shape[d] == 1 ? 0 : idx[d + lead]);
    return t->data[off];
}

/* ---- inputs ------------------------------------------------------------------------------- */

/* How an input reaches the op. */
typedef enum ref_view {
    REF_DENSE,    /* a fresh dense tensor */
    REF_PERMUTED, /* a permuted view of a dense tensor (perm, or the last two dims swapped) */
    REF_SLICED,   /* a window (offset, padded strides) of a larger tensor */
    REF_EXPANDED, /* dims in expand_mask stored with size 1 and expanded (stride 0) */
} ref_view;

typedef struct ref_input {
    int ndim;
    int64_t shape[DF_MAX_DIMS]; /* the logical shape the op sees */
    df_dtype dtype;             /* 0 = f32 */
    ref_view view;
    int perm[DF_MAX_DIMS]; /* REF_PERMUTED: storage dim k holds logical dim perm[k] */
    unsigned expand_mask;  /* REF_EXPANDED: bit d set = dim d is stretched */
    double lo, hi;         /* values uniform in [lo, hi); both 0 = [-1, 1) */
    bool absent;           /* an optional input left out (NULL) */
} ref_input;

/* Shorthand for table rows: REF_IN(2, 3) is a dense f32 [2, 3] input. */
#define REF_SHAPE(...)                                                                             \
    .ndim = (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), .shape = {__VA_ARGS__}
#define REF_IN(...)                                                                                \
    {                                                                                              \
        REF_SHAPE(__VA_ARGS__)                                                                     \
    }
#define REF_IN_VIEW(view_, ...)                                                                    \
    {                                                                                              \
        REF_SHAPE(__VA_ARGS__), .view = view_                                                      \
    }
#define REF_IN_T(dtype_, view_, ...)                                                               \
    {                                                                                              \
        REF_SHAPE(__VA_ARGS__), .dtype = dtype_, .view = view_                                     \
    }
#define REF_ABSENT                                                                                 \
    {                                                                                              \
        .absent = true                                                                             \
    }
/* Tolerance of n f32 ulps (relative), for results that are one rounding or a few away. */
#define REF_ULPS(n) .atol = 1e-30, .rtol = (n)*0x1p-23

typedef struct op_case op_case;

/* Calls the library; in[k] is NULL for an absent input. */
typedef df_tensor *(*op_run_fn)(df_ctx *ctx, const op_case *c, df_tensor *const in[]);
/* Fills *out (ref_alloc'd here) from the host inputs. */
typedef void (*op_ref_fn)(const op_case *c, const ref_tensor in[], ref_tensor *out);

struct op_case {
    const char *name;
    op_run_fn run;
    op_ref_fn ref;
    int n_in;
    ref_input in[4];
    int64_t i[8]; /* attributes, as the run/ref functions read them */
    double f[4];
    double atol, rtol;
    /* on a device that computes in f32 throughout (not the CPU's kernels: vulkan), a
     * tolerance of its own where that loses more than REF_F32_ATOL, REF_F32_RTOL (0: those) */
    double atol_f32, rtol_f32;
};

/* The least tolerance on devices that do not run the CPU's kernels: their transcendental
 * functions and reductions are f32 (results agree within f32 rounding, not to the bit). */
#define REF_F32_ATOL 1e-6
#define REF_F32_RTOL 4e-6

/* Host values of one input: drawn for the stored shape, then spread to the logical one. */
static inline ref_tensor ref_make_values(const ref_input *in, ref_rng *rng)
{
    double lo = in->lo, hi = in->hi;
    if (lo == 0 && hi == 0)
        lo = -1, hi = 1;
    int64_t stored[DF_MAX_DIMS];
    for (int d = 0; d < in->ndim; d++)
        stored[d] = in->view == REF_EXPANDED && (in->expand_mask >> d & 1) ? 1 : in->shape[d];
    ref_tensor src = ref_alloc(in->ndim, stored, in->dtype);
    for (int64_t i = 0; i < ref_numel(&src); i++) {
        double v = ref_uniform(rng, lo, hi);
        src.data[i] = ref_is_int(in->dtype) ? floor(v) : ref_round(v, in->dtype);
    }
    ref_tensor t = ref_alloc(in->ndim, in->shape, in->dtype);
    int64_t idx[DF_MAX_DIMS] = {0};
    for (int64_t i = 0; i < ref_numel(&t); i++) {
        ref_unravel(i, t.ndim, t.shape, idx);
        t.data[i] = ref_at_bcast(&src, t.ndim, idx);
    }
    ref_free(&src);
    return t;
}

/* A device tensor holding `values` (dense, shape `shape`) in dtype. */
static inline df_tensor *ref_upload(df_ctx *ctx, df_dtype dtype, int ndim, const int64_t *shape,
                                    const double *values)
{
    int64_t n = ref_count(ndim, shape);
    void *buf = calloc((size_t)(n > 0 ? n : 1), 8);
    assert_non_null(buf);
    assert_int_equal(df_convert(values, DF_DTYPE_F64, buf, dtype, n), DF_OK);
    df_tensor *t = df_tensor_from_host(ctx, dtype, shape, ndim, buf);
    free(buf);
    return t;
}

/* The device tensor for one input, presented as in->view asks. */
static inline df_tensor *ref_present(df_ctx *ctx, const ref_input *in, const ref_tensor *v)
{
    int nd = in->ndim;
    if (in->view == REF_DENSE)
        return ref_upload(ctx, in->dtype, nd, v->shape, v->data);

    if (in->view == REF_PERMUTED) {
        int perm[DF_MAX_DIMS];
        bool given = false;
        for (int d = 0; d < nd; d++)
            given = given || in->perm[d] != 0;
        for (int d = 0; d < nd; d++)
            perm[d] = given ? in->perm[d] : d;
        if (!given && nd >= 2) {
            perm[nd - 2] = nd - 1;
            perm[nd - 1] = nd - 2;
        }
        int64_t sshape[DF_MAX_DIMS], dims[DF_MAX_DIMS];
        int64_t idx[DF_MAX_DIMS] = {0}, sidx[DF_MAX_DIMS] = {0};
        for (int k = 0; k < nd; k++) {
            sshape[k] = in->shape[perm[k]];
            dims[perm[k]] = k; /* logical dim perm[k] comes from storage dim k */
        }
        int64_t n = ref_count(nd, sshape);
        double *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
        assert_non_null(s);
        for (int64_t i = 0; i < n; i++) {
            ref_unravel(i, nd, sshape, sidx);
            for (int k = 0; k < nd; k++)
                idx[perm[k]] = sidx[k];
            int64_t off = 0;
            for (int d = 0; d < nd; d++)
                off = off * in->shape[d] + idx[d];
            s[i] = v->data[off];
        }
        df_tensor *t = ref_upload(ctx, in->dtype, nd, sshape, s);
        free(s);
        return df_permute(ctx, t, dims, nd);
    }

    if (in->view == REF_SLICED) { /* padding: 1 before / 2 after in dim 0, 2 / 1 in the last */
        int64_t big[DF_MAX_DIMS], before[DF_MAX_DIMS] = {0}, idx[DF_MAX_DIMS] = {0};
        for (int d = 0; d < nd; d++)
            big[d] = in->shape[d];
        if (nd > 1)
            big[0] += 3, before[0] = 1;
        if (nd > 0)
            big[nd - 1] += 3, before[nd - 1] = 2;
        int64_t n = ref_count(nd, big);
        double *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
        assert_non_null(s);
        for (int64_t i = 0; i < n; i++)
            s[i] = ref_is_int(in->dtype) ? 7 : 1e4; /* padding the op must never read */
        for (int64_t i = 0; i < ref_numel(v); i++) {
            ref_unravel(i, nd, in->shape, idx);
            int64_t off = 0;
            for (int d = 0; d < nd; d++)
                off = off * big[d] + idx[d] + before[d];
            s[off] = v->data[i];
        }
        df_tensor *t = ref_upload(ctx, in->dtype, nd, big, s);
        free(s);
        if (nd > 1)
            t = df_slice(ctx, t, 0, 1, 1 + in->shape[0]);
        if (nd > 0)
            t = df_slice(ctx, t, nd - 1, 2, 2 + in->shape[nd - 1]);
        return t;
    }

    /* REF_EXPANDED: store the size-1 version, then expand */
    int64_t stored[DF_MAX_DIMS];
    for (int d = 0; d < nd; d++)
        stored[d] = (in->expand_mask >> d & 1) ? 1 : in->shape[d];
    int64_t n = ref_count(nd, stored), idx[DF_MAX_DIMS] = {0};
    double *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
    assert_non_null(s);
    for (int64_t i = 0; i < n; i++) {
        ref_unravel(i, nd, stored, idx);
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off = off * in->shape[d] + idx[d];
        s[i] = v->data[off];
    }
    df_tensor *t = ref_upload(ctx, in->dtype, nd, stored, s);
    free(s);
    return df_expand(ctx, t, in->shape, nd);
}

/* ---- backends and modes ------------------------------------------------------------------ */

static const df_eager_mode ref_modes[] = {DF_DEFER_NEVER, DF_DEFER_AND_FUSE};

static inline const char *ref_mode_name(df_eager_mode m)
{
    return m == DF_DEFER_NEVER ? "eager" : "defer_and_fuse";
}

/* One device the table runs on, and what the table did there. */
typedef struct ref_device {
    char name[32]; /* "cpu:0", "sim:0", "vulkan:0" */
    char kind[8];  /* "cpu", "sim", "gpu", "other" */
    bool cpu_kernels; /* cpu and sim run the CPU's kernels: the rows' own tolerances hold */
    int64_t dispatches; /* the device's dispatch counter, summed over the table's contexts */
    int runs, refused;  /* (row, mode) runs, and those the device refused (DF_E_UNSUPPORTED) */
} ref_device;

/* The devices of this program (ref_devices fills it once) and the one running now. */
static ref_device ref_dev[16];
static int ref_n_dev = -1;
static ref_device *ref_current;

/* Whether `want` ("sim", "vulkan:1") names device `name` ("sim:0"). */
static inline bool ref_names(const char *want, const char *name)
{
    size_t n = strcspn(want, ":");
    if (strchr(want, ':'))
        return strcmp(want, name) == 0;
    return strncmp(want, name, n) == 0 && name[n] == ':';
}

/* The devices the table runs on: every device the library lists, test devices included,
 * or only those $DIFFUSE_DEVICE names (the sim pass of ctest sets it to sim). */
static inline int ref_devices(void)
{
    if (ref_n_dev >= 0)
        return ref_n_dev;
    const char *want = getenv("DIFFUSE_DEVICE");
    bool all = !want || !*want || strcmp(want, "auto") == 0;
    df_device_desc d[16];
    int n = df_device_list(d, 16, true), k = 0;
    for (int i = 0; i < n && i < 16 && k < 16; i++) {
        if (!all && !ref_names(want, d[i].device))
            continue;
        ref_device *r = &ref_dev[k++];
        snprintf(r->name, sizeof r->name, "%.31s", d[i].device);
        snprintf(r->kind, sizeof r->kind, "%.7s", d[i].kind);
        r->cpu_kernels = strcmp(r->kind, "cpu") == 0 || strcmp(r->kind, "sim") == 0;
    }
    if (!all && k == 0) { /* as the Vulkan tests without a driver: skipped, and said */
        printf("DIFFUSE_DEVICE=%s names no device the library lists: skipped\n", want);
        exit(77);
    }
    ref_n_dev = k;
    return k;
}

/* A context on `device` in `mode`, or NULL (with the reason in why) when that mode is not
 * available there. */
static inline df_ctx *ref_open(const char *device, df_eager_mode mode, char *why, size_t cap)
{
    df_ctx *ctx = NULL;
    df_status s = df_ctx_create(&(df_ctx_opts){.device = device, .threads = 2}, &ctx);
    if (s != DF_OK) {
        snprintf(why, cap, "%s: %s", df_status_name(s), df_error_message());
        return NULL;
    }
    s = df_set_eager_mode(ctx, mode);
    if (s != DF_OK) {
        snprintf(why, cap, "%s: %s", df_status_name(s), df_error_message());
        df_ctx_free(ctx);
        return NULL;
    }
    return ctx;
}

/* Prints which (device, mode) pairs the op tests run in; returns how many. */
static inline int ref_print_modes(const char *program)
{
    int n = ref_devices(), runs = 0;
    for (int b = 0; b < n; b++) {
        for (size_t m = 0; m < sizeof ref_modes / sizeof *ref_modes; m++) {
            char why[512];
            df_ctx *ctx = ref_open(ref_dev[b].name, ref_modes[m], why, sizeof why);
            if (ctx) {
                printf("%s: runs on %s (%s%s) in mode %s\n", program, ref_dev[b].name,
                       ref_dev[b].kind,
                       ref_dev[b].cpu_kernels ? "" : "; tolerances at least f32's",
                       ref_mode_name(ref_modes[m]));
                runs++;
                df_ctx_free(ctx);
            } else {
                printf("%s: not run on %s in mode %s (%s)\n", program, ref_dev[b].name,
                       ref_mode_name(ref_modes[m]), why);
            }
        }
    }
    return runs;
}

/* Calls fn once per available (device, mode) with a fresh context; returns the count. Adds
 * each context's device dispatches to its device (ref_check_devices reads them). */
typedef void (*ref_ctx_fn)(df_ctx *ctx, const char *where, void *arg);

static inline int ref_for_each_ctx(ref_ctx_fn fn, void *arg)
{
    int n = ref_devices(), runs = 0;
    for (int b = 0; b < n; b++) {
        for (size_t m = 0; m < sizeof ref_modes / sizeof *ref_modes; m++) {
            char why[512], where[96];
            df_ctx *ctx = ref_open(ref_dev[b].name, ref_modes[m], why, sizeof why);
            if (!ctx)
                continue;
            snprintf(where, sizeof where, "%.31s/%s", ref_dev[b].name,
                     ref_mode_name(ref_modes[m]));
            ref_current = &ref_dev[b];
            fn(ctx, where, arg);
            ref_current = NULL;
            df_stats st;
            df_ctx_stats(ctx, &st);
            ref_dev[b].dispatches += st.device_dispatches;
            ref_dev[b].runs++;
            df_ctx_free(ctx);
            runs++;
        }
    }
    assert_true(runs > 0); /* at least one device in strict eager */
    return runs;
}

/* After a table: prints what ran where, and fails (returns 1) when a device other than the
 * CPU (which keeps no counters) dispatched no kernel: the table did not run there. */
static inline int ref_check_devices(const char *program)
{
    int failed = 0;
    for (int b = 0; b < ref_n_dev; b++) {
        const ref_device *d = &ref_dev[b];
        printf("%s: %s: %d runs, %d refused by the device (DF_E_UNSUPPORTED), %lld kernels "
               "dispatched there\n", program, d->name, d->runs, d->refused,
               (long long)d->dispatches);
        if (strcmp(d->kind, "cpu") != 0 && d->runs > 0 && d->dispatches <= 0) {
            printf("%s: FAIL %s dispatched nothing: the table did not run on it\n", program,
                   d->name);
            failed = 1;
        }
    }
    return failed;
}

/* ---- comparing ---------------------------------------------------------------------------- */

/* Fails the test with the first element outside atol + rtol |want|; NaN matches NaN. */
static inline void ref_compare(const char *what, const double *got, const ref_tensor *want,
                               double atol, double rtol)
{
    int64_t n = ref_numel(want), bad = -1;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double g = got[i], w = want->data[i];
        if (isnan(w) && isnan(g))
            continue;
        if (isinf(w) && g == w)
            continue;
        double err = fabs(g - w), lim = atol + rtol * fabs(w);
        if (!(err <= lim)) {
            if (bad < 0)
                bad = i;
        }
        if (err > worst || isnan(err))
            worst = err;
    }
    if (bad >= 0) {
        int64_t idx[DF_MAX_DIMS] = {0};
        ref_unravel(bad, want->ndim, want->shape, idx);
        char at[128] = "";
        for (int d = 0, used = 0; d < want->ndim; d++)
            used += snprintf(at + used, sizeof at - (size_t)used, d ? ", %lld" : "%lld",
                             (long long)idx[d]);
        fail_msg("%s: element [%s] is %.9g, expected %.9g (atol %g, rtol %g; worst error %g)", what,
                 at, got[bad], want->data[bad], atol, rtol, worst);
    }
}

/* Reads t as float64 after checking its shape and dtype against want. */
static inline double *ref_read(df_ctx *ctx, df_tensor *t, const ref_tensor *want, const char *what)
{
    if (!t)
        fail_msg("%s: the op returned NULL: %s", what, df_error_message());
    char desc[128];
    df_tensor_describe(t, desc, sizeof desc);
    if (df_tensor_ndim(t) != want->ndim)
        fail_msg("%s: result %s has %d dims, expected %d", what, desc, df_tensor_ndim(t),
                 want->ndim);
    for (int d = 0; d < want->ndim; d++)
        if (df_tensor_dim(t, d) != want->shape[d])
            fail_msg("%s: result %s, dim %d should be %lld", what, desc, d,
                     (long long)want->shape[d]);
    if (df_tensor_dtype(t) != want->dtype)
        fail_msg("%s: result %s should be %s", what, desc, df_dtype_name(want->dtype));
    int64_t n = ref_numel(want);
    double *got = calloc((size_t)(n > 0 ? n : 1), sizeof *got);
    assert_non_null(got);
    df_status s = df_tensor_read(ctx, t, DF_DTYPE_F64, got, (size_t)(n > 0 ? n : 1) * 8);
    if (s != DF_OK)
        fail_msg("%s: reading the result failed: %s", what, df_error_message());
    return got;
}

/* ---- the driver ---------------------------------------------------------------------------- */

typedef struct ref_case_run {
    const op_case *c;
    ref_tensor in[4];
    ref_tensor want;
} ref_case_run;

static inline void ref_case_in_ctx(df_ctx *ctx, const char *where, void *arg)
{
    ref_case_run *r = arg;
    const op_case *c = r->c;
    char what[256];
    snprintf(what, sizeof what, "%s on %s", c->name, where);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *in[4] = {NULL, NULL, NULL, NULL};
    for (int k = 0; k < c->n_in; k++) {
        if (c->in[k].absent)
            continue;
        in[k] = ref_present(ctx, &c->in[k], &r->in[k]);
        if (!in[k])
            fail_msg("%s: making input %d failed: %s", what, k, df_error_message());
    }
    df_tensor *out = c->run(ctx, c, in);
    ref_device *dev = ref_current;
    df_status s = out ? df_sync(ctx) : df_ctx_status(ctx); /* defer-and-fuse: runs it now */
    if (s == DF_E_UNSUPPORTED && !dev->cpu_kernels) {
        /* a dtype or op the device does not run (vulkan: f64): said, counted, not failed */
        print_message("refused %s: %s\n", what, df_error_message());
        dev->refused++;
        df_ctx_reset_error(ctx);
        df_scope_end(ctx, mark, NULL);
        return;
    }
    double *got = ref_read(ctx, out, &r->want, what);
    double atol = c->atol, rtol = c->rtol;
    if (!dev->cpu_kernels) {
        double fa = c->atol_f32 > 0 ? c->atol_f32 : REF_F32_ATOL;
        double fr = c->rtol_f32 > 0 ? c->rtol_f32 : REF_F32_RTOL;
        atol = atol > fa ? atol : fa;
        rtol = rtol > fr ? rtol : fr;
    }
    ref_compare(what, got, &r->want, atol, rtol);
    free(got);
    df_scope_end(ctx, mark, NULL);
    assert_int_equal(df_sync(ctx), DF_OK);
}

/* Runs one row on every device and mode (a cmocka test body; state is the op_case). */
static inline void ref_run_case(void **state)
{
    ref_case_run r = {.c = *state};
    ref_rng rng = {ref_hash(r.c->name)};
    for (int k = 0; k < r.c->n_in; k++)
        if (!r.c->in[k].absent)
            r.in[k] = ref_make_values(&r.c->in[k], &rng);
    r.c->ref(r.c, r.in, &r.want);
    ref_for_each_ctx(ref_case_in_ctx, &r);
    for (int k = 0; k < r.c->n_in; k++)
        ref_free(&r.in[k]);
    ref_free(&r.want);
}

/* Runs a table as one cmocka group, one test per row; returns the number of failures. */
static inline int ref_run_table(const char *group, const op_case *cases, size_t n)
{
    struct CMUnitTest *tests = calloc(n, sizeof *tests);
    assert_non_null(tests);
    for (size_t i = 0; i < n; i++) {
        tests[i].name = cases[i].name;
        tests[i].test_func = ref_run_case;
        tests[i].initial_state = (void *)&cases[i];
    }
    int failed = _cmocka_run_group_tests(group, tests, n, NULL, NULL);
    free(tests);
    return failed + ref_check_devices(group);
}

#endif
