/*
 * Tests for the FLUX.1 transformer (src/models/flux.c) through the public API:
 * the flux-transformer golden case in f32 (its own tolerance) and in bf16 compute, a
 * batch of two different rows, bf16 weights kept as bf16, ids of other dtypes and forms,
 * sequential offload, forward input errors, and malformed model folders written here (bad
 * config values, depths the weights do not have, a missing / mis-shaped / unexpected
 * tensor), plus an out-of-memory sweep of the loader.
 *
 * Model folders are written under DF_TEST_TMP by a small safetensors reader/writer of this
 * file (8-byte little-endian header length, JSON header, data), independent of the
 * library's own.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include <diffuse/flux.h>
#include <diffuse/ops.h>

#include "core/alloc.h"
#include "models/loader.h"

#define CASE_DIR  DF_GOLDEN_DIR "/flux-transformer"
#define MODEL_DIR CASE_DIR "/model"

/* ---- a tiny safetensors reader / writer ------------------------------------------------ */

typedef struct st_tensor {
    char name[160];
    char dtype[8]; /* "F32", "BF16", "F64" */
    int ndim;
    int64_t shape[8];
    uint8_t *data; /* malloc'd */
    size_t nbytes;
} st_tensor;

typedef struct st_file {
    st_tensor *t;
    int n;
} st_file;

static void *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static st_file st_read(const char *path)
{
    size_t len = 0;
    uint8_t *buf = read_file(path, &len);
    assert_non_null(buf);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | buf[i];
    cJSON *root = cJSON_ParseWithLength((const char *)buf + 8, (size_t)hlen);
    assert_non_null(root);
    st_file f = {calloc((size_t)cJSON_GetArraySize(root), sizeof(st_tensor)), 0};
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        if (strcmp(e->string, "__metadata__") == 0)
            continue;
        st_tensor *t = &f.t[f.n++];
        snprintf(t->name, sizeof t->name, "%s", e->string);
        snprintf(t->dtype, sizeof t->dtype, "%s", cJSON_GetObjectItem(e, "dtype")->valuestring);
        const cJSON *shape = cJSON_GetObjectItem(e, "shape"), *d;
        cJSON_ArrayForEach(d, shape) t->shape[t->ndim++] = (int64_t)d->valuedouble;
        const cJSON *offs = cJSON_GetObjectItem(e, "data_offsets");
        size_t b = (size_t)cJSON_GetArrayItem(offs, 0)->valuedouble;
        size_t end = (size_t)cJSON_GetArrayItem(offs, 1)->valuedouble;
        t->nbytes = end - b;
        t->data = malloc(t->nbytes + 1);
        memcpy(t->data, buf + 8 + hlen + b, t->nbytes);
    }
    cJSON_Delete(root);
    free(buf);
    return f;
}

static void st_write(const char *path, const st_file *f)
{
    cJSON *root = cJSON_CreateObject();
    size_t off = 0;
    for (int i = 0; i < f->n; i++) {
        const st_tensor *t = &f->t[i];
        cJSON *e = cJSON_AddObjectToObject(root, t->name);
        cJSON_AddStringToObject(e, "dtype", t->dtype);
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *json = cJSON_PrintUnformatted(root);
    size_t hlen = strlen(json), padded = (hlen + 7) / 8 * 8; /* keep the data 8-aligned */
    size_t total = 8 + padded + off;
    uint8_t *buf = malloc(total);
    for (int i = 0; i < 8; i++)
        buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, json, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    size_t p = 8 + padded;
    for (int i = 0; i < f->n; i++) {
        memcpy(buf + p, f->t[i].data, f->t[i].nbytes);
        p += f->t[i].nbytes;
    }
    write_file(path, buf, total);
    free(buf);
    free(json);
    cJSON_Delete(root);
}

static void st_free(st_file *f)
{
    for (int i = 0; i < f->n; i++)
        free(f->t[i].data);
    free(f->t);
}

static st_tensor *st_find(st_file *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0)
            return &f->t[i];
    fail_msg("no tensor %s", name);
    return NULL;
}

static int64_t st_numel(const st_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* The tensor's values as f32 (malloc'd), from F32 or F64 data. */
static float *st_f32(const st_tensor *t)
{
    int64_t n = st_numel(t);
    float *v = malloc((size_t)n * sizeof *v + 1);
    for (int64_t i = 0; i < n; i++) {
        if (strcmp(t->dtype, "F64") == 0) {
            double x;
            memcpy(&x, t->data + 8 * i, 8);
            v[i] = (float)x;
        } else {
            assert_string_equal(t->dtype, "F32");
            memcpy(&v[i], t->data + 4 * i, 4);
        }
    }
    return v;
}

/* ---- model folders under DF_TEST_TMP --------------------------------------------------- */

static char *golden_config(void)
{
    size_t len;
    char *cfg = read_file(MODEL_DIR "/config.json", &len);
    assert_non_null(cfg);
    return cfg;
}

/* A fresh folder DF_TEST_TMP/flux-<name>; returns its path (static buffer per call). */
static const char *make_dir(const char *name, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s/flux-%s", DF_TEST_TMP, name);
    mkdir(DF_TEST_TMP, 0755);
    if (mkdir(buf, 0755) != 0)
        assert_int_equal(errno, EEXIST);
    return buf;
}

/* config.json with the first `from` replaced by `to` (to NULL: unchanged). */
static void write_config(const char *dir, const char *from, const char *to)
{
    char *cfg = golden_config();
    char out[4096], path[1024];
    const char *at = from ? strstr(cfg, from) : NULL;
    if (from)
        assert_non_null(at);
    if (at)
        snprintf(out, sizeof out, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    else
        snprintf(out, sizeof out, "%s", cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, out, strlen(out));
    free(cfg);
}

static void write_weights(const char *dir, const st_file *f)
{
    char path[1024];
    int len = snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_true(len > 0 && len < (int)sizeof path);
    st_write(path, f);
}

static void remove_weights(const char *dir)
{
    char path[1024];
    int len = snprintf(path, sizeof path, "%s/diffusion_pytorch_model.safetensors", dir);
    assert_true(len > 0 && len < (int)sizeof path);
    remove(path);
}

/* ---- running the golden case ----------------------------------------------------------- */

typedef struct golden {
    st_file in;             /* case.safetensors */
    double max_abs, rel_l2; /* the case's tolerance for out.sample */
} golden;

static golden golden_load(void)
{
    golden g = {st_read(CASE_DIR "/case.safetensors"), 0, 0};
    size_t len;
    char *text = read_file(CASE_DIR "/case.json", &len);
    assert_non_null(text);
    cJSON *root = cJSON_Parse(text);
    const cJSON *tol = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "tolerance"), "sample");
    g.max_abs = cJSON_GetObjectItem(tol, "max_abs")->valuedouble;
    g.rel_l2 = cJSON_GetObjectItem(tol, "rel_l2")->valuedouble;
    assert_true(g.max_abs > 0 && g.rel_l2 > 0);
    cJSON_Delete(root);
    free(text);
    return g;
}

static df_tensor *upload(df_ctx *ctx, golden *g, const char *name)
{
    st_tensor *t = st_find(&g->in, name);
    float *v = st_f32(t);
    df_tensor *r = df_tensor_from_host(ctx, DF_DTYPE_F32, t->shape, t->ndim, v);
    free(v);
    assert_non_null(r);
    return r;
}

static df_flux_inputs golden_inputs(df_ctx *ctx, golden *g)
{
    return (df_flux_inputs){
        .hidden_states = upload(ctx, g, "in.hidden_states"),
        .encoder_hidden_states = upload(ctx, g, "in.encoder_hidden_states"),
        .pooled_projections = upload(ctx, g, "in.pooled_projections"),
        .timestep = upload(ctx, g, "in.timestep"),
        .img_ids = upload(ctx, g, "in.img_ids"),
        .txt_ids = upload(ctx, g, "in.txt_ids"),
    };
}

/* Runs the forward and reads the result (malloc'd f32, *n values). */
static float *forward(df_ctx *ctx, df_flux *m, const df_flux_inputs *in, int64_t *n)
{
    df_tensor *out = df_flux_forward(ctx, m, in);
    if (!out) {
        df_sync(ctx);
        fail_msg("forward failed: %s", df_error_message());
    }
    *n = df_tensor_numel(out);
    float *v = malloc((size_t)*n * sizeof *v);
    if (df_tensor_read(ctx, out, DF_DTYPE_F32, v, (size_t)*n * sizeof *v) != DF_OK)
        fail_msg("read failed: %s", df_error_message());
    df_tensor_free(out);
    return v;
}

typedef struct errs {
    double max_abs, rel_l2;
} errs;

static errs compare(const float *got, const double *ref, int64_t n)
{
    double num = 0, den = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        mx = fmax(mx, fabs(d));
        if (isnan(got[i]))
            mx = INFINITY;
    }
    return (errs){mx, sqrt(num / den)};
}

/* out.sample as f64 (malloc'd). */
static double *reference(golden *g, int64_t *n)
{
    st_tensor *t = st_find(&g->in, "out.sample");
    assert_string_equal(t->dtype, "F64");
    *n = st_numel(t);
    double *r = malloc((size_t)*n * sizeof *r);
    memcpy(r, t->data, (size_t)*n * sizeof *r);
    return r;
}

/* The golden case with the model in `dir` and compute dtype `compute`: its errors. */
static errs run_golden(const char *dir, df_dtype compute, int64_t *weight_bytes)
{
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = compute}, &ctx), DF_OK);
    df_flux *m = NULL;
    if (df_flux_load(ctx, dir, &m) != DF_OK)
        fail_msg("load failed: %s", df_error_message());
    if (weight_bytes)
        *weight_bytes = df_flux_weight_bytes(m);
    df_flux_inputs in = golden_inputs(ctx, &g);
    int64_t n, nref;
    float *got = forward(ctx, m, &in, &n);
    double *ref = reference(&g, &nref);
    assert_int_equal(n, nref);
    errs e = compare(got, ref, n);
    free(got);
    free(ref);
    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
    return e;
}

/* ---- parity ---------------------------------------------------------------------------- */

static void test_golden_f32_within_the_case_tolerance(void **state)
{
    (void)state;
    golden g = golden_load();
    errs e = run_golden(MODEL_DIR, DF_DTYPE_F32, NULL);
    printf("flux-transformer f32: max-abs %.3g (limit %.3g), rel-L2 %.3g (limit %.3g)\n", e.max_abs,
           g.max_abs, e.rel_l2, g.rel_l2);
    assert_true(e.max_abs <= g.max_abs);
    assert_true(e.rel_l2 <= g.rel_l2);
    st_free(&g.in);
}

static void test_golden_bf16_compute_within_2e_2(void **state)
{
    (void)state;
    errs e = run_golden(MODEL_DIR, DF_DTYPE_BF16, NULL);
    printf("flux-transformer bf16 compute: max-abs %.3g, rel-L2 %.3g (limit 2e-2)\n", e.max_abs,
           e.rel_l2);
    assert_true(e.rel_l2 <= 2e-2);
}

/* The golden case's output in one execution mode (f32 or bf16 compute), malloc'd. */
static float *output_in_mode(df_eager_mode mode, bool blocks, df_dtype compute, int64_t *n)
{
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2, .compute = compute, .mode = mode},
                                   &ctx),
                     DF_OK);
    df_flux *m = NULL;
    if (df_flux_load(ctx, MODEL_DIR, &m) != DF_OK)
        fail_msg("load failed: %s", df_error_message());
    if (blocks &&
        df_flux_compile_repeated_blocks(m, &(df_compile_opts){.fullgraph = true}) != DF_OK)
        fail_msg("compile failed: %s", df_error_message());
    df_flux_inputs in = golden_inputs(ctx, &g);
    float *out = forward(ctx, m, &in, n);
    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
    return out;
}

static double rel_l2_f(const float *got, const float *want, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return sqrt(num / den);
}

/* Defer-and-fuse and compiled blocks run the same model through the planner's rewrites
 * (fused chains, folded activations, RMS norm + RoPE, concats in place, bf16 operands):
 * in f32 they agree with strict eager to f32 rounding, in bf16 to well within bf16's. */
static void test_fused_modes_agree_with_strict_eager(void **state)
{
    (void)state;
    const df_dtype dtypes[2] = {DF_DTYPE_F32, DF_DTYPE_BF16};
    for (int di = 0; di < 2; di++) {
        int64_t n0, n1, n2;
        float *eager = output_in_mode(DF_DEFER_NEVER, false, dtypes[di], &n0);
        float *fuse = output_in_mode(DF_DEFER_AND_FUSE, false, dtypes[di], &n1);
        float *blocks = output_in_mode(DF_DEFER_AND_FUSE, true, dtypes[di], &n2);
        assert_int_equal(n1, n0);
        assert_int_equal(n2, n0);
        double e1 = rel_l2_f(fuse, eager, n0), e2 = rel_l2_f(blocks, eager, n0);
        printf("%s: fuse vs eager rel-L2 %.3g, compiled blocks vs eager %.3g\n",
               df_dtype_name(dtypes[di]), e1, e2);
        double limit = dtypes[di] == DF_DTYPE_F32 ? 1e-5 : 2e-3;
        assert_true(e1 <= limit);
        assert_true(e2 <= limit);
        free(eager);
        free(fuse);
        free(blocks);
    }
}

static void test_bf16_weights_stay_bf16_and_match(void **state)
{
    (void)state;
    char dir[1024];
    make_dir("bf16", dir, sizeof dir);
    write_config(dir, NULL, NULL);
    st_file f = st_read(MODEL_DIR "/diffusion_pytorch_model.safetensors");
    int64_t numel = 0;
    for (int i = 0; i < f.n; i++) {
        st_tensor *t = &f.t[i];
        int64_t n = st_numel(t);
        uint8_t *bf = malloc((size_t)n * 2);
        for (int64_t k = 0; k < n; k++) {
            float x;
            memcpy(&x, t->data + 4 * k, 4);
            uint16_t h = df_f32_to_bf16(x);
            memcpy(bf + 2 * k, &h, 2);
        }
        free(t->data);
        t->data = bf;
        t->nbytes = (size_t)n * 2;
        snprintf(t->dtype, sizeof t->dtype, "BF16");
        numel += n;
    }
    write_weights(dir, &f);
    st_free(&f);

    int64_t bytes = 0;
    errs e = run_golden(dir, DF_DTYPE_F32, &bytes);
    printf("flux-transformer bf16 weights: max-abs %.3g, rel-L2 %.3g (limit 2e-2)\n", e.max_abs,
           e.rel_l2);
    assert_int_equal(bytes, 2 * numel); /* two bytes per weight: no f32 copy was kept */
    assert_true(e.rel_l2 <= 2e-2);
}

/* Row 0 = the golden inputs, row 1 = other inputs: each row must equal its own B = 1 run. */
static void test_batch_of_two_rows_matches_single_rows(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, MODEL_DIR, &m), DF_OK);

    static const char *const names[] = {"in.hidden_states", "in.encoder_hidden_states",
                                        "in.pooled_projections", "in.timestep"};
    df_tensor *row1[4], *both[4];
    for (int i = 0; i < 4; i++) {
        st_tensor *t = st_find(&g.in, names[i]);
        int64_t n = st_numel(t);
        float *v = st_f32(t), *w = malloc((size_t)n * sizeof *w),
              *b = malloc(2 * (size_t)n * sizeof *b);
        for (int64_t k = 0; k < n; k++)
            w[k] = i == 3 ? 0.25f : -0.75f * v[n - 1 - k] + 0.1f; /* a different row */
        memcpy(b, v, (size_t)n * sizeof *b);
        memcpy(b + n, w, (size_t)n * sizeof *b);
        int64_t shape[8];
        memcpy(shape, t->shape, sizeof shape);
        row1[i] = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, t->ndim, w);
        shape[0] = 2;
        both[i] = df_tensor_from_host(ctx, DF_DTYPE_F32, shape, t->ndim, b);
        free(v);
        free(w);
        free(b);
    }
    df_flux_inputs in0 = golden_inputs(ctx, &g);
    df_flux_inputs in1 = in0, in2 = in0;
    in1.hidden_states = row1[0], in1.encoder_hidden_states = row1[1];
    in1.pooled_projections = row1[2], in1.timestep = row1[3];
    in2.hidden_states = both[0], in2.encoder_hidden_states = both[1];
    in2.pooled_projections = both[2], in2.timestep = both[3];

    int64_t n0, n1, n2, nref;
    float *y0 = forward(ctx, m, &in0, &n0);
    float *y1 = forward(ctx, m, &in1, &n1);
    float *y2 = forward(ctx, m, &in2, &n2);
    assert_int_equal(n2, 2 * n0);
    assert_int_equal(n1, n0);
    double *ref = reference(&g, &nref);
    errs e0 = compare(y2, ref, n0);
    assert_true(e0.max_abs <= g.max_abs && e0.rel_l2 <= g.rel_l2);
    double *r1 = malloc((size_t)n1 * sizeof *r1);
    double diff = 0;
    for (int64_t k = 0; k < n1; k++) {
        r1[k] = y1[k];
        diff = fmax(diff, fabs((double)y1[k] - y0[k]));
    }
    errs e1 = compare(y2 + n0, r1, n1);
    printf("batch 2: row 0 vs reference rel-L2 %.3g, row 1 vs its own run rel-L2 %.3g\n", e0.rel_l2,
           e1.rel_l2);
    assert_true(e1.rel_l2 <= 1e-5);
    assert_true(diff > 1e-2); /* the rows really differ */

    free(r1);
    free(ref);
    free(y0);
    free(y1);
    free(y2);
    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
}

/* ids as integers, of two different dtypes, or in the deprecated [1, S, 3] form give the
 * same output as the f32 [S, 3] ids (positions are small integers: exact in every dtype). */
static void test_ids_of_other_dtypes_and_forms_give_the_same_output(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, MODEL_DIR, &m), DF_OK);
    df_flux_inputs in = golden_inputs(ctx, &g);
    int64_t n;
    float *want = forward(ctx, m, &in, &n);

    df_tensor *ids[2];
    const char *names[2] = {"in.img_ids", "in.txt_ids"};
    for (int i = 0; i < 2; i++) {
        st_tensor *t = st_find(&g.in, names[i]);
        int64_t k = st_numel(t);
        float *v = st_f32(t);
        int64_t *iv = malloc((size_t)k * sizeof *iv);
        for (int64_t j = 0; j < k; j++)
            iv[j] = (int64_t)v[j];
        ids[i] = df_tensor_from_host(ctx, DF_DTYPE_I64, t->shape, t->ndim, iv);
        free(v);
        free(iv);
    }
    df_flux_inputs forms[3] = {in, in, in};
    forms[0].img_ids = ids[0], forms[0].txt_ids = ids[1]; /* both i64 */
    forms[1].img_ids = ids[0];                            /* i64 and f32 */
    forms[2].img_ids = df_unsqueeze(ctx, in.img_ids, 0);  /* [1, S_img, 3] */
    forms[2].txt_ids = df_unsqueeze(ctx, in.txt_ids, 0);  /* [1, S_txt, 3] */
    for (int f = 0; f < 3; f++) {
        int64_t n2;
        float *got = forward(ctx, m, &forms[f], &n2);
        assert_int_equal(n2, n);
        assert_memory_equal(got, want, (size_t)n * sizeof *got);
        free(got);
    }
    free(want);
    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
}

/* Sequential offload changes residency, not results: the same output bit for bit, and
 * no weight left resident after the forward. */
static void test_sequential_offload_gives_the_same_output(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, MODEL_DIR, &m), DF_OK);
    df_flux_inputs in = golden_inputs(ctx, &g);
    int64_t n, n2;
    float *want = forward(ctx, m, &in, &n);
    df_stats st;
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, df_flux_weight_bytes(m));

    assert_int_equal(df_flux_set_sequential_offload(m, true), DF_OK);
    float *got = forward(ctx, m, &in, &n2);
    assert_int_equal(n2, n);
    assert_memory_equal(got, want, (size_t)n * sizeof *got);
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, 0);

    assert_int_equal(df_flux_set_sequential_offload(m, false), DF_OK);
    df_ctx_stats(ctx, &st);
    assert_int_equal(st.resident_weight_bytes, df_flux_weight_bytes(m));
    free(got);
    free(want);
    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
}

/* ---- forward input errors -------------------------------------------------------------- */

static void test_bad_inputs_fail_the_context_naming_the_input(void **state)
{
    (void)state;
    golden g = golden_load();
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, MODEL_DIR, &m), DF_OK);
    df_flux_inputs in = golden_inputs(ctx, &g);

    df_flux_inputs bad = in;
    bad.hidden_states = df_zeros(ctx, DF_DTYPE_F32, (int64_t[]){1, 16, 32}, 3);
    assert_null(df_flux_forward(ctx, m, &bad));
    assert_int_equal(df_sync(ctx), DF_E_SHAPE);
    assert_non_null(strstr(df_error_message(), "hidden_states"));
    df_ctx_reset_error(ctx);

    bad = in;
    bad.img_ids = df_zeros(ctx, DF_DTYPE_F32, (int64_t[]){15, 3}, 2); /* 16 image tokens */
    assert_null(df_flux_forward(ctx, m, &bad));
    assert_int_equal(df_sync(ctx), DF_E_SHAPE);
    assert_non_null(strstr(df_error_message(), "img_ids"));
    df_ctx_reset_error(ctx);

    bad = in;
    bad.guidance = df_zeros(ctx, DF_DTYPE_F32, (int64_t[]){1}, 1);
    assert_null(df_flux_forward(ctx, m, &bad));
    assert_int_equal(df_sync(ctx), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "guidance"));
    df_ctx_reset_error(ctx);

    bad = in;
    bad.txt_ids = NULL;
    assert_null(df_flux_forward(ctx, m, &bad));
    assert_int_equal(df_sync(ctx), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "txt_ids"));

    df_flux_free(m);
    df_ctx_free(ctx);
    st_free(&g.in);
}

/* ---- malformed models ------------------------------------------------------------------ */

/* A context that has loaded and freed the golden model once, so that its own lazily grown
 * tables do not count as allocations left by a later load. */
static df_ctx *warm_ctx(void)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, MODEL_DIR, &m), DF_OK);
    df_flux_free(m);
    return ctx;
}

/* Loads `dir`, expecting failure `want` with a message holding needle1 and needle2. */
static void expect_load_error(const char *dir, df_status want, const char *needle1,
                              const char *needle2)
{
    df_ctx *ctx = warm_ctx();
    int64_t live = df_alloc_live();
    df_flux *m = (df_flux *)1;
    df_status s = df_flux_load(ctx, dir, &m);
    const char *msg = df_error_message();
    printf("  %s -> %s: %s\n", dir, df_status_name(s), msg);
    assert_int_equal(s, want);
    assert_null(m);
    assert_non_null(strstr(msg, needle1));
    if (needle2)
        assert_non_null(strstr(msg, needle2));
    assert_int_equal(df_alloc_live(), live); /* a failed load leaves nothing behind */
    df_ctx_free(ctx);
}

/* A config error with no weights in the folder: the config must be refused first. */
static void expect_config_error(const char *name, const char *from, const char *to, df_status want,
                                const char *key)
{
    char dir[1024];
    make_dir(name, dir, sizeof dir);
    write_config(dir, from, to);
    remove_weights(dir);
    expect_load_error(dir, want, "config.json", key);
}

static void test_bad_config_values_are_refused_before_the_weights(void **state)
{
    (void)state;
    expect_config_error("neg-size", "\"joint_attention_dim\": 48", "\"joint_attention_dim\": -48",
                        DF_E_FORMAT, "joint_attention_dim");
    expect_config_error("zero-heads", "\"num_attention_heads\": 2", "\"num_attention_heads\": 0",
                        DF_E_FORMAT, "num_attention_heads");
    expect_config_error("neg-depth", "\"num_single_layers\": 2", "\"num_single_layers\": -1",
                        DF_E_FORMAT, "num_single_layers");
    expect_config_error("axes-sum", "\"axes_dims_rope\": [\n    4,\n    6,\n    6\n  ]",
                        "\"axes_dims_rope\": [4, 6, 8]", DF_E_FORMAT, "axes_dims_rope");
    expect_config_error("axes-odd", "\"axes_dims_rope\": [\n    4,\n    6,\n    6\n  ]",
                        "\"axes_dims_rope\": [5, 5, 6]", DF_E_FORMAT, "axes_dims_rope");
    expect_config_error("patch", "\"patch_size\": 1", "\"patch_size\": 2", DF_E_UNSUPPORTED,
                        "patch_size");
    expect_config_error("type", "\"in_channels\": 64", "\"in_channels\": \"64\"", DF_E_FORMAT,
                        "in_channels");
    expect_config_error("class", "\"FluxTransformer2DModel\"", "\"SD3Transformer2DModel\"",
                        DF_E_UNSUPPORTED, "_class_name");
    expect_config_error("class-3d", "\"FluxTransformer2DModel\"", "\"FluxTransformer3DModel\"",
                        DF_E_UNSUPPORTED, "class 'FluxTransformer3DModel' is not supported "
                        "(this loader reads FluxTransformer2DModel)");
    expect_config_error("class-number", "\"FluxTransformer2DModel\"", "3", DF_E_FORMAT,
                        "'_class_name': expected a string");
}

/* A folder with the golden config (edited) and the golden weights (edited by `edit`). */
static const char *model_with(const char *name, const char *from, const char *to,
                              void (*edit)(st_file *), char *dir, size_t cap)
{
    make_dir(name, dir, cap);
    write_config(dir, from, to);
    st_file f = st_read(MODEL_DIR "/diffusion_pytorch_model.safetensors");
    if (edit)
        edit(&f);
    write_weights(dir, &f);
    st_free(&f);
    return dir;
}

static void test_depth_the_weights_do_not_have_is_refused(void **state)
{
    (void)state;
    char dir[1024];
    model_with("deeper", "\"num_layers\": 2", "\"num_layers\": 3", NULL, dir, sizeof dir);
    expect_load_error(dir, DF_E_FORMAT, "num_layers", "transformer_blocks.2");
    model_with("shallower", "\"num_single_layers\": 2", "\"num_single_layers\": 1", NULL, dir,
               sizeof dir);
    expect_load_error(dir, DF_E_FORMAT, "num_single_layers", "single_transformer_blocks.1");
}

static void drop_tensor(st_file *f)
{
    st_tensor *t = st_find(f, "transformer_blocks.1.attn.norm_added_k.weight");
    free(t->data);
    *t = f->t[--f->n];
}

static void reshape_tensor(st_file *f)
{
    st_tensor *t = st_find(f, "single_transformer_blocks.0.proj_mlp.weight"); /* [128, 32] */
    t->shape[0] = 64;
    t->shape[1] = 64;
}

static void add_tensor(st_file *f)
{
    f->t = realloc(f->t, (size_t)(f->n + 1) * sizeof *f->t);
    f->t[f->n++] = (st_tensor){.name = "transformer_blocks.0.attn.to_extra.weight",
                               .dtype = "F32",
                               .ndim = 1,
                               .shape = {4},
                               .data = calloc(16, 1),
                               .nbytes = 16};
}

static void test_missing_tensor_is_named(void **state)
{
    (void)state;
    char dir[1024];
    model_with("missing", NULL, NULL, drop_tensor, dir, sizeof dir);
    expect_load_error(dir, DF_E_FORMAT, "transformer_blocks.1.attn.norm_added_k.weight", "missing");
}

static void test_wrong_shape_is_named_with_both_shapes(void **state)
{
    (void)state;
    char dir[1024];
    model_with("shape", NULL, NULL, reshape_tensor, dir, sizeof dir);
    expect_load_error(dir, DF_E_FORMAT, "single_transformer_blocks.0.proj_mlp.weight", "[64, 64]");
    assert_non_null(strstr(df_error_message(), "[128, 32]"));
    assert_non_null(strstr(df_error_message(), "flux-shape/diffusion_pytorch_model.safetensors"));
}

static void test_unexpected_tensor_is_a_warning(void **state)
{
    (void)state;
    char dir[1024];
    model_with("extra", NULL, NULL, add_tensor, dir, sizeof dir);
    /* diffusers warns and loads: so do we, with one line naming the tensor */
    df_ctx *ctx = warm_ctx();
    df_flux *m = NULL;
    assert_int_equal(df_flux_load(ctx, dir, &m), DF_OK);
    assert_non_null(strstr(df_ws_last_warning(), "'transformer_blocks.0.attn.to_extra.weight'"));
    assert_non_null(strstr(df_ws_last_warning(), "not loaded"));
    df_flux_free(m);
    df_ctx_free(ctx);
}

static void test_guidance_embeds_without_its_weights_is_refused(void **state)
{
    (void)state;
    char dir[1024];
    model_with("guidance", "\"guidance_embeds\": false", "\"guidance_embeds\": true", NULL, dir,
               sizeof dir);
    expect_load_error(dir, DF_E_FORMAT, "time_text_embed.guidance_embedder.linear_1.weight",
                      "missing");
}

/* Every allocation of a load fails in turn: DF_E_OOM each time, and nothing leaks. */
static void test_load_out_of_memory_sweep(void **state)
{
    (void)state;
    df_ctx *ctx = warm_ctx();
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        df_flux *m = NULL;
        df_alloc_fail_at(nth);
        df_status s = df_flux_load(ctx, MODEL_DIR, &m);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            df_flux_free(m);
            break;
        }
        failures++;
        if (s != DF_E_OOM)
            fail_msg("allocation %lld: %s instead of DF_E_OOM: %s", (long long)nth,
                     df_status_name(s), df_error_message());
        assert_null(m);
        df_ctx_reset_error(ctx);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(failures > 3);
    assert_int_equal(df_alloc_live(), live);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_f32_within_the_case_tolerance),
        cmocka_unit_test(test_golden_bf16_compute_within_2e_2),
        cmocka_unit_test(test_fused_modes_agree_with_strict_eager),
        cmocka_unit_test(test_bf16_weights_stay_bf16_and_match),
        cmocka_unit_test(test_batch_of_two_rows_matches_single_rows),
        cmocka_unit_test(test_ids_of_other_dtypes_and_forms_give_the_same_output),
        cmocka_unit_test(test_sequential_offload_gives_the_same_output),
        cmocka_unit_test(test_bad_inputs_fail_the_context_naming_the_input),
        cmocka_unit_test(test_bad_config_values_are_refused_before_the_weights),
        cmocka_unit_test(test_depth_the_weights_do_not_have_is_refused),
        cmocka_unit_test(test_missing_tensor_is_named),
        cmocka_unit_test(test_wrong_shape_is_named_with_both_shapes),
        cmocka_unit_test(test_unexpected_tensor_is_a_warning),
        cmocka_unit_test(test_guidance_embeds_without_its_weights_is_refused),
        cmocka_unit_test(test_load_out_of_memory_sweep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
