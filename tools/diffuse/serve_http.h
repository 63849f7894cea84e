/*
 * diffuse serve: what the protocol mappers (serve_a1111.c, serve_openai.c) share with the
 * HTTP layer (serve_http.c): answers in the common error shape, waiting for a job while
 * watching the client, the JSON pieces both APIs answer with, and the handlers the router
 * calls. Each handler queues exactly one response and returns libmicrohttpd's result.
 */
#ifndef DIFFUSE_SERVE_HTTP_H
#define DIFFUSE_SERVE_HTTP_H

#include <microhttpd.h>

#include "serve.h"

/* ---- answers (serve_http.c) ---- */

/* Sends b (taken: freed or handed to libmicrohttpd) as application/json. */
enum MHD_Result serve_send_json(struct MHD_Connection *c, int status, serve_buf *b);
/* {"error": {"message", "type", "param", "code"}, "detail"}; Retry-After with 429 and 503. */
enum MHD_Result serve_send_error(struct MHD_Connection *c, int status, const char *param,
                                 const char *message);
enum MHD_Result serve_send_serve_error(struct MHD_Connection *c, const serve_error *e);
/* Access-Control-Allow-Origin when --cors was given. */
void serve_add_cors(struct MHD_Response *r);
const serve_limits *serve_http_limits(void);

/* Blocks until job j has finished; a client that goes away cancels it. */
void serve_wait_finished(struct MHD_Connection *c, serve_job *j);

/* With the lock held: a job's images as OpenAI's data array (url names when `url`), the job
 * as the jobs API shows it, and its place in the queue (1 = next; 0 when not queued). */
void serve_put_image_data(serve_buf *b, const serve_job *j, const char *host, bool url);
void serve_put_job(serve_buf *b, const serve_job *j, int position);
int serve_queue_position(const serve_job *j);

/* ---- AUTOMATIC1111 (serve_a1111.c) ---- */

enum MHD_Result serve_a1111_txt2img(struct MHD_Connection *c, const serve_buf *body);
enum MHD_Result serve_a1111_img2img(struct MHD_Connection *c, const serve_buf *body);
enum MHD_Result serve_a1111_models(struct MHD_Connection *c);
enum MHD_Result serve_a1111_options_get(struct MHD_Connection *c);
enum MHD_Result serve_a1111_options_post(struct MHD_Connection *c, const serve_buf *body);
enum MHD_Result serve_a1111_samplers(struct MHD_Connection *c);
enum MHD_Result serve_a1111_schedulers(struct MHD_Connection *c);
enum MHD_Result serve_a1111_progress(struct MHD_Connection *c);
enum MHD_Result serve_a1111_stop(struct MHD_Connection *c, bool skip); /* interrupt, skip */

/* ---- OpenAI and jobs (serve_openai.c) ---- */

enum MHD_Result serve_openai_generate(struct MHD_Connection *c, const serve_buf *body);
/* Submits a parsed generations or edits request (taken) and answers with its images. */
enum MHD_Result serve_openai_submit(struct MHD_Connection *c, serve_request *req);
enum MHD_Result serve_openai_models(struct MHD_Connection *c);
enum MHD_Result serve_jobs_post(struct MHD_Connection *c, const serve_buf *body);
/* /v1/jobs/{id} (GET, DELETE) and /v1/jobs/{id}/events (GET); `rest` follows "/v1/jobs/". */
enum MHD_Result serve_jobs_item(struct MHD_Connection *c, const char *method, const char *rest);

#endif
