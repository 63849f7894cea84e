/*
 * FLUX.2's latent layouts around the VAE (Flux2Pipeline's static helpers).
 *
 * FLUX.2 denoises tokens [B, S, 128]: the 32 latent channels of the VAE, patchified 2x2
 * (channel c*4 + dy*2 + dx), one token per patch, each carrying a position id (t, h, w, l).
 * Before decoding, the pipeline scatters the tokens back onto the patch grid by their ids
 * (_unpack_latents_with_ids), de-normalises them by the VAE's batch-norm statistics
 * (df_vae_bn_denormalize, in vae.c, which holds them) and unpatchifies to [B, 32, 2h, 2w].
 *
 * The scatter is a gather here: the host turns the ids into, for each grid position, the
 * row of the token that lands there, and one df_gather moves the rows. Ids in raster order
 * (the pipeline's own, [0, h, w, 0] for h, w in order) need no gather at all: the tokens
 * are then already the grid in row-major order, and a reshape and a permute do it. Grid
 * positions that no token names stay 0, as in torch's zeros + scatter_: they read a zero
 * row appended to the table.
 */
#include <diffuse/ops.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/vae_blocks.h"

/* The grid H x W the ids of every sample span (max + 1), checked to be one for all. */
static df_status grid_size(const int64_t *ids, int64_t B, int64_t S, int64_t *H, int64_t *W)
{
    for (int64_t b = 0; b < B; b++) {
        int64_t hb = 0, wb = 0;
        for (int64_t i = 0; i < S; i++) {
            const int64_t *id = ids + (b * S + i) * 4;
            if (id[1] < 0 || id[2] < 0 || id[1] >= (1 << 20) || id[2] >= (1 << 20))
                return df_errorf(DF_E_ARG,
                                 "unpack latents: token %lld of sample %lld has position "
                                 "(h %lld, w %lld), outside [0, 2^20)",
                                 (long long)i, (long long)b, (long long)id[1], (long long)id[2]);
            hb = id[1] + 1 > hb ? id[1] + 1 : hb;
            wb = id[2] + 1 > wb ? id[2] + 1 : wb;
        }
        if (b > 0 && (hb != *H || wb != *W))
            return df_errorf(DF_E_ARG,
                             "unpack latents: sample %lld spans a %lld x %lld grid but "
                             "sample 0 spans %lld x %lld",
                             (long long)b, (long long)hb, (long long)wb, (long long)*H,
                             (long long)*W);
        *H = hb;
        *W = wb;
    }
    return DF_OK;
}

/* rows[b * H * W + p]: the row of the packed table ([B * S, C], a zero row at B * S) that
 * lands at grid position p of sample b. *raster: the rows are 0, 1, 2, ... (no gather). */
static df_status scatter_rows(const int64_t *ids, int64_t B, int64_t S, int64_t H, int64_t W,
                              int64_t *rows, bool *raster, bool *holes)
{
    int64_t hw = H * W;
    for (int64_t j = 0; j < B * hw; j++)
        rows[j] = -1;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++) {
            const int64_t *id = ids + (b * S + i) * 4;
            int64_t *slot = rows + b * hw + id[1] * W + id[2];
            if (*slot >= 0)
                return df_errorf(DF_E_ARG,
                                 "unpack latents: tokens %lld and %lld of sample %lld share "
                                 "position (h %lld, w %lld)",
                                 (long long)(*slot - b * S), (long long)i, (long long)b,
                                 (long long)id[1], (long long)id[2]);
            *slot = b * S + i;
        }
    *raster = S == hw;
    *holes = false;
    for (int64_t j = 0; j < B * hw; j++) {
        if (rows[j] < 0) {
            rows[j] = B * S;
            *holes = true;
        }
        *raster = *raster && rows[j] == j;
    }
    return DF_OK;
}

/* [B, H*W, C] rows in grid order -> [B, C, H, W]. */
static df_tensor *grid_to_nchw(df_ctx *ctx, df_tensor *x, int64_t B, int64_t C, int64_t H,
                               int64_t W)
{
    x = df_reshape(ctx, x, DF_SHAPE(B, H, W, C));
    return df_contiguous(ctx, df_permute(ctx, x, DF_SHAPE(0, 3, 1, 2)));
}

/* The packed rows with a zero row appended: [B * S + 1, C]. */
static df_tensor *table_with_zero_row(df_ctx *ctx, df_tensor *table, int64_t C)
{
    float *zero = df_calloc((size_t)C, sizeof *zero);
    if (!zero) {
        df_errorf(DF_E_OOM, "unpack latents: out of memory");
        return NULL;
    }
    df_tensor *z = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, C), zero);
    df_free(zero);
    return df_concat(ctx, df_cast(ctx, table, DF_DTYPE_F32), z, 0);
}

df_status df_vae_unpack_latents_with_ids(df_ctx *ctx, df_tensor *packed, const int64_t *ids,
                                         df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_unpack_latents_with_ids", ctx, packed && ids, out));
    char d[96];
    if (df_tensor_ndim(packed) != 3 || df_tensor_dim(packed, 1) < 1)
        return df_errorf(DF_E_SHAPE, "unpack latents: packed %s, expected [B, S, C]",
                         df_tensor_describe(packed, d, sizeof d));
    int64_t B = df_tensor_dim(packed, 0), S = df_tensor_dim(packed, 1);
    int64_t C = df_tensor_dim(packed, 2), H = 0, W = 0;
    DF_TRY(grid_size(ids, B, S, &H, &W));

    int64_t *rows = df_malloc((size_t)(B * H * W) * sizeof *rows);
    if (!rows)
        return df_errorf(DF_E_OOM, "unpack latents: out of memory");
    bool raster = false, holes = false;
    df_status s = scatter_rows(ids, B, S, H, W, rows, &raster, &holes);
    if (s != DF_OK) {
        df_free(rows);
        return s;
    }
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x;
    if (raster) {
        x = grid_to_nchw(ctx, packed, B, C, H, W);
    } else {
        df_tensor *table = df_reshape(ctx, packed, DF_SHAPE(B * S, C));
        if (holes)
            table = table_with_zero_row(ctx, table, C);
        df_tensor *idx = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, H * W), rows);
        x = grid_to_nchw(ctx, df_gather(ctx, table, idx), B, C, H, W);
    }
    df_free(rows);
    x = df_scope_end(ctx, mark, x);
    return df_vae_finish(ctx, x, out);
}

df_status df_vae_unpatchify_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_unpatchify_latents", ctx, latents, out));
    char d[96];
    if (df_tensor_ndim(latents) != 4 || df_tensor_dim(latents, 1) % 4)
        return df_errorf(DF_E_SHAPE, "unpatchify latents: %s, expected [B, 4C, h, w]",
                         df_tensor_describe(latents, d, sizeof d));
    int64_t B = df_tensor_dim(latents, 0), C = df_tensor_dim(latents, 1) / 4;
    int64_t h = df_tensor_dim(latents, 2), w = df_tensor_dim(latents, 3);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x = df_reshape(ctx, latents, DF_SHAPE(B, C, 2, 2, h, w));
    x = df_permute(ctx, x, DF_SHAPE(0, 1, 4, 2, 5, 3)); /* [B, C, h, 2, w, 2] */
    x = df_scope_end(ctx, mark, df_reshape(ctx, x, DF_SHAPE(B, C, 2 * h, 2 * w)));
    return df_vae_finish(ctx, x, out);
}

df_status df_vae_patchify_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_patchify_latents", ctx, latents, out));
    char d[96];
    if (df_tensor_ndim(latents) != 4 || df_tensor_dim(latents, 2) % 2 ||
        df_tensor_dim(latents, 3) % 2)
        return df_errorf(DF_E_SHAPE, "patchify latents: %s, expected [B, C, h, w] with h and w "
                                     "even",
                         df_tensor_describe(latents, d, sizeof d));
    int64_t B = df_tensor_dim(latents, 0), C = df_tensor_dim(latents, 1);
    int64_t h = df_tensor_dim(latents, 2), w = df_tensor_dim(latents, 3);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x = df_reshape(ctx, latents, DF_SHAPE(B, C, h / 2, 2, w / 2, 2));
    x = df_permute(ctx, x, DF_SHAPE(0, 1, 3, 5, 2, 4)); /* [B, C, 2, 2, h/2, w/2] */
    x = df_scope_end(ctx, mark, df_reshape(ctx, x, DF_SHAPE(B, C * 4, h / 2, w / 2)));
    return df_vae_finish(ctx, x, out);
}
