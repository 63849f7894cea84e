/*
 * The flow-matching denoising loop and the decode that every pipeline shares.
 *
 * A pipeline prepares its scheduler, its text and its transformer's fixed inputs, then hands
 * the loop a df_denoise: the latents' shape and hooks for what differs per model (the
 * transformer call with its guidance, the host read of a prediction, the decode of a
 * preview). The loop owns the steps: device or host step, df_mark_step, the inpaint blend,
 * the tensor-parallel checks and broadcasts, previews, progress and cancellation, and the
 * run's step caches on the transformer (g->cache).
 */
#ifndef DF_PIPELINES_DENOISE_H
#define DF_PIPELINES_DENOISE_H

#include <diffuse/compile.h>
#include <diffuse/layout.h>
#include <diffuse/pipeline.h>
#include <diffuse/scheduler.h>
#include <diffuse/vae.h>

#include "models/transformer_base.h"

struct df_inpaint;
struct df_weight_set;

/* The config of the folder's scheduler (scheduler/scheduler_config.json) into *out. */
df_status df_denoise_scheduler_config(const df_pipeline *p, const df_model_index *idx,
                                      df_scheduler_config *out);

/*
 * A scheduler from `cfg` with `steps` timesteps: sigmas linspace(1, 1/steps, steps) where
 * `linear` (FLUX.1, FLUX.2), else the scheduler's own (SD3); shifted by *mu where mu is
 * given; its loop starting at step `first`. *out is the caller's to df_scheduler_free, NULL
 * on failure.
 */
df_status df_denoise_scheduler(const df_scheduler_config *cfg, int steps, bool linear,
                               const double *mu, int first, df_scheduler **out);

/* What the load options ask of a pipeline's loaded transformer t: its whole forward
 * compiled (compile), its repeated blocks compiled (compile_blocks) and, where the model
 * takes it (`sequential`), its blocks offloaded one at a time (DF_OFFLOAD_SEQUENTIAL). */
df_status df_denoise_prepare_transformer(const df_pipeline *p, df_transformer *t,
                                         bool sequential);

/* The run's loop settings: steps in [1, 1000], max_sequence_length in [1, max_seq_limit]. */
df_status df_denoise_check_steps(int steps, int max_seq, int max_seq_limit);

/* Unless g gives prompt embeddings: at least one of its np prompts (g->prompts, or
 * g->prompt alone), none of them NULL. */
df_status df_denoise_check_prompts(const df_gen_params *g, int np);

/* What a model's hook sees of one step. */
typedef struct df_denoise_step {
    df_tensor *x;   /* the latents, a tensor of the step's scope */
    int i;          /* the scheduler's step index */
    float t;        /* its timestep */
    bool on_device; /* whether the loop steps on the device; else it reads the prediction */
} df_denoise_step;

typedef struct df_denoise {
    df_scheduler *sched; /* timesteps set, begin index `first`; the caller's */
    int first, steps;    /* the loop runs steps first .. steps - 1 */
    int64_t shape[4];    /* the latents' shape as the transformer takes them */
    int ndim;
    int64_t B, n; /* images, and floats per image */
    void *model;  /* the hooks' first argument */
    /* The guided velocity for step `st`, a tensor of the step's scope in *v. */
    df_status (*predict)(void *model, const df_denoise_step *st, df_tensor **v);
    /* Host steps: the velocity (B * n floats) from predict's *v; NULL reads *v as it is. */
    df_status (*read)(void *model, df_tensor *v, float *v_host);
    /* Previews: the images of the latents `lat` of one image into out. */
    df_status (*decode)(void *model, const float *lat, df_gen_output *out);
    bool marks_step;                /* predict calls df_mark_step itself (after each forward) */
    const struct df_inpaint *blend; /* inpainting: the picture blended in after each step */
    /* The transformer the hooks call: resident for the loop when the pipeline offloads (and
     * its blocks are not offloaded one by one), and given g->cache's step caches for the
     * loop, `cache_contexts` of them (0 or 1: one; 2: "cond" and "uncond", which predict
     * picks with df_transformer_cache_context). Their trace goes into `out`. */
    df_transformer *transformer;
    int cache_contexts;
    df_gen_output *out;
} df_denoise;

/*
 * Runs the loop over the latents lat (B * n floats, updated in place). They stay on the
 * device and step there (the same bits as the host step) unless the host steps: g->host_step
 * or DIFFUSE_HOST_STEP (the reference path), tensor parallelism (rank 0's latents are
 * shared after every step, so the ranks stay identical), or an inpaint blend (on the host).
 * Fails with the first failing hook's or step's status; DF_E_CANCELLED when g->on_step asks
 * to stop. The step caches' checks (df_pipeline_check_cache) are the pipeline's, before.
 */
df_status df_denoise_run(df_pipeline *p, const df_gen_params *g, const df_denoise *d, float *lat);

/*
 * Decodes the VAE's input z [B, C, h, w] into out's B images of H x W (RGB8 and float),
 * through df_vae_decode_auto: tiled when `tiling`, or by itself when memory is short.
 * With `phase`, the VAE's weights are released (offloading) and the decode phase noted once
 * the image is read back.
 */
df_status df_denoise_decode(df_pipeline *p, df_vae *vae, df_tensor *z, bool tiling, bool phase,
                            int64_t B, int64_t H, int64_t W, df_gen_output *out);

#endif
