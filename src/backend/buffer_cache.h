/* The per-device caching allocator (see buffer_cache.c). */
#ifndef DF_BACKEND_BUFFER_CACHE_H
#define DF_BACKEND_BUFFER_CACHE_H

#include "backend/graph.h"

typedef struct df_buffer_cache df_buffer_cache;

df_status df_buffer_cache_create(df_device *dev, df_buffer_cache **out);
void df_buffer_cache_free(df_buffer_cache *c);
df_status df_buffer_cache_alloc(df_buffer_cache *c, size_t bytes, df_dev_buffer **out);
void df_buffer_cache_release(df_buffer_cache *c, df_dev_buffer *buf, size_t bytes);
void df_buffer_cache_stats(df_buffer_cache *c, df_mem_stats *out);
void df_buffer_cache_reset_peak(df_buffer_cache *c);
void df_buffer_cache_trim(df_buffer_cache *c);

#endif
