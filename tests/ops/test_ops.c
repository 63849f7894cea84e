/*
 * The op table: every op except the matrix products (those are in test_ops_matmul.c),
 * the view functions, cast and contiguous, each row run on every device the library lists
 * (or the one $DIFFUSE_DEVICE names) and in every execution mode the context accepts,
 * against a float64 reference written here (op_ref.h has the driver, and checks that each
 * device other than the CPU dispatched the table's kernels). Inputs come from a generator seeded by the row's name and
 * reach the op dense, permuted, sliced or expanded; weights come in f32, bf16 and f16.
 *
 * After the table: error cases (shapes that do not fit name both shapes, a gather id out
 * of range fails the stream with DF_E_ARG, NULL inputs give NULL), and an accuracy sweep
 * of the activations that reports their worst error in ulps.
 */
#include "ops/op_ref.h"

#define F32  DF_DTYPE_F32
#define BF16 DF_DTYPE_BF16
#define F16  DF_DTYPE_F16
#define F64  DF_DTYPE_F64
#define I32  DF_DTYPE_I32
#define I64  DF_DTYPE_I64

/* Shorthand for the rows (op_ref.h) */
#define SHAPE  REF_SHAPE
#define X      REF_IN
#define XV     REF_IN_VIEW
#define XT     REF_IN_T
#define ABSENT REF_ABSENT
#define ULPS   REF_ULPS

/* ---- references and runners ----------------------------------------------------------- */

static ref_tensor like(const ref_tensor *x, df_dtype dtype)
{
    return ref_alloc(x->ndim, x->shape, dtype);
}

/* contiguous / cast: i[0] = 1 for a cast to dtype i[1] */
static df_tensor *run_copy(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return c->i[0] ? df_cast(ctx, in[0], (df_dtype)c->i[1]) : df_contiguous(ctx, in[0]);
}

static void ref_copy(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    df_dtype t = c->i[0] ? (df_dtype)c->i[1] : in[0].dtype;
    *out = like(&in[0], t);
    for (int64_t i = 0; i < ref_numel(out); i++)
        out->data[i] = ref_round(in[0].data[i], t);
}

/* full: shape i[0..ndim), ndim i[6], dtype i[7], value f[0] */
static df_tensor *run_full(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_full(ctx, (df_dtype)c->i[7], c->i, (int)c->i[6], c->f[0]);
}

static void ref_full(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    *out = ref_alloc((int)c->i[6], c->i, (df_dtype)c->i[7]);
    for (int64_t i = 0; i < ref_numel(out); i++)
        out->data[i] = ref_round(c->f[0], out->dtype);
}

/* binary: i[0] = 0 add, 1 sub, 2 mul, 3 div */
static df_tensor *run_binary(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    df_tensor *(*const fns[])(df_ctx *, df_tensor *, df_tensor *) = {df_add, df_sub, df_mul,
                                                                     df_div};
    return fns[c->i[0]](ctx, in[0], in[1]);
}

static void ref_binary(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *a = &in[0], *b = &in[1];
    int nd = a->ndim > b->ndim ? a->ndim : b->ndim;
    int64_t shape[DF_MAX_DIMS], idx[DF_MAX_DIMS] = {0};
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - a->ndim), db = d - (nd - b->ndim);
        int64_t sa = da >= 0 ? a->shape[da] : 1, sb = db >= 0 ? b->shape[db] : 1;
        shape[d] = sa == 1 ? sb : sa;
    }
    *out = ref_alloc(nd, shape, F32);
    for (int64_t i = 0; i < ref_numel(out); i++) {
        ref_unravel(i, nd, shape, idx);
        double x = ref_at_bcast(a, nd, idx), y = ref_at_bcast(b, nd, idx);
        double r = c->i[0] == 0 ? x + y : c->i[0] == 1 ? x - y : c->i[0] == 2 ? x * y : x / y;
        out->data[i] = r;
    }
}

/* unary: i[0] = 0 scale (f[0] x + f[1]), 1 silu, 2 gelu, 3 gelu_tanh, 4 quick_gelu */
static df_tensor *run_unary(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    switch (c->i[0]) {
    case 0:
        return df_scale(ctx, in[0], (float)c->f[0], (float)c->f[1]);
    case 1:
        return df_silu(ctx, in[0]);
    case 2:
        return df_gelu(ctx, in[0]);
    case 3:
        return df_gelu_tanh(ctx, in[0]);
    default:
        return df_quick_gelu(ctx, in[0]);
    }
}

static double sigmoid(double u)
{
    return 1.0 / (1.0 + exp(-u));
}

static double act_ref(int kind, double x, double alpha, double beta)
{
    switch (kind) {
    case 0:
        return (double)(float)alpha * x + (double)(float)beta;
    case 1:
        return x * sigmoid(x);
    case 2:
        return 0.5 * x * erfc(-x / sqrt(2.0)); /* = 0.5 x (1 + erf(x / sqrt 2)) */
    case 3: /* 0.5 x (1 + tanh(y)) = x sigmoid(2y), without the cancellation at large -y */
        return x * sigmoid(2.0 * sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x));
    default:
        return x * sigmoid(1.702 * x);
    }
}

static void ref_unary(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    *out = like(&in[0], F32);
    for (int64_t i = 0; i < ref_numel(out); i++)
        out->data[i] = act_ref((int)c->i[0], in[0].data[i], c->f[0], c->f[1]);
}

/* softmax over the last dimension */
static df_tensor *run_softmax(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_softmax(ctx, in[0]);
}

static void ref_softmax(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    *out = like(&in[0], F32);
    int64_t d = in[0].shape[in[0].ndim - 1], rows = ref_numel(out) / d;
    for (int64_t r = 0; r < rows; r++) {
        const double *x = in[0].data + r * d;
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < d; i++)
            m = fmax(m, x[i]);
        for (int64_t i = 0; i < d; i++)
            s += exp(x[i] - m);
        for (int64_t i = 0; i < d; i++)
            out->data[r * d + i] = exp(x[i] - m) / s;
    }
}

/* layer norm (in[1] weight?, in[2] bias?, f[0] eps) and RMS norm (in[1] weight?, f[0]) */
static df_tensor *run_layer_norm(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_layer_norm(ctx, in[0], in[1], in[2], (float)c->f[0]);
}

static df_tensor *run_rms_norm(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_rms_norm(ctx, in[0], in[1], (float)c->f[0]);
}

/* Normalises rows of d values: (x - mean) / sqrt(var + eps) (rms: x / sqrt(mean x^2 + eps))
 * times weight[channel] plus bias[channel]; channel = element / per_channel % channels. */
static void norm_rows(const ref_tensor *x, const ref_tensor *w, const ref_tensor *b, double eps,
                      bool rms, int64_t d, int64_t per_channel, int64_t channels, ref_tensor *out)
{
    int64_t rows = ref_numel(x) / d;
    for (int64_t r = 0; r < rows; r++) {
        const double *v = x->data + r * d;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < d; i++)
            mean += v[i];
        mean = rms ? 0 : mean / (double)d;
        for (int64_t i = 0; i < d; i++)
            var += (v[i] - mean) * (v[i] - mean);
        double rstd = 1.0 / sqrt(var / (double)d + (double)(float)eps);
        for (int64_t i = 0; i < d; i++) {
            int64_t ch = (r * d + i) / per_channel % channels;
            double y = (v[i] - mean) * rstd;
            if (w)
                y *= w->data[ch];
            if (b)
                y += b->data[ch];
            out->data[r * d + i] = y;
        }
    }
}

static void ref_layer_norm(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    int64_t d = in[0].shape[in[0].ndim - 1];
    *out = like(&in[0], F32);
    norm_rows(&in[0], c->in[1].absent ? NULL : &in[1], c->in[2].absent ? NULL : &in[2], c->f[0],
              false, d, 1, d, out);
}

static void ref_rms_norm(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    int64_t d = in[0].shape[in[0].ndim - 1];
    *out = like(&in[0], F32);
    norm_rows(&in[0], c->in[1].absent ? NULL : &in[1], NULL, c->f[0], true, d, 1, d, out);
}

/* group norm: i[0] groups, f[0] eps */
static df_tensor *run_group_norm(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_group_norm(ctx, in[0], (int)c->i[0], in[1], in[2], (float)c->f[0]);
}

static void ref_group_norm(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *x = &in[0];
    int64_t channels = x->shape[1], hw = ref_numel(x) / x->shape[0] / channels;
    *out = like(x, F32);
    norm_rows(x, c->in[1].absent ? NULL : &in[1], c->in[2].absent ? NULL : &in[2], c->f[0], false,
              channels / c->i[0] * hw, hw, channels, out);
}

/* timestep embedding: i[0] dim, i[1] flip; f[0] shift, f[1] scale, f[2] max_period.
 * The reference keeps diffusers' float32 steps (golden README): exponent, frequency, the
 * scaled time and the angle are rounded to f32; sin and cos are taken in f64. */
static df_tensor *run_timestep(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_timestep_embedding(ctx, in[0], (int)c->i[0], c->i[1] != 0, (float)c->f[0],
                                 (float)c->f[1], (float)c->f[2]);
}

static void ref_timestep(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    int64_t batch = in[0].shape[0], dim = c->i[0], half = dim / 2;
    *out = ref_alloc(2, (int64_t[]){batch, dim}, F32);
    float neg_log = (float)-log((double)(float)c->f[2]);
    float denom = (float)((double)half - (double)(float)c->f[0]);
    for (int64_t b = 0; b < batch; b++) {
        float t = (float)c->f[1] * (float)in[0].data[b];
        for (int64_t i = 0; i < half; i++) {
            float expo = neg_log * (float)i;
            expo = expo / denom;
            float freq = (float)exp((double)expo);
            double angle = (double)(float)(t * freq);
            double s = sin(angle), co = cos(angle);
            out->data[b * dim + (c->i[1] ? half + i : i)] = s;
            out->data[b * dim + (c->i[1] ? i : half + i)] = co;
        }
    }
}

/* rope table: ids [S, n_axes]; i[0] n_axes, i[1..] axes dims; f[0] theta */
static df_tensor *run_rope_table(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    int axes[7];
    for (int a = 0; a < c->i[0]; a++)
        axes[a] = (int)c->i[1 + a];
    return df_rope_table(ctx, in[0], axes, (int)c->i[0], c->f[0]);
}

static void ref_rope_table(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    int64_t seq = in[0].shape[0], total = 0;
    int n_axes = (int)c->i[0];
    for (int a = 0; a < n_axes; a++)
        total += c->i[1 + a];
    *out = ref_alloc(3, (int64_t[]){seq, total / 2, 2}, F32);
    for (int64_t s = 0; s < seq; s++) {
        int64_t k0 = 0;
        for (int a = 0; a < n_axes; a++) {
            int64_t d = c->i[1 + a];
            double pos = (double)(float)in[0].data[s * n_axes + a]; /* ids.float() */
            for (int64_t k = 0; k < d / 2; k++) {
                double freq = 1.0 / pow(c->f[0], (double)(2 * k) / (double)d);
                out->data[(s * (total / 2) + k0 + k) * 2] = (float)cos(pos * freq);
                out->data[(s * (total / 2) + k0 + k) * 2 + 1] = (float)sin(pos * freq);
            }
            k0 += d / 2;
        }
    }
}

/* rope: x [B, H, S, D], table [S, D/2, 2] */
static df_tensor *run_rope(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_rope(ctx, in[0], in[1]);
}

static void ref_rope(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *x = &in[0], *t = &in[1];
    int64_t S = x->shape[2], D = x->shape[3], rows = ref_numel(x) / D;
    *out = like(x, F32);
    for (int64_t r = 0; r < rows; r++) {
        int64_t s = r % S;
        for (int64_t i = 0; i < D / 2; i++) {
            double x0 = x->data[r * D + 2 * i], x1 = x->data[r * D + 2 * i + 1];
            double co = t->data[(s * D / 2 + i) * 2], sn = t->data[(s * D / 2 + i) * 2 + 1];
            out->data[r * D + 2 * i] = x0 * co - x1 * sn;
            out->data[r * D + 2 * i + 1] = x1 * co + x0 * sn;
        }
    }
}

/* nearest 2x upsampling of [B, C, H, W] */
static df_tensor *run_upsample(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_upsample_nearest2x(ctx, in[0]);
}

static void ref_upsample(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *x = &in[0];
    int64_t H = x->shape[2], W = x->shape[3];
    *out = ref_alloc(4, (int64_t[]){x->shape[0], x->shape[1], 2 * H, 2 * W}, F32);
    int64_t idx[4] = {0};
    for (int64_t i = 0; i < ref_numel(out); i++) {
        ref_unravel(i, 4, out->shape, idx);
        out->data[i] = x->data[((idx[0] * x->shape[1] + idx[1]) * H + idx[2] / 2) * W + idx[3] / 2];
    }
}

/* concat along i[0] */
static df_tensor *run_concat(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_concat(ctx, in[0], in[1], (int)c->i[0]);
}

static void ref_concat(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *a = &in[0], *b = &in[1];
    int nd = a->ndim, dim = (int)(c->i[0] < 0 ? c->i[0] + nd : c->i[0]);
    int64_t shape[DF_MAX_DIMS], idx[DF_MAX_DIMS] = {0};
    memcpy(shape, a->shape, sizeof shape);
    shape[dim] += b->shape[dim];
    *out = ref_alloc(nd, shape, a->dtype);
    for (int64_t i = 0; i < ref_numel(out); i++) {
        ref_unravel(i, nd, shape, idx);
        const ref_tensor *src = idx[dim] < a->shape[dim] ? a : b;
        if (src == b)
            idx[dim] -= a->shape[dim];
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off = off * src->shape[d] + idx[d];
        out->data[i] = src->data[off];
    }
}

/* gather: table [V, D], ids [...] */
static df_tensor *run_gather(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_gather(ctx, in[0], in[1]);
}

static void ref_gather(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *tab = &in[0], *ids = &in[1];
    int64_t D = tab->shape[1], shape[DF_MAX_DIMS];
    memcpy(shape, ids->shape, sizeof shape);
    shape[ids->ndim] = D;
    *out = ref_alloc(ids->ndim + 1, shape, F32);
    for (int64_t i = 0; i < ref_numel(ids); i++)
        for (int64_t j = 0; j < D; j++)
            out->data[i * D + j] = tab->data[(int64_t)ids->data[i] * D + j];
}

/* token_rows: ids [B, S], i[0] the token (< 0: the first largest id) */
static df_tensor *run_token_rows(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    return df_token_rows(ctx, in[0], c->i[0]);
}

static void ref_token_rows(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *ids = &in[0];
    int64_t B = ids->shape[0], S = ids->shape[1], shape[DF_MAX_DIMS] = {B};
    *out = ref_alloc(1, shape, I64);
    for (int64_t b = 0; b < B; b++) {
        const double *row = ids->data + b * S;
        int64_t at = 0;
        for (int64_t j = 0; j < S; j++) {
            if (c->i[0] >= 0 && row[j] == (double)c->i[0]) {
                at = j;
                break;
            }
            if (c->i[0] < 0 && row[j] > row[at])
                at = j;
        }
        out->data[b] = (double)(b * S + at);
    }
}

/* ---- views ------------------------------------------------------------------------------ */

/* i[0] selects the view; its arguments follow in i[1..] */
enum { V_RESHAPE, V_PERMUTE, V_TRANSPOSE, V_SLICE, V_CHUNK, V_EXPAND, V_UNSQUEEZE, V_SQUEEZE };

static df_tensor *run_view(df_ctx *ctx, const op_case *c, df_tensor *const in[])
{
    const int64_t *a = c->i + 2; /* i[1] = how many arguments */
    int na = (int)c->i[1];
    switch (c->i[0]) {
    case V_RESHAPE:
        return df_reshape(ctx, in[0], a, na);
    case V_PERMUTE:
        return df_permute(ctx, in[0], a, na);
    case V_TRANSPOSE:
        return df_transpose(ctx, in[0], (int)a[0], (int)a[1]);
    case V_SLICE:
        return df_slice(ctx, in[0], (int)a[0], a[1], a[2]);
    case V_CHUNK:
        return df_chunk(ctx, in[0], (int)a[0], (int)a[1], (int)a[2]);
    case V_EXPAND:
        return df_expand(ctx, in[0], a, na);
    case V_UNSQUEEZE:
        return df_unsqueeze(ctx, in[0], (int)a[0]);
    default:
        return df_squeeze(ctx, in[0], (int)a[0]);
    }
}

/* The reference view: an output shape and, per output dim, the input dim it reads
 * (-1: none, a new or stretched dim) and a start offset. */
static void ref_views(const op_case *c, const ref_tensor in[], ref_tensor *out)
{
    const ref_tensor *x = &in[0];
    const int64_t *a = c->i + 2;
    int na = (int)c->i[1], nd = x->ndim;
    int64_t shape[DF_MAX_DIMS], start[DF_MAX_DIMS] = {0};
    int from[DF_MAX_DIMS];
    int onds = nd;
    for (int d = 0; d < nd; d++) {
        shape[d] = x->shape[d];
        from[d] = d;
    }
    switch (c->i[0]) {
    case V_RESHAPE: { /* same values in the same order */
        int64_t known = 1, numel = ref_numel(x);
        for (int d = 0; d < na; d++)
            known *= a[d] == -1 ? 1 : a[d];
        for (int d = 0; d < na; d++)
            shape[d] = a[d] == -1 ? numel / known : a[d];
        *out = ref_alloc(na, shape, x->dtype);
        memcpy(out->data, x->data, (size_t)numel * sizeof(double));
        return;
    }
    case V_PERMUTE:
    case V_TRANSPOSE:
        for (int d = 0; d < nd; d++) {
            int src = d;
            if (c->i[0] == V_PERMUTE) {
                src = (int)(a[d] < 0 ? a[d] + nd : a[d]);
            } else {
                int d0 = (int)(a[0] < 0 ? a[0] + nd : a[0]),
                    d1 = (int)(a[1] < 0 ? a[1] + nd : a[1]);
                src = d == d0 ? d1 : d == d1 ? d0 : d;
            }
            from[d] = src;
            shape[d] = x->shape[src];
        }
        break;
    case V_SLICE:
    case V_CHUNK: {
        int dim = (int)a[c->i[0] == V_SLICE ? 0 : 1];
        dim = dim < 0 ? dim + nd : dim;
        if (c->i[0] == V_SLICE) {
            start[dim] = a[1];
            shape[dim] = a[2] - a[1];
        } else {
            shape[dim] = x->shape[dim] / a[0];
            start[dim] = a[2] * shape[dim];
        }
        break;
    }
    case V_EXPAND: {
        int lead = na - nd;
        onds = na;
        for (int d = 0; d < na; d++) {
            from[d] = d < lead ? -1 : d - lead;
            int64_t have = d < lead ? 1 : x->shape[d - lead];
            shape[d] = a[d] == -1 ? have : a[d];
            if (from[d] >= 0 && have == 1 && shape[d] != 1)
                from[d] = -1; /* stretched: always index 0 */
        }
        break;
    }
    case V_UNSQUEEZE: {
        int at = (int)(a[0] < 0 ? a[0] + nd + 1 : a[0]);
        onds = nd + 1;
        for (int d = 0, s = 0; d < onds; d++) {
            from[d] = d == at ? -1 : s;
            shape[d] = d == at ? 1 : x->shape[s++];
        }
        break;
    }
    default: { /* squeeze */
        int at = (int)(a[0] < 0 ? a[0] + nd : a[0]);
        onds = nd - 1;
        for (int d = 0, s = 0; d < onds; d++, s++) {
            if (s == at)
                s++;
            from[d] = s;
            shape[d] = x->shape[s];
        }
        break;
    }
    }
    *out = ref_alloc(onds, shape, x->dtype);
    int64_t idx[DF_MAX_DIMS] = {0}, xi[DF_MAX_DIMS] = {0};
    for (int64_t i = 0; i < ref_numel(out); i++) {
        ref_unravel(i, onds, shape, idx);
        for (int d = 0; d < nd; d++)
            xi[d] = 0;
        for (int d = 0; d < onds; d++)
            if (from[d] >= 0)
                xi[from[d]] = idx[d] + start[from[d]];
        int64_t off = 0;
        for (int d = 0; d < nd; d++)
            off = off * x->shape[d] + xi[d];
        out->data[i] = x->data[off];
    }
}

/* ---- the table ---------------------------------------------------------------------------- */

#define EXACT       .atol = 0, .rtol = 0
#define ACT_TOL     .atol = 1e-6, .rtol = 1e-6 /* tails of tanh/erf forms, see sweep */
#define NORM_TOL    .atol = 2e-6, .rtol = 2e-6
#define SOFTMAX_TOL .atol = 5e-8, .rtol = 1e-6 /* exp(x - max): x - max is rounded to f32 */
#define ROPE_TOL    .atol = 1e-6, .rtol = 1e-6

/* clang-format off */
static const op_case cases[] = {
    /* contiguous and cast: strided -> dense, dtype conversions (tiled transposes from
     * 32 x 32 up, so some shapes are large enough for the tiles and the threads) */
    {"contiguous f32 permuted", run_copy, ref_copy, 1, {XV(REF_PERMUTED, 37, 45)}, EXACT},
    {"contiguous f32 permuted large", run_copy, ref_copy, 1, {XV(REF_PERMUTED, 3, 130, 101)},
     EXACT},
    {"contiguous f32 permuted 4d", run_copy, ref_copy, 1,
     {{SHAPE(2, 5, 33, 40), .view = REF_PERMUTED, .perm = {0, 2, 3, 1}}}, EXACT},
    {"contiguous f32 sliced", run_copy, ref_copy, 1, {XV(REF_SLICED, 5, 7, 33)}, EXACT},
    {"contiguous f32 sliced large", run_copy, ref_copy, 1, {XV(REF_SLICED, 300, 130)}, EXACT},
    {"contiguous f32 expanded", run_copy, ref_copy, 1,
     {{SHAPE(4, 6, 9), .view = REF_EXPANDED, .expand_mask = 2}}, EXACT},
    {"contiguous bf16 permuted", run_copy, ref_copy, 1, {XT(BF16, REF_PERMUTED, 3, 40, 50)}, EXACT},
    {"contiguous i64 sliced", run_copy, ref_copy, 1,
     {{SHAPE(6, 9), .dtype = I64, .view = REF_SLICED, .lo = -1e12, .hi = 1e12}}, EXACT},
    {"cast bf16 to f32", run_copy, ref_copy, 1, {XT(BF16, REF_DENSE, 7, 65)}, EXACT, .i = {1, F32}},
    {"cast f16 to f32 permuted", run_copy, ref_copy, 1, {XT(F16, REF_PERMUTED, 40, 70)}, EXACT,
     .i = {1, F32}},
    {"cast f32 to bf16", run_copy, ref_copy, 1, {XT(F32, REF_DENSE, 200, 201)}, EXACT,
     .i = {1, BF16}},
    {"cast f32 to f16", run_copy, ref_copy, 1, {{SHAPE(9, 31), .lo = -70000, .hi = 70000}}, EXACT,
     .i = {1, F16}},
    {"cast f32 to f16 small values", run_copy, ref_copy, 1,
     {{SHAPE(9, 31), .lo = -1e-6, .hi = 1e-6}}, EXACT, .i = {1, F16}},
    {"cast f32 to f16 sliced", run_copy, ref_copy, 1, {XV(REF_SLICED, 11, 37)}, EXACT,
     .i = {1, F16}},
    {"cast f32 to f64 permuted", run_copy, ref_copy, 1, {XV(REF_PERMUTED, 33, 35)}, EXACT,
     .i = {1, F64}},
    {"cast f64 to f32", run_copy, ref_copy, 1, {XT(F64, REF_DENSE, 5, 9)}, EXACT, .i = {1, F32}},
    {"cast bf16 to f16", run_copy, ref_copy, 1, {XT(BF16, REF_DENSE, 5, 9)}, EXACT, .i = {1, F16}},
    {"cast f32 to i32", run_copy, ref_copy, 1, {{SHAPE(4, 25), .lo = -1000, .hi = 1000}}, EXACT,
     .i = {1, I32}},
    {"cast i32 to f32", run_copy, ref_copy, 1,
     {{SHAPE(4, 25), .dtype = I32, .lo = -1e6, .hi = 1e6}}, EXACT, .i = {1, F32}},
    {"cast i64 to i32 expanded", run_copy, ref_copy, 1,
     {{SHAPE(3, 4, 5), .dtype = I64, .view = REF_EXPANDED, .expand_mask = 1, .lo = -1e9,
     .hi = 1e9}}, EXACT, .i = {1, I32}},
    {"cast i32 to i64", run_copy, ref_copy, 1, {{SHAPE(17), .dtype = I32, .lo = -2e9, .hi = 2e9}},
     EXACT, .i = {1, I64}},
    {"cast i64 to f64", run_copy, ref_copy, 1, {{SHAPE(17), .dtype = I64, .lo = -1e15, .hi = 1e15}},
     EXACT, .i = {1, F64}},

    /* full / zeros: shape in i[0..5], ndim i[6], dtype i[7] */
    {"full f32", run_full, ref_full, 0, {{0}}, EXACT, .i = {3, 5, 7, 0, 0, 0, 3, F32}, .f = {2.5}},
    {"full f32 large", run_full, ref_full, 0, {{0}}, EXACT, .i = {300, 301, 0, 0, 0, 0, 2, F32},
     .f = {-1.25}},
    {"full bf16 rounds", run_full, ref_full, 0, {{0}}, EXACT, .i = {4, 4, 0, 0, 0, 0, 2, BF16},
     .f = {0.1}},
    {"full i64", run_full, ref_full, 0, {{0}}, EXACT, .i = {10, 0, 0, 0, 0, 0, 1, I64}, .f = {-7}},
    {"zeros f16 scalar", run_full, ref_full, 0, {{0}}, EXACT, .i = {0, 0, 0, 0, 0, 0, 0, F16}},

    /* binary: both dense, inner-dim broadcast (stride 0), middle broadcast, lower rank,
     * views, other dtypes, and sizes that split rows between threads */
    {"add dense", run_binary, ref_binary, 2, {X(7, 33), X(7, 33)}, .i = {0}, ULPS(0.5)},
    {"add dense large", run_binary, ref_binary, 2, {X(3, 77, 151), X(3, 77, 151)}, .i = {0},
     ULPS(0.5)},
    {"add row broadcast", run_binary, ref_binary, 2, {X(3, 77, 151), X(77, 1)}, .i = {0},
     ULPS(0.5)},
    {"add middle broadcast", run_binary, ref_binary, 2, {X(2, 5, 8, 40), X(5, 1, 40)}, .i = {0},
     ULPS(0.5)},
    {"add lower rank", run_binary, ref_binary, 2, {X(3, 77, 151), X(151)}, .i = {0}, ULPS(0.5)},
    {"add both broadcast", run_binary, ref_binary, 2, {X(4, 1, 6), X(1, 5, 6)}, .i = {0},
     ULPS(0.5)},
    {"add scalar", run_binary, ref_binary, 2, {X(9, 10), X(1)}, .i = {0}, ULPS(0.5)},
    {"add scalar first", run_binary, ref_binary, 2, {X(1), X(9, 10)}, .i = {0}, ULPS(0.5)},
    {"add permuted + sliced", run_binary, ref_binary, 2, {XV(REF_PERMUTED, 33, 47),
     XV(REF_SLICED, 33, 47)}, .i = {0}, ULPS(0.5)},
    {"add permuted large", run_binary, ref_binary, 2, {XV(REF_PERMUTED, 4, 90, 100), X(4, 90, 100)},
     .i = {0}, ULPS(0.5)},
    {"add expanded", run_binary, ref_binary, 2, {X(4, 6, 9),
     {SHAPE(4, 6, 9), .view = REF_EXPANDED, .expand_mask = 5}}, .i = {0}, ULPS(0.5)},
    {"add bf16 weight", run_binary, ref_binary, 2, {X(6, 40), XT(BF16, REF_DENSE, 40)}, .i = {0},
     ULPS(0.5)},
    {"add f16 + f64", run_binary, ref_binary, 2, {XT(F16, REF_DENSE, 6, 40),
     XT(F64, REF_DENSE, 6, 40)}, .i = {0}, .atol = 1e-7,
     .rtol = 0x1p-23 /* b is rounded to f32 first */},
    {"sub middle broadcast", run_binary, ref_binary, 2, {X(2, 5, 8, 40), X(2, 1, 8, 40)}, .i = {1},
     ULPS(0.5)},
    {"sub scalar first sliced", run_binary, ref_binary, 2, {X(1), XV(REF_SLICED, 9, 70)}, .i = {1},
     ULPS(0.5)},
    {"mul gate broadcast", run_binary, ref_binary, 2, {X(2, 300, 64), X(2, 1, 64)}, .i = {2},
     ULPS(0.5)},
    {"mul channel broadcast", run_binary, ref_binary, 2, {X(2, 8, 60, 70), X(8, 1, 1)}, .i = {2},
     ULPS(0.5)},
    {"mul bf16 permuted", run_binary, ref_binary, 2, {XT(BF16, REF_PERMUTED, 12, 17), X(12, 17)},
     .i = {2}, ULPS(0.5)},
    {"div dense", run_binary, ref_binary, 2, {X(9, 33), {SHAPE(9, 33), .lo = 0.5, .hi = 2}},
     .i = {3}, ULPS(0.5)},
    {"div row broadcast", run_binary, ref_binary, 2, {X(3, 77, 151),
     {SHAPE(3, 77, 1), .lo = 0.5, .hi = 2}}, .i = {3}, ULPS(0.5)},
    {"div scalar", run_binary, ref_binary, 2, {XV(REF_PERMUTED, 30, 40),
     {SHAPE(1), .lo = 3, .hi = 4}}, .i = {3}, ULPS(0.5)},

    /* unary */
    {"scale dense", run_unary, ref_unary, 1, {X(5, 70)}, .i = {0}, .atol = 3e-7, .rtol = 0x1p-23,
     .f = {1.5, -0.25}},
    {"scale permuted large", run_unary, ref_unary, 1, {XV(REF_PERMUTED, 70, 501)}, .i = {0},
     .atol = 3e-7, .rtol = 0x1p-23, .f = {-3, 2}},
    {"silu dense", run_unary, ref_unary, 1, {{SHAPE(7, 65), .lo = -30, .hi = 30}}, .i = {1},
     ULPS(4)},
    {"silu large", run_unary, ref_unary, 1, {{SHAPE(70, 501), .lo = -10, .hi = 10}}, .i = {1},
     ULPS(4)},
    {"silu sliced", run_unary, ref_unary, 1, {XV(REF_SLICED, 7, 65)}, .i = {1}, ULPS(4)},
    {"silu expanded", run_unary, ref_unary, 1,
     {{SHAPE(5, 3, 64), .view = REF_EXPANDED, .expand_mask = 2}}, .i = {1}, ULPS(4)},
    {"silu bf16 input", run_unary, ref_unary, 1, {{SHAPE(5, 64), .dtype = BF16, .lo = -8, .hi = 8}},
     .i = {1}, ULPS(4)},
    {"gelu dense", run_unary, ref_unary, 1, {{SHAPE(7, 65), .lo = -6, .hi = 6}}, .i = {2}, ACT_TOL},
    {"gelu permuted", run_unary, ref_unary, 1,
     {{SHAPE(33, 65), .view = REF_PERMUTED, .lo = -6, .hi = 6}}, .i = {2}, ACT_TOL},
    {"gelu f16 input", run_unary, ref_unary, 1, {{SHAPE(5, 64), .dtype = F16, .lo = -4, .hi = 4}},
     .i = {2}, ACT_TOL},
    {"gelu_tanh dense", run_unary, ref_unary, 1, {{SHAPE(7, 65), .lo = -6, .hi = 6}}, .i = {3},
     ACT_TOL},
    {"gelu_tanh large", run_unary, ref_unary, 1, {{SHAPE(70, 501), .lo = -6, .hi = 6}}, .i = {3},
     ACT_TOL},
    {"gelu_tanh sliced", run_unary, ref_unary, 1,
     {{SHAPE(7, 65), .view = REF_SLICED, .lo = -6, .hi = 6}}, .i = {3}, ACT_TOL},
    {"quick_gelu dense", run_unary, ref_unary, 1, {{SHAPE(7, 65), .lo = -8, .hi = 8}}, .i = {4},
     ACT_TOL},
    {"quick_gelu expanded", run_unary, ref_unary, 1,
     {{SHAPE(4, 6, 9), .view = REF_EXPANDED, .expand_mask = 1, .lo = -8, .hi = 8}}, .i = {4},
     ACT_TOL},

    /* softmax */
    {"softmax", run_softmax, ref_softmax, 1, {{SHAPE(6, 77), .lo = -10, .hi = 10}}, SOFTMAX_TOL},
    {"softmax large", run_softmax, ref_softmax, 1, {{SHAPE(64, 600), .lo = -30, .hi = 30}},
     SOFTMAX_TOL},
    {"softmax permuted", run_softmax, ref_softmax, 1, {XV(REF_PERMUTED, 2, 40, 33)}, SOFTMAX_TOL},
    {"softmax one column", run_softmax, ref_softmax, 1, {X(5, 1)}, SOFTMAX_TOL},
    {"softmax bf16 input", run_softmax, ref_softmax, 1, {XT(BF16, REF_DENSE, 3, 50)}, SOFTMAX_TOL},

    /* layer norm: x, weight?, bias?; f[0] eps */
    {"layer_norm affine", run_layer_norm, ref_layer_norm, 3, {X(4, 7, 96), X(96), X(96)}, NORM_TOL,
     .f = {1e-5}},
    {"layer_norm no affine", run_layer_norm, ref_layer_norm, 3, {X(4, 7, 96), ABSENT, ABSENT},
     NORM_TOL, .f = {1e-6}},
    {"layer_norm bf16 weight f16 bias", run_layer_norm, ref_layer_norm, 3, {X(3, 64),
     XT(BF16, REF_DENSE, 64), XT(F16, REF_DENSE, 64)}, NORM_TOL, .f = {1e-5}},
    {"layer_norm weight only", run_layer_norm, ref_layer_norm, 3, {X(3, 64), X(64), ABSENT},
     NORM_TOL, .f = {1e-5}},
    {"layer_norm bias only", run_layer_norm, ref_layer_norm, 3, {X(3, 64), ABSENT, X(64)}, NORM_TOL,
     .f = {1e-5}},
    {"layer_norm large mean", run_layer_norm, ref_layer_norm, 3,
     {{SHAPE(80, 512), .lo = 1000, .hi = 1001}, X(512), X(512)}, .atol = 3e-5, .rtol = 3e-5,
     .f = {1e-6}, .atol_f32 = 3e-4, .rtol_f32 = 1e-3}, /* f32 statistics of values near 1000 */
    {"layer_norm permuted sliced weight", run_layer_norm, ref_layer_norm, 3,
     {XV(REF_PERMUTED, 2, 40, 33), XV(REF_SLICED, 33), ABSENT}, NORM_TOL, .f = {1e-5}},
    {"layer_norm large eps", run_layer_norm, ref_layer_norm, 3,
     {{SHAPE(4, 16), .lo = -0.01, .hi = 0.01}, ABSENT, ABSENT}, NORM_TOL, .f = {0.5}},

    /* rms norm: x, weight?; f[0] eps */
    {"rms_norm weight", run_rms_norm, ref_rms_norm, 2, {X(2, 3, 5, 64), X(64)}, NORM_TOL,
     .f = {1e-6}},
    {"rms_norm bf16 weight large", run_rms_norm, ref_rms_norm, 2, {X(2, 300, 128),
     XT(BF16, REF_DENSE, 128)}, NORM_TOL, .f = {1e-6}},
    {"rms_norm f16 weight", run_rms_norm, ref_rms_norm, 2, {X(7, 48), XT(F16, REF_DENSE, 48)},
     NORM_TOL, .f = {1e-6}},
    {"rms_norm no weight sliced", run_rms_norm, ref_rms_norm, 2, {XV(REF_SLICED, 9, 40), ABSENT},
     NORM_TOL, .f = {1e-5}},

    /* group norm: x [B, C, ...], weight?, bias?; i[0] groups, f[0] eps */
    {"group_norm affine", run_group_norm, ref_group_norm, 3, {X(2, 12, 5, 7), X(12), X(12)},
     NORM_TOL, .i = {4}, .f = {1e-6}},
    {"group_norm large f16 weight bf16 bias", run_group_norm, ref_group_norm, 3, {X(1, 64, 24, 24),
     XT(F16, REF_DENSE, 64), XT(BF16, REF_DENSE, 64)}, NORM_TOL, .i = {8}, .f = {1e-6}},
    {"group_norm no affine 2d", run_group_norm, ref_group_norm, 3, {X(2, 6), ABSENT, ABSENT},
     NORM_TOL, .i = {3}, .f = {1e-5}},
    {"group_norm one group offset", run_group_norm, ref_group_norm, 3,
     {{SHAPE(2, 4, 9), .lo = 50, .hi = 51}, X(4), ABSENT}, .atol = 2e-5, .rtol = 2e-5, .i = {1},
     .f = {1e-6}},
    {"group_norm permuted", run_group_norm, ref_group_norm, 3, {XV(REF_PERMUTED, 2, 8, 6, 5),
     ABSENT, X(8)}, NORM_TOL, .i = {8}, .f = {1e-6}},

    /* timestep embedding: i[0] dim, i[1] flip; f[0] shift, f[1] scale, f[2] max_period */
    {"timestep flux [cos, sin]", run_timestep, ref_timestep, 1, {{SHAPE(3), .lo = 0, .hi = 1}},
     .atol = 1e-6, .i = {256, 1}, .f = {0, 1, 10000}},
    {"timestep x1000 scale", run_timestep, ref_timestep, 1, {{SHAPE(4), .lo = 0, .hi = 1}},
     .atol = 3e-4, .i = {256, 1}, .f = {0, 1000, 10000}},
    {"timestep [sin, cos] shift 1 odd dim", run_timestep, ref_timestep, 1,
     {{SHAPE(2), .lo = 0, .hi = 1}}, .atol = 1e-6, .i = {33, 0}, .f = {1, 1, 10000}},
    {"timestep f64 t period 100", run_timestep, ref_timestep, 1,
     {{SHAPE(5), .dtype = F64, .lo = 0, .hi = 1}}, .atol = 1e-6, .i = {16, 0}, .f = {0.5, 1, 100}},
    {"timestep bf16 t", run_timestep, ref_timestep, 1,
     {{SHAPE(2), .dtype = BF16, .lo = 0, .hi = 1}}, .atol = 1e-6, .i = {8, 1}, .f = {0, 1, 10000}},

    /* rope table: ids [S, n_axes]; i[0] n_axes, i[1..] dims; f[0] theta */
    {"rope_table flux i64", run_rope_table, ref_rope_table, 1,
     {{SHAPE(10, 3), .dtype = I64, .lo = 0, .hi = 64}}, .atol = 1e-7, .i = {3, 4, 6, 6},
     .f = {10000}},
    {"rope_table f32 ids", run_rope_table, ref_rope_table, 1, {{SHAPE(7, 3), .lo = 0, .hi = 100}},
     .atol = 1e-7, .i = {3, 16, 56, 56}, .f = {10000}},
    {"rope_table flux2 i32 4 axes", run_rope_table, ref_rope_table, 1,
     {{SHAPE(300, 4), .dtype = I32, .lo = 0, .hi = 512}}, .atol = 1e-7, .i = {4, 32, 32, 32, 32},
     .f = {2000}},
    {"rope_table f64 ids sliced", run_rope_table, ref_rope_table, 1,
     {{SHAPE(6, 2), .dtype = F64, .view = REF_SLICED, .lo = 0, .hi = 1000}}, .atol = 1e-7, .i = {2,
     8, 4}, .f = {10000}},

    /* rope: x [B, H, S, D], table [S, D/2, 2] */
    {"rope dense", run_rope, ref_rope, 2, {X(2, 3, 10, 16), X(10, 8, 2)}, ROPE_TOL},
    {"rope heads permuted", run_rope, ref_rope, 2,
     {{SHAPE(2, 3, 10, 16), .view = REF_PERMUTED, .perm = {0, 2, 1, 3}}, X(10, 8, 2)}, ROPE_TOL},
    {"rope x sliced", run_rope, ref_rope, 2, {XV(REF_SLICED, 2, 3, 10, 16), X(10, 8, 2)}, ROPE_TOL},
    {"rope x last dims swapped", run_rope, ref_rope, 2, {XV(REF_PERMUTED, 1, 2, 8, 8), X(8, 4, 2)},
     ROPE_TOL},
    {"rope large", run_rope, ref_rope, 2, {X(1, 4, 80, 128), X(80, 64, 2)}, ROPE_TOL},
    {"rope f16 x", run_rope, ref_rope, 2, {XT(F16, REF_DENSE, 1, 2, 5, 8), X(5, 4, 2)}, ROPE_TOL},

    /* upsample, concat, gather */
    {"upsample dense", run_upsample, ref_upsample, 1, {X(2, 3, 5, 7)}, EXACT},
    {"upsample large", run_upsample, ref_upsample, 1, {X(1, 8, 40, 40)}, EXACT},
    {"upsample permuted", run_upsample, ref_upsample, 1, {XV(REF_PERMUTED, 1, 2, 6, 4)}, EXACT},
    {"upsample bf16", run_upsample, ref_upsample, 1, {XT(BF16, REF_DENSE, 1, 2, 3, 5)}, EXACT},
    {"concat dim 0", run_concat, ref_concat, 2, {X(2, 5, 3), X(4, 5, 3)}, EXACT, .i = {0}},
    {"concat dim 1 views", run_concat, ref_concat, 2, {XV(REF_PERMUTED, 3, 4, 33),
     XV(REF_SLICED, 3, 2, 33)}, EXACT, .i = {1}},
    {"concat last dim", run_concat, ref_concat, 2, {X(7, 1), X(7, 3)}, EXACT, .i = {-1}},
    {"concat last dim large", run_concat, ref_concat, 2, {X(2, 300, 64), X(2, 300, 100)}, EXACT,
     .i = {2}},
    {"concat expanded", run_concat, ref_concat, 2,
     {{SHAPE(3, 4, 5), .view = REF_EXPANDED, .expand_mask = 2}, X(3, 4, 2)}, EXACT, .i = {2}},
    {"concat bf16", run_concat, ref_concat, 2, {XT(BF16, REF_DENSE, 2, 6),
     XT(BF16, REF_PERMUTED, 3, 6)}, EXACT, .i = {0}},
    {"concat i64", run_concat, ref_concat, 2, {{SHAPE(2, 3), .dtype = I64, .lo = -100, .hi = 100},
     {SHAPE(2, 2), .dtype = I64, .lo = -100, .hi = 100}}, EXACT, .i = {1}},
    {"gather f32 i64 ids", run_gather, ref_gather, 2, {X(50, 24),
     {SHAPE(3, 7), .dtype = I64, .lo = 0, .hi = 50}}, EXACT},
    {"gather bf16 table", run_gather, ref_gather, 2, {XT(BF16, REF_DENSE, 50, 24),
     {SHAPE(9), .dtype = I32, .lo = 0, .hi = 50}}, EXACT},
    {"gather f16 table large", run_gather, ref_gather, 2, {XT(F16, REF_DENSE, 100, 64),
     {SHAPE(2, 300), .dtype = I32, .lo = 0, .hi = 100}}, EXACT},
    {"gather sliced table permuted ids", run_gather, ref_gather, 2, {XV(REF_SLICED, 30, 8),
     {SHAPE(4, 5), .dtype = I64, .view = REF_PERMUTED, .lo = 0, .hi = 30}}, EXACT},
    {"token_rows first match i64", run_token_rows, ref_token_rows, 1,
     {{SHAPE(4, 9), .dtype = I64, .lo = 0, .hi = 6}}, EXACT, .i = {3}},
    {"token_rows no match is 0", run_token_rows, ref_token_rows, 1,
     {{SHAPE(3, 5), .dtype = I32, .lo = 0, .hi = 6}}, EXACT, .i = {99}},
    {"token_rows argmax first of ties", run_token_rows, ref_token_rows, 1,
     {{SHAPE(5, 77), .dtype = I32, .lo = 0, .hi = 40}}, EXACT, .i = {-1}},
    {"token_rows argmax permuted i64", run_token_rows, ref_token_rows, 1,
     {{SHAPE(6, 7), .dtype = I64, .view = REF_PERMUTED, .lo = 0, .hi = 1000}}, EXACT,
     .i = {-1}},

    /* views: i[0] kind, i[1] argument count, arguments */
    {"reshape -1", run_view, ref_views, 1, {X(2, 3, 4)}, EXACT, .i = {V_RESHAPE, 2, 4, -1}},
    {"reshape of permuted (copies)", run_view, ref_views, 1, {XV(REF_PERMUTED, 2, 3, 4)}, EXACT,
     .i = {V_RESHAPE, 2, -1, 8}},
    {"reshape of sliced (copies)", run_view, ref_views, 1, {XV(REF_SLICED, 4, 6)}, EXACT,
     .i = {V_RESHAPE, 3, 2, 2, 6}},
    {"reshape to scalar shape", run_view, ref_views, 1, {X(1, 1)}, EXACT, .i = {V_RESHAPE, 0}},
    {"permute", run_view, ref_views, 1, {X(2, 3, 4)}, EXACT, .i = {V_PERMUTE, 3, 2, 0, 1}},
    {"permute negative dims", run_view, ref_views, 1, {XV(REF_SLICED, 2, 3, 4, 5)}, EXACT,
     .i = {V_PERMUTE, 4, -1, 1, 0, -2}},
    {"transpose", run_view, ref_views, 1, {X(2, 3, 4)}, EXACT, .i = {V_TRANSPOSE, 2, -1, 0}},
    {"slice", run_view, ref_views, 1, {X(4, 6, 5)}, EXACT, .i = {V_SLICE, 3, 1, 2, 5}},
    {"slice negative dim of permuted", run_view, ref_views, 1, {XV(REF_PERMUTED, 4, 6, 5)}, EXACT,
     .i = {V_SLICE, 3, -1, 0, 3}},
    {"chunk", run_view, ref_views, 1, {X(2, 9, 4)}, EXACT, .i = {V_CHUNK, 3, 3, 1, 2}},
    {"chunk last", run_view, ref_views, 1, {X(2, 8)}, EXACT, .i = {V_CHUNK, 3, 4, -1, 3}},
    {"expand", run_view, ref_views, 1, {X(3, 1)}, EXACT, .i = {V_EXPAND, 3, 2, -1, 4}},
    {"expand sliced", run_view, ref_views, 1, {XV(REF_SLICED, 1, 5)}, EXACT, .i = {V_EXPAND, 2, 6,
     5}},
    {"unsqueeze front", run_view, ref_views, 1, {X(3, 4)}, EXACT, .i = {V_UNSQUEEZE, 1, 0}},
    {"unsqueeze end", run_view, ref_views, 1, {XV(REF_PERMUTED, 3, 4)}, EXACT, .i = {V_UNSQUEEZE, 1,
     -1}},
    {"squeeze", run_view, ref_views, 1, {X(3, 1, 4)}, EXACT, .i = {V_SQUEEZE, 1, 1}},
    {"squeeze negative of permuted", run_view, ref_views, 1, {XV(REF_PERMUTED, 3, 4, 1)}, EXACT,
     .i = {V_SQUEEZE, 1, -1}},
};
/* clang-format on */

/* ---- error cases ---------------------------------------------------------------------------- */

static df_tensor *zeros(df_ctx *ctx, const int64_t *shape, int ndim)
{
    df_tensor *t = df_zeros(ctx, F32, shape, ndim);
    assert_non_null(t);
    return t;
}

static void expect_shape_error(df_ctx *ctx, df_tensor *r, const char *where, const char *a,
                               const char *b)
{
    if (r)
        fail_msg("%s: expected a shape error, got a tensor", where);
    assert_int_equal(df_ctx_status(ctx), DF_E_SHAPE);
    const char *msg = df_error_message();
    if (!strstr(msg, a) || (b && !strstr(msg, b)))
        fail_msg("%s: message '%s' should name %s%s%s", where, msg, a, b ? " and " : "",
                 b ? b : "");
    assert_int_equal(df_sync(ctx), DF_E_SHAPE); /* the context stays failed ... */
    df_ctx_reset_error(ctx);                    /* ... until the error is reset */
    assert_int_equal(df_ctx_status(ctx), DF_OK);
}

static void shape_errors_in(df_ctx *ctx, const char *where, void *arg)
{
    df_tensor *a = zeros(ctx, DF_SHAPE(2, 3)), *b = zeros(ctx, DF_SHAPE(4, 3));
    expect_shape_error(ctx, df_add(ctx, a, b), where, "[2, 3]", "[4, 3]");
    a = zeros(ctx, DF_SHAPE(2, 3));
    b = zeros(ctx, DF_SHAPE(4, 3));
    expect_shape_error(ctx, df_div(ctx, b, a), where, "[4, 3]", "[2, 3]");
    a = zeros(ctx, DF_SHAPE(2, 5, 3));
    b = zeros(ctx, DF_SHAPE(4, 3));
    expect_shape_error(ctx, df_concat(ctx, a, b, 0), where, "[2, 5, 3]", "[4, 3]");
    a = zeros(ctx, DF_SHAPE(2, 5, 3));
    b = zeros(ctx, DF_SHAPE(4));
    expect_shape_error(ctx, df_layer_norm(ctx, a, b, NULL, 1e-5f), where, "[2, 5, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 5, 3));
    b = zeros(ctx, DF_SHAPE(5));
    expect_shape_error(ctx, df_rms_norm(ctx, a, b, 1e-5f), where, "[2, 5, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 6, 3));
    expect_shape_error(ctx, df_group_norm(ctx, a, 4, NULL, NULL, 1e-5f), where, "[2, 6, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(1, 2, 5, 8));
    b = zeros(ctx, DF_SHAPE(5, 3, 2));
    expect_shape_error(ctx, df_rope(ctx, a, b), where, "[1, 2, 5, 8]", "[5, 3, 2]");
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_timestep_embedding(ctx, a, 8, true, 0, 1, 10000), where, "[2, 3]",
                       NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_upsample_nearest2x(ctx, a), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_reshape(ctx, a, DF_SHAPE(4, -1)), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_expand(ctx, a, DF_SHAPE(4, 3)), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_slice(ctx, a, 1, 2, 4), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_chunk(ctx, a, 2, 1, 0), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_squeeze(ctx, a, 0), where, "[2, 3]", NULL);
    a = zeros(ctx, DF_SHAPE(2, 3));
    expect_shape_error(ctx, df_permute(ctx, a, DF_SHAPE(0, 0)), where, "[2, 3]", NULL);
}

static void test_mismatched_shapes_name_both_shapes(void **state)
{
    (void)state;
    ref_for_each_ctx(shape_errors_in, NULL);
}

static void gather_errors_in(df_ctx *ctx, const char *where, void *arg)
{
    float table[4 * 3] = {0};
    df_tensor *tab = df_tensor_from_host(ctx, F32, DF_SHAPE(4, 3), table);
    const struct {
        df_dtype dtype;
        int64_t bad;
    } cases[] = {{I64, 4}, {I32, -1}, {I64, 1000000000000}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int64_t ids64[3] = {0, cases[k].bad, 2};
        int32_t ids32[3] = {0, (int32_t)cases[k].bad, 2};
        df_tensor *ids = df_tensor_from_host(ctx, cases[k].dtype, DF_SHAPE(3),
                                             cases[k].dtype == I64 ? (void *)ids64 : (void *)ids32);
        df_tensor *r = df_gather(ctx, tab, ids);
        assert_non_null(r); /* the ids are data: only the kernel can see them */
        df_status s = df_sync(ctx);
        if (s != DF_E_ARG)
            fail_msg("%s: gather of id %lld in a table of 4 rows: %s, expected DF_E_ARG", where,
                     (long long)cases[k].bad, df_status_name(s));
        char id[32];
        snprintf(id, sizeof id, "%lld", (long long)cases[k].bad);
        const char *msg = df_error_message();
        if (!strstr(msg, id) || !strstr(msg, "4 rows"))
            fail_msg("%s: message '%s' should name id %s and the table's 4 rows", where, msg, id);
        float out[3];
        assert_int_equal(df_tensor_read(ctx, r, F32, out, sizeof out), DF_E_ARG);
        df_ctx_reset_error(ctx);
    }
    /* the context works again after the reset */
    int64_t good[2] = {3, 1};
    df_tensor *ids = df_tensor_from_host(ctx, I64, DF_SHAPE(2), good);
    float out[6];
    assert_int_equal(df_tensor_read(ctx, df_gather(ctx, tab, ids), F32, out, sizeof out), DF_OK);
}

static void test_gather_id_out_of_range_fails_the_stream(void **state)
{
    (void)state;
    ref_for_each_ctx(gather_errors_in, NULL);
}

/* An op or a view given a NULL input (the result of a failed call) returns NULL and fails
 * the context, naming the op, so that a lost error still surfaces at the next check. */
#define EXPECT_NULL_INPUT_FAILS(call)                                                              \
    do {                                                                                           \
        if ((call) != NULL)                                                                        \
            fail_msg("%s: %s with a NULL input returned a tensor", where, #call);                 \
        if (df_ctx_status(ctx) != DF_E_ARG || !strstr(df_error_message(), "NULL"))               \
            fail_msg("%s: %s with a NULL input left the context at %d", where, #call,             \
                     (int)df_ctx_status(ctx));                                                     \
        df_ctx_reset_error(ctx);                                                                   \
    } while (0)

static void null_inputs_in(df_ctx *ctx, const char *where, void *arg)
{
    df_tensor *x = zeros(ctx, DF_SHAPE(2, 4)), *n = NULL;
    df_tensor *x4 = zeros(ctx, DF_SHAPE(1, 2, 2, 4));
    int axes[1] = {2};
    EXPECT_NULL_INPUT_FAILS(df_add(ctx, n, x));
    EXPECT_NULL_INPUT_FAILS(df_add(ctx, x, n));
    EXPECT_NULL_INPUT_FAILS(df_sub(ctx, n, x));
    EXPECT_NULL_INPUT_FAILS(df_mul(ctx, x, n));
    EXPECT_NULL_INPUT_FAILS(df_div(ctx, n, n));
    EXPECT_NULL_INPUT_FAILS(df_scale(ctx, n, 1, 0));
    EXPECT_NULL_INPUT_FAILS(df_silu(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_gelu(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_gelu_tanh(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_quick_gelu(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_softmax(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_layer_norm(ctx, n, NULL, NULL, 1e-5f));
    EXPECT_NULL_INPUT_FAILS(df_rms_norm(ctx, n, NULL, 1e-5f));
    EXPECT_NULL_INPUT_FAILS(df_group_norm(ctx, n, 1, NULL, NULL, 1e-5f));
    EXPECT_NULL_INPUT_FAILS(df_timestep_embedding(ctx, n, 8, true, 0, 1, 10000));
    EXPECT_NULL_INPUT_FAILS(df_rope_table(ctx, n, axes, 1, 1e4));
    EXPECT_NULL_INPUT_FAILS(df_rope(ctx, x4, n));
    EXPECT_NULL_INPUT_FAILS(df_rope(ctx, n, x));
    EXPECT_NULL_INPUT_FAILS(df_upsample_nearest2x(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_concat(ctx, x, n, 0));
    EXPECT_NULL_INPUT_FAILS(df_concat(ctx, n, x, 0));
    EXPECT_NULL_INPUT_FAILS(df_gather(ctx, n, x));
    EXPECT_NULL_INPUT_FAILS(df_gather(ctx, x, n));
    EXPECT_NULL_INPUT_FAILS(df_cast(ctx, n, BF16));
    EXPECT_NULL_INPUT_FAILS(df_contiguous(ctx, n));
    EXPECT_NULL_INPUT_FAILS(df_reshape(ctx, n, DF_SHAPE(-1)));
    EXPECT_NULL_INPUT_FAILS(df_permute(ctx, n, DF_SHAPE(1, 0)));
    EXPECT_NULL_INPUT_FAILS(df_transpose(ctx, n, 0, 1));
    EXPECT_NULL_INPUT_FAILS(df_slice(ctx, n, 0, 0, 1));
    EXPECT_NULL_INPUT_FAILS(df_chunk(ctx, n, 2, 0, 0));
    EXPECT_NULL_INPUT_FAILS(df_expand(ctx, n, DF_SHAPE(2, 4)));
    EXPECT_NULL_INPUT_FAILS(df_unsqueeze(ctx, n, 0));
    EXPECT_NULL_INPUT_FAILS(df_squeeze(ctx, n, 0));
    (void)arg;
    assert_int_equal(df_sync(ctx), DF_OK);
}

static void test_null_inputs_give_null(void **state)
{
    (void)state;
    ref_for_each_ctx(null_inputs_in, NULL);
}

static void invalid_cast_in(df_ctx *ctx, const char *where, void *arg)
{
    (void)arg;
    df_tensor *x = zeros(ctx, DF_SHAPE(2));
    assert_null(df_cast(ctx, x, DF_DTYPE_COUNT));
    df_status s = df_sync(ctx);
    if (s != DF_E_ARG)
        fail_msg("%s: cast to dtype %d: %s, expected DF_E_ARG: %s", where, DF_DTYPE_COUNT,
                 df_status_name(s), df_error_message());
}

static void test_cast_to_an_invalid_dtype_is_an_argument_error(void **state)
{
    (void)state;
    ref_for_each_ctx(invalid_cast_in, NULL);
}

/* ---- accuracy sweep of the activations ------------------------------------------------------ */

/* Error of got against want in units of the f32 spacing at want. */
static double ulps(double got, double want)
{
    if (got == want)
        return 0;
    double w = fabs(want) < 0x1p-126 ? 0x1p-126 : fabs(want);
    return fabs(got - want) / ldexp(1.0, ilogb(w) - 23);
}

static void sweep_in(df_ctx *ctx, const char *where, void *arg)
{
    enum { N = 400001 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    assert_non_null(x);
    assert_non_null(y);
    for (int i = 0; i < N; i++)
        x[i] = (float)(-40.0 + 80.0 * i / (N - 1));
    df_tensor *xt = df_tensor_from_host(ctx, F32, DF_SHAPE(N), x);
    static const char *const names[] = {"scale", "silu", "gelu", "gelu_tanh", "quick_gelu"};
    for (int kind = 1; kind <= 4; kind++) {
        op_case c = {.i = {kind}};
        df_tensor *in[1] = {xt};
        assert_int_equal(df_tensor_read(ctx, run_unary(ctx, &c, in), F32, y, N * sizeof *y), DF_OK);
        /* Where the result is well conditioned (x >= 0, or |x| <= 1) every form must be
         * within a few ulps; silu everywhere. For x < -1 the tanh, erf and 1.702 forms
         * lose relative accuracy to the f32 rounding of their argument (as torch's f32
         * math does), so there only an absolute bound applies. */
        double worst_core = 0, worst_neg = 0, worst_abs = 0;
        for (int i = 0; i < N; i++) {
            double want = act_ref(kind, x[i], 0, 0);
            if (x[i] >= -1 || kind == 1)
                worst_core = fmax(worst_core, ulps(y[i], want));
            else if (x[i] >= -3)
                worst_neg = fmax(worst_neg, ulps(y[i], want));
            worst_abs = fmax(worst_abs, fabs(y[i] - want));
        }
        print_message("%s %s: worst %.2f ulp (x >= -1%s), %.2f ulp on [-3, -1), worst "
                      "absolute error %.3g over [-40, 40]\n",
                      where, names[kind], worst_core, kind == 1 ? " and below" : "", worst_neg,
                      worst_abs);
        /* the CPU's kernels within 4 ulps; a device with its own f32 exp (vulkan) within 64 */
        assert_true(worst_core <= (ref_current->cpu_kernels ? 4.0 : 64.0));
        assert_true(worst_abs <= 2e-6);
    }
    /* specials: silu(-inf) = -0 or 0, silu(inf) = inf, NaN stays NaN */
    float sp[4] = {-INFINITY, INFINITY, NAN, 0.0f}, so[4];
    df_tensor *st = df_tensor_from_host(ctx, F32, DF_SHAPE(4), sp);
    assert_int_equal(df_tensor_read(ctx, df_silu(ctx, st), F32, so, sizeof so), DF_OK);
    assert_true(so[0] == 0.0f && isinf(so[1]) && so[1] > 0 && isnan(so[2]) && so[3] == 0.0f);
    free(x);
    free(y);
}

static void test_activation_accuracy_sweep(void **state)
{
    (void)state;
    ref_for_each_ctx(sweep_in, NULL);
}

int main(void)
{
    ref_print_modes("test_ops");
    int failed = ref_run_table("op table", cases, sizeof cases / sizeof *cases);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mismatched_shapes_name_both_shapes),
        cmocka_unit_test(test_gather_id_out_of_range_fails_the_stream),
        cmocka_unit_test(test_null_inputs_give_null),
        cmocka_unit_test(test_cast_to_an_invalid_dtype_is_an_argument_error),
        cmocka_unit_test(test_activation_accuracy_sweep),
    };
    failed += cmocka_run_group_tests_name("op errors and accuracy", tests, NULL, NULL);
    return failed ? 1 : 0;
}
