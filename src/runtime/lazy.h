/* Defer-and-fuse mode (lazy.c): records nodes into a pending graph. */
#ifndef DF_RUNTIME_LAZY_H
#define DF_RUNTIME_LAZY_H

#include "runtime/runtime.h"

/* Switches the context's executor to defer-and-fuse. */
df_status df_lazy_attach(df_ctx *ctx);
/* Ends the pending defer-and-fuse graph here: it is planned and run, and later ops start a
 * new one. A no-op in strict eager mode and while a module is traced (compile.c), whose
 * graph is never cut. */
df_status df_lazy_cut(df_ctx *ctx);
/* Nodes recorded and not yet run (0 in strict eager). */
int64_t df_lazy_pending(const df_ctx *ctx);

#endif
