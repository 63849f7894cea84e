/*
 * `diffuse config [NAME -o DIR]`: the config sets diffuse ships for released models. Without
 * arguments it lists them; with a name it writes that set as a diffusers folder skeleton
 * (model_index.json and every component's config) into DIR, to which the tokenizer folders
 * and weights can be added.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse config                 list the shipped config sets\n"
               "       diffuse config NAME -o DIR     write set NAME as a diffusers folder "
               "skeleton\n"
               "  a single checkpoint file of a shipped model (-m FILE) uses its set by "
               "itself;\n"
               "  tokenizers are not shipped: give them with --config DIR (FLUX.1: "
               "tokenizer/, tokenizer_2/;\n"
               "  SD3: tokenizer/, tokenizer_2/, tokenizer_3/)\n"
               "  shipped:");
    for (int i = 0; df_shipped_config_name(i); i++)
        fprintf(f, "%s %s", i ? "," : "", df_shipped_config_name(i));
    fprintf(f, "\n");
}

int cmd_config(int argc, char **argv)
{
    const char *name = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "-o") && i + 1 < argc) {
            out = argv[++i];
        } else if (argv[i][0] != '-' && !name) {
            name = argv[i];
        } else {
            usage(stderr);
            return 2;
        }
    }
    if (!name && !out) {
        for (int i = 0; df_shipped_config_name(i); i++)
            printf("%s\n", df_shipped_config_name(i));
        return 0;
    }
    if (!name || !out) {
        usage(stderr);
        return 2;
    }
    if (df_shipped_config_write(name, out) != DF_OK) {
        fprintf(stderr, "diffuse config: %s\n", df_error_message());
        return 1;
    }
    printf("%s: wrote the shipped %s configs; add the tokenizer folders (and any weights the "
           "checkpoint file lacks) to use it as --config %s\n",
           out, name, out);
    return 0;
}
