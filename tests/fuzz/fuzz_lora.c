/*
 * Fuzz target: LoRA adapter files (models/lora.c) as a pipeline reads them.
 *
 * The input is taken as one adapter file and read for each pipeline class that takes
 * adapters (FLUX.1, FLUX.2 [klein], SD3, and none named): the layout is recognised, the keys
 * are split into modules and checked, the scales worked out. Then, without loading a model,
 * every weight of a small fixed model description (the tiny pipelines' widths: inner 32,
 * FLUX.1's MLP 128, FLUX.2's 96) is asked for: whether an adapter touches it, its update
 * merged into a zeroed copy and in factored form, and at the end which modules updated
 * nothing. Nothing may crash, leak or read out of bounds, whatever the input, and the three
 * views of one weight must agree.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <diffuse/status.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/lora.h"

typedef struct weight {
    const char *component, *name;
    int64_t rows, cols;
} weight;

static const weight flux1[] = {
    {"transformer", "transformer_blocks.0.attn.to_q.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_k.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_v.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.add_q_proj.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.add_v_proj.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_out.0.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_add_out.weight", 32, 32},
    {"transformer", "transformer_blocks.0.ff.net.0.proj.weight", 128, 32},
    {"transformer", "transformer_blocks.0.ff_context.net.2.weight", 32, 128},
    {"transformer", "transformer_blocks.0.norm1.linear.weight", 192, 32},
    {"transformer", "transformer_blocks.1.norm1_context.linear.weight", 192, 32},
    {"transformer", "single_transformer_blocks.0.attn.to_q.weight", 32, 32},
    {"transformer", "single_transformer_blocks.0.attn.to_k.weight", 32, 32},
    {"transformer", "single_transformer_blocks.0.proj_mlp.weight", 128, 32},
    {"transformer", "single_transformer_blocks.0.proj_out.weight", 32, 160},
    {"transformer", "single_transformer_blocks.1.norm.linear.weight", 96, 32},
    {"transformer", "x_embedder.weight", 32, 64},
    {"transformer", "context_embedder.weight", 32, 48},
    {"transformer", "norm_out.linear.weight", 64, 32},
    {"transformer", "proj_out.weight", 64, 32},
    {"text_encoder", "text_model.encoder.layers.0.self_attn.q_proj.weight", 32, 32},
    {"text_encoder", "text_model.encoder.layers.0.mlp.fc1.weight", 64, 32},
    {"text_encoder", "text_model.encoder.layers.1.mlp.fc2.weight", 32, 64},
    {"text_encoder_2", "encoder.block.0.layer.0.SelfAttention.q.weight", 48, 48},
    {NULL, NULL, 0, 0},
};

static const weight flux2[] = {
    {"transformer", "transformer_blocks.0.attn.to_q.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_v.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.add_k_proj.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_out.0.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.to_add_out.weight", 32, 32},
    {"transformer", "transformer_blocks.0.ff.linear_in.weight", 192, 32},
    {"transformer", "transformer_blocks.0.ff.linear_out.weight", 32, 96},
    {"transformer", "transformer_blocks.0.ff_context.linear_in.weight", 192, 32},
    {"transformer", "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", 288, 32},
    {"transformer", "single_transformer_blocks.1.attn.to_out.weight", 32, 128},
    {"transformer", "x_embedder.weight", 32, 128},
    {"transformer", "context_embedder.weight", 32, 48},
    {"transformer", "time_guidance_embed.timestep_embedder.linear_1.weight", 32, 256},
    {"transformer", "double_stream_modulation_img.linear.weight", 192, 32},
    {"transformer", "single_stream_modulation.linear.weight", 96, 32},
    {"transformer", "norm_out.linear.weight", 64, 32},
    {"transformer", "proj_out.weight", 128, 32},
    {NULL, NULL, 0, 0},
};

static const weight sd3[] = {
    {"transformer", "transformer_blocks.0.attn.to_q.weight", 32, 32},
    {"transformer", "transformer_blocks.0.attn.add_k_proj.weight", 32, 32},
    {"transformer", "transformer_blocks.0.ff.net.2.weight", 32, 128},
    {"text_encoder", "text_model.encoder.layers.0.mlp.fc1.weight", 64, 32},
    {"text_encoder_2", "text_model.encoder.layers.0.self_attn.v_proj.weight", 32, 32},
    {NULL, NULL, 0, 0},
};

/* Asks the set for every weight of `model`; aborts when its answers disagree. */
static void exercise(df_lora_set *set, const weight *model)
{
    for (const weight *w = model; w->name; w++) {
        bool touched = df_lora_touches(set, w->component, w->name);
        float *down = NULL, *up = NULL;
        int64_t r = -1;
        df_status s = df_lora_factors(set, w->component, w->name, w->rows, w->cols, &down, &up, &r);
        if (s == DF_OK && (touched != (r > 0) || (r > 0) != (down != NULL)))
            abort(); /* touches and factors must agree */
        df_free(down);
        df_free(up);
        float *copy = df_calloc((size_t)(w->rows * w->cols), sizeof *copy);
        if (!copy)
            continue;
        df_status m = df_lora_merge(set, w->component, w->name, copy, w->rows, w->cols, 1);
        if ((m == DF_OK) != (s == DF_OK))
            abort(); /* the same adapters fit or do not fit, merged or not */
        df_free(copy);
    }
    df_lora_check_used(set, "transformer");
    df_lora_check_used(set, NULL);
}

/* The reader's warning lines (modules diffusers drops) go here, not to the fuzzer's log. */
static void discard(int level, const char *line, void *user)
{
    (void)level, (void)line, (void)user;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_set_log_fn(discard, NULL);
    static const struct {
        const char *pipeline;
        const weight *model;
    } runs[] = {
        {"FluxPipeline", flux1},
        {"Flux2KleinPipeline", flux2},
        {"StableDiffusion3Pipeline", sd3},
        {NULL, flux1},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        df_lora_set *set;
        if (df_lora_set_load_memory(data, size, "fuzz.safetensors", 0.5f, runs[i].pipeline, &set) !=
            DF_OK)
            continue;
        exercise(set, runs[i].model);
        df_lora_set_free(set);
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
