/*
 * `diffuse quantize -m IN -o OUT [--group N|k] [--shard-size BYTES] [--layout NAME]`:
 * writes the model folder IN to OUT with the linear weights of its transformer and T5
 * encoder stored as 8-bit values with their scales, in the int8 kernels' tiles unless
 * --layout says otherwise (df_quantize_model_layout, streaming tensor by tensor;
 * docs/int8.md). OUT loads like any model folder; its int8 weights are read in place.
 * Exit status: 0 on success, 1 on failure, 2 for a usage error.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse quantize -m IN -o OUT [--group N|k] [--shard-size BYTES]\n"
               "                        [--layout tiles32|tiles16|tiles64|rows]\n"
               "  writes the model folder IN to OUT with 8-bit linear weights (transformer, T5)\n"
               "  -m, --model IN   the diffusers model folder to read\n"
               "  -o, --output OUT the folder to write (created)\n"
               "      --group N|k  scale group along k: 32 to 256, or k for the whole k\n"
               "                   (default: DIFFUSE_INT8_GROUP, else 128)\n"
               "      --shard-size BYTES  split each component's weights into files of at\n"
               "                   most this size, with the index (default 2 GiB)\n"
               "      --layout NAME the I8 weights' byte order: tiles32 (default: the int8\n"
               "                   kernels' tiles, read in place), tiles16 or tiles64 (repacked\n"
               "                   at load), rows (row-major, packed on first use)\n"
               "  -h, --help       this text\n");
}

int cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *layout = NULL;
    int64_t group = df_int8_default_group(), shard_bytes = 0;
    static const struct option longs[] = {{"model", required_argument, 0, 'm'},
                                          {"output", required_argument, 0, 'o'},
                                          {"group", required_argument, 0, 'g'},
                                          {"shard-size", required_argument, 0, 'X'},
                                          {"layout", required_argument, 0, 'L'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "m:o:h", longs, NULL)) != -1) {
        switch (c) {
        case 'm':
            in = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 'g': {
            char *end;
            long g = strcmp(optarg, "k") == 0 ? 0 : strtol(optarg, &end, 10);
            if (strcmp(optarg, "k") != 0 && (*end || end == optarg || g < 32 || g > 256 || g % 4)) {
                fprintf(stderr,
                        "diffuse quantize: --group is 32 to 256 (a multiple of 4) or k, "
                        "not '%s'\n",
                        optarg);
                return 2;
            }
            group = g;
            break;
        }
        case 'X': {
            char *end;
            long long v = strtoll(optarg, &end, 10);
            if (*end || end == optarg || v < 1024) {
                fprintf(stderr, "diffuse quantize: --shard-size is a byte count of at least "
                                "1024, not '%s'\n",
                        optarg);
                return 2;
            }
            shard_bytes = v;
            break;
        }
        case 'L':
            layout = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!in || !out || optind != argc) {
        usage(stderr);
        return 2;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    df_status s = df_quantize_model_layout(in, out, group, shard_bytes, layout);
    if (s == DF_E_ARG && layout) {
        fprintf(stderr, "diffuse quantize: %s\n", df_error_message());
        return 2;
    }
    if (s != DF_OK) {
        fprintf(stderr, "diffuse quantize: %s\n", df_error_message());
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("%s: int8 weights (group %s%lld, %s) in %.1f s\n", out, group ? "" : "whole k, ",
           (long long)group, layout ? layout : "tiles32",
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    return 0;
}
