/*
 * The Vulkan loader, opened by hand: dlopen("libvulkan.so.1"), then every entry point
 * through vkGetInstanceProcAddr. One instance per process, made on first use and kept
 * until dvk_instance_shutdown.
 *
 * Validation: the Khronos loader enables the layers named in VK_INSTANCE_LAYERS by itself;
 * DIFFUSE_VULKAN_VALIDATION=1 asks for VK_LAYER_KHRONOS_validation explicitly. Whenever the
 * instance offers VK_EXT_debug_utils, a messenger prints every warning and error the
 * layers report and counts them in dvk_validation_messages, which the tests require to
 * stay 0.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

_Atomic int dvk_validation_messages;

static dvk_instance g_inst;
static bool g_ready;
static df_status g_failed; /* a failed first attempt is remembered (with a new message) */
static char g_why[256];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static VKAPI_ATTR VkBool32 VKAPI_CALL on_message(VkDebugUtilsMessageSeverityFlagBitsEXT sev,
                                                 VkDebugUtilsMessageTypeFlagsEXT type,
                                                 const VkDebugUtilsMessengerCallbackDataEXT *m,
                                                 void *user)
{
    if (sev & (VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
               VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)) {
        atomic_fetch_add(&dvk_validation_messages, 1);
        fprintf(stderr, "vulkan validation: %s\n", m && m->pMessage ? m->pMessage : "?");
    }
    return VK_FALSE;
}

static bool has_layer(const dvk_fns *fn, const char *name)
{
    uint32_t n = 0;
    if (fn->vkEnumerateInstanceLayerProperties(&n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkLayerProperties *p = calloc(n, sizeof *p);
    bool found = false;
    if (p && fn->vkEnumerateInstanceLayerProperties(&n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(p[i].layerName, name) == 0;
    free(p);
    return found;
}

static bool has_instance_ext(const dvk_fns *fn, const char *name)
{
    uint32_t n = 0;
    if (fn->vkEnumerateInstanceExtensionProperties(NULL, &n, NULL) != VK_SUCCESS || n == 0)
        return false;
    VkExtensionProperties *p = calloc(n, sizeof *p);
    bool found = false;
    if (p && fn->vkEnumerateInstanceExtensionProperties(NULL, &n, p) == VK_SUCCESS)
        for (uint32_t i = 0; i < n && !found; i++)
            found = strcmp(p[i].extensionName, name) == 0;
    free(p);
    return found;
}

static df_status open_loader(dvk_instance *in)
{
    const char *names[] = {"libvulkan.so.1", "libvulkan.so"};
    for (size_t i = 0; i < sizeof names / sizeof *names && !in->lib; i++)
        in->lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!in->lib)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: the Vulkan loader libvulkan.so.1 is not installed (%s); "
                         "install libvulkan1 and a driver (mesa-vulkan-drivers, or the "
                         "GPU vendor's)",
                         dlerror());
    in->fn.vkGetInstanceProcAddr =
        (PFN_vkGetInstanceProcAddr)dlsym(in->lib, "vkGetInstanceProcAddr");
    if (!in->fn.vkGetInstanceProcAddr)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: libvulkan.so.1 has no vkGetInstanceProcAddr");
#define DVK_LOAD_GLOBAL(fn_)                                                              \
    in->fn.fn_ = (PFN_##fn_)in->fn.vkGetInstanceProcAddr(NULL, #fn_);                   \
    if (!in->fn.fn_)                                                                      \
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: the loader lacks %s (Vulkan 1.1+)", #fn_);
    DVK_GLOBAL_FNS(DVK_LOAD_GLOBAL)
#undef DVK_LOAD_GLOBAL
    return DF_OK;
}

static df_status make_instance(dvk_instance *in)
{
    DF_TRY(open_loader(in));
    dvk_fns *fn = &in->fn;
    uint32_t version = 0;
    if (fn->vkEnumerateInstanceVersion(&version) != VK_SUCCESS ||
        version < VK_API_VERSION_1_2)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: the loader offers Vulkan %u.%u; diffuse needs 1.2 or newer",
                         VK_API_VERSION_MAJOR(version), VK_API_VERSION_MINOR(version));
    const char *layers[1];
    uint32_t n_layers = 0;
    const char *want = getenv("DIFFUSE_VULKAN_VALIDATION");
    if (want && strcmp(want, "1") == 0) {
        if (!has_layer(fn, "VK_LAYER_KHRONOS_validation"))
            return df_errorf(DF_E_UNSUPPORTED,
                             "vulkan: DIFFUSE_VULKAN_VALIDATION=1 but the layer "
                             "VK_LAYER_KHRONOS_validation is not installed "
                             "(vulkan-validationlayers)");
        layers[n_layers++] = "VK_LAYER_KHRONOS_validation";
    }
    const char *exts[2];
    uint32_t n_exts = 0;
    bool debug = has_instance_ext(fn, VK_EXT_DEBUG_UTILS_EXTENSION_NAME);
    if (debug)
        exts[n_exts++] = VK_EXT_DEBUG_UTILS_EXTENSION_NAME;
    VkApplicationInfo app = {
        .sType = VK_STRUCTURE_TYPE_APPLICATION_INFO,
        .pApplicationName = "diffuse",
        .pEngineName = "diffuse",
        .apiVersion = VK_API_VERSION_1_2,
    };
    VkInstanceCreateInfo ci = {
        .sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO,
        .pApplicationInfo = &app,
        .enabledLayerCount = n_layers,
        .ppEnabledLayerNames = layers,
        .enabledExtensionCount = n_exts,
        .ppEnabledExtensionNames = exts,
    };
    VkResult r = fn->vkCreateInstance(&ci, NULL, &in->instance);
    if (r == VK_ERROR_INCOMPATIBLE_DRIVER)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: the loader found no Vulkan 1.2 driver; install one "
                         "(mesa-vulkan-drivers, or the GPU vendor's)");
    if (r != VK_SUCCESS)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: vkCreateInstance failed (VkResult %d)", r);
#define DVK_LOAD_INSTANCE(fn_)                                                            \
    fn->fn_ = (PFN_##fn_)fn->vkGetInstanceProcAddr(in->instance, #fn_);                 \
    if (!fn->fn_)                                                                         \
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: the instance lacks %s", #fn_);
    DVK_INSTANCE_FNS(DVK_LOAD_INSTANCE)
#undef DVK_LOAD_INSTANCE
    if (debug) {
        fn->vkCreateDebugUtilsMessengerEXT = (PFN_vkCreateDebugUtilsMessengerEXT)
            fn->vkGetInstanceProcAddr(in->instance, "vkCreateDebugUtilsMessengerEXT");
        fn->vkDestroyDebugUtilsMessengerEXT = (PFN_vkDestroyDebugUtilsMessengerEXT)
            fn->vkGetInstanceProcAddr(in->instance, "vkDestroyDebugUtilsMessengerEXT");
        VkDebugUtilsMessengerCreateInfoEXT mi = {
            .sType = VK_STRUCTURE_TYPE_DEBUG_UTILS_MESSENGER_CREATE_INFO_EXT,
            .messageSeverity = VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT |
                               VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            .messageType = VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT |
                           VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            .pfnUserCallback = on_message,
        };
        if (fn->vkCreateDebugUtilsMessengerEXT &&
            fn->vkCreateDebugUtilsMessengerEXT(in->instance, &mi, NULL, &in->messenger) !=
                VK_SUCCESS)
            in->messenger = VK_NULL_HANDLE;
    }
    in->n_phys = 16;
    r = fn->vkEnumeratePhysicalDevices(in->instance, &in->n_phys, in->phys);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        return df_errorf(DF_E_UNSUPPORTED, "vulkan: vkEnumeratePhysicalDevices failed (%d)", r);
    if (in->n_phys == 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "vulkan: the loader found no Vulkan driver (no physical device); "
                         "install a driver (mesa-vulkan-drivers, or the GPU vendor's)");
    return DF_OK;
}

static void destroy(dvk_instance *in)
{
    if (in->instance) {
        if (in->messenger && in->fn.vkDestroyDebugUtilsMessengerEXT)
            in->fn.vkDestroyDebugUtilsMessengerEXT(in->instance, in->messenger, NULL);
        in->fn.vkDestroyInstance(in->instance, NULL);
    }
    if (in->lib)
        dlclose(in->lib);
    memset(in, 0, sizeof *in);
}

df_status dvk_instance_get(dvk_instance **out)
{
    *out = NULL;
    pthread_mutex_lock(&g_lock);
    df_status s = DF_OK;
    if (!g_ready && g_failed == DF_OK) {
        s = make_instance(&g_inst);
        if (s != DF_OK) {
            snprintf(g_why, sizeof g_why, "%s", df_error_message());
            destroy(&g_inst);
            g_failed = s;
        } else {
            g_ready = true;
        }
    } else if (!g_ready) {
        s = df_errorf(g_failed, "%s", g_why);
    }
    pthread_mutex_unlock(&g_lock);
    if (s == DF_OK)
        *out = &g_inst;
    return s;
}

void dvk_instance_shutdown(void)
{
    pthread_mutex_lock(&g_lock);
    if (g_ready)
        destroy(&g_inst);
    g_ready = false;
    g_failed = DF_OK;
    pthread_mutex_unlock(&g_lock);
}
