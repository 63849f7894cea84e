/*
 * diffuse generate: text to image.
 *
 * Options follow the DESIGN's CLI; anything not given comes from the model folder's
 * defaults (FLUX.1-schnell: 4 steps, no guidance, 256 T5 tokens, or tokenizer_2's
 * model_max_length where less, the VAE config's sample_size; SD3: 28 steps, CFG 7.0,
 * skip-layer guidance only with --slg-layers; FLUX.2-dev: 50 steps, embedded guidance 4.0;
 * FLUX.2 [klein]: distilled 4 steps, base 50 steps with CFG 4.0; both 512 text tokens). Several images are
 * written as NAME.png, NAME-1.png, ... Every PNG carries the generation parameters in a
 * tEXt chunk, and is written to a temporary name and renamed.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "cli.h"
#include "tp.h"

static void help(FILE *f)
{
    fprintf(f,
        "usage: diffuse generate -m MODEL_DIR (-p PROMPT | --prompt-file FILE) [options]\n"
        "\n"
        "  -m, --model DIR            diffusers pipeline folder (with model_index.json): FLUX.1,\n"
        "                             SD3/3.5, FLUX.2-dev or FLUX.2 [klein]; or one checkpoint\n"
        "                             file (ComfyUI's all-in-one files) with --config\n"
        "      --config DIR           with -m FILE: the diffusers folder giving the configs and\n"
        "                             tokenizers (the components the file lacks come from it)\n"
        "      --transformer FILE     the transformer's weights from one file instead of\n"
        "                             MODEL_DIR/transformer (whose config.json is used):\n"
        "                             FLUX.1, SD3 (MMDiT) or FLUX.2 in the original names,\n"
        "                             .safetensors (diffusers, BFL or ComfyUI names; f32, bf16,\n"
        "                             f16, fp8) or .gguf (F16, BF16, Q8_0, Q4_0/1, Q5_0/1,\n"
        "                             Q2_K..Q6_K)\n"
        "      --lora FILE[:SCALE]    a LoRA adapter (.safetensors: diffusers/peft, kohya or\n"
        "                             XLabs layout) merged into the weights at load, SCALE its\n"
        "                             weight (default 1); repeat for several (at most 8)\n"
        "      --vae FILE             the VAE's weights from one file (diffusers or original\n"
        "                             LDM names: ae.safetensors, FLUX.2's too; also under\n"
        "                             'vae.' / 'first_stage_model.'), MODEL_DIR/vae's config\n"
        "      --text-encoder FILE    FLUX.1 / SD3: CLIP-L from one file (clip_l.safetensors);\n"
        "                             FLUX.2: Mistral / klein's Qwen3 (ComfyUI's files)\n"
        "      --text-encoder-2 FILE  FLUX.1: T5 (t5xxl_fp16.safetensors); SD3: CLIP-G\n"
        "      --text-encoder-3 FILE  SD3: T5; text encoders in transformers' names, also\n"
        "                             under 'text_encoders.NAME.transformer.'\n"
        "      --text-encoder-3 none  SD3: run without T5, as diffusers' text_encoder_3=None\n"
        "                             (its part of the prompt is zeros; no text_encoder_3/ or\n"
        "                             tokenizer_3/ needed, a T5 in -m FILE is not read)\n"
        "  -p, --prompt TEXT          the prompt (UTF-8)\n"
        "      --prompt-file FILE     read the prompt from FILE (any length; one trailing\n"
        "                             newline is dropped)\n"
        "  -o, --output FILE          PNG to write (default: out.png)\n"
        "  -W, --width N              image width, a multiple of 16 (default: the model's;\n"
        "                             FLUX.1: vae/config.json's sample_size, 1024 for FLUX.1's\n"
        "                             own VAE, 64 for models/demo; SD3: 8 x the transformer's\n"
        "                             sample_size, 1024; FLUX.2 1024)\n"
        "  -H, --height N             image height, a multiple of 16 (default: as the width)\n"
        "      --steps N              denoising steps (default: schnell 4, dev 28; FLUX.2-dev 50,\n"
        "                             klein 4 distilled / 50 base)\n"
        "      --guidance X           guidance scale (FLUX.1-dev 3.5, schnell ignores it; SD3: CFG\n"
        "                             scale, default 7.0, classifier-free guidance when > 1;\n"
        "                             FLUX.2-dev: embedded, 4.0; klein base: CFG when > 1, 4.0;\n"
        "                             distilled klein ignores it)\n"
        "      --negative-prompt TEXT SD3, FLUX.2 [klein] base: the negative prompt for CFG\n"
        "                             (default empty); FLUX.1 Kontext: for true CFG\n"
        "      --true-cfg-scale X     FLUX.1 Kontext: above 1 with --negative-prompt, a second\n"
        "                             forward per step on it (default 1: off)\n"
        "      --clip-skip N          SD3: CLIP layers to skip from the end (default 0)\n"
        "      --slg-layers L,L,...   SD3.5: skip-layer guidance on these blocks (e.g. 7,8,9)\n"
        "      --slg-scale X          skip-layer guidance scale (default 2.8)\n"
        "      --slg-start X          fraction of the steps where it starts (default 0.01)\n"
        "      --slg-stop X           fraction of the steps where it stops (default 0.2)\n"
        "      --image FILE           image to image: start from this PNG or JPEG (FLUX.1, SD3;\n"
        "                             resized to the output size with PIL's Lanczos filter);\n"
        "                             FLUX.2: a reference image to edit (shrunk to 1024x1024\n"
        "                             pixels when larger, cropped to multiples of 16; the output\n"
        "                             takes the first one's size then, by default); repeat\n"
        "                             it for several references (up to 8);\n"
        "                             FLUX.1 Kontext (a FluxKontextPipeline folder): the one\n"
        "                             picture to edit, at the preferred Kontext resolution of\n"
        "                             its aspect ratio; with -W / -H it keeps its own size\n"
        "                             (rounded down to 16) and the output is exactly W x H\n"
        "      --strength X           image to image: the part of the steps that runs, in (0, 1]\n"
        "                             (default 0.6; 1 starts from pure noise)\n"
        "      --mask FILE            inpaint (FLUX.1, SD3): repaint where this PNG or JPEG, the\n"
        "                             --image's size, is white (grey >= 128), keep where black\n"
        "      --padding-mask-crop N  inpaint only the mask's box grown by N pixels, at the\n"
        "                             output size, and paste it back over the --image\n"
        "      --seed N               random seed; the same seed gives diffusers' own noise (default 0)\n"
        "  -n, --num-images N         images per prompt (default 1)\n"
        "      --max-sequence-length N  T5 tokens (default: schnell 256, dev 512, or\n"
        "                             tokenizer_2's model_max_length where it is less, 64 for\n"
        "                             models/demo; at most 512);\n"
        "                             FLUX.2: Mistral 3 / Qwen3 tokens (default 512)\n"
        "      --dtype f32|bf16|int8|auto  compute dtype (int8: 8-bit linears; default auto:\n"
        "                             bf16 for bf16 checkpoints where the device's bf16\n"
        "                             products measure >= 1.25x f32's, else f32; the CPU's\n"
        "                             rates are measured once and cached in DIFFUSE_CACHE_DIR;\n"
        "                             -v says the rates, which and why)\n"
        "      --int8-group N|k       with --dtype int8: k values per weight scale, 32 to 256 in\n"
        "                             steps of 4, or k for one per row (default:\n"
        "                             DIFFUSE_INT8_GROUP, else 128)\n"
        "      --int8-path NAME       with --dtype int8: the int8 kernel, portable|avx2|\n"
        "                             avx-vnni|avx512-vnni|onednn (default: DIFFUSE_INT8_PATH,\n"
        "                             else the best this CPU has)\n"
        "      --mode eager|fuse|compile  execution mode (default eager)\n"
        "      --compile-blocks       compile the repeated transformer blocks (with --mode compile\n"
        "                             they are traced into the compiled transformer)\n"
        "      --offload none|model|sequential  weight residency (default none); with\n"
        "                             --offload sequential, --mode compile compiles the\n"
        "                             repeated blocks instead of the whole transformer\n"
        "      --device NAME[:N]      auto, cpu or a plugin's device (diffuse devices lists\n"
        "                             them; default: $DIFFUSE_DEVICE, else auto)\n"
        "      --threads N            compute threads (default: all cores; per rank with --tp)\n"
        "      --tp N                 tensor parallelism over N processes, started as\n"
        "                             mpirun -np N diffuse generate --tp N ... (FLUX.1, FLUX.2)\n"
        "      --vae-tiling           decode the image in tiles (bounded memory for large images)\n"
        "      --cache SPEC           a step cache, as diffusers' transformer.enable_cache:\n"
        "                             first-block[:threshold=0.05] or\n"
        "                             taylorseer[:cache_interval=5,disable_cache_before_step=3,\n"
        "                             disable_cache_after_step=None,max_order=1,\n"
        "                             taylor_factors_dtype=bfloat16] or\n"
        "                             magcache:mag_ratios=flux|R/R/...[,threshold=0.06,\n"
        "                             max_skip_steps=3,retention_ratio=0.2,\n"
        "                             num_inference_steps=28] (FLUX.1, FLUX.2; docs/step-cache.md;\n"
        "                             -v and --stats-json say which steps computed, skipped,\n"
        "                             predicted)\n"
        "      --stats-json FILE      write the run's counters (ops, graphs, peak memory, s/step)\n"
        "  -v, --verbose              print timings and memory at the end\n"
        "      --profile              print where the time went at the end: each phase's\n"
        "                             seconds (encode, denoise, decode) and the kernels'\n"
        "                             time per op kind (off by default: timing each kernel\n"
        "                             costs a little)\n"
        "  -h, --help                 this text\n"
        "\n"
        "example:\n"
        "  diffuse generate -m ./FLUX.1-schnell -p \"a golden retriever surfing a wave\" \\\n"
        "      -W 1024 -H 1024 --seed 0 -o out.png\n");
}

static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "diffuse generate: %s expects an integer in [%ld, %ld], got '%s'\n", opt,
                lo, hi, s);
        return 2;
    }
    *out = (int)v;
    return 0;
}

static char *read_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "diffuse generate: cannot read prompt file '%s': %s\n", path,
                strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    size_t n;
    while (buf && (n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
            }
            buf = nb;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "diffuse generate: out of memory reading '%s'\n", path);
        return NULL;
    }
    if (memchr(buf, '\0', len)) {
        fprintf(stderr, "diffuse generate: prompt file '%s' contains a NUL byte\n", path);
        free(buf);
        return NULL;
    }
    if (len && buf[len - 1] == '\n')
        len--;
    if (len && buf[len - 1] == '\r')
        len--;
    buf[len] = '\0';
    return buf;
}

/* A finite number (--slg-scale, --slg-start, --slg-stop). */
static int parse_number(const char *opt, const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || end == s || !isfinite(v)) {
        fprintf(stderr, "diffuse generate: %s expects a number, got '%s'\n", opt, s);
        return 2;
    }
    *out = v;
    return 0;
}

/* "7,8,9" -> {7, 8, 9} (--slg-layers). */
static int parse_layers(const char *s, int *out, int cap, int *n)
{
    *n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (errno || end == p || v < 0 || v > 100000 || *n == cap || (*end && *end != ',')) {
            fprintf(stderr, "diffuse generate: --slg-layers expects block indices like 7,8,9 "
                            "(at most %d), got '%s'\n", cap, s);
            return 2;
        }
        out[(*n)++] = (int)v;
        if (!*end)
            return 0;
        p = end + 1;
    }
}

/* out.png -> out-3.png */
static void numbered(char *dst, size_t cap, const char *path, int i)
{
    if (i == 0) {
        snprintf(dst, cap, "%s", path);
        return;
    }
    const char *dot = strrchr(path, '.');
    const char *slash = strrchr(path, '/');
    if (!dot || (slash && dot < slash))
        dot = path + strlen(path);
    snprintf(dst, cap, "%.*s-%d%s", (int)(dot - path), path, i, dot);
}

/* The step cache's part of --stats-json: its spec, one letter per transformer call and the
 * counts of each (appended to the counters' JSON object). */
static void add_cache_stats(char *json, size_t cap, const df_cache_config *c,
                            const df_gen_output *out)
{
    size_t len = strlen(json);
    if (len < 1 || json[len - 1] != '}')
        return;
    int n[3] = {0, 0, 0};
    for (const char *t = out->cache_trace; *t; t++)
        n[*t == 'S' ? 1 : *t == 'P' ? 2 : 0]++;
    char spec[16384];
    df_cache_config_format(c, spec, sizeof spec);
    snprintf(json + len - 1, cap - (len - 1),
             ",\"cache\":\"%s\",\"cache_trace\":\"%s\",\"steps_computed\":%d,"
             "\"steps_skipped\":%d,\"steps_predicted\":%d}",
             spec, out->cache_trace, n[0], n[1], n[2]);
}

/* -v: each transformer call's fate, with the first-block cache's measured change. */
static void print_cache_steps(const df_cache_config *c, const df_gen_output *out)
{
    char spec[16384];
    df_cache_config_format(c, spec, sizeof spec);
    fprintf(stderr, "cache %s: %s (C computed, S skipped, P predicted)\n", spec,
            out->cache_trace);
    for (int i = 0; c->kind == DF_CACHE_MAG && out->cache_trace[i]; i++)
        if (!isnan(out->cache_diff[i]))
            fprintf(stderr, "  step %d: %c  accumulated error %.6f (threshold %g)\n", i,
                    out->cache_trace[i], out->cache_diff[i], c->threshold);
    for (int i = 0; c->kind == DF_CACHE_FIRST_BLOCK && out->cache_trace[i]; i++) {
        if (isnan(out->cache_diff[i]))
            fprintf(stderr, "  step %d: %c\n", i, out->cache_trace[i]);
        else
            fprintf(stderr, "  step %d: %c  change %.6f %s threshold %g\n", i,
                    out->cache_trace[i], out->cache_diff[i],
                    out->cache_diff[i] > c->threshold ? ">" : "<=", c->threshold);
    }
}

#define MAX_IMAGES 8

static void free_images(df_image **images, int n)
{
    for (int i = 0; i < n; i++)
        df_image_free(images[i]);
}

#define MAX_LORAS 8

/* --lora FILE[:SCALE]: a suffix after the last ':' that reads as a number is the scale
 * (so a path with ':' in it still works without one). */
static int parse_lora(const char *arg, char *path, df_lora_spec *out)
{
    snprintf(path, 4096, "%s", arg);
    *out = (df_lora_spec){.path = path, .scale = 1.0f};
    char *colon = strrchr(path, ':');
    if (colon && colon[1]) {
        char *end;
        float scale = strtof(colon + 1, &end);
        if (*end == '\0') {
            *colon = '\0';
            out->scale = scale;
        }
    }
    return path[0] ? 0 : 1;
}

/* Reads every --image file (refusing a bad one with its message) and lists their base names
 * and SHA-256 digests, comma-separated, for the PNG parameters. Returns 0 or 1. */
static int load_images(const char *const *paths, int n, df_image **out, char *names,
                       size_t names_cap, char *hashes, size_t hashes_cap)
{
    for (int i = 0; i < n; i++) {
        char hash[65];
        if (df_image_load(paths[i], &out[i]) != DF_OK ||
            df_file_sha256(paths[i], hash) != DF_OK) {
            fprintf(stderr, "diffuse generate: --image: %s\n", df_error_message());
            free_images(out, i + 1);
            return 1;
        }
        const char *base = strrchr(paths[i], '/');
        base = base && base[1] ? base + 1 : paths[i];
        size_t nl = strlen(names), hl = strlen(hashes);
        snprintf(names + nl, names_cap - nl, "%s%s", i ? ", " : "", base);
        snprintf(hashes + hl, hashes_cap - hl, "%s%s", i ? ", " : "", hash);
    }
    return 0;
}

/* Reads the --mask file, which must have the --image's size, with its base name and
 * SHA-256 for the PNG parameters. Returns 0 or 1. */
static int load_mask(const char *path, const df_image *image, df_image **mask, char *name,
                     size_t name_cap, char hash[66])
{
    if (df_image_load(path, mask) != DF_OK || df_file_sha256(path, hash) != DF_OK) {
        fprintf(stderr, "diffuse generate: --mask: %s\n", df_error_message());
        df_image_free(*mask);
        *mask = NULL;
        return 1;
    }
    if ((*mask)->width != image->width || (*mask)->height != image->height) {
        fprintf(stderr,
                "diffuse generate: --mask: %s is %dx%d but the --image is %dx%d: they "
                "must be the same size\n",
                path, (*mask)->width, (*mask)->height, image->width, image->height);
        df_image_free(*mask);
        *mask = NULL;
        return 1;
    }
    const char *base = strrchr(path, '/');
    snprintf(name, name_cap, "%s", base && base[1] ? base + 1 : path);
    return 0;
}

/* --profile: the run's phases and the kernels' time per op kind, largest first. */
static void print_profile(df_ctx *ctx, const df_gen_output *out)
{
    double total = 0;
    for (int i = 0; i < out->n_phases; i++)
        total += out->phases[i].seconds;
    fprintf(stderr, "profile: phases (wall seconds)\n");
    for (int i = 0; i < out->n_phases; i++)
        fprintf(stderr, "  %-8s %9.2f s %5.1f%%\n", out->phases[i].phase, out->phases[i].seconds,
                total > 0 ? 100.0 * out->phases[i].seconds / total : 0.0);
    df_profile_entry e[64];
    int n = df_ctx_profile(ctx, e, 64);
    double ms = 0;
    for (int i = 0; i < n; i++)
        ms += e[i].ms;
    fprintf(stderr, "profile: kernels (all phases; seconds of the kernels' own time)\n");
    for (int i = 0; i < n; i++)
        fprintf(stderr, "  %-18s %9.2f s %5.1f%% %10lld calls\n", e[i].op, e[i].ms / 1000.0,
                ms > 0 ? 100.0 * e[i].ms / ms : 0.0, (long long)e[i].calls);
}

int cmd_generate(int argc, char **argv)
{
    enum { O_PROMPT_FILE = 256, O_STEPS, O_GUIDANCE, O_SEED, O_MAXSEQ, O_DTYPE, O_MODE,
           O_COMPILE_BLOCKS, O_OFFLOAD, O_DEVICE, O_THREADS, O_TILING, O_STATS,
           O_NEGATIVE, O_CLIP_SKIP, O_SLG_LAYERS, O_SLG_SCALE, O_SLG_START, O_SLG_STOP, O_TP,
           O_CACHE, O_TRANSFORMER, O_LORA, O_VAE, O_TE1, O_TE2, O_TE3, O_CONFIG,
           O_IMAGE, O_STRENGTH, O_MASK, O_PADDING_MASK_CROP, O_INT8_GROUP, O_INT8_PATH,
           O_TRUE_CFG, O_PROFILE };
    static const struct option longopts[] = {
        {"model", required_argument, 0, 'm'},     {"prompt", required_argument, 0, 'p'},
        {"prompt-file", required_argument, 0, O_PROMPT_FILE},
        {"output", required_argument, 0, 'o'},    {"width", required_argument, 0, 'W'},
        {"height", required_argument, 0, 'H'},    {"steps", required_argument, 0, O_STEPS},
        {"guidance", required_argument, 0, O_GUIDANCE}, {"seed", required_argument, 0, O_SEED},
        {"num-images", required_argument, 0, 'n'},
        {"max-sequence-length", required_argument, 0, O_MAXSEQ},
        {"dtype", required_argument, 0, O_DTYPE}, {"mode", required_argument, 0, O_MODE},
        {"compile-blocks", no_argument, 0, O_COMPILE_BLOCKS},
        {"offload", required_argument, 0, O_OFFLOAD}, {"device", required_argument, 0, O_DEVICE},
        {"threads", required_argument, 0, O_THREADS}, {"vae-tiling", no_argument, 0, O_TILING},
        {"stats-json", required_argument, 0, O_STATS}, {"verbose", no_argument, 0, 'v'},
        {"profile", no_argument, 0, O_PROFILE},
        {"help", no_argument, 0, 'h'},
        {"negative-prompt", required_argument, 0, O_NEGATIVE},
        {"clip-skip", required_argument, 0, O_CLIP_SKIP},
        {"slg-layers", required_argument, 0, O_SLG_LAYERS},
        {"slg-scale", required_argument, 0, O_SLG_SCALE},
        {"slg-start", required_argument, 0, O_SLG_START},
        {"slg-stop", required_argument, 0, O_SLG_STOP},
        {"tp", required_argument, 0, O_TP}, {"cache", required_argument, 0, O_CACHE},
        {"transformer", required_argument, 0, O_TRANSFORMER},
        {"lora", required_argument, 0, O_LORA},
        {"vae", required_argument, 0, O_VAE}, {"config", required_argument, 0, O_CONFIG},
        {"text-encoder", required_argument, 0, O_TE1},
        {"text-encoder-2", required_argument, 0, O_TE2},
        {"text-encoder-3", required_argument, 0, O_TE3},
        {"image", required_argument, 0, O_IMAGE},
        {"strength", required_argument, 0, O_STRENGTH},
        {"true-cfg-scale", required_argument, 0, O_TRUE_CFG},
        {"mask", required_argument, 0, O_MASK},
        {"padding-mask-crop", required_argument, 0, O_PADDING_MASK_CROP},
        {"int8-group", required_argument, 0, O_INT8_GROUP},
        {"int8-path", required_argument, 0, O_INT8_PATH}, {0, 0, 0, 0}};
    const char *model = NULL, *prompt = NULL, *prompt_file = NULL, *output = "out.png";
    const char *stats_path = NULL, *image_paths[MAX_IMAGES], *mask_path = NULL;
    int n_image_paths = 0;
    df_load_opts lo = {.auto_dtype = true};
    df_lora_spec loras[MAX_LORAS];
    static char lora_paths[MAX_LORAS][4096];
    df_gen_params g = {0};
    df_cache_config cache;
    int verbose = 0, profile = 0, rc;
    int slg_layers[64];
    int tp = 0, muted = cli_tp_mute_others(); /* usage errors from rank 0 only */
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "m:p:o:W:H:n:vh", longopts, NULL)) != -1;) {
        switch (c) {
        case 'm': model = optarg; break;
        case 'p': prompt = optarg; break;
        case O_PROMPT_FILE: prompt_file = optarg; break;
        case 'o': output = optarg; break;
        case 'W': if ((rc = parse_int("--width", optarg, 16, 16384, &g.width))) return rc; break;
        case 'H': if ((rc = parse_int("--height", optarg, 16, 16384, &g.height))) return rc; break;
        case 'n': if ((rc = parse_int("--num-images", optarg, 1, 64, &g.num_images))) return rc; break;
        case O_STEPS: if ((rc = parse_int("--steps", optarg, 1, 1000, &g.steps))) return rc; break;
        case O_MAXSEQ:
            if ((rc = parse_int("--max-sequence-length", optarg, 1, 512, &g.max_sequence_length)))
                return rc;
            break;
        case O_THREADS: if ((rc = parse_int("--threads", optarg, 1, 1024, &lo.threads))) return rc; break;
        case O_GUIDANCE: {
            char *end;
            g.guidance = strtof(optarg, &end);
            if (*end || end == optarg) {
                fprintf(stderr, "diffuse generate: --guidance expects a number, got '%s'\n", optarg);
                return 2;
            }
            g.guidance_set = true;
            break;
        }
        case O_SEED: {
            char *end;
            errno = 0;
            g.seed = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || optarg[0] == '-') {
                fprintf(stderr, "diffuse generate: --seed expects a non-negative integer, got '%s'\n",
                        optarg);
                return 2;
            }
            break;
        }
        case O_INT8_GROUP: /* the library checks the steps of 4 */
            if (!strcmp(optarg, "k"))
                lo.int8_group = -1;
            else if ((rc = parse_int("--int8-group", optarg, 32, 256, &lo.int8_group)))
                return rc;
            break;
        case O_INT8_PATH:
            lo.int8_path = optarg; /* checked by the CPU device as the pipeline loads */
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "auto")) {
                lo.auto_dtype = true;
            } else if (!strcmp(optarg, "f32") || !strcmp(optarg, "bf16") ||
                       !strcmp(optarg, "int8")) {
                lo.auto_dtype = false;
                df_dtype_parse(optarg, &lo.dtype);
            } else {
                fprintf(stderr, "diffuse generate: --dtype is f32, bf16, int8 or auto, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_MODE:
            if (!strcmp(optarg, "eager")) {
                lo.mode = DF_DEFER_NEVER;
            } else if (!strcmp(optarg, "fuse")) {
                lo.mode = DF_DEFER_AND_FUSE;
            } else if (!strcmp(optarg, "compile")) {
                lo.mode = DF_DEFER_AND_FUSE; /* the transformer compiled, the rest fused */
                lo.compile = true;
            } else {
                fprintf(stderr, "diffuse generate: --mode is eager, fuse or compile, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_COMPILE_BLOCKS:
            lo.compile_blocks = true;
            break;
        case O_OFFLOAD:
            if (!strcmp(optarg, "none")) {
                lo.offload = DF_OFFLOAD_NONE;
            } else if (!strcmp(optarg, "model")) {
                lo.offload = DF_OFFLOAD_MODEL;
            } else if (!strcmp(optarg, "sequential")) {
                lo.offload = DF_OFFLOAD_SEQUENTIAL;
            } else {
                fprintf(stderr, "diffuse generate: --offload is none, model or sequential, "
                                "not '%s'\n", optarg);
                return 2;
            }
            break;
        case O_NEGATIVE: g.negative_prompt = optarg; break;
        case O_CLIP_SKIP:
            if ((rc = parse_int("--clip-skip", optarg, 0, 64, &g.clip_skip)))
                return rc;
            break;
        case O_SLG_LAYERS:
            if ((rc = parse_layers(optarg, slg_layers, 64, &g.n_slg_layers)))
                return rc;
            g.slg_layers = slg_layers;
            break;
        case O_SLG_SCALE: {
            double v;
            if ((rc = parse_number("--slg-scale", optarg, &v)))
                return rc;
            g.slg_scale = (float)v;
            break;
        }
        case O_SLG_START:
            if ((rc = parse_number("--slg-start", optarg, &g.slg_start)))
                return rc;
            break;
        case O_SLG_STOP:
            if ((rc = parse_number("--slg-stop", optarg, &g.slg_stop)))
                return rc;
            break;
        case O_DEVICE: lo.device = optarg; break;
        case O_TILING: g.vae_tiling = true; break;
        case O_TP: if ((rc = parse_int("--tp", optarg, 1, 4096, &tp))) return rc; break;
        case O_CACHE:
            if (df_cache_config_parse(optarg, &cache) != DF_OK) {
                fprintf(stderr, "diffuse generate: %s\n", df_error_message());
                return 2;
            }
            g.cache = &cache;
            break;
        case O_TRANSFORMER: lo.transformer_file = optarg; break;
        case O_LORA:
            if (lo.n_loras == MAX_LORAS) {
                fprintf(stderr, "diffuse generate: at most %d --lora options\n", MAX_LORAS);
                return 2;
            }
            if (parse_lora(optarg, lora_paths[lo.n_loras], &loras[lo.n_loras]) != 0) {
                fprintf(stderr, "diffuse generate: --lora '%s': expected FILE or FILE:SCALE\n",
                        optarg);
                return 2;
            }
            lo.loras = loras;
            lo.n_loras++;
            break;
        case O_VAE: lo.vae_file = optarg; break;
        case O_CONFIG: lo.config_dir = optarg; break;
        case O_TE1: lo.text_encoder_file = optarg; break;
        case O_TE2: lo.text_encoder_2_file = optarg; break;
        case O_TE3: /* "none": the library refuses it with a file (./none names one) */
            if (!strcmp(optarg, "none"))
                lo.no_text_encoder_3 = true;
            else
                lo.text_encoder_3_file = optarg;
            break;
        case O_IMAGE:
            if (n_image_paths == MAX_IMAGES) {
                fprintf(stderr, "diffuse generate: at most %d --image options\n", MAX_IMAGES);
                return 2;
            }
            image_paths[n_image_paths++] = optarg;
            break;
        case O_STRENGTH:
            if ((rc = parse_number("--strength", optarg, &g.strength)))
                return rc;
            if (!(g.strength > 0 && g.strength <= 1)) {
                fprintf(stderr, "diffuse generate: --strength must be in (0, 1], not %s\n",
                        optarg);
                return 2;
            }
            break;
        case O_TRUE_CFG: {
            double scale;
            if ((rc = parse_number("--true-cfg-scale", optarg, &scale)))
                return rc;
            g.true_cfg_scale = (float)scale;
            break;
        }
        case O_MASK: mask_path = optarg; break;
        case O_PADDING_MASK_CROP:
            if ((rc = parse_int("--padding-mask-crop", optarg, 1, 1 << 16,
                                &g.padding_mask_crop)))
                return rc;
            break;
        case O_STATS: stats_path = optarg; break;
        case 'v': verbose = 1; break;
        case O_PROFILE: profile = 1; break;
        case 'h': help(stdout); return 0;
        default: help(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "diffuse generate: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!model || (!prompt && !prompt_file) || (prompt && prompt_file)) {
        fprintf(stderr, "diffuse generate: need -m MODEL_DIR and one of -p PROMPT or "
                        "--prompt-file FILE (see --help)\n");
        return 2;
    }
    /* Fail before minutes of work when the image could not be written anyway. */
    char out_dir[4096];
    snprintf(out_dir, sizeof out_dir, "%s", output);
    char *slash_out = strrchr(out_dir, '/');
    if (slash_out)
        *(slash_out == out_dir ? slash_out + 1 : slash_out) = '\0';
    else
        snprintf(out_dir, sizeof out_dir, ".");
    if (access(out_dir, W_OK) != 0) {
        fprintf(stderr, "diffuse generate: cannot write '%s': %s\n", output, strerror(errno));
        return 1;
    }
    if (g.strength != 0 && !n_image_paths) {
        fprintf(stderr, "diffuse generate: --strength needs --image FILE\n");
        return 2;
    }
    if (mask_path && n_image_paths != 1) {
        fprintf(stderr, "diffuse generate: --mask needs one --image FILE to paint into, not "
                        "%d\n", n_image_paths);
        return 2;
    }
    if (g.padding_mask_crop && !mask_path) {
        fprintf(stderr, "diffuse generate: --padding-mask-crop needs --mask FILE\n");
        return 2;
    }
    /* The input pictures are read and checked before any model loads. */
    df_image *init_images[MAX_IMAGES] = {0}, *mask = NULL;
    char init_names[MAX_IMAGES * 256] = "", init_hashes[MAX_IMAGES * 66] = "";
    char mask_name[256] = "", mask_hash[66] = "";
    if (load_images(image_paths, n_image_paths, init_images, init_names, sizeof init_names,
                    init_hashes, sizeof init_hashes))
        return 1;
    if (mask_path && load_mask(mask_path, init_images[0], &mask, mask_name, sizeof mask_name,
                               mask_hash)) {
        free_images(init_images, n_image_paths);
        return 1;
    }
    g.mask = mask;
    if (n_image_paths == 1)
        g.image = init_images[0];
    else if (n_image_paths > 1)
        g.images = (const df_image *const *)init_images, g.n_images = n_image_paths;
    char *file_prompt = NULL;
    if (prompt_file && !(prompt = file_prompt = read_file(prompt_file))) {
        free_images(init_images, n_image_paths);
        return 1;
    }
    cli_tp_unmute(muted);
    cli_tp tpc;
    if ((rc = cli_tp_start(tp, &lo.threads, &tpc))) {
        free(file_prompt);
        free_images(init_images, n_image_paths);
        return rc;
    }
    lo.tp = tp;
    lo.comm = tpc.comm;
    if (lo.compile && lo.offload == DF_OFFLOAD_SEQUENTIAL && tpc.rank == 0)
        fprintf(stderr, "diffuse generate: --offload sequential changes residency between "
                        "blocks, which one compiled program cannot hold: compiling the "
                        "repeated blocks instead (--compile-blocks)\n");

    df_pipeline *p = NULL;
    df_gen_output out = {0};
    int status = 1;
    double t0 = 0;
    df_status s = df_pipeline_load(model, &lo, &p);
    if (s == DF_OK && profile)
        df_ctx_set_profiling(df_pipeline_ctx(p), true);
    if (s == DF_OK && verbose && tpc.rank == 0) {
        const char *why;
        df_dtype dt = df_pipeline_compute_dtype(p, &why);
        fprintf(stderr, "compute dtype %s: %s\n", df_dtype_name(dt), why);
        if (df_pipeline_shipped_config(p))
            fprintf(stderr, "config: shipped %s (tokenizers from %s)\n",
                    df_pipeline_shipped_config(p), lo.config_dir);
        if (df_pipeline_t5_off(p))
            fprintf(stderr, "T5: off (%s), its part of the prompt embeddings is zeros\n",
                    lo.no_text_encoder_3 ? "--text-encoder-3 none"
                                         : "text_encoder_3 is null in model_index.json");
    }
    /* FLUX.1 Kontext: an explicit -W / -H is the output size (the area diffusers fits the
     * size to is W x H) and the picture keeps its own size (_auto_resize=False); without
     * them, diffusers' defaults. */
    if (s == DF_OK && strcmp(df_pipeline_class(p), "FluxKontextPipeline") == 0 &&
        (g.width || g.height)) {
        int size;
        df_pipeline_defaults(p, NULL, NULL, NULL, &size);
        g.width = g.width ? g.width : size;
        g.height = g.height ? g.height : size;
        g.max_area = (int64_t)g.width * g.height;
        g.keep_image_size = true;
    }
    if (s == DF_OK) {
        g.prompt = prompt;
        g.progress = tpc.rank == 0 ? df_progress_bar : NULL;
        df_stats_reset(df_pipeline_ctx(p));
        s = df_pipeline_run(p, &g, &out);
    }
    (void)t0;
    if (s == DF_OK) {
        status = 0;
        for (int i = 0; i < out.count && status == 0; i++) {
            char path[4096], *params = NULL;
            numbered(path, sizeof path, output, i);
            const char *slash = strrchr(model, '/');
            df_image_params ip = {.prompt = prompt, .negative_prompt = g.negative_prompt,
                                  .steps = out.steps, .sampler = "Euler",
                                  .cfg_scale = out.guidance, .seed = g.seed + 0,
                                  .width = out.width, .height = out.height,
                                  .model = slash && slash[1] ? slash + 1 : model};
            if (mask) {
                ip.mask_image = mask_name;
                ip.mask_image_hash = mask_hash;
                ip.mask_padding = g.padding_mask_crop;
            }
            if (n_image_paths) {
                ip.init_image = init_names;
                ip.init_image_hash = init_hashes;
                /* FLUX.2 and Kontext take the picture as a reference and always start from
                 * noise */
                bool reference = strncmp(df_pipeline_class(p), "Flux2", 5) == 0 ||
                                 strcmp(df_pipeline_class(p), "FluxKontextPipeline") == 0;
                ip.denoising_strength = reference ? 0 : g.strength != 0 ? g.strength : 0.6;
            }
            s = df_image_format_parameters(&ip, &params);
            if (s == DF_OK)
                s = df_image_save_png(out.images[i], path, params);
            df_image_text_free(params);
            if (s != DF_OK) {
                fprintf(stderr, "diffuse generate: %s\n", df_error_message());
                status = 1;
            } else {
                printf("%s\n", path);
            }
        }
    } else if (tpc.rank == 0) { /* with --tp, rank 0 holds the failing rank's message */
        fprintf(stderr, "diffuse generate: %s\n", df_error_message());
    }
    if (p && tpc.rank == 0 && (stats_path || verbose || profile)) {
        df_stats st;
        df_ctx_stats(df_pipeline_ctx(p), &st);
        static char json[24576]; /* the counters and a cache spec of up to 1000 ratios */
        df_stats_to_json(&st, json, sizeof json);
        if (g.cache && g.cache->kind != DF_CACHE_NONE)
            add_cache_stats(json, sizeof json, g.cache, &out);
        if (stats_path) {
            FILE *f = fopen(stats_path, "w");
            if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f) != 0) {
                fprintf(stderr, "diffuse generate: cannot write %s: %s\n", stats_path,
                        strerror(errno));
                status = 1;
            }
        }
        if (verbose)
            for (int i = 0; i < out.n_phases; i++)
                fprintf(stderr, "%-8s weights resident: peak %8.1f MiB, after %8.1f MiB; "
                                "RSS %8.1f MiB\n",
                        out.phases[i].phase, out.phases[i].peak_resident_weight_bytes / 1048576.0,
                        out.phases[i].resident_weight_bytes / 1048576.0,
                        out.phases[i].rss_bytes / 1048576.0);
        if (verbose && g.cache && g.cache->kind != DF_CACHE_NONE)
            print_cache_steps(g.cache, &out);
        if (profile)
            print_profile(df_pipeline_ctx(p), &out);
        if (verbose)
            fprintf(stderr, "steps %lld, %.3f s/step, peak device bytes %.1f MiB, peak RSS "
                            "%.1f MiB, resident weights %.1f MiB\n",
                    (long long)st.steps, st.seconds_per_step, st.peak_bytes / 1048576.0,
                    st.peak_rss_bytes / 1048576.0, st.resident_weight_bytes / 1048576.0);
    }
    df_gen_output_free(&out);
    df_pipeline_free(p);
    cli_tp_end(&tpc);
    free(file_prompt);
    free_images(init_images, n_image_paths);
    df_image_free(mask);
    return status;
}
