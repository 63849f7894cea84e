/*
 * Compiled mode: a module's forward traced once per input signature, planned ahead of time
 * and replayed.
 *
 * df_compile() wraps a module (a forward function over tensors). The first call with a
 * given set of input shapes, strides and dtypes runs the forward once while recording its
 * ops (the trace), plans the whole graph — fusion, one arena for every activation,
 * constants folded (ops that depend on no input, such as tables built from fixed ids, run
 * once and are kept) — and runs it. Later calls with the same signature do not run the
 * forward's C code at all: the recorded graph is instantiated over the new inputs and run
 * with the stored plan. A new signature (a new image size) traces once more; shapes seen
 * before are reused. Step-dependent values are inputs, so a new step count never traces.
 *
 * A module may declare weights: tensors that are arguments rather than constants. The
 * trace is then valid for any instance of the same class (any block of a model), called
 * with that instance's weights — how compiled repeated blocks compile once per block class.
 */
#ifndef DIFFUSE_COMPILE_H
#define DIFFUSE_COMPILE_H

#include <stdbool.h>

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DF_MODULE_MAX_IO 16
#define DF_MODULE_MAX_WEIGHTS 64

typedef struct df_module {
    const char *name;
    int n_in, n_out;
    /* The forward: reads in[0..n_in) (NULL entries allowed), writes out[0..n_out). */
    df_status (*forward)(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out);
    /* Optional: the instance's weight tensors in a fixed order (at most
     * DF_MODULE_MAX_WEIGHTS); returns their count. */
    int (*weights)(void *self, df_tensor **out);
} df_module;

typedef struct df_compile_opts {
    bool fullgraph; /* a host read or sync inside the forward is an error naming the op */
    bool dynamic;   /* must be false: shapes are static (DF_E_UNSUPPORTED otherwise) */
} df_compile_opts;

typedef struct df_compiled df_compiled;

DF_API df_status df_compile(const df_module *m, const df_compile_opts *opts, df_compiled **out);
/* Calls the compiled module on instance `self` (traced on the first call of a signature).
 * Outputs are new tensors in the current scope. On failure every output is NULL and the
 * context has failed with the message too (so code that goes on with the outputs reports
 * it at its next status check). Called while another module is being traced (a compiled
 * block inside a compiled transformer), the forward is traced into the outer program. */
DF_API df_status df_compiled_call(df_ctx *ctx, df_compiled *c, void *self, df_tensor *const *in,
                                  df_tensor **out);
/* Programs traced so far (one per input signature). */
DF_API int df_compiled_programs(const df_compiled *c);
DF_API void df_compiled_free(df_compiled *c);

#ifdef __cplusplus
}
#endif
#endif
