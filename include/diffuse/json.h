/*
 * Read-only JSON documents: configs (config.json, scheduler_config.json, model_index.json),
 * sharded-checkpoint indexes and golden case files.
 *
 * A document is parsed once into a tree of df_json nodes that the caller only reads. Every
 * node remembers the file it came from and where it sits in the tree, so the typed getters
 * write messages such as
 *     transformer/config.json: key 'num_layers': expected an integer, found string
 * and model code needs one line per value:
 *     DF_TRY(df_json_get_int(cfg, "num_layers", &n));            (required)
 *     DF_TRY(df_json_get_int_or(cfg, "patch_size", 1, &p));      (optional: absent or null)
 *
 * Nodes are borrowed: they live as long as the root returned by a parse function, which the
 * caller frees with df_json_free(). Parsing rejects what a strict reader would: malformed
 * JSON, invalid UTF-8, control characters inside strings, the escape \u0000, and duplicate
 * keys in one object. Object lookup is a binary search; array indexing is constant time.
 */
#ifndef DIFFUSE_JSON_H
#define DIFFUSE_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_json df_json;

typedef enum df_json_type {
    DF_JSON_NULL,
    DF_JSON_BOOL,
    DF_JSON_NUMBER,
    DF_JSON_STRING,
    DF_JSON_ARRAY,
    DF_JSON_OBJECT,
} df_json_type;

/* ---- parsing ---------------------------------------------------------------------- */

/*
 * Parses the file at `path`. On success *out is the root, owned by the caller (free it with
 * df_json_free). Fails with DF_E_IO when the file cannot be read or is not a regular file,
 * DF_E_FORMAT when it is not valid JSON (the message gives path:line:column), DF_E_OOM.
 */
DF_API df_status df_json_parse_file(const char *path, df_json **out);

/*
 * Parses `len` bytes of `text` (no terminating NUL needed). `name` stands for the file in
 * messages ("<string>" when NULL). Same ownership and failures as df_json_parse_file.
 */
DF_API df_status df_json_parse_string(const char *text, size_t len, const char *name,
                                      df_json **out);

/* Frees a document given its root. NULL is fine; a node that is not a root is ignored. */
DF_API void df_json_free(df_json *root);

/* ---- reading nodes ---------------------------------------------------------------- */

/* The file (or name) the node's document came from. */
DF_API const char *df_json_source(const df_json *j);

/* The node's type; DF_JSON_NULL for a NULL node. */
DF_API df_json_type df_json_type_of(const df_json *j);

/* "null", "boolean", "number", "string", "array", "object". */
DF_API const char *df_json_type_name(df_json_type t);

/* True for a JSON null and for NULL (an absent member): Python's `config.get(key) is None`. */
DF_API bool df_json_is_null(const df_json *j);

/* Writes the node's path inside its document ("axes_dims_rope[1]", "weight_map.x"; "" for
 * the root) into buf, truncated to cap bytes, and returns buf. */
DF_API const char *df_json_path(const df_json *j, char *buf, size_t cap);

/* The member `key` of object `obj`; NULL when absent or when obj is not an object. */
DF_API const df_json *df_json_get(const df_json *obj, const char *key);

/* Arrays: element count (0 for anything else) and element i (NULL when out of range). */
DF_API int64_t df_json_array_size(const df_json *arr);
DF_API const df_json *df_json_array_get(const df_json *arr, int64_t i);

/* Objects: member count (0 for anything else) and member i in file order (NULL when out of
 * range); *out_key (if out_key is not NULL) receives its key. */
DF_API int64_t df_json_object_size(const df_json *obj);
DF_API const df_json *df_json_object_at(const df_json *obj, int64_t i, const char **out_key);

/* Raw values without checks: the number (0 when not a number), the string (NULL when not a
 * string; valid while the document lives), the boolean (false when not a boolean). */
DF_API double df_json_number(const df_json *j);
DF_API const char *df_json_string(const df_json *j);
DF_API bool df_json_bool(const df_json *j);

/* ---- typed values with messages --------------------------------------------------- */

/*
 * Converts one node. DF_E_FORMAT (message: source, the node's path, what was expected and
 * what was found) when the node has another type, is NULL (absent), is not an integral
 * number within int64 (_to_int) or within [0, 2^64 - 1] (_to_uint64), or is not finite
 * (_to_double). Integers are exact: they are read from the digits as written, not through
 * a double (18446744073709551615 is 2^64 - 1); a whole number written with a fraction or
 * exponent ("3.0", "1e3") counts as an integer below 2^53 in magnitude.
 */
DF_API df_status df_json_to_int(const df_json *j, int64_t *out);
DF_API df_status df_json_to_uint64(const df_json *j, uint64_t *out);
DF_API df_status df_json_to_double(const df_json *j, double *out);
DF_API df_status df_json_to_bool(const df_json *j, bool *out);
DF_API df_status df_json_to_string(const df_json *j, const char **out);

/*
 * Member getters. The plain forms require the member: DF_E_FORMAT when it is absent, null
 * or of the wrong type. The _or forms return `dflt` when the member is absent or null and
 * fail only on a wrong type. DF_E_FORMAT too when `obj` is not an object; DF_E_ARG when obj
 * or key is NULL. Strings are borrowed from the document.
 */
DF_API df_status df_json_get_int(const df_json *obj, const char *key, int64_t *out);
DF_API df_status df_json_get_int_or(const df_json *obj, const char *key, int64_t dflt,
                                    int64_t *out);
DF_API df_status df_json_get_uint64(const df_json *obj, const char *key, uint64_t *out);
DF_API df_status df_json_get_double(const df_json *obj, const char *key, double *out);
DF_API df_status df_json_get_double_or(const df_json *obj, const char *key, double dflt,
                                       double *out);
DF_API df_status df_json_get_bool(const df_json *obj, const char *key, bool *out);
DF_API df_status df_json_get_bool_or(const df_json *obj, const char *key, bool dflt, bool *out);
DF_API df_status df_json_get_string(const df_json *obj, const char *key, const char **out);
DF_API df_status df_json_get_string_or(const df_json *obj, const char *key, const char *dflt,
                                       const char **out);

/* A required member that must be an object / an array. */
DF_API df_status df_json_get_object(const df_json *obj, const char *key, const df_json **out);
DF_API df_status df_json_get_array(const df_json *obj, const char *key, const df_json **out);

/*
 * A required array of integers (e.g. "axes_dims_rope") / numbers, copied into out[0..cap).
 * *out_n receives the element count. DF_E_FORMAT when the member is missing, not an array,
 * longer than cap, or holds an element of another kind (the message names it: 'key[2]').
 */
DF_API df_status df_json_get_int_array(const df_json *obj, const char *key, int64_t *out,
                                       int64_t cap, int64_t *out_n);
DF_API df_status df_json_get_double_array(const df_json *obj, const char *key, double *out,
                                          int64_t cap, int64_t *out_n);

#ifdef __cplusplus
}
#endif
#endif
