/*
 * The CPU kernels' own exponential and the sigmoid-based activations built on it
 * (backend/cpu/k_common.h, k_elementwise.c), against libm in double precision over their
 * whole range: df_cpu_expf within 1.5 ulp of exp() from -104 to ln(FLT_MAX) (gradual
 * underflow included, inf above), and gelu_tanh / silu / quick_gelu within a bound in ulp of
 * their double forms (set by the f32 argument of their exponential, see below). The 16-lane
 * AVX-512 forms (df_cpu_expf16, df_cpu_x_sigmoid16, the row functions' AVX-512 path) must
 * give the scalar forms' bits, special values included; on a CPU without AVX-512 that test
 * is skipped and only the scalar checks run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/k_common.h"

/* Distance from f to the exact value ref in units of the last place of ref in f32 (the
 * subnormal spacing 2^-149 at the bottom). */
static double ulps(float f, double ref)
{
    double a = fabs(ref);
    int e;
    frexp(a, &e); /* a = m 2^e, m in [0.5, 1) */
    double ulp = ldexp(1.0, e - 24);
    if (ulp < 0x1p-149)
        ulp = 0x1p-149;
    return fabs((double)f - ref) / ulp;
}

/* n points evenly from lo to hi into x; returns n. */
static int64_t sweep(float lo, float hi, int64_t n, float *x)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)((double)i / (double)(n - 1));
    return n;
}

static void test_expf_against_libm(void **state)
{
    (void)state;
    int64_t n = 1 << 21;
    float *x = malloc((size_t)n * sizeof *x);
    assert_non_null(x);
    sweep(-104.0f, 88.72f, n, x); /* e^88.7229 is past FLT_MAX: inf, checked below */
    double worst = 0;
    float at = 0;
    for (int64_t i = 0; i < n; i++) {
        double u = ulps(df_cpu_expf(x[i]), exp((double)x[i]));
        if (u > worst)
            worst = u, at = x[i];
    }
    printf("df_cpu_expf: at most %.3f ulp (at %.9g)\n", worst, (double)at);
    assert_true(worst <= 1.5);
    assert_true(isinf(df_cpu_expf(88.73f)) && df_cpu_expf(88.73f) > 0);
    assert_true(isinf(df_cpu_expf(89.5f)) && df_cpu_expf(89.5f) > 0);
    assert_true(df_cpu_expf(-110.0f) == 0.0f);
    assert_true(df_cpu_expf(-INFINITY) == 0.0f);
    assert_true(df_cpu_expf(0.0f) == 1.0f);
    assert_true(isnan(df_cpu_expf(NAN)));
    free(x);
}

/* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in double. */
static double gelu_tanh_ref(double x)
{
    return 0.5 * x * (1.0 + tanh(0.79788456080286535588 * (x + 0.044715 * x * x * x)));
}

static double silu_ref(double x)
{
    return x / (1.0 + exp(-x));
}

static double quick_gelu_ref(double x)
{
    return x / (1.0 + exp(-1.702 * x));
}

/* Largest error of the row function of `op` against ref over [lo, hi]: in ulp where the
 * value is at least `floor` in magnitude, else absolute against `floor`'s ulp. */
static double activation_error(df_op op, double (*ref)(double), float lo, float hi)
{
    int64_t n = (1 << 20) + 7; /* not a multiple of 16: the scalar tail runs too */
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    sweep(lo, hi, n, x);
    df_cpu_unary_fns[op](y, x, n, 0.0f, 0.0f);
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = ref((double)x[i]);
        double u = fabs(r) >= 1e-3 ? ulps(y[i], r) : fabs((double)y[i] - r) / 0x1p-33;
        worst = u > worst ? u : worst;
    }
    free(x);
    free(y);
    return worst;
}

static void test_activations_against_libm(void **state)
{
    (void)state;
    /* The forms are x sigmoid(u) with u rounded to f32 first: its half-ulp error becomes a
     * relative error of |u| / 2 ulp in e^-|u|, so the error grows on the negative side,
     * where sigmoid(u) ~ e^u. Measured: gelu_tanh 17.8 ulp (u there up to ~ -14), silu 2.9,
     * quick_gelu 8.8; the bounds leave some margin. */
    double g = activation_error(DF_OP_GELU_TANH, gelu_tanh_ref, -12.0f, 12.0f);
    double s = activation_error(DF_OP_SILU, silu_ref, -30.0f, 30.0f);
    double q = activation_error(DF_OP_QUICK_GELU, quick_gelu_ref, -20.0f, 20.0f);
    printf("gelu_tanh %.2f ulp, silu %.2f ulp, quick_gelu %.2f ulp\n", g, s, q);
    assert_true(g <= 24.0);
    assert_true(s <= 4.0);
    assert_true(q <= 12.0);
}

#if defined(__x86_64__)
/* Inputs that reach every branch: the clamps, both signs of zero, infinities, NaN,
 * subnormal results, the sigmoid's underflow, then a dense sweep. */
static int64_t edge_inputs(float *x, int64_t cap)
{
    static const float special[] = {0.0f,    -0.0f,   1.0f,   -1.0f,   88.72f, 89.0f,  89.01f,
                                    -87.33f, -103.9f, -104.0f, -104.1f, -150.0f, 1e-30f, -1e-30f,
                                    INFINITY, -INFINITY, NAN,   -NAN,   1e30f,  -1e30f};
    int64_t n = (int64_t)(sizeof special / sizeof special[0]);
    memcpy(x, special, sizeof special);
    return n + sweep(-120.0f, 100.0f, cap - n, x + n);
}

static bool same_bits(float a, float b)
{
    uint32_t ua, ub;
    memcpy(&ua, &a, 4);
    memcpy(&ub, &b, 4);
    return ua == ub || (a != a && b != b); /* any NaN for a NaN */
}

/* The 16-lane forms over x[0..n) (n a multiple of 16) into e and s. The scalar references
 * are computed outside this function: the test is built without the library's
 * -ffp-contract=off, and code for the AVX-512 target could contract them. */
__attribute__((target("avx512f"))) static void lanes(const float *x, int64_t n, float *e, float *s)
{
    for (int64_t i = 0; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        _mm512_storeu_ps(e + i, df_cpu_expf16(v));
        _mm512_storeu_ps(s + i, df_cpu_x_sigmoid16(v, _mm512_mul_ps(v, _mm512_set1_ps(0.75f))));
    }
}

static void check_lanes(const float *x, int64_t n)
{
    n -= n % 16;
    float *e = malloc((size_t)n * sizeof *e), *s = malloc((size_t)n * sizeof *s);
    assert_non_null(e);
    assert_non_null(s);
    lanes(x, n, e, s);
    for (int64_t i = 0; i < n; i++) {
        float xk = x[i], ek = df_cpu_expf(xk), sk = df_cpu_x_sigmoid(xk, xk * 0.75f);
        if (!same_bits(e[i], ek) || !same_bits(s[i], sk))
            fail_msg("x = %.9g: exp %a / %a, x sigmoid %a / %a", (double)xk, (double)e[i],
                     (double)ek, (double)s[i], (double)sk);
    }
    free(e);
    free(s);
}

static void test_avx512_same_bits(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx512f"))
        skip();
    int64_t cap = (1 << 18) + 16 * 3;
    float *x = malloc((size_t)cap * sizeof *x), *y = malloc((size_t)cap * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    int64_t n = edge_inputs(x, cap);
    check_lanes(x, n);
    /* the row functions (AVX-512 body, scalar tail) against the scalar formulas */
    df_cpu_unary_fns[DF_OP_GELU_TANH](y, x, n, 0.0f, 0.0f);
    for (int64_t i = 0; i < n; i++) {
        float v = x[i], u = 1.5957691216057308f * v * (1.0f + 0.044715f * v * v);
        if (!same_bits(y[i], df_cpu_x_sigmoid(v, u)))
            fail_msg("gelu_tanh(%.9g) = %a, scalar %a", (double)v, (double)y[i],
                     (double)df_cpu_x_sigmoid(v, u));
    }
    df_cpu_unary_fns[DF_OP_SILU](y, x, n, 0.0f, 0.0f);
    for (int64_t i = 0; i < n; i++)
        if (!same_bits(y[i], df_cpu_x_sigmoid(x[i], x[i])))
            fail_msg("silu(%.9g) = %a", (double)x[i], (double)y[i]);
    df_cpu_unary_fns[DF_OP_QUICK_GELU](y, x, n, 0.0f, 0.0f);
    for (int64_t i = 0; i < n; i++)
        if (!same_bits(y[i], df_cpu_x_sigmoid(x[i], 1.702f * x[i])))
            fail_msg("quick_gelu(%.9g) = %a", (double)x[i], (double)y[i]);
    free(x);
    free(y);
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_expf_against_libm),
        cmocka_unit_test(test_activations_against_libm),
#if defined(__x86_64__)
        cmocka_unit_test(test_avx512_same_bits),
#endif
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
