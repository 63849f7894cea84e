/*
 * Golden kind "pipeline": a whole pipeline call, from prompt embeddings (pipe-*) or from
 * prompt strings (t2i-*), with given latents or a seeded generator. Prompts and negative
 * prompts are a string or a list (one negative per prompt); the generator is one
 * {"device": "cpu", "seed": s} or a list of them (one per image). Outputs: the final
 * latents, the float image in [0, 1] (NHWC) and the uint8 image. With --tp (tp.c) the
 * pipeline is split over the ranks and rank 0 compares.
 *
 * FluxImg2ImgPipeline / StableDiffusion3Img2ImgPipeline: args.image is a PNG or JPEG file
 * in the case folder (decoded as PIL's convert("RGB") gives it) and args.strength the part
 * of the schedule that runs (default 0.6); the folder is the text-to-image pipeline's,
 * which runs image to image when given a picture.
 *
 * FluxInpaintPipeline / StableDiffusion3InpaintPipeline: args.mask_image too (a file of the
 * case folder, the same size as the picture) and args.padding_mask_crop.
 * args.loras lists LoRA adapter files of the case folder with their set_adapters weights
 * (df_load_opts.loras).
 * "from_pretrained": {"text_encoder_3": null, "tokenizer_3": null} runs SD3 without T5, as
 * diffusers' from_pretrained(dir, text_encoder_3=None, tokenizer_3=None) did.
 * FluxKontextPipeline: args.image is the picture to edit, args.max_area the output's area
 * (default 1024 * 1024) and args._auto_resize (default true) whether the picture takes the
 * preferred Kontext resolution nearest its aspect ratio.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static int get_int(check_case *c, const char *key, int dflt, int *out)
{
    int64_t v;
    if (df_json_get_int_or(c->args, key, dflt, &v) != DF_OK)
        return check_fail(c, "args.%s: %s", key, df_error_message());
    *out = (int)v;
    return 0;
}

/* args.<key> = "in.<name>": reads the tensor; absent / null leaves *out NULL. */
static int get_tensor(check_case *c, const char *key, float **out, int64_t *shape, int *ndim)
{
    *out = NULL;
    const df_json *j = df_json_get(c->args, key);
    if (!j || df_json_is_null(j))
        return 0;
    const char *name = df_json_string(j);
    if (!name || strncmp(name, "in.", 3) != 0)
        return check_fail(c, "args.%s: expected \"in.<tensor>\"", key);
    if (check_read_f32(c, name, out, shape, ndim) != DF_OK)
        return check_fail(c, "%s: %s", name, df_error_message());
    return 0;
}

#define MAX_BATCH 64

/* args.<key>: a string (*one set, *n 0) or a list of at most MAX_BATCH strings (list[0..n)),
 * as diffusers takes prompts and negative prompts; absent / null leaves both unset. */
static int get_strings(check_case *c, const char *key, const char **one, const char **list,
                       int *n)
{
    *one = NULL, *n = 0;
    const df_json *j = df_json_get(c->args, key);
    if (!j || df_json_is_null(j))
        return 0;
    if (df_json_type_of(j) == DF_JSON_STRING) {
        *one = df_json_string(j);
        return 0;
    }
    if (df_json_type_of(j) != DF_JSON_ARRAY || df_json_array_size(j) < 1 ||
        df_json_array_size(j) > MAX_BATCH)
        return check_fail(c, "args.%s: expected a string or a list of 1 to %d strings", key,
                          MAX_BATCH);
    *n = (int)df_json_array_size(j);
    for (int i = 0; i < *n; i++)
        if (!(list[i] = df_json_string(df_json_array_get(j, i))))
            return check_fail(c, "args.%s[%d]: expected a string", key, i);
    return 0;
}

/* One {"device": "cpu", "seed": s} generator. */
static int get_generator(check_case *c, const df_json *gen, const char *what, uint64_t *seed)
{
    const char *device = df_json_string(df_json_get(gen, "device"));
    if (df_json_type_of(gen) != DF_JSON_OBJECT)
        return check_fail(c, "%s: expected {\"device\": \"cpu\", \"seed\": N}", what);
    if (device && strcmp(device, "cpu") != 0)
        return check_fail(c, "%s: only torch's CPU generator is reproduced, not '%s'", what,
                          device);
    return check_read_seed(c, gen, seed); /* exact, over torch's whole seed range */
}

/* args.generator: one generator (g->seed) or a list of them (seeds[0..n), one per image). */
static int get_generators(check_case *c, df_gen_params *g, uint64_t *seeds)
{
    const df_json *gen = df_json_get(c->args, "generator");
    if (!gen || df_json_is_null(gen))
        return 0;
    if (df_json_type_of(gen) != DF_JSON_ARRAY)
        return get_generator(c, gen, "args.generator", &g->seed);
    int64_t n = df_json_array_size(gen);
    if (n < 1 || n > MAX_BATCH)
        return check_fail(c, "args.generator: expected 1 to %d generators, found %lld",
                          MAX_BATCH, (long long)n);
    for (int64_t i = 0; i < n; i++) {
        char what[64];
        snprintf(what, sizeof what, "args.generator[%lld]", (long long)i);
        if (get_generator(c, df_json_array_get(gen, i), what, &seeds[i]))
            return 1;
    }
    g->seeds = seeds;
    g->n_seeds = (int)n;
    return 0;
}

/* Arguments diffuse does not implement fail the case rather than being ignored (which would
 * compare another call with the reference): per-encoder prompts. FLUX.1's true_cfg_scale goes
 * to the run (the library refuses it on classes without true CFG). */
static int unsupported_args(check_case *c, bool sd3, df_gen_params *g)
{
    static const char *const per_encoder[] = {"prompt_2", "prompt_3", "negative_prompt_2",
                                              "negative_prompt_3"};
    for (size_t i = 0; i < sizeof per_encoder / sizeof per_encoder[0]; i++) {
        const df_json *j = df_json_get(c->args, per_encoder[i]);
        if (j && !df_json_is_null(j))
            return check_fail(c, "args.%s: separate prompts per text encoder are not "
                              "implemented", per_encoder[i]);
    }
    double true_cfg;
    if (!sd3 && df_json_get_double_or(c->args, "true_cfg_scale", 1.0, &true_cfg) != DF_OK)
        return check_fail(c, "args.true_cfg_scale: %s", df_error_message());
    if (!sd3)
        g->true_cfg_scale = (float)true_cfg;
    return 0;
}

/* args.cache: the config diffusers' `pipe.transformer.enable_cache` took, as
 * {"config": "FirstBlockCacheConfig" | "TaylorSeerCacheConfig", <its fields>}: turned into
 * the --cache spec and parsed by the library, so an unknown field fails the case. */
static int get_cache(check_case *c, df_cache_config *cfg, const df_cache_config **out)
{
    *out = NULL;
    const df_json *j = df_json_get(c->args, "cache");
    if (!j || df_json_is_null(j))
        return 0;
    const char *name = df_json_string(df_json_get(j, "config"));
    const char *kind = !name                                       ? NULL
                       : strcmp(name, "FirstBlockCacheConfig") == 0 ? "first-block"
                       : strcmp(name, "TaylorSeerCacheConfig") == 0 ? "taylorseer"
                       : strcmp(name, "MagCacheConfig") == 0        ? "magcache"
                                                                   : NULL;
    if (df_json_type_of(j) != DF_JSON_OBJECT || !kind)
        return check_fail(c, "args.cache: expected {\"config\": \"FirstBlockCacheConfig\" or "
                          "\"TaylorSeerCacheConfig\", fields...}");
    char spec[16384];
    int len = snprintf(spec, sizeof spec, "%s", kind);
    for (int64_t i = 0; i < df_json_object_size(j); i++) {
        const char *key;
        const df_json *v = df_json_object_at(j, i, &key);
        if (strcmp(key, "config") == 0)
            continue;
        char val[8192];
        if (df_json_type_of(v) == DF_JSON_ARRAY) { /* mag_ratios: numbers joined by '/' */
            int n = 0;
            val[0] = '\0';
            for (int64_t e = 0; e < df_json_array_size(v) && n < (int)sizeof val - 32; e++)
                n += snprintf(val + n, sizeof val - (size_t)n, "%s%.9g", e ? "/" : "",
                              df_json_number(df_json_array_get(v, e)));
        } else if (df_json_is_null(v))
            snprintf(val, sizeof val, "None");
        else if (df_json_type_of(v) == DF_JSON_STRING)
            snprintf(val, sizeof val, "%s", df_json_string(v));
        else
            snprintf(val, sizeof val, "%.17g", df_json_number(v));
        len += snprintf(spec + len, sizeof spec - (size_t)len, "%c%s=%s",
                        strchr(spec, ':') ? ',' : ':', key, val);
        if (len >= (int)sizeof spec)
            return check_fail(c, "args.cache: too many fields");
    }
    if (df_cache_config_parse(spec, cfg) != DF_OK)
        return check_fail(c, "args.cache: %s", df_error_message());
    *out = cfg;
    return 0;
}

/* args.image (a file of the case folder, or a list of them: FLUX.2 references) and
 * args.strength, for the img2img classes and FLUX.2. */
static int get_image(check_case *c, df_gen_params *g, df_image **images, int cap, int *n)
{
    *n = 0;
    const df_json *j = df_json_get(c->args, "image");
    if (!j || df_json_is_null(j))
        return 0;
    bool list = df_json_type_of(j) == DF_JSON_ARRAY;
    int count = list ? (int)df_json_array_size(j) : 1;
    if (count < 1 || count > cap)
        return check_fail(c, "args.image: expected a file name or a list of 1 to %d", cap);
    for (int i = 0; i < count; i++) {
        const char *name = NULL;
        if (df_json_to_string(list ? df_json_array_get(j, i) : j, &name) != DF_OK)
            return check_fail(c, "args.image: expected file names of the case folder");
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", c->dir, name);
        if (df_image_load(path, &images[i]) != DF_OK)
            return check_fail(c, "args.image: %s", df_error_message());
        *n = i + 1;
    }
    if (list) {
        g->images = (const df_image *const *)images;
        g->n_images = count;
    } else {
        g->image = images[0];
    }
    if (df_json_get_double_or(c->args, "strength", 0.0, &g->strength) != DF_OK) /* 0: 0.6 */
        return check_fail(c, "args.strength: %s", df_error_message());
    return 0;
}

/* args.mask_image (a file of the case folder) and args.padding_mask_crop, for inpainting. */
static int get_mask(check_case *c, df_gen_params *g, df_image **mask)
{
    *mask = NULL;
    const df_json *j = df_json_get(c->args, "mask_image");
    if (!j || df_json_is_null(j))
        return 0;
    const char *name = NULL;
    if (df_json_to_string(j, &name) != DF_OK)
        return check_fail(c, "args.mask_image: expected a file name of the case folder");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", c->dir, name);
    if (df_image_load(path, mask) != DF_OK)
        return check_fail(c, "args.mask_image: %s", df_error_message());
    g->mask = *mask;
    return get_int(c, "padding_mask_crop", 0, &g->padding_mask_crop);
}

#define MAX_LORAS 8

/* args.loras: [{"file": F, "adapter_name": N, "weight": w}, ...], the adapters diffusers
 * loaded (load_lora_weights(F, adapter_name=N)) and weighted (set_adapters), F in the case
 * folder. "path" may stand for "file" and "scale" for "weight" (default 1); an entry may
 * also be the file name alone. */
static int get_loras(check_case *c, df_lora_spec *specs, char paths[][1200], int *n)
{
    *n = 0;
    const df_json *list = df_json_get(c->args, "loras");
    if (!list || df_json_is_null(list))
        return 0;
    if (df_json_type_of(list) != DF_JSON_ARRAY || df_json_array_size(list) > MAX_LORAS)
        return check_fail(c, "args.loras: expected a list of at most %d adapters", MAX_LORAS);
    for (int i = 0; i < (int)df_json_array_size(list); i++) {
        const df_json *l = df_json_array_get(list, i);
        const char *file = df_json_string(l);
        double weight = 1.0;
        if (!file) {
            file = df_json_string(df_json_get(l, "file"));
            if (!file)
                file = df_json_string(df_json_get(l, "path"));
            const char *key = df_json_get(l, "weight") ? "weight" : "scale";
            if (df_json_get_double_or(l, key, 1.0, &weight) != DF_OK)
                file = NULL;
        }
        if (!file)
            return check_fail(c, "args.loras[%d]: expected a file name or {\"file\": NAME, "
                              "\"weight\": W}", i);
        if (file[0] == '/')
            snprintf(paths[i], sizeof paths[i], "%s", file);
        else
            snprintf(paths[i], sizeof paths[i], "%s/%s", c->dir, file);
        specs[i] = (df_lora_spec){.path = paths[i], .scale = (float)weight};
        *n = i + 1;
    }
    return 0;
}

/* "from_pretrained": the components diffusers' from_pretrained was given besides the
 * folder. text_encoder_3 / tokenizer_3 null (SD3 without T5) is df_load_opts'
 * no_text_encoder_3; nothing else is read. */
static int get_from_pretrained(check_case *c, bool *no_t5)
{
    *no_t5 = false;
    const df_json *kw = df_json_get(c->root, "from_pretrained");
    if (!kw || df_json_is_null(kw))
        return 0;
    if (df_json_type_of(kw) != DF_JSON_OBJECT)
        return check_fail(c, "from_pretrained: expected an object of arguments");
    for (int64_t i = 0; i < df_json_object_size(kw); i++) {
        const char *key;
        const df_json *v = df_json_object_at(kw, i, &key);
        if (!df_json_is_null(v) ||
            (strcmp(key, "text_encoder_3") != 0 && strcmp(key, "tokenizer_3") != 0))
            return check_fail(c,
                              "from_pretrained.%s: only text_encoder_3 / tokenizer_3 "
                              "null (SD3 without T5) can be given",
                              key);
        *no_t5 = true;
    }
    return 0;
}

/* The pipeline classes run here, each with the family whose arguments and defaults it
 * takes; `diffuse-check --classes` lists them and test_model_classes holds them against
 * the library's pipeline classes. */
typedef enum pipeline_family { FAMILY_FLUX, FAMILY_SD3, FAMILY_FLUX2 } pipeline_family;

typedef struct pipeline_runner {
    const char *cls;
    pipeline_family family;
    bool kontext; /* FluxKontextPipeline's sizes */
} pipeline_runner;

static const pipeline_runner runners[] = {
    {"FluxPipeline", FAMILY_FLUX, false},
    {"FluxImg2ImgPipeline", FAMILY_FLUX, false},
    {"FluxInpaintPipeline", FAMILY_FLUX, false},
    {"FluxKontextPipeline", FAMILY_FLUX, true},
    {"StableDiffusion3Pipeline", FAMILY_SD3, false},
    {"StableDiffusion3Img2ImgPipeline", FAMILY_SD3, false},
    {"StableDiffusion3InpaintPipeline", FAMILY_SD3, false},
    {"Flux2Pipeline", FAMILY_FLUX2, false},
    {"Flux2KleinPipeline", FAMILY_FLUX2, false},
};

const char *check_pipeline_class(int i)
{
    return i >= 0 && i < (int)(sizeof runners / sizeof *runners) ? runners[i].cls : NULL;
}

int check_kind_pipeline(check_case *c)
{
    const pipeline_runner *r = CHECK_FIND_ROW(runners, c->cls);
    if (!r)
        return check_fail(c, "class %s is not implemented yet", c->cls);
    bool sd3 = r->family == FAMILY_SD3, flux2 = r->family == FAMILY_FLUX2, kontext = r->kontext;
    if (!c->model_dir)
        return check_fail(c, "the case names no pipeline folder");

    df_gen_params g = {0};
    int rc = 0;
    float *embeds = NULL, *pooled = NULL, *latents = NULL, *neg = NULL, *neg_pooled = NULL;
    int64_t es[8], ps[8], ls[8], ns[8], nps[8];
    int en = 0, pn = 0, ln = 0, nn = 0, npn = 0;
    int slg[64];
    rc |= get_int(c, "height", 0, &g.height);
    rc |= get_int(c, "width", 0, &g.width);
    rc |= get_int(c, "num_inference_steps", 0, &g.steps);
    rc |= get_int(c, "max_sequence_length", 0, &g.max_sequence_length);
    rc |= get_int(c, "num_images_per_prompt", 1, &g.num_images);
    double guidance;
    if (df_json_get_double_or(c->args, "guidance_scale", sd3 ? 7.0 : flux2 ? 4.0 : 3.5,
                              &guidance) != DF_OK)
        rc |= check_fail(c, "args.guidance_scale: %s", df_error_message());
    g.guidance = (float)guidance;
    g.guidance_set = true;
    rc |= get_tensor(c, "prompt_embeds", &embeds, es, &en);
    rc |= get_tensor(c, "pooled_prompt_embeds", &pooled, ps, &pn);
    rc |= get_tensor(c, "latents", &latents, ls, &ln);
    /* StableDiffusion3Pipeline: negative prompt / embeddings, clip_skip, skip-layer guidance */
    rc |= get_tensor(c, "negative_prompt_embeds", &neg, ns, &nn);
    rc |= get_tensor(c, "negative_pooled_prompt_embeds", &neg_pooled, nps, &npn);
    g.negative_prompt_embeds = neg;
    g.negative_pooled_prompt_embeds = neg_pooled;
    const char *negative_list[MAX_BATCH];
    int n_negative = 0;
    rc |= get_strings(c, "negative_prompt", &g.negative_prompt, negative_list, &n_negative);
    g.negative_prompts = n_negative ? negative_list : NULL;
    rc |= get_int(c, "clip_skip", 0, &g.clip_skip);
    rc |= check_read_indices(c, "skip_guidance_layers", slg, 64, &g.n_slg_layers);
    g.slg_layers = g.n_slg_layers ? slg : NULL;
    double slg_scale;
    if (df_json_get_double_or(c->args, "skip_layer_guidance_scale", 2.8, &slg_scale) != DF_OK ||
        df_json_get_double_or(c->args, "skip_layer_guidance_start", 0.01, &g.slg_start) != DF_OK ||
        df_json_get_double_or(c->args, "skip_layer_guidance_stop", 0.2, &g.slg_stop) != DF_OK)
        rc |= check_fail(c, "args: %s", df_error_message());
    g.slg_scale = (float)slg_scale;
    /* Flux2Pipeline / Flux2KleinPipeline: the hidden states stacked into the embeddings */
    int te_layers[8];
    const df_json *tl = df_json_get(c->args, "text_encoder_out_layers");
    if (!df_json_is_null(tl)) {
        g.n_text_encoder_out_layers = (int)df_json_array_size(tl);
        if (df_json_type_of(tl) != DF_JSON_ARRAY || g.n_text_encoder_out_layers > 8)
            rc |= check_fail(c, "args.text_encoder_out_layers: expected a list of layers");
        for (int i = 0; i < g.n_text_encoder_out_layers && i < 8; i++)
            te_layers[i] = (int)df_json_number(df_json_array_get(tl, i));
        g.text_encoder_out_layers = te_layers;
    }
    const char *prompt_list[MAX_BATCH];
    rc |= get_strings(c, "prompt", &g.prompt, prompt_list, &g.n_prompts);
    g.prompts = g.n_prompts ? prompt_list : NULL;
    /* diffusers: a list of negative prompts pairs with a list of prompts, one each */
    int batch = g.prompts ? g.n_prompts : g.prompt ? 1 : embeds ? (int)es[0] : 0;
    if (rc == 0 && n_negative && (n_negative != batch || g.prompt))
        rc |= check_fail(c,
                         "args.negative_prompt: %d negative prompts for a batch of %d "
                         "prompts given as %s",
                         n_negative, batch, g.prompt ? "a string" : "a list");
    uint64_t seeds[MAX_BATCH];
    rc |= get_generators(c, &g, seeds);
    if (embeds) {
        g.prompt_embeds = embeds;
        g.prompt_embeds_len = es[1];
        g.pooled_prompt_embeds = pooled;
        g.n_prompts = (int)es[0];
    }
    g.latents = latents;
    df_cache_config cache;
    rc |= get_cache(c, &cache, &g.cache);
    df_image *images[8] = {0};
    int n_images = 0;
    rc |= get_image(c, &g, images, 8, &n_images);
    df_image *mask = NULL;
    rc |= get_mask(c, &g, &mask);
    rc |= unsupported_args(c, sd3, &g);
    df_lora_spec loras[MAX_LORAS];
    static char lora_paths[MAX_LORAS][1200];
    int n_loras = 0;
    rc |= get_loras(c, loras, lora_paths, &n_loras);
    bool no_t5;
    rc |= get_from_pretrained(c, &no_t5);
    if (kontext) { /* diffusers' defaults: max_area 1024 ** 2, _auto_resize True */
        int64_t area = 1024 * 1024;
        bool auto_resize = true;
        if (df_json_get_int_or(c->args, "max_area", 1024 * 1024, &area) != DF_OK ||
            df_json_get_bool_or(c->args, "_auto_resize", true, &auto_resize) != DF_OK)
            rc |= check_fail(c, "args: %s", df_error_message());
        g.max_area = area;
        g.keep_image_size = !auto_resize;
    }
    rc = check_tp_agree(c, rc); /* with --tp, every rank loads the pipeline or none does */

    df_pipeline *p = NULL;
    df_gen_output out = {0};
    if (rc == 0) {
        /* compile / blocks: the transformer compiled, everything else deferred and fused. */
        bool compile = strcmp(c->mode, "compile") == 0, blocks = strcmp(c->mode, "blocks") == 0;
        df_eager_mode mode = strcmp(c->mode, "eager") == 0 ? DF_DEFER_NEVER : DF_DEFER_AND_FUSE;
        /* "single_file": an all-in-one checkpoint, "dir" the folder completing it */
        char file[4096];
        const char *single = check_single_file(c, file, sizeof file);
        df_status s = df_pipeline_load(single ? single : c->model_dir,
                                       &(df_load_opts){.device = c->device, .threads = c->threads,
                                                       .dtype = c->compute, .mode = mode,
                                                       .compile = compile,
                                                       .compile_blocks = blocks,
                                                       .comm = c->comm, .loras = loras,
                                                       .n_loras = n_loras,
                                                       .no_text_encoder_3 = no_t5,
                                                       .config_dir = single ? c->model_dir : NULL},
                                       &p);
        if (s == DF_OK)
            s = df_pipeline_run(p, &g, &out);
        if (s != DF_OK)
            rc = check_fail(c, "%s", df_error_message());
    }
    if (rc == 0 && (!c->comm || df_comm_rank(c->comm) == 0)) { /* --tp: rank 0 has the images */
        int64_t n_lat = 1;
        for (int d = 0; d < out.latents_ndim; d++)
            n_lat *= out.latents_shape[d];
        int64_t n_img = (int64_t)out.count * out.height * out.width * 3;
        rc |= check_compare_f32(c, "latents_final", out.latents, n_lat);
        rc |= check_compare_f32(c, "image", out.image_f32, n_img);
        double *u8 = malloc((size_t)n_img * sizeof *u8);
        if (!u8) {
            rc |= check_fail(c, "out of memory");
        } else {
            int64_t per = (int64_t)out.height * out.width * 3;
            for (int b = 0; b < out.count; b++)
                for (int64_t i = 0; i < per; i++)
                    u8[b * per + i] = out.images[b]->pixels[i];
            rc |= check_compare_f64(c, "image_uint8", u8, n_img);
            free(u8);
        }
        if (g.cache) { /* one letter per step, as ASCII codes */
            int64_t trace[1000];
            int64_t n = (int64_t)strlen(out.cache_trace);
            for (int64_t i = 0; i < n; i++)
                trace[i] = (unsigned char)out.cache_trace[i];
            printf("%s: cache trace %s\n", c->name, out.cache_trace);
            rc |= check_compare_i64(c, "cache_trace", trace, n);
        }
        check_write_stats(c, df_pipeline_ctx(p));
    }
    df_gen_output_free(&out);
    df_pipeline_free(p);
    free(embeds);
    free(pooled);
    free(latents);
    free(neg);
    free(neg_pooled);
    for (int i = 0; i < n_images; i++)
        df_image_free(images[i]);
    df_image_free(mask);
    return rc;
}
