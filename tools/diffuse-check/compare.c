/*
 * diffuse-check: reading case tensors and comparing outputs with the references.
 *
 * An output passes when max|got - ref| <= tolerance.max_abs and
 * ||got - ref||_2 / ||ref||_2 <= tolerance.rel_l2 (both scaled by the case's tol_scale), or,
 * for outputs listed in "exact", when every value is identical. image_uint8 may differ by 1
 * (its rel_l2 entry is not used), as the golden README says. A NaN anywhere fails. Every
 * comparison prints one line, so a failing case shows which output and by how much.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static char last_failure[2048];

int check_fail(const check_case *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_failure, sizeof last_failure, fmt, ap);
    va_end(ap);
    printf("%s: %s\n", c && c->name ? c->name : "?", last_failure);
    fflush(stdout);
    return 1;
}

const char *check_last_failure(void)
{
    return last_failure;
}

/* Reads `name` converted to `as` (elem bytes each) into a malloc'd buffer. */
static df_status read_as(const check_case *c, const char *name, df_dtype as, size_t elem,
                         void **out, int64_t *shape, int *ndim)
{
    *out = NULL;
    df_tensor_info t;
    df_status s = df_safetensors_find(c->tensors, name, &t);
    if (s != DF_OK)
        return s;
    size_t bytes = (size_t)t.numel * elem;
    void *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return DF_E_OOM;
    s = df_safetensors_read(c->tensors, name, as, buf, bytes);
    if (s != DF_OK) {
        free(buf);
        return s;
    }
    if (shape)
        memcpy(shape, t.shape, sizeof(int64_t) * (size_t)t.ndim);
    if (ndim)
        *ndim = t.ndim;
    *out = buf;
    return DF_OK;
}

df_status check_read_f64(const check_case *c, const char *name, double **out, int64_t *shape,
                         int *ndim)
{
    return read_as(c, name, DF_DTYPE_F64, sizeof(double), (void **)out, shape, ndim);
}

df_status check_read_i64(const check_case *c, const char *name, int64_t **out, int64_t *shape,
                         int *ndim)
{
    return read_as(c, name, DF_DTYPE_I64, sizeof(int64_t), (void **)out, shape, ndim);
}

df_status check_read_f32(const check_case *c, const char *name, float **out, int64_t *shape,
                         int *ndim)
{
    return read_as(c, name, DF_DTYPE_F32, sizeof(float), (void **)out, shape, ndim);
}

/* The reference tensor of an output: outputs[output] ("out.x"), else "out.<output>". */
static const char *ref_name(const check_case *c, const char *output, char *buf, size_t cap)
{
    const char *s = df_json_string(df_json_get(df_json_get(c->root, "outputs"), output));
    if (s)
        return s;
    snprintf(buf, cap, "out.%s", output);
    return buf;
}

static bool is_exact(const check_case *c, const char *output)
{
    const df_json *ex = df_json_get(c->root, "exact");
    for (int64_t i = 0; i < df_json_array_size(ex); i++) {
        const char *s = df_json_string(df_json_array_get(ex, i));
        if (s && strcmp(s, output) == 0)
            return true;
    }
    return false;
}

static int line(const check_case *c, const char *output, bool pass, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int line(const check_case *c, const char *output, bool pass, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("  %-22s ", output);
    vprintf(fmt, ap);
    printf("  %s\n", pass ? "PASS" : "FAIL");
    va_end(ap);
    fflush(stdout);
    return pass ? 0 : 1;
}

/* The int8 rule: a relative L2 error bound per kind of case (docs/int8.md has the errors
 * these bounds were set from: about twice the worst measured in any mode). */
double check_int8_rel_l2(const check_case *c)
{
    static const struct {
        const char *kind;
        double rel_l2;
    } bounds[] = {
        {"model_forward", CHECK_INT8_REL_L2_MODEL},
        {"text_encoder", CHECK_INT8_REL_L2_TEXT},
        {"pipeline", CHECK_INT8_REL_L2_PIPELINE},
    };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (c->kind && strcmp(c->kind, bounds[i].kind) == 0)
            return bounds[i].rel_l2;
    return CHECK_BF16_REL_L2; /* kinds int8 does not change (no linear of a weight) */
}

/* Tolerance comparison of n doubles. */
static int within_tolerance(const check_case *c, const char *output, const double *got,
                            const double *ref, int64_t n)
{
    const df_json *tol = df_json_get(df_json_get(c->root, "tolerance"), output);
    bool uint8_image = strcmp(output, "image_uint8") == 0;
    double max_abs_lim, rel_lim;
    if (df_json_get_double(tol, "max_abs", &max_abs_lim) != DF_OK ||
        (!uint8_image && df_json_get_double(tol, "rel_l2", &rel_lim) != DF_OK)) {
        if (!uint8_image)
            return check_fail(c, "output '%s' has no usable tolerance in case.json", output);
        max_abs_lim = 1.0;
    }
    double scale = c->tol_scale > 0 ? c->tol_scale : 1.0;
    if (!uint8_image) {
        max_abs_lim *= scale;
        rel_lim *= scale;
    }
    double max_abs = 0, diff2 = 0, ref2 = 0;
    int64_t worst = 0;
    bool nan = false;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (isnan(d)) {
            nan = true;
            worst = i;
            break;
        }
        if (d > max_abs) {
            max_abs = d;
            worst = i;
        }
        diff2 += d * d;
        ref2 += ref[i] * ref[i];
    }
    double rel = ref2 > 0 ? sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0);
    if (nan)
        return line(c, output, false, "NaN at [%lld]: got %g, expected %g", (long long)worst,
                    got[worst], ref[worst]);
    if (c->compute == DF_DTYPE_BF16) {
        /* bf16 matrix products cannot meet float32 tolerances; the rule for them is a
         * relative L2 error of at most 2e-2 against the float64 reference. */
        return line(c, output, rel <= CHECK_BF16_REL_L2, "max_abs %-9.3g  rel_l2 %-9.3g (<= %.3g, bf16)",
                    max_abs, rel, CHECK_BF16_REL_L2);
    }
    if (c->compute == DF_DTYPE_I8) {
        double lim = check_int8_rel_l2(c);
        return line(c, output, rel <= lim, "max_abs %-9.3g  rel_l2 %-9.3g (<= %.3g, int8)",
                    max_abs, rel, lim);
    }
    if (uint8_image)
        return line(c, output, max_abs <= max_abs_lim, "max_abs %-9.3g (<= %.3g)", max_abs,
                    max_abs_lim);
    bool pass = max_abs <= max_abs_lim && rel <= rel_lim;
    if (!pass && c->verbose)
        printf("  %-22s worst at [%lld]: got %.9g, expected %.9g\n", output, (long long)worst,
               got[worst], ref[worst]);
    return line(c, output, pass, "max_abs %-9.3g (<= %.3g)  rel_l2 %-9.3g (<= %.3g)", max_abs,
                max_abs_lim, rel, rel_lim);
}

int check_compare_f64(const check_case *c, const char *output, const double *got, int64_t n)
{
    char buf[256];
    const char *name = ref_name(c, output, buf, sizeof buf);
    double *ref;
    int64_t shape[8];
    int ndim;
    if (check_read_f64(c, name, &ref, shape, &ndim) != DF_OK)
        return check_fail(c, "output '%s': %s", output, df_error_message());
    int64_t m = 1;
    for (int d = 0; d < ndim; d++)
        m *= shape[d];
    int rc;
    if (m != n) {
        rc = line(c, output, false, "%lld values, the reference has %lld", (long long)n,
                  (long long)m);
    } else if (is_exact(c, output)) {
        int64_t bad = 0, first = -1;
        for (int64_t i = 0; i < n; i++) {
            if (!(got[i] == ref[i])) {
                bad++;
                first = first < 0 ? i : first;
            }
        }
        if (bad)
            rc = line(c, output, false, "exact: %lld of %lld differ, first at [%lld]: got %.17g, "
                      "expected %.17g", (long long)bad, (long long)n, (long long)first,
                      got[first], ref[first]);
        else
            rc = line(c, output, true, "exact: all %lld equal", (long long)n);
    } else {
        rc = within_tolerance(c, output, got, ref, n);
    }
    free(ref);
    return rc;
}

int check_compare_f32(const check_case *c, const char *output, const float *got, int64_t n)
{
    double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
    if (!d)
        return check_fail(c, "output '%s': out of memory", output);
    for (int64_t i = 0; i < n; i++)
        d[i] = got[i];
    int rc = check_compare_f64(c, output, d, n);
    free(d);
    return rc;
}

int check_compare_i64(const check_case *c, const char *output, const int64_t *got, int64_t n)
{
    if (!is_exact(c, output)) {
        double *d = malloc((size_t)(n > 0 ? n : 1) * sizeof *d);
        if (!d)
            return check_fail(c, "output '%s': out of memory", output);
        for (int64_t i = 0; i < n; i++)
            d[i] = (double)got[i];
        int rc = check_compare_f64(c, output, d, n);
        free(d);
        return rc;
    }
    char buf[256];
    const char *name = ref_name(c, output, buf, sizeof buf);
    int64_t *ref, shape[8];
    int ndim;
    if (check_read_i64(c, name, &ref, shape, &ndim) != DF_OK)
        return check_fail(c, "output '%s': %s", output, df_error_message());
    int64_t m = 1, bad = 0, first = -1;
    for (int d = 0; d < ndim; d++)
        m *= shape[d];
    int rc;
    if (m != n) {
        rc = line(c, output, false, "%lld values, the reference has %lld", (long long)n,
                  (long long)m);
    } else {
        for (int64_t i = 0; i < n; i++) {
            if (got[i] != ref[i]) {
                bad++;
                first = first < 0 ? i : first;
            }
        }
        if (bad)
            rc = line(c, output, false, "exact: %lld of %lld differ, first at [%lld]: got %lld, "
                      "expected %lld", (long long)bad, (long long)n, (long long)first,
                      (long long)got[first], (long long)ref[first]);
        else
            rc = line(c, output, true, "exact: all %lld equal", (long long)n);
    }
    free(ref);
    return rc;
}

df_ctx_opts check_ctx_opts(const check_case *c)
{
    bool eager = !c->mode || strcmp(c->mode, "eager") == 0;
    return (df_ctx_opts){.device = c->device, .threads = c->threads, .compute = c->compute,
                         .mode = eager ? DF_DEFER_NEVER : DF_DEFER_AND_FUSE};
}

int check_read_seed(check_case *c, const df_json *gen, uint64_t *out)
{
    *out = 0;
    const df_json *seed = df_json_get(gen, "seed");
    if (df_json_type_of(seed) == DF_JSON_NUMBER && df_json_number(seed) < 0) {
        int64_t negative;
        if (df_json_to_int(seed, &negative) != DF_OK)
            return check_fail(c, "args.generator: %s", df_error_message());
        *out = (uint64_t)negative; /* torch: a negative seed is its two's complement */
        return 0;
    }
    if (df_json_get_uint64(gen, "seed", out) != DF_OK)
        return check_fail(c, "args.generator: %s", df_error_message());
    return 0;
}

int check_read_indices(check_case *c, const char *key, int *out, int cap, int *n)
{
    *n = 0;
    const df_json *a = df_json_get(c->args, key);
    if (df_json_is_null(a))
        return 0;
    if (df_json_type_of(a) != DF_JSON_ARRAY || df_json_array_size(a) > cap)
        return check_fail(c, "args.%s: expected a list of at most %d block indices", key, cap);
    for (int64_t i = 0; i < df_json_array_size(a); i++) {
        int64_t v;
        if (df_json_to_int(df_json_array_get(a, i), &v) != DF_OK)
            return check_fail(c, "args.%s: %s", key, df_error_message());
        if (v < 0 || v > INT32_MAX)
            return check_fail(c, "args.%s[%lld]: %lld is not a block index", key, (long long)i,
                              (long long)v);
        out[i] = (int)v;
    }
    *n = (int)df_json_array_size(a);
    return 0;
}

int check_upload_arg(check_case *c, df_ctx *ctx, const char *key, df_tensor **out)
{
    *out = NULL;
    const df_json *a = df_json_get(c->args, key);
    if (df_json_is_null(a))
        return 0;
    if (df_json_type_of(a) == DF_JSON_NUMBER) {
        float v = (float)df_json_number(a);
        *out = df_tensor_from_host(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1, &v);
        return *out ? 0 : check_fail(c, "args.%s: %s", key, df_error_message());
    }
    const char *name;
    if (df_json_to_string(a, &name) != DF_OK)
        return check_fail(c, "args.%s: %s", key, df_error_message());
    float *data;
    int64_t shape[8];
    int ndim;
    if (check_read_f32(c, name, &data, shape, &ndim) != DF_OK)
        return check_fail(c, "args.%s: cannot read tensor '%s': %s", key, name, df_error_message());
    *out = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, ndim, data);
    free(data);
    if (!*out)
        return check_fail(c, "args.%s: cannot upload '%s': %s", key, name, df_error_message());
    return 0;
}

int check_compare_tensor(const check_case *c, df_ctx *ctx, const char *output, df_tensor *t)
{
    if (!t) {
        df_sync(ctx); /* makes the context's error the thread's message */
        return check_fail(c, "forward failed: %s", df_error_message());
    }
    int64_t n = df_tensor_numel(t);
    float *got = malloc((size_t)n * sizeof *got + 1);
    if (!got)
        return check_fail(c, "out of memory");
    int rc;
    if (df_tensor_read(ctx, t, DF_DTYPE_F32, got, (size_t)n * sizeof *got) != DF_OK)
        rc = check_fail(c, "forward failed: %s", df_error_message());
    else
        rc = check_compare_f32(c, output, got, n);
    free(got);
    return rc;
}

void check_write_stats(const check_case *c, df_ctx *ctx)
{
    if (!c->stats_json)
        return;
    df_stats st;
    char buf[2048];
    df_ctx_stats(ctx, &st);
    df_stats_to_json(&st, buf, sizeof buf);
    fprintf(c->stats_json, "%s\n", buf);
    fflush(c->stats_json);
}
