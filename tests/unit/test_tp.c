/*
 * Tensor parallelism with the in-process thread communicator (no mpirun needed): every rank
 * is a thread with its own context, the ranks of one df_comm_create_threads group.
 *
 * - Parity: the flux-transformer golden case on 1 and 2 ranks, in strict eager, in defer
 *   and fuse, and with compiled repeated blocks (eager and fuse); the te-t5 case on 1 and 2
 *   ranks (4 heads as 2 + 2), with and without the padding mask. The 2-rank outputs must be
 *   bit-identical on both ranks, within relative L2 1e-5 of the 1-rank output, and both
 *   within the case's own tolerance of the float64 reference.
 * - Bytes: each rank's df_stats weight_bytes_read equals its share computed here from the
 *   checkpoint's header (sharded tensors / N + replicated ones, rowwise biases on rank 0
 *   only), and stays within (1/N) x sharded + replicated + 1%.
 * - The sharded binding itself (loader.h) against slices read through df_weights: colwise
 *   rows wrap the mapping, rowwise columns and packed blocks are copies, rowwise biases live
 *   on rank 0, sizes not divisible by N are DF_E_ARG.
 * - The whole FluxPipeline (t2i-flux-schnell-seed42: prompt, seed, 4 steps) on 2 ranks given
 *   through df_load_opts.comm, the prompt on rank 0 only: the same image as 1 rank and the
 *   reference; rank 1 gets the same final latents and no image.
 * - Head counts not divisible by N are clear errors; df_comm_agree carries the failing
 *   rank's message; df_comm_abort wakes a rank waiting in a collective.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "core/status.h"
#include "models/loader.h"
#include "runtime/runtime.h" /* df_tensor's storage: was a slice wrapped or copied */

#define FLUX_CASE  DF_GOLDEN_DIR "/flux-transformer"
#define FLUX_MODEL FLUX_CASE "/model"
#define T5_CASE    DF_GOLDEN_DIR "/te-t5"
#define T5_MODEL   T5_CASE "/text_encoder_2"

enum { MAX_RANKS = 4 };

/* ---- golden inputs (host copies shared by the ranks) ------------------------------------ */

typedef struct host_tensor {
    void *data; /* malloc'd, f32 or i64 */
    int64_t shape[8];
    int ndim;
    int64_t numel;
} host_tensor;

static host_tensor read_tensor(const char *case_dir, const char *name, df_dtype as)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/case.safetensors", case_dir);
    df_safetensors *st = NULL;
    if (df_safetensors_open(path, &st) != DF_OK)
        fail_msg("%s", df_error_message());
    df_tensor_info info;
    assert_int_equal(df_safetensors_find(st, name, &info), DF_OK);
    host_tensor t = {.ndim = info.ndim, .numel = info.numel};
    memcpy(t.shape, info.shape, sizeof t.shape);
    size_t bytes = (size_t)info.numel * df_dtype_size(as);
    t.data = malloc(bytes + 1);
    assert_int_equal(df_safetensors_read(st, name, as, t.data, bytes), DF_OK);
    df_safetensors_free(st);
    return t;
}

/* The case's tolerance for `output`. */
static void tolerance(const char *case_dir, const char *output, double *max_abs, double *rel_l2)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/case.json", case_dir);
    df_json *root = NULL;
    assert_int_equal(df_json_parse_file(path, &root), DF_OK);
    const df_json *tol = df_json_get(df_json_get(root, "tolerance"), output);
    assert_int_equal(df_json_get_double(tol, "max_abs", max_abs), DF_OK);
    assert_int_equal(df_json_get_double(tol, "rel_l2", rel_l2), DF_OK);
    df_json_free(root);
}

static df_tensor *upload(df_ctx *ctx, const host_tensor *t, df_dtype dt)
{
    return df_tensor_from_host(ctx, dt, t->shape, t->ndim, t->data);
}

/* ---- one rank ----------------------------------------------------------------------------- */

typedef enum model_kind { FLUX, T5 } model_kind;

typedef struct job {
    /* in */
    df_comm *comm;
    model_kind model;
    df_eager_mode mode;
    bool blocks;           /* compiled repeated blocks (FLUX) */
    const host_tensor *in; /* FLUX: hidden, encoder, pooled, timestep, img_ids, txt_ids;
                              T5: input_ids, attention_mask */
    /* out */
    df_status s;
    char msg[512];
    float *out[2]; /* FLUX: sample; T5: plain, masked */
    int64_t n;
    int64_t bytes_read;
} job;

static df_status read_out(df_ctx *ctx, df_tensor *t, float **out, int64_t *n)
{
    if (!t)
        return df_sync(ctx) != DF_OK ? df_ctx_status(ctx) : DF_E_INTERNAL;
    *n = df_tensor_numel(t);
    *out = malloc((size_t)*n * sizeof **out);
    return df_tensor_read(ctx, t, DF_DTYPE_F32, *out, (size_t)*n * sizeof **out);
}

static df_status run_flux(df_ctx *ctx, job *j)
{
    df_flux *m = NULL;
    DF_TRY(df_flux_load(ctx, FLUX_MODEL, &m));
    df_stats st;
    df_ctx_stats(ctx, &st);
    j->bytes_read = st.weight_bytes_read;
    df_status s = j->blocks ? df_flux_compile_repeated_blocks(m, NULL) : DF_OK;
    const host_tensor *in = j->in;
    df_flux_inputs fi = {
        .hidden_states = upload(ctx, &in[0], DF_DTYPE_F32),
        .encoder_hidden_states = upload(ctx, &in[1], DF_DTYPE_F32),
        .pooled_projections = upload(ctx, &in[2], DF_DTYPE_F32),
        .timestep = upload(ctx, &in[3], DF_DTYPE_F32),
        .img_ids = upload(ctx, &in[4], DF_DTYPE_F32),
        .txt_ids = upload(ctx, &in[5], DF_DTYPE_F32),
    };
    for (int rep = 0; s == DF_OK && rep < (j->blocks ? 2 : 1); rep++) { /* blocks: replay too */
        free(j->out[0]);
        j->out[0] = NULL;
        s = read_out(ctx, df_flux_forward(ctx, m, &fi), &j->out[0], &j->n);
    }
    if (s == DF_OK && j->blocks && df_flux_compiled_programs(m) != 2)
        s = df_errorf(DF_E_INTERNAL, "expected 2 compiled block programs, found %d",
                      df_flux_compiled_programs(m));
    df_flux_free(m);
    return s;
}

static df_status run_t5(df_ctx *ctx, job *j)
{
    df_t5 *m = NULL;
    DF_TRY(df_t5_load(ctx, T5_MODEL, &m));
    df_stats st;
    df_ctx_stats(ctx, &st);
    j->bytes_read = st.weight_bytes_read;
    df_tensor *ids = upload(ctx, &j->in[0], DF_DTYPE_I64);
    df_tensor *mask = upload(ctx, &j->in[1], DF_DTYPE_I64);
    df_tensor *plain = NULL, *masked = NULL;
    df_status s = df_t5_encode(ctx, m, ids, NULL, &plain);
    if (s == DF_OK)
        s = read_out(ctx, plain, &j->out[0], &j->n);
    if (s == DF_OK)
        s = df_t5_encode(ctx, m, ids, mask, &masked);
    if (s == DF_OK)
        s = read_out(ctx, masked, &j->out[1], &j->n);
    df_t5_free(m);
    return s;
}

static void *rank_main(void *arg)
{
    job *j = arg;
    df_ctx *ctx = NULL;
    j->s = df_ctx_create(&(df_ctx_opts){.threads = 1, .mode = j->mode}, &ctx);
    if (j->s == DF_OK) {
        df_ctx_set_comm(ctx, j->comm);
        j->s = j->model == FLUX ? run_flux(ctx, j) : run_t5(ctx, j);
    }
    if (j->s != DF_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
        df_comm_abort(j->comm); /* never leave the other ranks waiting */
    }
    df_ctx_free(ctx);
    return NULL;
}

/* Runs `n` ranks of `proto` (one thread each); jobs[r] hold the results. */
static void run_ranks(int n, const job *proto, job *jobs)
{
    df_comm *comms[MAX_RANKS];
    assert_int_equal(df_comm_create_threads(n, comms), DF_OK);
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = *proto;
        jobs[r].comm = comms[r];
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        df_comm_free(comms[r]);
}

static void free_jobs(job *jobs, int n)
{
    for (int r = 0; r < n; r++) {
        free(jobs[r].out[0]);
        free(jobs[r].out[1]);
    }
}

/* ---- comparisons -------------------------------------------------------------------------- */

static double rel_l2_f32(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Asserts got is within the tolerance of the f64 reference; prints the errors. */
static void check_reference(const char *what, const float *got, const double *ref, int64_t n,
                            double max_abs, double rel_l2)
{
    double num = 0, den = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        mx = isnan(got[i]) ? INFINITY : fmax(mx, fabs(d));
    }
    double rl = sqrt(num / den);
    printf("  %-34s vs reference: max-abs %.3g (limit %.3g), rel-L2 %.3g (limit %.3g)\n", what, mx,
           max_abs, rl, rel_l2);
    assert_true(mx <= max_abs);
    assert_true(rl <= rel_l2);
}

/* ---- FLUX parity -------------------------------------------------------------------------- */

static void flux_parity(df_eager_mode mode, bool blocks, const char *label)
{
    static const char *const names[6] = {"in.hidden_states",
                                         "in.encoder_hidden_states",
                                         "in.pooled_projections",
                                         "in.timestep",
                                         "in.img_ids",
                                         "in.txt_ids"};
    host_tensor in[6];
    for (int i = 0; i < 6; i++)
        in[i] = read_tensor(FLUX_CASE, names[i], DF_DTYPE_F32);
    host_tensor ref = read_tensor(FLUX_CASE, "out.sample", DF_DTYPE_F64);
    double max_abs, rel_l2;
    tolerance(FLUX_CASE, "sample", &max_abs, &rel_l2);

    job proto = {.model = FLUX, .mode = mode, .blocks = blocks, .in = in};
    job one[1], two[2];
    run_ranks(1, &proto, one);
    run_ranks(2, &proto, two);
    for (int r = 0; r < 2; r++)
        if (two[r].s != DF_OK)
            fail_msg("rank %d of 2: %s", r, two[r].msg);
    if (one[0].s != DF_OK)
        fail_msg("1 rank: %s", one[0].msg);
    assert_int_equal(one[0].n, ref.numel);
    assert_int_equal(two[0].n, ref.numel);
    assert_memory_equal(two[0].out[0], two[1].out[0], (size_t)ref.numel * sizeof(float));
    double d = rel_l2_f32(two[0].out[0], one[0].out[0], ref.numel);
    printf("flux-transformer %s: 2 ranks vs 1 rank rel-L2 %.3g (limit 1e-5)\n", label, d);
    assert_true(d <= 1e-5);
    check_reference("1 rank", one[0].out[0], ref.data, ref.numel, max_abs, rel_l2);
    check_reference("2 ranks", two[0].out[0], ref.data, ref.numel, max_abs, rel_l2);

    free_jobs(one, 1);
    free_jobs(two, 2);
    for (int i = 0; i < 6; i++)
        free(in[i].data);
    free(ref.data);
}

static void test_flux_two_ranks_eager(void **state)
{
    (void)state;
    flux_parity(DF_DEFER_NEVER, false, "eager");
}

static void test_flux_two_ranks_fuse(void **state)
{
    (void)state;
    flux_parity(DF_DEFER_AND_FUSE, false, "fuse");
}

static void test_flux_two_ranks_compiled_blocks(void **state)
{
    (void)state;
    flux_parity(DF_DEFER_NEVER, true, "compiled blocks");
}

static void test_flux_two_ranks_compiled_blocks_fuse(void **state)
{
    (void)state;
    flux_parity(DF_DEFER_AND_FUSE, true, "compiled blocks + fuse");
}

/* ---- T5 parity ---------------------------------------------------------------------------- */

static void test_t5_two_ranks(void **state)
{
    (void)state;
    host_tensor in[2] = {read_tensor(T5_CASE, "in.input_ids", DF_DTYPE_I64),
                         read_tensor(T5_CASE, "in.attention_mask", DF_DTYPE_I64)};
    static const char *const outs[2] = {"last_hidden_state", "last_hidden_state_masked"};
    job proto = {.model = T5, .mode = DF_DEFER_NEVER, .in = in};
    job one[1], two[2];
    run_ranks(1, &proto, one);
    run_ranks(2, &proto, two);
    for (int r = 0; r < 2; r++)
        if (two[r].s != DF_OK)
            fail_msg("rank %d of 2: %s", r, two[r].msg);
    if (one[0].s != DF_OK)
        fail_msg("1 rank: %s", one[0].msg);
    for (int o = 0; o < 2; o++) {
        char name[64];
        snprintf(name, sizeof name, "out.%s", outs[o]);
        host_tensor ref = read_tensor(T5_CASE, name, DF_DTYPE_F64);
        double max_abs, rel_l2;
        tolerance(T5_CASE, outs[o], &max_abs, &rel_l2);
        assert_int_equal(two[0].n, ref.numel);
        assert_memory_equal(two[0].out[o], two[1].out[o], (size_t)ref.numel * sizeof(float));
        double d = rel_l2_f32(two[0].out[o], one[0].out[o], ref.numel);
        printf("te-t5 %s: 2 ranks vs 1 rank rel-L2 %.3g (limit 1e-5)\n", outs[o], d);
        assert_true(d <= 1e-5);
        check_reference("1 rank", one[0].out[o], ref.data, ref.numel, max_abs, rel_l2);
        check_reference("2 ranks", two[0].out[o], ref.data, ref.numel, max_abs, rel_l2);
        free(ref.data);
    }
    free_jobs(one, 1);
    free_jobs(two, 2);
    free(in[0].data);
    free(in[1].data);
}

/* ---- bytes read per rank ------------------------------------------------------------------ */

/* How the plan treats a tensor, decided here from its name alone. */
typedef enum share { REPLICATED, SHARDED, ROWWISE_BIAS } share;

static bool in_list(const char *s, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(s, *list) == 0)
            return true;
    return false;
}

/* "prefix.<digits>.rest" -> rest, or NULL. */
static const char *after_block(const char *name, const char *prefix)
{
    size_t n = strlen(prefix);
    if (strncmp(name, prefix, n) != 0 || name[n] < '0' || name[n] > '9')
        return NULL;
    const char *p = name + n;
    while (*p >= '0' && *p <= '9')
        p++;
    return *p == '.' ? p + 1 : NULL;
}

static share classify(const char *name, const char *const *col, const char *const *row,
                      const char *prefix1, const char *prefix2)
{
    const char *rest = after_block(name, prefix1);
    if (!rest && prefix2)
        rest = after_block(name, prefix2);
    if (!rest)
        return REPLICATED;
    char module[256];
    snprintf(module, sizeof module, "%s", rest);
    char *dot = strrchr(module, '.');
    bool is_bias = dot && strcmp(dot, ".bias") == 0;
    if (dot)
        *dot = '\0';
    if (in_list(module, col))
        return SHARDED;
    if (in_list(module, row))
        return is_bias ? ROWWISE_BIAS : SHARDED;
    return REPLICATED;
}

static share flux_share(const char *name)
{
    /* FluxTransformer2DModel._tp_plan, block-relative; single-block names share the list
     * (to_q/k/v colwise, proj_mlp colwise, proj_out rowwise). */
    static const char *const col[] = {"attn.to_q",       "attn.to_k",
                                      "attn.to_v",       "attn.add_q_proj",
                                      "attn.add_k_proj", "attn.add_v_proj",
                                      "ff.net.0.proj",   "ff_context.net.0.proj",
                                      "proj_mlp",        NULL};
    static const char *const row[] = {"attn.to_out.0",    "attn.to_add_out", "ff.net.2",
                                      "ff_context.net.2", "proj_out",        NULL};
    return classify(name, col, row, "transformer_blocks.", "single_transformer_blocks.");
}

static share t5_share(const char *name)
{
    static const char *const col[] = {"layer.0.SelfAttention.q",
                                      "layer.0.SelfAttention.k",
                                      "layer.0.SelfAttention.v",
                                      "layer.0.SelfAttention.relative_attention_bias",
                                      "layer.1.DenseReluDense.wi_0",
                                      "layer.1.DenseReluDense.wi_1",
                                      NULL};
    static const char *const row[] = {"layer.0.SelfAttention.o", "layer.1.DenseReluDense.wo", NULL};
    return classify(name, col, row, "encoder.block.", NULL);
}

/* Bytes of the checkpoint in `dir` by share. */
static void checkpoint_bytes(const char *dir, share (*fn)(const char *), int64_t bytes[3])
{
    df_weights *w = NULL;
    assert_int_equal(df_weights_open(dir, &w), DF_OK);
    bytes[0] = bytes[1] = bytes[2] = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        assert_int_equal(df_weights_at(w, i, &info), DF_OK);
        bytes[fn(info.name)] += (int64_t)info.nbytes;
    }
    df_weights_free(w);
}

/* `min_split`: the least share of the checkpoint the plan must split. */
static void check_bytes(const char *what, const char *dir, model_kind model,
                        share (*fn)(const char *), const job *proto_in, double min_split)
{
    int64_t b[3];
    checkpoint_bytes(dir, fn, b);
    int64_t total = b[REPLICATED] + b[SHARDED] + b[ROWWISE_BIAS];
    assert_true((double)b[SHARDED] >= min_split * (double)total);
    for (int n = 1; n <= 2; n++) {
        job proto = *proto_in, jobs[2];
        proto.model = model;
        run_ranks(n, &proto, jobs);
        for (int r = 0; r < n; r++) {
            if (jobs[r].s != DF_OK)
                fail_msg("rank %d of %d: %s", r, n, jobs[r].msg);
            int64_t want = b[SHARDED] / n + b[REPLICATED] + (r == 0 ? b[ROWWISE_BIAS] : 0);
            double bound = (double)b[SHARDED] / n + (double)(b[REPLICATED] + b[ROWWISE_BIAS]) +
                           0.01 * (double)total;
            printf("%s: rank %d of %d read %lld weight bytes (share %lld, bound %.0f, whole "
                   "model %lld)\n",
                   what, r, n, (long long)jobs[r].bytes_read, (long long)want, bound,
                   (long long)total);
            assert_int_equal(jobs[r].bytes_read, want);
            assert_true((double)jobs[r].bytes_read <= bound);
        }
        free_jobs(jobs, n);
    }
}

static void test_bytes_read_per_rank(void **state)
{
    (void)state;
    static const char *const names[6] = {"in.hidden_states",
                                         "in.encoder_hidden_states",
                                         "in.pooled_projections",
                                         "in.timestep",
                                         "in.img_ids",
                                         "in.txt_ids"};
    host_tensor in[6];
    for (int i = 0; i < 6; i++)
        in[i] = read_tensor(FLUX_CASE, names[i], DF_DTYPE_F32);
    check_bytes("flux-transformer", FLUX_MODEL, FLUX, flux_share, &(job){.in = in}, 0.5);
    for (int i = 0; i < 6; i++)
        free(in[i].data);
    host_tensor t5in[2] = {read_tensor(T5_CASE, "in.input_ids", DF_DTYPE_I64),
                           read_tensor(T5_CASE, "in.attention_mask", DF_DTYPE_I64)};
    /* the tiny T5's 4224-row embedding (replicated) is two thirds of it */
    check_bytes("te-t5", T5_MODEL, T5, t5_share, &(job){.in = t5in}, 0.25);
    free(t5in[0].data);
    free(t5in[1].data);
}

/* ---- the sharded binding ------------------------------------------------------------------ */

/* The f32 values of tensor `name` of the golden FLUX checkpoint, whole. */
static float *whole(const char *name, int64_t *rows, int64_t *cols)
{
    df_weights *w = NULL;
    assert_int_equal(df_weights_open(FLUX_MODEL, &w), DF_OK);
    df_tensor_info info;
    assert_int_equal(df_weights_find(w, name, &info), DF_OK);
    *rows = info.shape[0];
    *cols = info.ndim > 1 ? info.shape[1] : 1;
    float *v = malloc((size_t)info.numel * sizeof *v);
    assert_int_equal(df_weights_read(w, name, DF_DTYPE_F32, v, (size_t)info.numel * sizeof *v),
                     DF_OK);
    df_weights_free(w);
    return v;
}

static float *values(df_ctx *ctx, df_tensor *t)
{
    int64_t n = df_tensor_numel(t);
    float *v = malloc((size_t)n * sizeof *v);
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, v, (size_t)n * sizeof *v), DF_OK);
    return v;
}

static void test_sharded_linear_slices(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_weight_set *ws = NULL;
    assert_int_equal(df_weight_set_open(ctx, FLUX_MODEL, "transformer", &ws), DF_OK);
    int64_t D = 32, R, C;

    /* colwise, rank 1 of 2: rows [16, 32) and bias[16:32], wrapping the mapping */
    df_linear_weights l;
    df_shard col = {.style = DF_SHARD_COLWISE, .rank = 1, .world = 2};
    assert_int_equal(
        df_ws_linear_sharded(ws, &l, D, D, true, &col, "transformer_blocks.0.attn.to_q"), DF_OK);
    float *full = whole("transformer_blocks.0.attn.to_q.weight", &R, &C);
    assert_int_equal(df_tensor_dim(l.weight, 0), 16);
    assert_int_equal(df_tensor_dim(l.weight, 1), 32);
    float *got = values(ctx, l.weight);
    assert_memory_equal(got, full + 16 * C, (size_t)(16 * C) * sizeof *got);
    assert_true(l.weight->v.st->owns_buf); /* zero-copy: the device wraps the mapping */
    free(got);
    free(full);
    full = whole("transformer_blocks.0.attn.to_q.bias", &R, &C);
    got = values(ctx, l.bias);
    assert_int_equal(df_tensor_numel(l.bias), 16);
    assert_memory_equal(got, full + 16, 16 * sizeof *got);
    free(got);
    free(full);

    /* rowwise, rank 1 of 2: columns [16, 32), copied; no bias (rank 0 adds it) */
    df_shard row = {.style = DF_SHARD_ROWWISE, .rank = 1, .world = 2};
    assert_int_equal(
        df_ws_linear_sharded(ws, &l, D, D, true, &row, "transformer_blocks.0.attn.to_out.0"),
        DF_OK);
    assert_null(l.bias);
    full = whole("transformer_blocks.0.attn.to_out.0.weight", &R, &C);
    got = values(ctx, l.weight);
    assert_int_equal(df_tensor_dim(l.weight, 1), 16);
    for (int64_t r = 0; r < R; r++)
        assert_memory_equal(got + r * 16, full + r * C + 16, 16 * sizeof *got);
    assert_false(l.weight->v.st->external);
    free(got);
    free(full);
    row.rank = 0; /* rank 0 binds the whole bias */
    assert_int_equal(
        df_ws_linear_sharded(ws, &l, D, D, true, &row, "transformer_blocks.0.attn.to_add_out"),
        DF_OK);
    assert_non_null(l.bias);
    assert_int_equal(df_tensor_numel(l.bias), D);

    /* packed rowwise [1, 4] of proj_out [D, 5D], rank 1: columns [16, 32) + [32+64, 32+128) */
    df_shard packed = {
        .style = DF_SHARD_ROWWISE, .rank = 1, .world = 2, .n_parts = 2, .parts = {1, 4}};
    assert_int_equal(df_ws_linear_sharded(ws, &l, D, 5 * D, true, &packed,
                                          "single_transformer_blocks.0.proj_out"),
                     DF_OK);
    full = whole("single_transformer_blocks.0.proj_out.weight", &R, &C);
    got = values(ctx, l.weight);
    assert_int_equal(df_tensor_dim(l.weight, 1), 5 * D / 2);
    for (int64_t r = 0; r < R; r++) {
        assert_memory_equal(got + r * 80, full + r * C + 16, 16 * sizeof *got);
        assert_memory_equal(got + r * 80 + 16, full + r * C + 96, 64 * sizeof *got);
    }
    free(got);
    free(full);

    /* 3 ranks: 32 is not divisible by 3 */
    df_shard three = {.style = DF_SHARD_COLWISE, .rank = 0, .world = 3};
    assert_int_equal(
        df_ws_linear_sharded(ws, &l, D, D, true, &three, "transformer_blocks.1.attn.to_k"),
        DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "not divisible by the 3"));
    assert_non_null(strstr(df_error_message(), "transformer_blocks.1.attn.to_k.weight"));
    df_weight_set_free(ws);
    df_ctx_free(ctx);
}

/* ---- the pipeline ------------------------------------------------------------------------- */

#define PIPE_CASE DF_GOLDEN_DIR "/t2i-flux-schnell-seed42"
#define PIPE_DIR  DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline"

typedef struct pipe_job {
    df_comm *comm;
    const char *prompt; /* rank 0's; NULL: the case's */
    df_status s;
    char msg[512];
    df_gen_output out;
} pipe_job;

static void *pipe_main(void *arg)
{
    pipe_job *j = arg;
    df_pipeline *p = NULL;
    j->s = df_pipeline_load(PIPE_DIR, &(df_load_opts){.threads = 1, .comm = j->comm}, &p);
    bool lead = df_comm_rank(j->comm) == 0;
    if (j->s == DF_OK) /* the prompt is rank 0's alone */
        j->s = df_pipeline_run(p,
                               &(df_gen_params){.prompt = !lead ? NULL
                                                          : j->prompt
                                                              ? j->prompt
                                                              : "A photo of a red fox in the snow, "
                                                                "35mm, golden hour",
                                                .height = 64,
                                                .width = 64,
                                                .steps = 4,
                                                .guidance_set = true,
                                                .max_sequence_length = 256,
                                                .seed = 42},
                               &j->out);
    if (j->s != DF_OK)
        snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
    df_pipeline_free(p);
    return NULL;
}

static void run_pipeline(int n, pipe_job *jobs, const char *prompt, bool expect_ok)
{
    df_comm *comms[MAX_RANKS];
    assert_int_equal(df_comm_create_threads(n, comms), DF_OK);
    pthread_t th[MAX_RANKS];
    for (int r = 0; r < n; r++) {
        jobs[r] = (pipe_job){.comm = comms[r], .prompt = prompt};
        assert_int_equal(pthread_create(&th[r], NULL, pipe_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++) {
        df_comm_free(comms[r]);
        if (expect_ok && jobs[r].s != DF_OK)
            fail_msg("rank %d of %d: %s", r, n, jobs[r].msg);
    }
}

static void test_pipeline_two_ranks(void **state)
{
    (void)state;
    pipe_job one[1], two[2];
    run_pipeline(1, one, NULL, true);
    run_pipeline(2, two, NULL, true);
    host_tensor ref = read_tensor(PIPE_CASE, "out.image", DF_DTYPE_F64);
    double max_abs, rel_l2;
    tolerance(PIPE_CASE, "image", &max_abs, &rel_l2);
    assert_int_equal(two[0].out.count, 1);
    assert_int_equal(two[1].out.count, 0); /* only rank 0 decodes */
    assert_null(two[1].out.images);
    int64_t n = ref.numel, nl = 1;
    for (int d = 0; d < two[0].out.latents_ndim; d++)
        nl *= two[0].out.latents_shape[d];
    assert_memory_equal(two[0].out.latents, two[1].out.latents, (size_t)nl * sizeof(float));
    double d = rel_l2_f32(two[0].out.image_f32, one[0].out.image_f32, n);
    printf("t2i-flux-schnell-seed42 image: 2 ranks vs 1 rank rel-L2 %.3g (limit 1e-5)\n", d);
    assert_true(d <= 1e-5);
    check_reference("1 rank", one[0].out.image_f32, ref.data, n, max_abs, rel_l2);
    check_reference("2 ranks", two[0].out.image_f32, ref.data, n, max_abs, rel_l2);
    free(ref.data);
    df_gen_output_free(&one[0].out);
    df_gen_output_free(&two[0].out);
    df_gen_output_free(&two[1].out);
}

/* Rank 0's prompt is not UTF-8: its tokenizer fails, and rank 1 stops with rank 0's message
 * instead of waiting for the token ids. */
static void test_pipeline_rank0_failure_stops_both(void **state)
{
    (void)state;
    pipe_job two[2];
    run_pipeline(2, two, "a fox \xff\xfe in the snow", false);
    assert_int_equal(two[0].s, DF_E_ARG);
    assert_int_equal(two[1].s, DF_E_ARG);
    assert_non_null(strstr(two[1].msg, "rank 0: "));
    assert_non_null(strstr(two[1].msg, two[0].msg));
    printf("rank 1 reports: %s\n", two[1].msg);
}

/* ---- errors ------------------------------------------------------------------------------- */

static void test_heads_not_divisible_are_clear_errors(void **state)
{
    (void)state;
    static const char *const names[6] = {"in.hidden_states",
                                         "in.encoder_hidden_states",
                                         "in.pooled_projections",
                                         "in.timestep",
                                         "in.img_ids",
                                         "in.txt_ids"};
    host_tensor in[6];
    for (int i = 0; i < 6; i++)
        in[i] = read_tensor(FLUX_CASE, names[i], DF_DTYPE_F32);
    job jobs[3];
    run_ranks(3, &(job){.model = FLUX, .in = in}, jobs); /* 2 heads on 3 ranks */
    for (int r = 0; r < 3; r++) {
        assert_int_equal(jobs[r].s, DF_E_ARG);
        assert_non_null(strstr(jobs[r].msg, "num_attention_heads 2 is not divisible by the 3"));
    }
    free_jobs(jobs, 3);
    for (int i = 0; i < 6; i++)
        free(in[i].data);
    host_tensor t5in[2] = {read_tensor(T5_CASE, "in.input_ids", DF_DTYPE_I64),
                           read_tensor(T5_CASE, "in.attention_mask", DF_DTYPE_I64)};
    run_ranks(3, &(job){.model = T5, .in = t5in}, jobs); /* 4 heads on 3 ranks */
    for (int r = 0; r < 3; r++) {
        assert_int_equal(jobs[r].s, DF_E_ARG);
        assert_non_null(strstr(jobs[r].msg, "num_heads 4"));
    }
    free_jobs(jobs, 3);
    free(t5in[0].data);
    free(t5in[1].data);
}

typedef struct agree_job {
    df_comm *comm;
    df_status got;
    char msg[512];
} agree_job;

static void *agree_main(void *arg)
{
    agree_job *j = arg;
    df_status local = DF_OK;
    if (df_comm_rank(j->comm) == 1)
        local = df_errorf(DF_E_IO, "disk on fire");
    j->got = df_comm_agree(j->comm, local);
    snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
    return NULL;
}

static void *abort_main(void *arg)
{
    agree_job *j = arg;
    if (df_comm_rank(j->comm) == 1) {
        df_comm_abort(j->comm); /* never joins the barrier */
        j->got = DF_OK;
    } else {
        j->got = df_comm_barrier(j->comm); /* must not wait for ever */
        if (j->got == DF_OK)
            j->got = df_comm_barrier(j->comm);
    }
    return NULL;
}

static void run_pair(void *(*fn)(void *), agree_job *jobs)
{
    df_comm *c[2];
    assert_int_equal(df_comm_create_threads(2, c), DF_OK);
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        jobs[r] = (agree_job){.comm = c[r]};
        pthread_create(&th[r], NULL, fn, &jobs[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    df_comm_free(c[0]);
    df_comm_free(c[1]);
}

static void test_agree_carries_the_message_and_abort_wakes(void **state)
{
    (void)state;
    agree_job jobs[2];
    run_pair(agree_main, jobs);
    assert_int_equal(jobs[0].got, DF_E_IO);
    assert_string_equal(jobs[0].msg, "rank 1: disk on fire");
    assert_int_equal(jobs[1].got, DF_E_IO);
    assert_string_equal(jobs[1].msg, "disk on fire");
    run_pair(abort_main, jobs);
    assert_int_equal(jobs[0].got, DF_E_STATE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded_linear_slices),
        cmocka_unit_test(test_flux_two_ranks_eager),
        cmocka_unit_test(test_flux_two_ranks_fuse),
        cmocka_unit_test(test_flux_two_ranks_compiled_blocks),
        cmocka_unit_test(test_flux_two_ranks_compiled_blocks_fuse),
        cmocka_unit_test(test_t5_two_ranks),
        cmocka_unit_test(test_bytes_read_per_rank),
        cmocka_unit_test(test_pipeline_two_ranks),
        cmocka_unit_test(test_pipeline_rank0_failure_stops_both),
        cmocka_unit_test(test_heads_not_divisible_are_clear_errors),
        cmocka_unit_test(test_agree_carries_the_message_and_abort_wakes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
