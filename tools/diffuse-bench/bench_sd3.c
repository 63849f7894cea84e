/*
 * Workload "sd3": the SD3.5-medium transformer at full width (hidden 1536 = 24 heads of 64,
 * joint_attention_dim 4096, pooled 2048, 16 latent channels, patch 2, q/k RMS norms) with
 * random bf16 weights and reduced depth (4 blocks, the first 2 with dual attention, the
 * last context_pre_only; `--layers N` changes the depth), one denoising step with
 * classifier-free guidance: batch 2 at 512x512 (64x64 latents = 1024 image tokens, and
 * 77 + 256 = 333 text tokens), in f32 and bf16 compute, on 2 threads unless --threads says
 * otherwise. --quick runs a tiny model (hidden 128, 2 heads of 64) at 64 + 16 tokens.
 *
 * Two checkpoints are written into a temporary folder with df_st_writer: the embedders
 * alone (num_layers 0) and the full reduced-depth model. Timing each forward (after one
 * warm-up run that packs weights and touches pages) gives the block time without looking
 * inside the model:
 *     ms per block (mean) = (T_model - T_embed) / layers
 *     step (CFG, B = 2)   = T_model
 *
 * GFLOP/s count the matrix products analytically, per batch row (S_i image, S_t text
 * tokens, S = S_i + S_t, D hidden):
 *     block   q,k,v of both streams 6 S D^2, joint attention 4 S^2 D, to_out 2 S_i D^2,
 *             ff 16 S_i D^2; unless context_pre_only: to_add_out 2 S_t D^2 and ff_context
 *             16 S_t D^2; dual attention: q,k,v,out 8 S_i D^2 and attention 4 S_i^2 D;
 *             modulations 2 D^2 (9 or 6, plus 6 or 2) D
 *     embed   patch conv 2 S_i (C P^2) D, context_embedder 2 S_t J D, timestep and pooled
 *             MLPs 2 (256 D + D^2) + 2 (P D + D^2), norm_out 4 D^2, proj_out 2 S_i D (P^2 C)
 * Norms, activations and residual adds are O(S D) and left out. Each rate is set against
 * the machine's GEMM ceiling for the compute dtype (bench_ceiling_gflops).
 */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

typedef struct shape {
    int64_t D, heads, in_ch, patch, joint, pooled, pos_max;
    int64_t side;  /* latent side: tokens = (side / patch)^2 */
    int64_t s_txt; /* text tokens */
    int n_dual;    /* the first n_dual blocks have dual attention */
} shape;

static const shape full_shape = {1536, 24, 16, 2, 4096, 2048, 96, 64, 333, 2};
static const shape tiny_shape = {128, 2, 16, 2, 64, 32, 16, 16, 16, 1};

enum { BATCH = 2 }; /* classifier-free guidance: [uncond, cond] */

/* ---- the random checkpoint ---------------------------------------------------------------- */

typedef struct writer {
    df_st_writer *w;
    float *buf;
    int64_t cap;
    uint64_t seed;
    df_status s;
} writer;

/* A tensor of uniform values in [-scale, scale) (scale 0: ones), stored as bf16. */
static void put(writer *w, const char *name, const int64_t *shape, int ndim, float scale)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    if (w->s != DF_OK)
        return;
    if (n > w->cap) {
        float *b = realloc(w->buf, (size_t)n * sizeof *b);
        if (!b) {
            w->s = DF_E_OOM;
            return;
        }
        w->buf = b;
        w->cap = n;
    }
    if (scale > 0) {
        bench_fill_random(w->buf, n, ++w->seed);
        for (int64_t i = 0; i < n; i++)
            w->buf[i] *= scale;
    } else {
        for (int64_t i = 0; i < n; i++)
            w->buf[i] = 1.0f;
    }
    w->s = df_st_writer_add_f32(w->w, name, DF_DTYPE_BF16, shape, ndim, w->buf);
}

/* "<name>.weight" [out, in] (variance 1/in) and "<name>.bias" [out]. */
static void put_linear(writer *w, const char *name, int64_t out, int64_t in)
{
    char n[160];
    snprintf(n, sizeof n, "%s.weight", name);
    put(w, n, (int64_t[]){out, in}, 2, sqrtf(3.0f / (float)in));
    snprintf(n, sizeof n, "%s.bias", name);
    put(w, n, (int64_t[]){out}, 1, 0.02f);
}

static void put_block(writer *w, const shape *s, int i, bool dual, bool last)
{
    int64_t D = s->D, Dh = D / s->heads;
    char p[160];
    static const char *const proj[] = {"attn.to_q",       "attn.to_k",       "attn.to_v",
                                       "attn.to_out.0",   "attn.add_q_proj", "attn.add_k_proj",
                                       "attn.add_v_proj", "attn.to_add_out", "attn2.to_q",
                                       "attn2.to_k",      "attn2.to_v",      "attn2.to_out.0"};
    for (int k = 0; k < 12; k++) {
        if ((k == 7 && last) || (k >= 8 && !dual))
            continue;
        snprintf(p, sizeof p, "transformer_blocks.%d.%s", i, proj[k]);
        put_linear(w, p, D, D);
    }
    static const char *const qk[] = {"attn.norm_q",       "attn.norm_k",  "attn.norm_added_q",
                                     "attn.norm_added_k", "attn2.norm_q", "attn2.norm_k"};
    for (int k = 0; k < (dual ? 6 : 4); k++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.%s.weight", i, qk[k]);
        put(w, p, (int64_t[]){Dh}, 1, 0);
    }
    snprintf(p, sizeof p, "transformer_blocks.%d.norm1.linear", i);
    put_linear(w, p, (dual ? 9 : 6) * D, D);
    snprintf(p, sizeof p, "transformer_blocks.%d.norm1_context.linear", i);
    put_linear(w, p, (last ? 2 : 6) * D, D);
    static const char *const ff[] = {"ff", "ff_context"};
    for (int k = 0; k < (last ? 1 : 2); k++) {
        snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.0.proj", i, ff[k]);
        put_linear(w, p, 4 * D, D);
        snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.2", i, ff[k]);
        put_linear(w, p, D, 4 * D);
    }
}

/* "a/b" into out; 1 when it does not fit. */
static int join(char *out, size_t cap, const char *a, const char *b)
{
    return snprintf(out, cap, "%s/%s", a, b) >= (int)cap;
}

/* Writes an SD3 transformer folder `dir` with `layers` blocks. */
static int write_model(const char *dir, const shape *s, int layers)
{
    char path[1200];
    if (mkdir(dir, 0755) != 0)
        return 1;
    int64_t D = s->D, P = s->patch, M = s->pos_max;
    int n_dual = layers < s->n_dual ? layers : s->n_dual;
    writer w = {.seed = 17};
    w.s = df_st_writer_create(&w.w);
    put(&w, "pos_embed.proj.weight", (int64_t[]){D, s->in_ch, P, P}, 4,
        sqrtf(3.0f / (float)(s->in_ch * P * P)));
    put(&w, "pos_embed.proj.bias", (int64_t[]){D}, 1, 0.02f);
    put(&w, "pos_embed.pos_embed", (int64_t[]){1, M * M, D}, 3, 1.0f);
    put_linear(&w, "time_text_embed.timestep_embedder.linear_1", D, 256);
    put_linear(&w, "time_text_embed.timestep_embedder.linear_2", D, D);
    put_linear(&w, "time_text_embed.text_embedder.linear_1", D, s->pooled);
    put_linear(&w, "time_text_embed.text_embedder.linear_2", D, D);
    put_linear(&w, "context_embedder", D, s->joint);
    for (int i = 0; i < layers; i++)
        put_block(&w, s, i, i < n_dual, i == layers - 1);
    put_linear(&w, "norm_out.linear", 2 * D, D);
    put_linear(&w, "proj_out", P * P * s->in_ch, D);
    if (w.s == DF_OK && !join(path, sizeof path, dir, "diffusion_pytorch_model.safetensors"))
        w.s = df_st_writer_finish(w.w, path);
    df_st_writer_free(w.w);
    free(w.buf);
    if (w.s != DF_OK)
        return 1;
    FILE *f = join(path, sizeof path, dir, "config.json") ? NULL : fopen(path, "w");
    if (!f)
        return 1;
    fprintf(f,
            "{\n  \"_class_name\": \"SD3Transformer2DModel\",\n  \"sample_size\": %" PRId64
            ",\n  \"patch_size\": %" PRId64 ",\n  \"in_channels\": %" PRId64
            ",\n  \"out_channels\": %" PRId64 ",\n  \"num_layers\": %d,\n"
            "  \"attention_head_dim\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64
            ",\n  \"joint_attention_dim\": %" PRId64 ",\n  \"caption_projection_dim\": %" PRId64
            ",\n  \"pooled_projection_dim\": %" PRId64 ",\n  \"pos_embed_max_size\": %" PRId64
            ",\n  \"qk_norm\": \"rms_norm\",\n  \"dual_attention_layers\": [",
            s->side, P, s->in_ch, s->in_ch, layers, D / s->heads, s->heads, s->joint, D, s->pooled,
            M);
    for (int i = 0; i < n_dual; i++)
        fprintf(f, "%s%d", i ? ", " : "", i);
    fprintf(f, "]\n}\n");
    return fclose(f) != 0;
}

static void remove_model(const char *dir)
{
    char path[1200];
    if (!join(path, sizeof path, dir, "diffusion_pytorch_model.safetensors"))
        unlink(path);
    if (!join(path, sizeof path, dir, "config.json"))
        unlink(path);
    rmdir(dir);
}

/* ---- the measurement ---------------------------------------------------------------------- */

static int64_t image_tokens(const shape *s)
{
    return (s->side / s->patch) * (s->side / s->patch);
}

/* GFLOP of one block for the whole CFG batch. */
static double block_gflop(const shape *s, bool dual, bool last)
{
    double D = (double)s->D, si = (double)image_tokens(s), st = (double)s->s_txt, S = si + st;
    double f = 6 * S * D * D + 4 * S * S * D + 2 * si * D * D + 16 * si * D * D;
    if (!last)
        f += 2 * st * D * D + 16 * st * D * D;
    if (dual)
        f += 8 * si * D * D + 4 * si * si * D;
    f += 2 * D * D * ((dual ? 9 : 6) + (last ? 2 : 6));
    return BATCH * f / 1e9;
}

static double embed_gflop(const shape *s)
{
    double D = (double)s->D, si = (double)image_tokens(s), st = (double)s->s_txt;
    double C = (double)s->in_ch, P2 = (double)(s->patch * s->patch);
    double f = 2 * si * C * P2 * D + 2 * st * (double)s->joint * D + 2 * (256 * D + D * D) +
               2 * ((double)s->pooled * D + D * D) + 4 * D * D + 2 * si * D * P2 * C;
    return BATCH * f / 1e9;
}

static double blocks_gflop(const shape *s, int layers)
{
    double f = 0;
    for (int i = 0; i < layers; i++)
        f += block_gflop(s, i < s->n_dual, i == layers - 1);
    return f;
}

/* The CFG batch's inputs (random latents and text, one timestep for both rows). */
static int make_inputs(df_ctx *ctx, const shape *s, df_sd3_inputs *in)
{
    int64_t nl = BATCH * s->in_ch * s->side * s->side, nt = BATCH * s->s_txt * s->joint;
    float *x = malloc((size_t)nl * sizeof *x), *t = malloc((size_t)nt * sizeof *t);
    float *p = malloc((size_t)(BATCH * s->pooled) * sizeof *p), ts = 500.0f;
    int bad = !x || !t || !p;
    if (!bad) {
        bench_fill_random(x, nl, 1);
        bench_fill_random(t, nt, 2);
        bench_fill_random(p, BATCH * s->pooled, 3);
        *in = (df_sd3_inputs){
            .hidden_states = df_tensor_from_host(ctx, DF_DTYPE_F32,
                                                 DF_SHAPE(BATCH, s->in_ch, s->side, s->side), x),
            .encoder_hidden_states =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(BATCH, s->s_txt, s->joint), t),
            .pooled_projections =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(BATCH, s->pooled), p),
            .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), &ts),
        };
    }
    free(x);
    free(t);
    free(p);
    return bad || df_ctx_status(ctx) != DF_OK;
}

/* Seconds of one forward, until the device has finished it. */
static int run_once(df_ctx *ctx, df_sd3 *m, const df_sd3_inputs *in, double *seconds)
{
    double t0 = bench_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *out = df_sd3_forward(ctx, m, in);
    df_status st = df_sync(ctx);
    df_scope_end(ctx, mark, NULL);
    *seconds = bench_now() - t0;
    if (!out || st != DF_OK) {
        fprintf(stderr, "sd3: %s\n", df_error_message());
        return 1;
    }
    return 0;
}

typedef struct run_cfg {
    const shape *s;
    int layers, threads, repeats;
    df_dtype dtype;
    const char *mode;
} run_cfg;

/* Warm-up, then the best of `repeats` forwards of the model in `dir`. */
static int time_model(const run_cfg *rc, const char *dir, double *sec, int64_t *peak)
{
    df_ctx *ctx;
    df_eager_mode mode = strcmp(rc->mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = rc->threads, .compute = rc->dtype, .mode = mode},
                      &ctx) != DF_OK) {
        fprintf(stderr, "sd3: %s\n", df_error_message());
        return 1;
    }
    df_sd3 *m = NULL;
    int bad = df_sd3_load(ctx, dir, &m) != DF_OK;
    if (bad)
        fprintf(stderr, "sd3: %s\n", df_error_message());
    df_scope mark = df_scope_begin(ctx);
    df_sd3_inputs in;
    double s;
    bad = bad || make_inputs(ctx, rc->s, &in) || run_once(ctx, m, &in, &s);
    df_stats_reset(ctx);
    for (int r = 0; !bad && r < rc->repeats; r++) {
        bad = run_once(ctx, m, &in, &s);
        if (r == 0 || s < *sec)
            *sec = s;
    }
    df_stats st;
    df_ctx_stats(ctx, &st);
    *peak = st.peak_bytes > *peak ? st.peak_bytes : *peak;
    df_scope_end(ctx, mark, NULL);
    df_sd3_free(m);
    df_ctx_free(ctx);
    return bad;
}

static void report(const bench_opts *o, const run_cfg *rc, const char *what, double sec,
                   double gflop, double ceiling, int64_t peak)
{
    char shape[96], extra[96];
    snprintf(shape, sizeof shape, "B%d %" PRId64 "+%" PRId64 " %s", BATCH, image_tokens(rc->s),
             rc->s->s_txt, what);
    double rate = sec > 0 ? gflop / sec : 0;
    snprintf(extra, sizeof extra, ",\"ratio\":%.3f,\"gflop\":%.2f",
             ceiling > 0 ? rate / ceiling : 0, gflop);
    bench_report(o, "sd3", shape, rc->threads, df_dtype_name(rc->dtype), rc->mode, sec * 1e3, rate,
                 ceiling, peak, extra);
}

static int measure(const bench_opts *o, const run_cfg *rc, const char *root)
{
    double t_embed = 0, t_model = 0;
    int64_t peak = 0;
    char dir[1100];
    if (join(dir, sizeof dir, root, "embed") || time_model(rc, dir, &t_embed, &peak) ||
        join(dir, sizeof dir, root, "model") || time_model(rc, dir, &t_model, &peak))
        return 1;
    double ceiling = bench_ceiling_gflops(rc->dtype, rc->threads);
    double g_blocks = blocks_gflop(rc->s, rc->layers);
    char what[64];
    snprintf(what, sizeof what, "block (mean of %d)", rc->layers);
    report(o, rc, what, (t_model - t_embed) / rc->layers, g_blocks / rc->layers, ceiling, peak);
    snprintf(what, sizeof what, "step CFG (%d blocks)", rc->layers);
    report(o, rc, what, t_model, g_blocks + embed_gflop(rc->s), ceiling, peak);
    return 0;
}

int bench_sd3(const bench_opts *o)
{
    run_cfg rc = {.s = o->quick ? &tiny_shape : &full_shape,
                  .layers = 4,
                  .threads = o->threads ? o->threads : 2,
                  .repeats = o->quick ? 3 : 2};
    for (int i = 0; i + 1 < o->argc; i += 2) {
        if (strcmp(o->argv[i], "--layers") == 0)
            rc.layers = atoi(o->argv[i + 1]);
        else
            break;
    }
    if (rc.layers < 1 || rc.layers > 64) {
        fprintf(stderr, "sd3: usage: sd3 [--layers N] (1 <= N <= 64)\n");
        return 1;
    }
    const char *tmp = getenv("TMPDIR");
    char root[1024];
    snprintf(root, sizeof root, "%s/diffuse-bench-sd3-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root)) {
        fprintf(stderr, "sd3: cannot create a folder from %s\n", root);
        return 1;
    }
    char embed[1100], model[1100];
    int bad = join(embed, sizeof embed, root, "embed") ||
              join(model, sizeof model, root, "model") || write_model(embed, rc.s, 0) ||
              write_model(model, rc.s, rc.layers);
    if (bad)
        fprintf(stderr, "sd3: cannot write the random checkpoints in %s: %s\n", root,
                df_error_message());

    static const char *const modes[2] = {"eager", "fuse"};
    static const df_dtype dtypes[2] = {DF_DTYPE_F32, DF_DTYPE_BF16};
    int failures = bad;
    for (int di = 0; !bad && di < 2; di++) {
        if (o->dtype && strcmp(o->dtype, df_dtype_name(dtypes[di])) != 0)
            continue;
        for (int mi = 0; mi < 2; mi++) {
            if (o->mode ? strcmp(o->mode, modes[mi]) != 0 : mi > 0)
                continue; /* without --mode: eager only */
            rc.dtype = dtypes[di];
            rc.mode = modes[mi];
            failures += measure(o, &rc, root);
        }
    }
    remove_model(embed);
    remove_model(model);
    rmdir(root);
    return failures ? 1 : 0;
}
