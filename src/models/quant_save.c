/*
 * df_quantize_model (quantize.h): a model folder written with 8-bit linear weights.
 *
 * The folder keeps diffusers' layout and names. In each component with weights that
 * df_int8_quantizes names (the transformer, T5), every such "<name>" [n, k] is stored as I8
 * with "<name>_scale" F32 [n, groups] beside it, in the layout asked for: "tiles32" (the
 * default: the int8 kernels' tiles, core/int8_tiles.h, for every weight whose n and k fit
 * whole tiles; the others row-major), "tiles16" / "tiles64" (tiles another kernel would
 * read; the loader repacks them) or "rows" (row-major, as folders before the tiles). All
 * other tensors keep their dtype and bytes; the weights go to safetensors shards named as
 * the input's (BASE.safetensors, or past the shard size BASE-0000N-of-0000M.safetensors with
 * the index) and config.json gains
 *     "quantization_config": {"quant_method": "diffuse-int8", "bits": 8, "group_size": G,
 *                             "symmetric": true, ..., "layout": "tiles32",
 *                             "layout_version": 1}
 * (G = 0: the whole k). Every other file and folder is copied as it is. The loader maps the
 * I8 tensors; the kernels run tiles of their own width where they are mapped.
 *
 * Writing streams: every output tensor is declared first (df_st_shards lays out each shard's
 * header), then each input tensor is read from the mapping, quantized, written to its place
 * and its pages released, so memory holds about one tensor and its 8-bit copy, not the
 * component.
 */
#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/layout.h>
#include <diffuse/quantize.h>
#include <diffuse/safetensors_writer.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/int8_tiles.h"
#include "core/status.h"
#include "io/path.h"

/* Copies folder `from` into `to`, skipping the weights files when skip_weights. */
static df_status copy_tree(const char *from, const char *to, bool skip_weights,
                           const char *skip_name)
{
    DF_TRY(df_dir_make(to));
    DIR *d = opendir(from);
    if (!d)
        return df_errorf(DF_E_IO, "%s: cannot read the folder: %s", from, strerror(errno));
    df_status s = DF_OK;
    struct dirent *e;
    while (s == DF_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (skip_weights && (df_str_ends_with(e->d_name, ".safetensors") ||
                             df_str_ends_with(e->d_name, ".safetensors.index.json")))
            continue;
        if (skip_name && strcmp(e->d_name, skip_name) == 0)
            continue;
        char a[4096], b[4096];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        s = df_path_is_dir(a) ? copy_tree(a, b, false, NULL) : df_file_copy(a, b);
    }
    closedir(d);
    return s;
}

/* config.json with "quantization_config" added before its closing brace. */
static df_status write_config(const char *from, const char *to, int64_t group, const char *layout)
{
    FILE *f = fopen(from, "rb");
    if (!f)
        return df_errorf(DF_E_IO, "%s: cannot open: %s", from, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int c;
    while ((c = fgetc(f)) != EOF) {
        if (len + 1 >= cap) {
            char *t = df_realloc(text, cap = cap ? 2 * cap : 4096);
            if (!t) {
                df_free(text);
                fclose(f);
                return df_errorf(DF_E_OOM, "%s: out of memory", from);
            }
            text = t;
        }
        text[len++] = (char)c;
    }
    fclose(f);
    while (len > 0 && text[len - 1] != '}')
        len--;
    if (len == 0) {
        df_free(text);
        return df_errorf(DF_E_FORMAT, "%s: not a JSON object", from);
    }
    size_t body = len - 1;
    while (body > 0 && (text[body - 1] == ' ' || text[body - 1] == '\n' || text[body - 1] == '\r'))
        body--;
    FILE *out = fopen(to, "wb");
    if (!out) {
        df_free(text);
        return df_errorf(DF_E_IO, "%s: cannot create: %s", to, strerror(errno));
    }
    bool empty = body > 0 && text[body - 1] == '{';
    fwrite(text, 1, body, out);
    fprintf(out,
            "%s\n  \"quantization_config\": {\"quant_method\": \"diffuse-int8\", \"bits\": 8, "
            "\"group_size\": %lld, \"symmetric\": true, \"weights\": \"int8 per output "
            "channel and group of k\", \"activations\": \"int8, per token and group\", "
            "\"layout\": \"%s\", \"layout_version\": %d}\n}\n",
            empty ? "" : ",", (long long)group, layout, DF_I8_TILES_VERSION);
    df_free(text);
    return fclose(out) == 0 ? DF_OK : df_errorf(DF_E_IO, "%s: write failed", to);
}

static bool saved_int8(const char *component, const df_tensor_info *info)
{
    return df_int8_quantizes(component, info->name, info->ndim) &&
           (info->dtype == DF_DTYPE_F32 || info->dtype == DF_DTYPE_BF16 ||
            info->dtype == DF_DTYPE_F16);
}

/* q [n, k] and scale [n, groups] in place, row-major to tiles of nr (core/int8_tiles.h). */
static df_status to_tiles(int8_t *q, float *scale, int64_t n, int64_t k, int64_t groups, int nr)
{
    int8_t *tq = df_malloc((size_t)(n * k));
    float *ts = df_malloc((size_t)(n * groups) * sizeof(float));
    if (!tq || !ts) {
        df_free(tq);
        df_free(ts);
        return df_errorf(DF_E_OOM, "int8: out of memory placing a [%lld, %lld] weight in tiles",
                         (long long)n, (long long)k);
    }
    for (int64_t j = 0; j < n; j++) {
        for (int64_t kk = 0; kk < k; kk++)
            tq[df_i8_tiles_q_at(k, nr, j, kk)] = q[j * k + kk];
        for (int64_t g = 0; g < groups; g++)
            ts[df_i8_tiles_scale_at(groups, nr, j, g)] = scale[j * groups + g];
    }
    memcpy(q, tq, (size_t)(n * k));
    memcpy(scale, ts, (size_t)(n * groups) * sizeof(float));
    df_free(tq);
    df_free(ts);
    return DF_OK;
}

/* Tensor `info` into the shards (its first id there): as it is, or as I8 + scales, in tiles
 * of nr where they fit (nr 0: row-major). */
static df_status write_tensor(df_st_shards *out, const char *component, const df_tensor_info *info,
                              int64_t id, int64_t group, int nr)
{
    if (!saved_int8(component, info))
        return df_st_shards_write(out, id, info->data);
    int64_t n = info->shape[0], k = info->shape[1], groups = df_int8_weight_groups(k, group);
    int8_t *qv = df_malloc((size_t)(n * k) + 1);
    float *sc = df_malloc((size_t)(n * groups) * sizeof(float));
    df_status s = DF_OK;
    if (!qv || !sc)
        s = df_errorf(DF_E_OOM, "%s: out of memory quantizing '%s'", component, info->name);
    if (s == DF_OK)
        s = df_int8_quantize(info->data, info->dtype, n, k, group, qv, sc);
    if (s == DF_OK && df_i8_tiles_fit(n, k, nr))
        s = to_tiles(qv, sc, n, k, groups, nr);
    if (s == DF_OK)
        s = df_st_shards_write(out, id, qv);
    if (s == DF_OK)
        s = df_st_shards_write(out, id + 1, sc);
    df_free(qv);
    df_free(sc);
    return s;
}

/* One component: its weights, the quantized ones as I8 + scales, streamed into shards of
 * `to` named BASE*.safetensors. Every output tensor is declared first, so that each shard is
 * laid out before any bytes come and each tensor goes straight to its file; the input's
 * pages of a tensor are released once it is written. */
static df_status quantize_weights(const char *component, const df_weights *w, int64_t group, int nr,
                                  const char *to, const char *base, int64_t shard_bytes)
{
    df_st_shards *out;
    DF_TRY(df_st_shards_create(to, base, shard_bytes, &out));
    df_status s = DF_OK;
    int64_t count = df_weights_count(w);
    for (int64_t i = 0; s == DF_OK && i < count; i++) {
        df_tensor_info info;
        s = df_weights_at(w, i, &info);
        if (s != DF_OK)
            break;
        if (!saved_int8(component, &info)) {
            s = df_st_shards_declare(out, info.name, info.dtype, info.shape, info.ndim, NULL);
            continue;
        }
        int64_t n = info.shape[0], groups = df_int8_weight_groups(info.shape[1], group);
        char name[1024];
        snprintf(name, sizeof name, "%s_scale", info.name);
        s = df_st_shards_declare(out, info.name, DF_DTYPE_I8, info.shape, 2, NULL);
        if (s == DF_OK)
            s = df_st_shards_declare(out, name, DF_DTYPE_F32, (int64_t[]){n, groups}, 2, NULL);
    }
    if (s == DF_OK)
        s = df_st_shards_end_declarations(out);
    for (int64_t i = 0, id = 0; s == DF_OK && i < count; i++) {
        df_tensor_info info;
        s = df_weights_at(w, i, &info);
        if (s == DF_OK)
            s = write_tensor(out, component, &info, id, group, nr);
        if (s == DF_OK)
            s = df_weights_release_pages(w, info.name);
        id += saved_int8(component, &info) ? 2 : 1;
    }
    if (s == DF_OK)
        s = df_st_shards_finish(out);
    df_st_shards_free(out);
    return s;
}

static df_status quantize_component(const char *from, const char *to, const char *component,
                                    int64_t group, const char *layout, int64_t shard_bytes)
{
    char path[4096];
    df_weights *w;
    DF_TRY(df_layout_find_weights(from, path, sizeof path));
    DF_TRY(df_weights_open(path, &w));
    int64_t quantized = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        if (df_weights_at(w, i, &info) == DF_OK &&
            df_int8_quantizes(component, info.name, info.ndim))
            quantized++;
    }
    df_status s;
    if (quantized == 0) {
        s = copy_tree(from, to, false, NULL);
    } else {
        /* the input's file name: BASE.safetensors or BASE.safetensors.index.json */
        const char *file = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
        const char *ext = strstr(file, ".safetensors");
        char base[256];
        snprintf(base, sizeof base, "%.*s", (int)(ext ? ext - file : (ptrdiff_t)strlen(file)),
                 file);
        char cfg_in[4200], cfg_out[4200];
        snprintf(cfg_in, sizeof cfg_in, "%s/config.json", from);
        snprintf(cfg_out, sizeof cfg_out, "%s/config.json", to);
        s = copy_tree(from, to, true, "config.json");
        if (s == DF_OK)
            s = write_config(cfg_in, cfg_out, group, layout);
        if (s == DF_OK)
            s = quantize_weights(component, w, group, df_i8_layout_nr(layout), to, base,
                                 shard_bytes);
    }
    df_weights_free(w);
    return df_error_context(s, "quantizing %s", from);
}

df_status df_quantize_model(const char *in, const char *out, int64_t group)
{
    return df_quantize_model_sharded(in, out, group, 0);
}

df_status df_quantize_model_sharded(const char *in, const char *out, int64_t group,
                                    int64_t shard_bytes)
{
    return df_quantize_model_layout(in, out, group, shard_bytes, NULL);
}

df_status df_quantize_model_layout(const char *in, const char *out, int64_t group,
                                   int64_t shard_bytes, const char *layout)
{
    if (!layout)
        layout = "tiles32";
    if (df_i8_layout_nr(layout) < 0)
        return df_errorf(DF_E_ARG, "int8 layout '%s': expected rows, tiles16, tiles32 or tiles64",
                         layout);
    if (group < 0 || (group > 0 && (group < 32 || group > 256 || group % 4 != 0)))
        return df_errorf(DF_E_ARG,
                         "int8 group %lld: must be 32 to 256 (a multiple of 4), or 0 "
                         "for the whole k",
                         (long long)group);
    if (!df_path_is_dir(in))
        return df_errorf(DF_E_IO, "%s: not a model folder", in);
    DF_TRY(df_dir_make(out));
    DIR *d = opendir(in);
    if (!d)
        return df_errorf(DF_E_IO, "%s: cannot read the folder: %s", in, strerror(errno));
    df_status s = DF_OK;
    struct dirent *e;
    while (s == DF_OK && (e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        char a[4096], b[4096], cfg[4200], wpath[4096];
        snprintf(a, sizeof a, "%s/%s", in, e->d_name);
        snprintf(b, sizeof b, "%s/%s", out, e->d_name);
        snprintf(cfg, sizeof cfg, "%s/config.json", a);
        struct stat st;
        if (!df_path_is_dir(a))
            s = df_file_copy(a, b);
        else if (stat(cfg, &st) == 0 && df_layout_find_weights(a, wpath, sizeof wpath) == DF_OK)
            s = quantize_component(a, b, e->d_name, group, layout, shard_bytes);
        else
            s = copy_tree(a, b, false, NULL);
    }
    closedir(d);
    return s;
}
