/*
 * The table of the model classes diffuse implements (models.h), with each class's check.
 *
 * One row per class: its name, the pipeline folder it fills, the check `diffuse inspect`
 * runs, the weights int8 compute keeps in f32 and the make-tiny architectures that write
 * it. Every list of classes reads this table, so adding a class is its model file and a
 * row here (with a CHECKER line when it is a model); test_model_classes says what a row
 * lacks.
 *
 * A check validates a component folder (models, the scheduler, tokenizers) by loading it
 * exactly as a pipeline would (config keys, every weight bound by name with its expected
 * shape and dtype; a tensor the config does not call for is a warning) in a context of its
 * own, then freeing it. Loading maps the file and binds tensors without reading their data,
 * so a check costs little more than reading the header.
 */
#include <string.h>

#include <diffuse/clip.h>
#include <diffuse/flux.h>
#include <diffuse/flux2.h>
#include <diffuse/layout.h>
#include <diffuse/mistral.h>
#include <diffuse/models.h>
#include <diffuse/qwen3.h>
#include <diffuse/scheduler.h>
#include <diffuse/sd3.h>
#include <diffuse/tokenizer.h>
#include <diffuse/t5.h>
#include <diffuse/vae.h>

#include "core/status.h"

#define CHECKER(name, type, load, free_fn)                                                         \
    static df_status name(const char *dir, const df_json *config, const df_weights *weights)       \
    {                                                                                              \
        (void)config;                                                                              \
        (void)weights;                                                                             \
        df_ctx *ctx;                                                                               \
        DF_TRY(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx));                                 \
        type *m = NULL;                                                                            \
        df_status s = load(ctx, dir, &m);                                                          \
        free_fn(m);                                                                                \
        df_ctx_free(ctx);                                                                          \
        return s;                                                                                  \
    }

CHECKER(check_flux, df_flux, df_flux_load, df_flux_free)
CHECKER(check_sd3, df_sd3, df_sd3_load, df_sd3_free)
CHECKER(check_clip, df_clip, df_clip_load, df_clip_free)
CHECKER(check_t5, df_t5, df_t5_load, df_t5_free)
CHECKER(check_flux2, df_flux2, df_flux2_load, df_flux2_free)
CHECKER(check_mistral, df_decoder_lm, df_mistral_load, df_decoder_lm_free)
CHECKER(check_qwen3, df_decoder_lm, df_qwen3_load, df_decoder_lm_free)

/* df_vae_load reads both VAE classes: the config's class must be the one the index names. */
static df_status check_vae_class(const char *dir, bool flux2)
{
    df_ctx *ctx;
    DF_TRY(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx));
    df_vae *m = NULL;
    df_status s = df_vae_load(ctx, dir, &m);
    if (s == DF_OK && df_vae_config(m)->flux2 != flux2)
        s = df_errorf(DF_E_FORMAT,
                      "%s/config.json: the folder holds an %s, not the %s the "
                      "pipeline names",
                      dir, flux2 ? "AutoencoderKL" : "AutoencoderKLFlux2",
                      flux2 ? "AutoencoderKLFlux2" : "AutoencoderKL");
    df_vae_free(m);
    df_ctx_free(ctx);
    return s;
}

static df_status check_vae(const char *dir, const df_json *config, const df_weights *weights)
{
    (void)config;
    (void)weights;
    return check_vae_class(dir, false);
}

static df_status check_vae_flux2(const char *dir, const df_json *config, const df_weights *weights)
{
    (void)config;
    (void)weights;
    return check_vae_class(dir, true);
}

/* Folders without weights: the scheduler and tokenizers load as the pipeline loads them,
 * without a context. */
#define FOLDER_CHECKER(name, type, load, free_fn)                                                  \
    static df_status name(const char *dir, const df_json *config, const df_weights *weights)       \
    {                                                                                              \
        (void)config;                                                                              \
        (void)weights;                                                                             \
        type *x;                                                                                   \
        DF_TRY(load(dir, &x));                                                                     \
        free_fn(x);                                                                                \
        return DF_OK;                                                                              \
    }

FOLDER_CHECKER(check_scheduler, df_scheduler, df_scheduler_load, df_scheduler_free)
FOLDER_CHECKER(check_tokenizer, df_tokenizer, df_tokenizer_load, df_tokenizer_free)

/* The transformers' embedders and output layers: a few percent of the weights and the
 * largest share of int8's error (docs/int8.md). */
static const char *const flux_int8_keep[] = {"x_embedder.", "context_embedder.", "time_text_embed.",
                                             "norm_out.",   "proj_out.",         NULL};
static const char *const sd3_int8_keep[] = {"context_embedder.", "time_text_embed.", "norm_out.",
                                            "proj_out.", NULL};
static const char *const flux2_int8_keep[] = {
    "x_embedder.", "context_embedder.", "time_guidance_embed.", "norm_out.", "proj_out.", NULL};

static const df_model_class classes[] = {
    /* name, component, check, int8_keep, make-tiny architectures */
    {"FluxTransformer2DModel", "transformer", check_flux, flux_int8_keep, {"flux"}},
    {"SD3Transformer2DModel", "transformer", check_sd3, sd3_int8_keep, {"sd3"}},
    {"Flux2Transformer2DModel",
     "transformer",
     check_flux2,
     flux2_int8_keep,
     {"flux2", "flux2-klein"}},
    {"CLIPTextModel", "text_encoder", check_clip, NULL, {NULL}},
    {"CLIPTextModelWithProjection", "text_encoder", check_clip, NULL, {NULL}},
    {"T5EncoderModel", "text_encoder", check_t5, NULL, {NULL}},
    {"AutoencoderKL", "vae", check_vae, NULL, {NULL}},
    {"AutoencoderKLFlux2", "vae", check_vae_flux2, NULL, {NULL}},
    {"MistralModel", "text_encoder", check_mistral, NULL, {NULL}},
    {"MistralForCausalLM", "text_encoder", check_mistral, NULL, {NULL}},
    {"Mistral3ForConditionalGeneration",
     "text_encoder",
     check_mistral,
     NULL,
     {"mistral3-text-encoder"}},
    {"Qwen3Model", "text_encoder", check_qwen3, NULL, {NULL}},
    {"Qwen3ForCausalLM", "text_encoder", check_qwen3, NULL, {"qwen3-text-encoder"}},
    {"FlowMatchEulerDiscreteScheduler", "scheduler", check_scheduler, NULL, {NULL}},
    {"CLIPTokenizer", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"CLIPTokenizerFast", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"T5Tokenizer", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"T5TokenizerFast", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"PixtralProcessor", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"LlamaTokenizer", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"LlamaTokenizerFast", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"Qwen2Tokenizer", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"Qwen2TokenizerFast", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"PreTrainedTokenizerFast", "tokenizer", check_tokenizer, NULL, {NULL}},
    {"TokenizersBackend", "tokenizer", check_tokenizer, NULL, {NULL}},
};

const df_model_class *df_model_classes(int *n)
{
    if (n)
        *n = (int)(sizeof classes / sizeof classes[0]);
    return classes;
}

const df_model_class *df_model_class_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof classes / sizeof classes[0]; i++)
        if (strcmp(classes[i].name, name) == 0)
            return &classes[i];
    return NULL;
}

df_status df_models_register_checks(void)
{
    for (size_t i = 0; i < sizeof classes / sizeof classes[0]; i++)
        DF_TRY(df_model_check_register(classes[i].name, classes[i].check));
    return DF_OK;
}
