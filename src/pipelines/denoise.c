/*
 * The flow-matching denoising loop and the decode, shared by FluxPipeline, SD3 and FLUX.2
 * (dev and klein) and their image-input variants.
 *
 * One step, in the order every pipeline ran it: the model's hook calls the transformer
 * (compiled or not, with its guidance: SD3's batched CFG and skip-layer guidance, Kontext's
 * true CFG, FLUX.2's two forwards); the Euler step runs on the device in float32, or the
 * prediction is read and stepped on host floats (the reference path, tensor parallelism,
 * inpainting); df_mark_step marks the step (FLUX.2's hook marks each forward instead, which
 * keeps its graphs as they were); a rank whose sharded forward failed stops every rank; the
 * inpaint blend and rank 0's latents broadcast run on the host copy; then the preview, the
 * step's tensors released and the callbacks. The run's step caches are made, attached to
 * the transformer and freed here, through the transformer base; FLUX.2's hook switches
 * between its two cache contexts per step.
 */
#include <math.h>
#include <stdio.h>

#include "pipelines/denoise.h"

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/inpaint.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"
#include "sched/flow_match_euler.h"

df_status df_denoise_scheduler_config(const df_pipeline *p, const df_model_index *idx,
                                      df_scheduler_config *out)
{
    char dir[DF_PATH_MAX], path[DF_PATH_MAX + 32];
    DF_TRY(df_pipeline_component_dir(p, idx, "scheduler", dir, sizeof dir));
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    df_scheduler *s = NULL;
    DF_TRY(df_scheduler_load(path, &s));
    *out = *df_scheduler_get_config(s);
    df_scheduler_free(s);
    return DF_OK;
}

df_status df_denoise_prepare_transformer(const df_pipeline *p, df_transformer *t,
                                         bool sequential)
{
    if (p->opts.compile)
        DF_TRY(df_transformer_compile(t));
    if (p->opts.compile_blocks)
        DF_TRY(df_transformer_compile_repeated_blocks(t->kind, t,
                                                      &(df_compile_opts){.fullgraph = true}));
    if (sequential && p->opts.offload == DF_OFFLOAD_SEQUENTIAL)
        DF_TRY(df_transformer_set_sequential_offload(t->kind, t, true));
    return DF_OK;
}

df_status df_denoise_check_steps(int steps, int max_seq, int max_seq_limit)
{
    if (steps < 1 || steps > 1000)
        return df_errorf(DF_E_ARG, "steps must be in [1, 1000], not %d", steps);
    if (max_seq < 1 || max_seq > max_seq_limit)
        return df_errorf(DF_E_ARG, "max_sequence_length must be in [1, %d], not %d",
                         max_seq_limit, max_seq);
    return DF_OK;
}

df_status df_denoise_check_prompts(const df_gen_params *g, int np)
{
    if (g->prompt_embeds)
        return DF_OK;
    if (np < 1 || (!g->prompts && !g->prompt))
        return df_errorf(DF_E_ARG, "no prompt given");
    for (int i = 0; g->prompts && i < np; i++)
        if (!g->prompts[i])
            return df_errorf(DF_E_ARG, "prompt %d of %d is NULL", i, np);
    return DF_OK;
}

df_status df_denoise_scheduler(const df_scheduler_config *cfg, int steps, bool linear,
                               const double *mu, int first, df_scheduler **out)
{
    DF_TRY(df_scheduler_create(cfg, out));
    double *sig = linear ? df_malloc((size_t)steps * sizeof *sig) : NULL;
    df_status s = sig || !linear ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    if (s == DF_OK && linear)
        df_linspace(1.0, 1.0 / steps, steps, sig);
    if (s == DF_OK)
        s = df_scheduler_set_timesteps(*out, steps, sig, mu);
    df_free(sig);
    if (s == DF_OK)
        s = df_scheduler_set_begin_index(*out, first);
    if (s != DF_OK) {
        df_scheduler_free(*out);
        *out = NULL;
    }
    return s;
}

/* The step cache's trace and measured changes into the output (c, out may be NULL). */
static void cache_trace(const df_step_cache *c, df_gen_output *out)
{
    if (!c || !out)
        return;
    snprintf(out->cache_trace, sizeof out->cache_trace, "%s", df_step_cache_trace(c));
    int n;
    const double *d = df_step_cache_diffs(c, &n);
    for (int i = 0; i < 1000; i++)
        out->cache_diff[i] = i < n ? d[i] : NAN;
}

/* g->preview after a step: the first image's denoised estimate, decoded by the model. */
static df_status preview(df_pipeline *p, const df_gen_params *g, const df_denoise *d, df_tensor *x,
                         df_tensor *v, const float *lat, const float *v_host, float sigma, int step,
                         int steps)
{
    float *x0;
    DF_TRY(df_pipeline_preview_latents(p->ctx, x, v, lat, v_host, d->B * d->n, d->n, sigma, &x0));
    df_gen_output tmp = {0};
    df_status s = d->decode(d->model, x0, &tmp);
    if (s == DF_OK)
        g->preview(step, steps, tmp.images[0], g->progress_user);
    df_gen_output_free(&tmp);
    df_free(x0);
    return s;
}

df_status df_denoise_run(df_pipeline *p, const df_gen_params *g, const df_denoise *d, float *lat)
{
    df_ctx *ctx = p->ctx;
    int64_t n = d->B * d->n;
    int steps = d->steps - d->first; /* as the callbacks count them */
    bool on_device = !df_pipeline_host_step(g) && !df_pipeline_tp(p) && !d->blend;
    float *v_host = on_device ? NULL : df_malloc((size_t)n * sizeof *v_host);
    if (!on_device && !v_host)
        return df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n);
    df_status s = df_transformer_enable_cache(d->transformer, g->cache, d->cache_contexts);
    if (s != DF_OK) {
        df_free(v_host);
        return s;
    }
    /* Offloading: the transformer stays resident for the loop, unless its blocks come and go
     * one by one (sequential offload). */
    df_weight_set *resident = p->opts.offload != DF_OFFLOAD_NONE && !d->transformer->rep.sequential
                                  ? d->transformer->ws
                                  : NULL;
    if (resident)
        df_pipeline_onload(p, resident);
    df_scope mark = df_scope_begin(ctx);
    df_tensor *x =
        on_device ? df_tensor_from_host(ctx, DF_DTYPE_F32, d->shape, d->ndim, lat) : NULL;
    s = df_ctx_status(ctx);
    double t0 = df_now();
    for (int i = d->first; i < d->steps && s == DF_OK; i++) {
        df_denoise_step st = {
            .x = on_device ? x : df_tensor_from_host(ctx, DF_DTYPE_F32, d->shape, d->ndim, lat),
            .i = i,
            .t = df_scheduler_timesteps(d->sched)[i],
            .on_device = on_device,
        };
        df_tensor *v = NULL;
        s = d->predict(d->model, &st, &v);
        if (s == DF_OK && on_device)
            s = df_scheduler_step_tensor(d->sched, ctx, v, &x);
        if (s == DF_OK && !d->marks_step)
            s = df_mark_step(ctx);
        if (s == DF_OK && !on_device)
            s = d->read ? d->read(d->model, v, v_host)
                        : df_tensor_read(ctx, v, DF_DTYPE_F32, v_host, (size_t)n * sizeof *v_host);
        s = df_pipeline_tp_check(p, s); /* the sharded forward */
        if (s == DF_OK && !on_device)
            s = df_scheduler_step(d->sched, v_host, lat, n);
        if (s == DF_OK && d->blend)
            df_inpaint_blend(d->blend, df_scheduler_sigmas(d->sched), i, d->steps, lat);
        if (s == DF_OK && !on_device) /* the ranks stay identical */
            s = df_pipeline_tp_share(p, lat, (size_t)n * sizeof *lat);
        int done = i + 1 - d->first;
        if (s == DF_OK && df_pipeline_preview_due(g, done, steps))
            s = preview(p, g, d, on_device ? x : NULL, on_device ? v : NULL, lat, v_host,
                        df_scheduler_sigmas(d->sched)[i + 1], done, steps);
        x = df_scope_end(ctx, mark, x); /* the step's tensors go; the new latents stay */
        if (s == DF_OK)
            s = df_pipeline_step_done(g, done, steps, df_now() - t0);
    }
    if (s == DF_OK && on_device)
        s = df_tensor_read(ctx, x, DF_DTYPE_F32, lat, (size_t)n * sizeof *lat);
    df_scope_end(ctx, mark, NULL);
    if (s == DF_OK && resident)
        s = df_pipeline_offload(p, resident);
    cache_trace(df_transformer_step_cache(d->transformer), d->out);
    df_transformer_disable_cache(d->transformer);
    df_free(v_host);
    return s;
}

df_status df_denoise_decode(df_pipeline *p, df_vae *vae, df_tensor *z, bool tiling, bool phase,
                            int64_t B, int64_t H, int64_t W, df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    int64_t n_img = B * 3 * H * W;
    float *decoded = df_malloc((size_t)n_img * sizeof *decoded);
    df_status s = decoded ? DF_OK : df_errorf(DF_E_OOM, "out of memory for the image");
    df_tensor *img = NULL;
    if (s == DF_OK)
        s = df_vae_decode_auto(ctx, vae, z, tiling, &img); /* tiles by itself when short */
    if (s == DF_OK)
        s = df_tensor_read(ctx, img, DF_DTYPE_F32, decoded, (size_t)n_img * sizeof *decoded);
    if (phase) {
        if (s == DF_OK)
            s = df_pipeline_offload(p, df_vae_weight_set(vae));
        df_pipeline_note_phase(p, out, "decode");
    }
    if (s == DF_OK) {
        out->count = (int)B;
        out->images = df_calloc((size_t)B, sizeof *out->images);
        out->image_f32 = df_malloc((size_t)n_img * sizeof *out->image_f32);
        s = out->images && out->image_f32 ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    }
    if (s == DF_OK)
        s = df_vae_postprocess_f32(decoded, B, 3, H, W, out->image_f32);
    for (int64_t b = 0; b < B && s == DF_OK; b++) {
        s = df_image_create((int)W, (int)H, &out->images[b]);
        if (s == DF_OK)
            s = df_vae_postprocess_rgb8(decoded + (size_t)(b * 3 * H * W), 1, 3, H, W,
                                        out->images[b]->pixels);
    }
    df_free(decoded);
    return s;
}
