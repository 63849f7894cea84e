/*
 * The runtime's side of the device layer: storages, the graph IR, opened devices.
 *
 * A storage is a backend buffer handle, a byte offset into it and a size: only the
 * backend turns it into an address (backend/device.h). Sub-allocations (a planned graph's
 * arena slots, the parts of a concat written in place) are offsets into one buffer.
 * Storages are reference-counted: tensor handles and queued nodes hold references, and a
 * queued node's references are dropped by a host callback queued after its kernel, so
 * memory returns to the device's caching allocator only once the stream has passed its
 * last use.
 *
 * A graph node (df_gnode) is one op with its input and output views over storages. Strict
 * eager lowers it to the device's df_node (buffer + byte offset) and launches it at once;
 * defer-and-fuse and compiled mode collect nodes into graphs first.
 */
#ifndef DF_BACKEND_GRAPH_H
#define DF_BACKEND_GRAPH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include <diffuse/runtime.h>

#include "backend/device.h"

_Static_assert(DF_DEVICE_MAX_DIMS == DF_MAX_DIMS, "the device ABI and the API agree on ranks");

const char *df_op_name(df_op op);
df_op_kind df_op_kind_of(df_op op);
int df_op_inputs(df_op op);

typedef struct df_device df_device;
typedef struct df_gnode df_gnode;

typedef struct df_storage {
    atomic_int refs;        /* handles + nodes + graphs that hold it */
    int handles;            /* tensor handles only (host thread) */
    df_device *dev;
    df_dev_buffer *buf;     /* NULL while the storage is lazy (not yet produced) */
    uint64_t offset;        /* bytes into buf */
    size_t bytes;
    bool external;          /* buf is not this storage's to free (a wrapped host mapping
                               that owns its handle elsewhere, an arena slot, a part) */
    bool owns_buf;          /* the storage frees buf itself (a wrapped host mapping) */
    bool is_weight;         /* long-lived: the device may keep derived forms of it */
    void *host;             /* host memory this storage mirrors (a mapped weight), or NULL */
    /* A weight's residency, precision and int8 state (df_weight, below); NULL for
     * activations. Freed with the storage. */
    struct df_weight *weight;
    struct df_storage *base; /* the storage whose buffer this one is a part of (a concat's
                               part that the planner has its producer write in place):
                               held until this one is freed */
    df_gnode *producer;     /* the pending node that will produce it (defer-and-fuse) */
    uint64_t written_at;    /* strict eager: the compute stream position after the launch
                               that wrote it (and the launch's release); 0: unknown */
    atomic_bool write_failed; /* that launch's release ran on a failed stream */
} df_storage;

/*
 * What a weight storage holds beyond its memory: how it comes and goes (residency), the
 * precision int8 compute keeps it in, and its int8 form. Only the runtime writes it
 * (runtime/weight.c, runtime/residency.c); df_gview_lower hands it to the device as the
 * view's flags, scales and block type. Models reach it through runtime/weight.h.
 */
typedef struct df_weight {
    /* residency (runtime/weight.c, runtime/residency.c) */
    bool file_backed;  /* host is a read-only file mapping: its pages can be dropped
                          and will be read again from the file */
    const void *pages; /* the bytes in the file mapping whose pages come and go */
    size_t page_bytes;
    bool resident;          /* acquired: counted in df_stats' resident_weight_bytes */
    size_t resident_bytes;  /* what it holds resident: its bytes, or its 8-bit form */
    bool transient;         /* resident for one pass at a time: used in place, not packed */
    int64_t resident_since; /* 1 + the step count when last acquired; 0: not acquired since
                               its last release */
    uint64_t ready_at;      /* its upload on the copy stream ends there */
    /* precision */
    bool keep_precision; /* int8 compute keeps it in f32 (models/quant_policy.c) */
    /* int8 form */
    struct df_storage *i8_scale; /* an I8 weight saved quantized: its scales [rows, groups] */
    uint64_t i8_scale_offset;
    int64_t i8_groups;
    uint32_t block_type; /* an I8 weight in a compact file format (df_view.block_type) */
    float block_scale;
} df_weight;

/* A view of a storage, as the runtime keeps it. Strides and offset are in elements. */
typedef struct df_gview {
    df_storage *st; /* NULL: the optional input is absent */
    df_dtype dtype;
    int ndim;
    int64_t shape[DF_MAX_DIMS];
    int64_t stride[DF_MAX_DIMS];
    int64_t offset;
} df_gview;

struct df_gnode {
    df_op op;
    int n_in;
    df_gview in[DF_NODE_MAX_IN];
    df_gview out;       /* dense row-major; the defer-and-fuse planner may point it into a
                           larger tensor for the kernels that take that (rms_norm_rope,
                           and linear or attention writing their columns of a concat) */
    df_attrs a;
    struct df_comm *comm; /* ALL_REDUCE: the communicator it sums over (NULL: one rank) */
    /* Graph bookkeeping (defer-and-fuse / compile); unused in strict eager. */
    int id;
    df_gnode *next;
};

int64_t df_gview_numel(const df_gview *v);
bool df_gview_is_dense(const df_gview *v);
/* The device's view of v: buffer, byte offset, the storage's hints. */
void df_gview_lower(const df_gview *v, df_view *out);
/* The same for a node's views. */
void df_gnode_lower(const df_gnode *n, df_node *out);

/* An opened device: its backend, its caching allocator and counters. */
struct df_device {
    const df_device_ops *ops;
    void *impl;
    int index;
    char name[48];
    df_device_info info;
    struct df_buffer_cache *cache;
    _Atomic int64_t bytes_uploaded, bytes_downloaded; /* copies between host and device */
};

/* Opens device `name` ("cpu", "vulkan:1"; "auto" is the caller's to resolve, with
 * df_device_auto, which opens devices itself). */
df_status df_device_open(const char *name, const char *options, df_device **out);
void df_device_close(df_device *dev);

/* Storages: allocation through the device's caching allocator. */
df_status df_storage_alloc(df_device *dev, size_t bytes, df_storage **out);
df_storage *df_storage_lazy(df_device *dev, size_t bytes);
df_status df_storage_materialize(df_storage *st);
/* A storage over host memory the caller keeps alive (a mapped weight, wrapped data): the
 * device reads it in place where it can (DF_CAP_HOST_MEMORY); else the storage's buffer is
 * device memory that the host data is uploaded into when it is first needed (its derived
 * form, runtime/residency.c), and buf stays NULL until then. */
df_status df_storage_host(df_device *dev, void *host, size_t bytes, df_storage **out);
void df_storage_retain(df_storage *st);
void df_storage_release(df_storage *st);
/* The host address of st's byte 0 where the host may address the device's memory, else
 * NULL (the runtime then copies). */
void *df_storage_host_ptr(const df_storage *st);

/* Hands a buffer of `bytes` from df_storage_materialize back to the device's allocator. */
void df_buffer_release(df_device *dev, df_dev_buffer *buf, size_t bytes);

/* Memory counters of a device's caching allocator. */
typedef struct df_mem_stats {
    int64_t live_bytes, peak_bytes, allocated_total, cached_bytes;
} df_mem_stats;
void df_device_mem_stats(df_device *dev, df_mem_stats *out);
void df_device_mem_reset_peak(df_device *dev);
/* Returns cached, unused blocks to the backend. */
void df_device_trim(df_device *dev);

#include "backend/registry.h"

#endif
