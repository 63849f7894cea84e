/*
 * The Vulkan backend's core, shared by its files: the loader's function table, the opened
 * device, its memory pool and host arenas, command batches and pipelines.
 *
 * Nothing here links libvulkan: vk_loader.c opens libvulkan.so.1 with dlopen and fetches
 * every entry point through vkGetInstanceProcAddr / vkGetDeviceProcAddr, so a build with
 * this backend still runs on a machine without any Vulkan package (the backend then says
 * so with DF_E_UNSUPPORTED).
 *
 * Tensors are addressed by device address (buffer device address, core in Vulkan 1.2):
 * a shader gets one 64-bit address of its parameter block in a push constant, and the
 * block holds the address of every operand. No descriptor sets exist, and no tensor is
 * limited by maxStorageBufferRange: a pool block is bound whole and only
 * maxMemoryAllocationSize / maxBufferSize bound one allocation.
 *
 * The core is written against the op table (backend/ops.def) and the node and fused-program
 * structs of the device ABI (backend/device.h); the only thing it needs from its caller is a
 * way to turn a view's buffer into a device address (dvk_addr_fn): plugin.c gives it the
 * pool allocation behind a df_dev_buffer, the op test its own twins of CPU buffers.
 */
#ifndef DF_VK_INTERNAL_H
#define DF_VK_INTERNAL_H

#define VK_NO_PROTOTYPES
#include <vulkan/vulkan.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/device.h"

/* ---- the loader ------------------------------------------------------------------------ */

#define DVK_GLOBAL_FNS(X)                                                                  \
    X(vkCreateInstance)                                                                    \
    X(vkEnumerateInstanceVersion)                                                          \
    X(vkEnumerateInstanceLayerProperties)                                                  \
    X(vkEnumerateInstanceExtensionProperties)

#define DVK_INSTANCE_FNS(X)                                                                \
    X(vkDestroyInstance)                                                                   \
    X(vkEnumeratePhysicalDevices)                                                          \
    X(vkGetPhysicalDeviceProperties)                                                       \
    X(vkGetPhysicalDeviceProperties2)                                                      \
    X(vkGetPhysicalDeviceFeatures2)                                                        \
    X(vkGetPhysicalDeviceMemoryProperties)                                                 \
    X(vkGetPhysicalDeviceQueueFamilyProperties)                                            \
    X(vkEnumerateDeviceExtensionProperties)                                                \
    X(vkCreateDevice)                                                                      \
    X(vkGetDeviceProcAddr)

#define DVK_DEVICE_FNS(X)                                                                  \
    X(vkDestroyDevice)                                                                     \
    X(vkGetDeviceQueue)                                                                    \
    X(vkDeviceWaitIdle)                                                                    \
    X(vkCreateBuffer)                                                                      \
    X(vkDestroyBuffer)                                                                     \
    X(vkGetBufferMemoryRequirements)                                                       \
    X(vkAllocateMemory)                                                                    \
    X(vkFreeMemory)                                                                        \
    X(vkBindBufferMemory)                                                                  \
    X(vkMapMemory)                                                                         \
    X(vkUnmapMemory)                                                                       \
    X(vkGetBufferDeviceAddress)                                                            \
    X(vkCreateCommandPool)                                                                 \
    X(vkDestroyCommandPool)                                                                \
    X(vkAllocateCommandBuffers)                                                            \
    X(vkFreeCommandBuffers)                                                                \
    X(vkBeginCommandBuffer)                                                                \
    X(vkEndCommandBuffer)                                                                  \
    X(vkResetCommandBuffer)                                                                \
    X(vkCmdBindPipeline)                                                                   \
    X(vkCmdPushConstants)                                                                  \
    X(vkCmdDispatch)                                                                       \
    X(vkCmdPipelineBarrier)                                                                \
    X(vkCmdCopyBuffer)                                                                     \
    X(vkCmdExecuteCommands)                                                                \
    X(vkQueueSubmit)                                                                       \
    X(vkCreateFence)                                                                       \
    X(vkDestroyFence)                                                                      \
    X(vkWaitForFences)                                                                     \
    X(vkResetFences)                                                                       \
    X(vkGetFenceStatus)                                                                    \
    X(vkCreateShaderModule)                                                                \
    X(vkDestroyShaderModule)                                                               \
    X(vkCreatePipelineLayout)                                                              \
    X(vkDestroyPipelineLayout)                                                             \
    X(vkCreateComputePipelines)                                                            \
    X(vkDestroyPipeline)                                                                   \
    X(vkCreatePipelineCache)                                                               \
    X(vkDestroyPipelineCache)                                                              \
    X(vkGetPipelineCacheData)

typedef struct dvk_fns {
    PFN_vkGetInstanceProcAddr vkGetInstanceProcAddr;
#define DVK_DECLARE(name) PFN_##name name;
    DVK_GLOBAL_FNS(DVK_DECLARE)
    DVK_INSTANCE_FNS(DVK_DECLARE)
    DVK_DEVICE_FNS(DVK_DECLARE)
    PFN_vkCreateDebugUtilsMessengerEXT vkCreateDebugUtilsMessengerEXT;
    PFN_vkDestroyDebugUtilsMessengerEXT vkDestroyDebugUtilsMessengerEXT;
#undef DVK_DECLARE
} dvk_fns;

/* One Vulkan instance per process, made on first use (vk_loader.c). */
typedef struct dvk_instance {
    void *lib;
    dvk_fns fn;
    VkInstance instance;
    VkDebugUtilsMessengerEXT messenger;
    uint32_t n_phys;
    VkPhysicalDevice phys[16];
} dvk_instance;

/* Validation messages seen by the debug messenger (errors and warnings), process-wide. */
extern _Atomic int dvk_validation_messages;

df_status dvk_instance_get(dvk_instance **out);
void dvk_instance_shutdown(void);

/* ---- devices ---------------------------------------------------------------------------- */

typedef struct dvk_device_info {
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    char driver[VK_MAX_DRIVER_NAME_SIZE + VK_MAX_DRIVER_INFO_SIZE + 2];
    VkPhysicalDeviceType type;
    uint32_t vendor, device_id, driver_version, api_version;
    uint8_t uuid[VK_UUID_SIZE];
    uint64_t device_local_bytes, host_visible_bytes;
    uint32_t subgroup_size;
    uint32_t max_shared_bytes;
    uint64_t max_alloc_bytes, max_storage_range;
    bool fp16, int8, int64, bda, storage16, storage8, coopmat;
    bool usable;                /* has what this backend requires */
    char missing[96];           /* what it lacks, when not usable */
} dvk_device_info;

/* Physical devices in the order this backend offers them: discrete GPUs, integrated GPUs,
 * then the others (virtual, CPU implementations such as lavapipe); *out_n of them.
 * `order` maps our index to the instance's. */
df_status dvk_devices_list(int *out_n, int order[16]);
df_status dvk_device_info_get(int index, dvk_device_info *out);
/* Whether a device of this type is offered without being named: GPUs always, CPU
 * implementations only with DIFFUSE_VULKAN_ALLOW_CPU=1. */
bool dvk_device_offered(const dvk_device_info *info);

/* ---- memory ----------------------------------------------------------------------------- */

/* A pool block: one VkBuffer bound to one VkDeviceMemory, sub-allocated. */
typedef struct dvk_block {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceAddress addr;
    uint64_t size;
    void *mapped;         /* host pointer when the memory is host-visible */
    struct dvk_span *free_list;
    bool dedicated;       /* one allocation that took the whole block */
} dvk_block;

/* A device allocation: [addr, addr + size) inside `block`. */
typedef struct dvk_alloc {
    dvk_block *block;
    uint64_t offset, size;
    VkDeviceAddress addr;
} dvk_alloc;

/* A host-visible arena that one batch of commands uses for its parameter blocks and
 * upload staging; reset when the batch has run. */
typedef struct dvk_arena {
    VkBuffer buffer;
    VkDeviceMemory memory;
    VkDeviceAddress addr;
    char *mapped;
    uint64_t size, used;
} dvk_arena;

#define DVK_BATCHES 3

typedef struct dvk_batch {
    VkCommandBuffer cmd;
    VkFence fence;
    dvk_arena arena;
    bool recording, in_flight;
    int dispatches;
    uint64_t end_pos; /* the device position after its last command */
} dvk_batch;

/* A pipeline made on first use: a shader with its specialisation constants. */
typedef struct dvk_pipeline {
    int shader;
    int n_spec;
    uint32_t spec[8];
    VkPipeline pipeline;
} dvk_pipeline;

/* Address ranges the current batch wrote or read since its last barrier. */
#define DVK_HAZARD_MAX 64
#define DVK_MAX_SHADERS 16
typedef struct dvk_range {
    uint64_t lo, hi;
} dvk_range;

/* vk_coopmat.c: whether the bf16 matrix products run on mm_coop.comp, and why (or why not). */
typedef struct dvk_coopmat {
    bool use;
    bool asked; /* DIFFUSE_VULKAN_COOPMAT=1 */
    char why[160];
} dvk_coopmat;
/* A recorded graph (compiled mode's replay): a secondary command buffer that the batches
 * execute, with the parameter blocks of its dispatches in arenas of its own. */
typedef struct dvk_graph {
    VkCommandBuffer cmd;
    dvk_arena *arenas;
    int n_arenas;
    int64_t dispatches;
    uint64_t positions; /* commands it holds (positions a launch advances by) */
    const char *broken; /* why it cannot be replayed, or NULL */
} dvk_graph;

typedef struct dvk_stats {
    int64_t dispatches, submits, barriers, bytes_up, bytes_down, pipelines_created;
    int64_t dispatches_recorded, graph_launches;
    double pipeline_ms; /* spent making pipelines (from the cache or compiling) */
} dvk_stats;

typedef struct dvk_device {
    dvk_instance *inst;
    const dvk_fns *fn;
    dvk_device_info info;
    VkPhysicalDevice phys;
    VkDevice dev;
    VkQueue queue;
    uint32_t queue_family;
    uint32_t mem_device, mem_host; /* memory type indices */
    bool device_mem_host_visible;
    VkCommandPool cmd_pool;
    VkPipelineLayout layout;
    VkPipelineCache cache;
    char cache_path[512];
    size_t cache_loaded_bytes;
    dvk_pipeline *pipelines;
    int n_pipelines, cap_pipelines;
    /* the pool */
    dvk_block **blocks;
    int n_blocks, cap_blocks;
    uint64_t block_bytes;
    uint64_t live_bytes;
    /* command batches: `cur` records, the others may be in flight */
    dvk_batch batch[DVK_BATCHES];
    int cur;
    /* hazards of the recording batch */
    dvk_range written[DVK_HAZARD_MAX], read[DVK_HAZARD_MAX];
    int n_written, n_read;
    /* readback staging */
    dvk_arena readback;
    /* Faults shaders report (a gather id outside its table): host-visible, checked when a
     * batch has run (dvk_fault: kind 0 = none). */
    dvk_arena fault;
    dvk_stats stats;
    dvk_coopmat coopmat; /* vk_coopmat.c: chosen when the device is created */
    df_status failed; /* the first failure of a submitted batch (sticky until reset) */
    uint64_t pos, done_pos; /* commands recorded; position every finished batch reached */
    dvk_graph *capture;     /* the graph being recorded, or NULL */
    uint64_t capture_pos;   /* the position where it began */
    bool profile;           /* DIFFUSE_VULKAN_PROFILE=1 */
    double profile_ms[DVK_MAX_SHADERS];
    int64_t profile_calls[DVK_MAX_SHADERS];
} dvk_device;

df_status dvk_device_open(int index, dvk_device **out);
void dvk_device_close(dvk_device *d);

df_status dvk_alloc_make(dvk_device *d, uint64_t bytes, dvk_alloc **out);
void dvk_alloc_free(dvk_device *d, dvk_alloc *a);
/* Frees every block (at close). */
void dvk_pool_release(dvk_device *d);

/* Host <-> device copies. An upload is recorded into the current batch (staged through
 * its arena) and returns at once; a download submits what is pending and waits. */
df_status dvk_upload(dvk_device *d, VkDeviceAddress dst, const void *src, uint64_t bytes);
df_status dvk_download(dvk_device *d, void *dst, VkDeviceAddress src, uint64_t bytes);
/* Device-to-device copy in stream order. */
df_status dvk_copy(dvk_device *d, VkDeviceAddress dst, VkDeviceAddress src, uint64_t bytes);
/* The block and offset holding a device address (for copy commands). */
df_status dvk_locate(dvk_device *d, VkDeviceAddress addr, uint64_t bytes, dvk_block **block,
                     uint64_t *offset);

df_status dvk_arena_init(dvk_device *d, dvk_arena *a, uint64_t bytes);
void dvk_arena_deinit(dvk_device *d, dvk_arena *a);

/* ---- execution -------------------------------------------------------------------------- */

/* The recording command buffer (begun on demand). */
df_status dvk_batch_cmd(dvk_device *d, VkCommandBuffer *out);
/* `bytes` of host-visible memory in the recording batch's arena, 256-byte aligned;
 * submits and moves to the next batch when the arena is full. */
df_status dvk_batch_host(dvk_device *d, uint64_t bytes, void **host, VkDeviceAddress *addr);
/* What a shader reported in d->fault (kind, then three numbers), read once a batch ran. */
typedef struct dvk_fault {
    uint32_t kind, pad;
    int64_t a, b, c;
} dvk_fault;
enum { DVK_FAULT_NONE, DVK_FAULT_GATHER_ID };

/* Submits the recording batch (if it has commands). */
df_status dvk_flush(dvk_device *d);
/* Submits and waits for every batch; returns the first failure. */
df_status dvk_finish(dvk_device *d);
/* Positions: the count of commands recorded so far, and whether the device has finished
 * every command before `at` (with wait, waits until it has). Asking submits the recording
 * batch when `at` lies in it, so a position asked about is always reached eventually. */
uint64_t dvk_position(dvk_device *d);
bool dvk_reached(dvk_device *d, uint64_t at, bool wait);
/* Whether the device has finished every command before `at`, submitting nothing (what the
 * host callbacks ask after each launch: a batch is then submitted when it is full or the
 * host waits, not at every launch). */
bool dvk_done(dvk_device *d, uint64_t at);

/* Declares that the next command reads / writes these ranges; records a barrier first if
 * it depends on an earlier command of the batch. */
void dvk_hazard(dvk_device *d, const dvk_range *reads, int n_reads, const dvk_range *writes,
                int n_writes);

/* Records a dispatch of `shader` with specialisation constants over groups (x, y, z); the
 * parameter block `params` (bytes) is copied into the batch's arena. */
df_status dvk_dispatch(dvk_device *d, int shader, const uint32_t *spec, int n_spec,
                       const void *params, size_t bytes, uint32_t gx, uint32_t gy, uint32_t gz);

/* Recorded graphs. Between dvk_capture_begin and dvk_capture_end the commands go into the
 * graph's secondary command buffer; capture_end executes it once in the recording batch
 * (the work runs as if queued directly) and returns it; dvk_graph_launch executes it again.
 * A host copy or a wait inside a capture ends the recording there (the work still runs in
 * order) and capture_end then returns DF_E_UNSUPPORTED. */
df_status dvk_capture_begin(dvk_device *d);
df_status dvk_capture_end(dvk_device *d, dvk_graph **out);
df_status dvk_graph_launch(dvk_device *d, dvk_graph *g);
void dvk_graph_free(dvk_device *d, dvk_graph *g);
/* Ends a capture under way (if any) at this point, marking it not replayable for `why`. */
df_status dvk_capture_break(dvk_device *d, const char *why);

/* With DIFFUSE_VULKAN_PROFILE=1 every dispatch is submitted alone and timed; this prints
 * the time per shader to stderr (at close). */
void dvk_profile_print(dvk_device *d);

/* The pipeline cache file (under DIFFUSE_CACHE_DIR or ~/.cache/diffuse). */
df_status dvk_pipeline_cache_open(dvk_device *d);
void dvk_pipeline_cache_save(dvk_device *d);

/* ---- collectives (vk_collective.c) ------------------------------------------------------ */

/* A communicator over the host's (df_host_comm, copied). */
df_status dvk_comm_create(const df_host_comm *host, df_dev_comm **out);
void dvk_comm_free(df_dev_comm *c);
/* Runs `op` on [addr, ...) in stream order, staged through the readback arena and the
 * host communicator; every rank calls it for the same collectives in the same order. */
df_status dvk_collective(dvk_device *d, const df_dev_comm *c, const df_coll *op,
                         VkDeviceAddress addr);

/* ---- cooperative matrices (vk_coopmat.c) ------------------------------------------------- */

/* Room for VkPhysicalDeviceCooperativeMatrixFeaturesKHR, which older headers lack. */
typedef struct dvk_coopmat_features {
    uint64_t words[6];
} dvk_coopmat_features;

/* The host's log (the plugin sets it); NULL: stderr. */
extern void (*dvk_logf)(int level, const char *fmt, ...);

/* Decides, by feature query, whether the device's matrix products use cooperative
 * matrices; logs the choice. Called before the device is created. */
void dvk_coopmat_select(const dvk_instance *inst, VkPhysicalDevice pd,
                        const dvk_device_info *info, dvk_coopmat *out);
/* Where c->use: chains the feature into f12's pNext (in storage) and appends the extension
 * to exts (room for one more). */
void dvk_coopmat_chain(const dvk_coopmat *c, dvk_coopmat_features *storage,
                       VkPhysicalDeviceVulkan12Features *f12, const char **exts,
                       uint32_t *n_exts);

/* ---- shaders (generated at build time: vk_shaders.c) ------------------------------------ */

typedef struct dvk_shader_blob {
    const char *name;
    const unsigned char *code; /* SPIR-V words, 4-byte aligned */
    const size_t *bytes;
} dvk_shader_blob;

extern const dvk_shader_blob dvk_shaders[];
extern const int dvk_shader_count;
int dvk_shader_find(const char *name);

/* ---- ops (vk_ops.c, vk_ops_mm.c) --------------------------------------------------------- */

/* The device address of element 0 of a view (its storage's address plus its offset). */
typedef VkDeviceAddress (*dvk_addr_fn)(void *user, const df_view *v);

typedef struct dvk_env {
    dvk_device *d;
    dvk_addr_fn addr;
    void *user;
} dvk_env;

/* Records one node's kernel; DF_E_UNSUPPORTED names what this backend cannot run. */
df_status dvk_run_node(const dvk_env *e, const df_node *n);
df_status dvk_run_fused(const dvk_env *e, const df_fused *f);
/* Whether dvk_run_node can run this op at all. */
bool dvk_op_supported(df_op op);

#define DVK_MAX_DIMS 6 /* the device ABI's, = DF_MAX_DIMS */

static inline int64_t dvk_esize(df_dtype t)
{
    return t == DF_DTYPE_F32 || t == DF_DTYPE_I32   ? 4
           : t == DF_DTYPE_F64 || t == DF_DTYPE_I64 ? 8
           : t == DF_DTYPE_U8 || t == DF_DTYPE_I8   ? 1
                                                    : 2;
}

/* Views, whatever the ABI spells them: whether an optional input is present, and the same
 * view moved by `elems` elements. */
static inline bool dvk_has(const df_view *v)
{
    return v->buf != NULL;
}

static inline df_view dvk_view_shift(df_view v, int64_t elems)
{
    v.offset += (uint64_t)(elems * dvk_esize(v.dtype));
    return v;
}

/* Names and conversions of the plugin's own (it links nothing of the library). */
const char *dvk_op_name(df_op op);
const char *dvk_dtype_name(df_dtype t);
float dvk_bf16_f32(uint16_t h);
float dvk_f16_f32(uint16_t h);

/* Helpers the op files share. */
df_status dvk_run_copy_views(const dvk_env *e, const df_view *dst, const df_view *src);
dvk_range dvk_view_range(const dvk_env *e, const df_view *v);

#endif
