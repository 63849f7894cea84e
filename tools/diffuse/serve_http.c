/*
 * diffuse serve: HTTP, through libmicrohttpd.
 *
 * One thread per connection (MHD_USE_THREAD_PER_CONNECTION): a handler that waits for its
 * image simply blocks on the jobs' condition variable, and while it waits it watches its
 * own socket, so a client that goes away cancels its job. Bodies are collected up to
 * MAX_BODY (a larger one is read to its end and answered 413).
 *
 * Routes, each a row of `routes` below: the AUTOMATIC1111 API under /sdapi/v1/, OpenAI's
 * images API under /v1/, the jobs API (POST /v1/jobs, GET and DELETE /v1/jobs/{id}, the
 * Server-Sent Events stream /v1/jobs/{id}/events), generated files under /outputs/ and the
 * page at /. Every error is a JSON body
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

#include "serve.h"

#define MAX_BODY (1u << 20)

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
} request_ctx;

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

static enum MHD_Result send_json(struct MHD_Connection *c, int status, serve_buf *b)
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

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *param,
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

static enum MHD_Result send_serve_error(struct MHD_Connection *c, const serve_error *e)
{
    return send_error(c, e->status, e->param, e->message);
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
static void wait_finished(struct MHD_Connection *c, serve_job *j)
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

static void put_image_data(serve_buf *b, const serve_job *j, const char *host, bool url)
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

static void put_job(serve_buf *b, const serve_job *j, int position)
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
static int position_of(const serve_job *j)
{
    if (j->state != JOB_QUEUED)
        return 0;
    int older = 0;
    for (const serve_job *k = j->next; k; k = k->next)
        older += k->state == JOB_QUEUED;
    return older + 1;
}

/* ---- AUTOMATIC1111 ----------------------------------------------------------------- */

static enum MHD_Result a1111_txt2img(struct MHD_Connection *c, request_ctx *rq)
{
    serve_request req;
    serve_error err;
    if (serve_parse_a1111(rq->body.data, rq->body.len, &C.limits, &req, &err))
        return send_serve_error(c, &err);
    int batch = req.images;
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return send_serve_error(c, &err);
    }
    wait_finished(c, j);
    serve_lock();
    enum MHD_Result ok;
    /* Interrupted (/sdapi/v1/interrupt) answers with what was made, as A1111 does. */
    if (j->state == JOB_DONE || (j->state == JOB_CANCELLED && j->interrupted)) {
        serve_buf b = {0}, info = {0};
        serve_buf_puts(&b, "{\"images\": [");
        for (int i = 0; i < j->n_images; i++) {
            serve_buf_puts(&b, i ? ", \"" : "\"");
            serve_buf_base64(&b, j->images[i].png, j->images[i].png_len);
            serve_buf_puts(&b, "\"");
        }
        serve_buf_puts(&b, "], \"parameters\": {\"prompt\": ");
        serve_buf_json_str(&b, j->req.prompt);
        serve_buf_puts(&b, ", \"negative_prompt\": ");
        serve_buf_json_str(&b, j->req.negative_prompt);
        serve_buf_printf(&b,
                         ", \"steps\": %d, \"cfg_scale\": %g, \"width\": %d, \"height\": %d, "
                         "\"seed\": %llu, \"batch_size\": %d, \"n_iter\": 1, "
                         "\"sampler_name\": \"Euler\"}, \"info\": ",
                         j->steps_used, j->guidance_used, j->width, j->height,
                         (unsigned long long)j->req.seed, batch);
        serve_buf_puts(&info, "{\"prompt\": ");
        serve_buf_json_str(&info, j->req.prompt);
        serve_buf_puts(&info, ", \"all_prompts\": [");
        for (int i = 0; i < j->n_images; i++) {
            serve_buf_puts(&info, i ? ", " : "");
            serve_buf_json_str(&info, j->req.prompt);
        }
        serve_buf_puts(&info, "], \"negative_prompt\": ");
        serve_buf_json_str(&info, j->req.negative_prompt);
        serve_buf_printf(&info, ", \"seed\": %llu, \"all_seeds\": [",
                         (unsigned long long)j->req.seed);
        for (int i = 0; i < j->n_images; i++)
            serve_buf_printf(&info, "%s%llu", i ? ", " : "", (unsigned long long)j->images[i].seed);
        serve_buf_printf(&info,
                         "], \"subseed\": -1, \"width\": %d, \"height\": %d, "
                         "\"sampler_name\": \"Euler\", \"cfg_scale\": %g, \"steps\": %d, "
                         "\"batch_size\": %d, \"sd_model_name\": ",
                         j->width, j->height, j->guidance_used, j->steps_used, batch);
        serve_buf_json_str(&info, j->model);
        serve_buf_printf(&info, ", \"interrupted\": %s}", j->interrupted ? "true" : "false");
        serve_buf_json_str(&b, info.data);
        serve_buf_puts(&b, "}");
        serve_buf_free(&info);
        serve_unlock();
        ok = send_json(c, 200, &b);
    } else {
        char msg[sizeof j->error];
        int status = j->error_status ? j->error_status : 500;
        snprintf(msg, sizeof msg, "%s", j->error);
        serve_unlock();
        ok = send_error(c, status, NULL, msg);
    }
    serve_job_release(j);
    return ok;
}

static enum MHD_Result a1111_models(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "[");
    serve_lock();
    for (int i = 0; i < serve_model_count(); i++) {
        serve_buf_puts(&b, i ? ", {\"title\": " : "{\"title\": ");
        serve_buf_json_str(&b, serve_model_name(i));
        serve_buf_puts(&b, ", \"model_name\": ");
        serve_buf_json_str(&b, serve_model_name(i));
        serve_buf_puts(&b, ", \"hash\": null, \"sha256\": null, \"filename\": ");
        serve_buf_json_str(&b, serve_model_dir(i));
        serve_buf_puts(&b, ", \"config\": null}");
    }
    serve_unlock();
    serve_buf_puts(&b, "]");
    return send_json(c, 200, &b);
}

static enum MHD_Result a1111_options_get(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_lock();
    serve_buf_puts(&b, "{\"sd_model_checkpoint\": ");
    serve_buf_json_str(&b, serve_model_name(serve_model_default()));
    serve_unlock();
    serve_buf_puts(&b, ", \"samples_format\": \"png\", \"CLIP_stop_at_last_layers\": 1}");
    return send_json(c, 200, &b);
}

/* Only sd_model_checkpoint means something here; other options are accepted and ignored,
 * as clients set many at once. */
static enum MHD_Result a1111_options_post(struct MHD_Connection *c, request_ctx *rq)
{
    df_json *root = NULL;
    if (df_json_parse_string(rq->body.data ? rq->body.data : "", rq->body.len, "options", &root) !=
        DF_OK)
        return send_error(c, 400, NULL, df_error_message());
    enum MHD_Result ok;
    const char *name = NULL;
    if (df_json_type_of(root) != DF_JSON_OBJECT) {
        ok = send_error(c, 400, NULL, "the body must be a JSON object");
    } else if (df_json_get_string_or(root, "sd_model_checkpoint", NULL, &name) != DF_OK) {
        ok = send_error(c, 400, "sd_model_checkpoint", df_error_message());
    } else {
        serve_lock();
        int m = name ? serve_model_find(name) : serve_model_default();
        char names[512], msg[768];
        serve_model_list_text(names, sizeof names);
        if (m >= 0)
            serve_model_set_default(m);
        serve_unlock();
        if (m < 0) {
            snprintf(msg, sizeof msg,
                     "sd_model_checkpoint: unknown model '%.200s'; available: %.400s", name, names);
            ok = send_error(c, 400, "sd_model_checkpoint", msg);
        } else {
            serve_buf b = {0};
            serve_buf_puts(&b, "null");
            ok = send_json(c, 200, &b);
        }
    }
    df_json_free(root);
    return ok;
}

static enum MHD_Result a1111_samplers(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "[{\"name\": \"Euler\", \"aliases\": [\"k_euler\", \"flow_match_euler\"], "
                       "\"options\": {}}]");
    return send_json(c, 200, &b);
}

static enum MHD_Result a1111_schedulers(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "[{\"name\": \"automatic\", \"label\": \"Automatic\", \"aliases\": null, "
                       "\"default_rho\": -1, \"need_inner_model\": false}, "
                       "{\"name\": \"flow_match_euler\", \"label\": \"Flow match Euler\", "
                       "\"aliases\": null, \"default_rho\": -1, \"need_inner_model\": false}]");
    return send_json(c, 200, &b);
}

static enum MHD_Result a1111_progress(struct MHD_Connection *c)
{
    serve_buf b = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    serve_job *j = serve_job_current();
    serve_lock();
    int queued = serve_queue_length();
    double progress = 0, eta = 0;
    int step = 0, steps = 0, job_no = 0, count = queued;
    bool skipped = false, interrupted = false;
    char stamp[32] = "0";
    if (j) {
        count += j->req.images;
        job_no = j->image_index;
        step = j->step;
        steps = j->steps;
        skipped = j->skip;
        interrupted = j->cancel;
        double per_image = steps ? (double)step / steps : 0;
        progress = (j->image_index + per_image) / j->req.images;
        double elapsed = (double)ts.tv_sec + ts.tv_nsec * 1e-9 - j->started;
        eta = progress > 0 ? elapsed / progress - elapsed : 0;
        time_t t = (time_t)j->started;
        struct tm tmv;
        gmtime_r(&t, &tmv);
        strftime(stamp, sizeof stamp, "%Y%m%d%H%M%S", &tmv);
    }
    serve_buf_printf(&b,
                     "{\"progress\": %.4f, \"eta_relative\": %.3f, \"state\": "
                     "{\"skipped\": %s, \"interrupted\": %s, \"job\": \"%s\", "
                     "\"job_count\": %d, \"job_timestamp\": \"%s\", \"job_no\": %d, "
                     "\"sampling_step\": %d, \"sampling_steps\": %d}, "
                     "\"current_image\": null, \"textinfo\": ",
                     progress, eta, skipped ? "true" : "false", interrupted ? "true" : "false",
                     j ? j->id : "", count, stamp, job_no, step, steps);
    serve_buf_json_str(&b, serve_model_loading() ? "loading a model" : j ? "running" : "idle");
    serve_buf_puts(&b, "}");
    serve_unlock();
    serve_job_release(j);
    return send_json(c, 200, &b);
}

/* /sdapi/v1/interrupt and /sdapi/v1/skip act on the running job. */
static enum MHD_Result a1111_stop(struct MHD_Connection *c, bool skip)
{
    serve_job *j = serve_job_current();
    if (j) {
        serve_lock();
        if (skip) {
            j->skip = true;
        } else {
            j->interrupted = true;
            j->cancel = true;
        }
        serve_unlock();
        serve_job_release(j);
    }
    serve_buf b = {0};
    serve_buf_puts(&b, "null");
    return send_json(c, 200, &b);
}

/* ---- OpenAI and jobs --------------------------------------------------------------- */

static enum MHD_Result openai_generate(struct MHD_Connection *c, request_ctx *rq)
{
    serve_request req;
    serve_error err;
    if (serve_parse_openai(rq->body.data, rq->body.len, &C.limits, &req, &err))
        return send_serve_error(c, &err);
    serve_lock();
    bool no_outputs = req.want_url && !serve_outputs_dir();
    serve_unlock();
    if (no_outputs) {
        serve_request_deinit(&req);
        return send_error(c, 400, "response_format",
                          "response_format \"url\" needs the server "
                          "started with --outputs DIR");
    }
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return send_serve_error(c, &err);
    }
    wait_finished(c, j);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    serve_lock();
    enum MHD_Result ok;
    if (j->state == JOB_DONE) {
        serve_buf b = {0};
        serve_buf_printf(&b, "{\"created\": %lld, \"data\": ", (long long)j->created);
        put_image_data(&b, j, host, j->req.want_url);
        serve_buf_puts(&b, "}");
        serve_unlock();
        ok = send_json(c, 200, &b);
    } else {
        char msg[sizeof j->error];
        int status = j->error_status ? j->error_status : 500;
        snprintf(msg, sizeof msg, "%s", j->error);
        serve_unlock();
        ok = send_error(c, status, NULL, msg);
    }
    serve_job_release(j);
    return ok;
}

static enum MHD_Result openai_models(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "{\"object\": \"list\", \"data\": [");
    serve_lock();
    for (int i = 0; i < serve_model_count(); i++) {
        serve_buf_puts(&b, i ? ", {\"id\": " : "{\"id\": ");
        serve_buf_json_str(&b, serve_model_name(i));
        serve_buf_puts(&b, ", \"object\": \"model\", \"created\": 0, \"owned_by\": \"diffuse\"}");
    }
    serve_unlock();
    serve_buf_puts(&b, "]}");
    return send_json(c, 200, &b);
}

static enum MHD_Result jobs_post(struct MHD_Connection *c, request_ctx *rq)
{
    serve_request req;
    serve_error err;
    if (serve_parse_openai(rq->body.data, rq->body.len, &C.limits, &req, &err))
        return send_serve_error(c, &err);
    req.want_url = false; /* images come back in the job */
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return send_serve_error(c, &err);
    }
    serve_buf b = {0};
    serve_lock();
    put_job(&b, j, position_of(j));
    serve_unlock();
    serve_job_release(j);
    return send_json(c, 202, &b);
}

static enum MHD_Result job_get(struct MHD_Connection *c, serve_job *j)
{
    serve_buf b = {0};
    serve_lock();
    put_job(&b, j, position_of(j));
    if (j->state == JOB_DONE) {
        b.len--; /* reopen the object */
        serve_buf_puts(&b, ", \"data\": ");
        put_image_data(&b, j, NULL, false);
        serve_buf_puts(&b, "}");
    }
    serve_unlock();
    return send_json(c, 200, &b);
}

static enum MHD_Result job_delete(struct MHD_Connection *c, serve_job *j)
{
    serve_job_cancel(j);
    serve_buf b = {0};
    serve_lock();
    put_job(&b, j, position_of(j));
    serve_unlock();
    return send_json(c, 200, &b);
}

/* The events stream: one "event: NAME\ndata: JSON\n\n" per change, "state" first, then
 * "step"s, and "done" (with the images) or "error" last. A comment every 10 s keeps
 * proxies from closing an idle stream. */
typedef struct event_stream {
    serve_job *job;
    unsigned seen;
    bool started, finished;
    serve_buf pending;
    size_t sent;
} event_stream;

static void next_event(event_stream *es)
{
    serve_job *j = es->job;
    serve_buf *b = &es->pending;
    serve_lock();
    if (es->started) {
        for (int waited = 0; j->version == es->seen && waited < 40; waited++)
            serve_wait(0.25);
    }
    if (es->started && j->version == es->seen) {
        serve_buf_puts(b, ": waiting\n\n");
    } else if (j->state == JOB_DONE) {
        serve_buf_printf(b,
                         "event: done\ndata: {\"id\": \"%s\", \"width\": %d, \"height\": %d, "
                         "\"steps\": %d, \"guidance\": %g, \"model\": ",
                         j->id, j->width, j->height, j->steps_used, j->guidance_used);
        serve_buf_json_str(b, j->model);
        serve_buf_puts(b, ", \"data\": ");
        put_image_data(b, j, NULL, false);
        serve_buf_puts(b, "}\n\n");
        es->finished = true;
    } else if (j->state >= JOB_FAILED) {
        serve_buf_printf(b,
                         "event: error\ndata: {\"id\": \"%s\", \"state\": \"%s\", "
                         "\"message\": ",
                         j->id, serve_job_state_name(j->state));
        serve_buf_json_str(b, j->error);
        serve_buf_puts(b, "}\n\n");
        es->finished = true;
    } else if (!es->started || j->state == JOB_QUEUED) {
        serve_buf_puts(b, "event: state\ndata: ");
        put_job(b, j, position_of(j));
        serve_buf_puts(b, "\n\n");
    } else {
        serve_buf_printf(b,
                         "event: step\ndata: {\"id\": \"%s\", \"step\": %d, \"steps\": %d, "
                         "\"image\": %d, \"images\": %d}\n\n",
                         j->id, j->step, j->steps, j->image_index, j->req.images);
    }
    es->seen = j->version;
    es->started = true;
    serve_unlock();
}

static ssize_t events_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    event_stream *es = cls;
    if (es->sent == es->pending.len) {
        if (es->finished)
            return MHD_CONTENT_READER_END_OF_STREAM;
        es->pending.len = 0;
        es->sent = 0;
        next_event(es);
        if (es->pending.failed)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = es->pending.len - es->sent;
    if (n > max)
        n = max;
    memcpy(buf, es->pending.data + es->sent, n);
    es->sent += n;
    return (ssize_t)n;
}

static void events_free(void *cls)
{
    event_stream *es = cls;
    serve_job_release(es->job);
    serve_buf_free(&es->pending);
    free(es);
}

static enum MHD_Result job_events(struct MHD_Connection *c, serve_job *j)
{
    event_stream *es = calloc(1, sizeof *es);
    if (!es)
        return send_error(c, 500, NULL, "out of memory");
    es->job = j;
    j = NULL; /* the stream holds the reference now */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024,
                                                               events_read, es, events_free);
    if (!r) {
        events_free(es);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (C.cors)
        MHD_add_response_header(r, "Access-Control-Allow-Origin", C.cors);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* /v1/jobs/{id}[/events] */
static enum MHD_Result jobs_item(struct MHD_Connection *c, const char *method, const char *rest)
{
    char id[33];
    size_t n = strspn(rest, "0123456789abcdef");
    bool events = n == 32 && !strcmp(rest + 32, "/events");
    if (n != 32 || (rest[32] && !events))
        return send_error(c, 404, NULL, "no such job");
    memcpy(id, rest, 32);
    id[32] = '\0';
    const char *allowed = events ? "GET" : "GET, DELETE";
    if (strcmp(method, "GET") && (events || strcmp(method, "DELETE"))) {
        char msg[128];
        snprintf(msg, sizeof msg, "%.16s is not allowed here; use %s", method, allowed);
        return send_error(c, 405, NULL, msg);
    }
    serve_job *j = serve_job_find(id);
    if (!j)
        return send_error(c, 404, NULL, "no such job (finished jobs are kept for a while only)");
    if (events)
        return job_events(c, j);
    enum MHD_Result ok = !strcmp(method, "GET") ? job_get(c, j) : job_delete(c, j);
    serve_job_release(j);
    return ok;
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
        return send_error(c, 404, NULL, "no such file");
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0)
            close(fd);
        return send_error(c, 404, NULL, "no such file");
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
    R_SD_MODELS,
    R_OPTIONS,
    R_SAMPLERS,
    R_SCHEDULERS,
    R_PROGRESS,
    R_INTERRUPT,
    R_SKIP,
    R_SCRIPTS,
    R_GENERATIONS,
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
    {"/sdapi/v1/sd-models", "GET", R_SD_MODELS},
    {"/sdapi/v1/options", "GET, POST", R_OPTIONS},
    {"/sdapi/v1/samplers", "GET", R_SAMPLERS},
    {"/sdapi/v1/schedulers", "GET", R_SCHEDULERS},
    {"/sdapi/v1/progress", "GET", R_PROGRESS},
    {"/sdapi/v1/interrupt", "POST", R_INTERRUPT},
    {"/sdapi/v1/skip", "POST", R_SKIP},
    {"/sdapi/v1/scripts", "GET", R_SCRIPTS},
    {"/v1/images/generations", "POST", R_GENERATIONS},
    {"/v1/models", "GET", R_MODELS},
    {"/v1/jobs", "POST", R_JOBS},
};

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
            return send_error(c, 405, NULL, "the page answers GET only");
        return send_page(c);
    }
    if (!strncmp(url, "/outputs/", 9))
        return send_output(c, url + 9);
    if (!authorized(c))
        return send_error(c, 401, NULL,
                          "this server needs an API key: send "
                          "'Authorization: Bearer KEY'");
    if (rq->too_large) {
        char msg[128];
        snprintf(msg, sizeof msg, "the body is larger than %u bytes", MAX_BODY);
        return send_error(c, 413, NULL, msg);
    }
    if (!strncmp(url, "/v1/jobs/", 9))
        return jobs_item(c, method, url + 9);
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
            return a1111_txt2img(c, rq);
        case R_SD_MODELS:
            return a1111_models(c);
        case R_OPTIONS:
            return post ? a1111_options_post(c, rq) : a1111_options_get(c);
        case R_SAMPLERS:
            return a1111_samplers(c);
        case R_SCHEDULERS:
            return a1111_schedulers(c);
        case R_PROGRESS:
            return a1111_progress(c);
        case R_INTERRUPT:
            return a1111_stop(c, false);
        case R_SKIP:
            return a1111_stop(c, true);
        case R_SCRIPTS: { /* clients ask which extensions exist: none */
            serve_buf b = {0};
            serve_buf_puts(&b, "{\"txt2img\": [], \"img2img\": []}");
            return send_json(c, 200, &b);
        }
        case R_GENERATIONS:
            return openai_generate(c, rq);
        case R_MODELS:
            return openai_models(c);
        case R_JOBS:
            return jobs_post(c, rq);
        }
    }
    char msg[300];
    snprintf(msg, sizeof msg, "no route %.200s", url);
    return send_error(c, 404, NULL, msg);
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
        *con_cls = rq;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!rq->too_large && rq->body.len + *upload_data_size <= MAX_BODY)
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
