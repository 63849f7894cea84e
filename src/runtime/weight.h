/*
 * Weights, as the runtime owns them.
 *
 * A weight is a long-lived tensor whose storage carries a df_weight (backend/graph.h):
 * its residency (is it acquired, are its file pages wanted, is its device copy there), the
 * precision int8 compute keeps it in, and its int8 form (scales, compact block format).
 * Models bind a weight once (df_weight_bind), say its precision and int8 scales, and then
 * acquire and release weights by name prefix as offload asks; they never touch storages,
 * streams or pages. Everything below is for the host thread of the weight's context.
 */
#ifndef DF_RUNTIME_WEIGHT_H
#define DF_RUNTIME_WEIGHT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/runtime.h>

#include "backend/graph.h"

/* st's weight record, made (zeroed) when st has none yet. DF_E_OOM when it cannot be. */
df_status df_weight_of(df_storage *st, df_weight **out);

/* Makes t (a tensor a model keeps) a bound weight: `data`, `bytes` its bytes in the file
 * mapping (NULL: not a file's), `read` the bytes read from the file for it,
 * `resident_bytes` what it holds while resident. It starts resident; df_stats'
 * weight_bytes_read and resident_weight_bytes count it. */
df_status df_weight_bind(df_ctx *ctx, df_tensor *t, const void *data, size_t bytes, size_t read,
                         size_t resident_bytes);
/* Takes a bound weight out of df_stats' resident bytes before it is freed. */
void df_weight_unbind(df_ctx *ctx, const df_tensor *t);

/* Whether int8 compute keeps t in f32 (DF_VIEW_KEEP_PRECISION). */
df_status df_weight_keep_precision(df_tensor *t, bool keep);
/* Gives t, an I8 weight saved quantized, its f32 scales [rows, groups] (t's storage holds a
 * reference on scale's); `tiled`: both are in the kernels' tiles (core/int8_tiles.h). */
df_status df_weight_attach_scales(df_tensor *t, const df_tensor *scale, bool tiled);

/*
 * Residency by name prefix, for offload. A model's weights are a list of named bound
 * weights (the names are the checkpoint's). A bound weight is resident: its pages are
 * mapped and the device may keep derived forms of it. df_weight_release() (after all work
 * already queued) drops the derived forms, the device copy and the file's pages of every
 * weight whose name starts with `prefix` (NULL: all); the file stays mapped, so the next
 * use reads the pages again. df_weight_acquire() makes them resident again: asks the
 * kernel to read the pages ahead and uploads device copies on the copy stream (a failure
 * fails the context). Both follow in df_stats' resident_weight_bytes, and both decide the
 * offload hint (runtime.h, df_residency_note_acquire).
 */
typedef struct df_weight_ref {
    char *name; /* owned by the list's owner */
    df_tensor *t;
} df_weight_ref;

df_status df_weight_release(df_ctx *ctx, const df_weight_ref *w, int n, const char *prefix);
void df_weight_acquire(df_ctx *ctx, const df_weight_ref *w, int n, const char *prefix);
/* The bytes the listed weights hold resident now. */
int64_t df_weight_resident_bytes(const df_weight_ref *w, int n);

#endif
