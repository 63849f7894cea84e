/*
 * Command batches, barriers, pipelines and the pipeline cache.
 *
 * Batches: commands are recorded into one command buffer until the host needs a result
 * (a download), the batch's host arena is full, or DVK_BATCH_DISPATCHES dispatches are in
 * it; then it is submitted with a fence and the next of DVK_BATCHES command buffers
 * records, so recording overlaps the device's work. The host waits only in dvk_finish.
 *
 * Barriers come from dependencies: every command declares the address ranges it reads and
 * writes (dvk_hazard); a barrier is recorded only when a command reads or writes what an
 * earlier command of the batch wrote, or writes what one read. Each batch starts with one
 * barrier, which orders it after the batches submitted before it.
 *
 * Recorded graphs (compiled mode's replay): between dvk_capture_begin and dvk_capture_end
 * the commands go into a secondary command buffer, whose parameter blocks live in arenas of
 * its own; capture_end executes it once in the recording batch, dvk_graph_launch executes it
 * again in a later one (vkCmdExecuteCommands: no command is recorded again, and the call's
 * work is one submit). Its barriers are its hazards', as in a batch; one barrier before
 * and after each execution orders it against the batch's other commands.
 *
 * Pipelines are made on first use from the embedded SPIR-V and the specialisation
 * constants, through a VkPipelineCache that is loaded from and saved to
 * DIFFUSE_CACHE_DIR (default $XDG_CACHE_HOME/diffuse or ~/.cache/diffuse), in a file named
 * by vendor, device, driver version, the driver's cache UUID and the library version, so
 * a second process makes its pipelines from the cache.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

#ifndef DF_VERSION
#define DF_VERSION "dev"
#endif

#define DVK_BATCH_DISPATCHES 256

static const VkPipelineStageFlags STAGES =
    VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT;
static const VkAccessFlags ACCESS = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                    VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;

static void barrier(dvk_device *d, VkCommandBuffer cmd)
{
    VkMemoryBarrier mb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                          .srcAccessMask = ACCESS,
                          .dstAccessMask = ACCESS};
    d->fn->vkCmdPipelineBarrier(cmd, STAGES, STAGES, 0, 1, &mb, 0, NULL, 0, NULL);
    d->n_written = d->n_read = 0;
    d->stats.barriers++;
}

/* A fault a shader reported (the first since the last one was read) fails the device, with
 * the message the CPU backend gives for the same input. */
static void check_fault(dvk_device *d)
{
    dvk_fault *f = (dvk_fault *)(void *)d->fault.mapped;
    if (!f || f->kind == DVK_FAULT_NONE)
        return;
    if (d->failed == DF_OK && f->kind == DVK_FAULT_GATHER_ID)
        d->failed = df_errorf(DF_E_ARG, "gather: id %lld at position %lld is outside the "
                              "table of %lld rows", (long long)f->a, (long long)f->b,
                              (long long)f->c);
    memset(f, 0, sizeof *f);
}

static df_status wait_batch(dvk_device *d, dvk_batch *b)
{
    if (!b->in_flight)
        return DF_OK;
    VkResult r = d->fn->vkWaitForFences(d->dev, 1, &b->fence, VK_TRUE, UINT64_MAX);
    b->in_flight = false;
    check_fault(d);
    if (r == VK_SUCCESS && b->end_pos > d->done_pos)
        d->done_pos = b->end_pos;
    if (r != VK_SUCCESS && d->failed == DF_OK)
        d->failed = df_errorf(DF_E_DEVICE, "vulkan: waiting for a batch failed on '%s' (%d)",
                              d->info.name, r);
    return r == VK_SUCCESS ? DF_OK : d->failed;
}

/* A capture under way whose commands still go into its graph. */
static bool capturing(const dvk_device *d)
{
    return d->capture && !d->capture->broken;
}

df_status dvk_batch_cmd(dvk_device *d, VkCommandBuffer *out)
{
    if (capturing(d)) {
        *out = d->capture->cmd;
        return DF_OK;
    }
    dvk_batch *b = &d->batch[d->cur];
    if (!b->recording) {
        DF_TRY(wait_batch(d, b));
        d->fn->vkResetFences(d->dev, 1, &b->fence);
        d->fn->vkResetCommandBuffer(b->cmd, 0);
        VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                       .flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
        if (d->fn->vkBeginCommandBuffer(b->cmd, &bi) != VK_SUCCESS)
            return df_errorf(DF_E_DEVICE, "vulkan: vkBeginCommandBuffer failed");
        b->recording = true;
        b->arena.used = 0;
        b->dispatches = 0;
        barrier(d, b->cmd);
    }
    *out = b->cmd;
    return DF_OK;
}

df_status dvk_flush(dvk_device *d)
{
    dvk_batch *b = &d->batch[d->cur];
    if (!b->recording)
        return DF_OK;
    b->recording = false;
    VkMemoryBarrier hb = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER, /* the fault record */
                          .srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT,
                          .dstAccessMask = VK_ACCESS_HOST_READ_BIT};
    d->fn->vkCmdPipelineBarrier(b->cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                                VK_PIPELINE_STAGE_HOST_BIT, 0, 1, &hb, 0, NULL, 0, NULL);
    if (d->fn->vkEndCommandBuffer(b->cmd) != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkEndCommandBuffer failed");
    VkSubmitInfo si = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO,
                       .commandBufferCount = 1,
                       .pCommandBuffers = &b->cmd};
    VkResult r = d->fn->vkQueueSubmit(d->queue, 1, &si, b->fence);
    if (r != VK_SUCCESS) {
        if (d->failed == DF_OK)
            d->failed = df_errorf(DF_E_DEVICE, "vulkan: vkQueueSubmit failed on '%s' (%d)",
                                  d->info.name, r);
        return d->failed;
    }
    b->in_flight = true;
    b->end_pos = capturing(d) ? d->capture_pos : d->pos; /* the graph is not in it yet */
    d->stats.submits++;
    d->cur = (d->cur + 1) % DVK_BATCHES;
    return DF_OK;
}

df_status dvk_finish(dvk_device *d)
{
    DF_TRY(dvk_capture_break(d, "a wait for the device inside it"));
    df_status s = dvk_flush(d);
    for (int i = 0; i < DVK_BATCHES; i++) {
        df_status w = wait_batch(d, &d->batch[i]);
        if (s == DF_OK)
            s = w;
    }
    return s != DF_OK ? s : d->failed;
}

uint64_t dvk_position(dvk_device *d)
{
    return d->pos;
}

bool dvk_done(dvk_device *d, uint64_t at)
{
    if (at <= d->done_pos)
        return true;
    for (int i = 0; i < DVK_BATCHES; i++) {
        dvk_batch *b = &d->batch[i];
        if (b->in_flight && d->fn->vkGetFenceStatus(d->dev, b->fence) == VK_SUCCESS)
            wait_batch(d, b);
    }
    return at <= d->done_pos;
}

bool dvk_reached(dvk_device *d, uint64_t at, bool wait)
{
    if (at <= d->done_pos)
        return true;
    for (int i = 0; i < DVK_BATCHES; i++) { /* finished batches, without waiting */
        dvk_batch *b = &d->batch[i];
        if (b->in_flight && d->fn->vkGetFenceStatus(d->dev, b->fence) == VK_SUCCESS)
            wait_batch(d, b);
    }
    if (at <= d->done_pos)
        return true;
    if (capturing(d) && at > d->capture_pos) { /* inside the graph being recorded */
        if (!wait)
            return false;
        if (dvk_capture_break(d, "a wait for a position inside it") != DF_OK)
            return true;
    }
    if (d->batch[d->cur].recording && dvk_flush(d) != DF_OK)
        return true; /* a failed device: nothing will run; sync reports why */
    if (!wait)
        return false;
    for (int k = 0; k < DVK_BATCHES && at > d->done_pos; k++) { /* oldest first */
        dvk_batch *b = &d->batch[(d->cur + k) % DVK_BATCHES];
        if (wait_batch(d, b) != DF_OK)
            return true;
    }
    return at <= d->done_pos;
}

static df_status graph_host(dvk_device *d, dvk_graph *g, uint64_t need, void **host,
                            VkDeviceAddress *addr)
{
    dvk_arena *a = g->n_arenas ? &g->arenas[g->n_arenas - 1] : NULL;
    if (!a || a->used + need > a->size) {
        uint64_t size = a && a->size < (4u << 20) ? 2 * a->size : a ? a->size : 64u << 10;
        if (size < need)
            size = need;
        dvk_arena *na = realloc(g->arenas, ((size_t)g->n_arenas + 1) * sizeof *na);
        if (!na)
            return df_errorf(DF_E_OOM, "vulkan: out of host memory recording a graph");
        g->arenas = na;
        DF_TRY(dvk_arena_init(d, &g->arenas[g->n_arenas], size));
        a = &g->arenas[g->n_arenas++];
    }
    *host = a->mapped + a->used;
    *addr = a->addr + a->used;
    a->used += need;
    return DF_OK;
}

df_status dvk_batch_host(dvk_device *d, uint64_t bytes, void **host, VkDeviceAddress *addr)
{
    uint64_t need = (bytes + 255) & ~(uint64_t)255;
    if (capturing(d)) /* kept with the graph: its replays read them */
        return graph_host(d, d->capture, need, host, addr);
    VkCommandBuffer cmd;
    DF_TRY(dvk_batch_cmd(d, &cmd));
    dvk_batch *b = &d->batch[d->cur];
    if (b->arena.used + need > b->arena.size) {
        DF_TRY(dvk_flush(d));
        DF_TRY(dvk_batch_cmd(d, &cmd));
        b = &d->batch[d->cur];
        if (need > b->arena.size)
            return df_errorf(DF_E_INTERNAL, "vulkan: %llu bytes do not fit a batch arena",
                             (unsigned long long)bytes);
    }
    *host = b->arena.mapped + b->arena.used;
    *addr = b->arena.addr + b->arena.used;
    b->arena.used += need;
    return DF_OK;
}

static bool overlaps(const dvk_range *list, int n, dvk_range r)
{
    for (int i = 0; i < n; i++)
        if (r.lo < list[i].hi && list[i].lo < r.hi)
            return true;
    return false;
}

void dvk_hazard(dvk_device *d, const dvk_range *reads, int n_reads, const dvk_range *writes,
                int n_writes)
{
    VkCommandBuffer cmd;
    if (dvk_batch_cmd(d, &cmd) != DF_OK)
        return; /* the failure is reported by the command that follows */
    bool need = d->n_read + n_reads > DVK_HAZARD_MAX || d->n_written + n_writes > DVK_HAZARD_MAX;
    for (int i = 0; i < n_reads && !need; i++)
        need = overlaps(d->written, d->n_written, reads[i]);
    for (int i = 0; i < n_writes && !need; i++)
        need = overlaps(d->written, d->n_written, writes[i]) ||
               overlaps(d->read, d->n_read, writes[i]);
    if (need)
        barrier(d, cmd);
    for (int i = 0; i < n_reads; i++)
        d->read[d->n_read++] = reads[i];
    for (int i = 0; i < n_writes; i++)
        d->written[d->n_written++] = writes[i];
}

int dvk_shader_find(const char *name)
{
    for (int i = 0; i < dvk_shader_count; i++)
        if (strcmp(dvk_shaders[i].name, name) == 0)
            return i;
    return -1;
}

static df_status get_pipeline(dvk_device *d, int shader, const uint32_t *spec, int n_spec,
                              VkPipeline *out)
{
    for (int i = 0; i < d->n_pipelines; i++) {
        dvk_pipeline *p = &d->pipelines[i];
        if (p->shader == shader && p->n_spec == n_spec &&
            (n_spec == 0 || memcmp(p->spec, spec, (size_t)n_spec * sizeof *spec) == 0)) {
            *out = p->pipeline;
            return DF_OK;
        }
    }
    if (shader < 0 || shader >= dvk_shader_count || n_spec > 8)
        return df_errorf(DF_E_INTERNAL, "vulkan: no shader %d", shader);
    const dvk_shader_blob *blob = &dvk_shaders[shader];
    VkShaderModuleCreateInfo mi = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                   .codeSize = *blob->bytes,
                                   .pCode = (const uint32_t *)(const void *)blob->code};
    VkShaderModule mod;
    if (d->fn->vkCreateShaderModule(d->dev, &mi, NULL, &mod) != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: shader '%s' was refused by '%s'", blob->name,
                         d->info.name);
    VkSpecializationMapEntry map[8];
    for (int i = 0; i < n_spec; i++)
        map[i] = (VkSpecializationMapEntry){(uint32_t)i, (uint32_t)(i * 4), 4};
    VkSpecializationInfo si = {.mapEntryCount = (uint32_t)n_spec,
                               .pMapEntries = map,
                               .dataSize = (size_t)n_spec * 4,
                               .pData = spec};
    VkComputePipelineCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
        .stage = {.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                  .stage = VK_SHADER_STAGE_COMPUTE_BIT,
                  .module = mod,
                  .pName = "main",
                  .pSpecializationInfo = n_spec ? &si : NULL},
        .layout = d->layout,
    };
    VkPipeline pl;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    VkResult r = d->fn->vkCreateComputePipelines(d->dev, d->cache, 1, &ci, NULL, &pl);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    d->stats.pipeline_ms += (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    d->fn->vkDestroyShaderModule(d->dev, mod, NULL);
    if (r != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: making the pipeline of '%s' failed on '%s' (%d)",
                         blob->name, d->info.name, r);
    if (d->n_pipelines == d->cap_pipelines) {
        int cap = d->cap_pipelines ? 2 * d->cap_pipelines : 32;
        dvk_pipeline *np = realloc(d->pipelines, (size_t)cap * sizeof *np);
        if (!np) {
            d->fn->vkDestroyPipeline(d->dev, pl, NULL);
            return df_errorf(DF_E_OOM, "vulkan: out of host memory for pipelines");
        }
        d->pipelines = np;
        d->cap_pipelines = cap;
    }
    dvk_pipeline *p = &d->pipelines[d->n_pipelines++];
    memset(p, 0, sizeof *p);
    p->shader = shader;
    p->n_spec = n_spec;
    if (n_spec > 0)
        memcpy(p->spec, spec, (size_t)n_spec * sizeof *spec);
    p->pipeline = pl;
    d->stats.pipelines_created++;
    *out = pl;
    return DF_OK;
}

df_status dvk_dispatch(dvk_device *d, int shader, const uint32_t *spec, int n_spec,
                       const void *params, size_t bytes, uint32_t gx, uint32_t gy, uint32_t gz)
{
    if (gx == 0 || gy == 0 || gz == 0)
        return DF_OK;
    VkPipeline pl = VK_NULL_HANDLE;
    DF_TRY(get_pipeline(d, shader, spec, n_spec, &pl));
    void *host;
    VkDeviceAddress addr;
    DF_TRY(dvk_batch_host(d, bytes, &host, &addr));
    memcpy(host, params, bytes);
    VkCommandBuffer cmd;
    DF_TRY(dvk_batch_cmd(d, &cmd));
    d->fn->vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, pl);
    uint64_t a = addr;
    d->fn->vkCmdPushConstants(cmd, d->layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, 8, &a);
    d->fn->vkCmdDispatch(cmd, gx, gy, gz);
    d->stats.dispatches++;
    d->stats.dispatches_recorded++;
    d->pos++;
    dvk_batch *b = &d->batch[d->cur];
    if (capturing(d)) {
        d->capture->dispatches++;
    } else if (d->profile && shader < DVK_MAX_SHADERS) { /* DIFFUSE_VULKAN_PROFILE=1: timed alone */
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        DF_TRY(dvk_finish(d));
        clock_gettime(CLOCK_MONOTONIC, &t1);
        d->profile_ms[shader] += (double)(t1.tv_sec - t0.tv_sec) * 1e3 +
                                 (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
        d->profile_calls[shader]++;
    } else if (++b->dispatches >= DVK_BATCH_DISPATCHES) {
        DF_TRY(dvk_flush(d));
    }
    return DF_OK;
}

/* ---- recorded graphs --------------------------------------------------------------------- */

df_status dvk_capture_begin(dvk_device *d)
{
    if (d->capture)
        return df_errorf(DF_E_STATE, "vulkan: a capture is already under way");
    if (d->profile)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: no recorded graphs with "
                         "DIFFUSE_VULKAN_PROFILE=1 (every dispatch is submitted alone)");
    dvk_graph *g = calloc(1, sizeof *g);
    if (!g)
        return df_errorf(DF_E_OOM, "vulkan: out of host memory recording a graph");
    VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                      .commandPool = d->cmd_pool,
                                      .level = VK_COMMAND_BUFFER_LEVEL_SECONDARY,
                                      .commandBufferCount = 1};
    VkCommandBufferInheritanceInfo ih = {
        .sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_INHERITANCE_INFO};
    VkCommandBufferBeginInfo bi = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO,
                                   .flags = VK_COMMAND_BUFFER_USAGE_SIMULTANEOUS_USE_BIT,
                                   .pInheritanceInfo = &ih};
    if (d->fn->vkAllocateCommandBuffers(d->dev, &ai, &g->cmd) != VK_SUCCESS) {
        free(g);
        return df_errorf(DF_E_DEVICE, "vulkan: allocating a secondary command buffer failed");
    }
    if (d->fn->vkBeginCommandBuffer(g->cmd, &bi) != VK_SUCCESS) {
        d->fn->vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &g->cmd);
        free(g);
        return df_errorf(DF_E_DEVICE, "vulkan: vkBeginCommandBuffer failed (secondary)");
    }
    d->capture = g;
    d->capture_pos = d->pos;
    barrier(d, g->cmd); /* after everything before it; its hazards start here */
    return DF_OK;
}

/* Ends the recording and executes the graph once in the recording batch. */
static df_status end_recording(dvk_device *d, dvk_graph *g)
{
    d->capture = g;
    if (d->fn->vkEndCommandBuffer(g->cmd) != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkEndCommandBuffer failed (secondary)");
    g->positions = d->pos - d->capture_pos;
    const char *broken = g->broken;
    g->broken = "ending"; /* commands from here go into the batch */
    VkCommandBuffer prim;
    df_status s = dvk_batch_cmd(d, &prim);
    g->broken = broken;
    if (s != DF_OK)
        return s;
    d->fn->vkCmdExecuteCommands(prim, 1, &g->cmd);
    barrier(d, prim); /* what follows depends on it as a whole */
    return DF_OK;
}

df_status dvk_capture_break(dvk_device *d, const char *why)
{
    if (!capturing(d))
        return DF_OK;
    df_status s = end_recording(d, d->capture);
    d->capture->broken = why;
    return s;
}

df_status dvk_capture_end(dvk_device *d, dvk_graph **out)
{
    *out = NULL;
    dvk_graph *g = d->capture;
    if (!g)
        return df_errorf(DF_E_STATE, "vulkan: capture_end without capture_begin");
    df_status s = g->broken ? DF_OK : end_recording(d, g);
    d->capture = NULL;
    if (s != DF_OK || g->broken) {
        const char *why = g->broken ? g->broken : "recording it failed";
        dvk_graph_free(d, g);
        return s != DF_OK ? s : df_errorf(DF_E_UNSUPPORTED, "vulkan: the captured work "
                                          "cannot be replayed (%s)", why);
    }
    *out = g;
    return DF_OK;
}

df_status dvk_graph_launch(dvk_device *d, dvk_graph *g)
{
    if (d->capture)
        return df_errorf(DF_E_STATE, "vulkan: a graph launched inside a capture");
    VkCommandBuffer prim;
    DF_TRY(dvk_batch_cmd(d, &prim)); /* the graph begins with its own barrier */
    d->fn->vkCmdExecuteCommands(prim, 1, &g->cmd);
    barrier(d, prim);
    d->pos += g->positions;
    d->stats.dispatches += g->dispatches;
    d->stats.graph_launches++;
    if (++d->batch[d->cur].dispatches >= DVK_BATCH_DISPATCHES)
        DF_TRY(dvk_flush(d));
    return DF_OK;
}

void dvk_graph_free(dvk_device *d, dvk_graph *g)
{
    if (!g)
        return;
    dvk_finish(d); /* no batch executes it any more */
    d->fn->vkFreeCommandBuffers(d->dev, d->cmd_pool, 1, &g->cmd);
    for (int i = 0; i < g->n_arenas; i++)
        dvk_arena_deinit(d, &g->arenas[i]);
    free(g->arenas);
    free(g);
}

void dvk_profile_print(dvk_device *d)
{
    if (!d->profile)
        return;
    for (int i = 0; i < dvk_shader_count && i < DVK_MAX_SHADERS; i++)
        if (d->profile_calls[i])
            fprintf(stderr, "vulkan profile: %-8s %6lld dispatches %10.1f ms\n",
                    dvk_shaders[i].name, (long long)d->profile_calls[i], d->profile_ms[i]);
}

/* ---- the pipeline cache ---------------------------------------------------------------- */

static void cache_dir(char *out, size_t n)
{
    const char *dir = getenv("DIFFUSE_CACHE_DIR");
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (dir && *dir)
        snprintf(out, n, "%s", dir);
    else if (xdg && *xdg)
        snprintf(out, n, "%s/diffuse", xdg);
    else if (home && *home)
        snprintf(out, n, "%s/.cache/diffuse", home);
    else
        out[0] = 0;
}

/* mkdir -p; failures are left to the file's open. */
static void make_dirs(const char *path)
{
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(tmp, 0755);
            *p = '/';
        }
    mkdir(tmp, 0755);
}

df_status dvk_pipeline_cache_open(dvk_device *d)
{
    char dir[400];
    cache_dir(dir, sizeof dir);
    const dvk_device_info *in = &d->info;
    char uuid[2 * VK_UUID_SIZE + 1];
    for (int i = 0; i < (int)VK_UUID_SIZE; i++)
        snprintf(uuid + 2 * i, 3, "%02x", in->uuid[i]);
    d->cache_path[0] = 0;
    if (dir[0])
        snprintf(d->cache_path, sizeof d->cache_path, "%s/vulkan-%04x-%04x-%08x-%s-%s.bin", dir,
                 in->vendor, in->device_id, in->driver_version, uuid, DF_VERSION);
    void *data = NULL;
    size_t size = 0;
    FILE *f = d->cache_path[0] ? fopen(d->cache_path, "rb") : NULL;
    if (f) {
        if (fseek(f, 0, SEEK_END) == 0) {
            long len = ftell(f);
            if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (data = malloc((size_t)len)) &&
                fread(data, 1, (size_t)len, f) == (size_t)len)
                size = (size_t)len;
        }
        fclose(f);
    }
    VkPipelineCacheCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                                    .initialDataSize = size,
                                    .pInitialData = size ? data : NULL};
    VkResult r = d->fn->vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    if (r != VK_SUCCESS && size) { /* a stale or damaged file: start empty */
        ci.initialDataSize = 0;
        ci.pInitialData = NULL;
        size = 0;
        r = d->fn->vkCreatePipelineCache(d->dev, &ci, NULL, &d->cache);
    }
    free(data);
    if (r != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkCreatePipelineCache failed (%d)", r);
    d->cache_loaded_bytes = size;
    return DF_OK;
}

void dvk_pipeline_cache_save(dvk_device *d)
{
    if (!d->cache || !d->cache_path[0] || d->stats.pipelines_created == 0)
        return;
    size_t size = 0;
    if (d->fn->vkGetPipelineCacheData(d->dev, d->cache, &size, NULL) != VK_SUCCESS || !size)
        return;
    void *data = malloc(size);
    if (!data)
        return;
    if (d->fn->vkGetPipelineCacheData(d->dev, d->cache, &size, data) == VK_SUCCESS) {
        char dir[512], tmp[600];
        snprintf(dir, sizeof dir, "%s", d->cache_path);
        char *slash = strrchr(dir, '/');
        if (slash) {
            *slash = 0;
            make_dirs(dir);
        }
        snprintf(tmp, sizeof tmp, "%s.%d.tmp", d->cache_path, (int)getpid());
        FILE *f = fopen(tmp, "wb");
        bool ok = f && fwrite(data, 1, size, f) == size;
        if (f && fclose(f) != 0)
            ok = false;
        if (ok && rename(tmp, d->cache_path) == 0)
            ok = true;
        else
            unlink(tmp);
    }
    free(data);
}
