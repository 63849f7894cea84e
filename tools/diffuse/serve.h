/*
 * diffuse serve: the parts of the image server and what they share.
 *
 *   serve_request.c  request bodies (AUTOMATIC1111 and OpenAI JSON) to one serve_request,
 *                    base64, and a small JSON writer for the answers; no I/O, fuzzed
 *   serve_jobs.c     the models, the FIFO queue and the worker that runs one job at a time
 *   serve_http.c     libmicrohttpd: routes, authentication, files, the answers' common parts
 *   serve_a1111.c    AUTOMATIC1111's API
 *   serve_openai.c   OpenAI's images API and the jobs API with its events stream
 *   serve_page.c     the web page served at /
 *   cmd_serve.c      the command line
 */
#ifndef DIFFUSE_SERVE_H
#define DIFFUSE_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <diffuse/diffuse.h>

/* ---- requests ---------------------------------------------------------------------- */

#define SERVE_MAX_IMAGES       16 /* per request: batch_size x n_iter, or n */
#define SERVE_MAX_INPUT_IMAGES 8  /* pictures in: img2img's init_images, edits' image[] */

/* One generation request, whichever protocol asked for it. Zero fields: the model's
 * defaults. */
typedef struct serve_request {
    char *prompt;          /* owned */
    char *negative_prompt; /* owned; NULL: none */
    char *model;           /* owned; NULL: the server's default model */
    int width, height;     /* 0: the model's default size */
    int steps;             /* 0: the model's default */
    float guidance;
    bool guidance_set;
    bool seed_random; /* seed -1 */
    uint64_t seed;
    int images;    /* >= 1 */
    bool want_url; /* OpenAI response_format "url" */
    /* Pictures in (A1111 img2img, OpenAI edits), decoded; owned. One: image to image
     * (FLUX.1, SD3) or a reference to edit (FLUX.2); several: FLUX.2's references. */
    df_image *inputs[SERVE_MAX_INPUT_IMAGES];
    int n_inputs;
    df_image *mask;        /* owned; NULL: none. Inpainting: the size of inputs[0] */
    int padding_mask_crop; /* A1111's inpaint_full_res_padding when inpaint_full_res */
    double strength;       /* image to image: denoising strength in (0, 1]; 0: the default */
} serve_request;

/* Limits the parsers enforce. */
typedef struct serve_limits {
    int64_t max_pixels; /* width x height */
} serve_limits;

/* A parse failure: the HTTP status (400), the field at fault and a message naming it. */
typedef struct serve_error {
    int status;
    char param[64];
    char message[512];
} serve_error;

/* POST /sdapi/v1/txt2img. Returns 0, or the HTTP status with *err filled. On failure *out
 * holds nothing to free. */
int serve_parse_a1111(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                      serve_error *err);

/* POST /v1/images/generations and POST /v1/jobs. */
int serve_parse_openai(const char *body, size_t len, const serve_limits *lim, serve_request *out,
                       serve_error *err);

/* POST /sdapi/v1/img2img: the txt2img fields plus init_images (base64 PNG / JPEG, a
 * "data:image/...;base64," prefix allowed), denoising_strength, mask, inpaint_full_res and
 * inpaint_full_res_padding. */
int serve_parse_a1111_img2img(const char *body, size_t len, const serve_limits *lim,
                              serve_request *out, serve_error *err);

void serve_request_deinit(serve_request *r);

/* The sampler and scheduler names the A1111 API accepts (all the pipelines' flow-match Euler
 * scheduler), NULL-terminated. */
extern const char *const serve_samplers[];
extern const char *const serve_schedulers[];

/* ---- text buffers and JSON writing ------------------------------------------------- */

typedef struct serve_buf {
    char *data; /* NUL-terminated; NULL until something is written */
    size_t len, cap;
    bool failed; /* out of memory: later writes do nothing */
} serve_buf;

void serve_buf_put(serve_buf *b, const char *s, size_t n);
void serve_buf_puts(serve_buf *b, const char *s);
void serve_buf_printf(serve_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void serve_buf_json_str(serve_buf *b, const char *s); /* a quoted, escaped JSON string */
void serve_buf_base64(serve_buf *b, const void *data, size_t n);
void serve_buf_free(serve_buf *b);

/* Decodes standard base64 (padding optional, no whitespace). Returns the byte count, or -1
 * for a character outside the alphabet or a length that cannot be base64. out must hold
 * n / 4 * 3 + 3 bytes. */
int64_t serve_base64_decode(const char *s, size_t n, uint8_t *out);

/* A multipart/form-data body, split into its parts (serve_http.c fills it with
 * libmicrohttpd's post processor). */
#define SERVE_MAX_FORM_PARTS 32
typedef struct serve_form_part {
    char name[64];
    bool is_file; /* it came with a filename */
    serve_buf data;
} serve_form_part;
typedef struct serve_form {
    serve_form_part parts[SERVE_MAX_FORM_PARTS];
    int n;
    bool too_many; /* parts beyond SERVE_MAX_FORM_PARTS were dropped */
} serve_form;
void serve_form_free(serve_form *f);

/* POST /v1/images/edits: image (or image[], several for FLUX.2), mask, and the text fields
 * of /v1/images/generations (prompt, n, size, response_format, model, seed, steps,
 * guidance, negative_prompt) plus strength. */
int serve_parse_openai_edit(const serve_form *form, const serve_limits *lim, serve_request *out,
                            serve_error *err);

/* ---- models and jobs --------------------------------------------------------------- */

typedef enum serve_job_state {
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_DONE,
    JOB_FAILED,
    JOB_CANCELLED,
} serve_job_state;

const char *serve_job_state_name(serve_job_state s);

typedef struct serve_image {
    void *png;
    size_t png_len;
    uint64_t seed;
    char url_name[48]; /* "<random>.png" under --outputs when the request wanted a url */
} serve_image;

/* A job. Its fields change under serve_lock(); readers hold the lock and a reference. */
typedef struct serve_job {
    char id[33];
    serve_request req;
    char model[256]; /* the model that runs it (resolved at submit) */
    serve_job_state state;
    int step, steps; /* of the current image */
    int image_index; /* images finished */
    double created, started, finished;
    bool cancel, skip, interrupted;
    unsigned version; /* bumped on every change: the events stream waits for it */
    serve_image images[SERVE_MAX_IMAGES];
    int n_images;
    int width, height, steps_used; /* the resolved parameters of the run */
    float guidance_used;
    /* The latest live preview of the current image (a PNG of the run's denoised estimate,
     * df_gen_params.preview), NULL before the first; preview_version counts them. */
    void *preview_png;
    size_t preview_len;
    int preview_step;
    unsigned preview_version;
    char error[768];
    int error_status; /* HTTP status for the error */
    int refs;
    struct serve_job *next; /* in the list of all jobs, newest first */
} serve_job;

typedef struct serve_options {
    const char *model_dirs[16];
    int n_models;
    df_load_opts load;
    int queue;           /* waiting places */
    const char *outputs; /* NULL: no url responses */
    int64_t max_pixels;
    int preview_every;  /* steps between live previews; 0: none */
    int int8_attention; /* df_gen_params.int8_attention of every run (--int8-attention) */
} serve_options;

/* Starts the worker (which loads the default model first). 0 or -1 with a message on
 * stderr. */
int serve_jobs_start(const serve_options *o);
void serve_jobs_stop(void);

void serve_lock(void);
void serve_unlock(void);
/* Waits (with the lock held) until something changes or `seconds` pass. */
void serve_wait(double seconds);

/* Submits a job that takes ownership of *req (zeroed). Returns 0 with *out (a reference
 * the caller releases), or an HTTP status (400 unknown model, 429 full, 503 loading) with a
 * message in err. */
int serve_job_submit(serve_request *req, serve_job **out, serve_error *err);
serve_job *serve_job_find(const char *id); /* a reference, or NULL; takes the lock itself */
void serve_job_release(serve_job *j);      /* takes the lock itself */
void serve_job_cancel(serve_job *j);       /* takes the lock itself */
/* The running job (a reference), or NULL. */
serve_job *serve_job_current(void);
int serve_queue_length(void); /* with the lock held */

/* Models: names (folder names), the default, which are loaded. With the lock held. */
int serve_model_count(void);
const char *serve_model_name(int i);
const char *serve_model_dir(int i);
int serve_model_default(void);
bool serve_model_loading(void);
int serve_model_find(const char *name); /* -1 when unknown */
void serve_model_set_default(int i);
/* Writes the model names as "'a', 'b'" for messages. */
void serve_model_list_text(char *buf, size_t cap);

const char *serve_outputs_dir(void);

/* ---- HTTP -------------------------------------------------------------------------- */

/* Listens on host:port (port 0: any free port, written to *bound_port). 0, or -1 with a
 * message on stderr. */
int serve_http_start(const char *host, int port, const char *api_key, const char *cors,
                     int64_t max_pixels, int *bound_port);
void serve_http_stop(void);

/* The page at /. */
extern const char serve_page_html[];

/* Fills `out` with 32 random hex characters and a NUL. */
void serve_random_hex(char out[33]);

#endif
