/*
 * Pipelines: a whole diffusers folder (model_index.json) from prompt to image.
 *
 * df_pipeline_load reads model_index.json, picks the pipeline class (FluxPipeline,
 * StableDiffusion3Pipeline, Flux2Pipeline, Flux2KleinPipeline), loads its components and creates the context they run in.
 * df_pipeline_run encodes the prompts, draws the starting noise exactly as torch.randn does
 * for the seed, runs the denoising loop (calling df_mark_step once per step) and decodes
 * the latents.
 */
#ifndef DIFFUSE_PIPELINE_H
#define DIFFUSE_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "compile.h"
#include "image.h"
#include "runtime.h"
#include "step_cache.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct df_pipeline df_pipeline;

/* Where weights live between uses (diffusers' enable_model_cpu_offload and
 * enable_sequential_cpu_offload). On the CPU, "resident" means mapped into memory and
 * packed for the GEMM; released weights keep only their file mapping. */
typedef enum df_offload {
    DF_OFFLOAD_NONE,       /* every component resident from load on */
    DF_OFFLOAD_MODEL,      /* each component resident only while it runs */
    DF_OFFLOAD_SEQUENTIAL, /* the transformer's blocks resident one at a time, the next
                              block read ahead while the current one runs */
} df_offload;

/* A LoRA adapter file and its weight (diffusers' set_adapters weight: 1 is the adapter as
 * trained, 0 turns it off). Layouts, the scale rule and what is refused: docs/io.md. */
typedef struct df_lora_spec {
    const char *path; /* a .safetensors file in the diffusers/peft, kohya or XLabs layout */
    float scale;
} df_lora_spec;

/* What the .safetensors file at `path` is as a LoRA adapter: one line into out (cap bytes)
 * such as "LoRA adapter, kohya layout: 18 transformer modules, 1 text-encoder modules,
 * rank 4", with *found true. *found is false (out empty) when no key looks like a LoRA
 * tensor. Fails as df_load_opts.loras would (DF_E_IO, DF_E_FORMAT, DF_E_UNSUPPORTED with
 * the file and key), except that a module is not matched against a model. */
DF_API df_status df_lora_describe_file(const char *path, char *out, size_t cap, bool *found);

typedef struct df_load_opts {
    const char *device;  /* NULL: df_device_default() */
    int threads;         /* 0: all cores */
    df_dtype dtype;      /* compute dtype: DF_DTYPE_F32, DF_DTYPE_BF16 or DF_DTYPE_I8 (8-bit
                            linears in the transformer and T5; docs/int8.md); 0 with auto_dtype */
    bool auto_dtype;     /* bf16 for bf16 checkpoints on devices whose bf16 products
                            measure >= 1.25x f32's, else f32 (df_dtype_auto); under tensor
                            parallelism rank 0 measures and every rank takes its choice */
    df_eager_mode mode;  /* strict eager or defer-and-fuse */
    bool compile;        /* compile the transformer's forward (static shapes, traced once
                            per image size; see compile.h); the rest runs in `mode`. With
                            DF_OFFLOAD_SEQUENTIAL, whose per-block residency cannot be traced
                            into one program, the repeated blocks are compiled instead (as
                            with compile_blocks) */
    bool compile_blocks; /* compile the transformer's repeated blocks; with `compile` too,
                            the blocks are traced into the whole forward's program */
    df_offload offload;
    /* Tensor parallelism (FluxPipeline, Flux2Pipeline, Flux2KleinPipeline): the transformer
     * and the large text encoder (T5, Mistral 3, Qwen3) split over `tp` ranks, one process
     * each. 0 or 1: none. With `comm` NULL, tp > 1 initialises MPI (df_dist_init; the
     * program must run under mpirun -np tp) and the pipeline owns the communicator;
     * otherwise `comm` (MPI or threads, borrowed, of size tp; tp 0 takes its size) is used.
     * Every rank calls load and run with the same arguments; rank 0 tokenizes, draws the
     * noise, runs CLIP (FLUX.1) and the VAE and broadcasts what the others need, so the
     * result does not depend on tp. Only rank 0's output holds images; the others get the
     * latents. */
    int tp;
    struct df_comm *comm;
    /* The transformer's weights from this single file (a .safetensors in diffusers', the
     * original (Black Forest Labs', Stability AI's MMDiT) or ComfyUI's layout,
     * f32/bf16/f16/fp8, or a city96 .gguf; see df_flux_load_file, df_sd3_load_file,
     * df_flux2_load_file) instead of the folder's transformer/, whose config.json is still
     * the config. NULL: the folder's. FLUX.1, SD3 and FLUX.2 pipelines. */
    const char *transformer_file;
    /* int8 compute (dtype DF_DTYPE_I8): 1 keeps the diffusion transformer's embedders and
     * output layers in higher precision (the default policy; docs/int8.md), -1 quantizes
     * them too; 0 as DIFFUSE_INT8_KEEP says (none: quantize them). */
    int int8_keep;
    /* int8 compute on the CPU: the group of k values that share a scale as the weights are
     * quantized (32 to 256, a multiple of 4; -1 one group per row, the whole k; 0 as
     * DIFFUSE_INT8_GROUP says, else 128), and the int8 kernel that runs the products
     * ("portable", "avx2", "avx-vnni", "avx512-vnni", "onednn": one this CPU has, else the
     * load fails with DF_E_UNSUPPORTED; NULL as DIFFUSE_INT8_PATH says, else the best by
     * cpuid; borrowed for the load only). docs/int8.md. */
    int int8_group;
    const char *int8_path;
    /* LoRA adapters merged into the weights they update as the components load (a copy of
     * each updated weight; the checkpoint's mapping stays untouched), summed when several
     * update one weight. Borrowed for the call only. A key that updates no weight of the
     * pipeline, or A / B shapes that do not fit it, fail the load with DF_E_FORMAT. */
    const df_lora_spec *loras;
    int n_loras;
    /* FluxPipeline, StableDiffusion3Pipeline, Flux2Pipeline and Flux2KleinPipeline (and
     * their image-input classes): a component's weights from one single file instead of the
     * folder's, whose config.json is still the config (docs/io.md). vae_file:
     * AutoencoderKL / AutoencoderKLFlux2 in diffusers' or the original LDM names
     * (ae.safetensors, FLUX.2's with encoder.quant_conv / decoder.post_quant_conv and bn.*),
     * also under "vae." / "first_stage_model."; text_encoder_file: CLIP-L
     * (clip_l.safetensors), or FLUX.2's Qwen3 / Mistral (qwen_3_4b.safetensors,
     * mistral_3_small_flux2_*.safetensors); text_encoder_2_file: FLUX.1's T5
     * (t5xxl_fp16.safetensors) or SD3's CLIP-G (FLUX.2: DF_E_ARG, it has one encoder);
     * text_encoder_3_file: SD3's T5. Text encoders in transformers' names, also under
     * ComfyUI's "text_encoders.<name>.transformer.". NULL: the folder's. */
    const char *vae_file;
    const char *text_encoder_file;
    const char *text_encoder_2_file;
    const char *text_encoder_3_file;
    /* SD3 (StableDiffusion3Pipeline and its image-input classes) without its T5, as
     * diffusers' from_pretrained(..., text_encoder_3=None, tokenizer_3=None): text_encoder_3
     * and tokenizer_3 are not read (the folder, the shipped configs' tokenizer folders or
     * the checkpoint file may lack them, or hold them), and the T5 part of the prompt
     * embeddings, the negative prompt's too, is zeros of [rows, max_sequence_length,
     * joint_attention_dim], as diffusers 0.42 makes it. A folder whose model_index.json has
     * "text_encoder_3": [null, null] (diffusers saves a pipeline without T5 so) runs the
     * same way without it. DF_E_ARG with text_encoder_3_file, DF_E_UNSUPPORTED for another
     * class. */
    bool no_text_encoder_3;
    /* When df_pipeline_load's `dir` is one checkpoint file (ComfyUI's all-in-one files: a
     * transformer, VAE and text encoders recognised by their names), the diffusers folder
     * that gives model_index.json, the configs and the tokenizers; every component the file
     * holds (and that no *_file above names) is read from it, the rest from this folder. */
    const char *config_dir;
} df_load_opts;

/* Called after every denoising step. */
typedef void (*df_progress_fn)(int step, int steps, double seconds_elapsed, void *user);

/* Called once before the first step (step 0, steps 0) and after every denoising step (after
 * `progress`); returning false stops the run, which then fails with DF_E_CANCELLED having
 * freed everything it made. May be called from the thread that called df_pipeline_run only;
 * it may read a flag another thread sets. */
typedef bool (*df_step_fn)(int step, int steps, double seconds_elapsed, void *user);

/* Called with a preview of the run's first image after every `preview_every`-th denoising
 * step but the last (whose image the run returns): the VAE's decoding, at full size, of the
 * denoised estimate x0 = x - sigma * v at that step (the latents after the step, sigma the
 * scheduler's next sigma, v the guided prediction), as AUTOMATIC1111's "Full" live preview
 * shows. `preview` is borrowed for the call. Costs a VAE decode per preview; called from
 * the thread that called df_pipeline_run, before that step's `progress` and `on_step`. */
typedef void (*df_preview_fn)(int step, int steps, const df_image *preview, void *user);

/* Prints "step i/N  s/step  ETA" to stderr: a bar on a terminal, plain lines otherwise. */
DF_API void df_progress_bar(int step, int steps, double seconds_elapsed, void *user);

typedef struct df_gen_params {
    const char *prompt;          /* one prompt, or: */
    const char *const *prompts;  /* n_prompts prompts (a batch) */
    int n_prompts;
    int num_images;              /* images per prompt; 0 = 1 */
    int height, width;           /* 0: the model's default (1024 for FLUX.1) */
    int steps;                   /* 0: the model's default (schnell 4, dev 28) */
    float guidance;              /* guidance scale (FLUX.1-dev's embedded guidance) */
    bool guidance_set;           /* false: the model's default (dev 3.5) */
    uint64_t seed;
    int max_sequence_length;     /* T5 tokens (FLUX.2: Mistral / Qwen3 tokens); 0: 256 for
                                  * schnell, 512 for dev and FLUX.2 */
    bool vae_tiling;
    /* Optional inputs instead of prompts / noise (for parity checks): row-major f32. */
    const float *prompt_embeds;        /* [B, L, joint_attention_dim] */
    int64_t prompt_embeds_len;         /* L */
    const float *pooled_prompt_embeds; /* [B, pooled_projection_dim] */
    const float *latents;              /* packed initial latents [B, seq, C*4] (FLUX);
                                        * [B, C, H/8, W/8] (SD3); patchified
                                        * [B, 128, H/16, W/16] (FLUX.2) */
    df_progress_fn progress;
    df_step_fn on_step;          /* NULL: the run cannot be stopped (not with tensor
                                  * parallelism: DF_E_UNSUPPORTED) */
    void *progress_user;         /* passed to progress, on_step and preview */
    df_preview_fn preview;       /* NULL: no previews (not with tensor parallelism:
                                  * DF_E_UNSUPPORTED) */
    int preview_every;           /* steps between previews; 0: every step */
    /* Where the denoising loop steps the scheduler: 0 as DIFFUSE_HOST_STEP says (device
     * unless it is 1), 1 on the host (the reference path: latents read back every step),
     * -1 on the device. Tensor parallelism always steps on the host. */
    int host_step;
    /* int8 compute (df_load_opts.dtype DF_DTYPE_I8; docs/int8.md): the attention scores in
     * int8 (1) or f32 (-1) for this run; 0 as DIFFUSE_INT8_ATTENTION says (int8 unless it is
     * 0 or off). No effect in other compute dtypes. */
    int int8_attention;
    /* Classifier-free guidance (SD3: on when guidance > 1; default 7.0, 28 steps). */
    const char *negative_prompt;       /* NULL: "" (diffusers' default) */
    const float *negative_prompt_embeds;        /* [B, L, joint_attention_dim], with the
                                                 * prompt embeddings (same L) */
    const float *negative_pooled_prompt_embeds; /* [B, pooled_projection_dim] */
    /* FluxKontextPipeline's true CFG: above 1, with a negative prompt (or both negative
     * embeddings, given with the prompt embeddings), every step runs the transformer again
     * on the negative text and takes neg + true_cfg_scale * (pos - neg). 0 or 1: off (0
     * means diffusers' default 1.0). */
    float true_cfg_scale;
    int clip_skip;               /* SD3: CLIP layers skipped from the end; 0 = none
                                  * (hidden_states[-2]); the negative prompt ignores it */
    /* Skip-layer guidance (SD3.5): at steps i with slg_start*N < i < slg_stop*N an extra
     * positive-only forward leaves out slg_layers and the guided prediction gains
     * slg_scale * (cond - skip). Off without layers; zero fields take the defaults. */
    const int *slg_layers;
    int n_slg_layers;
    float slg_scale;             /* 0: 2.8 */
    double slg_start;            /* 0: 0.01 (double: i > N * start in Python's double) */
    double slg_stop;             /* 0: 0.2 */
    /* Batches, as diffusers' list arguments. negative_prompts (SD3): one negative prompt per
     * prompt (n_prompts of them, "" allowed), instead of negative_prompt. seeds: a list of
     * generators, one per image (n_seeds = prompts x num_images), each image's noise drawn
     * alone from its own generator as randn_tensor does with a list; without a list (or
     * with n_seeds 1, which diffusers treats as one generator) one generator seeded with
     * `seed` (or seeds[0]) draws the whole batch at once. */
    const char *const *negative_prompts;
    const uint64_t *seeds;
    int n_seeds;
    /* FLUX.2 (text_encoder_out_layers): the text encoder's hidden states stacked into the
     * prompt embeddings, as many as the transformer's joint_attention_dim holds; NULL: the
     * pipeline's own (Flux2Pipeline 10, 20, 30; Flux2KleinPipeline 9, 18, 27). */
    const int *text_encoder_out_layers;
    int n_text_encoder_out_layers;
    /* A step cache on the transformer (step_cache.h), as `pipe.transformer.enable_cache`;
     * NULL or DF_CACHE_NONE: every step computes. */
    const df_cache_config *cache;
    /* Image to image (FluxPipeline and StableDiffusion3Pipeline folders, or their Img2Img
     * classes): the picture the run starts from (borrowed; df_image_load reads PNG / JPEG),
     * resized to height x width as VaeImageProcessor does (PIL's Lanczos), encoded, and
     * noised to the step where the loop starts. strength in (0, 1] is the part of the
     * schedule that runs (the first int(steps - steps * strength) steps are skipped); 0
     * means 0.6, diffusers' default. One generator only. NULL image: text to image.
     * FLUX.2 (Flux2Pipeline, Flux2KleinPipeline): a reference picture to edit instead
     * (as Flux2ImageProcessor takes it: shrunk to 1024x1024 pixels when larger, keeping its
     * aspect ratio, then cropped at the centre to multiples of 16; height / width default to
     * that size; no strength: the run starts from noise). */
    const df_image *image;
    double strength;
    /* FLUX.2: several reference pictures (borrowed), instead of `image`; the output takes
     * the first one's size by default. The other pipelines take one picture. */
    const df_image *const *images;
    int n_images;
    /* Inpainting (FluxPipeline / FluxInpaintPipeline and StableDiffusion3Pipeline /
     * StableDiffusion3InpaintPipeline folders): with `image`, the mask (borrowed, the same
     * size as the image) says where the model paints: white (grey >= 128 after the resize)
     * repaints, black keeps the picture. strength as for image to image (0: 0.6). With
     * `latents` given, they are both the start and the noise the kept part is mixed with,
     * as diffusers does. padding_mask_crop > 0 (diffusers' padding_mask_crop): only the
     * mask's bounding box grown by that many pixels (to the output's aspect ratio) is
     * painted, at height x width, and pasted back over the picture. NULL mask: no
     * inpainting. */
    const df_image *mask;
    int padding_mask_crop;
    /* FluxKontextPipeline (FLUX.1 Kontext): `image` is the picture to edit. The output's
     * height and width keep their aspect ratio and are fitted to max_area pixels (0: the
     * folder's default size squared, 1024 x 1024), as diffusers does; the picture is
     * encoded at the preferred Kontext resolution nearest its aspect ratio, or, with
     * keep_image_size (diffusers' _auto_resize=False), at its own size rounded down to 16. */
    int64_t max_area;
    bool keep_image_size;
} df_gen_params;

typedef struct df_gen_output {
    int count;               /* images */
    int width, height;
    df_image **images;       /* count RGB8 images */
    float *image_f32;        /* [count, H, W, 3] in [0, 1] (VaeImageProcessor "np" output) */
    float *latents;          /* final latents, [count, seq, C] (FLUX and FLUX.2 packed),
                              * [count, C, h, w] (SD3; FLUX.2 klein: the VAE decoder's
                              * input [count, 32, H/8, W/8]) */
    int64_t latents_shape[4];
    int latents_ndim;
    int steps;
    float guidance;
    /* With a step cache: one letter per transformer call, 'C' computed, 'S' skipped (first
     * block cache), 'P' predicted (TaylorSeer); "" without one. */
    char cache_trace[1001];
    /* First-block cache: call i's relative change of the first block's residual, the number
     * compared with the threshold (NaN where none was measured: the first call). */
    double cache_diff[1000];
    /* Weight residency, memory and time of each phase of the run (encode, denoise, decode):
     * the most weight bytes resident during it, what stayed resident after it, the RSS, and
     * its wall-clock seconds (from the run's start or the phase before, work included that
     * was queued before it and finished in it). */
    int n_phases;
    struct {
        const char *phase;
        int64_t peak_resident_weight_bytes;
        int64_t resident_weight_bytes;
        int64_t rss_bytes;
        double seconds;
    } phases[8];
} df_gen_output;

/* What the single checkpoint file `path` (safetensors or GGUF) holds, as lines of text in
 * out: "model: ..." (FLUX.1-dev / -schnell / -fill / -depth, FLUX.2-dev / -klein,
 * SD3-medium, SD3.5-medium / -large, recognised from the keys as diffusers does),
 * "holds: ..." (the transformer, VAE, CLIP-L, CLIP-G, T5 found by their names) and
 * "missing: ..." (what a pipeline needs besides, and how to give it). DF_E_IO /
 * DF_E_FORMAT when the file cannot be read. */
DF_API df_status df_checkpoint_describe(const char *path, char *out, size_t cap);

/* The config sets diffuse ships for released models (model_index.json and every
 * component's config, no weights, no tokenizers; docs/io.md): the i-th set's name
 * ("FLUX.1-schnell"), or NULL past the last. Borrowed, static. */
DF_API const char *df_shipped_config_name(int i);

/* Writes the shipped set `name` into the folder `dir` (created if missing) as a diffusers
 * folder skeleton that tokenizer folders and weights can be added to. DF_E_ARG for a name
 * diffuse does not ship (the message lists those it does), DF_E_IO naming a path that
 * cannot be written. */
DF_API df_status df_shipped_config_write(const char *name, const char *dir);

/* Loads the pipeline in `dir` (the folder with model_index.json). opts may be NULL.
 * DF_E_IO / DF_E_FORMAT for missing or malformed files (naming them), DF_E_UNSUPPORTED for a
 * pipeline or component class diffuse does not implement. Free with df_pipeline_free. */
DF_API df_status df_pipeline_load(const char *dir, const df_load_opts *opts, df_pipeline **out);

/* Writes the loaded pipeline as a diffusers folder `out_dir` (created; files in it are
 * replaced): the weights the models bound, under diffusers' names, in the dtype they have in
 * memory (so a folder written from a single file loads to the same weights), each
 * component's file built in memory; the VAE's encoder half with its decoder; everything
 * else of the config folder (model_index.json, configs, scheduler, tokenizers) copied.
 * DF_E_IO naming a file that cannot be read or written, DF_E_UNSUPPORTED for a pipeline
 * class that cannot be written yet (FLUX.2). */
DF_API df_status df_pipeline_save(df_pipeline *p, const char *out_dir);

/* Runs text to image. On success *out holds the images (free with df_gen_output_free).
 * DF_E_ARG for invalid parameters (sizes not multiples of 16, steps < 1, invalid UTF-8 in a
 * prompt), naming the parameter. */
DF_API df_status df_pipeline_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out);
DF_API void df_gen_output_free(df_gen_output *out);

/* The pipeline's class ("FluxPipeline"), its context, and its default parameters. */
DF_API const char *df_pipeline_class(const df_pipeline *p);
/* The shipped config set a single-file load used ("FLUX.1-schnell"), or NULL when the
 * configs came from a folder. */
DF_API const char *df_pipeline_shipped_config(const df_pipeline *p);
/* Whether an SD3 pipeline runs without T5 (no_text_encoder_3, or text_encoder_3 null in
 * model_index.json): the T5 part of its prompt embeddings is zeros. False for every other
 * class. */
DF_API bool df_pipeline_t5_off(const df_pipeline *p);
DF_API df_ctx *df_pipeline_ctx(df_pipeline *p);
/* The compute dtype the pipeline runs in and, in *why (may be NULL; valid while p lives),
 * the reason: "asked for", or with auto_dtype the measured rates and why they decided. */
DF_API df_dtype df_pipeline_compute_dtype(const df_pipeline *p, const char **why);
DF_API void df_pipeline_defaults(const df_pipeline *p, int *steps, float *guidance,
                                 int *max_sequence_length, int *size);

DF_API void df_pipeline_free(df_pipeline *p);

#ifdef __cplusplus
}
#endif
#endif
