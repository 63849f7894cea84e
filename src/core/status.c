/*
 * Thread-local error messages.
 *
 * One fixed buffer per thread: recording a message never allocates, so an out-of-memory
 * failure can still be described.
 */
#include "core/status.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define MSG_CAP 1024

static _Thread_local char last_msg[MSG_CAP];

const char *df_status_name(df_status s)
{
    switch (s) {
    case DF_OK:            return "DF_OK";
    case DF_E_ARG:         return "DF_E_ARG";
    case DF_E_IO:          return "DF_E_IO";
    case DF_E_FORMAT:      return "DF_E_FORMAT";
    case DF_E_SHAPE:       return "DF_E_SHAPE";
    case DF_E_OOM:         return "DF_E_OOM";
    case DF_E_UNSUPPORTED: return "DF_E_UNSUPPORTED";
    case DF_E_DEVICE:      return "DF_E_DEVICE";
    case DF_E_STATE:       return "DF_E_STATE";
    case DF_E_INTERNAL:    return "DF_E_INTERNAL";
    case DF_E_CANCELLED:   return "DF_E_CANCELLED";
    }
    return "DF_E_UNKNOWN";
}

const char *df_error_message(void)
{
    return last_msg;
}

void df_error_clear(void)
{
    last_msg[0] = '\0';
}

df_status df_errorf(df_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof last_msg, fmt, ap);
    va_end(ap);
    return s;
}

df_status df_error_context(df_status s, const char *fmt, ...)
{
    char prefix[MSG_CAP], old[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, last_msg, sizeof old);
    size_t n = strnlen(prefix, MSG_CAP - 3);
    memcpy(last_msg, prefix, n);
    memcpy(last_msg + n, ": ", 2);
    size_t m = strnlen(old, MSG_CAP - 1 - n - 2);
    memcpy(last_msg + n + 2, old, m);
    last_msg[n + 2 + m] = '\0';
    return s;
}

/* The hook and its argument change together: one pointer to a pair that is never freed
 * while it may be in use (the pairs live in a small static ring). */
typedef struct log_hook {
    df_log_fn fn;
    void *user;
} log_hook;

static log_hook hooks[8];
static atomic_uint next_hook;
static _Atomic(log_hook *) hook;

void df_set_log_fn(df_log_fn fn, void *user)
{
    if (!fn) {
        atomic_store(&hook, NULL);
        return;
    }
    log_hook *h = &hooks[atomic_fetch_add(&next_hook, 1) % 8];
    h->fn = fn;
    h->user = user;
    atomic_store(&hook, h);
}

void df_logf(int level, const char *fmt, ...)
{
    log_hook *h = atomic_load(&hook);
    if (!h && level > 1 && !getenv("DIFFUSE_VERBOSE"))
        return;
    char line[MSG_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (h)
        h->fn(level, line, h->user);
    else
        fprintf(stderr, "%s\n", line);
}
