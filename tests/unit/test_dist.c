/*
 * Communicators and the all-reduce op: ranks as threads of this process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include <diffuse/diffuse.h>

enum { RANKS = 3, N = 1000 };

typedef struct rank_job {
    df_comm *comm;
    df_eager_mode mode;
    float out[N];
    df_status s;
    int32_t gathered[RANKS];
    uint8_t bcast[16];
} rank_job;

static void *rank_main(void *arg)
{
    rank_job *j = arg;
    int r = df_comm_rank(j->comm);
    df_ctx *ctx = NULL;
    j->s = df_ctx_create(&(df_ctx_opts){.threads = 1, .mode = j->mode}, &ctx);
    if (j->s != DF_OK)
        return NULL;
    df_ctx_set_comm(ctx, j->comm);
    float x[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(r + 1) * (float)i;
    df_tensor *t = df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(N), x);
    df_tensor *y = df_all_reduce(ctx, df_scale(ctx, t, 2.0f, 0.0f)); /* sum_r 2 (r+1) i */
    j->s = df_tensor_read(ctx, y, DF_DTYPE_F32, j->out, sizeof j->out);
    int32_t mine = 10 * r;
    if (j->s == DF_OK)
        j->s = df_comm_all_gather(j->comm, &mine, j->gathered, sizeof mine);
    if (r == 0)
        memcpy(j->bcast, "from rank zero!", 16);
    if (j->s == DF_OK)
        j->s = df_comm_broadcast(j->comm, j->bcast, sizeof j->bcast, 0);
    df_ctx_free(ctx);
    return NULL;
}

static void run_ranks(df_eager_mode mode)
{
    df_comm *comms[RANKS];
    assert_int_equal(df_comm_create_threads(RANKS, comms), DF_OK);
    static rank_job jobs[RANKS];
    pthread_t th[RANKS];
    for (int r = 0; r < RANKS; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].comm = comms[r];
        jobs[r].mode = mode;
        pthread_create(&th[r], NULL, rank_main, &jobs[r]);
    }
    for (int r = 0; r < RANKS; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < RANKS; r++) {
        assert_int_equal(jobs[r].s, DF_OK);
        for (int i = 0; i < N; i += 37)
            assert_float_equal(jobs[r].out[i], 2.0f * 6.0f * (float)i, 0);
        assert_memory_equal(jobs[r].out, jobs[0].out, sizeof jobs[0].out); /* bit-identical */
        for (int k = 0; k < RANKS; k++)
            assert_int_equal(jobs[r].gathered[k], 10 * k);
        assert_string_equal((const char *)jobs[r].bcast, "from rank zero!");
        df_comm_free(comms[r]);
    }
}

static void test_all_reduce_eager(void **state)
{
    (void)state;
    run_ranks(DF_DEFER_NEVER);
}

static void test_all_reduce_fuse(void **state)
{
    (void)state;
    run_ranks(DF_DEFER_AND_FUSE);
}

static void test_single_rank_and_no_comm_are_identity(void **state)
{
    (void)state;
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(NULL, &ctx), DF_OK);
    float x[3] = {1, 2, 3}, y[3];
    df_tensor *t = df_all_reduce(ctx, df_tensor_from_host(ctx, DF_DTYPE_F32, DF_SHAPE(3), x));
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, y, sizeof y), DF_OK);
    assert_memory_equal(x, y, sizeof x);
    df_ctx_free(ctx);
    df_comm *c[1];
    assert_int_equal(df_comm_create_threads(0, c), DF_E_ARG);
    assert_int_equal(df_comm_create_threads(1, c), DF_OK);
    assert_int_equal(df_comm_agree(c[0], DF_E_IO), DF_E_IO);
    df_comm_free(c[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_reduce_eager),
        cmocka_unit_test(test_all_reduce_fuse),
        cmocka_unit_test(test_single_rank_and_no_comm_are_identity),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
