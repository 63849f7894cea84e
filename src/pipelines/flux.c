/*
 * FluxPipeline (FLUX.1 schnell and dev), as diffusers' pipeline_flux.py runs it.
 *
 * Prompts: CLIP-L's pooled output and T5's last hidden state (no attention mask), 77 and
 * max_sequence_length tokens. Noise: (B, 16, 2*(H/16), 2*(W/16)) drawn in float32 from one
 * torch-compatible generator, packed into 2x2 patches. Schedule: sigmas linspace(1, 1/n, n)
 * with mu from the packed sequence length. Each step calls the transformer with sigma as
 * the timestep, then the flow-match Euler step runs on the host in float32 (exactly as the
 * scheduler does it); df_mark_step() marks the step. Decoding unpacks, un-scales and runs
 * the VAE decoder.
 *
 * Defaults come from the model: a transformer without guidance embedding is schnell-like
 * (4 steps, guidance ignored, 256 T5 tokens), one with it is dev-like (28 steps, guidance
 * 3.5, 512 tokens). Components listed as null in model_index.json are allowed when the
 * caller passes prompt embeddings instead of prompts.
 */
#include <math.h>
#include <string.h>

#include <diffuse/clip.h>
#include <diffuse/flux.h>
#include <diffuse/rng.h>
#include <diffuse/scheduler.h>
#include <diffuse/t5.h>
#include <diffuse/tokenizer.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/residency.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"

typedef struct flux_pipe {
    df_tokenizer *tok_clip, *tok_t5;
    df_clip *clip;
    df_t5 *t5;
    df_flux *transformer;
    df_vae *vae;
    df_scheduler_config sched;
    df_compiled *compiled; /* the transformer's forward, when compiled */
} flux_pipe;

/* The transformer's forward as a module, for df_compile. Inputs in df_flux_inputs order. */
static df_status transformer_forward(df_ctx *ctx, void *self, df_tensor *const *in,
                                     df_tensor **out)
{
    df_flux_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
    out[0] = df_flux_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module transformer_module = {
    .name = "FluxTransformer2DModel", .n_in = 7, .n_out = 1, .forward = transformer_forward};

static void flux_free(void *impl)
{
    flux_pipe *f = impl;
    df_tokenizer_free(f->tok_clip);
    df_tokenizer_free(f->tok_t5);
    df_clip_free(f->clip);
    df_t5_free(f->t5);
    df_flux_free(f->transformer);
    df_vae_free(f->vae);
    df_compiled_free(f->compiled);
    df_free(f);
}

/* Offloading: a component is made resident before it runs and released after. */
static void onload(const df_pipeline *p, df_weight_set *ws)
{
    if (ws && p->opts.offload != DF_OFFLOAD_NONE)
        df_ws_acquire(ws, NULL);
}

static df_status offload(const df_pipeline *p, df_weight_set *ws)
{
    return ws && p->opts.offload != DF_OFFLOAD_NONE ? df_ws_release(ws, NULL) : DF_OK;
}

static df_status expect_class(const df_pipeline *p, const df_model_index *idx, const char *name,
                              const char *cls)
{
    const df_component *c = df_model_index_find(idx, name);
    if (c && c->cls && strcmp(c->cls, cls) != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s/model_index.json: component '%s' is a %s; "
                         "FluxPipeline supports %s", p->dir, name, c->cls, cls);
    return DF_OK;
}

static df_status flux_load(df_pipeline *p, const df_model_index *idx)
{
    flux_pipe *f = df_calloc(1, sizeof *f);
    if (!f)
        return df_errorf(DF_E_OOM, "out of memory");
    p->impl = f;
    char dir[4096];
    DF_TRY(expect_class(p, idx, "transformer", "FluxTransformer2DModel"));
    DF_TRY(expect_class(p, idx, "vae", "AutoencoderKL"));
    DF_TRY(expect_class(p, idx, "text_encoder", "CLIPTextModel"));
    DF_TRY(expect_class(p, idx, "text_encoder_2", "T5EncoderModel"));
    DF_TRY(expect_class(p, idx, "scheduler", "FlowMatchEulerDiscreteScheduler"));

    DF_TRY(df_pipeline_component_dir(p, idx, "scheduler", dir, sizeof dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/scheduler_config.json", dir);
    df_scheduler *s = NULL;
    DF_TRY(df_scheduler_load(path, &s));
    f->sched = *df_scheduler_get_config(s);
    df_scheduler_free(s);

    DF_TRY(df_pipeline_component_dir(p, idx, "transformer", dir, sizeof dir));
    DF_TRY_CTX(df_flux_load(p->ctx, dir, &f->transformer), "%s", dir);
    DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
    DF_TRY_CTX(df_vae_load(p->ctx, dir, &f->vae), "%s", dir);
    /* Text side: optional as a whole (prompt embeddings may be given instead). */
    bool text = df_pipeline_has_component(idx, "text_encoder") ||
                df_pipeline_has_component(idx, "text_encoder_2");
    if (text) {
        static const char *const parts[] = {"tokenizer", "tokenizer_2", "text_encoder",
                                            "text_encoder_2"};
        for (int i = 0; i < 4; i++)
            DF_TRY(df_pipeline_component_dir(p, idx, parts[i], dir, sizeof dir));
        DF_TRY(df_pipeline_component_dir(p, idx, "tokenizer", dir, sizeof dir));
        DF_TRY_CTX(df_tokenizer_load(dir, &f->tok_clip), "%s", dir);
        DF_TRY(df_pipeline_component_dir(p, idx, "tokenizer_2", dir, sizeof dir));
        DF_TRY_CTX(df_tokenizer_load(dir, &f->tok_t5), "%s", dir);
        DF_TRY(df_pipeline_component_dir(p, idx, "text_encoder", dir, sizeof dir));
        DF_TRY_CTX(df_clip_load(p->ctx, dir, &f->clip), "%s", dir);
        DF_TRY(df_pipeline_component_dir(p, idx, "text_encoder_2", dir, sizeof dir));
        DF_TRY_CTX(df_t5_load(p->ctx, dir, &f->t5), "%s", dir);
        const df_flux_cfg *c = df_flux_config(f->transformer);
        if (df_t5_get_config(f->t5)->d_model != c->joint_attention_dim ||
            df_clip_get_config(f->clip)->hidden_size != c->pooled_projection_dim)
            return df_errorf(DF_E_FORMAT, "%s: text encoder widths (T5 %lld, CLIP %lld) do not "
                             "match the transformer's joint_attention_dim %lld and "
                             "pooled_projection_dim %lld", p->dir,
                             (long long)df_t5_get_config(f->t5)->d_model,
                             (long long)df_clip_get_config(f->clip)->hidden_size,
                             (long long)c->joint_attention_dim, (long long)c->pooled_projection_dim);
    }
    if (p->opts.compile)
        DF_TRY(df_compile(&transformer_module, &(df_compile_opts){.fullgraph = true},
                          &f->compiled));
    if (p->opts.compile_blocks)
        DF_TRY(df_flux_compile_repeated_blocks(f->transformer,
                                               &(df_compile_opts){.fullgraph = true}));
    if (p->opts.offload == DF_OFFLOAD_SEQUENTIAL)
        DF_TRY(df_flux_set_sequential_offload(f->transformer, true));
    /* With offloading nothing stays resident after loading. */
    DF_TRY(offload(p, f->clip ? df_clip_weight_set(f->clip) : NULL));
    DF_TRY(offload(p, f->t5 ? df_t5_weight_set(f->t5) : NULL));
    DF_TRY(offload(p, df_flux_weight_set(f->transformer)));
    DF_TRY(offload(p, df_vae_weight_set(f->vae)));
    bool dev = df_flux_config(f->transformer)->guidance_embeds;
    p->default_steps = dev ? 28 : 4;
    p->default_guidance = dev ? 3.5f : 0.0f;
    p->default_max_seq = dev ? 512 : 256;
    p->default_size = 1024;
    return DF_OK;
}

/* Text side for B rows (each prompt repeated num_images times). */
static df_status encode_prompts(df_pipeline *p, flux_pipe *f, const char *const *prompts, int np,
                                int per, int max_seq, df_tensor **embeds, df_tensor **pooled)
{
    df_ctx *ctx = p->ctx;
    int B = np * per;
    int64_t *clip_ids = df_malloc((size_t)B * 77 * sizeof *clip_ids);
    int64_t *t5_ids = df_malloc((size_t)B * (size_t)max_seq * sizeof *t5_ids);
    df_status s = clip_ids && t5_ids ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    for (int i = 0; i < np && s == DF_OK; i++) {
        df_tokens tc = {0}, tt = {0};
        size_t len = strlen(prompts[i]);
        s = df_tokenizer_encode(f->tok_clip, prompts[i], len,
                                &(df_tokenize_opts){.max_length = 77, .pad = true, .truncate = true},
                                &tc);
        if (s == DF_OK)
            s = df_tokenizer_encode(f->tok_t5, prompts[i], len,
                                    &(df_tokenize_opts){.max_length = max_seq, .pad = true,
                                                        .truncate = true},
                                    &tt);
        if (s == DF_OK && (tc.count != 77 || tt.count != max_seq))
            s = df_errorf(DF_E_INTERNAL, "tokenizer returned %lld/%lld ids", (long long)tc.count,
                          (long long)tt.count);
        for (int r = 0; r < per && s == DF_OK; r++) {
            memcpy(clip_ids + (size_t)(i * per + r) * 77, tc.ids, 77 * sizeof *clip_ids);
            memcpy(t5_ids + (size_t)(i * per + r) * (size_t)max_seq, tt.ids,
                   (size_t)max_seq * sizeof *t5_ids);
        }
        df_tokens_deinit(&tc);
        df_tokens_deinit(&tt);
        if (s != DF_OK)
            s = df_error_context(s, "prompt %d", i);
    }
    if (s == DF_OK) {
        df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, 77), clip_ids);
        df_clip_output co = {0};
        s = ids ? df_clip_encode(ctx, f->clip, ids, clip_ids, &(df_clip_request){0}, &co)
                : df_ctx_status(ctx);
        *pooled = co.pooler_output;
    }
    if (s == DF_OK) {
        df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, max_seq), t5_ids);
        s = ids ? df_t5_encode(ctx, f->t5, ids, NULL, embeds) : df_ctx_status(ctx);
    }
    df_free(clip_ids);
    df_free(t5_ids);
    return s;
}

/* (B, C, h, w) -> (B, (h/2)(w/2), 4C), channel c*4 + dy*2 + dx. */
static void pack_latents(const float *src, float *dst, int64_t B, int64_t C, int64_t h, int64_t w)
{
    int64_t hp = h / 2, wp = w / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t y = 0; y < h; y++)
                for (int64_t x = 0; x < w; x++) {
                    int64_t tok = (y / 2) * wp + x / 2, ch = c * 4 + (y % 2) * 2 + x % 2;
                    dst[(b * hp * wp + tok) * 4 * C + ch] = src[((b * C + c) * h + y) * w + x];
                }
}

static df_status flux_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    flux_pipe *f = p->impl;
    df_ctx *ctx = p->ctx;
    const df_flux_cfg *cfg = df_flux_config(f->transformer);
    const df_vae_info *vi = df_vae_config(f->vae);

    int H = g->height ? g->height : p->default_size, W = g->width ? g->width : p->default_size;
    int steps = g->steps ? g->steps : p->default_steps;
    float guidance = g->guidance_set ? g->guidance : p->default_guidance;
    int max_seq = g->max_sequence_length ? g->max_sequence_length : p->default_max_seq;
    int per = g->num_images > 0 ? g->num_images : 1;
    int factor = (int)vi->scale_factor * 2;
    if (H <= 0 || W <= 0 || H % factor || W % factor)
        return df_errorf(DF_E_ARG, "height %d and width %d must be positive multiples of %d", H, W,
                         factor);
    if (steps < 1 || steps > 1000)
        return df_errorf(DF_E_ARG, "steps must be in [1, 1000], not %d", steps);
    if (max_seq < 1 || max_seq > 512)
        return df_errorf(DF_E_ARG, "max_sequence_length must be in [1, 512], not %d", max_seq);
    if (!isfinite(guidance))
        return df_errorf(DF_E_ARG, "guidance must be a finite number");
    const char *const *prompts = g->prompts;
    int np = g->n_prompts;
    if (!prompts && g->prompt) {
        prompts = &g->prompt;
        np = 1;
    }
    if (!g->prompt_embeds && (np < 1 || !prompts))
        return df_errorf(DF_E_ARG, "no prompt given");
    if (!g->prompt_embeds && !f->t5)
        return df_errorf(DF_E_ARG, "%s has no text encoders: pass prompt embeddings", p->dir);
    if (g->prompt_embeds && (!g->pooled_prompt_embeds || g->prompt_embeds_len < 1))
        return df_errorf(DF_E_ARG, "prompt embeddings need their length and pooled embeddings");
    int B = (g->prompt_embeds ? 1 : np) * per;
    if (g->prompt_embeds && g->n_prompts > 1)
        B = g->n_prompts * per;

    int64_t C = cfg->in_channels / 4;
    int64_t h = 2 * (H / factor), w = 2 * (W / factor);
    int64_t S = (h / 2) * (w / 2), Ci = cfg->in_channels;
    int64_t n_lat = (int64_t)B * S * Ci;

    df_scope outer = df_scope_begin(ctx);
    df_status s = DF_OK;
    df_tensor *embeds = NULL, *pooled = NULL;
    df_stats_reset_resident_peak(ctx);
    int64_t L = max_seq;
    if (g->prompt_embeds) {
        L = g->prompt_embeds_len;
        embeds = df_tensor_from_host(ctx, DF_DTYPE_F32,
                                     DF_SHAPE(B, L, cfg->joint_attention_dim), g->prompt_embeds);
        pooled = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, cfg->pooled_projection_dim),
                                     g->pooled_prompt_embeds);
        s = df_ctx_status(ctx);
    } else {
        onload(p, df_clip_weight_set(f->clip));
        onload(p, df_t5_weight_set(f->t5));
        s = encode_prompts(p, f, prompts, np, per, max_seq, &embeds, &pooled);
        if (s == DF_OK)
            s = offload(p, df_clip_weight_set(f->clip));
        if (s == DF_OK)
            s = offload(p, df_t5_weight_set(f->t5));
        df_pipeline_note_phase(p, out, "encode");
    }

    float *lat = df_malloc((size_t)n_lat * sizeof *lat);
    float *noise = df_malloc((size_t)n_lat * sizeof *noise);
    float *ids = df_malloc((size_t)S * 3 * sizeof *ids);
    float *txt = df_calloc((size_t)L * 3, sizeof *txt);
    float *ts = df_malloc((size_t)B * sizeof *ts), *gs = df_malloc((size_t)B * sizeof *gs);
    if (s == DF_OK && !(lat && noise && ids && txt && ts && gs))
        s = df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n_lat);
    if (s == DF_OK) {
        if (g->latents) {
            memcpy(lat, g->latents, (size_t)n_lat * sizeof *lat);
        } else {
            df_rng rng;
            df_rng_init(&rng, g->seed);
            s = df_rng_randn_f32(&rng, noise, n_lat);
            pack_latents(noise, lat, B, C, h, w);
        }
        for (int64_t y = 0; y < h / 2; y++)
            for (int64_t x = 0; x < w / 2; x++) {
                float *r = ids + (y * (w / 2) + x) * 3;
                r[0] = 0, r[1] = (float)y, r[2] = (float)x;
            }
    }
    df_scheduler *sched = NULL;
    if (s == DF_OK)
        s = df_scheduler_create(&f->sched, &sched);
    if (s == DF_OK) {
        double *sig = df_malloc((size_t)steps * sizeof *sig);
        if (!sig) {
            s = df_errorf(DF_E_OOM, "out of memory");
        } else {
            df_linspace(1.0, 1.0 / steps, steps, sig);
            double mu = df_flux_calculate_shift(S, f->sched.base_image_seq_len,
                                                f->sched.max_image_seq_len, f->sched.base_shift,
                                                f->sched.max_shift);
            s = df_scheduler_set_timesteps(sched, steps, sig, &mu);
            df_free(sig);
        }
    }
    if (s == DF_OK)
        s = df_scheduler_set_begin_index(sched, 0);

    df_tensor *img_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(S, 3), ids);
    df_tensor *txt_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(L, 3), txt);
    if (s == DF_OK)
        s = df_ctx_status(ctx);
    if (p->opts.offload == DF_OFFLOAD_MODEL)
        onload(p, df_flux_weight_set(f->transformer));
    double t0 = df_now();
    for (int i = 0; i < steps && s == DF_OK; i++) {
        df_scope mark = df_scope_begin(ctx);
        float t = df_scheduler_timesteps(sched)[i];
        for (int b = 0; b < B; b++) {
            ts[b] = (float)((double)t / 1000.0);
            gs[b] = guidance;
        }
        df_flux_inputs in = {
            .hidden_states = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, Ci), lat),
            .encoder_hidden_states = embeds,
            .pooled_projections = pooled,
            .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B), ts),
            .img_ids = img_ids,
            .txt_ids = txt_ids,
            .guidance = cfg->guidance_embeds
                            ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B), gs) : NULL,
        };
        df_tensor *v = NULL;
        if (f->compiled) {
            df_tensor *args[7] = {in.hidden_states, in.encoder_hidden_states,
                                  in.pooled_projections, in.timestep, in.img_ids, in.txt_ids,
                                  in.guidance};
            s = df_compiled_call(ctx, f->compiled, f->transformer, args, &v);
        } else {
            v = df_flux_forward(ctx, f->transformer, &in);
        }
        if (s == DF_OK)
            s = df_mark_step(ctx);
        if (s == DF_OK)
            s = df_tensor_read(ctx, v, DF_DTYPE_F32, noise, (size_t)n_lat * sizeof *noise);
        if (s == DF_OK)
            s = df_scheduler_step(sched, noise, lat, n_lat);
        df_scope_end(ctx, mark, NULL);
        if (s == DF_OK && g->progress)
            g->progress(i + 1, steps, df_now() - t0, g->progress_user);
    }
    df_scheduler_free(sched);
    if (s == DF_OK && p->opts.offload == DF_OFFLOAD_MODEL)
        s = offload(p, df_flux_weight_set(f->transformer));
    df_pipeline_note_phase(p, out, "denoise");

    /* Decode. */
    onload(p, df_vae_weight_set(f->vae));
    int64_t n_img = (int64_t)B * 3 * H * W;
    float *decoded = s == DF_OK ? df_malloc((size_t)n_img * sizeof *decoded) : NULL;
    if (s == DF_OK && !decoded)
        s = df_errorf(DF_E_OOM, "out of memory for the image");
    if (s == DF_OK) {
        df_tensor *packed = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, Ci), lat);
        df_tensor *z = NULL, *img = NULL;
        s = packed ? df_vae_unpack_latents(ctx, packed, h, w, &z) : df_ctx_status(ctx);
        if (s == DF_OK)
            s = df_vae_unscale(ctx, f->vae, z, &z);
        if (s == DF_OK)
            s = g->vae_tiling ? df_vae_decode_tiled(ctx, f->vae, z, 64, 8, &img)
                              : df_vae_decode(ctx, f->vae, z, &img);
        if (s == DF_OK)
            s = df_tensor_read(ctx, img, DF_DTYPE_F32, decoded, (size_t)n_img * sizeof *decoded);
        if (s == DF_OK)
            s = offload(p, df_vae_weight_set(f->vae));
        df_pipeline_note_phase(p, out, "decode");
    }
    if (s == DF_OK) {
        out->count = B;
        out->width = W;
        out->height = H;
        out->steps = steps;
        out->guidance = cfg->guidance_embeds ? guidance : 0.0f;
        out->images = df_calloc((size_t)B, sizeof *out->images);
        out->image_f32 = df_malloc((size_t)n_img * sizeof *out->image_f32);
        out->latents = lat;
        lat = NULL;
        out->latents_ndim = 3;
        out->latents_shape[0] = B, out->latents_shape[1] = S, out->latents_shape[2] = Ci;
        s = out->images && out->image_f32 ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
        if (s == DF_OK)
            s = df_vae_postprocess_f32(decoded, B, 3, H, W, out->image_f32);
        for (int b = 0; b < B && s == DF_OK; b++) {
            s = df_image_create(W, H, &out->images[b]);
            if (s == DF_OK)
                s = df_vae_postprocess_rgb8(decoded + (size_t)b * 3 * H * W, 1, 3, H, W,
                                            out->images[b]->pixels);
        }
    }
    df_free(decoded);
    df_free(lat);
    df_free(noise);
    df_free(ids);
    df_free(txt);
    df_free(ts);
    df_free(gs);
    df_scope_end(ctx, outer, NULL);
    return s;
}

const df_pipeline_kind df_flux_pipeline_class = {
    .name = "FluxPipeline",
    .load = flux_load,
    .run = flux_run,
    .free = flux_free,
};
