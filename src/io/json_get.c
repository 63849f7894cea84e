/*
 * Typed JSON values with messages that name the file and the key.
 *
 * The getters are what model and pipeline code use to read configs, so each failure says
 * where and what: "<file>: key 'num_layers': expected an integer, found string". The _or
 * forms treat an absent member and a JSON null alike, as diffusers' configs use null for
 * "not set". Integers are read exactly from their digits (json.c keeps an integer literal's
 * value up to 2^64 - 1); a whole number written with a fraction or exponent ("3.0", "1e3")
 * is accepted below 2^53, where a double holds it exactly.
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

/* The number as written when it is an integer literal, else the nearest double. */
static const char *number_text(const df_json *j, char *buf, size_t cap)
{
    if (j->v.number.integer)
        snprintf(buf, cap, "%s%llu", j->v.number.negative ? "-" : "",
                 (unsigned long long)j->v.number.magnitude);
    else
        snprintf(buf, cap, "%.17g", j->v.number.value);
    return buf;
}

/*
 * j as an integer in [-2^63, 2^64 - 1]: exact for an integer literal; a number written with
 * a fraction or exponent counts when its value is whole and below 2^53 in magnitude (where
 * doubles are exact), so "3.0" is 3. *neg and *mag receive the sign and magnitude.
 */
static df_status integral(const df_json *j, bool *neg, uint64_t *mag)
{
    *neg = false;
    *mag = 0;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected an integer, found nothing");
    if (j->type != DF_JSON_NUMBER)
        return wrong_type(j, "an integer");
    char w[400], num[48];
    if (j->v.number.integer) {
        *neg = j->v.number.negative && j->v.number.magnitude != 0;
        *mag = j->v.number.magnitude;
        return DF_OK;
    }
    double v = j->v.number.value;
    if (v != floor(v))
        return df_errorf(DF_E_FORMAT, "%s: expected an integer, found %s",
                         where(j, w, sizeof w), number_text(j, num, sizeof num));
    if (!(fabs(v) < 0x1p64))
        return df_errorf(DF_E_FORMAT, "%s: expected an integer, found %s (out of range)",
                         where(j, w, sizeof w), number_text(j, num, sizeof num));
    if (!(fabs(v) < 0x1p53))
        return df_errorf(DF_E_FORMAT, "%s: expected an integer, found %s (past 2^53 a number "
                         "written with a fraction or exponent may have been rounded: write "
                         "the digits)", where(j, w, sizeof w), number_text(j, num, sizeof num));
    *neg = v < 0;
    *mag = (uint64_t)fabs(v);
    return DF_OK;
}

df_status df_json_to_int(const df_json *j, int64_t *out)
{
    *out = 0;
    bool neg;
    uint64_t mag;
    DF_TRY(integral(j, &neg, &mag));
    if (mag > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) {
        char w[400], num[48];
        return df_errorf(DF_E_FORMAT, "%s: expected an integer in [-2^63, 2^63 - 1], found %s "
                         "(out of range)", where(j, w, sizeof w), number_text(j, num, sizeof num));
    }
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return DF_OK;
}

df_status df_json_to_uint64(const df_json *j, uint64_t *out)
{
    *out = 0;
    bool neg;
    uint64_t mag;
    DF_TRY(integral(j, &neg, &mag));
    if (neg) {
        char w[400], num[48];
        return df_errorf(DF_E_FORMAT, "%s: expected a non-negative integer, found %s",
                         where(j, w, sizeof w), number_text(j, num, sizeof num));
    }
    *out = mag;
    return DF_OK;
}

df_status df_json_to_double(const df_json *j, double *out)
{
    *out = 0;
    if (!j)
        return df_errorf(DF_E_FORMAT, "expected a number, found nothing");
    if (j->type != DF_JSON_NUMBER)
        return wrong_type(j, "a number");
    if (!isfinite(j->v.number.value)) {
        char w[400];
        return df_errorf(DF_E_FORMAT, "%s: expected a finite number, found %g",
                         where(j, w, sizeof w), j->v.number.value);
    }
    *out = j->v.number.value;
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

df_status df_json_get_uint64(const df_json *obj, const char *key, uint64_t *out)
{
    const df_json *m;
    *out = 0;
    DF_TRY(member(obj, key, false, &m));
    return df_json_to_uint64(m, out);
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
