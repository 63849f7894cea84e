/*
 * diffuse: the command-line tool. Dispatches to a subcommand.
 */
#include <stdio.h>
#include <string.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", cmd_generate, "text to image from a diffusers model folder"},
    {"inspect", cmd_inspect, "list and validate a safetensors file or model folder"},
    {"info", cmd_info, "show the size and generation parameters of a PNG"},
    {"tokenize", cmd_tokenize, "print the token ids a model's tokenizer gives a text"},
    {"make-tiny", cmd_make_tiny, "write a small random pipeline folder (no download needed)"},
    {"quantize", cmd_quantize, "write a model folder with 8-bit linear weights (int8)"},
    {"convert", cmd_convert, "write a diffusers folder from a single checkpoint file"},
    {"config", cmd_config, "list the shipped model configs, or write one as a folder"},
    {"serve", cmd_serve, "an image server: A1111 and OpenAI APIs, a jobs API and a web page"},
    {"devices", cmd_devices, "list the devices --device can name, with memory and capabilities"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse COMMAND [options]   (diffuse COMMAND --help for details)\n\n"
               "commands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "  %-10s %s\n", "version", "print the version");
    fprintf(f, "\nexample:\n  diffuse generate -m ./FLUX.1-schnell -p \"a fox in the snow\" "
               "-W 1024 -H 1024 --seed 0 -o out.png\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        printf("diffuse %s\n", df_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(cmd, commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "diffuse: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
