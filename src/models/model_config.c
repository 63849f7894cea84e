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
