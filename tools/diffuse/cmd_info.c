/*
 * `diffuse info FILE.png...`: the size of each image and the generation parameters stored
 * in it (the "parameters" text chunk that `diffuse generate` and the web UIs write).
 *
 * The parameters are shown field by field; --raw prints the stored text as it is instead.
 * Text from the file is printed with control characters escaped (\n, \xNN), so a hostile
 * file can neither break the one-field-per-line layout nor drive the terminal. A file that
 * cannot be read prints one "error:" line and makes the exit status 1; a usage error
 * exits 2.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse info [--raw] FILE.png [FILE.png ...]\n"
               "  shows each image's size and the generation parameters stored in it\n"
               "  --raw      print the stored parameters text as it is\n"
               "  -h, --help this text\n");
}

/* Prints s with control characters escaped; `keep_newlines` lets '\n' through. */
static void put_clean(const char *s, bool keep_newlines)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\n' && keep_newlines)
            putchar('\n');
        else if (*p == '\n')
            fputs("\\n", stdout);
        else if (*p < 0x20 || *p == 0x7f)
            printf("\\x%02x", *p);
        else
            putchar(*p);
    }
}

static void field(const char *name, const char *value)
{
    if (!value)
        return;
    printf("  %-16s ", name);
    put_clean(value, false);
    putchar('\n');
}

static void show_parameters(const char *text)
{
    df_image_params p;
    if (df_image_parse_parameters(text, &p) != DF_OK) { /* only out of memory */
        put_clean(text, true);
        putchar('\n');
        return;
    }
    field("prompt:", p.prompt);
    field("negative prompt:", p.negative_prompt);
    if (p.steps > 0)
        printf("  %-16s %d\n", "steps:", p.steps);
    field("sampler:", p.sampler);
    if (p.sampler) /* a parameters line was found: these were written too */
        printf("  %-16s %g\n  %-16s %" PRIu64 "\n", "cfg scale:", p.cfg_scale, "seed:", p.seed);
    if (p.width > 0 && p.height > 0)
        printf("  %-16s %dx%d\n", "size:", p.width, p.height);
    field("model:", p.model);
    if (p.denoising_strength > 0)
        printf("  %-16s %g\n", "strength:", p.denoising_strength);
    field("init image:", p.init_image);
    field("init image hash:", p.init_image_hash);
    field("mask image:", p.mask_image);
    field("mask image hash:", p.mask_image_hash);
    if (p.mask_padding > 0)
        printf("  %-16s %d\n", "mask padding:", p.mask_padding);
    df_image_params_deinit(&p);
}

static int show(const char *path, bool raw)
{
    df_image *img;
    char *text;
    if (df_image_load_png(path, &img, &text) != DF_OK) {
        fputs("error: ", stderr);
        fputs(df_error_message(), stderr);
        fputc('\n', stderr);
        return 1;
    }
    put_clean(path, false);
    printf(": %dx%d RGB\n", img->width, img->height);
    if (!text) {
        printf("  (no generation parameters)\n");
    } else if (raw) {
        put_clean(text, true);
        putchar('\n');
    } else {
        show_parameters(text);
    }
    df_image_text_free(text);
    df_image_free(img);
    return 0;
}

int cmd_info(int argc, char **argv)
{
    bool raw = false;
    int first = 1;
    for (; first < argc && argv[first][0] == '-' && argv[first][1]; first++) {
        if (!strcmp(argv[first], "--raw")) {
            raw = true;
        } else if (!strcmp(argv[first], "-h") || !strcmp(argv[first], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[first], "--")) {
            first++;
            break;
        } else {
            fprintf(stderr, "diffuse info: unknown option '%s'\n", argv[first]);
            usage(stderr);
            return 2;
        }
    }
    if (first >= argc) {
        usage(stderr);
        return 2;
    }
    int status = 0;
    for (int i = first; i < argc; i++) {
        if (show(argv[i], raw) != 0)
            status = 1;
        if (i + 1 < argc)
            putchar('\n');
    }
    return status;
}
