/*
 * diffuse serve: HTTP, through libmicrohttpd.
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a handler that waits for its
 * image simply blocks on the jobs' condition variable, and while it waits it watches its
 * own socket, so a client that goes away cancels its job. Bodies are collected up to
 * MAX_BODY, MAX_UPLOAD on the routes that take pictures (a larger one is read to its end
 * and answered 413). OpenAI's edits come as multipart/form-data, split into parts by
 * libmicrohttpd's post processor.
 *
 * Routes, each a row of `routes` below: the AUTOMATIC1111 API under /sdapi/v1/
 * (serve_a1111.c), OpenAI's images API and the jobs API under /v1/ (serve_openai.c),
 * generated files under /outputs/ and the page at / (here). Every error is a JSON body
 *     {"error": {"message": "...", "type": "...", "param": "..."}, "detail": "..."}
 * (OpenAI's shape; "detail" is what FastAPI, and so A1111, answers).
 *
 * Security defaults: the socket binds 127.0.0.1 unless --host says otherwise; with
 * --api-key every route but the page itself needs "Authorization: Bearer KEY" (or HTTP
 * basic auth with KEY as the password, as A1111's --api-auth clients send, or ?api_key=KEY
 * for the page's event stream, which a browser cannot give headers); no CORS header unless
 * --cors names an origin; /outputs/ serves only the random names the server wrote.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "serve_http.h"

#define MAX_BODY (1u << 20)
#define MAX_UPLOAD (64u << 20) /* the routes that take pictures: img2img, edits */

typedef struct http_config {
    const char *api_key;
    const char *cors;
    serve_limits limits;
} http_config;

static http_config C;
static struct MHD_Daemon *daemon_;

/* Per-connection state: the request body being collected. */
typedef struct request_ctx {
    serve_buf body;
    bool too_large;
    unsigned limit; /* MAX_BODY or MAX_UPLOAD, by route */
} request_ctx;

static unsigned body_limit(const char *url)
{
    return !strcmp(url, "/sdapi/v1/img2img") || !strcmp(url, "/v1/images/edits") ? MAX_UPLOAD
                                                                                 : MAX_BODY;
}

/* ---- answers ----------------------------------------------------------------------- */

static enum MHD_Result send_buf(struct MHD_Connection *c, int status, const char *type,
                                serve_buf *b, const char *extra_header, const char *extra_value)
{
    if (b->failed) {
        serve_buf_free(b);
        serve_buf_puts(b, "{\"detail\": \"out of memory\"}");
        status = 500;
    }
    size_t len = b->len;
    char *data = b->data ? b->data : strdup("");
    memset(b, 0, sizeof *b);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (C.cors)
        MHD_add_response_header(r, "Access-Control-Allow-Origin", C.cors);
    if (extra_header)
        MHD_add_response_header(r, extra_header, extra_value);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

enum MHD_Result serve_send_json(struct MHD_Connection *c, int status, serve_buf *b)
{
    return send_buf(c, status, "application/json", b, NULL, NULL);
}

static const char *error_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 404:
        return "not_found_error";
    case 405:
        return "method_not_allowed";
    case 409:
        return "cancelled";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 503:
        return "service_unavailable";
    default:
        return "server_error";
    }
}

enum MHD_Result serve_send_error(struct MHD_Connection *c, int status, const char *param,
                                 const char *message)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "{\"error\": {\"message\": ");
    serve_buf_json_str(&b, message);
    serve_buf_printf(&b, ", \"type\": \"%s\", \"param\": ", error_type(status));
    if (param && param[0])
        serve_buf_json_str(&b, param);
    else
        serve_buf_puts(&b, "null");
    serve_buf_puts(&b, ", \"code\": null}, \"detail\": ");
    serve_buf_json_str(&b, message);
    serve_buf_puts(&b, "}");
    const char *h = NULL, *v = NULL;
    if (status == 429 || status == 503) {
        h = "Retry-After";
        v = "5";
    } else if (status == 401) {
        h = "WWW-Authenticate";
        v = "Bearer";
    }
    return send_buf(c, status, "application/json", &b, h, v);
}

void serve_add_cors(struct MHD_Response *r)
{
    if (C.cors)
        MHD_add_response_header(r, "Access-Control-Allow-Origin", C.cors);
}

const serve_limits *serve_http_limits(void)
{
    return &C.limits;
}

enum MHD_Result serve_send_serve_error(struct MHD_Connection *c, const serve_error *e)
{
    return serve_send_error(c, e->status, e->param, e->message);
}

/* ---- authentication ---------------------------------------------------------------- */

static bool same(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned diff = (unsigned)(na ^ nb);
    for (size_t i = 0; i < na; i++)
        diff |= (unsigned)(a[i] ^ b[i % (nb ? nb : 1)]);
    return diff == 0 && na == nb;
}

static bool authorized(struct MHD_Connection *c)
{
    if (!C.api_key)
        return true;
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "api_key");
    if (q && same(q, C.api_key))
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h)
        return false;
    if (!strncasecmp(h, "Bearer ", 7))
        return same(h + 7, C.api_key);
    if (!strncasecmp(h, "Basic ", 6)) {
        size_t n = strlen(h + 6);
        if (n > 4096)
            return false;
        uint8_t dec[4096 / 4 * 3 + 4];
        int64_t len = serve_base64_decode(h + 6, n, dec);
        if (len < 0)
            return false;
        dec[len] = '\0';
        const char *colon = memchr(dec, ':', (size_t)len);
        return colon && same(colon + 1, C.api_key);
    }
    return false;
}

/* ---- waiting for a job ------------------------------------------------------------- */

/* True when the client has closed its side (or the socket failed). */
static bool client_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))
        return true;
    char byte;
    return recv(ci->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Blocks until job j has finished; a client that goes away cancels it. */
void serve_wait_finished(struct MHD_Connection *c, serve_job *j)
{
    for (;;) {
        serve_lock();
        if (j->state == JOB_QUEUED || j->state == JOB_RUNNING)
            serve_wait(0.25);
        bool finished = j->state >= JOB_DONE;
        serve_unlock();
        if (finished)
            return;
        if (client_gone(c))
            serve_job_cancel(j);
    }
}

/* ---- shared pieces of answers ------------------------------------------------------ */

void serve_put_image_data(serve_buf *b, const serve_job *j, const char *host, bool url)
{
    serve_buf_puts(b, "[");
    for (int i = 0; i < j->n_images; i++) {
        const serve_image *im = &j->images[i];
        serve_buf_puts(b, i ? ", {" : "{");
        if (url && im->url_name[0]) {
            serve_buf_printf(b, "\"url\": \"http://%s/outputs/%s\"", host ? host : "localhost",
                             im->url_name);
        } else {
            serve_buf_puts(b, "\"b64_json\": \"");
            serve_buf_base64(b, im->png, im->png_len);
            serve_buf_puts(b, "\"");
        }
        serve_buf_puts(b, ", \"revised_prompt\": ");
        serve_buf_json_str(b, j->req.prompt);
        serve_buf_printf(b, ", \"seed\": %llu}", (unsigned long long)im->seed);
    }
    serve_buf_puts(b, "]");
}

void serve_put_job(serve_buf *b, const serve_job *j, int position)
{
    serve_buf_printf(b, "{\"id\": \"%s\", \"state\": \"%s\", \"model\": ", j->id,
                     serve_job_state_name(j->state));
    serve_buf_json_str(b, j->model);
    serve_buf_printf(b,
                     ", \"step\": %d, \"steps\": %d, \"image\": %d, \"images\": %d, "
                     "\"queue_position\": %d, \"created\": %.3f",
                     j->step, j->steps, j->image_index, j->req.images, position, j->created);
    if (j->error[0]) {
        serve_buf_puts(b, ", \"error\": ");
        serve_buf_json_str(b, j->error);
    }
    serve_buf_puts(b, "}");
}

/* The place of a queued job in the queue (1 = next), 0 otherwise. With the lock held. */
int serve_queue_position(const serve_job *j)
{
    if (j->state != JOB_QUEUED)
        return 0;
    int older = 0;
    for (const serve_job *k = j->next; k; k = k->next)
        older += k->state == JOB_QUEUED;
    return older + 1;
}

/* ---- files ------------------------------------------------------------------------- */

static enum MHD_Result send_page(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(serve_page_html), (void *)serve_page_html, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'self' 'unsafe-inline' data:");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* /outputs/<32 hex>.png, nothing else. */
static enum MHD_Result send_output(struct MHD_Connection *c, const char *name)
{
    serve_lock();
    const char *dir = serve_outputs_dir();
    serve_unlock();
    size_t n = strspn(name, "0123456789abcdef");
    if (!dir || n != 32 || strcmp(name + 32, ".png") != 0)
        return serve_send_error(c, 404, NULL, "no such file");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return serve_send_error(c, 404, NULL, "no such file");
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "image/png");
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- routing ----------------------------------------------------------------------- */

typedef enum route_id {
    R_PAGE,
    R_TXT2IMG,
    R_IMG2IMG,
    R_SD_MODELS,
    R_OPTIONS,
    R_SAMPLERS,
    R_SCHEDULERS,
    R_PROGRESS,
    R_INTERRUPT,
    R_SKIP,
    R_SCRIPTS,
    R_GENERATIONS,
    R_EDITS,
    R_MODELS,
    R_JOBS,
} route_id;

static const struct {
    const char *path;
    const char *methods; /* the methods it answers, as the Allow header lists them */
    route_id id;
} routes[] = {
    {"/", "GET", R_PAGE},
    {"/sdapi/v1/txt2img", "POST", R_TXT2IMG},
    {"/sdapi/v1/img2img", "POST", R_IMG2IMG},
    {"/sdapi/v1/sd-models", "GET", R_SD_MODELS},
    {"/sdapi/v1/options", "GET, POST", R_OPTIONS},
    {"/sdapi/v1/samplers", "GET", R_SAMPLERS},
    {"/sdapi/v1/schedulers", "GET", R_SCHEDULERS},
    {"/sdapi/v1/progress", "GET", R_PROGRESS},
    {"/sdapi/v1/interrupt", "POST", R_INTERRUPT},
    {"/sdapi/v1/skip", "POST", R_SKIP},
    {"/sdapi/v1/scripts", "GET", R_SCRIPTS},
    {"/v1/images/generations", "POST", R_GENERATIONS},
    {"/v1/images/edits", "POST", R_EDITS},
    {"/v1/models", "GET", R_MODELS},
    {"/v1/jobs", "POST", R_JOBS},
};

/* multipart/form-data parts, as libmicrohttpd's post processor hands them over: a part
 * starts at offset 0 and goes on in pieces. */
static enum MHD_Result form_part(void *cls, enum MHD_ValueKind kind, const char *key,
                                 const char *filename, const char *content_type,
                                 const char *transfer_encoding, const char *data, uint64_t off,
                                 size_t size)
{
    (void)kind;
    (void)content_type;
    (void)transfer_encoding;
    serve_form *f = cls;
    if (off == 0) {
        if (f->n == SERVE_MAX_FORM_PARTS) {
            f->too_many = true;
            return MHD_NO;
        }
        serve_form_part *p = &f->parts[f->n++];
        snprintf(p->name, sizeof p->name, "%s", key ? key : "");
        p->is_file = filename != NULL;
    }
    if (f->n > 0 && size)
        serve_buf_put(&f->parts[f->n - 1].data, data, size);
    return f->n > 0 && f->parts[f->n - 1].data.failed ? MHD_NO : MHD_YES;
}

/* POST /v1/images/edits: the body split into its parts, then parsed as a request. */
static enum MHD_Result edits(struct MHD_Connection *c, const serve_buf *body)
{
    const char *type = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!type || strncasecmp(type, "multipart/form-data", 19) != 0)
        return serve_send_error(c, 400, NULL,
                                "/v1/images/edits takes multipart/form-data (image, mask, "
                                "prompt, ...)");
    serve_form form = {0};
    struct MHD_PostProcessor *pp = MHD_create_post_processor(c, 64 * 1024, form_part, &form);
    if (!pp)
        return serve_send_error(c, 400, NULL,
                                "the multipart/form-data body has no boundary in its "
                                "Content-Type");
    bool ok = body->len == 0 || MHD_post_process(pp, body->data, body->len) == MHD_YES;
    MHD_destroy_post_processor(pp);
    if (!ok && !form.too_many) {
        serve_form_free(&form);
        return serve_send_error(c, 400, NULL, "the multipart/form-data body is malformed");
    }
    serve_request req;
    serve_error err;
    int rc = serve_parse_openai_edit(&form, serve_http_limits(), &req, &err);
    serve_form_free(&form);
    if (rc)
        return serve_send_serve_error(c, &err);
    return serve_openai_submit(c, &req);
}

static bool method_listed(const char *methods, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = methods; (p = strstr(p, method)); p += n)
        if ((p == methods || p[-1] == ' ') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static enum MHD_Result dispatch(struct MHD_Connection *c, const char *url, const char *method,
                                request_ctx *rq)
{
    if (!strcmp(url, "/") || !strcmp(url, "/index.html")) {
        if (strcmp(method, "GET") && strcmp(method, "HEAD"))
            return serve_send_error(c, 405, NULL, "the page answers GET only");
        return send_page(c);
    }
    if (!strncmp(url, "/outputs/", 9))
        return send_output(c, url + 9);
    if (!authorized(c))
        return serve_send_error(c, 401, NULL,
                                "this server needs an API key: send "
                                "'Authorization: Bearer KEY'");
    if (rq->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than %u bytes", rq->limit);
        return serve_send_error(c, 413, NULL, msg);
    }
    if (!strncmp(url, "/v1/jobs/", 9))
        return serve_jobs_item(c, method, url + 9);
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path) != 0)
            continue;
        if (!method_listed(routes[i].methods, method)) {
            char msg[128];
            snprintf(msg, sizeof msg, "%s is not allowed on %s; use %s", method, url,
                     routes[i].methods);
            serve_buf b = {0};
            serve_buf_puts(&b, "{\"detail\": ");
            serve_buf_json_str(&b, msg);
            serve_buf_puts(&b, ", \"error\": {\"message\": ");
            serve_buf_json_str(&b, msg);
            serve_buf_puts(&b, ", \"type\": \"method_not_allowed\", \"param\": null}}");
            return send_buf(c, 405, "application/json", &b, "Allow", routes[i].methods);
        }
        bool post = !strcmp(method, "POST");
        switch (routes[i].id) {
        case R_PAGE:
            return send_page(c);
        case R_TXT2IMG:
            return serve_a1111_txt2img(c, &rq->body);
        case R_IMG2IMG:
            return serve_a1111_img2img(c, &rq->body);
        case R_SD_MODELS:
            return serve_a1111_models(c);
        case R_OPTIONS:
            return post ? serve_a1111_options_post(c, &rq->body) : serve_a1111_options_get(c);
        case R_SAMPLERS:
            return serve_a1111_samplers(c);
        case R_SCHEDULERS:
            return serve_a1111_schedulers(c);
        case R_PROGRESS:
            return serve_a1111_progress(c);
        case R_INTERRUPT:
            return serve_a1111_stop(c, false);
        case R_SKIP:
            return serve_a1111_stop(c, true);
        case R_SCRIPTS: { /* clients ask which extensions exist: none */
            serve_buf b = {0};
            serve_buf_puts(&b, "{\"txt2img\": [], \"img2img\": []}");
            return serve_send_json(c, 200, &b);
        }
        case R_GENERATIONS:
            return serve_openai_generate(c, &rq->body);
        case R_EDITS:
            return edits(c, &rq->body);
        case R_MODELS:
            return serve_openai_models(c);
        case R_JOBS:
            return serve_jobs_post(c, &rq->body);
        }
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no route %.200s", url);
    return serve_send_error(c, 404, NULL, msg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    (void)cls;
    (void)version;
    request_ctx *rq = *con_cls;
    if (!rq) {
        rq = calloc(1, sizeof *rq);
        if (!rq)
            return MHD_NO;
        rq->limit = body_limit(url);
        *con_cls = rq;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rq->too_large && rq->body.len + *upload_data_size <= rq->limit)
            serve_buf_put(&rq->body, upload_data, *upload_data_size);
        else
            rq->too_large = true;
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (C.cors && !strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Access-Control-Allow-Origin", C.cors);
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        enum MHD_Result ok = MHD_queue_response(c, 204, r);
        MHD_destroy_response(r);
        return ok;
    }
    return dispatch(c, url, method, rq);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)c;
    (void)toe;
    request_ctx *rq = *con_cls;
    if (rq) {
        serve_buf_free(&rq->body);
        free(rq);
        *con_cls = NULL;
    }
}

int serve_http_start(const char *host, int port, const char *api_key, const char *cors,
                     int64_t max_pixels, int *bound_port)
{
    C.api_key = api_key;
    C.cors = cors;
    C.limits.max_pixels = max_pixels;
    struct sockaddr_in6 a6 = {0};
    struct sockaddr_in a4 = {0};
    struct sockaddr *addr;
    unsigned flags =
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
        a4.sin_family = AF_INET;
        a4.sin_port = htons((uint16_t)port);
        addr = (struct sockaddr *)&a4;
    } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
        a6.sin6_family = AF_INET6;
        a6.sin6_port = htons((uint16_t)port);
        addr = (struct sockaddr *)&a6;
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "diffuse serve: --host expects an IPv4 or IPv6 address, not '%s'\n", host);
        return -1;
    }
    daemon_ = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, on_request, NULL,
                               MHD_OPTION_SOCK_ADDR, addr, MHD_OPTION_CONNECTION_LIMIT,
                               (unsigned)256, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
                               MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    if (!daemon_) {
        fprintf(stderr, "diffuse serve: cannot listen on %s:%d: %s\n", host, port, strerror(errno));
        return -1;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
    *bound_port = di ? di->port : port;
    return 0;
}

void serve_http_stop(void)
{
    if (daemon_)
        MHD_stop_daemon(daemon_);
    daemon_ = NULL;
}
