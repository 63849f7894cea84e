/*
 * CONV2D kernel: im2col + the GEMM interface (gemm.h).
 *
 * Per image, out [O, Ho*Wo] = W [O, C*kh*kw] @ col [C*kh*kw, Ho*Wo] (+ bias per row), with
 * the weight as the row-major A operand in the compute dtype (a weight's converted copy is
 * made once and kept on its storage; an f32 weight in f32 compute is used as it is). The
 * patch matrix is built a chunk of output pixels at a time, so the scratch stays a few MiB
 * whatever the image size; the GEMM writes each chunk's columns straight into the output
 * (row stride Ho*Wo). A 1x1 convolution with stride 1 and no padding needs no patches in
 * f32: x itself is the B operand. The bias is written first and the GEMM accumulates.
 * Any kernel size, stride and padding work; 3x3 and 1x1 are what the VAE uses.
 *
 * This is the fallback: oneDNN's direct convolution (k_conv_dnnl.c) is tried first, and
 * this path runs where it has no fast kernel (DF_E_UNSUPPORTED) or DIFFUSE_CONV=im2col
 * asks for it (DIFFUSE_CONV=dnnl or unset: try oneDNN first).
 */
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/k_conv_dnnl.h"
#include "core/status.h"

#define COL_BYTES (8u << 20) /* patch matrix per chunk */

typedef struct conv_shape {
    int64_t C, H, W, kh, kw, Ho, Wo, stride, pad;
} conv_shape;

/* Row r = (c, ky, kx) of the patch matrix, for output pixels [p, p + cnt), as f32. */
static void patch_row(const conv_shape *s, const float *x, int64_t r, int64_t p, int64_t cnt,
                      float *dst)
{
    int64_t c = r / (s->kh * s->kw), ky = r / s->kw % s->kh, kx = r % s->kw;
    const float *xc = x + c * s->H * s->W;
    int64_t end = p + cnt;
    while (p < end) {
        int64_t oy = p / s->Wo, ox = p % s->Wo;
        int64_t seg = s->Wo - ox < end - p ? s->Wo - ox : end - p;
        int64_t iy = oy * s->stride - s->pad + ky;
        if (iy < 0 || iy >= s->H) {
            memset(dst, 0, (size_t)seg * sizeof *dst);
        } else {
            const float *row = xc + iy * s->W;
            for (int64_t i = 0; i < seg; i++) {
                int64_t ix = (ox + i) * s->stride - s->pad + kx;
                dst[i] = ix >= 0 && ix < s->W ? row[ix] : 0.0f;
            }
        }
        dst += seg;
        p += seg;
    }
}

/* The patch matrix [C*kh*kw, cnt] for output pixels [p0, p0 + cnt) of one image. */
static void im2col(const conv_shape *s, const float *x, int64_t p0, int64_t cnt, df_dtype type,
                   void *col)
{
    int64_t rows = s->C * s->kh * s->kw;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        if (type == DF_DTYPE_F32) {
            patch_row(s, x, r, p0, cnt, (float *)col + r * cnt);
            continue;
        }
        float buf[512];
        uint16_t *dst = (uint16_t *)col + r * cnt;
        for (int64_t i = 0; i < cnt; i += 512) {
            int64_t len = cnt - i < 512 ? cnt - i : 512;
            patch_row(s, x, r, p0 + i, len, buf);
            df_gemm_f32_to_bf16(buf, dst + i, len);
        }
    }
}

static size_t round64(size_t n)
{
    return (n + 63) & ~(size_t)63;
}

/* Whether to try oneDNN's convolution first: yes unless DIFFUSE_CONV=im2col (read per call:
 * a lookup is nothing beside a convolution). */
static bool want_dnnl(void)
{
    const char *e = getenv("DIFFUSE_CONV");
    return !(e && !strcmp(e, "im2col"));
}

DF_CPU_KERNEL(conv2d)
{
    const df_view *xv = &n->in[0], *wv = &n->in[1];
    const df_view *bv = n->in[2].buf ? &n->in[2] : NULL;
    df_dtype compute = df_gemm_compute_dtype((int)n->a.compute);
    int64_t B = xv->shape[0], O = wv->shape[0];
    conv_shape s = {.C = xv->shape[1],
                    .H = xv->shape[2],
                    .W = xv->shape[3],
                    .kh = wv->shape[2],
                    .kw = wv->shape[3],
                    .Ho = n->out.shape[2],
                    .Wo = n->out.shape[3],
                    .stride = n->a.stride,
                    .pad = n->a.padding};
    int64_t K = s.C * s.kh * s.kw, P = s.Ho * s.Wo;
    if (B == 0 || O == 0 || P == 0)
        return DF_OK;
    if (want_dnnl()) {
        df_status st = df_conv2d_dnnl(n, env, compute);
        if (st != DF_E_UNSUPPORTED)
            return st;
    }
    bool direct = s.kh == 1 && s.kw == 1 && s.stride == 1 && s.pad == 0 && compute == DF_DTYPE_F32;
    size_t es = df_dtype_size(compute);
    int64_t chunk = direct ? P : (int64_t)(COL_BYTES / (K > 0 ? (size_t)K * es : 1));
    chunk = chunk < 1 ? 1 : chunk > P ? P : chunk;

    size_t sx = round64(df_gemm_operand_scratch(xv, DF_DTYPE_F32));
    size_t sw = round64(df_gemm_operand_scratch(wv, compute));
    size_t sb = bv ? round64(df_gemm_operand_scratch(bv, DF_DTYPE_F32)) : 0;
    size_t sc = direct ? 0 : round64((size_t)(K * chunk) * es);
    char *scratch = NULL;
    if (sx + sw + sb + sc > 0 && !(scratch = df_env_scratch(env, sx + sw + sb + sc)))
        return df_errorf(DF_E_OOM, "conv2d: out of memory for %zu bytes of scratch",
                         sx + sw + sb + sc);
    const void *px, *pw, *pb = NULL;
    DF_TRY(df_gemm_operand(xv, DF_DTYPE_F32, scratch, &px));
    DF_TRY(df_gemm_operand(wv, compute, scratch + sx, &pw));
    if (bv)
        DF_TRY(df_gemm_operand(bv, DF_DTYPE_F32, scratch + sx + sw, &pb));
    void *col = scratch + sx + sw + sb;
    const float *x = px, *bias = pb;
    float *out = df_view_ptr(&n->out);

    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * s.C * s.H * s.W;
        float *ob = out + b * O * P;
        for (int64_t p0 = 0; p0 < P; p0 += chunk) {
            int64_t cnt = P - p0 < chunk ? P - p0 : chunk;
            if (bias) {
#pragma omp parallel for schedule(static)
                for (int64_t o = 0; o < O; o++)
                    for (int64_t i = 0; i < cnt; i++)
                        ob[o * P + p0 + i] = bias[o];
            }
            df_gemm_desc d = {.m = O,
                              .n = cnt,
                              .k = K,
                              .type = compute,
                              .lda = K,
                              .ldc = P,
                              .accumulate = bias != NULL};
            const void *pbm = col;
            if (direct) {
                pbm = xb + p0;
                d.ldb = P;
            } else {
                im2col(&s, xb, p0, cnt, compute, col);
                d.ldb = cnt;
            }
            df_status st = df_gemm(&d, pw, pbm, NULL, ob + p0);
            if (st != DF_OK)
                return df_error_context(st,
                                        "conv2d x [%lld, %lld, %lld, %lld], weight [%lld, "
                                        "%lld, %lld, %lld]",
                                        (long long)B, (long long)s.C, (long long)s.H,
                                        (long long)s.W, (long long)O, (long long)s.C,
                                        (long long)s.kh, (long long)s.kw);
        }
    }
    return DF_OK;
}
