/*
 * make-tiny's FLUX.2 pipeline folders (make_tiny_flux2.c): Flux2Pipeline with a Mistral 3
 * text encoder, or Flux2KleinPipeline (distilled) with a Qwen3 one, in diffusers' layout.
 */
#ifndef DIFFUSE_MAKE_TINY_FLUX2_H
#define DIFFUSE_MAKE_TINY_FLUX2_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/dtype.h>

#include "make_tiny_lm.h"

typedef struct tiny_flux2_sizes {
    int heads, head_dim, double_blocks, single_blocks; /* the transformer */
    tiny_lm_sizes te;     /* the text encoder (joint_attention_dim = 3 * te.hidden) */
    int vae_channels[4];  /* block_out_channels */
    int vae_layers, vae_groups;
    int64_t shard_bytes;  /* each component's weight files are split past this */
} tiny_flux2_sizes;

/* Tiny: a 2 x 16 transformer with 1 + 2 blocks, encoders of width 32 with just enough layers
 * for the pipelines' hidden-state lists (Mistral 31 of which 30 run, Qwen3 28 of which 27
 * run), a 4-level VAE of 8 to 16 channels. */
#define TINY_FLUX2_SIZES(klein)                                                                    \
    ((tiny_flux2_sizes){.heads = 2, .head_dim = 16, .double_blocks = 1, .single_blocks = 2,       \
                        .te = {.hidden = 32, .intermediate = 64, .layers = (klein) ? 28 : 31,     \
                               .heads = 4, .kv_heads = 2, .head_dim = 16, .vocab = 0},            \
                        .vae_channels = {8, 16, 16, 16}, .vae_layers = 1, .vae_groups = 4,        \
                        .shard_bytes = (int64_t)1 << 31})

/* FLUX.2 [klein] 4B's shapes: transformer 24 heads of 128, 5 double + 20 single blocks;
 * Qwen3-4B (36 layers at 2560, 32 heads / 8 KV heads of 128, MLP 9728, vocabulary 151936);
 * the VAE decoder at 128-512 channels, 2 layers per block, 32 groups. */
#define TINY_FLUX2_KLEIN_4B                                                                        \
    ((tiny_flux2_sizes){.heads = 24, .head_dim = 128, .double_blocks = 5, .single_blocks = 20,    \
                        .te = {.hidden = 2560, .intermediate = 9728, .layers = 36, .heads = 32,   \
                               .kv_heads = 8, .head_dim = 128, .vocab = 151936},                  \
                        .vae_channels = {128, 256, 512, 512}, .vae_layers = 2,                    \
                        .vae_groups = 32, .shard_bytes = (int64_t)1 << 31})

/* Writes the folder `dir` (which must exist). 0, or -1 after printing why on stderr. */
int tiny_write_flux2(const char *dir, bool klein, const tiny_flux2_sizes *z, df_dtype dtype,
                     uint64_t seed);

#endif
