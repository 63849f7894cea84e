/*
 * FluxPipeline (FLUX.1 schnell and dev), as diffusers' pipeline_flux.py runs it.
 *
 * Prompts: CLIP-L's pooled output and T5's last hidden state (no attention mask), 77 and
 * max_sequence_length tokens. Noise: (B, 16, 2*(H/16), 2*(W/16)) drawn in float32 from one
 * torch-compatible generator in one draw (or image by image from a list of generators),
 * packed into 2x2 patches. Schedule: sigmas linspace(1, 1/n, n)
 * with mu from the packed sequence length. Each step calls the transformer with sigma as
 * the timestep, then the flow-match Euler step runs on the device in float32 (the same
 * bits as the scheduler's host step, which DIFFUSE_HOST_STEP=1 selects), so the latents
 * stay on the device for the whole loop; df_mark_step() marks the step. Decoding unpacks,
 * un-scales and runs the VAE decoder. The loop and the decode are denoise.c's, shared with
 * SD3 and FLUX.2; this file gives them the transformer call and the latents' layout.
 *
 * Tensor parallelism (df_load_opts.tp, a communicator on the context): the transformer and
 * T5 load sharded on every rank; the tokenizers, CLIP and the VAE load and run on rank 0
 * only (they are small next to the transformer, and other ranks would only repeat the same
 * work). Rank 0 decides the run's sizes, tokenizes, runs CLIP, draws the noise and
 * broadcasts what the others need (T5 ids, pooled embeddings, latents, and the latents
 * again after each step, so every rank holds the same numbers and the result does not
 * depend on the number of ranks). Failures: where a rank can fail alone with no collective
 * pending (tokenizing, CLIP, the arguments) all ranks agree on the status (df_comm_agree),
 * so they stop together and rank 0 has the message; a rank whose sharded forward failed
 * cannot join the next collective, so it stops every rank (df_comm_abort). Host-side
 * collectives wait for the device first, so they never overlap the stream's all-reduces.
 *
 * Defaults come from the model: a transformer without guidance embedding is schnell-like
 * (4 steps, guidance ignored, 256 T5 tokens), one with it is dev-like (28 steps, guidance
 * 3.5, 512 tokens); a folder made for smaller images narrows the image side and the T5
 * tokens (folder_defaults). Components listed as null in model_index.json are allowed
 * when the caller passes prompt embeddings instead of prompts.
 *
 * FluxKontextPipeline is this pipeline with its sizes and picture from kontext.c: the
 * picture's tokens follow the latents on the transformer's input, and only the latents'
 * part of the output is kept.
 */
#include <math.h>
#include <string.h>

#include <diffuse/clip.h>
#include <diffuse/dist.h>
#include <diffuse/flux.h>
#include <diffuse/json.h>
#include <diffuse/scheduler.h>
#include <diffuse/t5.h>
#include <diffuse/tokenizer.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/denoise.h"
#include "pipelines/img2img.h"
#include "pipelines/inpaint.h"
#include "pipelines/kontext.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"
#include "sched/flow_match_euler.h"

typedef struct flux_pipe {
    df_pipeline_parts parts; /* first: pipeline.c allocates and frees it */
    df_tokenizer *tok_clip, *tok_t5;
    df_clip *clip;
    df_t5 *t5;
    df_flux *transformer;
} flux_pipe;

static void flux_free(void *impl)
{
    flux_pipe *f = impl;
    df_tokenizer_free(f->tok_clip);
    df_tokenizer_free(f->tok_t5);
    df_clip_free(f->clip);
    df_t5_free(f->t5);
    df_flux_free(f->transformer);
}

/* What a folder made for smaller images says (the demo pipeline, models/demo): the image
 * side is the VAE config's sample_size where it is a whole number of packed latents
 * (FLUX.1's own VAEs say 1024, FluxPipeline's default; otherwise 1024 stays), and T5 takes
 * at most tokenizer_2's model_max_length tokens by default (FLUX.1's says 512, so
 * schnell's 256 and dev's 512 stay). Only rank 0 loads the VAE and the tokenizer, and only
 * its defaults decide a run. */
static df_status folder_defaults(df_pipeline *p, const df_model_index *idx, flux_pipe *f)
{
    if (f->parts.vae) {
        char dir[4096], path[4200];
        DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
        snprintf(path, sizeof path, "%s/config.json", dir);
        df_json *cfg = NULL;
        DF_TRY(df_json_parse_file(path, &cfg));
        const df_json *v = df_json_get(cfg, "sample_size");
        double side = v && df_json_type_of(v) == DF_JSON_NUMBER ? df_json_number(v) : 0;
        df_json_free(cfg);
        int64_t factor = df_vae_config(f->parts.vae)->scale_factor * 2;
        if (side >= (double)factor && side <= 16384 && side == floor(side) &&
            (int64_t)side % factor == 0)
            p->default_size = (int)side;
    }
    if (f->tok_t5) {
        df_tokenizer_info info;
        df_tokenizer_get_info(f->tok_t5, &info);
        if (info.model_max_length > 0 && info.model_max_length < p->default_max_seq)
            p->default_max_seq = (int)info.model_max_length;
    }
    return DF_OK;
}

static df_status flux_load(df_pipeline *p, const df_model_index *idx)
{
    flux_pipe *f = p->impl;
    char dir[4096];

    DF_TRY(df_denoise_scheduler_config(p, idx, &f->parts.sched));

    DF_TRY(df_pipeline_component_dir(p, idx, "transformer", dir, sizeof dir));
    if (p->opts.transformer_file)
        DF_TRY(df_flux_load_file(p->ctx, dir, p->opts.transformer_file, &f->transformer));
    else
        DF_TRY_CTX(df_flux_load(p->ctx, dir, &f->transformer), "%s", dir);
    DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
    snprintf(f->parts.vae_dir, sizeof f->parts.vae_dir, "%s", dir);
    if (df_pipeline_lead(p))
        DF_TRY_CTX(df_vae_load_file(p->ctx, dir, p->opts.vae_file, &f->parts.vae), "%s", dir);
    /* Text side: optional as a whole (prompt embeddings may be given instead). */
    bool text = df_pipeline_has_component(idx, "text_encoder") ||
                df_pipeline_has_component(idx, "text_encoder_2");
    if (text) {
        static const char *const parts[] = {"tokenizer", "tokenizer_2", "text_encoder",
                                            "text_encoder_2"};
        for (int i = 0; i < 4; i++)
            DF_TRY(df_pipeline_component_dir(p, idx, parts[i], dir, sizeof dir));
        if (df_pipeline_lead(p)) {
            DF_TRY(df_pipeline_component_dir(p, idx, "tokenizer", dir, sizeof dir));
            DF_TRY_CTX(df_tokenizer_load(dir, &f->tok_clip), "%s", dir);
            DF_TRY(df_pipeline_load_t5_tokenizer(p, idx, "tokenizer_2",
                                                 p->opts.text_encoder_2_file, &f->tok_t5));
            DF_TRY(df_pipeline_component_dir(p, idx, "text_encoder", dir, sizeof dir));
            DF_TRY_CTX(df_clip_load_file(p->ctx, dir, p->opts.text_encoder_file, &f->clip), "%s",
                       dir);
        }
        DF_TRY(df_pipeline_component_dir(p, idx, "text_encoder_2", dir, sizeof dir));
        DF_TRY_CTX(df_t5_load_file(p->ctx, dir, p->opts.text_encoder_2_file, &f->t5), "%s", dir);
        const df_flux_cfg *c = df_flux_config(f->transformer);
        if (df_t5_get_config(f->t5)->d_model != c->joint_attention_dim ||
            (f->clip && df_clip_get_config(f->clip)->hidden_size != c->pooled_projection_dim))
            return df_errorf(DF_E_FORMAT,
                             "%s: text encoder widths (T5 %lld, CLIP %lld) do not "
                             "match the transformer's joint_attention_dim %lld and "
                             "pooled_projection_dim %lld",
                             p->dir, (long long)df_t5_get_config(f->t5)->d_model,
                             (long long)(f->clip ? df_clip_get_config(f->clip)->hidden_size : 0),
                             (long long)c->joint_attention_dim,
                             (long long)c->pooled_projection_dim);
    }
    DF_TRY(df_denoise_prepare_transformer(p, (df_transformer *)f->transformer, true));
    /* With offloading nothing stays resident after loading. */
    DF_TRY(df_pipeline_offload(p, f->clip ? df_clip_weight_set(f->clip) : NULL));
    DF_TRY(df_pipeline_offload(p, f->t5 ? df_t5_weight_set(f->t5) : NULL));
    DF_TRY(df_pipeline_offload(p, df_flux_weight_set(f->transformer)));
    DF_TRY(df_pipeline_offload(p, f->parts.vae ? df_vae_weight_set(f->parts.vae) : NULL));
    bool dev = df_flux_config(f->transformer)->guidance_embeds;
    p->default_steps = dev ? 28 : 4;
    p->default_guidance = dev ? 3.5f : 0.0f;
    p->default_max_seq = dev ? 512 : 256;
    p->default_size = 1024;
    return folder_defaults(p, idx, f);
}

/* A run's sizes, decided by rank 0 and shared so that every rank agrees. */
typedef struct run_sizes {
    int32_t H, W, steps, max_seq, per, np, B, factor;
    int64_t L;           /* text tokens */
    float guidance;
    int32_t has_embeds;  /* prompt embeddings given instead of prompts */
    int32_t first;       /* the loop's first step (image to image: cut by strength) */
    int32_t true_cfg;    /* Kontext's true CFG: a negative forward every step */
    float true_cfg_scale;
} run_sizes;

/* The sizes from the parameters and the model's defaults. */
static run_sizes resolve(const df_pipeline *p, const flux_pipe *f, const df_gen_params *g)
{
    run_sizes r = {
        .H = g->height ? g->height : p->default_size,
        .W = g->width ? g->width : p->default_size,
        .steps = g->steps ? g->steps : p->default_steps,
        .guidance = g->guidance_set ? g->guidance : p->default_guidance,
        .max_seq = g->max_sequence_length ? g->max_sequence_length : p->default_max_seq,
        .per = g->num_images > 0 ? g->num_images : 1,
        .np = g->prompts ? g->n_prompts : (g->prompt ? 1 : 0),
        .factor = f->parts.vae ? (int32_t)df_vae_config(f->parts.vae)->scale_factor * 2 : 0,
        .has_embeds = g->prompt_embeds != NULL,
    };
    r.B = (g->prompt_embeds ? 1 : r.np) * r.per;
    if (g->prompt_embeds && g->n_prompts > 1)
        r.B = g->n_prompts * r.per;
    r.L = g->prompt_embeds ? g->prompt_embeds_len : r.max_seq;
    /* do_true_cfg: true_cfg_scale > 1 and has_neg_prompt */
    bool has_neg =
        g->negative_prompt || (g->negative_prompt_embeds && g->negative_pooled_prompt_embeds);
    r.true_cfg_scale = g->true_cfg_scale != 0 ? g->true_cfg_scale : 1.0f;
    r.true_cfg = r.true_cfg_scale > 1 && has_neg;
    return r;
}

/* Kontext's true CFG: what it needs, and what it is not implemented with. */
static df_status check_true_cfg(const df_pipeline *p, const df_gen_params *g, const run_sizes *r)
{
    if (!isfinite(r->true_cfg_scale))
        return df_errorf(DF_E_ARG, "true_cfg_scale must be a finite number");
    if (!r->true_cfg)
        return DF_OK;
    if (p->cls->role != DF_PIPELINE_KONTEXT)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: true CFG (true_cfg_scale %g with a negative prompt) is "
                         "implemented for FluxKontextPipeline, not %s",
                         p->dir, r->true_cfg_scale, p->cls->name);
    if (g->cache && g->cache->kind != DF_CACHE_NONE)
        return df_errorf(DF_E_UNSUPPORTED, "true CFG with a step cache is not implemented "
                                           "(the cache would see two forwards per step)");
    if (!df_pipeline_lead(p))
        return DF_OK; /* the prompts are rank 0's */
    if (g->negative_prompts)
        return df_errorf(DF_E_UNSUPPORTED, "true CFG takes one negative prompt, not a list");
    if (g->prompt_embeds && !g->negative_prompt_embeds)
        return df_errorf(DF_E_ARG, "true CFG from prompt embeddings needs negative prompt "
                                   "embeddings and negative pooled embeddings, not a "
                                   "negative prompt");
    if (!g->prompt_embeds && g->negative_prompt_embeds)
        return df_errorf(DF_E_ARG, "negative prompt embeddings need the prompt embeddings "
                                   "(of the same length) too");
    return DF_OK;
}

static df_status check_sizes(const df_pipeline *p, const flux_pipe *f, const df_gen_params *g,
                             const run_sizes *r)
{
    if (r->factor <= 0)
        return df_errorf(DF_E_INTERNAL, "the VAE's scale factor is unknown on this rank");
    if (r->H <= 0 || r->W <= 0 || r->H % r->factor || r->W % r->factor)
        return df_errorf(DF_E_ARG, "height %d and width %d must be positive multiples of %d",
                         r->H, r->W, r->factor);
    DF_TRY(df_denoise_check_steps(r->steps, r->max_seq, 512));
    if (!isfinite(r->guidance))
        return df_errorf(DF_E_ARG, "guidance must be a finite number");
    if (g->n_images != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s: %s takes one input image, not a list of %d",
                         p->dir, p->cls->name, g->n_images);
    if (p->cls->role != DF_PIPELINE_KONTEXT && (g->max_area || g->keep_image_size))
        return df_errorf(DF_E_ARG,
                         "%s: max_area and keep_image_size are FluxKontextPipeline's, "
                         "not %s's",
                         p->dir, p->cls->name);
    if (p->cls->role == DF_PIPELINE_IMG2IMG && !g->image)
        return df_errorf(DF_E_ARG, "%s: FluxImg2ImgPipeline needs an input image", p->dir);
    DF_TRY(check_true_cfg(p, g, r));
    if (!df_pipeline_lead(p))
        return DF_OK; /* the prompts are rank 0's */
    DF_TRY(df_denoise_check_prompts(g, r->np));
    if (!g->prompt_embeds && !f->t5)
        return df_errorf(DF_E_ARG, "%s has no text encoders: pass prompt embeddings", p->dir);
    if (g->prompt_embeds && (!g->pooled_prompt_embeds || g->prompt_embeds_len < 1))
        return df_errorf(DF_E_ARG, "prompt embeddings need their length and pooled embeddings");
    return DF_OK;
}

/* Rank 0 tokenizes the prompts (each repeated `per` times) into clip_ids [B, 77] and t5_ids
 * [B, max_seq]. */
static df_status tokenize(flux_pipe *f, const char *const *prompts, const run_sizes *r,
                          int64_t *clip_ids, int64_t *t5_ids)
{
    df_status s = DF_OK;
    int per = r->per, max_seq = r->max_seq;
    for (int i = 0; i < r->np && s == DF_OK; i++) {
        df_tokens tc = {0}, tt = {0};
        size_t len = strlen(prompts[i]);
        s = df_tokenizer_encode(
            f->tok_clip, prompts[i], len,
            &(df_tokenize_opts){.max_length = 77, .pad = true, .truncate = true}, &tc);
        if (s == DF_OK)
            s = df_tokenizer_encode(f->tok_t5, prompts[i], len,
                                    &(df_tokenize_opts){.max_length = max_seq, .pad = true,
                                                        .truncate = true},
                                    &tt);
        if (s == DF_OK && (tc.count != 77 || tt.count != max_seq))
            s = df_errorf(DF_E_INTERNAL, "tokenizer returned %lld/%lld ids", (long long)tc.count,
                          (long long)tt.count);
        for (int k = 0; k < per && s == DF_OK; k++) {
            memcpy(clip_ids + (size_t)(i * per + k) * 77, tc.ids, 77 * sizeof *clip_ids);
            memcpy(t5_ids + (size_t)(i * per + k) * (size_t)max_seq, tt.ids,
                   (size_t)max_seq * sizeof *t5_ids);
        }
        df_tokens_deinit(&tc);
        df_tokens_deinit(&tt);
        if (s != DF_OK)
            s = df_error_context(s, "prompt %d", i);
    }
    return s;
}

/* Text side for B rows: CLIP's pooled output [B, P] and T5's hidden states [B, L, J]. */
static df_status encode_prompts(df_pipeline *p, flux_pipe *f, const char *const *prompts,
                                const run_sizes *r, df_tensor **embeds, df_tensor **pooled)
{
    df_ctx *ctx = p->ctx;
    int64_t B = r->B, max_seq = r->max_seq;
    int64_t P = df_flux_config(f->transformer)->pooled_projection_dim;
    int64_t *clip_ids = df_malloc((size_t)B * 77 * sizeof *clip_ids);
    int64_t *t5_ids = df_malloc((size_t)B * (size_t)max_seq * sizeof *t5_ids);
    float *pooled_host =
        df_pipeline_tp(p) ? df_malloc((size_t)(B * P) * sizeof *pooled_host) : NULL;
    df_status s = clip_ids && t5_ids && (pooled_host || !df_pipeline_tp(p))
                      ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    if (s == DF_OK && df_pipeline_lead(p))
        s = tokenize(f, prompts, r, clip_ids, t5_ids);
    if (s == DF_OK && df_pipeline_lead(p)) {
        df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, 77), clip_ids);
        df_clip_output co = {0};
        s = ids ? df_clip_encode(ctx, f->clip, ids, &(df_clip_request){0}, &co)
                : df_ctx_status(ctx);
        *pooled = co.pooler_output;
        if (s == DF_OK && df_pipeline_tp(p))
            s = df_tensor_read(ctx, *pooled, DF_DTYPE_F32, pooled_host,
                               (size_t)(B * P) * sizeof *pooled_host);
    }
    s = df_pipeline_tp_agree(p, s); /* tokenizing or CLIP failed on rank 0: every rank stops */
    if (s == DF_OK && df_pipeline_tp(p)) {
        s = df_pipeline_tp_share(p, t5_ids, (size_t)B * (size_t)max_seq * sizeof *t5_ids);
        if (s == DF_OK)
            s = df_pipeline_tp_share(p, pooled_host, (size_t)(B * P) * sizeof *pooled_host);
        if (s == DF_OK && !df_pipeline_lead(p))
            *pooled = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, P), pooled_host);
    }
    if (s == DF_OK) {
        df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(B, max_seq), t5_ids);
        s = ids ? df_t5_encode(ctx, f->t5, ids, NULL, embeds) : df_ctx_status(ctx);
        if (s == DF_OK && df_pipeline_tp(p))
            s = df_sync(ctx);
        s = df_pipeline_tp_check(p, s); /* sharded T5 */
    }
    df_free(clip_ids);
    df_free(t5_ids);
    df_free(pooled_host);
    return s;
}

/* True CFG's negative text from the negative prompt, one row per prompt's row (diffusers
 * encodes one negative prompt for num_images_per_prompt rows). */
static df_status encode_negative(df_pipeline *p, flux_pipe *f, const df_gen_params *g,
                                 const run_sizes *r, df_tensor **embeds, df_tensor **pooled)
{
    const char **negs = df_malloc((size_t)(r->np > 0 ? r->np : 1) * sizeof *negs);
    if (!negs)
        return df_errorf(DF_E_OOM, "out of memory for the negative prompts");
    for (int i = 0; i < r->np; i++)
        negs[i] = g->negative_prompt ? g->negative_prompt : "";
    df_status s = encode_prompts(p, f, negs, r, embeds, pooled);
    df_free(negs);
    return s == DF_OK ? s : df_error_context(s, "negative prompt");
}

/* Prompt embeddings given by the caller (rank 0's, shared): given_e [rows, L, J] and
 * given_q [rows, P]. */
static df_status given_embeddings(df_pipeline *p, const float *given_e, const float *given_q,
                                  const run_sizes *r, df_tensor **embeds, df_tensor **pooled)
{
    const df_flux_cfg *cfg = df_flux_config(((flux_pipe *)p->impl)->transformer);
    int64_t ne = r->B * r->L * cfg->joint_attention_dim, np = r->B * cfg->pooled_projection_dim;
    float *e = df_malloc((size_t)ne * sizeof *e), *q = df_malloc((size_t)np * sizeof *q);
    df_status s = e && q ? DF_OK : df_errorf(DF_E_OOM, "out of memory for prompt embeddings");
    /* each given row once per image, as encode_prompt repeats num_images_per_prompt */
    int64_t row_e = r->L * cfg->joint_attention_dim, row_q = cfg->pooled_projection_dim;
    for (int64_t b = 0; s == DF_OK && df_pipeline_lead(p) && b < r->B; b++) {
        memcpy(e + b * row_e, given_e + b / r->per * row_e, (size_t)row_e * sizeof *e);
        memcpy(q + b * row_q, given_q + b / r->per * row_q, (size_t)row_q * sizeof *q);
    }
    s = df_pipeline_tp_agree(p, s);
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, e, (size_t)ne * sizeof *e);
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, q, (size_t)np * sizeof *q);
    if (s == DF_OK) {
        *embeds = df_tensor_from_host(p->ctx, DF_DTYPE_F32,
                                      DF_SHAPE(r->B, r->L, cfg->joint_attention_dim), e);
        *pooled = df_tensor_from_host(p->ctx, DF_DTYPE_F32,
                                      DF_SHAPE(r->B, cfg->pooled_projection_dim), q);
        s = df_ctx_status(p->ctx);
    }
    df_free(e);
    df_free(q);
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

/* Decodes the packed latents [B, S, Ci] into the output's images (rank 0). */
static df_status decode(df_pipeline *p, flux_pipe *f, const df_gen_params *g, const run_sizes *r,
                        const float *lat, df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    int64_t B = r->B, Ci = df_flux_config(f->transformer)->in_channels;
    int64_t h = 2 * (r->H / r->factor), w = 2 * (r->W / r->factor), S = (h / 2) * (w / 2);
    df_pipeline_onload(p, df_vae_weight_set(f->parts.vae));
    df_tensor *packed = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S, Ci), lat);
    df_tensor *z = NULL;
    df_status s = packed ? df_vae_unpack_latents(ctx, packed, h, w, &z) : df_ctx_status(ctx);
    if (s == DF_OK)
        s = df_vae_unscale(ctx, f->parts.vae, z, &z);
    if (s == DF_OK)
        s = df_denoise_decode(p, f->parts.vae, z, g->vae_tiling, true, B, r->H, r->W, out);
    return s;
}

/* Creates the scheduler with FluxPipeline's sigmas and mu for S image tokens, its loop
 * starting at step `first`. */
static df_status make_scheduler(const flux_pipe *f, int steps, int first, int64_t S,
                                df_scheduler **out)
{
    double mu = df_flux_calculate_shift(S, f->parts.sched.base_image_seq_len,
                                        f->parts.sched.max_image_seq_len, f->parts.sched.base_shift,
                                        f->parts.sched.max_shift);
    return df_denoise_scheduler(&f->parts.sched, steps, true, &mu, first, out);
}

/* One transformer forward (compiled or not) on `in`; with `S` > 0 only the first S tokens
 * of its output, the latents' (Kontext's picture tokens follow them). */
static df_status predict(df_ctx *ctx, flux_pipe *f, const df_flux_inputs *in, int64_t S,
                         df_tensor **v)
{
    df_tensor *args[7] = {in->hidden_states, in->encoder_hidden_states, in->pooled_projections,
                          in->timestep, in->img_ids, in->txt_ids, in->guidance};
    *v = NULL;
    df_status s = df_transformer_call(ctx, (df_transformer *)f->transformer, args, v);
    if (s == DF_OK && S > 0 && *v) /* noise_pred[:, :S] */
        *v = df_contiguous(ctx, df_slice(ctx, *v, 1, 0, S));
    return s;
}

/* A run's fixed inputs to the transformer, for the loop's hooks. */
typedef struct flux_loop {
    df_pipeline *p;
    flux_pipe *f;
    const df_gen_params *g;
    const run_sizes *r;
    df_tensor *embeds, *pooled;         /* [B, L, J], [B, P] */
    df_tensor *neg_embeds, *neg_pooled; /* true CFG's negative text, or NULL */
    df_tensor *img_ids, *txt_ids;       /* [S + Si, 3], [L, 3] */
    df_tensor *image_tokens;            /* Kontext's picture [B, Si, Ci], or NULL */
    int64_t S;                          /* the latents' tokens */
    float *ts, *gs;                     /* [B] timesteps and guidance */
} flux_loop;

/* The loop's model call: the velocity for the latents x [B, S, Ci], with true CFG's
 * negative forward where it runs. */
static df_status loop_predict(void *self, const df_denoise_step *st, df_tensor **out)
{
    flux_loop *l = self;
    df_ctx *ctx = l->p->ctx;
    int64_t B = l->r->B;
    for (int64_t b = 0; b < B; b++) {
        l->ts[b] = (float)((double)st->t / 1000.0);
        l->gs[b] = l->r->guidance;
    }
    df_flux_inputs in = {
        .hidden_states = l->image_tokens ? df_concat(ctx, st->x, l->image_tokens, 1)
                                         : st->x, /* [B, S + Si, Ci] */
        .encoder_hidden_states = l->embeds,
        .pooled_projections = l->pooled,
        .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B), l->ts),
        .img_ids = l->img_ids,
        .txt_ids = l->txt_ids,
        .guidance = df_flux_config(l->f->transformer)->guidance_embeds
                        ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B), l->gs)
                        : NULL,
    };
    int64_t keep = l->image_tokens ? l->S : 0;
    df_tensor *v = NULL, *neg = NULL;
    df_status s = predict(ctx, l->f, &in, keep, &v);
    if (s == DF_OK && l->neg_embeds) { /* true CFG: the same forward on the negative text */
        df_flux_inputs nin = in;
        nin.encoder_hidden_states = l->neg_embeds;
        nin.pooled_projections = l->neg_pooled;
        s = predict(ctx, l->f, &nin, keep, &neg);
        if (s == DF_OK && v && neg) /* neg + true_cfg_scale * (pos - neg) */
            v = df_add(ctx, neg, df_scale(ctx, df_sub(ctx, v, neg), l->r->true_cfg_scale, 0));
    }
    *out = v;
    return s;
}

/* g->preview's decode: one image's packed latents. */
static df_status loop_decode(void *self, const float *lat, df_gen_output *out)
{
    flux_loop *l = self;
    run_sizes one = *l->r;
    one.B = 1;
    return decode(l->p, l->f, l->g, &one, lat, out);
}

/* The denoising loop over the packed latents lat [B, S, Ci] (in place); ki: Kontext's
 * picture tokens, or NULL; neg_embeds / neg_pooled: true CFG's negative text, or NULL. */
static df_status denoise(df_pipeline *p, flux_pipe *f, const df_gen_params *g, const run_sizes *r,
                         df_tensor *embeds, df_tensor *pooled, df_tensor *neg_embeds,
                         df_tensor *neg_pooled, const df_inpaint *ip, const df_image_tokens *ki,
                         float *lat, df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    int64_t B = r->B, L = r->L, Ci = df_flux_config(f->transformer)->in_channels;
    int64_t h = 2 * (r->H / r->factor), w = 2 * (r->W / r->factor), S = (h / 2) * (w / 2);
    int64_t Si = ki ? ki->n_tokens : 0;
    flux_loop l = {.p = p, .f = f, .g = g, .r = r, .embeds = embeds, .pooled = pooled,
                   .neg_embeds = neg_embeds, .neg_pooled = neg_pooled, .S = S};
    float *ids = df_malloc((size_t)(S + Si) * 3 * sizeof *ids);
    float *txt = df_calloc((size_t)L * 3, sizeof *txt);
    l.ts = df_malloc((size_t)B * sizeof *l.ts);
    l.gs = df_malloc((size_t)B * sizeof *l.gs);
    df_scheduler *sched = NULL;
    df_status s = ids && txt && l.ts && l.gs ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    for (int64_t y = 0; s == DF_OK && y < h / 2; y++)
        for (int64_t x = 0; x < w / 2; x++) {
            float *row = ids + (y * (w / 2) + x) * 3;
            row[0] = 0, row[1] = (float)y, row[2] = (float)x;
        }
    if (s == DF_OK && ki) /* latent_ids then image_ids, one sequence */
        memcpy(ids + S * 3, ki->ids, (size_t)Si * 3 * sizeof *ids);
    if (s == DF_OK)
        s = make_scheduler(f, r->steps, r->first, S, &sched);
    if (s == DF_OK)
        s = df_pipeline_check_cache(p, g);
    if (s == DF_OK)
        l.img_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(S + Si, 3), ids);
    if (s == DF_OK && ki && ki->channels != Ci)
        s = df_errorf(DF_E_FORMAT,
                      "the picture's tokens have %lld channels, the transformer "
                      "takes %lld",
                      (long long)ki->channels, (long long)Ci);
    if (s == DF_OK && ki) {
        df_tensor *one = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, Si, Ci), ki->tokens);
        l.image_tokens = df_contiguous(ctx, df_expand(ctx, one, DF_SHAPE(B, Si, Ci)));
    }
    if (s == DF_OK)
        l.txt_ids = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(L, 3), txt);
    if (s == DF_OK)
        s = df_ctx_status(ctx);
    if (s == DF_OK)
        s = df_denoise_run(p, g,
                           &(df_denoise){
                               .sched = sched,
                               .first = r->first,
                               .steps = r->steps,
                               .shape = {B, S, Ci},
                               .ndim = 3,
                               .B = B,
                               .n = S * Ci,
                               .model = &l,
                               .predict = loop_predict,
                               .decode = loop_decode,
                               .blend = ip,
                               .transformer = (df_transformer *)f->transformer,
                               .out = out,
                           },
                           lat);
    df_scheduler_free(sched);
    df_free(ids);
    df_free(txt);
    df_free(l.ts);
    df_free(l.gs);
    return s;
}
/* The sigma of the loop's first step, to which an input picture's latents are noised. */
static df_status first_sigma(const flux_pipe *f, const run_sizes *r, float *sigma)
{
    int64_t h = 2 * (r->H / r->factor), w = 2 * (r->W / r->factor);
    df_scheduler *sched;
    DF_TRY(make_scheduler(f, r->steps, r->first, (h / 2) * (w / 2), &sched));
    *sigma = df_scheduler_sigmas(sched)[r->first];
    df_scheduler_free(sched);
    return DF_OK;
}

/* FluxImg2ImgPipeline.prepare_latents: the input picture's latents noised to the sigma of
 * the loop's first step, [B, C, h, w]. */
static df_status image_latents(df_pipeline *p, flux_pipe *f, const df_gen_params *g,
                               const run_sizes *r, float *out)
{
    float sigma;
    DF_TRY(first_sigma(f, r, &sigma));
    return df_img2img_latents(p, f->parts.vae_dir, &f->parts.vae_enc, g, r->B, r->H, r->W,
                              r->factor, sigma, out);
}

/* FluxInpaintPipeline's prepare_latents and prepare_mask_latents: the starting latents
 * (packed) into lat, what the blend reads into ip. */
static df_status inpaint_latents(df_pipeline *p, flux_pipe *f, const df_gen_params *g,
                                 const run_sizes *r, float *lat, df_inpaint *ip)
{
    float sigma;
    DF_TRY(first_sigma(f, r, &sigma));
    int64_t C = df_flux_config(f->transformer)->in_channels / 4;
    return df_inpaint_prepare(p, f->parts.vae_dir, &f->parts.vae_enc, g, r->B, r->H, r->W,
                              r->factor, C, sigma, pack_latents, lat, ip);
}

static df_status flux_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    flux_pipe *f = p->impl;
    df_ctx *ctx = p->ctx;
    const df_flux_cfg *cfg = df_flux_config(f->transformer);
    bool kontext = p->cls->role == DF_PIPELINE_KONTEXT;

    df_gen_params sized; /* Kontext: the size fitted to max_area */
    df_status s = DF_OK;
    if (kontext) { /* rank 0 has the VAE, and decides */
        int factor = f->parts.vae ? (int)df_vae_config(f->parts.vae)->scale_factor * 2 : 0;
        s = df_kontext_params(p, g, p->default_size, factor, &sized);
        g = &sized;
    }
    s = df_pipeline_tp_agree(p, s);
    if (s != DF_OK)
        return s;
    run_sizes r = resolve(p, f, g);
    s = df_pipeline_tp_share(p, &r, sizeof r); /* rank 0's sizes everywhere */
    if (s == DF_OK)
        s = check_sizes(p, f, g, &r);
    if (s == DF_OK && g->image && !kontext)
        s = df_img2img_first_step(g, r.steps, &r.first);
    s = df_pipeline_tp_agree(p, s);
    if (s != DF_OK)
        return s;
    const char *const *prompts = g->prompts ? g->prompts : &g->prompt;
    int64_t C = cfg->in_channels / 4, Ci = cfg->in_channels;
    int64_t h = 2 * (r.H / r.factor), w = 2 * (r.W / r.factor), S = (h / 2) * (w / 2);
    int64_t n_lat = (int64_t)r.B * S * Ci;

    df_scope outer = df_scope_begin(ctx);
    df_stats_reset_resident_peak(ctx); /* phases report their own peaks, not the load's */
    df_tensor *embeds = NULL, *pooled = NULL, *neg_embeds = NULL, *neg_pooled = NULL;
    if (r.has_embeds) {
        s = given_embeddings(p, g->prompt_embeds, g->pooled_prompt_embeds, &r, &embeds, &pooled);
        if (s == DF_OK && r.true_cfg)
            s = given_embeddings(p, g->negative_prompt_embeds, g->negative_pooled_prompt_embeds, &r,
                                 &neg_embeds, &neg_pooled);
    } else {
        df_pipeline_onload(p, f->clip ? df_clip_weight_set(f->clip) : NULL);
        df_pipeline_onload(p, df_t5_weight_set(f->t5));
        s = encode_prompts(p, f, prompts, &r, &embeds, &pooled);
        if (s == DF_OK && r.true_cfg)
            s = encode_negative(p, f, g, &r, &neg_embeds, &neg_pooled);
        if (s == DF_OK)
            s = df_pipeline_offload(p, f->clip ? df_clip_weight_set(f->clip) : NULL);
        if (s == DF_OK)
            s = df_pipeline_offload(p, df_t5_weight_set(f->t5));
        df_pipeline_note_phase(p, out, "encode");
    }

    float *lat = df_malloc((size_t)n_lat * sizeof *lat);
    float *noise = df_malloc((size_t)n_lat * sizeof *noise);
    if (s == DF_OK && !(lat && noise))
        s = df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n_lat);
    df_inpaint ip = {0};
    if (s == DF_OK && df_pipeline_lead(p)) { /* rank 0 draws the noise */
        if (g->mask) {
            s = inpaint_latents(p, f, g, &r, lat, &ip);
        } else if (g->latents) {
            memcpy(lat, g->latents, (size_t)n_lat * sizeof *lat);
        } else if (g->image && !kontext) {
            s = image_latents(p, f, g, &r, noise); /* (B, C, h, w) */
            if (s == DF_OK)
                pack_latents(noise, lat, r.B, C, h, w);
        } else {
            s = df_pipeline_draw_noise(g, r.B, C * h * w, noise); /* (B, C, h, w) */
            if (s == DF_OK)
                pack_latents(noise, lat, r.B, C, h, w);
        }
    }
    df_image_tokens ki = {0}; /* the picture's tokens, after the noise as prepare_latents */
    if (s == DF_OK && kontext && g->image && df_pipeline_lead(p))
        s = df_kontext_image_make(p, f->parts.vae_dir, &f->parts.vae_enc, g, r.factor, &ki);
    s = df_pipeline_tp_agree(p, s);
    if (s == DF_OK && kontext && g->image && df_pipeline_tp(p))
        s = df_image_tokens_share(p, &ki, 3, "the picture's tokens");
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, lat, (size_t)n_lat * sizeof *lat);
    if (s == DF_OK)
        s = denoise(p, f, g, &r, embeds, pooled, neg_embeds, neg_pooled, g->mask ? &ip : NULL,
                    kontext && g->image ? &ki : NULL, lat, out);
    df_image_tokens_deinit(&ki);
    df_pipeline_note_phase(p, out, "denoise");

    if (s == DF_OK && df_pipeline_lead(p))
        s = decode(p, f, g, &r, lat, out);
    if (s == DF_OK) {
        out->width = r.W;
        out->height = r.H;
        out->steps = r.steps;
        out->guidance = cfg->guidance_embeds ? r.guidance : 0.0f;
        out->latents = lat;
        lat = NULL;
        out->latents_ndim = 3;
        out->latents_shape[0] = r.B, out->latents_shape[1] = S, out->latents_shape[2] = Ci;
    }
    df_free(lat);
    df_free(noise);
    df_inpaint_deinit(&ip);
    df_scope_end(ctx, outer, NULL);
    return s;
}

static int flux_weight_sets(df_pipeline *p, const char **names, df_weight_set **sets, int cap)
{
    flux_pipe *f = p->impl;
    df_weight_set *all[] = {df_flux_weight_set(f->transformer), df_vae_weight_set(f->parts.vae),
                            f->clip ? df_clip_weight_set(f->clip) : NULL,
                            f->t5 ? df_t5_weight_set(f->t5) : NULL};
    static const char *const name[] = {"transformer", "vae", "text_encoder", "text_encoder_2"};
    return df_pipeline_list_weight_sets(name, all, 4, names, sets, cap);
}

static const df_pipeline_ops flux_ops = {
    .size = sizeof(flux_pipe),
    .load = flux_load,
    .run = flux_run,
    .free = flux_free,
    .weight_sets = flux_weight_sets,
};

/* The image-input classes load the same components (inpaint.c, img2img.c, kontext.c). */
const df_pipeline_kind df_flux_pipeline_class = {"FluxPipeline", &flux_ops};
const df_pipeline_kind df_flux_img2img_pipeline_class = {"FluxImg2ImgPipeline", &flux_ops,
                                                         DF_PIPELINE_IMG2IMG};
const df_pipeline_kind df_flux_inpaint_pipeline_class = {"FluxInpaintPipeline", &flux_ops,
                                                         DF_PIPELINE_INPAINT};
const df_pipeline_kind df_flux_kontext_pipeline_class = {"FluxKontextPipeline", &flux_ops,
                                                         DF_PIPELINE_KONTEXT};
