/*
 * LoRA adapters (lora.h): reading the files, naming their targets, merging.
 *
 * A file becomes a list of targets, each one module of the file's own names (the key
 * without its lora_A / lora_down suffix) with its A and B (borrowed from the mapped file)
 * and its scale. Nothing is converted up front: when the loader binds a weight, the
 * weight's diffusers name is turned into the name each layout would give it ("transformer.
 * transformer_blocks.0.attn.to_q"; "lora_unet_double_blocks_0_img_attn_qkv" with rows 0..1
 * of 3; "double_blocks.0.processor.qkv_lora1" likewise) and the targets of that name are
 * merged, B cut to the weight's rows. A target no weight asked for is reported by
 * df_lora_check_used, so a key naming a module the model lacks is an error, not ignored.
 * The exceptions are what diffusers itself reads and drops (T5 modules of a FLUX.1 kohya
 * file, kohya modules FLUX.2's converter does not map, ...): those targets are marked
 * skipped with one warning line per kind, so the image is diffusers' one.
 *
 * Merging is exact f32 arithmetic on a copy: W' = W + s B[rows] A, rounded once to the
 * weight's dtype.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/json.h>
#include <diffuse/safetensors.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/lora.h"
#include "models/names.h"

typedef enum layout { LAYOUT_PEFT, LAYOUT_KOHYA, LAYOUT_XLABS, LAYOUT_BFL2, LAYOUT_COUNT } layout;

static const char *const layout_names[] = {"diffusers/peft", "kohya", "XLabs",
                                           "BFL / ai-toolkit (FLUX.2)"};

typedef struct target {
    int file;
    char key[256]; /* the module in the file's names */
    bool has_a, has_b, has_alpha;
    df_tensor_info a, b; /* [rank, in], [out, rank] */
    float alpha;
    float scale;
    bool used;
    bool skipped; /* read but not applied (diffusers drops it; see dropped_by_diffusers) */
} target;

typedef struct adapter {
    char *path;
    df_safetensors *st;
    layout lay;
    float weight;
} adapter;

struct df_lora_set {
    adapter *files;
    int n_files;
    target *t;
    int n, cap;
    bool flux1, flux2;
    bool any; /* no pipeline named: every layout is read, nothing warned (df_lora_describe_file) */
    int text_encoders; /* how many of text_encoder, text_encoder_2 take adapters */
    const char *pipeline;
};

static bool starts(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static bool ends(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* ---- reading a file ----------------------------------------------------------------- */

/* The prefix of BFL / ai-toolkit FLUX.2 names ("diffusion_model.", or peft's
 * "base_model.model." that diffusers renames to it); NULL when `key` has neither. */
static const char *bfl2_prefix(const char *key)
{
    return starts(key, "diffusion_model.")    ? "diffusion_model."
           : starts(key, "base_model.model.") ? "base_model.model."
                                              : NULL;
}

/* The file's layout, in the order diffusers' lora_state_dict tests them: any
 * ".lora_down.weight" is kohya, then XLabs' ".processor." (FLUX.1), then BFL / ai-toolkit
 * names under "diffusion_model." (FLUX.2), else diffusers / peft. LoKr files are refused,
 * and on FLUX.1 (`flux1`) the two layouts diffusers' FluxPipeline converts and diffuse does
 * not: BFL's Control LoRAs ("query_norm.scale" keys) and fal's Kontext ("base_model"). */
static df_status detect(const char *path, const df_safetensors *st, bool flux1, layout *out)
{
    int64_t n = df_safetensors_count(st);
    bool kohya = false, xlabs = false, bfl2 = false;
    const char *control = NULL, *fal = NULL;
    for (int64_t i = 0; i < n; i++) {
        df_tensor_info info;
        if (df_safetensors_at(st, i, &info) != DF_OK)
            continue;
        if (strstr(info.name, ".lokr_") || starts(info.name, "lycoris_"))
            return df_errorf(DF_E_UNSUPPORTED,
                             "%s: key '%s': LoKr adapters (lokr_w1 / lokr_w2 factors) are "
                             "not supported; diffuse reads low-rank (LoRA) adapters only",
                             path, info.name);
        kohya |= ends(info.name, ".lora_down.weight");
        xlabs |= strstr(info.name, ".processor.") != NULL;
        bfl2 |= bfl2_prefix(info.name) != NULL;
        if (!control && strstr(info.name, "query_norm.scale"))
            control = info.name;
        if (!fal && strstr(info.name, "base_model"))
            fal = info.name;
    }
    *out = kohya ? LAYOUT_KOHYA : xlabs ? LAYOUT_XLABS : bfl2 ? LAYOUT_BFL2 : LAYOUT_PEFT;
    if (flux1 && !kohya && !xlabs && (control || fal))
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: key '%s': %s are not supported (diffusers' FluxPipeline "
                         "converts them; diffuse does not yet)",
                         path, control ? control : fal,
                         control ? "BFL Control LoRAs (with norm scales)"
                                 : "fal Kontext LoRAs (base_model.model.* names)");
    return DF_OK;
}

/* ComfyUI's names for a FLUX.1 kohya file, as diffusers' kohya converter renames them:
 * "diffusion_model.<BFL module>" is "lora_unet_<module, '.' -> '_'>" and
 * "text_encoders.clip_l.transformer.<module>" is "lora_te_<module, '_'>". */
static void comfy_to_kohya(char *module, size_t cap)
{
    static const char *const from[] = {"diffusion_model.", "text_encoders.clip_l.transformer."};
    static const char *const to[] = {"lora_unet_", "lora_te_"};
    for (int i = 0; i < 2; i++) {
        size_t lf = strlen(from[i]), lt = strlen(to[i]), n = strlen(module);
        if (!starts(module, from[i]) || n - lf + lt >= cap)
            continue;
        memmove(module + lt, module + lf, n - lf + 1);
        memcpy(module, to[i], lt);
        for (char *c = module + lt; *c; c++)
            if (*c == '.')
                *c = '_';
        return;
    }
}

/* The module and the role ('A', 'B', 'a' for alpha) of a key in layout `lay`; 0: none.
 * BFL / ai-toolkit modules lose their prefix, and the "sformer_blocks." alias of some
 * exports becomes "transformer_blocks." as diffusers reads it; a FLUX.1 kohya file's
 * ComfyUI names become sd-scripts' (comfy_to_kohya). */
static char split_key(layout lay, bool flux1, const char *key, char *module, size_t cap)
{
    static const struct {
        layout lay;
        const char *suffix;
        char role;
    } roles[] = {
        {LAYOUT_PEFT, ".lora_A.weight", 'A'},   {LAYOUT_PEFT, ".lora_B.weight", 'B'},
        {LAYOUT_PEFT, ".alpha", 'a'},           {LAYOUT_KOHYA, ".lora_down.weight", 'A'},
        {LAYOUT_KOHYA, ".lora_up.weight", 'B'}, {LAYOUT_KOHYA, ".alpha", 'a'},
        {LAYOUT_XLABS, ".down.weight", 'A'},    {LAYOUT_XLABS, ".up.weight", 'B'},
        {LAYOUT_BFL2, ".lora_A.weight", 'A'},   {LAYOUT_BFL2, ".lora_B.weight", 'B'},
    };
    if (lay == LAYOUT_XLABS && starts(key, "diffusion_model."))
        key += strlen("diffusion_model.");
    if (lay == LAYOUT_BFL2) {
        const char *prefix = bfl2_prefix(key);
        if (!prefix)
            return 0;
        key += strlen(prefix);
        if (starts(key, "sformer_blocks.") && strlen(key) + 5 < cap) {
            snprintf(module, cap, "tran%s", key); /* "tran" + "sformer_blocks..." */
            key = module;
        }
    }
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++) {
        size_t n = strlen(key), k = strlen(roles[i].suffix);
        if (roles[i].lay != lay || !ends(key, roles[i].suffix) || n - k >= cap)
            continue;
        memmove(module, key, n - k);
        module[n - k] = '\0';
        if (lay == LAYOUT_KOHYA && flux1)
            comfy_to_kohya(module, cap);
        return roles[i].role;
    }
    return 0;
}

static df_status refuse_key(const char *path, layout lay, const char *key)
{
    if (strstr(key, "lora_magnitude_vector"))
        return df_errorf(DF_E_UNSUPPORTED, "%s: key '%s': DoRA adapters are not supported", path,
                         key);
    if (ends(key, ".lora_B.bias") || ends(key, ".lora_up.bias"))
        return df_errorf(DF_E_UNSUPPORTED, "%s: key '%s': LoRA biases are not supported", path,
                         key);
    static const char *const want[] = {
        "<component>.<module>.lora_A.weight, .lora_B.weight or .alpha",
        "lora_unet_<module> / lora_te1_<module> with .lora_down.weight, .lora_up.weight or .alpha",
        "<block>.processor.<name>_lora*.down.weight or .up.weight",
        "diffusion_model.<module>.lora_A.weight or .lora_B.weight (diffusers refuses .alpha)"};
    return df_errorf(DF_E_FORMAT,
                     "%s: key '%s' is not a LoRA tensor of the %s layout "
                     "(expected %s)",
                     path, key, layout_names[lay], want[lay]);
}

static target *find_target(df_lora_set *set, int file, const char *module)
{
    for (int i = set->n - 1; i >= 0 && set->t[i].file == file; i--)
        if (strcmp(set->t[i].key, module) == 0)
            return &set->t[i];
    if (set->n == set->cap) {
        int cap = set->cap ? 2 * set->cap : 64;
        target *t = df_realloc(set->t, (size_t)cap * sizeof *t);
        if (!t)
            return NULL;
        set->t = t;
        set->cap = cap;
    }
    target *t = &set->t[set->n++];
    *t = (target){.file = file};
    snprintf(t->key, sizeof t->key, "%s", module);
    return t;
}

static df_status read_alpha(const char *path, const df_tensor_info *info, float *out)
{
    if (info->numel != 1 || info->dtype == DF_DTYPE_COUNT)
        return df_errorf(DF_E_FORMAT,
                         "%s: alpha '%s' must be one number, found %lld values "
                         "of %s",
                         path, info->name, (long long)info->numel, info->dtype_name);
    return df_convert(info->data, info->dtype, out, DF_DTYPE_F32, 1);
}

/* Collects the file's keys into targets (A, B, alpha), checking each. */
/* Keys diffusers reads past before converting a file, each kind with its reason. */
enum { DROP_DORA_SCALE, DROP_FLUX1_KOHYA, DROP_FLUX2_KOHYA, DROP_KINDS };
static const char *drop_why(int kind)
{
    switch (kind) {
    case DROP_DORA_SCALE:
        return "diffusers' lora_state_dict filters DoRA's dora_scale keys out and loads the "
               "rest as a plain LoRA";
    case DROP_FLUX1_KOHYA:
        return "diffusers' FLUX.1 kohya converter filters out bias and norm differences, "
               "position embeddings and text projections";
    default:
        return "diffusers' FLUX.2 kohya converter drops the keys it does not map";
    }
}

/* Which kind of dropped key `key` (role `role` in the file's layout) is, or -1 when diffusers
 * keeps it. `filter`: a FLUX.1 kohya file without lora_transformer_ keys, whose bias and
 * norm differences (".diff_b"; every ".norm" / ".diff" key once one key has both: `norm_diff`),
 * position embeddings and text projections diffusers' converter filters out. */
static int drop_kind(const df_lora_set *set, layout lay, const char *key, char role, bool filter,
                     bool norm_diff)
{
    if (strstr(key, "dora_scale"))
        return DROP_DORA_SCALE;
    if (filter && (strstr(key, ".diff_b") || strstr(key, "position_embedding") ||
                   strstr(key, "text_projection") ||
                   (norm_diff && (strstr(key, ".norm") || strstr(key, ".diff")))))
        return DROP_FLUX1_KOHYA;
    if (!role && lay == LAYOUT_KOHYA && set->flux2)
        return DROP_FLUX2_KOHYA;
    return -1;
}

static df_status collect(df_lora_set *set, int file)
{
    const adapter *ad = &set->files[file];
    int64_t n = df_safetensors_count(ad->st);
    bool filter = ad->lay == LAYOUT_KOHYA && set->flux1, norm_diff = false;
    for (int64_t i = 0; filter && i < n; i++) {
        df_tensor_info info;
        DF_TRY(df_safetensors_at(ad->st, i, &info));
        filter = !starts(info.name, "lora_transformer_");
        norm_diff |= strstr(info.name, ".norm") && strstr(info.name, ".diff");
    }
    int filtered[DROP_KINDS] = {0};
    const char *first_filtered[DROP_KINDS] = {"", "", ""};
    for (int64_t i = 0; i < n; i++) {
        df_tensor_info info;
        DF_TRY(df_safetensors_at(ad->st, i, &info));
        char module[256];
        char role = split_key(ad->lay, set->flux1, info.name, module, sizeof module);
        int drop = drop_kind(set, ad->lay, info.name, role, filter, norm_diff);
        if (drop >= 0) {
            if (filtered[drop]++ == 0)
                first_filtered[drop] = info.name;
            continue;
        }
        if (!role)
            return refuse_key(ad->path, ad->lay, info.name);
        target *t = find_target(set, file, module);
        if (!t)
            return df_errorf(DF_E_OOM, "%s: out of memory", ad->path);
        if (role == 'a') {
            DF_TRY(read_alpha(ad->path, &info, &t->alpha));
            t->has_alpha = true;
            continue;
        }
        if (info.ndim != 2)
            return df_errorf(DF_E_FORMAT, "%s: key '%s' has %d dimensions; a LoRA matrix has 2",
                             ad->path, info.name, info.ndim);
        if (info.dtype != DF_DTYPE_F32 && info.dtype != DF_DTYPE_BF16 && info.dtype != DF_DTYPE_F16)
            return df_errorf(DF_E_UNSUPPORTED,
                             "%s: key '%s' is stored as %s; LoRA matrices "
                             "must be F32, BF16 or F16",
                             ad->path, info.name, info.dtype_name);
        if (role == 'A')
            t->a = info, t->has_a = true;
        else
            t->b = info, t->has_b = true;
    }
    for (int k = 0; k < DROP_KINDS; k++)
        if (filtered[k] && !set->any)
            df_logf(0, "warning: %s: %d keys (the first '%s') are not applied: %s", ad->path,
                    filtered[k], first_filtered[k], drop_why(k));
    return DF_OK;
}

/* ---- the scale rule ----------------------------------------------------------------- */

/* peft's pattern keys: "^name" matches the module name exactly, "name" also as a suffix
 * after a '.'. */
static const df_json *pattern_value(const df_json *patterns, const char *module)
{
    int64_t n = patterns ? df_json_object_size(patterns) : 0;
    for (int64_t i = 0; i < n; i++) {
        const char *key;
        const df_json *v = df_json_object_at(patterns, i, &key);
        bool anchored = key[0] == '^';
        const char *p = key + anchored;
        size_t lm = strlen(module), lp = strlen(p);
        if (strcmp(module, p) == 0 || (!anchored && lm > lp && module[lm - lp - 1] == '.' &&
                                       strcmp(module + lm - lp, p) == 0))
            return v;
    }
    return NULL;
}

/* The scale of peft target t (module "<component>.<name>") from the file's metadata: the
 * component's r / lora_alpha with their patterns; false when the metadata has none. */
static df_status metadata_scale(const adapter *ad, const df_json *meta, target *t, bool *found)
{
    *found = false;
    char component[64], key[96];
    const char *dot = strchr(t->key, '.');
    size_t len = dot ? (size_t)(dot - t->key) : 0;
    if (!meta || !dot || len >= sizeof component)
        return DF_OK;
    memcpy(component, t->key, len);
    component[len] = '\0';
    snprintf(key, sizeof key, "%s.r", component);
    const df_json *r = df_json_get(meta, key);
    snprintf(key, sizeof key, "%s.lora_alpha", component);
    const df_json *alpha = df_json_get(meta, key);
    if (!r || !alpha)
        return DF_OK;
    snprintf(key, sizeof key, "%s.rank_pattern", component);
    const df_json *rp = pattern_value(df_json_get(meta, key), dot + 1);
    snprintf(key, sizeof key, "%s.alpha_pattern", component);
    const df_json *ap = pattern_value(df_json_get(meta, key), dot + 1);
    snprintf(key, sizeof key, "%s.use_rslora", component);
    const df_json *rs = df_json_get(meta, key);
    double rank = df_json_number(rp ? rp : r), a = df_json_number(ap ? ap : alpha);
    if (!(rank >= 1) || !(a == a))
        return df_errorf(DF_E_FORMAT,
                         "%s: lora_adapter_metadata: %s: r %g and lora_alpha %g "
                         "are not a rank and an alpha",
                         ad->path, component, rank, a);
    if ((double)t->a.shape[0] != rank)
        return df_errorf(DF_E_FORMAT,
                         "%s: key '%s.lora_A.weight' has rank %lld but the "
                         "adapter's metadata gives module '%s' rank %g",
                         ad->path, t->key, (long long)t->a.shape[0], dot + 1, rank);
    bool rslora = rs && df_json_type_of(rs) == DF_JSON_BOOL && df_json_bool(rs);
    t->scale = (float)(a / (rslora ? sqrt(rank) : rank));
    *found = true;
    return DF_OK;
}

/* Without metadata: a module's own alpha, else the component's most common one (as
 * diffusers' get_peft_kwargs makes lora_alpha), else its rank (scale 1). */
static float default_alpha(const df_lora_set *set, const target *t)
{
    if (t->has_alpha)
        return t->alpha;
    size_t clen = strcspn(t->key, ".");
    float best = 0;
    int best_n = 0;
    for (int i = 0; i < set->n; i++) {
        const target *u = &set->t[i];
        if (u->file != t->file || !u->has_alpha || strncmp(u->key, t->key, clen + 1) != 0)
            continue;
        int c = 0;
        for (int j = 0; j < set->n; j++)
            c += set->t[j].file == t->file && set->t[j].has_alpha &&
                 strncmp(set->t[j].key, t->key, clen + 1) == 0 && set->t[j].alpha == u->alpha;
        if (c > best_n)
            best = u->alpha, best_n = c;
    }
    return best_n ? best : (float)t->a.shape[0];
}

/* FLUX.2's modules in Black Forest Labs' names, as diffusers 0.42's FLUX.2 converters map
 * them (_convert_non_diffusers_flux2_lora_to_diffusers for "diffusion_model." files, with
 * lora_A / lora_B; _convert_kohya_flux2_lora_to_diffusers for "lora_unet_<name, '_'>"
 * files, which maps the rows marked `kohya` and drops the rest). A fused qkv's B is cut in
 * thirds (part 0..2) with A shared; single blocks' linear1 is the fused to_qkv_mlp_proj
 * whole. No row is reordered: norm_out.linear takes final_layer.adaLN_modulation.1 as is. */
static const struct flux2_rule {
    const char *diffusers, *bfl;
    int part;
    bool kohya;
} flux2_rules[] = {
    {"transformer_blocks.%d.attn.to_q%n", "double_blocks.%d.img_attn.qkv", 0, true},
    {"transformer_blocks.%d.attn.to_k%n", "double_blocks.%d.img_attn.qkv", 1, true},
    {"transformer_blocks.%d.attn.to_v%n", "double_blocks.%d.img_attn.qkv", 2, true},
    {"transformer_blocks.%d.attn.add_q_proj%n", "double_blocks.%d.txt_attn.qkv", 0, true},
    {"transformer_blocks.%d.attn.add_k_proj%n", "double_blocks.%d.txt_attn.qkv", 1, true},
    {"transformer_blocks.%d.attn.add_v_proj%n", "double_blocks.%d.txt_attn.qkv", 2, true},
    {"transformer_blocks.%d.attn.to_out.0%n", "double_blocks.%d.img_attn.proj", -1, true},
    {"transformer_blocks.%d.attn.to_add_out%n", "double_blocks.%d.txt_attn.proj", -1, true},
    {"transformer_blocks.%d.ff.linear_in%n", "double_blocks.%d.img_mlp.0", -1, true},
    {"transformer_blocks.%d.ff.linear_out%n", "double_blocks.%d.img_mlp.2", -1, true},
    {"transformer_blocks.%d.ff_context.linear_in%n", "double_blocks.%d.txt_mlp.0", -1, true},
    {"transformer_blocks.%d.ff_context.linear_out%n", "double_blocks.%d.txt_mlp.2", -1, true},
    {"single_transformer_blocks.%d.attn.to_qkv_mlp_proj%n", "single_blocks.%d.linear1", -1, true},
    {"single_transformer_blocks.%d.attn.to_out%n", "single_blocks.%d.linear2", -1, true},
    {"x_embedder%n", "img_in", -1, true},
    {"context_embedder%n", "txt_in", -1, true},
    {"time_guidance_embed.timestep_embedder.linear_1%n", "time_in.in_layer", -1, true},
    {"time_guidance_embed.timestep_embedder.linear_2%n", "time_in.out_layer", -1, true},
    {"proj_out%n", "final_layer.linear", -1, true},
    {"time_guidance_embed.guidance_embedder.linear_1%n", "guidance_in.in_layer", -1, false},
    {"time_guidance_embed.guidance_embedder.linear_2%n", "guidance_in.out_layer", -1, false},
    {"norm_out.linear%n", "final_layer.adaLN_modulation.1", -1, false},
    {"single_stream_modulation.linear%n", "single_stream_modulation.lin", -1, false},
    {"double_stream_modulation_img.linear%n", "double_stream_modulation_img.lin", -1, false},
    {"double_stream_modulation_txt.linear%n", "double_stream_modulation_txt.lin", -1, false},
};

/* Rule r's name in kohya's form for block `block`: "lora_unet_" + BFL's name, '.' -> '_'. */
static void kohya2_key(const struct flux2_rule *r, int block, char *out, size_t cap)
{
    int n = snprintf(out, cap, "lora_unet_");
    snprintf(out + n, cap - (size_t)n, r->bfl, block);
    for (char *c = out + n; *c; c++)
        if (*c == '.')
            *c = '_';
}

/* Whether diffusers' FLUX.2 kohya converter maps module `key` ("lora_unet_..."). */
static bool kohya2_converted(const char *key)
{
    const char *block_kinds[] = {"lora_unet_double_blocks_", "lora_unet_single_blocks_"};
    int block = 0;
    for (int i = 0; i < 2; i++) { /* the block number, as the converter reads it */
        const char *p = key + strlen(block_kinds[i]);
        if (!starts(key, block_kinds[i]) || *p < '0' || *p > '9')
            continue;
        for (block = 0; *p >= '0' && *p <= '9' && block < 100000; p++)
            block = block * 10 + (*p - '0');
    }
    for (size_t i = 0; i < sizeof flux2_rules / sizeof flux2_rules[0]; i++) {
        char name[300];
        kohya2_key(&flux2_rules[i], block, name, sizeof name);
        if (flux2_rules[i].kohya && strcmp(name, key) == 0)
            return true;
    }
    return false;
}

/* diffusers 0.42's kohya converter names the modules outside the blocks (img_in, txt_in,
 * time_in, vector_in, guidance_in, final_layer) without the "transformer." prefix, so
 * load_lora_weights never applies them; neither does diffuse, to give the same image. */
static bool dropped_by_diffusers(const char *key)
{
    static const char *const outside[] = {"lora_unet_img_in",       "lora_unet_txt_in",
                                          "lora_unet_time_in_",     "lora_unet_vector_in_",
                                          "lora_unet_guidance_in_", "lora_unet_final_layer_"};
    for (size_t i = 0; i < sizeof outside / sizeof outside[0]; i++)
        if (starts(key, outside[i]))
            return true;
    return false;
}

static df_status finish(df_lora_set *set, int file, int first)
{
    const adapter *ad = &set->files[file];
    df_json *meta = NULL;
    const char *raw = df_safetensors_metadata(ad->st, "lora_adapter_metadata");
    if (raw && ad->lay == LAYOUT_PEFT)
        DF_TRY_CTX(df_json_parse_string(raw, strlen(raw), "lora_adapter_metadata", &meta), "%s",
                   ad->path);
    df_status s = DF_OK;
    int skipped = 0, t5 = 0, dropped = 0, unet = 0;
    const char *first_dropped = "";
    /* diffusers reads a kohya file with lora_transformer_ keys as a "mixture": it drops the
     * lora_unet_ keys and refuses any but lora_transformer_ / lora_te1_ */
    bool mixture = false;
    for (int i = first; i < set->n; i++)
        mixture |= ad->lay == LAYOUT_KOHYA && starts(set->t[i].key, "lora_transformer_");
    for (int i = first; s == DF_OK && i < set->n; i++) {
        target *t = &set->t[i];
        const char *a_name = ad->lay == LAYOUT_KOHYA   ? "lora_down"
                             : ad->lay == LAYOUT_XLABS ? "down"
                                                       : "lora_A";
        const char *b_name = ad->lay == LAYOUT_KOHYA   ? "lora_up"
                             : ad->lay == LAYOUT_XLABS ? "up"
                                                       : "lora_B";
        if (!t->has_a || !t->has_b) {
            s = df_errorf(DF_E_FORMAT, "%s: module '%s' has %s but no %s", ad->path, t->key,
                          t->has_a   ? a_name
                          : t->has_b ? b_name
                                     : "an alpha",
                          t->has_a ? b_name : a_name);
            break;
        }
        if (t->a.shape[0] != t->b.shape[1]) {
            s = df_errorf(DF_E_FORMAT,
                          "%s: module '%s': %s has rank %lld ([%lld, %lld]) but "
                          "%s has rank %lld ([%lld, %lld])",
                          ad->path, t->key, a_name, (long long)t->a.shape[0],
                          (long long)t->a.shape[0], (long long)t->a.shape[1], b_name,
                          (long long)t->b.shape[1], (long long)t->b.shape[0],
                          (long long)t->b.shape[1]);
            break;
        }
        if (ad->lay == LAYOUT_PEFT) {
            const char *c = t->key;
            if ((starts(c, "text_encoder.") && set->text_encoders < 1) ||
                (starts(c, "text_encoder_2.") && set->text_encoders < 2)) {
                if (skipped++ == 0 && !set->any)
                    df_logf(0,
                            "warning: %s: module '%s' (and any other of that text "
                            "encoder) is not applied: diffusers' %s loads adapters into %s "
                            "only",
                            ad->path, t->key, set->pipeline,
                            set->text_encoders ? "the transformer and text_encoder"
                                               : "the transformer");
                t->skipped = t->used = true;
                continue;
            }
            if (!starts(c, "transformer.") && !starts(c, "text_encoder.") &&
                !starts(c, "text_encoder_2.")) {
                s = df_errorf(DF_E_UNSUPPORTED,
                              "%s: module '%s': diffuse applies LoRA to "
                              "'transformer.', 'text_encoder.' and 'text_encoder_2.' modules",
                              ad->path, t->key);
                break;
            }
        } else if (ad->lay == LAYOUT_BFL2 && !set->flux2 && !set->any) {
            s = df_errorf(DF_E_UNSUPPORTED,
                          "%s: the %s layout (module '%s') is read for FLUX.2 pipelines "
                          "only (as diffusers' Flux2LoraLoaderMixin converts it), not for %s",
                          ad->path, layout_names[ad->lay], t->key, set->pipeline);
            break;
        } else if (ad->lay == LAYOUT_KOHYA && set->flux2) {
            if (!kohya2_converted(t->key)) { /* diffusers warns and drops it */
                t->skipped = t->used = true;
                if (dropped++ == 0)
                    first_dropped = t->key;
            }
        } else if (ad->lay != LAYOUT_BFL2 && !set->flux1) { /* kohya, XLabs on SD3 */
            s = df_errorf(DF_E_UNSUPPORTED,
                          "%s: the %s layout is not read for %s: diffusers' loader of that "
                          "pipeline converts no %s file",
                          ad->path, layout_names[ad->lay], set->pipeline, layout_names[ad->lay]);
            break;
        } else if (ad->lay == LAYOUT_KOHYA && mixture && !starts(t->key, "lora_unet_") &&
                   !t->has_alpha) {
            s = df_errorf(DF_E_UNSUPPORTED,
                          "%s: module '%s' has no .alpha: diffusers' kohya converter needs "
                          "one for every module of a file with lora_transformer_* modules",
                          ad->path, t->key);
            break;
        } else if (ad->lay == LAYOUT_KOHYA && mixture && starts(t->key, "lora_unet_")) {
            t->skipped = t->used = true;
            unet++;
        } else if (ad->lay == LAYOUT_KOHYA && mixture && !starts(t->key, "lora_transformer_") &&
                   !starts(t->key, "lora_te1_")) {
            s = df_errorf(DF_E_UNSUPPORTED,
                          "%s: module '%s' beside lora_transformer_* modules: diffusers' "
                          "kohya converter reads such a file with lora_transformer_*, "
                          "lora_te1_* (and drops lora_unet_*) only, and refuses it",
                          ad->path, t->key);
            break;
        } else if (ad->lay == LAYOUT_KOHYA &&
                   (starts(t->key, "lora_te2_") ||
                    starts(t->key, "text_encoders.t5xxl.transformer."))) {
            t->skipped = t->used = true; /* diffusers' kohya converter filters them out */
            t5++;
        } else if (ad->lay == LAYOUT_KOHYA && !starts(t->key, "lora_unet_") &&
                   !starts(t->key, "lora_transformer_") && !starts(t->key, "lora_te1_") &&
                   !starts(t->key, "lora_te_")) {
            s = df_errorf(DF_E_UNSUPPORTED,
                          "%s: module '%s': kohya LoRA is read for lora_unet_* (BFL's "
                          "names, or ComfyUI's diffusion_model.*) and lora_transformer_* "
                          "(diffusers' names) of the transformer, lora_te1_* / lora_te_* "
                          "(CLIP-L) and lora_te2_* (T5, dropped as diffusers drops it)",
                          ad->path, t->key);
            break;
        }
        bool found = false;
        if (ad->lay == LAYOUT_PEFT)
            s = metadata_scale(ad, meta, t, &found);
        if (s != DF_OK || found) {
            t->scale *= ad->weight;
            continue;
        }
        double rank = (double)t->a.shape[0];
        double alpha = ad->lay == LAYOUT_XLABS || ad->lay == LAYOUT_BFL2 ? rank
                       : ad->lay == LAYOUT_KOHYA && t->has_alpha         ? t->alpha
                       : ad->lay == LAYOUT_KOHYA                         ? rank
                                                                         : default_alpha(set, t);
        t->scale = (float)(alpha / rank * ad->weight);
        if (ad->lay == LAYOUT_KOHYA && set->flux1 && !t->skipped && dropped_by_diffusers(t->key)) {
            if (skipped++ == 0 && !set->any)
                df_logf(0,
                        "warning: %s: kohya module '%s' (and any other outside the "
                        "blocks) is not applied, as diffusers' load_lora_weights does not "
                        "apply it",
                        ad->path, t->key);
            t->skipped = t->used = true;
        }
    }
    if (s == DF_OK && t5 && !set->any)
        df_logf(0,
                "warning: %s: %d kohya modules of the T5 text encoder (lora_te2_*, "
                "text_encoders.t5xxl.*) are not applied, as diffusers' FLUX.1 kohya converter "
                "drops them",
                ad->path, t5);
    if (s == DF_OK && unet && !set->any)
        df_logf(0,
                "warning: %s: %d lora_unet_* modules are not applied: beside "
                "lora_transformer_* modules, diffusers' kohya converter drops them",
                ad->path, unet);
    if (s == DF_OK && dropped && !set->any)
        df_logf(0,
                "warning: %s: %d kohya modules (the first '%s') are not applied: diffusers' "
                "FLUX.2 kohya converter maps the blocks' attention, MLP and linear1 / linear2, "
                "img_in, txt_in, time_in and final_layer.linear only, and drops the rest",
                ad->path, dropped, first_dropped);
    df_json_free(meta);
    return s;
}

/* An empty set for `n` files on pipeline class `pipeline` (NULL: any). */
static df_lora_set *set_create(int n, const char *pipeline)
{
    df_lora_set *set = df_calloc(1, sizeof *set);
    if (!set || !(set->files = df_calloc(n ? (size_t)n : 1, sizeof *set->files))) {
        df_free(set);
        return NULL;
    }
    /* which components take adapters: diffusers' _lora_loadable_modules of the class */
    bool flux2 = pipeline && starts(pipeline, "Flux2");
    set->flux1 = !pipeline || (starts(pipeline, "Flux") && !flux2);
    set->flux2 = flux2;
    set->any = !pipeline;
    set->text_encoders = !pipeline || starts(pipeline, "StableDiffusion3") ? 2 : flux2 ? 0 : 1;
    set->pipeline = pipeline ? pipeline : "pipeline";
    return set;
}

/* Reads file `i` of the set, whose path and weight are set, from `st` (taken over). */
static df_status add_file(df_lora_set *set, int i, df_safetensors *st)
{
    adapter *ad = &set->files[i];
    ad->st = st;
    if (df_safetensors_count(ad->st) == 0)
        return df_errorf(DF_E_FORMAT, "%s: the adapter file holds no tensors", ad->path);
    DF_TRY(detect(ad->path, ad->st, set->flux1 && !set->any, &ad->lay));
    int first = set->n;
    DF_TRY(collect(set, i));
    return finish(set, i, first);
}

df_status df_lora_set_load(const df_lora_spec *specs, int n, const char *pipeline,
                           df_lora_set **out)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !specs))
        return df_errorf(DF_E_ARG, "LoRA: %d adapters and a list %s", n, specs ? "" : "NULL");
    df_lora_set *set = set_create(n, pipeline);
    if (!set)
        return df_errorf(DF_E_OOM, "LoRA: out of memory");
    df_status s = DF_OK;
    for (int i = 0; s == DF_OK && i < n; i++) {
        adapter *ad = &set->files[i];
        set->n_files = i + 1;
        if (!specs[i].path) {
            s = df_errorf(DF_E_ARG, "LoRA %d: path is NULL", i);
            break;
        }
        ad->weight = specs[i].scale;
        ad->path = df_strdup(specs[i].path);
        if (!ad->path) {
            s = df_errorf(DF_E_OOM, "LoRA: out of memory");
            break;
        }
        df_safetensors *st = NULL;
        s = df_safetensors_open(specs[i].path, &st);
        if (s == DF_OK)
            s = add_file(set, i, st);
    }
    if (s != DF_OK) {
        df_lora_set_free(set);
        return s;
    }
    *out = set;
    return DF_OK;
}

df_status df_lora_set_load_memory(const void *buf, size_t len, const char *name, float scale,
                                  const char *pipeline, df_lora_set **out)
{
    *out = NULL;
    df_lora_set *set = set_create(1, pipeline);
    if (!set)
        return df_errorf(DF_E_OOM, "LoRA: out of memory");
    set->n_files = 1;
    set->files[0].weight = scale;
    set->files[0].path = df_strdup(name ? name : "adapter");
    df_status s = set->files[0].path ? DF_OK : df_errorf(DF_E_OOM, "LoRA: out of memory");
    df_safetensors *st = NULL;
    if (s == DF_OK)
        s = df_safetensors_open_memory(buf, len, set->files[0].path, &st);
    if (s == DF_OK)
        s = add_file(set, 0, st);
    if (s != DF_OK) {
        df_lora_set_free(set);
        return s;
    }
    *out = set;
    return DF_OK;
}

void df_lora_set_free(df_lora_set *set)
{
    if (!set)
        return;
    for (int i = 0; i < set->n_files; i++) {
        df_safetensors_free(set->files[i].st);
        df_free(set->files[i].path);
    }
    df_free(set->files);
    df_free(set->t);
    df_free(set);
}

/* ---- matching a weight -------------------------------------------------------------- */

/* A weight as one layout names it: the module, and the rows of B that update it (B's rows
 * cut in `units` equal parts; parts [part[i][0], part[i][1]) concatenated). */
typedef struct name_in {
    char key[300];
    int units, n;
    int part[2][2];
} name_in;

static void underscores(char *s)
{
    for (; *s; s++)
        if (*s == '.')
            *s = '_';
}

/* XLabs' module for diffusers weight `module` (no ".weight"), with its part of the qkv. */
static bool xlabs_name(const char *module, name_in *out)
{
    static const struct {
        const char *diffusers, *xlabs;
        int part;
    } map[] = {
        {"transformer_blocks.%d.attn.to_q%n", "double_blocks.%d.processor.qkv_lora1", 0},
        {"transformer_blocks.%d.attn.to_k%n", "double_blocks.%d.processor.qkv_lora1", 1},
        {"transformer_blocks.%d.attn.to_v%n", "double_blocks.%d.processor.qkv_lora1", 2},
        {"transformer_blocks.%d.attn.add_q_proj%n", "double_blocks.%d.processor.qkv_lora2", 0},
        {"transformer_blocks.%d.attn.add_k_proj%n", "double_blocks.%d.processor.qkv_lora2", 1},
        {"transformer_blocks.%d.attn.add_v_proj%n", "double_blocks.%d.processor.qkv_lora2", 2},
        {"transformer_blocks.%d.attn.to_out.0%n", "double_blocks.%d.processor.proj_lora1", -1},
        {"transformer_blocks.%d.attn.to_add_out%n", "double_blocks.%d.processor.proj_lora2", -1},
        {"single_transformer_blocks.%d.attn.to_q%n", "single_blocks.%d.processor.qkv_lora", 0},
        {"single_transformer_blocks.%d.attn.to_k%n", "single_blocks.%d.processor.qkv_lora", 1},
        {"single_transformer_blocks.%d.attn.to_v%n", "single_blocks.%d.processor.qkv_lora", 2},
        {"single_transformer_blocks.%d.proj_out%n", "single_blocks.%d.processor.proj_lora", -1},
    };
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
        int block = -1, used = -1;
        if (sscanf(module, map[i].diffusers, &block, &used) != 1 || used < 0 ||
            module[used] != '\0')
            continue;
        int p = map[i].part;
        *out =
            (name_in){.units = p < 0 ? 1 : 3, .n = 1, .part = {{p < 0 ? 0 : p, p < 0 ? 1 : p + 1}}};
        snprintf(out->key, sizeof out->key, map[i].xlabs, block);
        return true;
    }
    return false;
}

/* The BFL name (kohya: "lora_unet_" + its '_' form) of FLUX.2 weight `module`. */
static bool flux2_name(const char *module, layout lay, name_in *out)
{
    for (size_t i = 0; i < sizeof flux2_rules / sizeof flux2_rules[0]; i++) {
        const struct flux2_rule *r = &flux2_rules[i];
        int block = -1, used = -1;
        bool blocks = strstr(r->diffusers, "%d") != NULL;
        int got = blocks ? sscanf(module, r->diffusers, &block, &used)
                         : sscanf(module, r->diffusers, &used);
        if (got != (blocks ? 1 : 0) || used < 0 || module[used] != '\0' ||
            (lay == LAYOUT_KOHYA && !r->kohya))
            continue;
        *out = (name_in){.units = r->part < 0 ? 1 : 3,
                         .n = 1,
                         .part = {{r->part < 0 ? 0 : r->part, r->part < 0 ? 1 : r->part + 1}}};
        if (lay == LAYOUT_KOHYA)
            kohya2_key(r, block, out->key, sizeof out->key);
        else
            snprintf(out->key, sizeof out->key, r->bfl, block);
        return true;
    }
    return false;
}

/* The name of weight `name` of `component` in layout `lay`; false when it has none. */
static bool name_for(const df_lora_set *set, layout lay, const char *component, const char *name,
                     int alt, name_in *out)
{
    char module[256];
    size_t len = strlen(name);
    if (!ends(name, ".weight") || len - 7 >= sizeof module)
        return false;
    memcpy(module, name, len - 7);
    module[len - 7] = '\0';
    *out = (name_in){.units = 1, .n = 1, .part = {{0, 1}}};
    bool text = starts(component, "text_encoder");
    if (lay == LAYOUT_PEFT) {
        /* transformers 5 names CLIP's modules without "text_model." */
        const char *m = alt && starts(module, "text_model.") ? module + 11 : module;
        if (alt && m == module)
            return false;
        snprintf(out->key, sizeof out->key, "%s.%s", component, m);
        return true;
    }
    if (set->flux2 && (lay == LAYOUT_KOHYA || lay == LAYOUT_BFL2)) {
        if (strcmp(component, "transformer") != 0)
            return false;
        if (!alt)
            return flux2_name(module, lay, out);
        /* diffusion_model.<diffusers block module>: read as it is */
        if (lay != LAYOUT_BFL2 || (!starts(module, "transformer_blocks.") &&
                                   !starts(module, "single_transformer_blocks.")))
            return false;
        snprintf(out->key, sizeof out->key, "%s", module);
        return true;
    }
    if (!set->flux1 || lay == LAYOUT_BFL2)
        return false;
    if (lay == LAYOUT_KOHYA && alt) { /* diffusers' module names: "lora_transformer_<module>" */
        if (strcmp(component, "transformer") != 0)
            return false;
        snprintf(out->key, sizeof out->key, "lora_transformer_%s", module);
        underscores(out->key + 17);
        return true;
    }
    if (alt)
        return false;
    if (lay == LAYOUT_KOHYA && text) {
        if (strcmp(component, "text_encoder") != 0)
            return false;
        snprintf(out->key, sizeof out->key, "lora_te1_%s", module);
        underscores(out->key + 9);
        return true;
    }
    if (strcmp(component, "transformer") != 0)
        return false;
    if (lay == LAYOUT_XLABS)
        return xlabs_name(module, out);
    df_name_src src;
    if (!df_names_flux_bfl(name, 0, &src) || !ends(src.name, ".weight"))
        return false;
    src.name[strlen(src.name) - 7] = '\0';
    snprintf(out->key, sizeof out->key, "lora_unet_%s", src.name);
    underscores(out->key + 10);
    out->units = src.units;
    out->n = src.n;
    memcpy(out->part, src.part, sizeof out->part);
    return true;
}

/* A weight as each layout present in the set names it: [layout][alt], key "" for none. */
typedef struct weight_names {
    name_in in[LAYOUT_COUNT][2];
} weight_names;

static void names_of(const df_lora_set *set, const char *component, const char *name,
                     weight_names *w)
{
    for (int lay = 0; lay < LAYOUT_COUNT; lay++) {
        bool present = false;
        for (int f = 0; f < set->n_files; f++)
            present |= set->files[f].lay == (layout)lay;
        for (int alt = 0; alt < 2; alt++)
            if (!present || !name_for(set, (layout)lay, component, name, alt, &w->in[lay][alt]))
                w->in[lay][alt].key[0] = '\0';
    }
}

/* How target t updates the weight named `w`; NULL when it does not. */
static const name_in *match(const df_lora_set *set, const target *t, const weight_names *w)
{
    layout lay = set->files[t->file].lay;
    for (int alt = 0; alt < 2 && !t->skipped; alt++) {
        const name_in *how = &w->in[lay][alt];
        if (!how->key[0])
            continue;
        if (strcmp(how->key, t->key) == 0)
            return how;
        /* kohya's CLIP names may start "lora_te_" instead of "lora_te1_" */
        if (lay == LAYOUT_KOHYA && starts(t->key, "lora_te_") && starts(how->key, "lora_te1_") &&
            strcmp(how->key + 9, t->key + 8) == 0)
            return how;
    }
    return NULL;
}

bool df_lora_touches(const df_lora_set *set, const char *component, const char *name)
{
    if (!set || set->n == 0)
        return false;
    weight_names w;
    names_of(set, component, name, &w);
    for (int i = 0; i < set->n; i++)
        if (match(set, &set->t[i], &w))
            return true;
    return false;
}

/* DF_E_FORMAT unless t's A and B (B cut as `how` says) fit a weight [rows, cols]. */
static df_status check_fits(const df_lora_set *set, const target *t, const name_in *how,
                            int64_t rows, int64_t cols, const char *component, const char *name)
{
    const adapter *ad = &set->files[t->file];
    int64_t b_rows = t->b.shape[0], unit = b_rows / how->units, got = 0;
    for (int p = 0; p < how->n; p++)
        got += (int64_t)(how->part[p][1] - how->part[p][0]) * unit;
    if (t->a.shape[1] != cols || b_rows % how->units || got != rows)
        return df_errorf(DF_E_FORMAT,
                         "%s: module '%s': A [%lld, %lld] and B [%lld, %lld] do "
                         "not fit %s weight '%s' [%lld, %lld]%s",
                         ad->path, t->key, (long long)t->a.shape[0], (long long)t->a.shape[1],
                         (long long)t->b.shape[0], (long long)t->b.shape[1], component, name,
                         (long long)rows, (long long)cols,
                         how->units > 1 ? " (B's rows are split as the fused weight's)" : "");
    return DF_OK;
}

/* t's A [r, cols] and B [b_rows, r] in f32, or an error naming the file. */
static df_status read_ab(const df_lora_set *set, const target *t, float **a_out, float **b_out)
{
    const adapter *ad = &set->files[t->file];
    int64_t r = t->a.shape[0], cols = t->a.shape[1], b_rows = t->b.shape[0];
    float *a = df_malloc((size_t)(r * cols) * sizeof *a);
    float *b = df_malloc((size_t)(b_rows * r) * sizeof *b);
    df_status s = a && b ? DF_OK : df_errorf(DF_E_OOM, "%s: out of memory", ad->path);
    if (s == DF_OK)
        s = df_convert(t->a.data, t->a.dtype, a, DF_DTYPE_F32, r * cols);
    if (s == DF_OK)
        s = df_convert(t->b.data, t->b.dtype, b, DF_DTYPE_F32, b_rows * r);
    if (s != DF_OK) {
        df_free(a);
        df_free(b);
        return s;
    }
    *a_out = a;
    *b_out = b;
    return DF_OK;
}

/* The row of B that gives row `row` of the weight (B's rows cut as `how` says). */
static int64_t b_row(const target *t, const name_in *how, int64_t row)
{
    int64_t unit = t->b.shape[0] / how->units;
    for (int p = 0; p < how->n; p++) {
        int64_t len = (int64_t)(how->part[p][1] - how->part[p][0]) * unit;
        if (row < len)
            return how->part[p][0] * unit + row;
        row -= len;
    }
    return -1; /* not reached: check_fits counted the rows */
}

/* Adds s B[rows] A to w [rows, cols]. */
static df_status add_delta(const df_lora_set *set, const target *t, const name_in *how, float *w,
                           int64_t rows, int64_t cols, int threads, const char *component,
                           const char *name)
{
    DF_TRY(check_fits(set, t, how, rows, cols, component, name));
    float *a, *b;
    DF_TRY(read_ab(set, t, &a, &b));
    int64_t r = t->a.shape[0];
    float scale = t->scale;
    /* rows are independent: split over the threads; each row is r axpy's of length cols */
#pragma omp parallel for num_threads(threads > 1 ? threads : 1) schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        float *restrict wr = w + row * cols;
        const float *br = b + b_row(t, how, row) * r;
        for (int64_t k = 0; k < r; k++) {
            float c = scale * br[k];
            const float *restrict ak = a + k * cols;
#pragma omp simd
            for (int64_t j = 0; j < cols; j++)
                wr[j] += c * ak[j];
        }
    }
    df_free(a);
    df_free(b);
    return DF_OK;
}

df_status df_lora_factors(df_lora_set *set, const char *component, const char *name, int64_t rows,
                          int64_t cols, float **down, float **up, int64_t *r)
{
    *down = *up = NULL;
    *r = 0;
    int64_t total = 0;
    weight_names wn;
    names_of(set, component, name, &wn);
    for (int i = 0; i < set->n; i++) {
        const name_in *how = match(set, &set->t[i], &wn);
        if (!how)
            continue;
        DF_TRY(check_fits(set, &set->t[i], how, rows, cols, component, name));
        total += set->t[i].a.shape[0];
    }
    if (total == 0)
        return DF_OK;
    float *d = df_calloc((size_t)(total * cols), sizeof *d);
    float *u = df_calloc((size_t)(rows * total), sizeof *u);
    if (!d || !u) {
        df_free(d);
        df_free(u);
        return df_errorf(DF_E_OOM, "%s: out of memory for the LoRA of '%s'", component, name);
    }
    int64_t off = 0;
    for (int i = 0; i < set->n; i++) {
        target *t = &set->t[i];
        const name_in *how = match(set, t, &wn);
        if (!how)
            continue;
        float *a, *b;
        df_status s = read_ab(set, t, &a, &b);
        if (s != DF_OK) {
            df_free(d);
            df_free(u);
            return s;
        }
        int64_t rk = t->a.shape[0];
        for (int64_t k = 0; k < rk * cols; k++)
            d[off * cols + k] = t->scale * a[k];
        for (int64_t row = 0; row < rows; row++)
            for (int64_t k = 0; k < rk; k++)
                u[row * total + off + k] = b[b_row(t, how, row) * rk + k];
        df_free(a);
        df_free(b);
        t->used = true;
        off += rk;
    }
    *down = d;
    *up = u;
    *r = total;
    return DF_OK;
}

df_status df_lora_merge(df_lora_set *set, const char *component, const char *name, float *w,
                        int64_t rows, int64_t cols, int threads)
{
    df_status s = DF_OK;
    weight_names wn;
    names_of(set, component, name, &wn);
    for (int i = 0; s == DF_OK && i < set->n; i++) {
        const name_in *how = match(set, &set->t[i], &wn);
        if (!how)
            continue;
        s = add_delta(set, &set->t[i], how, w, rows, cols, threads, component, name);
        set->t[i].used = true;
    }
    return s;
}

df_status df_lora_check_used(const df_lora_set *set, const char *component)
{
    for (int i = 0; set && i < set->n; i++) {
        const target *t = &set->t[i];
        const adapter *ad = &set->files[t->file];
        if (t->used)
            continue;
        if (component) { /* only this component's targets */
            bool text = starts(t->key, "lora_te");
            bool mine = ad->lay == LAYOUT_PEFT
                            ? starts(t->key, component) && t->key[strlen(component)] == '.'
                            : strcmp(component, text ? "text_encoder" : "transformer") == 0;
            if (!mine)
                continue;
        }
        return df_errorf(DF_E_FORMAT,
                         "%s: LoRA module '%s' (%s layout) updates no weight of "
                         "the model%s%s: the model has no such linear layer",
                         ad->path, t->key, layout_names[ad->lay], component ? "'s " : "",
                         component ? component : "");
    }
    return DF_OK;
}

static bool looks_like_lora(const char *path, bool *found)
{
    df_safetensors *st;
    if (df_safetensors_open(path, &st) != DF_OK)
        return false;
    int64_t n = df_safetensors_count(st);
    for (int64_t i = 0; !*found && i < n; i++) {
        df_tensor_info info;
        *found = df_safetensors_at(st, i, &info) == DF_OK &&
                 (strstr(info.name, ".lora_A.") || strstr(info.name, ".lora_down.") ||
                  (strstr(info.name, ".processor.") && strstr(info.name, "_lora")));
    }
    df_safetensors_free(st);
    return true;
}

df_status df_lora_describe_file(const char *path, char *buf, size_t cap, bool *found)
{
    *found = false;
    if (cap)
        buf[0] = '\0';
    if (looks_like_lora(path, found) && !*found)
        return DF_OK;
    df_lora_set *set;
    DF_TRY(df_lora_set_load(&(df_lora_spec){.path = path, .scale = 1}, 1, NULL, &set));
    int n_tr = 0, n_te = 0;
    int64_t rmin = INT64_MAX, rmax = 0;
    for (int i = 0; i < set->n; i++) {
        const char *k = set->t[i].key;
        bool te = starts(k, "text_encoder") || starts(k, "lora_te");
        n_te += te;
        n_tr += !te;
        rmin = set->t[i].a.shape[0] < rmin ? set->t[i].a.shape[0] : rmin;
        rmax = set->t[i].a.shape[0] > rmax ? set->t[i].a.shape[0] : rmax;
    }
    char ranks[48];
    if (rmin == rmax)
        snprintf(ranks, sizeof ranks, "%lld", (long long)rmin);
    else
        snprintf(ranks, sizeof ranks, "%lld..%lld", (long long)rmin, (long long)rmax);
    snprintf(buf, cap,
             "LoRA adapter, %s layout: %d transformer modules, %d text-encoder "
             "modules, rank %s",
             layout_names[set->files[0].lay], n_tr, n_te, ranks);
    df_lora_set_free(set);
    return DF_OK;
}
