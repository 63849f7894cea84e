/*
 * The int8 quantization policy (quant_policy.h).
 */
#include <stdlib.h>
#include <string.h>

#include "models/quant_policy.h"
#include "runtime/runtime.h"

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

bool df_quant_keeps_precision(const char *component, const char *name)
{
    if (strcmp(component, "vae") == 0 || starts(name, "text_model.") ||
        starts(name, "text_projection"))
        return true;
    if (strcmp(component, "transformer") != 0)
        return false;
    const char *keep = getenv("DIFFUSE_INT8_KEEP");
    if (keep && strcmp(keep, "none") == 0)
        return false;
    static const char *const kept[] = {"x_embedder.", "context_embedder.", "time_text_embed.",
                                       "norm_out.", "proj_out."};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++)
        if (starts(name, kept[i]))
            return true;
    return false;
}

size_t df_quant_bind(df_ctx *ctx, const char *component, const char *name, df_tensor *t,
                     size_t bytes)
{
    bool keeps = df_quant_keeps_precision(component, name);
    t->v.st->keep_precision = keeps;
    size_t len = strlen(name);
    bool linear_weight = t->v.ndim == 2 && len > 7 && strcmp(name + len - 7, ".weight") == 0;
    if (df_ctx_compute_dtype(ctx) != DF_DTYPE_I8 || keeps || !linear_weight)
        return bytes;
    /* int8 values, and per group of 128 (the default) an f32 scale and an int32 sum */
    int64_t n = t->v.shape[0], k = t->v.shape[1];
    return (size_t)(n * k) + (size_t)(n * ((k + 127) / 128)) * 8;
}
