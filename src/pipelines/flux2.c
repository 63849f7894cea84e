/*
 * Flux2Pipeline (FLUX.2-dev) and Flux2KleinPipeline (FLUX.2 [klein]), as diffusers'
 * pipeline_flux2.py and pipeline_flux2_klein.py run them.
 *
 * A reference picture (df_gen_params.image) is encoded into extra tokens with their own ids
 * (flux2_reference.c) that join the latents on the transformer's input only; the output is
 * cut back to the latents' tokens (predict).
 *
 * Prompts: Flux2Pipeline renders each prompt with the system message through Mistral's chat
 * template, Flux2KleinPipeline through Qwen3's (tokenizer.h: df_tokenizer_encode_prompt),
 * both padded and truncated to max_sequence_length (512) on the tokenizer's padding side.
 * The ids and the attention mask go through the text encoder (Mistral 3 / Qwen3), and the
 * hidden states of the pipeline's layers (dev 10, 20, 30; klein 9, 18, 27, or the caller's
 * text_encoder_out_layers) are stacked per token into [B, L, 3 * hidden]. Each prompt's
 * embeddings are repeated num_images_per_prompt times in a row. Klein base's negative
 * prompt is "" (diffusers' only choice; diffuse also takes one per prompt).
 *
 * Latents: FLUX.2 works in the VAE's patchified, batch-norm-normalised space. The noise is
 * randn (B, 128, H/16, W/16) from one torch-compatible generator (or one per image from a
 * list; or latents given in that layout), packed to tokens (B, (H/16)(W/16), 128) with ids
 * (0, h, w, 0); the prompt embeddings get ids (0, 0, 0, l) (sched/flux2_latents.c).
 * Schedule: sigmas linspace(1, 1/n, n) shifted with compute_empirical_mu(image tokens, n),
 * FLUX.2's own rule. Each step calls the transformer with t / 1000 as the timestep; the
 * flow-match Euler step runs on the device in float32, the same bits as the scheduler's
 * host step (DIFFUSE_HOST_STEP=1 selects that reference path). The loop and the decode are
 * denoise.c's; this file gives them the transformer call (with CFG's second forward) and
 * the latents' layout.
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
 * Offload (model): text_encoder -> transformer -> vae, each resident only while it runs.
 *
 * Tensor parallelism (a communicator on the context): the transformer and the text encoder
 * load sharded on every rank; the tokenizer and the VAE load and run on rank 0 only. Rank 0
 * decides the run's sizes, tokenizes, draws the noise and broadcasts what the others need
 * (ids and masks, latents, and the latents again after each step), so every rank holds the
 * same numbers and the image does not depend on the number of ranks; every rank gets the
 * encoder's full hidden states. Failures follow FluxPipeline's rules (flux.c).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/flux2.h>
#include <diffuse/mistral.h>
#include <diffuse/qwen3.h>
#include <diffuse/rng.h>
#include <diffuse/scheduler.h>
#include <diffuse/tokenizer.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/denoise.h"
#include "pipelines/flux2_reference.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"
#include "sched/flow_match_euler.h"
#include "sched/flux2_latents.h"

typedef struct flux2_pipe {
    df_pipeline_parts parts; /* first: pipeline.c allocates and frees it */
    bool klein;        /* Flux2KleinPipeline */
    bool is_distilled; /* klein: step-wise distilled (no CFG) */
    df_tokenizer *tok; /* rank 0 */
    df_decoder_lm *te; /* NULL when the folder has no text encoder */
    df_flux2 *transformer;
} flux2_pipe;

static void flux2_free(void *impl)
{
    flux2_pipe *f = impl;
    df_tokenizer_free(f->tok);
    df_decoder_lm_free(f->te);
    df_flux2_free(f->transformer);
}

/* The folder's tokenizer; when the folder has no tokenizer files and the text encoder's file
 * carries Mistral's tekken.json (ComfyUI's tekken_model), the file's. */
static df_status load_tokenizer(const df_pipeline *p, const char *dir, df_tokenizer **out)
{
    df_status s = df_tokenizer_load(dir, out);
    const char *file = p->opts.text_encoder_file;
    if (s == DF_OK || s != DF_E_IO || !df_tokenizer_file_has_tekken(file))
        return s == DF_OK ? s : df_error_context(s, "%s", dir);
    char why[1024];
    snprintf(why, sizeof why, "%s", df_error_message());
    s = df_tokenizer_load_tekken(file, out);
    if (s != DF_OK)
        return df_error_context(s, "%s; the text encoder file's tokenizer (tekken_model)", why);
    df_logf(1, "tokenizer: Mistral's tekken.json (tekken_model) from %s; the folder has none",
            file);
    return DF_OK;
}

/* The text side (optional as a whole: prompt embeddings may be given instead): the
 * tokenizer on rank 0, the encoder on every rank (sharded under tensor parallelism). */
static df_status load_text(df_pipeline *p, flux2_pipe *f, const df_model_index *idx)
{
    if (!df_pipeline_has_component(idx, "text_encoder"))
        return DF_OK;
    char dir[DF_PATH_MAX];
    DF_TRY(df_pipeline_component_dir(p, idx, "tokenizer", dir, sizeof dir));
    if (df_pipeline_lead(p))
        DF_TRY(load_tokenizer(p, dir, &f->tok));
    if (f->tok && df_tokenizer_kind(f->tok) != DF_TOKENIZER_BPE_JSON)
        return df_errorf(DF_E_FORMAT, "%s: %s's tokenizer must be a tokenizer.json (found a %s "
                         "tokenizer)", dir, p->cls->name,
                         df_tokenizer_type_name(df_tokenizer_kind(f->tok)));
    DF_TRY(df_pipeline_component_dir(p, idx, "text_encoder", dir, sizeof dir));
    const char *file = p->opts.text_encoder_file;
    DF_TRY_CTX(f->klein ? df_qwen3_load_file(p->ctx, dir, file, &f->te)
                        : df_mistral_load_file(p->ctx, dir, file, &f->te),
               "%s", dir);
    int64_t hidden = df_decoder_lm_get_config(f->te)->hidden_size;
    int64_t joint = df_flux2_config(f->transformer)->joint_attention_dim;
    if (joint % hidden != 0)
        return df_errorf(DF_E_FORMAT, "%s: the transformer's joint_attention_dim %lld is not a "
                         "multiple of the text encoder's hidden_size %lld (it stacks %s hidden "
                         "states)", p->dir, (long long)joint, (long long)hidden,
                         f->klein ? "Qwen3's" : "Mistral's");
    return DF_OK;
}

static df_status flux2_load(df_pipeline *p, const df_model_index *idx)
{
    flux2_pipe *f = p->impl;
    f->klein = strcmp(p->cls->name, "Flux2KleinPipeline") == 0;
    if (f->klein)
        DF_TRY(df_json_get_bool_or(df_model_index_json(idx), "is_distilled", false,
                                   &f->is_distilled));

    DF_TRY(df_denoise_scheduler_config(p, idx, &f->parts.sched));

    char dir[DF_PATH_MAX];
    DF_TRY(df_pipeline_component_dir(p, idx, "transformer", dir, sizeof dir));
    DF_TRY_CTX(df_flux2_load_file(p->ctx, dir, p->opts.transformer_file, &f->transformer), "%s",
               dir);
    DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
    snprintf(f->parts.vae_dir, sizeof f->parts.vae_dir, "%s", dir);
    const df_flux2_cfg *c = df_flux2_config(f->transformer);
    if (df_pipeline_lead(p)) {
        DF_TRY_CTX(df_vae_load_file(p->ctx, dir, p->opts.vae_file, &f->parts.vae), "%s", dir);
        if (!df_vae_config(f->parts.vae)->flux2 ||
            c->in_channels != df_vae_config(f->parts.vae)->bn_channels)
            return df_errorf(DF_E_FORMAT,
                             "%s: the transformer takes %lld latent channels but the VAE's "
                             "patchified latents have %lld",
                             p->dir, (long long)c->in_channels,
                             (long long)df_vae_config(f->parts.vae)->bn_channels);
    }
    DF_TRY(load_text(p, f, idx));

    DF_TRY(df_denoise_prepare_transformer(p, (df_transformer *)f->transformer, true));
    /* With offloading nothing stays resident after loading. */
    DF_TRY(df_pipeline_offload(p, f->te ? df_decoder_lm_weight_set(f->te) : NULL));
    DF_TRY(df_pipeline_offload(p, df_flux2_weight_set(f->transformer)));
    DF_TRY(df_pipeline_offload(p, f->parts.vae ? df_vae_weight_set(f->parts.vae) : NULL));
    bool distilled = f->klein && f->is_distilled;
    p->default_steps = distilled ? 4 : 50;
    p->default_guidance = distilled ? 1.0f : 4.0f;
    p->default_max_seq = 512;
    p->default_size = 1024;
    return DF_OK;
}

/* A run's sizes, decided by rank 0 and shared so that every rank agrees. h, w: the patch
 * grid (H/16, W/16); S = h * w image tokens. */
typedef struct run_sizes {
    int32_t H, W, steps, factor, per, np, max_seq;
    int32_t has_embeds, has_neg_embeds; /* prompt (negative) embeddings given */
    int32_t cfg; /* klein base with guidance > 1: a second, negative forward per step */
    int64_t B, L, h, w, S, C; /* C: patchified channels (128) */
    float guidance;
} run_sizes;

static run_sizes resolve(const df_pipeline *p, const flux2_pipe *f, const df_gen_params *g)
{
    run_sizes r = {
        .H = g->height ? g->height : p->default_size,
        .W = g->width ? g->width : p->default_size,
        .steps = g->steps ? g->steps : p->default_steps,
        .guidance = g->guidance_set ? g->guidance : p->default_guidance,
        .max_seq = g->max_sequence_length ? g->max_sequence_length : p->default_max_seq,
        .per = g->num_images > 0 ? g->num_images : 1,
        .factor = f->parts.vae ? (int32_t)df_vae_config(f->parts.vae)->scale_factor * 2 : 0,
        .has_embeds = g->prompt_embeds != NULL,
        .has_neg_embeds = g->negative_prompt_embeds != NULL,
        .C = df_flux2_config(f->transformer)->in_channels,
    };
    if (g->prompt_embeds)
        r.np = g->n_prompts > 1 ? g->n_prompts : 1;
    else
        r.np = g->prompts ? g->n_prompts : (g->prompt ? 1 : 0);
    r.B = (int64_t)r.np * r.per;
    r.L = g->prompt_embeds ? g->prompt_embeds_len : r.max_seq;
    r.cfg = f->klein && !f->is_distilled && r.guidance > 1.0f;
    /* prepare_latents: 2 * (H // (f * 2)) latent rows, patchified 2x2 */
    if (r.factor > 0) {
        r.h = r.H / r.factor;
        r.w = r.W / r.factor;
    }
    r.S = r.h * r.w;
    return r;
}

static df_status check_sizes(const df_pipeline *p, const flux2_pipe *f, const df_gen_params *g,
                             const run_sizes *r)
{
    if (r->factor <= 0)
        return df_errorf(DF_E_INTERNAL, "the VAE's scale factor is unknown on this rank");
    if (r->H < r->factor || r->W < r->factor)
        return df_errorf(DF_E_ARG, "height %d and width %d must be at least %d", r->H, r->W,
                         r->factor);
    DF_TRY(df_denoise_check_steps(r->steps, r->max_seq, 512));
    if (!isfinite(r->guidance))
        return df_errorf(DF_E_ARG, "guidance must be a finite number");
    if (r->has_embeds && r->L < 1)
        return df_errorf(DF_E_ARG, "prompt embeddings need their length");
    bool needs_text = !r->has_embeds || (r->cfg && !r->has_neg_embeds);
    if (needs_text && !f->te)
        return df_errorf(DF_E_ARG, "%s has no text encoder: pass prompt embeddings%s", p->dir,
                         r->cfg ? " and negative prompt embeddings (classifier-free guidance: "
                                  "guidance > 1 on a base checkpoint)" : "");
    if (!df_pipeline_lead(p))
        return DF_OK; /* the prompts are rank 0's */
    DF_TRY(df_denoise_check_prompts(g, r->np));
    for (int i = 0; r->cfg && g->negative_prompts && i < r->np; i++)
        if (!g->negative_prompts[i])
            return df_errorf(DF_E_ARG, "negative prompt %d of %d is NULL", i, r->np);
    if (g->n_text_encoder_out_layers < 0 ||
        g->n_text_encoder_out_layers > DF_DECODER_LM_MAX_OUTPUTS ||
        (g->n_text_encoder_out_layers > 0 && !g->text_encoder_out_layers))
        return df_errorf(DF_E_ARG, "text_encoder_out_layers: %d layers (1 to %d, with a list)",
                         g->n_text_encoder_out_layers, DF_DECODER_LM_MAX_OUTPUTS);
    return DF_OK;
}

/* ---- prompts ---------------------------------------------------------------------------- */

/* The hidden-state layers the embeddings stack (the caller's or the pipeline's). */
static int out_layers(const flux2_pipe *f, const df_gen_params *g, const int **layers)
{
    if (g->n_text_encoder_out_layers > 0) {
        *layers = g->text_encoder_out_layers;
        return g->n_text_encoder_out_layers;
    }
    static const int klein[] = {9, 18, 27}, dev[] = {10, 20, 30}; /* qwen3.h, mistral.h */
    *layers = f->klein ? klein : dev;
    return 3;
}

/* Rank 0 renders and tokenizes n prompts into ids and mask [n, L]. */
static df_status tokenize(const flux2_pipe *f, const char *const *prompts, int n, int64_t L,
                          int64_t *ids, int64_t *mask)
{
    df_prompt_format fmt = f->klein ? DF_PROMPT_FLUX2_QWEN3 : DF_PROMPT_FLUX2_MISTRAL;
    df_status s = DF_OK;
    for (int i = 0; i < n && s == DF_OK; i++) {
        df_tokens t = {0};
        s = df_tokenizer_encode_prompt(f->tok, fmt, prompts[i], strlen(prompts[i]), NULL,
                                       &(df_tokenize_opts){.max_length = L}, &t);
        if (s == DF_OK && t.count != L)
            s = df_errorf(DF_E_INTERNAL, "the tokenizer returned %lld ids, not %lld",
                          (long long)t.count, (long long)L);
        if (s == DF_OK) {
            memcpy(ids + (size_t)i * (size_t)L, t.ids, (size_t)L * sizeof *ids);
            memcpy(mask + (size_t)i * (size_t)L, t.attention_mask, (size_t)L * sizeof *mask);
        }
        df_tokens_deinit(&t);
        if (s != DF_OK)
            s = df_error_context(s, "prompt %d", i);
    }
    return s;
}

/* The prompt embeddings of n prompts (rank 0's) into out [n, L, D] on every rank. */
static df_status encode(df_pipeline *p, flux2_pipe *f, const df_gen_params *g,
                        const char *const *prompts, int n, const run_sizes *r, float *out)
{
    df_ctx *ctx = p->ctx;
    const int *layers;
    int nl = out_layers(f, g, &layers);
    int64_t L = r->L, D = df_flux2_config(f->transformer)->joint_attention_dim;
    const df_decoder_lm_config *tc = df_decoder_lm_get_config(f->te);
    df_status s = DF_OK;
    if (nl * tc->hidden_size != D)
        s = df_errorf(DF_E_ARG, "%d stacked hidden states of width %lld make %lld features, "
                      "but the transformer's joint_attention_dim is %lld", nl,
                      (long long)tc->hidden_size, (long long)(nl * tc->hidden_size), (long long)D);
    for (int i = 0; i < nl && s == DF_OK; i++)
        if (layers[i] < 0 || layers[i] > tc->num_hidden_layers)
            s = df_errorf(DF_E_ARG, "%s reads hidden state %d of the text encoder, which has %lld "
                          "layers (hidden states 0 to %lld): pass text_encoder_out_layers",
                          p->cls->name, layers[i], (long long)tc->num_hidden_layers,
                          (long long)tc->num_hidden_layers);
    int64_t *ids = df_malloc((size_t)(n * L) * sizeof *ids);
    int64_t *mask = df_malloc((size_t)(n * L) * sizeof *mask);
    if (s == DF_OK && !(ids && mask))
        s = df_errorf(DF_E_OOM, "out of memory for %d prompts' ids", n);
    if (s == DF_OK && df_pipeline_lead(p))
        s = tokenize(f, prompts, n, L, ids, mask);
    s = df_pipeline_tp_agree(p, s); /* tokenizing failed on rank 0: every rank stops */
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, ids, (size_t)(n * L) * sizeof *ids);
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, mask, (size_t)(n * L) * sizeof *mask);
    if (s == DF_OK) {
        df_scope mark = df_scope_begin(ctx);
        df_tensor *ti = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(n, L), ids);
        df_tensor *tm = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(n, L), mask);
        df_tensor *emb = NULL;
        s = ti && tm ? df_decoder_lm_stacked(ctx, f->te, ti, tm, layers, nl, &emb)
                     : df_ctx_status(ctx);
        if (s == DF_OK)
            s = df_tensor_read(ctx, emb, DF_DTYPE_F32, out, (size_t)(n * L * D) * sizeof *out);
        df_scope_end(ctx, mark, NULL);
        s = df_pipeline_tp_check(p, s); /* the sharded encoder */
    }
    df_free(ids);
    df_free(mask);
    return s;
}

/* Creates the scheduler with FLUX.2's sigmas and empirical mu. */
static df_status make_scheduler(const flux2_pipe *f, const run_sizes *r, df_scheduler **out)
{
    double mu = df_flux2_compute_empirical_mu(r->S, r->steps);
    return df_denoise_scheduler(&f->parts.sched, r->steps, true, &mu, 0, out);
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

/* The reference tokens repeated over the batch, [B, Sr, C], and the ids of the latents
 * followed by theirs, [S + Sr, 4] (in place of *ids). */
static df_status reference_inputs(df_ctx *ctx, const run_sizes *r, const df_image_tokens *refs,
                                  df_tensor **ref, df_tensor **ids)
{
    int64_t Sr = refs->n_tokens, C = refs->channels;
    if (C != r->C)
        return df_errorf(DF_E_FORMAT,
                         "the reference image's tokens have %lld channels, the "
                         "transformer takes %lld",
                         (long long)C, (long long)r->C);
    df_tensor *one = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1, Sr, C), refs->tokens);
    df_tensor *rid = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(Sr, 4), refs->ids);
    if (!one || !rid)
        return df_ctx_status(ctx);
    *ref = df_contiguous(ctx, df_expand(ctx, one, DF_SHAPE(r->B, Sr, C)));
    *ids = df_concat(ctx, *ids, rid, 0);
    return df_ctx_status(ctx);
}

/* One transformer forward (a marked step): the velocity [B, S, C] for the packed latents x,
 * a tensor of the current scope in *out. */
static df_status predict(df_pipeline *p, flux2_pipe *f, const run_sizes *r, df_tensor *x, float t,
                         df_tensor *embeds, df_tensor *img_ids, df_tensor *txt_ids, df_tensor *ref,
                         df_tensor **out)
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
        .hidden_states = ref ? df_concat(ctx, x, ref, 1) : x, /* [B, S + Sr, C] */
        .encoder_hidden_states = embeds,
        .timestep = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B), ts),
        .img_ids = img_ids,
        .txt_ids = txt_ids,
        .guidance = guided ? df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B), gs) : NULL,
    };
    df_free(ts);
    df_free(gs);
    df_tensor *args[6] = {in.hidden_states, in.encoder_hidden_states, in.timestep,
                          in.img_ids, in.txt_ids, in.guidance};
    *out = NULL;
    df_status s = df_transformer_call(ctx, (df_transformer *)f->transformer, args, out);
    if (s == DF_OK && ref && *out) /* noise_pred[:, :S]: the latents' tokens only */
        *out = df_contiguous(ctx, df_slice(ctx, *out, 1, 0, r->S));
    return s == DF_OK ? df_mark_step(ctx) : s;
}

/* The step caches a run may take (g->cache), as Flux2KleinPipeline enables them: one state
 * per cache context, "cond" and, with CFG, "uncond" (the loop makes them). diffusers 0.42
 * runs no first-block or TaylorSeer cache on Flux2Pipeline (it calls the transformer outside
 * any cache context, which those hooks refuse; MagCache's sets one) and no first-block cache
 * on FLUX.2 (its hook subtracts the double block's output pair from the single block's joint
 * output): both are refused here too. */
static df_status check_cache(df_pipeline *p, const flux2_pipe *f, const df_gen_params *g)
{
    if (!g->cache || g->cache->kind == DF_CACHE_NONE)
        return DF_OK;
    DF_TRY(df_pipeline_check_cache(p, g));
    if (!f->klein && g->cache->kind != DF_CACHE_MAG)
        return df_errorf(DF_E_UNSUPPORTED, "--cache: Flux2Pipeline calls its transformer "
                         "outside a cache context, where diffusers 0.42's first-block and "
                         "TaylorSeer hooks fail (its MagCache sets one itself); these step "
                         "caches run on Flux2KleinPipeline and FluxPipeline");
    if (g->cache->kind == DF_CACHE_FIRST_BLOCK)
        return df_errorf(DF_E_UNSUPPORTED, "--cache first-block: diffusers 0.42's first-block "
                         "cache fails on Flux2Transformer2DModel (its single blocks return the "
                         "joint sequence, not the image and text streams); use taylorseer");
    return DF_OK;
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
        s = df_vae_bn_denormalize(ctx, f->parts.vae, z, &z);
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
    df_pipeline_onload(p, df_vae_weight_set(f->parts.vae));
    df_tensor *z = NULL;
    df_status s = to_decoder_input(ctx, f, r, lat, &z);
    if (s == DF_OK && unpacked) {
        int64_t n = r->B * r->C * r->S;
        *unpacked = df_malloc((size_t)n * sizeof **unpacked);
        s = *unpacked ? df_tensor_read(ctx, z, DF_DTYPE_F32, *unpacked, (size_t)n * sizeof(float))
                      : df_errorf(DF_E_OOM, "out of memory");
    }
    if (s == DF_OK)
        s = df_denoise_decode(p, f->parts.vae, z, g->vae_tiling, true, r->B, r->factor * r->h,
                              r->factor * r->w, out);
    return s;
}

/* A run's fixed inputs to the transformer, for the loop's hooks. */
typedef struct flux2_loop {
    df_pipeline *p;
    flux2_pipe *f;
    const df_gen_params *g;
    const run_sizes *r;
    df_tensor *embeds, *neg;       /* the prompts' and, with CFG, the negative text */
    df_tensor *img_ids, *txt_ids;  /* [S (+ Sr), 4], [L, 4] */
    df_tensor *ref;                /* reference tokens [B, Sr, C], or NULL */
} flux2_loop;

/* The loop's model call: the velocity for the latents x [B, S, C], with CFG's second
 * forward under the "uncond" cache where it runs. */
static df_status loop_predict(void *self, const df_denoise_step *st, df_tensor **out)
{
    flux2_loop *l = self;
    df_tensor *vt = NULL, *vnt = NULL;
    df_transformer *t = (df_transformer *)l->f->transformer;
    df_transformer_cache_context(t, 0); /* "cond" */
    df_status s = predict(l->p, l->f, l->r, st->x, st->t, l->embeds, l->img_ids, l->txt_ids,
                          l->ref, &vt);
    df_transformer_cache_context(t, 1); /* "uncond" */
    if (s == DF_OK && l->r->cfg)
        s = predict(l->p, l->f, l->r, st->x, st->t, l->neg, l->img_ids, l->txt_ids, l->ref, &vnt);
    df_transformer_cache_context(t, -1);
    if (s == DF_OK && l->r->cfg) /* neg + scale * (cond - neg), each op in float32 */
        vt = df_add(l->p->ctx, vnt,
                    df_scale(l->p->ctx, df_sub(l->p->ctx, vt, vnt), l->r->guidance, -0.0f));
    *out = vt;
    return s;
}

/* g->preview's decode: one image's packed latents. */
static df_status loop_decode(void *self, const float *lat, df_gen_output *out)
{
    flux2_loop *l = self;
    run_sizes one = *l->r;
    one.B = 1;
    return decode(l->p, l->f, l->g, &one, lat, NULL, out);
}

/* The denoising loop over the packed latents lat [B, S, C] (in place). */
static df_status denoise(df_pipeline *p, flux2_pipe *f, const df_gen_params *g,
                         const run_sizes *r, df_tensor *embeds, df_tensor *neg,
                         const df_image_tokens *refs, float *lat, df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    flux2_loop l = {.p = p, .f = f, .g = g, .r = r, .embeds = embeds, .neg = neg};
    df_scheduler *sched = NULL;
    df_status s = make_scheduler(f, r, &sched);
    if (s == DF_OK)
        s = make_ids(ctx, r, &l.img_ids, &l.txt_ids);
    if (s == DF_OK)
        s = check_cache(p, f, g);
    if (s == DF_OK && refs && refs->n_tokens > 0) /* their ids after the latents' */
        s = reference_inputs(ctx, r, refs, &l.ref, &l.img_ids);
    if (s == DF_OK)
        s = df_denoise_run(p, g,
                           &(df_denoise){
                               .sched = sched,
                               .first = 0,
                               .steps = r->steps,
                               .shape = {r->B, r->S, r->C},
                               .ndim = 3,
                               .B = r->B,
                               .n = r->S * r->C,
                               .model = &l,
                               .predict = loop_predict,
                               .decode = loop_decode,
                               .marks_step = true, /* predict marks each forward */
                               .transformer = (df_transformer *)f->transformer,
                               .cache_contexts = r->cfg ? 2 : 1,
                               .out = out,
                           },
                           lat);
    df_scheduler_free(sched);
    return s;
}

/* The starting tokens (rank 0): the given latents [B, C, h, w] or seeded noise, packed. */
static df_status initial_latents(const df_gen_params *g, const run_sizes *r, float *lat)
{
    int64_t n = r->B * r->C * r->S;
    float *scratch = df_malloc((size_t)n * sizeof *scratch);
    if (!scratch)
        return df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n);
    /* randn (B, C, h, w) from one generator, or image by image from a list */
    df_status s = g->latents ? DF_OK
                             : df_pipeline_draw_noise(g, (int)r->B, r->C * r->S, scratch);
    if (s == DF_OK)
        df_flux2_pack_latents(g->latents ? g->latents : scratch, r->B, r->C, r->h, r->w, lat);
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

/* The prompt and negative prompt embeddings, [np, L, D] each on the host of every rank
 * (neg only with CFG): encoded from the prompts, or the caller's (rank 0's, shared). */
static df_status text_side(df_pipeline *p, flux2_pipe *f, const df_gen_params *g,
                           const run_sizes *r, float *e, float *neg, df_gen_output *out)
{
    size_t n = (size_t)r->np * (size_t)r->L *
               (size_t)df_flux2_config(f->transformer)->joint_attention_dim;
    bool lead = df_pipeline_lead(p);
    if (r->has_embeds && lead)
        memcpy(e, g->prompt_embeds, n * sizeof *e);
    if (r->cfg && r->has_neg_embeds && lead)
        memcpy(neg, g->negative_prompt_embeds, n * sizeof *neg);
    df_status s = DF_OK;
    if (r->has_embeds)
        s = df_pipeline_tp_share(p, e, n * sizeof *e);
    if (s == DF_OK && r->cfg && r->has_neg_embeds)
        s = df_pipeline_tp_share(p, neg, n * sizeof *neg);
    if (s != DF_OK || (r->has_embeds && (!r->cfg || r->has_neg_embeds)))
        return s;

    df_pipeline_onload(p, df_decoder_lm_weight_set(f->te));
    if (!r->has_embeds)
        s = encode(p, f, g, g->prompts ? g->prompts : &g->prompt, r->np, r, e);
    if (s == DF_OK && r->cfg && !r->has_neg_embeds) {
        /* "" for every prompt, or the caller's own negative prompts */
        const char **negs = df_malloc((size_t)r->np * sizeof *negs);
        if (!negs)
            s = df_errorf(DF_E_OOM, "out of memory");
        for (int i = 0; negs && i < r->np; i++)
            negs[i] = !lead ? "" : g->negative_prompts ? g->negative_prompts[i]
                             : g->negative_prompt ? g->negative_prompt : "";
        if (s == DF_OK && (s = encode(p, f, g, negs, r->np, r, neg)) != DF_OK)
            s = df_error_context(s, "negative prompt");
        df_free(negs);
    }
    if (s == DF_OK)
        s = df_pipeline_offload(p, df_decoder_lm_weight_set(f->te));
    df_pipeline_note_phase(p, out, "encode");
    return s;
}

static df_status flux2_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    flux2_pipe *f = p->impl;
    df_ctx *ctx = p->ctx;
    df_gen_params with_size;
    const df_image *const *refs = g->n_images > 0 ? g->images : &g->image;
    int n_refs = g->n_images > 0 ? g->n_images : g->image ? 1 : 0;
    if (g->n_images < 0 || (g->n_images > 0 && (!g->images || g->image)))
        return df_errorf(DF_E_ARG, "give either one image or a list of n_images (%d) images",
                         g->n_images);
    for (int i = 0; i < n_refs; i++)
        if (!refs[i])
            return df_errorf(DF_E_ARG, "reference image %d of %d is NULL", i, n_refs);
    if (n_refs > 0) { /* the output takes the first reference's size unless one is given */
        if (g->strength != 0)
            return df_errorf(DF_E_ARG,
                             "%s: %s takes reference images, not a strength (it "
                             "always starts from noise)",
                             p->dir, p->cls->name);
        for (int i = 0; i < n_refs; i++)
            DF_TRY_CTX(df_flux2_reference_check(refs[i]), "reference image %d", i);
        int rh, rw; /* the first picture's size once shrunk and cropped */
        df_flux2_reference_size(refs[0], 16, &rh, &rw);
        with_size = *g;
        with_size.height = g->height ? g->height : rh;
        with_size.width = g->width ? g->width : rw;
        g = &with_size;
    }
    run_sizes r = resolve(p, f, g);
    df_status s = df_pipeline_tp_share(p, &r, sizeof r); /* rank 0's sizes everywhere */
    if (s == DF_OK)
        s = check_sizes(p, f, g, &r);
    s = df_pipeline_tp_agree(p, s);
    if (s != DF_OK)
        return s;
    int64_t D = df_flux2_config(f->transformer)->joint_attention_dim, n = r.B * r.S * r.C;
    size_t ne = (size_t)r.np * (size_t)r.L * (size_t)D;

    df_scope outer = df_scope_begin(ctx);
    df_stats_reset_resident_peak(ctx); /* phases report their own peaks, not the load's */
    float *e = df_malloc(ne * sizeof *e), *ne_host = r.cfg ? df_malloc(ne * sizeof *e) : NULL;
    float *lat = df_malloc((size_t)n * sizeof *lat), *unpacked = NULL;
    s = e && lat && (ne_host || !r.cfg) ? DF_OK : df_errorf(DF_E_OOM, "out of memory");
    if (s == DF_OK)
        s = text_side(p, f, g, &r, e, ne_host, out);
    df_tensor *embeds = NULL, *neg = NULL;
    if (s == DF_OK) {
        embeds = upload_embeds(ctx, &r, r.per, D, e);
        neg = r.cfg ? upload_embeds(ctx, &r, r.per, D, ne_host) : NULL;
        s = df_ctx_status(ctx);
    }
    if (s == DF_OK && df_pipeline_lead(p))
        s = initial_latents(g, &r, lat);
    df_image_tokens ref = {0}; /* after the noise, as prepare_image_latents runs */
    if (s == DF_OK && n_refs > 0 && df_pipeline_lead(p)) /* rank 0 encodes and shares */
        s = df_flux2_reference_make(p, f->parts.vae_dir, &f->parts.vae_enc, refs, n_refs, r.factor,
                                    g->vae_tiling, &ref);
    s = df_pipeline_tp_agree(p, s);
    if (s == DF_OK && n_refs > 0 && df_pipeline_tp(p))
        s = df_image_tokens_share(p, &ref, 4, "the reference images");
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, lat, (size_t)n * sizeof *lat);
    if (s == DF_OK)
        s = denoise(p, f, g, &r, embeds, neg, &ref, lat, out);
    df_image_tokens_deinit(&ref);
    df_pipeline_note_phase(p, out, "denoise");
    bool unpack = f->klein && df_pipeline_lead(p);
    if (s == DF_OK && df_pipeline_lead(p))
        s = decode(p, f, g, &r, lat, unpack ? &unpacked : NULL, out);
    if (s == DF_OK) {
        out->width = (int)(r.factor * r.w);
        out->height = (int)(r.factor * r.h);
        out->steps = r.steps;
        out->guidance = r.guidance;
        if (unpack) { /* the decoder's input, as Flux2KleinPipeline returns it */
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
    df_free(e);
    df_free(ne_host);
    df_free(lat);
    df_free(unpacked);
    df_scope_end(ctx, outer, NULL);
    return s;
}

/* What `diffuse convert` writes (pipeline_save.c): each loaded component's bound weights. */
static int flux2_weight_sets(df_pipeline *p, const char **names, df_weight_set **sets, int cap)
{
    flux2_pipe *f = p->impl;
    df_weight_set *all[] = {df_flux2_weight_set(f->transformer),
                            f->parts.vae ? df_vae_weight_set(f->parts.vae) : NULL,
                            f->te ? df_decoder_lm_weight_set(f->te) : NULL};
    static const char *const name[] = {"transformer", "vae", "text_encoder"};
    return df_pipeline_list_weight_sets(name, all, 3, names, sets, cap);
}

static const df_pipeline_ops flux2_ops = {
    .size = sizeof(flux2_pipe),
    .load = flux2_load,
    .run = flux2_run,
    .free = flux2_free,
    .weight_sets = flux2_weight_sets,
};

const df_pipeline_kind df_flux2_pipeline_class = {"Flux2Pipeline", &flux2_ops};
const df_pipeline_kind df_flux2_klein_pipeline_class = {"Flux2KleinPipeline", &flux2_ops};
