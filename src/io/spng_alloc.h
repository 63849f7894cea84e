/*
 * libspng contexts whose memory comes from df_malloc & co., so out-of-memory tests reach
 * them, shared by the PNG writer (png.c) and the input-image reader (image_load.c).
 */
#ifndef DF_IO_SPNG_ALLOC_H
#define DF_IO_SPNG_ALLOC_H

#include <stdbool.h>

#include <spng.h>

/* A new context (spng_ctx_new2 with `flags`); NULL when memory ran out. Free it with
 * spng_ctx_free. */
spng_ctx *df_spng_ctx_new(int flags);

/* Whether the failure `err` of this thread's latest context was for want of memory: zlib
 * reports a failed allocation inside inflate as a broken stream, so a failed allocation
 * since df_spng_ctx_new counts as well as SPNG_EMEM. */
bool df_spng_out_of_memory(int err);

#endif
