/*
 * Weights kept in their file's compact form, packed into the int8 layout one block of
 * DF_I8_NR channels at a time as the product reads them (gemm_int8.h, df_i8_blocks).
 *
 * Choices:
 * - Types that are small integers times one scale per run of values (core/quant_blocks.h,
 *   df_qblock_run: Q8_0, Q4_0, Q5_0 per 32, Q3_K and Q6_K per 16) take their run as the
 *   group: their integers go into the layout as they are, their scales widened to f32
 *   (exact), so the product is the one of ggml's weights with no rounding of the weight
 *   (Q6_K: of the exact d * sc * q, which ggml rounds to f32 once more). Q8_0's integers
 *   are read straight from its blocks.
 * - Every other type (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K: an offset per run, which a symmetric
 *   scale cannot hold) and fp8 are dequantised a row at a time to f32, ggml's values (fp8:
 *   the exact upcast times the tensor's scale, rounded once to f32), and quantized per group
 *   of 32 by df_i8_quantize_channel, as a float weight is on load.
 * - A row's values are written into the thread's scratch, never a whole tensor.
 */
#include <math.h>
#include <string.h>

#include <diffuse/dtype.h>

#include "backend/cpu/gemm_int8.h"
#include "backend/cpu/gemm_int8_impl.h"
#include "core/quant_blocks.h"

#define GROUP 32

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

static bool is_fp8(uint32_t type)
{
    return type == DF_QBLOCK_F8_E4M3 || type == DF_QBLOCK_F8_E5M2;
}

df_status df_i8_blocks_of(const void *data, uint32_t type, float scale, int64_t n, int64_t k,
                          df_i8_blocks *out)
{
    memset(out, 0, sizeof *out);
    size_t row_bytes;
    if (is_fp8(type)) {
        row_bytes = (size_t)k;
    } else {
        const df_qblock_info *q = df_qblock_info_of(type);
        if (!q || !q->dequant || q->block == 1)
            return df_errorf(DF_E_UNSUPPORTED,
                             "int8: no packing for weights of ggml type %s (%u) kept in "
                             "their blocks",
                             q ? q->name : "unknown", (unsigned)type);
        if (k % q->block)
            return df_errorf(DF_E_FORMAT,
                             "int8: a %s weight's rows of %lld values are not whole blocks "
                             "of %d",
                             q->name, (long long)k, q->block);
        row_bytes = (size_t)(k / q->block) * (size_t)q->bytes;
    }
    *out = (df_i8_blocks){
        .n = n, .k = k, .type = type, .scale = scale, .data = data, .row_bytes = row_bytes};
    return DF_OK;
}

/* The group of a type: its run where it has one, else 32. */
static int64_t group_of(uint32_t type)
{
    int run = is_fp8(type) ? 0 : df_qblock_run(type);
    return run ? run : GROUP;
}

df_i8_weight df_i8_blocks_shape(const df_i8_blocks *w)
{
    df_i8_groups g = df_i8_groups_of(w->k, group_of(w->type));
    return (df_i8_weight){.n = w->n,
                          .k = w->k,
                          .kp = g.kp,
                          .group = g.group,
                          .n_groups = g.n_groups,
                          .n_blocks = (w->n + DF_I8_NR - 1) / DF_I8_NR};
}

/* Where each array of a packed block (and a row's working space) sits in the scratch. */
typedef struct scratch_layout {
    size_t q, scale, corr, row, qrow, rscale, bytes;
} scratch_layout;

static scratch_layout layout_of(const df_i8_weight *s)
{
    scratch_layout l;
    size_t per_block = (size_t)(s->n_groups * DF_I8_NR);
    l.q = 0;
    l.scale = l.q + round64((size_t)(s->kp * DF_I8_NR));
    l.corr = l.scale + round64(per_block * sizeof(float));
    l.row = l.corr + round64(per_block * sizeof(int32_t));
    l.qrow = l.row + round64((size_t)s->kp * sizeof(float));
    l.rscale = l.qrow + round64((size_t)s->kp);
    l.bytes = l.rscale + round64((size_t)s->n_groups * sizeof(float));
    return l;
}

size_t df_i8_blocks_scratch(const df_i8_weight *shape)
{
    return layout_of(shape).bytes;
}

/* One channel of a type with runs: its integers and the f32 widening of its scales. */
static void exact_channel(const df_i8_blocks *w, const uint8_t *src, float *work, int8_t *q,
                          float *scale)
{
    const df_qblock_info *info = df_qblock_info_of(w->type);
    df_qblock_ints(w->type, src, w->k / info->block, work, q, scale); /* checked by _of */
}

/* One channel of any other type: dequantised to f32, then quantized per group. */
static void requantized_channel(const df_i8_blocks *w, const df_i8_weight *s, const uint8_t *src,
                                float *row, int8_t *q, float *scale)
{
    if (w->type == DF_QBLOCK_F8_E4M3) {
        for (int64_t i = 0; i < w->k; i++)
            row[i] = df_f8_e4m3_to_f32(src[i]) * w->scale;
    } else if (w->type == DF_QBLOCK_F8_E5M2) {
        for (int64_t i = 0; i < w->k; i++)
            row[i] = df_f8_e5m2_to_f32(src[i]) * w->scale;
    } else {
        const df_qblock_info *info = df_qblock_info_of(w->type);
        df_qblock_dequant(w->type, src, w->k / info->block, row);
    }
    memset(row + w->k, 0, (size_t)(s->kp - w->k) * sizeof(float));
    df_i8_quantize_channel(row, s->group, s->n_groups, q, scale);
}

void df_i8_blocks_pack(const df_i8_blocks *w, int64_t b, const df_i8_weight *shape, void *scratch,
                       df_i8_weight *out)
{
    scratch_layout l = layout_of(shape);
    char *mem = scratch;
    *out = *shape;
    out->n_blocks = 1;
    out->q = (int8_t *)(mem + l.q);
    out->scale = (float *)(mem + l.scale);
    out->corr = (int32_t *)(mem + l.corr);
    out->dnnl = NULL;
    if ((b + 1) * DF_I8_NR > w->n) /* channels past n: zero values, scales and sums */
        memset(mem, 0, l.row);
    float *row = (float *)(mem + l.row);
    int8_t *q = (int8_t *)(mem + l.qrow);
    float *scale = (float *)(mem + l.rscale);
    bool exact = !is_fp8(w->type) && shape->group == df_qblock_run(w->type);
    for (int c = 0; c < DF_I8_NR && b * DF_I8_NR + c < w->n; c++) {
        const uint8_t *src = w->data + (size_t)(b * DF_I8_NR + c) * w->row_bytes;
        if (exact)
            exact_channel(w, src, row, q, scale);
        else
            requantized_channel(w, shape, src, row, q, scale);
        df_i8_place_channel(out, 0, c, q, scale);
    }
}
