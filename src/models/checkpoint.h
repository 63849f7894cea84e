/*
 * What a single checkpoint file holds: which model its transformer is and which
 * components are in it, recognised from the tensor names and shapes as diffusers'
 * single-file loader does (infer_diffusers_model_type): FLUX.1 by
 * double_blocks.0.img_attn.norm.key_norm.scale, dev vs schnell by guidance_in (fill and
 * depth by img_in's width), FLUX.2 by single_stream_modulation (dev vs klein by
 * guidance_in, which klein lacks), SD3 by
 * joint_blocks.0.context_block.adaLN_modulation.1.bias of width 9216 and pos_embed's
 * length (36864: SD3 medium, 147456: SD3.5 medium), SD3.5 large by joint_blocks.37; each
 * under no prefix or ComfyUI's "model.diffusion_model.". The other components by the names
 * their maps probe (names.h), anywhere in the file: the LDM VAE (FLUX.2's by its
 * bn.running_mean beside it), CLIP-L / CLIP-G (by ComfyUI's "clip_l" / "clip_g" prefixes,
 * else by width: 1280 is CLIP-G), T5, and a Mistral / Qwen3 language model (by
 * layers.0.post_attention_layernorm; Qwen3 by its q_norm under the same prefix).
 */
#ifndef DF_MODELS_CHECKPOINT_H
#define DF_MODELS_CHECKPOINT_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/status.h>

/* One tensor's name and shape, as the recognition reads them. */
typedef struct df_checkpoint_key {
    const char *name;
    int ndim;
    int64_t shape[4];
} df_checkpoint_key;

typedef struct df_checkpoint_parts {
    /* "FLUX.1-dev", "FLUX.1-schnell", "FLUX.1-fill", "FLUX.1-depth", "FLUX.2-dev",
     * "FLUX.2-klein", "SD3-medium",
     * "SD3.5-medium", "SD3.5-large", "SD3-like ...", "FLUX.1-dev (diffusers names)", ...,
     * or "" when the file holds no transformer diffuse knows */
    const char *model;
    bool transformer, vae, clip_l, clip_g, t5;
    bool vae_diffusers;  /* the VAE is in diffusers' names, not LDM's */
    bool t5_llamacpp;    /* the T5 is in llama.cpp's names (enc.blk.N.attn_q, ...) */
    bool gguf_tokenizer; /* a GGUF carrying llama.cpp's tokenizer (tokenizer.ggml.model) */
    bool gguf_tokenizer_t5; /* ... and it is T5's ("t5"), which diffuse reads */
    bool vae_flux2;      /* the VAE is AutoencoderKLFlux2 (it holds the latent batch norm) */
    bool qwen3, mistral; /* FLUX.2 klein's / dev's text encoder (transformers' names) */
    char transformer_prefix[64]; /* "", "model.diffusion_model." */
    /* The shipped config set for the file (shipped.h: its model and sizes), or "" with
     * shipped_why saying why there is none. */
    const char *shipped;
    char shipped_why[256];
} df_checkpoint_parts;

/* Every model name df_checkpoint_recognise_keys can give, NULL-terminated. */
extern const char *const df_checkpoint_models[];

/* Recognises a list of keys (any order). Never fails. */
void df_checkpoint_recognise_keys(const df_checkpoint_key *keys, int n, df_checkpoint_parts *out);

/* Recognises the safetensors or GGUF file `path` from its header. DF_E_IO, DF_E_FORMAT (as
 * the readers fail), DF_E_OOM. */
df_status df_checkpoint_recognise(const char *path, df_checkpoint_parts *out);

#endif
