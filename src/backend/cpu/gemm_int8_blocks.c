/*
 * Weights kept in their file's compact form, packed into the int8 layout one block of
 * DF_I8_NR channels at a time as the product reads them (gemm_int8.h, df_i8_blocks).
 *
 * Choices:
 * - The group is 32, the block of Q8_0, Q4_0 and Q5_0: those three are symmetric integers
 *   times one f16 scale per 32 values, so their integers go into the layout as they are
 *   and their scales are widened to f32 (exact). Q8_0 is read straight from its blocks;
 *   Q4_0 and Q5_0 through core/quant_blocks.c's dequantiser, whose every value is the
 *   integer times the scale, exactly, so dividing by the scale gives the integer back.
 * - Every other type (Q4_1, Q5_1, the K-quants) and fp8 are dequantised a row at a time to
 *   f32, ggml's exact values (fp8: the exact upcast times the tensor's scale, rounded once
 *   to f32), and quantized per group by df_i8_quantize_channel, as a float weight would
 *   be on load. Their offsets (Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) and 16-value sub-block
 *   scales (Q3_K, Q6_K) do not fit one symmetric scale per 32 values.
 * - A row's dequantised values are written into the thread's scratch, never a whole
 *   tensor.
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

/* Types whose blocks are int8-exact with one f16 scale per 32 values at their start. */
static bool is_exact(uint32_t type)
{
    return type == DF_GGML_Q8_0 || type == DF_GGML_Q4_0 || type == DF_GGML_Q5_0;
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
    *out = (df_i8_blocks){.n = n,
                          .k = k,
                          .type = type,
                          .scale = scale,
                          .data = data,
                          .row_bytes = row_bytes};
    return DF_OK;
}

df_i8_weight df_i8_blocks_shape(const df_i8_blocks *w)
{
    df_i8_weight s = {.n = w->n, .k = w->k};
    s.group = df_i8_group_for(w->k, GROUP);
    s.kp = (w->k + s.group - 1) / s.group * s.group;
    s.n_groups = s.kp / s.group;
    s.n_blocks = (w->n + DF_I8_NR - 1) / DF_I8_NR;
    return s;
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

static float f16_at(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return df_f16_to_f32(h);
}

/* One channel of an exact type: its integers and the f32 widening of its scales. */
static void exact_channel(const df_i8_blocks *w, const uint8_t *src, float *row, int8_t *q,
                          float *scale)
{
    const df_qblock_info *info = df_qblock_info_of(w->type);
    int64_t blocks = w->k / GROUP;
    if (w->type == DF_GGML_Q8_0) {
        for (int64_t g = 0; g < blocks; g++) {
            const uint8_t *b = src + g * info->bytes;
            scale[g] = f16_at(b);
            memcpy(q + g * GROUP, b + 2, GROUP);
        }
        return;
    }
    df_qblock_dequant(w->type, src, blocks, row); /* cannot fail: checked by _of */
    for (int64_t g = 0; g < blocks; g++) {
        float d = f16_at(src + g * info->bytes);
        scale[g] = d;
        for (int i = 0; i < GROUP; i++) {
            float v = d != 0.0f ? row[g * GROUP + i] / d : 0.0f;
            q[g * GROUP + i] = (int8_t)(v >= -128.0f && v <= 127.0f ? v : 0.0f);
        }
    }
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

void df_i8_blocks_pack(const df_i8_blocks *w, int64_t b, const df_i8_weight *shape,
                       void *scratch, df_i8_weight *out)
{
    scratch_layout l = layout_of(shape);
    char *mem = scratch;
    *out = *shape;
    out->n_blocks = 1;
    out->q = (int8_t *)(mem + l.q);
    out->scale = (float *)(mem + l.scale);
    out->corr = (int32_t *)(mem + l.corr);
    out->dnnl = NULL;
    memset(mem, 0, l.row); /* channels past n: zero values, scales and sums */
    float *row = (float *)(mem + l.row);
    int8_t *q = (int8_t *)(mem + l.qrow);
    float *scale = (float *)(mem + l.rscale);
    bool exact = is_exact(w->type) && shape->group == GROUP;
    for (int c = 0; c < DF_I8_NR && b * DF_I8_NR + c < w->n; c++) {
        const uint8_t *src = w->data + (size_t)(b * DF_I8_NR + c) * w->row_bytes;
        if (exact)
            exact_channel(w, src, row, q, scale);
        else
            requantized_channel(w, shape, src, row, q, scale);
        df_i8_place_channel(out, 0, c, q, scale);
    }
}
