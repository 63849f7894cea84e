/*
 * Pipeline loading and the parts every pipeline class shares: picking the class from
 * model_index.json, creating the context the components run in, the progress bar and the
 * output's lifetime.
 *
 * Tensor parallelism (df_load_opts.tp): the communicator is set up before the context, bound
 * to it (so the models load sharded), and after loading every rank agrees on the result: a
 * rank that failed to load stops all of them, and rank 0 holds the failing rank's message.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <diffuse/cpu.h>
#include <diffuse/dist.h>
#include <diffuse/gguf.h>
#include <diffuse/layout.h>
#include <diffuse/rng.h>
#include <diffuse/weights.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/status.h"
#include "sched/flow_match_euler.h"
#include "io/path.h"
#include "models/checkpoint.h"
#include "models/loader.h"
#include "models/shipped.h"
#include "pipelines/inpaint.h"
#include "models/lora.h"
#include "pipelines/pipeline.h"
#include "runtime/runtime.h"

#define CLIP_TOKENIZER {"CLIPTokenizer", "CLIPTokenizerFast"}
#define T5_TOKENIZER {"T5Tokenizer", "T5TokenizerFast"}
#define SCHEDULER {"scheduler", {"FlowMatchEulerDiscreteScheduler"}}
/* FluxPipeline's components, which its image-input classes share. */
#define FLUX_COMPONENTS                                                                    \
    {{"transformer", {"FluxTransformer2DModel"}},                                          \
     {"vae", {"AutoencoderKL"}},                                                           \
     {"text_encoder", {"CLIPTextModel"}},                                                  \
     {"text_encoder_2", {"T5EncoderModel"}},                                               \
     {"tokenizer", CLIP_TOKENIZER},                                                        \
     {"tokenizer_2", T5_TOKENIZER},                                                        \
     SCHEDULER}
/* StableDiffusion3Pipeline's components, which its image-input classes share. */
#define SD3_COMPONENTS                                                                     \
    {{"transformer", {"SD3Transformer2DModel"}},                                           \
     {"vae", {"AutoencoderKL"}},                                                           \
     {"text_encoder", {"CLIPTextModelWithProjection"}},                                    \
     {"text_encoder_2", {"CLIPTextModelWithProjection"}},                                  \
     {"text_encoder_3", {"T5EncoderModel"}},                                               \
     {"tokenizer", CLIP_TOKENIZER},                                                        \
     {"tokenizer_2", CLIP_TOKENIZER},                                                      \
     {"tokenizer_3", T5_TOKENIZER},                                                        \
     SCHEDULER}

/* Tokenizers are read from their files (df_tokenizer_load decides the kind), so each slot
 * names the classes transformers 4.x and 5.x save for that tokenizer: 5.x writes the
 * generic TokenizersBackend where 4.x wrote PreTrainedTokenizerFast. */
static const df_pipeline_table tables[] = {
    {&df_flux_pipeline_class, FLUX_COMPONENTS},
    {&df_flux_img2img_pipeline_class, FLUX_COMPONENTS},
    {&df_flux_inpaint_pipeline_class, FLUX_COMPONENTS},
    {&df_sd3_pipeline_class, SD3_COMPONENTS},
    {&df_sd3_img2img_pipeline_class, SD3_COMPONENTS},
    {&df_sd3_inpaint_pipeline_class, SD3_COMPONENTS},
    {&df_flux2_pipeline_class,
     {{"transformer", {"Flux2Transformer2DModel"}},
      {"vae", {"AutoencoderKLFlux2"}},
      {"text_encoder", {"Mistral3ForConditionalGeneration"}},
      {"tokenizer", {"PixtralProcessor", "LlamaTokenizerFast", "LlamaTokenizer",
                     "PreTrainedTokenizerFast", "TokenizersBackend"}},
      SCHEDULER}},
    {&df_flux2_klein_pipeline_class,
     {{"transformer", {"Flux2Transformer2DModel"}},
      {"vae", {"AutoencoderKLFlux2"}},
      {"text_encoder", {"Qwen3ForCausalLM"}},
      {"tokenizer", {"Qwen2Tokenizer", "Qwen2TokenizerFast", "PreTrainedTokenizerFast",
                     "TokenizersBackend"}},
      SCHEDULER}},
    {&df_flux_kontext_pipeline_class, FLUX_COMPONENTS}, /* kontext.c */
};

const df_pipeline_table *df_pipeline_tables(int *n)
{
    *n = (int)(sizeof tables / sizeof tables[0]);
    return tables;
}

/* "A, B or C" of a NULL-terminated list, into buf. */
static const char *join_names(const char *const *names, int count, char *buf, size_t cap)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < count && names[i] && used < cap; i++)
        used += (size_t)snprintf(buf + used, cap - used, "%s%s",
                                 i == 0 ? "" : (i + 1 < count && names[i + 1]) ? ", " : " or ",
                                 names[i]);
    return buf;
}

/* Every component of the table that the index names must be one of its classes. */
static df_status check_components(const df_pipeline *p, const df_pipeline_table *t,
                                  const df_model_index *idx)
{
    for (const df_component_rule *r = t->components;
         r < t->components + DF_PIPELINE_MAX_COMPONENTS && r->name; r++) {
        const df_component *c = df_model_index_find(idx, r->name);
        if (!c || !c->cls)
            continue;
        bool known = false;
        for (int i = 0; i < DF_COMPONENT_MAX_CLASSES && r->classes[i] && !known; i++)
            known = strcmp(c->cls, r->classes[i]) == 0;
        if (!known) {
            char list[512];
            return df_errorf(DF_E_UNSUPPORTED, "%s/model_index.json: component '%s' is a "
                             "%.96s; %s supports %s", p->dir, r->name, c->cls, t->kind->name,
                             join_names(r->classes, DF_COMPONENT_MAX_CLASSES, list,
                                        sizeof list));
        }
    }
    return DF_OK;
}

bool df_pipeline_has_component(const df_model_index *idx, const char *name)
{
    const df_component *c = df_model_index_find(idx, name);
    return c && c->cls;
}

df_status df_pipeline_component_dir(const df_pipeline *p, const df_model_index *idx,
                                    const char *name, char *buf, size_t cap)
{
    if (!df_pipeline_has_component(idx, name))
        return df_errorf(DF_E_FORMAT, "%s/model_index.json: the pipeline needs component "
                         "'%s', which is missing or null", p->dir, name);
    bool tokenizer = strncmp(name, "tokenizer", 9) == 0;
    return df_layout_component_dir(tokenizer && p->tokenizer_dir[0] ? p->tokenizer_dir : p->dir,
                                   name, buf, cap);
}

/* Whether `file` is a GGUF file that carries its own tokenizer (llama.cpp's
 * tokenizer.ggml.*, as city96's and llama.cpp's T5 files do). */
static bool gguf_carries_tokenizer(const char *file)
{
    if (!file || !df_str_ends_with(file, ".gguf"))
        return false;
    df_gguf *g = NULL;
    bool carries = df_gguf_open(file, &g) == DF_OK &&
                   df_gguf_kv_find(g, "tokenizer.ggml.model") >= 0;
    df_gguf_free(g);
    return carries;
}

df_status df_pipeline_load_t5_tokenizer(const df_pipeline *p, const df_model_index *idx,
                                        const char *name, const char *t5_file,
                                        df_tokenizer **out)
{
    char dir[DF_PATH_MAX];
    df_status s = df_pipeline_component_dir(p, idx, name, dir, sizeof dir);
    bool absent = s != DF_OK; /* no such component: the folder cannot hold it */
    if (s == DF_OK && (s = df_tokenizer_load(dir, out)) != DF_OK) {
        absent = s == DF_E_IO; /* no tokenizer files (a broken one is reported as it is) */
        s = df_error_context(s, "%s", dir);
    }
    if (s == DF_OK || !absent || !t5_file)
        return s;
    char why[512];
    snprintf(why, sizeof why, "%s", df_error_message());
    if (!gguf_carries_tokenizer(t5_file))
        return df_errorf(s, "%s", why);
    s = df_tokenizer_load_gguf(t5_file, out);
    if (s != DF_OK)
        return df_error_context(s, "%s; the T5 file's own tokenizer (tokenizer.ggml.*)", why);
    df_logf(1, "%s: the T5 file's tokenizer (llama.cpp's tokenizer.ggml.*) from %s; the folder "
            "has none", name, t5_file);
    return DF_OK;
}

bool df_pipeline_lead(const df_pipeline *p)
{
    return df_comm_rank(p->comm) == 0;
}

bool df_pipeline_tp(const df_pipeline *p)
{
    return df_comm_size(p->comm) > 1;
}

df_status df_pipeline_tp_check(df_pipeline *p, df_status s)
{
    if (s != DF_OK && df_pipeline_tp(p))
        df_comm_abort(p->comm);
    return s;
}

df_status df_pipeline_tp_agree(df_pipeline *p, df_status s)
{
    if (!df_pipeline_tp(p))
        return s;
    df_status w = df_sync(p->ctx);
    return df_comm_agree(p->comm, s != DF_OK ? s : w);
}

df_status df_pipeline_tp_share(df_pipeline *p, void *buf, size_t bytes)
{
    if (!df_pipeline_tp(p))
        return DF_OK;
    DF_TRY(df_pipeline_tp_check(p, df_sync(p->ctx)));
    return df_comm_broadcast(p->comm, buf, bytes, 0);
}

df_status df_image_tokens_share(df_pipeline *p, df_image_tokens *t, int id_width,
                                const char *what)
{
    int64_t size[2] = {t->n_tokens, t->channels};
    DF_TRY(df_pipeline_tp_share(p, size, sizeof size));
    df_status s = DF_OK;
    if (!df_pipeline_lead(p)) {
        t->n_tokens = size[0], t->channels = size[1];
        t->tokens = df_malloc((size_t)(size[0] * size[1]) * sizeof *t->tokens);
        t->ids = df_malloc((size_t)(size[0] * id_width) * sizeof *t->ids);
        s = t->tokens && t->ids ? DF_OK : df_errorf(DF_E_OOM, "out of memory for %s", what);
    }
    s = df_pipeline_tp_agree(p, s);
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, t->tokens, (size_t)(size[0] * size[1]) * sizeof *t->tokens);
    if (s == DF_OK)
        s = df_pipeline_tp_share(p, t->ids, (size_t)(size[0] * id_width) * sizeof *t->ids);
    return s;
}

void df_image_tokens_deinit(df_image_tokens *t)
{
    df_free(t->tokens);
    df_free(t->ids);
    memset(t, 0, sizeof *t);
}

/* The tensor-parallel ranks the options ask for, if any. */
static df_status tp_setup(df_pipeline *p)
{
    int tp = p->opts.tp;
    if (tp < 0)
        return df_errorf(DF_E_ARG, "tp must be at least 1, not %d", tp);
    if (tp <= 1 && !p->opts.comm)
        return DF_OK;
    if (p->opts.comm) {
        p->comm = p->opts.comm;
    } else {
        DF_TRY(df_dist_init(NULL, NULL, &p->comm));
        p->owns_comm = true;
    }
    int ranks = df_comm_size(p->comm);
    if (tp != 0 && tp != ranks)
        return df_errorf(DF_E_ARG, "tensor parallelism over %d ranks was asked for, but %d "
                         "ranks were launched (mpirun -np %d)", tp, ranks, tp);
    return DF_OK;
}

/* Reads model_index.json, creates the context and loads the class's components. */
/* Appends to an out-of-memory message what would use less memory. */
static void suggest_less_memory(df_offload level)
{
    const char *hint = level == DF_OFFLOAD_NONE
                           ? "model offload (--offload model) keeps only the running component "
                             "resident"
                       : level == DF_OFFLOAD_MODEL
                           ? "sequential offload (--offload sequential) keeps only two "
                             "transformer blocks resident"
                           : "a smaller image, --vae-tiling, or bf16 compute (--dtype bf16) "
                             "needs less";
    char msg[1024];
    snprintf(msg, sizeof msg, "%s; %s", df_error_message(), hint);
    df_errorf(DF_E_OOM, "%s", msg);
}

df_dtype df_pipeline_checkpoint_dtype(const char *pipeline_dir)
{
    char dir[DF_PATH_MAX];
    df_weights *w = NULL;
    if (df_layout_component_dir(pipeline_dir, "transformer", dir, sizeof dir) != DF_OK ||
        df_weights_open(dir, &w) != DF_OK)
        return DF_DTYPE_COUNT;
    uint64_t bytes[DF_DTYPE_COUNT + 1] = {0};
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        if (df_weights_at(w, i, &info) == DF_OK && info.dtype <= DF_DTYPE_COUNT)
            bytes[info.dtype] += info.nbytes;
    }
    df_weights_free(w);
    df_dtype most = DF_DTYPE_COUNT;
    for (int t = 0; t < DF_DTYPE_COUNT; t++)
        if (bytes[t] > 0 && (most == DF_DTYPE_COUNT || bytes[t] > bytes[most]))
            most = (df_dtype)t;
    return most;
}

/*
 * --dtype auto: the device's measured rates and the checkpoint's dtype decide (df_dtype_auto).
 * Under tensor parallelism every rank must compute in the same dtype, and ranks measuring
 * at once would slow each other down: rank 0 asks, and sends its choice and reason to the
 * others. Every rank calls this (it holds collectives), whatever `s` its load has so far.
 */
static df_status choose_auto_dtype(df_pipeline *p, df_status s)
{
    if (df_pipeline_tp(p))
        s = df_comm_agree(p->comm, s);
    if (s != DF_OK)
        return s;
    struct {
        int32_t dtype;
        char why[sizeof p->dtype_why];
    } choice = {DF_DTYPE_F32, ""};
    if (df_pipeline_lead(p)) {
        df_matmul_rates r;
        df_status asked = df_ctx_matmul_rates(p->ctx, &r);
        bool known = asked == DF_OK;
        if (asked == DF_E_ARG)
            s = asked; /* a malformed DIFFUSE_MATMUL_RATES is the user's to fix */
        /* the checkpoint matters only where bf16 could be chosen: no file read elsewhere */
        bool faster = known && r.bf16_gflops >= 1.25 * r.f32_gflops;
        df_dtype stored = faster ? df_pipeline_checkpoint_dtype(p->dir) : DF_DTYPE_COUNT;
        choice.dtype = (int32_t)df_dtype_auto(known ? &r : NULL, stored, choice.why,
                                              sizeof choice.why);
    }
    if (df_pipeline_tp(p)) {
        s = df_comm_agree(p->comm, s);
        if (s == DF_OK)
            s = df_comm_broadcast(p->comm, &choice, sizeof choice, 0);
    }
    if (s != DF_OK)
        return s;
    choice.why[sizeof choice.why - 1] = '\0';
    p->compute = (df_dtype)choice.dtype;
    snprintf(p->dtype_why, sizeof p->dtype_why, "%s", choice.why);
    return df_ctx_set_compute_dtype(p->ctx, p->compute);
}

/* LoRA adapters (opts.loras): read before the components load, merged while they bind
 * (ctx->lora, read by models/loader.c), checked and dropped after. */
static df_status open_loras(df_pipeline *p)
{
    if (df_comm_size(p->comm) > 1)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: LoRA adapters (%s) with tensor parallelism "
                         "are not supported",
                         p->dir, p->opts.loras[0].path);
    return df_lora_set_load(p->opts.loras, p->opts.n_loras, p->cls->name, &p->ctx->lora);
}

static df_status close_loras(df_pipeline *p, df_status s)
{
    if (!p->ctx)
        return s;
    if (s == DF_OK)
        s = df_lora_check_used(p->ctx->lora, NULL);
    df_lora_set_free(p->ctx->lora);
    p->ctx->lora = NULL;
    p->opts.loras = NULL; /* borrowed for the load only */
    p->opts.n_loras = 0;
    return s;
}

static df_status load_parts(df_pipeline *p)
{
    df_model_index *idx = NULL;
    df_status s = df_model_index_load(p->dir, &idx); /* no early return: see choose_auto_dtype */
    const char *cls = df_model_index_class(idx);
    const df_pipeline_table *table = NULL;
    const char *names[sizeof tables / sizeof tables[0] + 1] = {NULL};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        names[i] = tables[i].kind->name;
        if (cls && strcmp(cls, names[i]) == 0)
            table = &tables[i];
    }
    p->cls = table ? table->kind : NULL;
    char list[512];
    if (s == DF_OK && !p->cls)
        s = df_errorf(DF_E_UNSUPPORTED, "%s/model_index.json: pipeline class '%.96s' is not "
                      "supported (supported: %s)", p->dir, cls ? cls : "(none)",
                      join_names(names, (int)(sizeof tables / sizeof tables[0]), list,
                                 sizeof list));
    else if (s == DF_OK)
        s = check_components(p, table, idx);
    bool sd3 = p->cls == &df_sd3_pipeline_class || p->cls == &df_sd3_img2img_pipeline_class ||
               p->cls == &df_sd3_inpaint_pipeline_class;
    bool flux2 = p->cls && strstr(p->cls->name, "Flux2") != NULL;
    if (s == DF_OK && p->opts.transformer_file && p->cls != &df_flux_pipeline_class &&
        p->cls != &df_flux_kontext_pipeline_class && !sd3 && !flux2)
        s = df_errorf(DF_E_UNSUPPORTED, "%s: a single-file transformer (%s) is read for "
                      "FLUX.1 (FluxPipeline, FluxKontextPipeline), SD3 and FLUX.2 only, not %s",
                      p->dir, p->opts.transformer_file, p->cls->name);
    if (s == DF_OK && p->opts.text_encoder_2_file && flux2)
        s = df_errorf(DF_E_ARG, "%s: --text-encoder-2 (%s): %s has one text encoder "
                      "(--text-encoder FILE)", p->dir, p->opts.text_encoder_2_file,
                      p->cls->name);
    if (s == DF_OK && p->opts.text_encoder_3_file && !sd3)
        s = df_errorf(DF_E_UNSUPPORTED, "%s: --text-encoder-3 (%s) is SD3's T5; %s has no "
                      "text_encoder_3", p->dir, p->opts.text_encoder_3_file, p->cls->name);
    if (s == DF_OK && p->opts.no_text_encoder_3 && !sd3)
        s = df_errorf(DF_E_UNSUPPORTED, "%s: --text-encoder-3 none leaves out SD3's T5; %s "
                      "has no text_encoder_3", p->dir, p->cls->name);
    if (s == DF_OK && df_comm_size(p->comm) > 1 &&
        (p->cls == &df_sd3_pipeline_class || p->cls == &df_sd3_img2img_pipeline_class ||
         p->cls == &df_sd3_inpaint_pipeline_class))
        s = df_errorf(DF_E_UNSUPPORTED, "%s/model_index.json: tensor parallelism is "
                      "implemented for FluxPipeline, Flux2Pipeline and Flux2KleinPipeline, "
                      "not %s", p->dir, p->cls->name);
    p->compute = p->opts.auto_dtype ? DF_DTYPE_F32 : p->opts.dtype;
    snprintf(p->dtype_why, sizeof p->dtype_why, "asked for");
    if (s == DF_OK)
        s = df_ctx_create(&(df_ctx_opts){.device = p->opts.device,
                                         .threads = p->opts.threads,
                                         .compute = p->compute,
                                         .mode = p->opts.mode,
                                         .int8_group = p->opts.int8_group,
                                         .int8_path = p->opts.int8_path},
                          &p->ctx);
    p->opts.int8_path = NULL; /* borrowed: the device read it as it opened */
    if (p->opts.auto_dtype)
        s = choose_auto_dtype(p, s);
    if (s == DF_OK && p->opts.n_loras > 0)
        s = open_loras(p);
    if (s == DF_OK) {
        df_ctx_set_comm(p->ctx, p->comm);
        p->ctx->int8_keep = p->opts.int8_keep; /* read as the weights are bound */
        p->impl = df_calloc(1, p->cls->ops->size);
        s = p->impl ? p->cls->ops->load(p, idx) : df_errorf(DF_E_OOM, "out of memory");
    }
    s = close_loras(p, s);
    if (s == DF_E_OOM)
        suggest_less_memory(p->opts.offload);
    df_model_index_free(idx);
    return s;
}

/* Whether `dir` is a diffusers folder (it has model_index.json), not only tokenizers. */
static bool has_model_index(const char *dir)
{
    char path[DF_PATH_MAX];
    int n = snprintf(path, sizeof path, "%s/model_index.json", dir);
    return n > 0 && (size_t)n < sizeof path && df_path_is_file(path);
}

/* Whether the weights of `component` come from the checkpoint (`c`) or an option. SD3's
 * second encoder is CLIP-G and its T5 the third; FLUX.1's T5 the second. */
static bool component_given(const df_load_opts *o, const df_checkpoint_parts *c,
                            const char *component)
{
    bool sd3 = strncmp(c->model, "SD3", 3) == 0 || c->clip_g;
    if (strcmp(component, "transformer") == 0)
        return c->transformer || o->transformer_file;
    if (strcmp(component, "vae") == 0)
        return c->vae || o->vae_file;
    if (strcmp(component, "text_encoder") == 0)
        return c->clip_l || o->text_encoder_file;
    if (strcmp(component, "text_encoder_2") == 0)
        return (sd3 ? c->clip_g : c->t5) || o->text_encoder_2_file;
    if (strcmp(component, "text_encoder_3") == 0)
        return c->t5 || o->text_encoder_3_file;
    return true; /* the scheduler: its config is all it needs */
}

/* Whether the load leaves `component` out: SD3's T5 and its tokenizer with
 * no_text_encoder_3. */
static bool component_left_out(const df_load_opts *o, const char *component)
{
    return o->no_text_encoder_3 &&
           (strcmp(component, "text_encoder_3") == 0 || strcmp(component, "tokenizer_3") == 0);
}

static const char *component_option(const char *component)
{
    return strcmp(component, "transformer") == 0      ? "--transformer FILE"
           : strcmp(component, "vae") == 0            ? "--vae FILE"
           : strcmp(component, "text_encoder") == 0   ? "--text-encoder FILE"
           : strcmp(component, "text_encoder_2") == 0 ? "--text-encoder-2 FILE"
                                                      : "--text-encoder-3 FILE, or none "
                                                        "to run without T5";
}

/* Whether the T5 tokenizer `tokenizer` (tokenizer_2 of FLUX.1, tokenizer_3 of SD3) comes
 * with the T5's weights: their file, an option's or the checkpoint `path` itself, is a GGUF
 * file that carries one (df_pipeline_load_t5_tokenizer reads it there). */
static bool t5_tokenizer_in_weights(const df_load_opts *o, const df_checkpoint_parts *c,
                                    const char *path, const char *tokenizer)
{
    bool sd3 = strncmp(c->model, "SD3", 3) == 0 || c->clip_g;
    if (strcmp(tokenizer, sd3 ? "tokenizer_3" : "tokenizer_2") != 0)
        return false;
    const char *file = sd3 ? o->text_encoder_3_file : o->text_encoder_2_file;
    return gguf_carries_tokenizer(file ? file : c->t5 ? path : NULL);
}

/* What the shipped set `idx` still needs for this load of the checkpoint `path`, appended
 * to `need` (cap bytes): each tokenizer folder config_dir lacks (all of them without one,
 * but for a T5 tokenizer its GGUF weights carry), then each component whose weights
 * neither the file nor an option gives. */
static void shipped_needs(const df_pipeline *p, const char *path, const df_checkpoint_parts *c,
                          const df_model_index *idx, char *need, size_t cap)
{
    const char *cfg = p->opts.config_dir;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < df_model_index_count(idx); i++) {
            const df_component *comp = df_model_index_at(idx, i);
            bool tokenizer = strncmp(comp->name, "tokenizer", 9) == 0;
            char dir[DF_PATH_MAX];
            size_t n = strlen(need);
            if (!comp->cls || tokenizer != (pass == 0) || component_left_out(&p->opts, comp->name))
                continue;
            if (tokenizer && (!cfg || df_layout_component_dir(cfg, comp->name, dir,
                                                              sizeof dir) != DF_OK) &&
                !t5_tokenizer_in_weights(&p->opts, c, path, comp->name))
                snprintf(need + n, cap - n, "%s%s/ (in --config DIR%s%s)", n ? ", " : "",
                         comp->name, cfg ? ": not in " : "", cfg ? cfg : "");
            else if (!tokenizer && !component_given(&p->opts, c, comp->name))
                snprintf(need + n, cap - n, "%s%s (%s)", n ? ", " : "", comp->name,
                         component_option(comp->name));
        }
}

/*
 * Where the configs of the checkpoint file `path` come from: config_dir when it is a
 * diffusers folder (its configs win); else the shipped set for the recognised model and
 * size, written into a temporary folder, with the tokenizers from config_dir. What the set
 * still needs (tokenizer folders, weights the file lacks) is checked here, before any
 * weight is read, so that one message names all of it.
 */
static df_status choose_configs(df_pipeline *p, const char *path, const df_checkpoint_parts *c)
{
    const char *cfg = p->opts.config_dir;
    if (cfg && has_model_index(cfg)) {
        snprintf(p->dir, sizeof p->dir, "%s", cfg);
        return DF_OK;
    }
    if (!*c->shipped)
        return df_errorf(DF_E_ARG,
                         "%s is a single checkpoint file (%s), and diffuse ships no configs "
                         "for it: %s; give the model's diffusers folder (or one holding "
                         "model_index.json, each component's config.json and the tokenizer "
                         "folders) as config_dir (diffuse generate --config DIR)",
                         path, *c->model ? c->model : "no transformer", c->shipped_why);
    const df_shipped_config *set = df_shipped_find(c->shipped);
    df_json *index = NULL;
    size_t size = 0;
    const char *text = df_shipped_file(set, "model_index.json", &size);
    DF_TRY(df_json_parse_string(text, size, "model_index.json (shipped)", &index));
    df_model_index *idx = NULL;
    df_status s = df_model_index_from_json(index, &idx);
    char need[1024] = "";
    if (s == DF_OK)
        shipped_needs(p, path, c, idx, need, sizeof need);
    df_model_index_free(idx);
    df_json_free(index);
    bool tokenizers = strstr(need, "tokenizer") != NULL;
    if (s == DF_OK && need[0])
        s = df_errorf(DF_E_ARG,
                      "%s is %s: diffuse ships its configs, not its tokenizers or the weights "
                      "the file lacks; still needed: %s%s%s%s",
                      path, set->name, need, tokenizers ? ". The tokenizer folders are " : "",
                      tokenizers ? set->tokenizers : "",
                      tokenizers ? ", from a diffusers folder of the model or a folder "
                                   "holding only those, given as config_dir (diffuse "
                                   "generate --config DIR)"
                                 : "");
    if (s == DF_OK)
        s = df_shipped_write_temp(set, p->dir, sizeof p->dir);
    if (s != DF_OK)
        return s;
    p->shipped = set;
    snprintf(p->tokenizer_dir, sizeof p->tokenizer_dir, "%s", cfg ? cfg : "");
    df_logf(2, "config: shipped %s (written to %s); tokenizers from %s", set->name, p->dir,
            cfg ? cfg : "nowhere");
    return DF_OK;
}

/*
 * `path` is one checkpoint file (ComfyUI's all-in-one files): config_dir gives
 * model_index.json, the configs and the tokenizers, and each component the file holds is
 * read from it, unless it was given a file of its own. SD3's second CLIP is CLIP-G and its
 * T5 the third encoder; FLUX.1's T5 the second.
 */
static df_status use_checkpoint(df_pipeline *p, const char *path)
{
    df_checkpoint_parts parts;
    DF_TRY(df_checkpoint_recognise(path, &parts));
    if (!parts.transformer && !parts.vae && !parts.clip_l && !parts.clip_g && !parts.t5 &&
        !parts.qwen3 && !parts.mistral)
        return df_errorf(DF_E_FORMAT,
                         "%s: no component diffuse recognises (a FLUX.1 / SD3 / FLUX.2 "
                         "transformer in the original names, an LDM VAE, CLIP-L, CLIP-G, T5, "
                         "Qwen3 or Mistral)",
                         path);
    DF_TRY(choose_configs(p, path, &parts));
    snprintf(p->checkpoint, sizeof p->checkpoint, "%s", path);
    const char *f = p->checkpoint;
    bool sd3 = strncmp(parts.model, "SD3", 3) == 0 || parts.clip_g;
    df_load_opts *o = &p->opts;
    if (parts.transformer && !o->transformer_file)
        o->transformer_file = f;
    if (parts.vae && !o->vae_file)
        o->vae_file = f;
    if (parts.clip_l && !o->text_encoder_file)
        o->text_encoder_file = f;
    if (parts.clip_g && !o->text_encoder_2_file)
        o->text_encoder_2_file = f;
    if (parts.t5 && sd3 && !o->text_encoder_3_file && !o->no_text_encoder_3)
        o->text_encoder_3_file = f;
    if (parts.t5 && !sd3 && !o->text_encoder_2_file)
        o->text_encoder_2_file = f;
    if ((parts.qwen3 || parts.mistral) && !o->text_encoder_file) /* FLUX.2's one encoder */
        o->text_encoder_file = f;
    return DF_OK;
}

/* Whether a load's error is about a config or tokenizer file (which a checkpoint file does
 * not hold), rather than about weights: the file names, not the word "config", which a
 * folder's path may hold. */
static bool names_config_or_tokenizer(const char *message)
{
    return strstr(message, "config.json") || strstr(message, "model_index.json") ||
           strstr(message, "tokenizer");
}

df_status df_pipeline_load(const char *dir, const df_load_opts *opts, df_pipeline **out)
{
    *out = NULL;
    df_pipeline *p = df_calloc(1, sizeof *p);
    if (!p)
        return df_errorf(DF_E_OOM, "out of memory loading %s", dir);
    snprintf(p->dir, sizeof p->dir, "%s", dir);
    p->opts = opts ? *opts : (df_load_opts){.auto_dtype = true};
    if (p->opts.compile && p->opts.offload == DF_OFFLOAD_SEQUENTIAL) {
        /* Residency changes between blocks cannot be traced: compile the blocks instead, as
         * diffusers advises for offloaded models (load opts, compile). */
        p->opts.compile = false;
        p->opts.compile_blocks = true;
    }
    df_status s = tp_setup(p); /* first, so that a rank failing below still takes part: */
    if (s == DF_OK && p->opts.no_text_encoder_3 && p->opts.text_encoder_3_file)
        s = df_errorf(DF_E_ARG, "--text-encoder-3 none and --text-encoder-3 %s: SD3 runs "
                      "without T5 or with that file, not both", p->opts.text_encoder_3_file);
    if (s == DF_OK && df_path_is_file(dir))
        s = use_checkpoint(p, dir);
    if (s == DF_OK)
        s = load_parts(p);
    if (s != DF_OK && p->shipped) {
        char why[1024];
        snprintf(why, sizeof why, "%s", df_error_message());
        s = df_errorf(s, "%s (loading on the shipped %s configs, which describe the released "
                      "model: %s and the component files given must hold its weights)", why,
                      p->shipped->name, p->checkpoint);
    } else if (s != DF_OK && p->checkpoint[0] && names_config_or_tokenizer(df_error_message())) {
        char why[1024];
        snprintf(why, sizeof why, "%s", df_error_message());
        s = df_errorf(s, "%s (%s holds weights only: the configs and tokenizers come from the "
                      "folder given as config_dir / --config, a diffusers folder of the "
                      "model)", why, p->checkpoint);
    }
    if (p->comm)
        s = df_comm_agree(p->comm, s); /* all ranks loaded, or all stop */
    if (s != DF_OK) {
        df_pipeline_free(p);
        return s;
    }
    *out = p;
    return DF_OK;
}

/* The phases restart the context's resident-weight peak to measure their own, which leaves
 * the context counting only since the last phase; the run's peak is the largest phase's.
 * Raising the residency by the difference and lowering it again moves only the peak. */
static void restore_run_peak(df_pipeline *p)
{
    df_sync(p->ctx); /* no release still queued */
    df_stats st;
    df_ctx_stats(p->ctx, &st);
    int64_t up = p->run_peak - st.resident_weight_bytes;
    if (p->run_peak > st.peak_resident_weight_bytes && up > 0) {
        df_stats_add_weights(p->ctx, 0, up);
        df_stats_add_weights(p->ctx, 0, -up);
    }
}

df_status df_pipeline_run(df_pipeline *p, const df_gen_params *g, df_gen_output *out)
{
    memset(out, 0, sizeof *out);
    if (!g)
        return df_errorf(DF_E_ARG, "generate: no parameters");
    if (g->on_step && p->comm)
        return df_errorf(DF_E_UNSUPPORTED, "generate: on_step (cancellation) with tensor "
                                           "parallelism: every rank would have to agree");
    if (g->preview && p->comm)
        return df_errorf(DF_E_UNSUPPORTED, "generate: previews with tensor parallelism are "
                                           "not implemented");
    if (g->preview_every < 0)
        return df_errorf(DF_E_ARG, "generate: preview_every must be >= 0, not %d",
                         g->preview_every);
    p->run_peak = 0;
    p->phase_start = df_now();
    df_status s = DF_OK;
    if (g->on_step && !g->on_step(0, 0, 0.0, g->progress_user))
        s = df_errorf(DF_E_CANCELLED, "generate: cancelled before the first step");
    int int8_attention = p->ctx->int8_attention; /* the run's setting, for this run only */
    p->ctx->int8_attention = g->int8_attention;
    if (s == DF_OK)
        s = df_inpaint_check(p, g); /* a mask, on any class */
    if (s == DF_OK && g->mask && g->padding_mask_crop > 0)
        s = df_inpaint_run_cropped(p, g, out); /* the class's run on the crop */
    else if (s == DF_OK)
        s = p->cls->ops->run(p, g, out);
    p->ctx->int8_attention = int8_attention;
    restore_run_peak(p);
    if (s != DF_OK) {
        /* Resetting the context waits for its stream, which may report the stream's own
         * failure again: keep the run's message. */
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", df_error_message());
        df_gen_output_free(out);
        df_ctx_reset_error(p->ctx);
        df_errorf(s, "%s", msg);
    }
    if (s == DF_E_OOM)
        suggest_less_memory(p->opts.offload);
    return s;
}

int df_pipeline_list_weight_sets(const char *const *name, df_weight_set *const *all, int n,
                                 const char **names, df_weight_set **sets, int cap)
{
    int k = 0;
    for (int i = 0; i < n; i++)
        if (all[i] && k < cap)
            names[k] = name[i], sets[k++] = all[i];
    return k;
}

df_status df_pipeline_check_cache(const df_pipeline *p, const df_gen_params *g)
{
    if (!g->cache || g->cache->kind == DF_CACHE_NONE)
        return DF_OK;
    const char *name = g->cache->kind == DF_CACHE_FIRST_BLOCK ? "first-block" : "taylorseer";
    if (p->opts.compile)
        return df_errorf(DF_E_UNSUPPORTED, "--cache %s: the transformer is compiled whole "
                         "(--mode compile), so no step can leave blocks out; use --mode eager "
                         "or fuse, or --compile-blocks", name);
    if (df_pipeline_tp(p))
        return df_errorf(DF_E_UNSUPPORTED, "--cache %s with tensor parallelism is not "
                         "implemented", name);
    if (g->cache->kind == DF_CACHE_TAYLORSEER && p->opts.compile_blocks)
        return df_errorf(DF_E_UNSUPPORTED, "--cache taylorseer predicts attention inside the "
                         "blocks, which compiled blocks (--compile-blocks) trace once; use "
                         "first-block or leave the blocks uncompiled");
    return DF_OK;
}

void df_gen_output_free(df_gen_output *out)
{
    if (!out)
        return;
    for (int i = 0; out->images && i < out->count; i++)
        df_image_free(out->images[i]);
    df_free(out->images);
    df_free(out->image_f32);
    df_free(out->latents);
    memset(out, 0, sizeof *out);
}

df_dtype df_pipeline_compute_dtype(const df_pipeline *p, const char **why)
{
    if (why)
        *why = p->dtype_why;
    return p->compute;
}

const char *df_pipeline_class(const df_pipeline *p)
{
    return p->cls->name;
}

const char *df_pipeline_shipped_config(const df_pipeline *p)
{
    return p->shipped ? p->shipped->name : NULL;
}

bool df_pipeline_t5_off(const df_pipeline *p)
{
    return p->t5_off;
}

df_ctx *df_pipeline_ctx(df_pipeline *p)
{
    return p->ctx;
}

void df_pipeline_defaults(const df_pipeline *p, int *steps, float *guidance, int *max_seq,
                          int *size)
{
    if (steps)
        *steps = p->default_steps;
    if (guidance)
        *guidance = p->default_guidance;
    if (max_seq)
        *max_seq = p->default_max_seq;
    if (size)
        *size = p->default_size;
}

void df_pipeline_free(df_pipeline *p)
{
    if (!p)
        return;
    if (p->impl) {
        if (p->cls->ops->free)
            p->cls->ops->free(p->impl);
        df_pipeline_parts *parts = p->impl;
        df_vae_free(parts->vae);
        df_vae_encoder_free(parts->vae_enc);
        df_free(p->impl);
    }
    df_ctx_free(p->ctx);
    if (p->owns_comm)
        df_comm_free(p->comm);
    if (p->shipped)
        df_shipped_remove(p->shipped, p->dir);
    df_free(p);
}

void df_progress_bar(int step, int steps, double elapsed, void *user)
{
    (void)user;
    double per = step > 0 ? elapsed / step : 0;
    double eta = per * (steps - step);
    if (isatty(STDERR_FILENO)) {
        int width = 30, done = steps ? step * width / steps : width;
        fprintf(stderr, "\r[%.*s%*s] step %d/%d  %.2f s/step  ETA %.0f s ", done,
                "##############################", width - done, "", step, steps, per, eta);
        if (step == steps)
            fputc('\n', stderr);
    } else {
        fprintf(stderr, "step %d/%d  %.2f s/step  ETA %.0f s\n", step, steps, per, eta);
    }
    fflush(stderr);
}

df_status df_pipeline_step_done(const df_gen_params *g, int step, int steps, double elapsed)
{
    if (g->progress)
        g->progress(step, steps, elapsed, g->progress_user);
    if (g->on_step && !g->on_step(step, steps, elapsed, g->progress_user))
        return df_errorf(DF_E_CANCELLED, "generate: cancelled after step %d of %d", step, steps);
    return DF_OK;
}

bool df_pipeline_preview_due(const df_gen_params *g, int step, int steps)
{
    int every = g->preview_every > 0 ? g->preview_every : 1;
    return g->preview && step < steps && step % every == 0;
}

df_status df_pipeline_preview_latents(df_ctx *ctx, df_tensor *x, df_tensor *v, const float *x_host,
                                      const float *v_host, int64_t total, int64_t n, float sigma,
                                      float **out)
{
    *out = NULL;
    float *xs = df_malloc((size_t)total * sizeof *xs), *vs = df_malloc((size_t)total * sizeof *vs);
    df_status s = xs && vs ? DF_OK : df_errorf(DF_E_OOM, "out of memory for a preview");
    if (s == DF_OK && x)
        s = df_tensor_read(ctx, x, DF_DTYPE_F32, xs, (size_t)total * sizeof *xs);
    else if (s == DF_OK)
        memcpy(xs, x_host, (size_t)total * sizeof *xs);
    if (s == DF_OK && v)
        s = df_tensor_read(ctx, v, DF_DTYPE_F32, vs, (size_t)total * sizeof *vs);
    else if (s == DF_OK)
        memcpy(vs, v_host, (size_t)total * sizeof *vs);
    for (int64_t k = 0; s == DF_OK && k < n; k++)
        xs[k] -= sigma * vs[k];
    df_free(vs);
    if (s != DF_OK)
        df_free(xs);
    else
        *out = xs;
    return s;
}

bool df_pipeline_host_step(const df_gen_params *g)
{
    if (g->host_step)
        return g->host_step > 0;
    return df_scheduler_host_step();
}

void df_pipeline_note_phase(df_pipeline *p, df_gen_output *out, const char *phase)
{
    if (out->n_phases >= (int)(sizeof out->phases / sizeof out->phases[0]))
        return;
    df_sync(p->ctx); /* queued releases have happened */
    df_stats st;
    df_ctx_stats(p->ctx, &st);
    out->phases[out->n_phases].phase = phase;
    out->phases[out->n_phases].peak_resident_weight_bytes = st.peak_resident_weight_bytes;
    if (st.peak_resident_weight_bytes > p->run_peak)
        p->run_peak = st.peak_resident_weight_bytes;
    out->phases[out->n_phases].resident_weight_bytes = st.resident_weight_bytes;
    out->phases[out->n_phases].rss_bytes = st.rss_bytes;
    double now = df_now();
    out->phases[out->n_phases].seconds = now - p->phase_start;
    p->phase_start = now;
    out->n_phases++;
    df_stats_reset_resident_peak(p->ctx);
}

df_status df_pipeline_draw_noise(const df_gen_params *g, int B, int64_t n, float *out)
{
    if (g->n_seeds < 0 || (g->n_seeds > 0 && !g->seeds))
        return df_errorf(DF_E_ARG, "%d generator seeds given without a list", g->n_seeds);
    if (g->n_seeds > 1 && g->n_seeds != B)
        return df_errorf(DF_E_ARG, "a list of %d generators was given for a batch of %d "
                         "images (prompts x images per prompt); give one generator per image, "
                         "or one for the whole batch", g->n_seeds, B);
    df_rng rng;
    if (g->n_seeds <= 1) { /* one generator: the whole (B, ...) tensor in one draw */
        df_rng_init(&rng, g->n_seeds == 1 ? g->seeds[0] : g->seed);
        return df_rng_randn_f32(&rng, out, (int64_t)B * n);
    }
    for (int b = 0; b < B; b++) { /* a list: image b alone from generator b */
        df_rng_init(&rng, g->seeds[b]);
        DF_TRY(df_rng_randn_f32(&rng, out + (int64_t)b * n, n));
    }
    return DF_OK;
}

void df_pipeline_onload(const df_pipeline *p, df_weight_set *ws)
{
    if (ws && p->opts.offload != DF_OFFLOAD_NONE)
        df_ws_acquire(ws, NULL);
}

df_status df_pipeline_offload(const df_pipeline *p, df_weight_set *ws)
{
    return ws && p->opts.offload != DF_OFFLOAD_NONE ? df_ws_release(ws, NULL) : DF_OK;
}
