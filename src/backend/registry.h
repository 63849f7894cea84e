/*
 * The backend registry and the checked wrappers through which the runtime calls a device.
 *
 * The CPU backend is built in (and `sim` where the build has it); others are plugins
 * `libdiffuse-<name>.so` found in the folder of the library (or of the program it is
 * linked into), or in $DIFFUSE_BACKEND_DIR, loaded the first time a backend is looked up
 * unless DIFFUSE_BACKEND_AUTOLOAD=0, or by df_backend_load(name). A registered table is
 * the backend's own, copied into a full-size table (entries a plugin built against an
 * older header does not know read as NULL) after its required entries were checked, so
 * the wrappers below test only the optional ones.
 */
#ifndef DF_BACKEND_REGISTRY_H
#define DF_BACKEND_REGISTRY_H

#include "backend/device.h"

/* Adds a backend (its table must outlive the process). Refused: another ABI version, a
 * missing required entry, a name already taken. */
df_status df_backend_register(const df_device_ops *ops);
/* The backend called `name`, or NULL. */
const df_device_ops *df_backend_find(const char *name);
int df_backend_count(void);
const df_device_ops *df_backend_at(int i);
/* The services the library offers backends. */
const df_host_api *df_host_services(void);

const df_device_ops *df_backend_cpu(void);
const df_device_ops *df_backend_sim(void);

/* ---- Wrappers: `d` is a df_device (graph.h). ------------------------------------------ */

#define df_dev_stream_create(d, kind, out) ((d)->ops->stream_create((d)->impl, (kind), (out)))
#define df_dev_stream_free(d, s) ((d)->ops->stream_free(s))
#define df_dev_buffer_alloc(d, n, out) ((d)->ops->buffer_alloc((d)->impl, (n), (out)))
#define df_dev_buffer_free(d, b) ((d)->ops->buffer_free((d)->impl, (b)))
#define df_dev_launch(d, s, n) ((d)->ops->launch((s), (n)))
#define df_dev_record(d, s) ((d)->ops->stream_record(s))
#define df_dev_reached(d, s, at, wait) ((d)->ops->stream_reached((s), (at), (wait)))
#define df_dev_sync(d, s) ((d)->ops->stream_sync(s))
#define df_dev_reset(d, s) ((d)->ops->stream_reset(s))
#define df_dev_callback(d, s, fn, arg) ((d)->ops->host_callback((s), (fn), (arg)))
#define df_dev_copy_h2d(d, s, b, off, src, n) ((d)->ops->copy_h2d((s), (b), (off), (src), (n)))
#define df_dev_copy_d2h(d, s, dst, b, off, n) ((d)->ops->copy_d2h((s), (dst), (b), (off), (n)))
#define df_dev_copy_d2d(d, s, db, doff, sb, soff, n) \
    ((d)->ops->copy_d2d((s), (db), (doff), (sb), (soff), (n)))
#define df_dev_wait(d, s, other, at) ((d)->ops->stream_wait((s), (other), (at)))

struct df_device;
df_status df_dev_launch_fused(const struct df_device *d, df_dev_stream *s, const df_fused *f);
void df_dev_throttle(const struct df_device *d, df_dev_stream *s, size_t depth);
bool df_dev_supports(const struct df_device *d, const df_node *n);
/* Whether the device has a kernel for op at all (a node with only the op set). */
bool df_dev_has_op(const struct df_device *d, df_op op);
df_dtype df_dev_matmul_dtype(const struct df_device *d, df_dtype requested);
/* The device's matmul_rates answer; DF_E_UNSUPPORTED naming the device when it has none. */
df_status df_dev_matmul_rates(const struct df_device *d, double *f32, double *bf16, char *how,
                              size_t cap);
df_status df_dev_drop_cache(const struct df_device *d, df_dev_stream *s, df_dev_buffer *b);
/* The device's counters (zeros where it keeps none). */
void df_dev_counters_get(const struct df_device *d, df_dev_counters *out);
/* Whether the device records graphs (capture_begin ... graph_free). */
bool df_dev_can_capture(const struct df_device *d);
#define df_dev_has(d, cap) (((d)->info.caps & (cap)) != 0)

#endif
