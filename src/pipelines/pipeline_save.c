/*
 * Writing a loaded pipeline as a diffusers folder (df_pipeline_save; `diffuse convert`).
 *
 * The weights are what the models bound, under diffusers' names: a single file's original
 * names have been mapped, its fused tensors split and its swapped halves put back in
 * diffusers' order by loading, so writing the bound tensors is the conversion diffusers'
 * from_single_file does. Each tensor is written in the dtype it has in memory (a mapped
 * f32 / bf16 / f16 weight as stored, fp8 and GGUF weights upcast to the compute dtype),
 * so the folder loads to the same weights bit for bit. The VAE's encoder half, which a
 * text-to-image load does not bind, is loaded from the same source and written with it.
 *
 * Everything else of the config folder (model_index.json, configs, scheduler, tokenizers,
 * and the weights of components the pipeline did not load) is copied as it is; with shipped
 * configs, the tokenizers come from the folder they were read from. A
 * component's file is built in memory before it is written (its size in RAM).
 *
 * An SD3 load without T5 (no_text_encoder_3) writes a folder without it: no
 * text_encoder_3/ or tokenizer_3/, and model_index.json naming both [null, null], as
 * diffusers' save_pretrained writes a component passed as None.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/json.h>
#include <diffuse/safetensors_writer.h>
#include <diffuse/vae.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "models/loader.h"
#include "models/weight_sets.h"
#include "pipelines/pipeline.h"

static bool is_weights(const char *name)
{
    return df_str_ends_with(name, ".safetensors") || df_str_ends_with(name, ".index.json") ||
           df_str_ends_with(name, ".bin") || df_str_ends_with(name, ".gguf");
}

/* Copies the plain files of `from` into `to` (created); weight files too unless `skip`. */
static df_status copy_folder(const char *from, const char *to, bool skip_weights)
{
    DF_TRY(df_dir_make(to));
    DIR *d = opendir(from);
    if (!d)
        return df_errorf(DF_E_IO, "%s: cannot list: %s", from, strerror(errno));
    df_status s = DF_OK;
    struct dirent *e;
    char a[4096], b[4096];
    while (s == DF_OK && (e = readdir(d))) {
        if (snprintf(a, sizeof a, "%s/%s", from, e->d_name) >= (int)sizeof a ||
            snprintf(b, sizeof b, "%s/%s", to, e->d_name) >= (int)sizeof b) {
            s = df_errorf(DF_E_IO, "%s/%s: path too long", from, e->d_name);
            break;
        }
        if (e->d_name[0] == '.' || !df_path_is_file(a) || (skip_weights && is_weights(e->d_name)))
            continue;
        s = df_file_copy(a, b);
    }
    closedir(d);
    return s;
}

/* Whether `other` (NULL: none) bound a tensor named `name`. */
static bool bound_by(df_weight_set *other, const char *name)
{
    for (int i = 0; other && i < df_ws_bound_count(other); i++) {
        const char *n;
        df_ws_bound(other, i, &n);
        if (strcmp(n, name) == 0)
            return true;
    }
    return false;
}

/* Adds every tensor `ws` bound to the writer, in its own dtype, but those `skip` bound
 * (FLUX.2's batch-norm statistics, which both halves of its VAE read). */
static df_status add_bound(df_ctx *ctx, df_weight_set *ws, df_weight_set *skip, df_st_writer *w)
{
    for (int i = 0; i < df_ws_bound_count(ws); i++) {
        const char *name;
        df_tensor *t = df_ws_bound(ws, i, &name);
        if (bound_by(skip, name))
            continue;
        df_dtype dt = df_tensor_dtype(t);
        size_t bytes = (size_t)df_tensor_numel(t) * df_dtype_size(dt);
        void *buf = df_malloc(bytes ? bytes : 1);
        if (!buf)
            return df_errorf(DF_E_OOM, "out of memory writing tensor '%s'", name);
        df_status s = df_tensor_read(ctx, t, dt, buf, bytes);
        if (s == DF_OK)
            s = df_st_writer_add(w, name, dt, df_tensor_shape(t), df_tensor_ndim(t), buf);
        df_free(buf);
        DF_TRY(s);
    }
    return DF_OK;
}

/* One component's weights into `path`; the VAE's encoder half with it. */
static df_status write_component(df_pipeline *p, const char *name, df_weight_set *ws,
                                 const char *path)
{
    df_st_writer *w;
    DF_TRY(df_st_writer_create(&w));
    df_status s = add_bound(p->ctx, ws, NULL, w);
    df_vae_encoder *enc = NULL;
    if (s == DF_OK && strcmp(name, "vae") == 0) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/vae", p->dir);
        /* A VAE file without its encoder converts to a folder without one. */
        if (df_vae_encoder_load_file(p->ctx, dir, p->opts.vae_file, &enc) == DF_OK)
            s = add_bound(p->ctx, df_vae_encoder_weight_set(enc), ws, w);
    }
    if (s == DF_OK)
        s = df_st_writer_finish(w, path);
    df_vae_encoder_free(enc);
    df_st_writer_free(w);
    return s;
}

/* Whether the load left `name` (a component folder) out of the pipeline. */
static bool left_out(const df_pipeline *p, const char *name)
{
    return p->opts.no_text_encoder_3 &&
           (strcmp(name, "text_encoder_3") == 0 || strcmp(name, "tokenizer_3") == 0);
}

static void write_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(f, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(f, "\\u%04x", *c);
        else
            fputc(*c, f);
    }
    fputc('"', f);
}

/* One JSON value, indented as diffusers' save_pretrained indents (2 spaces, one array
 * element or member a line). Numbers keep their integer digits when integral. */
static void write_value(FILE *f, const df_json *j, int depth)
{
    int64_t n = df_json_type_of(j) == DF_JSON_ARRAY ? df_json_array_size(j)
                                                     : df_json_object_size(j);
    int64_t iv;
    switch (df_json_type_of(j)) {
    case DF_JSON_NULL:
        fputs("null", f);
        return;
    case DF_JSON_BOOL:
        fputs(df_json_bool(j) ? "true" : "false", f);
        return;
    case DF_JSON_NUMBER:
        if (df_json_to_int(j, &iv) == DF_OK)
            fprintf(f, "%" PRId64, iv);
        else
            fprintf(f, "%.17g", df_json_number(j));
        return;
    case DF_JSON_STRING:
        write_string(f, df_json_string(j));
        return;
    case DF_JSON_ARRAY:
    case DF_JSON_OBJECT:
        break;
    }
    bool obj = df_json_type_of(j) == DF_JSON_OBJECT;
    fputc(obj ? '{' : '[', f);
    for (int64_t i = 0; i < n; i++) {
        const char *key = NULL;
        const df_json *v = obj ? df_json_object_at(j, i, &key) : df_json_array_get(j, i);
        fprintf(f, "%s\n%*s", i ? "," : "", 2 * (depth + 1), "");
        if (obj) {
            write_string(f, key);
            fputs(": ", f);
        }
        write_value(f, v, depth + 1);
    }
    if (n)
        fprintf(f, "\n%*s", 2 * depth, "");
    fputc(obj ? '}' : ']', f);
}

/* `from`'s model_index.json written to `to` with the left-out components [null, null]
 * (added where `from` does not name them). */
static df_status write_index(const df_pipeline *p, const char *from, const char *to)
{
    static const char *const dropped[] = {"text_encoder_3", "tokenizer_3"};
    df_json *idx;
    DF_TRY(df_json_parse_file(from, &idx));
    FILE *f = fopen(to, "w");
    if (!f) {
        df_json_free(idx);
        return df_errorf(DF_E_IO, "%s: cannot write: %s", to, strerror(errno));
    }
    fputc('{', f);
    int64_t n = df_json_object_size(idx);
    for (int64_t i = 0; i < n; i++) {
        const char *key;
        const df_json *v = df_json_object_at(idx, i, &key);
        fprintf(f, "%s\n  ", i ? "," : "");
        write_string(f, key);
        fputs(": ", f);
        if (left_out(p, key))
            fputs("[\n    null,\n    null\n  ]", f);
        else
            write_value(f, v, 1);
    }
    for (int i = 0; i < 2; i++)
        if (left_out(p, dropped[i]) && !df_json_get(idx, dropped[i]))
            fprintf(f, "%s\n  \"%s\": [\n    null,\n    null\n  ]", n++ ? "," : "",
                    dropped[i]);
    fputs("\n}\n", f);
    df_json_free(idx);
    if (ferror(f) | fclose(f))
        return df_errorf(DF_E_IO, "%s: write failed", to);
    return DF_OK;
}

/* `path` and the folders above it that do not exist yet. */
static df_status make_dirs(const char *path)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return df_errorf(DF_E_IO, "%s: path too long", path);
    for (char *c = buf + 1; *c; c++)
        if (*c == '/') {
            *c = '\0';
            DF_TRY(df_dir_make(buf));
            *c = '/';
        }
    return df_dir_make(buf);
}

df_status df_pipeline_save(df_pipeline *p, const char *out_dir)
{
    if (!p || !out_dir)
        return df_errorf(DF_E_ARG, "df_pipeline_save: NULL %s", p ? "out_dir" : "pipeline");
    /* The inpainting and Kontext classes' folders are not written yet. */
    bool saves = p->cls->role == DF_PIPELINE_TEXT2IMG || p->cls->role == DF_PIPELINE_IMG2IMG;
    if (!saves || !p->cls->ops->weight_sets)
        return df_errorf(DF_E_UNSUPPORTED, "%s: writing a %s folder is not implemented", p->dir,
                         p->cls->name);
    const char *names[8];
    df_weight_set *sets[8];
    int n = p->cls->ops->weight_sets(p, names, sets, 8);
    DF_TRY(make_dirs(out_dir));
    DIR *d = opendir(p->dir);
    if (!d)
        return df_errorf(DF_E_IO, "%s: cannot list: %s", p->dir, strerror(errno));
    df_status s = DF_OK;
    struct dirent *e;
    char from[4096], to[4096];
    while (s == DF_OK && (e = readdir(d))) {
        if (e->d_name[0] == '.' || left_out(p, e->d_name))
            continue;
        snprintf(from, sizeof from, "%s/%s", p->dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", out_dir, e->d_name);
        int k = -1;
        for (int i = 0; i < n; i++)
            if (strcmp(names[i], e->d_name) == 0)
                k = i;
        if (p->opts.no_text_encoder_3 && strcmp(e->d_name, "model_index.json") == 0)
            s = write_index(p, from, to);
        else if (df_path_is_file(from) && !is_weights(e->d_name))
            s = df_file_copy(from, to);
        else if (df_path_is_dir(from))
            s = copy_folder(from, to, k >= 0);
        if (s == DF_OK && k >= 0) {
            bool transformers = strncmp(names[k], "text_encoder", 12) == 0;
            snprintf(to, sizeof to, "%s/%s/%s", out_dir, names[k],
                     transformers ? "model.safetensors" : "diffusion_pytorch_model.safetensors");
            s = write_component(p, names[k], sets[k], to);
        }
    }
    closedir(d);
    /* Shipped configs (-m FILE with only tokenizers in --config DIR): the tokenizers are
     * copied from where they were read. */
    d = s == DF_OK && p->tokenizer_dir[0] ? opendir(p->tokenizer_dir) : NULL;
    while (d && s == DF_OK && (e = readdir(d))) {
        snprintf(from, sizeof from, "%s/%s", p->tokenizer_dir, e->d_name);
        snprintf(to, sizeof to, "%s/%s", out_dir, e->d_name);
        if (strncmp(e->d_name, "tokenizer", 9) == 0 && !left_out(p, e->d_name) &&
            df_path_is_dir(from))
            s = copy_folder(from, to, false);
    }
    if (d)
        closedir(d);
    return s;
}
