/*
 * diffuse serve: AUTOMATIC1111's API (/sdapi/v1/...).
 *
 * txt2img and img2img submit one job and wait for it (a client that hangs up cancels it); the
 * answer is A1111's {images, parameters, info} with info as a JSON string. The listings answer what
 * a client needs to pick a model and a sampler; options carry sd_model_checkpoint only. interrupt
 * and skip act on the running job. Routing, authentication and the error shape are serve_http.c's.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "serve_http.h"

/* Submits the parsed request (taken) and answers A1111's {images, parameters, info}. */
static enum MHD_Result submit(struct MHD_Connection *c, serve_request *req_in)
{
    serve_request req = *req_in;
    memset(req_in, 0, sizeof *req_in);
    serve_error err;
    int batch = req.images;
    double strength = req.n_inputs ? req.strength : 0;
    serve_job *j;
    if (serve_job_submit(&req, &j, &err)) {
        serve_request_deinit(&req);
        return serve_send_serve_error(c, &err);
    }
    serve_wait_finished(c, j);
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
        if (strength > 0)
            serve_buf_printf(&info, ", \"denoising_strength\": %g", strength);
        serve_buf_printf(&info, ", \"interrupted\": %s}", j->interrupted ? "true" : "false");
        serve_buf_json_str(&b, info.data);
        serve_buf_puts(&b, "}");
        serve_buf_free(&info);
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

enum MHD_Result serve_a1111_txt2img(struct MHD_Connection *c, const serve_buf *body)
{
    serve_request req;
    serve_error err;
    if (serve_parse_a1111(body->data, body->len, serve_http_limits(), &req, &err))
        return serve_send_serve_error(c, &err);
    return submit(c, &req);
}

enum MHD_Result serve_a1111_img2img(struct MHD_Connection *c, const serve_buf *body)
{
    serve_request req;
    serve_error err;
    if (serve_parse_a1111_img2img(body->data, body->len, serve_http_limits(), &req, &err))
        return serve_send_serve_error(c, &err);
    return submit(c, &req);
}

enum MHD_Result serve_a1111_models(struct MHD_Connection *c)
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
    return serve_send_json(c, 200, &b);
}

enum MHD_Result serve_a1111_options_get(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_lock();
    serve_buf_puts(&b, "{\"sd_model_checkpoint\": ");
    serve_buf_json_str(&b, serve_model_name(serve_model_default()));
    serve_unlock();
    serve_buf_puts(&b, ", \"samples_format\": \"png\", \"CLIP_stop_at_last_layers\": 1}");
    return serve_send_json(c, 200, &b);
}

/* Only sd_model_checkpoint means something here; other options are accepted and ignored,
 * as clients set many at once. */
enum MHD_Result serve_a1111_options_post(struct MHD_Connection *c, const serve_buf *body)
{
    df_json *root = NULL;
    if (df_json_parse_string(body->data ? body->data : "", body->len, "options", &root) != DF_OK)
        return serve_send_error(c, 400, NULL, df_error_message());
    enum MHD_Result ok;
    const char *name = NULL;
    if (df_json_type_of(root) != DF_JSON_OBJECT) {
        ok = serve_send_error(c, 400, NULL, "the body must be a JSON object");
    } else if (df_json_get_string_or(root, "sd_model_checkpoint", NULL, &name) != DF_OK) {
        ok = serve_send_error(c, 400, "sd_model_checkpoint", df_error_message());
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
            ok = serve_send_error(c, 400, "sd_model_checkpoint", msg);
        } else {
            serve_buf b = {0};
            serve_buf_puts(&b, "null");
            ok = serve_send_json(c, 200, &b);
        }
    }
    df_json_free(root);
    return ok;
}

enum MHD_Result serve_a1111_samplers(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "[{\"name\": \"Euler\", \"aliases\": [\"k_euler\", \"flow_match_euler\"], "
                       "\"options\": {}}]");
    return serve_send_json(c, 200, &b);
}

enum MHD_Result serve_a1111_schedulers(struct MHD_Connection *c)
{
    serve_buf b = {0};
    serve_buf_puts(&b, "[{\"name\": \"automatic\", \"label\": \"Automatic\", \"aliases\": null, "
                       "\"default_rho\": -1, \"need_inner_model\": false}, "
                       "{\"name\": \"flow_match_euler\", \"label\": \"Flow match Euler\", "
                       "\"aliases\": null, \"default_rho\": -1, \"need_inner_model\": false}]");
    return serve_send_json(c, 200, &b);
}

enum MHD_Result serve_a1111_progress(struct MHD_Connection *c)
{
    serve_buf b = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* A1111: skip_current_image defaults to false, so the preview comes unless refused */
    const char *skip = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "skip_current_image");
    bool want_image = !skip || !(strcmp(skip, "true") == 0 || strcmp(skip, "True") == 0 ||
                                 strcmp(skip, "1") == 0);
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
                     "\"current_image\": ",
                     progress, eta, skipped ? "true" : "false", interrupted ? "true" : "false",
                     j ? j->id : "", count, stamp, job_no, step, steps);
    if (j && j->preview_png && want_image) {
        serve_buf_puts(&b, "\"");
        serve_buf_base64(&b, j->preview_png, j->preview_len);
        serve_buf_puts(&b, "\"");
    } else {
        serve_buf_puts(&b, "null");
    }
    serve_buf_puts(&b, ", \"textinfo\": ");
    serve_buf_json_str(&b, serve_model_loading() ? "loading a model" : j ? "running" : "idle");
    serve_buf_puts(&b, "}");
    serve_unlock();
    serve_job_release(j);
    return serve_send_json(c, 200, &b);
}

/* /sdapi/v1/interrupt and /sdapi/v1/skip act on the running job. */
enum MHD_Result serve_a1111_stop(struct MHD_Connection *c, bool skip)
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
    return serve_send_json(c, 200, &b);
}
