/*
 * Tests for the text encoders (src/models/clip.c, src/models/t5.c): the te-clip-l,
 * te-clip-g and te-t5 golden cases through the library API with the cases' tolerances,
 * the pooling rules, hidden-state requests, config and checkpoint errors, bf16 weights, and
 * an out-of-memory sweep of the loaders.
 *
 * Checkpoint variants (a tensor left out, an extra one, bf16 copies) are written into
 * DF_TEST_TMP by a small safetensors writer of the test's own, so the loader is checked
 * against files it did not write.
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
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "core/alloc.h"
#include "models/loader.h"

#define GOLDEN(rel) DF_GOLDEN_DIR "/" rel

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    return ctx;
}

/* ---- golden case data --------------------------------------------------------------- */

typedef struct golden {
    df_safetensors *st;
    df_json *json;
} golden;

static golden golden_open(const char *case_name)
{
    golden g;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/case.safetensors", DF_GOLDEN_DIR, case_name);
    if (df_safetensors_open(path, &g.st) != DF_OK)
        fail_msg("%s", df_error_message());
    snprintf(path, sizeof path, "%s/%s/case.json", DF_GOLDEN_DIR, case_name);
    if (df_json_parse_file(path, &g.json) != DF_OK)
        fail_msg("%s", df_error_message());
    return g;
}

static void golden_close(golden *g)
{
    df_safetensors_free(g->st);
    df_json_free(g->json);
}

/* A tensor of case.safetensors as i64 or f64 (malloc'd), with its shape. */
static void *golden_read(const golden *g, const char *name, df_dtype as, int64_t *shape, int *ndim,
                         int64_t *numel)
{
    df_tensor_info info;
    if (df_safetensors_find(g->st, name, &info) != DF_OK)
        fail_msg("%s", df_error_message());
    void *p = malloc((size_t)info.numel * 8);
    assert_non_null(p);
    assert_int_equal(df_safetensors_read(g->st, name, as, p, (size_t)info.numel * 8), DF_OK);
    if (shape)
        memcpy(shape, info.shape, sizeof(int64_t) * (size_t)info.ndim);
    if (ndim)
        *ndim = info.ndim;
    *numel = info.numel;
    return p;
}

/* Input ids of a case as a host array and a tensor. */
static df_tensor *golden_ids(df_ctx *ctx, const golden *g, const char *name, int64_t **host)
{
    int64_t shape[8], n;
    int ndim;
    *host = golden_read(g, name, DF_DTYPE_I64, shape, &ndim, &n);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, shape, ndim, *host);
    assert_non_null(t);
    return t;
}

typedef struct error_stats {
    double max_abs, rel_l2;
} error_stats;

static error_stats errors_of(const double *got, const double *want, int64_t n)
{
    double max_abs = 0, diff2 = 0, ref2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs(got[i] - want[i]);
        max_abs = d > max_abs ? d : max_abs;
        diff2 += d * d;
        ref2 += want[i] * want[i];
    }
    return (error_stats){max_abs, sqrt(diff2) / sqrt(ref2)};
}

/* Reads t as f64 (n elements, shape checked against out.<output>). */
static double *read_f64(df_ctx *ctx, df_tensor *t, int64_t n)
{
    assert_non_null(t);
    assert_int_equal(df_tensor_numel(t), n);
    double *got = malloc((size_t)n * sizeof *got);
    assert_non_null(got);
    df_status s = df_tensor_read(ctx, t, DF_DTYPE_F64, got, (size_t)n * sizeof *got);
    if (s != DF_OK)
        fail_msg("%s", df_error_message());
    return got;
}

/* Compares t with out.<output> against the case's tolerance for it. */
static error_stats check_output(df_ctx *ctx, const golden *g, const char *case_name,
                                const char *output, df_tensor *t)
{
    char name[128];
    snprintf(name, sizeof name, "out.%s", output);
    int64_t shape[8], n;
    int ndim;
    double *want = golden_read(g, name, DF_DTYPE_F64, shape, &ndim, &n);
    assert_int_equal(df_tensor_ndim(t), ndim);
    for (int d = 0; d < ndim; d++)
        assert_int_equal(df_tensor_dim(t, d), shape[d]);
    double *got = read_f64(ctx, t, n);
    error_stats e = errors_of(got, want, n);
    const df_json *tol = df_json_get(df_json_get(g->json, "tolerance"), output);
    double max_abs, rel_l2;
    assert_int_equal(df_json_get_double(tol, "max_abs", &max_abs), DF_OK);
    assert_int_equal(df_json_get_double(tol, "rel_l2", &rel_l2), DF_OK);
    printf("    %s %-26s max_abs %.3g (limit %.3g)  rel_l2 %.3g (limit %.3g)\n", case_name, output,
           e.max_abs, max_abs, e.rel_l2, rel_l2);
    assert_true(e.max_abs <= max_abs);
    assert_true(e.rel_l2 <= rel_l2);
    free(want);
    free(got);
    return e;
}

/* ---- a small safetensors writer ----------------------------------------------------- */

typedef struct st_entry {
    char name[160];
    const char *dtype; /* "F32", "BF16", "I64" */
    int64_t shape[4];
    int ndim;
    void *data; /* malloc'd, owned by the entry */
    size_t nbytes;
} st_entry;

typedef struct st_file {
    st_entry e[128];
    int n;
} st_file;

static void st_add(st_file *f, const char *name, const char *dtype, const int64_t *shape, int ndim,
                   const void *data, size_t nbytes)
{
    assert_true(f->n < 128);
    st_entry *e = &f->e[f->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    memcpy(e->shape, shape, sizeof(int64_t) * (size_t)ndim);
    e->data = malloc(nbytes ? nbytes : 1);
    assert_non_null(e->data);
    memcpy(e->data, data, nbytes);
    e->nbytes = nbytes;
}

/* Header (JSON padded with spaces to a multiple of 8), then the tensors back to back. */
static void st_write(st_file *f, const char *path)
{
    size_t cap = 64 + (size_t)f->n * 320, len = 0, off = 0;
    char *h = malloc(cap);
    assert_non_null(h);
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < f->n; i++) {
        const st_entry *e = &f->e[i];
        len += (size_t)snprintf(h + len, cap - len, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[",
                                i ? "," : "", e->name, e->dtype);
        for (int d = 0; d < e->ndim; d++)
            len += (size_t)snprintf(h + len, cap - len, "%s%lld", d ? "," : "",
                                    (long long)e->shape[d]);
        len += (size_t)snprintf(h + len, cap - len, "],\"data_offsets\":[%zu,%zu]}", off,
                                off + e->nbytes);
        off += e->nbytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    assert_true(len + 8 < cap);
    while (len % 8)
        h[len++] = ' ';
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    assert_int_equal(fwrite(hl, 1, 8, fp), 8);
    assert_int_equal(fwrite(h, 1, len, fp), len);
    for (int i = 0; i < f->n; i++) {
        assert_int_equal(fwrite(f->e[i].data, 1, f->e[i].nbytes, fp), f->e[i].nbytes);
        free(f->e[i].data);
    }
    assert_int_equal(fclose(fp), 0);
    free(h);
    f->n = 0;
}

/* ---- model folder variants ---------------------------------------------------------- */

/* DF_TEST_TMP/<name>, created empty of our files. */
static void tmp_dir(const char *name, char *buf, size_t cap)
{
    mkdir(DF_TEST_TMP, 0755);
    snprintf(buf, cap, "%s/%s", DF_TEST_TMP, name);
    mkdir(buf, 0755);
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fputs(text, fp);
    assert_int_equal(fclose(fp), 0);
}

static char *read_text(const char *path)
{
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, fp), (size_t)n);
    s[n] = 0;
    fclose(fp);
    return s;
}

/* config.json of `src_dir` with the line holding "key" replaced by `"key": value,`. */
static void write_config_with(const char *src_dir, const char *dst_dir, const char *key,
                              const char *value)
{
    char path[1024], quoted[128];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    char *cfg = read_text(path);
    snprintf(quoted, sizeof quoted, "\"%s\"", key);
    char *at = strstr(cfg, quoted);
    assert_non_null(at);
    char *eol = strchr(at, '\n');
    assert_non_null(eol);
    bool last = eol[-1] != ',';
    size_t n = strlen(cfg) + strlen(value) + 256;
    char *out = malloc(n);
    assert_non_null(out);
    snprintf(out, n, "%.*s\"%s\": %s%s%s", (int)(at - cfg), cfg, key, value, last ? "" : ",", eol);
    write_text(dst_dir, "config.json", out);
    free(out);
    free(cfg);
}

static void copy_config(const char *src_dir, const char *dst_dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    char *cfg = read_text(path);
    write_text(dst_dir, "config.json", cfg);
    free(cfg);
}

/* Writes `dst_dir`/model.safetensors: the weights of `src_dir` in `dtype` (F32 or BF16),
 * without the tensor `skip` (NULL: none), plus `extra` (an I64 [1, 77] tensor; NULL: none). */
static void write_weights(const char *src_dir, const char *dst_dir, df_dtype dtype,
                          const char *skip, const char *extra)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", src_dir);
    df_safetensors *src;
    if (df_safetensors_open(path, &src) != DF_OK)
        fail_msg("%s", df_error_message());
    static st_file f;
    f.n = 0;
    for (int64_t i = 0; i < df_safetensors_count(src); i++) {
        df_tensor_info info;
        assert_int_equal(df_safetensors_at(src, i, &info), DF_OK);
        if (skip && strcmp(info.name, skip) == 0)
            continue;
        size_t es = df_dtype_size(dtype), nbytes = (size_t)info.numel * es;
        void *buf = malloc(nbytes);
        assert_non_null(buf);
        assert_int_equal(df_safetensors_read(src, info.name, dtype, buf, nbytes), DF_OK);
        st_add(&f, info.name, dtype == DF_DTYPE_BF16 ? "BF16" : "F32", info.shape, info.ndim, buf,
               nbytes);
        free(buf);
    }
    if (extra) {
        int64_t pos[77];
        for (int i = 0; i < 77; i++)
            pos[i] = i;
        st_add(&f, extra, "I64", (int64_t[]){1, 77}, 2, pos, sizeof pos);
    }
    df_safetensors_free(src);
    int len = snprintf(path, sizeof path, "%s/model.safetensors", dst_dir);
    assert_true(len > 0 && len < (int)sizeof path);
    st_write(&f, path);
}

/* ---- golden cases --------------------------------------------------------------------- */

static void run_clip_case(const char *case_name, const char *folder, bool projection)
{
    df_ctx *ctx = new_ctx();
    golden g = golden_open(case_name);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s/%s", DF_GOLDEN_DIR, case_name, folder);
    df_clip *m = NULL;
    if (df_clip_load(ctx, dir, &m) != DF_OK)
        fail_msg("%s", df_error_message());
    assert_int_equal(df_clip_get_config(m)->with_projection, projection);

    int64_t *host;
    df_tensor *ids = golden_ids(ctx, &g, "in.input_ids", &host);
    df_clip_output o;
    df_status s = df_clip_encode(
        ctx, m, ids, &(df_clip_request){.hidden_states = {-2}, .n_hidden_states = 1}, &o);
    if (s != DF_OK)
        fail_msg("%s", df_error_message());
    check_output(ctx, &g, case_name, "last_hidden_state", o.last_hidden_state);
    check_output(ctx, &g, case_name, "hidden_states_m2", o.hidden_states[0]);
    if (projection) {
        check_output(ctx, &g, case_name, "text_embeds", o.text_embeds);
    } else {
        assert_null(o.text_embeds);
        check_output(ctx, &g, case_name, "pooler_output", o.pooler_output);
    }
    free(host);
    df_clip_free(m);
    golden_close(&g);
    df_ctx_free(ctx);
}

static void test_golden_clip_l(void **state)
{
    (void)state;
    run_clip_case("te-clip-l", "text_encoder", false);
}

static void test_golden_clip_g(void **state)
{
    (void)state;
    run_clip_case("te-clip-g", "text_encoder_2", true);
}

static void test_golden_t5(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    golden g = golden_open("te-t5");
    df_t5 *m = NULL;
    if (df_t5_load(ctx, GOLDEN("te-t5/text_encoder_2"), &m) != DF_OK)
        fail_msg("%s", df_error_message());
    int64_t *ids_host, *mask_host;
    df_tensor *ids = golden_ids(ctx, &g, "in.input_ids", &ids_host);
    df_tensor *mask = golden_ids(ctx, &g, "in.attention_mask", &mask_host);
    df_tensor *plain, *masked;
    assert_int_equal(df_t5_encode(ctx, m, ids, NULL, &plain), DF_OK);
    assert_int_equal(df_t5_encode(ctx, m, ids, mask, &masked), DF_OK);
    check_output(ctx, &g, "te-t5", "last_hidden_state", plain);
    check_output(ctx, &g, "te-t5", "last_hidden_state_masked", masked);
    free(ids_host);
    free(mask_host);
    df_t5_free(m);
    golden_close(&g);
    df_ctx_free(ctx);
}

/* ---- pooling and hidden states -------------------------------------------------------- */

/* Row `pos` of batch row `b` of a [B, S, D] tensor read as f64. */
static void row_of(const double *x, int64_t s, int64_t d, int64_t b, int64_t pos, double *out)
{
    memcpy(out, x + (b * s + pos) * d, (size_t)d * sizeof *out);
}

static void test_clip_pools_at_first_eos_when_eos_id_is_not_2(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    golden g = golden_open("te-clip-l");
    int64_t *host;
    df_tensor *ids = golden_ids(ctx, &g, "in.input_ids", &host);
    int64_t s = df_tensor_dim(ids, 1);
    /* Pick as "EOS" the id at position 3 of row 0 (a word, not the largest id). */
    int64_t eos = host[3], first = -1;
    for (int64_t j = 0; j < s && first < 0; j++)
        if (host[j] == eos)
            first = j;
    int64_t argmax = 0;
    for (int64_t j = 1; j < s; j++)
        if (host[j] > host[argmax])
            argmax = j;
    assert_true(first >= 0 && first != argmax);

    char dir[1024], value[32];
    tmp_dir("te_clip_eos", dir, sizeof dir);
    snprintf(value, sizeof value, "%lld", (long long)eos);
    write_config_with(GOLDEN("te-clip-l/text_encoder"), dir, "eos_token_id", value);
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL, NULL);
    df_clip *m = NULL;
    if (df_clip_load(ctx, dir, &m) != DF_OK)
        fail_msg("%s", df_error_message());
    df_clip_output o;
    assert_int_equal(df_clip_encode(ctx, m, ids, NULL, &o), DF_OK); /* EOS found on the device */
    int64_t d = df_clip_get_config(m)->hidden_size, b = df_tensor_dim(ids, 0);
    double *last = read_f64(ctx, o.last_hidden_state, b * s * d);
    double *pooled = read_f64(ctx, o.pooler_output, b * d);
    double *want = malloc((size_t)d * sizeof *want);
    row_of(last, s, d, 0, first, want);
    assert_memory_equal(pooled, want, (size_t)d * sizeof *want);
    row_of(last, s, d, 0, argmax, want);
    assert_memory_not_equal(pooled, want, (size_t)d * sizeof *want);
    free(want);
    free(last);
    free(pooled);
    free(host);
    df_clip_free(m);
    golden_close(&g);
    df_ctx_free(ctx);
}

static void test_clip_hidden_state_indices(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    golden g = golden_open("te-clip-l");
    int64_t *host;
    df_tensor *ids = golden_ids(ctx, &g, "in.input_ids", &host);
    df_clip *m = NULL;
    if (df_clip_load(ctx, GOLDEN("te-clip-l/text_encoder"), &m) != DF_OK)
        fail_msg("%s", df_error_message());
    int64_t layers = df_clip_get_config(m)->num_hidden_layers;
    int64_t n = df_tensor_numel(ids) * df_clip_get_config(m)->hidden_size;
    df_clip_output o;
    df_clip_request req = {.hidden_states = {-1, (int)layers, -2, (int)layers - 1, 0},
                           .n_hidden_states = 5};
    assert_int_equal(df_clip_encode(ctx, m, ids, &req, &o), DF_OK);
    double *a = read_f64(ctx, o.hidden_states[0], n), *b = read_f64(ctx, o.hidden_states[1], n);
    double *c = read_f64(ctx, o.hidden_states[2], n), *d = read_f64(ctx, o.hidden_states[3], n);
    double *last = read_f64(ctx, o.last_hidden_state, n);
    assert_memory_equal(a, b, (size_t)n * sizeof *a); /* -1 is the last layer's output */
    assert_memory_equal(c, d, (size_t)n * sizeof *c); /* -2 the one before */
    assert_memory_not_equal(a, c, (size_t)n * sizeof *a);
    assert_memory_not_equal(a, last, (size_t)n * sizeof *a); /* before final_layer_norm */
    /* hidden_states[0] is the embeddings: the token row plus the position row */
    double *emb = read_f64(ctx, o.hidden_states[4], n);
    assert_memory_not_equal(emb, a, (size_t)n * sizeof *a);
    free(emb);
    free(a), free(b), free(c), free(d), free(last);

    req = (df_clip_request){.hidden_states = {(int)layers + 1}, .n_hidden_states = 1};
    assert_int_equal(df_clip_encode(ctx, m, ids, &req, &o), DF_E_ARG);
    assert_null(o.last_hidden_state);
    req = (df_clip_request){.hidden_states = {-(int)layers - 2}, .n_hidden_states = 1};
    assert_int_equal(df_clip_encode(ctx, m, ids, &req, &o), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "hidden_states"));

    /* An id one past the vocabulary: only the device sees the ids, so the stream fails in
     * the token embedding's gather, naming the id. */
    int64_t vocab = df_clip_get_config(m)->vocab_size;
    host[5] = vocab;
    df_tensor *bad = df_tensor_from_host(ctx, DF_DTYPE_I64, df_tensor_shape(ids), 2, host);
    assert_int_equal(df_clip_encode(ctx, m, bad, NULL, &o), DF_OK);
    assert_int_equal(df_sync(ctx), DF_E_ARG);
    char id[32];
    snprintf(id, sizeof id, "id %lld", (long long)vocab);
    assert_non_null(strstr(df_error_message(), id));
    df_ctx_reset_error(ctx);
    free(host);
    df_clip_free(m);
    golden_close(&g);
    df_ctx_free(ctx);
}

/* ---- config and checkpoint errors ------------------------------------------------------ */

static df_status clip_load_status(df_ctx *ctx, const char *dir)
{
    df_clip *m = (df_clip *)1;
    df_status s = df_clip_load(ctx, dir, &m);
    if (s == DF_OK)
        df_clip_free(m);
    else
        assert_null(m);
    return s;
}

static df_status t5_load_status(df_ctx *ctx, const char *dir)
{
    df_t5 *m = (df_t5 *)1;
    df_status s = df_t5_load(ctx, dir, &m);
    assert_null(m);
    return s;
}

/* config.json of `src_dir` with the first `from` replaced by `to`. */
static void write_config_replaced(const char *src_dir, const char *dst_dir, const char *from,
                                  const char *to)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", src_dir);
    char *cfg = read_text(path);
    char *at = strstr(cfg, from);
    assert_non_null(at);
    size_t n = strlen(cfg) + strlen(to) + 1;
    char *out = malloc(n);
    assert_non_null(out);
    snprintf(out, n, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    write_text(dst_dir, "config.json", out);
    free(out);
    free(cfg);
}

/* The class a config names decides the loader: an unknown one is refused, naming the file. */
static void test_config_class_is_checked(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[512];
    static const struct {
        const char *src, *from, *to;
        df_status want;
        const char *word;
    } cases[] = {
        {"te-clip-l/text_encoder", "\"CLIPTextModel\"", "\"BertModel\"", DF_E_UNSUPPORTED,
         "key 'architectures[0]': class 'BertModel'"},
        {"te-clip-l/text_encoder", "\"CLIPTextModel\"", "7", DF_E_FORMAT,
         "key 'architectures[0]': expected a string"},
        {"te-clip-l/text_encoder", "\"architectures\": [\n    \"CLIPTextModel\"\n  ]",
         "\"architectures\": \"CLIPTextModel\"", DF_E_FORMAT, "expected an array"},
        {"te-clip-l/text_encoder", "{", "{\"_class_name\": 3, ", DF_E_FORMAT,
         "key '_class_name': expected a string"},
        {"te-t5/text_encoder_2", "\"T5EncoderModel\"", "\"MT5EncoderModel\"", DF_E_UNSUPPORTED,
         "class 'MT5EncoderModel'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "te_class_%zu", i);
        tmp_dir(name, dir, sizeof dir);
        char src[512];
        snprintf(src, sizeof src, "%s/%s", DF_GOLDEN_DIR, cases[i].src);
        write_config_replaced(src, dir, cases[i].from, cases[i].to);
        write_weights(src, dir, DF_DTYPE_F32, NULL, NULL);
        bool t5 = strstr(cases[i].src, "t5") != NULL;
        df_status s = t5 ? t5_load_status(ctx, dir) : clip_load_status(ctx, dir);
        if (s != cases[i].want || !strstr(df_error_message(), "config.json") ||
            !strstr(df_error_message(), cases[i].word))
            fail_msg("case %zu: got %s '%s', expected %s with '%s'", i, df_status_name(s),
                     df_error_message(), df_status_name(cases[i].want), cases[i].word);
    }
    df_ctx_free(ctx);
}

static void test_clip_negative_hidden_size_names_the_key(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    tmp_dir("te_clip_negative", dir, sizeof dir);
    write_config_with(GOLDEN("te-clip-l/text_encoder"), dir, "hidden_size", "-64");
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(clip_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "'hidden_size'"));
    assert_non_null(strstr(df_error_message(), "-64"));
    df_ctx_free(ctx);
}

static void test_clip_heads_must_divide_hidden_size(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    tmp_dir("te_clip_heads", dir, sizeof dir);
    write_config_with(GOLDEN("te-clip-l/text_encoder"), dir, "num_attention_heads", "5");
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(clip_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "'num_attention_heads'"));
    assert_non_null(strstr(df_error_message(), "hidden_size 64"));
    df_ctx_free(ctx);
}

static void test_clip_unknown_activation_is_unsupported(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    tmp_dir("te_clip_act", dir, sizeof dir);
    write_config_with(GOLDEN("te-clip-l/text_encoder"), dir, "hidden_act", "\"swish\"");
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(clip_load_status(ctx, dir), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "swish"));
    df_ctx_free(ctx);
}

static void test_clip_missing_tensor_is_named(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    const char *gone = "text_model.encoder.layers.1.mlp.fc2.bias";
    tmp_dir("te_clip_missing", dir, sizeof dir);
    copy_config(GOLDEN("te-clip-l/text_encoder"), dir);
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, gone, NULL);
    assert_int_equal(clip_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), gone));
    assert_non_null(strstr(df_error_message(), "missing"));
    df_ctx_free(ctx);
}

static void test_clip_position_ids_buffer_is_ignored(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    tmp_dir("te_clip_position_ids", dir, sizeof dir);
    copy_config(GOLDEN("te-clip-l/text_encoder"), dir);
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL,
                  "text_model.embeddings.position_ids");
    df_clip *m = NULL;
    if (df_clip_load(ctx, dir, &m) != DF_OK)
        fail_msg("%s", df_error_message());
    df_clip_free(m);
    /* any other unexpected tensor loads with a warning naming it (as in diffusers) */
    tmp_dir("te_clip_unexpected", dir, sizeof dir);
    copy_config(GOLDEN("te-clip-l/text_encoder"), dir);
    write_weights(GOLDEN("te-clip-l/text_encoder"), dir, DF_DTYPE_F32, NULL,
                  "text_model.embeddings.extra");
    assert_int_equal(clip_load_status(ctx, dir), DF_OK);
    assert_non_null(strstr(df_ws_last_warning(), "'text_model.embeddings.extra'"));
    df_ctx_free(ctx);
}

static void test_t5_config_and_checkpoint_errors(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[1024];
    const char *src = GOLDEN("te-t5/text_encoder_2");
    tmp_dir("te_t5_ff", dir, sizeof dir);
    write_config_with(src, dir, "feed_forward_proj", "\"relu\"");
    write_weights(src, dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(t5_load_status(ctx, dir), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "feed_forward_proj"));

    tmp_dir("te_t5_heads", dir, sizeof dir);
    write_config_with(src, dir, "num_heads", "0");
    write_weights(src, dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(t5_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "'num_heads'"));

    /* d_kv 8 would need q of [32, 64]; the checkpoint's is [64, 64] */
    tmp_dir("te_t5_dkv", dir, sizeof dir);
    write_config_with(src, dir, "d_kv", "8");
    write_weights(src, dir, DF_DTYPE_F32, NULL, NULL);
    assert_int_equal(t5_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "encoder.block.0.layer.0.SelfAttention.q.weight"));

    const char *gone = "encoder.block.2.layer.1.DenseReluDense.wi_1.weight";
    tmp_dir("te_t5_missing", dir, sizeof dir);
    copy_config(src, dir);
    write_weights(src, dir, DF_DTYPE_F32, gone, NULL);
    assert_int_equal(t5_load_status(ctx, dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), gone));
    df_ctx_free(ctx);
}

static void test_t5_bad_inputs(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_t5 *m = NULL;
    if (df_t5_load(ctx, GOLDEN("te-t5/text_encoder_2"), &m) != DF_OK)
        fail_msg("%s", df_error_message());
    int64_t vocab = df_t5_get_config(m)->vocab_size;
    int64_t ids[6] = {5, 6, 7, 8, 9, 1}, mask[4] = {1, 1, 1, 0};
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(2, 3), ids);
    df_tensor *mk = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(2, 2), mask);
    df_tensor *h = (df_tensor *)1;
    assert_int_equal(df_t5_encode(ctx, m, t, mk, &h), DF_E_ARG); /* mask [2, 2] for [2, 3] */
    assert_null(h);
    assert_non_null(strstr(df_error_message(), "mask"));
    float f[6] = {0};
    df_tensor *ft = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(2, 3), f);
    assert_int_equal(df_t5_encode(ctx, m, ft, NULL, &h), DF_E_ARG); /* float ids */

    /* an id past the vocabulary fails when the lookup runs, never reads out of bounds */
    ids[4] = vocab;
    t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(2, 3), ids);
    df_status s = df_t5_encode(ctx, m, t, NULL, &h);
    if (s == DF_OK) {
        float out[6 * 64];
        s = df_tensor_read(ctx, h, DF_DTYPE_F32, out, sizeof out);
    }
    assert_int_equal(s, DF_E_ARG);
    df_t5_free(m);
    df_ctx_free(ctx);
}

/* ---- bf16 weights ----------------------------------------------------------------------- */

static int64_t resident(df_ctx *ctx)
{
    df_stats st;
    df_ctx_stats(ctx, &st);
    return st.resident_weight_bytes;
}

static void test_t5_bf16_weights_stay_bf16_and_match(void **state)
{
    (void)state;
    char dir[1024];
    tmp_dir("te_t5_bf16", dir, sizeof dir);
    copy_config(GOLDEN("te-t5/text_encoder_2"), dir);
    write_weights(GOLDEN("te-t5/text_encoder_2"), dir, DF_DTYPE_BF16, NULL, NULL);

    df_ctx *ctx = new_ctx();
    df_t5 *f32 = NULL, *bf16 = NULL;
    int64_t before = resident(ctx);
    assert_int_equal(df_t5_load(ctx, GOLDEN("te-t5/text_encoder_2"), &f32), DF_OK);
    int64_t f32_bytes = resident(ctx) - before;
    df_t5_free(f32);
    before = resident(ctx);
    if (df_t5_load(ctx, dir, &bf16) != DF_OK)
        fail_msg("%s", df_error_message());
    int64_t bf16_bytes = resident(ctx) - before;
    printf("    resident weight bytes: f32 %lld, bf16 %lld\n", (long long)f32_bytes,
           (long long)bf16_bytes);
    assert_true(f32_bytes > 0);
    assert_int_equal(bf16_bytes * 2, f32_bytes); /* not widened on load */

    golden g = golden_open("te-t5");
    int64_t *host, n;
    df_tensor *ids = golden_ids(ctx, &g, "in.input_ids", &host);
    df_tensor *h;
    assert_int_equal(df_t5_encode(ctx, bf16, ids, NULL, &h), DF_OK);
    double *want = golden_read(&g, "out.last_hidden_state", DF_DTYPE_F64, NULL, NULL, &n);
    double *got = read_f64(ctx, h, n);
    error_stats e = errors_of(got, want, n);
    printf("    te-t5 bf16 weights: max_abs %.3g rel_l2 %.3g (limit 2e-2)\n", e.max_abs, e.rel_l2);
    assert_true(e.rel_l2 <= 2e-2);
    assert_true(e.rel_l2 > 1e-5); /* the weights really were rounded */
    free(want);
    free(got);
    free(host);
    golden_close(&g);
    df_t5_free(bf16);
    df_ctx_free(ctx);
}

/* ---- out of memory ------------------------------------------------------------------------ */

static void test_loaders_survive_every_failed_allocation(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    const char *dirs[2] = {GOLDEN("te-clip-g/text_encoder_2"), GOLDEN("te-t5/text_encoder_2")};
    for (int which = 0; which < 2; which++) {
        /* one load first, so that the context's own tables have grown to size */
        df_clip *c0 = NULL;
        df_t5 *t0 = NULL;
        assert_int_equal(
            which == 0 ? df_clip_load(ctx, dirs[0], &c0) : df_t5_load(ctx, dirs[1], &t0), DF_OK);
        df_clip_free(c0);
        df_t5_free(t0);
        int64_t live = df_alloc_live();
        for (int k = 1;; k++) {
            df_clip *c = NULL;
            df_t5 *t = NULL;
            df_alloc_fail_at(k);
            df_status s =
                which == 0 ? df_clip_load(ctx, dirs[0], &c) : df_t5_load(ctx, dirs[1], &t);
            df_alloc_fail_at(0);
            df_clip_free(c);
            df_t5_free(t);
            df_ctx_reset_error(ctx);
            assert_int_equal(df_alloc_live(), live);
            if (s == DF_OK)
                break;
            assert_int_equal(s, DF_E_OOM);
            assert_true(k < 100000);
        }
    }
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_clip_l),
        cmocka_unit_test(test_golden_clip_g),
        cmocka_unit_test(test_golden_t5),
        cmocka_unit_test(test_clip_pools_at_first_eos_when_eos_id_is_not_2),
        cmocka_unit_test(test_clip_hidden_state_indices),
        cmocka_unit_test(test_clip_negative_hidden_size_names_the_key),
        cmocka_unit_test(test_config_class_is_checked),
        cmocka_unit_test(test_clip_heads_must_divide_hidden_size),
        cmocka_unit_test(test_clip_unknown_activation_is_unsupported),
        cmocka_unit_test(test_clip_missing_tensor_is_named),
        cmocka_unit_test(test_clip_position_ids_buffer_is_ignored),
        cmocka_unit_test(test_t5_config_and_checkpoint_errors),
        cmocka_unit_test(test_t5_bad_inputs),
        cmocka_unit_test(test_t5_bf16_weights_stay_bf16_and_match),
        cmocka_unit_test(test_loaders_survive_every_failed_allocation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
