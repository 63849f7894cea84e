/*
 * The backend registry: the built-in CPU backend, plugins found in the plugin folder at
 * the first look-up (unless DIFFUSE_BACKEND_AUTOLOAD=0) or loaded by df_backend_load, and
 * the checks that refuse a plugin built for another ABI or a table without its required
 * entries. Autoloading happens once per process, so tests/backends.cmake runs this
 * program twice: `autoload` (the plugins are there from the start) and `manual`
 * (DIFFUSE_BACKEND_AUTOLOAD=0: nothing is loaded until asked). DF_TEST_NEEDS_ARGS
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <diffuse/runtime.h>

#include "backend/graph.h"
#include "core/status.h"
#include "runtime/runtime.h"

static bool autoload_mode;

static void expect_fill_on(const char *device)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.device = device}, &ctx), DF_OK);
    assert_string_equal(df_ctx_device_name(ctx), device);
    df_tensor *t = df_full(ctx, DF_DTYPE_F32, (int64_t[]){3, 5}, 2, 2.5);
    float got[15];
    assert_int_equal(df_tensor_read(ctx, t, DF_DTYPE_F32, got, sizeof got), DF_OK);
    for (int i = 0; i < 15; i++)
        assert_true(got[i] == 2.5f);
    /* an op the device has no kernel for is refused with a message naming it */
    df_tensor *u = df_scale(ctx, t, 2.0f, 0.0f);
    assert_null(u);
    assert_int_equal(df_ctx_status(ctx), DF_E_UNSUPPORTED);
    df_ctx_free(ctx);
}

static void test_cpu_is_built_in(void **state)
{
    (void)state;
    const df_device_ops *cpu = df_backend_find("cpu");
    assert_non_null(cpu);
    assert_int_equal(cpu->abi_version, DF_DEVICE_ABI_VERSION);
    df_device *dev = NULL;
    assert_int_equal(df_device_open("cpu", "threads=2", &dev), DF_OK);
    assert_true(df_dev_has(dev, DF_CAP_HOST_MEMORY));
    assert_true(df_dev_has(dev, DF_CAP_FUSED));
    assert_true(dev->info.memory_bytes > 0);
    df_device_close(dev);
}

static void test_plugin_loading(void **state)
{
    (void)state;
    if (autoload_mode) {
        assert_non_null(df_backend_find("testdev")); /* there from the first look-up */
    } else {
        assert_null(df_backend_find("testdev"));
        df_ctx *ctx = NULL;
        assert_int_equal(df_ctx_create(&(df_ctx_opts){.device = "testdev"}, &ctx),
                         DF_E_UNSUPPORTED);
        assert_non_null(strstr(df_error_message(), "no backend named 'testdev'"));
        assert_int_equal(df_backend_load("testdev"), DF_OK);
    }
    assert_int_equal(df_backend_load("testdev"), DF_OK); /* already there: nothing to do */
    expect_fill_on("testdev:0");
    expect_fill_on("testdev:1");
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.device = "testdev:2"}, &ctx), DF_E_ARG);
}

static void test_bad_plugins_are_refused(void **state)
{
    (void)state;
    /* built for another ABI: never registered, autoloaded or not */
    assert_null(df_backend_find("badabi"));
    assert_int_equal(df_backend_load("badabi"), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "device ABI"));
    assert_null(df_backend_find("badabi"));
    /* not there at all */
    assert_int_equal(df_backend_load("nosuchdevice"), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "libdiffuse-nosuchdevice.so"));
    assert_int_equal(df_backend_load("../x"), DF_E_ARG);
}

static void test_register_checks_required_entries(void **state)
{
    (void)state;
    df_device_ops t = *df_backend_cpu();
    t.name = "cpu"; /* taken */
    assert_int_equal(df_backend_register(&t), DF_E_ARG);
    t.name = "nolaunch";
    t.launch = NULL;
    assert_int_equal(df_backend_register(&t), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "launch"));
    /* a table from an older header: the entries it does not know read as absent */
    t = *df_backend_cpu();
    t.name = "short";
    t.struct_size = offsetof(df_device_ops, supports);
    assert_int_equal(df_backend_register(&t), DF_OK);
    const df_device_ops *r = df_backend_find("short");
    assert_non_null(r);
    assert_null(r->supports);
    assert_null(r->collective);
    assert_non_null(r->stream_throttle);
}

int main(int argc, char **argv)
{
    if (argc != 2 || (strcmp(argv[1], "autoload") && strcmp(argv[1], "manual")))
        return fprintf(stderr, "usage: test_backends autoload|manual\n"), 2;
    autoload_mode = strcmp(argv[1], "autoload") == 0;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_is_built_in),
        cmocka_unit_test(test_plugin_loading),
        cmocka_unit_test(test_bad_plugins_are_refused),
        cmocka_unit_test(test_register_checks_required_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
