/*
 * diffuse devices: the devices of every backend that answers, with their memory and
 * capabilities, and which one --device auto (the default) picks.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "cli.h"

/* What --dtype auto sees of the device: its matrix product rates, and the pick for a bf16
 * checkpoint. */
static void print_rates(const char *device)
{
    df_ctx *ctx;
    df_matmul_rates r;
    if (df_ctx_create(&(df_ctx_opts){.device = device}, &ctx) != DF_OK) {
        printf("%-10s matmul rates: cannot open the device: %s\n", "", df_error_message());
        return;
    }
    if (df_ctx_matmul_rates(ctx, &r) != DF_OK) {
        printf("%-10s matmul rates: %s\n", "", df_error_message());
    } else {
        printf("%-10s matmul f32 %.0f GFLOP/s, bf16 %.0f GFLOP/s (%s)\n", "", r.f32_gflops,
               r.bf16_gflops, r.how);
        printf("%-10s --dtype auto: %s for bf16 checkpoints, f32 for others\n", "",
               df_dtype_name(df_dtype_auto(&r, DF_DTYPE_BF16, NULL, 0)));
    }
    df_ctx_free(ctx);
}

int cmd_devices(int argc, char **argv)
{
    bool all = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--all") == 0) {
            all = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: diffuse devices [--all]\n\n"
                   "Lists the devices --device NAME[:N] can name, with their memory and\n"
                   "capabilities. --all also lists test devices (the sim backend, whose\n"
                   "memory the host cannot address). Backend plugins libdiffuse-NAME.so\n"
                   "next to the library are loaded first (DIFFUSE_BACKEND_AUTOLOAD=0: not).\n");
            return 0;
        } else {
            fprintf(stderr, "diffuse devices: unknown option '%s' (see --help)\n", argv[i]);
            return 2;
        }
    }
    df_device_desc d[64];
    int n = df_device_list(d, 64, all);
    const char *chosen = df_device_auto();
    for (int i = 0; i < n && i < 64; i++) {
        char caps[512];
        df_device_caps_string(d[i].caps, caps, sizeof caps);
        printf("%-10s %-5s %s%s\n", d[i].device, d[i].kind, d[i].name,
               strcmp(d[i].device, chosen) == 0 ||
                       (strchr(chosen, ':') == NULL &&
                        strncmp(d[i].device, chosen, strlen(chosen)) == 0 &&
                        strcmp(d[i].device + strlen(chosen), ":0") == 0)
                   ? "  (auto)"
                   : "");
        printf("%-10s memory %.1f GiB", "", (double)d[i].memory_bytes / (1u << 30));
        if (d[i].memory_free)
            printf(" (%.1f GiB free)", (double)d[i].memory_free / (1u << 30));
        printf("\n%-10s %s\n", "", caps[0] ? caps : "(no capabilities: ops one by one)");
        print_rates(d[i].device);
    }
    return n > 0 ? 0 : 1;
}
