/*
 * Device memory: a pool of large blocks (one VkBuffer over one VkDeviceMemory each, with a
 * device address), sub-allocated first-fit with 256-byte alignment and coalescing frees;
 * an allocation larger than a block gets a block of its own. Host-visible arenas stage
 * uploads and hold parameter blocks; a readback arena stages downloads.
 *
 * Weights arrive as bytes in their stored dtype and stay so: bf16 and f16 are 16-bit on the
 * device too, and the shaders convert as they load.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

#define ALIGN 256u

struct dvk_span {
    struct dvk_span *next;
    uint64_t off, size;
};

static uint64_t round_up(uint64_t n, uint64_t a)
{
    return (n + a - 1) / a * a;
}

static const VkBufferUsageFlags USAGE = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                                        VK_BUFFER_USAGE_TRANSFER_DST_BIT |
                                        VK_BUFFER_USAGE_SHADER_DEVICE_ADDRESS_BIT;

/* A buffer with its own memory of `type`, mapped when host-visible. */
static df_status make_buffer(dvk_device *d, uint64_t bytes, uint32_t type, bool map,
                             VkBuffer *buf, VkDeviceMemory *mem, VkDeviceAddress *addr,
                             void **mapped)
{
    const dvk_fns *fn = d->fn;
    VkBufferCreateInfo bi = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                             .size = bytes,
                             .usage = USAGE,
                             .sharingMode = VK_SHARING_MODE_EXCLUSIVE};
    if (fn->vkCreateBuffer(d->dev, &bi, NULL, buf) != VK_SUCCESS)
        return df_errorf(DF_E_OOM, "vulkan: vkCreateBuffer of %llu bytes failed",
                         (unsigned long long)bytes);
    VkMemoryRequirements req;
    fn->vkGetBufferMemoryRequirements(d->dev, *buf, &req);
    if (!(req.memoryTypeBits & (1u << type))) {
        fn->vkDestroyBuffer(d->dev, *buf, NULL);
        *buf = VK_NULL_HANDLE;
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: '%s' cannot place storage buffers in memory type %u",
                         d->info.name, type);
    }
    VkMemoryAllocateFlagsInfo fi = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_FLAGS_INFO,
                                    .flags = VK_MEMORY_ALLOCATE_DEVICE_ADDRESS_BIT};
    VkMemoryAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO,
                               .pNext = &fi,
                               .allocationSize = req.size,
                               .memoryTypeIndex = type};
    VkResult r = fn->vkAllocateMemory(d->dev, &ai, NULL, mem);
    if (r != VK_SUCCESS) {
        fn->vkDestroyBuffer(d->dev, *buf, NULL);
        *buf = VK_NULL_HANDLE;
        return df_errorf(DF_E_OOM, "vulkan: out of device memory for %llu bytes on '%s' (%d)",
                         (unsigned long long)bytes, d->info.name, r);
    }
    fn->vkBindBufferMemory(d->dev, *buf, *mem, 0);
    VkBufferDeviceAddressInfo di = {.sType = VK_STRUCTURE_TYPE_BUFFER_DEVICE_ADDRESS_INFO,
                                    .buffer = *buf};
    *addr = fn->vkGetBufferDeviceAddress(d->dev, &di);
    if (map && fn->vkMapMemory(d->dev, *mem, 0, VK_WHOLE_SIZE, 0, mapped) != VK_SUCCESS) {
        fn->vkDestroyBuffer(d->dev, *buf, NULL);
        fn->vkFreeMemory(d->dev, *mem, NULL);
        *buf = VK_NULL_HANDLE;
        *mem = VK_NULL_HANDLE;
        return df_errorf(DF_E_DEVICE, "vulkan: vkMapMemory failed");
    }
    return DF_OK;
}

df_status dvk_arena_init(dvk_device *d, dvk_arena *a, uint64_t bytes)
{
    memset(a, 0, sizeof *a);
    void *p = NULL;
    DF_TRY(make_buffer(d, bytes, d->mem_host, true, &a->buffer, &a->memory, &a->addr, &p));
    a->mapped = p;
    a->size = bytes;
    return DF_OK;
}

void dvk_arena_deinit(dvk_device *d, dvk_arena *a)
{
    if (a->buffer)
        d->fn->vkDestroyBuffer(d->dev, a->buffer, NULL);
    if (a->memory)
        d->fn->vkFreeMemory(d->dev, a->memory, NULL);
    memset(a, 0, sizeof *a);
}

static df_status add_block(dvk_device *d, uint64_t bytes, bool dedicated, dvk_block **out)
{
    if (d->n_blocks == d->cap_blocks) {
        int cap = d->cap_blocks ? 2 * d->cap_blocks : 16;
        dvk_block **nb = realloc(d->blocks, (size_t)cap * sizeof *nb);
        if (!nb)
            return df_errorf(DF_E_OOM, "vulkan: out of host memory for the block list");
        d->blocks = nb;
        d->cap_blocks = cap;
    }
    dvk_block *b = calloc(1, sizeof *b);
    if (!b)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory for a block");
    df_status s = make_buffer(d, bytes, d->mem_device, false, &b->buffer, &b->memory, &b->addr,
                              &b->mapped);
    if (s != DF_OK) {
        free(b);
        return s;
    }
    b->size = bytes;
    b->dedicated = dedicated;
    if (!dedicated) {
        struct dvk_span *sp = malloc(sizeof *sp);
        if (!sp) {
            d->fn->vkDestroyBuffer(d->dev, b->buffer, NULL);
            d->fn->vkFreeMemory(d->dev, b->memory, NULL);
            free(b);
            return df_errorf(DF_E_OOM, "vulkan: out of host memory for a span");
        }
        *sp = (struct dvk_span){NULL, 0, bytes};
        b->free_list = sp;
    }
    d->blocks[d->n_blocks++] = b;
    *out = b;
    return DF_OK;
}

static bool take(dvk_block *b, uint64_t bytes, uint64_t *off)
{
    for (struct dvk_span **pp = &b->free_list; *pp; pp = &(*pp)->next) {
        struct dvk_span *s = *pp;
        if (s->size < bytes)
            continue;
        *off = s->off;
        s->off += bytes;
        s->size -= bytes;
        if (s->size == 0) {
            *pp = s->next;
            free(s);
        }
        return true;
    }
    return false;
}

df_status dvk_alloc_make(dvk_device *d, uint64_t bytes, dvk_alloc **out)
{
    *out = NULL;
    uint64_t need = round_up(bytes ? bytes : 1, ALIGN);
    if (d->info.max_alloc_bytes && need > d->info.max_alloc_bytes)
        return df_errorf(DF_E_OOM,
                         "vulkan: %llu bytes in one tensor exceed the device's largest "
                         "allocation (%llu bytes, '%s')",
                         (unsigned long long)bytes, (unsigned long long)d->info.max_alloc_bytes,
                         d->info.name);
    dvk_alloc *a = calloc(1, sizeof *a);
    if (!a)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory for an allocation");
    dvk_block *blk = NULL;
    uint64_t off = 0;
    if (need > d->block_bytes / 2) { /* a large tensor: a block of its own */
        df_status s = add_block(d, need, true, &blk);
        if (s != DF_OK) {
            free(a);
            return s;
        }
    } else {
        for (int i = 0; i < d->n_blocks && !blk; i++)
            if (!d->blocks[i]->dedicated && take(d->blocks[i], need, &off))
                blk = d->blocks[i];
        if (!blk) {
            df_status s = add_block(d, d->block_bytes, false, &blk);
            if (s != DF_OK) {
                free(a);
                return s;
            }
            take(blk, need, &off);
        }
    }
    a->block = blk;
    a->offset = off;
    a->size = need;
    a->addr = blk->addr + off;
    d->live_bytes += need;
    *out = a;
    return DF_OK;
}

static void drop_block(dvk_device *d, dvk_block *b)
{
    for (int i = 0; i < d->n_blocks; i++)
        if (d->blocks[i] == b) {
            d->blocks[i] = d->blocks[--d->n_blocks];
            break;
        }
    while (b->free_list) {
        struct dvk_span *n = b->free_list->next;
        free(b->free_list);
        b->free_list = n;
    }
    d->fn->vkDestroyBuffer(d->dev, b->buffer, NULL);
    d->fn->vkFreeMemory(d->dev, b->memory, NULL);
    free(b);
}

void dvk_alloc_free(dvk_device *d, dvk_alloc *a)
{
    if (!a)
        return;
    dvk_block *b = a->block;
    d->live_bytes -= a->size;
    if (b->dedicated) {
        /* Commands already recorded may still use it: let them finish first. */
        dvk_finish(d);
        drop_block(d, b);
        free(a);
        return;
    }
    struct dvk_span *prev = NULL, *next = b->free_list;
    while (next && next->off < a->offset) {
        prev = next;
        next = next->next;
    }
    if (prev && prev->off + prev->size == a->offset) {
        prev->size += a->size;
        if (next && prev->off + prev->size == next->off) {
            prev->size += next->size;
            prev->next = next->next;
            free(next);
        }
    } else if (next && a->offset + a->size == next->off) {
        next->off = a->offset;
        next->size += a->size;
    } else {
        struct dvk_span *s = malloc(sizeof *s);
        if (s) { /* without host memory the span is lost, not corrupted */
            *s = (struct dvk_span){next, a->offset, a->size};
            if (prev)
                prev->next = s;
            else
                b->free_list = s;
        }
    }
    free(a);
}

void dvk_pool_release(dvk_device *d)
{
    while (d->n_blocks > 0)
        drop_block(d, d->blocks[d->n_blocks - 1]);
    free(d->blocks);
    d->blocks = NULL;
    d->cap_blocks = 0;
}

df_status dvk_locate(dvk_device *d, VkDeviceAddress addr, uint64_t bytes, dvk_block **block,
                     uint64_t *offset)
{
    for (int i = 0; i < d->n_blocks; i++) {
        dvk_block *b = d->blocks[i];
        if (addr >= b->addr && addr + bytes <= b->addr + b->size) {
            *block = b;
            *offset = addr - b->addr;
            return DF_OK;
        }
    }
    return df_errorf(DF_E_INTERNAL, "vulkan: address 0x%llx (+%llu bytes) is in no pool block",
                     (unsigned long long)addr, (unsigned long long)bytes);
}

static VkBuffer current_arena(dvk_device *d, VkDeviceAddress addr, uint64_t *off)
{
    dvk_arena *a = &d->batch[d->cur].arena;
    *off = addr - a->addr;
    return a->buffer;
}

df_status dvk_upload(dvk_device *d, VkDeviceAddress dst, const void *src, uint64_t bytes)
{
    DF_TRY(dvk_capture_break(d, "an upload from host memory inside it"));
    dvk_block *blk = NULL;
    uint64_t boff = 0;
    DF_TRY(dvk_locate(d, dst, bytes, &blk, &boff));
    uint64_t chunk_max = d->batch[0].arena.size / 2;
    for (uint64_t done = 0; done < bytes;) {
        uint64_t n = bytes - done < chunk_max ? bytes - done : chunk_max;
        void *host;
        VkDeviceAddress haddr;
        DF_TRY(dvk_batch_host(d, n, &host, &haddr));
        memcpy(host, (const char *)src + done, n);
        dvk_range w = {dst + done, dst + done + n};
        dvk_hazard(d, NULL, 0, &w, 1);
        VkCommandBuffer cmd;
        DF_TRY(dvk_batch_cmd(d, &cmd));
        uint64_t aoff;
        VkBuffer abuf = current_arena(d, haddr, &aoff);
        VkBufferCopy c = {.srcOffset = aoff, .dstOffset = boff + done, .size = n};
        d->fn->vkCmdCopyBuffer(cmd, abuf, blk->buffer, 1, &c);
        d->pos++;
        done += n;
    }
    d->stats.bytes_up += (int64_t)bytes;
    return DF_OK;
}

df_status dvk_download(dvk_device *d, void *dst, VkDeviceAddress src, uint64_t bytes)
{
    DF_TRY(dvk_capture_break(d, "a read by the host inside it"));
    dvk_block *blk = NULL;
    uint64_t boff = 0;
    DF_TRY(dvk_locate(d, src, bytes, &blk, &boff));
    for (uint64_t done = 0; done < bytes;) {
        uint64_t n = bytes - done < d->readback.size ? bytes - done : d->readback.size;
        dvk_range r = {src + done, src + done + n};
        dvk_hazard(d, &r, 1, NULL, 0);
        VkCommandBuffer cmd;
        DF_TRY(dvk_batch_cmd(d, &cmd));
        VkBufferCopy c = {.srcOffset = boff + done, .dstOffset = 0, .size = n};
        d->fn->vkCmdCopyBuffer(cmd, blk->buffer, d->readback.buffer, 1, &c);
        d->pos++;
        VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                              .srcAccessMask = VK_ACCESS_TRANSFER_WRITE_BIT,
                              .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
        d->fn->vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT,
                                    VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &mb, 0, NULL, 0, NULL);
        DF_TRY(dvk_finish(d));
        memcpy((char *)dst + done, d->readback.mapped, n);
        done += n;
    }
    d->stats.bytes_down += (int64_t)bytes;
    return DF_OK;
}

df_status dvk_copy(dvk_device *d, VkDeviceAddress dst, VkDeviceAddress src, uint64_t bytes)
{
    dvk_block *sb = NULL, *db = NULL;
    uint64_t so = 0, dof = 0;
    DF_TRY(dvk_locate(d, src, bytes, &sb, &so));
    DF_TRY(dvk_locate(d, dst, bytes, &db, &dof));
    dvk_range r = {src, src + bytes}, w = {dst, dst + bytes};
    dvk_hazard(d, &r, 1, &w, 1);
    VkCommandBuffer cmd;
    DF_TRY(dvk_batch_cmd(d, &cmd));
    VkBufferCopy c = {.srcOffset = so, .dstOffset = dof, .size = bytes};
    d->fn->vkCmdCopyBuffer(cmd, sb->buffer, db->buffer, 1, &c);
    d->pos++;
    return DF_OK;
}
