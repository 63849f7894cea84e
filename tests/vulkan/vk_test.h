/*
 * What the Vulkan backend's test programs (tests/vulkan/test_vk_*.c) share: device 0, the
 * failure count and one printed line per check, the skip when there is no device, and the
 * ending: the device and instance closed, any validation message a failure, the exit status.
 */
#ifndef DF_TESTS_VK_TEST_H
#define DF_TESTS_VK_TEST_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "backend/vulkan/vk_internal.h"
#include "core/status.h"

static dvk_device *g_dev;
static int g_failures;

static inline void check(bool ok, const char *what)
{
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    g_failures += !ok;
}

/* Whether opening device 0 gave `s` != DF_OK: then it says why, and the test exits 77
 * (skipped: no Vulkan loader or device). */
static inline bool vk_test_skipped(df_status s)
{
    if (s == DF_OK)
        return false;
    printf("skipped: no Vulkan device: %s\n", df_error_message());
    return true;
}

/* Closes g_dev and the instance and returns the exit status: 1 if any check failed or the
 * validation layer reported anything. */
static inline int vk_test_finish(void)
{
    dvk_device_close(g_dev);
    dvk_instance_shutdown();
    int msgs = atomic_load(&dvk_validation_messages);
    if (msgs) {
        printf("FAIL %d validation messages\n", msgs);
        g_failures++;
    }
    printf("%d failures\n", g_failures);
    return g_failures ? 1 : 0;
}

#endif
