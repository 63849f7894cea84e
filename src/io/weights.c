/*
 * df_weights: one safetensors file or a sharded checkpoint behind an index.
 *
 * The index ("weight_map": tensor -> shard file) is checked both ways against the shards:
 * every mapped tensor must be in its shard, and every tensor of a shard must be mapped to
 * that shard, so the two can never disagree about which bytes a name means. Shard names
 * must stay inside the index's folder; each distinct shard is opened once. Lookups go
 * through one table sorted by name that points at the shards' own entries, so tensor names
 * are not copied and the index document is freed after opening.
 */
#include "io/weights.h"

#include <stdlib.h>
#include <string.h>

#include <diffuse/layout.h>

#include "core/alloc.h"
#include "core/status.h"
#include "io/path.h"
#include "io/safetensors.h"

typedef struct w_entry {
    const char *name; /* the shard's own copy */
    int shard;
} w_entry;

struct df_weights {
    char *path;
    int n_shards;
    df_safetensors **shards;
    int64_t count;
    w_entry *entries; /* sorted by name */
};

static int entry_by_tensor(const void *a, const void *b)
{
    return strcmp(((const df_index_entry *)a)->tensor, ((const df_index_entry *)b)->tensor);
}

static int str_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

df_status df_weights_index_parse(const df_json *root, df_index_entry **out, int64_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    const char *src = df_json_source(root);
    if (df_json_type_of(root) != DF_JSON_OBJECT)
        return df_errorf(DF_E_FORMAT, "%s: a safetensors index must be a JSON object, found %s",
                         src, df_json_type_name(df_json_type_of(root)));
    const df_json *meta = df_json_get(root, "metadata");
    if (!df_json_is_null(meta)) { /* not needed, but a wrong type means a broken writer */
        DF_TRY(df_json_get_object(root, "metadata", &meta));
        const df_json *total = df_json_get(meta, "total_size");
        uint64_t bytes;
        if (!df_json_is_null(total))
            DF_TRY(df_json_to_uint64(total, &bytes));
    }
    const df_json *map;
    DF_TRY(df_json_get_object(root, "weight_map", &map));
    int64_t n = df_json_object_size(map);
    if (n == 0)
        return df_errorf(DF_E_FORMAT, "%s: weight_map is empty", src);
    df_index_entry *e = df_malloc(sizeof *e * (size_t)n);
    if (!e)
        return df_errorf(DF_E_OOM, "%s: out of memory for %lld index entries", src,
                         (long long)n);
    for (int64_t i = 0; i < n; i++) {
        const char *tensor;
        const df_json *v = df_json_object_at(map, i, &tensor);
        df_status s = df_json_to_string(v, &e[i].shard);
        if (s == DF_OK)
            s = df_path_check_inside(e[i].shard, false, src, "shard");
        if (s != DF_OK) {
            df_free(e);
            return s;
        }
        e[i].tensor = tensor;
    }
    qsort(e, (size_t)n, sizeof *e, entry_by_tensor);
    *out = e;
    *out_n = n;
    return DF_OK;
}

static int w_by_name(const void *a, const void *b)
{
    return strcmp(((const w_entry *)a)->name, ((const w_entry *)b)->name);
}

static const w_entry *lookup(const df_weights *w, const char *name)
{
    if (!w || !name)
        return NULL;
    w_entry probe = {.name = name};
    return bsearch(&probe, w->entries, (size_t)w->count, sizeof *w->entries, w_by_name);
}

static df_status open_single(df_weights *w)
{
    w->shards = df_calloc(1, sizeof *w->shards);
    if (!w->shards)
        return df_errorf(DF_E_OOM, "%s: out of memory", w->path);
    DF_TRY(df_safetensors_open(w->path, &w->shards[0]));
    w->n_shards = 1;
    const df_safetensors *st = w->shards[0];
    w->count = st->count;
    w->entries = df_calloc((size_t)(st->count ? st->count : 1), sizeof *w->entries);
    if (!w->entries)
        return df_errorf(DF_E_OOM, "%s: out of memory", w->path);
    for (int64_t i = 0; i < st->count; i++)
        w->entries[i] = (w_entry){st->entries[i].name, 0};
    return DF_OK;
}

/* Opens each distinct shard named in the sorted index entries. */
static df_status open_shards(df_weights *w, const df_index_entry *idx, int64_t n,
                             const char ***out_names)
{
    const char **names = df_malloc(sizeof *names * (size_t)n);
    if (!names)
        return df_errorf(DF_E_OOM, "%s: out of memory", w->path);
    *out_names = names;
    for (int64_t i = 0; i < n; i++)
        names[i] = idx[i].shard;
    qsort(names, (size_t)n, sizeof *names, str_cmp);
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (k == 0 || strcmp(names[k - 1], names[i]) != 0)
            names[k++] = names[i];
    w->shards = df_calloc((size_t)k, sizeof *w->shards);
    if (!w->shards)
        return df_errorf(DF_E_OOM, "%s: out of memory", w->path);
    char *dir;
    DF_TRY(df_path_dirname(w->path, &dir));
    df_status s = DF_OK;
    for (int64_t i = 0; i < k && s == DF_OK; i++) {
        char *p;
        s = df_path_join(dir, names[i], &p);
        if (s == DF_OK) {
            s = df_safetensors_open(p, &w->shards[i]);
            if (s != DF_OK)
                s = df_error_context(s, "%s: shard '%s'", w->path, names[i]);
            df_free(p);
        }
        if (s == DF_OK)
            w->n_shards++;
    }
    df_free(dir);
    return s;
}

/* Checks the index against the shards both ways and builds the lookup table. */
static df_status cross_check(df_weights *w, const df_index_entry *idx, int64_t n,
                             const char **names)
{
    w->entries = df_calloc((size_t)n, sizeof *w->entries);
    if (!w->entries)
        return df_errorf(DF_E_OOM, "%s: out of memory", w->path);
    for (int64_t i = 0; i < n; i++) {
        const char **hit = bsearch(&idx[i].shard, names, (size_t)w->n_shards, sizeof *names,
                                   str_cmp);
        int shard = (int)(hit - names);
        const st_entry *e = df_st_lookup(w->shards[shard], idx[i].tensor);
        if (!e)
            return df_errorf(DF_E_FORMAT, "%s: weight_map places tensor '%s' in shard '%s', "
                             "which has no such tensor", w->path, idx[i].tensor,
                             idx[i].shard);
        w->entries[i] = (w_entry){e->name, shard};
    }
    w->count = n;
    for (int s = 0; s < w->n_shards; s++) {
        const df_safetensors *st = w->shards[s];
        for (int64_t i = 0; i < st->count; i++) {
            const w_entry *e = lookup(w, st->entries[i].name);
            if (!e)
                return df_errorf(DF_E_FORMAT, "%s: tensor '%s' of shard '%s' is not in the "
                                 "weight_map", w->path, st->entries[i].name, names[s]);
            if (e->shard != s)
                return df_errorf(DF_E_FORMAT, "%s: tensor '%s' is in shard '%s' but the "
                                 "weight_map places it in '%s'", w->path, e->name, names[s],
                                 names[e->shard]);
        }
    }
    return DF_OK;
}

static df_status open_index(df_weights *w)
{
    df_json *root;
    DF_TRY(df_json_parse_file(w->path, &root));
    df_index_entry *idx = NULL;
    const char **names = NULL;
    int64_t n = 0;
    df_status s = df_weights_index_parse(root, &idx, &n);
    if (s == DF_OK)
        s = open_shards(w, idx, n, &names);
    if (s == DF_OK)
        s = cross_check(w, idx, n, names);
    df_free(names);
    df_free(idx);
    df_json_free(root);
    return s;
}

df_status df_weights_open(const char *path, df_weights **out)
{
    if (!out || !path)
        return df_errorf(DF_E_ARG, "df_weights_open: NULL argument");
    *out = NULL;
    char found[DF_PATH_MAX];
    if (df_path_is_dir(path)) {
        DF_TRY(df_layout_find_weights(path, found, sizeof found));
        path = found;
    }
    df_weights *w = df_calloc(1, sizeof *w);
    if (w)
        w->path = df_strdup(path);
    if (!w || !w->path) {
        df_free(w);
        return df_errorf(DF_E_OOM, "out of memory opening %s", path);
    }
    df_status s = df_str_ends_with(path, ".json") ? open_index(w) : open_single(w);
    if (s != DF_OK) {
        df_weights_free(w);
        return s;
    }
    *out = w;
    return DF_OK;
}

void df_weights_free(df_weights *w)
{
    if (!w)
        return;
    for (int i = 0; w->shards && i < w->n_shards; i++)
        df_safetensors_free(w->shards[i]);
    df_free(w->shards);
    df_free(w->entries);
    df_free(w->path);
    df_free(w);
}

const char *df_weights_path(const df_weights *w)
{
    return w ? w->path : "";
}

int df_weights_shard_count(const df_weights *w)
{
    return w ? w->n_shards : 0;
}

const df_safetensors *df_weights_shard(const df_weights *w, int i)
{
    return w && i >= 0 && i < w->n_shards ? w->shards[i] : NULL;
}

int64_t df_weights_count(const df_weights *w)
{
    return w ? w->count : 0;
}

df_status df_weights_at(const df_weights *w, int64_t i, df_tensor_info *out)
{
    if (!w || i < 0 || i >= w->count)
        return df_errorf(DF_E_ARG, "%s: tensor index %lld out of range", df_weights_path(w),
                         (long long)i);
    const w_entry *e = &w->entries[i];
    DF_TRY(df_safetensors_find(w->shards[e->shard], e->name, out));
    out->shard = e->shard;
    return DF_OK;
}

df_status df_weights_find(const df_weights *w, const char *name, df_tensor_info *out)
{
    const w_entry *e = lookup(w, name);
    if (!e) {
        memset(out, 0, sizeof *out);
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_weights_path(w),
                         name ? name : "(null)");
    }
    DF_TRY(df_safetensors_find(w->shards[e->shard], e->name, out));
    out->shard = e->shard;
    return DF_OK;
}

bool df_weights_contains(const df_weights *w, const char *name)
{
    return lookup(w, name) != NULL;
}

uint64_t df_weights_total_bytes(const df_weights *w)
{
    uint64_t total = 0;
    for (int i = 0; w && i < w->n_shards; i++)
        total += w->shards[i]->data_size;
    return total;
}

/* The shard holding `name`, or a failure naming the checkpoint. */
static df_status shard_of(const df_weights *w, const char *name, const df_safetensors **out)
{
    *out = NULL;
    const w_entry *e = lookup(w, name);
    if (!e)
        return df_errorf(DF_E_FORMAT, "%s: no tensor '%s'", df_weights_path(w),
                         name ? name : "(null)");
    *out = w->shards[e->shard];
    return DF_OK;
}

df_status df_weights_read(const df_weights *w, const char *name, df_dtype as, void *dst,
                          size_t dst_bytes)
{
    const df_safetensors *st;
    DF_TRY(shard_of(w, name, &st));
    return df_safetensors_read(st, name, as, dst, dst_bytes);
}

df_status df_weights_read_rows(const df_weights *w, const char *name, int64_t r0, int64_t r1,
                               df_dtype as, void *dst, size_t dst_bytes)
{
    const df_safetensors *st;
    DF_TRY(shard_of(w, name, &st));
    return df_safetensors_read_rows(st, name, r0, r1, as, dst, dst_bytes);
}

df_status df_weights_read_cols(const df_weights *w, const char *name, int64_t c0, int64_t c1,
                               df_dtype as, void *dst, size_t dst_bytes)
{
    const df_safetensors *st;
    DF_TRY(shard_of(w, name, &st));
    return df_safetensors_read_cols(st, name, c0, c1, as, dst, dst_bytes);
}

uint64_t df_weights_bytes_read(const df_weights *w)
{
    uint64_t total = 0;
    for (int i = 0; w && i < w->n_shards; i++)
        total += df_safetensors_bytes_read(w->shards[i]);
    return total;
}

df_status df_weights_release_pages(const df_weights *w, const char *name)
{
    if (!w)
        return df_errorf(DF_E_ARG, "df_weights_release_pages: NULL handle");
    if (name) {
        const df_safetensors *st;
        DF_TRY(shard_of(w, name, &st));
        return df_safetensors_release_pages(st, name);
    }
    for (int i = 0; i < w->n_shards; i++)
        DF_TRY(df_safetensors_release_pages(w->shards[i], NULL));
    return DF_OK;
}
