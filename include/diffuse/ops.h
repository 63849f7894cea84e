/*
 * The op API: what model code calls. Every function returns a new tensor owned by the
 * current scope, or NULL on failure (see runtime.h for how errors are reported). The same
 * calls run in every execution mode and on every device.
 *
 * Broadcasting follows NumPy: shapes are aligned at the right, and a dimension of 1
 * stretches. Activations are f32; weights may be f32, bf16 or f16. Matrix products
 * (linear, matmul, attention, conv2d) compute in the context's compute dtype (f32, or bf16
 * inputs with f32 accumulation) and return f32.
 */
#ifndef DIFFUSE_OPS_H
#define DIFFUSE_OPS_H

#include "runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A linear layer's weights: weight [N, K], bias [N] or NULL. */
typedef struct df_linear_weights {
    df_tensor *weight;
    df_tensor *bias;
    /* Optional low-rank side product (an unmerged LoRA, models/lora.h): df_linear adds
     * (x lora_down^T) lora_up^T, lora_down [R, K] with the adapters' scales folded in,
     * lora_up [N, R]. NULL: none. */
    df_tensor *lora_down;
    df_tensor *lora_up;
} df_linear_weights;

/* --- views: no data moves; the result shares the input's storage --------------------- */

/* One dimension may be -1 (inferred). A non-contiguous input is copied first. */
DF_API df_tensor *df_reshape(df_ctx *ctx, df_tensor *x, const int64_t *shape, int ndim);
DF_API df_tensor *df_permute(df_ctx *ctx, df_tensor *x, const int64_t *dims, int ndim);
DF_API df_tensor *df_transpose(df_ctx *ctx, df_tensor *x, int d0, int d1);
/* Elements [start, end) of dimension dim (negative dim counts from the end). */
DF_API df_tensor *df_slice(df_ctx *ctx, df_tensor *x, int dim, int64_t start, int64_t end);
/* Part i of n equal parts of dimension dim (torch.chunk with a size that divides). */
DF_API df_tensor *df_chunk(df_ctx *ctx, df_tensor *x, int n, int dim, int i);
/* Dimensions of size 1 repeated to `shape` (stride 0); -1 keeps a dimension. */
DF_API df_tensor *df_expand(df_ctx *ctx, df_tensor *x, const int64_t *shape, int ndim);
DF_API df_tensor *df_unsqueeze(df_ctx *ctx, df_tensor *x, int dim);
DF_API df_tensor *df_squeeze(df_ctx *ctx, df_tensor *x, int dim);

/* --- copies and conversions ---------------------------------------------------------- */

DF_API df_tensor *df_contiguous(df_ctx *ctx, df_tensor *x);
DF_API df_tensor *df_cast(df_ctx *ctx, df_tensor *x, df_dtype dtype);
/* Concatenation of a and b along dim (all other dimensions equal). */
DF_API df_tensor *df_concat(df_ctx *ctx, df_tensor *a, df_tensor *b, int dim);
/* Rows of table [V, D] picked by integer ids [...]: result [..., D]. */
DF_API df_tensor *df_gather(df_ctx *ctx, df_tensor *table, df_tensor *ids);
/* For each row b of integer ids [B, S], the flat index b * S + j of the first position j
 * holding `token`, or 0 + b * S when the row has none; with token < 0, of the row's first
 * largest id (torch's argmax). Result: i64 [B], ready for df_gather on a [B * S, D] view
 * (CLIP's pooled output at the EOS token). */
DF_API df_tensor *df_token_rows(df_ctx *ctx, df_tensor *ids, int64_t token);

/* --- elementwise ----------------------------------------------------------------------- */

DF_API df_tensor *df_add(df_ctx *ctx, df_tensor *a, df_tensor *b);
DF_API df_tensor *df_sub(df_ctx *ctx, df_tensor *a, df_tensor *b);
DF_API df_tensor *df_mul(df_ctx *ctx, df_tensor *a, df_tensor *b);
DF_API df_tensor *df_div(df_ctx *ctx, df_tensor *a, df_tensor *b);
/* alpha * x + beta */
DF_API df_tensor *df_scale(df_ctx *ctx, df_tensor *x, float alpha, float beta);
DF_API df_tensor *df_silu(df_ctx *ctx, df_tensor *x);
DF_API df_tensor *df_gelu(df_ctx *ctx, df_tensor *x);      /* exact, with erf */
DF_API df_tensor *df_gelu_tanh(df_ctx *ctx, df_tensor *x); /* tanh approximation */
DF_API df_tensor *df_quick_gelu(df_ctx *ctx, df_tensor *x); /* x * sigmoid(1.702 x) */

/* --- normalisation and softmax (all in f32) ------------------------------------------- */

/* Softmax over the last dimension. */
DF_API df_tensor *df_softmax(df_ctx *ctx, df_tensor *x);
/* Over the last dimension; weight and bias [D] may be NULL (no affine). */
DF_API df_tensor *df_layer_norm(df_ctx *ctx, df_tensor *x, df_tensor *weight, df_tensor *bias,
                                float eps);
/* x / sqrt(mean(x^2) + eps) * weight over the last dimension; weight may be NULL. */
DF_API df_tensor *df_rms_norm(df_ctx *ctx, df_tensor *x, df_tensor *weight, float eps);
/* x [B, C, ...] in `groups` groups of channels; weight and bias [C] may be NULL. */
DF_API df_tensor *df_group_norm(df_ctx *ctx, df_tensor *x, int groups, df_tensor *weight,
                                df_tensor *bias, float eps);

/* --- positions and time --------------------------------------------------------------- */

/* Sinusoidal embedding of t [B] (any float dtype) -> [B, dim] f32, computed in f32 as
 * diffusers' get_timestep_embedding: angle = (scale * t) * exp(-ln(max_period) * i /
 * (half - shift)); [sin, cos] or, with flip_sin_to_cos, [cos, sin]. */
DF_API df_tensor *df_timestep_embedding(df_ctx *ctx, df_tensor *t, int dim, bool flip_sin_to_cos,
                                        float downscale_freq_shift, float scale,
                                        float max_period);
/* RoPE table for positions ids [S, n_axes] (f32, f64 or integer): for each axis a, the
 * axes_dim[a]/2 frequencies theta^(-2k/axes_dim[a]), angle = pos * freq computed in f64,
 * stored as f32 pairs (cos, sin): result [S, sum(axes_dim)/2, 2]. */
DF_API df_tensor *df_rope_table(df_ctx *ctx, df_tensor *ids, const int *axes_dim, int n_axes,
                                double theta);
/* Rotates interleaved pairs of x [B, H, S, D] by table [S, D/2, 2] (f32 math):
 * (x0 c - x1 s, x1 c + x0 s). */
DF_API df_tensor *df_rope(df_ctx *ctx, df_tensor *x, df_tensor *table);

/* --- matrix products -------------------------------------------------------------------- */

/* x [..., K] @ weight^T + bias -> [..., N], plus w's low-rank side product if it has one. */
DF_API df_tensor *df_linear(df_ctx *ctx, df_tensor *x, const df_linear_weights *w);
/* a [..., M, K] @ b [..., K, N] -> [..., M, N]; b's batch dimensions broadcast. */
DF_API df_tensor *df_matmul(df_ctx *ctx, df_tensor *a, df_tensor *b);
/* softmax(q k^T * scale + mask) v without forming the whole [Sq, Sk] matrix.
 * q [B, H, Sq, D], k [B, H, Sk, D], v [B, H, Sk, Dv]; mask NULL or additive f32
 * broadcastable to [B, H, Sq, Sk]; causal masks keys after the query's position.
 * scale <= 0 means 1/sqrt(D). */
DF_API df_tensor *df_attention(df_ctx *ctx, df_tensor *q, df_tensor *k, df_tensor *v,
                               df_tensor *mask, bool causal, float scale);
/* x [B, C, H, W] (*) weight [O, C, kh, kw] + bias [O] (NULL allowed). */
DF_API df_tensor *df_conv2d(df_ctx *ctx, df_tensor *x, df_tensor *weight, df_tensor *bias,
                            int stride, int padding);
/* Nearest-neighbour 2x upsampling of x [B, C, H, W]. */
DF_API df_tensor *df_upsample_nearest2x(df_ctx *ctx, df_tensor *x);

#ifdef __cplusplus
}
#endif
#endif
