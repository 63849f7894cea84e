/* Shared config checks of the model classes (see model_config.h). */
#include <string.h>

#include "core/status.h"
#include "models/model_config.h"

df_status df_config_size(const df_json *cfg, const char *key, int64_t dflt, int64_t min,
                         int64_t max, int64_t *out)
{
    DF_TRY(df_json_get_int_or(cfg, key, dflt, out));
    if (*out < min || *out > max)
        return df_errorf(DF_E_FORMAT, "%s: key '%s' is %lld; expected an integer in [%lld, %lld]",
                         df_json_source(cfg), key, (long long)*out, (long long)min,
                         (long long)max);
    return DF_OK;
}

df_status df_config_class(const df_json *cfg, const char *cls)
{
    const char *name = NULL;
    DF_TRY(df_json_get_string_or(cfg, "_class_name", NULL, &name));
    if (name && strcmp(name, cls) != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s: key '_class_name': class '%.96s' is not "
                         "supported (this loader reads %s)", df_json_source(cfg), name, cls);
    return DF_OK;
}

df_status df_config_names_all(const df_json *cfg, const char *key, const char *want, int64_t n,
                              const char *n_key)
{
    const df_json *names = df_json_get(cfg, key);
    if (df_json_is_null(names))
        return DF_OK;
    const char *src = df_json_source(cfg);
    DF_TRY(df_json_get_array(cfg, key, &names));
    int64_t got = df_json_array_size(names);
    if (n >= 0 && got != n)
        return df_errorf(DF_E_FORMAT, "%s: %s has %lld entries but %s has %lld", src, key,
                         (long long)got, n_key, (long long)n);
    for (int64_t i = 0; i < got; i++) {
        const char *t;
        DF_TRY(df_json_to_string(df_json_array_get(names, i), &t));
        if (strcmp(t, want) != 0)
            return df_errorf(DF_E_UNSUPPORTED,
                             "%s: key '%s[%lld]' is '%.64s'; only \"%s\" is implemented", src,
                             key, (long long)i, t, want);
    }
    return DF_OK;
}

df_status df_config_rope_axes(const df_json *cfg, const int64_t *dflt, int n_dflt, int max_axes,
                              int64_t max, int64_t head_dim, int64_t *axes, int *n)
{
    const char *src = df_json_source(cfg);
    if (df_json_is_null(df_json_get(cfg, "axes_dims_rope"))) {
        memcpy(axes, dflt, (size_t)n_dflt * sizeof *axes);
        *n = n_dflt;
    } else {
        int64_t got = 0;
        DF_TRY(df_json_get_int_array(cfg, "axes_dims_rope", axes, max_axes, &got));
        if (got < 1)
            return df_errorf(DF_E_FORMAT, "%s: key 'axes_dims_rope' is empty", src);
        *n = (int)got;
    }
    int64_t sum = 0;
    for (int a = 0; a < *n; a++) {
        int64_t d = axes[a];
        if (d <= 0 || d % 2 || d > max)
            return df_errorf(DF_E_FORMAT,
                             "%s: key 'axes_dims_rope[%d]' is %lld; expected a "
                             "positive even size (RoPE rotates pairs)",
                             src, a, (long long)d);
        sum += d;
    }
    if (sum != head_dim)
        return df_errorf(DF_E_FORMAT,
                         "%s: key 'axes_dims_rope' sums to %lld but "
                         "'attention_head_dim' is %lld; RoPE must cover the whole head",
                         src, (long long)sum, (long long)head_dim);
    return DF_OK;
}
