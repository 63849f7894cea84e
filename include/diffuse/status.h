/*
 * Status codes and the thread's last error message.
 *
 * Every library function that can fail returns a df_status. DF_OK is 0; failures are
 * negative. The function that discovers a failure records one message naming the file,
 * tensor or argument at fault; df_error_message() returns it until the next failure on the
 * same thread.
 */
#ifndef DIFFUSE_STATUS_H
#define DIFFUSE_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#if defined(DF_BUILDING_LIBRARY)
#define DF_API __attribute__((visibility("default")))
#else
#define DF_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum df_status {
    DF_OK             = 0,
    DF_E_ARG          = -1, /* a caller passed an invalid argument */
    DF_E_IO           = -2, /* a file could not be opened, read or written */
    DF_E_FORMAT       = -3, /* a file is malformed or disagrees with its config */
    DF_E_SHAPE        = -4, /* tensor shapes do not fit the operation */
    DF_E_OOM          = -5, /* memory ran out */
    DF_E_UNSUPPORTED  = -6, /* not implemented for this op, dtype, device or class */
    DF_E_DEVICE       = -7, /* a device or backend failed */
    DF_E_STATE        = -8, /* called at the wrong time (e.g. a host read under fullgraph) */
    DF_E_INTERNAL     = -9, /* a bug in diffuse */
    DF_E_CANCELLED    = -10, /* the caller stopped the run (df_gen_params.on_step) */
} df_status;

/* Short name of a status code ("DF_E_FORMAT"). Never NULL. */
DF_API const char *df_status_name(df_status s);

/* The calling thread's last error message; "" when none. Valid until the next failure. */
DF_API const char *df_error_message(void);

/* Clears the calling thread's error message. */
DF_API void df_error_clear(void);

/* Messages the library prints that are not errors (warnings such as unused checkpoint
 * tensors, backend notes): level 0 warning, 1 note, 2 detail. By default they go to stderr
 * as one line each ("detail" only with DIFFUSE_VERBOSE set). A program that owns its
 * output (a server) installs a hook instead; NULL restores stderr. The hook may be called
 * from any thread, so it must be thread-safe; `line` has no trailing newline. */
typedef void (*df_log_fn)(int level, const char *line, void *user);
DF_API void df_set_log_fn(df_log_fn fn, void *user);

/* For programs that use the library: on failure print the message and exit(1). */
#define DF_CHECK(expr)                                                                     \
    do {                                                                                   \
        df_status df_check_s_ = (expr);                                                    \
        if (df_check_s_ != DF_OK) {                                                        \
            fprintf(stderr, "error: %s\n", df_error_message());                            \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
