/*
 * make-tiny's FLUX.2 pipelines: Flux2Pipeline (--arch flux2: Mistral 3 text encoder,
 * guidance-embedded transformer) and Flux2KleinPipeline (--arch flux2-klein: Qwen3 text
 * encoder, step-wise distilled), each a whole folder in diffusers' layout: model_index.json,
 * scheduler/, tokenizer/ (tokenizer.json, tokenizer_config.json, special_tokens_map.json),
 * text_encoder/ (make_tiny_lm.c), transformer/ and vae/ (decoder half, post_quant_conv and
 * the batch-norm statistics).
 *
 * The tokenizers are small byte-level BPEs in the structure of the real files: Mistral's in
 * the tekken layout of FLUX.2-dev's (1000 control tokens first, then the 256 bytes at
 * 1000 + b, then merges; ignore_merges; the tekken split regex; "<s> $A" template; left
 * padding from LlamaTokenizerFast), Qwen3's as Qwen3's own (the bytes in ByteLevel order
 * from id 0, merges, then the 26 added tokens <|endoftext|> ... </think>; NFC; Qwen's split
 * regex; right padding from Qwen2Tokenizer). The text encoders have enough layers for the
 * pipelines' own hidden-state lists (10, 20, 30 and 9, 18, 27), so no option is needed.
 *
 * Sizes: the default is tiny (tests, demo). TINY_FLUX2_KLEIN_4B is FLUX.2 [klein] 4B's shape
 * (a 24 x 128 transformer with 5 + 20 blocks, Qwen3-4B's 36 layers at width 2560, the full
 * VAE decoder), for measuring a full-depth pipeline with random weights; the big components
 * are written in shards so that writing needs only a shard's memory.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "make_tiny_flux2.h"
#include "make_tiny_writer.h"

/* ---- tokenizers --------------------------------------------------------------------------- */

/* A growing text buffer. */
typedef struct text {
    char *p;
    size_t len, cap;
    bool oom;
} text;

static void tprintf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void tprintf(text *t, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = t->oom ? 0 : vsnprintf(t->p + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (t->oom || (size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = (t->cap + (size_t)n + 1) * 2;
        char *p = realloc(t->p, cap);
        if (!p) {
            t->oom = true;
            return;
        }
        t->p = p;
        t->cap = cap;
    }
}

/* The ByteLevel alphabet: printable Latin-1 bytes stand for themselves, the others are
 * shifted to U+0100 and up; `order` lists the bytes in the alphabet's own order (printable
 * first), as GPT-2-style vocabularies number them. */
static bool printable(int b)
{
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

static int byte_symbol(int b)
{
    if (printable(b))
        return b;
    int n = 0;
    for (int c = 0; c < b; c++)
        n += !printable(c);
    return 256 + n;
}

/* The byte whose symbol is the k-th smallest: the printable bytes in order, then the
 * others. */
static int nth_symbol_byte(int k)
{
    for (int pass = 0, seen = -1; pass < 2; pass++)
        for (int b = 0; b < 256; b++)
            if (printable(b) == (pass == 0) && ++seen == k)
                return b;
    return -1;
}

/* The JSON-escaped UTF-8 of the ByteLevel symbol of byte b. */
static void put_symbol(text *t, int b)
{
    int cp = byte_symbol(b);
    if (cp == '"' || cp == '\\')
        tprintf(t, "\\%c", cp);
    else if (cp < 0x80)
        tprintf(t, "%c", cp);
    else
        tprintf(t, "%c%c", 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F));
}

/* Merges of ByteLevel symbols ("\xc4\xa0" is U+0120, the space byte's symbol), each
 * making a new token. */
static const char *const merges[][2] = {
    {"\xc4\xa0", "t"}, {"i", "n"}, {"h", "e"}, {"\xc4\xa0", "a"}, {"o", "n"}, {"e", "r"},
    {"\xc4\xa0" "t", "he"}, {"a", "t"}, {"\xc4\xa0", "c"}, {"o", "r"}, {"\xc4\xa0", "s"},
    {"e", "n"}, {"\xc4\xa0", "o"}, {"\xc4\xa0" "c", "at"}, {"\xc4\xa0", "p"}, {"h", "o"},
};
#define N_MERGES (int)(sizeof merges / sizeof merges[0])

typedef struct added_token {
    const char *content;
    bool special;
} added_token;

static const char *const mistral_control[] = {
    "<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]",
    "[IMG_END]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]"};
enum { MISTRAL_CONTROL = 1000 };

static const added_token qwen_added[] = {
    {"<|endoftext|>", true}, {"<|im_start|>", true}, {"<|im_end|>", true},
    {"<|object_ref_start|>", true}, {"<|object_ref_end|>", true}, {"<|box_start|>", true},
    {"<|box_end|>", true}, {"<|quad_start|>", true}, {"<|quad_end|>", true},
    {"<|vision_start|>", true}, {"<|vision_end|>", true}, {"<|vision_pad|>", true},
    {"<|image_pad|>", true}, {"<|video_pad|>", true}, {"<tool_call>", false},
    {"</tool_call>", false}, {"<|fim_prefix|>", false}, {"<|fim_middle|>", false},
    {"<|fim_suffix|>", false}, {"<|fim_pad|>", false}, {"<|repo_name|>", false},
    {"<|file_sep|>", false}, {"<tool_response>", false}, {"</tool_response>", false},
    {"<think>", false}, {"</think>", false}};
#define N_QWEN_ADDED (int)(sizeof qwen_added / sizeof qwen_added[0])

static const char tekken_regex[] =
    "[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?[\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]*"
    "[\\\\p{Ll}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]+|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?"
    "[\\\\p{Lu}\\\\p{Lt}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]+[\\\\p{Ll}\\\\p{Lm}\\\\p{Lo}\\\\p{M}]*|"
    "\\\\p{N}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n/]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
static const char qwen_regex[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| ?"
    "[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";

static void added_entry(text *t, int id, const char *content, bool special, bool first)
{
    tprintf(t, "%s\n    {\"id\": %d, \"content\": \"%s\", \"single_word\": false, "
               "\"lstrip\": false, \"rstrip\": false, \"normalized\": false, \"special\": %s}",
            first ? "" : ",", id, content, special ? "true" : "false");
}

static void decoder_entry(text *t, int id, const char *content, bool special, bool first)
{
    tprintf(t, "%s\n    \"%d\": {\"content\": \"%s\", \"lstrip\": false, \"normalized\": false, "
               "\"rstrip\": false, \"single_word\": false, \"special\": %s}",
            first ? "" : ",", id, content, special ? "true" : "false");
}

/* The name of Mistral control token i (0 <= i < 1000). */
static const char *control_name(int i, char *buf, size_t cap)
{
    if (i < (int)(sizeof mistral_control / sizeof mistral_control[0]))
        return mistral_control[i];
    snprintf(buf, cap, "<SPECIAL_%d>", i);
    return buf;
}

/* Writes the tokenizer folder; *vocab receives the largest id + 1. */
static int write_tokenizer(const char *root, bool klein, int *vocab)
{
    char dir[4096], name[32];
    snprintf(dir, sizeof dir, "%s/tokenizer", root);
    if (tw_make_dir(dir))
        return -1;
    text t = {0}, c = {0};
    int first_byte = klein ? 0 : MISTRAL_CONTROL, base = first_byte + 256 + N_MERGES;
    *vocab = klein ? base + N_QWEN_ADDED : base;
    tprintf(&t, "{\n  \"version\": \"1.0\",\n  \"truncation\": null,\n  \"padding\": null,\n"
                "  \"added_tokens\": [");
    for (int i = 0; i < (klein ? N_QWEN_ADDED : MISTRAL_CONTROL); i++)
        added_entry(&t, klein ? base + i : i,
                    klein ? qwen_added[i].content : control_name(i, name, sizeof name),
                    klein ? qwen_added[i].special : true, i == 0);
    tprintf(&t, "\n  ],\n  \"normalizer\": %s,\n", klein ? "{\"type\": \"NFC\"}" : "null");
    tprintf(&t, "  \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": "
                "\"Split\", \"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", "
                "\"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false, "
                "\"trim_offsets\": %s, \"use_regex\": false}]},\n",
            klein ? qwen_regex : tekken_regex, klein ? "false" : "true");
    if (klein)
        tprintf(&t, "  \"post_processor\": {\"type\": \"ByteLevel\", \"add_prefix_space\": "
                    "false, \"trim_offsets\": false, \"use_regex\": false},\n  \"decoder\": "
                    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": "
                    "false, \"use_regex\": false},\n");
    else
        tprintf(&t, "  \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": "
                    "[{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, {\"Sequence\": "
                    "{\"id\": \"A\", \"type_id\": 0}}], \"pair\": [{\"SpecialToken\": {\"id\": "
                    "\"<s>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, "
                    "{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 1}}, {\"Sequence\": "
                    "{\"id\": \"B\", \"type_id\": 1}}], \"special_tokens\": {\"<s>\": {\"id\": "
                    "\"<s>\", \"ids\": [1], \"tokens\": [\"<s>\"]}}},\n  \"decoder\": {\"type\": "
                    "\"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true, "
                    "\"use_regex\": true},\n");
    tprintf(&t, "  \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": null, "
                "\"continuing_subword_prefix\": %s, \"end_of_word_suffix\": %s, \"fuse_unk\": "
                "false, \"byte_fallback\": false, \"ignore_merges\": %s,\n    \"vocab\": {",
            klein ? "\"\"" : "null", klein ? "\"\"" : "null", klein ? "false" : "true");
    int id = 0;
    for (int i = 0; !klein && i < MISTRAL_CONTROL; i++, id++)
        tprintf(&t, "%s\"%s\": %d", i ? ", " : "", control_name(i, name, sizeof name), id);
    /* bytes: Mistral numbers them in byte order, Qwen in the alphabet's order */
    for (int k = 0; k < 256; k++, id++) {
        int b = klein ? nth_symbol_byte(k) : k;
        tprintf(&t, "%s\"", id ? ", " : "");
        put_symbol(&t, b);
        tprintf(&t, "\": %d", id);
    }
    for (int m = 0; m < N_MERGES; m++, id++)
        tprintf(&t, ", \"%s%s\": %d", merges[m][0], merges[m][1], id);
    tprintf(&t, "},\n    \"merges\": [");
    for (int m = 0; m < N_MERGES; m++)
        tprintf(&t, "%s[\"%s\", \"%s\"]", m ? ", " : "", merges[m][0], merges[m][1]);
    tprintf(&t, "]\n  }\n}\n");

    /* tokenizer_config.json: the special tokens, padding side by tokenizer_class */
    tprintf(&c, "{\n  \"add_bos_token\": %s,\n", klein ? "false" : "true");
    if (!klein)
        tprintf(&c, "  \"add_eos_token\": false,\n");
    tprintf(&c, "  \"add_prefix_space\": %s,\n  \"added_tokens_decoder\": {",
            klein ? "false" : "null");
    for (int i = 0; i < (klein ? N_QWEN_ADDED : MISTRAL_CONTROL); i++)
        decoder_entry(&c, klein ? base + i : i,
                      klein ? qwen_added[i].content : control_name(i, name, sizeof name),
                      klein ? qwen_added[i].special : true, i == 0);
    if (klein)
        tprintf(&c, "\n  },\n  \"additional_special_tokens\": [\"<|im_start|>\", "
                    "\"<|im_end|>\", \"<|object_ref_start|>\", \"<|object_ref_end|>\", "
                    "\"<|box_start|>\", \"<|box_end|>\", \"<|quad_start|>\", \"<|quad_end|>\", "
                    "\"<|vision_start|>\", \"<|vision_end|>\", \"<|vision_pad|>\", "
                    "\"<|image_pad|>\", \"<|video_pad|>\"],\n  \"bos_token\": null,\n"
                    "  \"clean_up_tokenization_spaces\": false,\n  \"eos_token\": "
                    "\"<|im_end|>\",\n  \"errors\": \"replace\",\n  \"model_max_length\": "
                    "131072,\n  \"pad_token\": \"<|endoftext|>\",\n  \"split_special_tokens\": "
                    "false,\n  \"tokenizer_class\": \"Qwen2Tokenizer\",\n"
                    "  \"unk_token\": null\n}\n");
    else
        tprintf(&c, "\n  },\n  \"bos_token\": \"<s>\",\n  \"clean_up_tokenization_spaces\": "
                    "false,\n  \"eos_token\": \"</s>\",\n  \"extra_special_tokens\": {},\n"
                    "  \"legacy\": true,\n  \"model_max_length\": "
                    "1000000000000000019884624838656,\n  \"pad_token\": \"<pad>\",\n"
                    "  \"processor_class\": \"PixtralProcessor\",\n  \"tokenizer_class\": "
                    "\"LlamaTokenizerFast\",\n  \"unk_token\": \"<unk>\",\n"
                    "  \"use_default_system_prompt\": false,\n  \"padding_side\": \"left\"\n}\n");
    int rc = t.oom || c.oom ? -1 : 0;
    if (rc)
        fprintf(stderr, "diffuse make-tiny: out of memory for the tokenizer\n");
    rc = rc ? rc : tw_write_file(dir, "tokenizer.json", t.p);
    rc = rc ? rc : tw_write_file(dir, "tokenizer_config.json", c.p);
    rc = rc ? rc
            : tw_write_file(dir, "special_tokens_map.json",
                         klein ? "{\n  \"eos_token\": \"<|im_end|>\",\n  \"pad_token\": "
                                 "\"<|endoftext|>\"\n}\n"
                               : "{\n  \"bos_token\": \"<s>\",\n  \"eos_token\": \"</s>\",\n"
                                 "  \"pad_token\": \"<pad>\",\n  \"unk_token\": \"<unk>\"\n}\n");
    free(t.p);
    free(c.p);
    return rc;
}

/* ---- transformer ---------------------------------------------------------------------- */

static int write_transformer(const char *root, const tiny_flux2_sizes *z, bool guidance,
                             df_dtype dtype, uint64_t seed)
{
    const int64_t hd = z->head_dim, D = z->heads * hd, M = 3 * D, J = 3 * z->te.hidden;
    const int64_t C = 128; /* the VAE's 32 channels, patchified 2x2 */
    int a = (int)hd / 4;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"Flux2Transformer2DModel\",\n"
             "  \"_diffusers_version\": \"0.37.1\",\n  \"attention_head_dim\": %lld,\n"
             "  \"axes_dims_rope\": [%d, %d, %d, %d],\n  \"eps\": 1e-06,\n"
             "  \"guidance_embeds\": %s,\n  \"in_channels\": %lld,\n"
             "  \"joint_attention_dim\": %lld,\n  \"mlp_ratio\": 3.0,\n"
             "  \"num_attention_heads\": %d,\n  \"num_layers\": %d,\n"
             "  \"num_single_layers\": %d,\n  \"out_channels\": null,\n  \"patch_size\": 1,\n"
             "  \"rope_theta\": 2000,\n  \"timestep_guidance_channels\": 256\n}\n",
             (long long)hd, a, a, a, (int)hd - 3 * a, guidance ? "true" : "false", (long long)C,
             (long long)J, z->heads, z->double_blocks, z->single_blocks);
    tiny_writer w;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/transformer", root);
    if (tw_begin(&w, dir, "diffusion_pytorch_model", dtype, NULL, seed, z->shard_bytes) ||
        tw_write_file(w.dir, "config.json", cfg))
        return -1;
    tw_linear(&w, "x_embedder", D, C, false);
    tw_linear(&w, "context_embedder", D, J, false);
    tw_linear(&w, "time_guidance_embed.timestep_embedder.linear_1", D, 256, false);
    tw_linear(&w, "time_guidance_embed.timestep_embedder.linear_2", D, D, false);
    if (guidance) {
        tw_linear(&w, "time_guidance_embed.guidance_embedder.linear_1", D, 256, false);
        tw_linear(&w, "time_guidance_embed.guidance_embedder.linear_2", D, D, false);
    }
    tw_linear(&w, "double_stream_modulation_img.linear", 6 * D, D, false);
    tw_linear(&w, "double_stream_modulation_txt.linear", 6 * D, D, false);
    tw_linear(&w, "single_stream_modulation.linear", 3 * D, D, false);
    char p[256];
    for (int b = 0; b < z->double_blocks; b++) {
        static const char *const sq[] = {"attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0",
                                         "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                                         "attn.to_add_out"};
        for (int i = 0; i < 8; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s", b, sq[i]);
            tw_linear(&w, p, D, D, false);
        }
        static const char *const qk[] = {"norm_q", "norm_k", "norm_added_q", "norm_added_k"};
        for (int i = 0; i < 4; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.attn.%s", b, qk[i]);
            tw_norm(&w, p, hd, false);
        }
        static const char *const ff[] = {"ff", "ff_context"};
        for (int i = 0; i < 2; i++) {
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.linear_in", b, ff[i]);
            tw_linear(&w, p, 2 * M, D, false);
            snprintf(p, sizeof p, "transformer_blocks.%d.%s.linear_out", b, ff[i]);
            tw_linear(&w, p, D, M, false);
        }
    }
    for (int b = 0; b < z->single_blocks; b++) {
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.to_qkv_mlp_proj", b);
        tw_linear(&w, p, 3 * D + 2 * M, D, false);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.to_out", b);
        tw_linear(&w, p, D, D + M, false);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_q", b);
        tw_norm(&w, p, hd, false);
        snprintf(p, sizeof p, "single_transformer_blocks.%d.attn.norm_k", b);
        tw_norm(&w, p, hd, false);
    }
    tw_linear(&w, "norm_out.linear", 2 * D, D, false);
    tw_linear(&w, "proj_out", C, D, false);
    return tw_finish(&w);
}

/* ---- VAE (decoder half, post_quant_conv, batch-norm statistics) ------------------------- */

static void resnet(tiny_writer *w, const char *p, int cin, int cout)
{
    char n[256];
    snprintf(n, sizeof n, "%s.norm1", p);
    tw_norm(w, n, cin, true);
    snprintf(n, sizeof n, "%s.conv1", p);
    tw_conv(w, n, cout, cin, 3);
    snprintf(n, sizeof n, "%s.norm2", p);
    tw_norm(w, n, cout, true);
    snprintf(n, sizeof n, "%s.conv2", p);
    tw_conv(w, n, cout, cout, 3);
    if (cin != cout) {
        snprintf(n, sizeof n, "%s.conv_shortcut", p);
        tw_conv(w, n, cout, cin, 1);
    }
}

static int write_vae(const char *root, const tiny_flux2_sizes *z, df_dtype dtype, uint64_t seed)
{
    const int *ch = z->vae_channels, L = 32;
    char cfg[2048];
    snprintf(cfg, sizeof cfg,
             "{\n  \"_class_name\": \"AutoencoderKLFlux2\",\n"
             "  \"_diffusers_version\": \"0.37.1\",\n"
             "  \"act_fn\": \"silu\",\n  \"batch_norm_eps\": 0.0001,\n"
             "  \"batch_norm_momentum\": 0.1,\n  \"block_out_channels\": [%d, %d, %d, %d],\n"
             "  \"down_block_types\": [\"DownEncoderBlock2D\", \"DownEncoderBlock2D\", "
             "\"DownEncoderBlock2D\", \"DownEncoderBlock2D\"],\n  \"force_upcast\": true,\n"
             "  \"in_channels\": 3,\n  \"latent_channels\": %d,\n  \"layers_per_block\": %d,\n"
             "  \"mid_block_add_attention\": true,\n  \"norm_num_groups\": %d,\n"
             "  \"out_channels\": 3,\n  \"patch_size\": [2, 2],\n  \"sample_size\": 1024,\n"
             "  \"up_block_types\": [\"UpDecoderBlock2D\", \"UpDecoderBlock2D\", "
             "\"UpDecoderBlock2D\", \"UpDecoderBlock2D\"],\n  \"use_post_quant_conv\": true,\n"
             "  \"use_quant_conv\": true\n}\n",
             ch[0], ch[1], ch[2], ch[3], L, z->vae_layers, z->vae_groups);
    tiny_writer w;
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/vae", root);
    if (tw_begin(&w, dir, "diffusion_pytorch_model", dtype, NULL, seed, z->shard_bytes) ||
        tw_write_file(w.dir, "config.json", cfg))
        return -1;
    tw_add(&w, "bn.running_mean", SH(4 * L), 0.2f, 0);
    tw_add(&w, "bn.running_var", SH(4 * L), 0.05f, 1.0f);
    tw_conv(&w, "post_quant_conv", L, L, 1);
    int top = ch[3];
    tw_conv(&w, "decoder.conv_in", top, L, 3);
    resnet(&w, "decoder.mid_block.resnets.0", top, top);
    resnet(&w, "decoder.mid_block.resnets.1", top, top);
    tw_norm(&w, "decoder.mid_block.attentions.0.group_norm", top, true);
    static const char *const att[] = {"to_q", "to_k", "to_v", "to_out.0"};
    char n[256];
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "decoder.mid_block.attentions.0.%s", att[i]);
        tw_linear(&w, n, top, top, true);
    }
    int cin = top;
    for (int b = 0; b < 4; b++) {
        int cout = ch[3 - b];
        for (int r = 0; r <= z->vae_layers; r++) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.resnets.%d", b, r);
            resnet(&w, n, r ? cout : cin, cout);
        }
        if (b < 3) {
            snprintf(n, sizeof n, "decoder.up_blocks.%d.upsamplers.0.conv", b);
            tw_conv(&w, n, cout, cout, 3);
        }
        cin = cout;
    }
    tw_norm(&w, "decoder.conv_norm_out", ch[0], true);
    tw_conv(&w, "decoder.conv_out", 3, ch[0], 3);
    return tw_finish(&w);
}

/* ---- the pipeline folder ------------------------------------------------------------------ */

int tiny_write_flux2(const char *dir, bool klein, const tiny_flux2_sizes *z, df_dtype dtype,
                     uint64_t seed)
{
    char index[1024];
    snprintf(index, sizeof index,
             "{\n  \"_class_name\": \"%s\",\n  \"_diffusers_version\": \"0.37.1\",\n%s"
             "  \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
             "  \"text_encoder\": [\"transformers\", \"%s\"],\n"
             "  \"tokenizer\": [\"transformers\", \"%s\"],\n"
             "  \"transformer\": [\"diffusers\", \"Flux2Transformer2DModel\"],\n"
             "  \"vae\": [\"diffusers\", \"AutoencoderKLFlux2\"]\n}\n",
             klein ? "Flux2KleinPipeline" : "Flux2Pipeline",
             klein ? "  \"is_distilled\": true,\n" : "",
             klein ? "Qwen3ForCausalLM" : "Mistral3ForConditionalGeneration",
             klein ? "Qwen2TokenizerFast" : "PixtralProcessor");
    static const char sched[] =
        "{\n  \"_class_name\": \"FlowMatchEulerDiscreteScheduler\",\n"
        "  \"_diffusers_version\": \"0.37.1\",\n  \"base_image_seq_len\": 256,\n"
        "  \"base_shift\": 0.5,\n  \"invert_sigmas\": false,\n  \"max_image_seq_len\": 4096,\n"
        "  \"max_shift\": 1.15,\n  \"num_train_timesteps\": 1000,\n  \"shift\": 3.0,\n"
        "  \"shift_terminal\": null,\n  \"stochastic_sampling\": false,\n"
        "  \"time_shift_type\": \"exponential\",\n  \"use_beta_sigmas\": false,\n"
        "  \"use_dynamic_shifting\": true,\n  \"use_exponential_sigmas\": false,\n"
        "  \"use_karras_sigmas\": false\n}\n";
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/scheduler", dir);
    int vocab = 0;
    if (tw_write_file(dir, "model_index.json", index) || tw_make_dir(sub) ||
        tw_write_file(sub, "scheduler_config.json", sched) || write_tokenizer(dir, klein, &vocab))
        return -1;
    tiny_lm_sizes te = z->te;
    te.shard_bytes = z->shard_bytes;
    if (te.vocab < vocab)
        te.vocab = vocab;
    snprintf(sub, sizeof sub, "%s/text_encoder", dir);
    if ((klein ? tiny_write_qwen3 : tiny_write_mistral3)(sub, &te, dtype, seed + 1))
        return -1;
    if (write_transformer(dir, z, !klein, dtype, seed + 2) || write_vae(dir, z, dtype, seed + 3))
        return -1;
    return 0;
}
