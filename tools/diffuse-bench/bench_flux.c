/*
 * Workload "flux": the FLUX.1 transformer at full width (hidden 3072 = 24 heads of 128,
 * MLP 4x, joint_attention_dim 4096, pooled 768, in_channels 64) with random bf16 weights
 * and reduced depth (2 double + 4 single blocks; `--double N --single N` change it), at
 * the token counts of 256x256 and 512x512 images: 256+512 and 1024+512 (image + text),
 * in f32 and bf16 compute, on 2 threads unless --threads says otherwise. --quick runs a
 * tiny model (hidden 128) at 16+8 and 64+8 tokens.
 *
 * Three checkpoints are written into a temporary folder by a streaming safetensors writer
 * (header first, then each tensor generated in chunks): the embedders alone (0 blocks),
 * the double blocks alone, and the single blocks alone. Timing each forward (after one
 * warm-up run that packs weights and touches pages) gives per-block times without looking
 * inside the model:
 *     ms per double block = (T_double - T_embed) / n_double
 *     ms per single block = (T_single - T_embed) / n_single
 *     forward (n_double + n_single) = T_double + T_single - T_embed
 *
 * GFLOP/s count the matrix products analytically (B = 1, S = S_img + S_txt, D = hidden):
 *     double block  24 S D^2 + 4 S^2 D + 24 D^2
 *                   (q,k,v of both streams 6 S D^2, to_out + to_add_out 2 S D^2,
 *                    ff + ff_context 16 S D^2, q k^T and p v 4 S^2 D, two 6D x D
 *                    modulations 24 D^2)
 *     single block  24 S D^2 + 4 S^2 D + 6 D^2
 *                   (q,k,v 6 S D^2, proj_mlp 8 S D^2, proj_out (5D -> D) 10 S D^2,
 *                    attention 4 S^2 D, the 3D x D modulation 6 D^2)
 *     embedders     2 S_img C D + 2 S_txt J D + 2 (256 D + D^2) + 2 (P D + D^2)
 *                   + 4 D^2 + 2 S_img D C   (C in_channels, J joint, P pooled)
 * Norms, RoPE, activations and residual adds are O(S D) and left out. Each rate is set
 * against the machine's GEMM ceiling for the compute dtype (bench_ceiling_gflops).
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"

typedef struct shape {
    int64_t D, heads, in_ch, joint, pooled;
    int64_t axes[3];
} shape;

static const shape full_shape = {3072, 24, 64, 4096, 768, {16, 56, 56}};
static const shape tiny_shape = {128, 4, 16, 64, 32, {8, 12, 12}};

/* The three checkpoints: embedders only, the double blocks, the single blocks. */
static const char *const model_names[3] = {"embed", "double", "single"};

/* ---- the random checkpoint --------------------------------------------------------------- */

typedef struct wt {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector of `rows` */
    float scale;        /* uniform in [-scale, scale); 0: all ones (RMS norm weights) */
} wt;

typedef struct wlist {
    wt *w;
    int n, cap;
} wlist;

static int add(wlist *l, int64_t rows, int64_t cols, float scale, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int add(wlist *l, int64_t rows, int64_t cols, float scale, const char *fmt, ...)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        wt *w = realloc(l->w, (size_t)cap * sizeof *w);
        if (!w)
            return 1;
        l->w = w;
        l->cap = cap;
    }
    wt *w = &l->w[l->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->rows = rows;
    w->cols = cols;
    w->scale = scale;
    return 0;
}

/* A linear layer [out, in] with bias: weights of variance 1/in, small biases. */
static int add_linear(wlist *l, int64_t out, int64_t in, const char *fmt, const char *p, int i)
{
    char base[80];
    snprintf(base, sizeof base, fmt, p, i);
    int bad = add(l, out, in, sqrtf(3.0f / (float)in), "%s.weight", base);
    return bad || add(l, out, 0, 0.02f, "%s.bias", base);
}

static int weight_list(const shape *s, int n_double, int n_single, wlist *l)
{
    int64_t D = s->D, Dh = D / s->heads;
    int bad = add_linear(l, D, s->in_ch, "%sx_embedder", "", 0);
    bad = bad || add_linear(l, D, s->joint, "%scontext_embedder", "", 0);
    bad = bad || add_linear(l, D, 256, "%stime_text_embed.timestep_embedder.linear_1", "", 0);
    bad = bad || add_linear(l, D, D, "%stime_text_embed.timestep_embedder.linear_2", "", 0);
    bad = bad || add_linear(l, D, s->pooled, "%stime_text_embed.text_embedder.linear_1", "", 0);
    bad = bad || add_linear(l, D, D, "%stime_text_embed.text_embedder.linear_2", "", 0);
    bad = bad || add_linear(l, 2 * D, D, "%snorm_out.linear", "", 0);
    bad = bad || add_linear(l, s->in_ch, D, "%sproj_out", "", 0);
    const char *p = "transformer_blocks";
    for (int i = 0; !bad && i < n_double; i++) {
        bad = add_linear(l, 6 * D, D, "%s.%d.norm1.linear", p, i) ||
              add_linear(l, 6 * D, D, "%s.%d.norm1_context.linear", p, i);
        static const char *const proj[8] = {"to_q",       "to_k",       "to_v",     "add_q_proj",
                                            "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"};
        for (int k = 0; !bad && k < 8; k++) {
            char fmt[64];
            snprintf(fmt, sizeof fmt, "%%s.%%d.attn.%s", proj[k]);
            bad = add_linear(l, D, D, fmt, p, i);
        }
        static const char *const norms[4] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int k = 0; !bad && k < 4; k++)
            bad = add(l, Dh, 0, 0, "%s.%d.attn.%s.weight", p, i, norms[k]);
        bad = bad || add_linear(l, 4 * D, D, "%s.%d.ff.net.0.proj", p, i) ||
              add_linear(l, D, 4 * D, "%s.%d.ff.net.2", p, i) ||
              add_linear(l, 4 * D, D, "%s.%d.ff_context.net.0.proj", p, i) ||
              add_linear(l, D, 4 * D, "%s.%d.ff_context.net.2", p, i);
    }
    p = "single_transformer_blocks";
    for (int i = 0; !bad && i < n_single; i++) {
        bad = add_linear(l, 3 * D, D, "%s.%d.norm.linear", p, i) ||
              add_linear(l, D, D, "%s.%d.attn.to_q", p, i) ||
              add_linear(l, D, D, "%s.%d.attn.to_k", p, i) ||
              add_linear(l, D, D, "%s.%d.attn.to_v", p, i) ||
              add(l, Dh, 0, 0, "%s.%d.attn.norm_q.weight", p, i) ||
              add(l, Dh, 0, 0, "%s.%d.attn.norm_k.weight", p, i) ||
              add_linear(l, 4 * D, D, "%s.%d.proj_mlp", p, i) ||
              add_linear(l, D, 5 * D, "%s.%d.proj_out", p, i);
    }
    return bad;
}

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int write_values(FILE *f, const wt *w, uint64_t *rng)
{
    uint16_t buf[8192];
    int64_t n = w->rows * (w->cols ? w->cols : 1);
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < 8192 ? n - done : 8192;
        for (int64_t i = 0; i < k; i++) {
            float u = (float)(next_random(rng) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
            buf[i] = df_f32_to_bf16(w->scale > 0 ? (2 * u - 1) * w->scale : 1.0f);
        }
        if (fwrite(buf, sizeof *buf, (size_t)k, f) != (size_t)k)
            return 1;
        done += k;
    }
    return 0;
}

static int write_safetensors(const char *path, const wlist *l)
{
    size_t cap = 256 * (size_t)l->n + 64, len = 0;
    char *h = malloc(cap);
    if (!h)
        return 1;
    uint64_t off = 0;
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < l->n; i++) {
        const wt *w = &l->w[i];
        uint64_t bytes = 2 * (uint64_t)w->rows * (uint64_t)(w->cols ? w->cols : 1);
        char dims[48];
        if (w->cols)
            snprintf(dims, sizeof dims, "%" PRId64 ",%" PRId64, w->rows, w->cols);
        else
            snprintf(dims, sizeof dims, "%" PRId64, w->rows);
        len += (size_t)snprintf(h + len, cap - len,
                                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],"
                                "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                i ? "," : "", w->name, dims, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8 && len < cap)
        h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    int bad = !f || fwrite(hl, 1, 8, f) != 8 || fwrite(h, 1, len, f) != len;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; !bad && i < l->n; i++)
        bad = write_values(f, &l->w[i], &rng);
    if (f && fclose(f) != 0)
        bad = 1;
    free(h);
    return bad;
}

/* "a/b" into out; 1 when it does not fit. */
static int join(char *out, size_t cap, const char *a, const char *b)
{
    return snprintf(out, cap, "%s/%s", a, b) >= (int)cap;
}

static int write_model(const char *dir, const shape *s, int n_double, int n_single)
{
    char path[1200];
    if (mkdir(dir, 0755) != 0 ||
        join(path, sizeof path, dir, "diffusion_pytorch_model.safetensors"))
        return 1;
    wlist l = {0};
    int bad = weight_list(s, n_double, n_single, &l) || write_safetensors(path, &l);
    free(l.w);
    FILE *f = bad || join(path, sizeof path, dir, "config.json") ? NULL : fopen(path, "w");
    if (!f)
        return 1;
    fprintf(f,
            "{\n  \"_class_name\": \"FluxTransformer2DModel\",\n  \"patch_size\": 1,\n"
            "  \"in_channels\": %" PRId64 ",\n  \"out_channels\": null,\n"
            "  \"num_layers\": %d,\n  \"num_single_layers\": %d,\n"
            "  \"attention_head_dim\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64 ",\n"
            "  \"joint_attention_dim\": %" PRId64 ",\n  \"pooled_projection_dim\": %" PRId64
            ",\n  \"guidance_embeds\": false,\n  \"axes_dims_rope\": [%" PRId64 ", %" PRId64
            ", %" PRId64 "]\n}\n",
            s->in_ch, n_double, n_single, s->D / s->heads, s->heads, s->joint, s->pooled,
            s->axes[0], s->axes[1], s->axes[2]);
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

/* The checkpoints under `root` (those that were written), and the folder itself. */
static void remove_models(const char *root)
{
    for (int i = 0; i < 3; i++) {
        char dir[1100];
        if (!join(dir, sizeof dir, root, model_names[i]))
            remove_model(dir);
    }
    rmdir(root);
}

/* ---- the measurement --------------------------------------------------------------------- */

static double double_gflop(const shape *s, double S)
{
    double D = (double)s->D;
    return (24 * S * D * D + 4 * S * S * D + 24 * D * D) / 1e9;
}

static double single_gflop(const shape *s, double S)
{
    double D = (double)s->D;
    return (24 * S * D * D + 4 * S * S * D + 6 * D * D) / 1e9;
}

static double embed_gflop(const shape *s, double s_img, double s_txt)
{
    double D = (double)s->D, C = (double)s->in_ch;
    return (2 * s_img * C * D + 2 * s_txt * (double)s->joint * D + 2 * (256 * D + D * D) +
            2 * ((double)s->pooled * D + D * D) + 4 * D * D + 2 * s_img * D * C) /
           1e9;
}

static float *random_values(int64_t n, uint64_t seed)
{
    float *v = malloc((size_t)n * sizeof *v + 1);
    for (int64_t i = 0; v && i < n; i++)
        v[i] = (float)(next_random(&seed) >> 40) * (2.0f / 16777216.0f) - 1.0f;
    return v;
}

/* Random inputs for one forward with s_img image tokens on a square grid and s_txt text
 * tokens (ids all zero, as FluxPipeline makes them). */
static int make_inputs(df_ctx *ctx, const shape *s, int64_t s_img, int64_t s_txt,
                       df_flux_inputs *in)
{
    int64_t side = (int64_t)sqrt((double)s_img);
    float *x = random_values(s_img * s->in_ch, 1), *t = random_values(s_txt * s->joint, 2);
    float *p = random_values(s->pooled, 3), sigma = 0.75f;
    float *img = calloc((size_t)s_img * 3, sizeof *img),
          *txt = calloc((size_t)s_txt * 3, sizeof *txt);
    int bad = !x || !t || !p || !img || !txt;
    for (int64_t i = 0; !bad && i < s_img; i++) {
        img[3 * i + 1] = (float)(i / side);
        img[3 * i + 2] = (float)(i % side);
    }
    if (!bad)
        *in = (df_flux_inputs){
            .hidden_states =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, s_img, s->in_ch), x),
            .encoder_hidden_states =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, s_txt, s->joint), t),
            .pooled_projections = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, s->pooled), p),
            .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), &sigma),
            .img_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s_img, 3), img),
            .txt_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s_txt, 3), txt),
        };
    free(x);
    free(t);
    free(p);
    free(img);
    free(txt);
    return bad || df_ctx_status(ctx) != DF_OK;
}

/* Seconds of one forward, until the device has finished it. */
static int run_once(df_ctx *ctx, df_flux *m, const df_flux_inputs *in, double *seconds)
{
    double t0 = bench_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *out = df_flux_forward(ctx, m, in);
    df_status st = df_sync(ctx);
    df_scope_end(ctx, mark, NULL);
    *seconds = bench_now() - t0;
    if (!out || st != DF_OK) {
        fprintf(stderr, "flux: %s\n", df_error_message());
        return 1;
    }
    return 0;
}

typedef struct run_cfg {
    const shape *s;
    int n_double, n_single;
    int threads;
    df_dtype dtype;
    const char *mode;
    int64_t tokens[2][2]; /* {image, text} per token setting */
    int n_tokens;
    int repeats; /* timed forwards per mode (workload "modes") */
} run_cfg;

/* Warm-up then best of `repeats` forwards of the model in `dir` at each token setting:
 * sec[k] for setting k. */
static int time_model(const bench_opts *o, const run_cfg *rc, const char *dir, double *sec,
                      int64_t *peak)
{
    df_ctx *ctx;
    df_eager_mode mode = strcmp(rc->mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = rc->threads, .compute = rc->dtype, .mode = mode},
                      &ctx) != DF_OK) {
        fprintf(stderr, "flux: %s\n", df_error_message());
        return 1;
    }
    df_flux *m = NULL;
    int bad = df_flux_load(ctx, dir, &m) != DF_OK;
    if (bad)
        fprintf(stderr, "flux: %s\n", df_error_message());
    int repeats = o->quick ? 3 : 2; /* tiny shapes are cheap: more runs against noise */
    for (int k = 0; !bad && k < rc->n_tokens; k++) {
        df_scope mark = df_scope_begin(ctx);
        df_flux_inputs in;
        double s;
        bad = make_inputs(ctx, rc->s, rc->tokens[k][0], rc->tokens[k][1], &in) ||
              run_once(ctx, m, &in, &s);
        df_stats_reset(ctx);
        for (int r = 0; !bad && r < repeats; r++) {
            bad = run_once(ctx, m, &in, &s);
            if (r == 0 || s < sec[k])
                sec[k] = s;
        }
        df_stats st;
        df_ctx_stats(ctx, &st);
        if (st.peak_bytes > peak[k])
            peak[k] = st.peak_bytes;
        df_scope_end(ctx, mark, NULL);
    }
    df_flux_free(m);
    df_ctx_free(ctx);
    return bad;
}

static void report(const bench_opts *o, const run_cfg *rc, const char *what, int k, double sec,
                   double gflop, double ceiling, int64_t peak)
{
    char shape[96], extra[96];
    snprintf(shape, sizeof shape, "%" PRId64 "+%" PRId64 " %s", rc->tokens[k][0], rc->tokens[k][1],
             what);
    double rate = sec > 0 ? gflop / sec : 0;
    snprintf(extra, sizeof extra, ",\"gflop\":%.2f", gflop); /* the report prints the ratio */
    bench_report(o, "flux", shape, rc->threads, df_dtype_name(rc->dtype), rc->mode, sec * 1e3, rate,
                 ceiling, peak, extra);
}

/* sec[i][k]: the fastest forward of checkpoint i (model_names) at token setting k. */
static int time_models(const bench_opts *o, const run_cfg *rc, const char *root, double sec[3][2],
                       int64_t *peak)
{
    for (int i = 0; i < 3; i++) {
        char dir[1100];
        if (join(dir, sizeof dir, root, model_names[i]) || time_model(o, rc, dir, sec[i], peak))
            return 1;
    }
    return 0;
}

static int measure(const bench_opts *o, const run_cfg *rc, const char *root)
{
    double sec[3][2] = {{0}};
    int64_t peak[2] = {0};
    if (time_models(o, rc, root, sec, peak))
        return 1;
    double ceiling = bench_ceiling_gflops(rc->dtype, rc->threads);
    for (int k = 0; k < rc->n_tokens; k++) {
        double s_img = (double)rc->tokens[k][0], S = s_img + (double)rc->tokens[k][1];
        double t_d = (sec[1][k] - sec[0][k]) / rc->n_double;
        double t_s = (sec[2][k] - sec[0][k]) / rc->n_single;
        double total = sec[1][k] + sec[2][k] - sec[0][k];
        double flop = embed_gflop(rc->s, s_img, (double)rc->tokens[k][1]) +
                      rc->n_double * double_gflop(rc->s, S) + rc->n_single * single_gflop(rc->s, S);
        char what[48];
        report(o, rc, "double block", k, t_d, double_gflop(rc->s, S), ceiling, peak[k]);
        report(o, rc, "single block", k, t_s, single_gflop(rc->s, S), ceiling, peak[k]);
        snprintf(what, sizeof what, "forward %d+%d", rc->n_double, rc->n_single);
        report(o, rc, what, k, total, flop, ceiling, peak[k]);
    }
    return 0;
}

/* The three checkpoints of rc's depth in a new folder root[cap] named after `workload`.
 * Returns 0 on success; otherwise says why on stderr and removes what it wrote. */
static int write_models(const char *workload, const run_cfg *rc, char *root, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(root, cap, "%s/diffuse-bench-%s-XXXXXX", tmp && *tmp ? tmp : "/tmp", workload);
    if (!mkdtemp(root)) {
        fprintf(stderr, "%s: cannot create a folder from %s\n", workload, root);
        return 1;
    }
    const int depth[3][2] = {{0, 0}, {rc->n_double, 0}, {0, rc->n_single}};
    for (int i = 0; i < 3; i++) {
        char dir[1100];
        if (join(dir, sizeof dir, root, model_names[i]) ||
            write_model(dir, rc->s, depth[i][0], depth[i][1])) {
            fprintf(stderr, "%s: cannot write the random checkpoint %s/%s\n", workload, root,
                    model_names[i]);
            remove_models(root);
            return 1;
        }
    }
    return 0;
}

int bench_flux(const bench_opts *o)
{
    run_cfg rc = {.s = o->quick ? &tiny_shape : &full_shape,
                  .n_double = 2,
                  .n_single = 4,
                  .threads = o->threads ? o->threads : 2,
                  .n_tokens = 2};
    for (int i = 0; i + 1 < o->argc; i += 2) {
        if (strcmp(o->argv[i], "--double") == 0)
            rc.n_double = atoi(o->argv[i + 1]);
        else if (strcmp(o->argv[i], "--single") == 0)
            rc.n_single = atoi(o->argv[i + 1]);
        else
            break;
    }
    if (rc.n_double < 1 || rc.n_single < 1) {
        fprintf(stderr, "flux: usage: flux [--double N] [--single N] (N >= 1)\n");
        return 1;
    }
    const int64_t full_tokens[2][2] = {{256, 512}, {1024, 512}},
                  tiny_tokens[2][2] = {{16, 8}, {64, 8}};
    memcpy(rc.tokens, o->quick ? tiny_tokens : full_tokens, sizeof rc.tokens);

    char root[1024];
    if (write_models("flux", &rc, root, sizeof root))
        return 1;
    static const char *const modes[2] = {"eager", "fuse"};
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    int failures = 0;
    for (int di = 0; di < 3; di++) {
        if (o->dtype && strcmp(o->dtype, df_dtype_name(dtypes[di])) != 0)
            continue;
        for (int mi = 0; mi < 2; mi++) {
            if (o->mode ? strcmp(o->mode, modes[mi]) != 0 : mi > 0)
                continue; /* without --mode: eager only until the other modes exist */
            rc.dtype = dtypes[di];
            rc.mode = modes[mi];
            failures += measure(o, &rc, root);
        }
    }
    remove_models(root);
    return failures ? 1 : 0;
}

int bench_flux_pairs(const bench_opts *o, int threads, const char *mode, int64_t s_img,
                     int64_t s_txt, const df_dtype *dtypes, int n, bench_flux_pair *out)
{
    run_cfg rc = {.s = o->quick ? &tiny_shape : &full_shape,
                  .n_double = 1,
                  .n_single = 1,
                  .threads = threads,
                  .mode = mode,
                  .tokens = {{s_img, s_txt}},
                  .n_tokens = 1};
    double S = (double)(s_img + s_txt);
    for (int i = 0; i < n; i++)
        out[i] = (bench_flux_pair){.gflop = {double_gflop(rc.s, S), single_gflop(rc.s, S)}};
    char root[1024];
    if (write_models("peer", &rc, root, sizeof root))
        return n;
    int failures = 0;
    for (int i = 0; i < n; i++) {
        double sec[3][2] = {{0}};
        rc.dtype = dtypes[i];
        if (time_models(o, &rc, root, sec, &out[i].peak_bytes)) {
            failures++;
            continue;
        }
        out[i].ms[0] = 1e3 * (sec[1][0] - sec[0][0]);
        out[i].ms[1] = 1e3 * (sec[2][0] - sec[0][0]);
    }
    remove_models(root);
    return failures;
}

/* ---- workload "modes": the execution modes side by side ---------------------------------- */

/* The whole transformer as a module, for df_compile. */
static df_status flux_module_forward(df_ctx *ctx, void *self, df_tensor *const *in,
                                     df_tensor **out)
{
    df_flux_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
    out[0] = df_flux_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module flux_module = {
    .name = "FluxTransformer2DModel", .n_in = 7, .n_out = 1, .forward = flux_module_forward};

typedef struct mode_run {
    const char *mode;
    df_flux *m;
    df_compiled *whole;
} mode_run;

/* One forward in the run's mode, until the device has finished it. */
static int forward_once(df_ctx *ctx, mode_run *r, const df_flux_inputs *in, double *seconds)
{
    double t0 = bench_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *out = NULL;
    df_status st;
    if (r->whole) {
        df_tensor *args[7] = {in->hidden_states, in->encoder_hidden_states,
                              in->pooled_projections, in->timestep, in->img_ids, in->txt_ids,
                              in->guidance};
        st = df_compiled_call(ctx, r->whole, r->m, args, &out);
    } else {
        out = df_flux_forward(ctx, r->m, in);
        st = df_mark_step(ctx); /* what the pipelines do once per step */
    }
    if (st == DF_OK)
        st = df_sync(ctx);
    df_scope_end(ctx, mark, NULL);
    *seconds = bench_now() - t0;
    if (!out || st != DF_OK) {
        fprintf(stderr, "modes: %s: %s\n", r->mode, df_error_message());
        return 1;
    }
    return 0;
}

static bool is_matrix_product(const char *op)
{
    return !strcmp(op, "linear") || !strcmp(op, "matmul") || !strcmp(op, "attention") ||
           !strcmp(op, "conv2d");
}

/* Kernel time per op kind, divided by the `steps` it was gathered over. */
static void print_profile(const bench_opts *o, df_ctx *ctx, const char *label, int steps)
{
    df_profile_entry e[64];
    int n = df_ctx_profile(ctx, e, 64);
    double total = 0, outside = 0;
    for (int i = 0; i < n; i++) {
        e[i].ms /= steps;
        total += e[i].ms;
        outside += is_matrix_product(e[i].op) ? 0 : e[i].ms;
    }
    if (o->json) {
        printf("{\"workload\":\"modes\",\"profile\":\"%s\",\"total_ms\":%.2f,"
               "\"outside_matrix_products_ms\":%.2f,\"ops\":{", label, total, outside);
        for (int i = 0; i < n; i++)
            printf("%s\"%s\":%.2f", i ? "," : "", e[i].op, e[i].ms);
        printf("}}\n");
        return;
    }
    printf("  profile %s: kernels %.1f ms, outside matrix products %.1f ms (%.0f%%)\n", label,
           total, outside, total > 0 ? 100 * outside / total : 0);
    for (int i = 0; i < n && i < 12; i++)
        printf("    %-18s %8.1f ms %5.1f%%  %6lld calls\n", e[i].op, e[i].ms,
               total > 0 ? 100 * e[i].ms / total : 0, (long long)(e[i].calls / steps));
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One mode under measurement: its context, model and inputs, and what it measured. */
typedef struct mode_bench {
    const char *mode;
    df_ctx *ctx;
    mode_run r;
    df_scope mark;
    df_flux_inputs in;
    double first, times[64], median; /* median: set by mode_report */
    df_stats st0;
    int bad;
} mode_bench;

/* Loads the model in the mode's context and runs the first call (which packs weights,
 * plans or compiles), reported on its own. */
static int mode_setup(const bench_opts *o, const run_cfg *rc, const char *dir, int k,
                      mode_bench *b)
{
    bool compile = !strcmp(b->mode, "compile"), blocks = !strcmp(b->mode, "blocks");
    df_eager_mode em = !strcmp(b->mode, "eager") ? DF_DEFER_NEVER : DF_DEFER_AND_FUSE;
    b->r.mode = b->mode;
    if (df_ctx_create(&(df_ctx_opts){.device = bench_device_name, .threads = rc->threads,
                                     .compute = rc->dtype, .mode = em},
                      &b->ctx) != DF_OK) {
        fprintf(stderr, "modes: %s\n", df_error_message());
        return b->bad = 1;
    }
    int bad = df_flux_load(b->ctx, dir, &b->r.m) != DF_OK;
    if (!bad && compile)
        bad = df_compile(&flux_module, &(df_compile_opts){.fullgraph = true}, &b->r.whole) != DF_OK;
    if (!bad && blocks)
        bad = df_flux_compile_repeated_blocks(b->r.m, &(df_compile_opts){.fullgraph = true}) !=
              DF_OK;
    if (bad)
        fprintf(stderr, "modes: %s\n", df_error_message());
    b->mark = df_scope_begin(b->ctx);
    bad = bad || make_inputs(b->ctx, rc->s, rc->tokens[k][0], rc->tokens[k][1], &b->in);
    df_stats_reset(b->ctx);
    bad = bad || forward_once(b->ctx, &b->r, &b->in, &b->first);
    df_ctx_stats(b->ctx, &b->st0);
    df_stats_reset(b->ctx);
    df_ctx_set_profiling(b->ctx, o->profile);
    return b->bad = bad;
}

static void mode_report(const bench_opts *o, const run_cfg *rc, int k, mode_bench *b)
{
    int repeats = rc->repeats;
    df_stats st;
    df_ctx_stats(b->ctx, &st);
    double S = (double)(rc->tokens[k][0] + rc->tokens[k][1]);
    double flop = embed_gflop(rc->s, (double)rc->tokens[k][0], (double)rc->tokens[k][1]) +
                  rc->n_double * double_gflop(rc->s, S) + rc->n_single * single_gflop(rc->s, S);
    /* The median step: the machine is shared, and a mean follows its worst moments. */
    qsort(b->times, (size_t)repeats, sizeof *b->times, cmp_double);
    double sec = repeats % 2 ? b->times[repeats / 2]
                             : 0.5 * (b->times[repeats / 2 - 1] + b->times[repeats / 2]);
    b->median = sec;
    char shape[96], extra[600];
    snprintf(shape, sizeof shape, "%" PRId64 "+%" PRId64 " forward %d+%d", rc->tokens[k][0],
             rc->tokens[k][1], rc->n_double, rc->n_single);
    snprintf(extra, sizeof extra,
             ",\"first_ms\":%.1f,\"compile_ms\":%.2f,\"graphs_compiled\":%lld,"
             "\"cache_hits\":%lld,\"fused_kernels\":%lld,\"kernels\":%lld,"
             "\"min_ms\":%.1f,\"max_ms\":%.1f,\"repeats\":%d,"
             "\"first_peak_mib\":%.1f,\"step_peak_mib\":%.1f,\"device\":\"%s\","
             "\"dispatches\":%lld,\"recorded\":%lld,\"submits\":%lld,\"graph_launches\":%lld",
             b->first * 1e3, b->st0.compile_ms, (long long)b->st0.graphs_compiled,
             (long long)st.cache_hits, (long long)(st.fused_kernels / repeats),
             (long long)(st.ops_enqueued / repeats), b->times[0] * 1e3,
             b->times[repeats - 1] * 1e3, repeats, b->st0.peak_bytes / 1048576.0,
             st.peak_bytes / 1048576.0, df_ctx_device_name(b->ctx),
             (long long)(st.device_dispatches / repeats),
             (long long)(st.device_dispatches_recorded / repeats),
             (long long)(st.device_submits / repeats),
             (long long)(st.device_graph_launches / repeats));
    bench_report(o, "modes", shape, rc->threads, df_dtype_name(rc->dtype), b->mode, sec * 1e3,
                 flop / sec, bench_ceiling_gflops(rc->dtype, rc->threads),
                 st.peak_bytes > b->st0.peak_bytes ? st.peak_bytes : b->st0.peak_bytes, extra);
    if (!o->json)
        printf("  %s: first call %.1f ms (compile %.2f ms), %lld kernels per step, %lld fused\n",
               b->mode, b->first * 1e3, b->st0.compile_ms,
               (long long)(st.ops_enqueued / repeats), (long long)(st.fused_kernels / repeats));
    if (o->profile) {
        char label[128];
        snprintf(label, sizeof label, "%s %s %s, per step", shape, df_dtype_name(rc->dtype),
                 b->mode);
        print_profile(o, b->ctx, label, repeats);
    }
}

static void mode_teardown(mode_bench *b)
{
    if (b->ctx)
        df_scope_end(b->ctx, b->mark, NULL);
    df_compiled_free(b->r.whole);
    df_flux_free(b->r.m);
    df_ctx_free(b->ctx);
}

/* Every selected (dtype, mode) at token setting k. The timed steps take turns, one step of
 * each per round, so that a slow spell of the shared machine falls on all of them alike and
 * the ratios between dtypes and modes are from the same moments. */
static int measure_modes(const bench_opts *o, const run_cfg *rc, const char *dir, int k,
                         const df_dtype *dtypes, int n_dtypes, const char *const *modes,
                         int n_modes)
{
    mode_bench b[12] = {{0}};
    run_cfg cfg[12];
    int n = 0, failures = 0;
    for (int di = 0; di < n_dtypes; di++)
        for (int mi = 0; mi < n_modes; mi++, n++) {
            cfg[n] = *rc;
            cfg[n].dtype = dtypes[di];
            b[n].mode = modes[mi];
            failures += mode_setup(o, &cfg[n], dir, k, &b[n]);
        }
    for (int i = 0; i < rc->repeats; i++)
        for (int j = 0; j < n; j++)
            if (!b[j].bad)
                failures += b[j].bad = forward_once(b[j].ctx, &b[j].r, &b[j].in, &b[j].times[i]);
    /* the best mode of each dtype, and its speed-up over f32's best */
    double best[3] = {0};
    for (int j = 0; j < n; j++) {
        if (!b[j].bad) {
            mode_report(o, &cfg[j], k, &b[j]);
            int di = j / n_modes;
            if (!best[di] || b[j].median < best[di])
                best[di] = b[j].median;
        }
        mode_teardown(&b[j]);
    }
    if (!o->json && n_dtypes > 1 && dtypes[0] == DF_DTYPE_F32 && best[0] > 0)
        for (int di = 1; di < n_dtypes; di++)
            if (best[di] > 0)
                printf("  %" PRId64 "+%" PRId64 ": best %s step %.1f ms, %.2fx f32's best "
                       "(%.1f ms)\n",
                       rc->tokens[k][0], rc->tokens[k][1], df_dtype_name(dtypes[di]),
                       best[di] * 1e3, best[0] / best[di], best[0] * 1e3);
    return failures;
}

/* Whether `mode` is one of the comma-separated names in `list`. */
static bool mode_listed(const char *list, const char *mode)
{
    size_t n = strlen(mode);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && !strncmp(p, mode, n))
            return true;
        p += len + (end != NULL);
    }
    return false;
}

int bench_modes(const bench_opts *o)
{
    run_cfg rc = {.s = o->quick ? &tiny_shape : &full_shape,
                  .n_double = 1,
                  .n_single = 2,
                  .threads = o->threads ? o->threads : 2,
                  .n_tokens = 2,
                  .repeats = o->quick ? 3 : 5};
    for (int i = 0; i + 1 < o->argc; i += 2) {
        if (strcmp(o->argv[i], "--double") == 0)
            rc.n_double = atoi(o->argv[i + 1]);
        else if (strcmp(o->argv[i], "--single") == 0)
            rc.n_single = atoi(o->argv[i + 1]);
        else if (strcmp(o->argv[i], "--repeats") == 0)
            rc.repeats = atoi(o->argv[i + 1]);
    }
    if (rc.n_double < 1 || rc.n_single < 1 || rc.repeats < 1 || rc.repeats > 64) {
        fprintf(stderr,
                "modes: usage: modes [--double N] [--single N] [--repeats 1..64] (N >= 1)\n");
        return 1;
    }
    const int64_t full_tokens[2][2] = {{256, 512}, {1024, 512}},
                  tiny_tokens[2][2] = {{16, 8}, {64, 8}};
    memcpy(rc.tokens, o->quick ? tiny_tokens : full_tokens, sizeof rc.tokens);
    const char *tmp = getenv("TMPDIR");
    char root[1024], dir[1100];
    snprintf(root, sizeof root, "%s/diffuse-bench-modes-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root) || join(dir, sizeof dir, root, "model") ||
        write_model(dir, rc.s, rc.n_double, rc.n_single)) {
        fprintf(stderr, "modes: cannot write the random checkpoint under %s\n", root);
        return 1;
    }
    static const char *const modes[4] = {"eager", "fuse", "compile", "blocks"};
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    df_dtype chosen_dtypes[3];
    const char *chosen[4];
    int n_dtypes = 0, n_chosen = 0, failures = 0;
    for (int di = 0; di < 3; di++)
        if (!o->dtype || strcmp(o->dtype, df_dtype_name(dtypes[di])) == 0)
            chosen_dtypes[n_dtypes++] = dtypes[di];
    for (int mi = 0; mi < 4; mi++)
        if (!o->mode || mode_listed(o->mode, modes[mi]))
            chosen[n_chosen++] = modes[mi];
    for (int k = 0; k < rc.n_tokens; k++)
        failures += measure_modes(o, &rc, dir, k, chosen_dtypes, n_dtypes, chosen, n_chosen);
    remove_model(dir);
    rmdir(root);
    return failures ? 1 : 0;
}

/* ---- workload "compile": compile time against depth --------------------------------------- */

/* Compile time (recording + planning) of the whole transformer and of its repeated blocks,
 * at FLUX.1's full depth (19 + 38) and at depth 8. The work is proportional to the number
 * of ops, not to tensor sizes (nothing is generated or tuned per shape), so the model is
 * FLUX.1-shaped but narrow (hidden 128) to keep the checkpoint small; --width 3072 gives the
 * real width if the disk and time allow. */
int bench_compile(const bench_opts *o)
{
    shape s = tiny_shape;
    for (int i = 0; i + 1 < o->argc; i += 2)
        if (!strcmp(o->argv[i], "--width")) {
            s = full_shape;
            s.D = atoi(o->argv[i + 1]);
            s.heads = s.D / 128 > 0 ? s.D / 128 : 1;
        }
    const int depths[2][2] = {{8, 8}, {19, 38}};
    const char *tmp = getenv("TMPDIR");
    char root[1024], dir[1100];
    snprintf(root, sizeof root, "%s/diffuse-bench-compile-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(root) || join(dir, sizeof dir, root, "model"))
        return 1;
    int failures = 0;
    int threads = o->threads ? o->threads : 2;
    for (int d = 0; d < 2; d++) {
        if (write_model(dir, &s, depths[d][0], depths[d][1])) {
            fprintf(stderr, "compile: cannot write the checkpoint\n");
            failures++;
            break;
        }
        run_cfg rc = {.s = &s, .n_double = depths[d][0], .n_single = depths[d][1],
                      .threads = threads, .dtype = DF_DTYPE_F32, .n_tokens = 1,
                      .tokens = {{1024, 512}}};
        for (int mi = 0; mi < 2; mi++) {
            const char *mode = mi ? "blocks" : "compile";
            df_ctx *ctx;
            if (df_ctx_create(&(df_ctx_opts){.threads = threads, .mode = DF_DEFER_AND_FUSE},
                              &ctx) != DF_OK)
                return 1;
            mode_run r = {.mode = mode};
            int bad = df_flux_load(ctx, dir, &r.m) != DF_OK;
            if (!bad && !mi)
                bad = df_compile(&flux_module, &(df_compile_opts){.fullgraph = true}, &r.whole);
            if (!bad && mi)
                bad = df_flux_compile_repeated_blocks(r.m, &(df_compile_opts){.fullgraph = true});
            df_flux_inputs in;
            double first = 0, again = 0;
            df_stats st;
            bad = bad || make_inputs(ctx, rc.s, 1024, 512, &in);
            df_stats_reset(ctx);
            bad = bad || forward_once(ctx, &r, &in, &first);
            df_ctx_stats(ctx, &st);
            bad = bad || forward_once(ctx, &r, &in, &again);
            if (bad) {
                fprintf(stderr, "compile: %s\n", df_error_message());
                failures++;
            } else {
                char shape[96], extra[128];
                snprintf(shape, sizeof shape, "depth %d+%d, 1024+512 tokens, hidden %" PRId64,
                         depths[d][0], depths[d][1], s.D);
                snprintf(extra, sizeof extra, ",\"compile_ms\":%.2f,\"programs\":%lld",
                         st.compile_ms, (long long)st.graphs_compiled);
                bench_report(o, "compile", shape, threads, "f32", mode, st.compile_ms, 0, 0,
                             st.arena_bytes, extra);
            }
            df_compiled_free(r.whole);
            df_flux_free(r.m);
            df_ctx_free(ctx);
        }
        remove_model(dir);
    }
    rmdir(root);
    return failures ? 1 : 0;
}
