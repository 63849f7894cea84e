/*
 * diffuse serve: OpenAI's images API (/v1/images/generations, /v1/models) and the jobs API
 * (/v1/jobs), with its Server-Sent Events stream; /v1/images/edits comes here once
 * serve_http.c has split its multipart body and serve_request.c has read it.
 *
 * generations submits one job and waits for it, as txt2img does; a job from POST /v1/jobs
 * runs on its own and is followed with GET /v1/jobs/{id}, its event stream, or cancelled
 * with DELETE. The stream is a libmicrohttpd callback response whose reader blocks until
 * the job changes (its version moves), then writes one event.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_http.h"

enum MHD_Result serve_openai_generate(struct MHD_Connection *c, const serve_buf *body)
{
    serve_request req;
    serve_error err;
    if (serve_parse_openai(body->data, body->len, serve_http_limits(), &req, &err))
        return serve_send_serve_error(c, &err);
    return serve_openai_submit(c, &req);
}

enum MHD_Result serve_openai_submit(struct MHD_Connection *c, serve_request *req_in)
{
    serve_request req = *req_in;
    memset(req_in, 0, sizeof *req_in);
    serve_error err;
    serve_lock();
    bool no_outputs = req.want_url && !serve_outputs_dir();
    serve_unlock();
    if (no_outputs) {
        serve_request_deinit(&req);
        return serve_send_error(c, 400, "response_format",
                                "response_format \"url\" needs the server "
                                "started with --outputs DIR");
    }
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return serve_send_serve_error(c, &err);
    }
    serve_wait_finished(c, j);
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    serve_lock();
    enum MHD_Result ok;
    if (j->state == JOB_DONE) {
        serve_buf b = {0};
        serve_buf_printf(&b, "{\"created\": %lld, \"data\": ", (long long)j->created);
        serve_put_image_data(&b, j, host, j->req.want_url);
        serve_buf_puts(&b, "}");
        serve_unlock();
        ok = serve_send_json(c, 200, &b);
    } else {
        char msg[sizeof j->error];
        int status = j->error_status ? j->error_status : 500;
        snprintf(msg, sizeof msg, "%s", j->error);
        serve_unlock();
        ok = serve_send_error(c, status, NULL, msg);
    }
    serve_job_release(j);
    return ok;
}

enum MHD_Result serve_openai_models(struct MHD_Connection *c)
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
    return serve_send_json(c, 200, &b);
}

enum MHD_Result serve_jobs_post(struct MHD_Connection *c, const serve_buf *body)
{
    serve_request req;
    serve_error err;
    if (serve_parse_openai(body->data, body->len, serve_http_limits(), &req, &err))
        return serve_send_serve_error(c, &err);
    req.want_url = false; /* images come back in the job */
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return serve_send_serve_error(c, &err);
    }
    serve_buf b = {0};
    serve_lock();
    serve_put_job(&b, j, serve_queue_position(j));
    serve_unlock();
    serve_job_release(j);
    return serve_send_json(c, 202, &b);
}

static enum MHD_Result job_get(struct MHD_Connection *c, serve_job *j)
{
    serve_buf b = {0};
    serve_lock();
    serve_put_job(&b, j, serve_queue_position(j));
    if (j->state == JOB_DONE) {
        b.len--; /* reopen the object */
        serve_buf_puts(&b, ", \"data\": ");
        serve_put_image_data(&b, j, NULL, false);
        serve_buf_puts(&b, "}");
    }
    serve_unlock();
    return serve_send_json(c, 200, &b);
}

static enum MHD_Result job_delete(struct MHD_Connection *c, serve_job *j)
{
    serve_job_cancel(j);
    serve_buf b = {0};
    serve_lock();
    serve_put_job(&b, j, serve_queue_position(j));
    serve_unlock();
    return serve_send_json(c, 200, &b);
}

/* The events stream: one "event: NAME\ndata: JSON\n\n" per change, "state" first, then
 * "step"s, and "done" (with the images) or "error" last. A comment every 10 s keeps
 * proxies from closing an idle stream. */
typedef struct event_stream {
    serve_job *job;
    unsigned seen, preview_seen;
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
        serve_put_image_data(b, j, NULL, false);
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
        serve_put_job(b, j, serve_queue_position(j));
        serve_buf_puts(b, "\n\n");
    } else {
        serve_buf_printf(b,
                         "event: step\ndata: {\"id\": \"%s\", \"step\": %d, \"steps\": %d, "
                         "\"image\": %d, \"images\": %d}\n\n",
                         j->id, j->step, j->steps, j->image_index, j->req.images);
        if (j->preview_png && j->preview_version != es->preview_seen) {
            serve_buf_printf(b,
                             "event: preview\ndata: {\"id\": \"%s\", \"step\": %d, "
                             "\"steps\": %d, \"image\": %d, \"b64_json\": \"",
                             j->id, j->preview_step, j->steps, j->image_index);
            serve_buf_base64(b, j->preview_png, j->preview_len);
            serve_buf_puts(b, "\"}\n\n");
            es->preview_seen = j->preview_version;
        }
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
        return serve_send_error(c, 500, NULL, "out of memory");
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
    serve_add_cors(r);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* /v1/jobs/{id}[/events] */
enum MHD_Result serve_jobs_item(struct MHD_Connection *c, const char *method, const char *rest)
{
    char id[33];
    size_t n = strspn(rest, "0123456789abcdef");
    bool events = n == 32 && !strcmp(rest + 32, "/events");
    if (n != 32 || (rest[32] && !events))
        return serve_send_error(c, 404, NULL, "no such job");
    memcpy(id, rest, 32);
    id[32] = '\0';
    const char *allowed = events ? "GET" : "GET, DELETE";
    if (strcmp(method, "GET") && (events || strcmp(method, "DELETE"))) {
        char msg[128];
        snprintf(msg, sizeof msg, "%.16s is not allowed here; use %s", method, allowed);
        return serve_send_error(c, 405, NULL, msg);
    }
    serve_job *j = serve_job_find(id);
    if (!j)
        return serve_send_error(c, 404, NULL,
                                "no such job (finished jobs are kept for a while only)");
    if (events)
        return job_events(c, j);
    enum MHD_Result ok = !strcmp(method, "GET") ? job_get(c, j) : job_delete(c, j);
    serve_job_release(j);
    return ok;
}
