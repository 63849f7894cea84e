/*
 * Conditioning embeddings and adaptive layer norms shared by the diffusion transformers.
 *
 * Each function mirrors one diffusers module (named in embeddings.h) with the op API only,
 * so it runs unchanged in every execution mode. Choices:
 * - Modulation vectors are views (chunks) of one linear output, unsqueezed to [B, 1, D];
 *   the elementwise ops broadcast them over the sequence without copies.
 * - The timestep scale (FLUX multiplies sigma by 1000) is an attribute of the sinusoid op,
 *   applied in f32 before the frequencies, as diffusers computes `timesteps.float() * freq`
 *   on the already scaled value: for an f32 t, float(t) * 1000.0f rounds once, exactly as
 *   float(double(t) * 1000) does.
 */
#include "models/embeddings.h"

#include <stdio.h>

#include "core/status.h"

df_status df_emb_mlp_bind(df_weight_set *ws, df_emb_mlp *out, int64_t in, int64_t hidden,
                          int64_t out_f, bool bias, const char *prefix)
{
    DF_TRY(df_ws_linear(ws, &out->linear_1, hidden, in, bias, "%s.linear_1", prefix));
    DF_TRY(df_ws_linear(ws, &out->linear_2, out_f, hidden, bias, "%s.linear_2", prefix));
    return DF_OK;
}

df_tensor *df_emb_mlp_forward(df_ctx *ctx, const df_emb_mlp *mlp, df_tensor *x)
{
    df_tensor *h = df_silu(ctx, df_linear(ctx, x, &mlp->linear_1)); /* [..., hidden] */
    return df_linear(ctx, h, &mlp->linear_2);                       /* [..., out]    */
}

df_tensor *df_emb_timestep(df_ctx *ctx, const df_emb_mlp *mlp, df_tensor *t, int dim, float scale)
{
    /* Timesteps(dim, flip_sin_to_cos=True, downscale_freq_shift=0): [cos, sin] */
    df_tensor *proj =
        df_timestep_embedding(ctx, t, dim, true, 0.0f, scale, 10000.0f); /* [B, dim] */
    return df_emb_mlp_forward(ctx, mlp, proj);                           /* [B, out] */
}

void df_emb_modulation(df_ctx *ctx, const df_linear_weights *linear, df_tensor *cond, int n,
                       df_tensor **out)
{
    df_tensor *emb = df_linear(ctx, df_silu(ctx, cond), linear); /* [B, n*D] */
    for (int i = 0; i < n; i++)
        out[i] = df_unsqueeze(ctx, df_chunk(ctx, emb, n, 1, i), 1); /* [B, 1, D] */
    if (df_ctx_status(ctx) != DF_OK)
        for (int i = 0; i < n; i++)
            out[i] = NULL;
}

df_tensor *df_emb_modulate(df_ctx *ctx, df_tensor *x, df_tensor *shift, df_tensor *scale, float eps)
{
    df_scope mark = df_scope_begin(ctx); /* the norm and the product go at the end */
    df_tensor *h = df_layer_norm(ctx, x, NULL, NULL, eps); /* [B, S, D] */
    h = df_mul(ctx, h, df_scale(ctx, scale, 1.0f, 1.0f));  /* * (1 + scale) */
    return df_scope_end(ctx, mark, df_add(ctx, h, shift)); /* + shift [B, S, D] */
}

df_tensor *df_emb_ada_norm_continuous(df_ctx *ctx, const df_linear_weights *linear, df_tensor *x,
                                      df_tensor *cond, float eps)
{
    df_tensor *mod[2];
    df_emb_modulation(ctx, linear, cond, 2, mod); /* scale, shift: [B, 1, D] each */
    return df_emb_modulate(ctx, x, mod[1], mod[0], eps);
}

df_tensor *df_emb_rope_table(df_ctx *ctx, df_tensor *txt_ids, df_tensor *img_ids,
                             const int64_t *axes_dim, int n_axes, double theta)
{
    if (!txt_ids || !img_ids)
        return NULL;
    DF_ASSERT(n_axes <= DF_EMB_MAX_AXES);
    int axes[DF_EMB_MAX_AXES]; /* the configs' sizes were checked to be at most 2^24 */
    for (int a = 0; a < n_axes; a++)
        axes[a] = (int)axes_dim[a];
    if (df_tensor_dtype(txt_ids) != df_tensor_dtype(img_ids)) {
        txt_ids = df_cast(ctx, txt_ids, DF_DTYPE_F64); /* exact for f32/f16/bf16 and ids < 2^53 */
        img_ids = df_cast(ctx, img_ids, DF_DTYPE_F64);
    }
    df_tensor *ids = df_concat(ctx, txt_ids, img_ids, 0);    /* [S, A] text first */
    return df_rope_table(ctx, ids, axes, n_axes, theta);     /* [S, sum/2, 2]     */
}

df_status df_emb_check_input(const char *model, const char *name, const df_tensor *t, int ndim,
                             const int64_t *want, bool ids)
{
    if (!t)
        return df_errorf(DF_E_ARG, "%s forward: input '%s' is missing", model, name);
    df_dtype dt = df_tensor_dtype(t);
    bool is_f =
        dt == DF_DTYPE_F32 || dt == DF_DTYPE_BF16 || dt == DF_DTYPE_F16 || dt == DF_DTYPE_F64;
    bool fits =
        df_tensor_ndim(t) == ndim && (is_f || (ids && (dt == DF_DTYPE_I32 || dt == DF_DTYPE_I64)));
    for (int d = 0; fits && d < ndim; d++)
        fits = want[d] < 0 ? df_tensor_dim(t, d) > 0 : df_tensor_dim(t, d) == want[d];
    if (fits)
        return DF_OK;
    char got[128], w[128];
    int used = snprintf(w, sizeof w, "[");
    for (int d = 0; d < ndim && used < (int)sizeof w; d++)
        used += want[d] < 0 ? snprintf(w + used, sizeof w - (size_t)used, d ? ", *" : "*")
                            : snprintf(w + used, sizeof w - (size_t)used, d ? ", %lld" : "%lld",
                                       (long long)want[d]);
    if (used < (int)sizeof w)
        snprintf(w + used, sizeof w - (size_t)used, "]");
    return df_errorf(DF_E_SHAPE, "%s forward: input '%s' is %s; expected %s %s", model, name,
                     df_tensor_describe(t, got, sizeof got), w,
                     ids ? "(float or integer)" : "float");
}
