/*
 * Golden kind "model_forward" for SD3Transformer2DModel: `class.from_pretrained(dir)(**args)[0]`
 * compared with out.sample.
 *
 * The arguments are hidden_states (B, C, H, W), encoder_hidden_states, pooled_projections,
 * timestep (each "in.<name>", read as f32 and uploaded) and optionally skip_layers (a JSON
 * list of block indices, or null); return_dict is ignored. The context is made by the
 * caller (kind_model_forward.c) from --device, --threads, --dtype and --mode. --mode
 * compile compiles the whole forward, --mode blocks the repeated blocks (one program per
 * block variant); both run twice (trace, then replay) and compare both results.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int check_sd3_forward(check_case *c, df_ctx *ctx);

/* The whole forward as a module (--mode compile); the instance is the model with the
 * case's skip layers. */
typedef struct sd3_call {
    df_sd3 *m;
    df_sd3_inputs in;
} sd3_call;

static df_status sd3_module_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    const sd3_call *call = self;
    df_sd3_inputs si = call->in;
    si.hidden_states = in[0], si.encoder_hidden_states = in[1];
    si.pooled_projections = in[2], si.timestep = in[3];
    out[0] = df_sd3_forward(ctx, call->m, &si);
    return out[0] ? DF_OK : df_ctx_status(ctx);
}

static const df_module sd3_module = {
    .name = "SD3Transformer2DModel", .n_in = 4, .n_out = 1, .forward = sd3_module_forward};

/* Distinct block variants of the model (dual attention x context_pre_only). */
static int block_variants(const df_sd3 *m)
{
    const df_sd3_cfg *c = df_sd3_config(m);
    bool seen[4] = {false};
    int n = 0;
    for (int64_t i = 0; i < c->num_layers; i++) {
        bool dual = false;
        for (int k = 0; k < c->n_dual_attention_layers; k++)
            dual = dual || c->dual_attention_layers[k] == i;
        int v = (dual ? 2 : 0) + (i == c->num_layers - 1);
        n += !seen[v];
        seen[v] = true;
    }
    return n;
}

int check_sd3_forward(check_case *c, df_ctx *ctx)
{
    df_sd3 *m;
    char file[4096];
    if (df_sd3_load_file(ctx, c->model_dir, check_single_file(c, file, sizeof file), &m) !=
        DF_OK)
        return check_fail(c, "loading %s: %s", c->model_dir, df_error_message());
    df_sd3_inputs in = {0};
    int rc = check_upload_arg(c, ctx, "hidden_states", &in.hidden_states);
    rc = rc ? rc : check_upload_arg(c, ctx, "encoder_hidden_states", &in.encoder_hidden_states);
    rc = rc ? rc : check_upload_arg(c, ctx, "pooled_projections", &in.pooled_projections);
    rc = rc ? rc : check_upload_arg(c, ctx, "timestep", &in.timestep);
    int skip[64];
    if (rc == 0) {
        rc = check_read_indices(c, "skip_layers", skip, 64, &in.n_skip_layers);
        in.skip_layers = in.n_skip_layers ? skip : NULL;
    }
    bool compile = c->mode && strcmp(c->mode, "compile") == 0;
    bool blocks = c->mode && strcmp(c->mode, "blocks") == 0;
    df_compiled *whole = NULL;
    if (rc == 0 && compile &&
        df_compile(&sd3_module, &(df_compile_opts){.fullgraph = true}, &whole) != DF_OK)
        rc = check_fail(c, "compile: %s", df_error_message());
    if (rc == 0 && blocks &&
        df_sd3_compile_repeated_blocks(m, &(df_compile_opts){.fullgraph = true}) != DF_OK)
        rc = check_fail(c, "compile blocks: %s", df_error_message());
    /* The compiled modes run twice: the first call traces, the second replays. */
    for (int call = 0; rc == 0 && call < (compile || blocks ? 2 : 1); call++) {
        df_tensor *out = NULL;
        if (whole) {
            df_tensor *args[4] = {in.hidden_states, in.encoder_hidden_states, in.pooled_projections,
                                  in.timestep};
            sd3_call self = {m, in};
            if (df_compiled_call(ctx, whole, &self, args, &out) != DF_OK)
                out = NULL;
        } else {
            out = df_sd3_forward(ctx, m, &in);
        }
        rc = check_compare_tensor(c, ctx, "sample", out);
    }
    if (rc == 0 && blocks && df_sd3_compiled_programs(m) != block_variants(m))
        rc = check_fail(c, "compiled blocks made %d programs, expected %d (one per block variant)",
                        df_sd3_compiled_programs(m), block_variants(m));
    if (c->stats_json) {
        df_stats st;
        char buf[2048];
        df_ctx_stats(ctx, &st);
        df_stats_to_json(&st, buf, sizeof buf);
        fprintf(c->stats_json, "%s\n", buf);
    }
    df_compiled_free(whole);
    df_sd3_free(m);
    return rc;
}
