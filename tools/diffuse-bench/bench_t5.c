/*
 * Workload "t5": the T5 encoder at T5-XXL width (d_model 4096, 64 heads of 64, d_ff 10240)
 * with 2 layers of random bf16 weights, on 256 and 512 tokens (256 only with --quick), in
 * f32 and bf16 compute, for each thread count and execution mode asked for.
 *
 * The checkpoint is written once into a temporary folder by a streaming safetensors writer
 * (header first, then each tensor generated and written in chunks, so ~770 MB of weights
 * never sit in memory at once) and removed at the end. The vocabulary is small (1024 rows):
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

typedef struct wt {
    char name[96];
    int64_t rows, cols; /* cols 0: a vector of `rows` */
    float scale;        /* uniform in [-scale, scale); 0: all ones (norm weights) */
} wt;

static int weight_list(wt *w)
{
    int n = 0;
    w[n++] = (wt){"shared.weight", VOCAB, D_MODEL, 1.0f};
    w[n++] = (wt){"encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", BUCKETS,
                  HEADS, 0.5f};
    const float in_scale = 1.7320508f / 64.0f;   /* variance 1/d_model: sqrt(3 / 4096) */
    const float ff_scale = 1.7320508f / 101.19f; /* sqrt(3 / 10240) */
    for (int l = 0; l < LAYERS; l++) {
        const char *p = "encoder.block";
        static const char *qkvo[4] = {"q", "k", "v", "o"};
        for (int i = 0; i < 4; i++) {
            /* o is [d_model, H * d_kv]; both are 4096 here */
            w[n] = (wt){"", HEADS * D_KV, D_MODEL, in_scale};
            snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.0.SelfAttention.%s.weight", p, l,
                     qkvo[i]);
        }
        w[n] = (wt){"", D_MODEL, 0, 0};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.0.layer_norm.weight", p, l);
        for (int i = 0; i < 2; i++) {
            w[n] = (wt){"", D_FF, D_MODEL, in_scale};
            snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.DenseReluDense.wi_%d.weight", p, l,
                     i);
        }
        w[n] = (wt){"", D_MODEL, D_FF, ff_scale};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.DenseReluDense.wo.weight", p, l);
        w[n] = (wt){"", D_MODEL, 0, 0};
        snprintf(w[n++].name, sizeof w->name, "%s.%d.layer.1.layer_norm.weight", p, l);
    }
    w[n++] = (wt){"encoder.final_layer_norm.weight", D_MODEL, 0, 0};
    return n;
}

static uint64_t next_random(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* Writes n bf16 values of w to f in chunks. */
static int write_values(FILE *f, const wt *w, int64_t n, uint64_t *rng)
{
    uint16_t buf[8192];
    for (int64_t done = 0; done < n;) {
        int64_t k = n - done < 8192 ? n - done : 8192;
        for (int64_t i = 0; i < k; i++) {
            float u = (float)(next_random(rng) >> 40) * (1.0f / 16777216.0f); /* [0, 1) */
            buf[i] = df_f32_to_bf16(w->scale > 0 ? (2 * u - 1) * w->scale : 1.0f);
        }
        if (fwrite(buf, sizeof *buf, (size_t)k, f) != (size_t)k)
            return 1;
        done += k;
    }
    return 0;
}

static int write_checkpoint(const char *dir)
{
    wt w[64];
    int n = weight_list(w);
    size_t cap = 256 * (size_t)n, len = 0;
    char *h = malloc(cap);
    if (!h)
        return 1;
    uint64_t off = 0;
    len += (size_t)snprintf(h + len, cap - len, "{");
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 2 * (uint64_t)w[i].rows * (uint64_t)(w[i].cols ? w[i].cols : 1);
        if (w[i].cols)
            len += (size_t)snprintf(
                h + len, cap - len,
                "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":"
                "[%" PRId64 ",%" PRId64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                i ? "," : "", w[i].name, w[i].rows, w[i].cols, off, off + bytes);
        else
            len += (size_t)snprintf(h + len, cap - len,
                                    "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":"
                                    "[%" PRId64 "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                    i ? "," : "", w[i].name, w[i].rows, off, off + bytes);
        off += bytes;
    }
    len += (size_t)snprintf(h + len, cap - len, "}");
    while (len % 8 && len < cap)
        h[len++] = ' ';

    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "wb");
    int bad = !f;
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    bad = bad || fwrite(hl, 1, 8, f) != 8 || fwrite(h, 1, len, f) != len;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int i = 0; !bad && i < n; i++)
        bad = write_values(f, &w[i], w[i].rows * (w[i].cols ? w[i].cols : 1), &rng);
    if (f && fclose(f) != 0)
        bad = 1;
    free(h);

    snprintf(path, sizeof path, "%s/config.json", dir);
    f = bad ? NULL : fopen(path, "w");
    if (!f)
        return 1;
    fprintf(f,
            "{\n  \"architectures\": [\"T5EncoderModel\"],\n  \"d_model\": %d,\n"
            "  \"d_kv\": %d,\n  \"d_ff\": %d,\n  \"num_layers\": %d,\n  \"num_heads\": %d,\n"
            "  \"relative_attention_num_buckets\": %d,\n"
            "  \"relative_attention_max_distance\": 128,\n  \"layer_norm_epsilon\": 1e-06,\n"
            "  \"feed_forward_proj\": \"gated-gelu\",\n  \"vocab_size\": %d,\n"
            "  \"torch_dtype\": \"bfloat16\"\n}\n",
            D_MODEL, D_KV, D_FF, LAYERS, HEADS, BUCKETS, VOCAB);
    return fclose(f) != 0;
}

static void remove_checkpoint(const char *dir)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* ---- the measurement ------------------------------------------------------------------- */

static double t5_gflop(int64_t s)
{
    double per_layer = 4.0 * 2 * s * D_MODEL * (double)(HEADS * D_KV) +
                       2.0 * 2 * HEADS * (double)s * s * D_KV +
                       3.0 * 2 * s * D_MODEL * (double)D_FF;
    return LAYERS * per_layer / 1e9;
}

/* One encoder run on s tokens; the wall and CPU seconds it took (until the result is on
 * the host). */
static int run_once(df_ctx *ctx, df_t5 *m, int64_t s, double *seconds, double *cpu_seconds)
{
    int64_t *ids = malloc((size_t)s * sizeof *ids);
    if (!ids)
        return 1;
    for (int64_t i = 0; i < s; i++)
        ids[i] = (i * 37 + 11) % VOCAB;
    float probe[4];
    double t0 = bench_now(), c0 = bench_cpu_now();
    df_scope mark = df_scope_begin(ctx);
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_I64, DF_SHAPE(1, s), ids);
    df_tensor *h;
    df_status st = df_t5_encode(ctx, m, t, NULL, &h);
    if (st == DF_OK)
        st = df_tensor_read(ctx, df_slice(ctx, df_slice(ctx, h, 1, 0, 1), 2, 0, 4), DF_DTYPE_F32,
                            probe, sizeof probe);
    df_scope_end(ctx, mark, NULL);
    *seconds = bench_now() - t0;
    *cpu_seconds = bench_cpu_now() - c0;
    free(ids);
    if (st != DF_OK)
        fprintf(stderr, "t5: %s\n", df_error_message());
    return st != DF_OK;
}

typedef struct setting {
    int threads;
    df_dtype dtype;
    const char *mode;
} setting;

static int measure(const bench_opts *o, const char *dir, const setting *set, int64_t s)
{
    df_ctx *ctx;
    df_eager_mode mode = strcmp(set->mode, "fuse") == 0 ? DF_DEFER_AND_FUSE : DF_DEFER_NEVER;
    if (df_ctx_create(&(df_ctx_opts){.threads = set->threads, .compute = set->dtype, .mode = mode},
                      &ctx) != DF_OK) {
        fprintf(stderr, "t5: %s\n", df_error_message());
        return 1;
    }
    df_t5 *m = NULL;
    int bad = df_t5_load(ctx, dir, &m) != DF_OK;
    if (bad)
        fprintf(stderr, "t5: %s\n", df_error_message());
    double best = 0, best_cpu = 0, sec, cpu;
    bad = bad || run_once(ctx, m, s, &sec, &cpu); /* warm-up: packing, page faults */
    df_stats_reset(ctx);
    int repeats = o->quick ? 1 : 3;
    for (int r = 0; !bad && r < repeats; r++) {
        bad = run_once(ctx, m, s, &sec, &cpu);
        if (r == 0 || sec < best)
            best = sec;
        if (r == 0 || cpu < best_cpu)
            best_cpu = cpu;
    }
    if (!bad) {
        df_stats stats;
        df_ctx_stats(ctx, &stats);
        char shape[64];
        snprintf(shape, sizeof shape, "B1xS%" PRId64 "xd%dxff%dxL%d", s, D_MODEL, D_FF, LAYERS);
        int threads = df_ctx_threads(ctx);
        double gflop = t5_gflop(s);
        /* On a shared machine the rate from CPU time (flop * threads / CPU seconds) is the
         * steadier one; it is reported beside the wall-clock rate. */
        char extra[160];
        snprintf(extra, sizeof extra, ",\"cpu_gflops\":%.1f,\"ceiling_cpu_gflops\":%.1f",
                 best_cpu > 0 ? gflop * threads / best_cpu : 0.0,
                 bench_ceiling_cpu_gflops(set->dtype, threads));
        bench_report(o, "t5", shape, threads, df_dtype_name(set->dtype), set->mode, best * 1e3,
                     gflop / best, bench_ceiling_gflops(set->dtype, threads), stats.peak_bytes,
                     extra);
    }
    df_t5_free(m);
    df_ctx_free(ctx);
    return bad;
}

int bench_t5(const bench_opts *o)
{
    static const char *modes[2] = {"eager", "fuse"};
    static const df_dtype dtypes[2] = {DF_DTYPE_F32, DF_DTYPE_BF16};
    const int64_t lengths[2] = {256, 512};
    int threads[2] = {o->threads, 0}, n_threads = 1;
    if (o->threads == 0) {
        threads[0] = 1;
        threads[1] = 2;
        n_threads = 2;
    }

    const char *tmp = getenv("TMPDIR");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/diffuse-bench-t5-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir)) {
        fprintf(stderr, "t5: cannot create a folder from %s\n", dir);
        return 1;
    }
    if (write_checkpoint(dir) != 0) {
        fprintf(stderr, "t5: cannot write the random checkpoint in %s\n", dir);
        remove_checkpoint(dir);
        return 1;
    }
    int failures = 0;
    for (int li = 0; li < (o->quick ? 1 : 2); li++)
        for (int di = 0; di < 2; di++) {
            if (o->dtype && strcmp(o->dtype, df_dtype_name(dtypes[di])) != 0)
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
    remove_checkpoint(dir);
    return failures ? 1 : 0;
}
