/*
 * A whole compiled transformer replays as one recorded graph: the tiny FLUX.1, SD3 and
 * FLUX.2 klein transformers, each compiled whole (fullgraph) and called four times with new
 * inputs (latents, text, timestep, guidance) on a device that records graphs.
 *
 * The first call traces and records; every later call must record no kernel, launch one
 * graph and hand the device one submit, and give what an uncompiled forward of the same
 * inputs gives. That needs every op of the forward to run on the device, the timestep
 * embedding and the RoPE table included (a host wait inside the capture would make the
 * program replay node by node, many submits a call). Each call's counters are printed.
 *
 * Usage: test_compiled_transformer DEVICE TINY_FLUX TINY_SD3 TINY_FLUX2_KLEIN (the folders
 * `diffuse make-tiny` writes). Exit 77 when the device cannot be opened.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/diffuse.h>

enum { CALLS = 4, S_IMG = 16, S_TXT = 8, SIDE = 8 };

static int g_failures;

static void fail(const char *model, const char *what)
{
    printf("FAIL %s: %s (%s)\n", model, what, df_error_message());
    g_failures++;
}

/* Deterministic values in [-1, 1) that differ from call to call. */
static float *values(int64_t n, uint32_t seed)
{
    float *v = malloc((size_t)n * sizeof *v + 1);
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; v && i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (float)(s >> 8) / 8388608.0f - 1.0f;
    }
    return v;
}

static df_tensor *random_tensor(df_ctx *ctx, const int64_t *shape, int ndim, uint32_t seed)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    float *v = values(n, seed);
    df_tensor *t = v ? df_tensor_from_host(ctx, DF_DTYPE_F32, shape, ndim, v) : NULL;
    free(v);
    return t;
}

/* Position ids [S, n_axes]: image rows (0, y, x[, 0]) over a 4-wide grid, text rows
 * (0, 0, 0[, l]) for FLUX.2 and zeros for FLUX.1. */
static df_tensor *ids(df_ctx *ctx, int64_t seq, int n_axes, bool image)
{
    float v[64 * 4] = {0};
    for (int64_t s = 0; s < seq; s++) {
        if (image) {
            v[s * n_axes + 1] = (float)(s / 4);
            v[s * n_axes + 2] = (float)(s % 4);
        } else if (n_axes == 4) {
            v[s * n_axes + 3] = (float)s;
        }
    }
    return df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(seq, n_axes), v);
}

/* ---- the three transformers as modules ------------------------------------------------ */

static df_status flux_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    df_flux_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
    out[0] = df_flux_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static df_status sd3_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    df_sd3_inputs si = {.hidden_states = in[0], .encoder_hidden_states = in[1],
                        .pooled_projections = in[2], .timestep = in[3]};
    out[0] = df_sd3_forward(ctx, self, &si);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static df_status flux2_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    df_flux2_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5]};
    out[0] = df_flux2_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module flux_module = {.name = "flux", .n_in = 7, .n_out = 1,
                                      .forward = flux_forward};
static const df_module sd3_module = {.name = "sd3", .n_in = 4, .n_out = 1,
                                     .forward = sd3_forward};
static const df_module flux2_module = {.name = "flux2", .n_in = 6, .n_out = 1,
                                       .forward = flux2_forward};

/* One call's inputs, made from `seed` (the timestep and guidance move with it). */
typedef struct inputs {
    df_tensor *t[7];
} inputs;

static void make_inputs(df_ctx *ctx, const char *arch, void *m, uint32_t seed, inputs *x)
{
    memset(x, 0, sizeof *x);
    float ts[1] = {0.9f - 0.2f * (float)seed}, gs[1] = {3.5f + (float)seed};
    if (strcmp(arch, "flux") == 0) {
        const df_flux_cfg *c = df_flux_config(m);
        x->t[0] = random_tensor(ctx, DF_SHAPE(1, S_IMG, c->in_channels), seed);
        x->t[1] = random_tensor(ctx, DF_SHAPE(1, S_TXT, c->joint_attention_dim), seed + 100);
        x->t[2] = random_tensor(ctx, DF_SHAPE(1, c->pooled_projection_dim), seed + 200);
        x->t[3] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), ts);
        x->t[4] = ids(ctx, S_IMG, c->n_axes, true);
        x->t[5] = ids(ctx, S_TXT, c->n_axes, false);
        if (c->guidance_embeds)
            x->t[6] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), gs);
    } else if (strcmp(arch, "sd3") == 0) {
        const df_sd3_cfg *c = df_sd3_config(m);
        ts[0] *= 1000.0f;
        x->t[0] = random_tensor(ctx, DF_SHAPE(1, c->in_channels, SIDE, SIDE), seed);
        x->t[1] = random_tensor(ctx, DF_SHAPE(1, S_TXT, c->joint_attention_dim), seed + 100);
        x->t[2] = random_tensor(ctx, DF_SHAPE(1, c->pooled_projection_dim), seed + 200);
        x->t[3] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), ts);
    } else {
        const df_flux2_cfg *c = df_flux2_config(m);
        x->t[0] = random_tensor(ctx, DF_SHAPE(1, S_IMG, c->in_channels), seed);
        x->t[1] = random_tensor(ctx, DF_SHAPE(1, S_TXT, c->joint_attention_dim), seed + 100);
        x->t[2] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), ts);
        x->t[3] = ids(ctx, S_IMG, c->n_axes, true);
        x->t[4] = ids(ctx, S_TXT, c->n_axes, false);
        if (c->guidance_embeds)
            x->t[5] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), gs);
    }
}

static df_tensor *forward(df_ctx *ctx, const df_module *mod, void *m, df_tensor *const *t)
{
    df_tensor *out = NULL;
    return mod->forward(ctx, m, t, &out) == DF_OK ? out : NULL;
}

/* Max |a - b| over max |b|. */
static double rel_err(df_ctx *ctx, df_tensor *a, df_tensor *b)
{
    int64_t n = df_tensor_numel(b);
    float *x = malloc((size_t)n * sizeof *x + 1), *y = malloc((size_t)n * sizeof *y + 1);
    double err = INFINITY, scale = 0, diff = 0;
    if (x && y && df_tensor_read(ctx, a, DF_DTYPE_F32, x, (size_t)n * sizeof *x) == DF_OK &&
        df_tensor_read(ctx, b, DF_DTYPE_F32, y, (size_t)n * sizeof *y) == DF_OK) {
        for (int64_t i = 0; i < n; i++) {
            scale = fmax(scale, fabs(y[i]));
            diff = fmax(diff, fabs((double)x[i] - y[i]));
        }
        err = diff / (scale > 0 ? scale : 1);
    }
    free(x);
    free(y);
    return err;
}

static void run_model(df_ctx *ctx, const char *arch, const char *folder)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/transformer", folder);
    void *m = NULL;
    df_status s = strcmp(arch, "flux") == 0  ? df_flux_load(ctx, dir, (df_flux **)&m)
                  : strcmp(arch, "sd3") == 0 ? df_sd3_load(ctx, dir, (df_sd3 **)&m)
                                             : df_flux2_load(ctx, dir, (df_flux2 **)&m);
    if (s != DF_OK) {
        fail(arch, "load");
        return;
    }
    const df_module *mod = strcmp(arch, "flux") == 0  ? &flux_module
                           : strcmp(arch, "sd3") == 0 ? &sd3_module
                                                      : &flux2_module;
    df_compiled *c = NULL;
    if (df_compile(mod, &(df_compile_opts){.fullgraph = true}, &c) != DF_OK) {
        fail(arch, "compile");
        c = NULL;
    }
    for (int call = 0; c && call < CALLS; call++) {
        df_scope mark = df_scope_begin(ctx);
        inputs x;
        make_inputs(ctx, arch, m, (uint32_t)call, &x);
        df_tensor *want = forward(ctx, mod, m, x.t), *got = NULL;
        if (!want || df_sync(ctx) != DF_OK) {
            fail(arch, "uncompiled forward");
            df_scope_end(ctx, mark, NULL);
            break;
        }
        df_stats_reset(ctx);
        s = df_compiled_call(ctx, c, m, x.t, &got);
        if (s == DF_OK)
            s = df_sync(ctx); /* the call's work, handed over */
        df_stats st;
        df_ctx_stats(ctx, &st);
        if (s != DF_OK) {
            fail(arch, "compiled call");
            df_scope_end(ctx, mark, NULL);
            break;
        }
        double err = rel_err(ctx, got, want);
        printf("%-5s call %d: dispatches %lld, recorded %lld, submits %lld, graph launches "
               "%lld; max error vs uncompiled %.2g\n", arch, call,
               (long long)st.device_dispatches, (long long)st.device_dispatches_recorded,
               (long long)st.device_submits, (long long)st.device_graph_launches, err);
        if (!(err <= 1e-5))
            fail(arch, "compiled result differs from the uncompiled forward");
        if (call == 0 && (st.device_graph_launches != 0 || st.device_dispatches_recorded < 1))
            fail(arch, "first call: expected a recording and no graph launch");
        if (call > 0 && (st.device_dispatches_recorded != 0 || st.device_graph_launches != 1 ||
                         st.device_submits != 1 || st.device_dispatches < 1))
            fail(arch, "later call: expected 0 kernels recorded, 1 graph launch, 1 submit");
        df_scope_end(ctx, mark, NULL);
    }
    if (c && df_compiled_programs(c) != 1)
        fail(arch, "expected one program for one input shape");
    df_compiled_free(c);
    if (strcmp(arch, "flux") == 0)
        df_flux_free(m);
    else if (strcmp(arch, "sd3") == 0)
        df_sd3_free(m);
    else
        df_flux2_free(m);
}

int main(int argc, char **argv)
{
    if (argc != 5) {
        fprintf(stderr, "usage: %s DEVICE TINY_FLUX TINY_SD3 TINY_FLUX2_KLEIN\n", argv[0]);
        return 2;
    }
    df_ctx *ctx = NULL;
    if (df_ctx_create(&(df_ctx_opts){.device = argv[1], .threads = 2}, &ctx) != DF_OK) {
        printf("skipped: device %s: %s\n", argv[1], df_error_message());
        return 77;
    }
    printf("device: %s\n", df_ctx_device_name(ctx));
    run_model(ctx, "flux", argv[2]);
    run_model(ctx, "sd3", argv[3]);
    run_model(ctx, "flux2", argv[4]);
    df_ctx_free(ctx);
    printf("%d failures\n", g_failures);
    return g_failures ? 1 : 0;
}
