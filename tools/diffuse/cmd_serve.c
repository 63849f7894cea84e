/*
 * diffuse serve: the image server's command line.
 *
 * Parses the options, starts the HTTP listener and the worker (which loads the default
 * model while the listener already answers, with 503 for generation requests), and runs
 * until SIGINT or SIGTERM. The library's warnings go through its log hook to stderr with
 * the server's prefix, one line at a time.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

static void help(FILE *f)
{
    fprintf(
        f,
        "usage: diffuse serve -m MODEL_DIR [-m MODEL_DIR ...] [options]\n"
        "\n"
        "An image server with AUTOMATIC1111's API (/sdapi/v1/...), OpenAI's images API\n"
        "(/v1/images/generations), a jobs API with progress events (/v1/jobs) and a page at /.\n"
        "Models stay loaded; one image is made at a time, the rest wait in a queue.\n"
        "\n"
        "  -m, --model DIR        a diffusers pipeline folder, named by its folder name; the "
        "first\n"
        "                         is the default (more: -m DIR again, at most 16)\n"
        "      --host ADDR        address to listen on (default 127.0.0.1: this machine only)\n"
        "      --port N           port (default 7860; 0: any free port, printed at start)\n"
        "      --api-key KEY      require 'Authorization: Bearer KEY' on every route but the page\n"
        "      --queue N          waiting places; more requests get 429 (default 16)\n"
        "      --outputs DIR      where response_format \"url\" images are written and served\n"
        "                         from (/outputs/NAME.png); without it, url is refused\n"
        "      --cors ORIGIN      send Access-Control-Allow-Origin: ORIGIN (default: none)\n"
        "      --max-pixels N     largest width x height accepted (default 4194304 = 2048x2048)\n"
        "      --preview-every N  a live preview (a VAE decode of the denoised estimate) every\n"
        "                         N steps, for /sdapi/v1/progress and the events (default 2;\n"
        "                         0: none)\n"
        "      --int8-attention on|off  with --dtype int8: int8 or f32 attention scores for\n"
        "                         every run (default: DIFFUSE_INT8_ATTENTION, else on)\n"
        "      --int8-keep embedders|none  with --dtype int8: keep the transformer's embedders\n"
        "                         and outputs in precision, or quantize them too (default:\n"
        "                         DIFFUSE_INT8_KEEP, else embedders)\n"
        "      --int8-group N|k   with --dtype int8: k values per weight scale, 32 to 256 in\n"
        "                         steps of 4, or k for one per row (default:\n"
        "                         DIFFUSE_INT8_GROUP, else 128)\n"
        "      --int8-path NAME   with --dtype int8: the int8 kernel, portable|avx2|avx-vnni|\n"
        "                         avx512-vnni|onednn (default: DIFFUSE_INT8_PATH, else the\n"
        "                         best this CPU has)\n"
        "      --dtype f32|bf16|int8|auto, --mode eager|fuse|compile, --offload none|model|\n"
        "      sequential, --device NAME, --threads N   as for diffuse generate\n"
        "  -h, --help             this text\n"
        "\n"
        "example:\n"
        "  diffuse serve -m ./FLUX.1-schnell -m ./FLUX.2-klein-4B --port 7860\n");
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

static void log_line(int level, const char *line, void *user)
{
    (void)user;
    if (level > 1)
        return;
    pthread_mutex_lock(&log_mu);
    fprintf(stderr, "diffuse serve: %s\n", line);
    pthread_mutex_unlock(&log_mu);
}

static int parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "diffuse serve: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo,
                hi, s);
        return 2;
    }
    *out = v;
    return 0;
}

int cmd_serve(int argc, char **argv)
{
    enum {
        O_HOST = 256,
        O_PORT,
        O_KEY,
        O_QUEUE,
        O_OUTPUTS,
        O_CORS,
        O_MAXPIX,
        O_PREVIEW,
        O_INT8_ATTN,
        O_INT8_KEEP,
        O_INT8_GROUP,
        O_INT8_PATH,
        O_DTYPE,
        O_MODE,
        O_OFFLOAD,
        O_DEVICE,
        O_THREADS
    };
    static const struct option longopts[] = {{"model", required_argument, 0, 'm'},
                                             {"host", required_argument, 0, O_HOST},
                                             {"port", required_argument, 0, O_PORT},
                                             {"api-key", required_argument, 0, O_KEY},
                                             {"queue", required_argument, 0, O_QUEUE},
                                             {"outputs", required_argument, 0, O_OUTPUTS},
                                             {"cors", required_argument, 0, O_CORS},
                                             {"max-pixels", required_argument, 0, O_MAXPIX},
                                             {"preview-every", required_argument, 0, O_PREVIEW},
                                             {"int8-attention", required_argument, 0, O_INT8_ATTN},
                                             {"int8-keep", required_argument, 0, O_INT8_KEEP},
                                             {"int8-group", required_argument, 0, O_INT8_GROUP},
                                             {"int8-path", required_argument, 0, O_INT8_PATH},
                                             {"dtype", required_argument, 0, O_DTYPE},
                                             {"mode", required_argument, 0, O_MODE},
                                             {"offload", required_argument, 0, O_OFFLOAD},
                                             {"device", required_argument, 0, O_DEVICE},
                                             {"threads", required_argument, 0, O_THREADS},
                                             {"help", no_argument, 0, 'h'},
                                             {0, 0, 0, 0}};
    serve_options o = {
        .load = {.auto_dtype = true}, .queue = 16, .max_pixels = 2048 * 2048, .preview_every = 2};
    const char *host = "127.0.0.1", *key = NULL, *cors = NULL;
    long port = 7860, v;
    int rc;
    optind = 1;
    for (int c; (c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1;) {
        switch (c) {
        case 'm':
            if (o.n_models == 16) {
                fprintf(stderr, "diffuse serve: at most 16 models (-m)\n");
                return 2;
            }
            o.model_dirs[o.n_models++] = optarg;
            break;
        case O_HOST:
            host = optarg;
            break;
        case O_PORT:
            if ((rc = parse_long("--port", optarg, 0, 65535, &port)))
                return rc;
            break;
        case O_KEY:
            key = optarg;
            break;
        case O_QUEUE:
            if ((rc = parse_long("--queue", optarg, 1, 100000, &v)))
                return rc;
            o.queue = (int)v;
            break;
        case O_OUTPUTS:
            o.outputs = optarg;
            break;
        case O_CORS:
            cors = optarg;
            break;
        case O_MAXPIX:
            if ((rc = parse_long("--max-pixels", optarg, 256, 1L << 28, &v)))
                return rc;
            o.max_pixels = v;
            break;
        case O_INT8_ATTN:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "diffuse serve: --int8-attention expects on or off, not '%s'\n",
                        optarg);
                return 2;
            }
            o.int8_attention = strcmp(optarg, "on") ? -1 : 1;
            break;
        case O_INT8_KEEP:
            if (strcmp(optarg, "embedders") && strcmp(optarg, "none")) {
                fprintf(stderr, "diffuse serve: --int8-keep expects embedders or none, not '%s'\n",
                        optarg);
                return 2;
            }
            o.load.int8_keep = strcmp(optarg, "none") ? 1 : -1;
            break;
        case O_INT8_GROUP: /* the library checks the steps of 4 */
            if (!strcmp(optarg, "k"))
                o.load.int8_group = -1;
            else if ((rc = parse_long("--int8-group", optarg, 32, 256, &v)))
                return rc;
            else
                o.load.int8_group = (int)v;
            break;
        case O_INT8_PATH:
            o.load.int8_path = optarg; /* checked by the CPU device as each model loads */
            break;
        case O_PREVIEW:
            if ((rc = parse_long("--preview-every", optarg, 0, 10000, &v)))
                return rc;
            o.preview_every = (int)v;
            break;
        case O_THREADS:
            if ((rc = parse_long("--threads", optarg, 1, 1024, &v)))
                return rc;
            o.load.threads = (int)v;
            break;
        case O_DTYPE:
            if (!strcmp(optarg, "auto")) {
                o.load.auto_dtype = true;
            } else if (!strcmp(optarg, "f32") || !strcmp(optarg, "bf16") ||
                       !strcmp(optarg, "int8")) {
                o.load.auto_dtype = false;
                df_dtype_parse(optarg, &o.load.dtype);
            } else {
                fprintf(stderr, "diffuse serve: --dtype is f32, bf16, int8 or auto, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_MODE:
            if (!strcmp(optarg, "eager")) {
                o.load.mode = DF_DEFER_NEVER;
            } else if (!strcmp(optarg, "fuse")) {
                o.load.mode = DF_DEFER_AND_FUSE;
            } else if (!strcmp(optarg, "compile")) {
                o.load.mode = DF_DEFER_AND_FUSE;
                o.load.compile = true;
            } else {
                fprintf(stderr, "diffuse serve: --mode is eager, fuse or compile, not '%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_OFFLOAD:
            if (!strcmp(optarg, "none")) {
                o.load.offload = DF_OFFLOAD_NONE;
            } else if (!strcmp(optarg, "model")) {
                o.load.offload = DF_OFFLOAD_MODEL;
            } else if (!strcmp(optarg, "sequential")) {
                o.load.offload = DF_OFFLOAD_SEQUENTIAL;
            } else {
                fprintf(stderr,
                        "diffuse serve: --offload is none, model or sequential, not "
                        "'%s'\n",
                        optarg);
                return 2;
            }
            break;
        case O_DEVICE:
            o.load.device = optarg;
            break;
        case 'h':
            help(stdout);
            return 0;
        default:
            help(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "diffuse serve: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o.n_models == 0) {
        fprintf(stderr, "diffuse serve: need at least one -m MODEL_DIR (see --help)\n");
        return 2;
    }
    for (int i = 0; i < o.n_models; i++) {
        char index[4200];
        struct stat st;
        snprintf(index, sizeof index, "%s/model_index.json", o.model_dirs[i]);
        if (stat(index, &st) != 0) {
            fprintf(stderr, "diffuse serve: %s: %s\n", index, strerror(errno));
            return 1;
        }
    }
    struct stat st;
    if (o.outputs &&
        (stat(o.outputs, &st) != 0 || !S_ISDIR(st.st_mode) || access(o.outputs, W_OK) != 0)) {
        fprintf(stderr, "diffuse serve: --outputs '%s' is not a writable folder\n", o.outputs);
        return 1;
    }

    df_set_log_fn(log_line, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* Blocked in every thread started from here on; the main thread waits for them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

    int bound = 0;
    if (serve_jobs_start(&o) != 0)
        return 1;
    if (serve_http_start(host, (int)port, key, cors, o.max_pixels, &bound) != 0) {
        serve_jobs_stop();
        return 1;
    }
    printf("diffuse serve: listening on http://%s:%d/ (models:", host, bound);
    for (int i = 0; i < o.n_models; i++)
        printf(" %s", o.model_dirs[i]);
    printf(")\n");
    fflush(stdout);
    int sig;
    sigwait(&stop_signals, &sig);
    fprintf(stderr, "diffuse serve: stopping\n");
    serve_jobs_stop();
    serve_http_stop();
    df_set_log_fn(NULL, NULL);
    return 0;
}
