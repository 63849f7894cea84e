/*
 * Golden kind "model_forward" for SD3Transformer2DModel: `class.from_pretrained(dir)(**args)[0]`
 * compared with out.sample.
 *
 * The arguments are hidden_states (B, C, H, W), encoder_hidden_states, pooled_projections,
 * timestep (each "in.<name>", read as f32 and uploaded) and optionally skip_layers (a JSON
 * list of block indices, or null); return_dict is ignored. The context is made by the
 * caller (kind_model_forward.c) from --device, --threads, --dtype and --mode.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

int check_sd3_forward(check_case *c, df_ctx *ctx);

static int upload(check_case *c, df_ctx *ctx, const char *key, df_tensor **out)
{
    *out = NULL;
    const df_json *a = df_json_get(c->args, key);
    if (df_json_is_null(a))
        return 0;
    const char *name = df_json_string(a);
    if (!name)
        return check_fail(c, "args.%s: expected \"in.<tensor>\"", key);
    float *data;
    int64_t shape[8];
    int ndim;
    if (check_read_f32(c, name, &data, shape, &ndim) != DF_OK)
        return check_fail(c, "args.%s: cannot read tensor '%s': %s", key, name, df_error_message());
    *out = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, ndim, data);
    free(data);
    if (!*out)
        return check_fail(c, "args.%s: cannot upload '%s': %s", key, name, df_error_message());
    return 0;
}

int check_sd3_forward(check_case *c, df_ctx *ctx)
{
    df_sd3 *m;
    if (df_sd3_load(ctx, c->model_dir, &m) != DF_OK)
        return check_fail(c, "loading %s: %s", c->model_dir, df_error_message());
    df_sd3_inputs in = {0};
    int rc = upload(c, ctx, "hidden_states", &in.hidden_states);
    rc = rc ? rc : upload(c, ctx, "encoder_hidden_states", &in.encoder_hidden_states);
    rc = rc ? rc : upload(c, ctx, "pooled_projections", &in.pooled_projections);
    rc = rc ? rc : upload(c, ctx, "timestep", &in.timestep);
    int skip[64];
    const df_json *sl = df_json_get(c->args, "skip_layers");
    if (rc == 0 && !df_json_is_null(sl)) {
        int64_t n = df_json_array_size(sl);
        if (df_json_type_of(sl) != DF_JSON_ARRAY || n > 64)
            rc = check_fail(c, "args.skip_layers: expected a list of at most 64 block indices");
        for (int64_t i = 0; rc == 0 && i < n; i++)
            skip[i] = (int)df_json_number(df_json_array_get(sl, i));
        in.skip_layers = skip;
        in.n_skip_layers = (int)n;
    }
    if (rc == 0) {
        df_tensor *out = df_sd3_forward(ctx, m, &in);
        int64_t n = out ? df_tensor_numel(out) : 0;
        float *got = out ? malloc((size_t)n * sizeof *got + 1) : NULL;
        if (!out) {
            df_sync(ctx); /* makes the context's error the thread's message */
            rc = check_fail(c, "forward failed: %s", df_error_message());
        } else if (!got) {
            rc = check_fail(c, "out of memory");
        } else if (df_tensor_read(ctx, out, DF_DTYPE_F32, got, (size_t)n * sizeof *got) != DF_OK) {
            rc = check_fail(c, "forward failed: %s", df_error_message());
        } else {
            rc = check_compare_f32(c, "sample", got, n);
        }
        free(got);
        if (c->stats_json) {
            df_stats st;
            char buf[2048];
            df_ctx_stats(ctx, &st);
            df_stats_to_json(&st, buf, sizeof buf);
            fprintf(c->stats_json, "%s\n", buf);
        }
    }
    df_sd3_free(m);
    return rc;
}
