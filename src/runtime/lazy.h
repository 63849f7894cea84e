/* Defer-and-fuse mode (lazy.c): records nodes into a pending graph. */
#ifndef DF_RUNTIME_LAZY_H
#define DF_RUNTIME_LAZY_H

#include "runtime/runtime.h"

/* Switches the context's executor to defer-and-fuse. */
df_status df_lazy_attach(df_ctx *ctx);
/* Nodes recorded and not yet run (0 in strict eager). */
int64_t df_lazy_pending(const df_ctx *ctx);

#endif
