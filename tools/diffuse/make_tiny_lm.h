/*
 * make-tiny's decoder-only text encoder folders (make_tiny_lm.c), for the FLUX.2 pipelines'
 * tiny models: `dir` becomes a component folder (config.json + model.safetensors, or its
 * shards with model.safetensors.index.json past sizes->shard_bytes) in transformers' own
 * layout. Both return 0, or -1 after printing the failure on stderr.
 */
#ifndef DIFFUSE_MAKE_TINY_LM_H
#define DIFFUSE_MAKE_TINY_LM_H

#include <stdint.h>

#include <diffuse/dtype.h>

typedef struct tiny_lm_sizes {
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab;
    int64_t shard_bytes; /* model.safetensors is split past this (0: 2 GiB) */
} tiny_lm_sizes;

/* Small enough for tests, with GQA (2 heads per KV head) and head_dim not hidden / heads.
 * FLUX.2 stacks 3 hidden states: joint_attention_dim = 3 * hidden. The FLUX.2 layer lists
 * (10, 20, 30 and 9, 18, 27) need at least 30 and 27 layers; a tiny pipeline with fewer
 * layers passes its own list to the encoder. */
#define TINY_LM_SIZES                                                                              \
    ((tiny_lm_sizes){.hidden = 32,                                                                 \
                     .intermediate = 64,                                                           \
                     .layers = 4,                                                                  \
                     .heads = 4,                                                                   \
                     .kv_heads = 2,                                                                \
                     .head_dim = 16,                                                               \
                     .vocab = 512})

/* Mistral3ForConditionalGeneration with a one-layer vision tower and the projector. */
int tiny_write_mistral3(const char *dir, const tiny_lm_sizes *z, df_dtype dtype, uint64_t seed);
/* Qwen3ForCausalLM with an untied lm_head. */
int tiny_write_qwen3(const char *dir, const tiny_lm_sizes *z, df_dtype dtype, uint64_t seed);

#endif
