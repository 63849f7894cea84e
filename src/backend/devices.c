/*
 * Devices as the API names them: the default device, "auto", and the list that
 * `diffuse devices` prints. Every backend in the registry is asked for its devices; test
 * devices (the sim backend) are listed only when asked for.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/graph.h"
#include "core/status.h"

static const char *kind_name(df_device_kind k)
{
    switch (k) {
    case DF_DEVICE_KIND_CPU: return "cpu";
    case DF_DEVICE_KIND_GPU: return "gpu";
    case DF_DEVICE_KIND_SIM: return "sim";
    default: return "other";
    }
}

int df_device_list(df_device_desc *out, int cap, bool all)
{
    int n = 0;
    for (int b = 0, nb = df_backend_count(); b < nb; b++) {
        const df_device_ops *ops = df_backend_at(b);
        for (int i = 0, nd = ops->device_count(); i < nd; i++) {
            df_device_info info;
            if (ops->device_info(i, &info) != DF_OK)
                continue; /* a device that does not answer is not listed */
            if (info.kind == DF_DEVICE_KIND_SIM && !all)
                continue;
            if (n < cap) {
                df_device_desc *d = &out[n];
                memset(d, 0, sizeof *d);
                snprintf(d->device, sizeof d->device, "%s:%d", ops->name, i);
                snprintf(d->name, sizeof d->name, "%s", info.name);
                d->kind = kind_name(info.kind);
                d->memory_bytes = info.memory_bytes;
                d->memory_free = info.memory_free;
                d->caps = info.caps;
                d->priority = info.priority;
            }
            n++;
        }
    }
    df_error_clear();
    return n;
}

const char *df_device_caps_string(uint32_t caps, char *buf, size_t cap)
{
    static const struct {
        uint32_t bit;
        const char *name;
    } names[] = {
#define DF_CAP(name, bit, word, doc) {DF_CAP_##name, word},
#include "backend/ops.def"
#undef DF_CAP
    };
    size_t used = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        if ((caps & names[i].bit) && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? " " : "",
                                     names[i].name);
        caps &= ~names[i].bit;
    }
    for (int b = 0; b < 32; b++) /* bits of a newer vocabulary than this library's */
        if ((caps >> b & 1u) && used < cap)
            used += (size_t)snprintf(buf + used, cap - used, "%scap%d", used ? " " : "", b);
    return buf;
}

const char *df_device_default(void)
{
    const char *env = getenv("DIFFUSE_DEVICE");
    if (env && *env && strcmp(env, "auto") != 0)
        return env;
    return df_device_auto();
}

const char *df_device_auto(void)
{
    static _Thread_local char best[32];
    int best_priority = 0;
    snprintf(best, sizeof best, "cpu");
    df_device_desc d[64];
    int n = df_device_list(d, 64, false);
    for (int i = 0; i < n && i < 64; i++) {
        if (d[i].priority <= best_priority)
            continue;
        df_device *dev = NULL; /* the best that answers: it must open */
        if (df_device_open(d[i].device, "", &dev) == DF_OK) {
            snprintf(best, sizeof best, "%.31s", d[i].device);
            best_priority = d[i].priority;
        }
        df_device_close(dev);
    }
    df_error_clear();
    return best;
}
