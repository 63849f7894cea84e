/*
 * Workload "vae": the AutoencoderKL decoder at FLUX.1 width (block_out_channels 128, 256,
 * 512, 512; 2 layers per block; 16 latent channels; 32 groups) with random f32 weights,
 * decoding one image whole and then tiled, to show what tiling does to peak memory.
 *
 *     diffuse-bench vae [SIZE [TILE [OVERLAP]]]
 *
 * SIZE is the image side in pixels (default 512, 256 with --quick; a multiple of 8).
 * TILE and OVERLAP are in latents; by default TILE is half the latent side, at most 64,
 * and OVERLAP a quarter of TILE, so the image is cut into 3 x 3 tiles. TILE 0 decodes whole
 * only. --profile prints the kernel time per op kind of the whole decode, and the convs'
 * GFLOP/s against the ceiling (DIFFUSE_CONV=im2col runs the convs through im2col + GEMM
 * instead of oneDNN's convolution, for a before/after in back-to-back runs).
 *
 * The weights are random, the residual branches at a tenth of unit gain (RESIDUAL_GAIN).
 * The checkpoint (decoder only, ~200 MB) is written once into a temporary folder and
 * removed at the end. A small decode first packs the weights for the kernels, so that the
 * measured runs see only activations: peak_bytes is df_stats' peak of device memory in use
 * after df_stats_reset (weights are mapped from the file and not counted). The two outputs
 * are compared (rel_l2 of tiled against whole) as a sanity check of the tiling.
 *
 * GFLOP/s use the analytic count: every conv 2 * Cin * Cout * k^2 * Ho * Wo, the mid-block
 * attention's four projections 8 * S * C^2 and its scores and values 4 * S^2 * C, for
 * S = h * w latent positions (norms and elementwise ops left out). Compute dtype: f32
 * unless --dtype bf16 (the activations, hence the memory, are f32 either way).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

enum { LATENT = 16, GROUPS = 32, LAYERS = 2, N_BLOCKS = 4 };
/* Residual branches (each ResNet's conv2, the attention's to_out) at a tenth of unit gain,
 * as in trained VAEs; at unit gain a random decoder is so sensitive that tiled and whole
 * outputs are unrelated and their difference tells nothing. */
#define RESIDUAL_GAIN 0.1f
static const int64_t blocks[N_BLOCKS] = {128, 256, 512, 512};

/* ---- the random checkpoint ------------------------------------------------------------ */

typedef struct writer {
    df_st_writer *w;
    uint64_t rng;
    int bad;
} writer;

static float uniform(writer *wr) /* [-1, 1) */
{
    wr->rng ^= wr->rng << 13;
    wr->rng ^= wr->rng >> 7;
    wr->rng ^= wr->rng << 17;
    return (float)(wr->rng >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

static void put(writer *wr, const char *name, const char *suffix, const int64_t *shape, int ndim,
                float scale, float offset)
{
    if (wr->bad)
        return;
    char full[256];
    snprintf(full, sizeof full, "%s.%s", name, suffix);
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = malloc((size_t)n * sizeof *v);
    if (!v) {
        wr->bad = 1;
        return;
    }
    for (int64_t i = 0; i < n; i++)
        v[i] = offset + scale * uniform(wr);
    wr->bad = df_st_writer_add_f32(wr->w, full, DF_DTYPE_F32, shape, ndim, v) != DF_OK;
    free(v);
}

/* Uniform weights of unit gain (variance 1 / fan_in), times `gain`. */
static void put_conv_gain(writer *wr, const char *name, int64_t o, int64_t i, int64_t k, float gain)
{
    put(wr, name, "weight", (int64_t[]){o, i, k, k}, 4, gain * sqrtf(3.0f / (float)(i * k * k)), 0);
    put(wr, name, "bias", (int64_t[]){o}, 1, 0.05f, 0);
}

static void put_conv(writer *wr, const char *name, int64_t o, int64_t i, int64_t k)
{
    put_conv_gain(wr, name, o, i, k, 1.0f);
}

static void put_norm(writer *wr, const char *name, int64_t c)
{
    put(wr, name, "weight", (int64_t[]){c}, 1, 0, 1);
    put(wr, name, "bias", (int64_t[]){c}, 1, 0, 0);
}

/* "<p>.<part>" in buf. */
static const char *sub(char *buf, size_t cap, const char *p, const char *part)
{
    snprintf(buf, cap, "%s.%s", p, part);
    return buf;
}

static void put_resnet(writer *wr, const char *p, int64_t in, int64_t out)
{
    char n[200];
    put_norm(wr, sub(n, sizeof n, p, "norm1"), in);
    put_conv(wr, sub(n, sizeof n, p, "conv1"), out, in, 3);
    put_norm(wr, sub(n, sizeof n, p, "norm2"), out);
    put_conv_gain(wr, sub(n, sizeof n, p, "conv2"), out, out, 3, RESIDUAL_GAIN);
    if (in != out)
        put_conv(wr, sub(n, sizeof n, p, "conv_shortcut"), out, in, 1);
}

static int write_checkpoint(const char *dir)
{
    writer wr = {.rng = 0x9E3779B97F4A7C15ull};
    if (df_st_writer_create(&wr.w) != DF_OK)
        return 1;
    int64_t top = blocks[N_BLOCKS - 1];
    put_conv(&wr, "decoder.conv_in", top, LATENT, 3);
    put_resnet(&wr, "decoder.mid_block.resnets.0", top, top);
    put_norm(&wr, "decoder.mid_block.attentions.0.group_norm", top);
    static const char *proj[4] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int i = 0; i < 4; i++) {
        char n[200];
        snprintf(n, sizeof n, "decoder.mid_block.attentions.0.%s", proj[i]);
        float gain = i == 3 ? RESIDUAL_GAIN : 1.0f;
        put(&wr, n, "weight", (int64_t[]){top, top}, 2, gain * sqrtf(3.0f / (float)top), 0);
        put(&wr, n, "bias", (int64_t[]){top}, 1, 0.05f, 0);
    }
    put_resnet(&wr, "decoder.mid_block.resnets.1", top, top);
    int64_t prev = top;
    for (int b = 0; b < N_BLOCKS; b++) {
        int64_t out = blocks[N_BLOCKS - 1 - b];
        char n[200];
        for (int j = 0; j <= LAYERS; j++) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", b, j);
            put_resnet(&wr, n, j == 0 ? prev : out, out);
        }
        if (b < N_BLOCKS - 1) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            put_conv(&wr, n, out, out, 3);
        }
        prev = out;
    }
    put_norm(&wr, "decoder.conv_norm_out", blocks[0]);
    put_conv(&wr, "decoder.conv_out", 3, blocks[0], 3);

    char path[1200];
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    int bad = wr.bad || df_st_writer_finish(wr.w, path) != DF_OK;
    df_st_writer_free(wr.w);
    snprintf(path, sizeof path, "%s/config.json", dir);
    FILE *f = bad ? NULL : fopen(path, "w");
    if (!f)
        return 1;
    fprintf(f,
            "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"act_fn\": \"silu\",\n"
            "  \"block_out_channels\": [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "],\n"
            "  \"latent_channels\": %d,\n  \"layers_per_block\": %d,\n"
            "  \"norm_num_groups\": %d,\n  \"out_channels\": 3,\n"
            "  \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", "
            "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"],\n"
            "  \"scaling_factor\": 0.3611,\n  \"shift_factor\": 0.1159,\n"
            "  \"use_post_quant_conv\": false,\n  \"use_quant_conv\": false\n}\n",
            blocks[0], blocks[1], blocks[2], blocks[3], LATENT, LAYERS, GROUPS);
    return fclose(f) != 0;
}

static void remove_checkpoint(const char *dir)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- the measurement ------------------------------------------------------------------- */

static double conv_flop(int64_t cin, int64_t cout, int64_t k, int64_t h, int64_t w)
{
    return 2.0 * (double)cin * (double)cout * (double)(k * k) * (double)h * (double)w;
}

static double resnet_flop(int64_t in, int64_t out, int64_t h, int64_t w)
{
    return conv_flop(in, out, 3, h, w) + conv_flop(out, out, 3, h, w) +
           (in != out ? conv_flop(in, out, 1, h, w) : 0);
}

/* The decoder's conv FLOPs for an h x w latent, in GFLOP. */
static double decoder_conv_gflop(int64_t h, int64_t w)
{
    int64_t top = blocks[N_BLOCKS - 1];
    double f = conv_flop(LATENT, top, 3, h, w) + 2 * resnet_flop(top, top, h, w);
    int64_t prev = top;
    for (int b = 0; b < N_BLOCKS; b++) {
        int64_t out = blocks[N_BLOCKS - 1 - b];
        for (int j = 0; j <= LAYERS; j++)
            f += resnet_flop(j == 0 ? prev : out, out, h, w);
        if (b < N_BLOCKS - 1) {
            h *= 2, w *= 2;
            f += conv_flop(out, out, 3, h, w);
        }
        prev = out;
    }
    return (f + conv_flop(blocks[0], 3, 3, h, w)) / 1e9;
}

/* Decoder FLOPs for an h x w latent (see the top of the file): the convs and the mid-block
 * attention. */
static double decoder_gflop(int64_t h, int64_t w)
{
    double s = (double)(h * w), c = (double)blocks[N_BLOCKS - 1];
    return decoder_conv_gflop(h, w) + (8 * s * c * c + 4 * s * s * c) / 1e9;
}

typedef struct result {
    double seconds;
    int64_t peak_bytes;
    float *pixels; /* malloc'd */
} result;

/* One decode of z, whole (tile 0) or tiled; its time and peak memory. */
static int decode_once(df_ctx *ctx, df_vae *vae, df_tensor *z, int64_t tile, int64_t overlap,
                       result *r)
{
    df_stats_reset(ctx);
    double t0 = bench_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *img;
    df_status st = tile ? df_vae_decode_tiled(ctx, vae, z, tile, overlap, &img)
                        : df_vae_decode(ctx, vae, z, &img);
    if (st == DF_OK) {
        int64_t n = df_tensor_numel(img);
        r->pixels = malloc((size_t)n * sizeof *r->pixels);
        st = r->pixels
                 ? df_tensor_read(ctx, img, DF_DTYPE_F32, r->pixels, (size_t)n * sizeof *r->pixels)
                 : DF_E_OOM;
    }
    df_scope_end(ctx, mark, NULL);
    r->seconds = bench_now() - t0;
    df_stats stats;
    df_ctx_stats(ctx, &stats);
    r->peak_bytes = stats.peak_bytes;
    if (st != DF_OK)
        fprintf(stderr, "vae: %s\n", df_error_message());
    return st != DF_OK;
}

static double rel_l2(const float *a, const float *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        r += (double)b[i] * b[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

/* Kernel time per op kind of the last decode, and the convs' rate against the ceiling. */
static void print_profile(const bench_opts *o, df_ctx *ctx, double conv_gflop, double ceiling)
{
    df_profile_entry e[64];
    int n = df_ctx_profile(ctx, e, 64);
    double total = 0, conv_ms = 0;
    for (int i = 0; i < n; i++) {
        total += e[i].ms;
        conv_ms += strcmp(e[i].op, "conv2d") == 0 ? e[i].ms : 0;
    }
    double rate = conv_ms > 0 ? conv_gflop / (conv_ms * 1e-3) : 0;
    if (o->json) {
        printf("{\"workload\":\"vae\",\"profile\":\"whole\",\"total_ms\":%.2f,"
               "\"conv_gflops\":%.1f,\"ceiling\":%.1f,\"ops\":{",
               total, rate, ceiling);
        for (int i = 0; i < n; i++)
            printf("%s\"%s\":%.2f", i ? "," : "", e[i].op, e[i].ms);
        printf("}}\n");
        return;
    }
    printf("  profile whole decode: kernels %.1f ms; conv2d %.1f GFLOP/s (%.0f%% of %.1f)\n",
           total, rate, ceiling > 0 ? 100 * rate / ceiling : 0, ceiling);
    for (int i = 0; i < n && i < 16; i++)
        printf("    %-16s %6" PRId64 " calls %10.1f ms %5.1f%%\n", e[i].op, e[i].calls, e[i].ms,
               total > 0 ? 100 * e[i].ms / total : 0);
}

typedef struct setting {
    int64_t size, tile, overlap;
    int threads;
    df_dtype dtype;
    const char *mode;
} setting;

static int measure(const bench_opts *o, const char *dir, const setting *set)
{
    df_ctx *ctx;
    df_eager_mode mode = strcmp(set->mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = set->threads, .compute = set->dtype, .mode = mode},
                      &ctx) != DF_OK) {
        fprintf(stderr, "vae: %s\n", df_error_message());
        return 1;
    }
    df_vae *vae = NULL;
    int bad = df_vae_load(ctx, dir, &vae) != DF_OK;
    if (bad)
        fprintf(stderr, "vae: %s\n", df_error_message());

    int64_t h = set->size / 8, n = LATENT * h * h;
    float *lat = malloc((size_t)n * sizeof *lat);
    writer wr = {.rng = 42};
    for (int64_t i = 0; !bad && lat && i < n; i++)
        lat[i] = uniform(&wr);
    bad = bad || !lat;
    result warm = {0}, whole = {0}, tiled = {0};
    df_tensor *z =
        bad ? NULL : df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, LATENT, h, h), lat);
    bad = bad || !z;
    /* Warm-up on a small latent: weights packed for the kernels, pages read. */
    df_tensor *small = bad ? NULL : df_slice(ctx, df_slice(ctx, z, 2, 0, 4), 3, 0, 4);
    bad = bad || decode_once(ctx, vae, small, 0, 0, &warm);
    if (!bad && o->profile)
        df_ctx_set_profiling(ctx, true);
    bad = bad || decode_once(ctx, vae, z, 0, 0, &whole);
    if (!bad && o->profile) {
        print_profile(o, ctx, decoder_conv_gflop(h, h),
                      bench_ceiling_gflops(set->dtype, df_ctx_threads(ctx)));
        df_ctx_set_profiling(ctx, false);
    }
    bad = bad || (set->tile > 0 && decode_once(ctx, vae, z, set->tile, set->overlap, &tiled));

    if (!bad) {
        char shape[96], extra[160];
        int64_t npix = 3 * set->size * set->size;
        double gflop = decoder_gflop(h, h);
        double ceiling = bench_ceiling_gflops(set->dtype, df_ctx_threads(ctx));
        snprintf(shape, sizeof shape, "1x%dx%" PRId64 "x%" PRId64 "->%" PRId64 "x%" PRId64, LATENT,
                 h, h, set->size, set->size);
        snprintf(extra, sizeof extra, ",\"tiled\":false");
        bench_report(o, "vae", shape, df_ctx_threads(ctx), df_dtype_name(set->dtype), set->mode,
                     whole.seconds * 1e3, gflop / whole.seconds, ceiling, whole.peak_bytes, extra);
        snprintf(extra, sizeof extra,
                 ",\"tiled\":true,\"tile\":%" PRId64 ",\"overlap\":%" PRId64
                 ",\"rel_l2_vs_whole\":%.3g",
                 set->tile, set->overlap, rel_l2(tiled.pixels, whole.pixels, npix));
        /* tiled decodes a little more (the overlaps): the same count is used for both */
        if (set->tile > 0)
            bench_report(o, "vae", shape, df_ctx_threads(ctx), df_dtype_name(set->dtype), set->mode,
                     tiled.seconds * 1e3, gflop / tiled.seconds, ceiling, tiled.peak_bytes, extra);
        if (!o->json && set->tile > 0)
            printf("vae %" PRId64 "x%" PRId64 ": peak %.1f MiB whole, %.1f MiB tiled "
                   "(tile %" PRId64 ", overlap %" PRId64 " latents); tiled vs whole rel_l2 "
                   "%.3g\n",
                   set->size, set->size, whole.peak_bytes / 1048576.0, tiled.peak_bytes / 1048576.0,
                   set->tile, set->overlap, rel_l2(tiled.pixels, whole.pixels, npix));
    }
    free(warm.pixels);
    free(whole.pixels);
    free(tiled.pixels);
    free(lat);
    df_vae_free(vae);
    df_ctx_free(ctx);
    return bad;
}

int bench_vae(const bench_opts *o)
{
    setting set = {.size = o->quick ? 256 : 512,
                   .threads = o->threads,
                   .mode = "eager",
                   .dtype = DF_DTYPE_F32};
    if (o->argc > 0)
        set.size = strtoll(o->argv[0], NULL, 10);
    if (set.size < 64 || set.size % 8) {
        fprintf(stderr, "vae: SIZE must be a multiple of 8, at least 64 (got %s)\n",
                o->argc > 0 ? o->argv[0] : "?");
        return 1;
    }
    int64_t h = set.size / 8;
    set.tile = o->argc > 1 ? strtoll(o->argv[1], NULL, 10) : (h / 2 < 64 ? h / 2 : 64);
    set.overlap = o->argc > 2 ? strtoll(o->argv[2], NULL, 10) : set.tile / 4;
    if (o->dtype && !df_dtype_parse(o->dtype, &set.dtype)) {
        fprintf(stderr, "vae: unknown dtype %s\n", o->dtype);
        return 1;
    }
    if (o->mode)
        set.mode = o->mode;
    if (strcmp(set.mode, "eager") != 0 && strcmp(set.mode, "fuse") != 0) {
        fprintf(stderr, "vae: mode %s is not available\n", set.mode);
        return 1;
    }

    const char *tmp = getenv("TMPDIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/diffuse-bench-vae-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "vae: cannot create a folder from %s\n", dir);
        return 1;
    }
    int bad = write_checkpoint(dir);
    if (bad)
        fprintf(stderr, "vae: cannot write the random checkpoint in %s: %s\n", dir,
                df_error_message());
    bad = bad || measure(o, dir, &set);
    remove_checkpoint(dir);
    return bad;
}
