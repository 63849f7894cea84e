/*
 * Fuzz target: JSON configs as the loaders read them.
 *
 * The input is parsed as a config file; then every value in the tree is visited through
 * the typed accessors (with its path for messages), the getters that model code uses are
 * called on the top-level object, and the document is read as a model_index.json and as a
 * *.safetensors.index.json (without opening shards). Nothing may crash, leak or read out of
 * bounds, whatever the input.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <diffuse/layout.h>

#include "core/alloc.h"
#include "io/weights.h"

static void visit(const df_json *j, int depth)
{
    char path[128];
    int64_t i64;
    double d;
    bool b;
    const char *s;
    df_json_path(j, path, sizeof path);
    df_json_to_int(j, &i64);
    df_json_to_double(j, &d);
    df_json_to_bool(j, &b);
    df_json_to_string(j, &s);
    if (depth > 64)
        return;
    for (int64_t i = 0; i < df_json_array_size(j); i++)
        visit(df_json_array_get(j, i), depth + 1);
    for (int64_t i = 0; i < df_json_object_size(j); i++) {
        const char *key;
        const df_json *v = df_json_object_at(j, i, &key);
        if (df_json_get(j, key) != v)
            abort(); /* keys are unique, so lookup finds the member itself */
        visit(v, depth + 1);
    }
}

static void getters(const df_json *cfg)
{
    int64_t v, arr[8], n;
    double d, darr[8];
    bool b;
    const char *s;
    const df_json *o;
    df_json_get_int(cfg, "num_layers", &v);
    df_json_get_int_or(cfg, "patch_size", 1, &v);
    df_json_get_double_or(cfg, "theta", 10000.0, &d);
    df_json_get_bool_or(cfg, "guidance_embeds", false, &b);
    df_json_get_string_or(cfg, "_class_name", NULL, &s);
    df_json_get_int_array(cfg, "axes_dims_rope", arr, 8, &n);
    df_json_get_double_array(cfg, "sigmas", darr, 8, &n);
    df_json_get_object(cfg, "weight_map", &o);
    df_json_get_array(cfg, "architectures", &o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_json *root;
    if (df_json_parse_string((const char *)data, size, "config.json", &root) != DF_OK)
        return 0;
    visit(root, 0);
    getters(root);
    df_model_index *idx;
    if (df_model_index_from_json(root, &idx) == DF_OK) {
        for (int i = 0; i < df_model_index_count(idx); i++)
            if (df_model_index_find(idx, df_model_index_at(idx, i)->name) == NULL)
                abort();
        df_model_index_free(idx);
    }
    df_index_entry *entries;
    int64_t n;
    if (df_weights_index_parse(root, &entries, &n) == DF_OK)
        df_free(entries);
    df_json_free(root);
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
