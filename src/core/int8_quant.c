/*
 * The int8 weight format (int8_quant.h) and the public quantizer (quantize.h).
 *
 * Choices:
 * - Rounding is to nearest even (nearbyintf) of x * (127 / max|x|), clamped to +-127; a
 *   group of zeros has scale 0. The build turns off implicit fused multiply-adds, so every
 *   caller of df_i8_round gets the same integers.
 * - The public functions take 0 for the whole k; inside, the whole k is DF_I8_WHOLE_K, so
 *   that 0 can mean "the default" where a setting is read.
 */
#include "core/int8_quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/dtype.h>
#include <diffuse/quantize.h>

#include "core/alloc.h"
#include "core/status.h"

df_i8_groups df_i8_groups_of(int64_t k, int64_t group)
{
    df_i8_groups g;
    if (group <= 0)
        group = 128;
    if (group % 4 == 0 && group < k && k % group == 0)
        g.group = group;
    else
        g.group = (k + 3) / 4 * 4; /* the whole k, padded to whole quads */
    g.kp = (k + g.group - 1) / g.group * g.group;
    g.n_groups = g.kp / g.group;
    return g;
}

int64_t df_i8_group_for(int64_t k, int64_t group)
{
    return df_i8_groups_of(k, group).group;
}

int64_t df_i8_default_group(void)
{
    static _Atomic int64_t group = -1;
    if (group < 0) {
        const char *env = getenv("DIFFUSE_INT8_GROUP");
        int64_t g = 128;
        if (env && strcmp(env, "k") == 0)
            g = 0;
        else if (env && *env) {
            long v = strtol(env, NULL, 10);
            if (v >= 32 && v <= 256 && v % 4 == 0)
                g = v;
        }
        group = g;
    }
    return group == 0 ? DF_I8_WHOLE_K : group;
}

/* 127 / max|x| over n values (0 when all are zero), and the scale max|x| / 127. */
static float group_inverse(const float *x, int64_t n, float *scale)
{
    float amax = 0;
    for (int64_t i = 0; i < n; i++)
        amax = fmaxf(amax, fabsf(x[i]));
    *scale = amax / 127.0f;
    return amax > 0 ? 127.0f / amax : 0.0f;
}

void df_i8_quantize_channel(const float *row, int64_t group, int64_t n_groups, int8_t *q,
                            float *scale)
{
    for (int64_t g = 0; g < n_groups; g++) {
        const float *x = row + g * group;
        float inv = group_inverse(x, group, &scale[g]);
        for (int64_t i = 0; i < group; i++)
            q[g * group + i] = (int8_t)df_i8_round(x[i], inv);
    }
}

/* --- the public functions (quantize.h) -------------------------------------------------- */

/* The public functions' group (0: the whole k) as df_i8_groups_of takes it. */
static int64_t public_group(int64_t group)
{
    return group <= 0 ? DF_I8_WHOLE_K : group;
}

int64_t df_int8_default_group(void)
{
    int64_t g = df_i8_default_group();
    return g == DF_I8_WHOLE_K ? 0 : g;
}

int64_t df_int8_weight_groups(int64_t k, int64_t group)
{
    return df_i8_groups_of(k, public_group(group)).n_groups;
}

df_status df_int8_quantize(const void *w, df_dtype type, int64_t n, int64_t k, int64_t group,
                           int8_t *q, float *scale)
{
    if (type != DF_DTYPE_F32 && type != DF_DTYPE_BF16 && type != DF_DTYPE_F16)
        return df_errorf(DF_E_UNSUPPORTED, "int8: cannot quantize a %s weight",
                         df_dtype_name(type));
    df_i8_groups l = df_i8_groups_of(k, public_group(group));
    float *row = df_malloc((size_t)l.kp * sizeof(float));
    int8_t *qr = df_malloc((size_t)l.kp);
    if (!row || !qr) {
        df_free(row);
        df_free(qr);
        return df_errorf(DF_E_OOM, "int8: out of memory quantizing a [%lld, %lld] weight",
                         (long long)n, (long long)k);
    }
    memset(row, 0, (size_t)l.kp * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        df_convert((const char *)w + (size_t)(j * k) * df_dtype_size(type), type, row, DF_DTYPE_F32,
                   k);
        df_i8_quantize_channel(row, l.group, l.n_groups, qr, scale + j * l.n_groups);
        memcpy(q + j * k, qr, (size_t)k);
    }
    df_free(row);
    df_free(qr);
    return DF_OK;
}
