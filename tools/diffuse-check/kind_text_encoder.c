/*
 * Golden kind "text_encoder": transformers' text encoders from the case's component folder.
 *
 * CLIPTextModel / CLIPTextModelWithProjection: args.input_ids [B, S] through df_clip_encode,
 * outputs last_hidden_state, pooler_output, text_embeds and hidden_states_m2
 * (= hidden_states[-2]). T5EncoderModel: args.input_ids through df_t5_encode without a mask
 * (last_hidden_state) and with args.attention_mask (last_hidden_state_masked).
 * MistralModel / Mistral3ForConditionalGeneration / Qwen3Model / Qwen3ForCausalLM:
 * args.input_ids and args.attention_mask through df_decoder_lm_forward, outputs
 * last_hidden_state and prompt_embeds (the hidden states of args.layers stacked per token,
 * df_decoder_lm_stacked). Each output the case lists is compared; an output name this
 * handler does not know fails the case.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* The outputs one run produced, by the case's output names. */
typedef struct te_outputs {
    const char *names[8];
    df_tensor *tensors[8];
    int n;
} te_outputs;

static void put(te_outputs *o, const char *name, df_tensor *t)
{
    if (t && o->n < 8) {
        o->names[o->n] = name;
        o->tensors[o->n++] = t;
    }
}

static df_tensor *find(const te_outputs *o, const char *name)
{
    for (int i = 0; i < o->n; i++)
        if (strcmp(o->names[i], name) == 0)
            return o->tensors[i];
    return NULL;
}

/* Reads args.<key> ("in.x", an integer tensor) into a new tensor; *host keeps the values. */
static int int_arg(check_case *c, df_ctx *ctx, const char *key, df_tensor **t, int64_t **host)
{
    const char *name;
    int64_t shape[8];
    int ndim;
    *t = NULL;
    *host = NULL;
    if (df_json_get_string(c->args, key, &name) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    if (check_read_i64(c, name, host, shape, &ndim) != DF_OK)
        return check_fail(c, "%s: %s", name, df_error_message());
    *t = df_tensor_from_host(ctx, DF_DTYPE_I64, shape, ndim, *host);
    if (!*t)
        return check_fail(c, "%s: %s", name, df_error_message());
    return 0;
}

static int compare_outputs(check_case *c, df_ctx *ctx, const te_outputs *o)
{
    const df_json *outputs;
    if (df_json_get_object(c->root, "outputs", &outputs) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    int failures = 0;
    for (int64_t i = 0; i < df_json_object_size(outputs); i++) {
        const char *name;
        df_json_object_at(outputs, i, &name);
        df_tensor *t = find(o, name);
        if (!t) {
            failures += check_fail(c, "output '%s' is not produced by %s", name, c->cls);
            continue;
        }
        int64_t n = df_tensor_numel(t);
        float *got = malloc((size_t)n * sizeof *got);
        if (!got || df_tensor_read(ctx, t, DF_DTYPE_F32, got, (size_t)n * sizeof *got) != DF_OK)
            failures +=
                check_fail(c, "output '%s': %s", name, got ? df_error_message() : "out of memory");
        else
            failures += check_compare_f32(c, name, got, n);
        free(got);
    }
    return failures ? 1 : 0;
}

static int run_clip(check_case *c, df_ctx *ctx, te_outputs *o)
{
    df_clip *m;
    char file[4096];
    if (df_clip_load_file(ctx, c->model_dir, check_single_file(c, file, sizeof file), &m) !=
        DF_OK)
        return check_fail(c, "%s", df_error_message());
    bool want_proj = strcmp(c->cls, "CLIPTextModelWithProjection") == 0;
    if (df_clip_get_config(m)->with_projection != want_proj) {
        df_clip_free(m);
        return check_fail(c, "%s: the checkpoint %s text_projection.weight, unlike a %s",
                          c->model_dir, want_proj ? "lacks" : "has", c->cls);
    }
    df_tensor *ids;
    int64_t *host;
    int rc = int_arg(c, ctx, "input_ids", &ids, &host);
    df_clip_output out;
    if (rc == 0 &&
        df_clip_encode(ctx, m, ids, &(df_clip_request){.hidden_states = {-2}, .n_hidden_states = 1},
                       &out) != DF_OK)
        rc = check_fail(c, "%s", df_error_message());
    if (rc == 0) {
        put(o, "last_hidden_state", out.last_hidden_state);
        put(o, "pooler_output", out.pooler_output);
        put(o, "text_embeds", out.text_embeds);
        put(o, "hidden_states_m2", out.hidden_states[0]);
        rc = compare_outputs(c, ctx, o);
    }
    free(host);
    df_clip_free(m);
    return rc;
}

static int run_t5(check_case *c, df_ctx *ctx, te_outputs *o)
{
    df_t5 *m;
    char file[4096];
    if (df_t5_load_file(ctx, c->model_dir, check_single_file(c, file, sizeof file), &m) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    df_tensor *ids, *mask = NULL, *plain, *masked = NULL;
    int64_t *host, *mask_host = NULL;
    int rc = int_arg(c, ctx, "input_ids", &ids, &host);
    if (rc == 0 && df_t5_encode(ctx, m, ids, NULL, &plain) != DF_OK)
        rc = check_fail(c, "%s", df_error_message());
    if (rc == 0 && !df_json_is_null(df_json_get(c->args, "attention_mask"))) {
        rc = int_arg(c, ctx, "attention_mask", &mask, &mask_host);
        if (rc == 0 && df_t5_encode(ctx, m, ids, mask, &masked) != DF_OK)
            rc = check_fail(c, "%s", df_error_message());
    }
    if (rc == 0) {
        put(o, "last_hidden_state", plain);
        put(o, "last_hidden_state_masked", masked);
        rc = compare_outputs(c, ctx, o);
    }
    free(host);
    free(mask_host);
    df_t5_free(m);
    return rc;
}

static int run_decoder_lm(check_case *c, df_ctx *ctx, te_outputs *o)
{
    df_decoder_lm *m;
    char file[4096];
    const char *single = check_single_file(c, file, sizeof file);
    df_status s = strncmp(c->cls, "Qwen3", 5) == 0
                      ? df_qwen3_load_file(ctx, c->model_dir, single, &m)
                      : df_mistral_load_file(ctx, c->model_dir, single, &m);
    if (s != DF_OK)
        return check_fail(c, "%s", df_error_message());
    int64_t l64[DF_DECODER_LM_MAX_OUTPUTS], n_layers = 0;
    if (!df_json_is_null(df_json_get(c->args, "layers")) &&
        df_json_get_int_array(c->args, "layers", l64, DF_DECODER_LM_MAX_OUTPUTS, &n_layers) !=
            DF_OK) {
        df_decoder_lm_free(m);
        return check_fail(c, "%s", df_error_message());
    }
    int layers[DF_DECODER_LM_MAX_OUTPUTS];
    for (int64_t i = 0; i < n_layers; i++)
        layers[i] = (int)l64[i];
    df_tensor *ids, *mask = NULL;
    int64_t *host, *mask_host = NULL;
    int rc = int_arg(c, ctx, "input_ids", &ids, &host);
    if (rc == 0 && !df_json_is_null(df_json_get(c->args, "attention_mask")))
        rc = int_arg(c, ctx, "attention_mask", &mask, &mask_host);
    df_decoder_lm_output out = {0};
    df_tensor *stacked = NULL;
    /* last_hidden_state when the case lists it (a pruned file's case does not) */
    bool last = !df_json_is_null(df_json_get(df_json_get(c->root, "outputs"), "last_hidden_state"));
    if (rc == 0 && last &&
        df_decoder_lm_forward(ctx, m, ids, mask,
                              &(df_decoder_lm_request){.last_hidden_state = true}, &out) != DF_OK)
        rc = check_fail(c, "%s", df_error_message());
    if (rc == 0 && n_layers > 0 &&
        df_decoder_lm_stacked(ctx, m, ids, mask, layers, (int)n_layers, &stacked) != DF_OK)
        rc = check_fail(c, "%s", df_error_message());
    if (rc == 0) {
        put(o, "last_hidden_state", out.last_hidden_state);
        put(o, "prompt_embeds", stacked);
        rc = compare_outputs(c, ctx, o);
    }
    free(host);
    free(mask_host);
    df_decoder_lm_free(m);
    return rc;
}

/* The runner of each text encoder class of the model table (models.h). */
typedef struct te_runner {
    const char *cls;
    int (*run)(check_case *c, df_ctx *ctx, te_outputs *o);
} te_runner;

static const te_runner runners[] = {
    {"CLIPTextModel", run_clip},
    {"CLIPTextModelWithProjection", run_clip},
    {"T5EncoderModel", run_t5},
    {"MistralModel", run_decoder_lm},
    {"MistralForCausalLM", run_decoder_lm},
    {"Mistral3ForConditionalGeneration", run_decoder_lm},
    {"Qwen3Model", run_decoder_lm},
    {"Qwen3ForCausalLM", run_decoder_lm},
};

bool check_text_encoder_runs(const char *cls)
{
    return CHECK_FIND_ROW(runners, cls) != NULL;
}

int check_kind_text_encoder(check_case *c)
{
    const te_runner *runner = CHECK_FIND_ROW(runners, c->cls);
    if (!runner)
        return check_fail(c, "class %s is not implemented yet", c->cls);
    if (!c->model_dir)
        return check_fail(c, "case.json \"dir\" is null; a text encoder needs its folder");

    df_ctx *ctx;
    df_ctx_opts opts = check_ctx_opts(c);
    if (df_ctx_create(&opts, &ctx) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    te_outputs o = {0};
    df_scope mark = df_scope_begin(ctx);
    int rc = runner->run(c, ctx, &o);
    df_scope_end(ctx, mark, NULL);
    check_write_stats(c, ctx);
    df_ctx_free(ctx);
    return rc;
}
