/*
 * Model checks for `diffuse inspect`: a component folder of a class diffuse implements
 * (models, the scheduler, tokenizers) is validated by loading it exactly as a pipeline
 * would (config keys, every weight bound by name with its expected shape and dtype; a
 * tensor the config does not call for is a warning) in a context of its own, then freed.
 * Loading maps the file and binds tensors without reading their data, so a check costs
 * little more than reading the header.
 */
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

#define CHECKER(name, type, load, free_fn)                                                 \
    static df_status name(const char *dir, const df_json *config, const df_weights *weights) \
    {                                                                                      \
        (void)config;                                                                      \
        (void)weights;                                                                     \
        df_ctx *ctx;                                                                       \
        DF_TRY(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx));                         \
        type *m = NULL;                                                                    \
        df_status s = load(ctx, dir, &m);                                                  \
        free_fn(m);                                                                        \
        df_ctx_free(ctx);                                                                  \
        return s;                                                                          \
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
        s = df_errorf(DF_E_FORMAT, "%s/config.json: the folder holds an %s, not the %s the "
                      "pipeline names", dir, flux2 ? "AutoencoderKL" : "AutoencoderKLFlux2",
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

/* Folders without weights: the scheduler and tokenizers load as the pipeline loads them. */
static df_status check_scheduler(const char *dir, const df_json *config, const df_weights *w)
{
    (void)config;
    (void)w;
    df_scheduler *s;
    DF_TRY(df_scheduler_load(dir, &s));
    df_scheduler_free(s);
    return DF_OK;
}

static df_status check_tokenizer(const char *dir, const df_json *config, const df_weights *w)
{
    (void)config;
    (void)w;
    df_tokenizer *t;
    DF_TRY(df_tokenizer_load(dir, &t));
    df_tokenizer_free(t);
    return DF_OK;
}

df_status df_models_register_checks(void)
{
    static const struct {
        const char *cls;
        df_model_check_fn fn;
    } table[] = {
        {"FluxTransformer2DModel", check_flux},
        {"SD3Transformer2DModel", check_sd3},
        {"Flux2Transformer2DModel", check_flux2},
        {"CLIPTextModel", check_clip},
        {"CLIPTextModelWithProjection", check_clip},
        {"T5EncoderModel", check_t5},
        {"AutoencoderKL", check_vae},
        {"AutoencoderKLFlux2", check_vae_flux2},
        {"MistralModel", check_mistral},
        {"MistralForCausalLM", check_mistral},
        {"Mistral3ForConditionalGeneration", check_mistral},
        {"Qwen3Model", check_qwen3},
        {"Qwen3ForCausalLM", check_qwen3},
        {"FlowMatchEulerDiscreteScheduler", check_scheduler},
        {"CLIPTokenizer", check_tokenizer},
        {"CLIPTokenizerFast", check_tokenizer},
        {"T5Tokenizer", check_tokenizer},
        {"T5TokenizerFast", check_tokenizer},
        {"PixtralProcessor", check_tokenizer},
        {"LlamaTokenizer", check_tokenizer},
        {"LlamaTokenizerFast", check_tokenizer},
        {"Qwen2Tokenizer", check_tokenizer},
        {"Qwen2TokenizerFast", check_tokenizer},
        {"PreTrainedTokenizerFast", check_tokenizer},
        {"TokenizersBackend", check_tokenizer},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        DF_TRY(df_model_check_register(table[i].cls, table[i].fn));
    return DF_OK;
}
