/*
 * Flux2Pipeline (FLUX.2-dev) and Flux2KleinPipeline (FLUX.2 [klein]), as diffusers'
 * pipeline_flux2.py and pipeline_flux2_klein.py run them, from prompt embeddings.
 *
 * Latents: FLUX.2 works in the VAE's patchified, batch-norm-normalised space. The noise is
 * randn (B, 128, H/16, W/16) from one torch-compatible generator (or latents given in that
 * layout), packed to tokens (B, (H/16)(W/16), 128) with ids (0, h, w, 0); the prompt
 * embeddings get ids (0, 0, 0, l) (sched/flux2_latents.c). Schedule: sigmas linspace(1,
 * 1/n, n) shifted with compute_empirical_mu(image tokens, n), FLUX.2's own rule. Each step
 * calls the transformer with t / 1000 as the timestep; the flow-match Euler step runs on
 * the host in float32, exactly as the scheduler does it.
 *
 * Guidance: Flux2Pipeline passes guidance_scale to the transformer's guidance embedder (one
 * forward per step; default 50 steps, 4.0). Flux2KleinPipeline has no guidance embedder:
 * a distilled checkpoint (model_index.json "is_distilled": true) runs one forward per step
 * and ignores the scale (defaults 4 steps, 1.0); a base checkpoint runs real classifier-
 * free guidance, neg + scale * (cond - neg) in float32, when the scale is above 1, with the
 * negative prompt embeddings (defaults 50 steps, 4.0).
 *
 * Decoding: the tokens are scattered back by their ids, de-normalised by the VAE's
 * batch-norm statistics, unpatchified to (B, 32, H/8, W/8) and decoded (vae.h). The
 * latents returned are, as diffusers returns them for output_type "latent", the packed
 * tokens for Flux2Pipeline and the decoder's input for Flux2KleinPipeline (which un-packs
 * before its output_type check).
 *
 * Not implemented yet: prompts (the Mistral 3 and Qwen3 text encoders and their
 * tokenizers), reference images, tensor parallelism. A folder whose text encoder is listed
 * loads; a run with prompts instead of embeddings fails with DF_E_UNSUPPORTED.
 */
#include <math.h>
#include <string.h>

#include <diffuse/flux2.h>
#include <diffuse/rng.h>
#include <diffuse/scheduler.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/residency.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"
#include "sched/flux2_latents.h"

typedef struct flux2_pipe {
    bool klein;        /* Flux2KleinPipeline */
    bool is_distilled; /* klein: step-wise distilled (no CFG) */
    df_flux2 *transformer;
    df_vae *vae;
    df_scheduler_config sched;
    df_compiled *compiled; /* the transformer's forward, when compiled */
} flux2_pipe;

/* The transformer's forward as a module, for df_compile. Inputs in df_flux2_inputs order. */
static df_status transformer_forward(df_ctx *ctx, void *self, df_tensor *const *in,
                                     df_tensor **out)
{
    df_flux2_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5]};
    out[0] = df_flux2_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module transformer_module = {
    .name = "Flux2Transformer2DModel", .n_in = 6, .n_out = 1, .forward = transformer_forward};

static void flux2_free(void *impl)
{
    flux2_pipe *f = impl;
    df_flux2_free(f->transformer);
    df_vae_free(f->vae);
    df_compiled_free(f->compiled);
    df_free(f);
}

static df_status expect_class(const df_pipeline *p, const df_model_index *idx, const char *name,
                              const char *cls)
{
    const df_component *c = df_model_index_find(idx, name);
    if (c && c->cls && strcmp(c->cls, cls) != 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s/model_index.json: component '%s' is a %s; %s supports %s", p->dir,
                         name, c->cls, p->cls->name, cls);
    return DF_OK;
}

static df_status flux2_load(df_pipeline *p, const df_model_index *idx)
{
    flux2_pipe *f = df_calloc(1, sizeof *f);
    if (!f)
        return df_errorf(DF_E_OOM, "out of memory");
    p->impl = f;
    f->klein = strcmp(p->cls->name, "Flux2KleinPipeline") == 0;
    if (f->klein)
        DF_TRY(df_json_get_bool_or(df_model_index_json(idx), "is_distilled", false,
                                   &f->is_distilled));
    DF_TRY(expect_class(p, idx, "transformer", "Flux2Transformer2DModel"));
    DF_TRY(expect_class(p, idx, "vae", "AutoencoderKLFlux2"));
    DF_TRY(expect_class(p, idx, "scheduler", "FlowMatchEulerDiscreteScheduler"));

    char dir[4096], path[4200];
    DF_TRY(df_pipeline_component_dir(p, idx, "scheduler", dir, sizeof dir));
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    df_scheduler *s = NULL;
    DF_TRY(df_scheduler_load(path, &s));
    f->sched = *df_scheduler_get_config(s);
    df_scheduler_free(s);

    DF_TRY(df_pipeline_component_dir(p, idx, "transformer", dir, sizeof dir));
    DF_TRY_CTX(df_flux2_load(p->ctx, dir, &f->transformer), "%s", dir);
    DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
    DF_TRY_CTX(df_vae_load(p->ctx, dir, &f->vae), "%s", dir);
    const df_flux2_cfg *c = df_flux2_config(f->transformer);
    if (!df_vae_config(f->vae)->flux2 ||
        c->in_channels != df_vae_config(f->vae)->bn_channels)
        return df_errorf(DF_E_FORMAT,
                         "%s: the transformer takes %lld latent channels but the VAE's "
                         "patchified latents have %lld",
                         p->dir, (long long)c->in_channels,
                         (long long)df_vae_config(f->vae)->bn_channels);

    if (p->opts.compile)
        DF_TRY(df_compile(&transformer_module, &(df_compile_opts){.fullgraph = true},
                          &f->compiled));
    if (p->opts.compile_blocks)
        DF_TRY(df_flux2_compile_repeated_blocks(f->transformer,
                                                &(df_compile_opts){.fullgraph = true}));
    if (p->opts.offload == DF_OFFLOAD_SEQUENTIAL)
        DF_TRY(df_flux2_set_sequential_offload(f->transformer, true));
    /* With offloading nothing stays resident after loading. */
    DF_TRY(df_pipeline_offload(p, df_flux2_weight_set(f->transformer)));
    DF_TRY(df_pipeline_offload(p, df_vae_weight_set(f->vae)));
    bool distilled = f->klein && f->is_distilled;
    p->default_steps = distilled ? 4 : 50;
    p->default_guidance = distilled ? 1.0f : 4.0f;
    p->default_max_seq = 512;
    p->default_size = 1024;
    return DF_OK;
}

/* A run's sizes. h, w: the patch grid (H/16, W/16); S = h * w image tokens. */
typedef struct run_sizes {
    int H, W, steps, factor;
    int64_t B, L, h, w, S, C; /* C: patchified channels (128) */
    float guidance;
    bool cfg; /* klein base with guidance > 1: a second, negative forward per step */
} run_sizes;

static df_status resolve(const df_pipeline *p, const flux2_pipe *f, const df_gen_params *g,
                         run_sizes *r)
{
    int per = g->num_images > 0 ? g->num_images : 1;
    *r = (run_sizes){
        .H = g->height ? g->height : p->default_size,
        .W = g->width ? g->width : p->default_size,
        .steps = g->steps ? g->steps : p->default_steps,
        .guidance = g->guidance_set ? g->guidance : p->default_guidance,
        .factor = (int)df_vae_config(f->vae)->scale_factor * 2,
        .L = g->prompt_embeds_len,
        .C = df_flux2_config(f->transformer)->in_channels,
    };
    r->B = (int64_t)(g->n_prompts > 1 ? g->n_prompts : 1) * per;
    r->cfg = f->klein && !f->is_distilled && r->guidance > 1.0f;
    if (!g->prompt_embeds)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: prompts are not supported for %s yet (its text encoder is not "
                         "implemented): pass prompt embeddings",
                         p->dir, p->cls->name);
    if (g->prompt_embeds_len < 1)
        return df_errorf(DF_E_ARG, "prompt embeddings need their length");
    if (r->cfg && !g->negative_prompt_embeds)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: classifier-free guidance (guidance %g > 1, not distilled) needs "
                         "negative prompt embeddings until the text encoder is implemented",
                         p->dir, (double)r->guidance);
    if (r->H < r->factor || r->W < r->factor)
        return df_errorf(DF_E_ARG, "height %d and width %d must be at least %d", r->H, r->W,
                         r->factor);
    if (r->steps < 1 || r->steps > 1000)
        return df_errorf(DF_E_ARG, "steps must be in [1, 1000], not %d", r->steps);
    if (!isfinite(r->guidance))
        return df_errorf(DF_E_ARG, "guidance must be a finite number");
    /* prepare_latents: 2 * (H // (f * 2)) latent rows, patchified 2x2 */
    r->h = r->H / r->factor;
    r->w = r->W / r->factor;
    r->S = r->h * r->w;
    return DF_OK;
}

/* Creates the scheduler with FLUX.2's sigmas and empirical mu. */
static df_status make_scheduler(const flux2_pipe *f, const run_sizes *r, df_scheduler **out)
{
    DF_TRY(df_scheduler_create(&f->sched, out));
    double *sig = df_malloc((size_t)r->steps * sizeof *sig);
    if (!sig)
        return df_errorf(DF_E_OOM, "out of memory");
    df_linspace(1.0, 1.0 / r->steps, r->steps, sig);
    double mu = df_flux2_compute_empirical_mu(r->S, r->steps);
    df_status s = df_scheduler_set_timesteps(*out, r->steps, sig, &mu);
    df_free(sig);
    return s == DF_OK ? df_scheduler_set_begin_index(*out, 0) : s;
}

/* The ids of S image tokens and L text tokens, as f32 [S, 4] and [L, 4] tensors. */
static df_status make_ids(df_ctx *ctx, const run_sizes *r, df_tensor **img, df_tensor **txt)
{
    int64_t *li = df_malloc((size_t)(r->S * 4) * sizeof *li);
    int64_t *ti = df_malloc((size_t)(r->L * 4) * sizeof *ti);
    float *v = df_malloc((size_t)((r->S > r->L ? r->S : r->L) * 4) * sizeof *v);
    df_status s = li && ti && v ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    if (s == DF_OK) {
        df_flux2_latent_ids(1, r->h, r->w, li);
        df_flux2_text_ids(1, r->L, ti);
        for (int64_t i = 0; i < r->S * 4; i++)
            v[i] = (float)li[i];
        *img = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->S, 4), v);
        for (int64_t i = 0; i < r->L * 4; i++)
            v[i] = (float)ti[i];
        *txt = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->L, 4), v);
        s = df_ctx_status(ctx);
    }
    df_free(li);
    df_free(ti);
    df_free(v);
    return s;
}

/* One transformer forward: the velocity for the packed latents (host) read back into v. */
static df_status predict(df_pipeline *p, flux2_pipe *f, const run_sizes *r, const float *lat,
                         float t, df_tensor *embeds, df_tensor *img_ids, df_tensor *txt_ids,
                         float *v)
{
    df_ctx *ctx = p->ctx;
    bool guided = df_flux2_config(f->transformer)->guidance_embeds;
    float *ts = df_malloc((size_t)r->B * sizeof *ts), *gs = df_malloc((size_t)r->B * sizeof *gs);
    if (!ts || !gs) {
        df_free(ts);
        df_free(gs);
        return df_errorf(DF_E_OOM, "out of memory");
    }
    for (int64_t b = 0; b < r->B; b++) {
        ts[b] = (float)((double)t / 1000.0);
        gs[b] = r->guidance;
    }
    df_flux2_inputs in = {
        .hidden_states = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B, r->S, r->C), lat),
        .encoder_hidden_states = embeds,
        .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B), ts),
        .img_ids = img_ids,
        .txt_ids = txt_ids,
        .guidance = guided ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B), gs) : NULL,
    };
    df_free(ts);
    df_free(gs);
    df_tensor *out = NULL;
    df_status s = DF_OK;
    if (f->compiled) {
        df_tensor *args[6] = {in.hidden_states, in.encoder_hidden_states, in.timestep,
                              in.img_ids, in.txt_ids, in.guidance};
        s = df_compiled_call(ctx, f->compiled, f->transformer, args, &out);
    } else {
        out = df_flux2_forward(ctx, f->transformer, &in);
    }
    if (s == DF_OK)
        s = df_mark_step(ctx);
    size_t n = (size_t)(r->B * r->S * r->C);
    if (s == DF_OK)
        s = df_tensor_read(ctx, out, DF_DTYPE_F32, v, n * sizeof *v);
    return s;
}

/* The denoising loop over the packed latents lat [B, S, C] (in place). */
static df_status denoise(df_pipeline *p, flux2_pipe *f, const df_gen_params *g,
                         const run_sizes *r, df_tensor *embeds, df_tensor *neg, float *lat)
{
    df_ctx *ctx = p->ctx;
    int64_t n = r->B * r->S * r->C;
    float *v = df_malloc((size_t)n * sizeof *v);
    float *vn = r->cfg ? df_malloc((size_t)n * sizeof *vn) : NULL;
    df_scheduler *sched = NULL;
    df_tensor *img_ids = NULL, *txt_ids = NULL;
    df_status s = v && (vn || !r->cfg) ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    if (s == DF_OK)
        s = make_scheduler(f, r, &sched);
    if (s == DF_OK)
        s = make_ids(ctx, r, &img_ids, &txt_ids);
    if (p->opts.offload == DF_OFFLOAD_MODEL)
        df_pipeline_onload(p, df_flux2_weight_set(f->transformer));
    double t0 = df_now();
    for (int i = 0; i < r->steps && s == DF_OK; i++) {
        df_scope mark = df_scope_begin(ctx);
        float t = df_scheduler_timesteps(sched)[i];
        s = predict(p, f, r, lat, t, embeds, img_ids, txt_ids, v);
        if (s == DF_OK && r->cfg)
            s = predict(p, f, r, lat, t, neg, img_ids, txt_ids, vn);
        if (s == DF_OK && r->cfg) /* neg + scale * (cond - neg), each op in float32 */
            for (int64_t j = 0; j < n; j++)
                v[j] = vn[j] + r->guidance * (v[j] - vn[j]);
        if (s == DF_OK)
            s = df_scheduler_step(sched, v, lat, n);
        df_scope_end(ctx, mark, NULL);
        if (s == DF_OK && g->progress)
            g->progress(i + 1, r->steps, df_now() - t0, g->progress_user);
    }
    df_scheduler_free(sched);
    if (s == DF_OK && p->opts.offload == DF_OFFLOAD_MODEL)
        s = df_pipeline_offload(p, df_flux2_weight_set(f->transformer));
    df_free(v);
    df_free(vn);
    return s;
}

/* The packed tokens lat [B, S, C] -> the decoder's input [B, C/4, 2h, 2w]: scattered by
 * their ids, de-normalised, unpatchified. */
static df_status to_decoder_input(df_ctx *ctx, const flux2_pipe *f, const run_sizes *r,
                                  const float *lat, df_tensor **out)
{
    int64_t *ids = df_malloc((size_t)(r->B * r->S * 4) * sizeof *ids);
    if (!ids)
        return df_errorf(DF_E_OOM, "out of memory");
    df_flux2_latent_ids(r->B, r->h, r->w, ids);
    df_tensor *packed = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B, r->S, r->C), lat);
    df_tensor *z = NULL;
    df_status s = packed ? df_vae_unpack_latents_with_ids(ctx, packed, ids, &z)
                         : df_ctx_status(ctx);
    df_free(ids);
    if (s == DF_OK)
        s = df_vae_bn_denormalize(ctx, f->vae, z, &z);
    if (s == DF_OK)
        s = df_vae_unpatchify_latents(ctx, z, &z);
    *out = s == DF_OK ? z : NULL;
    return s;
}

/* Decodes the packed latents into the output's images; for klein, *unpacked receives the
 * decoder's input [B, C/4, 2h, 2w] on the host (malloc'd). */
static df_status decode(df_pipeline *p, flux2_pipe *f, const df_gen_params *g,
                        const run_sizes *r, const float *lat, float **unpacked,
                        df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    int64_t B = r->B, H = 16 * r->h, W = 16 * r->w, n_img = B * 3 * H * W;
    df_pipeline_onload(p, df_vae_weight_set(f->vae));
    float *decoded = df_malloc((size_t)n_img * sizeof *decoded);
    df_status s = decoded ? DF_OK : df_errorf(DF_E_OOM, "out of memory for the image");
    df_tensor *z = NULL, *img = NULL;
    if (s == DF_OK)
        s = to_decoder_input(ctx, f, r, lat, &z);
    if (s == DF_OK && unpacked) {
        int64_t n = B * r->C * r->S;
        *unpacked = df_malloc((size_t)n * sizeof **unpacked);
        s = *unpacked ? df_tensor_read(ctx, z, DF_DTYPE_F32, *unpacked, (size_t)n * sizeof(float))
                      : df_errorf(DF_E_OOM, "out of memory");
    }
    if (s == DF_OK)
        s = g->vae_tiling ? df_vae_decode_tiled(ctx, f->vae, z, 64, 8, &img)
                          : df_vae_decode(ctx, f->vae, z, &img);
    if (s == DF_OK)
        s = df_tensor_read(ctx, img, DF_DTYPE_F32, decoded, (size_t)n_img * sizeof *decoded);
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_vae_weight_set(f->vae));
    df_pipeline_note_phase(p, out, "decode");
    if (s == DF_OK) {
        out->count = (int)B;
        out->images = df_calloc((size_t)B, sizeof *out->images);
        out->image_f32 = df_malloc((size_t)n_img * sizeof *out->image_f32);
        s = out->images && out->image_f32 ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
        if (s == DF_OK)
            s = df_vae_postprocess_f32(decoded, B, 3, H, W, out->image_f32);
        for (int64_t b = 0; b < B && s == DF_OK; b++) {
            s = df_image_create((int)W, (int)H, &out->images[b]);
            if (s == DF_OK)
                s = df_vae_postprocess_rgb8(decoded + (size_t)(b * 3 * H * W), 1, 3, H, W,
                                            out->images[b]->pixels);
        }
    }
    df_free(decoded);
    return s;
}

/* The starting tokens: the given latents [B, C, h, w] or seeded noise, packed. */
static df_status initial_latents(const df_gen_params *g, const run_sizes *r, float *lat)
{
    int64_t n = r->B * r->C * r->S;
    float *scratch = df_malloc((size_t)n * sizeof *scratch);
    if (!scratch)
        return df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n);
    df_status s = DF_OK;
    if (g->latents) {
        df_flux2_pack_latents(g->latents, r->B, r->C, r->h, r->w, lat);
    } else {
        df_rng rng;
        df_rng_init(&rng, g->seed);
        s = df_flux2_noise(&rng, r->B, r->C, r->h, r->w, scratch, lat);
    }
    df_free(scratch);
    return s;
}

/* Embeddings for B rows from the caller's B / per rows, each repeated per times in a row
 * (num_images_per_prompt). */
static df_tensor *upload_embeds(df_ctx *ctx, const run_sizes *r, int per, int64_t D,
                                const float *e)
{
    size_t row = (size_t)(r->L * D);
    float *rep = df_malloc((size_t)r->B * row * sizeof *rep);
    if (!rep) {
        df_errorf(DF_E_OOM, "out of memory for prompt embeddings");
        return NULL;
    }
    for (int64_t b = 0; b < r->B; b++)
        memcpy(rep + (size_t)b * row, e + (size_t)(b / per) * row, row * sizeof *rep);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B, r->L, D), rep);
    df_free(rep);
    return t;
}

static df_status flux2_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    flux2_pipe *f = p->impl;
    df_ctx *ctx = p->ctx;
    run_sizes r;
    DF_TRY(resolve(p, f, g, &r));
    int64_t D = df_flux2_config(f->transformer)->joint_attention_dim, n = r.B * r.S * r.C;

    df_scope outer = df_scope_begin(ctx);
    df_stats_reset_resident_peak(ctx); /* phases report their own peaks, not the load's */
    int per = g->num_images > 0 ? g->num_images : 1;
    df_tensor *embeds = upload_embeds(ctx, &r, per, D, g->prompt_embeds);
    df_tensor *neg = r.cfg ? upload_embeds(ctx, &r, per, D, g->negative_prompt_embeds) : NULL;
    float *lat = df_malloc((size_t)n * sizeof *lat), *unpacked = NULL;
    df_status s = df_ctx_status(ctx);
    if (s == DF_OK && !lat)
        s = df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n);
    if (s == DF_OK)
        s = initial_latents(g, &r, lat);
    if (s == DF_OK)
        s = denoise(p, f, g, &r, embeds, neg, lat);
    df_pipeline_note_phase(p, out, "denoise");
    if (s == DF_OK)
        s = decode(p, f, g, &r, lat, f->klein ? &unpacked : NULL, out);
    if (s == DF_OK) {
        out->width = (int)(16 * r.w);
        out->height = (int)(16 * r.h);
        out->steps = r.steps;
        out->guidance = r.guidance;
        if (f->klein) { /* the decoder's input, as Flux2KleinPipeline returns it */
            out->latents = unpacked;
            unpacked = NULL;
            out->latents_ndim = 4;
            out->latents_shape[0] = r.B, out->latents_shape[1] = r.C / 4;
            out->latents_shape[2] = 2 * r.h, out->latents_shape[3] = 2 * r.w;
        } else {
            out->latents = lat;
            lat = NULL;
            out->latents_ndim = 3;
            out->latents_shape[0] = r.B, out->latents_shape[1] = r.S, out->latents_shape[2] = r.C;
        }
    }
    df_free(lat);
    df_free(unpacked);
    df_scope_end(ctx, outer, NULL);
    return s;
}

const df_pipeline_kind df_flux2_pipeline_class = {
    .name = "Flux2Pipeline",
    .load = flux2_load,
    .run = flux2_run,
    .free = flux2_free,
};

const df_pipeline_kind df_flux2_klein_pipeline_class = {
    .name = "Flux2KleinPipeline",
    .load = flux2_load,
    .run = flux2_run,
    .free = flux2_free,
};
