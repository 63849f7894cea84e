/*
 * diffuse convert FILE --config DIR -o OUT: a single checkpoint file (a ComfyUI all-in-one
 * file, or a transformer / VAE / text encoder file with --transformer etc.) written as the
 * diffusers folder OUT. The file is loaded as `generate -m FILE --config DIR` loads it
 * (in f32, so nothing is rounded), then df_pipeline_save writes what was bound under
 * diffusers' names beside DIR's configs and tokenizers. With -m DIR instead of FILE, the
 * component options alone name the files.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/diffuse.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: diffuse convert FILE --config DIR -o OUT [options]\n"
               "       diffuse convert -m DIR --transformer FILE ... -o OUT\n"
               "\n"
               "Writes the diffusers folder OUT: FILE's components (a single checkpoint, e.g.\n"
               "ComfyUI's all-in-one file) under diffusers' names, the rest and the configs and\n"
               "tokenizers copied from DIR.\n"
               "\n"
               "  -o, --output DIR           the folder to write (created)\n"
               "      --config DIR           the diffusers folder completing FILE\n"
               "  -m, --model DIR            a diffusers folder, with the component options below\n"
               "      --transformer FILE     --vae FILE  --text-encoder FILE\n"
               "      --text-encoder-2 FILE  --text-encoder-3 FILE   as for generate\n"
               "      --text-encoder-3 none  SD3 without T5: OUT's model_index.json names\n"
               "                             text_encoder_3 and tokenizer_3 null\n"
               "      --threads N            threads (default: all cores)\n");
}

int cmd_convert(int argc, char **argv)
{
    enum { O_CONFIG = 256, O_TRANSFORMER, O_VAE, O_TE1, O_TE2, O_TE3, O_THREADS };
    static const struct option longopts[] = {{"output", required_argument, 0, 'o'},
                                             {"model", required_argument, 0, 'm'},
                                             {"config", required_argument, 0, O_CONFIG},
                                             {"transformer", required_argument, 0, O_TRANSFORMER},
                                             {"vae", required_argument, 0, O_VAE},
                                             {"text-encoder", required_argument, 0, O_TE1},
                                             {"text-encoder-2", required_argument, 0, O_TE2},
                                             {"text-encoder-3", required_argument, 0, O_TE3},
                                             {"threads", required_argument, 0, O_THREADS},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    df_load_opts lo = {.dtype = DF_DTYPE_F32};
    const char *out = NULL, *model = NULL;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "o:m:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'o':
            out = optarg;
            break;
        case 'm':
            model = optarg;
            break;
        case O_CONFIG:
            lo.config_dir = optarg;
            break;
        case O_TRANSFORMER:
            lo.transformer_file = optarg;
            break;
        case O_VAE:
            lo.vae_file = optarg;
            break;
        case O_TE1:
            lo.text_encoder_file = optarg;
            break;
        case O_TE2:
            lo.text_encoder_2_file = optarg;
            break;
        case O_TE3:
            if (!strcmp(optarg, "none")) /* SD3 without T5: written as null components */
                lo.no_text_encoder_3 = true;
            else
                lo.text_encoder_3_file = optarg;
            break;
        case O_THREADS:
            lo.threads = atoi(optarg);
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!model && optind < argc)
        model = argv[optind++];
    if (!model || !out || optind < argc) {
        usage(stderr);
        return 2;
    }
    df_pipeline *p;
    if (df_pipeline_load(model, &lo, &p) != DF_OK) {
        fprintf(stderr, "diffuse convert: %s\n", df_error_message());
        return 1;
    }
    df_status s = df_pipeline_save(p, out);
    df_pipeline_free(p);
    if (s != DF_OK) {
        fprintf(stderr, "diffuse convert: %s\n", df_error_message());
        return 1;
    }
    printf("%s\n", out);
    return 0;
}
