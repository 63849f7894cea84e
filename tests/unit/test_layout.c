/*
 * Tests of the diffusers folder layout: model_index.json (components, [null, null], settings,
 * malformed entries, names that would leave the folder), component folders, the weight file
 * search order, configs, the model check registry, and every golden model and pipeline
 * folder opening and validating cleanly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include <diffuse/layout.h>

#include "core/alloc.h"
#include "unit/io_files.h"

static df_json *parse(const char *text)
{
    df_json *j = NULL;
    if (df_json_parse_string(text, strlen(text), "model_index.json", &j) != DF_OK)
        fail_msg("%s", df_error_message());
    return j;
}

static void test_model_index(void **state)
{
    (void)state;
    df_json *j = parse("{\"_class_name\": \"FluxPipeline\", \"_diffusers_version\": \"0.37.1\","
                       " \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],"
                       " \"text_encoder\": [null, null], \"requires_safety_checker\": true,"
                       " \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"]}");
    df_model_index *idx;
    assert_int_equal(df_model_index_from_json(j, &idx), DF_OK);
    assert_string_equal(df_model_index_class(idx), "FluxPipeline");
    assert_int_equal(df_model_index_count(idx), 3);
    const df_component *c = df_model_index_at(idx, 0);
    assert_string_equal(c->name, "scheduler");
    assert_string_equal(c->library, "diffusers");
    c = df_model_index_find(idx, "text_encoder");
    assert_non_null(c);
    assert_null(c->library);
    assert_null(c->cls);
    assert_string_equal(df_model_index_find(idx, "transformer")->cls, "FluxTransformer2DModel");
    assert_null(df_model_index_find(idx, "requires_safety_checker"));
    assert_null(df_model_index_at(idx, 3));
    assert_ptr_equal(df_model_index_json(idx), j);
    df_model_index_free(idx);
    df_json_free(j);
}

typedef struct bad_mi {
    const char *what, *text, *word;
} bad_mi;

static const bad_mi bad_model_indexes[] = {
    {"three entries", "{\"vae\": [\"diffusers\", \"AutoencoderKL\", \"x\"]}", "array of 3"},
    {"library a number", "{\"vae\": [1, \"AutoencoderKL\"]}", "library must be a string"},
    {"class an object", "{\"vae\": [\"diffusers\", {}]}", "class must be a string"},
    {"half null", "{\"vae\": [null, \"AutoencoderKL\"]}", "both be null"},
    {"component ..", "{\"..\": [\"diffusers\", \"AutoencoderKL\"]}", "'..'"},
    {"component with /", "{\"a/b\": [\"diffusers\", \"AutoencoderKL\"]}", "plain name"},
    {"component .", "{\".\": [\"diffusers\", \"AutoencoderKL\"]}", "does not name"},
    {"component empty", "{\"\": [\"diffusers\", \"AutoencoderKL\"]}", "empty"},
    {"not an object", "[\"vae\"]", "must be a JSON object"},
    {"class name not a string", "{\"_class_name\": 3}", "'_class_name'"},
    {"class a path", "{\"vae\": [\"diffusers\", \"../../etc/passwd\"]}",
     "component 'vae': class '../../etc/passwd' is not a Python identifier"},
    {"class with a space", "{\"vae\": [\"diffusers\", \"Autoencoder KL\"]}",
     "not a Python identifier"},
    {"class empty", "{\"vae\": [\"diffusers\", \"\"]}", "not a Python identifier"},
    {"component with -", "{\"text-encoder\": [\"transformers\", \"T5EncoderModel\"]}",
     "component name 'text-encoder' is not a Python identifier"},
    {"component from a digit", "{\"2vae\": [\"diffusers\", \"AutoencoderKL\"]}",
     "not a Python identifier"},
};

static void test_bad_model_index(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_model_indexes / sizeof bad_model_indexes[0]; i++) {
        const bad_mi *c = &bad_model_indexes[i];
        df_json *j = parse(c->text);
        df_model_index *idx = (df_model_index *)1;
        df_status s = df_model_index_from_json(j, &idx);
        const char *m = df_error_message();
        if (s != DF_E_FORMAT || !strstr(m, c->word) || !strstr(m, "model_index.json"))
            fail_msg("%s: got %s '%s', expected DF_E_FORMAT with '%s'", c->what,
                     df_status_name(s), m, c->word);
        assert_null(idx);
        df_json_free(j);
    }
}

/* Every JSON file of a folder is an object: df_layout_open_json refuses another root,
 * naming the file, and so does loading model_index.json. */
static void test_json_root_must_be_an_object(void **state)
{
    (void)state;
    char dir[600], path[800];
    test_dir("layout-roots", dir, sizeof dir);
    static const char *const roots[][2] = {{"[]", "found array"}, {"\"x\"", "found string"},
                                           {"null", "found null"}, {"1", "found number"}};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        write_text(path_in(dir, "config.json", path, sizeof path), roots[i][0]);
        df_json *j = (df_json *)1;
        assert_int_equal(df_layout_open_config(dir, &j), DF_E_FORMAT);
        assert_null(j);
        assert_non_null(strstr(df_error_message(), path));
        assert_non_null(strstr(df_error_message(), roots[i][1]));
        write_text(path_in(dir, "model_index.json", path, sizeof path), roots[i][0]);
        df_model_index *idx = (df_model_index *)1;
        assert_int_equal(df_model_index_load(dir, &idx), DF_E_FORMAT);
        assert_null(idx);
        assert_non_null(strstr(df_error_message(), path));
        assert_non_null(strstr(df_error_message(), roots[i][1]));
    }
    write_text(path_in(dir, "config.json", path, sizeof path), "{}");
    df_json *j = NULL;
    assert_int_equal(df_layout_open_config(dir, &j), DF_OK);
    df_json_free(j);
}

static void touch(const char *dir, const char *name)
{
    char path[800];
    size_t len;
    uint8_t *b = st_bytes("{}", NULL, 0, &len);
    write_file(path_in(dir, name, path, sizeof path), b, len);
    free(b);
}

static void test_folders(void **state)
{
    (void)state;
    char root[512], dir[DF_PATH_MAX], path[800];
    test_dir("layout", root, sizeof root);
    write_text(path_in(root, "model_index.json", path, sizeof path),
               "{\"vae\": [\"diffusers\", \"AutoencoderKL\"], \"text_encoder\": [null, null],"
               " \"unet\": [\"diffusers\", \"UNet2DConditionModel\"]}");
    mkdir(path_in(root, "vae", path, sizeof path), 0755);
    df_model_index *idx;
    assert_int_equal(df_model_index_load(root, &idx), DF_OK);
    assert_int_equal(df_model_index_count(idx), 3);
    df_model_index_free(idx);

    assert_int_equal(df_layout_component_dir(root, "vae", dir, sizeof dir), DF_OK);
    assert_string_equal(dir, path);
    assert_int_equal(df_layout_component_dir(root, "unet", dir, sizeof dir), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "component 'unet' has no folder"));
    assert_int_equal(df_layout_component_dir(root, "../x", dir, sizeof dir), DF_E_FORMAT);
    assert_int_equal(df_layout_component_dir(root, "vae", dir, 8), DF_E_ARG);
    /* A component folder that is a link out of the pipeline folder is refused; a link to a
     * folder inside it is fine. */
    char outside[600], link[800];
    snprintf(outside, sizeof outside, "%s-outside", root);
    mkdir(outside, 0755);
    unlink(path_in(root, "te", link, sizeof link));
    assert_int_equal(symlink(outside, link), 0);
    assert_int_equal(df_layout_component_dir(root, "te", dir, sizeof dir), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "component 'te' is a link to"));
    assert_non_null(strstr(df_error_message(), "outside the pipeline folder"));
    assert_string_equal(dir, "");
    unlink(path_in(root, "te2", link, sizeof link));
    assert_int_equal(symlink("vae", link), 0);
    assert_int_equal(df_layout_component_dir(root, "te2", dir, sizeof dir), DF_OK);

    /* The weight search order, and what a folder without safetensors says. */
    df_layout_component_dir(root, "vae", dir, sizeof dir);
    assert_int_equal(df_layout_find_weights(dir, path, sizeof path), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "no weights"));
    touch(dir, "diffusion_pytorch_model.bin");
    assert_int_equal(df_layout_find_weights(dir, path, sizeof path), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), ".bin"));
    touch(dir, "model.safetensors.index.json");
    assert_int_equal(df_layout_find_weights(dir, path, sizeof path), DF_OK);
    assert_true(ends_with(path, "/model.safetensors.index.json"));
    touch(dir, "model.safetensors");
    assert_int_equal(df_layout_find_weights(dir, path, sizeof path), DF_OK);
    assert_true(ends_with(path, "/model.safetensors"));
    touch(dir, "diffusion_pytorch_model.safetensors");
    assert_int_equal(df_layout_find_weights(dir, path, sizeof path), DF_OK);
    assert_true(ends_with(path, "/diffusion_pytorch_model.safetensors"));
    df_weights *w;
    assert_int_equal(df_weights_open(dir, &w), DF_OK); /* an empty but valid file */
    assert_int_equal(df_weights_count(w), 0);
    df_weights_free(w);

    /* Configs. */
    df_json *cfg;
    assert_int_equal(df_layout_open_config(dir, &cfg), DF_E_IO);
    write_text(path_in(dir, "config.json", path, sizeof path), "{\"in_channels\": 4}");
    assert_int_equal(df_layout_open_config(dir, &cfg), DF_OK);
    int64_t v;
    assert_int_equal(df_json_get_int(cfg, "in_channels", &v), DF_OK);
    assert_int_equal(v, 4);
    df_json_free(cfg);
    assert_int_equal(df_layout_open_json(dir, "../model_index.json", &cfg), DF_E_FORMAT);
    assert_int_equal(df_layout_open_json(root, "model_index.json", &cfg), DF_OK);
    df_json_free(cfg);
    remove_tree(root);
}

static df_status check_a(const char *dir, const df_json *cfg, const df_weights *w)
{
    return DF_OK;
}

static df_status check_b(const char *dir, const df_json *cfg, const df_weights *w)
{
    return DF_E_FORMAT;
}

static void test_registry(void **state)
{
    (void)state;
    assert_null(df_model_check_find("FluxTransformer2DModel")); /* empty until models add */
    assert_int_equal(df_model_check_register("TestModel", check_a), DF_OK);
    assert_ptr_equal(df_model_check_find("TestModel"), check_a);
    assert_int_equal(df_model_check_register("TestModel", check_b), DF_OK);
    assert_ptr_equal(df_model_check_find("TestModel"), check_b);
    assert_null(df_model_check_find("Other"));
    assert_null(df_model_check_find(NULL));
    assert_int_equal(df_model_check_register(NULL, check_a), DF_E_ARG);
    assert_int_equal(df_model_check_register("X", NULL), DF_E_ARG);
}

/* Opens every weight of a component folder and reads every tensor's first row. */
static void validate_component(const char *dir)
{
    df_json *cfg;
    if (df_layout_open_config(dir, &cfg) != DF_OK)
        fail_msg("%s", df_error_message());
    df_weights *w;
    if (df_weights_open(dir, &w) != DF_OK)
        fail_msg("%s", df_error_message());
    assert_true(df_weights_count(w) > 0);
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info t;
        assert_int_equal(df_weights_at(w, i, &t), DF_OK);
        float row[4096];
        int64_t n = t.ndim ? t.numel / (t.shape[0] ? t.shape[0] : 1) : 1;
        if (t.dtype == DF_DTYPE_COUNT || n > 4096 || t.numel == 0)
            continue;
        df_status s = t.ndim ? df_weights_read_rows(w, t.name, 0, 1, DF_DTYPE_F32, row, sizeof row)
                             : df_weights_read(w, t.name, DF_DTYPE_F32, row, sizeof row);
        if (s != DF_OK)
            fail_msg("%s", df_error_message());
    }
    df_weights_free(w);
    df_json_free(cfg);
}

/* Every folder of a golden case that holds config.json is a model folder; every one that
 * holds model_index.json is a pipeline whose included components must all be there. */
static void test_golden_folders(void **state)
{
    (void)state;
    DIR *d = opendir(DF_GOLDEN_DIR);
    if (!d)
        skip();
    int models = 0, pipelines = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char casedir[1024];
        snprintf(casedir, sizeof casedir, "%s/%s", DF_GOLDEN_DIR, e->d_name);
        DIR *cd = e->d_name[0] != '.' ? opendir(casedir) : NULL;
        for (struct dirent *f; cd && (f = readdir(cd));) {
            char sub[2048], probe[2100];
            snprintf(sub, sizeof sub, "%s/%s", casedir, f->d_name);
            if (f->d_name[0] == '.' || !is_dir(sub))
                continue;
            if (access(path_in(sub, "config.json", probe, sizeof probe), R_OK) == 0) {
                validate_component(sub);
                models++;
            }
            if (access(path_in(sub, "model_index.json", probe, sizeof probe), R_OK) != 0)
                continue;
            df_model_index *idx;
            if (df_model_index_load(sub, &idx) != DF_OK)
                fail_msg("%s", df_error_message());
            for (int i = 0; i < df_model_index_count(idx); i++) {
                const df_component *c = df_model_index_at(idx, i);
                char cdir[DF_PATH_MAX];
                if (!c->cls)
                    continue;
                if (df_layout_component_dir(sub, c->name, cdir, sizeof cdir) != DF_OK)
                    fail_msg("%s", df_error_message());
                if (access(path_in(cdir, "config.json", probe, sizeof probe), R_OK) == 0) {
                    validate_component(cdir);
                    models++;
                }
            }
            df_model_index_free(idx);
            pipelines++;
        }
        if (cd)
            closedir(cd);
    }
    closedir(d);
    print_message("%d model folders and %d pipelines validated\n", models, pipelines);
    assert_true(models > 10 && pipelines > 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_index), cmocka_unit_test(test_bad_model_index),
        cmocka_unit_test(test_folders),     cmocka_unit_test(test_registry),
        cmocka_unit_test(test_golden_folders),
        cmocka_unit_test(test_json_root_must_be_an_object),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
