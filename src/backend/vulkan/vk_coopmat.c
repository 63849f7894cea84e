/*
 * Whether the matrix products use the cooperative-matrix shader (mm_coop.comp), decided once
 * per device by feature query before the device is created, and logged.
 *
 * It is used when all of these hold: the shader was compiled into this build (it needs a
 * compiler that knows GL_KHR_cooperative_matrix); the device has VK_KHR_cooperative_matrix
 * with the cooperativeMatrix feature, for compute shaders; it lists a 16 x 16 x 16 shape
 * with f16 A and B, f32 C and result at subgroup scope; it has shaderFloat16 and the Vulkan
 * memory model (the shader's scopes); its subgroups have at most 64 invocations (a
 * workgroup of 256 then has at least 4, each multiplying at most 4 of the 16 tiles); and
 * DIFFUSE_VULKAN_COOPMAT is not 0. DIFFUSE_VULKAN_COOPMAT=1 asks for it: where it cannot
 * be used the backend still runs the portable shader, and the reason is logged (at level 1,
 * seen without DIFFUSE_VERBOSE), which is what the tests check on a device without it.
 *
 * When it is used, only bf16 products without the convolution gather go to it
 * (vk_ops_mm.c): its f16 tiles hold bf16-rounded operands exactly in f16's range.
 *
 * The Vulkan headers of older SDKs (Debian 12 has 1.3.239) predate the extension, so its
 * types are declared here when the header lacks them (values from the Vulkan registry).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

#ifndef VK_KHR_cooperative_matrix
#define VK_KHR_cooperative_matrix 1
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR                      \
    ((VkStructureType)1000506000)
#define VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR ((VkStructureType)1000506001)
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR                    \
    ((VkStructureType)1000506002)
typedef enum VkComponentTypeKHR {
    VK_COMPONENT_TYPE_FLOAT16_KHR = 0,
    VK_COMPONENT_TYPE_FLOAT32_KHR = 1,
    VK_COMPONENT_TYPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkComponentTypeKHR;
typedef enum VkScopeKHR {
    VK_SCOPE_DEVICE_KHR = 1,
    VK_SCOPE_WORKGROUP_KHR = 2,
    VK_SCOPE_SUBGROUP_KHR = 3,
    VK_SCOPE_QUEUE_FAMILY_KHR = 5,
    VK_SCOPE_MAX_ENUM_KHR = 0x7FFFFFFF
} VkScopeKHR;
typedef struct VkCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void *pNext;
    uint32_t MSize, NSize, KSize;
    VkComponentTypeKHR AType, BType, CType, ResultType;
    VkBool32 saturatingAccumulation;
    VkScopeKHR scope;
} VkCooperativeMatrixPropertiesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixFeaturesKHR {
    VkStructureType sType;
    void *pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
} VkPhysicalDeviceCooperativeMatrixFeaturesKHR;
typedef struct VkPhysicalDeviceCooperativeMatrixPropertiesKHR {
    VkStructureType sType;
    void *pNext;
    VkShaderStageFlags cooperativeMatrixSupportedStages;
} VkPhysicalDeviceCooperativeMatrixPropertiesKHR;
typedef VkResult(VKAPI_PTR *PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)(
    VkPhysicalDevice physicalDevice, uint32_t *pPropertyCount,
    VkCooperativeMatrixPropertiesKHR *pProperties);
#endif

void (*dvk_logf)(int level, const char *fmt, ...);

static void log_line(int level, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (dvk_logf)
        dvk_logf(level, "%s", msg);
    else if (level <= 1 || getenv("DIFFUSE_VERBOSE"))
        fprintf(stderr, "diffuse: %s\n", msg);
}

/* The reason the shader cannot be used, or NULL; why[] holds it. */
static const char *refusal(const dvk_instance *inst, VkPhysicalDevice pd,
                           const dvk_device_info *info, char *why, size_t n)
{
    const dvk_fns *fn = &inst->fn;
    if (dvk_shader_find("mm_coop") < 0)
        return snprintf(why, n, "this build has no cooperative-matrix shader (its compiler "
                        "lacks GL_KHR_cooperative_matrix)"), why;
    if (!info->coopmat)
        return snprintf(why, n, "the device has no VK_KHR_cooperative_matrix"), why;
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR fc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR};
    VkPhysicalDeviceVulkan12Features f12 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, .pNext = &fc};
    VkPhysicalDeviceFeatures2 f2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                    .pNext = &f12};
    fn->vkGetPhysicalDeviceFeatures2(pd, &f2);
    if (!fc.cooperativeMatrix)
        return snprintf(why, n, "the cooperativeMatrix feature is off"), why;
    if (!f12.vulkanMemoryModel || !f12.shaderFloat16)
        return snprintf(why, n, "the device lacks %s", !f12.shaderFloat16 ? "shaderFloat16"
                                                                           : "vulkanMemoryModel"),
               why;
    VkPhysicalDeviceCooperativeMatrixPropertiesKHR cp = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_PROPERTIES_KHR};
    VkPhysicalDeviceProperties2 p2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2,
                                      .pNext = &cp};
    fn->vkGetPhysicalDeviceProperties2(pd, &p2);
    if (!(cp.cooperativeMatrixSupportedStages & VK_SHADER_STAGE_COMPUTE_BIT))
        return snprintf(why, n, "cooperative matrices are not offered to compute shaders"), why;
    if (info->subgroup_size == 0 || info->subgroup_size > 64)
        return snprintf(why, n, "subgroups of %u invocations (the shader needs 1 to 64)",
                        info->subgroup_size), why;
    PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR get =
        (PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR)fn->vkGetInstanceProcAddr(
            inst->instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR");
    uint32_t count = 0;
    if (!get || get(pd, &count, NULL) != VK_SUCCESS || count == 0)
        return snprintf(why, n, "the device lists no cooperative-matrix shapes"), why;
    VkCooperativeMatrixPropertiesKHR *props = calloc(count, sizeof *props);
    if (!props)
        return snprintf(why, n, "out of host memory listing its shapes"), why;
    for (uint32_t i = 0; i < count; i++)
        props[i].sType = VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_KHR;
    bool found = false;
    VkResult r = get(pd, &count, props);
    if (r == VK_SUCCESS || r == VK_INCOMPLETE)
        for (uint32_t i = 0; i < count && !found; i++) {
            const VkCooperativeMatrixPropertiesKHR *q = &props[i];
            found = q->MSize == 16 && q->NSize == 16 && q->KSize == 16 &&
                    q->AType == VK_COMPONENT_TYPE_FLOAT16_KHR &&
                    q->BType == VK_COMPONENT_TYPE_FLOAT16_KHR &&
                    q->CType == VK_COMPONENT_TYPE_FLOAT32_KHR &&
                    q->ResultType == VK_COMPONENT_TYPE_FLOAT32_KHR &&
                    q->scope == VK_SCOPE_SUBGROUP_KHR && !q->saturatingAccumulation;
        }
    free(props);
    if (!found)
        return snprintf(why, n, "none of its %u shapes is 16x16x16 f16 x f16 -> f32 at "
                        "subgroup scope", count), why;
    return NULL;
}

void dvk_coopmat_select(const dvk_instance *inst, VkPhysicalDevice pd,
                        const dvk_device_info *info, dvk_coopmat *out)
{
    memset(out, 0, sizeof *out);
    const char *env = getenv("DIFFUSE_VULKAN_COOPMAT");
    bool off = env && strcmp(env, "0") == 0, asked = env && strcmp(env, "1") == 0;
    out->asked = asked;
    const char *no = off ? (snprintf(out->why, sizeof out->why,
                                     "DIFFUSE_VULKAN_COOPMAT=0"), out->why)
                         : refusal(inst, pd, info, out->why, sizeof out->why);
    out->use = no == NULL;
    if (out->use) {
        snprintf(out->why, sizeof out->why, "16x16x16 f16 x f16 -> f32 at subgroup scope");
        log_line(2, "vulkan: '%s': bf16 matrix products on cooperative matrices (%s)",
                 info->name, out->why);
    } else {
        log_line(asked ? 1 : 2, "vulkan: '%s': matrix products on the portable tiled shader%s: "
                 "%s", info->name, asked ? " although DIFFUSE_VULKAN_COOPMAT=1" : "", out->why);
    }
}

void dvk_coopmat_chain(const dvk_coopmat *c, dvk_coopmat_features *storage,
                       VkPhysicalDeviceVulkan12Features *f12, const char **exts,
                       uint32_t *n_exts)
{
    _Static_assert(sizeof(dvk_coopmat_features) >=
                       sizeof(VkPhysicalDeviceCooperativeMatrixFeaturesKHR),
                   "dvk_coopmat_features holds the feature struct");
    if (!c->use)
        return;
    VkPhysicalDeviceCooperativeMatrixFeaturesKHR *fc = (void *)storage;
    *fc = (VkPhysicalDeviceCooperativeMatrixFeaturesKHR){
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR,
        .pNext = f12->pNext,
        .cooperativeMatrix = VK_TRUE};
    f12->pNext = fc;
    f12->vulkanMemoryModel = VK_TRUE;
    f12->shaderFloat16 = VK_TRUE;
    exts[(*n_exts)++] = "VK_KHR_cooperative_matrix";
}
