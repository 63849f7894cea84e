/*
 * Golden kind "model_forward": `class.from_pretrained(dir)(**args)[0]` compared with
 * out.sample.
 *
 * The model is loaded from the case's own folder with the library's loader, in a context
 * made from --device, --threads, --dtype and --mode. Each argument is either "in.<name>"
 * (read as f32 and uploaded as a tensor), null (the input is absent), or a number (a [1]
 * tensor holding it); return_dict is ignored. A FLUX.1 case may name a "single_file"
 * (safetensors or GGUF, in the original or ComfyUI layout) that holds the weights, "dir"
 * then holding only the config. The transformer classes are the model table's
 * (df_model_class_find), each run by its row of `runners` below: FluxTransformer2DModel and
 * Flux2Transformer2DModel here, SD3Transformer2DModel in kind_sd3.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int check_sd3_forward(check_case *c, df_ctx *ctx); /* kind_sd3.c */

/* The whole transformer as a module, for --mode compile. */
static df_status flux_module_forward(df_ctx *ctx, void *self, df_tensor *const *in,
                                     df_tensor **out)
{
    df_flux_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5], in[6]};
    out[0] = df_flux_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module flux_module = {
    .name = "FluxTransformer2DModel", .n_in = 7, .n_out = 1, .forward = flux_module_forward};

static int run_flux(check_case *c, df_ctx *ctx)
{
    df_flux *m;
    /* "single_file": the weights come from that file (relative to the case folder), read
     * through the name maps, with "dir" giving the config. */
    const char *single = NULL;
    if (df_json_get_string_or(c->root, "single_file", NULL, &single) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    char file[4096];
    if (single)
        snprintf(file, sizeof file, "%s/%s", c->dir, single);
    df_status ls = single ? df_flux_load_file(ctx, c->model_dir, file, &m)
                          : df_flux_load(ctx, c->model_dir, &m);
    if (ls != DF_OK)
        return check_fail(c, "loading %s: %s", single ? file : c->model_dir,
                          df_error_message());
    static const char *const keys[] = {"hidden_states",
                                       "encoder_hidden_states",
                                       "pooled_projections",
                                       "timestep",
                                       "img_ids",
                                       "txt_ids",
                                       "guidance"};
    df_tensor *t[7];
    int rc = 0;
    for (int i = 0; i < 7 && rc == 0; i++)
        rc = check_upload_arg(c, ctx, keys[i], &t[i]);
    bool compile = strcmp(c->mode, "compile") == 0, blocks = strcmp(c->mode, "blocks") == 0;
    df_compiled *whole = NULL;
    if (rc == 0 && compile &&
        df_compile(&flux_module, &(df_compile_opts){.fullgraph = true}, &whole) != DF_OK)
        rc = check_fail(c, "compile: %s", df_error_message());
    if (rc == 0 && blocks &&
        df_flux_compile_repeated_blocks(m, &(df_compile_opts){.fullgraph = true}) != DF_OK)
        rc = check_fail(c, "compile blocks: %s", df_error_message());
    /* The compiled modes run twice: the first call traces, the second replays. */
    for (int call = 0; rc == 0 && call < (compile || blocks ? 2 : 1); call++) {
        df_tensor *out = NULL;
        if (whole) {
            if (df_compiled_call(ctx, whole, m, t, &out) != DF_OK)
                rc = check_fail(c, "compiled call %d: %s", call, df_error_message());
        } else {
            df_flux_inputs in = {t[0], t[1], t[2], t[3], t[4], t[5], t[6]};
            out = df_flux_forward(ctx, m, &in);
        }
        if (rc == 0)
            rc = check_compare_tensor(c, ctx, "sample", out);
    }
    if (rc == 0 && blocks && df_flux_compiled_programs(m) != 2)
        rc = check_fail(c, "compiled blocks made %d programs, expected 2 (one per block class)",
                        df_flux_compiled_programs(m));
    check_write_stats(c, ctx);
    df_compiled_free(whole);
    df_flux_free(m);
    return rc;
}

/* The whole FLUX.2 transformer as a module, for --mode compile. */
static df_status flux2_module_forward(df_ctx *ctx, void *self, df_tensor *const *in,
                                      df_tensor **out)
{
    df_flux2_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5]};
    out[0] = df_flux2_forward(ctx, self, &fi);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module flux2_module = {
    .name = "Flux2Transformer2DModel", .n_in = 6, .n_out = 1, .forward = flux2_module_forward};

static int run_flux2(check_case *c, df_ctx *ctx)
{
    df_flux2 *m;
    char file[4096];
    if (df_flux2_load_file(ctx, c->model_dir, check_single_file(c, file, sizeof file), &m) !=
        DF_OK)
        return check_fail(c, "loading %s: %s", c->model_dir, df_error_message());
    static const char *const keys[] = {"hidden_states", "encoder_hidden_states", "timestep",
                                       "img_ids",       "txt_ids",               "guidance"};
    df_tensor *t[6];
    int rc = 0;
    for (int i = 0; i < 6 && rc == 0; i++)
        rc = check_upload_arg(c, ctx, keys[i], &t[i]);
    bool compile = strcmp(c->mode, "compile") == 0, blocks = strcmp(c->mode, "blocks") == 0;
    df_compiled *whole = NULL;
    if (rc == 0 && compile &&
        df_compile(&flux2_module, &(df_compile_opts){.fullgraph = true}, &whole) != DF_OK)
        rc = check_fail(c, "compile: %s", df_error_message());
    if (rc == 0 && blocks &&
        df_flux2_compile_repeated_blocks(m, &(df_compile_opts){.fullgraph = true}) != DF_OK)
        rc = check_fail(c, "compile blocks: %s", df_error_message());
    /* The compiled modes run twice: the first call traces, the second replays. */
    for (int call = 0; rc == 0 && call < (compile || blocks ? 2 : 1); call++) {
        df_tensor *out = NULL;
        if (whole) {
            if (df_compiled_call(ctx, whole, m, t, &out) != DF_OK)
                rc = check_fail(c, "compiled call %d: %s", call, df_error_message());
        } else {
            df_flux2_inputs in = {t[0], t[1], t[2], t[3], t[4], t[5]};
            out = df_flux2_forward(ctx, m, &in);
        }
        if (rc == 0)
            rc = check_compare_tensor(c, ctx, "sample", out);
    }
    const df_flux2_cfg *cfg = df_flux2_config(m);
    int classes = (cfg->num_layers > 0) + (cfg->num_single_layers > 0);
    if (rc == 0 && blocks && df_flux2_compiled_programs(m) != classes)
        rc = check_fail(c, "compiled blocks made %d programs, expected %d (one per block class)",
                        df_flux2_compiled_programs(m), classes);
    check_write_stats(c, ctx);
    df_compiled_free(whole);
    df_flux2_free(m);
    return rc;
}

/* The runner of each transformer class of the model table (models.h). */
typedef struct forward_runner {
    const char *cls;
    int (*run)(check_case *c, df_ctx *ctx);
} forward_runner;

static const forward_runner runners[] = {
    {"FluxTransformer2DModel", run_flux},
    {"SD3Transformer2DModel", check_sd3_forward}, /* kind_sd3.c */
    {"Flux2Transformer2DModel", run_flux2},
};

bool check_model_forward_runs(const char *cls)
{
    return CHECK_FIND_ROW(runners, cls) != NULL;
}

int check_kind_model_forward(check_case *c)
{
    const df_model_class *row = df_model_class_find(c->cls); /* models.h */
    if (!row || strcmp(row->component, "transformer") != 0)
        return check_fail(c, "model_forward: unknown class %s", c->cls);
    const forward_runner *runner = CHECK_FIND_ROW(runners, c->cls);
    if (!runner)
        return check_fail(c, "model_forward: the transformer class %s has no runner here", c->cls);
    if (!c->model_dir)
        return check_fail(c, "model_forward needs a model folder (case.json \"dir\")");

    df_ctx *ctx;
    df_ctx_opts opts = check_ctx_opts(c);
    if (df_ctx_create(&opts, &ctx) != DF_OK)
        return check_fail(c, "cannot create a context on %s: %s",
                          c->device ? c->device : "the default device", df_error_message());
    int rc = runner->run(c, ctx);
    df_ctx_free(ctx);
    return rc;
}
