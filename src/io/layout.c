/*
 * The diffusers folder layout: model_index.json, component folders, their weights and
 * configs, and the registry of per-class model checks.
 *
 * model_index.json members whose value is an array are components; any other member is a
 * pipeline setting. A component array must be [library, class] with strings or nulls; its
 * name must be a plain name, since it becomes a folder name, and both the name and the
 * class must be Python identifiers, since diffusers passes the name as a keyword argument
 * and looks the class up as an attribute of its library. Every JSON file of the layout
 * (model_index.json, config.json, scheduler_config.json, tokenizer files) is an object. Weights are looked for in
 * diffusers' order of preference; when a folder has only PyTorch pickles (.bin) we say so
 * instead of "missing", since diffuse does not read pickles. The model check registry is a
 * fixed table behind a mutex: model code registers once, inspect looks up.
 */
#include <diffuse/layout.h>

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"

struct df_model_index {
    const df_json *root;
    df_json *owned; /* the document when loaded from a folder */
    const char *cls;
    int count;
    df_component *components;
};

/* Whether s is a Python identifier of ASCII letters, digits and '_' (not starting with a
 * digit): every diffusers component name and every class diffuse can load is one. */
static bool is_identifier(const char *s)
{
    if (!s[0] || (s[0] >= '0' && s[0] <= '9'))
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_'))
            return false;
    return true;
}

/* Reads one member as a component; *is_component is false for a setting. */
static df_status read_component(const df_json *root, const char *key, const df_json *v,
                                df_component *c, bool *is_component)
{
    const char *src = df_json_source(root);
    *is_component = df_json_type_of(v) == DF_JSON_ARRAY;
    if (!*is_component || key[0] == '_') {
        *is_component = false;
        return DF_OK;
    }
    if (df_json_array_size(v) != 2)
        return df_errorf(DF_E_FORMAT, "%s: component '%s' must be [library, class], found an "
                         "array of %lld", src, key, (long long)df_json_array_size(v));
    const char *parts[2];
    for (int i = 0; i < 2; i++) {
        const df_json *p = df_json_array_get(v, i);
        if (df_json_type_of(p) != DF_JSON_STRING && df_json_type_of(p) != DF_JSON_NULL)
            return df_errorf(DF_E_FORMAT, "%s: component '%s': %s must be a string or null, "
                             "found %s", src, key, i ? "class" : "library",
                             df_json_type_name(df_json_type_of(p)));
        parts[i] = df_json_string(p);
    }
    if (!parts[0] != !parts[1])
        return df_errorf(DF_E_FORMAT, "%s: component '%s': library and class must both be "
                         "null or both be strings", src, key);
    DF_TRY(df_path_check_inside(key, true, src, "component"));
    if (!is_identifier(key))
        return df_errorf(DF_E_FORMAT, "%s: component name '%.96s' is not a Python identifier "
                         "(letters, digits and '_')", src, key);
    if (parts[1] && !is_identifier(parts[1]))
        return df_errorf(DF_E_FORMAT, "%s: component '%s': class '%.96s' is not a Python "
                         "identifier (letters, digits and '_')", src, key, parts[1]);
    *c = (df_component){key, parts[0], parts[1]};
    return DF_OK;
}

df_status df_model_index_from_json(const df_json *root, df_model_index **out)
{
    if (!out || !root)
        return df_errorf(DF_E_ARG, "df_model_index_from_json: NULL argument");
    *out = NULL;
    const char *src = df_json_source(root);
    if (df_json_type_of(root) != DF_JSON_OBJECT)
        return df_errorf(DF_E_FORMAT, "%s: model_index.json must be a JSON object, found %s",
                         src, df_json_type_name(df_json_type_of(root)));
    const char *cls;
    DF_TRY(df_json_get_string_or(root, "_class_name", NULL, &cls));
    int64_t n = df_json_object_size(root);
    df_model_index *idx = df_calloc(1, sizeof *idx);
    if (idx)
        idx->components = df_calloc((size_t)(n ? n : 1), sizeof *idx->components);
    if (!idx || !idx->components) {
        df_free(idx);
        return df_errorf(DF_E_OOM, "%s: out of memory", src);
    }
    idx->root = root;
    idx->cls = cls;
    for (int64_t i = 0; i < n; i++) {
        const char *key;
        const df_json *v = df_json_object_at(root, i, &key);
        bool is_component;
        df_status s = read_component(root, key, v, &idx->components[idx->count], &is_component);
        if (s != DF_OK) {
            df_model_index_free(idx);
            return s;
        }
        idx->count += is_component;
    }
    *out = idx;
    return DF_OK;
}

df_status df_model_index_load(const char *dir, df_model_index **out)
{
    if (!out || !dir)
        return df_errorf(DF_E_ARG, "df_model_index_load: NULL argument");
    *out = NULL;
    df_json *root;
    DF_TRY(df_layout_open_json(dir, "model_index.json", &root));
    df_status s = df_model_index_from_json(root, out);
    if (s != DF_OK) {
        df_json_free(root);
        return s;
    }
    (*out)->owned = root;
    return DF_OK;
}

const df_json *df_model_index_json(const df_model_index *idx)
{
    return idx ? idx->root : NULL;
}

const char *df_model_index_class(const df_model_index *idx)
{
    return idx ? idx->cls : NULL;
}

int df_model_index_count(const df_model_index *idx)
{
    return idx ? idx->count : 0;
}

const df_component *df_model_index_at(const df_model_index *idx, int i)
{
    return idx && i >= 0 && i < idx->count ? &idx->components[i] : NULL;
}

const df_component *df_model_index_find(const df_model_index *idx, const char *name)
{
    for (int i = 0; idx && name && i < idx->count; i++)
        if (strcmp(idx->components[i].name, name) == 0)
            return &idx->components[i];
    return NULL;
}

void df_model_index_free(df_model_index *idx)
{
    if (!idx)
        return;
    df_json_free(idx->owned);
    df_free(idx->components);
    df_free(idx);
}

/* ---- component folders ------------------------------------------------------------ */

static df_status join_into(const char *dir, const char *name, char *buf, size_t cap)
{
    size_t a = strlen(dir);
    bool slash = a > 0 && dir[a - 1] != '/';
    int n = snprintf(buf, cap, "%s%s%s", dir, slash ? "/" : "", name);
    if (n < 0 || (size_t)n >= cap)
        return df_errorf(DF_E_ARG, "path '%s/%s' is longer than %zu bytes", dir, name, cap);
    return DF_OK;
}

df_status df_layout_component_dir(const char *root, const char *component, char *buf,
                                  size_t cap)
{
    if (!root || !component || !buf || cap == 0)
        return df_errorf(DF_E_ARG, "df_layout_component_dir: NULL argument");
    buf[0] = '\0';
    char src[DF_PATH_MAX];
    snprintf(src, sizeof src, "%s/model_index.json", root);
    DF_TRY(df_path_check_inside(component, true, src, "component"));
    DF_TRY(join_into(root, component, buf, cap));
    if (!df_path_is_dir(buf))
        return df_errorf(DF_E_IO, "%s: component '%s' has no folder %s", src, component, buf);
    /* The folder itself may not be a link out of the pipeline folder (a Hugging Face cache
     * snapshot links files to its blobs, never component folders). */
    char real_root[PATH_MAX], real_dir[PATH_MAX];
    df_status s = DF_OK;
    if (!realpath(root, real_root) || !realpath(buf, real_dir)) {
        s = df_errorf(DF_E_IO, "%s: cannot resolve component folder %s: %s", src, buf,
                      strerror(errno));
    } else {
        size_t n = strlen(real_root);
        bool inside = strncmp(real_dir, real_root, n) == 0 &&
                      (real_dir[n] == '/' || (n == 1 && real_root[0] == '/'));
        if (!inside)
            s = df_errorf(DF_E_FORMAT, "%s: component '%s' is a link to %s, outside the "
                          "pipeline folder", src, component, real_dir);
    }
    if (s != DF_OK)
        buf[0] = '\0';
    return s;
}

/* Whether `dir` holds a file ending in `suffix`. */
static bool has_file_ending(const char *dir, const char *suffix)
{
    DIR *d = opendir(dir);
    if (!d)
        return false;
    bool found = false;
    for (struct dirent *e; !found && (e = readdir(d));)
        found = df_str_ends_with(e->d_name, suffix);
    closedir(d);
    return found;
}

df_status df_layout_find_weights(const char *dir, char *buf, size_t cap)
{
    static const char *const names[] = {
        "diffusion_pytorch_model.safetensors",
        "model.safetensors",
        "diffusion_pytorch_model.safetensors.index.json",
        "model.safetensors.index.json",
    };
    if (!dir || !buf || cap == 0)
        return df_errorf(DF_E_ARG, "df_layout_find_weights: NULL argument");
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        DF_TRY(join_into(dir, names[i], buf, cap));
        if (df_path_is_file(buf))
            return DF_OK;
    }
    buf[0] = '\0';
    if (has_file_ending(dir, ".bin"))
        return df_errorf(DF_E_UNSUPPORTED, "%s: only PyTorch .bin weights are there; diffuse "
                         "reads safetensors (convert them, or download the .safetensors "
                         "files)", dir);
    return df_errorf(DF_E_IO, "%s: no weights (diffusion_pytorch_model.safetensors, "
                     "model.safetensors or a sharded .safetensors.index.json)", dir);
}

df_status df_layout_open_json(const char *dir, const char *file, df_json **out)
{
    if (!out || !dir || !file)
        return df_errorf(DF_E_ARG, "df_layout_open_json: NULL argument");
    *out = NULL;
    char path[DF_PATH_MAX];
    DF_TRY(df_path_check_inside(file, true, dir, "file"));
    DF_TRY(join_into(dir, file, path, sizeof path));
    DF_TRY(df_json_parse_file(path, out));
    if (df_json_type_of(*out) != DF_JSON_OBJECT) {
        df_status s = df_errorf(DF_E_FORMAT, "%s: the root must be a JSON object, found %s",
                                path, df_json_type_name(df_json_type_of(*out)));
        df_json_free(*out);
        *out = NULL;
        return s;
    }
    return DF_OK;
}

df_status df_layout_open_config(const char *dir, df_json **out)
{
    return df_layout_open_json(dir, "config.json", out);
}

/* ---- model checks ----------------------------------------------------------------- */

#define MAX_CHECKS 64

static struct {
    char cls[96];
    df_model_check_fn fn;
} checks[MAX_CHECKS];
static int n_checks;
static pthread_mutex_t checks_lock = PTHREAD_MUTEX_INITIALIZER;

df_status df_model_check_register(const char *cls, df_model_check_fn fn)
{
    if (!cls || !fn || strlen(cls) >= sizeof checks[0].cls)
        return df_errorf(DF_E_ARG, "df_model_check_register: invalid class or function");
    df_status s = DF_OK;
    pthread_mutex_lock(&checks_lock);
    int i = 0;
    while (i < n_checks && strcmp(checks[i].cls, cls) != 0)
        i++;
    if (i == MAX_CHECKS) {
        s = df_errorf(DF_E_OOM, "model check registry is full (%d classes)", MAX_CHECKS);
    } else {
        strcpy(checks[i].cls, cls);
        checks[i].fn = fn;
        if (i == n_checks)
            n_checks++;
    }
    pthread_mutex_unlock(&checks_lock);
    return s;
}

df_model_check_fn df_model_check_find(const char *cls)
{
    df_model_check_fn fn = NULL;
    if (!cls)
        return NULL;
    pthread_mutex_lock(&checks_lock);
    for (int i = 0; i < n_checks && !fn; i++)
        if (strcmp(checks[i].cls, cls) == 0)
            fn = checks[i].fn;
    pthread_mutex_unlock(&checks_lock);
    return fn;
}

const char *df_model_check_classes(char *buf, size_t cap)
{
    size_t used = 0;
    if (cap)
        buf[0] = '\0';
    pthread_mutex_lock(&checks_lock);
    for (int i = 0; i < n_checks && used < cap; i++) {
        int n = snprintf(buf + used, cap - used, "%s%s", i ? ", " : "", checks[i].cls);
        used += n > 0 ? (size_t)n : 0;
    }
    pthread_mutex_unlock(&checks_lock);
    return buf;
}
