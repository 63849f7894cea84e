/*
 * Qwen3 as a text encoder (qwen3.h): Qwen3Config reading and the checkpoint prefixes of
 * Qwen3Model and Qwen3ForCausalLM; decoder_lm.c runs it, with the per-head q/k RMS norm.
 *
 * Choices:
 * - Qwen3Config's defaults: head_dim 128, rope_theta 10000, rms_norm_eps 1e-6,
 *   attention_bias false. use_sliding_window true (no released Qwen3 sets it) is
 *   DF_E_UNSUPPORTED, and so is a layer_types entry (transformers 5.x) other than
 *   "full_attention".
 * - lm_head (absent when tie_word_embeddings) is marked used without being bound.
 */
#include <string.h>

#include <diffuse/qwen3.h>

#include "core/status.h"
#include "models/decoder_lm.h"
#include "models/model_config.h"
#include "models/text_config.h"

static const char *const prefixes[] = {"model.", "", NULL};
static const char *const skipped[] = {"lm_head.", NULL};

static df_status read_config(const df_json *j, df_decoder_lm_config *c, int64_t *window)
{
    *c = (df_decoder_lm_config){0};
    *window = 0;
    static const char *const classes[] = {"Qwen3Model", "Qwen3ForCausalLM"};
    DF_TRY(df_text_config_class(j, classes, 2));
    bool sliding;
    DF_TRY(df_json_get_bool_or(j, "use_sliding_window", false, &sliding));
    if (sliding)
        return df_errorf(
            DF_E_UNSUPPORTED,
            "%s: key 'use_sliding_window' is true; windowed attention is not implemented",
            df_json_source(j));
    DF_TRY(df_decoder_lm_read_common(j, 10000.0, 128, 1e-6, c));
    /* transformers 5.x's layer_types: one attention kind per layer, of which only full
     * attention is implemented. */
    DF_TRY(df_config_names_all(j, "layer_types", "full_attention", -1, NULL));
    c->qk_norm = true;
    return DF_OK;
}

static const df_decoder_lm_class qwen3 = {
    .name = "Qwen3",
    .read_config = read_config,
    .prefixes = prefixes,
    .skipped = skipped,
};

df_status df_qwen3_load(df_ctx *ctx, const char *dir, df_decoder_lm **out)
{
    return df_decoder_lm_load(ctx, dir, &qwen3, out);
}

df_status df_qwen3_load_file(df_ctx *ctx, const char *dir, const char *file, df_decoder_lm **out)
{
    return df_decoder_lm_load_file(ctx, dir, file, &qwen3, out);
}
