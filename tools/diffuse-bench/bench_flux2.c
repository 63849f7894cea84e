/*
 * Workload "flux2": the FLUX.2 transformer at two real widths with random bf16 weights and
 * reduced depth (1 double + 1 single block; `--double N --single N` change it):
 *     klein-4B width  hidden 3072 (24 heads of 128), joint_attention_dim 7680, no guidance
 *     dev width       hidden 6144 (48 heads of 128), joint_attention_dim 15360, guidance
 * (`--width klein|dev` picks one; `--size 512|1024` one image size), both with in_channels
 * 128, mlp_ratio 3 (SwiGLU) and 4-axis RoPE (32 x 4), at the token counts of 512x512 and
 * 1024x1024 images: 1024+512 and 4096+512 (image + text). --quick runs a tiny model (hidden 128) at 16+8 and 64+8 tokens.
 *
 * As for "flux", three checkpoints are written (embedders only, the double blocks alone,
 * the single blocks alone) and each forward is timed after one warm-up run (best of 5 with
 * --quick), so that
 *     ms per double block = (T_double - T_embed) / n_double, likewise per single block,
 *     forward (n_double + n_single) = T_double + T_single - T_embed,
 * and a full-depth step is estimated as T_embed + L_double * t_double + L_single * t_single
 * with the config's depths (klein-4B 5 + 20, dev 8 + 48).
 *
 * GFLOP/s count the matrix products (B = 1, S = S_img + S_txt, D hidden, M = 3D MLP width):
 *     double block  8 S D^2 + 6 S M D + 4 S^2 D   (q,k,v of both streams 6 S D^2, the two
 *                   output projections 2 S D^2, SwiGLU in (2M) and out 6 S M D, attention)
 *     single block  the same: to_qkv_mlp_proj 2 S D (3D + 2M), to_out 2 S (D + M) D, attention
 *     embedders     2 S_img C D + 2 S_txt J D + (1 or 2) x 2 (256 D + D^2) + 30 D^2 (the
 *                   three shared modulations) + 4 D^2 (norm_out) + 2 S_img D C (proj_out)
 * against the machine's GEMM ceiling measured in the same run (bench_ceiling_gflops).
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
    const char *name;
    int64_t D, heads, in_ch, joint, axis; /* axis: each of the 4 RoPE axes */
    bool guidance;
    int full_double, full_single; /* the real model's depth */
} shape;

static const shape klein_shape = {"klein-4B", 3072, 24, 128, 7680, 32, false, 5, 20};
static const shape dev_shape = {"dev", 6144, 48, 128, 15360, 32, true, 8, 48};
static const shape tiny_shape = {"tiny", 128, 4, 128, 96, 8, true, 2, 4};

static const char *const model_names[3] = {"embed", "double", "single"};

/* ---- the random checkpoint --------------------------------------------------------------- */

typedef struct wt {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector of `rows` (an RMS norm weight: all ones) */
} wt;

typedef struct wlist {
    wt *w;
    int n, cap;
} wlist;

static int add(wlist *l, int64_t rows, int64_t cols, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int add(wlist *l, int64_t rows, int64_t cols, const char *fmt, ...)
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
    return 0;
}

static int weight_list(const shape *s, int n_double, int n_single, wlist *l)
{
    int64_t D = s->D, Dh = D / s->heads, M = 3 * D;
    int bad = add(l, D, s->in_ch, "x_embedder.weight") ||
              add(l, D, s->joint, "context_embedder.weight") ||
              add(l, D, 256, "time_guidance_embed.timestep_embedder.linear_1.weight") ||
              add(l, D, D, "time_guidance_embed.timestep_embedder.linear_2.weight") ||
              add(l, 6 * D, D, "double_stream_modulation_img.linear.weight") ||
              add(l, 6 * D, D, "double_stream_modulation_txt.linear.weight") ||
              add(l, 3 * D, D, "single_stream_modulation.linear.weight") ||
              add(l, 2 * D, D, "norm_out.linear.weight") || add(l, s->in_ch, D, "proj_out.weight");
    if (s->guidance)
        bad = bad || add(l, D, 256, "time_guidance_embed.guidance_embedder.linear_1.weight") ||
              add(l, D, D, "time_guidance_embed.guidance_embedder.linear_2.weight");
    for (int i = 0; !bad && i < n_double; i++) {
        static const char *const proj[8] = {"to_q",       "to_k",       "to_v",     "add_q_proj",
                                            "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"};
        for (int k = 0; !bad && k < 8; k++)
            bad = add(l, D, D, "transformer_blocks.%d.attn.%s.weight", i, proj[k]);
        static const char *const norms[4] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int k = 0; !bad && k < 4; k++)
            bad = add(l, Dh, 0, "transformer_blocks.%d.attn.%s.weight", i, norms[k]);
        static const char *const ff[2] = {"ff", "ff_context"};
        for (int k = 0; !bad && k < 2; k++)
            bad = add(l, 2 * M, D, "transformer_blocks.%d.%s.linear_in.weight", i, ff[k]) ||
                  add(l, D, M, "transformer_blocks.%d.%s.linear_out.weight", i, ff[k]);
    }
    for (int i = 0; !bad && i < n_single; i++)
        bad = add(l, 3 * D + 2 * M, D, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj.weight",
                  i) ||
              add(l, Dh, 0, "single_transformer_blocks.%d.attn.norm_q.weight", i) ||
              add(l, Dh, 0, "single_transformer_blocks.%d.attn.norm_k.weight", i) ||
              add(l, D, D + M, "single_transformer_blocks.%d.attn.to_out.weight", i);
    return bad;
}

/* Values uniform in [-sqrt(3 / cols), sqrt(3 / cols)) (variance 1 / fan-in), as bf16. */
static int write_values(FILE *f, const wt *w, uint64_t seed)
{
    uint16_t buf[8192];
    float scale = w->cols ? sqrtf(3.0f / (float)w->cols) : 0;
    int64_t n = w->rows * (w->cols ? w->cols : 1);
    float v[8192];
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < 8192 ? n - done : 8192;
        bench_fill_random(v, k, seed + (uint64_t)done);
        for (int64_t i = 0; i < k; i++)
            buf[i] = df_f32_to_bf16(w->cols ? v[i] * scale : 1.0f);
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
    for (int i = 0; !bad && i < l->n; i++)
        bad = write_values(f, &l->w[i], 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1));
    if (f && fclose(f) != 0)
        bad = 1;
    free(h);
    return bad;
}

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
            "{\n  \"_class_name\": \"Flux2Transformer2DModel\",\n  \"patch_size\": 1,\n"
            "  \"in_channels\": %" PRId64 ",\n  \"out_channels\": null,\n"
            "  \"num_layers\": %d,\n  \"num_single_layers\": %d,\n"
            "  \"attention_head_dim\": %" PRId64 ",\n  \"num_attention_heads\": %" PRId64 ",\n"
            "  \"joint_attention_dim\": %" PRId64 ",\n  \"mlp_ratio\": 3.0,\n"
            "  \"guidance_embeds\": %s,\n  \"rope_theta\": 2000,\n"
            "  \"axes_dims_rope\": [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64 "]\n}\n",
            s->in_ch, n_double, n_single, s->D / s->heads, s->heads, s->joint,
            s->guidance ? "true" : "false", s->axis, s->axis, s->axis, s->axis);
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

/* ---- the measurement --------------------------------------------------------------------- */

static double block_gflop(const shape *s, double S)
{
    double D = (double)s->D, M = 3 * D;
    return (8 * S * D * D + 6 * S * M * D + 4 * S * S * D) / 1e9;
}

static double embed_gflop(const shape *s, double s_img, double s_txt)
{
    double D = (double)s->D, C = (double)s->in_ch;
    return (2 * s_img * C * D + 2 * s_txt * (double)s->joint * D +
            (s->guidance ? 2 : 1) * 2 * (256 * D + D * D) + 34 * D * D + 2 * s_img * D * C) /
           1e9;
}

typedef struct run_cfg {
    const shape *s;
    int n_double, n_single, threads;
    df_dtype dtype;
    const char *mode;
    int64_t tokens[2][2]; /* {image, text} per token setting */
    int n_tokens;
} run_cfg;

/* Random inputs: latents, text, t = 0.75 (guidance 4) and FLUX.2's ids: image (0, h, w, 0)
 * on a square grid, text (0, 0, 0, l). */
static int make_inputs(df_ctx *ctx, const shape *s, int64_t s_img, int64_t s_txt,
                       df_flux2_inputs *in)
{
    int64_t side = (int64_t)sqrt((double)s_img);
    float *x = malloc((size_t)(s_img * s->in_ch) * sizeof *x + 1);
    float *t = malloc((size_t)(s_txt * s->joint) * sizeof *t + 1);
    float *img = calloc((size_t)s_img * 4, sizeof *img), *txt = calloc((size_t)s_txt * 4, 4);
    float sigma = 0.75f, g = 4.0f;
    int bad = !x || !t || !img || !txt;
    if (!bad) {
        bench_fill_random(x, s_img * s->in_ch, 1);
        bench_fill_random(t, s_txt * s->joint, 2);
        for (int64_t i = 0; i < s_img; i++)
            img[4 * i + 1] = (float)(i / side), img[4 * i + 2] = (float)(i % side);
        for (int64_t i = 0; i < s_txt; i++)
            txt[4 * i + 3] = (float)i;
        *in = (df_flux2_inputs){
            .hidden_states =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, s_img, s->in_ch), x),
            .encoder_hidden_states =
                df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, s_txt, s->joint), t),
            .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), &sigma),
            .img_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s_img, 4), img),
            .txt_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(s_txt, 4), txt),
            .guidance =
                s->guidance ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), &g) : NULL,
        };
    }
    free(x), free(t), free(img), free(txt);
    return bad || df_ctx_status(ctx) != DF_OK;
}

/* Warm-up, then the best of `repeats` timed forwards of the model in `dir` per token
 * setting: sec[k]; the context's peak memory over them: peak[k]. */
static int time_model(const bench_opts *o, const run_cfg *rc, int repeats, const char *dir,
                      double *sec, int64_t *peak)
{
    df_ctx *ctx;
    df_eager_mode mode = strcmp(rc->mode, "eager") ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = rc->threads, .compute = rc->dtype, .mode = mode},
                      &ctx) != DF_OK) {
        fprintf(stderr, "flux2: %s\n", df_error_message());
        return 1;
    }
    df_flux2 *m = NULL;
    int bad = df_flux2_load(ctx, dir, &m) != DF_OK;
    if (!bad && !strcmp(rc->mode, "blocks"))
        bad = df_flux2_compile_repeated_blocks(m, NULL) != DF_OK;
    for (int k = 0; !bad && k < rc->n_tokens; k++) {
        df_scope mark = df_scope_begin(ctx);
        df_flux2_inputs in;
        bad = make_inputs(ctx, rc->s, rc->tokens[k][0], rc->tokens[k][1], &in);
        df_stats_reset(ctx);
        for (int rep = 0; !bad && rep <= repeats; rep++) { /* rep 0: the warm-up */
            df_ctx_set_profiling(ctx, o->profile && rep == repeats);
            double t0 = bench_now();
            df_scope inner = df_scope_begin(ctx);
            bad = !df_flux2_forward(ctx, m, &in) || df_sync(ctx) != DF_OK;
            df_scope_end(ctx, inner, NULL);
            double t = bench_now() - t0;
            sec[k] = rep == 1 || t < sec[k] ? t : sec[k];
        }
        df_profile_entry e[16];
        int n = o->profile && !bad ? df_ctx_profile(ctx, e, 16) : 0;
        for (int i = 0; i < n; i++)
            printf("  profile %s, %" PRId64 "+%" PRId64 " tokens: %-14s %9.2f ms %6lld calls\n",
                   dir, rc->tokens[k][0], rc->tokens[k][1], e[i].op, e[i].ms,
                   (long long)e[i].calls);
        df_ctx_set_profiling(ctx, false);
        df_stats st;
        df_ctx_stats(ctx, &st);
        peak[k] = st.peak_bytes > peak[k] ? st.peak_bytes : peak[k];
        df_scope_end(ctx, mark, NULL);
    }
    if (bad)
        fprintf(stderr, "flux2: %s\n", df_error_message());
    df_flux2_free(m);
    df_ctx_free(ctx);
    return bad;
}

static void report(const bench_opts *o, const run_cfg *rc, const char *what, int k, double sec,
                   double gflop, double ceiling, int64_t peak)
{
    char shape[128], extra[96];
    snprintf(shape, sizeof shape, "%s %" PRId64 "+%" PRId64 " %s", rc->s->name,
             rc->tokens[k][0], rc->tokens[k][1], what);
    snprintf(extra, sizeof extra, ",\"gflop\":%.2f", gflop);
    bench_report(o, "flux2", shape, rc->threads, df_dtype_name(rc->dtype), rc->mode, sec * 1e3,
                 sec > 0 ? gflop / sec : 0, ceiling, peak, extra);
}

static int measure(const bench_opts *o, const run_cfg *rc, const char *root)
{
    double sec[3][2] = {{0}};
    int64_t peak[2] = {0};
    for (int i = 0; i < 3; i++) {
        char dir[1100];
        if (join(dir, sizeof dir, root, model_names[i]) ||
            time_model(o, rc, o->quick ? 5 : 1, dir, sec[i], peak))
            return 1;
    }
    double ceiling = bench_ceiling_gflops(rc->dtype, rc->threads);
    for (int k = 0; k < rc->n_tokens; k++) {
        double s_img = (double)rc->tokens[k][0], S = s_img + (double)rc->tokens[k][1];
        double t_d = (sec[1][k] - sec[0][k]) / rc->n_double;
        double t_s = (sec[2][k] - sec[0][k]) / rc->n_single;
        double e = embed_gflop(rc->s, s_img, (double)rc->tokens[k][1]), b = block_gflop(rc->s, S);
        report(o, rc, "double block", k, t_d, b, ceiling, peak[k]);
        report(o, rc, "single block", k, t_s, b, ceiling, peak[k]);
        char what[64];
        snprintf(what, sizeof what, "forward %d+%d", rc->n_double, rc->n_single);
        report(o, rc, what, k, sec[1][k] + sec[2][k] - sec[0][k],
               e + (rc->n_double + rc->n_single) * b, ceiling, peak[k]);
        const shape *s = rc->s;
        snprintf(what, sizeof what, "step %d+%d (estimated)", s->full_double, s->full_single);
        report(o, rc, what, k, sec[0][k] + s->full_double * t_d + s->full_single * t_s,
               e + (s->full_double + s->full_single) * b, ceiling, 0);
    }
    return 0;
}

int bench_flux2(const bench_opts *o)
{
    run_cfg rc = {.n_double = 1, .n_single = 1, .threads = o->threads ? o->threads : 2,
                  .n_tokens = 2};
    const char *width = NULL, *size = NULL;
    for (int i = 0; i + 1 < o->argc; i += 2) {
        if (strcmp(o->argv[i], "--double") == 0)
            rc.n_double = atoi(o->argv[i + 1]);
        else if (strcmp(o->argv[i], "--single") == 0)
            rc.n_single = atoi(o->argv[i + 1]);
        else if (strcmp(o->argv[i], "--width") == 0)
            width = o->argv[i + 1];
        else if (strcmp(o->argv[i], "--size") == 0)
            size = o->argv[i + 1];
    }
    if (rc.n_double < 1 || rc.n_single < 1 ||
        (width && strcmp(width, "klein") && strcmp(width, "dev")) ||
        (size && strcmp(size, "512") && strcmp(size, "1024"))) {
        fprintf(stderr, "flux2: usage: flux2 [--double N] [--single N] [--width klein|dev] "
                        "[--size 512|1024]\n");
        return 1;
    }
    const int64_t full_tokens[2][2] = {{1024, 512}, {4096, 512}},
                  tiny_tokens[2][2] = {{16, 8}, {64, 8}};
    memcpy(rc.tokens, o->quick ? tiny_tokens : full_tokens, sizeof rc.tokens);
    if (size && !o->quick) {
        if (!strcmp(size, "1024"))
            memcpy(rc.tokens[0], rc.tokens[1], sizeof rc.tokens[0]);
        rc.n_tokens = 1;
    }
    const shape *shapes[2] = {&klein_shape, &dev_shape};
    if (o->quick)
        shapes[0] = &tiny_shape, shapes[1] = NULL;
    else if (width)
        shapes[0] = strcmp(width, "dev") ? &klein_shape : &dev_shape, shapes[1] = NULL;

    static const df_dtype dtypes[3] = {DF_DTYPE_BF16, DF_DTYPE_F32, DF_DTYPE_I8};
    int failures = 0;
    for (int si = 0; si < 2 && shapes[si]; si++) {
        rc.s = shapes[si];
        const char *tmp = getenv("TMPDIR");
        char root[1024];
        snprintf(root, sizeof root, "%s/diffuse-bench-flux2-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(root)) {
            fprintf(stderr, "flux2: cannot create a folder from %s\n", root);
            return 1;
        }
        const int depth[3][2] = {{0, 0}, {rc.n_double, 0}, {0, rc.n_single}};
        int bad = 0;
        for (int i = 0; !bad && i < 3; i++) {
            char dir[1100];
            bad = join(dir, sizeof dir, root, model_names[i]) ||
                  write_model(dir, rc.s, depth[i][0], depth[i][1]);
            if (bad)
                fprintf(stderr, "flux2: cannot write the random checkpoint %s/%s\n", root,
                        model_names[i]);
        }
        failures += bad;
        for (int di = 0; !bad && di < 3; di++) {
            /* Without --dtype: bf16 only (the realistic setting); f32 and int8 on request. */
            if (o->dtype ? strcmp(o->dtype, df_dtype_name(dtypes[di])) != 0 : di > 0)
                continue;
            rc.dtype = dtypes[di];
            rc.mode = o->mode ? o->mode : "fuse";
            if (strcmp(rc.mode, "eager") && strcmp(rc.mode, "fuse") && strcmp(rc.mode, "blocks")) {
                fprintf(stderr, "flux2: --mode is eager, fuse or blocks\n");
                failures++;
                break;
            }
            failures += measure(o, &rc, root);
        }
        for (int i = 0; i < 3; i++) {
            char dir[1100];
            if (!join(dir, sizeof dir, root, model_names[i]))
                remove_model(dir);
        }
        rmdir(root);
    }
    return failures ? 1 : 0;
}
