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
#include "models/shipped.h"

static const char *const prefixes[] = {"", "model.diffusion_model."};

/* The names transformer() below gives; test_shipped_configs checks each has a shipped
 * config set or a recorded reason. */
const char *const df_checkpoint_models[] = {
    "FLUX.1-dev",   "FLUX.1-schnell", "FLUX.1-fill", "FLUX.1-depth", "FLUX.2-dev",
    "FLUX.2-klein", "SD3-medium",     "SD3.5-medium", "SD3.5-large",
    "SD3-like (MMDiT names, no released size)", NULL};

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
        /* diffusers says flux-2-dev for both; klein has no guidance embedding */
        out->model = find(keys, n, "guidance_in.in_layer.weight", NULL) ? "FLUX.2-dev"
                                                                         : "FLUX.2-klein";
    } else if (find(keys, n, "double_blocks.0.img_attn.norm.key_norm.scale", &prefix)) {
        int64_t in = dim(find(keys, n, "img_in.weight", NULL), 1);
        out->model = !find(keys, n, "guidance_in.in_layer.bias", NULL) ? "FLUX.1-schnell"
                     : in == 384                                       ? "FLUX.1-fill"
                     : in == 128                                       ? "FLUX.1-depth"
                                                                       : "FLUX.1-dev";
    }
    /* The layout without a released size (a tiny test model, a fine-tune of another width):
     * what diffusers could not name, diffuse still reads with a config. */
    if (!*out->model && find(keys, n, "joint_blocks.0.x_block.attn.qkv.weight", &prefix))
        out->model = "SD3-like (MMDiT names, no released size)";
    /* diffusers' own names (stable-diffusion.cpp's convert copies them under its prefix
     * without --convert-name); diffusers' rules do not name these, the classes' keys do. */
    if (!*out->model && find(keys, n, "transformer_blocks.0.attn.to_q.weight", &prefix)) {
        if (find(keys, n, "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight", NULL))
            out->model = "FLUX.2 (diffusers names)";
        else if (find(keys, n, "single_transformer_blocks.0.proj_mlp.weight", NULL))
            out->model = find(keys, n, "time_text_embed.guidance_embedder.linear_1.weight", NULL)
                             ? "FLUX.1-dev (diffusers names)"
                             : "FLUX.1-schnell (diffusers names)";
        else if (find(keys, n, "pos_embed.proj.weight", NULL))
            out->model = "SD3 (diffusers names)";
    }
    out->transformer = *out->model != '\0';
    snprintf(out->transformer_prefix, sizeof out->transformer_prefix, "%s", prefix);
}

/* Whether the key `name` (which ends in `suffix`) has a sibling: the same prefix followed by
 * `other`. */
static bool has_sibling(const df_checkpoint_key *keys, int n, const char *name,
                        const char *suffix, const char *other)
{
    size_t pl = strlen(name) - strlen(suffix), ol = strlen(other);
    for (int i = 0; i < n; i++)
        if (strlen(keys[i].name) == pl + ol && strncmp(keys[i].name, name, pl) == 0 &&
            strcmp(keys[i].name + pl, other) == 0)
            return true;
    return false;
}

/* A CLIP text model's key (its width in dimension 1): CLIP-G under "clip_g" or 1280 wide. */
static void note_clip(const df_checkpoint_key *k, df_checkpoint_parts *out)
{
    if (strstr(k->name, "clip_g") || (!strstr(k->name, "clip_l") && dim(k, 1) == 1280))
        out->clip_g = true;
    else
        out->clip_l = true;
}

void df_checkpoint_recognise_keys(const df_checkpoint_key *keys, int n, df_checkpoint_parts *out)
{
    memset(out, 0, sizeof *out);
    transformer(keys, n, out);
    for (int i = 0; i < n; i++) {
        const char *name = keys[i].name;
        if (ends_with(name, df_names_vae_probe())) {
            out->vae = true;
            if (has_sibling(keys, n, name, df_names_vae_probe(), df_names_vae_flux2_probe()))
                out->vae_flux2 = true;
        }
        if (ends_with(name, df_names_diffusers_vae_probe()))
            out->vae = out->vae_diffusers = true;
        if (ends_with(name, df_names_t5_probe()))
            out->t5 = true;
        if (ends_with(name, df_names_t5_llamacpp_probe()))
            out->t5 = out->t5_llamacpp = true;
        if (ends_with(name, df_names_mistral_consolidated_probe()))
            out->mistral = true; /* Mistral's own names: tok_embeddings (no Qwen3 has them) */
        if (ends_with(name, df_names_lm_probe())) {
            if (has_sibling(keys, n, name, df_names_lm_probe(), df_names_qwen3_probe()))
                out->qwen3 = true;
            else
                out->mistral = true;
        }
        /* OpenCLIP's in_proj is [3 x width, width]; a vision tower's (visual.transformer.
         * resblocks) is no text encoder. */
        if (ends_with(name, df_names_clip_bare_probe()) ||
            (ends_with(name, df_names_clip_openclip_probe()) && !strstr(name, "visual.")))
            note_clip(&keys[i], out);
    }
    const df_shipped_config *c = df_shipped_match(keys, n, out, out->shipped_why,
                                                  sizeof out->shipped_why);
    out->shipped = c ? c->name : "";
}

df_status df_checkpoint_recognise(const char *path, df_checkpoint_parts *out)
{
    memset(out, 0, sizeof *out);
    out->model = "";
    out->shipped = "";
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
    if (s == DF_OK) {
        df_checkpoint_recognise_keys(keys, (int)n, out);
        out->gguf_tokenizer = g && df_gguf_kv_find(g, "tokenizer.ggml.model") >= 0;
        const char *model = NULL;
        out->gguf_tokenizer_t5 = out->gguf_tokenizer &&
                                 df_gguf_get_string(g, "tokenizer.ggml.model", &model) == DF_OK &&
                                 strcmp(model, "t5") == 0;
    }
    df_free(keys);
    df_gguf_free(g);
    df_weights_free(w);
    return s;
}

/* Appends `text` to out (cap bytes in all) after what is there. */
static void add(char *out, size_t cap, const char *text)
{
    size_t n = strlen(out);
    if (n < cap)
        snprintf(out + n, cap - n, "%s", text);
}

df_status df_checkpoint_describe(const char *path, char *out, size_t cap)
{
    if (!out || cap == 0)
        return df_errorf(DF_E_ARG, "df_checkpoint_describe: no room for the description");
    out[0] = '\0';
    df_checkpoint_parts c;
    DF_TRY(df_checkpoint_recognise(path, &c));
    bool sd3 = strncmp(c.model, "SD3", 3) == 0 || c.clip_g;
    char line[512];
    snprintf(line, sizeof line, "model: %s%s%s%s\n", *c.model ? c.model : "no transformer",
             c.transformer ? " (transformer under " : "",
             c.transformer ? (*c.transformer_prefix ? c.transformer_prefix : "no prefix") : "",
             c.transformer ? ")" : "");
    add(out, cap, line);
    add(out, cap, "holds:");
    const struct {
        bool has;
        const char *name;
    } parts[] = {{c.transformer, " transformer"},
                 {c.vae && !c.vae_diffusers && !c.vae_flux2, " VAE (LDM names)"},
                 {c.vae_diffusers, " VAE (diffusers names)"},
                 {c.vae_flux2, " VAE (FLUX.2's AutoencoderKLFlux2, LDM names)"},
                 {c.clip_l, " CLIP-L"},
                 {c.clip_g, " CLIP-G"},
                 {c.t5 && !c.t5_llamacpp, " T5"},
                 {c.t5_llamacpp, " T5 (llama.cpp names)"},
                 {c.qwen3, " Qwen3 (FLUX.2 klein's text encoder)"},
                 {c.mistral, " Mistral (FLUX.2 dev's text encoder)"}};
    bool any = false;
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++)
        if (parts[i].has) {
            add(out, cap, any ? "," : "");
            add(out, cap, parts[i].name);
            any = true;
        }
    add(out, cap, any ? "\n" : " nothing diffuse recognises\n");
    if (c.gguf_tokenizer_t5)
        add(out, cap, "tokenizer: llama.cpp's T5 (tokenizer.ggml.*), used when the folder "
                      "(--config DIR or -m DIR) has no T5 tokenizer\n");
    else if (c.gguf_tokenizer)
        add(out, cap, "tokenizer: llama.cpp's (tokenizer.ggml.*), not read: diffuse reads "
                      "tokenizers from a diffusers folder (--config DIR or -m DIR)\n");
    if (*c.shipped)
        snprintf(line, sizeof line, "config: shipped %s\n", c.shipped);
    else
        snprintf(line, sizeof line, "config: %s; give --config DIR\n", c.shipped_why);
    add(out, cap, line);
    if (strncmp(c.model, "FLUX.2", 6) == 0 || c.vae_flux2 || c.qwen3 || c.mistral) {
        bool klein = strcmp(c.model, "FLUX.2-klein") == 0 || (!c.transformer && c.qwen3);
        bool dev = strcmp(c.model, "FLUX.2-dev") == 0 || (!c.transformer && c.mistral);
        add(out, cap, "missing:");
        if (!c.transformer)
            add(out, cap, " transformer (--transformer FILE or -m DIR),");
        if (!c.vae_flux2)
            add(out, cap, " VAE (--vae FILE or the folder's vae/),");
        if ((klein && !c.qwen3) || (dev && !c.mistral) || (!klein && !dev))
            add(out, cap,
                klein ? " Qwen3 (--text-encoder FILE or the folder's text_encoder/),"
                : dev ? " Mistral (--text-encoder FILE or the folder's text_encoder/),"
                      : " text encoder (--text-encoder FILE or the folder's text_encoder/),");
        add(out, cap,
            " configs and tokenizers (none shipped for FLUX.2: -m FILE --config DIR, a "
            "diffusers folder of the model, or -m DIR with the component options)");
        return DF_OK;
    }
    add(out, cap, "missing:");
    if (!c.transformer)
        add(out, cap, " transformer (--transformer FILE or -m DIR),");
    if (!c.vae)
        add(out, cap, " VAE (--vae FILE or the folder's vae/),");
    if (!c.clip_l)
        add(out, cap, " CLIP-L (--text-encoder FILE or the folder's text_encoder/),");
    if (sd3 && !c.clip_g)
        add(out, cap, " CLIP-G (--text-encoder-2 FILE or the folder's text_encoder_2/),");
    if (!c.t5) /* the shipped SD3 sets name T5, as the official folders do */
        add(out, cap,
            sd3 && *c.shipped ? " T5 (--text-encoder-3 FILE: the shipped configs name it; "
                                "or --text-encoder-3 none to run without it),"
            : sd3             ? " T5 (optional for SD3: --text-encoder-3 FILE, the folder's "
                                "text_encoder_3/, or --text-encoder-3 none),"
                              : " T5 (--text-encoder-2 FILE or the folder's text_encoder_2/),");
    if (*c.shipped) {
        add(out, cap, " tokenizers (--config DIR holding ");
        add(out, cap, df_shipped_find(c.shipped)->tokenizers);
        add(out, cap, ")");
    } else {
        add(out, cap,
            " configs and tokenizers (-m FILE --config DIR, a diffusers folder of the model, "
            "or -m DIR with the component options)");
    }
    return DF_OK;
}
