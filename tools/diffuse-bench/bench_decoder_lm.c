/*
 * Workload "decoder-lm": FLUX.2's text encoders, the decoder-only language models, at their
 * real widths with 2 layers of random bf16 weights, on 512 tokens (128 with --quick), in
 * f32, bf16 and int8 compute:
 *     qwen3-4b     klein 4B's Qwen3: hidden 2560, MLP 9728, 32 heads / 8 KV heads of 128,
 *                  q/k norms; the pipeline runs 27 of its layers
 *     qwen3-8b     klein 9B's Qwen3: hidden 4096, MLP 12288, 32 / 8 heads of 128; 27 layers
 *     mistral-24b  FLUX.2-dev's Mistral Small 3: hidden 5120, MLP 32768, 32 / 8 heads of 128;
 *                  30 layers
 * `--width NAME` picks one (default qwen3-4b). A whole encoding is about (layers run / 2) x
 * a row's ms. Each measurement warms up once (weights quantized or packed, pages read), then
 * times `repeats` runs and reports the fastest. GFLOP/s count the matrix products per layer:
 *     q, o            2 * 2 * S * hidden * (heads * head_dim)
 *     k, v            2 * 2 * S * hidden * (kv_heads * head_dim)
 *     scores, values  2 * 2 * heads * S * S * head_dim (the causal mask does not halve it)
 *     gate, up, down  3 * 2 * S * hidden * mlp
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

enum { LAYERS = 2, VOCAB = 1024, HEAD_DIM = 128 };

typedef struct lm_width {
    const char *name;
    const char *arch; /* config.json architectures[0] */
    int64_t hidden, mlp, heads, kv_heads;
    bool qk_norm;
} lm_width;

static const lm_width widths[] = {
    {"qwen3-4b", "Qwen3Model", 2560, 9728, 32, 8, true},
    {"qwen3-8b", "Qwen3Model", 4096, 12288, 32, 8, true},
    {"mistral-24b", "MistralModel", 5120, 32768, 32, 8, false},
};

static int weight_list(const lm_width *wd, bench_weight *w)
{
    int n = 0;
    const int64_t d = wd->hidden, qw = wd->heads * HEAD_DIM, kvw = wd->kv_heads * HEAD_DIM;
    const float in_scale = 1.7320508f / 50.6f; /* about sqrt(3 / 2560) */
    w[n++] = (bench_weight){"embed_tokens.weight", VOCAB, d, 1.0f};
    for (int l = 0; l < LAYERS; l++) {
        struct {
            const char *name;
            int64_t rows, cols;
        } m[] = {{"self_attn.q_proj", qw, d},   {"self_attn.k_proj", kvw, d},
                 {"self_attn.v_proj", kvw, d},  {"self_attn.o_proj", d, qw},
                 {"mlp.gate_proj", wd->mlp, d}, {"mlp.up_proj", wd->mlp, d},
                 {"mlp.down_proj", d, wd->mlp}};
        for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
            w[n] = (bench_weight){"", m[i].rows, m[i].cols, in_scale};
            snprintf(w[n++].name, sizeof w->name, "layers.%d.%s.weight", l, m[i].name);
        }
        static const char *const norms[4] = {"input_layernorm", "post_attention_layernorm",
                                             "self_attn.q_norm", "self_attn.k_norm"};
        for (int i = 0; i < (wd->qk_norm ? 4 : 2); i++) {
            w[n] = (bench_weight){"", i < 2 ? d : HEAD_DIM, 0, 0};
            snprintf(w[n++].name, sizeof w->name, "layers.%d.%s.weight", l, norms[i]);
        }
    }
    w[n++] = (bench_weight){"norm.weight", d, 0, 0};
    return n;
}

static int write_model(const char *dir, const lm_width *wd)
{
    bench_weight w[64];
    int n = weight_list(wd, w);
    char config[1024];
    snprintf(config, sizeof config,
             "{\n  \"architectures\": [\"%s\"],\n  \"hidden_size\": %" PRId64 ",\n"
             "  \"intermediate_size\": %" PRId64 ",\n  \"num_hidden_layers\": %d,\n"
             "  \"num_attention_heads\": %" PRId64 ",\n  \"num_key_value_heads\": %" PRId64 ",\n"
             "  \"head_dim\": %d,\n  \"vocab_size\": %d,\n  \"rms_norm_eps\": 1e-06,\n"
             "  \"rope_theta\": 1000000.0,\n  \"hidden_act\": \"silu\",\n"
             "  \"tie_word_embeddings\": false,\n  \"torch_dtype\": \"bfloat16\"\n}\n",
             wd->arch, wd->hidden, wd->mlp, LAYERS, wd->heads, wd->kv_heads, HEAD_DIM, VOCAB);
    return bench_write_model(dir, w, n, config);
}

static double lm_gflop(const lm_width *wd, int64_t s)
{
    double d = (double)wd->hidden, qw = (double)(wd->heads * HEAD_DIM),
           kvw = (double)(wd->kv_heads * HEAD_DIM);
    double per_layer = 2.0 * 2 * s * d * qw + 2.0 * 2 * s * d * kvw +
                       2.0 * 2 * wd->heads * (double)s * s * HEAD_DIM +
                       3.0 * 2 * s * d * (double)wd->mlp;
    return LAYERS * per_layer / 1e9;
}

static df_status load(df_ctx *ctx, const char *dir, const void *arg, void **out)
{
    const lm_width *wd = arg;
    return strcmp(wd->arch, "Qwen3Model") == 0 ? df_qwen3_load(ctx, dir, (df_decoder_lm **)out)
                                               : df_mistral_load(ctx, dir, (df_decoder_lm **)out);
}

/* One forward to the last layer's hidden state. */
static df_status encode(df_ctx *ctx, void *model, df_tensor *ids, df_tensor **out)
{
    df_decoder_lm_request req = {.hidden_states = {LAYERS}, .n_hidden_states = 1};
    df_decoder_lm_output lm = {0};
    df_status st = df_decoder_lm_forward(ctx, model, ids, NULL, &req, &lm);
    *out = lm.hidden_states[0];
    return st;
}

static void free_lm(void *model)
{
    df_decoder_lm_free(model);
}

static int measure(const bench_opts *o, const char *dir, const lm_width *wd, int threads,
                   df_dtype dtype, const char *mode, int64_t s)
{
    const bench_encoder lm = {.workload = "decoder-lm",
                              .vocab = VOCAB,
                              .arg = wd,
                              .load = load,
                              .encode = encode,
                              .free = free_lm};
    char shape[96];
    snprintf(shape, sizeof shape, "%s B1xS%" PRId64 "xL%d", wd->name, s, LAYERS);
    return bench_encoder_measure(o, &lm, dir, threads, dtype, mode, s, shape, lm_gflop(wd, s));
}

int bench_decoder_lm(const bench_opts *o)
{
    const lm_width *wd = &widths[0];
    for (int i = 0; i < o->argc; i++) {
        if (strcmp(o->argv[i], "--width") == 0 && i + 1 < o->argc) {
            const char *name = o->argv[++i];
            wd = NULL;
            for (size_t k = 0; k < sizeof widths / sizeof widths[0]; k++)
                if (strcmp(widths[k].name, name) == 0)
                    wd = &widths[k];
            if (!wd) {
                fprintf(stderr, "decoder-lm: unknown --width '%s' (qwen3-4b, qwen3-8b, "
                                "mistral-24b)\n", name);
                return 2;
            }
        } else {
            fprintf(stderr, "decoder-lm: unknown argument '%s' (--width NAME)\n", o->argv[i]);
            return 2;
        }
    }
    static const char *const modes[2] = {"eager", "fuse"};
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    int threads[2] = {o->threads, 0}, n_threads = 1;
    if (o->threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        n_threads = 2;
    }
    char dir[1024];
    if (bench_temp_dir("decoder-lm", dir, sizeof dir))
        return 1;
    if (write_model(dir, wd) != 0) {
        fprintf(stderr, "decoder-lm: cannot write the random checkpoint in %s\n", dir);
        bench_remove_model(dir);
        return 1;
    }
    const int64_t s = o->quick ? 128 : 512;
    int failures = 0;
    for (int di = 0; di < 3; di++) {
        if (!bench_dtype_wanted(o, dtypes[di]))
            continue;
        for (int mi = 0; mi < 2; mi++) {
            if (o->mode ? strcmp(o->mode, modes[mi]) != 0 : mi > 0)
                continue; /* without --mode: eager only */
            for (int ti = 0; ti < n_threads; ti++)
                failures += measure(o, dir, wd, threads[ti], dtypes[di], modes[mi], s);
        }
    }
    bench_remove_model(dir);
    return failures ? 1 : 0;
}
