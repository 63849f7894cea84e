/*
 * StableDiffusion3Pipeline (SD3, SD3.5), as diffusers' pipeline_stable_diffusion_3.py runs it.
 *
 * Prompts: CLIP-L and CLIP-G (both CLIPTextModelWithProjection) give hidden_states[-2]
 * (-(clip_skip + 2) with clip_skip; the negative prompt always uses -2, as diffusers passes
 * clip_skip=None for it), concatenated on features and zero-padded to joint_attention_dim;
 * T5's last hidden state (max_sequence_length tokens, no mask) follows on the sequence axis.
 * Without text_encoder_3 (null in model_index.json, or df_load_opts.no_text_encoder_3 as
 * diffusers' text_encoder_3=None) the T5 part is zeros of max_sequence_length tokens, for
 * the negative prompt too, as diffusers 0.42's _get_t5_prompt_embeds gives (older releases
 * took the CLIP tokenizer's 77).
 * Pooled = cat(CLIP-L text_embeds, CLIP-G text_embeds).
 *
 * Guidance: with guidance > 1 the negative prompt ("" by default) is encoded too and the
 * transformer runs once per step on the batch [negative, positive];
 * noise = uncond + guidance * (cond - uncond) is formed in float32, as the float32 pipeline
 * does (on the device; on the host with DIFFUSE_HOST_STEP=1). Skip-layer guidance adds, at steps i
 * with start*N < i < stop*N, (cond - skip) * scale, where `skip` is a positive-only forward without
 * the listed blocks.
 *
 * Batches: prompt i is paired with negative prompt i (or the one negative prompt given for
 * all); each is repeated num_images times in place, [p0, p0, p1, p1], and the CFG batch is
 * [all negatives, all positives].
 * Noise: (B, in_channels, H/8, W/8) drawn in float32 from one torch-compatible generator in
 * one draw, or image by image from a list of generators (no packing). Schedule: the scheduler's own
 * linspace (no sigmas passed) with its static shift; mu from the patch-grid length only when the
 * config asks for dynamic shifting. The transformer gets timestep = t in [0, 1000]; the flow-match
 * Euler step runs on the device in float32 with the scheduler's own rounding (the same bits as its
 * host step, which DIFFUSE_HOST_STEP=1 selects), so the latents stay on the device for the whole
 * loop; df_mark_step() marks each step. With
 * df_load_opts.compile the transformer's forward is compiled (traced once per image size),
 * with compile_blocks its repeated blocks.
 * Decoding un-scales (latents / scaling_factor + shift_factor) and runs the VAE decoder.
 * The loop and the decode are denoise.c's; this file gives them the transformer call with
 * its guidance, and the host path's guidance on host floats.
 *
 * Defaults: 28 steps, guidance 7.0, 256 T5 tokens, sample_size * 8 pixels. Components
 * listed as null in model_index.json are allowed when the caller passes prompt embeddings
 * (and negative ones for guidance) instead of prompts.
 */
#include <math.h>
#include <string.h>

#include <diffuse/clip.h>
#include <diffuse/scheduler.h>
#include <diffuse/sd3.h>
#include <diffuse/t5.h>
#include <diffuse/tokenizer.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/weight_sets.h"
#include "pipelines/denoise.h"
#include "pipelines/img2img.h"
#include "pipelines/inpaint.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"
#include "sched/flow_match_euler.h"

#define SD3_MAX_SEQ 512 /* diffusers refuses longer T5 sequences */

typedef struct sd3_pipe {
    df_pipeline_parts parts; /* first: pipeline.c allocates and frees it */
    df_tokenizer *tok_l, *tok_g, *tok_t5;
    df_clip *clip_l, *clip_g;
    df_t5 *t5; /* NULL: the T5 part of the prompt is zeros */
    df_sd3 *transformer;
    int64_t clip_len; /* the CLIP tokenizer's model_max_length (77) */
} sd3_pipe;

static void sd3_free(void *impl)
{
    sd3_pipe *s = impl;
    df_tokenizer_free(s->tok_l);
    df_tokenizer_free(s->tok_g);
    df_tokenizer_free(s->tok_t5);
    df_clip_free(s->clip_l);
    df_clip_free(s->clip_g);
    df_t5_free(s->t5);
    df_sd3_free(s->transformer);
}

/* --- loading ----------------------------------------------------------------------------- */

static df_status load_tokenizer(df_pipeline *p, const df_model_index *idx, const char *name,
                                df_tokenizer **out)
{
    char dir[DF_PATH_MAX];
    DF_TRY(df_pipeline_component_dir(p, idx, name, dir, sizeof dir));
    DF_TRY_CTX(df_tokenizer_load(dir, out), "%s", dir);
    return DF_OK;
}

static df_status load_clip(df_pipeline *p, const df_model_index *idx, const char *name,
                           const char *file, df_clip **out)
{
    char dir[DF_PATH_MAX];
    DF_TRY(df_pipeline_component_dir(p, idx, name, dir, sizeof dir));
    DF_TRY_CTX(df_clip_load_file(p->ctx, dir, file, out), "%s", dir);
    if (!df_clip_get_config(*out)->with_projection)
        return df_errorf(DF_E_FORMAT,
                         "%s: StableDiffusion3Pipeline needs a "
                         "CLIPTextModelWithProjection (text_projection.weight), the pooled "
                         "prompt is its text_embeds",
                         dir);
    return DF_OK;
}

/* T5 and its tokenizer. Where their files are missing, the message says how to run
 * without them, as diffusers' text_encoder_3=None does. */
static df_status load_t5(df_pipeline *p, sd3_pipe *s, const df_model_index *idx)
{
    const char *file = p->opts.text_encoder_3_file;
    char dir[DF_PATH_MAX];
    df_status st = df_pipeline_load_t5_tokenizer(p, idx, "tokenizer_3", file, &s->tok_t5);
    if (st == DF_OK)
        st = df_pipeline_component_dir(p, idx, "text_encoder_3", dir, sizeof dir);
    if (st == DF_OK && (st = df_t5_load_file(p->ctx, dir, file, &s->t5)) != DF_OK)
        st = df_error_context(st, "%s", dir);
    if (st == DF_E_IO) {
        char why[1024];
        snprintf(why, sizeof why, "%s", df_error_message());
        st = df_errorf(st,
                       "%s (SD3 runs without T5, as diffusers' text_encoder_3=None, with "
                       "--text-encoder-3 none)",
                       why);
    }
    return st;
}

/* Tokenizers and text encoders; all optional together (prompt embeddings instead), T5 on
 * its own too (null in model_index.json, or left out by no_text_encoder_3). Widths must
 * fit the transformer. */
static df_status load_text(df_pipeline *p, sd3_pipe *s, const df_model_index *idx)
{
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    bool t5 = df_pipeline_has_component(idx, "text_encoder_3") && !p->opts.no_text_encoder_3;
    p->t5_off = !t5;
    s->clip_len = 77;
    if (!df_pipeline_has_component(idx, "text_encoder") &&
        !df_pipeline_has_component(idx, "text_encoder_2") && !t5)
        return DF_OK;
    DF_TRY(load_tokenizer(p, idx, "tokenizer", &s->tok_l));
    DF_TRY(load_tokenizer(p, idx, "tokenizer_2", &s->tok_g));
    DF_TRY(load_clip(p, idx, "text_encoder", p->opts.text_encoder_file, &s->clip_l));
    DF_TRY(load_clip(p, idx, "text_encoder_2", p->opts.text_encoder_2_file, &s->clip_g));
    df_tokenizer_info info;
    df_tokenizer_get_info(s->tok_l, &info);
    s->clip_len = info.model_max_length > 0 ? info.model_max_length : 77;
    const df_clip_config *l = df_clip_get_config(s->clip_l), *g = df_clip_get_config(s->clip_g);
    if (s->clip_len > l->max_position_embeddings || s->clip_len > g->max_position_embeddings)
        return df_errorf(DF_E_FORMAT,
                         "%s/tokenizer: model_max_length %lld is longer than the "
                         "CLIP encoders' max_position_embeddings (%lld, %lld)",
                         p->dir, (long long)s->clip_len, (long long)l->max_position_embeddings,
                         (long long)g->max_position_embeddings);
    if (t5) {
        DF_TRY(load_t5(p, s, idx));
        if (df_t5_get_config(s->t5)->d_model != c->joint_attention_dim)
            return df_errorf(DF_E_FORMAT,
                             "%s: text_encoder_3 d_model %lld differs from the "
                             "transformer's joint_attention_dim %lld",
                             p->dir, (long long)df_t5_get_config(s->t5)->d_model,
                             (long long)c->joint_attention_dim);
    }
    if (l->hidden_size + g->hidden_size > c->joint_attention_dim ||
        l->projection_dim + g->projection_dim != c->pooled_projection_dim)
        return df_errorf(DF_E_FORMAT,
                         "%s: CLIP widths (hidden %lld + %lld, projections %lld + "
                         "%lld) do not fit the transformer's joint_attention_dim %lld and "
                         "pooled_projection_dim %lld",
                         p->dir, (long long)l->hidden_size, (long long)g->hidden_size,
                         (long long)l->projection_dim, (long long)g->projection_dim,
                         (long long)c->joint_attention_dim, (long long)c->pooled_projection_dim);
    return DF_OK;
}

static df_status sd3_load(df_pipeline *p, const df_model_index *idx)
{
    sd3_pipe *s = p->impl;
    if (df_pipeline_has_component(idx, "image_encoder"))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s/model_index.json: IP-Adapter image encoders are "
                         "not supported",
                         p->dir);

    DF_TRY(df_denoise_scheduler_config(p, idx, &s->parts.sched));

    char dir[DF_PATH_MAX];
    DF_TRY(df_pipeline_component_dir(p, idx, "transformer", dir, sizeof dir));
    DF_TRY_CTX(df_sd3_load_file(p->ctx, dir, p->opts.transformer_file, &s->transformer), "%s",
               dir);
    DF_TRY(df_pipeline_component_dir(p, idx, "vae", dir, sizeof dir));
    DF_TRY_CTX(df_vae_load_file(p->ctx, dir, p->opts.vae_file, &s->parts.vae), "%s", dir);
    snprintf(s->parts.vae_dir, sizeof s->parts.vae_dir, "%s", dir);
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    const df_vae_info *vi = df_vae_config(s->parts.vae);
    if (vi->latent_channels != c->in_channels || vi->latent_channels != c->out_channels)
        return df_errorf(DF_E_FORMAT,
                         "%s: the VAE has %lld latent channels but the transformer "
                         "takes %lld and predicts %lld",
                         p->dir, (long long)vi->latent_channels, (long long)c->in_channels,
                         (long long)c->out_channels);
    DF_TRY(load_text(p, s, idx));
    /* The skip-layer forward of skip-layer guidance runs uncompiled: it is a different graph,
     * and runs in few steps. */
    DF_TRY(df_denoise_prepare_transformer(p, (df_transformer *)s->transformer, false));

    /* With offloading nothing stays resident after loading. (Sequential offload of the SD3
     * transformer's blocks is not implemented: it offloads whole components, as model.) */
    DF_TRY(df_pipeline_offload(p, s->clip_l ? df_clip_weight_set(s->clip_l) : NULL));
    DF_TRY(df_pipeline_offload(p, s->clip_g ? df_clip_weight_set(s->clip_g) : NULL));
    DF_TRY(df_pipeline_offload(p, s->t5 ? df_t5_weight_set(s->t5) : NULL));
    DF_TRY(df_pipeline_offload(p, df_sd3_weight_set(s->transformer)));
    DF_TRY(df_pipeline_offload(p, df_vae_weight_set(s->parts.vae)));
    p->default_steps = 28;
    p->default_guidance = 7.0f;
    p->default_max_seq = 256;
    p->default_size = (int)(c->sample_size * vi->scale_factor);
    return DF_OK;
}

/* --- prompt encoding --------------------------------------------------------------------- */

/* ids [n * per, len]: text i's ids in rows i*per .. i*per + per - 1. */
static df_status tokenize(const df_tokenizer *tok, const char *const *texts, int n, int per,
                          int64_t len, int64_t *ids)
{
    for (int i = 0; i < n; i++) {
        df_tokens t = {0};
        df_status s = df_tokenizer_encode(
            tok, texts[i], strlen(texts[i]),
            &(df_tokenize_opts){.max_length = len, .pad = true, .truncate = true}, &t);
        if (s == DF_OK && t.count != len)
            s = df_errorf(DF_E_INTERNAL, "tokenizer returned %lld ids, not %lld",
                          (long long)t.count, (long long)len);
        for (int r = 0; r < per && s == DF_OK; r++)
            memcpy(ids + (size_t)(i * per + r) * (size_t)len, t.ids, (size_t)len * sizeof *ids);
        df_tokens_deinit(&t);
        if (s != DF_OK)
            return df_error_context(s, "prompt %d", i);
    }
    return DF_OK;
}

/* One CLIP model on the rows' ids: hidden state `layer` [R, len, D] and text_embeds [R, P]. */
static df_status clip_encode(df_ctx *ctx, const df_clip *m, const df_tokenizer *tok,
                             const char *const *texts, int n, int per, int64_t len, int layer,
                             df_tensor **hidden, df_tensor **pooled)
{
    int64_t R = (int64_t)n * per;
    int64_t *ids = df_malloc((size_t)R * (size_t)len * sizeof *ids);
    if (!ids)
        return df_errorf(DF_E_OOM, "out of memory for token ids");
    df_status s = tokenize(tok, texts, n, per, len, ids);
    if (s == DF_OK) {
        df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(R, len), ids);
        df_clip_output o = {0};
        s = t ? df_clip_encode(ctx, m, t,
                               &(df_clip_request){.hidden_states = {layer}, .n_hidden_states = 1},
                               &o)
              : df_ctx_status(ctx);
        *hidden = o.hidden_states[0];
        *pooled = o.text_embeds;
    }
    df_free(ids);
    return s;
}

/* encode_prompt for n texts, each repeated per times: embeds [R, clip_len + L, J] and pooled
 * [R, P]; `clip_skip` picks hidden_states[-(clip_skip + 2)]. */
static df_status encode_texts(df_pipeline *p, sd3_pipe *s, const char *const *texts, int n, int per,
                              int clip_skip, int max_seq, df_tensor **embeds, df_tensor **pooled)
{
    df_ctx *ctx = p->ctx;
    int64_t R = (int64_t)n * per, J = df_sd3_config(s->transformer)->joint_attention_dim;
    int layer = -(clip_skip + 2);
    df_tensor *hl, *pl, *hg, *pg, *t5;
    DF_TRY_CTX(clip_encode(ctx, s->clip_l, s->tok_l, texts, n, per, s->clip_len, layer, &hl, &pl),
               "text_encoder");
    DF_TRY_CTX(clip_encode(ctx, s->clip_g, s->tok_g, texts, n, per, s->clip_len, layer, &hg, &pg),
               "text_encoder_2");
    df_tensor *clip = df_concat(ctx, hl, hg, 2); /* [R, clip_len, Dl + Dg] */
    int64_t pad = J - df_tensor_dim(hl, 2) - df_tensor_dim(hg, 2);
    if (pad > 0)
        clip = df_concat(ctx, clip, df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(R, s->clip_len, pad)),
                         2); /* [R, clip_len, J] */
    if (s->t5) {
        int64_t *ids = df_malloc((size_t)R * (size_t)max_seq * sizeof *ids);
        if (!ids)
            return df_errorf(DF_E_OOM, "out of memory for token ids");
        df_status st = tokenize(s->tok_t5, texts, n, per, max_seq, ids);
        df_tensor *t =
            st == DF_OK ? df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(R, max_seq), ids) : NULL;
        if (st == DF_OK)
            st = t ? df_t5_encode(ctx, s->t5, t, NULL, &t5) : df_ctx_status(ctx);
        df_free(ids);
        DF_TRY_CTX(st, "text_encoder_3");
    } else {
        t5 = df_zeros(ctx, DF_DTYPE_F32, DF_SHAPE(R, max_seq, J));
    }
    *embeds = df_concat(ctx, clip, t5, 1); /* [R, clip_len + L, J] */
    *pooled = df_concat(ctx, pl, pg, 1);   /* [R, Pl + Pg] */
    return df_ctx_status(ctx);
}

/* Caller-given embeddings [n, L, J] and pooled [n, P], each row repeated per times. */
static df_status upload_embeds(df_ctx *ctx, const float *e, const float *pooled, int n, int per,
                               int64_t L, int64_t J, int64_t P, df_tensor **out_e,
                               df_tensor **out_p)
{
    int64_t R = (int64_t)n * per;
    float *be = df_malloc((size_t)R * (size_t)(L * J) * sizeof *be);
    float *bp = df_malloc((size_t)R * (size_t)P * sizeof *bp);
    df_status s = be && bp ? DF_OK : df_errorf(DF_E_OOM, "out of memory for prompt embeddings");
    for (int64_t r = 0; r < R && s == DF_OK; r++) {
        memcpy(be + r * L * J, e + (r / per) * L * J, (size_t)(L * J) * sizeof *be);
        memcpy(bp + r * P, pooled + (r / per) * P, (size_t)P * sizeof *bp);
    }
    if (s == DF_OK) {
        *out_e = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(R, L, J), be);
        *out_p = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(R, P), bp);
        s = df_ctx_status(ctx);
    }
    df_free(be);
    df_free(bp);
    return s;
}

/* --- the call ---------------------------------------------------------------------------- */

typedef struct run_cfg {
    int H, W, steps, max_seq, per, rows, B;
    int first; /* the loop's first step (image to image: cut by strength) */
    float guidance;
    bool cfg; /* classifier-free guidance (guidance > 1) */
    float slg_scale;
    double slg_start, slg_stop;
    const char *const *prompts; /* rows texts, or NULL with prompt embeddings */
} run_cfg;

static df_status check_params(df_pipeline *p, sd3_pipe *s, const df_gen_params *g, run_cfg *r)
{
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    int factor = (int)(df_vae_config(s->parts.vae)->scale_factor * c->patch_size);
    r->H = g->height ? g->height : p->default_size;
    r->W = g->width ? g->width : p->default_size;
    r->steps = g->steps ? g->steps : p->default_steps;
    r->guidance = g->guidance_set ? g->guidance : p->default_guidance;
    r->max_seq = g->max_sequence_length ? g->max_sequence_length : p->default_max_seq;
    r->per = g->num_images > 0 ? g->num_images : 1;
    r->cfg = r->guidance > 1.0f;
    r->slg_scale = g->slg_scale != 0 ? g->slg_scale : 2.8f;
    r->slg_start = g->slg_start != 0 ? g->slg_start : 0.01;
    r->slg_stop = g->slg_stop != 0 ? g->slg_stop : 0.2;
    if (r->H <= 0 || r->W <= 0 || r->H % factor || r->W % factor)
        return df_errorf(DF_E_ARG, "height %d and width %d must be positive multiples of %d", r->H,
                         r->W, factor);
    DF_TRY(df_denoise_check_steps(r->steps, r->max_seq, SD3_MAX_SEQ));
    if (!isfinite(r->guidance) || !isfinite(r->slg_scale) || !isfinite(r->slg_start) ||
        !isfinite(r->slg_stop))
        return df_errorf(DF_E_ARG, "guidance and skip-layer guidance settings must be finite");
    if (g->n_images != 0)
        return df_errorf(DF_E_UNSUPPORTED, "%s: %s takes one input image, not a list of %d",
                         p->dir, p->cls->name, g->n_images);
    if (p->cls->role == DF_PIPELINE_IMG2IMG && !g->image)
        return df_errorf(DF_E_ARG, "%s: StableDiffusion3Img2ImgPipeline needs an input image",
                         p->dir);
    if (g->image && g->latents && !g->mask) /* inpainting takes them (inpaint.c) */
        return df_errorf(DF_E_ARG, "image to image with SD3 takes no latents (diffusers' "
                                   "StableDiffusion3Img2ImgPipeline makes them from the image)");
    if (g->image)
        DF_TRY(df_img2img_first_step(g, r->steps, &r->first));
    if (g->clip_skip < 0)
        return df_errorf(DF_E_ARG, "clip_skip must be >= 0, not %d", g->clip_skip);
    DF_TRY(df_transformer_check_layers("skip-layer guidance layer", g->slg_layers, g->n_slg_layers,
                                       c->num_layers));

    r->prompts = g->prompts;
    int np = g->n_prompts;
    if (!r->prompts && g->prompt) {
        r->prompts = &g->prompt;
        np = 1;
    }
    if (g->prompt_embeds) {
        if (!g->pooled_prompt_embeds || g->prompt_embeds_len < 1)
            return df_errorf(DF_E_ARG, "prompt embeddings need their length and pooled "
                                       "embeddings");
        r->rows = g->n_prompts > 0 ? g->n_prompts : 1;
        r->prompts = NULL;
    } else {
        if (np < 1 || !r->prompts)
            return df_errorf(DF_E_ARG, "no prompt given");
        for (int i = 0; i < np; i++)
            if (!r->prompts[i])
                return df_errorf(DF_E_ARG, "prompt %d is NULL", i);
        if (!s->clip_l)
            return df_errorf(DF_E_ARG, "%s has no text encoders: pass prompt embeddings", p->dir);
        r->rows = np;
    }
    if (g->negative_prompt && g->negative_prompts)
        return df_errorf(DF_E_ARG, "give either one negative prompt for all prompts or a list "
                                   "of them, not both");
    if (g->negative_prompts && g->negative_prompt_embeds)
        return df_errorf(DF_E_ARG, "give either negative prompts or negative prompt "
                                   "embeddings, not both");
    for (int i = 0; g->negative_prompts && i < r->rows; i++)
        if (!g->negative_prompts[i])
            return df_errorf(DF_E_ARG, "negative prompt %d of %d is NULL", i, r->rows);
    if (g->negative_prompt_embeds && !g->negative_pooled_prompt_embeds)
        return df_errorf(DF_E_ARG, "negative prompt embeddings need negative pooled embeddings");
    if (r->cfg && !g->negative_prompt_embeds && !s->clip_l)
        return df_errorf(DF_E_ARG,
                         "%s has no text encoders: guidance %g needs negative prompt "
                         "embeddings",
                         p->dir, (double)r->guidance);
    r->B = r->rows * r->per;
    return DF_OK;
}

/* The positive and (with guidance) negative embeddings, each [B, L, J] / [B, P]. */
static df_status prompt_embeddings(df_pipeline *p, sd3_pipe *s, const df_gen_params *g,
                                   const run_cfg *r, df_tensor **pe, df_tensor **pp, df_tensor **ne,
                                   df_tensor **np)
{
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    int64_t J = c->joint_attention_dim, P = c->pooled_projection_dim;
    *ne = *np = NULL;
    if (g->prompt_embeds)
        DF_TRY(upload_embeds(p->ctx, g->prompt_embeds, g->pooled_prompt_embeds, r->rows, r->per,
                             g->prompt_embeds_len, J, P, pe, pp));
    else
        DF_TRY(encode_texts(p, s, r->prompts, r->rows, r->per, g->clip_skip, r->max_seq, pe, pp));
    if (!r->cfg)
        return DF_OK;
    if (g->negative_prompt_embeds) {
        DF_TRY(upload_embeds(p->ctx, g->negative_prompt_embeds, g->negative_pooled_prompt_embeds,
                             r->rows, r->per, df_tensor_dim(*pe, 1), J, P, ne, np));
    } else {
        const char **neg = df_malloc((size_t)r->rows * sizeof *neg);
        if (!neg)
            return df_errorf(DF_E_OOM, "out of memory");
        for (int i = 0; i < r->rows; i++) /* prompt i's own negative, or the common one */
            neg[i] = g->negative_prompts  ? g->negative_prompts[i]
                     : g->negative_prompt ? g->negative_prompt
                                          : "";
        df_status st = encode_texts(p, s, neg, r->rows, r->per, 0, r->max_seq, ne, np);
        df_free(neg);
        DF_TRY_CTX(st, "negative prompt");
        if (df_tensor_dim(*ne, 1) != df_tensor_dim(*pe, 1))
            return df_errorf(DF_E_ARG,
                             "the negative prompt encodes to %lld tokens but the "
                             "prompt embeddings have %lld",
                             (long long)df_tensor_dim(*ne, 1), (long long)df_tensor_dim(*pe, 1));
    }
    return DF_OK;
}

/* The denoising loop over host latents lat [B, C, h, w]. */
/* Classifier-free guidance on the device: v [2B, ...] = [uncond, cond];
 * uncond + g * (cond - uncond) [+ (cond - skip) * slg_scale], each op in float32 as the
 * host path rounds it. */
static df_tensor *guide(df_ctx *ctx, const run_cfg *r, df_tensor *v, df_tensor *vs)
{
    df_tensor *u = df_slice(ctx, v, 0, 0, r->B), *cond = df_slice(ctx, v, 0, r->B, 2 * r->B);
    df_tensor *noise = df_add(ctx, u, df_scale(ctx, df_sub(ctx, cond, u), r->guidance, -0.0f));
    if (vs)
        noise = df_add(ctx, noise, df_scale(ctx, df_sub(ctx, cond, vs), r->slg_scale, -0.0f));
    return noise;
}

/* The scheduler of a run on latents [., ., h, w], its loop starting at step r->first. */
static df_status make_scheduler(const sd3_pipe *s, const run_cfg *r, int64_t h, int64_t w,
                                df_scheduler **out)
{
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    int64_t seq = (h / c->patch_size) * (w / c->patch_size);
    double mu = df_flux_calculate_shift(seq, s->parts.sched.base_image_seq_len,
                                        s->parts.sched.max_image_seq_len, s->parts.sched.base_shift,
                                        s->parts.sched.max_shift);
    return df_denoise_scheduler(&s->parts.sched, r->steps, false,
                                s->parts.sched.use_dynamic_shifting ? &mu : NULL, r->first, out);
}

/* Decodes lat [B, C, h, w] and fills the output's images. */
static df_status decode(df_pipeline *p, sd3_pipe *s, const df_gen_params *g, const run_cfg *r,
                        const float *lat, int64_t C, int64_t h, int64_t w, df_gen_output *out)
{
    df_ctx *ctx = p->ctx;
    df_tensor *z = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(r->B, C, h, w), lat);
    df_status st = df_ctx_status(ctx);
    if (st == DF_OK && g->mask) /* StableDiffusion3InpaintPipeline decodes latents / scale */
        z = df_scale(ctx, z, (float)(1.0 / df_vae_config(s->parts.vae)->scaling_factor), -0.0f);
    else if (st == DF_OK)
        st = df_vae_unscale(ctx, s->parts.vae, z, &z);
    if (st == DF_OK)
        st = df_denoise_decode(p, s->parts.vae, z, g->vae_tiling, false, r->B, r->H, r->W, out);
    return st;
}

/* A run's fixed inputs to the transformer, for the loop's hooks. */
typedef struct sd3_loop {
    df_pipeline *p;
    sd3_pipe *s;
    const df_gen_params *g;
    const run_cfg *r;
    df_tensor *embeds, *pooled; /* [negative, positive] with CFG, else the positive text */
    df_tensor *pos_e, *pos_p;   /* the positive text alone, for skip-layer guidance */
    int64_t C, h, w, n;         /* the latents [B, C, h, w], n = B C h w */
    df_tensor *vs;              /* this step's skip-layer prediction, or NULL */
    float *pred, *skip;         /* host steps: the predictions read back */
} sd3_loop;

/* The loop's model call: one batched forward ([uncond, cond] with CFG) and, inside
 * skip-layer guidance's window, one on the positive text skipping g->slg_layers; guided
 * on the device, or left for loop_read on the host path. */
static df_status loop_predict(void *self, const df_denoise_step *step, df_tensor **out)
{
    sd3_loop *l = self;
    df_ctx *ctx = l->p->ctx;
    const run_cfg *r = l->r;
    df_tensor *x = step->x;
    df_tensor *ts = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(1), &step->t);
    df_tensor *args[4] = {r->cfg ? df_concat(ctx, x, x, 0) : x, l->embeds, l->pooled, ts};
    df_tensor *v = NULL;
    df_status st = df_transformer_call(ctx, (df_transformer *)l->s->transformer, args, &v);
    int i = step->i;
    bool slg = l->skip && (double)i > r->steps * r->slg_start && (double)i < r->steps * r->slg_stop;
    l->vs = slg ? df_sd3_forward(ctx, l->s->transformer,
                                 &(df_sd3_inputs){.hidden_states = x,
                                                  .encoder_hidden_states = l->pos_e,
                                                  .pooled_projections = l->pos_p,
                                                  .timestep = ts,
                                                  .skip_layers = l->g->slg_layers,
                                                  .n_skip_layers = l->g->n_slg_layers})
                : NULL;
    *out = st == DF_OK && step->on_device && r->cfg ? guide(ctx, r, v, l->vs) : v;
    return st;
}

/* The reference path: the predictions read to the host and guided on host floats into
 * noise (n floats). */
static df_status loop_read(void *self, df_tensor *v, float *noise)
{
    sd3_loop *l = self;
    const run_cfg *r = l->r;
    int64_t n = l->n, rows = r->cfg ? 2 : 1;
    float *pred = l->pred, *skip = l->skip;
    DF_TRY(df_tensor_read(l->p->ctx, v, DF_DTYPE_F32, pred, (size_t)(rows * n) * sizeof *pred));
    if (l->vs)
        DF_TRY(df_tensor_read(l->p->ctx, l->vs, DF_DTYPE_F32, skip, (size_t)n * sizeof *skip));
    if (!r->cfg) {
        memcpy(noise, pred, (size_t)n * sizeof *noise);
        return DF_OK;
    }
    /* noise = uncond + g * (cond - uncond) [+ (cond - skip) * slg_scale], float32 */
    for (int64_t k = 0; k < n; k++) {
        float u = pred[k], cond = pred[n + k];
        float diff = cond - u, guided = r->guidance * diff;
        noise[k] = u + guided;
        if (l->vs) {
            float d2 = cond - skip[k], add = d2 * r->slg_scale;
            noise[k] = noise[k] + add;
        }
    }
    return DF_OK;
}

/* g->preview's decode: one image's latents. */
static df_status loop_decode(void *self, const float *lat, df_gen_output *out)
{
    sd3_loop *l = self;
    run_cfg one = *l->r;
    one.B = 1;
    return decode(l->p, l->s, l->g, &one, lat, l->C, l->h, l->w, out);
}

static df_status denoise(df_pipeline *p, sd3_pipe *s, const df_gen_params *g, const run_cfg *r,
                         df_tensor *embeds, df_tensor *pooled, df_tensor *pos_e, df_tensor *pos_p,
                         const df_inpaint *ip, float *lat, int64_t C, int64_t h, int64_t w)
{
    int64_t n = (int64_t)r->B * C * h * w, rows = r->cfg ? 2 * r->B : r->B;
    sd3_loop l = {.p = p, .s = s, .g = g, .r = r, .embeds = embeds, .pooled = pooled,
                  .pos_e = pos_e, .pos_p = pos_p, .C = C, .h = h, .w = w, .n = n};
    bool slg = g->n_slg_layers > 0 && r->cfg;
    l.pred = df_malloc((size_t)(rows * C * h * w) * sizeof *l.pred);
    l.skip = slg ? df_malloc((size_t)n * sizeof *l.skip) : NULL;
    df_scheduler *sched = NULL;
    df_status st = l.pred && (l.skip || !slg)
                       ? DF_OK
                       : df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n);
    if (st == DF_OK)
        st = make_scheduler(s, r, h, w, &sched);
    if (st == DF_OK)
        st = df_denoise_run(p, g,
                            &(df_denoise){
                                .sched = sched,
                                .first = r->first,
                                .steps = r->steps,
                                .shape = {r->B, C, h, w},
                                .ndim = 4,
                                .B = r->B,
                                .n = C * h * w,
                                .model = &l,
                                .predict = loop_predict,
                                .read = loop_read,
                                .decode = loop_decode,
                                .blend = ip,
                                .transformer = (df_transformer *)s->transformer,
                            },
                            lat);
    df_scheduler_free(sched);
    df_free(l.pred);
    df_free(l.skip);
    return st;
}

/* The sigma of the loop's first step, to which an input picture's latents are noised. */
static df_status first_sigma(const sd3_pipe *s, const run_cfg *r, int64_t h, int64_t w,
                             float *sigma)
{
    df_scheduler *sched;
    DF_TRY(make_scheduler(s, r, h, w, &sched));
    *sigma = df_scheduler_sigmas(sched)[r->first];
    df_scheduler_free(sched);
    return DF_OK;
}

/* StableDiffusion3Img2ImgPipeline.prepare_latents: the input picture's latents noised to
 * the sigma of the loop's first step, [B, C, h, w]. */
static df_status image_latents(df_pipeline *p, sd3_pipe *s, const df_gen_params *g,
                               const run_cfg *r, int64_t h, int64_t w, float *out)
{
    float sigma;
    DF_TRY(first_sigma(s, r, h, w, &sigma));
    int multiple = (int)df_vae_config(s->parts.vae)->scale_factor; /* VaeImageProcessor's */
    return df_img2img_latents(p, s->parts.vae_dir, &s->parts.vae_enc, g, r->B, r->H, r->W, multiple,
                              sigma, out);
}

/* StableDiffusion3InpaintPipeline's prepare_latents and prepare_mask_latents: the starting
 * latents into lat, what the blend reads into ip. */
static df_status inpaint_latents(df_pipeline *p, sd3_pipe *s, const df_gen_params *g,
                                 const run_cfg *r, int64_t h, int64_t w, float *lat, df_inpaint *ip)
{
    float sigma;
    DF_TRY(first_sigma(s, r, h, w, &sigma));
    int multiple = (int)df_vae_config(s->parts.vae)->scale_factor; /* VaeImageProcessor's */
    int64_t C = df_sd3_config(s->transformer)->in_channels;
    return df_inpaint_prepare(p, s->parts.vae_dir, &s->parts.vae_enc, g, r->B, r->H, r->W, multiple,
                              C, sigma, NULL, lat, ip);
}

static df_status sd3_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    sd3_pipe *s = p->impl;
    df_ctx *ctx = p->ctx;
    run_cfg r = {0};
    DF_TRY(check_params(p, s, g, &r));
    if (g->cache && g->cache->kind != DF_CACHE_NONE) /* docs/step-cache.md */
        return df_errorf(DF_E_UNSUPPORTED, "--cache: SD3Transformer2DModel has no step caches "
                         "in diffusers 0.42 (no enable_cache); they run on FluxPipeline and "
                         "Flux2KleinPipeline");
    const df_sd3_cfg *c = df_sd3_config(s->transformer);
    int64_t f = df_vae_config(s->parts.vae)->scale_factor;
    int64_t C = c->in_channels, h = r.H / f, w = r.W / f, n_lat = (int64_t)r.B * C * h * w;

    df_scope outer = df_scope_begin(ctx);
    df_tensor *pe = NULL, *pp = NULL, *ne = NULL, *np = NULL;
    df_stats_reset_resident_peak(ctx);
    df_weight_set *text[3] = {s->clip_l ? df_clip_weight_set(s->clip_l) : NULL,
                              s->clip_g ? df_clip_weight_set(s->clip_g) : NULL,
                              s->t5 ? df_t5_weight_set(s->t5) : NULL};
    for (int i = 0; i < 3; i++)
        df_pipeline_onload(p, text[i]);
    df_status st = prompt_embeddings(p, s, g, &r, &pe, &pp, &ne, &np);
    for (int i = 0; i < 3 && st == DF_OK; i++)
        st = df_pipeline_offload(p, text[i]);
    df_pipeline_note_phase(p, out, "encode");
    df_tensor *embeds = pe, *pooled = pp;
    if (st == DF_OK && r.cfg) {
        embeds = df_concat(ctx, ne, pe, 0); /* [negative, positive] */
        pooled = df_concat(ctx, np, pp, 0);
        st = df_ctx_status(ctx);
    }

    float *lat = df_malloc((size_t)n_lat * sizeof *lat);
    if (st == DF_OK && !lat)
        st = df_errorf(DF_E_OOM, "out of memory for %lld latents", (long long)n_lat);
    df_inpaint ip = {0};
    if (st == DF_OK && g->mask) {
        st = inpaint_latents(p, s, g, &r, h, w, lat, &ip);
    } else if (st == DF_OK && g->latents) {
        memcpy(lat, g->latents, (size_t)n_lat * sizeof *lat);
    } else if (st == DF_OK && g->image) {
        st = image_latents(p, s, g, &r, h, w, lat);
    } else if (st == DF_OK) {
        st = df_pipeline_draw_noise(g, r.B, C * h * w, lat);
    }
    if (st == DF_OK)
        st = denoise(p, s, g, &r, embeds, pooled, pe, pp, g->mask ? &ip : NULL, lat, C, h, w);
    df_pipeline_note_phase(p, out, "denoise");
    df_pipeline_onload(p, df_vae_weight_set(s->parts.vae));
    if (st == DF_OK)
        st = decode(p, s, g, &r, lat, C, h, w, out);
    if (st == DF_OK)
        st = df_pipeline_offload(p, df_vae_weight_set(s->parts.vae));
    df_pipeline_note_phase(p, out, "decode");
    if (st == DF_OK) {
        out->width = r.W;
        out->height = r.H;
        out->steps = r.steps;
        out->guidance = r.guidance;
        out->latents = lat;
        lat = NULL;
        out->latents_ndim = 4;
        out->latents_shape[0] = r.B, out->latents_shape[1] = C;
        out->latents_shape[2] = h, out->latents_shape[3] = w;
    }
    df_free(lat);
    df_inpaint_deinit(&ip);
    df_scope_end(ctx, outer, NULL);
    return st;
}

static int sd3_weight_sets(df_pipeline *p, const char **names, df_weight_set **sets, int cap)
{
    sd3_pipe *s = p->impl;
    df_weight_set *all[] = {df_sd3_weight_set(s->transformer), df_vae_weight_set(s->parts.vae),
                            s->clip_l ? df_clip_weight_set(s->clip_l) : NULL,
                            s->clip_g ? df_clip_weight_set(s->clip_g) : NULL,
                            s->t5 ? df_t5_weight_set(s->t5) : NULL};
    static const char *const name[] = {"transformer", "vae", "text_encoder", "text_encoder_2",
                                       "text_encoder_3"};
    return df_pipeline_list_weight_sets(name, all, 5, names, sets, cap);
}

static const df_pipeline_ops sd3_ops = {
    .size = sizeof(sd3_pipe),
    .load = sd3_load,
    .run = sd3_run,
    .free = sd3_free,
    .weight_sets = sd3_weight_sets,
};

/* The image-input classes load the same components (inpaint.c, img2img.c). */
const df_pipeline_kind df_sd3_pipeline_class = {"StableDiffusion3Pipeline", &sd3_ops};
const df_pipeline_kind df_sd3_img2img_pipeline_class = {"StableDiffusion3Img2ImgPipeline",
                                                        &sd3_ops, DF_PIPELINE_IMG2IMG};
const df_pipeline_kind df_sd3_inpaint_pipeline_class = {"StableDiffusion3InpaintPipeline",
                                                        &sd3_ops, DF_PIPELINE_INPAINT};
