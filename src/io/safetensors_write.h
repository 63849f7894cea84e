/*
 * Inside of the safetensors writers, shared by safetensors_write.c (one file built in
 * memory) and safetensors_shards.c (a component's shards, streamed): a tensor's declaration
 * and the header both write, so that their files agree byte for byte.
 */
#ifndef DF_IO_SAFETENSORS_WRITE_H
#define DF_IO_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include <diffuse/dtype.h>

typedef struct st_decl {
    char *name; /* owned */
    df_dtype dtype;
    int ndim;
    int64_t shape[8];
    size_t bytes;
} st_decl;

/* Checks a tensor to be written (a dtype safetensors names, a name that needs no escaping,
 * ndim <= 8, a shape whose byte count fits) and fills *d with a copy of its name.
 * DF_E_ARG naming the tensor, DF_E_OOM. */
df_status df_st_decl_init(st_decl *d, const char *name, df_dtype dtype, const int64_t *shape,
                          int ndim);

/* The header of a file whose data holds e[0], e[1], ... in this order: the JSON (names as
 * given, offsets in that order) padded with spaces to a multiple of 8 bytes. *out is the
 * caller's (df_free), *len its length. DF_E_OOM. */
df_status df_st_header(const st_decl *const *e, int64_t n, char **out, size_t *len);

/* Writes all `bytes` of `data` at `offset` of the open file `fd`; DF_E_IO naming `path`. */
df_status df_st_pwrite(int fd, const char *path, const void *data, size_t bytes,
                       uint64_t offset);

#endif
