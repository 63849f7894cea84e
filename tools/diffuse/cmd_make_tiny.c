/*
 * diffuse make-tiny: writes a small pipeline folder with seeded random weights, in exactly
 * the layout diffusers' save_pretrained writes, so that the whole program runs without a
 * download (the demo, the tests, a user trying the tool).
 *
 * Everything is generated here: the configs, the weights (normal draws scaled by
 * 1/sqrt(fan_in), norms at 1, biases small), a CLIP byte-level BPE vocabulary (the 256
 * byte symbols, their end-of-word forms and a few merges) and a T5 SentencePiece model
 * (letters, digits, punctuation and a few words, written as the protobuf spiece.model).
 * The image such a model draws is structured noise: it proves the machinery, not art.
 *
 * Architectures: flux (FluxPipeline: CLIP-L, T5, FluxTransformer2DModel), flux2 and
 * flux2-klein (Flux2Pipeline / Flux2KleinPipeline, make_tiny_flux2.c) and sd3
 * (StableDiffusion3Pipeline shaped like SD3.5-medium: CLIP-L and CLIP-G with projections,
 * the latter padding with "!", T5 as wide as both CLIPs together, an MMDiT with dual
 * attention in its first blocks, q/k RMS norms and the stored sin-cos position grid,
 * scheduler shift 3.0, the SD3 VAE scaling). The writers take the folder and sizes as
 * parameters so both share them.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "cli.h"
#include "make_tiny_flux2.h"
#include "make_tiny_lm.h"
#include "make_tiny_writer.h"

/* One CLIP text encoder's sizes; proj > 0 makes it a CLIPTextModelWithProjection. */
typedef struct clip_dims {
    int d, layers, heads, ff, proj;
    const char *act;
    int vocab; /* the embedding's rows at least (the tokenizer's count if more) */
} clip_dims;

/* A T5 encoder's sizes (gated-gelu). */
typedef struct t5_dims {
    int d, d_kv, heads, ff, layers, vocab; /* vocab: as clip_dims' */
} t5_dims;

typedef struct tiny {
    char dir[2048];
    df_rng rng; /* one generator through every component */
    df_dtype dtype;
    tiny_writer w;       /* the component being written */
    int64_t shard_bytes; /* its weight files are split past this (0: 2 GiB) */
    int fx_heads, fx_head_dim, fx_double, fx_single; /* the FLUX transformer's sizes */
    clip_dims clip;                                  /* FLUX's CLIP-L */
    t5_dims t5;                                      /* FLUX's T5 */
    int vae_channels[4], vae_layers, vae_groups;     /* the VAE decoder */
} tiny;

/* ---- small file helpers ------------------------------------------------------------ */

static int write_text(const tiny *t, const char *rel, const char *text)
{
    return tw_write_file(t->dir, rel, text);
}

/* ---- weights: one component at a time through make_tiny_writer.c ---------------------- */

static int begin(tiny *t, const char *component, const char *base)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", t->dir, component);
    return tw_begin(&t->w, path, base, t->dtype, &t->rng, 0, t->shard_bytes);
}

/* ---- sizes ------------------------------------------------------------------------------ */

enum {
    CLIP_D = 64, CLIP_LAYERS = 2, CLIP_HEADS = 4, CLIP_FF = 128,
    T5_D = 64, T5_KV = 16, T5_HEADS = 4, T5_FF = 128, T5_LAYERS = 2,
    FX_HEADS = 2, FX_HEAD_DIM = 32, FX_DOUBLE = 1, FX_SINGLE = 2, FX_IN = 64,
    VAE_LATENT = 16,
    /* SD3.5-like: CLIP-G wider than CLIP-L, T5 as wide as both (joint_attention_dim),
     * three blocks of which the first two have dual attention. */
    SD3_CLIP_G_D = 96, SD3_CLIP_PROJ = 64, SD3_T5_D = 192,
    SD3_HEADS = 2, SD3_HEAD_DIM = 32, SD3_LAYERS = 3, SD3_PATCH = 2, SD3_POS_MAX = 32,
    SD3_SAMPLE = 32,
};
#define FX_INNER (FX_HEADS * FX_HEAD_DIM)
#define SD3_INNER (SD3_HEADS * SD3_HEAD_DIM)
static const int vae_channels[4] = {32, 32, 64, 64};

static const clip_dims flux_clip = {CLIP_D, CLIP_LAYERS, CLIP_HEADS, CLIP_FF, 0, "quick_gelu", 0};
static const clip_dims sd3_clip_l = {CLIP_D, CLIP_LAYERS, CLIP_HEADS, CLIP_FF, SD3_CLIP_PROJ,
                                     "quick_gelu", 0};
static const clip_dims sd3_clip_g = {SD3_CLIP_G_D, CLIP_LAYERS, CLIP_HEADS, 2 * SD3_CLIP_G_D,
                                     SD3_CLIP_PROJ, "gelu", 0};
static const t5_dims tiny_t5 = {T5_D, T5_KV, T5_HEADS, T5_FF, T5_LAYERS, 0};
static const t5_dims sd3_t5 = {SD3_T5_D, T5_KV, T5_HEADS, T5_FF, T5_LAYERS, 0};

/* --size schnell: FLUX.1-schnell's shapes. CLIP-L (12 layers at 768, vocabulary 49408),
 * T5-XXL's encoder (24 layers at 4096, 64 heads of 64, gated-GELU 10240, vocabulary 32128),
 * the transformer's 19 double + 38 single blocks of 24 heads of 128, the VAE decoder at
 * 128-512 channels with 2 layers per block and 32 groups: about 17 G parameters (34 GB in
 * bf16), written in shards. */
static const clip_dims schnell_clip = {768, 12, 12, 3072, 0, "quick_gelu", 49408};
static const t5_dims schnell_t5 = {4096, 64, 64, 10240, 24, 32128};
static const int schnell_vae[4] = {128, 256, 512, 512};

/* ---- CLIP tokenizer and encoder ----------------------------------------------------- */

/* The byte-level BPE alphabet: printable Latin-1 bytes stand for themselves, the others
 * are shifted to U+0100 and up (the CLIP / GPT-2 convention). */
static int byte_symbol(int b)
{
    if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF))
        return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        if (!((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF)))
            n++;
    return 256 + n;
}

/* Appends the JSON-escaped UTF-8 form of code point cp. */
static size_t put_cp(char *s, int cp)
{
    if (cp == '"' || cp == '\\')
        return (size_t)sprintf(s, "\\%c", cp);
    if (cp < 0x80)
        return (size_t)sprintf(s, "%c", cp);
    if (cp < 0x800)
        return (size_t)sprintf(s, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
    return (size_t)sprintf(s, "%c%c%c", 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F),
                           0x80 | (cp & 0x3F));
}

static const char *const clip_merges[][2] = {
    {"t", "h"}, {"th", "e</w>"}, {"a", "n"}, {"i", "n"}, {"o", "n</w>"}, {"e", "r</w>"},
    {"o", "f</w>"}, {"a", "t</w>"}, {"s", "t"}, {"r", "e"},
};
#define N_MERGES (int)(sizeof clip_merges / sizeof clip_merges[0])

/* The CLIP tokenizer folder `folder`; `pad` is its pad token (CLIP-L <|endoftext|>, SD3's
 * CLIP-G "!"). */
static int write_clip_tokenizer(tiny *t, const char *folder, const char *pad, int *vocab_size)
{
    char path[4096], rel[256], text[1024];
    snprintf(path, sizeof path, "%s/%s", t->dir, folder);
    if (tw_make_dir(path))
        return -1;
    size_t cap = 1 << 16, len = 0;
    char *v = malloc(cap);
    if (!v)
        return -1;
    int id = 0;
    len += (size_t)sprintf(v + len, "{");
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            len += (size_t)sprintf(v + len, "%s\"", id ? "," : "");
            len += put_cp(v + len, byte_symbol(b));
            len += (size_t)sprintf(v + len, "%s\":%d", pass ? "</w>" : "", id++);
        }
    for (int m = 0; m < N_MERGES; m++)
        len += (size_t)sprintf(v + len, ",\"%s%s\":%d", clip_merges[m][0], clip_merges[m][1], id++);
    len += (size_t)sprintf(v + len, ",\"<|startoftext|>\":%d,\"<|endoftext|>\":%d}", id, id + 1);
    *vocab_size = id + 2;
    snprintf(rel, sizeof rel, "%s/vocab.json", folder);
    int rc = write_text(t, rel, v);
    len = (size_t)sprintf(v, "#version: 0.2\n");
    for (int m = 0; m < N_MERGES; m++)
        len += (size_t)sprintf(v + len, "%s %s\n", clip_merges[m][0], clip_merges[m][1]);
    snprintf(rel, sizeof rel, "%s/merges.txt", folder);
    rc = rc ? rc : write_text(t, rel, v);
    free(v);
    snprintf(rel, sizeof rel, "%s/special_tokens_map.json", folder);
    snprintf(text, sizeof text,
             "{\"bos_token\": \"<|startoftext|>\", \"eos_token\": \"<|endoftext|>\",\n"
             " \"pad_token\": \"%s\", \"unk_token\": \"<|endoftext|>\"}\n", pad);
    rc = rc ? rc : write_text(t, rel, text);
    snprintf(rel, sizeof rel, "%s/tokenizer_config.json", folder);
    snprintf(text, sizeof text,
             "{\"bos_token\": \"<|startoftext|>\", \"eos_token\": \"<|endoftext|>\",\n"
             " \"pad_token\": \"%s\", \"unk_token\": \"<|endoftext|>\",\n"
             " \"model_max_length\": 77, \"tokenizer_class\": \"CLIPTokenizer\",\n"
             " \"clean_up_tokenization_spaces\": true, \"errors\": \"replace\"}\n", pad);
    rc = rc ? rc : write_text(t, rel, text);
    return rc;
}

/* A CLIP text encoder in `folder` (text_encoder, text_encoder_2). */
static int write_clip(tiny *t, const char *folder, const clip_dims *c, int vocab)
{
    if (vocab < c->vocab)
        vocab = c->vocab;
    char cfg[2048], rel[256];
    snprintf(
        cfg, sizeof cfg,
        "{\n  \"architectures\": [\"%s\"],\n  \"bos_token_id\": 0,\n"
        "  \"eos_token_id\": 2,\n  \"hidden_act\": \"%s\",\n  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n  \"layer_norm_eps\": 1e-05,\n"
        "  \"max_position_embeddings\": 77,\n  \"model_type\": \"clip_text_model\",\n"
        "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"pad_token_id\": 1,\n"
        "  \"projection_dim\": %d,\n  \"torch_dtype\": \"%s\",\n  \"vocab_size\": %d\n}\n",
        c->proj ? "CLIPTextModelWithProjection" : "CLIPTextModel", c->act, c->d, c->ff, c->heads,
        c->layers, c->proj ? c->proj : c->d, t->dtype == DF_DTYPE_BF16 ? "bfloat16" : "float32",
        vocab);
    snprintf(rel, sizeof rel, "%s/config.json", folder);
    if (begin(t, folder, "model") || write_text(t, rel, cfg))
        return -1;
    const int D = c->d;
    tw_add(&t->w, "text_model.embeddings.token_embedding.weight", SH(vocab, D), 0.5f, 0);
    tw_add(&t->w, "text_model.embeddings.position_embedding.weight", SH(77, D), 0.1f, 0);
    for (int l = 0; l < c->layers; l++) {
        char p[256];
        const char *lin[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                             "self_attn.out_proj"};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "text_model.encoder.layers.%d.%s", l, lin[i]);
            tw_linear(&t->w, p, D, D, 1);
        }
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc1", l);
        tw_linear(&t->w, p, c->ff, D, 1);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.mlp.fc2", l);
        tw_linear(&t->w, p, D, c->ff, 1);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm1", l);
        tw_norm(&t->w, p, D, 1);
        snprintf(p, sizeof p, "text_model.encoder.layers.%d.layer_norm2", l);
        tw_norm(&t->w, p, D, 1);
    }
    tw_norm(&t->w, "text_model.final_layer_norm", D, 1);
    if (c->proj)
        tw_add(&t->w, "text_projection.weight", SH(c->proj, D), 1.0f / sqrtf((float)D), 0);
    return tw_finish(&t->w);
}

/* ---- T5 SentencePiece model and encoder ------------------------------------------------ */

typedef struct buf {
    unsigned char *p;
    size_t len, cap;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = (b->len + n) * 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p)
            return;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void varint(buf *b, uint64_t v)
{
    unsigned char c[10];
    int n = 0;
    do {
        c[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, c, (size_t)n);
}

static void field_varint(buf *b, int field, int64_t v)
{
    varint(b, (uint64_t)field << 3);
    varint(b, (uint64_t)v);
}

static void field_bytes(buf *b, int field, const void *d, size_t n)
{
    varint(b, (uint64_t)field << 3 | 2);
    varint(b, n);
    put(b, d, n);
}

static void piece(buf *model, const char *text, float score, int type)
{
    buf p = {0};
    field_bytes(&p, 1, text, strlen(text));
    varint(&p, 2 << 3 | 5);
    put(&p, &score, 4);
    field_varint(&p, 3, type);
    field_bytes(model, 1, p.p, p.len);
    free(p.p);
}

/* The T5 SentencePiece tokenizer folder `folder` (tokenizer_2, SD3's tokenizer_3). */
static int write_t5_tokenizer(tiny *t, const char *folder, int *vocab_size)
{
    char path[4096], rel[256];
    snprintf(path, sizeof path, "%s/%s", t->dir, folder);
    if (tw_make_dir(path))
        return -1;
    enum { NORMAL = 1, UNKNOWN = 2, CONTROL = 3 };
    buf m = {0};
    int n = 0;
    piece(&m, "<pad>", 0, CONTROL), n++;
    piece(&m, "</s>", 0, CONTROL), n++;
    piece(&m, "<unk>", 0, UNKNOWN), n++;
    #define SP "\xe2\x96\x81" /* U+2581, SentencePiece's word boundary */
    /* (single letters after a boundary come below; a piece may appear only once) */
    static const char *const words[] = {SP "the", SP "of", SP "in", SP "and", SP "fox"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        piece(&m, words[i], -4.0f - 0.1f * (float)i, NORMAL), n++;
    piece(&m, "\xe2\x96\x81", -5.0f, NORMAL), n++;
    for (int c = 'a'; c <= 'z'; c++) {
        char s[8];
        snprintf(s, sizeof s, "\xe2\x96\x81%c", c);
        piece(&m, s, -7.0f - 0.01f * (float)(c - 'a'), NORMAL), n++;
    }
    const char *singles =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?'-:;()";
    for (const char *c = singles; *c; c++) {
        char s[2] = {*c, 0};
        piece(&m, s, -9.0f - 0.01f * (float)(c - singles), NORMAL), n++;
    }
    buf trainer = {0};
    field_varint(&trainer, 3, 1); /* model_type UNIGRAM */
    field_varint(&trainer, 4, n); /* vocab_size */
    field_varint(&trainer, 40, 2); /* unk_id */
    field_varint(&trainer, 41, -1); /* bos_id */
    field_varint(&trainer, 42, 1); /* eos_id */
    field_varint(&trainer, 43, 0); /* pad_id */
    field_bytes(&m, 2, trainer.p, trainer.len);
    buf normalizer = {0};
    field_bytes(&normalizer, 1, "nmt_nfkc", 8);
    field_varint(&normalizer, 3, 1); /* add_dummy_prefix */
    field_varint(&normalizer, 4, 1); /* remove_extra_whitespaces */
    field_varint(&normalizer, 5, 1); /* escape_whitespaces */
    field_bytes(&m, 3, normalizer.p, normalizer.len);
    free(trainer.p);
    free(normalizer.p);
    snprintf(path, sizeof path, "%s/%s/spiece.model", t->dir, folder);
    FILE *f = fopen(path, "wb");
    int rc = (!f || !m.p || fwrite(m.p, 1, m.len, f) != m.len) ? -1 : 0;
    if (f && fclose(f) != 0)
        rc = -1;
    free(m.p);
    if (rc) {
        fprintf(stderr, "diffuse make-tiny: cannot write %s\n", path);
        return -1;
    }
    /* The 100 <extra_id_N> tokens follow the pieces, N = 0 last. */
    char *text = malloc(1 << 15);
    if (!text)
        return -1;
    size_t len = (size_t)sprintf(text, "{");
    for (int i = 0; i < 100; i++)
        len += (size_t)sprintf(text + len, "%s\"<extra_id_%d>\": %d", i ? ", " : "", i, n + 99 - i);
    sprintf(text + len, "}\n");
    snprintf(rel, sizeof rel, "%s/added_tokens.json", folder);
    rc = write_text(t, rel, text);
    len =
        (size_t)sprintf(text, "{\"eos_token\": \"</s>\", \"pad_token\": \"<pad>\", "
                              "\"unk_token\": \"<unk>\", \"extra_ids\": 100, \"legacy\": true,\n"
                              " \"model_max_length\": 512, \"tokenizer_class\": \"T5Tokenizer\",\n"
                              " \"additional_special_tokens\": [");
    for (int i = 0; i < 100; i++)
        len += (size_t)sprintf(text + len, "%s\"<extra_id_%d>\"", i ? ", " : "", i);
    sprintf(text + len, "]}\n");
    snprintf(rel, sizeof rel, "%s/tokenizer_config.json", folder);
    rc = rc ? rc : write_text(t, rel, text);
    snprintf(rel, sizeof rel, "%s/special_tokens_map.json", folder);
    rc = rc ? rc : write_text(t, rel,
                              "{\"eos_token\": \"</s>\", \"pad_token\": \"<pad>\", "
                              "\"unk_token\": \"<unk>\"}\n");
    free(text);
    *vocab_size = n + 100;
    return rc;
}

/* A T5 encoder of width d_model in `folder` (text_encoder_2, SD3's text_encoder_3). */
static int write_t5(tiny *t, const char *folder, const t5_dims *z, int vocab)
{
    if (vocab < z->vocab)
        vocab = z->vocab;
    char cfg[2048], rel[256];
    snprintf(cfg, sizeof cfg,
             "{\n  \"architectures\": [\"T5EncoderModel\"],\n  \"d_ff\": %d,\n  \"d_kv\": %d,\n"
             "  \"d_model\": %d,\n  \"dense_act_fn\": \"gelu_new\",\n  \"eos_token_id\": 1,\n"
             "  \"feed_forward_proj\": \"gated-gelu\",\n  \"is_gated_act\": true,\n"
             "  \"layer_norm_epsilon\": 1e-06,\n  \"model_type\": \"t5\",\n  \"num_heads\": %d,\n"
             "  \"num_layers\": %d,\n  \"pad_token_id\": 0,\n"
             "  \"relative_attention_max_distance\": 128,\n"
             "  \"relative_attention_num_buckets\": 32,\n  \"tie_word_embeddings\": false,\n"
             "  \"torch_dtype\": \"%s\",\n  \"vocab_size\": %d\n}\n",
             z->ff, z->d_kv, z->d, z->heads, z->layers,
             t->dtype == DF_DTYPE_BF16 ? "bfloat16" : "float32", vocab);
    snprintf(rel, sizeof rel, "%s/config.json", folder);
    if (begin(t, folder, "model") || write_text(t, rel, cfg))
        return -1;
    const int T5D = z->d;
    tw_add(&t->w, "shared.weight", SH(vocab, T5D), 1.0f, 0);
    int inner = z->d_kv * z->heads;
    for (int l = 0; l < z->layers; l++) {
        char p[256];
        const char *qkv[] = {"q", "k", "v"};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "encoder.block.%d.layer.0.SelfAttention.%s", l, qkv[i]);
            tw_linear(&t->w, p, inner, T5D, 0);
        }
        snprintf(p, sizeof p, "encoder.block.%d.layer.0.SelfAttention.o", l);
        tw_linear(&t->w, p, T5D, inner, 0);
        if (l == 0)
            tw_add(&t->w, "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                SH(32, z->heads), 0.5f, 0);
        snprintf(p, sizeof p, "encoder.block.%d.layer.0.layer_norm", l);
        tw_norm(&t->w, p, T5D, 0);
        snprintf(p, sizeof p, "encoder.block.%d.layer.1.DenseReluDense.wi_0", l);
        tw_linear(&t->w, p, z->ff, T5D, 0);
        snprintf(p, sizeof p, "encoder.block.%d.layer.1.DenseReluDense.wi_1", l);
        tw_linear(&t->w, p, z->ff, T5D, 0);
        snprintf(p, sizeof p, "encoder.block.%d.layer.1.DenseReluDense.wo", l);
        tw_linear(&t->w, p, T5D, z->ff, 0);
        snprintf(p, sizeof p, "encoder.block.%d.layer.1.layer_norm", l);
        tw_norm(&t->w, p, T5D, 0);
    }
    tw_norm(&t->w, "encoder.final_layer_norm", T5D, 0);
    return tw_finish(&t->w);
}

/* ---- FLUX transformer --------------------------------------------------------------------- */

static int write_flux(tiny *t)
{
    /* RoPE axes: FLUX.1's (16, 56, 56) at head_dim 128; the same proportions otherwise
     * ((8, 12, 12) at the default 32). */
    int hd = t->fx_head_dim, a0 = hd == 32 ? 8 : hd / 8, a1 = (hd - a0) / 2;
    char cfg[1024];
    snprintf(
        cfg, sizeof cfg,
        "{\n  \"_class_name\": \"FluxTransformer2DModel\",\n  \"_diffusers_version\": \"0.37.1\",\n"
        "  \"attention_head_dim\": %d,\n  \"axes_dims_rope\": [%d, %d, %d],\n"
        "  \"guidance_embeds\": false,\n  \"in_channels\": %d,\n  \"joint_attention_dim\": %d,\n"
        "  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n  \"num_single_layers\": %d,\n"
        "  \"out_channels\": null,\n  \"patch_size\": 1,\n  \"pooled_projection_dim\": %d\n}\n",
        hd, a0, a1, hd - a0 - a1, FX_IN, t->t5.d, t->fx_heads, t->fx_double, t->fx_single,
        t->clip.d);
    if (begin(t, "transformer", "diffusion_pytorch_model") ||
        write_text(t, "transformer/config.json", cfg))
        return -1;
    const int D = t->fx_heads * hd, M = 4 * D;
    tw_linear(&t->w, "x_embedder", D, FX_IN, 1);
    tw_linear(&t->w, "context_embedder", D, t->t5.d, 1);
    tw_linear(&t->w, "time_text_embed.timestep_embedder.linear_1", D, 256, 1);
    tw_linear(&t->w, "time_text_embed.timestep_embedder.linear_2", D, D, 1);
    tw_linear(&t->w, "time_text_embed.text_embedder.linear_1", D, t->clip.d, 1);
    tw_linear(&t->w, "time_text_embed.text_embedder.linear_2", D, D, 1);
    char p[256];
    for (int b = 0; b < t->fx_double; b++) {
        static const char *const sq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                                         "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                                         "attn.to_add_out"};
        for (int i = 0; i < 8; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", b, sq[i]);
            tw_linear(&t->w, p, D, D, 1);
        }
        static const char *const qk[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.attn.%s", b, qk[i]);
            tw_norm(&t->w, p, hd, 0);
        }
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1.linear", b);
        tw_linear(&t->w, p, 6 * D, D, 1);
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1_context.linear", b);
        tw_linear(&t->w, p, 6 * D, D, 1);
        static const char *const ff[] = {"ff", "ff_context"};
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.0.proj", b, ff[i]);
            tw_linear(&t->w, p, M, D, 1);
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.2", b, ff[i]);
            tw_linear(&t->w, p, D, M, 1);
        }
    }
    for (int b = 0; b < t->fx_single; b++) {
        static const char *const qkv[] = {"attn.to_q", "attn.to_k", "attn.to_v"};
        for (int i = 0; i < 3; i++) {
            snprintf(p, sizeof p, "single_transformer_blocks.%d.%s", b, qkv[i]);
            tw_linear(&t->w, p, D, D, 1);
        }
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_q", b);
        tw_norm(&t->w, p, hd, 0);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_k", b);
        tw_norm(&t->w, p, hd, 0);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.norm.linear", b);
        tw_linear(&t->w, p, 3 * D, D, 1);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_mlp", b);
        tw_linear(&t->w, p, M, D, 1);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.proj_out", b);
        tw_linear(&t->w, p, D, D + M, 1);
    }
    tw_linear(&t->w, "norm_out.linear", 2 * D, D, 1);
    tw_linear(&t->w, "proj_out", FX_IN, D, 1);
    return tw_finish(&t->w);
}

/* ---- SD3 transformer (SD3.5-like: dual attention, q/k RMS norms) ------------------------ */

/* The sin-cos grid PatchEmbed stores for pos_embed_max_size M (diffusers'
 * get_2d_sincos_pos_embed with base_size = sample_size / patch_size): for grid cell (i, j)
 * the first D/2 channels encode the column, the last D/2 the row, each [sin, cos] over
 * D/4 frequencies 10000^(-k/(D/4)). */
static void sincos_grid(float *out, int M, int D, int base)
{
    int q = D / 4;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            float *e = out + ((size_t)i * M + j) * D;
            double pos[2] = {(double)j / ((double)M / base), (double)i / ((double)M / base)};
            for (int a = 0; a < 2; a++)
                for (int k = 0; k < q; k++) {
                    double angle = pos[a] / pow(10000.0, (double)k / q);
                    e[a * 2 * q + k] = (float)sin(angle);
                    e[a * 2 * q + q + k] = (float)cos(angle);
                }
        }
}

static int write_sd3(tiny *t)
{
    const int D = SD3_INNER, P = SD3_PATCH, M = SD3_POS_MAX, pooled = 2 * SD3_CLIP_PROJ;
    char cfg[1024];
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"SD3Transformer2DModel\",\n"
             "  \"_diffusers_version\": \"0.37.1\",\n"
             "  \"attention_head_dim\": %d,\n  \"caption_projection_dim\": %d,\n"
             "  \"dual_attention_layers\": [0, 1],\n  \"in_channels\": %d,\n"
             "  \"joint_attention_dim\": %d,\n  \"num_attention_heads\": %d,\n"
             "  \"num_layers\": %d,\n  \"out_channels\": %d,\n  \"patch_size\": %d,\n"
             "  \"pooled_projection_dim\": %d,\n  \"pos_embed_max_size\": %d,\n"
             "  \"qk_norm\": \"rms_norm\",\n  \"sample_size\": %d\n}\n",
             SD3_HEAD_DIM, D, VAE_LATENT, SD3_T5_D, SD3_HEADS, SD3_LAYERS, VAE_LATENT, P, pooled,
             M, SD3_SAMPLE);
    if (begin(t, "transformer", "diffusion_pytorch_model") ||
        write_text(t, "transformer/config.json", cfg))
        return -1;
    tw_conv(&t->w, "pos_embed.proj", D, VAE_LATENT, P);
    float *grid = malloc((size_t)M * M * D * sizeof *grid);
    if (!grid) {
        fprintf(stderr, "diffuse make-tiny: out of memory for the position grid\n");
        tw_finish(&t->w);
        return -1;
    }
    sincos_grid(grid, M, D, SD3_SAMPLE / P);
    tw_add_values(&t->w, "pos_embed.pos_embed", SH(1, M * M, D), grid);
    free(grid);
    tw_linear(&t->w, "time_text_embed.timestep_embedder.linear_1", D, 256, 1);
    tw_linear(&t->w, "time_text_embed.timestep_embedder.linear_2", D, D, 1);
    tw_linear(&t->w, "time_text_embed.text_embedder.linear_1", D, pooled, 1);
    tw_linear(&t->w, "time_text_embed.text_embedder.linear_2", D, D, 1);
    tw_linear(&t->w, "context_embedder", D, SD3_T5_D, 1);
    char p[256];
    for (int b = 0; b < SD3_LAYERS; b++) {
        bool dual = b < 2, last = b == SD3_LAYERS - 1;
        static const char *const proj[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                                           "attn.add_q_proj", "attn.add_k_proj",
                                           "attn.add_v_proj", "attn.to_add_out",
                                           "attn2.to_q", "attn2.to_k", "attn2.to_v",
                                           "attn2.to_out.0"};
        for (int i = 0; i < 12; i++) {
            if ((i == 7 && last) || (i >= 8 && !dual))
                continue;
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", b, proj[i]);
            tw_linear(&t->w, p, D, D, 1);
        }
        static const char *const qk[] = {"attn.norm_q", "attn.norm_k", "attn.norm_added_q",
                                         "attn.norm_added_k", "attn2.norm_q", "attn2.norm_k"};
        for (int i = 0; i < (dual ? 6 : 4); i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", b, qk[i]);
            tw_norm(&t->w, p, SD3_HEAD_DIM, 0);
        }
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1.linear", b);
        tw_linear(&t->w, p, (dual ? 9 : 6) * D, D, 1);
        snprintf(p, sizeof p, "transformer_blocks.%d.norm1_context.linear", b);
        tw_linear(&t->w, p, (last ? 2 : 6) * D, D, 1);
        static const char *const ff[] = {"ff", "ff_context"};
        for (int i = 0; i < (last ? 1 : 2); i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.0.proj", b, ff[i]);
            tw_linear(&t->w, p, 4 * D, D, 1);
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.net.2", b, ff[i]);
            tw_linear(&t->w, p, D, 4 * D, 1);
        }
    }
    tw_linear(&t->w, "norm_out.linear", 2 * D, D, 1);
    tw_linear(&t->w, "proj_out", P * P * VAE_LATENT, D, 1);
    return tw_finish(&t->w);
}

/* ---- VAE (decoder half; the encoder is not needed to generate) ------------------------- */

static void resnet(tiny *t, const char *p, int cin, int cout)
{
    char n[256];
    snprintf(n, sizeof n, "%s.norm1", p);
    tw_norm(&t->w, n, cin, 1);
    snprintf(n, sizeof n, "%s.conv1", p);
    tw_conv(&t->w, n, cout, cin, 3);
    snprintf(n, sizeof n, "%s.norm2", p);
    tw_norm(&t->w, n, cout, 1);
    snprintf(n, sizeof n, "%s.conv2", p);
    tw_conv(&t->w, n, cout, cout, 3);
    if (cin != cout) {
        snprintf(n, sizeof n, "%s.conv_shortcut", p);
        tw_conv(&t->w, n, cout, cin, 1);
    }
}

/* The VAE with the pipeline's latent scaling (FLUX.1 0.3611 / 0.1159, SD3 1.5305 / 0.0609). */
static int write_vae(tiny *t, double scaling, double shift)
{
    const int *ch = t->vae_channels;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"AutoencoderKL\",\n  \"_diffusers_version\": \"0.37.1\",\n"
             "  \"act_fn\": \"silu\",\n  \"block_out_channels\": [%d, %d, %d, %d],\n"
             "  \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
             "\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"],\n  \"force_upcast\": true,\n"
             "  \"in_channels\": 3,\n  \"latent_channels\": %d,\n  \"layers_per_block\": %d,\n"
             "  \"mid_block_add_attention\": true,\n  \"norm_num_groups\": %d,\n"
             "  \"out_channels\": 3,\n  \"sample_size\": 256,\n  \"scaling_factor\": %g,\n"
             "  \"shift_factor\": %g,\n  \"up_block_types\": [\"UpDecoderBlock2D\", "
             "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", \"UpDecoderBlock2D\"],\n"
             "  \"use_post_quant_conv\": false,\n  \"use_quant_conv\": false\n}\n",
             ch[0], ch[1], ch[2], ch[3], VAE_LATENT, t->vae_layers, t->vae_groups, scaling, shift);
    if (begin(t, "vae", "diffusion_pytorch_model") || write_text(t, "vae/config.json", cfg))
        return -1;
    int top = ch[3];
    tw_conv(&t->w, "decoder.conv_in", top, VAE_LATENT, 3);
    resnet(t, "decoder.mid_block.resnets.0", top, top);
    resnet(t, "decoder.mid_block.resnets.1", top, top);
    tw_norm(&t->w, "decoder.mid_block.attentions.0.group_norm", top, 1);
    static const char *const att[] = {"to_q", "to_k", "to_v", "to_out.0"};
    for (int i = 0; i < 4; i++) {
        char n[256];
        snprintf(n, sizeof n, "decoder.mid_block.attentions.0.%s", att[i]);
        tw_linear(&t->w, n, top, top, 1);
    }
    int cin = top;
    for (int b = 0; b < 4; b++) {
        int cout = ch[3 - b];
        for (int r = 0; r <= t->vae_layers; r++) {
            char n[256];
            snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", b, r);
            resnet(t, n, r ? cout : cin, cout);
        }
        if (b < 3) {
            char n[256];
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            tw_conv(&t->w, n, cout, cout, 3);
        }
        cin = cout;
    }
    tw_norm(&t->w, "decoder.conv_norm_out", ch[0], 1);
    tw_conv(&t->w, "decoder.conv_out", 3, ch[0], 3);
    return tw_finish(&t->w);
}

/* ---- the command ------------------------------------------------------------------------ */

static const char flux_index[] =
    "{\n  \"_class_name\": \"FluxPipeline\",\n  \"_diffusers_version\": \"0.37.1\",\n"
    "  \"feature_extractor\": [null, null],\n  \"image_encoder\": [null, null],\n"
    "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
    "  \"text_encoder\": [\"transformers\", \"CLIPTextModel\"],\n"
    "  \"text_encoder_2\": [\"transformers\", \"T5EncoderModel\"],\n"
    "  \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"],\n"
    "  \"tokenizer_2\": [\"transformers\", \"T5Tokenizer\"],\n"
    "  \"transformer\": [\"diffusers\", \"FluxTransformer2DModel\"],\n"
    "  \"vae\": [\"diffusers\", \"AutoencoderKL\"]\n}\n";

static const char sd3_index[] =
    "{\n  \"_class_name\": \"StableDiffusion3Pipeline\",\n  \"_diffusers_version\": \"0.37.1\",\n"
    "  \"feature_extractor\": [null, null],\n  \"image_encoder\": [null, null],\n"
    "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
    "  \"text_encoder\": [\"transformers\", \"CLIPTextModelWithProjection\"],\n"
    "  \"text_encoder_2\": [\"transformers\", \"CLIPTextModelWithProjection\"],\n"
    "  \"text_encoder_3\": [\"transformers\", \"T5EncoderModel\"],\n"
    "  \"tokenizer\": [\"transformers\", \"CLIPTokenizer\"],\n"
    "  \"tokenizer_2\": [\"transformers\", \"CLIPTokenizer\"],\n"
    "  \"tokenizer_3\": [\"transformers\", \"T5Tokenizer\"],\n"
    "  \"transformer\": [\"diffusers\", \"SD3Transformer2DModel\"],\n"
    "  \"vae\": [\"diffusers\", \"AutoencoderKL\"]\n}\n";

/* Whether `arch` is a make-tiny architecture of a row of the model table (models.h); the
 * architectures, comma-separated, go to list. */
static bool arch_in_table(const char *arch, char *list, size_t cap)
{
    bool found = false;
    size_t len = 0;
    int n;
    const df_model_class *classes = df_model_classes(&n);
    list[0] = '\0';
    for (int i = 0; i < n; i++)
        for (int k = 0; k < DF_MODEL_TINY_ARCHS && classes[i].tiny_arch[k]; k++) {
            found = found || strcmp(arch, classes[i].tiny_arch[k]) == 0;
            int w =
                snprintf(list + len, cap - len, "%s%s", len ? ", " : "", classes[i].tiny_arch[k]);
            if (w > 0 && (size_t)w < cap - len)
                len += (size_t)w;
        }
    return found;
}

/* What the command line asked of a writer besides the tiny sizes. */
typedef struct tiny_run {
    const char *arch, *size; /* --arch, --size */
    unsigned sized;          /* which of --heads, --head-dim, --double, --single were given */
    uint64_t seed;
    const char *out; /* DIR */
} tiny_run;

static int write_mistral3_folder(tiny *t, const tiny_run *r)
{
    return tiny_write_mistral3(r->out, &TINY_LM_SIZES, t->dtype, r->seed) ? 1 : 0;
}

static int write_qwen3_folder(tiny *t, const tiny_run *r)
{
    return tiny_write_qwen3(r->out, &TINY_LM_SIZES, t->dtype, r->seed) ? 1 : 0;
}

/* Flux2Pipeline or Flux2KleinPipeline (make_tiny_flux2.c), into t->dir. */
static int write_flux2_pipeline(tiny *t, const tiny_run *r)
{
    bool klein = strcmp(r->arch, "flux2-klein") == 0;
    tiny_flux2_sizes z = strcmp(r->size, "klein-4b") == 0 ? TINY_FLUX2_KLEIN_4B
                                                           : TINY_FLUX2_SIZES(klein);
    if (t->shard_bytes > 0)
        z.shard_bytes = t->shard_bytes;
    z.heads = r->sized & 1u ? t->fx_heads : z.heads;
    z.head_dim = r->sized & 2u ? t->fx_head_dim : z.head_dim;
    z.double_blocks = r->sized & 4u ? t->fx_double : z.double_blocks;
    z.single_blocks = r->sized & 8u ? t->fx_single : z.single_blocks;
    if (tiny_write_flux2(t->dir, klein, &z, t->dtype, r->seed))
        return 1;
    printf("%s\n", t->dir);
    return 0;
}

/* FluxPipeline or StableDiffusion3Pipeline into t->dir: the two share the scheduler, the
 * CLIP tokenizer and encoder writers, the T5 and the VAE. */
static int write_flux_or_sd3(tiny *t, const tiny_run *r, bool sd3)
{
    df_rng_init(&t->rng, r->seed);
    int clip_vocab = 0, t5_vocab = 0;
    int rc = write_text(t, "model_index.json", sd3 ? sd3_index : flux_index);
    char sched[4096];
    snprintf(sched, sizeof sched, "%s/scheduler", t->dir);
    rc = rc ? rc : tw_make_dir(sched);
    char sched_cfg[1024];
    snprintf(sched_cfg, sizeof sched_cfg,
        "{\n  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n"
        "  \"_diffusers_version\": \"0.37.1\",\n  \"base_image_seq_len\": 256,\n"
        "  \"base_shift\": 0.5,\n  \"invert_sigmas\": false,\n  \"max_image_seq_len\": 4096,\n"
        "  \"max_shift\": 1.15,\n  \"num_train_timesteps\": 1000,\n  \"shift\": %s,\n"
        "  \"shift_terminal\": null,\n  \"stochastic_sampling\": false,\n"
        "  \"time_shift_type\": \"exponential\",\n  \"use_beta_sigmas\": false,\n"
        "  \"use_dynamic_shifting\": false,\n  \"use_exponential_sigmas\": false,\n"
        "  \"use_karras_sigmas\": false\n}\n", sd3 ? "3.0" : "1.0");
    rc = rc ? rc : write_text(t, "scheduler/scheduler_config.json", sched_cfg);
    rc = rc ? rc : write_clip_tokenizer(t, "tokenizer", "<|endoftext|>", &clip_vocab);
    if (sd3) {
        rc = rc ? rc : write_clip(t, "text_encoder", &sd3_clip_l, clip_vocab);
        rc = rc ? rc : write_clip_tokenizer(t, "tokenizer_2", "!", &clip_vocab);
        rc = rc ? rc : write_clip(t, "text_encoder_2", &sd3_clip_g, clip_vocab);
        rc = rc ? rc : write_t5_tokenizer(t, "tokenizer_3", &t5_vocab);
        rc = rc ? rc : write_t5(t, "text_encoder_3", &sd3_t5, t5_vocab);
        rc = rc ? rc : write_sd3(t);
        rc = rc ? rc : write_vae(t, 1.5305, 0.0609);
    } else {
        rc = rc ? rc : write_clip(t, "text_encoder", &t->clip, clip_vocab);
        rc = rc ? rc : write_t5_tokenizer(t, "tokenizer_2", &t5_vocab);
        rc = rc ? rc : write_t5(t, "text_encoder_2", &t->t5, t5_vocab);
        rc = rc ? rc : write_flux(t);
        rc = rc ? rc : write_vae(t, 0.3611, 0.1159);
    }
    if (rc)
        return 1;
    printf("%s\n", t->dir);
    return 0;
}

static int write_flux_pipeline(tiny *t, const tiny_run *r)
{
    return write_flux_or_sd3(t, r, false);
}

static int write_sd3_pipeline(tiny *t, const tiny_run *r)
{
    return write_flux_or_sd3(t, r, true);
}

/* The writer of each architecture that a row of the model table (models.h) names; `diffuse
 * make-tiny --list` prints them and test_model_classes holds them against the table. */
typedef struct tiny_arch {
    const char *name;
    bool pipeline; /* a pipeline folder (--size applies, DIR's parents are made) */
    int (*write)(tiny *t, const tiny_run *r);
} tiny_arch;

static const tiny_arch writers[] = {
    {"flux", true, write_flux_pipeline},
    {"sd3", true, write_sd3_pipeline},
    {"flux2", true, write_flux2_pipeline},
    {"flux2-klein", true, write_flux2_pipeline},
    {"mistral3-text-encoder", false, write_mistral3_folder},
    {"qwen3-text-encoder", false, write_qwen3_folder},
};

static const tiny_arch *find_writer(const char *arch)
{
    for (size_t i = 0; i < sizeof writers / sizeof *writers; i++)
        if (strcmp(writers[i].name, arch) == 0)
            return &writers[i];
    return NULL;
}

int cmd_make_tiny(int argc, char **argv)
{
    static const struct option longopts[] = {{"arch", required_argument, 0, 'a'},
                                             {"seed", required_argument, 0, 's'},
                                             {"dtype", required_argument, 0, 'd'},
                                             {"heads", required_argument, 0, 'H'},
                                             {"head-dim", required_argument, 0, 'D'},
                                             {"double", required_argument, 0, 'B'},
                                             {"single", required_argument, 0, 'S'},
                                             {"size", required_argument, 0, 'Z'},
                                             {"shard-size", required_argument, 0, 'X'},
                                             {"list", no_argument, 0, 'l'},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    const char *arch = "flux";
    tiny t = {.dtype = DF_DTYPE_F32, .fx_heads = FX_HEADS, .fx_head_dim = FX_HEAD_DIM,
              .fx_double = FX_DOUBLE, .fx_single = FX_SINGLE, .clip = flux_clip, .t5 = tiny_t5,
              .vae_channels = {vae_channels[0], vae_channels[1], vae_channels[2],
                               vae_channels[3]},
              .vae_layers = 1, .vae_groups = 8};
    uint64_t seed = 0;
    const char *size = "tiny";
    long long shard_size = 0;
    unsigned sized = 0; /* which of --heads, --head-dim, --double, --single were given */
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1;) {
        switch (c) {
        case 'a': arch = optarg; break;
        case 's': seed = strtoull(optarg, NULL, 10); break;
        case 'd':
            if (!df_dtype_parse(optarg, &t.dtype) ||
                (t.dtype != DF_DTYPE_F32 && t.dtype != DF_DTYPE_BF16 && t.dtype != DF_DTYPE_F16)) {
                fprintf(stderr, "diffuse make-tiny: --dtype is f32, bf16 or f16\n");
                return 2;
            }
            break;
        case 'H': case 'D': case 'B': case 'S': {
            char *end;
            long v = strtol(optarg, &end, 10);
            long lo = c == 'B' || c == 'S' ? 0 : 1, hi = c == 'D' ? 512 : 64;
            if (*end || end == optarg || v < lo || v > hi || (c == 'D' && (v < 16 || v % 8))) {
                fprintf(stderr, "diffuse make-tiny: bad value '%s' for --%s\n", optarg,
                        c == 'H'   ? "heads"
                        : c == 'D' ? "head-dim"
                        : c == 'B' ? "double"
                                   : "single");
                return 2;
            }
            *(c == 'H' ? &t.fx_heads : c == 'D' ? &t.fx_head_dim : c == 'B' ? &t.fx_double
                                                                         : &t.fx_single) = (int)v;
            sized |= c == 'H' ? 1u : c == 'D' ? 2u : c == 'B' ? 4u : 8u;
            break;
        }
        case 'Z':
            if (strcmp(optarg, "tiny") != 0 && strcmp(optarg, "klein-4b") != 0 &&
                strcmp(optarg, "schnell") != 0) {
                fprintf(stderr, "diffuse make-tiny: --size is tiny, klein-4b or schnell, not "
                                "'%s'\n", optarg);
                return 2;
            }
            size = optarg;
            break;
        case 'X': {
            char *end;
            shard_size = strtoll(optarg, &end, 10);
            if (*end || end == optarg || shard_size < 1024) {
                fprintf(stderr, "diffuse make-tiny: --shard-size is a byte count of at least "
                                "1024, not '%s'\n", optarg);
                return 2;
            }
            break;
        }
        case 'l':
            for (size_t i = 0; i < sizeof writers / sizeof *writers; i++)
                printf("%s\n", writers[i].name);
            return 0;
        case 'h':
            printf("usage: diffuse make-tiny [--arch flux|sd3|flux2|flux2-klein] [--seed N] "
                   "[--dtype f32|bf16|f16] "
                   "[--heads N --head-dim N --double N --single N] [--size tiny|klein-4b|schnell]\n"
                   "[--shard-size BYTES] DIR | --list\n"
                   "Writes a small pipeline folder with seeded random weights in the diffusers\n"
                   "layout: flux (FluxPipeline: model_index.json, scheduler/, text_encoder/ +\n"
                   "tokenizer/ (CLIP-L), text_encoder_2/ + tokenizer_2/ (T5), transformer/, vae/)\n"
                   "or sd3 (StableDiffusion3Pipeline, SD3.5-like: CLIP-L, CLIP-G and T5 as\n"
                   "text_encoder(_2, _3)/ + tokenizer(_2, _3)/, an MMDiT with dual attention).\n"
                   "--heads, --head-dim, --double, --single size the FLUX transformer (default\n"
                   "2 x 32, 1 + 2 blocks; FLUX.1 width is --heads 24 --head-dim 128), e.g. to\n"
                   "try offloading on a pipeline whose transformer is gigabytes; they size the\n"
                   "FLUX.2 transformers too (default 2 x 16, 1 + 2 blocks).\n"
                   "--arch flux2 writes a Flux2Pipeline (FLUX.2-dev-like: Mistral 3 text encoder\n"
                   "and a tokenizer.json in the FLUX.2-dev layout, a guidance-embedded\n"
                   "Flux2Transformer2DModel, AutoencoderKLFlux2), --arch flux2-klein a distilled\n"
                   "Flux2KleinPipeline (Qwen3 text encoder and tokenizer); --size klein-4b gives\n"
                   "flux2-klein FLUX.2 [klein] 4B's real shapes (about 16 GB in bf16) with random\n"
                   "weights, to measure a full-depth pipeline; --size schnell gives flux\n"
                   "FLUX.1-schnell's (CLIP-L, T5-XXL, 19 + 38 blocks at 3072, the full VAE\n"
                   "decoder: about 34 GB in bf16). --shard-size BYTES splits each component's\n"
                   "weight files past that size (default 2 GiB), with the index; writing holds\n"
                   "one shard in memory.\n"
                   "--arch mistral3-text-encoder | qwen3-text-encoder writes DIR as one text\n"
                   "encoder folder (Mistral3ForConditionalGeneration / Qwen3ForCausalLM).\n"
                   "--list prints the architectures this program writes, one a line.\n");
            return 0;
        default: return 2;
        }
    }
    if (optind + 1 != argc) {
        fprintf(stderr, "usage: diffuse make-tiny [--arch flux|sd3] [--seed N] [--dtype D] DIR\n");
        return 2;
    }
    char archs[256];
    if (!arch_in_table(arch, archs, sizeof archs)) {
        fprintf(stderr, "diffuse make-tiny: architecture '%s' is not supported (%s)\n", arch,
                archs);
        return 2;
    }
    const tiny_arch *w = find_writer(arch);
    if (!w) {
        fprintf(stderr,
                "diffuse make-tiny: architecture '%s' is in the model table but has no "
                "writer here\n",
                arch);
        return 2;
    }
    tiny_run r = {.arch = arch, .size = size, .sized = sized, .seed = seed, .out = argv[optind]};
    /* One text encoder component folder (make_tiny_lm.c), for the FLUX.2 encoders. */
    if (!w->pipeline)
        return w->write(&t, &r);
    bool schnell = strcmp(size, "schnell") == 0;
    if ((strcmp(size, "klein-4b") == 0 && strcmp(arch, "flux2-klein") != 0) ||
        (schnell && strcmp(arch, "flux") != 0)) {
        fprintf(stderr, "diffuse make-tiny: --size %s is for --arch %s\n", size,
                schnell ? "flux" : "flux2-klein");
        return 2;
    }
    if (schnell) {
        t.clip = schnell_clip;
        t.t5 = schnell_t5;
        memcpy(t.vae_channels, schnell_vae, sizeof t.vae_channels);
        t.vae_layers = 2;
        t.vae_groups = 32;
        t.fx_heads = 24;
        t.fx_head_dim = 128;
        t.fx_double = 19;
        t.fx_single = 38;
    }
    t.shard_bytes = shard_size;
    snprintf(t.dir, sizeof t.dir, "%s", argv[optind]);
    /* Create parents one level at a time ("demo/tiny-flux"). */
    for (char *s = t.dir + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (tw_make_dir(t.dir))
                return 1;
            *s = '/';
        }
    if (tw_make_dir(t.dir))
        return 1;
    return w->write(&t, &r);
}
