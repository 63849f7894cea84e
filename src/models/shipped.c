/*
 * The shipped config sets (shipped.h).
 *
 * The JSON files live in src/models/configs/<model>/ as data, embedded at build time as
 * bytes, so that a value is never retyped in C and a file can be compared with its source
 * (SOURCES.md records where each set's values come from, and test_shipped_configs checks
 * every file's SHA-256 against the recorded one). A set is matched to a file by the model
 * checkpoint.c recognised and then by sizes read from tensor shapes: a model's layout alone
 * does not say its size, and a config of the wrong size would fail later with a message
 * about a tensor rather than about the missing --config.
 *
 * When a set is used by a load, it is written as a folder skeleton into a private temporary
 * folder, which the pipeline reads as it reads any diffusers folder and removes when it is
 * freed; the same writer serves `diffuse config NAME -o DIR`.
 */
#include "models/shipped.h"

#include <diffuse/pipeline.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/status.h"

/* FLUX.1-dev and schnell share their released sizes (dev adds guidance_in, which
 * checkpoint.c's model name already tells) and their tokenizers. */
#define FLUX1_RELEASED                                                                             \
    .tokenizers = "tokenizer/ (CLIP: vocab.json and merges.txt) and tokenizer_2/ (T5: "            \
                  "spiece.model or tokenizer.json)",                                               \
    .width_key = "img_in.weight", .width_rows = 3072, .width_cols = 64,                            \
    .last_key = {"double_blocks.18.img_attn.qkv.weight", "single_blocks.37.linear1.weight"},       \
    .past_key = {"double_blocks.19.img_attn.qkv.weight", "single_blocks.38.linear1.weight"}

/* SD3 and SD3.5: one stack of joint blocks, whose last block's context half is "pre-only"
 * but still has its attention's qkv; the width is the context embedder's output. */
#define SD3_RELEASED(width, last, past)                                                            \
    .tokenizers = "tokenizer/ (CLIP-L: vocab.json and merges.txt), tokenizer_2/ (CLIP-G: "         \
                  "vocab.json and merges.txt) and tokenizer_3/ (T5: spiece.model or "              \
                  "tokenizer.json)",                                                               \
    .width_key = "context_embedder.weight", .width_rows = width, .width_cols = 4096,               \
    .last_key = {"joint_blocks." #last ".x_block.attn.qkv.weight",                                 \
                 "joint_blocks." #last ".context_block.attn.qkv.weight"},                          \
    .past_key = {"joint_blocks." #past ".x_block.attn.qkv.weight",                                 \
                 "joint_blocks." #past ".context_block.attn.qkv.weight"}

static const df_shipped_config sets[] = {
    {.name = "FLUX.1-dev", FLUX1_RELEASED},
    {.name = "FLUX.1-schnell", FLUX1_RELEASED},
    {.name = "SD3-medium", SD3_RELEASED(1536, 23, 24)},
    {.name = "SD3.5-large", SD3_RELEASED(2432, 37, 38)},
};

/* Every model checkpoint.c names that has no set, and why. */
static const struct {
    const char *model, *reason;
} missing[] = {
    {"FLUX.1-fill", "FluxFillPipeline is not implemented"},
    {"FLUX.1-depth", "FluxControlPipeline is not implemented"},
    {"FLUX.2-dev", "no complete public copy of its official configs was found to take the "
                   "values from"},
    {"FLUX.2-klein", "no faithful public copy of the official klein 4B / 9B configs was "
                     "found to take the values from (the one found has a transformer config "
                     "edited for another loader)"},
    {"SD3.5-medium", "no public copy of its official configs was found to take the values "
                     "from (its transformer's dual-attention layers and 384 positions are "
                     "its own)"},
    {"SD3-like (MMDiT names, no released size)", "the file is of no released size"},
};

int df_shipped_count(void)
{
    return (int)(sizeof sets / sizeof sets[0]);
}

const df_shipped_config *df_shipped_at(int i)
{
    return i >= 0 && i < df_shipped_count() ? &sets[i] : NULL;
}

const df_shipped_config *df_shipped_find(const char *name)
{
    for (int i = 0; name && i < df_shipped_count(); i++)
        if (strcmp(sets[i].name, name) == 0)
            return &sets[i];
    return NULL;
}

const char *df_shipped_missing_reason(const char *model)
{
    if (df_shipped_find(model))
        return NULL;
    for (size_t i = 0; model && i < sizeof missing / sizeof missing[0]; i++)
        if (strcmp(missing[i].model, model) == 0)
            return missing[i].reason;
    return "diffuse has no config for it";
}

/* The key `name` under `prefix`, or NULL. */
static const df_checkpoint_key *find_key(const df_checkpoint_key *keys, int n, const char *prefix,
                                         const char *name)
{
    size_t pl = strlen(prefix);
    for (int i = 0; i < n; i++)
        if (strncmp(keys[i].name, prefix, pl) == 0 && strcmp(keys[i].name + pl, name) == 0)
            return &keys[i];
    return NULL;
}

static bool sizes_agree(const df_shipped_config *c, const df_checkpoint_key *keys, int n,
                        const char *prefix)
{
    const df_checkpoint_key *w = find_key(keys, n, prefix, c->width_key);
    if (!w || w->ndim != 2 || w->shape[0] != c->width_rows || w->shape[1] != c->width_cols)
        return false;
    for (int i = 0; i < 2; i++)
        if (!find_key(keys, n, prefix, c->last_key[i]) || find_key(keys, n, prefix, c->past_key[i]))
            return false;
    return true;
}

const df_shipped_config *df_shipped_match(const df_checkpoint_key *keys, int n,
                                          const df_checkpoint_parts *parts, char *why, size_t cap)
{
    why[0] = '\0';
    const df_shipped_config *c = parts->transformer ? df_shipped_find(parts->model) : NULL;
    if (!parts->transformer)
        snprintf(why, cap, "the file holds no transformer to tell the model by");
    else if (!c)
        snprintf(why, cap, "none shipped for %s: %s", parts->model,
                 df_shipped_missing_reason(parts->model));
    else if (!sizes_agree(c, keys, n, parts->transformer_prefix))
        snprintf(why, cap,
                 "none shipped for this size (the layout is %s's, the tensor shapes "
                 "are not the released model's)",
                 parts->model);
    else
        return c;
    return NULL;
}

/* The blobs of set `c` are those whose path starts with "<name>/". */
static const df_shipped_blob *blob_at(const df_shipped_config *c, int i)
{
    size_t nl = strlen(c->name);
    for (int b = 0; b < df_shipped_blob_count; b++) {
        const char *p = df_shipped_blobs[b].path;
        if (strncmp(p, c->name, nl) == 0 && p[nl] == '/' && i-- == 0)
            return &df_shipped_blobs[b];
    }
    return NULL;
}

const char *df_shipped_file_at(const df_shipped_config *c, int i)
{
    const df_shipped_blob *b = c ? blob_at(c, i) : NULL;
    return b ? b->path + strlen(c->name) + 1 : NULL;
}

const char *df_shipped_file(const df_shipped_config *c, const char *path, size_t *size)
{
    for (int i = 0; c && path; i++) {
        const df_shipped_blob *b = blob_at(c, i);
        if (!b)
            break;
        if (strcmp(b->path + strlen(c->name) + 1, path) == 0) {
            if (size)
                *size = b->size;
            return (const char *)b->text;
        }
    }
    return NULL;
}

/* mkdir of each folder on the way to `path`'s last '/', inside `dir` (which exists). */
static df_status make_parents(const char *full, size_t from)
{
    char buf[4096];
    if (strlen(full) >= sizeof buf)
        return df_errorf(DF_E_ARG, "%s: path longer than %zu bytes", full, sizeof buf);
    strcpy(buf, full);
    for (size_t i = from; buf[i]; i++) {
        if (buf[i] != '/')
            continue;
        buf[i] = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return df_errorf(DF_E_IO, "%s: cannot create the folder: %s", buf, strerror(errno));
        buf[i] = '/';
    }
    return DF_OK;
}

df_status df_shipped_write(const df_shipped_config *c, const char *dir)
{
    if (!c || !dir)
        return df_errorf(DF_E_ARG, "df_shipped_write: NULL argument");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return df_errorf(DF_E_IO, "%s: cannot create the folder: %s", dir, strerror(errno));
    const char *rel;
    for (int i = 0; (rel = df_shipped_file_at(c, i)); i++) {
        char full[4096];
        int len = snprintf(full, sizeof full, "%s/%s", dir, rel);
        if (len < 0 || (size_t)len >= sizeof full)
            return df_errorf(DF_E_ARG, "%s/%s: path longer than %zu bytes", dir, rel, sizeof full);
        DF_TRY(make_parents(full, strlen(dir) + 1));
        size_t size = 0;
        const char *text = df_shipped_file(c, rel, &size);
        FILE *f = fopen(full, "wb");
        if (!f)
            return df_errorf(DF_E_IO, "%s: cannot write: %s", full, strerror(errno));
        bool ok = fwrite(text, 1, size, f) == size;
        ok = fclose(f) == 0 && ok;
        if (!ok)
            return df_errorf(DF_E_IO, "%s: cannot write: %s", full, strerror(errno));
    }
    return DF_OK;
}

df_status df_shipped_write_temp(const df_shipped_config *c, char *out, size_t cap)
{
    const char *tmp = getenv("TMPDIR");
    int len = snprintf(out, cap, "%s/diffuse-config-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (len < 0 || (size_t)len >= cap)
        return df_errorf(DF_E_ARG, "TMPDIR: path longer than %zu bytes", cap);
    if (!mkdtemp(out)) {
        df_status s = df_errorf(DF_E_IO,
                                "%s: cannot create a temporary folder for the shipped "
                                "%s configs: %s",
                                out, c->name, strerror(errno));
        out[0] = '\0';
        return s;
    }
    df_status s = df_shipped_write(c, out);
    if (s != DF_OK) {
        df_shipped_remove(c, out);
        out[0] = '\0';
    }
    return s;
}

void df_shipped_remove(const df_shipped_config *c, const char *dir)
{
    if (!c || !dir || !*dir)
        return;
    const char *rel;
    for (int i = 0; (rel = df_shipped_file_at(c, i)); i++) {
        char full[4096];
        int len = snprintf(full, sizeof full, "%s/%s", dir, rel);
        if (len < 0 || (size_t)len >= sizeof full)
            continue;
        unlink(full);
        /* the file's folders, deepest first; rmdir leaves any that are not empty */
        for (char *slash; (slash = strrchr(full, '/')) && slash > full + strlen(dir);) {
            *slash = '\0';
            rmdir(full);
        }
    }
    rmdir(dir);
}

const char *df_shipped_config_name(int i)
{
    const df_shipped_config *c = df_shipped_at(i);
    return c ? c->name : NULL;
}

df_status df_shipped_config_write(const char *name, const char *dir)
{
    if (!name || !dir)
        return df_errorf(DF_E_ARG, "df_shipped_config_write: NULL argument");
    const df_shipped_config *c = df_shipped_find(name);
    if (!c) {
        char list[512] = "";
        for (int i = 0; i < df_shipped_count(); i++) {
            size_t n = strlen(list);
            snprintf(list + n, sizeof list - n, "%s%s", i ? ", " : "", sets[i].name);
        }
        return df_errorf(DF_E_ARG, "no shipped config set is called '%.96s' (diffuse ships: %s)",
                         name, list);
    }
    return df_shipped_write(c, dir);
}
