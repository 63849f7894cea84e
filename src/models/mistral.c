/*
 * Mistral as a text encoder (mistral.h): MistralConfig / Mistral3Config reading and where
 * the language model's tensors live in each checkpoint layout; decoder_lm.c runs it.
 *
 * Choices:
 * - A Mistral3Config is recognised by its text_config object, which is read as a
 *   MistralConfig (model_type "mistral"); its vision_config is not read.
 * - Mistral3 checkpoints hold the language model under `model.language_model.` (saved by
 *   transformers >= 4.52) or `language_model.model.` (before); MistralForCausalLM under
 *   `model.`, MistralModel at the root. The vision tower, the multimodal projector and
 *   lm_head are marked used without being bound: their bytes are never read.
 * - MistralConfig's defaults: rope_theta 10000, rms_norm_eps 1e-6, head_dim hidden_size /
 *   num_attention_heads. sliding_window (null in Mistral Small 3.x; MistralConfig's default
 *   is 4096) is kept: a longer input is DF_E_UNSUPPORTED rather than run unwindowed.
 */
#include <string.h>

#include <diffuse/mistral.h>

#include "core/status.h"
#include "models/decoder_lm.h"
#include "models/text_config.h"

static const char *const prefixes[] = {"model.language_model.", "language_model.model.", "model.",
                                       "", NULL};

/* Vision tower, projector and lm_head in both Mistral3 layouts (and MistralForCausalLM). */
static const char *const skipped[] = {"model.vision_tower.",
                                      "model.multi_modal_projector.",
                                      "vision_tower.",
                                      "multi_modal_projector.",
                                      "lm_head.",
                                      "language_model.lm_head.",
                                      NULL};

static df_status read_config(const df_json *root, df_decoder_lm_config *c, int64_t *window)
{
    *c = (df_decoder_lm_config){0};
    *window = 0;
    static const char *const classes[] = {"MistralModel", "MistralForCausalLM",
                                          "Mistral3ForConditionalGeneration"};
    DF_TRY(df_text_config_class(root, classes, 3));
    const df_json *text = df_json_get(root, "text_config");
    const df_json *j = df_json_is_null(text) ? root : text;
    DF_TRY(df_decoder_lm_read_common(j, 10000.0, 0, 1e-6, c));
    const df_json *w = df_json_get(j, "sliding_window");
    if (!df_json_is_null(w))
        DF_TRY(df_json_to_int(w, window));
    if (*window < 0)
        *window = 0;
    return DF_OK;
}

static const df_decoder_lm_class mistral = {
    .name = "Mistral",
    .read_config = read_config,
    .prefixes = prefixes,
    .skipped = skipped,
};

df_status df_mistral_load(df_ctx *ctx, const char *dir, df_decoder_lm **out)
{
    return df_decoder_lm_load(ctx, dir, &mistral, out);
}

df_status df_mistral_load_file(df_ctx *ctx, const char *dir, const char *file, df_decoder_lm **out)
{
    return df_decoder_lm_load_file(ctx, dir, file, &mistral, out);
}

bool df_mistral_skips_tensor(const char *name)
{
    for (const char *const *p = skipped; *p; p++)
        if (strncmp(name, *p, strlen(*p)) == 0)
            return true;
    return false;
}
