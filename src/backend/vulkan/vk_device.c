/*
 * Vulkan devices: listing, what each offers, opening one.
 *
 * Order: discrete GPUs, then integrated GPUs, then virtual GPUs, then CPU implementations
 * (lavapipe). A CPU implementation is never offered by default, because the CPU backend
 * is faster on the same cores: it is used when DIFFUSE_VULKAN_ALLOW_CPU=1 or when the
 * caller names its index (`vulkan:N`).
 *
 * Requirements: Vulkan 1.2 with bufferDeviceAddress, shaderInt64 and 16-bit storage
 * buffers (every desktop GPU of the last years has them). Optional, reported: shaderFloat16,
 * shaderInt8 with 8-bit storage, VK_KHR_cooperative_matrix.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

static int type_rank(VkPhysicalDeviceType t)
{
    switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: return 0;
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: return 1;
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: return 2;
    case VK_PHYSICAL_DEVICE_TYPE_CPU: return 4;
    default: return 3;
    }
}

df_status dvk_devices_list(int *out_n, int order[16])
{
    *out_n = 0;
    dvk_instance *in;
    DF_TRY(dvk_instance_get(&in));
    int n = 0;
    for (int rank = 0; rank <= 4; rank++)
        for (uint32_t i = 0; i < in->n_phys; i++) {
            VkPhysicalDeviceProperties p;
            in->fn.vkGetPhysicalDeviceProperties(in->phys[i], &p);
            if (type_rank(p.deviceType) == rank)
                order[n++] = (int)i;
        }
    *out_n = n;
    return DF_OK;
}

static bool has_device_ext(const dvk_fns *fn, VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0;
    if (fn->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL) != VK_SUCCESS || !n)
        return false;
    VkExtensionProperties *p = calloc(n, sizeof *p);
    bool found = false;
    if (p && fn->vkEnumerateDeviceExtensionProperties(pd, NULL, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(p[i].extensionName, name) == 0;
    free(p);
    return found;
}

static void query(const dvk_instance *in, VkPhysicalDevice pd, dvk_device_info *o)
{
    const dvk_fns *fn = &in->fn;
    memset(o, 0, sizeof *o);
    VkPhysicalDeviceSubgroupProperties sub = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceMaintenance3Properties m3 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, .pNext = &sub};
    VkPhysicalDeviceDriverProperties drv = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, .pNext = &m3};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &drv};
    fn->vkGetPhysicalDeviceProperties2(pd, &p2);
    const VkPhysicalDeviceProperties *p = &p2.properties;
    snprintf(o->name, sizeof o->name, "%s", p->deviceName);
    snprintf(o->driver, sizeof o->driver, "%s %s", drv.driverName, drv.driverInfo);
    o->type = p->deviceType;
    o->vendor = p->vendorID;
    o->device_id = p->deviceID;
    o->driver_version = p->driverVersion;
    o->api_version = p->apiVersion;
    memcpy(o->uuid, p->pipelineCacheUUID, VK_UUID_SIZE);
    o->subgroup_size = sub.subgroupSize;
    o->max_shared_bytes = p->limits.maxComputeSharedMemorySize;
    o->max_storage_range = p->limits.maxStorageBufferRange;
    o->max_alloc_bytes = m3.maxMemoryAllocationSize;

    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES, .pNext = &f12};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f11};
    if (p->apiVersion >= VK_API_VERSION_1_2)
        fn->vkGetPhysicalDeviceFeatures2(pd, &f2);
    o->int64 = f2.features.shaderInt64;
    o->bda = f12.bufferDeviceAddress;
    o->storage16 = f11.storageBuffer16BitAccess;
    o->storage8 = f12.storageBuffer8BitAccess;
    o->fp16 = f12.shaderFloat16;
    o->int8 = f12.shaderInt8 && f12.storageBuffer8BitAccess;
    o->coopmat = has_device_ext(fn, pd, "VK_KHR_cooperative_matrix");

    VkPhysicalDeviceMemoryProperties mp;
    fn->vkGetPhysicalDeviceMemoryProperties(pd, &mp);
    for (uint32_t h = 0; h < mp.memoryHeapCount; h++) {
        if (mp.memoryHeaps[h].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
            o->device_local_bytes += mp.memoryHeaps[h].size;
        else
            o->host_visible_bytes += mp.memoryHeaps[h].size;
    }
    o->usable = true;
    if (p->apiVersion < VK_API_VERSION_1_2)
        snprintf(o->missing, sizeof o->missing, "Vulkan 1.2");
    else if (!o->bda)
        snprintf(o->missing, sizeof o->missing, "bufferDeviceAddress");
    else if (!o->int64)
        snprintf(o->missing, sizeof o->missing, "shaderInt64");
    else if (!o->storage16 || !o->storage8)
        snprintf(o->missing, sizeof o->missing, "8- and 16-bit storage buffers");
    o->usable = o->missing[0] == 0;
}

df_status dvk_device_info_get(int index, dvk_device_info *out)
{
    int order[16], n;
    DF_TRY(dvk_devices_list(&n, order));
    if (index < 0 || index >= n)
        return df_errorf(DF_E_ARG, "vulkan: there is no device %d (%d found)", index, n);
    dvk_instance *in;
    DF_TRY(dvk_instance_get(&in));
    query(in, in->phys[order[index]], out);
    return DF_OK;
}

bool dvk_device_offered(const dvk_device_info *info)
{
    if (!info->usable)
        return false;
    if (info->type != VK_PHYSICAL_DEVICE_TYPE_CPU)
        return true;
    const char *allow = getenv("DIFFUSE_VULKAN_ALLOW_CPU");
    return allow && strcmp(allow, "1") == 0;
}

static int find_memory(const VkPhysicalDeviceMemoryProperties *mp, VkMemoryPropertyFlags want,
                       VkMemoryPropertyFlags avoid)
{
    for (uint32_t i = 0; i < mp->memoryTypeCount; i++) {
        VkMemoryPropertyFlags f = mp->memoryTypes[i].propertyFlags;
        if ((f & want) == want && !(f & avoid))
            return (int)i;
    }
    return -1;
}

static df_status create_device(dvk_device *d)
{
    const dvk_fns *fn = d->fn;
    uint32_t nq = 0;
    fn->vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, NULL);
    VkQueueFamilyProperties qp[16];
    nq = nq > 16 ? 16 : nq;
    fn->vkGetPhysicalDeviceQueueFamilyProperties(d->phys, &nq, qp);
    int family = -1;
    for (uint32_t i = 0; i < nq && family < 0; i++) /* a compute-only family first */
        if ((qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT) && !(qp[i].queueFlags & VK_QUEUE_GRAPHICS_BIT))
            family = (int)i;
    for (uint32_t i = 0; i < nq && family < 0; i++)
        if (qp[i].queueFlags & VK_QUEUE_COMPUTE_BIT)
            family = (int)i;
    if (family < 0)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: device '%s' has no compute queue",
                         d->info.name);
    d->queue_family = (uint32_t)family;
    float prio = 1.0f;
    VkDeviceQueueCreateInfo qi = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                  .queueFamilyIndex = d->queue_family,
                                  .queueCount = 1,
                                  .pQueuePriorities = &prio};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES,
        .bufferDeviceAddress = VK_TRUE,
        .storageBuffer8BitAccess = VK_TRUE,
        .shaderFloat16 = d->info.fp16,
        .shaderInt8 = d->info.int8,
    };
    VkPhysicalDeviceVulkan11Features f11 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES,
        .pNext = &f12,
        .storageBuffer16BitAccess = VK_TRUE,
    };
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f11,
                                    .features = {.shaderInt64 = VK_TRUE}};
    /* cooperative matrices, where the matmul will use them (vk_coopmat.c) */
    const char *exts[1];
    uint32_t n_exts = 0;
    dvk_coopmat_features cmf;
    dvk_coopmat_select(d->inst, d->phys, &d->info, &d->coopmat);
    dvk_coopmat_chain(&d->coopmat, &cmf, &f12, exts, &n_exts);
    VkDeviceCreateInfo ci = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO,
                             .pNext = &f2,
                             .queueCreateInfoCount = 1,
                             .pQueueCreateInfos = &qi,
                             .enabledExtensionCount = n_exts,
                             .ppEnabledExtensionNames = exts};
    VkResult r = fn->vkCreateDevice(d->phys, &ci, NULL, &d->dev);
    if (r != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkCreateDevice failed on '%s' (VkResult %d)",
                         d->info.name, r);
    return DF_OK;
}

static df_status load_device_fns(dvk_device *d)
{
    dvk_fns *fn = &d->inst->fn;
#define DVK_LOAD_DEVICE(fn_)                                                              \
    if (!fn->fn_)                                                                         \
        fn->fn_ = (PFN_##fn_)fn->vkGetDeviceProcAddr(d->dev, #fn_);                     \
    if (!fn->fn_)                                                                         \
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: device '%s' lacks %s", d->info.name, #fn_);
    DVK_DEVICE_FNS(DVK_LOAD_DEVICE)
#undef DVK_LOAD_DEVICE
    return DF_OK;
}

static df_status open_device(int index, dvk_device *d)
{
    int order[16], n;
    DF_TRY(dvk_devices_list(&n, order));
    if (index < 0 || index >= n)
        return df_errorf(DF_E_ARG, "vulkan: there is no device %d (%d found)", index, n);
    DF_TRY(dvk_instance_get(&d->inst));
    d->fn = &d->inst->fn;
    d->phys = d->inst->phys[order[index]];
    query(d->inst, d->phys, &d->info);
    if (!d->info.usable)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: device %d '%s' lacks %s", index,
                         d->info.name, d->info.missing);
    VkPhysicalDeviceMemoryProperties mp;
    d->fn->vkGetPhysicalDeviceMemoryProperties(d->phys, &mp);
    int dev_mem = find_memory(&mp, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT, 0);
    int host_mem = find_memory(&mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT |
                                        VK_MEMORY_PROPERTY_HOST_CACHED_BIT, 0);
    if (host_mem < 0)
        host_mem = find_memory(&mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                        VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
    if (dev_mem < 0 || host_mem < 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: device '%s' has no %s memory type", d->info.name,
                         dev_mem < 0 ? "device-local" : "host-visible coherent");
    d->mem_device = (uint32_t)dev_mem;
    d->mem_host = (uint32_t)host_mem;
    d->device_mem_host_visible =
        (mp.memoryTypes[dev_mem].propertyFlags & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT) != 0;
    DF_TRY(create_device(d));
    DF_TRY(load_device_fns(d));
    d->fn->vkGetDeviceQueue(d->dev, d->queue_family, 0, &d->queue);

    VkCommandPoolCreateInfo pi = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO,
                                  .flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                  .queueFamilyIndex = d->queue_family};
    if (d->fn->vkCreateCommandPool(d->dev, &pi, NULL, &d->cmd_pool) != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkCreateCommandPool failed");
    VkPushConstantRange pc = {.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT, .size = 8};
    VkPipelineLayoutCreateInfo li = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                                     .pushConstantRangeCount = 1,
                                     .pPushConstantRanges = &pc};
    if (d->fn->vkCreatePipelineLayout(d->dev, &li, NULL, &d->layout) != VK_SUCCESS)
        return df_errorf(DF_E_DEVICE, "vulkan: vkCreatePipelineLayout failed");
    /* Pool blocks: 256 MiB, or what one allocation may be. */
    d->block_bytes = (uint64_t)256 << 20;
    if (d->info.max_alloc_bytes && d->block_bytes > d->info.max_alloc_bytes)
        d->block_bytes = d->info.max_alloc_bytes;
    for (int i = 0; i < DVK_BATCHES; i++) {
        dvk_batch *b = &d->batch[i];
        VkCommandBufferAllocateInfo ai = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO,
                                          .commandPool = d->cmd_pool,
                                          .level = VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                                          .commandBufferCount = 1};
        if (d->fn->vkAllocateCommandBuffers(d->dev, &ai, &b->cmd) != VK_SUCCESS)
            return df_errorf(DF_E_DEVICE, "vulkan: vkAllocateCommandBuffers failed");
        VkFenceCreateInfo fi = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
        if (d->fn->vkCreateFence(d->dev, &fi, NULL, &b->fence) != VK_SUCCESS)
            return df_errorf(DF_E_DEVICE, "vulkan: vkCreateFence failed");
        DF_TRY(dvk_arena_init(d, &b->arena, (uint64_t)16 << 20));
    }
    DF_TRY(dvk_arena_init(d, &d->readback, (uint64_t)16 << 20));
    DF_TRY(dvk_arena_init(d, &d->fault, 256));
    memset(d->fault.mapped, 0, sizeof(dvk_fault));
    DF_TRY(dvk_pipeline_cache_open(d));
    const char *prof = getenv("DIFFUSE_VULKAN_PROFILE");
    d->profile = prof && strcmp(prof, "1") == 0;
    return DF_OK;
}

df_status dvk_device_open(int index, dvk_device **out)
{
    *out = NULL;
    dvk_device *d = calloc(1, sizeof *d);
    if (!d)
        return df_errorf(DF_E_OOM, "vulkan: out of memory for a device");
    df_status s = open_device(index, d);
    if (s != DF_OK) {
        dvk_device_close(d);
        return s;
    }
    *out = d;
    return DF_OK;
}

void dvk_device_close(dvk_device *d)
{
    if (!d)
        return;
    if (d->dev) {
        dvk_finish(d);
        d->fn->vkDeviceWaitIdle(d->dev);
        dvk_profile_print(d);
        dvk_pipeline_cache_save(d);
        for (int i = 0; i < d->n_pipelines; i++)
            d->fn->vkDestroyPipeline(d->dev, d->pipelines[i].pipeline, NULL);
        free(d->pipelines);
        if (d->cache)
            d->fn->vkDestroyPipelineCache(d->dev, d->cache, NULL);
        for (int i = 0; i < DVK_BATCHES; i++) {
            dvk_batch *b = &d->batch[i];
            if (b->fence)
                d->fn->vkDestroyFence(d->dev, b->fence, NULL);
            dvk_arena_deinit(d, &b->arena);
        }
        dvk_arena_deinit(d, &d->readback);
        dvk_arena_deinit(d, &d->fault);
        dvk_pool_release(d);
        if (d->layout)
            d->fn->vkDestroyPipelineLayout(d->dev, d->layout, NULL);
        if (d->cmd_pool)
            d->fn->vkDestroyCommandPool(d->dev, d->cmd_pool, NULL);
        d->fn->vkDestroyDevice(d->dev, NULL);
    }
    free(d);
}
