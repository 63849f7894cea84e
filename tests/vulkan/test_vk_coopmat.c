/*
 * The choice of the cooperative-matrix matmul (vk_coopmat.c, shaders/mm_coop.comp), on
 * Vulkan device 0 with DIFFUSE_VULKAN_COOPMAT=1 (asked for):
 * - the choice agrees with what the device and the build have: a device without
 *   VK_KHR_cooperative_matrix (lavapipe), or a build without the shader, gets the portable
 *   shader, with the reason named; DIFFUSE_VULKAN_COOPMAT=0 turns it off anywhere;
 * - where the shader was compiled in, its embedded SPIR-V declares the CooperativeMatrixKHR
 *   capability (so the blob is the shader it claims to be);
 * - a bf16 linear (with a bias, sizes that are not multiples of the tiles) on whichever
 *   shader was chosen matches a host computation of the same bf16 products.
 *
 * lavapipe has no cooperative matrices, so in CI this checks the fallback; the
 * cooperative-matrix shader itself runs only on a device that reports the extension.
 * Run under VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation: any validation message fails.
 * Without a Vulkan loader or device the test exits 77 (skipped).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_test.h"

struct df_dev_buffer {
    dvk_alloc *a;
};

static VkDeviceAddress addr_of(void *user, const df_view *v)
{
    (void)user;
    return v->buf->a->addr + v->offset;
}

/* Whether the SPIR-V declares `cap` (OpCapability, opcode 17). */
static bool spirv_has_capability(const unsigned char *code, size_t bytes, uint32_t cap)
{
    const uint32_t *w = (const uint32_t *)(const void *)code;
    size_t n = bytes / 4;
    if (n < 5 || w[0] != 0x07230203u)
        return false;
    for (size_t i = 5; i < n;) {
        uint32_t count = w[i] >> 16, op = w[i] & 0xffffu;
        if (count == 0)
            return false;
        if (op == 17 && count == 2 && i + 1 < n && w[i + 1] == cap)
            return true;
        i += count;
    }
    return false;
}

static float bf16_round(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

static df_view dense(df_dev_buffer *b, int64_t rows, int64_t cols)
{
    df_view v = {.buf = b, .dtype = DF_DTYPE_F32, .ndim = 2, .shape = {rows, cols},
                 .stride = {cols, 1}};
    return v;
}

/* out = x w^T + bias in bf16 compute on the device, against the host. */
static void test_bf16_linear(void)
{
    const int64_t M = 37, N = 70, K = 50;
    float *x = malloc(M * K * 4), *w = malloc(N * K * 4), *bias = malloc(N * 4);
    float *got = malloc(M * N * 4);
    for (int64_t i = 0; i < M * K; i++)
        x[i] = sinf((float)i * 0.37f) * 3.0f;
    for (int64_t i = 0; i < N * K; i++)
        w[i] = cosf((float)i * 0.11f) * 0.5f;
    for (int64_t i = 0; i < N; i++)
        bias[i] = (float)i * 0.01f;
    df_dev_buffer bx = {0}, bw = {0}, bb = {0}, bo = {0};
    df_status s = dvk_alloc_make(g_dev, M * K * 4, &bx.a);
    if (s == DF_OK)
        s = dvk_alloc_make(g_dev, N * K * 4, &bw.a);
    if (s == DF_OK)
        s = dvk_alloc_make(g_dev, N * 4, &bb.a);
    if (s == DF_OK)
        s = dvk_alloc_make(g_dev, M * N * 4, &bo.a);
    if (s == DF_OK)
        s = dvk_upload(g_dev, bx.a->addr, x, M * K * 4);
    if (s == DF_OK)
        s = dvk_upload(g_dev, bw.a->addr, w, N * K * 4);
    if (s == DF_OK)
        s = dvk_upload(g_dev, bb.a->addr, bias, N * 4);
    df_node n = {.op = DF_OP_LINEAR, .n_in = 3};
    n.in[0] = dense(&bx, M, K);
    n.in[1] = dense(&bw, N, K);
    n.in[2] = (df_view){.buf = &bb, .dtype = DF_DTYPE_F32, .ndim = 1, .shape = {N},
                        .stride = {1}};
    n.out = dense(&bo, M, N);
    n.a.compute = DF_DTYPE_BF16;
    dvk_env e = {.d = g_dev, .addr = addr_of};
    if (s == DF_OK)
        s = dvk_run_node(&e, &n);
    if (s == DF_OK)
        s = dvk_download(g_dev, got, bo.a->addr, M * N * 4);
    double worst = 0;
    for (int64_t i = 0; s == DF_OK && i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = 0;
            for (int64_t k = 0; k < K; k++)
                ref += (double)bf16_round(x[i * K + k]) * (double)bf16_round(w[j * K + k]);
            ref += bias[j];
            double err = fabs(got[i * N + j] - ref) / (1.0 + fabs(ref));
            worst = err > worst ? err : worst;
        }
    printf("bf16 linear %lldx%lldx%lld on the %s shader: largest error %.2e (<= 1e-5)\n",
           (long long)M, (long long)N, (long long)K,
           g_dev->coopmat.use ? "cooperative" : "portable", worst);
    check(s == DF_OK && worst <= 1e-5, "bf16 linear on the chosen shader");
    dvk_finish(g_dev);
    dvk_alloc_free(g_dev, bx.a);
    dvk_alloc_free(g_dev, bw.a);
    dvk_alloc_free(g_dev, bb.a);
    dvk_alloc_free(g_dev, bo.a);
    free(x);
    free(w);
    free(bias);
    free(got);
}

int main(void)
{
    setenv("DIFFUSE_VULKAN_COOPMAT", "1", 1);
    if (vk_test_skipped(dvk_device_open(0, &g_dev)))
        return 77;
    int shader = dvk_shader_find("mm_coop");
    printf("device: %s: VK_KHR_cooperative_matrix %s; shader %s; chosen: %s (%s)\n",
           g_dev->info.name, g_dev->info.coopmat ? "yes" : "no",
           shader >= 0 ? "compiled in" : "not compiled in",
           g_dev->coopmat.use ? "cooperative" : "portable", g_dev->coopmat.why);
    check(g_dev->coopmat.asked, "DIFFUSE_VULKAN_COOPMAT=1 is read");
    if (shader < 0)
        check(!g_dev->coopmat.use && strstr(g_dev->coopmat.why, "no cooperative-matrix shader"),
              "without the shader: the portable path, saying why");
    else if (!g_dev->info.coopmat)
        check(!g_dev->coopmat.use && strstr(g_dev->coopmat.why, "VK_KHR_cooperative_matrix"),
              "without the extension: the portable path, saying why");
    if (shader >= 0)
        check(spirv_has_capability(dvk_shaders[shader].code, *dvk_shaders[shader].bytes, 6022),
              "the embedded mm_coop declares CooperativeMatrixKHR");
    setenv("DIFFUSE_VULKAN_COOPMAT", "0", 1);
    dvk_coopmat c;
    dvk_coopmat_select(g_dev->inst, g_dev->phys, &g_dev->info, &c);
    check(!c.use && strcmp(c.why, "DIFFUSE_VULKAN_COOPMAT=0") == 0,
          "DIFFUSE_VULKAN_COOPMAT=0: the portable path");
    test_bf16_linear();
    return vk_test_finish();
}
