/*
 * 8-bit matrix products with K-grouped scales (the int8 compute dtype).
 *
 *     out[m, n] = epilogue( sum_g  sa[m, g] * sw[n, g] * sum_{k in g} qa[m, k] qw[n, k] )
 *
 * Weights w [n, k] are quantized once, symmetrically, per output channel and per group of
 * `group` consecutive k (qw = round(w / sw) in [-127, 127], sw = max|w| / 127 over the
 * group); activations the same way per token (row) and group, on every call. Each group's
 * dot product is exact in int32; it is converted once and added to an f32 accumulator with
 * one multiply by the two scales and one fused multiply-add, in group order. The epilogue
 * adds the bias, applies the activation or the gated residual and writes f32 or bf16 rows.
 *
 * Every path computes the same integers and the same f32 operations in the same order, so
 * all paths give bit-identical results:
 * - avx512-vnni: the project's micro-kernel, vpdpbusd on 512-bit registers (u8 x s8: the
 *   activations are stored shifted by +128 and each group's accumulator starts at
 *   -128 * (the group's weight column sum), which cancels the shift exactly);
 * - avx-vnni: the same on 256-bit registers (VEX AVX-VNNI, or EVEX AVX512-VNNI + VL);
 * - avx2: CPUs without VNNI (vpmaddubsw on the activations taken back to signed, which
 *   reaches the same integers; see gemm_int8_x86.c);
 * - portable: plain C, for any CPU.
 * - onednn: oneDNN's u8 x s8 matmul (AMX-INT8 where the CPU has it), for whole-k groups
 *   only (oneDNN 2.6 scales per output channel, not per group); it agrees with the others
 *   to f32 rounding, not bit for bit. Weights with groups run on the best other path.
 * The path is picked at run time: the best kernel of the project's own the CPU has (the VNNI
 * kernels, else AVX2, else portable), and for whole-k groups that kernel or oneDNN, which
 * ever measured faster at that shape on this CPU (df_i8_whole_k_path); DIFFUSE_INT8_PATH=
 * portable|avx2|avx-vnni|avx512-vnni|onednn or df_i8_force_path() forces one the CPU has,
 * for the process; a device opened with int8_path=NAME (df_kernel_env.int8_path, from
 * df_ctx_opts.int8_path) forces one for its own kernels.
 */
#ifndef DF_BACKEND_CPU_GEMM_INT8_H
#define DF_BACKEND_CPU_GEMM_INT8_H

#include <stdbool.h>
#include <stdint.h>

#include <diffuse/dtype.h>

#include "backend/cpu/cpu_device.h"
#include "core/int8_quant.h"
#include "core/int8_tiles.h"
#include "core/status.h"

typedef enum df_i8_path {
    DF_I8_PATH_AUTO,
    DF_I8_PATH_PORTABLE,
    DF_I8_PATH_AVX2,
    DF_I8_PATH_AVX_VNNI,
    DF_I8_PATH_AVX512_VNNI,
    DF_I8_PATH_ONEDNN,
    DF_I8_PATH_COUNT,
} df_i8_path;

#define DF_I8_NR DF_I8_TILE_NR /* output channels per packed block (core/int8_tiles.h) */
#define DF_I8_MR 8             /* rows per micro-tile */

/* A quantized, packed weight [n, k]. k is padded with zeros to kp (a multiple of 4 and of
 * the group); n to whole blocks of DF_I8_NR channels (scale 0). */
typedef struct df_i8_weight {
    int64_t n, k, kp, group, n_groups, n_blocks;
    int8_t *q;     /* [n_blocks][kp / 4][DF_I8_NR][4] */
    float *scale;  /* [n_blocks][n_groups][DF_I8_NR] */
    int32_t *corr; /* [n_blocks][n_groups][DF_I8_NR]: -128 * sum of the group's q */
    void *dnnl;    /* the oneDNN path's form of it, made on first use there */
} df_i8_weight;

/* Quantized activations [m, kp]: u8 (q + 128) and per-row group scales [m][n_groups]. */
typedef struct df_i8_act {
    int64_t m, kp, group, n_groups;
    uint8_t *q;
    float *scale;
} df_i8_act;

/* Bytes of a packed weight of [n, k] with that group (what df_i8_weight_pack allocates). */
size_t df_i8_weight_bytes(int64_t n, int64_t k, int64_t group);

/* Quantizes (df_i8_quantize_channel) and packs w [n, k] (rows ldw elements apart, dtype f32,
 * bf16 or f16; `group` as df_i8_groups_of takes it) into one allocation of
 * df_i8_weight_bytes; free with df_i8_weight_free. Uses the calling thread's OpenMP team. */
df_status df_i8_weight_pack(const void *w, df_dtype type, int64_t n, int64_t k, int64_t ldw,
                            int64_t group, df_i8_weight **out);
void df_i8_weight_free(void *w);
/* The same from values already quantized (df_int8_quantize's q [n, k] and scale
 * [n, n_groups]): the same packed weight as quantizing their source. */
df_status df_i8_weight_from_plain(const int8_t *q, const float *scale, int64_t n, int64_t k,
                                  int64_t group, df_i8_weight **out);

/* A weight saved in the kernels' tiles (core/int8_tiles.h: n a multiple of DF_I8_NR, k of 4,
 * `group` as df_i8_weight_pack takes it): q [n / NR][k / 4][NR][4] and scale
 * [n / NR][groups][NR] are used where they are (the caller keeps them alive, e.g. a file
 * mapping); the one allocation, df_i8_tiles_bytes, holds the header and the group sums
 * (corr), computed here in one pass over q. Free with df_i8_weight_free. DF_E_ARG for a
 * shape that is not whole tiles. */
size_t df_i8_tiles_bytes(int64_t n, int64_t k, int64_t group);
df_status df_i8_weight_from_tiles(const int8_t *q, const float *scale, int64_t n, int64_t k,
                                  int64_t group, df_i8_weight **out);
/* Weights made by df_i8_weight_from_tiles in this process so far: the tests' proof that a
 * saved folder's tiles were used in place (the results are the same bits either way). */
int64_t df_i8_tiles_in_place(void);

/* Bytes of scratch for the activations of m rows (df_i8_act_init places them there). */
size_t df_i8_act_bytes(const df_i8_weight *w, int64_t m);
/* Quantizes x [m, k] (rows ldx elements apart, f32 or bf16) into `scratch`. */
void df_i8_act_quantize(const df_i8_weight *w, const void *x, df_dtype type, int64_t m,
                        int64_t ldx, void *scratch, df_i8_act *out);

/* The epilogue: out = act(acc + bias), or residual + gate * (acc + bias) when gate is set. */
typedef struct df_i8_epilogue {
    const float *bias;     /* [n] or NULL */
    int act;               /* DF_GEMM_ACT_* (not with gate) */
    const float *gate;     /* [n] or NULL */
    const float *residual; /* rows of n, ldr apart (with gate) */
    int64_t ldr;
    void *out;             /* rows of n, ldc apart */
    int64_t ldc;
    bool out_bf16;
} df_i8_epilogue;

/* out = epilogue(a w^T) on `path` (AUTO: the dispatched one), using the calling thread's
 * OpenMP team unless called inside a parallel region. */
df_status df_i8_gemm(const df_i8_act *a, const df_i8_weight *w, const df_i8_epilogue *e,
                     df_i8_path path);

/*
 * Weights kept in their file's compact form (gemm_int8_blocks.c): GGUF blocks (ggml types
 * with a dequantiser in core/quant_blocks.c) or fp8 times a per-tensor scale. Nothing is
 * kept besides the file's bytes: each product packs the weight into the int8 layout one
 * block of DF_I8_NR channels at a time, in each thread's scratch:
 * - Q8_0, Q4_0, Q5_0 (integers times one scale per 32 values) and Q3_K, Q6_K (per 16)
 *   take that run as the group: their integers and scales (widened to f32, exactly) are
 *   placed as they are, so the product is the one of ggml's dequantised weights with no
 *   rounding of the weight;
 * - every other type, and fp8, is dequantised a row at a time to f32 (ggml's values,
 *   fp8's exact upcast times its scale) and quantized per group of 32 (the whole k when
 *   32 does not divide it) by the usual rule.
 */
typedef struct df_i8_blocks {
    int64_t n, k;
    uint32_t type;       /* ggml type id, or DF_QBLOCK_F8_E4M3 / _E5M2 */
    float scale;         /* fp8: the tensor's scale (1 when it has none) */
    const uint8_t *data; /* n rows of row_bytes */
    size_t row_bytes;
} df_i8_blocks;

/* The weight of a view with block_type set: DF_E_UNSUPPORTED naming the type when there
 * is no packer for it, DF_E_FORMAT when k is not whole blocks of it. */
df_status df_i8_blocks_of(const void *data, uint32_t type, float scale, int64_t n, int64_t k,
                          df_i8_blocks *out);
/* The packed weight's dimensions (kp, group, n_groups, n_blocks; no data), which the
 * activations are quantized for. */
df_i8_weight df_i8_blocks_shape(const df_i8_blocks *w);
/* Bytes of one thread's scratch for packing a block. */
size_t df_i8_blocks_scratch(const df_i8_weight *shape);
/* Packs block b (channels b * DF_I8_NR ...) into *out, a one-block weight of `shape` whose
 * arrays are placed in scratch (64-byte aligned, df_i8_blocks_scratch bytes). */
void df_i8_blocks_pack(const df_i8_blocks *w, int64_t b, const df_i8_weight *shape, void *scratch,
                       df_i8_weight *out);
/* out = epilogue(a w^T), packing w block by block on the calling thread's OpenMP team. */
df_status df_i8_gemm_blocks(const df_i8_act *a, const df_i8_blocks *w, const df_i8_epilogue *e,
                            df_i8_path path);

/* The path of a whole-k product (w->n_groups == 1) when none is forced: the best kernel of
 * the project's own, or DF_I8_PATH_ONEDNN where oneDNN measured faster for w's (k, n) on
 * this many threads (int8_choice.c: timed once per CPU and shape class, the verdict cached on
 * disk and read back by later processes). DIFFUSE_INT8_GEMM=own|onednn|auto overrides (DF_E_ARG
 * for another value, DF_E_UNSUPPORTED for onednn on a CPU whose oneDNN has no exact int8
 * products). Grouped weights get the own kernel. `how` (may be NULL) says where the answer
 * came from. */
df_status df_i8_whole_k_path(const df_i8_weight *w, df_i8_path *out, char *how, size_t cap);
/* Forgets the verdicts taken in this process (the next product reads the file again). */
void df_i8_choice_forget(void);
/* The cache file of the verdict for (k, n) on `threads` ("" without a cache folder). */
void df_i8_choice_file(int64_t k, int64_t n, int threads, char *out, size_t cap);

/* Whether this CPU can run `path`; the dispatched path; its name. */
bool df_i8_path_available(df_i8_path path);
df_i8_path df_i8_path_best(void);
const char *df_i8_path_name(df_i8_path path);
/* Makes AUTO mean `path` from now on (AUTO restores cpuid dispatch); DF_E_UNSUPPORTED when
 * the CPU lacks it. */
df_status df_i8_force_path(df_i8_path path);
/* The path named `name` (df_i8_path_name's names but "auto"): DF_E_ARG for another name,
 * DF_E_UNSUPPORTED for a kernel this CPU lacks. */
df_status df_i8_path_parse(const char *name, df_i8_path *out);
/* Products (df_i8_gemm, df_i8_gemm_blocks calls) run on `path` in this process so far: the
 * tests' proof of which kernel a setting picked, since our kernels agree bit for bit. */
int64_t df_i8_products(df_i8_path path);

/*
 * Linear layers in int8 compute (gemm.c's df_gemm_linear with compute DF_DTYPE_I8).
 *
 * df_i8_linear_applies: whether this linear runs in int8: w is a 2-D weight storage
 * (is_weight) that the quantization policy did not keep in higher precision
 * (keep_precision), in f32, bf16 or f16. Other linears compute in f32.
 * df_i8_linear: quantizes w once into a derived form kept on its storage (keyed by the
 * group, and dropped with the other derived forms when the weight is released), drops the
 * file's pages of w, quantizes x per call into env's scratch, and runs the product with
 * the epilogue. The group is env's int8_group (df_ctx_opts.int8_group), else
 * df_i8_default_group (core/int8_quant.h: DIFFUSE_INT8_GROUP, default 128); the
 * path is env's int8_path, else as df_i8_gemm's AUTO dispatches.
 */
bool df_i8_linear_applies(const df_view *w);
df_status df_i8_linear(df_kernel_env *env, const df_view *x, int64_t m, const df_view *w,
                       const df_view *bias, const df_i8_epilogue *e);

#endif
