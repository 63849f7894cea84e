/*
 * Test helper for test_mistral.c and test_qwen3.c: a tiny random decoder-only language
 * model written as a checkpoint in transformers' layout, a plain float64 reference of its
 * forward, and a runner for N in-process tensor-parallel ranks.
 *
 * The reference follows transformers' MistralModel / Qwen3Model literally: embedding, per
 * layer RMS norm, q/k/v (Qwen3: RMS norm per head), rotate_half RoPE with the cos/sin table
 * computed in float32 as MistralRotaryEmbedding does, repeat_kv, scores / sqrt(head_dim)
 * plus finfo.min where the 4-D causal + padding mask says so, softmax (a row that sees no
 * real key gives 0, as transformers 5.x with torch >= 2.5's SDPA does), o, residual, RMS norm, down(silu(gate) * up), residual;
 * the final norm gives hidden_states[L]. Weights are the checkpoint's values (bf16 ones
 * upcast exactly).
 */
#ifndef DF_TESTS_DECODER_LM_REF_H
#define DF_TESTS_DECODER_LM_REF_H

#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

typedef struct tiny_lm {
    int64_t d, f, layers, heads, kv, dh, vocab;
    double eps, theta;
    bool qk_norm, bias;
    /* weights, f64, already rounded to the checkpoint dtype */
    double *embed, *norm;
    struct tiny_layer {
        double *in_norm, *post_norm, *q, *k, *v, *o, *qb, *kb, *vb, *ob, *qn, *kn;
        double *gate, *up, *down;
    } * l;
} tiny_lm;

static inline double tiny_rand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0; /* [-1, 1) */
}

/* n values of center + amp * U(-1, 1), rounded to `dtype`'s precision. */
static inline double *tiny_fill(uint64_t *s, int64_t n, double center, double amp, df_dtype dt)
{
    double *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) {
        float v = (float)(center + amp * tiny_rand(s));
        p[i] = dt == DF_DTYPE_BF16 ? df_bf16_to_f32(df_f32_to_bf16(v)) : v;
    }
    return p;
}

static inline void tiny_init(tiny_lm *m, uint64_t seed, df_dtype dt)
{
    uint64_t s = seed;
    int64_t d = m->d, qw = m->heads * m->dh, kvw = m->kv * m->dh, f = m->f;
    m->embed = tiny_fill(&s, m->vocab * d, 0, 1, dt);
    m->norm = tiny_fill(&s, d, 1, 0.2, dt);
    m->l = calloc((size_t)m->layers, sizeof *m->l);
    for (int i = 0; i < m->layers; i++) {
        struct tiny_layer *l = &m->l[i];
        l->in_norm = tiny_fill(&s, d, 1, 0.2, dt);
        l->post_norm = tiny_fill(&s, d, 1, 0.2, dt);
        l->q = tiny_fill(&s, qw * d, 0, 0.3, dt);
        l->k = tiny_fill(&s, kvw * d, 0, 0.3, dt);
        l->v = tiny_fill(&s, kvw * d, 0, 0.3, dt);
        l->o = tiny_fill(&s, d * qw, 0, 0.2, dt);
        if (m->bias) {
            l->qb = tiny_fill(&s, qw, 0, 0.2, dt);
            l->kb = tiny_fill(&s, kvw, 0, 0.2, dt);
            l->vb = tiny_fill(&s, kvw, 0, 0.2, dt);
            l->ob = tiny_fill(&s, d, 0, 0.2, dt);
        }
        if (m->qk_norm) {
            l->qn = tiny_fill(&s, m->dh, 1, 0.2, dt);
            l->kn = tiny_fill(&s, m->dh, 1, 0.2, dt);
        }
        l->gate = tiny_fill(&s, f * d, 0, 0.3, dt);
        l->up = tiny_fill(&s, f * d, 0, 0.3, dt);
        l->down = tiny_fill(&s, d * f, 0, 0.2, dt);
    }
}

static inline void tiny_free(tiny_lm *m)
{
    for (int i = 0; i < m->layers; i++) {
        struct tiny_layer *l = &m->l[i];
        double *all[] = {l->in_norm, l->post_norm, l->q,  l->k,  l->v,    l->o,  l->qb,  l->kb,
                         l->vb,      l->ob,        l->qn, l->kn, l->gate, l->up, l->down};
        for (size_t j = 0; j < sizeof all / sizeof *all; j++)
            free(all[j]);
    }
    free(m->l);
    free(m->embed);
    free(m->norm);
}

/* ---- the checkpoint ----------------------------------------------------------------------- */

static inline void tiny_add(df_st_writer *w, df_dtype dt, const double *x, int64_t rows,
                            int64_t cols, const char *fmt, const char *prefix, int layer)
{
    char name[256];
    if (layer >= 0)
        snprintf(name, sizeof name, fmt, prefix, layer);
    else
        snprintf(name, sizeof name, fmt, prefix);
    int64_t n = rows * (cols ? cols : 1);
    float *f = malloc((size_t)n * sizeof *f);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    int64_t shape[2] = {rows, cols};
    if (df_st_writer_add_f32(w, name, dt, shape, cols ? 2 : 1, f) != DF_OK)
        fprintf(stderr, "%s\n", df_error_message());
    free(f);
}

/* Adds the language model's tensors under `prefix` ("model.language_model."). */
static inline void tiny_add_lm(df_st_writer *w, const tiny_lm *m, df_dtype dt, const char *p)
{
    int64_t d = m->d, qw = m->heads * m->dh, kvw = m->kv * m->dh, f = m->f;
    tiny_add(w, dt, m->embed, m->vocab, d, "%sembed_tokens.weight", p, -1);
    tiny_add(w, dt, m->norm, d, 0, "%snorm.weight", p, -1);
    for (int i = 0; i < m->layers; i++) {
        const struct tiny_layer *l = &m->l[i];
        tiny_add(w, dt, l->in_norm, d, 0, "%slayers.%d.input_layernorm.weight", p, i);
        tiny_add(w, dt, l->post_norm, d, 0, "%slayers.%d.post_attention_layernorm.weight", p, i);
        tiny_add(w, dt, l->q, qw, d, "%slayers.%d.self_attn.q_proj.weight", p, i);
        tiny_add(w, dt, l->k, kvw, d, "%slayers.%d.self_attn.k_proj.weight", p, i);
        tiny_add(w, dt, l->v, kvw, d, "%slayers.%d.self_attn.v_proj.weight", p, i);
        tiny_add(w, dt, l->o, d, qw, "%slayers.%d.self_attn.o_proj.weight", p, i);
        if (m->bias) {
            tiny_add(w, dt, l->qb, qw, 0, "%slayers.%d.self_attn.q_proj.bias", p, i);
            tiny_add(w, dt, l->kb, kvw, 0, "%slayers.%d.self_attn.k_proj.bias", p, i);
            tiny_add(w, dt, l->vb, kvw, 0, "%slayers.%d.self_attn.v_proj.bias", p, i);
            tiny_add(w, dt, l->ob, d, 0, "%slayers.%d.self_attn.o_proj.bias", p, i);
        }
        if (m->qk_norm) {
            tiny_add(w, dt, l->qn, m->dh, 0, "%slayers.%d.self_attn.q_norm.weight", p, i);
            tiny_add(w, dt, l->kn, m->dh, 0, "%slayers.%d.self_attn.k_norm.weight", p, i);
        }
        tiny_add(w, dt, l->gate, f, d, "%slayers.%d.mlp.gate_proj.weight", p, i);
        tiny_add(w, dt, l->up, f, d, "%slayers.%d.mlp.up_proj.weight", p, i);
        tiny_add(w, dt, l->down, d, f, "%slayers.%d.mlp.down_proj.weight", p, i);
    }
}

/* The text of the model's config keys (no braces), for a config.json. */
static inline void tiny_config_keys(const tiny_lm *m, char *buf, size_t cap)
{
    snprintf(buf, cap,
             "\"hidden_size\": %lld, \"intermediate_size\": %lld, \"num_hidden_layers\": %lld, "
             "\"num_attention_heads\": %lld, \"num_key_value_heads\": %lld, \"head_dim\": %lld, "
             "\"vocab_size\": %lld, \"rms_norm_eps\": %g, \"rope_theta\": %.17g, "
             "\"attention_bias\": %s, \"hidden_act\": \"silu\"",
             (long long)m->d, (long long)m->f, (long long)m->layers, (long long)m->heads,
             (long long)m->kv, (long long)m->dh, (long long)m->vocab, m->eps, m->theta,
             m->bias ? "true" : "false");
}

static inline void tiny_write_text(const char *dir, const char *file, const char *text)
{
    char path[1024];
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* ---- the float64 reference ---------------------------------------------------------------- */

static inline void ref_rms(const double *x, const double *w, int64_t n, double eps, double *out)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        out[i] = w[i] * (x[i] * r);
}

/* y[r] = sum_c w[r, c] x[c] (+ b[r]) */
static inline void ref_linear(const double *x, const double *w, const double *b, int64_t rows,
                              int64_t cols, double *y)
{
    for (int64_t r = 0; r < rows; r++) {
        double acc = b ? b[r] : 0;
        for (int64_t c = 0; c < cols; c++)
            acc += w[r * cols + c] * x[c];
        y[r] = acc;
    }
}

/* Rotates one head x[dh] at position pos in place (rotate_half, float32 table). */
static inline void ref_rope(const tiny_lm *m, double *x, int64_t pos)
{
    int64_t half = m->dh / 2;
    for (int64_t i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)m->theta, (float)(2 * i) / (float)m->dh);
        float ang = (float)pos * inv;
        double c = cosf(ang), s = sinf(ang);
        double a = x[i], b = x[i + half];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/*
 * hs[k] (k = 0..L, each [B, S, D], malloc'd by the caller as (L+1) * B*S*D doubles) for ids
 * [B, S] and mask [B, S] (NULL: all ones).
 */
static inline void ref_forward(const tiny_lm *m, const int64_t *ids, const int64_t *mask, int64_t B,
                               int64_t S, double *hs)
{
    int64_t d = m->d, dh = m->dh, H = m->heads, KV = m->kv, f = m->f, g = H / KV;
    int64_t bsd = B * S * d;
    double *x = hs;
    for (int64_t t = 0; t < B * S; t++)
        memcpy(x + t * d, m->embed + ids[t] * d, (size_t)d * sizeof *x);
    double *n = malloc((size_t)d * sizeof *n), *q = malloc((size_t)(B * S * H * dh) * 8);
    double *k = malloc((size_t)(B * S * KV * dh) * 8), *v = malloc((size_t)(B * S * KV * dh) * 8);
    double *att = malloc((size_t)(H * dh) * 8), *p = malloc((size_t)S * 8);
    double *gt = malloc((size_t)f * 8), *up = malloc((size_t)f * 8), *tmp = malloc((size_t)d * 8);
    for (int li = 0; li < m->layers; li++) {
        const struct tiny_layer *l = &m->l[li];
        double *y = hs + (li + 1) * bsd;
        memcpy(y, x, (size_t)bsd * sizeof *y);
        for (int64_t t = 0; t < B * S; t++) {
            ref_rms(x + t * d, l->in_norm, d, m->eps, n);
            ref_linear(n, l->q, l->qb, H * dh, d, q + t * H * dh);
            ref_linear(n, l->k, l->kb, KV * dh, d, k + t * KV * dh);
            ref_linear(n, l->v, l->vb, KV * dh, d, v + t * KV * dh);
            for (int64_t h = 0; h < H; h++) {
                double *qh = q + (t * H + h) * dh;
                if (m->qk_norm)
                    ref_rms(qh, l->qn, dh, m->eps, qh);
                ref_rope(m, qh, t % S);
            }
            for (int64_t h = 0; h < KV; h++) {
                double *kh = k + (t * KV + h) * dh;
                if (m->qk_norm)
                    ref_rms(kh, l->kn, dh, m->eps, kh);
                ref_rope(m, kh, t % S);
            }
        }
        for (int64_t b = 0; b < B; b++)
            for (int64_t i = 0; i < S; i++) {
                for (int64_t h = 0; h < H; h++) {
                    const double *qh = q + ((b * S + i) * H + h) * dh;
                    int64_t kvh = h / g;
                    double mx = -INFINITY;
                    bool any = false;
                    for (int64_t j = 0; j < S; j++) {
                        bool ok = j <= i && (!mask || mask[b * S + j]);
                        double sc = 0;
                        const double *kh = k + ((b * S + j) * KV + kvh) * dh;
                        for (int64_t e = 0; e < dh; e++)
                            sc += qh[e] * kh[e];
                        p[j] = ok ? sc / sqrt((double)dh) : -INFINITY;
                        any |= ok;
                        if (p[j] > mx)
                            mx = p[j];
                    }
                    double sum = 0;
                    for (int64_t j = 0; j < S; j++) {
                        p[j] = any ? exp(p[j] - mx) : 0.0; /* no real key: output 0 */
                        sum += p[j];
                    }
                    for (int64_t e = 0; e < dh; e++) {
                        double acc = 0;
                        for (int64_t j = 0; j < S; j++)
                            acc += p[j] * v[((b * S + j) * KV + kvh) * dh + e];
                        att[h * dh + e] = any ? acc / sum : 0.0;
                    }
                }
                double *yt = y + (b * S + i) * d;
                ref_linear(att, l->o, l->ob, d, H * dh, tmp);
                for (int64_t e = 0; e < d; e++)
                    yt[e] += tmp[e];
                ref_rms(yt, l->post_norm, d, m->eps, n);
                ref_linear(n, l->gate, NULL, f, d, gt);
                ref_linear(n, l->up, NULL, f, d, up);
                for (int64_t e = 0; e < f; e++)
                    gt[e] = gt[e] / (1 + exp(-gt[e])) * up[e];
                ref_linear(gt, l->down, NULL, d, f, tmp);
                for (int64_t e = 0; e < d; e++)
                    yt[e] += tmp[e];
            }
        x = y;
    }
    /* hidden_states[L] is after the final norm */
    double *last = hs + m->layers * bsd;
    for (int64_t t = 0; t < B * S; t++)
        ref_rms(last + t * d, m->norm, d, m->eps, last + t * d);
    free(n), free(q), free(k), free(v), free(att), free(p), free(gt), free(up), free(tmp);
}

/* max |a - b| / max(1, max |b|) */
static inline double ref_max_err(const float *a, const double *b, int64_t n)
{
    double e = 0, mb = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        e = d > e ? d : e;
        mb = fabs(b[i]) > mb ? fabs(b[i]) : mb;
    }
    return e / mb;
}

/* ---- tensor-parallel ranks ---------------------------------------------------------------- */

typedef df_status (*lm_load_fn)(df_ctx *ctx, const char *dir, df_decoder_lm **out);

typedef struct lm_job {
    df_comm *comm;
    lm_load_fn load;
    const char *dir;
    const int64_t *ids, *mask;
    int64_t B, S;
    const int *layers;
    int n_layers;
    df_status s;
    char msg[512];
    float *out; /* stacked [B, S, n_layers * D] */
    int64_t n;
    int64_t bytes_read;
} lm_job;

static inline void *lm_rank_main(void *arg)
{
    lm_job *j = arg;
    df_ctx *ctx = NULL;
    df_decoder_lm *m = NULL;
    j->s = df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx);
    if (j->s == DF_OK) {
        df_ctx_set_comm(ctx, j->comm);
        j->s = j->load(ctx, j->dir, &m);
    }
    if (j->s == DF_OK) {
        df_stats st;
        df_ctx_stats(ctx, &st);
        j->bytes_read = st.weight_bytes_read;
        df_tensor *ids = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(j->B, j->S), j->ids);
        df_tensor *mask =
            j->mask ? df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(j->B, j->S), j->mask) : NULL;
        df_tensor *out = NULL;
        j->s = df_decoder_lm_stacked(ctx, m, ids, mask, j->layers, j->n_layers, &out);
        if (j->s == DF_OK) {
            j->n = df_tensor_numel(out);
            j->out = malloc((size_t)j->n * sizeof *j->out);
            j->s = df_tensor_read(ctx, out, DF_DTYPE_F32, j->out, (size_t)j->n * sizeof *j->out);
        }
    }
    if (j->s != DF_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", df_error_message());
        df_comm_abort(j->comm);
    }
    df_decoder_lm_free(m);
    df_ctx_free(ctx);
    return NULL;
}

/* Runs `n` ranks (threads) of proto; jobs[r] get the results. */
static inline void lm_run_ranks(int n, const lm_job *proto, lm_job *jobs)
{
    df_comm *comms[4];
    pthread_t th[4];
    if (df_comm_create_threads(n, comms) != DF_OK)
        return;
    for (int r = 0; r < n; r++) {
        jobs[r] = *proto;
        jobs[r].comm = comms[r];
        pthread_create(&th[r], NULL, lm_rank_main, &jobs[r]);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < n; r++)
        df_comm_free(comms[r]);
}

/* Bytes of the model's tensors that TP splits (q, k, v, o, gate, up, down weights and the
 * colwise biases), and of those every rank holds whole (embedding, norms); rank 0 also
 * holds o's bias. esize: bytes per element in the checkpoint. */
static inline void tiny_tp_bytes(const tiny_lm *m, int64_t esize, int64_t *split,
                                 int64_t *replicated, int64_t *rank0_extra)
{
    int64_t d = m->d, qw = m->heads * m->dh, kvw = m->kv * m->dh, f = m->f;
    int64_t per = (qw * d + 2 * kvw * d + d * qw + 3 * f * d) + (m->bias ? qw + 2 * kvw : 0);
    int64_t rep = 2 * d + (m->qk_norm ? 2 * m->dh : 0);
    *split = m->layers * per * esize;
    *replicated = (m->vocab * d + d + m->layers * rep) * esize;
    *rank0_extra = m->bias ? m->layers * d * esize : 0;
}

#endif
