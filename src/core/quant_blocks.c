/*
 * ggml block types: the size table and the dequantisers.
 *
 * Each dequantiser turns one block into f32 with the arithmetic of ggml's reference C code
 * (ggml-quants.c), which the `gguf` package's numpy code repeats: the f16 scales are widened
 * to f32, a sub-block's scale is formed first (d * sc) and then applied to each integer
 * (scale * q - min), every step rounded to f32. The build turns off implicit fused
 * multiply-adds, so these match the reference bit for bit. Bytes are read one at a time and
 * multi-byte fields assembled little-endian, so the source may have any alignment.
 *
 * The block layouts (QK_K = 256 values per super-block):
 *   Q4_0  d, qs[16]                 Q4_1  d, m, qs[16]
 *   Q5_0  d, qh[4], qs[16]          Q5_1  d, m, qh[4], qs[16]
 *   Q8_0  d, qs[32] (int8)
 *   Q2_K  scales[16], qs[64], d, dmin
 *   Q3_K  hmask[32], qs[64], scales[12], d
 *   Q4_K  d, dmin, scales[12], qs[128]
 *   Q5_K  d, dmin, scales[12], qh[32], qs[128]
 *   Q6_K  ql[128], qh[64], scales[16] (int8), d
 */
#include "core/quant_blocks.h"

#include <math.h>
#include <string.h>

#include <diffuse/dtype.h>

#include "core/status.h"

#define QK_K 256

static const struct {
    uint32_t id;
    df_qblock_info info;
} table[] = {
    {0, {"F32", 1, 4, true}},          {1, {"F16", 1, 2, true}},
    {2, {"Q4_0", 32, 18, true}},       {3, {"Q4_1", 32, 20, true}},
    {6, {"Q5_0", 32, 22, true}},       {7, {"Q5_1", 32, 24, true}},
    {8, {"Q8_0", 32, 34, true}},       {9, {"Q8_1", 32, 36, false}},
    {10, {"Q2_K", 256, 84, true}},     {11, {"Q3_K", 256, 110, true}},
    {12, {"Q4_K", 256, 144, true}},    {13, {"Q5_K", 256, 176, true}},
    {14, {"Q6_K", 256, 210, true}},    {15, {"Q8_K", 256, 292, false}},
    {16, {"IQ2_XXS", 256, 66, false}}, {17, {"IQ2_XS", 256, 74, false}},
    {18, {"IQ3_XXS", 256, 98, false}}, {19, {"IQ1_S", 256, 50, false}},
    {20, {"IQ4_NL", 32, 18, false}},   {21, {"IQ3_S", 256, 110, false}},
    {22, {"IQ2_S", 256, 82, false}},   {23, {"IQ4_XS", 256, 136, false}},
    {24, {"I8", 1, 1, false}},         {25, {"I16", 1, 2, false}},
    {26, {"I32", 1, 4, false}},        {27, {"I64", 1, 8, false}},
    {28, {"F64", 1, 8, true}},         {29, {"IQ1_M", 256, 56, false}},
    {30, {"BF16", 1, 2, true}},        {34, {"TQ1_0", 256, 54, false}},
    {35, {"TQ2_0", 256, 66, false}},   {39, {"MXFP4", 32, 17, false}},
};

const df_qblock_info *df_qblock_info_of(uint32_t type)
{
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (table[i].id == type)
            return &table[i].info;
    return NULL;
}

static float half(const uint8_t *p)
{
    return df_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

static uint32_t u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Q4_0: [d, qs[16]]; value j is the low nibble of qs[j], value j + 16 the high one. */
static void q4_0(const uint8_t *b, float *y)
{
    float d = half(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + 16] = d * (float)((qs[j] >> 4) - 8);
    }
}

static void q4_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    const uint8_t *qs = b + 4;
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + 16] = d * (float)(qs[j] >> 4) + m;
    }
}

/* Q5_0: the fifth bit of value j is bit j of qh. */
static void q5_0(const uint8_t *b, float *y)
{
    float d = half(b);
    uint32_t qh = u32le(b + 2);
    const uint8_t *qs = b + 6;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int x1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)(x0 - 16);
        y[j + 16] = d * (float)(x1 - 16);
    }
}

static void q5_1(const uint8_t *b, float *y)
{
    float d = half(b), m = half(b + 2);
    uint32_t qh = u32le(b + 4);
    const uint8_t *qs = b + 8;
    for (int j = 0; j < 16; j++) {
        int x0 = (qs[j] & 0x0f) | (int)((qh >> j) & 1) << 4;
        int x1 = (qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
        y[j] = d * (float)x0 + m;
        y[j + 16] = d * (float)x1 + m;
    }
}

static void q8_0(const uint8_t *b, float *y)
{
    float d = half(b);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

/* Q2_K: 16 sub-blocks of 16 values, each with a 4-bit scale and a 4-bit min. */
static void q2_k(const uint8_t *b, float *y)
{
    const uint8_t *scales = b, *q = b + 16;
    float d = half(b + 80), dmin = half(b + 82);
    int is = 0;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half16 = 0; half16 < 2; half16++) {
                uint8_t sc = scales[is++];
                float dl = d * (float)(sc & 0x0f), ml = dmin * (float)(sc >> 4);
                for (int l = 0; l < 16; l++)
                    *y++ = dl * (float)((q[l + 16 * half16] >> shift) & 3) - ml;
            }
        }
        q += 32;
    }
}

/* Q3_K: 2 low bits in qs, the third (inverted: a set bit means no -4) in hmask; 16 signed
 * 6-bit scales packed as four low nibbles... see the table in the gguf package. */
static void q3_k_scales(const uint8_t *b, int8_t scales[16])
{
    const uint8_t *sc = b + 96;
    for (int i = 0; i < 16; i++) {
        int low = i < 8 ? sc[i] & 0x0f : sc[i - 8] >> 4;
        int high = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        scales[i] = (int8_t)((low | high << 4) - 32);
    }
}

static void q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hm = b, *q = b + 32;
    float d_all = half(b + 108);
    int8_t scales[16];
    q3_k_scales(b, scales);
    int is = 0;
    uint8_t m = 1;
    for (int n = 0; n < QK_K; n += 128) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int half16 = 0; half16 < 2; half16++) {
                float dl = d_all * (float)scales[is++];
                for (int l = 0; l < 16; l++) {
                    int k = l + 16 * half16;
                    int v = ((q[k] >> shift) & 3) - ((hm[k] & m) ? 0 : 4);
                    *y++ = dl * (float)v;
                }
            }
            m = (uint8_t)(m << 1);
        }
        q += 32;
    }
}

/* The scale d * sc and the min dmin * m of sub-block j (0..7) of a Q4_K / Q5_K super-block,
 * from its 6-bit sc and m packed in q, each rounded to f32 as ggml forms them. */
static void scale_min_k4(int j, const uint8_t *q, float d, float dmin, float *dj, float *mj)
{
    int sc, m;
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    *dj = d * (float)sc;
    *mj = dmin * (float)m;
}

static void q4_k(const uint8_t *b, float *y)
{
    float d = half(b), dmin = half(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
        float d1, m1, d2, m2;
        scale_min_k4(is, scales, d, dmin, &d1, &m1);
        scale_min_k4(is + 1, scales, d, dmin, &d2, &m2);
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)(q[l] & 0x0f) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)(q[l] >> 4) - m2;
    }
}

static void q5_k(const uint8_t *b, float *y)
{
    float d = half(b), dmin = half(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32) {
        float d1, m1, d2, m2;
        scale_min_k4(is, scales, d, dmin, &d1, &m1);
        scale_min_k4(is + 1, scales, d, dmin, &d2, &m2);
        for (int l = 0; l < 32; l++)
            *y++ = d1 * (float)((ql[l] & 0x0f) + (qh[l] & u1 ? 16 : 0)) - m1;
        for (int l = 0; l < 32; l++)
            *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        u1 = (uint8_t)(u1 << 2);
        u2 = (uint8_t)(u2 << 2);
    }
}

static void q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = half(b + 208);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0x0f) | ((qh[l] >> 0) & 3) << 4) - 32;
            int q2 = ((ql[l + 32] & 0x0f) | ((qh[l] >> 2) & 3) << 4) - 32;
            int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
            int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
            y[l] = d * (float)sc[is] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

df_status df_qblock_dequant(uint32_t type, const void *src, int64_t nblocks, float *dst)
{
    const df_qblock_info *info = df_qblock_info_of(type);
    if (!info || !info->dequant)
        return df_errorf(DF_E_UNSUPPORTED, "dequantising ggml type %s (%u) is not supported",
                         info ? info->name : "unknown", type);
    const uint8_t *b = src;
    void (*one)(const uint8_t *, float *) = NULL;
    switch (type) {
    case DF_GGML_F32:
        memcpy(dst, src, (size_t)nblocks * 4);
        return DF_OK;
    case DF_GGML_F16:
        for (int64_t i = 0; i < nblocks; i++)
            dst[i] = half(b + 2 * i);
        return DF_OK;
    case DF_GGML_BF16:
        for (int64_t i = 0; i < nblocks; i++)
            dst[i] = df_bf16_to_f32((uint16_t)(b[2 * i] | b[2 * i + 1] << 8));
        return DF_OK;
    case DF_GGML_F64:
        for (int64_t i = 0; i < nblocks; i++) {
            double v;
            memcpy(&v, b + 8 * i, 8);
            dst[i] = (float)v;
        }
        return DF_OK;
    case DF_GGML_Q4_0:
        one = q4_0;
        break;
    case DF_GGML_Q4_1:
        one = q4_1;
        break;
    case DF_GGML_Q5_0:
        one = q5_0;
        break;
    case DF_GGML_Q5_1:
        one = q5_1;
        break;
    case DF_GGML_Q8_0:
        one = q8_0;
        break;
    case DF_GGML_Q2_K:
        one = q2_k;
        break;
    case DF_GGML_Q3_K:
        one = q3_k;
        break;
    case DF_GGML_Q4_K:
        one = q4_k;
        break;
    case DF_GGML_Q5_K:
        one = q5_k;
        break;
    case DF_GGML_Q6_K:
        one = q6_k;
        break;
    default:
        return df_errorf(DF_E_UNSUPPORTED, "dequantising ggml type %s is not supported",
                         info->name);
    }
    for (int64_t i = 0; i < nblocks; i++)
        one(b + (size_t)i * (size_t)info->bytes, dst + i * info->block);
    return DF_OK;
}

int df_qblock_run(uint32_t type)
{
    switch (type) {
    case DF_GGML_Q8_0:
    case DF_GGML_Q4_0:
    case DF_GGML_Q5_0:
        return 32;
    case DF_GGML_Q3_K:
    case DF_GGML_Q6_K:
        return 16;
    default:
        return 0;
    }
}

/* The scale of each run of one block (Q3_K, Q6_K: value i is in run i / 16, the order in
 * which q3_k and q6_k walk their scales). */
static void run_scales(uint32_t type, const uint8_t *b, float *scale)
{
    if (type == DF_GGML_Q3_K) {
        int8_t sc[16];
        q3_k_scales(b, sc);
        float d = half(b + 108);
        for (int i = 0; i < 16; i++)
            scale[i] = d * (float)sc[i];
    } else if (type == DF_GGML_Q6_K) {
        const int8_t *sc = (const int8_t *)(b + 192);
        float d = half(b + 208);
        for (int i = 0; i < 16; i++)
            scale[i] = d * (float)sc[i];
    } else { /* Q8_0, Q4_0, Q5_0: the block's f16 scale comes first */
        scale[0] = half(b);
    }
}

df_status df_qblock_ints(uint32_t type, const void *src, int64_t nblocks, float *work, int8_t *q,
                         float *scale)
{
    int run = df_qblock_run(type);
    const df_qblock_info *info = df_qblock_info_of(type);
    if (!run)
        return df_errorf(DF_E_UNSUPPORTED,
                         "ggml type %s (%u) is not integers times one scale "
                         "per run of values",
                         info ? info->name : "unknown", type);
    const uint8_t *b = src;
    int runs = info->block / run;
    for (int64_t i = 0; i < nblocks; i++, b += info->bytes) {
        float *sc = scale + i * runs;
        int8_t *qi = q + i * info->block;
        run_scales(type, b, sc);
        if (type == DF_GGML_Q8_0) {
            memcpy(qi, b + 2, 32);
            continue;
        }
        DF_TRY(df_qblock_dequant(type, b, 1, work));
        for (int j = 0; j < info->block; j++) { /* y / s is the integer (Q6_K: within 2^-24) */
            float s = sc[j / run], v = s != 0.0f ? work[j] / s : 0.0f;
            qi[j] = (int8_t)(v >= -128.0f && v <= 127.0f ? nearbyintf(v) : 0.0f);
        }
    }
    return DF_OK;
}
