/*
 * make-tiny's weight writer (make_tiny_writer.c): the tensors of one component folder, drawn
 * from a seeded normal distribution and written tensor by tensor into safetensors shards of
 * at most a given size, named as diffusers and transformers name them (one file:
 * BASE.safetensors; more: BASE-0000N-of-0000M.safetensors with BASE.safetensors.index.json).
 * The shards are written by the library's df_st_shards; each tensor is declared and written
 * in turn, so writing holds one shard in memory and a full-size model is written in a
 * shard's memory.
 */
#ifndef DIFFUSE_MAKE_TINY_WRITER_H
#define DIFFUSE_MAKE_TINY_WRITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/diffuse.h>

/* Shards of this size unless a writer is given another (0). */
#define TINY_SHARD_BYTES DF_ST_SHARD_BYTES

typedef struct tiny_writer {
    char dir[4096];   /* component folder */
    df_st_shards *w;  /* its weight files */
    df_rng own, *rng; /* rng: own, or the caller's to share across components */
    df_dtype dtype;
    df_status s;
} tiny_writer;

/* Creates `dir` if needed (its parent must exist). */
int tw_make_dir(const char *path);
/* Writes `text` to dir/name. 0, or -1 after printing why. */
int tw_write_file(const char *dir, const char *name, const char *text);

/* Starts the component folder `dir` (created) with files BASE*.safetensors. rng NULL: the
 * writer's own generator seeded with `seed`; else the caller's, advanced in place.
 * shard_bytes 0: TINY_SHARD_BYTES. 0, or -1 after printing why. */
int tw_begin(tiny_writer *w, const char *dir, const char *base, df_dtype dtype, df_rng *rng,
             uint64_t seed, int64_t shard_bytes);

/* `name` of `shape` from mean + std * N(0, 1) (std 0: all mean). A failure is kept in w->s
 * and reported by tw_finish; later calls do nothing. */
void tw_add(tiny_writer *w, const char *name, const int64_t *shape, int ndim, float std,
            float mean);
/* `name` of `shape` with the given f32 values. */
void tw_add_values(tiny_writer *w, const char *name, const int64_t *shape, int ndim,
                   const float *v);
/* name.weight [out, in] scaled by 1 / sqrt(in), and name.bias [out] when `bias`. */
void tw_linear(tiny_writer *w, const char *name, int64_t out, int64_t in, bool bias);
/* name.weight [dim] near 1, and name.bias [dim] near 0 when `bias`. */
void tw_norm(tiny_writer *w, const char *name, int64_t dim, bool bias);
/* A k x k convolution's name.weight [out, in, k, k] and name.bias [out]. */
void tw_conv(tiny_writer *w, const char *name, int64_t out, int64_t in, int64_t k);

/* Writes the last shard, names the shards and, for more than one, writes the index; frees
 * what the writer holds. 0, or -1 after printing the first failure. */
int tw_finish(tiny_writer *w);

/* A shape literal for tw_add: SH(rows, cols) expands to the array and its length. */
#define SH(...) (const int64_t[]){__VA_ARGS__}, (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t))

#endif
