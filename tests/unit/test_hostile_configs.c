/*
 * Hostile model folders that every loader must refuse, naming the file and what it found:
 *
 * - a config.json whose root is not an object (an array, a string), for every model class
 *   (FLUX, SD3, FLUX.2 transformers, both VAEs, CLIP, T5, Mistral, Qwen3) and the scheduler;
 * - a config whose class is another one: DF_E_UNSUPPORTED naming it and the class the loader
 *   reads; a class that is not a string: DF_E_FORMAT;
 * - model_index.json: an unknown pipeline class (naming the supported ones), a class that is
 *   not a string, a component class that is not a Python identifier ('../../etc/passwd'), a
 *   tokenizer class the pipeline does not read.
 * Each case is a golden folder's own weights (linked) under an edited config.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#define GOLDEN(rel) DF_GOLDEN_DIR "/" rel

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot read %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    return s;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* A fresh folder DF_TEST_TMP/hostile-<name>-<pid>. */
static const char *fresh_dir(const char *name, char *buf, size_t cap)
{
    mkdir(DF_TEST_TMP, 0755);
    snprintf(buf, cap, "%s/hostile-%s-%d", DF_TEST_TMP, name, (int)getpid());
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", buf, buf);
    assert_int_equal(system(cmd), 0);
    return buf;
}

/* `dir`/config.json: `src`'s config with its first `from` replaced by `to` (from NULL: the
 * whole text replaced by `to`), and links to src's weight files. */
static void edited_copy(const char *src, const char *dir, const char *from, const char *to)
{
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", src);
    char *cfg = read_text(path);
    char *out;
    if (from) {
        char *at = strstr(cfg, from);
        if (!at)
            fail_msg("%s has no '%s'", path, from);
        size_t n = strlen(cfg) + strlen(to) + 1;
        out = malloc(n);
        assert_non_null(out);
        snprintf(out, n, "%.*s%s%s", (int)(at - cfg), cfg, to, at + strlen(from));
    } else {
        out = strdup(to);
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, out);
    free(out);
    free(cfg);
    static const char *const weights[] = {"diffusion_pytorch_model.safetensors",
                                          "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char from_path[2048], to_path[2048];
        snprintf(from_path, sizeof from_path, "%s/%s", src, weights[i]);
        snprintf(to_path, sizeof to_path, "%s/%s", dir, weights[i]);
        if (access(from_path, R_OK) == 0)
            assert_int_equal(symlink(from_path, to_path), 0);
    }
}

typedef enum { FLUX, SD3, FLUX2, VAE, CLIP, T5, MISTRAL, QWEN3 } loader;

/* Loads `dir` with one model class's loader; the model is freed at once. */
static df_status load(loader which, const char *dir)
{
    df_ctx *ctx;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 1}, &ctx), DF_OK);
    df_status s;
    switch (which) {
    case FLUX: {
        df_flux *m = NULL;
        s = df_flux_load(ctx, dir, &m);
        df_flux_free(m);
        break;
    }
    case SD3: {
        df_sd3 *m = NULL;
        s = df_sd3_load(ctx, dir, &m);
        df_sd3_free(m);
        break;
    }
    case FLUX2: {
        df_flux2 *m = NULL;
        s = df_flux2_load(ctx, dir, &m);
        df_flux2_free(m);
        break;
    }
    case VAE: {
        df_vae *m = NULL;
        s = df_vae_load(ctx, dir, &m);
        df_vae_free(m);
        break;
    }
    case CLIP: {
        df_clip *m = NULL;
        s = df_clip_load(ctx, dir, &m);
        df_clip_free(m);
        break;
    }
    case T5: {
        df_t5 *m = NULL;
        s = df_t5_load(ctx, dir, &m);
        df_t5_free(m);
        break;
    }
    case MISTRAL:
    case QWEN3: {
        df_decoder_lm *m = NULL;
        s = which == MISTRAL ? df_mistral_load(ctx, dir, &m) : df_qwen3_load(ctx, dir, &m);
        df_decoder_lm_free(m);
        break;
    }
    default:
        s = DF_E_ARG;
    }
    df_ctx_free(ctx);
    return s;
}

static const struct {
    loader which;
    const char *src, *cls;
} models[] = {
    {FLUX, GOLDEN("flux-transformer/model"), "FluxTransformer2DModel"},
    {SD3, GOLDEN("sd3-transformer/model"), "SD3Transformer2DModel"},
    {FLUX2, GOLDEN("flux2-transformer/model"), "Flux2Transformer2DModel"},
    {VAE, GOLDEN("vae-decode-flux/vae"), "AutoencoderKL"},
    {VAE, GOLDEN("vae-decode-flux2/vae"), "AutoencoderKLFlux2"},
    {CLIP, GOLDEN("te-clip-l/text_encoder"), "CLIPTextModel"},
    {T5, GOLDEN("te-t5/text_encoder_2"), "T5EncoderModel"},
    {MISTRAL, GOLDEN("te-mistral/text_encoder"), "MistralModel"},
    {QWEN3, GOLDEN("t2i-flux2-klein/pipeline/text_encoder"), "Qwen3ForCausalLM"},
};
#define N_MODELS (sizeof models / sizeof models[0])

static void expect(df_status got, df_status want, const char *what, const char *w1, const char *w2)
{
    const char *m = df_error_message();
    if (got != want || !strstr(m, w1) || (w2 && !strstr(m, w2)))
        fail_msg("%s: got %s '%s', expected %s naming '%s'%s%s", what, df_status_name(got), m,
                 df_status_name(want), w1, w2 ? " and " : "", w2 ? w2 : "");
}

static void test_golden_folders_load(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_MODELS; i++)
        expect(load(models[i].which, models[i].src), DF_OK, models[i].src, "", NULL);
}

static void test_config_root_not_an_object(void **state)
{
    (void)state;
    static const char *const roots[][2] = {{"[{\"_class_name\": \"X\"}]", "found array"},
                                           {"\"config\"", "found string"},
                                           {"7", "found number"}};
    for (size_t i = 0; i < N_MODELS; i++) {
        for (size_t r = 0; r < sizeof roots / sizeof roots[0]; r++) {
            char dir[1024], name[32];
            snprintf(name, sizeof name, "root-%zu-%zu", i, r);
            fresh_dir(name, dir, sizeof dir);
            edited_copy(models[i].src, dir, NULL, roots[r][0]);
            char file[1100];
            snprintf(file, sizeof file, "%s/config.json", dir);
            expect(load(models[i].which, dir), DF_E_FORMAT, models[i].cls, file, roots[r][1]);
        }
    }
    /* the scheduler reads scheduler_config.json, not through the model layout */
    char dir[1024], file[1100];
    fresh_dir("root-scheduler", dir, sizeof dir);
    snprintf(file, sizeof file, "%s/scheduler_config.json", dir);
    write_text(file, "[\"FlowMatchEulerDiscreteScheduler\"]");
    df_scheduler *s = (df_scheduler *)1;
    expect(df_scheduler_load(dir, &s), DF_E_FORMAT, "scheduler", file, "found array");
    assert_null(s);
}

static void test_config_class_unknown_or_not_a_string(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_MODELS; i++) {
        char quoted[128], other[128], dir[1024], name[32];
        snprintf(quoted, sizeof quoted, "\"%s\"", models[i].cls);
        char three[96];
        snprintf(three, sizeof three, "%s", models[i].cls);
        char *two = strstr(three, "2D");
        if (two)
            two[0] = '3'; /* FluxTransformer3DModel */
        else
            snprintf(three, sizeof three, "%sXL", models[i].cls);
        snprintf(other, sizeof other, "\"%s\"", three);
        snprintf(name, sizeof name, "class-%zu", i);
        fresh_dir(name, dir, sizeof dir);
        edited_copy(models[i].src, dir, quoted, other);
        df_status s = load(models[i].which, dir);
        expect(s, DF_E_UNSUPPORTED, models[i].cls, three, "config.json");
        /* and it names what the loader reads, apart from the class it found */
        const char *m = df_error_message(), *named = strstr(m, three);
        bool supported = false;
        for (const char *at = strstr(m, models[i].cls); at && !supported;
             at = strstr(at + 1, models[i].cls))
            supported = !(at >= named && at < named + strlen(three));
        if (!supported)
            fail_msg("%s: '%s' does not name the supported class", models[i].cls, m);

        snprintf(name, sizeof name, "class-num-%zu", i);
        fresh_dir(name, dir, sizeof dir);
        edited_copy(models[i].src, dir, quoted, "42");
        expect(load(models[i].which, dir), DF_E_FORMAT, models[i].cls, "expected a string",
               "config.json");
    }
}

/* A pipeline folder: the golden t2i-sd3 one's components linked under an edited index. */
static const char *edited_pipeline(const char *name, const char *from, const char *to, char *dir,
                                   size_t cap)
{
    fresh_dir(name, dir, cap);
    static const char *const parts[] = {"scheduler",      "text_encoder", "text_encoder_2",
                                        "text_encoder_3", "tokenizer",    "tokenizer_2",
                                        "tokenizer_3",    "transformer",  "vae"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "cp -r '%s/%s' '%s/'", GOLDEN("t2i-sd3/pipeline"), parts[i], dir);
        assert_int_equal(system(cmd), 0);
    }
    char *index = read_text(GOLDEN("t2i-sd3/pipeline/model_index.json"));
    char *at = strstr(index, from);
    if (!at)
        fail_msg("model_index.json has no '%s'", from);
    size_t n = strlen(index) + strlen(to) + 1;
    char *out = malloc(n), path[1100];
    snprintf(out, n, "%.*s%s%s", (int)(at - index), index, to, at + strlen(from));
    snprintf(path, sizeof path, "%s/model_index.json", dir);
    write_text(path, out);
    free(out);
    free(index);
    return dir;
}

static void test_model_index_classes(void **state)
{
    (void)state;
    static const struct {
        const char *from, *to;
        df_status want;
        const char *w1, *w2;
    } cases[] = {
        {"\"StableDiffusion3Pipeline\"", "\"StableDiffusion4Pipeline\"", DF_E_UNSUPPORTED,
         "pipeline class 'StableDiffusion4Pipeline' is not supported",
         "(supported: FluxPipeline, FluxImg2ImgPipeline, FluxInpaintPipeline, "
         "StableDiffusion3Pipeline, StableDiffusion3Img2ImgPipeline, "
         "StableDiffusion3InpaintPipeline, Flux2Pipeline, Flux2KleinPipeline or "
         "FluxKontextPipeline)"},
        {"\"StableDiffusion3Pipeline\"", "[\"StableDiffusion3Pipeline\"]", DF_E_FORMAT,
         "'_class_name'", "expected a string"},
        {"\"AutoencoderKL\"", "\"../../etc/passwd\"", DF_E_FORMAT,
         "component 'vae': class '../../etc/passwd' is not a Python identifier", NULL},
        {"\"AutoencoderKL\"", "\"AutoencoderTiny\"", DF_E_UNSUPPORTED,
         "component 'vae' is a AutoencoderTiny; StableDiffusion3Pipeline supports "
         "AutoencoderKL",
         NULL},
        {"\"T5Tokenizer\"", "\"BertTokenizer\"", DF_E_UNSUPPORTED,
         "component 'tokenizer_3' is a BertTokenizer; StableDiffusion3Pipeline supports "
         "T5Tokenizer or T5TokenizerFast",
         NULL},
        {"\"T5Tokenizer\"", "\"T5TokenizerFast\"", DF_OK, "", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char dir[1024], name[32];
        snprintf(name, sizeof name, "index-%zu", i);
        edited_pipeline(name, cases[i].from, cases[i].to, dir, sizeof dir);
        df_pipeline *p = (df_pipeline *)1;
        df_status s = df_pipeline_load(dir, &(df_load_opts){.threads = 1}, &p);
        expect(s, cases[i].want, name, cases[i].w1, cases[i].w2);
        if (s == DF_OK)
            df_pipeline_free(p);
        else
            assert_null(p);
        if (s != DF_OK && !strstr(df_error_message(), "model_index.json"))
            fail_msg("%s: '%s' does not name model_index.json", name, df_error_message());
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_folders_load),
        cmocka_unit_test(test_config_root_not_an_object),
        cmocka_unit_test(test_config_class_unknown_or_not_a_string),
        cmocka_unit_test(test_model_index_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
