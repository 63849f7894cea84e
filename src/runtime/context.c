/*
 * Contexts: device, stream, mode, scopes and statistics.
 *
 * Scopes are ranges of one list of live handles in creation order: a scope's mark is the
 * list's length when it began, and ending it releases handles from the mark on. A kept
 * handle moves down to the mark, into the enclosing scope. df_tensor_free leaves a hole
 * (NULL) that later scope ends skip.
 */
#include <ctype.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/status.h"
#include "backend/registry.h"
#include "runtime/lazy.h"
#include "runtime/runtime.h"

static bool env_flag(const char *name)
{
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

/* int8 compute needs a device that declares int8 products (DF_CAP_INT8): without them it is
 * refused here, before any weight is quantized for products that could not run. The
 * message names the devices that do declare them. */
static df_status int8_supported(const df_ctx *ctx, df_dtype compute)
{
    if (compute != DF_DTYPE_I8 || df_dev_has(ctx->dev, DF_CAP_INT8))
        return DF_OK;
    df_device_desc d[16];
    int n = df_device_list(d, 16, false);
    char with[256] = "";
    for (int i = 0, used = 0; i < n && i < 16; i++)
        if (d[i].caps & DF_CAP_INT8 && used < (int)sizeof with)
            used += snprintf(with + used, sizeof with - (size_t)used, "%s--device %s",
                             used ? ", " : "", d[i].device);
    return df_errorf(DF_E_UNSUPPORTED,
                     "compute dtype int8: %s has no int8 products (linear, attention); %s%s",
                     ctx->dev->name, with[0] ? "devices with them: " : "no device here has them",
                     with);
}

df_status df_ctx_create(const df_ctx_opts *opts, df_ctx **out)
{
    *out = NULL;
    df_ctx_opts o = opts ? *opts : (df_ctx_opts){0};
    if (o.compute != DF_DTYPE_F32 && o.compute != DF_DTYPE_BF16 && o.compute != DF_DTYPE_I8)
        return df_errorf(DF_E_ARG, "compute dtype must be f32, bf16 or i8, not %s",
                         df_dtype_name(o.compute));
    if (o.threads < 0)
        return df_errorf(DF_E_ARG, "threads must be >= 0 (0 = all cores), not %d", o.threads);
    if (o.int8_group != 0 && o.int8_group != -1 &&
        (o.int8_group < 32 || o.int8_group > 256 || o.int8_group % 4 != 0))
        return df_errorf(DF_E_ARG,
                         "int8_group must be 32 to 256 and a multiple of 4, -1 for the whole "
                         "k or 0 for DIFFUSE_INT8_GROUP, not %d",
                         o.int8_group);
    if (o.int8_path && (!*o.int8_path || strlen(o.int8_path) > 31 || strchr(o.int8_path, ',')))
        return df_errorf(DF_E_ARG, "int8_path '%s' is not an int8 kernel's name", o.int8_path);
    df_ctx *ctx = df_calloc(1, sizeof *ctx);
    if (!ctx)
        return df_errorf(DF_E_OOM, "out of memory creating a context");
    ctx->compute = o.compute;
    ctx->exec = &df_exec_eager;
    ctx->fuse_max_nodes = o.fuse_max_nodes > 0 ? o.fuse_max_nodes : 4096;
    ctx->launch_blocking = env_flag("DIFFUSE_LAUNCH_BLOCKING");
    ctx->profiling = env_flag("DIFFUSE_PROFILE");
    ctx->int8_group = o.int8_group;
    char options[128] = ""; /* the device's "key=value,..." (device.h's device_open) */
    int n = 0;
    if (o.threads > 0)
        n += snprintf(options + n, sizeof options - (size_t)n, ",threads=%d", o.threads);
    if (o.int8_group)
        n += snprintf(options + n, sizeof options - (size_t)n, ",int8_group=%d", o.int8_group);
    if (o.int8_path)
        snprintf(options + n, sizeof options - (size_t)n, ",int8_path=%s", o.int8_path);
    const char *device = !o.device                  ? df_device_default()
                         : strcmp(o.device, "auto") == 0 ? df_device_auto()
                                                         : o.device;
    df_status s = df_device_open(device, options + (options[0] == ','), &ctx->dev);
    if (s == DF_OK) {
        ctx->threads = o.threads > 0 ? o.threads : ctx->dev->info.compute_units;
        s = df_dev_stream_create(ctx->dev, DF_STREAM_COMPUTE, &ctx->stream);
    }
    if (s == DF_OK)
        s = int8_supported(ctx, o.compute);
    df_eager_mode mode = env_flag("DIFFUSE_DEFER_AND_FUSE") ? DF_DEFER_AND_FUSE : o.mode;
    if (s == DF_OK)
        s = df_set_eager_mode(ctx, mode);
    if (s != DF_OK) {
        df_ctx_free(ctx);
        return s;
    }
    ctx->step_clock = df_now();
    *out = ctx;
    return DF_OK;
}

void df_ctx_free(df_ctx *ctx)
{
    if (!ctx)
        return;
    if (ctx->stream && ctx->exec)
        ctx->exec->flush(ctx);
    for (int64_t i = ctx->n_live - 1; i >= 0; i--)
        if (ctx->live[i])
            df_tensor_free(ctx->live[i]);
    if (ctx->exec && ctx->exec->destroy)
        ctx->exec->destroy(ctx);
    if (ctx->stream) {
        df_dev_sync(ctx->dev, ctx->stream);
        df_dev_stream_free(ctx->dev, ctx->stream);
    }
    if (ctx->copy_stream)
        df_dev_stream_free(ctx->dev, ctx->copy_stream);
    if (ctx->dev_comm)
        ctx->dev->ops->comm_free(ctx->dev_comm);
    df_storage_release(ctx->arena);
    df_device_close(ctx->dev);
    df_free(ctx->live);
    df_free(ctx);
}

df_tensor *df_ctx_fail(df_ctx *ctx, df_status s)
{
    if (ctx->status == DF_OK) {
        ctx->status = s;
        snprintf(ctx->status_msg, sizeof ctx->status_msg, "%s", df_error_message());
    }
    return NULL;
}

df_status df_ctx_raise(df_ctx *ctx)
{
    if (ctx->status != DF_OK)
        df_errorf(ctx->status, "%s", ctx->status_msg);
    return ctx->status;
}

df_status df_ctx_status(const df_ctx *ctx)
{
    return ctx->status;
}

void df_ctx_reset_error(df_ctx *ctx)
{
    df_dev_sync(ctx->dev, ctx->stream);
    df_dev_reset(ctx->dev, ctx->stream);
    if (ctx->copy_stream) {
        df_dev_sync(ctx->dev, ctx->copy_stream);
        df_dev_reset(ctx->dev, ctx->copy_stream);
    }
    ctx->status = DF_OK;
    ctx->status_msg[0] = '\0';
}

df_status df_ctx_set_compute_dtype(df_ctx *ctx, df_dtype compute)
{
    if (compute != DF_DTYPE_F32 && compute != DF_DTYPE_BF16 && compute != DF_DTYPE_I8)
        return df_errorf(DF_E_ARG, "compute dtype must be f32, bf16 or i8, not %s",
                         df_dtype_name(compute));
    DF_TRY(int8_supported(ctx, compute));
    ctx->compute = compute;
    return DF_OK;
}

df_dtype df_ctx_compute_dtype(const df_ctx *ctx)
{
    return ctx->compute;
}

df_dtype df_ctx_attention_compute(const df_ctx *ctx)
{
    if (ctx->compute != DF_DTYPE_I8)
        return ctx->compute;
    bool on = ctx->int8_attention > 0;
    if (ctx->int8_attention == 0) {
        const char *env = getenv("DIFFUSE_INT8_ATTENTION");
        on = !(env && (strcmp(env, "0") == 0 || strcmp(env, "off") == 0));
    }
    return on ? DF_DTYPE_I8 : DF_DTYPE_F32;
}

df_status df_set_eager_mode(df_ctx *ctx, df_eager_mode mode)
{
    if (mode != DF_DEFER_NEVER && mode != DF_DEFER_AND_FUSE)
        return df_errorf(DF_E_ARG, "unknown eager mode %d", (int)mode);
    if (mode == ctx->mode && ctx->exec)
        return DF_OK;
    if (ctx->exec) {
        DF_TRY(ctx->exec->flush(ctx));
        if (ctx->exec->destroy)
            ctx->exec->destroy(ctx);
    }
    ctx->exec = &df_exec_eager;
    ctx->exec_state = NULL;
    ctx->mode = DF_DEFER_NEVER;
    if (mode == DF_DEFER_AND_FUSE) {
        DF_TRY(df_lazy_attach(ctx));
        ctx->mode = mode;
    }
    return DF_OK;
}

df_eager_mode df_get_eager_mode(const df_ctx *ctx)
{
    return ctx->mode;
}

int df_ctx_threads(const df_ctx *ctx)
{
    return ctx->threads > 0 ? ctx->threads : 1;
}

const char *df_ctx_device_name(const df_ctx *ctx)
{
    return ctx->dev->name;
}

df_status df_ctx_matmul_rates(df_ctx *ctx, df_matmul_rates *out)
{
    memset(out, 0, sizeof *out);
    df_status s = df_dev_matmul_rates(ctx->dev, &out->f32_gflops, &out->bf16_gflops, out->how,
                                      sizeof out->how);
    if (s != DF_OK)
        memset(out, 0, sizeof *out);
    return s;
}

df_status df_sync(df_ctx *ctx)
{
    if (ctx->status != DF_OK)
        return df_ctx_raise(ctx);
    df_status s = ctx->exec->flush(ctx);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s), df_ctx_raise(ctx);
    s = df_dev_sync(ctx->dev, ctx->stream);
    if (s == DF_OK && ctx->copy_stream)
        s = df_dev_sync(ctx->dev, ctx->copy_stream);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s), df_ctx_raise(ctx);
    return DF_OK;
}

df_status df_event_record(df_ctx *ctx, df_event *out)
{
    out->at = 0;
    df_status s = ctx->status != DF_OK ? df_ctx_raise(ctx) : ctx->exec->flush(ctx);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s), df_ctx_raise(ctx);
    out->at = df_dev_record(ctx->dev, ctx->stream);
    return DF_OK;
}

bool df_event_done(df_ctx *ctx, df_event ev)
{
    return df_dev_reached(ctx->dev, ctx->stream, ev.at, false);
}

df_status df_event_sync(df_ctx *ctx, df_event ev)
{
    df_dev_reached(ctx->dev, ctx->stream, ev.at, true);
    return ctx->status != DF_OK ? df_ctx_raise(ctx) : DF_OK;
}

df_status df_mark_step(df_ctx *ctx)
{
    df_status s = ctx->status != DF_OK ? df_ctx_raise(ctx) : ctx->exec->flush(ctx);
    if (s != DF_OK)
        return df_ctx_fail(ctx, s), df_ctx_raise(ctx);
    double now = df_now();
    if (ctx->stats.steps > 0) {
        ctx->step_seconds += now - ctx->step_clock;
        ctx->steps_timed++;
    }
    ctx->step_clock = now;
    ctx->stats.steps++;
    return DF_OK;
}

/* --- scopes ----------------------------------------------------------------------------- */

df_scope df_scope_begin(df_ctx *ctx)
{
    return ctx->n_live;
}

static void keep_at(df_ctx *ctx, df_scope *mark, df_tensor *t)
{
    if (!t || t->slot < *mark)
        return; /* made outside the scope, or persistent */
    int64_t dst = (*mark)++;
    df_tensor *other = ctx->live[dst];
    ctx->live[dst] = t;
    ctx->live[t->slot] = other;
    if (other)
        other->slot = t->slot;
    t->slot = dst;
}

void df_scope_end_n(df_ctx *ctx, df_scope mark, df_tensor **keep, int n)
{
    if (mark < 0 || mark > ctx->n_live)
        return;
    for (int i = 0; i < n; i++)
        keep_at(ctx, &mark, keep[i]);
    for (int64_t i = ctx->n_live - 1; i >= mark; i--) {
        df_tensor *t = ctx->live[i];
        if (t) {
            t->slot = -1;
            df_tensor_free(t);
        }
    }
    ctx->n_live = mark;
}

df_tensor *df_scope_end(df_ctx *ctx, df_scope mark, df_tensor *keep)
{
    df_scope_end_n(ctx, mark, &keep, 1);
    return keep;
}

df_status df_empty_cache(df_ctx *ctx)
{
    df_status s = df_sync(ctx); /* releases queued behind the stream have happened */
    df_device_trim(ctx->dev);
    malloc_trim(0); /* freed heap pages inside the arenas, not only at their tops */
    return s;
}

/* DIFFUSE_MEMORY_LIMIT's value: "8G", "512M", "1073741824"; -1 when malformed. */
static int64_t parse_bytes(const char *v)
{
    static const char units[] = "KMGT";
    char *end;
    double n = strtod(v, &end);
    if (end == v)
        return -1;
    if (*end) {
        const char *u = strchr(units, toupper((unsigned char)*end));
        if (!u || end[1])
            return -1;
        n = ldexp(n, 10 * (int)(u - units + 1));
    }
    return n >= 0 && n < 9e18 ? (int64_t)n : -1;
}

static int64_t resident_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long total = 0, resident = 0;
    bool ok = f && fscanf(f, "%ld %ld", &total, &resident) == 2;
    if (f)
        fclose(f);
    return ok ? (int64_t)resident * sysconf(_SC_PAGESIZE) : 0;
}

static int64_t meminfo_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    long long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lld kB", &kib) == 1)
            break;
    fclose(f);
    return kib < 0 ? -1 : (int64_t)kib * 1024;
}

int64_t df_memory_available(void)
{
    const char *v = getenv("DIFFUSE_MEMORY_LIMIT");
    if (!v || !*v)
        return meminfo_available();
    int64_t limit = parse_bytes(v);
    if (limit < 0)
        return -1;
    int64_t used = resident_bytes();
    return limit > used ? limit - used : 0;
}

/* --- statistics ------------------------------------------------------------------------- */

void df_ctx_stats(df_ctx *ctx, df_stats *out)
{
    df_mem_stats m;
    df_device_mem_stats(ctx->dev, &m);
    *out = ctx->stats;
    out->bytes_allocated = m.allocated_total - ctx->allocated_base;
    out->peak_bytes = m.peak_bytes;
    out->live_bytes = m.live_bytes;
    out->bytes_uploaded = atomic_load(&ctx->dev->bytes_uploaded) - ctx->uploaded_base;
    out->bytes_downloaded = atomic_load(&ctx->dev->bytes_downloaded) - ctx->downloaded_base;
    df_dev_counters c;
    df_dev_counters_get(ctx->dev, &c);
    out->device_dispatches = c.dispatches - ctx->counters_base.dispatches;
    out->device_dispatches_recorded =
        c.dispatches_recorded - ctx->counters_base.dispatches_recorded;
    out->device_submits = c.submits - ctx->counters_base.submits;
    out->device_graph_launches = c.graph_launches - ctx->counters_base.graph_launches;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0)
        out->peak_rss_bytes = (int64_t)ru.ru_maxrss * 1024;
    out->seconds_per_step = ctx->steps_timed ? ctx->step_seconds / (double)ctx->steps_timed : 0;
    FILE *f = fopen("/proc/self/statm", "r");
    long pages_total, pages_resident;
    if (f && fscanf(f, "%ld %ld", &pages_total, &pages_resident) == 2)
        out->rss_bytes = (int64_t)pages_resident * sysconf(_SC_PAGESIZE);
    if (f)
        fclose(f);
}

void df_stats_reset(df_ctx *ctx)
{
    int64_t resident = ctx->stats.resident_weight_bytes;
    memset(&ctx->stats, 0, sizeof ctx->stats);
    for (int i = 0; i <= DF_OP_COUNT; i++) {
        atomic_store(&ctx->prof_ns[i], 0);
        atomic_store(&ctx->prof_calls[i], 0);
    }
    ctx->stats.resident_weight_bytes = resident;
    ctx->stats.peak_resident_weight_bytes = resident;
    ctx->step_seconds = 0;
    ctx->steps_timed = 0;
    df_device_mem_reset_peak(ctx->dev);
    df_mem_stats m;
    df_device_mem_stats(ctx->dev, &m);
    ctx->allocated_base = m.allocated_total;
    ctx->uploaded_base = atomic_load(&ctx->dev->bytes_uploaded);
    ctx->downloaded_base = atomic_load(&ctx->dev->bytes_downloaded);
    df_dev_counters_get(ctx->dev, &ctx->counters_base);
}

void df_stats_add_weights(df_ctx *ctx, int64_t bytes_read, int64_t resident_delta)
{
    ctx->stats.weight_bytes_read += bytes_read;
    ctx->stats.resident_weight_bytes += resident_delta;
    if (ctx->stats.resident_weight_bytes > ctx->stats.peak_resident_weight_bytes)
        ctx->stats.peak_resident_weight_bytes = ctx->stats.resident_weight_bytes;
}

void df_stats_reset_resident_peak(df_ctx *ctx)
{
    ctx->stats.peak_resident_weight_bytes = ctx->stats.resident_weight_bytes;
}

int df_stats_to_json(const df_stats *s, char *buf, size_t cap)
{
    return snprintf(buf, cap,
                    "{\"ops_enqueued\":%lld,\"graphs_built\":%lld,\"graphs_compiled\":%lld,"
                    "\"cache_hits\":%lld,\"cache_misses\":%lld,\"compile_ms\":%.3f,"
                    "\"fused_kernels\":%lld,\"bytes_allocated\":%lld,\"peak_bytes\":%lld,"
                    "\"peak_rss_bytes\":%lld,\"weight_bytes_read\":%lld,"
                    "\"resident_weight_bytes\":%lld,\"arena_bytes\":%lld,\"steps\":%lld,"
                    "\"seconds_per_step\":%.6f,\"rss_bytes\":%lld,"
                    "\"peak_resident_weight_bytes\":%lld,\"bytes_uploaded\":%lld,"
                    "\"bytes_downloaded\":%lld,\"device_dispatches\":%lld,"
                    "\"device_dispatches_recorded\":%lld,\"device_submits\":%lld,"
                    "\"device_graph_launches\":%lld}",
                    (long long)s->ops_enqueued, (long long)s->graphs_built,
                    (long long)s->graphs_compiled, (long long)s->cache_hits,
                    (long long)s->cache_misses, s->compile_ms, (long long)s->fused_kernels,
                    (long long)s->bytes_allocated, (long long)s->peak_bytes,
                    (long long)s->peak_rss_bytes, (long long)s->weight_bytes_read,
                    (long long)s->resident_weight_bytes, (long long)s->arena_bytes,
                    (long long)s->steps, s->seconds_per_step, (long long)s->rss_bytes,
                    (long long)s->peak_resident_weight_bytes, (long long)s->bytes_uploaded,
                    (long long)s->bytes_downloaded, (long long)s->device_dispatches,
                    (long long)s->device_dispatches_recorded, (long long)s->device_submits,
                    (long long)s->device_graph_launches);
}

/* --- profiling -------------------------------------------------------------------------- */

void df_profile_add(df_ctx *ctx, int slot, double seconds)
{
    atomic_fetch_add(&ctx->prof_ns[slot], (int64_t)(seconds * 1e9));
    atomic_fetch_add(&ctx->prof_calls[slot], 1);
}

void df_ctx_set_profiling(df_ctx *ctx, bool on)
{
    ctx->profiling = on;
}

int df_ctx_profile(df_ctx *ctx, df_profile_entry *out, int cap)
{
    df_sync(ctx);
    int n = 0;
    for (int i = 0; i <= DF_OP_COUNT && n < cap; i++) {
        int64_t calls = atomic_load(&ctx->prof_calls[i]);
        if (!calls)
            continue;
        out[n++] = (df_profile_entry){.op = i == DF_OP_COUNT ? "fused" : df_op_name((df_op)i),
                                      .calls = calls,
                                      .ms = (double)atomic_load(&ctx->prof_ns[i]) * 1e-6};
    }
    for (int i = 1; i < n; i++) /* largest first */
        for (int j = i; j > 0 && out[j].ms > out[j - 1].ms; j--) {
            df_profile_entry t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    return n;
}
