/*
 * FLUX.2's starting latents and position ids on the host (see flux2_latents.h).
 *
 * The noise is drawn whole and then transposed, because the draw order is what a seed
 * means: torch fills the (B, 4C, h, w) tensor in memory order, and only then does the
 * pipeline permute it to tokens.
 */
#include "sched/flux2_latents.h"

#include "core/status.h"

/* Each of the B [rows, cols] matrices of in transposed into out's [cols, rows]. */
static void transpose(const float *in, int64_t B, int64_t rows, int64_t cols, float *out)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++)
                out[(b * cols + c) * rows + r] = in[(b * rows + r) * cols + c];
}

void df_flux2_pack_latents(const float *in, int64_t B, int64_t C, int64_t h, int64_t w,
                           float *out)
{
    transpose(in, B, C, h * w, out); /* [B, C, hw] -> [B, hw, C] */
}

void df_flux2_unpack_latents(const float *in, int64_t B, int64_t C, int64_t h, int64_t w,
                             float *out)
{
    transpose(in, B, h * w, C, out); /* [B, hw, C] -> [B, C, hw] */
}

df_status df_flux2_noise(df_rng *rng, int64_t B, int64_t C, int64_t h, int64_t w, float *scratch,
                         float *out)
{
    if (!rng || !scratch || !out || B < 1 || C < 1 || h < 1 || w < 1)
        return df_errorf(DF_E_ARG,
                         "flux2 noise: %s (batch %lld, channels %lld, %lld x %lld)",
                         !rng || !scratch || !out ? "NULL argument" : "empty shape",
                         (long long)B, (long long)C, (long long)h, (long long)w);
    DF_TRY(df_rng_randn_f32(rng, scratch, B * C * h * w));
    df_flux2_pack_latents(scratch, B, C, h, w, out);
    return DF_OK;
}

void df_flux2_latent_ids(int64_t B, int64_t h, int64_t w, int64_t *ids)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t p = 0; p < h * w; p++) {
            int64_t *id = ids + (b * h * w + p) * 4;
            id[0] = 0;
            id[1] = p / w;
            id[2] = p % w;
            id[3] = 0;
        }
}

void df_flux2_text_ids(int64_t B, int64_t L, int64_t *ids)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++) {
            int64_t *id = ids + (b * L + l) * 4;
            id[0] = id[1] = id[2] = 0;
            id[3] = l;
        }
}
