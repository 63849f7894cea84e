/*
 * The VAE decoder: diffusers' AutoencoderKL, decoder side, and the steps around it that
 * the pipelines share (FLUX latent unpacking, un-scaling, image post-processing).
 *
 * A df_vae is loaded from a diffusers `vae/` folder (config.json + weights). Only the
 * decoder is built: decoder.* and post_quant_conv.* are bound, while the encoder's tensors
 * (encoder.*, quant_conv.*) that full checkpoints carry are skipped on purpose. Any other
 * tensor the config does not call for is an error.
 *
 * The decode path of a pipeline reads:
 *     df_vae_unpack_latents(ctx, packed, h, w, &z);   FLUX only: (B, S, 4C) -> (B, C, h, w)
 *     df_vae_unscale(ctx, vae, z, &z);                 z / scaling_factor + shift_factor
 *     df_vae_decode(ctx, vae, z, &img);                (B, C, h, w) -> (B, 3, 8h, 8w)
 *     df_tensor_read(ctx, img, DF_DTYPE_F32, buf, ...);
 *     df_vae_postprocess_rgb8(buf, B, 3, 8h, 8w, pixels);
 *
 * FLUX.2 (AutoencoderKLFlux2) replaces the first two steps:
 *     df_vae_unpack_latents_with_ids(ctx, packed, ids, &z);   (B, S, 128) -> (B, 128, h, w)
 *     df_vae_bn_denormalize(ctx, vae, z, &z);                  z * bn std + bn mean
 *     df_vae_unpatchify_latents(ctx, z, &z);                   -> (B, 32, 2h, 2w)
 *
 * Tensors returned by these functions belong to the context's current scope, like op
 * results (runtime.h).
 */
#ifndef DIFFUSE_VAE_H
#define DIFFUSE_VAE_H

#include <stdbool.h>
#include <stdint.h>

#include "rng.h"
#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most entries block_out_channels may have. */
#define DF_VAE_MAX_BLOCKS 8

typedef struct df_vae df_vae;

/* The decoder's settings, read from vae/config.json. */
typedef struct df_vae_info {
    int64_t latent_channels; /* z channels */
    int64_t out_channels;    /* image channels (3) */
    int n_blocks;            /* len(block_out_channels) */
    int64_t block_out_channels[DF_VAE_MAX_BLOCKS];
    int layers_per_block; /* each up block has this + 1 ResNets */
    int norm_num_groups;
    bool mid_block_add_attention; /* default true */
    bool use_post_quant_conv;     /* default true (SD1/SDXL); FLUX, SD3: false */
    double scaling_factor;        /* default 0.18215; AutoencoderKLFlux2: 1 (none) */
    double shift_factor;          /* null or absent: 0 */
    int64_t scale_factor;         /* 2^(n_blocks - 1): pixels per latent */
    int64_t sample_size;          /* config sample_size (its first entry), default 32: the
                                   * tile side of df_vae_encode_tiled */
    /* AutoencoderKLFlux2: the decoder is built from decoder_block_out_channels when the
     * config has them (block_out_channels above then holds those), and the pipeline's
     * latents are normalised by a BatchNorm2d over the 2x2-patchified latents. */
    bool flux2;
    int64_t bn_channels;   /* 4 * latent_channels (128); 0 for AutoencoderKL */
    double batch_norm_eps; /* default 1e-4 */
} df_vae_info;

/*
 * Loads the AutoencoderKL or AutoencoderKLFlux2 decoder in `dir` (the folder holding
 * config.json and diffusion_pytorch_model.safetensors). Weights stay in the mapped file, in
 * their stored dtype; a FLUX.2 VAE's bn.running_mean and bn.running_var are also read to
 * the host (missing, they fail the load, naming the file and the tensor). On success *out
 * is owned by the caller; free it with df_vae_free(). Fails with DF_E_IO when a file cannot
 * be read; DF_E_FORMAT when the config is malformed or impossible (empty
 * block_out_channels, norm_num_groups not dividing a channel count, ...) or the weights
 * disagree with it (missing tensor, wrong shape, unexpected decoder tensor);
 * DF_E_UNSUPPORTED for another class, block type, activation or patch_size.
 */
DF_API df_status df_vae_load(df_ctx *ctx, const char *dir, df_vae **out);
/* df_vae_load with the weights from the single file `file` (NULL: dir's): diffusers' names
 * or the original LDM ones (Black Forest Labs' ae.safetensors, SD3's VAE), also under
 * ComfyUI's "vae." / "first_stage_model." prefixes, with dir/config.json as the config.
 * The attention's 1x1 convolutions are read as diffusers' linears. Fails as df_vae_load. */
DF_API df_status df_vae_load_file(df_ctx *ctx, const char *dir, const char *file,
                                  df_vae **out);

/* The decoder's settings (borrowed; valid while vae lives). */
DF_API const df_vae_info *df_vae_config(const df_vae *vae);

/*
 * FluxPipeline._unpack_latents: packed latents [B, (h/2)(w/2), 4C] -> [B, C, h, w], where
 * packed channel c*4 + dy*2 + dx of token (y, x) lands at (c, 2y + dy, 2x + dx). h and w
 * are the latent height and width (pixels / vae scale factor). DF_E_SHAPE when h or w is
 * odd or not positive, or the packed shape does not match.
 */
DF_API df_status df_vae_unpack_latents(df_ctx *ctx, df_tensor *packed, int64_t h, int64_t w,
                                       df_tensor **out);
/* The inverse, FluxPipeline._pack_latents: [B, C, h, w] -> [B, (h/2)(w/2), 4C]. */
DF_API df_status df_vae_pack_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out);

/* latents / scaling_factor + shift_factor (any shape), as the pipelines do before decode.
 * DF_E_ARG for an AutoencoderKLFlux2, which has no such factors (df_vae_bn_denormalize). */
DF_API df_status df_vae_unscale(df_ctx *ctx, const df_vae *vae, df_tensor *latents,
                                df_tensor **out);

/*
 * Flux2Pipeline._unpack_latents_with_ids: tokens [B, S, C] and their position ids, host
 * int64 [B, S, 4] as (t, h, w, l), -> [B, C, H, W] with token i of sample b written at
 * (h_i, w_i), H = max h + 1 and W = max w + 1 over the sample; positions no token names are
 * 0. Every sample must span the same H x W, as torch.stack requires. DF_E_SHAPE for a
 * packed tensor that is not 3-D; DF_E_ARG for a negative id, samples of different sizes,
 * or two tokens of a sample at one position (torch's scatter would leave either).
 */
DF_API df_status df_vae_unpack_latents_with_ids(df_ctx *ctx, df_tensor *packed,
                                                const int64_t *ids, df_tensor **out);

/*
 * Flux2Pipeline's de-normalisation before decode: latents [B, bn_channels, h, w] (the
 * 2x2-patchified layout) -> latents * sqrt(bn.running_var + batch_norm_eps) +
 * bn.running_mean, per channel. DF_E_ARG for a VAE that is not an AutoencoderKLFlux2,
 * DF_E_SHAPE when the channels do not match.
 */
DF_API df_status df_vae_bn_denormalize(df_ctx *ctx, const df_vae *vae, df_tensor *latents,
                                       df_tensor **out);

/*
 * Flux2Pipeline._unpatchify_latents: [B, 4C, h, w] -> [B, C, 2h, 2w], channel c*4 + dy*2 +
 * dx of (y, x) landing at (c, 2y + dy, 2x + dx). _patchify is the inverse. DF_E_SHAPE for
 * a tensor that is not 4-D, channels not a multiple of 4, or (patchify) an odd size.
 */
DF_API df_status df_vae_unpatchify_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out);
DF_API df_status df_vae_patchify_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out);

/*
 * AutoencoderKL.decode: latents [B, latent_channels, h, w] -> [B, out_channels, h*f, w*f]
 * with f = scale_factor (8 for four blocks), f32. Each block's temporaries are released
 * when it ends and the call waits for each block to run, so the memory in use is about
 * one block's working set (it returns when the last block has run). DF_E_SHAPE when the
 * latents do not fit; a failed op is reported here and leaves the context failed.
 */
DF_API df_status df_vae_decode(df_ctx *ctx, const df_vae *vae, df_tensor *latents, df_tensor **out);

/*
 * The same decode, tile by tile, so memory stays bounded for large images: the latents are
 * cut into tiles of tile_latent x tile_latent (the last tile of a row or column is
 * smaller) that overlap their neighbours by overlap_latent; each tile is decoded on its
 * own and neighbouring tiles are blended linearly across the overlap (overlap_latent * f
 * pixels). 0 picks the defaults, 64 (512 pixels) and 16 (a quarter of a smaller tile). The
 * memory in use is about one tile's working set plus the image. Because GroupNorm sees one
 * tile's statistics instead of the whole image's, the result is close to, not equal to,
 * df_vae_decode's. Latents that fit in one tile are decoded whole. DF_E_ARG when
 * tile_latent < 2 * overlap_latent or either is negative.
 */
DF_API df_status df_vae_decode_tiled(df_ctx *ctx, const df_vae *vae, df_tensor *latents,
                                     int64_t tile_latent, int64_t overlap_latent, df_tensor **out);

/*
 * The decode the pipelines run. First the memory nobody uses goes back (df_empty_cache:
 * the transformer's cached blocks, freed heap pages). With `tiled`, df_vae_decode_tiled
 * with 64-latent tiles overlapping by 8 (the pipelines' vae_tiling). Otherwise the whole
 * decode when df_vae_decode_bytes fits in df_memory_available(), else tiled by itself with
 * the largest of 64-, 32- and 16-latent tiles (overlap an eighth) whose need fits, the
 * smallest when none does. The choice is logged: a note when it tiles by itself, a detail
 * (DIFFUSE_VERBOSE) otherwise. Errors as df_vae_decode.
 */
DF_API df_status df_vae_decode_auto(df_ctx *ctx, const df_vae *vae, df_tensor *latents, bool tiled,
                                    df_tensor **out);

/* Estimated peak memory of df_vae_decode for `batch` images of h x w latents, in bytes: the
 * f32 activations alive at its fullest point (the first ResNet of the last up block, for
 * FLUX.1's widths at 1024 x 1024 3 GiB) plus the weights in f32, and a quarter more for
 * the checkpoint's pages and the allocator's rounding and cache. */
DF_API int64_t df_vae_decode_bytes(const df_vae *vae, int64_t batch, int64_t h, int64_t w);

/* Frees the decoder and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_vae_free(df_vae *vae);

/* ---- the encoder (img2img and editing pipelines) ---- */

typedef struct df_vae_encoder df_vae_encoder;

/*
 * Loads AutoencoderKL's encoder from `dir` (the same vae/ folder df_vae_load reads):
 * encoder.* and quant_conv.* (when use_quant_conv, default true) are bound, the decoder's
 * tensors skipped; an AutoencoderKLFlux2's encoder is built from its block_out_channels and
 * its bn.running_mean / running_var are read to the host. Free with df_vae_encoder_free().
 * Fails as df_vae_load does; DF_E_UNSUPPORTED for a down block type other than
 * DownEncoderBlock2D.
 */
DF_API df_status df_vae_encoder_load(df_ctx *ctx, const char *dir, df_vae_encoder **out);
/* The same from a single file, as df_vae_load_file reads it. */
DF_API df_status df_vae_encoder_load_file(df_ctx *ctx, const char *dir, const char *file,
                                          df_vae_encoder **out);

/* The settings read from vae/config.json (borrowed; valid while e lives). */
DF_API const df_vae_info *df_vae_encoder_config(const df_vae_encoder *e);

/*
 * AutoencoderKL.encode up to the posterior's parameters: image [B, in_channels, H, W] in
 * [-1, 1] (H and W multiples of scale_factor) -> moments [B, 2 * latent_channels, H / f,
 * W / f], the mean then the log variance, f32. Memory and waiting as df_vae_decode.
 * DF_E_SHAPE when the image does not fit.
 */
DF_API df_status df_vae_encode(df_ctx *ctx, const df_vae_encoder *e, df_tensor *image,
                               df_tensor **out);

/*
 * The same moments, tile by tile, as AutoencoderKL._tiled_encode does with enable_tiling():
 * when H or W is over tile_sample (0: the config's sample_size, diffusers'
 * tile_sample_min_size), the image is cut into tiles of that side starting every
 * int(0.75 * tile) pixels (the last ones smaller), each encoded alone; in row-major order
 * each tile's moments are blended in place with the already blended tile above, then the
 * one to the left, linearly over int(tile_latent / 4) latent rows / columns (tile_latent =
 * tile / scale_factor), and the first tile_latent - blend rows and columns of each are
 * kept. Images that fit in one tile are encoded whole. The blending happens on the host;
 * the memory in use is one tile's working set plus the moments. DF_E_UNSUPPORTED for a
 * tile whose stride or side is not a multiple of scale_factor, DF_E_SHAPE as df_vae_encode.
 */
DF_API df_status df_vae_encode_tiled(df_ctx *ctx, const df_vae_encoder *e, df_tensor *image,
                                     int64_t tile_sample, df_tensor **out);

/*
 * DiagonalGaussianDistribution over host moments [B, 2C, h, w] (f32) -> out [B, C, h, w]:
 * with rng, sample(generator) = mean + exp(0.5 * clamp(logvar, -30, 20)) * noise, the noise
 * drawn from rng as randn_tensor((B, C, h, w)) draws it (one draw for the batch; the
 * generator moves on); with rng NULL, mode() = the mean (retrieve_latents' "argmax").
 * DF_E_ARG for NULL pointers or sizes below 1.
 */
DF_API df_status df_vae_latent_dist(const float *moments, int64_t batch, int64_t channels,
                                    int64_t height, int64_t width, df_rng *rng, float *out);

/* In place, as the pipelines scale the encoded latents: (x - shift_factor) *
 * scaling_factor in float32. DF_E_ARG for an AutoencoderKLFlux2. */
DF_API df_status df_vae_scale_latents(const df_vae_info *info, float *latents, int64_t n);

/*
 * Flux2Pipeline._encode_vae_image after retrieve_latents(argmax): the latents [B, C, H, W]
 * (host f32, H and W even) patchified 2x2 (channel c*4 + dy*2 + dx) and normalised with the
 * VAE's batch-norm running statistics, (x - mean) / sqrt(var + eps) in float32, into out
 * [B, 4C, H/2, W/2]. DF_E_ARG for a VAE that is not an AutoencoderKLFlux2, DF_E_SHAPE for
 * odd sizes.
 */
DF_API df_status df_vae_encoder_flux2_normalize(const df_vae_encoder *e, const float *latents,
                                                int64_t batch, int64_t height, int64_t width,
                                                float *out);

/* Frees the encoder and its weights (waits for queued work that reads them). NULL is fine. */
DF_API void df_vae_encoder_free(df_vae_encoder *e);

/*
 * VaeImageProcessor.postprocess on host memory. decoded is [B, C, H, W] f32 as decode
 * returns it. _f32 writes [B, H, W, C] floats clamp(x / 2 + 0.5, 0, 1) (output_type "np");
 * _rgb8 writes [B, H, W, C] bytes round(image * 255) with the product in float32 and ties
 * to even, as numpy does (output_type "pil"); NaN becomes 0. DF_E_ARG for NULL pointers or
 * sizes below 1.
 */
DF_API df_status df_vae_postprocess_f32(const float *decoded, int64_t batch, int64_t channels,
                                        int64_t height, int64_t width, float *out);
DF_API df_status df_vae_postprocess_rgb8(const float *decoded, int64_t batch, int64_t channels,
                                         int64_t height, int64_t width, uint8_t *out);

#ifdef __cplusplus
}
#endif
#endif
