/*
 * Defer-and-fuse mode. TODO(#7): record, optimise and cache graphs.
 */
#include "core/status.h"
#include "runtime/lazy.h"

df_status df_lazy_attach(df_ctx *ctx)
{
    (void)ctx;
    return df_errorf(DF_E_UNSUPPORTED, "the defer-and-fuse mode is not implemented yet");
}
