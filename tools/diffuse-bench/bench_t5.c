/*
 * Workload "t5": the T5 encoder at T5-XXL width (d_model 4096, 64 heads of 64, d_ff 10240)
 * with 2 layers of random bf16 weights, on 256 and 512 tokens (256 only with --quick), in
 * f32, bf16 and int8 compute, for each thread count and execution mode asked for. The
 * whole T5-XXL encoder has 24 such layers: its encoding time is about 12x a row's ms.
 *
 * The checkpoint (~770 MB) is written once into a temporary folder by the streaming writer
 * of bench_checkpoint.c and removed at the end. The vocabulary is small (1024 rows):
 * the embedding lookup is not what is measured.
 *
 * Each measurement runs the encoder once to warm up (weights packed for the GEMM, pages
 * read), then times `repeats` runs and reports the fastest. GFLOP/s use the analytic count
 * of the matrix products, per layer and batch row:
 *     q, k, v, o projections   4 * 2 * S * d_model * (H * d_kv)
 *     scores and values        2 * 2 * H * S * S * d_kv
 *     wi_0, wi_1, wo           3 * 2 * S * d_model * d_ff
 * (norms, the gated GELU and residual adds are O(S * d) and left out), set against the
 * machine's GEMM ceiling for the compute dtype (bench_ceiling_gflops).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"

enum {
    D_MODEL = 4096,
    HEADS = 64,
    D_KV = 64,
    D_FF = 10240,
    LAYERS = 2,
    VOCAB = 1024,
    BUCKETS = 32,
};

/* ---- the random checkpoint ------------------------------------------------------------ */

static int weight_list(bench_weight *w)
{
    int n = 0;
    w[n++] = (bench_weight){"shared.weight", VOCAB, D_MODEL, 1.0f};
    w[n++] = (bench_weight){"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                            BUCKETS, HEADS, 0.5f};
    const float in_scale = 1.7320508f / 64.0f;   /* variance 1/d_model: sqrt(3 / 4096) */
    const float ff_scale = 1.7320508f / 101.19f; /* sqrt(3 / 10240) */
    for (int l = 0; l < LAYERS; l++) {
        const char *p = "encoder.block";
        static const char *qkvo[4] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; i++) {
            /* o is [d_model, H * d_kv]; both are 4096 here */
            w[n] = (bench_weight){"", HEADS * D_KV, D_MODEL, in_scale};
            snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.0.SelfAttention.%s.weight", p, l,
                     qkvo[i]);
        }
        w[n] = (bench_weight){"", D_MODEL, 0, 0};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.0.layer_norm.weight", p, l);
        for (int i = 0; i < 2; i++) {
            w[n] = (bench_weight){"", D_FF, D_MODEL, in_scale};
            snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.DenseReluDense.wi_%d.weight", p, l,
                     i);
        }
        w[n] = (bench_weight){"", D_MODEL, D_FF, ff_scale};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.DenseReluDense.wo.weight", p, l);
        w[n] = (bench_weight){"", D_MODEL, 0, 0};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.layer_norm.weight", p, l);
    }
    w[n++] = (bench_weight){"encoder.final_layer_norm.weight", D_MODEL, 0, 0};
    return n;
}

static int write_checkpoint(const char *dir)
{
    bench_weight w[64];
    int n = weight_list(w);
    char config[1024];
    snprintf(config, sizeof config,
             "{\n  \"architectures\": [\"T5EncoderModel\"],\n  \"d_model\": %d,\n"
             "  \"d_kv\": %d,\n  \"d_ff\": %d,\n  \"num_layers\": %d,\n  \"num_heads\": %d,\n"
             "  \"relative_attention_num_buckets\": %d,\n"
             "  \"relative_attention_max_distance\": 128,\n  \"layer_norm_epsilon\": 1e-06,\n"
             "  \"feed_forward_proj\": \"gated-gelu\",\n  \"vocab_size\": %d,\n"
             "  \"torch_dtype\": \"bfloat16\"\n}\n",
             D_MODEL, D_KV, D_FF, LAYERS, HEADS, BUCKETS, VOCAB);
    return bench_write_model(dir, w, n, config);
}

/* ---- the measurement ------------------------------------------------------------------- */

static double t5_gflop(int64_t s)
{
    double per_layer = 4.0 * 2 * s * D_MODEL * (double)(HEADS * D_KV) +
                       2.0 * 2 * HEADS * (double)s * s * D_KV +
                       3.0 * 2 * s * D_MODEL * (double)D_FF;
    return LAYERS * per_layer / 1e9;
}

static df_status load(df_ctx *ctx, const char *dir, const void *arg, void **out)
{
    (void)arg;
    return df_t5_load(ctx, dir, (df_t5 **)out);
}

static df_status encode(df_ctx *ctx, void *model, df_tensor *ids, df_tensor **out)
{
    return df_t5_encode(ctx, model, ids, NULL, out);
}

static void free_t5(void *model)
{
    df_t5_free(model);
}

typedef struct setting {
    int threads;
    df_dtype dtype;
    const char *mode;
} setting;

static int measure(const bench_opts *o, const char *dir, const setting *set, int64_t s)
{
    static const bench_encoder t5 = {
        .workload = "t5", .vocab = VOCAB, .load = load, .encode = encode, .free = free_t5};
    char shape[64];
    snprintf(shape, sizeof shape, "B1xS%" PRId64 "xd%dxff%dxL%d", s, D_MODEL, D_FF, LAYERS);
    return bench_encoder_measure(o, &t5, dir, set->threads, set->dtype, set->mode, s, shape,
                                 t5_gflop(s));
}

int bench_t5(const bench_opts *o)
{
    static const char *modes[2] = {"eager", "fuse"};
    static const df_dtype dtypes[3] = {DF_DTYPE_F32, DF_DTYPE_BF16, DF_DTYPE_I8};
    const int64_t lengths[2] = {256, 512};
    int threads[2] = {o->threads, 0}, n_threads = 1;
    if (o->threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        n_threads = 2;
    }

    char dir[1024];
    if (bench_temp_dir("t5", dir, sizeof dir))
        return 1;
    if (write_checkpoint(dir) != 0) {
        fprintf(stderr, "t5: cannot write the random checkpoint in %s\n", dir);
        bench_remove_model(dir);
        return 1;
    }
    int failures = 0;
    for (int li = 0; li < (o->quick ? 1 : 2); li++)
        for (int di = 0; di < 3; di++) {
            if (!bench_dtype_wanted(o, dtypes[di]))
                continue;
            for (int mi = 0; mi < 2; mi++) {
                if (o->mode && strcmp(o->mode, modes[mi]) != 0)
                    continue;
                for (int ti = 0; ti < n_threads; ti++) {
                    setting set = {threads[ti], dtypes[di], modes[mi]};
                    failures += measure(o, dir, &set, lengths[li]);
                }
            }
        }
    bench_remove_model(dir);
    return failures ? 1 : 0;
}
