/*
 * ggml's block-quantised element types: their sizes, and dequantisation block by block.
 *
 * A block of `block` values is stored in `bytes` bytes (a scale or two in f16, then packed
 * integers). The type ids are ggml's own (they are what a GGUF file stores). The io layer
 * uses this table to validate tensor sizes; readers and the CPU backend use the dequantisers,
 * which turn whole blocks into f32 exactly as ggml's reference C code (and the `gguf`
 * package's numpy code) do: every product and difference rounded to f32 in the same order.
 */
#ifndef DF_CORE_QUANT_BLOCKS_H
#define DF_CORE_QUANT_BLOCKS_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/status.h>

/* ggml type ids (enum ggml_type). */
enum {
    DF_GGML_F32 = 0,   DF_GGML_F16 = 1,   DF_GGML_Q4_0 = 2,  DF_GGML_Q4_1 = 3,
    DF_GGML_Q5_0 = 6,  DF_GGML_Q5_1 = 7,  DF_GGML_Q8_0 = 8,  DF_GGML_Q8_1 = 9,
    DF_GGML_Q2_K = 10, DF_GGML_Q3_K = 11, DF_GGML_Q4_K = 12, DF_GGML_Q5_K = 13,
    DF_GGML_Q6_K = 14, DF_GGML_Q8_K = 15, DF_GGML_I8 = 24,   DF_GGML_I16 = 25,
    DF_GGML_I32 = 26,  DF_GGML_I64 = 27,  DF_GGML_F64 = 28,  DF_GGML_BF16 = 30,
};

/* Not ggml types: fp8 weights kept as stored (df_view.block_type), one byte per value. */
enum { DF_QBLOCK_F8_E4M3 = 0x100, DF_QBLOCK_F8_E5M2 = 0x101 };

typedef struct df_qblock_info {
    const char *name; /* "Q4_K", "F16", ... */
    int block;        /* values per block */
    int bytes;        /* bytes per block */
    bool dequant;     /* df_qblock_dequant converts it */
} df_qblock_info;

/* The type with ggml id `type`, or NULL when the id is not a ggml type. */
const df_qblock_info *df_qblock_info_of(uint32_t type);

/*
 * Dequantises `nblocks` whole blocks of `type` at `src` (any alignment) into `dst`
 * (nblocks * block floats). DF_E_UNSUPPORTED (naming the type) when the type has no
 * dequantiser here; nothing is written then.
 */
df_status df_qblock_dequant(uint32_t type, const void *src, int64_t nblocks, float *dst);

/*
 * Types whose values are small integers times one scale per run of `run` consecutive values
 * (Q8_0, Q4_0, Q5_0: runs of 32, the block; Q3_K, Q6_K: runs of 16): the run, else 0.
 */
int df_qblock_run(uint32_t type);

/*
 * The integers (nblocks * block of them, in [-128, 127]) and run scales (nblocks * block /
 * run, f32) of whole blocks of such a type; `work` holds one block of floats. scale * q is
 * ggml's value exactly, except Q6_K's, which ggml rounds to f32 once more (d * sc * q).
 * DF_E_UNSUPPORTED for any other type.
 */
df_status df_qblock_ints(uint32_t type, const void *src, int64_t nblocks, float *work, int8_t *q,
                         float *scale);

#endif
