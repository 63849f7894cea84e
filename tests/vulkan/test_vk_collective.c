/*
 * The Vulkan backend's collectives (vk_collective.c) on one device, as rank 1 of 3, with a
 * host communicator that plays the other two ranks: their data is a known pattern, so the
 * all-reduce sum, the gathered parts and the broadcast bytes are known exactly.
 *
 * Each collective sits between two device commands: a copy that writes its buffer before
 * it and a copy that reads the result after it, so stream order is checked, not only the
 * arithmetic. The sizes exceed the 16 MiB readback arena, so the chunking (the same chunks
 * on every rank) runs too; the host communicator checks that its calls arrive in order,
 * chunk after chunk, with the rank's own data.
 *
 * Run under VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation: any validation message fails.
 * Without a Vulkan loader or device the test exits 77 (skipped).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vk_test.h"

#define RANKS 3
#define ME 1

/* Rank r's element i: exact in f32, and so are sums of three. */
static float value(int r, int64_t i)
{
    return (float)(r * 1000) + (float)(i % 997) * 0.5f;
}

/* The other ranks, seen from rank ME: `cursor` counts the elements handled so far. */
typedef struct fake_comm {
    int64_t cursor;
    int bad; /* calls whose input was not the rank's own data */
} fake_comm;

static df_status fake_all_reduce(void *self, float *buf, int64_t n)
{
    fake_comm *f = self;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = f->cursor + i;
        f->bad += buf[i] != value(ME, k);
        for (int r = 0; r < RANKS; r++)
            if (r != ME)
                buf[i] += value(r, k);
    }
    f->cursor += n;
    return DF_OK;
}

static df_status fake_all_gather(void *self, const void *send, void *recv, size_t bytes)
{
    fake_comm *f = self;
    int64_t n = (int64_t)(bytes / sizeof(float));
    const float *s = send;
    for (int r = 0; r < RANKS; r++) {
        float *part = (float *)recv + (int64_t)r * n;
        for (int64_t i = 0; i < n; i++) {
            if (r == ME)
                f->bad += s[i] != value(ME, f->cursor + i);
            part[i] = r == ME ? s[i] : value(r, f->cursor + i);
        }
    }
    f->cursor += n;
    return DF_OK;
}

static df_status fake_broadcast(void *self, void *buf, size_t bytes, int root)
{
    fake_comm *f = self;
    float *p = buf;
    int64_t n = (int64_t)(bytes / sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        if (root == ME)
            f->bad += p[i] != value(ME, f->cursor + i);
        else
            p[i] = value(root, f->cursor + i);
    }
    f->cursor += n;
    return DF_OK;
}

static df_status fake_barrier(void *self)
{
    (void)self;
    return DF_OK;
}

/* One collective on `count` elements (a buffer of `total`): `init` is uploaded into a
 * source allocation and copied into the buffer on the device, the collective runs, the
 * buffer is copied into a third allocation, which is read back into `out`. */
static df_status run_between_copies(const df_dev_comm *c, df_coll op, const float *init,
                                    int64_t total, float *out)
{
    uint64_t bytes = (uint64_t)total * sizeof(float);
    dvk_alloc *src = NULL, *buf = NULL, *dst = NULL;
    df_status s = dvk_alloc_make(g_dev, bytes, &src);
    if (s == DF_OK)
        s = dvk_alloc_make(g_dev, bytes, &buf);
    if (s == DF_OK)
        s = dvk_alloc_make(g_dev, bytes, &dst);
    if (s == DF_OK)
        s = dvk_upload(g_dev, src->addr, init, bytes);
    if (s == DF_OK)
        s = dvk_copy(g_dev, buf->addr, src->addr, bytes);
    if (s == DF_OK)
        s = dvk_collective(g_dev, c, &op, buf->addr);
    if (s == DF_OK)
        s = dvk_copy(g_dev, dst->addr, buf->addr, bytes);
    if (s == DF_OK)
        s = dvk_download(g_dev, out, dst->addr, bytes);
    dvk_finish(g_dev);
    if (src)
        dvk_alloc_free(g_dev, src);
    if (buf)
        dvk_alloc_free(g_dev, buf);
    if (dst)
        dvk_alloc_free(g_dev, dst);
    return s;
}

static void test_all_reduce(const df_dev_comm *c, fake_comm *f, float *init, float *out)
{
    const int64_t n = 5000000; /* 20 MB: two chunks of the readback arena */
    for (int64_t i = 0; i < n; i++)
        init[i] = value(ME, i);
    *f = (fake_comm){0};
    df_coll op = {.kind = DF_COLL_ALL_REDUCE_SUM, .count = n, .dtype = DF_DTYPE_F32};
    df_status s = run_between_copies(c, op, init, n, out);
    int64_t wrong = 0;
    for (int64_t i = 0; s == DF_OK && i < n; i++)
        wrong += out[i] != value(0, i) + value(1, i) + value(2, i);
    printf("all_reduce of %lld floats: %lld wrong, %d bad inputs\n", (long long)n,
           (long long)wrong, f->bad);
    check(s == DF_OK && wrong == 0 && f->bad == 0 && f->cursor == n, "all_reduce sum");
}

static void test_all_gather(const df_dev_comm *c, fake_comm *f, float *init, float *out)
{
    const int64_t n = 2000000; /* per rank: 8 MB, two chunks of arena / (ranks + 1) */
    for (int64_t i = 0; i < RANKS * n; i++)
        init[i] = i / n == ME ? value(ME, i % n) : -1.0f;
    *f = (fake_comm){0};
    df_coll op = {.kind = DF_COLL_ALL_GATHER, .count = n, .dtype = DF_DTYPE_F32};
    df_status s = run_between_copies(c, op, init, RANKS * n, out);
    int64_t wrong = 0;
    for (int64_t i = 0; s == DF_OK && i < RANKS * n; i++)
        wrong += out[i] != value((int)(i / n), i % n);
    printf("all_gather of %lld floats per rank: %lld wrong, %d bad inputs\n", (long long)n,
           (long long)wrong, f->bad);
    check(s == DF_OK && wrong == 0 && f->bad == 0 && f->cursor == n, "all_gather parts");
}

static void test_broadcast(const df_dev_comm *c, fake_comm *f, float *init, float *out)
{
    const int64_t n = 5000000;
    for (int root = 0; root < 2; root++) { /* another rank's data, then this rank's */
        int from = root == 0 ? 2 : ME;
        for (int64_t i = 0; i < n; i++)
            init[i] = value(ME, i);
        *f = (fake_comm){0};
        df_coll op = {.kind = DF_COLL_BROADCAST, .count = n, .dtype = DF_DTYPE_F32,
                      .root = from};
        df_status s = run_between_copies(c, op, init, n, out);
        int64_t wrong = 0;
        for (int64_t i = 0; s == DF_OK && i < n; i++)
            wrong += out[i] != value(from, i);
        printf("broadcast of %lld floats from rank %d: %lld wrong, %d bad inputs\n",
               (long long)n, from, (long long)wrong, f->bad);
        check(s == DF_OK && wrong == 0 && f->bad == 0 && f->cursor == n,
              from == ME ? "broadcast from this rank" : "broadcast to this rank");
    }
}

static void test_refusals(const df_dev_comm *c)
{
    dvk_alloc *a = NULL;
    if (dvk_alloc_make(g_dev, 1024, &a) != DF_OK) {
        check(false, "allocation");
        return;
    }
    df_coll op = {.kind = DF_COLL_ALL_REDUCE_SUM, .count = 16, .dtype = DF_DTYPE_BF16};
    df_status s = dvk_collective(g_dev, c, &op, a->addr);
    printf("bf16 all_reduce: %s: %s\n", df_status_name(s), df_error_message());
    check(s == DF_E_UNSUPPORTED && strstr(df_error_message(), "bf16"), "bf16 all_reduce refused");
    op = (df_coll){.kind = DF_COLL_BROADCAST, .count = 16, .dtype = DF_DTYPE_F32, .root = 5};
    s = dvk_collective(g_dev, c, &op, a->addr);
    check(s == DF_E_ARG, "broadcast from a rank that does not exist refused");
    dvk_finish(g_dev);
    dvk_alloc_free(g_dev, a);
}

int main(void)
{
    if (vk_test_skipped(dvk_device_open(0, &g_dev)))
        return 77;
    printf("device: %s, readback arena %llu bytes\n", g_dev->info.name,
           (unsigned long long)g_dev->readback.size);
    fake_comm f = {0};
    df_host_comm h = {.rank = ME, .size = RANKS, .self = &f, .all_reduce_f32 = fake_all_reduce,
                      .all_gather = fake_all_gather, .broadcast = fake_broadcast,
                      .barrier = fake_barrier};
    df_dev_comm *c = NULL;
    float *init = malloc(6000000 * sizeof(float)), *out = malloc(6000000 * sizeof(float));
    if (!init || !out || dvk_comm_create(&h, &c) != DF_OK) {
        printf("FAIL setup: out of memory\n");
        return 1;
    }
    test_all_reduce(c, &f, init, out);
    test_all_gather(c, &f, init, out);
    test_broadcast(c, &f, init, out);
    test_refusals(c);
    dvk_comm_free(c);
    free(init);
    free(out);
    printf("bytes up %lld, down %lld\n", (long long)g_dev->stats.bytes_up,
           (long long)g_dev->stats.bytes_down);
    return vk_test_finish();
}
