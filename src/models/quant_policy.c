/*
 * The int8 quantization policy (quant_policy.h, and df_int8_quantizes in quantize.h). The
 * transformers' weights kept in f32 are their rows' int8_keep in the model table
 * (model_classes.c).
 */
#include <stdlib.h>
#include <string.h>

#include <diffuse/models.h>
#include <diffuse/quantize.h>

#include "core/status.h"
#include "models/loader.h"
#include "models/quant_policy.h"
#include "runtime/runtime.h"
#include "runtime/weight.h"

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool df_quant_keeps_precision(const char *component, const char *name, int keep)
{
    if (strcmp(component, "vae") == 0 || starts(name, "text_model.") ||
        starts(name, "text_projection"))
        return true;
    if (strcmp(component, "transformer") != 0)
        return false;
    if (keep == 0) {
        const char *env = getenv("DIFFUSE_INT8_KEEP");
        keep = env && strcmp(env, "none") == 0 ? -1 : 1;
    }
    if (keep < 0)
        return false;
    /* What any transformer class keeps (models.h): the component does not say which class
     * it holds, and no class's kept prefix names another class's quantized weight. */
    int n;
    const df_model_class *classes = df_model_classes(&n);
    for (int i = 0; i < n; i++)
        for (const char *const *k = classes[i].int8_keep; k && *k; k++)
            if (strcmp(classes[i].component, "transformer") == 0 && starts(name, *k))
                return true;
    return false;
}

static bool quantizes(const char *component, const char *name, int ndim, int keep)
{
    size_t len = strlen(name);
    if (ndim != 2 || len <= 7 || strcmp(name + len - 7, ".weight") != 0)
        return false;
    /* tables that are looked up, not multiplied (T5's token and position embeddings) */
    if (strcmp(name, "shared.weight") == 0 || strstr(name, "embed_tokens.") ||
        strstr(name, "relative_attention_bias."))
        return false;
    return !df_quant_keeps_precision(component, name, keep);
}

bool df_int8_quantizes(const char *component, const char *name, int ndim)
{
    return quantizes(component, name, ndim, 0);
}

df_status df_quant_bind(df_ctx *ctx, const char *component, const char *name, df_tensor *t,
                        size_t bytes, size_t *resident)
{
    *resident = bytes;
    bool keeps = df_quant_keeps_precision(component, name, ctx->int8_keep);
    DF_TRY(df_weight_keep_precision(t, keeps));
    if (df_ctx_compute_dtype(ctx) != DF_DTYPE_I8 || t->v.dtype == DF_DTYPE_I8 ||
        !quantizes(component, name, t->v.ndim, ctx->int8_keep))
        return DF_OK;
    /* int8 values, and per group an f32 scale and an int32 sum */
    int64_t n = t->v.shape[0], k = t->v.shape[1];
    int64_t group = ctx->int8_group > 0   ? ctx->int8_group /* as the device quantizes it */
                    : ctx->int8_group < 0 ? 0               /* the whole k */
                                          : df_int8_default_group();
    *resident = (size_t)(n * k) + (size_t)(n * df_int8_weight_groups(k, group)) * 8;
    return DF_OK;
}

df_status df_quant_attach_int8(const char *name, df_tensor *t, df_tensor *scale, bool tiled)
{
    if (scale->v.dtype != DF_DTYPE_F32 || t->v.ndim != 2 || scale->v.ndim != 2 ||
        scale->v.shape[0] != t->v.shape[0] ||
        df_int8_weight_groups(t->v.shape[1], t->v.shape[1] / scale->v.shape[1]) !=
            scale->v.shape[1])
        return df_errorf(DF_E_FORMAT,
                         "tensor '%s_scale': %lld %s scales per row do not fit "
                         "the int8 groups of a row of %lld",
                         name, (long long)scale->v.shape[1], df_dtype_name(scale->v.dtype),
                         (long long)t->v.shape[1]);
    return df_weight_attach_scales(t, scale, tiled);
}
