/*
 * AutoencoderKL's encoder (diffusers), and the posterior the pipelines draw latents from.
 *
 *   image [B, 3, H, W] in [-1, 1] -> encoder.conv_in (3x3)
 *     -> down_blocks.0 .. n-1: layers_per_block ResNets, then, in all but the last, a 3x3
 *        conv with stride 2 after zero padding of one row below and one column right
 *        (Downsample2D with padding 0)
 *     -> mid_block: ResNet, attention, ResNet
 *     -> conv_norm_out (GroupNorm) -> SiLU -> conv_out (3x3) to 2 * latent_channels
 *     -> quant_conv (1x1, when use_quant_conv)
 *   = the moments [B, 2 * latent_channels, H / f, W / f]: the mean, then the log variance.
 *
 * The encoder is its own object, loaded from the same vae/ folder as the decoder (df_vae),
 * binding encoder.* and quant_conv.* and skipping the decoder's tensors; a pipeline that
 * only generates never loads it. The blocks are the decoder's (vae_blocks.c); the pass ends
 * and waits after every block, as decoding does, so memory stays near one block's working
 * set.
 *
 * DiagonalGaussianDistribution runs on the host (df_vae_latent_dist): the moments are small
 * next to the image, and the noise of sample() comes from the host generator exactly as
 * torch draws it, in the order diffusers draws it relative to the pipeline's other noise.
 *
 * df_vae_encode_tiled is AutoencoderKL._tiled_encode (enable_tiling): overlapping tiles
 * encoded one at a time, their moments blended on the host in diffusers' order, in place.
 *
 * AutoencoderKLFlux2 has the same encoder, built from block_out_channels (the decoder may
 * use decoder_block_out_channels instead), and quant_conv. Flux2Pipeline takes the
 * posterior's mode, patchifies it 2x2 and normalises it with the VAE's batch-norm running
 * statistics (df_vae_encoder_flux2_normalize): those are read to the host at load, as the
 * decoder reads them.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/json.h>
#include <diffuse/ops.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/loader.h"
#include "models/model_config.h"
#include "models/vae_blocks.h"

typedef struct down_block {
    df_vae_resnet *resnets; /* layers_per_block */
    df_vae_conv downsample; /* w == NULL in the last block */
} down_block;

struct df_vae_encoder {
    df_vae_info info;
    int64_t in_channels;
    bool use_quant_conv;
    df_weight_set *ws;
    df_vae_conv conv_in;
    down_block down[DF_VAE_MAX_BLOCKS];
    df_vae_resnet mid_resnets[2];
    df_vae_attention mid_attn;
    df_vae_norm norm_out;
    df_vae_conv conv_out;   /* to 2 * latent_channels (double_z) */
    df_vae_conv quant_conv; /* w == NULL without use_quant_conv */
    /* AutoencoderKLFlux2: bn.running_mean and sqrt(bn.running_var + eps) per patchified
     * channel, in float32 as torch computes them; NULL otherwise. */
    float *bn_mean, *bn_std;
};

/* --- config ------------------------------------------------------------------------------ */

static df_status read_encoder_config(const df_json *cfg, df_vae_encoder *e)
{
    const char *src = df_json_source(cfg);
    DF_TRY(df_vae_read_config(cfg, &e->info));
    /* the decoder reads block_out_channels backwards, the encoder forwards; a FLUX.2
     * config's decoder_block_out_channels (which df_vae_read_config put in their place) are
     * not the encoder's */
    if (e->info.flux2) {
        int64_t n;
        DF_TRY(df_json_get_int_array(cfg, "block_out_channels", e->info.block_out_channels,
                                     DF_VAE_MAX_BLOCKS, &n));
        for (int i = 0; i < e->info.n_blocks; i++)
            if (e->info.block_out_channels[i] % e->info.norm_num_groups)
                return df_errorf(DF_E_FORMAT,
                                 "%s: norm_num_groups %d does not divide block_out_channels[%d]",
                                 src, e->info.norm_num_groups, i);
    }
    DF_TRY(df_json_get_int_or(cfg, "in_channels", 3, &e->in_channels));
    if (e->in_channels < 1 || e->in_channels > 64)
        return df_errorf(DF_E_FORMAT, "%s: in_channels is %lld", src, (long long)e->in_channels);
    DF_TRY(df_json_get_bool_or(cfg, "use_quant_conv", true, &e->use_quant_conv));
    DF_TRY(df_config_names_all(cfg, "down_block_types", "DownEncoderBlock2D", e->info.n_blocks,
                               "block_out_channels"));
    return DF_OK;
}

/* --- weights ----------------------------------------------------------------------------- */

static df_status bind_weights(df_vae_encoder *e)
{
    const df_vae_info *c = &e->info;
    df_weight_set *ws = e->ws;
    int64_t prev = c->block_out_channels[0], top = c->block_out_channels[c->n_blocks - 1];
    DF_TRY(df_vae_bind_conv(ws, &e->conv_in, prev, e->in_channels, 3, "encoder.conv_in"));
    char name[256];
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t out_c = c->block_out_channels[i];
        down_block *d = &e->down[i];
        d->resnets = df_calloc((size_t)c->layers_per_block + 1, sizeof *d->resnets);
        if (!d->resnets)
            return df_errorf(DF_E_OOM, "vae encoder: out of memory");
        for (int j = 0; j < c->layers_per_block; j++) {
            snprintf(name, sizeof name, "encoder.down_blocks.%d.resnets.%d", i, j);
            DF_TRY(df_vae_bind_resnet(ws, &d->resnets[j], j == 0 ? prev : out_c, out_c, name));
        }
        if (i < c->n_blocks - 1) {
            snprintf(name, sizeof name, "encoder.down_blocks.%d.downsamplers.0.conv", i);
            DF_TRY(df_vae_bind_conv(ws, &d->downsample, out_c, out_c, 3, name));
        }
        prev = out_c;
    }
    DF_TRY(df_vae_bind_resnet(ws, &e->mid_resnets[0], top, top, "encoder.mid_block.resnets.0"));
    if (c->mid_block_add_attention)
        DF_TRY(df_vae_bind_attention(ws, &e->mid_attn, top, "encoder.mid_block.attentions.0"));
    DF_TRY(df_vae_bind_resnet(ws, &e->mid_resnets[1], top, top, "encoder.mid_block.resnets.1"));
    DF_TRY(df_vae_bind_norm(ws, &e->norm_out, top, "encoder.conv_norm_out"));
    int64_t moments = 2 * c->latent_channels;
    DF_TRY(df_vae_bind_conv(ws, &e->conv_out, moments, top, 3, "encoder.conv_out"));
    if (e->use_quant_conv)
        DF_TRY(df_vae_bind_conv(ws, &e->quant_conv, moments, moments, 1, "quant_conv"));

    /* The decoder half of the checkpoint is df_vae's. */
    df_ws_ignore_prefix(ws, "decoder.");
    df_ws_ignore_prefix(ws, "post_quant_conv.");
    return df_ws_check_all_used(ws);
}

/* AutoencoderKLFlux2's bn.running_mean / running_var to the host (see struct df_vae_encoder). */
static df_status bind_batch_norm(df_ctx *ctx, df_vae_encoder *e)
{
    return df_vae_read_batch_norm(ctx, e->ws, &e->info, true, "vae encoder", &e->bn_mean,
                                  &e->bn_std);
}

df_status df_vae_encoder_load(df_ctx *ctx, const char *dir, df_vae_encoder **out)
{
    return df_vae_encoder_load_file(ctx, dir, NULL, out);
}

df_status df_vae_encoder_load_file(df_ctx *ctx, const char *dir, const char *file,
                                   df_vae_encoder **out)
{
    *out = NULL;
    if (!ctx || !dir)
        return df_errorf(DF_E_ARG, "df_vae_encoder_load: NULL %s", ctx ? "dir" : "ctx");
    df_vae_encoder *e = df_calloc(1, sizeof *e);
    if (!e)
        return df_errorf(DF_E_OOM, "vae encoder: out of memory");
    const df_json *cfg;
    df_status s = df_vae_open_weights(ctx, dir, file, &e->ws);
    if (s == DF_OK)
        s = df_weight_set_config(e->ws, &cfg);
    if (s == DF_OK)
        s = read_encoder_config(cfg, e);
    if (s == DF_OK && e->info.flux2)
        s = bind_batch_norm(ctx, e);
    if (s == DF_OK)
        s = bind_weights(e);
    if (s != DF_OK) {
        df_vae_encoder_free(e);
        return s;
    }
    *out = e;
    return DF_OK;
}

const df_vae_info *df_vae_encoder_config(const df_vae_encoder *e)
{
    return e ? &e->info : NULL;
}

df_weight_set *df_vae_encoder_weight_set(const df_vae_encoder *e)
{
    return e ? e->ws : NULL;
}

void df_vae_encoder_free(df_vae_encoder *e)
{
    if (!e)
        return;
    df_weight_set_free(e->ws); /* waits for queued kernels that read the weights */
    for (int i = 0; i < DF_VAE_MAX_BLOCKS; i++)
        df_free(e->down[i].resnets);
    df_free(e->bn_mean);
    df_free(e->bn_std);
    df_free(e);
}

/* --- forward ----------------------------------------------------------------------------- */

/* Downsample2D(padding=0): F.pad(x, (0, 1, 0, 1)), then the 3x3 conv with stride 2.
 * x: [B, C, H, W] -> [B, C, H / 2, W / 2] (H, W even) */
static df_tensor *downsample_fwd(df_ctx *ctx, const df_vae_conv *c, df_tensor *x)
{
    int64_t B = df_tensor_dim(x, 0), C = df_tensor_dim(x, 1);
    int64_t H = df_tensor_dim(x, 2), W = df_tensor_dim(x, 3);
    df_dtype dt = df_tensor_dtype(x);
    x = df_concat(ctx, x, df_zeros(ctx, dt, DF_SHAPE(B, C, H, 1)), 3);     /* [B, C, H, W+1] */
    x = df_concat(ctx, x, df_zeros(ctx, dt, DF_SHAPE(B, C, 1, W + 1)), 2); /* [B, C, H+1, W+1] */
    return df_conv2d(ctx, x, c->w, c->b, 2, 0);
}

df_status df_vae_encode(df_ctx *ctx, const df_vae_encoder *e, df_tensor *image, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_encode", ctx, e && image, out));
    const df_vae_info *c = &e->info;
    char d[96];
    int64_t f = c->scale_factor;
    if (df_tensor_ndim(image) != 4 || df_tensor_dim(image, 1) != e->in_channels ||
        df_tensor_dim(image, 2) % f || df_tensor_dim(image, 3) % f)
        return df_errorf(DF_E_SHAPE,
                         "vae encode: image %s, expected [B, %lld, H, W] with H and W "
                         "multiples of %lld",
                         df_tensor_describe(image, d, sizeof d), (long long)e->in_channels,
                         (long long)f);
    int g = c->norm_num_groups;

    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = df_vae_end_block(ctx, mark, df_vae_conv_fwd(ctx, &e->conv_in, image));
    for (int i = 0; i < c->n_blocks; i++) {
        const down_block *db = &e->down[i];
        for (int j = 0; j < c->layers_per_block; j++)
            h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &db->resnets[j], g, h));
        if (db->downsample.w)
            h = df_vae_end_block(ctx, mark, downsample_fwd(ctx, &db->downsample, h));
    }
    h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &e->mid_resnets[0], g, h));
    if (c->mid_block_add_attention)
        h = df_vae_end_block(ctx, mark, df_vae_attention_fwd(ctx, &e->mid_attn, g, h));
    h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &e->mid_resnets[1], g, h));
    h = df_silu(ctx, df_vae_norm_fwd(ctx, &e->norm_out, g, h));
    h = df_vae_conv_fwd(ctx, &e->conv_out, h); /* [B, 2 * latent, h, w] */
    if (e->quant_conv.w)
        h = df_vae_conv_fwd(ctx, &e->quant_conv, h);
    h = df_vae_end_block(ctx, mark, h);
    return df_vae_finish(ctx, h, out);
}

/* --- tiled encoding (AutoencoderKL._tiled_encode) ------------------------------------------ */

/* One tile's moments on the host, [B, C, h, w]. */
typedef struct tile {
    int64_t h, w;
    float *m;
} tile;

/* blend_v: b's first rows go over from a's last ones to b's own (same width), in float32 as
 * torch multiplies a float32 tensor by a Python float. */
static void blend_v(const tile *a, tile *b, int64_t BC, int64_t extent)
{
    extent = extent < a->h ? extent : a->h;
    extent = extent < b->h ? extent : b->h;
    for (int64_t y = 0; y < extent; y++) {
        float wa = (float)(1.0 - (double)y / extent), wb = (float)((double)y / extent);
        for (int64_t c = 0; c < BC; c++)
            for (int64_t x = 0; x < b->w; x++) {
                float *to = b->m + (c * b->h + y) * b->w + x;
                *to = a->m[(c * a->h + a->h - extent + y) * a->w + x] * wa + *to * wb;
            }
    }
}

/* blend_h: b's first columns from a's last ones (same height). */
static void blend_h(const tile *a, tile *b, int64_t BC, int64_t extent)
{
    extent = extent < a->w ? extent : a->w;
    extent = extent < b->w ? extent : b->w;
    for (int64_t x = 0; x < extent; x++) {
        float wa = (float)(1.0 - (double)x / extent), wb = (float)((double)x / extent);
        for (int64_t c = 0; c < BC; c++)
            for (int64_t y = 0; y < b->h; y++) {
                float *to = b->m + (c * b->h + y) * b->w + x;
                *to = a->m[(c * a->h + y) * a->w + a->w - extent + x] * wa + *to * wb;
            }
    }
}

/* Encodes image[:, :, y0:y0+th, x0:x0+tw] into t (host). */
static df_status encode_tile(df_ctx *ctx, const df_vae_encoder *e, df_tensor *image, int64_t y0,
                             int64_t th, int64_t x0, int64_t tw, tile *t)
{
    df_scope mark = df_scope_begin(ctx);
    df_tensor *part = df_slice(ctx, df_slice(ctx, image, 2, y0, y0 + th), 3, x0, x0 + tw);
    df_tensor *m = NULL;
    df_status s = part ? df_vae_encode(ctx, e, df_contiguous(ctx, part), &m) : df_ctx_status(ctx);
    if (s == DF_OK) {
        int64_t n = df_tensor_numel(m);
        t->h = df_tensor_dim(m, 2), t->w = df_tensor_dim(m, 3);
        t->m = df_malloc((size_t)n * sizeof *t->m);
        s = t->m ? df_tensor_read(ctx, m, DF_DTYPE_F32, t->m, (size_t)n * sizeof *t->m)
                 : df_errorf(DF_E_OOM, "out of memory for a tile's moments");
    }
    df_scope_end(ctx, mark, NULL);
    return s;
}

df_status df_vae_encode_tiled(df_ctx *ctx, const df_vae_encoder *e, df_tensor *image,
                              int64_t tile_sample, df_tensor **out)
{
    *out = NULL;
    if (!ctx || !e || !image)
        return df_errorf(DF_E_ARG, "df_vae_encode_tiled: NULL argument");
    int64_t f = e->info.scale_factor, T = tile_sample ? tile_sample : e->info.sample_size;
    if (df_tensor_ndim(image) != 4 ||
        (df_tensor_dim(image, 2) <= T && df_tensor_dim(image, 3) <= T))
        return df_vae_encode(ctx, e, image, out);       /* one tile (or a shape it refuses) */
    int64_t stride = (int64_t)((double)T * (1 - 0.25)); /* overlap_size */
    int64_t TL = T / f, extent = (int64_t)((double)TL * 0.25), keep = TL - extent;
    if (T <= 0 || T % f || stride % f || stride < 1)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vae encode: tiles of %lld pixels (a stride of %lld) "
                         "are not whole latents of %lld pixels",
                         (long long)T, (long long)stride, (long long)f);
    int64_t B = df_tensor_dim(image, 0), H = df_tensor_dim(image, 2), W = df_tensor_dim(image, 3);
    int64_t C2 = 2 * e->info.latent_channels, BC = B * C2;
    int64_t rows = (H + stride - 1) / stride, cols = (W + stride - 1) / stride;
    tile *tiles = df_calloc((size_t)(rows * cols), sizeof *tiles);
    if (!tiles)
        return df_errorf(DF_E_OOM, "out of memory for %lld tiles", (long long)(rows * cols));
    df_status s = DF_OK;
    for (int64_t i = 0; s == DF_OK && i < rows; i++)
        for (int64_t j = 0; s == DF_OK && j < cols; j++) {
            int64_t y0 = i * stride, x0 = j * stride;
            s = encode_tile(ctx, e, image, y0, (H - y0 < T ? H - y0 : T), x0,
                            (W - x0 < T ? W - x0 : T), &tiles[i * cols + j]);
        }
    int64_t Ho = 0, Wo = 0; /* the kept rows of the first column, columns of the first row */
    for (int64_t i = 0; s == DF_OK && i < rows; i++)
        Ho += tiles[i * cols].h < keep ? tiles[i * cols].h : keep;
    for (int64_t j = 0; s == DF_OK && j < cols; j++)
        Wo += tiles[j].w < keep ? tiles[j].w : keep;
    float *m = s == DF_OK ? df_malloc((size_t)(BC * Ho * Wo) * sizeof *m) : NULL;
    if (s == DF_OK && !m)
        s = df_errorf(DF_E_OOM, "out of memory for the moments");
    for (int64_t i = 0, oy = 0; s == DF_OK && i < rows; i++) {
        int64_t kh = 0;
        for (int64_t j = 0, ox = 0; j < cols; j++) {
            tile *t = &tiles[i * cols + j];
            if (i > 0) /* in place: the tiles above and to the left are already blended */
                blend_v(&tiles[(i - 1) * cols + j], t, BC, extent);
            if (j > 0)
                blend_h(&tiles[i * cols + j - 1], t, BC, extent);
            kh = t->h < keep ? t->h : keep;
            int64_t kw = t->w < keep ? t->w : keep;
            for (int64_t c = 0; c < BC; c++)
                for (int64_t y = 0; y < kh; y++)
                    memcpy(m + (c * Ho + oy + y) * Wo + ox, t->m + (c * t->h + y) * t->w,
                           (size_t)kw * sizeof *m);
            ox += kw;
        }
        oy += kh;
    }
    if (s == DF_OK) {
        *out = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, C2, Ho, Wo), m);
        s = *out ? DF_OK : df_ctx_status(ctx);
    }
    for (int64_t i = 0; i < rows * cols; i++)
        df_free(tiles[i].m);
    df_free(tiles);
    df_free(m);
    return s;
}

/* --- the posterior ----------------------------------------------------------------------- */

df_status df_vae_latent_dist(const float *moments, int64_t batch, int64_t channels, int64_t height,
                             int64_t width, df_rng *rng, float *out)
{
    if (!moments || !out || batch < 1 || channels < 1 || height < 1 || width < 1)
        return df_errorf(DF_E_ARG, "df_vae_latent_dist: NULL pointer or a size below 1");
    int64_t per = channels * height * width, n = batch * per;
    if (rng) /* sample(): randn_tensor(mean.shape, generator) in one draw for the batch */
        DF_TRY(df_rng_randn_f32(rng, out, n));
    for (int64_t b = 0; b < batch; b++) {
        const float *mean = moments + b * 2 * per, *logvar = mean + per;
        float *o = out + b * per;
        for (int64_t i = 0; i < per; i++) {
            if (!rng) { /* mode(): the mean */
                o[i] = mean[i];
                continue;
            }
            float lv = fminf(fmaxf(logvar[i], -30.0f), 20.0f);
            float std = expf(0.5f * lv);
            o[i] = mean[i] + std * o[i];
        }
    }
    return DF_OK;
}

df_status df_vae_scale_latents(const df_vae_info *info, float *latents, int64_t n)
{
    if (!info || (!latents && n > 0))
        return df_errorf(DF_E_ARG, "df_vae_scale_latents: NULL argument");
    if (info->flux2)
        return df_errorf(DF_E_ARG, "df_vae_scale_latents: an AutoencoderKLFlux2 has no "
                                   "scaling or shift factor");
    float shift = (float)info->shift_factor, scale = (float)info->scaling_factor;
    for (int64_t i = 0; i < n; i++)
        latents[i] = (latents[i] - shift) * scale;
    return DF_OK;
}

df_status df_vae_encoder_flux2_normalize(const df_vae_encoder *e, const float *latents,
                                         int64_t batch, int64_t height, int64_t width, float *out)
{
    if (!e || !latents || !out || batch < 1 || height < 2 || width < 2)
        return df_errorf(DF_E_ARG, "df_vae_encoder_flux2_normalize: NULL pointer or a size "
                                   "below 1 (2 for height and width)");
    if (!e->info.flux2)
        return df_errorf(DF_E_ARG, "df_vae_encoder_flux2_normalize: the VAE is not an "
                                   "AutoencoderKLFlux2 (it has no batch-norm statistics)");
    if (height % 2 || width % 2)
        return df_errorf(DF_E_SHAPE, "FLUX.2 latents %lldx%lld: patchifying needs even sizes",
                         (long long)height, (long long)width);
    int64_t C = e->info.latent_channels, h = height / 2, w = width / 2;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < height; y++)
                for (int64_t x = 0; x < width; x++) {
                    int64_t pc = c * 4 + (y % 2) * 2 + x % 2; /* _patchify_latents */
                    float v = latents[((b * C + c) * height + y) * width + x];
                    out[((b * 4 * C + pc) * h + y / 2) * w + x / 2] =
                        (v - e->bn_mean[pc]) / e->bn_std[pc];
                }
    return DF_OK;
}
