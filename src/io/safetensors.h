/*
 * Inside of df_safetensors, shared by safetensors.c (open, validate, look up) and
 * safetensors_read.c (reads, slices, page release).
 */
#ifndef DF_IO_SAFETENSORS_H
#define DF_IO_SAFETENSORS_H

#include <stdatomic.h>

#include <diffuse/safetensors.h>

/* The safetensors format caps the JSON header at 100 MB. */
#define DF_SAFETENSORS_MAX_HEADER ((uint64_t)100 << 20)

enum { ST_F8_NONE, ST_F8_E4M3, ST_F8_E5M2 };

typedef struct st_entry {
    const char *name;       /* in the handle's names block */
    const char *dtype_name; /* static */
    df_dtype dtype;         /* DF_DTYPE_COUNT when not loadable */
    uint8_t elem_size;
    uint8_t f8;             /* ST_F8_E4M3 or ST_F8_E5M2 for fp8 (dtype is DF_DTYPE_COUNT) */
    int ndim;
    int64_t shape[DF_SAFETENSORS_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end; /* within the data section; checked at open */
} st_entry;

typedef struct st_meta {
    const char *key, *value;
} st_meta;

struct df_safetensors {
    char *path;
    const uint8_t *base; /* the whole file (or caller's buffer) */
    size_t size;
    bool mapped; /* base is our mapping (else the caller's memory) */
    const uint8_t *data; /* data section: base + 8 + header length */
    uint64_t data_size;
    int64_t count;
    st_entry *entries; /* sorted by name */
    char *names;       /* every name and metadata string */
    int64_t meta_count;
    st_meta *meta;     /* sorted by key */
    _Atomic uint64_t bytes_read;
};

/* The entry for `name`, or NULL. */
const st_entry *df_st_lookup(const df_safetensors *st, const char *name);

/* Fills *out from an entry. */
void df_st_info(const df_safetensors *st, const st_entry *e, df_tensor_info *out);

#endif
