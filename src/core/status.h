/*
 * Internal side of error reporting: recording a message, and the macros that pass
 * failures up.
 */
#ifndef DF_CORE_STATUS_H
#define DF_CORE_STATUS_H

#include <diffuse/status.h>

/* Records the message for this thread and returns `s`, so callers write
 * `return df_errorf(DF_E_FORMAT, "...", ...)`. */
df_status df_errorf(df_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prefixes the current message with "context: ", keeping `s`. */
df_status df_error_context(df_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sends one line to the log hook (df_set_log_fn), or to stderr. */
void df_logf(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define DF_TRY(expr)                                                                       \
    do {                                                                                   \
        df_status df_try_s_ = (expr);                                                      \
        if (df_try_s_ != DF_OK)                                                            \
            return df_try_s_;                                                              \
    } while (0)

#define DF_TRY_CTX(expr, ...)                                                              \
    do {                                                                                   \
        df_status df_try_s_ = (expr);                                                      \
        if (df_try_s_ != DF_OK)                                                            \
            return df_error_context(df_try_s_, __VA_ARGS__);                               \
    } while (0)

/* Our own invariants only; never a check of input. Reports and traps in debug builds. */
#ifdef NDEBUG
#define DF_ASSERT(cond) ((void)0)
#else
#define DF_ASSERT(cond)                                                                    \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__, __LINE__,  \
                    #cond);                                                                \
            __builtin_trap();                                                              \
        }                                                                                  \
    } while (0)
#endif

#endif
