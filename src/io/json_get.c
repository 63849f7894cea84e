/*
 * Typed JSON values with messages that name the file and the key.
 *
 * The getters are what model and pipeline code use to read configs, so each failure says
 * where and what: "<file>: key 'num_layers': expected an integer, found string". The _or
 * forms treat an absent member and a JSON null alike, as diffusers' configs use null for
 * "not set". Integers must be integral numbers within int64; since JSON numbers are parsed
 * as doubles, "3.0" is accepted as 3 and integers beyond 2^53 are not exact.
 */
#include <math.h>
#include <string.h>

#include "core/status.h"
#include "io/json.h"

/* "<file>: key 'path'" or "<file>: the top-level value" into buf. */
static const char *where(const df_json *j, char *buf, size_t cap)
{
    char path[256];
    df_json_path(j, path, sizeof path);
    if (path[0])
        snprintf(buf, cap, "%s: key '%s'", j->source, path);
    else
        snprintf(buf, cap, "%s: the top-level value", j->source);
    return buf;
}

static df_status wrong_type(const df_json *j, const char *expected)
{
    char w[400];
    return df_errorf(DF_E_FORMAT, "%s: expected %s, found %s", where(j, w, sizeof w), expected,
                     df_json_type_name(j->type));
}

df_status df_json_to_int(const df_json *j, int64_t *out)
{
    *out = 0;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected an integer, found nothing");
    if (j->type != DF_JSON_NUMBER)
        return wrong_type(j, "an integer");
    double v = j->v.number;
    char w[400];
    if (!(v >= -9223372036854775808.0 && v < 9223372036854775808.0))
        return df_errorf(DF_E_FORMAT, "%s: expected an integer, found %g (out of range)",
                         where(j, w, sizeof w), v);
    if (v != floor(v))
        return df_errorf(DF_E_FORMAT, "%s: expected an integer, found %g",
                         where(j, w, sizeof w), v);
    *out = (int64_t)v;
    return DF_OK;
}

df_status df_json_to_double(const df_json *j, double *out)
{
    *out = 0;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected a number, found nothing");
    if (j->type != DF_JSON_NUMBER)
        return wrong_type(j, "a number");
    if (!isfinite(j->v.number)) {
        char w[400];
        return df_errorf(DF_E_FORMAT, "%s: expected a finite number, found %g",
                         where(j, w, sizeof w), j->v.number);
    }
    *out = j->v.number;
    return DF_OK;
}

df_status df_json_to_bool(const df_json *j, bool *out)
{
    *out = false;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected true or false, found nothing");
    if (j->type != DF_JSON_BOOL)
        return wrong_type(j, "true or false");
    *out = j->v.boolean;
    return DF_OK;
}

df_status df_json_to_string(const df_json *j, const char **out)
{
    *out = NULL;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected a string, found nothing");
    if (j->type != DF_JSON_STRING)
        return wrong_type(j, "a string");
    *out = j->v.string;
    return DF_OK;
}

/*
 * Finds member `key` of `obj` for a getter. Returns DF_OK with *m NULL when the member is
 * absent or null and `optional`; fails when it is absent and required.
 */
static df_status member(const df_json *obj, const char *key, bool optional, const df_json **m)
{
    *m = NULL;
    if (!obj || !key)
        return df_errorf(DF_E_ARG, "df_json_get: NULL object or key");
    if (obj->type != DF_JSON_OBJECT)
        return wrong_type(obj, "an object");
    const df_json *j = df_json_get(obj, key);
    if (!j) {
        if (optional)
            return DF_OK;
        char path[256];
        df_json_path(obj, path, sizeof path);
        return df_errorf(DF_E_FORMAT, "%s: key '%s%s%s' is missing", obj->source, path,
                         path[0] ? "." : "", key);
    }
    if (optional && j->type == DF_JSON_NULL)
        return DF_OK;
    *m = j;
    return DF_OK;
}

df_status df_json_get_int(const df_json *obj, const char *key, int64_t *out)
{
    const df_json *m;
    *out = 0;
    DF_TRY(member(obj, key, false, &m));
    return df_json_to_int(m, out);
}

df_status df_json_get_int_or(const df_json *obj, const char *key, int64_t dflt, int64_t *out)
{
    const df_json *m;
    *out = 0;
    DF_TRY(member(obj, key, true, &m));
    if (!m) {
        *out = dflt;
        return DF_OK;
    }
    return df_json_to_int(m, out);
}

df_status df_json_get_double(const df_json *obj, const char *key, double *out)
{
    const df_json *m;
    *out = 0;
    DF_TRY(member(obj, key, false, &m));
    return df_json_to_double(m, out);
}

df_status df_json_get_double_or(const df_json *obj, const char *key, double dflt, double *out)
{
    const df_json *m;
    *out = 0;
    DF_TRY(member(obj, key, true, &m));
    if (!m) {
        *out = dflt;
        return DF_OK;
    }
    return df_json_to_double(m, out);
}

df_status df_json_get_bool(const df_json *obj, const char *key, bool *out)
{
    const df_json *m;
    *out = false;
    DF_TRY(member(obj, key, false, &m));
    return df_json_to_bool(m, out);
}

df_status df_json_get_bool_or(const df_json *obj, const char *key, bool dflt, bool *out)
{
    const df_json *m;
    *out = false;
    DF_TRY(member(obj, key, true, &m));
    if (!m) {
        *out = dflt;
        return DF_OK;
    }
    return df_json_to_bool(m, out);
}

df_status df_json_get_string(const df_json *obj, const char *key, const char **out)
{
    const df_json *m;
    *out = NULL;
    DF_TRY(member(obj, key, false, &m));
    return df_json_to_string(m, out);
}

df_status df_json_get_string_or(const df_json *obj, const char *key, const char *dflt,
                                const char **out)
{
    const df_json *m;
    *out = NULL;
    DF_TRY(member(obj, key, true, &m));
    if (!m) {
        *out = dflt;
        return DF_OK;
    }
    return df_json_to_string(m, out);
}

df_status df_json_get_object(const df_json *obj, const char *key, const df_json **out)
{
    *out = NULL;
    const df_json *m;
    DF_TRY(member(obj, key, false, &m));
    if (m->type != DF_JSON_OBJECT)
        return wrong_type(m, "an object");
    *out = m;
    return DF_OK;
}

df_status df_json_get_array(const df_json *obj, const char *key, const df_json **out)
{
    *out = NULL;
    const df_json *m;
    DF_TRY(member(obj, key, false, &m));
    if (m->type != DF_JSON_ARRAY)
        return wrong_type(m, "an array");
    *out = m;
    return DF_OK;
}

/* The array member `key`, checked to hold at most `cap` elements. */
static df_status bounded_array(const df_json *obj, const char *key, int64_t cap,
                               const char *what, const df_json **out)
{
    DF_TRY(df_json_get_array(obj, key, out));
    if ((*out)->v.list.n > cap) {
        char w[400];
        df_status s = df_errorf(DF_E_FORMAT, "%s: expected at most %lld %s, found %lld",
                                where(*out, w, sizeof w), (long long)cap, what,
                                (long long)(*out)->v.list.n);
        *out = NULL;
        return s;
    }
    return DF_OK;
}

df_status df_json_get_int_array(const df_json *obj, const char *key, int64_t *out, int64_t cap,
                                int64_t *out_n)
{
    *out_n = 0;
    const df_json *a;
    DF_TRY(bounded_array(obj, key, cap, "integers", &a));
    for (int64_t i = 0; i < a->v.list.n; i++)
        DF_TRY(df_json_to_int(&a->v.list.items[i], &out[i]));
    *out_n = a->v.list.n;
    return DF_OK;
}

df_status df_json_get_double_array(const df_json *obj, const char *key, double *out,
                                   int64_t cap, int64_t *out_n)
{
    *out_n = 0;
    const df_json *a;
    DF_TRY(bounded_array(obj, key, cap, "numbers", &a));
    for (int64_t i = 0; i < a->v.list.n; i++)
        DF_TRY(df_json_to_double(&a->v.list.items[i], &out[i]));
    *out_n = a->v.list.n;
    return DF_OK;
}
