/*
 * The int8 tile layout: how a saved int8 weight's bytes are ordered when they are stored as
 * the int8 kernels read them (docs/int8.md, "The saved layout and its version").
 *
 * A weight q [n, k] (int8, n a multiple of nr, k a multiple of 4) in tiles of nr channels is
 * stored as [n / nr][k / 4][nr][4]: for each block of nr output channels, each run of 4
 * consecutive k, the nr channels' 4 values. Its scales [n, groups] are stored as
 * [n / nr][groups][nr]. The byte counts are those of the row-major arrays, so a tiled tensor
 * keeps its [n, k] and [n, groups] shapes in the file, and a block of nr channels is
 * contiguous in both: rows [r0, r1) on block boundaries are the same byte range as in the
 * row-major layout. A weight whose n or k does not fit whole tiles stays row-major.
 *
 * The writer (models/quant_save.c), the loader (models/loader.c) and the CPU kernels
 * (backend/cpu/gemm_int8*.c, whose DF_I8_NR is DF_I8_TILE_NR) share this one definition.
 */
#ifndef DF_CORE_INT8_TILES_H
#define DF_CORE_INT8_TILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The tiles the int8 kernels read: DF_I8_TILE_NR channels by 4 k. */
#define DF_I8_TILE_NR 32
/* The version of the tile layout's meaning ("layout_version" in quantization_config). */
#define DF_I8_TILES_VERSION 1
/* df_view.block_type of an I8 weight whose bytes are in tiles of DF_I8_TILE_NR (its scales,
 * df_view.scale_buf, too). Not a ggml type and not fp8 (core/quant_blocks.h). */
#define DF_QBLOCK_I8_TILES 0x120u

/* Whether q [n, k] is stored in tiles of nr (nr 0: row-major). */
static inline bool df_i8_tiles_fit(int64_t n, int64_t k, int nr)
{
    return nr > 0 && n > 0 && k > 0 && n % nr == 0 && k % 4 == 0;
}

/* The position of q[j][kk] in tiles of nr channels of a weight with k columns. */
static inline size_t df_i8_tiles_q_at(int64_t k, int nr, int64_t j, int64_t kk)
{
    return (size_t)((((j / nr) * (k / 4) + kk / 4) * nr + j % nr) * 4 + kk % 4);
}

/* The position of scale[j][g] in tiles of nr channels of a weight with `groups` groups. */
static inline size_t df_i8_tiles_scale_at(int64_t groups, int nr, int64_t j, int64_t g)
{
    return (size_t)(((j / nr) * groups + g) * nr + j % nr);
}

/* A layout tag ("rows", "tiles16", "tiles32", "tiles64"): its nr (0 for rows), or -1 for
 * a name that is none of these. */
static inline int df_i8_layout_nr(const char *tag)
{
    static const struct {
        const char *name;
        int nr;
    } known[] = {{"rows", 0}, {"tiles16", 16}, {"tiles32", 32}, {"tiles64", 64}};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        if (strcmp(known[i].name, tag) == 0)
            return known[i].nr;
    }
    return -1;
}

#endif
