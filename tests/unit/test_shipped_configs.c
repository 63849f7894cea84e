/*
 * The shipped configs (models/shipped.h): which file gets which set, that every set's files
 * are the recorded text, that they load through the same readers as a folder's configs at
 * the released model's full size, and what a single-file load without a folder says.
 *
 * Full-size weights are sparse files: the safetensors header is written and the data region
 * is made by ftruncate, so a 12-billion-parameter transformer costs no disk. Loading binds
 * tensors by name and shape without reading their bytes, so the model checks run on them.
 * The names and shapes come from tests/shipped/<set>.shapes, which diffusers' and
 * transformers' own classes built from the same configs (tools/refgen/shipped_shapes.py).
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/diffuse.h>

#include "models/checkpoint.h"
#include "models/shipped.h"
#include "unit/io_files.h"

#define SOURCE_ROOT    DF_GOLDEN_DIR "/../.."
#define TOKENIZERS     DF_GOLDEN_DIR "/t2i-flux-schnell/pipeline"
#define SD3_TOKENIZERS DF_GOLDEN_DIR "/t2i-sd3/pipeline"
#define T5_GGUF        DF_GOLDEN_DIR "/../cases/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf"

/* ---- sparse safetensors ------------------------------------------------------------- */

typedef struct {
    const char *name;
    int ndim;
    int64_t shape[4];
} tensor;

/* Writes `n` BF16 tensors as a safetensors file whose data region is a hole. */
static void write_sparse(const char *path, const tensor *t, int n)
{
    size_t cap = 256 + (size_t)n * 256, len = 1;
    char *h = malloc(cap);
    assert_non_null(h);
    strcpy(h, "{");
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t bytes = 2;
        char shape[128] = "";
        for (int d = 0; d < t[i].ndim; d++) {
            bytes *= (uint64_t)t[i].shape[d];
            size_t sl = strlen(shape);
            snprintf(shape + sl, sizeof shape - sl, "%s%lld", d ? "," : "",
                     (long long)t[i].shape[d]);
        }
        int w =
            snprintf(h + len, cap - len,
                     "%s\"%s\":{\"dtype\":\"BF16\",\"shape\":[%s],\"data_offsets\":[%llu,%llu]}",
                     i ? "," : "", t[i].name, shape, (unsigned long long)off,
                     (unsigned long long)(off + bytes));
        assert_true(w > 0 && (size_t)w < cap - len);
        len += (size_t)w;
        off += bytes;
    }
    strcpy(h + len, "}");
    len++;
    while (len % 8) /* the data starts 8-aligned, as writers keep it */
        h[len++] = ' ';
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint8_t hl[8];
    for (int i = 0; i < 8; i++)
        hl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    assert_int_equal(fwrite(hl, 1, 8, f), 8);
    assert_int_equal(fwrite(h, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(truncate(path, (off_t)(8 + len + off)), 0);
    free(h);
}

/* FLUX.1's original (BFL) names that the recognition and the size check read, at the
 * released size; `guidance` adds dev's guidance embedding, `blocks` the double-block count. */
static void write_flux_bfl(const char *path, const char *prefix, bool guidance, int width,
                           int blocks)
{
    char names[6][128];
    const char *base[] = {"img_in.weight",
                          "double_blocks.0.img_attn.norm.key_norm.scale",
                          "double_blocks.%d.img_attn.qkv.weight",
                          "single_blocks.37.linear1.weight",
                          "guidance_in.in_layer.weight",
                          "guidance_in.in_layer.bias"};
    tensor t[6] = {{names[0], 2, {width, 64}},        {names[1], 1, {128}},
                   {names[2], 2, {3 * width, width}}, {names[3], 2, {7 * width, width}},
                   {names[4], 2, {width, 256}},       {names[5], 1, {width}}};
    for (int i = 0; i < 6; i++) {
        char key[96];
        snprintf(key, sizeof key, base[i], blocks - 1);
        snprintf(names[i], sizeof names[i], "%s%s", prefix, key);
    }
    write_sparse(path, t, guidance ? 6 : 4);
}

/* ---- recognition -------------------------------------------------------------------- */

/* SD3's original (SAI / ComfyUI) names that the recognition and the size check read, for a
 * transformer of `width` and `blocks` joint blocks whose position table has `positions`
 * rows (192 x 192 for SD3-medium and SD3.5-large, 384 x 384 for SD3.5-medium). */
static void write_sd3(const char *path, const char *prefix, int width, int blocks, int positions)
{
    char names[7][128];
    const char *base[] = {"context_embedder.weight",
                          "pos_embed",
                          "joint_blocks.0.context_block.adaLN_modulation.1.bias",
                          "joint_blocks.0.x_block.attn.qkv.weight",
                          "joint_blocks.%d.x_block.attn.qkv.weight",
                          "joint_blocks.%d.context_block.attn.qkv.weight",
                          "joint_blocks.%d.x_block.mlp.fc1.weight"};
    tensor t[7] = {{names[0], 2, {width, 4096}},      {names[1], 3, {1, positions, width}},
                   {names[2], 1, {6 * width}},        {names[3], 2, {3 * width, width}},
                   {names[4], 2, {3 * width, width}}, {names[5], 2, {3 * width, width}},
                   {names[6], 2, {4 * width, width}}};
    for (int i = 0; i < 7; i++) {
        char key[96]; /* the MLP at block 37 at most: SD3.5-large's last, which names it */
        snprintf(key, sizeof key, base[i], i == 6 && blocks > 38 ? 37 : blocks - 1);
        snprintf(names[i], sizeof names[i], "%s%s", prefix, key);
    }
    write_sparse(path, t, 7);
}

static void test_recognition_picks_the_set_by_model_and_size(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("shipped-recognise", dir, sizeof dir);
    path_in(dir, "f.safetensors", path, sizeof path);
    df_checkpoint_parts c;

    write_flux_bfl(path, "", false, 3072, 19);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "FLUX.1-schnell");
    assert_string_equal(c.shipped, "FLUX.1-schnell");

    write_flux_bfl(path, "model.diffusion_model.", false, 3072, 19);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.shipped, "FLUX.1-schnell");
    char text[2048];
    assert_int_equal(df_checkpoint_describe(path, text, sizeof text), DF_OK);
    assert_non_null(strstr(text, "config: shipped FLUX.1-schnell\n"));
    assert_non_null(strstr(text, "tokenizer_2/"));

    /* dev (guidance_in): its own set, never schnell's; at another width, none */
    write_flux_bfl(path, "", true, 3072, 19);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "FLUX.1-dev");
    assert_string_equal(c.shipped, "FLUX.1-dev");
    assert_int_equal(df_checkpoint_describe(path, text, sizeof text), DF_OK);
    assert_non_null(strstr(text, "config: shipped FLUX.1-dev\n"));
    write_flux_bfl(path, "model.diffusion_model.", true, 3072, 20);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "FLUX.1-dev");
    assert_string_equal(c.shipped, "");
    assert_non_null(strstr(c.shipped_why, "size"));

    /* the schnell layout at other sizes: a width, one block more, one fewer */
    const int sizes[][2] = {{64, 19}, {3072, 20}, {3072, 18}};
    for (int i = 0; i < 3; i++) {
        write_flux_bfl(path, "", false, sizes[i][0], sizes[i][1]);
        assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
        assert_string_equal(c.model, "FLUX.1-schnell");
        assert_string_equal(c.shipped, "");
        assert_non_null(strstr(c.shipped_why, "size"));
        assert_int_equal(df_checkpoint_describe(path, text, sizeof text), DF_OK);
        assert_non_null(strstr(text, "config: none shipped for this size"));
    }
    remove_tree(dir);
}

static void test_recognition_picks_the_sd3_sets(void **state)
{
    (void)state;
    char dir[512], path[600], text[2048];
    test_dir("shipped-recognise-sd3", dir, sizeof dir);
    path_in(dir, "f.safetensors", path, sizeof path);
    df_checkpoint_parts c;

    /* SD3-medium (sd3_medium_incl_clips*.safetensors: under model.diffusion_model.) */
    write_sd3(path, "model.diffusion_model.", 1536, 24, 36864);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "SD3-medium");
    assert_string_equal(c.shipped, "SD3-medium");
    assert_int_equal(df_checkpoint_describe(path, text, sizeof text), DF_OK);
    assert_non_null(strstr(text, "config: shipped SD3-medium\n"));
    assert_non_null(strstr(text, "tokenizer_3/ (T5"));
    assert_non_null(strstr(text, " T5 (--text-encoder-3 FILE: the shipped configs name it; "
                                 "or --text-encoder-3 none to run without it)"));

    /* SD3.5-large (and its turbo), with and without the prefix */
    write_sd3(path, "model.diffusion_model.", 2432, 38, 36864);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "SD3.5-large");
    assert_string_equal(c.shipped, "SD3.5-large");
    write_sd3(path, "", 2432, 38, 36864);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.shipped, "SD3.5-large");
    assert_int_equal(df_checkpoint_describe(path, text, sizeof text), DF_OK);
    assert_non_null(strstr(text, "config: shipped SD3.5-large\n"));

    /* SD3.5-medium: recognised, not shipped, and it says why */
    write_sd3(path, "", 1536, 24, 147456);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "SD3.5-medium");
    assert_string_equal(c.shipped, "");
    assert_non_null(strstr(c.shipped_why, "none shipped for SD3.5-medium"));

    /* the released layouts at other sizes: one block more or fewer, another width */
    const struct {
        int width, blocks;
        const char *model;
    } other[] = {{1536, 25, "SD3-medium"},
                 {1536, 23, "SD3-medium"},
                 {2432, 39, "SD3.5-large"},
                 {2304, 38, "SD3.5-large"}};
    for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
        write_sd3(path, "", other[i].width, other[i].blocks, 36864);
        assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
        assert_string_equal(c.model, other[i].model);
        assert_string_equal(c.shipped, "");
        assert_non_null(strstr(c.shipped_why, "size"));
    }
    remove_tree(dir);
}

/* A GGUF file (city96's layout: the transformer's original names, no prefix) of F16
 * tensors; the tensor data is a hole. */
static void write_sparse_gguf(const char *path, const tensor *t, int n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    uint32_t u32v[2] = {3, 0};             /* version 3 */
    uint64_t counts[2] = {(uint64_t)n, 0}; /* tensors, no metadata */
    assert_int_equal(fwrite("GGUF", 1, 4, f), 4);
    assert_int_equal(fwrite(&u32v[0], 4, 1, f), 1);
    assert_int_equal(fwrite(counts, 8, 2, f), 2);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t len = strlen(t[i].name), bytes = 2;
        uint32_t ndim = (uint32_t)t[i].ndim, type = 1; /* F16 */
        assert_int_equal(fwrite(&len, 8, 1, f), 1);
        assert_int_equal(fwrite(t[i].name, 1, len, f), len);
        assert_int_equal(fwrite(&ndim, 4, 1, f), 1);
        for (int d = t[i].ndim - 1; d >= 0; d--) { /* ggml's ne: innermost first */
            uint64_t ne = (uint64_t)t[i].shape[d];
            bytes *= ne;
            assert_int_equal(fwrite(&ne, 8, 1, f), 1);
        }
        assert_int_equal(fwrite(&type, 4, 1, f), 1);
        assert_int_equal(fwrite(&off, 8, 1, f), 1);
        off += (bytes + 31) / 32 * 32;
    }
    long pos = ftell(f);
    assert_true(pos > 0);
    long data = (pos + 31) / 32 * 32;
    assert_int_equal(fclose(f), 0);
    assert_int_equal(truncate(path, (off_t)(data + (long)off)), 0);
}

static void test_gguf_file_gets_the_set(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("shipped-gguf", dir, sizeof dir);
    path_in(dir, "flux1-schnell-F16.gguf", path, sizeof path);
    const tensor t[] = {{"img_in.weight", 2, {3072, 64}},
                        {"double_blocks.0.img_attn.norm.key_norm.scale", 1, {128}},
                        {"double_blocks.18.img_attn.qkv.weight", 2, {9216, 3072}},
                        {"single_blocks.37.linear1.weight", 2, {21504, 3072}}};
    write_sparse_gguf(path, t, 4);
    df_checkpoint_parts c;
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "FLUX.1-schnell");
    assert_string_equal(c.shipped, "FLUX.1-schnell");

    /* city96's SD3.5-large GGUF: the same names, no prefix */
    const tensor l[] = {{"context_embedder.weight", 2, {2432, 4096}},
                        {"joint_blocks.37.x_block.attn.qkv.weight", 2, {7296, 2432}},
                        {"joint_blocks.37.context_block.attn.qkv.weight", 2, {7296, 2432}},
                        {"joint_blocks.37.x_block.mlp.fc1.weight", 2, {9728, 2432}}};
    path_in(dir, "sd3.5_large-F16.gguf", path, sizeof path);
    write_sparse_gguf(path, l, 4);
    assert_int_equal(df_checkpoint_recognise(path, &c), DF_OK);
    assert_string_equal(c.model, "SD3.5-large");
    assert_string_equal(c.shipped, "SD3.5-large");
    remove_tree(dir);
}

/* Every model the recognition can name is shipped or says why not. */
static void test_every_recognised_model_is_shipped_or_says_why(void **state)
{
    (void)state;
    int n = 0;
    for (const char *const *m = df_checkpoint_models; *m; m++, n++) {
        const char *why = df_shipped_missing_reason(*m);
        if (!df_shipped_find(*m)) {
            assert_non_null(why);
            if (strcmp(why, "diffuse has no config for it") == 0)
                fail_msg("recognised model %s has no shipped config and no recorded reason", *m);
        } else {
            assert_null(why);
        }
    }
    assert_true(n >= 9);
    for (int i = 0; i < df_shipped_count(); i++) { /* and every set serves a recognised model */
        bool named = false;
        for (const char *const *m = df_checkpoint_models; *m; m++)
            named |= strcmp(*m, df_shipped_at(i)->name) == 0;
        assert_true(named);
    }
}

/* The class a shipped config names: "_class_name", or transformers' "architectures"[0]. */
static const char *config_class(const df_json *j)
{
    const char *cls = df_json_string(df_json_get(j, "_class_name"));
    const df_json *arch = df_json_get(j, "architectures");
    return cls ? cls : arch ? df_json_string(df_json_array_get(arch, 0)) : NULL;
}

/* Every model class diffuse implements (models.h's table) is in some shipped set, or is
 * listed here with the reason it is not; tokenizers are never shipped. */
static void test_every_model_class_is_shipped_or_listed(void **state)
{
    (void)state;
    static const char *const not_shipped[] = {
        /* FLUX.2 sets: no faithful public copy of the official configs was found
         * (shipped.c lists the models) */
        "Flux2Transformer2DModel", "AutoencoderKLFlux2", "Mistral3ForConditionalGeneration",
        "Qwen3ForCausalLM",
        /* classes diffuse reads that no released pipeline's model_index.json names */
        "MistralModel", "MistralForCausalLM", "Qwen3Model", NULL};
    int n;
    const df_model_class *classes = df_model_classes(&n);
    for (int i = 0; i < n; i++) {
        if (strcmp(classes[i].component, "tokenizer") == 0)
            continue;
        bool found = false;
        for (int s = 0; s < df_shipped_count() && !found; s++) {
            const char *rel;
            for (int f = 0; !found && (rel = df_shipped_file_at(df_shipped_at(s), f)); f++) {
                size_t size;
                const char *text = df_shipped_file(df_shipped_at(s), rel, &size);
                df_json *j;
                assert_int_equal(df_json_parse_string(text, size, rel, &j), DF_OK);
                const char *cls = config_class(j);
                found = cls && strcmp(cls, classes[i].name) == 0;
                df_json_free(j);
            }
        }
        bool listed = false;
        for (const char *const *c = not_shipped; *c; c++)
            listed |= strcmp(*c, classes[i].name) == 0;
        if (!found && !listed)
            fail_msg("model class %s has no shipped config and is not listed as not shipped",
                     classes[i].name);
        if (found && listed)
            fail_msg("model class %s is shipped now: take it off the not-shipped list",
                     classes[i].name);
    }
}

/* ---- the files ---------------------------------------------------------------------- */

/* Each embedded file's SHA-256 is the one SOURCES.md records beside its source. */
static void test_files_are_the_recorded_text(void **state)
{
    (void)state;
    FILE *f = fopen(SOURCE_ROOT "/src/models/configs/SOURCES.md", "rb");
    assert_non_null(f);
    static char sources[65536];
    size_t len = fread(sources, 1, sizeof sources - 1, f);
    fclose(f);
    sources[len] = '\0';
    char dir[512];
    test_dir("shipped-hash", dir, sizeof dir);
    int files = 0;
    for (int s = 0; s < df_shipped_count(); s++) {
        const df_shipped_config *c = df_shipped_at(s);
        assert_int_equal(df_shipped_write(c, dir), DF_OK);
        const char *rel;
        for (int i = 0; (rel = df_shipped_file_at(c, i)); i++, files++) {
            char path[1024], hash[65], line[512];
            path_in(dir, rel, path, sizeof path);
            assert_int_equal(df_file_sha256(path, hash), DF_OK);
            snprintf(line, sizeof line, "`%s/%s` | `%s`", c->name, rel, hash);
            if (!strstr(sources, line))
                fail_msg("SOURCES.md records no line '%s': the file changed, or its source "
                         "was not recorded",
                         line);
        }
        df_shipped_remove(c, dir);
        assert_false(is_dir(dir)); /* everything written was removed */
        mkdir(dir, 0755);
    }
    assert_true(files >= 20);
    remove_tree(dir);
}

/* Reads tests/shipped/<set>.shapes: the tensors of `component`, into t (cap rows). */
static int read_shapes(const char *set, const char *component, tensor *t, int cap,
                       char (*names)[160])
{
    char path[512];
    snprintf(path, sizeof path, "%s/tests/shipped/%s.shapes", SOURCE_ROOT, set);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        char comp[64], name[160], dims[96];
        if (sscanf(line, "%63s %159s %95s", comp, name, dims) != 3 || strcmp(comp, component))
            continue;
        assert_true(n < cap);
        strcpy(names[n], name);
        t[n] = (tensor){names[n], 0, {0}};
        for (char *p = dims, *end; *p && t[n].ndim < 4; p = *end ? end + 1 : end) {
            t[n].shape[t[n].ndim++] = strtoll(p, &end, 10);
            if (end == p)
                break;
        }
        n++;
    }
    fclose(f);
    return n;
}

/* Every component of every set, at the released size, loads through diffuse's own readers
 * (the checks `diffuse inspect` runs: the config read, every weight bound by name and shape),
 * and the scheduler through the scheduler's. */
static void test_configs_load_at_full_size(void **state)
{
    (void)state;
    assert_int_equal(df_models_register_checks(), DF_OK);
    enum { CAP = 2048 };
    tensor *t = malloc(CAP * sizeof *t);
    char(*names)[160] = malloc(CAP * sizeof *names);
    assert_non_null(t);
    assert_non_null(names);
    for (int s = 0; s < df_shipped_count(); s++) {
        const df_shipped_config *c = df_shipped_at(s);
        char dir[512];
        test_dir("shipped-load", dir, sizeof dir);
        assert_int_equal(df_shipped_write(c, dir), DF_OK);
        df_model_index *idx;
        assert_int_equal(df_model_index_load(dir, &idx), DF_OK);
        int models = 0;
        for (int i = 0; i < df_model_index_count(idx); i++) {
            const df_component *comp = df_model_index_at(idx, i);
            char cdir[1024], file[1200];
            path_in(dir, comp->name, cdir, sizeof cdir);
            if (strncmp(comp->name, "tokenizer", 9) == 0)
                continue;
            if (strcmp(comp->name, "scheduler") == 0) {
                df_scheduler *sch;
                assert_int_equal(df_scheduler_load(cdir, &sch), DF_OK);
                df_scheduler_free(sch);
                continue;
            }
            int n = read_shapes(c->name, comp->name, t, CAP, names);
            assert_true(n > 0);
            bool diffusers = strcmp(comp->library, "diffusers") == 0;
            path_in(cdir, diffusers ? "diffusion_pytorch_model.safetensors" : "model.safetensors",
                    file, sizeof file);
            write_sparse(file, t, n);
            df_model_check_fn check = df_model_check_find(comp->cls);
            assert_non_null(check);
            df_status st = check(cdir, NULL, NULL);
            if (st != DF_OK)
                fail_msg("%s %s (%s): %s", c->name, comp->name, comp->cls, df_error_message());
            models++;
        }
        assert_true(models >= 2);
        df_model_index_free(idx);
        remove_tree(dir);
    }
    free(names);
    free(t);
}

/* ---- loading a single file ---------------------------------------------------------- */

/* The temporary folders a load left in `tmp`. */
static int leftovers(const char *tmp)
{
    DIR *d = opendir(tmp);
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strncmp(e->d_name, "diffuse-config-", 15) == 0;
    closedir(d);
    return n;
}

static void copy_tree(const char *from, const char *to)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

static void test_single_file_load_asks_for_the_tokenizers(void **state)
{
    (void)state;
    char dir[512], file[600], tmp[600], toks[600], half[600];
    test_dir("shipped-pipeline", dir, sizeof dir);
    path_in(dir, "flux1-schnell.safetensors", file, sizeof file);
    path_in(dir, "tmp", tmp, sizeof tmp);
    path_in(dir, "toks", toks, sizeof toks);
    path_in(dir, "half", half, sizeof half);
    mkdir(tmp, 0755);
    mkdir(toks, 0755);
    mkdir(half, 0755);
    copy_tree(TOKENIZERS "/tokenizer", toks);
    copy_tree(TOKENIZERS "/tokenizer_2", toks);
    copy_tree(TOKENIZERS "/tokenizer", half);
    setenv("TMPDIR", tmp, 1);
    write_flux_bfl(file, "model.diffusion_model.", false, 3072, 19);
    df_pipeline *p = (void *)1;

    /* no folder at all: the configs are shipped, the tokenizers are asked for by name */
    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1}, &p), DF_E_ARG);
    assert_null(p);
    const char *m = df_error_message();
    assert_non_null(strstr(m, "FLUX.1-schnell"));
    assert_non_null(strstr(m, "tokenizer/"));
    assert_non_null(strstr(m, "tokenizer_2/"));
    assert_non_null(strstr(m, "--config DIR"));

    /* a folder with one of the two: the missing one and the weights the file lacks */
    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1, .config_dir = half}, &p),
                     DF_E_ARG);
    m = df_error_message();
    assert_non_null(strstr(m, "still needed: tokenizer_2/ (in --config DIR: not in"));
    assert_non_null(strstr(m, "vae (--vae FILE)"));
    assert_non_null(strstr(m, "text_encoder_2 (--text-encoder-2 FILE)"));

    /* a T5 GGUF that carries its tokenizer (llama.cpp's tokenizer.ggml.*) as the second
     * encoder: tokenizer_2/ is not asked for, with or without a folder */
    assert_int_equal(df_pipeline_load(file,
                                      &(df_load_opts){.threads = 1,
                                                      .config_dir = half,
                                                      .text_encoder_2_file = T5_GGUF},
                                      &p),
                     DF_E_ARG);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer_2/"));
    assert_non_null(strstr(m, "still needed: text_encoder (--text-encoder FILE), vae (--vae FILE)"));
    assert_null(strstr(m, "text_encoder_2"));
    assert_int_equal(
        df_pipeline_load(file, &(df_load_opts){.threads = 1, .text_encoder_2_file = T5_GGUF}, &p),
        DF_E_ARG);
    m = df_error_message();
    assert_non_null(strstr(m, "still needed: tokenizer/ (in --config DIR), text_encoder "));
    assert_null(strstr(m, "tokenizer_2/ (in --config DIR"));

    /* both tokenizers: only the weights */
    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1, .config_dir = toks}, &p),
                     DF_E_ARG);
    m = df_error_message();
    assert_non_null(strstr(m, "still needed: text_encoder (--text-encoder FILE), "));
    assert_null(strstr(m, "tokenizer/"));
    assert_null(strstr(m, "tokenizer_2/"));

    /* all of it: the shipped configs are used and the load goes on to the weights, where
     * this file (four of the transformer's tensors) fails: no tokenizer or config error,
     * and the temporary folder is gone afterwards */
    df_status s = df_pipeline_load(file,
                                   &(df_load_opts){.threads = 1,
                                                   .config_dir = toks,
                                                   .vae_file = file,
                                                   .text_encoder_file = file,
                                                   .text_encoder_2_file = file},
                                   &p);
    assert_int_not_equal(s, DF_OK);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer"));
    assert_non_null(strstr(m, "loading on the shipped FLUX.1-schnell configs"));
    assert_non_null(strstr(m, "num_layers"));
    assert_int_equal(leftovers(tmp), 0);

    /* a diffusers folder as --config DIR wins over the shipped set */
    s = df_pipeline_load(file, &(df_load_opts){.threads = 1, .config_dir = TOKENIZERS}, &p);
    assert_int_not_equal(s, DF_OK);
    m = df_error_message();
    assert_non_null(strstr(m, TOKENIZERS "/transformer"));
    assert_null(strstr(m, "loading on the shipped"));
    assert_int_equal(leftovers(tmp), 0);

    /* another size of the layout: no shipped set, --config asked for */
    write_flux_bfl(file, "", false, 64, 19);
    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1, .config_dir = toks}, &p),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "none shipped for this size"));
    assert_int_equal(leftovers(tmp), 0);
    unsetenv("TMPDIR");
    remove_tree(dir);
}

/* SD3.5-large's own file (sd3.5_large.safetensors: the transformer alone): the three
 * tokenizers and every encoder and the VAE are asked for; a T5 GGUF that carries its
 * tokenizer as the third encoder excuses tokenizer_3/. */
static void test_sd3_single_file_load_asks_for_what_is_missing(void **state)
{
    (void)state;
    char dir[512], file[600], tmp[600], toks[600], clips[600];
    test_dir("shipped-sd3", dir, sizeof dir);
    path_in(dir, "sd3.5_large.safetensors", file, sizeof file);
    path_in(dir, "tmp", tmp, sizeof tmp);
    path_in(dir, "toks", toks, sizeof toks);
    path_in(dir, "clips", clips, sizeof clips);
    mkdir(tmp, 0755);
    mkdir(toks, 0755);
    mkdir(clips, 0755);
    copy_tree(SD3_TOKENIZERS "/tokenizer", toks);
    copy_tree(SD3_TOKENIZERS "/tokenizer_2", toks);
    copy_tree(SD3_TOKENIZERS "/tokenizer_3", toks);
    copy_tree(SD3_TOKENIZERS "/tokenizer", clips);
    copy_tree(SD3_TOKENIZERS "/tokenizer_2", clips);
    setenv("TMPDIR", tmp, 1);
    write_sd3(file, "model.diffusion_model.", 2432, 38, 36864);
    df_pipeline *p = (void *)1;

    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1}, &p), DF_E_ARG);
    assert_null(p);
    const char *m = df_error_message();
    assert_non_null(strstr(m, "is SD3.5-large: diffuse ships its configs"));
    assert_non_null(strstr(m, "still needed: tokenizer/ (in --config DIR), tokenizer_2/ (in "
                              "--config DIR), tokenizer_3/ (in --config DIR), text_encoder "
                              "(--text-encoder FILE), text_encoder_2 (--text-encoder-2 FILE), "
                              "text_encoder_3 (--text-encoder-3 FILE, or none to run "
                              "without T5), vae (--vae FILE)"));
    assert_non_null(strstr(m, "tokenizer_2/ (CLIP-G"));

    /* the CLIP tokenizers and a T5 GGUF carrying its own: no tokenizer is asked for */
    assert_int_equal(
        df_pipeline_load(
            file,
            &(df_load_opts){.threads = 1, .config_dir = clips, .text_encoder_3_file = T5_GGUF}, &p),
        DF_E_ARG);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer/"));
    assert_null(strstr(m, "tokenizer_2/"));
    assert_null(strstr(m, "tokenizer_3/"));
    assert_non_null(strstr(m, "still needed: text_encoder (--text-encoder FILE), text_encoder_2 "
                              "(--text-encoder-2 FILE), vae (--vae FILE)"));

    /* without T5 (--text-encoder-3 none): neither T5 nor tokenizer_3/ is asked for, and
     * with the rest given the load goes on to the weights */
    assert_int_equal(
        df_pipeline_load(
            file, &(df_load_opts){.threads = 1, .config_dir = clips, .no_text_encoder_3 = true},
            &p),
        DF_E_ARG);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer_3/"));
    assert_non_null(strstr(m, "still needed: text_encoder (--text-encoder FILE), text_encoder_2 "
                              "(--text-encoder-2 FILE), vae (--vae FILE)"));
    df_status none = df_pipeline_load(file,
                                      &(df_load_opts){.threads = 1,
                                                      .config_dir = clips,
                                                      .vae_file = file,
                                                      .text_encoder_file = file,
                                                      .text_encoder_2_file = file,
                                                      .no_text_encoder_3 = true},
                                      &p);
    assert_int_not_equal(none, DF_OK);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer"));
    assert_null(strstr(m, "text_encoder_3"));
    assert_non_null(strstr(m, "loading on the shipped SD3.5-large configs"));
    assert_int_equal(leftovers(tmp), 0);

    /* all of it: the load goes on to the weights on the shipped configs */
    df_status s = df_pipeline_load(file,
                                   &(df_load_opts){.threads = 1,
                                                   .config_dir = toks,
                                                   .vae_file = file,
                                                   .text_encoder_file = file,
                                                   .text_encoder_2_file = file,
                                                   .text_encoder_3_file = file},
                                   &p);
    assert_int_not_equal(s, DF_OK);
    m = df_error_message();
    assert_null(strstr(m, "tokenizer"));
    assert_non_null(strstr(m, "loading on the shipped SD3.5-large configs"));
    assert_int_equal(leftovers(tmp), 0);

    /* SD3-medium: its own set */
    write_sd3(file, "", 1536, 24, 36864);
    assert_int_equal(df_pipeline_load(file, &(df_load_opts){.threads = 1, .config_dir = toks}, &p),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "is SD3-medium: diffuse ships its configs"));
    assert_int_equal(leftovers(tmp), 0);
    unsetenv("TMPDIR");
    remove_tree(dir);
}

/* A released-size file with every component given as a file of its own (sparse, in
 * diffusers' and transformers' names) and only the tokenizers in --config DIR: the whole
 * pipeline loads on the shipped configs, which names them, and leaves no temporary folder. */
static void test_single_file_loads_on_the_shipped_configs(void **state)
{
    (void)state;
    char dir[512], file[600], tmp[600], toks[600], parts[4][600];
    static const char *const names[] = {"transformer", "vae", "text_encoder", "text_encoder_2"};
    test_dir("shipped-full", dir, sizeof dir);
    path_in(dir, "flux1-schnell.safetensors", file, sizeof file);
    path_in(dir, "tmp", tmp, sizeof tmp);
    path_in(dir, "toks", toks, sizeof toks);
    mkdir(tmp, 0755);
    mkdir(toks, 0755);
    copy_tree(TOKENIZERS "/tokenizer", toks);
    copy_tree(TOKENIZERS "/tokenizer_2", toks);
    setenv("TMPDIR", tmp, 1);
    write_flux_bfl(file, "", false, 3072, 19);
    enum { CAP = 2048 };
    tensor *t = malloc(CAP * sizeof *t);
    char(*tn)[160] = malloc(CAP * sizeof *tn);
    assert_non_null(t);
    assert_non_null(tn);
    for (int i = 0; i < 4; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.safetensors", names[i]);
        path_in(dir, name, parts[i], sizeof parts[i]);
        write_sparse(parts[i], t, read_shapes("FLUX.1-schnell", names[i], t, CAP, tn));
    }
    free(tn);
    free(t);
    df_pipeline *p = NULL;
    df_status s = df_pipeline_load(file,
                                   &(df_load_opts){.threads = 1,
                                                   .config_dir = toks,
                                                   .transformer_file = parts[0],
                                                   .vae_file = parts[1],
                                                   .text_encoder_file = parts[2],
                                                   .text_encoder_2_file = parts[3]},
                                   &p);
    if (s != DF_OK)
        fail_msg("%s", df_error_message());
    assert_string_equal(df_pipeline_class(p), "FluxPipeline");
    assert_string_equal(df_pipeline_shipped_config(p), "FLUX.1-schnell");
    assert_int_equal(leftovers(tmp), 1); /* the configs it reads */
    df_pipeline_free(p);
    assert_int_equal(leftovers(tmp), 0);
    unsetenv("TMPDIR");
    remove_tree(dir);
}

/* The same for SD3-medium and SD3.5-large: the transformer file (-m) and the VAE and three
 * encoders as files of their own, the three tokenizer folders in --config DIR: the whole
 * StableDiffusion3Pipeline loads on each shipped set. */
static void test_sd3_single_file_loads_on_the_shipped_configs(void **state)
{
    (void)state;
    static const char *const names[] = {"transformer", "vae", "text_encoder", "text_encoder_2",
                                        "text_encoder_3"};
    static const struct {
        const char *set;
        int width, blocks;
    } sets[] = {{"SD3-medium", 1536, 24}, {"SD3.5-large", 2432, 38}};
    enum { CAP = 2048 };
    tensor *t = malloc(CAP * sizeof *t);
    char(*tn)[160] = malloc(CAP * sizeof *tn);
    assert_non_null(t);
    assert_non_null(tn);
    for (size_t s = 0; s < sizeof sets / sizeof sets[0]; s++) {
        char dir[512], file[600], tmp[600], toks[600], parts[5][600];
        test_dir("shipped-full-sd3", dir, sizeof dir);
        path_in(dir, "sd3.safetensors", file, sizeof file);
        path_in(dir, "tmp", tmp, sizeof tmp);
        path_in(dir, "toks", toks, sizeof toks);
        mkdir(tmp, 0755);
        mkdir(toks, 0755);
        copy_tree(SD3_TOKENIZERS "/tokenizer", toks);
        copy_tree(SD3_TOKENIZERS "/tokenizer_2", toks);
        copy_tree(SD3_TOKENIZERS "/tokenizer_3", toks);
        setenv("TMPDIR", tmp, 1);
        write_sd3(file, "model.diffusion_model.", sets[s].width, sets[s].blocks, 36864);
        for (int i = 0; i < 5; i++) {
            char name[64];
            snprintf(name, sizeof name, "%s.safetensors", names[i]);
            path_in(dir, name, parts[i], sizeof parts[i]);
            write_sparse(parts[i], t, read_shapes(sets[s].set, names[i], t, CAP, tn));
        }
        df_pipeline *p = NULL;
        df_status st = df_pipeline_load(file,
                                        &(df_load_opts){.threads = 1,
                                                        .config_dir = toks,
                                                        .transformer_file = parts[0],
                                                        .vae_file = parts[1],
                                                        .text_encoder_file = parts[2],
                                                        .text_encoder_2_file = parts[3],
                                                        .text_encoder_3_file = parts[4]},
                                        &p);
        if (st != DF_OK)
            fail_msg("%s: %s", sets[s].set, df_error_message());
        assert_string_equal(df_pipeline_class(p), "StableDiffusion3Pipeline");
        assert_string_equal(df_pipeline_shipped_config(p), sets[s].set);
        assert_int_equal(leftovers(tmp), 1);
        df_pipeline_free(p);
        assert_int_equal(leftovers(tmp), 0);
        unsetenv("TMPDIR");
        remove_tree(dir);
    }
    free(tn);
    free(t);
}

static void test_config_write_by_name(void **state)
{
    (void)state;
    char dir[512], path[700];
    test_dir("shipped-write", dir, sizeof dir);
    assert_string_equal(df_shipped_config_name(0), "FLUX.1-dev");
    assert_string_equal(df_shipped_config_name(1), "FLUX.1-schnell");
    assert_string_equal(df_shipped_config_name(2), "SD3-medium");
    assert_string_equal(df_shipped_config_name(3), "SD3.5-large");
    assert_null(df_shipped_config_name(df_shipped_count()));
    assert_int_equal(df_shipped_config_write("FLUX.1-schnell", dir), DF_OK);
    assert_true(is_dir(path_in(dir, "transformer", path, sizeof path)));
    df_model_index *idx;
    assert_int_equal(df_model_index_load(dir, &idx), DF_OK);
    assert_string_equal(df_model_index_class(idx), "FluxPipeline");
    df_model_index_free(idx);
    assert_int_equal(df_shipped_config_write("SD3.5-large", dir), DF_OK);
    assert_int_equal(df_model_index_load(dir, &idx), DF_OK);
    assert_string_equal(df_model_index_class(idx), "StableDiffusion3Pipeline");
    df_model_index_free(idx);
    assert_int_equal(df_shipped_config_write("FLUX.3-mega", dir), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "FLUX.1-schnell"));
    assert_non_null(strstr(df_error_message(), "SD3.5-large"));
    remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_recognition_picks_the_set_by_model_and_size),
        cmocka_unit_test(test_recognition_picks_the_sd3_sets),
        cmocka_unit_test(test_gguf_file_gets_the_set),
        cmocka_unit_test(test_every_recognised_model_is_shipped_or_says_why),
        cmocka_unit_test(test_every_model_class_is_shipped_or_listed),
        cmocka_unit_test(test_files_are_the_recorded_text),
        cmocka_unit_test(test_configs_load_at_full_size),
        cmocka_unit_test(test_single_file_load_asks_for_the_tokenizers),
        cmocka_unit_test(test_sd3_single_file_load_asks_for_what_is_missing),
        cmocka_unit_test(test_single_file_loads_on_the_shipped_configs),
        cmocka_unit_test(test_sd3_single_file_loads_on_the_shipped_configs),
        cmocka_unit_test(test_config_write_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
