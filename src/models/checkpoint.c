/*
 * Recognising a checkpoint file's model and components (checkpoint.h). The rules are
 * diffusers' infer_diffusers_model_type for the models diffuse runs, in its order: SD3
 * before SD3.5 large, FLUX.2 before FLUX.1. Keys are looked up by exact name under the two
 * prefixes diffusers tries; the components by suffix, since their prefixes vary.
 */
#include "models/checkpoint.h"

#include <stdio.h>
#include <string.h>

#include <diffuse/gguf.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "models/names.h"

static const char *const prefixes[] = {"", "model.diffusion_model."};

/* The key `name` under either transformer prefix, or NULL; *prefix gets the one found. */
static const df_checkpoint_key *find(const df_checkpoint_key *keys, int n, const char *name,
                                     const char **prefix)
{
    for (size_t p = 0; p < sizeof prefixes / sizeof *prefixes; p++) {
        size_t pl = strlen(prefixes[p]);
        for (int i = 0; i < n; i++)
            if (strncmp(keys[i].name, prefixes[p], pl) == 0 &&
                strcmp(keys[i].name + pl, name) == 0) {
                if (prefix)
                    *prefix = prefixes[p];
                return &keys[i];
            }
    }
    return NULL;
}

static int64_t dim(const df_checkpoint_key *k, int d)
{
    if (!k || k->ndim == 0)
        return 0;
    if (d < 0)
        d += k->ndim;
    return d >= 0 && d < k->ndim && d < 4 ? k->shape[d] : 0;
}

static bool ends_with(const char *name, const char *suffix)
{
    size_t n = strlen(name), s = strlen(suffix);
    return n >= s && strcmp(name + n - s, suffix) == 0 && (n == s || name[n - s - 1] == '.');
}

/* The transformer: which model, and under which prefix. */
static void transformer(const df_checkpoint_key *keys, int n, df_checkpoint_parts *out)
{
    const char *prefix = "";
    const df_checkpoint_key *k;
    out->model = "";
    if ((k = find(keys, n, "joint_blocks.0.context_block.adaLN_modulation.1.bias", &prefix)) &&
        dim(k, -1) == 9216) {
        int64_t len = dim(find(keys, n, "pos_embed", NULL), 1);
        out->model = len == 36864 ? "SD3-medium" : len == 147456 ? "SD3.5-medium" : "";
    } else if (find(keys, n, "joint_blocks.37.x_block.mlp.fc1.weight", &prefix)) {
        out->model = "SD3.5-large";
    } else if (find(keys, n, "single_stream_modulation.lin.weight", &prefix)) {
        out->model = "FLUX.2";
    } else if (find(keys, n, "double_blocks.0.img_attn.norm.key_norm.scale", &prefix)) {
        int64_t in = dim(find(keys, n, "img_in.weight", NULL), 1);
        out->model = !find(keys, n, "guidance_in.in_layer.bias", NULL) ? "FLUX.1-schnell"
                     : in == 384                                      ? "FLUX.1-fill"
                     : in == 128                                      ? "FLUX.1-depth"
                                                                      : "FLUX.1-dev";
    }
    out->transformer = *out->model != '\0';
    snprintf(out->transformer_prefix, sizeof out->transformer_prefix, "%s", prefix);
}

void df_checkpoint_recognise_keys(const df_checkpoint_key *keys, int n, df_checkpoint_parts *out)
{
    memset(out, 0, sizeof *out);
    transformer(keys, n, out);
    for (int i = 0; i < n; i++) {
        const char *name = keys[i].name;
        if (ends_with(name, df_names_vae_probe()))
            out->vae = true;
        if (ends_with(name, df_names_t5_probe()))
            out->t5 = true;
        if (ends_with(name, df_names_clip_bare_probe())) {
            bool g = strstr(name, "clip_g") || (!strstr(name, "clip_l") && dim(&keys[i], 1) == 1280);
            if (g)
                out->clip_g = true;
            else
                out->clip_l = true;
        }
    }
}

df_status df_checkpoint_recognise(const char *path, df_checkpoint_parts *out)
{
    memset(out, 0, sizeof *out);
    out->model = "";
    df_gguf *g = NULL;
    df_weights *w = NULL;
    DF_TRY(df_str_ends_with(path, ".gguf") ? df_gguf_open(path, &g) : df_weights_open(path, &w));
    int64_t n = g ? df_gguf_count(g) : df_weights_count(w);
    df_checkpoint_key *keys = df_calloc((size_t)(n ? n : 1), sizeof *keys);
    df_status s = keys ? DF_OK : df_errorf(DF_E_OOM, "%s: out of memory", path);
    for (int64_t i = 0; s == DF_OK && i < n; i++) {
        df_checkpoint_key *k = &keys[i];
        if (g) {
            df_gguf_tensor t;
            if ((s = df_gguf_at(g, i, &t)) == DF_OK) {
                k->name = t.name, k->ndim = t.ndim < 4 ? t.ndim : 4;
                memcpy(k->shape, t.shape, (size_t)k->ndim * sizeof *k->shape);
            }
        } else {
            df_tensor_info t;
            if ((s = df_weights_at(w, i, &t)) == DF_OK) {
                k->name = t.name, k->ndim = t.ndim < 4 ? t.ndim : 4;
                memcpy(k->shape, t.shape, (size_t)k->ndim * sizeof *k->shape);
            }
        }
    }
    if (s == DF_OK)
        df_checkpoint_recognise_keys(keys, (int)n, out);
    df_free(keys);
    df_gguf_free(g);
    df_weights_free(w);
    return s;
}
