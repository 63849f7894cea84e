/*
 * AutoencoderKL's and AutoencoderKLFlux2's decoder (diffusers), built from vae/config.json.
 *
 *   z -> post_quant_conv (1x1, when use_post_quant_conv) -> decoder.conv_in (3x3)
 *     -> mid_block: ResNet, attention (one head of width C, residual), ResNet
 *     -> up_blocks.0 .. up_blocks.n-1 (0 = lowest resolution): layers_per_block + 1 ResNets,
 *        then, in all but the last, nearest 2x upsampling and a 3x3 conv
 *     -> conv_norm_out (GroupNorm) -> SiLU -> conv_out (3x3)
 *
 * AutoencoderKLFlux2 has the same decoder (built from decoder_block_out_channels when its
 * config has them) with post_quant_conv, plus a BatchNorm2d over the 2x2-patchified
 * latents whose running statistics the pipeline uses to de-normalise its latents before
 * decoding: they are read to the host at load (df_vae_bn_denormalize); the layout steps
 * around it live in vae_flux2.c.
 *
 * Every GroupNorm uses norm_num_groups groups and eps 1e-6; a ResNet has a 1x1
 * conv_shortcut where it changes the channel count. The up blocks walk block_out_channels
 * backwards, as diffusers' Decoder does.
 *
 * Loading binds decoder.* and post_quant_conv.* by their checkpoint names. A full
 * AutoencoderKL checkpoint also holds the encoder (encoder.*, quant_conv.*): those tensors
 * are skipped explicitly, and any other tensor the config does not call for is an error.
 * The config is checked as a whole before any weight is bound or any block allocated, so
 * an impossible one (no blocks, a group count that does not divide a channel count, ...)
 * fails with one message naming the key.
 *
 * Decoding keeps one scope open and ends it after every block, keeping only the block's
 * output, then waits for the block to run (df_vae_end_block): strict eager mode allocates an
 * op's output when the op is queued, so this wait is what keeps the memory in use near
 * one block's working set instead of the whole decoder's (a ResNet does the same after each
 * of its ops, vae_blocks.c).
 *
 * df_vae_decode_auto, what the pipelines call, decodes whole or tiled by the memory there
 * is: it estimates the whole decode's peak from the latent size and the widths, stage by
 * stage as the code above keeps activations alive (df_vae_decode_bytes), and tiles when
 * that exceeds df_memory_available(), with the largest tile that fits.
 *
 * Tiled decoding (df_vae_decode_tiled) is our own scheme, not diffusers' exact one: tiles
 * of a fixed latent size on a fixed stride (size - overlap), the last one of a row or
 * column cut short at the edge; each tile decoded alone; neighbours blended linearly over
 * the overlap, with weight (i + 0.5) / E for the later tile at pixel i of an E-pixel
 * overlap (diffusers uses i / E and crops instead). Each pixel lies in at most two tiles
 * per axis (tile >= 2 * overlap), so the blend is a pair of separable 1-D ramps, done
 * with slices, elementwise ops and concatenation on the device. The default, 64-latent
 * tiles (512 pixels) overlapping by 16 (a 128-pixel blend), cuts a 1024x1024 image into
 * 3 x 3 tiles, each with about a quarter of the whole image's working set.
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
#include "models/weight_sets.h"
#include "models/vae_blocks.h"

#define MAX_LAYERS_PER_BLOCK 64
#define MAX_CHANNELS         (1 << 16)

typedef struct up_block {
    df_vae_resnet *resnets; /* layers_per_block + 1 */
    df_vae_conv upsample;   /* w == NULL in the last block */
} up_block;

struct df_vae {
    df_vae_info info;
    df_weight_set *ws;
    df_vae_conv post_quant_conv; /* w == NULL when the config has none */
    df_vae_conv conv_in;
    df_vae_resnet mid_resnets[2];
    df_vae_attention mid_attn;
    up_block up[DF_VAE_MAX_BLOCKS];
    df_vae_norm norm_out;
    df_vae_conv conv_out;
    /* AutoencoderKLFlux2: bn.running_mean and sqrt(bn.running_var + eps) per patchified
     * channel, computed once at load in float32 as torch does; NULL otherwise. */
    float *bn_mean, *bn_std;
};

/* --- config ------------------------------------------------------------------------------ */

/* AutoencoderKLFlux2's decoder_block_out_channels (diffusers 0.42): null, absent or empty
 * means the encoder's block_out_channels (diffusers builds the decoder from
 * `decoder_block_out_channels or block_out_channels`); otherwise as many entries, which the
 * decoder is built from. */
static df_status read_decoder_channels(const df_json *cfg, df_vae_info *info)
{
    const df_json *dec = df_json_get(cfg, "decoder_block_out_channels");
    if (df_json_is_null(dec) ||
        (df_json_type_of(dec) == DF_JSON_ARRAY && df_json_array_size(dec) == 0))
        return DF_OK;
    int64_t n;
    DF_TRY(df_json_get_int_array(cfg, "decoder_block_out_channels", info->block_out_channels,
                                 DF_VAE_MAX_BLOCKS, &n));
    if (n != info->n_blocks)
        return df_errorf(DF_E_FORMAT,
                         "%s: decoder_block_out_channels has %lld entries but "
                         "block_out_channels has %d",
                         df_json_source(cfg), (long long)n, info->n_blocks);
    return DF_OK;
}

/* AutoencoderKLFlux2's BatchNorm2d over the 2x2-patchified latents: batch_norm_eps, and a
 * patch_size of [2, 2], the only one the FLUX.2 pipelines (un)patchify with. There is no
 * scaling_factor or shift_factor: unscaling is the identity. */
static df_status read_batch_norm(const df_json *cfg, df_vae_info *info)
{
    const char *src = df_json_source(cfg);
    DF_TRY(df_json_get_double_or(cfg, "batch_norm_eps", 1e-4, &info->batch_norm_eps));
    if (!(info->batch_norm_eps >= 0))
        return df_errorf(DF_E_FORMAT, "%s: batch_norm_eps is %g (expected >= 0)", src,
                         info->batch_norm_eps);
    if (!df_json_is_null(df_json_get(cfg, "patch_size"))) {
        int64_t patch[2] = {0, 0}, n;
        DF_TRY(df_json_get_int_array(cfg, "patch_size", patch, 2, &n));
        if (n != 2 || patch[0] != 2 || patch[1] != 2)
            return df_errorf(DF_E_UNSUPPORTED,
                             "%s: patch_size is [%lld, %lld]; only [2, 2] is implemented (the "
                             "FLUX.2 pipelines patchify latents 2x2)",
                             src, (long long)patch[0], (long long)patch[1]);
    }
    info->bn_channels = 4 * info->latent_channels;
    info->scaling_factor = 1.0;
    info->shift_factor = 0.0;
    return DF_OK;
}

df_status df_vae_read_config(const df_json *cfg, df_vae_info *info)
{
    const char *src = df_json_source(cfg);
    const char *cls;
    DF_TRY(df_json_get_string_or(cfg, "_class_name", "AutoencoderKL", &cls));
    info->flux2 = strcmp(cls, "AutoencoderKLFlux2") == 0;
    if (strcmp(cls, "AutoencoderKL") != 0 && !info->flux2)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: class %s is not implemented (the VAE decoder "
                         "reads AutoencoderKL and AutoencoderKLFlux2)",
                         src, cls);
    const char *act;
    DF_TRY(df_json_get_string_or(cfg, "act_fn", "silu", &act));
    if (strcmp(act, "silu") != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s: act_fn '%s' is not supported (only silu)", src,
                         act);

    int64_t n_blocks, v;
    DF_TRY(df_json_get_int_array(cfg, "block_out_channels", info->block_out_channels,
                                 DF_VAE_MAX_BLOCKS, &n_blocks));
    if (n_blocks < 1)
        return df_errorf(DF_E_FORMAT, "%s: block_out_channels is empty", src);
    info->n_blocks = (int)n_blocks;
    info->scale_factor = (int64_t)1 << (n_blocks - 1);
    if (info->flux2)
        DF_TRY(read_decoder_channels(cfg, info));

    DF_TRY(df_json_get_int_or(cfg, "latent_channels", 4, &info->latent_channels));
    DF_TRY(df_json_get_int_or(cfg, "out_channels", 3, &info->out_channels));
    DF_TRY(df_json_get_int_or(cfg, "layers_per_block", 1, &v));
    if (v < 0 || v > MAX_LAYERS_PER_BLOCK)
        return df_errorf(DF_E_FORMAT, "%s: layers_per_block is %lld (expected 0 to %d)", src,
                         (long long)v, MAX_LAYERS_PER_BLOCK);
    info->layers_per_block = (int)v;
    DF_TRY(df_json_get_int_or(cfg, "norm_num_groups", 32, &v));
    if (v < 1 || v > MAX_CHANNELS)
        return df_errorf(DF_E_FORMAT, "%s: norm_num_groups is %lld (expected at least 1)", src,
                         (long long)v);
    info->norm_num_groups = (int)v;

    if (info->latent_channels < 1 || info->latent_channels > MAX_CHANNELS)
        return df_errorf(DF_E_FORMAT, "%s: latent_channels is %lld", src,
                         (long long)info->latent_channels);
    if (info->out_channels < 1 || info->out_channels > MAX_CHANNELS)
        return df_errorf(DF_E_FORMAT, "%s: out_channels is %lld", src,
                         (long long)info->out_channels);
    for (int i = 0; i < info->n_blocks; i++) {
        int64_t c = info->block_out_channels[i];
        if (c < 1 || c > MAX_CHANNELS)
            return df_errorf(DF_E_FORMAT, "%s: block_out_channels[%d] is %lld", src, i,
                             (long long)c);
        if (c % info->norm_num_groups)
            return df_errorf(DF_E_FORMAT,
                             "%s: norm_num_groups %d does not divide "
                             "block_out_channels[%d] = %lld",
                             src, info->norm_num_groups, i, (long long)c);
    }

    /* Only UpDecoderBlock2D exists for AutoencoderKL; absent means all of them. */
    DF_TRY(df_config_names_all(cfg, "up_block_types", "UpDecoderBlock2D", n_blocks,
                               "block_out_channels"));

    DF_TRY(
        df_json_get_bool_or(cfg, "mid_block_add_attention", true, &info->mid_block_add_attention));
    DF_TRY(df_json_get_bool_or(cfg, "use_post_quant_conv", true, &info->use_post_quant_conv));
    /* the tiled encoder's tile side (diffusers' tile_sample_min_size): a number, or a list
     * whose first entry counts; diffusers' default 32 */
    const df_json *ss = df_json_get(cfg, "sample_size");
    if (df_json_type_of(ss) == DF_JSON_ARRAY && df_json_array_size(ss) > 0)
        ss = df_json_array_get(ss, 0);
    info->sample_size = 32;
    if (ss && !df_json_is_null(ss))
        DF_TRY_CTX(df_json_to_int(ss, &info->sample_size), "%s: sample_size", src);
    if (info->flux2)
        return read_batch_norm(cfg, info);
    DF_TRY(df_json_get_double_or(cfg, "scaling_factor", 0.18215, &info->scaling_factor));
    DF_TRY(df_json_get_double_or(cfg, "shift_factor", 0.0, &info->shift_factor));
    if (info->scaling_factor == 0)
        return df_errorf(DF_E_FORMAT, "%s: scaling_factor is 0", src);
    return DF_OK;
}

/* --- weights ----------------------------------------------------------------------------- */

/* bn.running_mean and bn.running_var [4 * latent_channels], read to the host once: the
 * pipeline's de-normalisation uses them on every decode, and the std needs a square root
 * (std = sqrt(var + eps) in float32, as the pipeline computes it in the VAE's dtype). The
 * step counter bn.num_batches_tracked is not used. */
static df_status bind_batch_norm(df_ctx *ctx, df_vae *vae)
{
    return df_vae_read_batch_norm(ctx, vae->ws, &vae->info, false, "vae", &vae->bn_mean,
                                  &vae->bn_std);
}

static df_status bind_weights(df_ctx *ctx, df_vae *vae)
{
    const df_vae_info *c = &vae->info;
    df_weight_set *ws = vae->ws;
    int64_t top = c->block_out_channels[c->n_blocks - 1];
    if (c->use_post_quant_conv)
        DF_TRY(df_vae_bind_conv(ws, &vae->post_quant_conv, c->latent_channels, c->latent_channels,
                                1, "post_quant_conv"));
    DF_TRY(df_vae_bind_conv(ws, &vae->conv_in, top, c->latent_channels, 3, "decoder.conv_in"));
    DF_TRY(df_vae_bind_resnet(ws, &vae->mid_resnets[0], top, top, "decoder.mid_block.resnets.0"));
    if (c->mid_block_add_attention)
        DF_TRY(df_vae_bind_attention(ws, &vae->mid_attn, top, "decoder.mid_block.attentions.0"));
    DF_TRY(df_vae_bind_resnet(ws, &vae->mid_resnets[1], top, top, "decoder.mid_block.resnets.1"));

    int64_t prev = top;
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t out_c = c->block_out_channels[c->n_blocks - 1 - i];
        up_block *u = &vae->up[i];
        u->resnets = df_calloc((size_t)c->layers_per_block + 1, sizeof *u->resnets);
        if (!u->resnets)
            return df_errorf(DF_E_OOM, "vae: out of memory");
        char name[256];
        for (int j = 0; j <= c->layers_per_block; j++) {
            snprintf(name, sizeof name, "decoder.up_blocks.%d.resnets.%d", i, j);
            DF_TRY(df_vae_bind_resnet(ws, &u->resnets[j], j == 0 ? prev : out_c, out_c, name));
        }
        if (i < c->n_blocks - 1) {
            snprintf(name, sizeof name, "decoder.up_blocks.%d.upsamplers.0.conv", i);
            DF_TRY(df_vae_bind_conv(ws, &u->upsample, out_c, out_c, 3, name));
        }
        prev = out_c;
    }
    DF_TRY(df_vae_bind_norm(ws, &vae->norm_out, c->block_out_channels[0], "decoder.conv_norm_out"));
    DF_TRY(df_vae_bind_conv(ws, &vae->conv_out, c->out_channels, c->block_out_channels[0], 3,
                            "decoder.conv_out"));

    if (c->flux2)
        DF_TRY(bind_batch_norm(ctx, vae));

    /* The encoder half of the checkpoint is not ours to bind. */
    df_ws_ignore_prefix(ws, "encoder.");
    df_ws_ignore_prefix(ws, "quant_conv.");
    return df_ws_check_all_used(ws);
}

df_status df_vae_load(df_ctx *ctx, const char *dir, df_vae **out)
{
    return df_vae_load_file(ctx, dir, NULL, out);
}

df_status df_vae_load_file(df_ctx *ctx, const char *dir, const char *file, df_vae **out)
{
    *out = NULL;
    if (!ctx || !dir)
        return df_errorf(DF_E_ARG, "df_vae_load: NULL %s", ctx ? "dir" : "ctx");
    df_vae *vae = df_calloc(1, sizeof *vae);
    if (!vae)
        return df_errorf(DF_E_OOM, "vae: out of memory");
    const df_json *cfg;
    df_status s = df_vae_open_weights(ctx, dir, file, &vae->ws);
    if (s == DF_OK)
        s = df_weight_set_config(vae->ws, &cfg);
    if (s == DF_OK)
        s = df_vae_read_config(cfg, &vae->info);
    if (s == DF_OK)
        s = bind_weights(ctx, vae);
    if (s != DF_OK) {
        df_vae_free(vae);
        return s;
    }
    *out = vae;
    return DF_OK;
}

const df_vae_info *df_vae_config(const df_vae *vae)
{
    return vae ? &vae->info : NULL;
}

df_weight_set *df_vae_weight_set(const df_vae *vae)
{
    return vae ? vae->ws : NULL;
}

void df_vae_free(df_vae *vae)
{
    if (!vae)
        return;
    df_weight_set_free(vae->ws); /* waits for queued kernels that read the weights */
    for (int i = 0; i < DF_VAE_MAX_BLOCKS; i++)
        df_free(vae->up[i].resnets);
    df_free(vae->bn_mean);
    df_free(vae->bn_std);
    df_free(vae);
}

/* --- forward ----------------------------------------------------------------------------- */

df_status df_vae_decode(df_ctx *ctx, const df_vae *vae, df_tensor *latents, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_decode", ctx, vae && latents, out));
    const df_vae_info *c = &vae->info;
    char d[96];
    if (df_tensor_ndim(latents) != 4 || df_tensor_dim(latents, 1) != c->latent_channels)
        return df_errorf(DF_E_SHAPE, "vae decode: latents %s, expected [B, %lld, h, w]",
                         df_tensor_describe(latents, d, sizeof d), (long long)c->latent_channels);
    int g = c->norm_num_groups;

    /* One scope for the whole decode, ended after every block (see df_vae_end_block). */
    df_scope mark = df_scope_begin(ctx);
    df_tensor *h = latents;
    if (vae->post_quant_conv.w)
        h = df_vae_conv_fwd(ctx, &vae->post_quant_conv, h);
    h = df_vae_end_block(ctx, mark, df_vae_conv_fwd(ctx, &vae->conv_in, h)); /* [B, C_top, h, w] */

    h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &vae->mid_resnets[0], g, h));
    if (c->mid_block_add_attention)
        h = df_vae_end_block(ctx, mark, df_vae_attention_fwd(ctx, &vae->mid_attn, g, h));
    h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &vae->mid_resnets[1], g, h));

    for (int i = 0; i < c->n_blocks; i++) {
        const up_block *u = &vae->up[i];
        for (int j = 0; j <= c->layers_per_block; j++)
            h = df_vae_end_block(ctx, mark, df_vae_resnet_fwd(ctx, &u->resnets[j], g, h));
        if (u->upsample.w) {
            df_tensor *up = df_upsample_nearest2x(ctx, h); /* [B, C, 2H, 2W] */
            h = df_vae_end_block(ctx, mark, df_vae_conv_fwd(ctx, &u->upsample, up));
        }
    }

    h = df_silu(ctx, df_vae_norm_fwd(ctx, &vae->norm_out, g, h));
    h = df_vae_end_block(ctx, mark, df_vae_conv_fwd(ctx, &vae->conv_out, h)); /* [B, 3, H, W] */
    return df_vae_finish(ctx, h, out);
}

/* --- tiled decoding ---------------------------------------------------------------------- */

#define DEFAULT_TILE    64
#define DEFAULT_OVERLAP 16

/* a and b overlap by e entries along dim (a's last e, b's first e): the result keeps a's
 * head, the linear blend a + (b - a) * ramp over the overlap, then b's tail. */
static df_tensor *join(df_ctx *ctx, df_tensor *a, df_tensor *b, int dim, int64_t e, df_tensor *ramp)
{
    if (e == 0)
        return df_concat(ctx, a, b, dim);
    int64_t la = df_tensor_dim(a, dim), lb = df_tensor_dim(b, dim);
    df_tensor *a_tail = df_slice(ctx, a, dim, la - e, la);
    df_tensor *mix = df_sub(ctx, df_slice(ctx, b, dim, 0, e), a_tail);
    mix = df_add(ctx, a_tail, df_mul(ctx, mix, ramp));
    df_tensor *head = df_concat(ctx, df_slice(ctx, a, dim, 0, la - e), mix, dim);
    return df_concat(ctx, head, df_slice(ctx, b, dim, e, lb), dim);
}

/* The blend weights of the later tile, (i + 0.5) / e, shaped to broadcast along dim. */
static df_tensor *make_ramp(df_ctx *ctx, int64_t e, int dim)
{
    if (e == 0)
        return NULL;
    float *r = df_malloc((size_t)e * sizeof *r);
    if (!r) {
        df_errorf(DF_E_OOM, "vae: out of memory");
        return NULL;
    }
    for (int64_t i = 0; i < e; i++)
        r[i] = (float)(((double)i + 0.5) / (double)e);
    int64_t shape[4] = {1, 1, 1, 1};
    shape[dim] = e;
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, 4, r);
    df_free(r);
    return t;
}

/* Tiles along an axis of length n: start k * stride, length min(tile, n - start). */
static int64_t tile_count(int64_t n, int64_t tile, int64_t stride)
{
    return n <= tile ? 1 : 1 + (n - tile + stride - 1) / stride;
}

df_status df_vae_decode_tiled(df_ctx *ctx, const df_vae *vae, df_tensor *latents,
                              int64_t tile_latent, int64_t overlap_latent, df_tensor **out)
{
    *out = NULL;
    if (!ctx || !vae || !latents)
        return df_errorf(DF_E_ARG, "df_vae_decode_tiled: NULL argument");
    if (tile_latent == 0)
        tile_latent = DEFAULT_TILE;
    if (overlap_latent == 0)
        overlap_latent = tile_latent >= 2 * DEFAULT_OVERLAP ? DEFAULT_OVERLAP : tile_latent / 4;
    if (tile_latent < 1 || overlap_latent < 0 || tile_latent < 2 * overlap_latent)
        return df_errorf(DF_E_ARG,
                         "vae tiled decode: tile %lld and overlap %lld latents "
                         "(need tile >= 1 and 0 <= 2 * overlap <= tile)",
                         (long long)tile_latent, (long long)overlap_latent);
    if (df_tensor_ndim(latents) != 4)
        return df_vae_decode(ctx, vae, latents, out); /* reports the shape */
    int64_t h = df_tensor_dim(latents, 2), w = df_tensor_dim(latents, 3);
    if (h <= tile_latent && w <= tile_latent)
        return df_vae_decode(ctx, vae, latents, out);

    int64_t stride = tile_latent - overlap_latent;
    int64_t ny = tile_count(h, tile_latent, stride), nx = tile_count(w, tile_latent, stride);
    int64_t e = overlap_latent * vae->info.scale_factor; /* overlap in pixels */

    /* Marks are reused as in df_vae_decode: each end releases the superseded strip or
     * image along with the tile's temporaries. */
    df_scope outer = df_scope_begin(ctx);
    df_tensor *ramp_y = make_ramp(ctx, e, 2), *ramp_x = make_ramp(ctx, e, 3);
    df_tensor *image = NULL;
    df_status s = df_ctx_status(ctx);
    if (s == DF_OK && e && (!ramp_y || !ramp_x))
        s = DF_E_OOM; /* make_ramp's allocation failed */
    for (int64_t ty = 0; ty < ny && s == DF_OK; ty++) {
        int64_t y0 = ty * stride, y1 = y0 + tile_latent < h ? y0 + tile_latent : h;
        df_scope row = df_scope_begin(ctx);
        df_tensor *strip = NULL;
        for (int64_t tx = 0; tx < nx && s == DF_OK; tx++) {
            int64_t x0 = tx * stride, x1 = x0 + tile_latent < w ? x0 + tile_latent : w;
            df_tensor *z = df_slice(ctx, df_slice(ctx, latents, 2, y0, y1), 3, x0, x1);
            df_tensor *tile = NULL;
            s = z ? df_vae_decode(ctx, vae, z, &tile) : df_ctx_status(ctx);
            if (s == DF_OK)
                strip = strip ? join(ctx, strip, tile, 3, e, ramp_x) : tile;
            strip = df_scope_end(ctx, row, s == DF_OK ? strip : NULL);
        }
        if (s == DF_OK)
            image = image ? join(ctx, image, strip, 2, e, ramp_y) : strip;
        df_scope_end_n(ctx, outer, (df_tensor *[]){ramp_y, ramp_x, s == DF_OK ? image : NULL}, 3);
    }
    image = df_scope_end(ctx, outer, s == DF_OK ? image : NULL);
    if (s != DF_OK)
        return s;
    return df_vae_finish(ctx, image, out);
}

/* --- choosing how to decode ------------------------------------------------------------- */

/* A ResNet of vae_blocks.c at `px` pixels: x with two others of its stages alive (the norm
 * and SiLU of x, or x, the second conv's output, the shortcut and the sum). */
static int64_t resnet_live(int64_t cin, int64_t cout, int64_t px)
{
    int64_t a = 3 * cin, b = cin + 3 * cout;
    return (a > b ? a : b) * px;
}

int64_t df_vae_decode_bytes(const df_vae *vae, int64_t batch, int64_t h, int64_t w)
{
    if (!vae || batch < 1 || h < 1 || w < 1)
        return 0;
    const df_vae_info *c = &vae->info;
    int64_t top = c->block_out_channels[c->n_blocks - 1], px = h * w, peak = 0, v;
#define TAKE(x) (v = (x), peak = v > peak ? v : peak)
    TAKE((2 * c->latent_channels + top) * px); /* post_quant_conv, conv_in */
    TAKE(resnet_live(top, top, px));           /* the mid block's ResNets */
    TAKE(8 * top * px);                        /* its attention: x, norm, q, k, v, ... */
    int64_t prev = top;
    for (int i = 0; i < c->n_blocks; i++) {
        int64_t out_c = c->block_out_channels[c->n_blocks - 1 - i];
        TAKE(resnet_live(prev, out_c, px));
        if (vae->up[i].upsample.w) {
            TAKE(9 * out_c * px); /* x, upsampled, conv: 1 + 4 + 4 */
            px *= 4;
        }
        prev = out_c;
    }
    TAKE((3 * prev + c->out_channels) * px); /* x, norm, SiLU, conv_out */
#undef TAKE
    int64_t weights = 0;
    for (int i = 0; i < df_ws_bound_count(vae->ws); i++) {
        const char *name;
        weights += df_tensor_numel(df_ws_bound(vae->ws, i, &name));
    }
    /* a quarter more for what RSS holds beyond live tensors: the checkpoint's own pages,
     * the allocator's rounding and its cached blocks */
    return (batch * peak + weights) * (int64_t)sizeof(float) * 5 / 4;
}

/* What the tiled decode holds besides a tile: the image, a row of tiles and their blends. */
static int64_t tiled_bytes(const df_vae *vae, int64_t batch, int64_t h, int64_t w, int64_t tile)
{
    int64_t f = vae->info.scale_factor;
    int64_t image = batch * vae->info.out_channels * h * f * w * f * (int64_t)sizeof(float);
    return df_vae_decode_bytes(vae, batch, h < tile ? h : tile, w < tile ? w : tile) + 4 * image;
}

static double gib(int64_t bytes)
{
    return (double)bytes / (double)(1 << 30);
}

df_status df_vae_decode_auto(df_ctx *ctx, const df_vae *vae, df_tensor *latents, bool tiled,
                             df_tensor **out)
{
    *out = NULL;
    if (!ctx || !vae || !latents)
        return df_errorf(DF_E_ARG, "df_vae_decode_auto: NULL argument");
    DF_TRY(df_empty_cache(ctx));
    if (tiled)
        return df_vae_decode_tiled(ctx, vae, latents, 64, 8, out);
    if (df_tensor_ndim(latents) != 4)
        return df_vae_decode(ctx, vae, latents, out); /* reports the shape */
    int64_t B = df_tensor_dim(latents, 0), h = df_tensor_dim(latents, 2);
    int64_t w = df_tensor_dim(latents, 3), f = vae->info.scale_factor;
    int64_t need = df_vae_decode_bytes(vae, B, h, w), avail = df_memory_available();
    if (avail < 0 || need <= avail) {
        df_logf(2, "decode: %lld x %lld whole, needs %.2f GiB, %.2f GiB available",
                (long long)(w * f), (long long)(h * f), gib(need), gib(avail));
        return df_vae_decode(ctx, vae, latents, out);
    }
    int64_t tile = 64;
    while (tile > 16 && tiled_bytes(vae, B, h, w, tile) > avail)
        tile /= 2;
    df_logf(1,
            "decode: %lld x %lld tiled (%lld-latent tiles), needs %.2f GiB whole, %.2f GiB "
            "tiled, %.2f GiB available",
            (long long)(w * f), (long long)(h * f), (long long)tile, gib(need),
            gib(tiled_bytes(vae, B, h, w, tile)), gib(avail));
    return df_vae_decode_tiled(ctx, vae, latents, tile, tile / 8, out);
}

/* --- latent layout and scaling ----------------------------------------------------------- */

df_status df_vae_unpack_latents(df_ctx *ctx, df_tensor *packed, int64_t h, int64_t w,
                                df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_unpack_latents", ctx, packed, out));
    char d[96];
    bool fits = df_tensor_ndim(packed) == 3 && h >= 2 && w >= 2 && h % 2 == 0 && w % 2 == 0;
    int64_t B = fits ? df_tensor_dim(packed, 0) : 0, C4 = fits ? df_tensor_dim(packed, 2) : 0;
    if (!fits || C4 % 4 || df_tensor_dim(packed, 1) != (h / 2) * (w / 2))
        return df_errorf(DF_E_SHAPE,
                         "unpack latents: packed %s for a %lld x %lld latent "
                         "(expected [B, %lld, 4C] with h and w even)",
                         df_tensor_describe(packed, d, sizeof d), (long long)h, (long long)w,
                         (long long)((h / 2) * (w / 2)));
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x = df_reshape(ctx, packed, DF_SHAPE(B, h / 2, w / 2, C4 / 4, 2, 2));
    x = df_permute(ctx, x, DF_SHAPE(0, 3, 1, 4, 2, 5)); /* [B, C, h/2, 2, w/2, 2] */
    x = df_scope_end(ctx, mark, df_reshape(ctx, x, DF_SHAPE(B, C4 / 4, h, w)));
    return df_vae_finish(ctx, x, out);
}

df_status df_vae_pack_latents(df_ctx *ctx, df_tensor *latents, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_pack_latents", ctx, latents, out));
    char d[96];
    if (df_tensor_ndim(latents) != 4 || df_tensor_dim(latents, 2) % 2 ||
        df_tensor_dim(latents, 3) % 2)
        return df_errorf(DF_E_SHAPE,
                         "pack latents: %s, expected [B, C, h, w] with h and w "
                         "even",
                         df_tensor_describe(latents, d, sizeof d));
    int64_t B = df_tensor_dim(latents, 0), C = df_tensor_dim(latents, 1);
    int64_t h = df_tensor_dim(latents, 2), w = df_tensor_dim(latents, 3);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x = df_reshape(ctx, latents, DF_SHAPE(B, C, h / 2, 2, w / 2, 2));
    x = df_permute(ctx, x, DF_SHAPE(0, 2, 4, 1, 3, 5)); /* [B, h/2, w/2, C, 2, 2] */
    x = df_scope_end(ctx, mark, df_reshape(ctx, x, DF_SHAPE(B, (h / 2) * (w / 2), C * 4)));
    return df_vae_finish(ctx, x, out);
}

df_status df_vae_unscale(df_ctx *ctx, const df_vae *vae, df_tensor *latents, df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_unscale", ctx, vae && latents, out));
    const df_vae_info *c = &vae->info;
    if (c->flux2)
        return df_errorf(DF_E_ARG, "vae unscale: an AutoencoderKLFlux2 has no scaling_factor; "
                                   "its latents are de-normalised by df_vae_bn_denormalize");
    df_tensor *x = df_scale(ctx, latents, (float)(1.0 / c->scaling_factor), (float)c->shift_factor);
    return df_vae_finish(ctx, x, out);
}

df_status df_vae_bn_denormalize(df_ctx *ctx, const df_vae *vae, df_tensor *latents,
                                df_tensor **out)
{
    DF_TRY(df_vae_start("df_vae_bn_denormalize", ctx, vae && latents, out));
    const df_vae_info *c = &vae->info;
    if (!c->flux2)
        return df_errorf(DF_E_ARG, "vae bn de-normalisation: only an AutoencoderKLFlux2 has "
                                   "batch-df_vae_norm statistics");
    char d[96];
    if (df_tensor_ndim(latents) != 4 || df_tensor_dim(latents, 1) != c->bn_channels)
        return df_errorf(DF_E_SHAPE,
                         "vae bn de-normalisation: latents %s, expected [B, %lld, h, w]",
                         df_tensor_describe(latents, d, sizeof d), (long long)c->bn_channels);
    df_scope mark = df_scope_begin(ctx);
    const int64_t shape[4] = {1, c->bn_channels, 1, 1};
    df_tensor *std = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, 4, vae->bn_std);
    df_tensor *mean = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, 4, vae->bn_mean);
    df_tensor *x = df_add(ctx, df_mul(ctx, latents, std), mean); /* x * std + mean */
    x = df_scope_end(ctx, mark, x);
    return df_vae_finish(ctx, x, out);
}

/* --- post-processing on the host --------------------------------------------------------- */

static df_status check_image_args(const char *fn, const void *in, const void *out, int64_t b,
                                  int64_t c, int64_t h, int64_t w)
{
    if (!in || !out || b < 1 || c < 1 || h < 1 || w < 1)
        return df_errorf(DF_E_ARG, "%s: %s (batch %lld, channels %lld, %lld x %lld)", fn,
                         !in || !out ? "NULL buffer" : "empty image", (long long)b, (long long)c,
                         (long long)h, (long long)w);
    return DF_OK;
}

/* clamp(x / 2 + 0.5, 0, 1) in float32; NaN stays NaN as in torch. */
static float to_unit(float x)
{
    float v = x * 0.5f + 0.5f;
    return v < 0.0f ? 0.0f : v > 1.0f ? 1.0f : v;
}

/* decoded [B, C, H, W] -> [B, H, W, C] in [0, 1]: as floats into f32, or when f32 is NULL
 * scaled to 0..255 and rounded into u8 (NaN as 0). */
static df_status postprocess(const char *fn, const float *decoded, int64_t batch,
                             int64_t channels, int64_t height, int64_t width, float *f32,
                             uint8_t *u8)
{
    DF_TRY(check_image_args(fn, decoded, f32 ? (const void *)f32 : u8, batch, channels, height,
                            width));
    int64_t hw = height * width;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t c = 0; c < channels; c++)
            for (int64_t p = 0; p < hw; p++) {
                float v = to_unit(decoded[(b * channels + c) * hw + p]);
                int64_t at = (b * hw + p) * channels + c;
                if (f32) {
                    f32[at] = v;
                } else {
                    v *= 255.0f;
                    u8[at] = v == v ? (uint8_t)nearbyintf(v) : 0;
                }
            }
    return DF_OK;
}

df_status df_vae_postprocess_f32(const float *decoded, int64_t batch, int64_t channels,
                                 int64_t height, int64_t width, float *out)
{
    return postprocess("df_vae_postprocess_f32", decoded, batch, channels, height, width, out,
                       NULL);
}

df_status df_vae_postprocess_rgb8(const float *decoded, int64_t batch, int64_t channels,
                                  int64_t height, int64_t width, uint8_t *out)
{
    return postprocess("df_vae_postprocess_rgb8", decoded, batch, channels, height, width, NULL,
                       out);
}
