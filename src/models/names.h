/*
 * Name maps: where a diffusers tensor lives in a checkpoint written with other names
 * (Black Forest Labs' originals, ComfyUI's prefixed files, city96's GGUFs). Each model
 * owns its map (names_<model>.c); the loader (single_file.c) applies it while binding, so
 * nothing is converted or copied on disk.
 */
#ifndef DF_MODELS_NAMES_H
#define DF_MODELS_NAMES_H

#include <stdbool.h>
#include <stddef.h>

/* A diffusers tensor as rows of an original one: the original's first dimension cut in
 * `units` equal parts, and parts [part[i][0], part[i][1]) for i < n concatenated. */
typedef struct df_name_src {
    char name[256];
    int units;
    int n;
    int part[2][2];
    bool transpose; /* a 2-D original stored transposed (read whole, then transposed) */
    int rope_head_dim; /* > 0: rows stored in Mistral's rotary order, heads of this many rows
                        * (each head's rows interleaved pairs, where transformers has halves) */
} df_name_src;

/* Fills *out for diffusers tensor `diffusers`; false when the map has no such name. `arg` is
 * what the model's loader knows from its config and the map needs (the VAE's number of up
 * blocks, which LDM's names count the other way); maps that need nothing ignore it. */
typedef bool (*df_name_map)(const char *diffusers, int arg, df_name_src *out);

/* A map as a table: diffusers name -> original name, '*' standing for a block index and a
 * pattern ending in '.' for the last word ("weight" / "bias"), with the parts of the
 * original's rows that make the diffusers tensor (in `units` equal parts). */
typedef struct df_name_rule {
    const char *diffusers, *original;
    int units, n;
    int part[2][2];
} df_name_rule;

/* The whole original tensor; its second half then its first (scale and shift swapped); its
 * i-th third (a fused qkv). */
/* clang-format off */
#define DF_NAME_WHOLE    1, 1, {{0, 1}}
#define DF_NAME_SWAPPED  2, 2, {{1, 2}, {0, 1}}
#define DF_NAME_THIRD(i) 3, 1, {{i, i + 1}}
/* clang-format on */

/* Names every diffusers-named FLUX.1 / FLUX.2 / SD3 transformer and AutoencoderKL holds:
 * with df_names_same they find the prefix a file puts before diffusers' own names
 * (stable-diffusion.cpp's convert without --convert-name: "model.diffusion_model.", "vae."). */
const char *df_names_diffusers_transformer_probe(void);
const char *df_names_diffusers_vae_probe(void);

/* Fills *out from the first rule matching `diffusers`; false when none does. */
bool df_names_lookup(const df_name_rule *rules, size_t n, const char *diffusers, df_name_src *out);

/* FLUX.1 (FluxTransformer2DModel) in BFL's layout, and a name every such file holds. */
bool df_names_flux_bfl(const char *diffusers, int arg, df_name_src *out);
const char *df_names_flux_probe(void);
/* The part of that map FLUX.2's BFL layout shares (attention, QK norms, final layer). */
bool df_names_flux_bfl_shared(const char *diffusers, df_name_src *out);

/* SD3 / SD3.5 (SD3Transformer2DModel) in the original MMDiT layout (joint_blocks.N.x_block /
 * context_block); arg = num_layers (the last block's context modulation is swapped). */
bool df_names_sd3_mmdit(const char *diffusers, int arg, df_name_src *out);
const char *df_names_sd3_probe(void);

/* FLUX.2 (Flux2Transformer2DModel) in BFL's FLUX.2 layout. names_flux2.c. */
bool df_names_flux2_bfl(const char *diffusers, int arg, df_name_src *out);
const char *df_names_flux2_probe(void);

/* AutoencoderKL in the original (LDM / BFL ae.safetensors) layout; arg = the number of up
 * blocks (len(block_out_channels)), with DF_NAMES_VAE_NESTED_QUANT added for FLUX.2's
 * ae.safetensors (encoder.quant_conv / decoder.post_quant_conv). names_vae.c. */
#define DF_NAMES_VAE_NESTED_QUANT 0x10000
bool df_names_vae_ldm(const char *diffusers, int arg, df_name_src *out);
const char *df_names_vae_probe(void);
/* A name only AutoencoderKLFlux2 files hold (the latent batch norm), in every layout. */
const char *df_names_vae_flux2_probe(void);

/* Text encoders (names_text.c). transformers' own names under a prefix (ComfyUI's
 * "text_encoders.clip_l.transformer.", or none): the identity. */
bool df_names_same(const char *diffusers, int arg, df_name_src *out);
/* A CLIP text model saved without its "text_model." level (text_projection stays). */
bool df_names_clip_bare(const char *diffusers, int arg, df_name_src *out);
/* Names every CLIP text model / T5 encoder file holds, with and without "text_model.". */
const char *df_names_clip_probe(void);
const char *df_names_clip_bare_probe(void);
const char *df_names_t5_probe(void);
/* A CLIP text model in OpenCLIP's layout (transformer.resblocks.N with a fused in_proj,
 * ln_final, text_projection stored [width, proj]), as diffusers' convert_open_clip_checkpoint
 * reads it, and a name every such file holds. */
bool df_names_clip_openclip(const char *diffusers, int arg, df_name_src *out);
const char *df_names_clip_openclip_probe(void);
/* A T5 encoder in llama.cpp's names (token_embd, enc.blk.N.attn_q, ..., enc.output_norm), as
 * llama.cpp's and city96's T5 GGUFs hold it, and a name every such file holds. */
bool df_names_t5_llamacpp(const char *diffusers, int arg, df_name_src *out);
const char *df_names_t5_llamacpp_probe(void);
/* A name every Mistral / Qwen3 language model file holds and CLIP / T5 files do not
 * (under "model.", ComfyUI's "text_encoders.<name>.transformer.model." or none), and one
 * only Qwen3 holds (its per-head q norm). */
const char *df_names_lm_probe(void);
/* A Mistral / Qwen3 file whose language model sits under some prefix, read with
 * transformers' names for the config's class: arg picks the class's own prefix, which the
 * map takes off (DF_NAMES_LM_ROOT: MistralModel / Qwen3Model, DF_NAMES_LM_MODEL: *ForCausalLM,
 * DF_NAMES_LM_LANGUAGE_MODEL: Mistral3ForConditionalGeneration); a name without it is not
 * in the file. */
enum { DF_NAMES_LM_ROOT, DF_NAMES_LM_MODEL, DF_NAMES_LM_LANGUAGE_MODEL };
bool df_names_lm(const char *diffusers, int arg, df_name_src *out);
const char *df_names_lm_class_prefix(int arg);
const char *df_names_qwen3_probe(void);
/* A Mistral language model in Mistral's own names (consolidated.safetensors: tok_embeddings,
 * layers.N.attention.wq/wk/wv/wo, feed_forward.w1/w2/w3, attention_norm, ffn_norm, norm),
 * as transformers' convert_mistral_weights_to_hf.py maps them: wq and wk rows permuted back
 * from the rotary layout. arg = DF_NAMES_MISTRAL_ARG(class layout, head_dim). */
#define DF_NAMES_MISTRAL_ARG(layout, head_dim) ((layout) | (int)(head_dim) << 4)
bool df_names_mistral_consolidated(const char *diffusers, int arg, df_name_src *out);
const char *df_names_mistral_consolidated_probe(void);

#endif
