/*
 * The backend registry, plugin loading and the wrappers of optional backend entries.
 *
 * Plugins: the first look-up of a backend (df_backend_find) loads every
 * `libdiffuse-<name>.so` of the plugin folder once, unless DIFFUSE_BACKEND_AUTOLOAD=0. The
 * folder is $DIFFUSE_BACKEND_DIR, else the folder of the file this code is linked into
 * (the shared library, or the program that links the static one) and, for a program
 * installed in bindir, the library folder beside it (DF_PLUGIN_RELDIR, libdir relative to
 * bindir, set by CMake: an installed `diffuse` finds the plugins installed in libdir). A
 * plugin that fails to load or to register is skipped with a warning when loading
 * automatically, and reported as an error by df_backend_load.
 */
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/graph.h"
#include "core/alloc.h"
#include "core/status.h"

#define MAX_BACKENDS 16

static df_device_ops table[MAX_BACKENDS];
static int n_backends;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t builtins_once = PTHREAD_ONCE_INIT;
static pthread_once_t autoload_once = PTHREAD_ONCE_INIT;

static void host_logf(int level, const char *fmt, ...)
{
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    df_logf(level, "diffuse: %s", line);
}

static df_status host_errorf(df_status s, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return df_errorf(s, "%s", msg);
}

static const df_host_api host_api = {
    .abi_version = DF_DEVICE_ABI_VERSION,
    .errorf = host_errorf,
    .logf = host_logf,
    .error_message = df_error_message,
    .aligned_alloc = df_aligned_alloc,
    .aligned_free = df_aligned_free,
};

const df_host_api *df_host_services(void)
{
    return &host_api;
}

static df_status check_ops(const df_device_ops *ops)
{
    if (!ops || !ops->name || !*ops->name || strlen(ops->name) > 15)
        return df_errorf(DF_E_ARG, "backend table without a name (1 to 15 characters)");
    if (ops->abi_version != DF_DEVICE_ABI_VERSION)
        return df_errorf(DF_E_UNSUPPORTED, "backend '%s' was built for device ABI %d, this "
                         "library speaks %d", ops->name, ops->abi_version,
                         DF_DEVICE_ABI_VERSION);
    if (ops->struct_size < offsetof(df_device_ops, stream_throttle))
        return df_errorf(DF_E_UNSUPPORTED, "backend '%s': its table is %zu bytes, shorter "
                         "than the required entries", ops->name, ops->struct_size);
    const struct {
        const char *name;
        bool present;
    } required[] = {
        {"device_count", ops->device_count}, {"device_info", ops->device_info},
        {"device_open", ops->device_open}, {"device_close", ops->device_close},
        {"buffer_alloc", ops->buffer_alloc}, {"buffer_free", ops->buffer_free},
        {"stream_create", ops->stream_create}, {"stream_free", ops->stream_free},
        {"launch", ops->launch}, {"copy_h2d", ops->copy_h2d}, {"copy_d2h", ops->copy_d2h},
        {"copy_d2d", ops->copy_d2d}, {"host_callback", ops->host_callback},
        {"stream_record", ops->stream_record}, {"stream_reached", ops->stream_reached},
        {"stream_wait", ops->stream_wait}, {"stream_sync", ops->stream_sync},
        {"stream_reset", ops->stream_reset},
    };
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        if (!required[i].present)
            return df_errorf(DF_E_UNSUPPORTED, "backend '%s' lacks the required entry %s",
                             ops->name, required[i].name);
    return DF_OK;
}

static df_status register_locked(const df_device_ops *ops)
{
    DF_TRY(check_ops(ops));
    for (int i = 0; i < n_backends; i++)
        if (strcmp(table[i].name, ops->name) == 0)
            return df_errorf(DF_E_ARG, "a backend named '%s' is already registered",
                             ops->name);
    if (n_backends == MAX_BACKENDS)
        return df_errorf(DF_E_UNSUPPORTED, "backend '%s': at most %d backends", ops->name,
                         MAX_BACKENDS);
    df_device_ops *t = &table[n_backends];
    memset(t, 0, sizeof *t);
    memcpy(t, ops, ops->struct_size < sizeof *t ? ops->struct_size : sizeof *t);
    t->struct_size = sizeof *t;
    n_backends++;
    return DF_OK;
}

static void register_builtins(void)
{
    register_locked(df_backend_cpu()); /* cannot fail: checked by the tests */
    if (df_backend_sim())
        register_locked(df_backend_sim());
}

df_status df_backend_register(const df_device_ops *ops)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_mutex_lock(&mu);
    df_status s = register_locked(ops);
    pthread_mutex_unlock(&mu);
    return s;
}

#ifndef DF_PLUGIN_RELDIR
#define DF_PLUGIN_RELDIR "../lib"
#endif

/* Folder `which` (0, 1) plugins are looked for in (no trailing slash); false when there is
 * no such folder. 0: $DIFFUSE_BACKEND_DIR, else the folder of the file this code is in;
 * 1 (without $DIFFUSE_BACKEND_DIR): that folder's DF_PLUGIN_RELDIR. */
static bool plugin_dir(int which, char *out, size_t size)
{
    const char *env = getenv("DIFFUSE_BACKEND_DIR");
    if (env && *env) {
        snprintf(out, size, "%s", env);
        return which == 0;
    }
    Dl_info info;
    out[0] = '\0';
    if (!dladdr((void *)plugin_dir, &info) || !info.dli_fname)
        return false;
    snprintf(out, size, "%s", info.dli_fname);
    char *slash = strrchr(out, '/');
    if (slash)
        *slash = '\0';
    else
        snprintf(out, size, ".");
    if (which == 1) {
        size_t n = strlen(out);
        if (n + 1 + strlen(DF_PLUGIN_RELDIR) >= size)
            return false;
        snprintf(out + n, size - n, "/%s", DF_PLUGIN_RELDIR);
    }
    return which <= 1;
}

static df_status load_path(const char *path, const char *name)
{
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return df_errorf(DF_E_IO, "backend '%s': cannot load %s: %s", name, path,
                         dlerror());
    df_device_plugin_fn entry = (df_device_plugin_fn)dlsym(h, DF_DEVICE_PLUGIN_ENTRY);
    if (!entry) {
        dlclose(h);
        return df_errorf(DF_E_FORMAT, "backend '%s': %s has no symbol %s", name, path,
                         DF_DEVICE_PLUGIN_ENTRY);
    }
    df_error_clear();
    const df_device_ops *ops = entry(&host_api, DF_DEVICE_ABI_VERSION);
    if (!ops) {
        const char *why = df_error_message();
        df_status s = df_errorf(DF_E_DEVICE, "backend '%s' (%s) declined to load: %s", name,
                                path, why && *why ? why : "no reason given");
        dlclose(h);
        return s;
    }
    df_status s = DF_OK;
    if (strcmp(ops->name, name) != 0)
        s = df_errorf(DF_E_FORMAT, "%s calls itself '%s', expected '%s'", path, ops->name,
                      name);
    if (s == DF_OK) {
        pthread_mutex_lock(&mu);
        s = register_locked(ops);
        pthread_mutex_unlock(&mu);
    }
    if (s != DF_OK)
        dlclose(h);
    return s; /* a registered plugin stays loaded for the life of the process */
}

static bool registered(const char *name)
{
    pthread_mutex_lock(&mu);
    bool found = false;
    for (int i = 0; i < n_backends && !found; i++)
        found = strcmp(table[i].name, name) == 0;
    pthread_mutex_unlock(&mu);
    return found;
}

static bool plugin_name(const char *file, char *name, size_t size)
{
    size_t n = strlen(file);
    const char *pre = "libdiffuse-", *suf = ".so";
    size_t np = strlen(pre), ns = strlen(suf);
    if (n <= np + ns || strncmp(file, pre, np) != 0 || strcmp(file + n - ns, suf) != 0 ||
        n - np - ns >= size)
        return false;
    memcpy(name, file + np, n - np - ns);
    name[n - np - ns] = '\0';
    return true;
}

static void autoload(void)
{
    const char *env = getenv("DIFFUSE_BACKEND_AUTOLOAD");
    if (env && strcmp(env, "0") == 0)
        return;
    char dir[4096];
    for (int which = 0; plugin_dir(which, dir, sizeof dir); which++) {
        DIR *d = dir[0] ? opendir(dir) : NULL;
        if (!d)
            continue;
        for (struct dirent *e; (e = readdir(d));) {
            char name[16], path[4400];
            if (!plugin_name(e->d_name, name, sizeof name) || registered(name))
                continue; /* the first folder that has a plugin wins */
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            if (load_path(path, name) != DF_OK)
                host_logf(0, "warning: %s", df_error_message());
        }
        closedir(d);
    }
    df_error_clear();
}

df_status df_backend_load(const char *name)
{
    pthread_once(&builtins_once, register_builtins);
    if (!name || !*name || strlen(name) > 15 || strchr(name, '/'))
        return df_errorf(DF_E_ARG, "backend name '%s': expected 1 to 15 characters, no '/'",
                         name ? name : "(null)");
    if (registered(name))
        return DF_OK;
    char dir[4096], path[4400];
    for (int which = 0; plugin_dir(which, dir, sizeof dir); which++) {
        snprintf(path, sizeof path, "%s/libdiffuse-%s.so", dir[0] ? dir : ".", name);
        if (access(path, F_OK) == 0)
            return load_path(path, name);
    }
    plugin_dir(0, dir, sizeof dir); /* in no folder: the first one's message */
    snprintf(path, sizeof path, "%s/libdiffuse-%s.so", dir[0] ? dir : ".", name);
    return load_path(path, name);
}

const df_device_ops *df_backend_find(const char *name)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_once(&autoload_once, autoload);
    const df_device_ops *found = NULL;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_backends && !found; i++)
        if (strcmp(table[i].name, name) == 0)
            found = &table[i];
    pthread_mutex_unlock(&mu);
    return found;
}

int df_backend_count(void)
{
    pthread_once(&builtins_once, register_builtins);
    pthread_once(&autoload_once, autoload);
    pthread_mutex_lock(&mu);
    int n = n_backends;
    pthread_mutex_unlock(&mu);
    return n;
}

const df_device_ops *df_backend_at(int i)
{
    pthread_mutex_lock(&mu);
    const df_device_ops *ops = i >= 0 && i < n_backends ? &table[i] : NULL;
    pthread_mutex_unlock(&mu);
    return ops;
}

/* ---- wrappers of optional entries ---------------------------------------------------- */

df_status df_dev_launch_fused(const df_device *d, df_dev_stream *s, const df_fused *f)
{
    if (!d->ops->launch_fused)
        return df_errorf(DF_E_UNSUPPORTED, "%s cannot run fused programs", d->name);
    return d->ops->launch_fused(s, f);
}

void df_dev_throttle(const df_device *d, df_dev_stream *s, size_t depth)
{
    if (d->ops->stream_throttle)
        d->ops->stream_throttle(s, depth);
}

bool df_dev_supports(const df_device *d, const df_node *n)
{
    if ((unsigned)n->op >= DF_OP_COUNT)
        return false;
    return !d->ops->supports || d->ops->supports(d->impl, n);
}

bool df_dev_has_op(const df_device *d, df_op op)
{
    df_node n = {.op = op};
    return df_dev_supports(d, &n);
}

df_dtype df_dev_matmul_dtype(const df_device *d, df_dtype requested)
{
    return d->ops->matmul_dtype ? d->ops->matmul_dtype(d->impl, requested) : requested;
}

df_status df_dev_matmul_rates(const df_device *d, double *f32, double *bf16, char *how,
                              size_t cap)
{
    *f32 = *bf16 = 0;
    if (cap)
        how[0] = '\0';
    if (!d->ops->matmul_rates)
        return df_errorf(DF_E_UNSUPPORTED, "device %s does not say how fast its matrix "
                         "products are", d->name);
    return d->ops->matmul_rates(d->impl, f32, bf16, how, cap);
}

df_status df_dev_drop_cache(const df_device *d, df_dev_stream *s, df_dev_buffer *b)
{
    return d->ops->buffer_drop_cache ? d->ops->buffer_drop_cache(s, b) : DF_OK;
}

void df_dev_counters_get(const df_device *d, df_dev_counters *out)
{
    memset(out, 0, sizeof *out);
    if (d->ops->device_counters)
        d->ops->device_counters(d->impl, out);
}

bool df_dev_can_capture(const df_device *d)
{
    return d->ops->capture_begin && d->ops->capture_end && d->ops->graph_launch &&
           d->ops->graph_free;
}
