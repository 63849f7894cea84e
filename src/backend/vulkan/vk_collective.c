/*
 * Collectives on device buffers (the device ABI's comm_create / collective), staged through
 * host memory: the device range is copied into the host-visible readback arena, the host
 * communicator works on that mapped memory in place, and the result is uploaded again.
 *
 * Stream order: a collective that needs the device's data (all-reduce, all-gather, the
 * root of a broadcast) submits what is recorded and waits for it, as a download does, so
 * it sees every command queued before it; its upload is recorded into the current batch,
 * so every command queued after it sees the result (the hazard tracking puts the barrier
 * in). A rank that only receives a broadcast does not wait at all. The host thread is the
 * one that calls the communicator: this backend has no thread of its own, and every rank
 * queues the same collectives in the same order, so each call meets its peers.
 *
 * Sizes: a collective larger than the readback arena runs in chunks of the same size on
 * every rank (the arena's size is fixed), so the ranks' host calls still pair up. An
 * all-gather keeps its send and receive parts in the arena together: a chunk is at most
 * arena / (ranks + 1) bytes.
 *
 * Direct device-to-device transfers (peer memory, exported memory between processes) are
 * not used: every byte crosses host memory twice.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

struct df_dev_comm {
    df_host_comm host;
};

df_status dvk_comm_create(const df_host_comm *host, df_dev_comm **out)
{
    *out = NULL;
    df_dev_comm *c = calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory creating a communicator");
    c->host = *host;
    *out = c;
    return DF_OK;
}

void dvk_comm_free(df_dev_comm *c)
{
    free(c);
}

/* [src, src + bytes) into the readback arena at `at`, once every earlier command ran;
 * returns the mapped host address of the copy. */
static df_status stage_down(dvk_device *d, VkDeviceAddress src, uint64_t bytes, uint64_t at,
                            char **host)
{
    dvk_block *blk = NULL;
    uint64_t boff = 0;
    DF_TRY(dvk_locate(d, src, bytes, &blk, &boff));
    dvk_range r = {src, src + bytes};
    dvk_hazard(d, &r, 1, NULL, 0);
    VkCommandBuffer cmd;
    DF_TRY(dvk_batch_cmd(d, &cmd));
    VkBufferCopy c = {.srcOffset = boff, .dstOffset = at, .size = bytes};
    d->fn->vkCmdCopyBuffer(cmd, blk->buffer, d->readback.buffer, 1, &c);
    d->pos++;
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    d->fn->vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT, VK_PIPELINE_STAGE_HOST_BIT,
                                0, 1, &mb, 0, NULL, 0, NULL);
    DF_TRY(dvk_finish(d));
    d->stats.bytes_down += (int64_t)bytes;
    *host = d->readback.mapped + at;
    return DF_OK;
}

static df_status all_reduce(dvk_device *d, const df_host_comm *h, VkDeviceAddress addr,
                            int64_t count)
{
    int64_t chunk = (int64_t)(d->readback.size / sizeof(float));
    for (int64_t done = 0; done < count; done += chunk) {
        int64_t n = count - done < chunk ? count - done : chunk;
        uint64_t bytes = (uint64_t)n * sizeof(float);
        VkDeviceAddress at = addr + (uint64_t)done * sizeof(float);
        char *host;
        DF_TRY(stage_down(d, at, bytes, 0, &host));
        DF_TRY(h->all_reduce_f32(h->self, (float *)host, n));
        DF_TRY(dvk_upload(d, at, host, bytes));
    }
    return DF_OK;
}

/* Rank r's `per_rank` bytes at addr + r * per_rank, on every rank. */
static df_status all_gather(dvk_device *d, const df_host_comm *h, VkDeviceAddress addr,
                            uint64_t per_rank)
{
    uint64_t chunk = (d->readback.size / (uint64_t)(h->size + 1)) & ~(uint64_t)255;
    if (chunk == 0)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: all_gather over %d ranks does not fit the "
                         "%llu-byte readback arena", h->size,
                         (unsigned long long)d->readback.size);
    for (uint64_t done = 0; done < per_rank; done += chunk) {
        uint64_t n = per_rank - done < chunk ? per_rank - done : chunk;
        char *mine;
        DF_TRY(stage_down(d, addr + (uint64_t)h->rank * per_rank + done, n, 0, &mine));
        char *recv = d->readback.mapped + chunk; /* ranks' parts, n bytes each */
        DF_TRY(h->all_gather(h->self, mine, recv, (size_t)n));
        for (int r = 0; r < h->size; r++)
            if (r != h->rank)
                DF_TRY(dvk_upload(d, addr + (uint64_t)r * per_rank + done,
                                  recv + (uint64_t)r * n, n));
    }
    return DF_OK;
}

static df_status broadcast(dvk_device *d, const df_host_comm *h, VkDeviceAddress addr,
                           uint64_t bytes, int root)
{
    uint64_t chunk = d->readback.size;
    for (uint64_t done = 0; done < bytes; done += chunk) {
        uint64_t n = bytes - done < chunk ? bytes - done : chunk;
        char *host = d->readback.mapped;
        if (h->rank == root)
            DF_TRY(stage_down(d, addr + done, n, 0, &host));
        DF_TRY(h->broadcast(h->self, host, (size_t)n, root));
        if (h->rank != root)
            DF_TRY(dvk_upload(d, addr + done, host, n));
    }
    return DF_OK;
}

df_status dvk_collective(dvk_device *d, const df_dev_comm *c, const df_coll *op,
                         VkDeviceAddress addr)
{
    const df_host_comm *h = &c->host;
    if (h->size <= 1 || op->count <= 0)
        return DF_OK;
    uint64_t bytes = (uint64_t)op->count * (uint64_t)dvk_esize(op->dtype);
    switch (op->kind) {
    case DF_COLL_ALL_REDUCE_SUM:
        if (op->dtype != DF_DTYPE_F32)
            return df_errorf(DF_E_UNSUPPORTED, "vulkan: all_reduce of %s (the host "
                             "communicator sums f32 only)", dvk_dtype_name(op->dtype));
        return all_reduce(d, h, addr, op->count);
    case DF_COLL_ALL_GATHER:
        return all_gather(d, h, addr, bytes);
    case DF_COLL_BROADCAST:
        if (op->root < 0 || op->root >= h->size)
            return df_errorf(DF_E_ARG, "vulkan: broadcast from rank %d of %d", op->root,
                             h->size);
        return broadcast(d, h, addr, bytes, op->root);
    }
    return df_errorf(DF_E_ARG, "vulkan: unknown collective %d", (int)op->kind);
}
