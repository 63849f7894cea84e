/*
 * `diffuse inspect PATH`: lists and validates weights and model folders.
 *
 * PATH may be a .safetensors file, a .gguf file (metadata, tensors with their ggml types,
 * and which types diffuse cannot dequantise), a *.safetensors.index.json, a component folder
 * (config.json + weights) or a pipeline folder (model_index.json). Everything the loader
 * would read is opened and validated: every JSON file of every component folder, every
 * weight file and index entry, and, for a class whose model code registered a check, every
 * weight against the config. Tensors are listed with dtype, shape and bytes, then totals.
 * A single file in a layout the name maps know (a FLUX.1 transformer with Black Forest
 * Labs' names, a ComfyUI prefix, city96's GGUF) gets a "recognised:" line, and so does a
 * LoRA adapter (its layout, target counts and ranks).
 *
 * Broken input prints one line on stderr ("error: " and the library's message, which names
 * the file and what is wrong) and exits 1; a usage error exits 2. A pipeline folder this
 * build cannot load (no model_index.json, a pipeline or component class it does not
 * implement) is broken input too: what was found is listed on stdout first, then the one
 * line "error: pipeline not loadable by this build: ..." says why. Names from files are
 * printed with control characters escaped, so a hostile tensor name can neither break the
 * one-line rule nor drive the terminal. SIGPIPE is ignored (`inspect ... | head` must not
 * kill us); a failed write to stdout is reported as an error instead.
 */
#include <dirent.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static bool ends_with(const char *s, const char *suffix);

typedef struct inspect {
    bool summary;      /* no per-tensor lines */
    bool model_checks; /* load each component of a known class on its own */
    bool lone;         /* PATH is one component folder: a class it cannot load is an error */
    int components;
    int files;
    int64_t tensors;
    uint64_t bytes;
} inspect;

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse inspect [--summary] PATH\n"
               "  PATH  a .safetensors file, a .gguf file, a .safetensors.index.json, a\n"
               "        component folder (config.json + weights) or a pipeline folder\n"
               "        (model_index.json); for a single file, what it was recognised as\n"
               "  -s, --summary  list files and totals, not each tensor\n");
}

/* Prints s with bytes below 0x20 and 0x7f written as \xNN. */
static void put_clean(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
}

static int fail(void)
{
    fputs("error: ", stderr);
    put_clean(stderr, df_error_message());
    fputc('\n', stderr);
    return 1;
}

static int fail_msg(const char *path, const char *what)
{
    fputs("error: ", stderr);
    put_clean(stderr, path);
    fprintf(stderr, ": %s\n", what);
    return 1;
}

static const char *human(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = {"B", "KB", "MB", "GB", "TB"};
    double v = (double)bytes;
    int u = 0;
    while (v >= 1000 && u < 4) {
        v /= 1000;
        u++;
    }
    snprintf(buf, cap, u ? "%.2f %s" : "%.0f %s", v, units[u]);
    return buf;
}

static void print_tensor(const df_tensor_info *t, int width)
{
    char shape[200];
    size_t n = 0;
    shape[0] = '\0';
    for (int d = 0; d < t->ndim && n < sizeof shape - 24; d++)
        n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", d ? ", " : "",
                              (long long)t->shape[d]);
    fputs("    ", stdout);
    put_clean(stdout, t->name);
    int pad = width - (int)strlen(t->name);
    printf("%*s  %-7s [%s]%*s %zu%s\n", pad > 0 ? pad : 0, "", t->dtype_name, shape,
           (int)(n < 18 ? 18 - n : 0), "", t->nbytes,
           t->dtype == DF_DTYPE_COUNT ? "  (dtype not loadable by diffuse)" : "");
}

static int list_weights(inspect *in, const df_weights *w)
{
    char h[32];
    int64_t count = df_weights_count(w);
    uint64_t bytes = df_weights_total_bytes(w);
    int shards = df_weights_shard_count(w);
    printf("  weights ");
    put_clean(stdout, df_weights_path(w));
    printf(": %lld tensors, %s (%llu bytes)", (long long)count, human(bytes, h, sizeof h),
           (unsigned long long)bytes);
    if (shards > 1)
        printf(" in %d shards", shards);
    printf("\n");
    for (int i = 0; shards > 1 && i < shards; i++) {
        const df_safetensors *st = df_weights_shard(w, i);
        printf("    shard ");
        put_clean(stdout, df_safetensors_path(st));
        printf(": %lld tensors\n", (long long)df_safetensors_count(st));
    }
    int width = 0;
    for (int64_t i = 0; i < count && !in->summary; i++) {
        df_tensor_info t;
        if (df_weights_at(w, i, &t) != DF_OK)
            return fail();
        int len = (int)strlen(t.name);
        width = len > width ? (len < 60 ? len : 60) : width;
    }
    for (int64_t i = 0; i < count && !in->summary; i++) {
        df_tensor_info t;
        if (df_weights_at(w, i, &t) != DF_OK)
            return fail();
        print_tensor(&t, width);
    }
    in->files += shards;
    in->tensors += count;
    in->bytes += bytes;
    return 0;
}

/* For a single file: what the FLUX.1 name map recognises in it, when it does (a file it
 * does not recognise is described by the lines after, not by what it is not), and which
 * model and components the file holds. */
static int describe_single_file(const char *path)
{
    char line[512];
    bool found;
    if (ends_with(path, ".safetensors")) { /* a LoRA adapter says so, or why it is broken */
        if (df_lora_describe_file(path, line, sizeof line, &found) != DF_OK)
            return fail();
        if (found) {
            printf("  recognised: ");
            put_clean(stdout, line);
            printf("\n");
            return 0;
        }
    }
    if (df_flux_describe_file(path, line, sizeof line, &found) != DF_OK)
        return fail();
    if (found) {
        printf("  recognised: ");
        put_clean(stdout, line);
        printf("\n");
    }
    /* The whole file: its model, its components and what a pipeline needs besides. */
    char parts[1024];
    if (df_checkpoint_describe(path, parts, sizeof parts) != DF_OK)
        return fail();
    for (char *l = strtok(parts, "\n"); l; l = strtok(NULL, "\n")) {
        printf("  ");
        put_clean(stdout, l);
        printf("\n");
    }
    return 0;
}

static int inspect_weights_file(inspect *in, const char *path)
{
    df_weights *w;
    if (df_weights_open(path, &w) != DF_OK)
        return fail();
    int rc = list_weights(in, w);
    df_weights_free(w);
    if (rc == 0 && ends_with(path, ".safetensors"))
        rc = describe_single_file(path);
    return rc;
}

/* One metadata value, short: scalars and strings as they are, arrays as type and count. */
static void print_kv(const df_gguf *g, int64_t i)
{
    df_gguf_value_type type, elem;
    uint64_t count;
    const char *key = df_gguf_kv_key(g, i, &type, &elem, &count);
    fputs("    ", stdout);
    put_clean(stdout, key);
    fputs(" = ", stdout);
    const char *s;
    int64_t v;
    double d;
    if (type == DF_GGUF_ARRAY) {
        printf("array of %llu (element type %d)\n", (unsigned long long)count, (int)elem);
    } else if (type == DF_GGUF_STRING && df_gguf_get_string(g, key, &s) == DF_OK) {
        putchar('"');
        put_clean(stdout, strlen(s) > 200 ? "(long string)" : s);
        printf("\"\n");
    } else if (type != DF_GGUF_FLOAT32 && type != DF_GGUF_FLOAT64 &&
               df_gguf_get_int(g, key, &v) == DF_OK) {
        printf("%lld\n", (long long)v);
    } else if (df_gguf_get_float(g, key, &d) == DF_OK) {
        printf("%.9g\n", d);
    } else {
        printf("?\n");
    }
}

static int inspect_gguf_file(inspect *in, const char *path)
{
    df_gguf *g;
    if (df_gguf_open(path, &g) != DF_OK)
        return fail();
    char h[32];
    int64_t count = df_gguf_count(g);
    uint64_t bytes = df_gguf_tensor_bytes(g);
    printf("  gguf ");
    put_clean(stdout, path);
    printf(": version %u, alignment %u, %lld metadata keys, %lld tensors, %s (%llu bytes)\n",
           df_gguf_version(g), df_gguf_alignment(g), (long long)df_gguf_kv_count(g),
           (long long)count, human(bytes, h, sizeof h), (unsigned long long)bytes);
    for (int64_t i = 0; i < df_gguf_kv_count(g) && !in->summary; i++)
        print_kv(g, i);
    int64_t by_type[64] = {0}, unreadable = 0;
    const char *type_names[64] = {0};
    for (int64_t i = 0; i < count; i++) {
        df_gguf_tensor t;
        if (df_gguf_at(g, i, &t) != DF_OK) {
            df_gguf_free(g);
            return fail();
        }
        if (t.type < 64) {
            by_type[t.type]++;
            type_names[t.type] = t.type_name;
        }
        unreadable += !t.readable;
        if (in->summary)
            continue;
        char shape[200];
        size_t n = 0;
        shape[0] = '\0';
        for (int d = 0; d < t.ndim && n < sizeof shape - 24; d++)
            n += (size_t)snprintf(shape + n, sizeof shape - n, "%s%lld", d ? ", " : "",
                                  (long long)t.shape[d]);
        fputs("    ", stdout);
        put_clean(stdout, t.name);
        printf("  %-7s [%s] %zu%s\n", t.type_name, shape, t.nbytes,
               t.readable ? "" : "  (type not dequantised by diffuse)");
    }
    printf("  types:");
    for (int t = 0; t < 64; t++)
        if (by_type[t])
            printf(" %s x %lld", type_names[t], (long long)by_type[t]);
    printf("%s\n", unreadable ? "  (some types are not dequantised by diffuse)" : "");
    df_gguf_free(g);
    in->files++;
    in->tensors += count;
    in->bytes += bytes;
    return describe_single_file(path);
}

static int by_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Parses every *.json file of `dir` (validating it); *has_config says if config.json is one. */
static int check_json_files(const char *dir, bool *has_config)
{
    *has_config = false;
    DIR *d = opendir(dir);
    if (!d)
        return fail_msg(dir, "cannot open the folder");
    char *names[256];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 256;) {
        size_t len = strlen(e->d_name);
        if (len > 5 && strcmp(e->d_name + len - 5, ".json") == 0)
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_str);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        df_json *j;
        if (rc == 0 && names[i] && df_layout_open_json(dir, names[i], &j) != DF_OK)
            rc = fail();
        else if (rc == 0 && names[i])
            df_json_free(j);
        if (names[i] && strcmp(names[i], "config.json") == 0)
            *has_config = true;
        free(names[i]);
    }
    return rc;
}

/* The class a config.json names: diffusers' "_class_name" (which must be a string) or
 * transformers' "architectures". */
static df_status config_class(const df_json *cfg, const char **out)
{
    df_status s = df_json_get_string_or(cfg, "_class_name", NULL, out);
    if (s != DF_OK)
        return s;
    if (!*out)
        *out = df_json_string(df_json_array_get(df_json_get(cfg, "architectures"), 0));
    return DF_OK;
}

/* The tensors of a Mistral / Mistral3 text encoder that loading skips unread (vision
 * tower, multimodal projector, lm_head). */
static int list_skipped(const inspect *in, const df_weights *w)
{
    int64_t n = 0;
    uint64_t bytes = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info t;
        if (df_weights_at(w, i, &t) != DF_OK)
            return fail();
        if (df_mistral_skips_tensor(t.name))
            n++, bytes += t.nbytes;
    }
    if (n == 0)
        return 0;
    char h[32];
    printf("  skipped, not needed for text-to-image (never read): %lld tensors, %s (%llu bytes)\n",
           (long long)n, human(bytes, h, sizeof h), (unsigned long long)bytes);
    for (int64_t i = 0; i < df_weights_count(w) && !in->summary; i++) {
        df_tensor_info t;
        if (df_weights_at(w, i, &t) == DF_OK && df_mistral_skips_tensor(t.name)) {
            fputs("    ", stdout);
            put_clean(stdout, t.name);
            fputc('\n', stdout);
        }
    }
    return 0;
}

/* A component folder; `cls` is the class from model_index.json or NULL. */
static int inspect_component(inspect *in, const char *dir, const char *label, const char *cls)
{
    bool has_config;
    if (check_json_files(dir, &has_config))
        return 1;
    df_json *cfg = NULL;
    if (has_config && df_layout_open_config(dir, &cfg) != DF_OK)
        return fail();
    bool own_class = !cls; /* the folder's own config names it, not a pipeline's index */
    if (!cls && cfg && config_class(cfg, &cls) != DF_OK) {
        df_json_free(cfg);
        return fail();
    }
    printf("component ");
    put_clean(stdout, label);
    if (cls) {
        printf(": ");
        put_clean(stdout, cls);
    }
    printf("\n");
    in->components++;
    char wpath[DF_PATH_MAX];
    df_status s = df_layout_find_weights(dir, wpath, sizeof wpath);
    int rc = 0;
    df_weights *w = NULL;
    if (s == DF_OK) {
        if (df_weights_open(wpath, &w) != DF_OK)
            rc = fail();
        else
            rc = list_weights(in, w);
    } else if (has_config || s != DF_E_IO) {
        rc = fail(); /* a model config without weights, or only .bin files */
    }
    df_model_check_fn check = cls && in->model_checks ? df_model_check_find(cls) : NULL;
    if (rc == 0 && in->lone && own_class && cls && in->model_checks && !check) {
        char known[2048];
        fputs("error: ", stderr);
        put_clean(stderr, dir);
        fputs("/config.json: class '", stderr);
        put_clean(stderr, cls);
        fprintf(stderr, "' is not one this build loads (it loads %s)\n",
                df_model_check_classes(known, sizeof known));
        rc = 1;
    } else if (rc == 0 && check) {
        if (check(dir, cfg, w) != DF_OK)
            rc = fail();
        else if (w)
            printf("  weights match the %s config\n", cls);
        else
            printf("  loads as %s\n", cls);
        if (rc == 0 && w && strncmp(cls, "Mistral", 7) == 0)
            rc = list_skipped(in, w);
    }
    df_weights_free(w);
    df_json_free(cfg);
    return rc;
}

/* The one error line of a folder this build cannot load. */
static int not_loadable(const char *why)
{
    fputs("error: pipeline not loadable by this build: ", stderr);
    put_clean(stderr, why);
    fputc('\n', stderr);
    return 1;
}

/* Whether `dir` holds a file `name`. */
static bool has_file(const char *dir, const char *name)
{
    char path[DF_PATH_MAX + 64];
    struct stat sb;
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    return n > 0 && (size_t)n < sizeof path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Whether `dir` looks like a component folder: a config, tokenizer files or weights. */
static bool is_component_folder(const char *dir)
{
    static const char *const marks[] = {"config.json", "scheduler_config.json",
                                        "tokenizer_config.json", "tokenizer.json", "vocab.json",
                                        "spiece.model"};
    for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
        if (has_file(dir, marks[i]))
            return true;
    char w[DF_PATH_MAX];
    return df_layout_find_weights(dir, w, sizeof w) != DF_E_IO;
}

/* Lists and checks, by the classes their configs name, the component folders under `dir`
 * (subfolders holding a config, tokenizer files or weights): what a pipeline folder without
 * a readable model_index.json still holds. */
static int list_component_folders(inspect *in, const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return fail_msg(dir, "cannot open the folder");
    char *names[64];
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) && n < 64;) {
        char sub[DF_PATH_MAX];
        struct stat sb;
        snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name);
        if (e->d_name[0] != '.' && stat(sub, &sb) == 0 && S_ISDIR(sb.st_mode) &&
            is_component_folder(sub))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_str);
    int rc = 0;
    for (int i = 0; i < n; i++) {
        char sub[DF_PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", dir, names[i] ? names[i] : "");
        if (rc == 0 && names[i])
            rc = inspect_component(in, sub, names[i], NULL);
        free(names[i]);
    }
    return rc;
}

/*
 * A folder without model_index.json: a component folder, or a pipeline folder that lost its
 * index, told apart by what it holds. The latter's component folders are listed, then it
 * is an error: without the index there is no pipeline class and no list of components.
 */
static int inspect_folder(inspect *in, const char *dir)
{
    if (is_component_folder(dir)) {
        in->lone = true;
        return inspect_component(in, dir, dir, NULL);
    }
    printf("pipeline ");
    put_clean(stdout, dir);
    printf(": no model_index.json\n");
    int before = in->components;
    if (list_component_folders(in, dir))
        return 1;
    char why[DF_PATH_MAX + 256];
    snprintf(why, sizeof why, "%s/model_index.json: no such file; a pipeline folder needs it "
             "to name its class and components (%s)", dir,
             in->components > before
                 ? "its component folders are listed above"
                 : "and this folder holds no component folder, config or weights either");
    return not_loadable(why);
}

/*
 * A pipeline folder gets the checks of a load because it is loaded (the weights are mapped,
 * not read): every component the class needs, with its class, config and weights. When it
 * does not load (a class this build does not implement, a broken file, an index that
 * cannot be read) each component of a known class is loaded on its own while it is listed,
 * and the load's message ends the listing as "pipeline not loadable by this build" - unless
 * a component's own check failed first, whose message is then the one line.
 */
static int inspect_pipeline(inspect *in, const char *dir)
{
    df_model_index *idx;
    char why[1024] = "";
    if (df_model_index_load(dir, &idx) != DF_OK) { /* list the folders, then say why */
        snprintf(why, sizeof why, "%s", df_error_message());
        printf("pipeline ");
        put_clean(stdout, dir);
        printf(": model_index.json cannot be read\n");
        return list_component_folders(in, dir) ? 1 : not_loadable(why);
    }
    df_pipeline *p = NULL;
    /* an explicit dtype: --dtype auto would measure the CPU, which a listing does not need */
    df_status s = df_pipeline_load(dir, &(df_load_opts){.threads = 1, .dtype = DF_DTYPE_F32},
                                   &p);
    df_pipeline_free(p);
    if (s != DF_OK)
        snprintf(why, sizeof why, "%s", df_error_message());
    in->model_checks = s != DF_OK;
    const char *cls = df_model_index_class(idx);
    const char *ver = df_json_string(df_json_get(df_model_index_json(idx), "_diffusers_version"));
    printf("pipeline ");
    put_clean(stdout, dir);
    if (cls) {
        printf(": ");
        put_clean(stdout, cls);
    }
    if (ver) {
        printf(" (diffusers ");
        put_clean(stdout, ver);
        printf(")");
    }
    printf("\n");
    int rc = 0;
    for (int i = 0; i < df_model_index_count(idx) && rc == 0; i++) {
        const df_component *c = df_model_index_at(idx, i);
        if (!c->cls) {
            printf("component ");
            put_clean(stdout, c->name);
            /* diffusers saves an SD3 pipeline loaded with text_encoder_3=None so */
            bool sd3 = cls && strncmp(cls, "StableDiffusion3", 16) == 0;
            printf(": not included%s\n",
                   sd3 && strcmp(c->name, "text_encoder_3") == 0
                       ? " (T5 off: its part of the prompt embeddings is zeros)"
                       : "");
            continue;
        }
        char cdir[DF_PATH_MAX];
        if (df_layout_component_dir(dir, c->name, cdir, sizeof cdir) != DF_OK)
            rc = fail();
        else
            rc = inspect_component(in, cdir, c->name, c->cls);
    }
    if (rc == 0 && why[0]) {
        rc = not_loadable(why);
    } else if (rc == 0) {
        printf("pipeline loads: every component matches its class and config\n");
    }
    df_model_index_free(idx);
    return rc;
}

/* `path`, a .json file, parsed as a diffusers folder's JSON files are read: an object. */
static int inspect_json_file(inspect *in, const char *path)
{
    char dir[DF_PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (slash)
        snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    else
        snprintf(dir, sizeof dir, ".");
    if (slash && slash == path)
        snprintf(dir, sizeof dir, "/");
    df_json *j;
    if (df_layout_open_json(dir, slash ? slash + 1 : path, &j) != DF_OK)
        return fail();
    printf("json ");
    put_clean(stdout, path);
    printf(": valid (object of %lld keys)\n", (long long)df_json_object_size(j));
    df_json_free(j);
    in->files++;
    return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int inspect_path(inspect *in, const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0)
        return fail_msg(path, "no such file or folder");
    if (S_ISDIR(sb.st_mode)) {
        char probe[DF_PATH_MAX];
        snprintf(probe, sizeof probe, "%s/model_index.json", path);
        if (stat(probe, &sb) == 0)
            return inspect_pipeline(in, path);
        return inspect_folder(in, path);
    }
    if (!S_ISREG(sb.st_mode))
        return fail_msg(path, "not a regular file or folder");
    if (ends_with(path, ".json") && !ends_with(path, ".safetensors.index.json"))
        return inspect_json_file(in, path);
    if (ends_with(path, ".gguf"))
        return inspect_gguf_file(in, path);
    return inspect_weights_file(in, path);
}

int cmd_inspect(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    inspect in = {.model_checks = true};
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "-s") == 0 || strcmp(a, "--summary") == 0) {
            in.summary = true;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "diffuse inspect: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (path) {
            fprintf(stderr, "diffuse inspect: one PATH only\n");
            usage(stderr);
            return 2;
        } else {
            path = a;
        }
    }
    if (df_models_register_checks() != DF_OK) {
        fprintf(stderr, "diffuse inspect: %s\n", df_error_message());
        return 1;
    }
    if (!path) {
        usage(stderr);
        return 2;
    }
    int rc = inspect_path(&in, path);
    if (rc == 0) {
        char h[32];
        printf("total: %d component%s, %d file%s, %lld tensors, %s (%llu bytes)\n",
               in.components, in.components == 1 ? "" : "s", in.files,
               in.files == 1 ? "" : "s", (long long)in.tensors, human(in.bytes, h, sizeof h),
               (unsigned long long)in.bytes);
    }
    if (fflush(stdout) != 0 || ferror(stdout)) {
        if (rc == 0)
            fputs("error: cannot write the listing to stdout\n", stderr);
        return 1;
    }
    return rc;
}
