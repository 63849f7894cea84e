/*
 * A weight in a oneDNN layout, made once and kept on the weight's storage as a derived form
 * (cpu_device.h), for the products (gemm.c) and the convolutions (k_conv_dnnl.c).
 */
#ifndef DF_BACKEND_CPU_DNNL_WEIGHT_H
#define DF_BACKEND_CPU_DNNL_WEIGHT_H

#include <oneapi/dnnl/dnnl.h>
#include <stdbool.h>
#include <stdint.h>

#include "backend/cpu/cpu_device.h"

/* One step of the hash that keys a derived form: what decides the form goes in, one value at
 * a time. */
static inline uint64_t df_hash_mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 31);
}

/* Writes weight w in layout md into dst (md's size). */
typedef df_status (*df_dnnl_fill_fn)(const df_view *w, const dnnl_memory_desc_t *md, void *dst,
                                     void *arg);

/* The weight w in layout md: the form kept on w's storage under `key` (a hash of what decides
 * it) when there is one with that layout, else one made now by fill(w, md, dst, arg) and
 * kept; *made says which. `what` names the caller in the out-of-memory message. */
df_status df_dnnl_weight_kept(const df_view *w, uint64_t key, const dnnl_memory_desc_t *md,
                              df_dnnl_fill_fn fill, void *arg, const char *what,
                              const void **out, bool *made);

#endif
