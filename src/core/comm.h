/*
 * The communicator interface (the functions live in dist/; the struct is here so that
 * backends can run the all-reduce op without depending on dist/).
 */
#ifndef DF_CORE_COMM_H
#define DF_CORE_COMM_H

#include <stddef.h>
#include <stdint.h>

#include <diffuse/status.h>

typedef struct df_comm df_comm;

typedef struct df_comm_ops {
    df_status (*all_reduce_f32)(df_comm *c, float *buf, int64_t n);
    df_status (*broadcast)(df_comm *c, void *buf, size_t bytes, int root);
    df_status (*all_gather)(df_comm *c, const void *send, void *recv, size_t bytes);
    df_status (*barrier)(df_comm *c);
    void (*abort)(df_comm *c); /* stops every rank (see df_comm_abort) */
    void (*free)(df_comm *c);
} df_comm_ops;

struct df_comm {
    const df_comm_ops *ops;
    int rank, size;
    void *impl;
};

#endif
