/*
 * diffuse-bench: the command line, the workload table, and the report format.
 *
 *   diffuse-bench [--json] [--quick] [--profile] [--threads N] [--dtype f32|bf16|int8]
 *                 [--mode eager|fuse|compile|blocks] [--device D] WORKLOAD [args]
 *
 * The common options may come before or after the workload's name; everything else after
 * the name is the workload's own arguments. A measurement is printed as a table row (a
 * header comes first), or with --json as one JSON object per line. Timing is wall-clock
 * from a monotonic clock; workloads time around df_sync so that queued work is counted.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* Workloads written in other files of this folder. */
int bench_load(const bench_opts *o);
int bench_tokenizer(const bench_opts *o);
int bench_flux(const bench_opts *o);
int bench_flux2(const bench_opts *o);
int bench_t5(const bench_opts *o);
int bench_decoder_lm(const bench_opts *o);
int bench_vae(const bench_opts *o);
int bench_compile(const bench_opts *o);
int bench_sd3(const bench_opts *o);
int bench_tp(const bench_opts *o);
int bench_cache(const bench_opts *o);
int bench_lora(const bench_opts *o);
int bench_peer(const bench_opts *o);

static const bench_workload workloads[] = {
    {"ceiling", "best GEMM rate of the provider (oneDNN), f32 and bf16, 1 and 2 threads",
     bench_ceiling},
    {"gemm",
     "df_linear with bias at FLUX shapes (M = 1536/3072/4608, K, N = 3072/12288) "
     "against the ceiling",
     bench_gemm},
    {"attention",
     "df_attention, 24 heads of 128, 4608 and 1536 tokens, against the GEMM "
     "ceiling",
     bench_attention},
    /* Workloads of other parts, added once their files exist. */
    {"load", "opening and reading a sharded checkpoint [--size 2G] [--shards 4] [--dir D]",
     bench_load},
    {"tokenizer", "tokens per second of the CLIP and T5 tokenizers [GOLDEN_DIR]", bench_tokenizer},
    {"flux", "FLUX.1 transformer blocks at full width [--double N] [--single N]", bench_flux},
    {"flux2",
     "FLUX.2 transformer at klein-4B and dev width, 512x512 and 1024x1024 [--double N] "
     "[--single N] [--width klein|dev] [--size 512|1024]",
     bench_flux2},
    {"t5", "T5-XXL-width encoder layers on 256 and 512 tokens, f32, bf16 and int8", bench_t5},
    {"decoder-lm",
     "FLUX.2's text encoders (Qwen3 4B / 8B, Mistral Small 3) at full width, 2 layers on 512 "
     "tokens, f32, bf16 and int8 [--width qwen3-4b|qwen3-8b|mistral-24b]",
     bench_decoder_lm},
    {"vae", "VAE decoder whole and tiled [SIZE [TILE [OVERLAP]]]", bench_vae},
    {"modes",
     "FLUX.1-width transformer in every execution mode side by side: first call, ms per step, "
     "peak memory, kernels; --profile adds time per op kind [--double N] [--single N] "
     "[--repeats N]",
     bench_modes},
    {"compile", "compile time of the whole transformer and of its repeated blocks at depth 8 "
                "and 19+38 [--width 3072]",
     bench_compile},
    {"device",
     "--device D (default vulkan) against the CPU in the same run: df_linear GFLOP/s on "
     "square sizes against the nominal peak (--peak GFLOPS; else unknown), and a "
     "FLUX.1-shaped step in eager, fuse and compile with the device's counters [--peak G] "
     "[--full]",
     bench_device},
    {"sd3", "SD3.5-medium-width transformer step with CFG at 512x512", bench_sd3},
    {"single-file",
     "load time, resident memory and step time of a FLUX.1 transformer from a single file "
     "(safetensors/GGUF) or a folder: CONFIG_DIR [FILE] [--tokens IMG TXT] [--runs N]",
     bench_single_file},
    {"tp",
     "tensor parallelism: FLUX.1-width transformer at 512x512, 1 process x 2 threads against "
     "2 ranks x 1 thread (thread communicator) [--double N] [--single N] [--repeats N] "
     "[--rounds N]",
     bench_tp},
    {"cache",
     "step caches (first-block, taylorseer) against the uncached run of a FluxPipeline / "
     "Flux2KleinPipeline folder: s/step, speed-up, trace, PSNR DIR [--steps 28] [--size 512] "
     "[--guidance 3.5] [--cache SPEC]...",
     bench_cache},
    {"lora",
     "an unmerged LoRA on a FLUX-width linear (M = 4096, K = N = 3072, rank 16 and 64): the "
     "plain linear, the side product as products and an add, and df_linear's fused form; "
     "f32 and int8 [--reps N]",
     bench_lora},
    {"peer",
     "diffuse against PyTorch + diffusers on one FLUX.1 double + single block pair at "
     "1024+512 tokens in the same run: f32, bf16, int8 against torch eager and torch.compile, "
     "and the ratios [--python PATH (default $DIFFUSE_PEER_PYTHON)] [--script PATH]",
     bench_peer},
};
#define N_WORKLOADS ((int)(sizeof workloads / sizeof workloads[0]))

bool bench_quick;
const char *bench_device_name;

double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double bench_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void bench_fill_random(float *p, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        p[i] = (float)((double)(s >> 11) / (double)(1ull << 52) - 1.0);
    }
}

/* s as the body of a JSON string (quotes and backslashes escaped, controls dropped). */
static void put_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, f);
    }
    fputc('"', f);
}

void bench_report(const bench_opts *o, const char *workload, const char *shape, int threads,
                  const char *dtype, const char *mode, double ms, double gflops,
                  double ceiling_gflops, int64_t peak_bytes, const char *extra)
{
    if (o->json) {
        printf("{\"workload\":");
        put_json_string(stdout, workload);
        printf(",\"shape\":");
        put_json_string(stdout, shape);
        printf(",\"threads\":%d,\"dtype\":", threads);
        put_json_string(stdout, dtype);
        printf(",\"mode\":");
        put_json_string(stdout, mode);
        printf(",\"ms\":%.4f,\"gflops\":%.2f,\"ceiling_gflops\":%.2f,\"peak_bytes\":%lld%s}\n", ms,
               gflops, ceiling_gflops, (long long)peak_bytes, extra ? extra : "");
        fflush(stdout);
        return;
    }
    static bool header;
    if (!header) {
        printf("%-10s %-34s %3s %-5s %-6s %11s %9s %9s %6s %10s  %s\n", "workload", "shape", "thr",
               "dtype", "mode", "ms", "GFLOP/s", "ceiling", "ratio", "peak MiB", "extra");
        header = true;
    }
    char ratio[16] = "-";
    if (ceiling_gflops > 0 && gflops > 0)
        snprintf(ratio, sizeof ratio, "%.3f", gflops / ceiling_gflops);
    const char *e = extra ? extra : "";
    if (*e == ',')
        e++;
    printf("%-10s %-34s %3d %-5s %-6s %11.3f %9.1f %9.1f %6s %10.1f  %s\n", workload, shape,
           threads, dtype, mode, ms, gflops, ceiling_gflops, ratio,
           (double)peak_bytes / (1024.0 * 1024.0), e);
    fflush(stdout);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse-bench [--json] [--quick] [--profile] [--threads N] "
               "[--dtype f32|bf16|int8] [--mode eager|fuse|compile|blocks] [--device D] "
               "WORKLOAD [args]\n\n"
               "  --json       one JSON object per measurement, per line\n"
               "  --quick      small shapes, few repeats (smoke runs)\n"
               "  --profile    per-op-kind time profile, where the workload offers one\n"
               "  --threads N  compute threads (default: 1 and 2 where the workload says so)\n"
               "  --dtype T    compute dtype f32, bf16 or int8 (default: all)\n"
               "  --mode M     execution mode eager, fuse, compile or blocks (default: eager;\n"
               "               modes: every mode, or a comma-separated list)\n"
               "  --device D   the device the contexts open (modes, device; default: the\n"
               "               default device)\n\n"
               "workloads:\n");
    for (int i = 0; i < N_WORKLOADS; i++)
        fprintf(f, "  %-10s %s\n", workloads[i].name, workloads[i].help);
}

/* Whether v is a comma-separated list of execution modes. */
static bool modes_valid(const char *v)
{
    static const char *const known[] = {"eager", "fuse", "compile", "blocks"};
    for (const char *p = v;;) {
        size_t len = strcspn(p, ",");
        bool ok = false;
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
            ok = ok || (strlen(known[k]) == len && !strncmp(p, known[k], len));
        if (!ok)
            return false;
        if (!p[len])
            return true;
        p += len + 1;
    }
}

int main(int argc, char **argv)
{
    bench_opts o = {0};
    const char *name = NULL;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            free(rest);
            return 0;
        } else if (strcmp(a, "--device") == 0 && v) {
            o.device = bench_device_name = v;
            i++;
        } else if (strcmp(a, "--json") == 0) {
            o.json = true;
        } else if (strcmp(a, "--quick") == 0) {
            o.quick = true;
        } else if (strcmp(a, "--profile") == 0) {
            o.profile = true;
        } else if (strcmp(a, "--threads") == 0 && v) {
            char *end;
            long t = strtol(v, &end, 10);
            if (*end || t < 1 || t > 4096) {
                fprintf(stderr, "diffuse-bench: --threads needs a positive count, not '%s'\n", v);
                free(rest);
                return 2;
            }
            o.threads = (int)t;
            i++;
        } else if (strcmp(a, "--dtype") == 0 && v) {
            if (strcmp(v, "int8") == 0)
                v = "i8";
            if (strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0 && strcmp(v, "i8") != 0) {
                fprintf(stderr, "diffuse-bench: --dtype is f32, bf16 or int8, not '%s'\n", v);
                free(rest);
                return 2;
            }
            o.dtype = v;
            i++;
        } else if (strcmp(a, "--mode") == 0 && v) {
            if (!modes_valid(v)) {
                fprintf(stderr,
                        "diffuse-bench: --mode is eager, fuse, compile or blocks (or, for "
                        "'modes', a comma-separated list of them), not '%s'\n",
                        v);
                free(rest);
                return 2;
            }
            o.mode = v;
            i++;
        } else if (!name && a[0] != '-') {
            name = a;
        } else if (name) {
            rest[o.argc++] = argv[i];
        } else {
            fprintf(stderr, "diffuse-bench: unknown option '%s'\n\n", a);
            usage(stderr);
            free(rest);
            return 2;
        }
    }
    o.argv = rest;
    bench_quick = o.quick;
    if (!name) {
        usage(stderr);
        free(rest);
        return 2;
    }
    bool blocks_ok = strcmp(name, "flux2") == 0 && strcmp(o.mode ? o.mode : "", "blocks") == 0;
    if (o.mode && strcmp(name, "modes") != 0 && strcmp(name, "device") != 0 &&
        strcmp(o.mode, "eager") != 0 &&
        strcmp(o.mode, "fuse") != 0 && !blocks_ok) {
        fprintf(stderr, "diffuse-bench: '%s' takes --mode eager or fuse, not '%s'\n", name,
                o.mode);
        free(rest);
        return 2;
    }
    for (int i = 0; i < N_WORKLOADS; i++) {
        if (strcmp(workloads[i].name, name) == 0) {
            int rc = workloads[i].run(&o);
            free(rest);
            return rc;
        }
    }
    fprintf(stderr, "diffuse-bench: no workload named '%s'\n\n", name);
    usage(stderr);
    free(rest);
    return 2;
}
