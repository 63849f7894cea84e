/* What every pipeline class provides to pipeline.c (load by class, run, free). */
#ifndef DF_PIPELINES_PIPELINE_H
#define DF_PIPELINES_PIPELINE_H

#include <diffuse/layout.h>
#include <diffuse/pipeline.h>
#include <diffuse/scheduler.h>
#include <diffuse/tokenizer.h>
#include <diffuse/vae.h>

struct df_weight_set;

/* What every class's state (p->impl) starts with: pipeline.c allocates the state zeroed
 * before the class loads, and frees these after the class freed its own parts. */
typedef struct df_pipeline_parts {
    df_vae *vae;             /* NULL where the class loads none (ranks other than 0) */
    df_vae_encoder *vae_enc; /* image inputs: loaded on first use */
    char vae_dir[4096];
    df_scheduler_config sched;
} df_pipeline_parts;

/* What a pipeline file implements, shared by the classes that load the same components
 * (FluxPipeline, FluxImg2ImgPipeline, ... all run flux.c's). */
typedef struct df_pipeline_ops {
    size_t size; /* of the state, a struct whose first member is a df_pipeline_parts */
    df_status (*load)(df_pipeline *p, const df_model_index *idx);
    df_status (*run)(df_pipeline *p, const df_gen_params *g, df_gen_output *out);
    void (*free)(void *impl); /* the state's own parts; NULL: it has none */
    /* The loaded components' weights, for df_pipeline_save: up to `cap` component names
     * (model_index.json's) and their weight sets; returns how many. */
    int (*weight_sets)(df_pipeline *p, const char **names, struct df_weight_set **sets, int cap);
} df_pipeline_ops;

/* What a class asks of a run beyond its prompt (diffusers' pipeline variants). */
typedef enum df_pipeline_role {
    DF_PIPELINE_TEXT2IMG,
    DF_PIPELINE_IMG2IMG, /* needs an input image */
    DF_PIPELINE_INPAINT, /* needs an input image and a mask */
    DF_PIPELINE_KONTEXT, /* FluxKontextPipeline's sizes and picture (kontext.c) */
} df_pipeline_role;

/* One pipeline class: a row of one line per class, its code the ops of its file. */
typedef struct df_pipeline_kind {
    const char *name; /* model_index.json "_class_name" */
    const df_pipeline_ops *ops;
    df_pipeline_role role;
} df_pipeline_kind;

struct df_pipeline {
    const df_pipeline_kind *cls;
    void *impl;
    df_ctx *ctx;
    char dir[2048];
    char checkpoint[2048]; /* -m FILE: the all-in-one file the components' *_file name */
    /* -m FILE without a folder of configs: the shipped set (models/shipped.h) written into
     * the temporary folder `dir`, removed by df_pipeline_free; the tokenizers come from
     * tokenizer_dir (--config DIR holding only tokenizer folders). */
    const struct df_shipped_config *shipped;
    char tokenizer_dir[2048];
    df_load_opts opts;
    struct df_comm *comm; /* tensor-parallel ranks, or NULL */
    bool owns_comm;
    df_dtype compute;      /* the context's compute dtype */
    char dtype_why[512];   /* why: "asked for", or df_dtype_auto's reason */
    int64_t run_peak; /* the most weight bytes resident in any phase of the current run */
    double phase_start; /* df_now() at the current run's start or its last phase's end */
    /* Defaults a class sets at load. */
    int default_steps, default_max_seq, default_size;
    float default_guidance;
    bool t5_off; /* SD3 without text_encoder_3: df_pipeline_t5_off */
};

extern const df_pipeline_kind df_flux_pipeline_class;
extern const df_pipeline_kind df_flux_img2img_pipeline_class; /* FluxImg2ImgPipeline */
extern const df_pipeline_kind df_flux_inpaint_pipeline_class; /* FluxInpaintPipeline */
extern const df_pipeline_kind df_flux_kontext_pipeline_class; /* FluxKontextPipeline */

/* Offloading (p->opts.offload): make a component's weights resident before it runs, and
 * release them after its queued work (both no-ops without offload; ws may be NULL). */
void df_pipeline_onload(const df_pipeline *p, struct df_weight_set *ws);
df_status df_pipeline_offload(const df_pipeline *p, struct df_weight_set *ws);

/* The dtype most of the transformer's weight bytes are stored in (the checkpoint's dtype
 * for --dtype auto); DF_DTYPE_COUNT when the folder has no readable transformer (its load
 * then reports why). */
df_dtype df_pipeline_checkpoint_dtype(const char *pipeline_dir);

/* The starting noise of B images of n floats each, as diffusers' randn_tensor draws it in
 * float32 from the parameters' generator(s): one generator draws all B * n values at once; a
 * list of B generators (g->seeds) draws image b alone from seeds[b]. DF_E_ARG when the list
 * has neither 1 nor B generators (diffusers' ValueError). */
df_status df_pipeline_draw_noise(const df_gen_params *g, int B, int64_t n, float *out);

/* Records the residency and memory after `phase` in the output, and restarts the context's
 * resident-weight peak for the next phase (df_pipeline_run restores the run's peak, the
 * largest of its phases', when the run ends). */
void df_pipeline_note_phase(df_pipeline *p, df_gen_output *out, const char *phase);
extern const df_pipeline_kind df_sd3_pipeline_class;
extern const df_pipeline_kind df_sd3_img2img_pipeline_class; /* StableDiffusion3Img2ImgPipeline */
extern const df_pipeline_kind df_sd3_inpaint_pipeline_class; /* StableDiffusion3InpaintPipeline */
extern const df_pipeline_kind df_flux2_pipeline_class;       /* Flux2Pipeline */
extern const df_pipeline_kind df_flux2_klein_pipeline_class; /* Flux2KleinPipeline */

/* The folder of component `name` of the pipeline, or an error naming it when the index
 * lists it as null or the folder is missing. */
df_status df_pipeline_component_dir(const df_pipeline *p, const df_model_index *idx,
                                    const char *name, char *buf, size_t cap);
/* Loads the T5 tokenizer from component `name` (tokenizer_2 of FLUX.1, tokenizer_3 of SD3).
 * When that fails and `t5_file` (the T5 encoder's single file, or NULL) is a GGUF carrying
 * llama.cpp's tokenizer (tokenizer.ggml.*), the error is DF_E_UNSUPPORTED saying that such a
 * tokenizer is not read and where to put one, after the folder's own message. */
df_status df_pipeline_load_t5_tokenizer(const df_pipeline *p, const df_model_index *idx,
                                        const char *name, const char *t5_file,
                                        df_tokenizer **out);
/* Whether the index names the component (not [null, null]). */
bool df_pipeline_has_component(const df_model_index *idx, const char *name);

/* The components a pipeline class loads, with the classes model_index.json may name for
 * each (a component given as [null, null] is left out; one not listed is ignored, as
 * diffusers ignores an unexpected one). One table per class, in pipeline.c: the load checks
 * a folder against it before the class loads anything, and `diffuse inspect` has a model
 * check for every class it names (tests/unit/test_pipeline_tables.c). */
#define DF_PIPELINE_MAX_COMPONENTS 10
#define DF_COMPONENT_MAX_CLASSES 6
typedef struct df_component_rule {
    const char *name;                                /* "transformer"; NULL ends the table */
    const char *classes[DF_COMPONENT_MAX_CLASSES];  /* NULL-terminated */
} df_component_rule;

typedef struct df_pipeline_table {
    const df_pipeline_kind *kind;
    df_component_rule components[DF_PIPELINE_MAX_COMPONENTS];
} df_pipeline_table;

/* The pipeline classes this build loads; *n gets their count. */
const df_pipeline_table *df_pipeline_tables(int *n);

/* Tensor parallelism (p->comm). lead: rank 0, or the only process; tp: more than one rank.
 * tp_check: after work that ran the stream's collectives, a rank that failed there cannot
 * join the next collective, so it stops every rank (returns s). tp_agree: every rank's
 * status where a rank may have failed alone with no collective pending (waits for the
 * device first). tp_share: rank 0's `bytes` at buf on every rank (after the device is
 * idle). All three are s / DF_OK without tensor parallelism. */
bool df_pipeline_lead(const df_pipeline *p);
bool df_pipeline_tp(const df_pipeline *p);

/* After denoising step `step` of `steps`: calls g->progress, then g->on_step; DF_E_CANCELLED
 * when on_step asks to stop. */
df_status df_pipeline_step_done(const df_gen_params *g, int step, int steps, double elapsed);

/* Previews (g->preview): whether step `step` of `steps` gets one, and the denoised estimate
 * x0 = x - sigma * v of the batch's first n latents (the latents after the step, sigma the
 * next sigma, v the guided prediction), read from the device tensors x / v when they are
 * given, else from the host arrays; *out (n floats) is the caller's to df_free. */
bool df_pipeline_preview_due(const df_gen_params *g, int step, int steps);
df_status df_pipeline_preview_latents(df_ctx *ctx, df_tensor *x, df_tensor *v, const float *x_host,
                                      const float *v_host, int64_t total, int64_t n, float sigma,
                                      float **out);

/* Whether the denoising loop steps on the host: g->host_step, else DIFFUSE_HOST_STEP. */
bool df_pipeline_host_step(const df_gen_params *g);
df_status df_pipeline_tp_check(df_pipeline *p, df_status s);
df_status df_pipeline_tp_agree(df_pipeline *p, df_status s);
df_status df_pipeline_tp_share(df_pipeline *p, void *buf, size_t bytes);

/* A picture's latents as tokens that join the latents on the transformer's input (Kontext's
 * picture, FLUX.2's reference images), with their ids. */
typedef struct df_image_tokens {
    int64_t n_tokens;
    int64_t channels; /* 4 * latent_channels */
    float *tokens;    /* [n_tokens, channels] */
    float *ids;       /* [n_tokens, id_width], f32 as the transformer reads ids */
} df_image_tokens;

/* Tensor parallelism: rank 0's tokens and ids (id_width per token) on every rank (rank 0
 * alone has the VAE); `what` names them in the out-of-memory message. */
df_status df_image_tokens_share(df_pipeline *p, df_image_tokens *t, int id_width,
                                const char *what);
void df_image_tokens_deinit(df_image_tokens *t);

/* For df_pipeline_kind.weight_sets: the loaded ones of the n components name[i] with weights
 * all[i] (NULL: not loaded), in order, at most cap into names and sets; returns how many. */
int df_pipeline_list_weight_sets(const char *const *name, struct df_weight_set *const *all, int n,
                                 const char **names, struct df_weight_set **sets, int cap);

/* Step caches (g->cache): DF_E_UNSUPPORTED where the run cannot take one (a transformer
 * compiled whole, tensor parallelism, TaylorSeer with compiled blocks), naming why. */
df_status df_pipeline_check_cache(const df_pipeline *p, const df_gen_params *g);

#endif
