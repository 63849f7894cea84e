/*
 * Tests for the FLUX.2 transformer (src/models/flux2.c) through the public API, on the
 * flux2-transformer (FLUX.2-dev-like, guidance embeddings) and flux2-klein-transformer (no
 * guidance) golden cases:
 * - each case in f32 within its own tolerance of the float64 reference, with ids as int64
 *   (as the pipelines pass them) and as f32 giving the same output;
 * - defer-and-fuse, the whole model compiled, compiled repeated blocks (in eager and in
 *   fuse; traced then replayed) and sequential offload agree with strict eager;
 * - a batch of two different rows matches each row run alone;
 * - tensor parallelism with the in-process communicator: 2 ranks give bit-identical outputs
 *   on both ranks, within rel-L2 1e-5 of 1 rank, in eager, fuse and compiled blocks; each
 *   rank reads exactly its share of the checkpoint (sharded tensors / 2 + replicated ones);
 * - bad configs (class, patch size, RoPE axes, depth, guidance_embeds against the weights,
 *   heads not divisible by the ranks) and bad inputs fail with messages naming the key or
 *   the input.
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
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#define DEV_CASE   DF_GOLDEN_DIR "/flux2-transformer"
#define KLEIN_CASE DF_GOLDEN_DIR "/flux2-klein-transformer"

enum { N_IN = 6, MAX_RANKS = 4 };

/* ---- golden inputs ------------------------------------------------------------------------ */

typedef struct host_tensor {
    void *data; /* malloc'd, in the dtype it was read as */
    df_dtype dtype;
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
    host_tensor t = {.dtype = as, .ndim = info.ndim, .numel = info.numel};
    memcpy(t.shape, info.shape, sizeof t.shape);
    size_t bytes = (size_t)info.numel * df_dtype_size(as);
    t.data = malloc(bytes + 1);
    assert_int_equal(df_safetensors_read(st, name, as, t.data, bytes), DF_OK);
    df_safetensors_free(st);
    return t;
}

/* The case's inputs: hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids,
 * guidance (absent for klein); ids read as `ids`. */
typedef struct inputs {
    host_tensor t[N_IN];
    bool has[N_IN];
} inputs;

static inputs read_inputs(const char *case_dir, df_dtype ids)
{
    static const char *const names[N_IN] = {"in.hidden_states", "in.encoder_hidden_states",
                                            "in.timestep",      "in.img_ids",
                                            "in.txt_ids",       "in.guidance"};
    inputs in = {0};
    bool guidance = strcmp(case_dir, DEV_CASE) == 0;
    for (int i = 0; i < N_IN; i++) {
        in.has[i] = i < 5 || guidance;
        if (in.has[i])
            in.t[i] = read_tensor(case_dir, names[i], i == 3 || i == 4 ? ids : DF_DTYPE_F32);
    }
    return in;
}

static void free_inputs(inputs *in)
{
    for (int i = 0; i < N_IN; i++)
        free(in->t[i].data);
}

static df_flux2_inputs upload(df_ctx *ctx, const inputs *in)
{
    df_tensor *t[N_IN] = {0};
    for (int i = 0; i < N_IN; i++)
        if (in->has[i])
            t[i] = df_tensor_from_host(ctx, in->t[i].dtype, in->t[i].shape, in->t[i].ndim,
                                       in->t[i].data);
    return (df_flux2_inputs){t[0], t[1], t[2], t[3], t[4], t[5]};
}

static void tolerance(const char *case_dir, double *max_abs, double *rel_l2)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/case.json", case_dir);
    df_json *root = NULL;
    assert_int_equal(df_json_parse_file(path, &root), DF_OK);
    const df_json *tol = df_json_get(df_json_get(root, "tolerance"), "sample");
    assert_int_equal(df_json_get_double(tol, "max_abs", max_abs), DF_OK);
    assert_int_equal(df_json_get_double(tol, "rel_l2", rel_l2), DF_OK);
    df_json_free(root);
}

static double rel_l2(const float *a, const float *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ---- one run ------------------------------------------------------------------------------ */

typedef enum variant { PLAIN, WHOLE, BLOCKS, OFFLOAD } variant;

typedef struct job {
    /* in */
    const char *case_dir;
    const char *model_dir; /* NULL: the case's model */
    df_comm *comm;
    df_eager_mode mode;
    variant v;
    const inputs *in;
    /* out */
    df_status s;
    char msg[512];
    float *out;
    int64_t n;
    int64_t bytes_read;
    int programs;
} job;

static df_status module_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    df_flux2_inputs fi = {in[0], in[1], in[2], in[3], in[4], in[5]};
    out[0] = df_flux2_forward(ctx, self, &fi);
    return df_ctx_status(ctx);
}

static df_status read_out(df_ctx *ctx, df_tensor *t, job *j)
{
    if (!t)
        return df_sync(ctx) != DF_OK ? df_ctx_status(ctx) : DF_E_INTERNAL;
    free(j->out);
    j->n = df_tensor_numel(t);
    j->out = malloc((size_t)j->n * sizeof *j->out);
    return df_tensor_read(ctx, t, DF_DTYPE_F32, j->out, (size_t)j->n * sizeof *j->out);
}

static df_status run_model(df_ctx *ctx, job *j)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/model", j->case_dir);
    df_flux2 *m = NULL;
    df_status s = df_flux2_load(ctx, j->model_dir ? j->model_dir : dir, &m);
    if (s != DF_OK)
        return s;
    df_stats st;
    df_ctx_stats(ctx, &st);
    j->bytes_read = st.weight_bytes_read;
    static const df_module whole = {.name = "Flux2Transformer2DModel", .n_in = N_IN, .n_out = 1,
                                    .forward = module_forward};
    df_compiled *c = NULL;
    if (j->v == WHOLE)
        s = df_compile(&whole, NULL, &c);
    if (j->v == BLOCKS)
        s = df_flux2_compile_repeated_blocks(m, NULL);
    if (j->v == OFFLOAD)
        s = df_flux2_set_sequential_offload(m, true);
    df_flux2_inputs fi = upload(ctx, j->in);
    /* The compiled variants run twice: the first call traces, the second replays. */
    for (int rep = 0; s == DF_OK && rep < (j->v == WHOLE || j->v == BLOCKS ? 2 : 1); rep++) {
        df_tensor *out = NULL;
        if (c)
            s = df_compiled_call(ctx, c, m, (df_tensor *[]){fi.hidden_states,
                                                            fi.encoder_hidden_states,
                                                            fi.timestep, fi.img_ids, fi.txt_ids,
                                                            fi.guidance},
                                 &out);
        else
            out = df_flux2_forward(ctx, m, &fi);
        if (s == DF_OK)
            s = read_out(ctx, out, j);
    }
    j->programs = df_flux2_compiled_programs(m);
    df_compiled_free(c);
    df_flux2_free(m);
    return s;
}

static void *rank_main(void *arg)
{
    job *j = arg;
    df_ctx *ctx = NULL;
    j->s = df_ctx_create(&(df_ctx_opts){.threads = 1, .mode = j->mode}, &ctx);
    if (j->s == DF_OK) {
        if (j->comm)
            df_ctx_set_comm(ctx, j->comm);
        j->s = run_model(ctx, j);
    }
    if (j->s != DF_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
        if (j->comm)
            df_comm_abort(j->comm); /* never leave the other ranks waiting */
    }
    df_ctx_free(ctx);
    return NULL;
}

/* One run on one rank, without a communicator; fails the test on error. */
static job run1(const char *case_dir, df_eager_mode mode, variant v, const inputs *in)
{
    job j = {.case_dir = case_dir, .mode = mode, .v = v, .in = in};
    rank_main(&j);
    if (j.s != DF_OK)
        fail_msg("%s: %s", case_dir, j.msg);
    return j;
}

/* Runs `n` ranks of `proto` (one thread each) into jobs[0..n). */
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

/* ---- the reference ------------------------------------------------------------------------ */

static void check_case(const char *case_dir)
{
    inputs in64 = read_inputs(case_dir, DF_DTYPE_I64), in32 = read_inputs(case_dir, DF_DTYPE_F32);
    job a = run1(case_dir, DF_DEFER_NEVER, PLAIN, &in64);
    job b = run1(case_dir, DF_DEFER_NEVER, PLAIN, &in32);
    host_tensor ref = read_tensor(case_dir, "out.sample", DF_DTYPE_F64);
    assert_int_equal(a.n, ref.numel);
    assert_memory_equal(a.out, b.out, (size_t)a.n * sizeof *a.out); /* int64 ids = f32 ids */
    double max_abs, rl, num = 0, den = 0, mx = 0;
    tolerance(case_dir, &max_abs, &rl);
    const double *r = ref.data;
    for (int64_t i = 0; i < ref.numel; i++) {
        double d = a.out[i] - r[i];
        num += d * d, den += r[i] * r[i];
        mx = isnan(a.out[i]) ? INFINITY : fmax(mx, fabs(d));
    }
    printf("%s: max-abs %.3g (limit %.3g), rel-L2 %.3g (limit %.3g)\n", case_dir, mx, max_abs,
           sqrt(num / den), rl);
    assert_true(mx <= max_abs);
    assert_true(sqrt(num / den) <= rl);
    free(a.out), free(b.out), free(ref.data);
    free_inputs(&in64), free_inputs(&in32);
}

static void test_dev_case_within_its_tolerance(void **state)
{
    (void)state;
    check_case(DEV_CASE);
}

static void test_klein_case_within_its_tolerance(void **state)
{
    (void)state;
    check_case(KLEIN_CASE);
}

/* ---- modes -------------------------------------------------------------------------------- */

static void modes_agree(const char *case_dir)
{
    inputs in = read_inputs(case_dir, DF_DTYPE_I64);
    job eager = run1(case_dir, DF_DEFER_NEVER, PLAIN, &in);
    struct {
        df_eager_mode mode;
        variant v;
        const char *what;
        int programs;
    } runs[] = {{DF_DEFER_AND_FUSE, PLAIN, "fuse", 0},
                {DF_DEFER_NEVER, WHOLE, "compiled whole", 0},
                {DF_DEFER_NEVER, BLOCKS, "compiled blocks", 2},
                {DF_DEFER_AND_FUSE, BLOCKS, "compiled blocks + fuse", 2},
                {DF_DEFER_NEVER, OFFLOAD, "sequential offload", 0},
                {DF_DEFER_AND_FUSE, OFFLOAD, "sequential offload + fuse", 0}};
    for (size_t k = 0; k < sizeof runs / sizeof *runs; k++) {
        job j = run1(case_dir, runs[k].mode, runs[k].v, &in);
        assert_int_equal(j.n, eager.n);
        double d = rel_l2(j.out, eager.out, j.n);
        printf("%s %s vs strict eager: rel-L2 %.3g (limit 1e-5), %d block programs\n", case_dir,
               runs[k].what, d, j.programs);
        assert_true(d <= 1e-5);
        assert_int_equal(j.programs, runs[k].programs);
        if (runs[k].v == OFFLOAD && runs[k].mode == DF_DEFER_NEVER) /* the same ops */
            assert_memory_equal(j.out, eager.out, (size_t)j.n * sizeof *j.out);
        free(j.out);
    }
    free(eager.out);
    free_inputs(&in);
}

static void test_modes_agree_with_strict_eager_dev(void **state)
{
    (void)state;
    modes_agree(DEV_CASE);
}

static void test_modes_agree_with_strict_eager_klein(void **state)
{
    (void)state;
    modes_agree(KLEIN_CASE);
}

/* Row 0 is the case's input, row 1 another (scaled latents and text, another timestep):
 * each output row equals that row run alone. */
static void test_batch_of_two_rows_matches_single_rows(void **state)
{
    (void)state;
    inputs one = read_inputs(DEV_CASE, DF_DTYPE_I64), other = read_inputs(DEV_CASE, DF_DTYPE_I64);
    float *x = other.t[0].data, *c = other.t[1].data, *t = other.t[2].data, *g = other.t[5].data;
    for (int64_t i = 0; i < other.t[0].numel; i++)
        x[i] = -0.5f * x[i] + 0.1f;
    for (int64_t i = 0; i < other.t[1].numel; i++)
        c[i] *= 1.5f;
    t[0] = 0.25f, g[0] = 2.5f;
    job a = run1(DEV_CASE, DF_DEFER_NEVER, PLAIN, &one);
    job b = run1(DEV_CASE, DF_DEFER_NEVER, PLAIN, &other);

    inputs two = read_inputs(DEV_CASE, DF_DTYPE_I64);
    for (int i = 0; i < N_IN; i++) {
        if (i == 3 || i == 4)
            continue; /* ids: row 0 is used */
        host_tensor *h = &two.t[i];
        size_t row = (size_t)h->numel * sizeof(float);
        h->data = realloc(h->data, 2 * row);
        memcpy((char *)h->data + row, other.t[i].data, row);
        h->shape[0] = 2, h->numel *= 2;
    }
    job ab = run1(DEV_CASE, DF_DEFER_NEVER, PLAIN, &two);
    assert_int_equal(ab.n, 2 * a.n);
    double d0 = rel_l2(ab.out, a.out, a.n), d1 = rel_l2(ab.out + a.n, b.out, a.n);
    printf("batch of 2: row 0 rel-L2 %.3g, row 1 rel-L2 %.3g (limit 1e-6); rows differ by %.3g\n",
           d0, d1, rel_l2(a.out, b.out, a.n));
    assert_true(d0 <= 1e-6 && d1 <= 1e-6);
    assert_true(rel_l2(a.out, b.out, a.n) > 1e-2); /* the second row is another input */
    free(a.out), free(b.out), free(ab.out);
    free_inputs(&one), free_inputs(&other), free_inputs(&two);
}

/* ---- tensor parallelism ------------------------------------------------------------------- */

static void tp_parity(const char *case_dir, df_eager_mode mode, variant v, const char *what)
{
    inputs in = read_inputs(case_dir, DF_DTYPE_I64);
    job proto = {.case_dir = case_dir, .mode = mode, .v = v, .in = &in};
    job one[1], two[2];
    run_ranks(1, &proto, one);
    run_ranks(2, &proto, two);
    for (int r = 0; r < 2; r++)
        if (two[r].s != DF_OK)
            fail_msg("rank %d of 2: %s", r, two[r].msg);
    if (one[0].s != DF_OK)
        fail_msg("1 rank: %s", one[0].msg);
    assert_int_equal(two[0].n, one[0].n);
    assert_memory_equal(two[0].out, two[1].out, (size_t)one[0].n * sizeof(float));
    double d = rel_l2(two[0].out, one[0].out, one[0].n);
    printf("%s %s: 2 ranks vs 1 rank rel-L2 %.3g (limit 1e-5)\n", case_dir, what, d);
    assert_true(d <= 1e-5);
    if (v == BLOCKS)
        assert_int_equal(two[0].programs, 2);
    for (int r = 0; r < 2; r++)
        free(two[r].out);
    free(one[0].out);
    free_inputs(&in);
}

static void test_two_ranks_match_one_eager(void **state)
{
    (void)state;
    tp_parity(DEV_CASE, DF_DEFER_NEVER, PLAIN, "eager");
    tp_parity(KLEIN_CASE, DF_DEFER_NEVER, PLAIN, "eager");
}

static void test_two_ranks_match_one_fuse(void **state)
{
    (void)state;
    tp_parity(DEV_CASE, DF_DEFER_AND_FUSE, PLAIN, "fuse");
}

static void test_two_ranks_match_one_compiled_blocks(void **state)
{
    (void)state;
    tp_parity(DEV_CASE, DF_DEFER_NEVER, BLOCKS, "compiled blocks");
    tp_parity(KLEIN_CASE, DF_DEFER_AND_FUSE, BLOCKS, "compiled blocks + fuse");
}

/* Whether `name` is one of the modules the TP plan splits: the block modules of
 * Flux2Transformer2DModel._tp_plan, context_embedder and the modulations. */
static bool sharded(const char *name)
{
    static const char *const split[] = {
        "attn.to_q.",       "attn.to_k.",          "attn.to_v.",
        "attn.add_q_proj.", "attn.add_k_proj.",    "attn.add_v_proj.",
        "attn.to_out.0.",   "attn.to_add_out.",    "ff.linear_in.",
        "ff.linear_out.",   "ff_context.linear_in.", "ff_context.linear_out.",
        "attn.to_qkv_mlp_proj.", "attn.to_out.weight"};
    const char *rest = NULL;
    static const char *const blocks[] = {"transformer_blocks.", "single_transformer_blocks."};
    for (int b = 0; b < 2 && !rest; b++) {
        size_t n = strlen(blocks[b]);
        if (strncmp(name, blocks[b], n) == 0) {
            rest = name + n;
            while (*rest >= '0' && *rest <= '9')
                rest++;
            rest = *rest == '.' ? rest + 1 : NULL;
        }
    }
    for (size_t i = 0; rest && i < sizeof split / sizeof *split; i++)
        if (strncmp(rest, split[i], strlen(split[i])) == 0)
            return true;
    /* split rowwise although their input is whole on every rank (make_tp_plan) */
    static const char *const outer[] = {
        "context_embedder.weight", "double_stream_modulation_img.linear.weight",
        "double_stream_modulation_txt.linear.weight", "single_stream_modulation.linear.weight"};
    for (size_t i = 0; i < sizeof outer / sizeof *outer; i++)
        if (strcmp(name, outer[i]) == 0)
            return true;
    return false;
}

static void test_bytes_read_per_rank(void **state)
{
    (void)state;
    df_weights *w = NULL;
    assert_int_equal(df_weights_open(DEV_CASE "/model", &w), DF_OK);
    int64_t split = 0, whole = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        assert_int_equal(df_weights_at(w, i, &info), DF_OK);
        *(sharded(info.name) ? &split : &whole) += (int64_t)info.nbytes;
    }
    df_weights_free(w);
    printf("checkpoint: %lld bytes split, %lld replicated\n", (long long)split, (long long)whole);
    assert_true(split > whole); /* the plan splits most of the blocks' weights */

    inputs in = read_inputs(DEV_CASE, DF_DTYPE_I64);
    job proto = {.case_dir = DEV_CASE, .mode = DF_DEFER_NEVER, .in = &in};
    job two[2];
    run_ranks(2, &proto, two);
    for (int r = 0; r < 2; r++) {
        if (two[r].s != DF_OK)
            fail_msg("rank %d of 2: %s", r, two[r].msg);
        printf("rank %d of 2 read %lld weight bytes (share %lld of %lld)\n", r,
               (long long)two[r].bytes_read, (long long)(split / 2 + whole),
               (long long)(split + whole));
        assert_int_equal(two[r].bytes_read, split / 2 + whole);
        free(two[r].out);
    }
    free_inputs(&in);
}

/* ---- errors ------------------------------------------------------------------------------- */

/* A model folder under DF_TEST_TMP: the case's weights and its config.json with `from`
 * replaced by `to` (both NULL: unchanged). Returns the folder. */
static const char *edited_model(const char *case_dir, const char *from, const char *to)
{
    static char dir[1024];
    char path[1200], src[1200];
    snprintf(dir, sizeof dir, "%s/flux2-edited", DF_TEST_TMP);
    mkdir(DF_TEST_TMP, 0755);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    snprintf(src, sizeof src, "%s/model/diffusion_pytorch_model.safetensors", case_dir);
    unlink(path);
    assert_int_equal(symlink(src, path), 0);

    snprintf(src, sizeof src, "%s/model/config.json", case_dir);
    FILE *f = fopen(src, "rb");
    assert_non_null(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    assert_non_null(f);
    char *at = from ? strstr(text, from) : NULL;
    if (from)
        assert_non_null(at);
    if (at) {
        fwrite(text, 1, (size_t)(at - text), f);
        fputs(to, f);
        fputs(at + strlen(from), f);
    } else {
        fputs(text, f);
    }
    fclose(f);
    return dir;
}

static void expect_load_error(const char *case_dir, const char *from, const char *to,
                              df_status want, const char *needle1, const char *needle2)
{
    const char *dir = edited_model(case_dir, from, to);
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_flux2 *m = (df_flux2 *)1;
    df_status s = df_flux2_load(ctx, dir, &m);
    printf("%s -> %s: %s\n", from, to, df_error_message());
    assert_int_equal(s, want);
    assert_null(m);
    assert_non_null(strstr(df_error_message(), needle1));
    if (needle2)
        assert_non_null(strstr(df_error_message(), needle2));
    df_ctx_free(ctx);
}

static void test_bad_configs_are_refused_naming_the_key(void **state)
{
    (void)state;
    expect_load_error(DEV_CASE, "\"Flux2Transformer2DModel\"", "\"FluxTransformer2DModel\"",
                      DF_E_UNSUPPORTED, "_class_name", "Flux2Transformer2DModel");
    expect_load_error(DEV_CASE, "\"patch_size\": 1", "\"patch_size\": 2", DF_E_UNSUPPORTED,
                      "patch_size", NULL);
    expect_load_error(DEV_CASE, "\"attention_head_dim\": 16", "\"attention_head_dim\": 20",
                      DF_E_FORMAT, "axes_dims_rope", "attention_head_dim");
    expect_load_error(DEV_CASE, "\"num_layers\": 2", "\"num_layers\": 3", DF_E_FORMAT,
                      "num_layers", "transformer_blocks.2");
    expect_load_error(DEV_CASE, "\"num_single_layers\": 2", "\"num_single_layers\": 1",
                      DF_E_FORMAT, "num_single_layers", "single_transformer_blocks.1");
    expect_load_error(DEV_CASE, "\"guidance_embeds\": true", "\"guidance_embeds\": false",
                      DF_E_FORMAT, "guidance_embeds", "guidance_embedder");
    expect_load_error(KLEIN_CASE, "\"guidance_embeds\": false", "\"guidance_embeds\": true",
                      DF_E_FORMAT, "guidance_embedder.linear_1.weight", NULL);
    expect_load_error(DEV_CASE, "\"mlp_ratio\": 3.0", "\"mlp_ratio\": 4.0", DF_E_FORMAT,
                      "ff.linear_in.weight", NULL);
    expect_load_error(DEV_CASE, "\"joint_attention_dim\": 48", "\"joint_attention_dim\": 64",
                      DF_E_FORMAT, "context_embedder.weight", NULL);
}

static void test_heads_not_divisible_by_the_ranks_is_a_clear_error(void **state)
{
    (void)state;
    inputs in = read_inputs(KLEIN_CASE, DF_DTYPE_I64);
    job proto = {.case_dir = KLEIN_CASE, .mode = DF_DEFER_NEVER, .in = &in};
    job four[4];
    run_ranks(4, &proto, four); /* 2 heads on 4 ranks */
    for (int r = 0; r < 4; r++) {
        assert_int_equal(four[r].s, DF_E_ARG);
        assert_non_null(strstr(four[r].msg, "num_attention_heads 2 is not divisible by the 4"));
        free(four[r].out);
    }
    free_inputs(&in);
}

/* Runs the dev model on `fi` with input `k` replaced; the context must fail naming it. */
static void expect_input_error(df_ctx *ctx, df_flux2 *m, df_flux2_inputs fi, df_status want,
                               const char *needle)
{
    assert_null(df_flux2_forward(ctx, m, &fi));
    assert_int_equal(df_ctx_status(ctx), want);
    assert_int_equal(df_sync(ctx), want);
    printf("bad input: %s\n", df_error_message());
    assert_non_null(strstr(df_error_message(), needle));
    df_ctx_reset_error(ctx);
}

static void test_bad_inputs_fail_the_context_naming_the_input(void **state)
{
    (void)state;
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_flux2 *dev = NULL, *klein = NULL;
    assert_int_equal(df_flux2_load(ctx, DEV_CASE "/model", &dev), DF_OK);
    assert_int_equal(df_flux2_load(ctx, KLEIN_CASE "/model", &klein), DF_OK);
    inputs in = read_inputs(DEV_CASE, DF_DTYPE_I64);
    df_flux2_inputs fi = upload(ctx, &in), bad = fi;

    bad.guidance = NULL;
    expect_input_error(ctx, dev, bad, DF_E_ARG, "'guidance' is missing");
    expect_input_error(ctx, klein, fi, DF_E_ARG, "no guidance embedder");
    bad = fi;
    bad.hidden_states = fi.encoder_hidden_states; /* 48 channels, not 128 */
    expect_input_error(ctx, dev, bad, DF_E_SHAPE, "'hidden_states'");
    bad = fi;
    bad.img_ids = fi.txt_ids; /* 6 rows for 16 image tokens */
    expect_input_error(ctx, dev, bad, DF_E_SHAPE, "'img_ids'");
    bad = fi;
    bad.timestep = NULL;
    expect_input_error(ctx, dev, bad, DF_E_ARG, "'timestep' is missing");

    df_flux2_free(dev);
    df_flux2_free(klein);
    free_inputs(&in);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dev_case_within_its_tolerance),
        cmocka_unit_test(test_klein_case_within_its_tolerance),
        cmocka_unit_test(test_modes_agree_with_strict_eager_dev),
        cmocka_unit_test(test_modes_agree_with_strict_eager_klein),
        cmocka_unit_test(test_batch_of_two_rows_matches_single_rows),
        cmocka_unit_test(test_two_ranks_match_one_eager),
        cmocka_unit_test(test_two_ranks_match_one_fuse),
        cmocka_unit_test(test_two_ranks_match_one_compiled_blocks),
        cmocka_unit_test(test_bytes_read_per_rank),
        cmocka_unit_test(test_bad_configs_are_refused_naming_the_key),
        cmocka_unit_test(test_heads_not_divisible_by_the_ranks_is_a_clear_error),
        cmocka_unit_test(test_bad_inputs_fail_the_context_naming_the_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
