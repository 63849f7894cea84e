/*
 * Random graphs of the ops FLUX and SD3 blocks are made of, run in strict eager, in
 * defer-and-fuse and as a compiled module (trace, then replay), in f32 and bf16 compute, at
 * batch 1 and 2. Whatever the planner does with them (fused chains, folded activations, RMS
 * norm + RoPE, concats written in place, bf16 operands, the shared arena) the results must
 * be strict eager's: to f32 rounding in f32, to bf16 rounding in bf16.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/compile.h>
#include <diffuse/diffuse.h>

enum { H = 2, DH = 8, D = H * DH, S1 = 5, S2 = 7, STEPS = 14, POOL = 64, SEEDS = 30 };

/* The graph's inputs and parameters, made in each context from the same host data. */
typedef struct world {
    df_tensor *x1, *x2;     /* [B, S1, D], [B, S2, D] */
    df_tensor *w, *w2;      /* [D, D], [D, 2D] */
    df_tensor *bias, *mod;  /* [D], [D] */
    df_tensor *head_w;      /* [DH]: per-head RMS norm weight */
    df_tensor *gate;        /* [B, 1, D]: an AdaLN gate, one row per sample */
    df_tensor *table[3];    /* RoPE tables [S, DH/2, 2] for S1, S2 and S1 + S2 */
} world;

static void fill(float *v, int n, float scale, float phase)
{
    for (int i = 0; i < n; i++)
        v[i] = scale * sinf(0.61f * (float)i + phase);
}

static world make_world(df_ctx *ctx, int64_t B)
{
    static float x1[2 * S1 * D], x2[2 * S2 * D], w[D * D], w2[D * 2 * D], bias[D], mod[D],
        hw[DH], gate[2 * D], table[(S1 + S2) * DH];
    fill(x1, 2 * S1 * D, 1.5f, 0.1f);
    fill(x2, 2 * S2 * D, -2.0f, 0.7f);
    fill(w, D * D, 0.3f, 0.2f);
    fill(w2, D * 2 * D, 0.2f, 1.1f);
    fill(bias, D, 0.1f, 0.4f);
    fill(mod, D, 0.5f, 2.0f);
    fill(hw, DH, 0.8f, 0.9f);
    fill(gate, 2 * D, 1.2f, 0.3f);
    world wd = {
        .x1 = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S1, D), x1),
        .x2 = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, S2, D), x2),
        .w = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D, D), w),
        .w2 = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D, 2 * D), w2),
        .bias = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D), bias),
        .mod = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(D), mod),
        .head_w = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(DH), hw),
        .gate = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(B, 1, D), gate),
    };
    const int64_t seqs[3] = {S1, S2, S1 + S2};
    for (int k = 0; k < 3; k++) {
        for (int64_t s = 0; s < seqs[k]; s++)
            for (int i = 0; i < DH / 2; i++) {
                table[s * DH + 2 * i] = cosf(0.2f * (float)((s + k) * (i + 1)));
                table[s * DH + 2 * i + 1] = sinf(0.2f * (float)((s + k) * (i + 1)));
            }
        wd.table[k] = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(seqs[k], DH / 2, 2), table);
    }
    return wd;
}

typedef struct rng {
    uint64_t s;
} rng;

static uint32_t next(rng *r)
{
    r->s = r->s * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(r->s >> 33);
}

typedef struct pool {
    df_tensor *t[POOL];
    int n;
} pool;

static int64_t seq_of(df_tensor *t)
{
    return df_tensor_dim(t, 1);
}

/* A [B, S, D] tensor of the pool with sequence length s (0: any), or NULL. */
static df_tensor *pick(pool *p, rng *r, int64_t s)
{
    for (int tries = 0; tries < 16; tries++) {
        df_tensor *t = p->t[next(r) % (uint32_t)p->n];
        if (!s || seq_of(t) == s)
            return t;
    }
    return NULL;
}

static df_tensor *linear(df_ctx *ctx, df_tensor *x, df_tensor *w, df_tensor *bias)
{
    return df_linear(ctx, x, &(df_linear_weights){.weight = w, .bias = bias});
}

/* [B, S, D] -> [B, S, H, DH] */
static df_tensor *heads(df_ctx *ctx, df_tensor *t)
{
    return df_reshape(ctx, t, DF_SHAPE(df_tensor_dim(t, 0), seq_of(t), H, DH));
}

/* [B, S, H, DH] -> [B, H, S, DH] (a view) */
static df_tensor *heads_first(df_ctx *ctx, df_tensor *t)
{
    return df_permute(ctx, t, DF_SHAPE(0, 2, 1, 3));
}

/* Attention output [B, H, S, DH] -> [B, S, D] */
static df_tensor *merge(df_ctx *ctx, df_tensor *o)
{
    return df_reshape(ctx, df_transpose(ctx, o, 1, 2),
                      DF_SHAPE(df_tensor_dim(o, 0), df_tensor_dim(o, 2), D));
}

static df_tensor *table_for(const world *w, int64_t s)
{
    return s == S1 ? w->table[0] : s == S2 ? w->table[1] : w->table[2];
}

/* Attention of one sequence: q, k RMS-normed per head, RoPE or not. */
static df_tensor *self_attention(df_ctx *ctx, const world *w, rng *r, df_tensor *a)
{
    bool rope = next(r) % 2;
    df_tensor *q = df_rms_norm(ctx, heads(ctx, linear(ctx, a, w->w, NULL)), w->head_w, 1e-6f);
    df_tensor *k = df_rms_norm(ctx, heads(ctx, linear(ctx, a, w->w, w->bias)), NULL, 1e-6f);
    df_tensor *v = heads_first(ctx, heads(ctx, linear(ctx, a, w->w, NULL)));
    q = heads_first(ctx, q);
    k = heads_first(ctx, k);
    if (rope) {
        q = df_rope(ctx, q, table_for(w, seq_of(a)));
        k = df_rope(ctx, k, table_for(w, seq_of(a)));
    }
    return merge(ctx, df_attention(ctx, q, k, v, NULL, false, 0.0f));
}

/* Joint attention of two streams, joined along the sequence (a FLUX double block). */
static df_tensor *joint_attention(df_ctx *ctx, const world *w, df_tensor *c, df_tensor *x)
{
    df_tensor *qkv[3];
    for (int i = 0; i < 3; i++) {
        df_tensor *u = heads(ctx, linear(ctx, c, w->w, NULL));
        df_tensor *v = heads(ctx, linear(ctx, x, w->w, w->bias));
        if (i < 2) {
            u = df_rms_norm(ctx, u, w->head_w, 1e-6f);
            v = df_rms_norm(ctx, v, NULL, 1e-6f);
        }
        df_tensor *j = heads_first(ctx, df_concat(ctx, u, v, 1));
        qkv[i] = i < 2 ? df_rope(ctx, j, w->table[2]) : j;
    }
    return merge(ctx, df_attention(ctx, qkv[0], qkv[1], qkv[2], NULL, false, 0.0f));
}

/* The random graph of `seed` over world w; its two results (the last two it made). */
static void build(df_ctx *ctx, const world *w, uint32_t seed, df_tensor **out)
{
    rng r = {seed * 2654435761u + 12345u};
    pool p = {{w->x1, w->x2}, 2};
    for (int step = 0; step < STEPS; step++) {
        df_tensor *a = pick(&p, &r, 0), *b, *c, *y = NULL;
        switch (next(&r) % 9) {
        case 0: /* a binary pointwise op */
            if ((b = pick(&p, &r, seq_of(a))))
                y = next(&r) % 2 ? df_add(ctx, a, b) : df_mul(ctx, a, b);
            break;
        case 1: /* a unary one */
            y = next(&r) % 3 == 0 ? df_scale(ctx, a, 0.5f, 0.25f)
                : next(&r) % 2    ? df_silu(ctx, a)
                                  : df_gelu_tanh(ctx, a);
            break;
        case 2: /* a product, maybe with an activation to fold */
            y = linear(ctx, a, w->w, next(&r) % 2 ? w->bias : NULL);
            if (next(&r) % 2)
                y = df_gelu_tanh(ctx, y);
            break;
        case 3: /* a norm with AdaLN-style modulation, or an RMS norm */
            y = next(&r) % 2
                    ? df_add(ctx, df_mul(ctx, df_layer_norm(ctx, a, NULL, NULL, 1e-6f), w->mod),
                             w->mod)
                    : df_rms_norm(ctx, a, w->mod, 1e-6f);
            break;
        case 4: /* the two streams joined along the sequence */
            if ((b = pick(&p, &r, S1)) && (c = pick(&p, &r, S2)))
                y = df_concat(ctx, b, c, 1);
            break;
        case 5: /* two branches side by side into one product (a FLUX single block): fresh
                 * results (written in place) or ones the pool holds (copied) */
            if ((b = pick(&p, &r, seq_of(a)))) {
                uint32_t how = next(&r);
                df_tensor *left = how % 3 == 0   ? a
                                  : how % 3 == 1 ? linear(ctx, a, w->w, NULL)
                                                 : self_attention(ctx, w, &r, a);
                df_tensor *right = how / 3 % 2 ? b : df_gelu_tanh(ctx, linear(ctx, b, w->w, w->bias));
                y = linear(ctx, df_concat(ctx, left, right, 2), w->w2, NULL);
            }
            break;
        case 6:
            y = self_attention(ctx, w, &r, a);
            if (next(&r) % 2)
                y = linear(ctx, y, w->w, w->bias);
            break;
        case 7:
            if ((b = pick(&p, &r, S1)) && (c = pick(&p, &r, S2)))
                y = joint_attention(ctx, w, b, c);
            break;
        default: { /* a gated residual, x + gate * linear(h), operands in either order */
            uint32_t how = next(&r);
            df_tensor *g = how % 2 ? w->mod : w->gate; /* one row, or one per sample */
            if (!(b = pick(&p, &r, seq_of(a))))
                break;
            df_tensor *h = linear(ctx, b, w->w, how / 2 % 2 ? w->bias : NULL);
            df_tensor *gh = how / 4 % 2 ? df_mul(ctx, g, h) : df_mul(ctx, h, g);
            y = how / 8 % 2 ? df_add(ctx, a, gh) : df_add(ctx, gh, a);
            break;
        }
        }
        if (y && p.n < POOL)
            p.t[p.n++] = y;
    }
    out[0] = p.t[p.n - 1];
    out[1] = p.t[p.n - 2];
}

typedef struct program {
    const world *w;
    uint32_t seed;
} program;

static df_status program_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    (void)in;
    const program *pr = self;
    build(ctx, pr->w, pr->seed, out);
    return df_ctx_status(ctx);
}

typedef struct result {
    float *v[2];
    int64_t n[2];
} result;

static void read_out(df_ctx *ctx, df_tensor **out, result *res)
{
    for (int j = 0; j < 2; j++) {
        res->n[j] = df_tensor_numel(out[j]);
        res->v[j] = malloc((size_t)res->n[j] * sizeof(float));
        assert_non_null(res->v[j]);
        if (df_tensor_read(ctx, out[j], DF_DTYPE_F32, res->v[j], (size_t)res->n[j] * 4) != DF_OK)
            fail_msg("read failed: %s", df_error_message());
    }
}

/* mode 0: strict eager, 1: defer-and-fuse, 2: compiled (the replay, after the trace). */
static result run(int mode, df_dtype compute, int64_t B, uint32_t seed)
{
    df_ctx *ctx;
    df_eager_mode em = mode == 0 ? DF_DEFER_NEVER : DF_DEFER_AND_FUSE;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .mode = em, .compute = compute},
                                   &ctx),
                     DF_OK);
    world w = make_world(ctx, B);
    result res = {0};
    df_tensor *out[2];
    if (mode < 2) {
        df_scope mark = df_scope_begin(ctx);
        build(ctx, &w, seed, out);
        df_scope_end_n(ctx, mark, out, 2); /* only the results stay visible */
        read_out(ctx, out, &res);
    } else {
        static const df_module m = {.name = "random", .n_in = 0, .n_out = 2,
                                    .forward = program_forward};
        program pr = {&w, seed};
        df_compiled *c;
        assert_int_equal(df_compile(&m, &(df_compile_opts){.fullgraph = true}, &c), DF_OK);
        for (int call = 0; call < 2; call++) {
            if (df_compiled_call(ctx, c, &pr, NULL, out) != DF_OK)
                fail_msg("seed %u: compiled call %d: %s", seed, call, df_error_message());
        }
        read_out(ctx, out, &res);
        df_compiled_free(c);
    }
    df_ctx_free(ctx);
    return res;
}

static double rel_l2(const float *got, const float *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) != isnan(want[i]))
            return INFINITY;
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static void free_result(result *r)
{
    free(r->v[0]);
    free(r->v[1]);
}

static void test_random_graphs_match_strict_eager(void **state)
{
    (void)state;
    const df_dtype dtypes[2] = {DF_DTYPE_F32, DF_DTYPE_BF16};
    double worst[2] = {0, 0};
    for (uint32_t seed = 0; seed < SEEDS; seed++)
        for (int di = 0; di < 2; di++)
            for (int64_t B = 1; B <= 2; B++) {
                result want = run(0, dtypes[di], B, seed);
                for (int mode = 1; mode <= 2; mode++) {
                    result got = run(mode, dtypes[di], B, seed);
                    for (int j = 0; j < 2; j++) {
                        assert_int_equal(got.n[j], want.n[j]);
                        double e = rel_l2(got.v[j], want.v[j], want.n[j]);
                        worst[di] = e > worst[di] ? e : worst[di];
                        /* f32: rounding; bf16: an activation folded into a product is the
                         * provider's, rounded to bf16 once more than in eager */
                        double limit = di == 0 ? 1e-5 : 1e-2;
                        if (!(e <= limit))
                            fail_msg("seed %u, %s, batch %lld, %s: result %d rel-L2 %.3g > %.0e",
                                     seed, df_dtype_name(dtypes[di]), (long long)B,
                                     mode == 1 ? "defer-and-fuse" : "compiled", j, e, limit);
                    }
                    free_result(&got);
                }
                free_result(&want);
            }
    printf("worst rel-L2 against strict eager: f32 %.3g, bf16 %.3g\n", worst[0], worst[1]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_graphs_match_strict_eager),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
