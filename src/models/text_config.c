/*
 * Config checks shared by the text encoders (see text_config.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/status.h"
#include "models/text_config.h"

df_status df_text_config_int(const df_json *cfg, const char *key, int64_t dflt, int64_t max,
                             int64_t *out)
{
    *out = 0;
    int64_t v;
    if (dflt < 0)
        DF_TRY(df_json_get_int(cfg, key, &v));
    else
        DF_TRY(df_json_get_int_or(cfg, key, dflt, &v));
    if (v < 1 || v > max)
        return df_errorf(DF_E_FORMAT,
                         "%s: key '%s': %" PRId64 " is impossible (expected 1 to %" PRId64 ")",
                         df_json_source(cfg), key, v, max);
    *out = v;
    return DF_OK;
}

df_status df_text_config_eps(const df_json *cfg, const char *key, double dflt, double *out)
{
    *out = 0;
    double v;
    DF_TRY(df_json_get_double_or(cfg, key, dflt, &v));
    if (!(v >= 0 && v < 1))
        return df_errorf(DF_E_FORMAT, "%s: key '%s': %g is impossible (expected 0 <= eps < 1)",
                         df_json_source(cfg), key, v);
    *out = v;
    return DF_OK;
}

df_status df_text_config_class(const df_json *cfg, const char *const *classes, int n)
{
    const char *src = df_json_source(cfg);
    const char *keys[2] = {"architectures", "_class_name"};
    for (int k = 0; k < 2; k++) {
        const df_json *v = df_json_get(cfg, keys[k]);
        if (df_json_is_null(v))
            continue;
        const char *cls;
        if (k == 0) {
            const df_json *list;
            DF_TRY(df_json_get_array(cfg, keys[k], &list));
            for (int64_t i = 0; i < df_json_array_size(list); i++)
                DF_TRY(df_json_to_string(df_json_array_get(list, i), &cls));
            if (df_json_array_size(list) == 0)
                continue;
            cls = df_json_string(df_json_array_get(list, 0));
        } else {
            DF_TRY(df_json_to_string(v, &cls));
        }
        bool known = false;
        for (int i = 0; i < n && !known; i++)
            known = strcmp(cls, classes[i]) == 0;
        if (!known) {
            char list[256];
            size_t used = 0;
            list[0] = '\0';
            for (int i = 0; i < n && used < sizeof list; i++)
                used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                         classes[i]);
            return df_errorf(DF_E_UNSUPPORTED, "%s: key '%s%s': class '%.96s' is not one this "
                             "loader reads (%s)", src, keys[k], k == 0 ? "[0]" : "", cls, list);
        }
    }
    return DF_OK;
}

void df_text_component_name(const char *dir, const char *fallback, char *buf, size_t cap)
{
    size_t end = strlen(dir);
    while (end > 0 && dir[end - 1] == '/')
        end--;
    size_t start = end;
    while (start > 0 && dir[start - 1] != '/')
        start--;
    if (end == start || (end - start == 1 && dir[start] == '.'))
        snprintf(buf, cap, "%s", fallback);
    else
        snprintf(buf, cap, "%.*s", (int)(end - start), dir + start);
}
