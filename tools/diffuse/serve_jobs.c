/*
 * diffuse serve: models, the job queue and the worker.
 *
 * One worker thread runs one job at a time: the CPU's cores are shared by every kernel, so
 * two runs side by side would each take twice as long and hold twice the memory. Waiting
 * jobs form a FIFO of --queue places. Each model (-m DIR, named by its folder) is loaded
 * the first time a job asks for it and then stays resident; the default model is loaded
 * when the server starts, and while any model loads new generation requests are answered
 * 503.
 *
 * One mutex guards everything here, with one condition variable broadcast on every change:
 * jobs are few and change a few times a second, so the simple rule is cheap. A job is
 * reference counted (the list holds one reference, each HTTP handler that waits on it
 * another); finished jobs stay listed for GET /v1/jobs/{id} until MAX_FINISHED newer ones
 * push them out.
 *
 * A job's images are generated one by one with seeds seed, seed + 1, ... (A1111's
 * all_seeds), so progress and skip work per image. Cancellation goes through the
 * pipeline's on_step callback: the run stops after the current step and frees everything.
 * Live previews come through the preview callback (every --preview-every steps): the newest
 * is kept on the job as a PNG for the events stream and /sdapi/v1/progress. Pictures sent
 * in (img2img, edits) were decoded by the request layer and go to the run as the CLI's
 * --image does (df_gen_params.image / images, strength).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "serve.h"

#define MAX_FINISHED 32

typedef struct model {
    char name[256];
    const char *dir;
    df_pipeline *p;
    bool failed; /* the last load failed: try again on the next job */
} model;

static struct {
    pthread_mutex_t mu;
    pthread_cond_t changed;
    pthread_t worker;
    bool started, stopping;
    model models[16];
    int n_models, default_model;
    bool loading;
    df_load_opts load;
    int queue_cap;
    const char *outputs;
    int preview_every;
    int int8_attention;
    serve_job *jobs;    /* every listed job, newest first */
    serve_job *current; /* running */
} S = {.mu = PTHREAD_MUTEX_INITIALIZER, .changed = PTHREAD_COND_INITIALIZER};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void serve_lock(void)
{
    pthread_mutex_lock(&S.mu);
}

void serve_unlock(void)
{
    pthread_mutex_unlock(&S.mu);
}

static void changed(void)
{
    pthread_cond_broadcast(&S.changed);
}

void serve_wait(double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + seconds;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&S.changed, &S.mu, &ts);
}

void serve_random_hex(char out[33])
{
    uint8_t r[16];
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? read(fd, r, sizeof r) : -1;
    if (fd >= 0)
        close(fd);
    if (got != (ssize_t)sizeof r) { /* no /dev/urandom: still unique, not secret */
        static unsigned counter;
        uint64_t x = (uint64_t)now() * 1000003u ^ (uint64_t)getpid() << 32 ^ ++counter;
        for (int i = 0; i < 16; i++, x = x * 6364136223846793005u + 1442695040888963407u)
            r[i] = (uint8_t)(x >> 56);
    }
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
}

const char *serve_job_state_name(serve_job_state s)
{
    switch (s) {
    case JOB_QUEUED:
        return "queued";
    case JOB_RUNNING:
        return "running";
    case JOB_DONE:
        return "done";
    case JOB_FAILED:
        return "failed";
    case JOB_CANCELLED:
        return "cancelled";
    }
    return "unknown";
}

/* ---- models (with the lock held) --------------------------------------------------- */

int serve_model_count(void)
{
    return S.n_models;
}
const char *serve_model_name(int i)
{
    return S.models[i].name;
}
const char *serve_model_dir(int i)
{
    return S.models[i].dir;
}
int serve_model_default(void)
{
    return S.default_model;
}
bool serve_model_loading(void)
{
    return S.loading;
}
void serve_model_set_default(int i)
{
    S.default_model = i;
}
const char *serve_outputs_dir(void)
{
    return S.outputs;
}

int serve_model_find(const char *name)
{
    for (int i = 0; i < S.n_models; i++)
        if (!strcmp(S.models[i].name, name))
            return i;
    return -1;
}

void serve_model_list_text(char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < S.n_models && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s'%s'", i ? ", " : "", S.models[i].name);
}

/* ./models/demo/ -> demo */
static void folder_name(const char *dir, char *out, size_t cap)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/')
        b--;
    snprintf(out, cap, "%.*s", (int)(n - b), dir + b);
}

/* ---- jobs -------------------------------------------------------------------------- */

static void job_free(serve_job *j)
{
    serve_request_deinit(&j->req);
    for (int i = 0; i < j->n_images; i++)
        df_image_png_free(j->images[i].png);
    df_image_png_free(j->preview_png);
    free(j);
}

static void unref(serve_job *j)
{
    if (--j->refs == 0)
        job_free(j);
}

void serve_job_release(serve_job *j)
{
    if (!j)
        return;
    serve_lock();
    unref(j);
    serve_unlock();
}

int serve_queue_length(void)
{
    int n = 0;
    for (serve_job *j = S.jobs; j; j = j->next)
        n += j->state == JOB_QUEUED;
    return n;
}

/* Drops finished jobs beyond the newest MAX_FINISHED from the list. */
static void trim_finished(void)
{
    int kept = 0;
    for (serve_job **pp = &S.jobs; *pp;) {
        serve_job *j = *pp;
        bool finished = j->state >= JOB_DONE;
        if (finished && ++kept > MAX_FINISHED) {
            *pp = j->next;
            unref(j);
        } else {
            pp = &j->next;
        }
    }
}

int serve_job_submit(serve_request *req, serve_job **out, serve_error *err)
{
    *out = NULL;
    serve_lock();
    int m = req->model ? serve_model_find(req->model) : S.default_model;
    int rc = 0;
    if (m < 0) {
        char names[512];
        serve_model_list_text(names, sizeof names);
        err->status = rc = 400;
        snprintf(err->param, sizeof err->param, "model");
        snprintf(err->message, sizeof err->message, "unknown model '%.200s'; available: %.280s",
                 req->model, names);
    } else if (S.loading) {
        err->status = rc = 503;
        snprintf(err->param, sizeof err->param, "%s", "");
        snprintf(err->message, sizeof err->message, "a model is loading; try again shortly");
    } else if (serve_queue_length() >= S.queue_cap) {
        err->status = rc = 429;
        snprintf(err->param, sizeof err->param, "%s", "");
        snprintf(err->message, sizeof err->message,
                 "the queue is full (%d waiting, --queue %d); try again later",
                 serve_queue_length(), S.queue_cap);
    }
    serve_job *j = rc ? NULL : calloc(1, sizeof *j);
    if (!rc && !j) {
        err->status = rc = 500;
        snprintf(err->message, sizeof err->message, "out of memory");
    }
    if (rc) {
        serve_unlock();
        return rc;
    }
    serve_random_hex(j->id);
    j->req = *req;
    memset(req, 0, sizeof *req);
    snprintf(j->model, sizeof j->model, "%s", S.models[m].name);
    j->created = now();
    j->refs = 2; /* the list's and the caller's */
    j->next = S.jobs;
    S.jobs = j;
    trim_finished();
    changed();
    serve_unlock();
    *out = j;
    return 0;
}

serve_job *serve_job_find(const char *id)
{
    serve_lock();
    serve_job *j = S.jobs;
    while (j && strcmp(j->id, id) != 0)
        j = j->next;
    if (j)
        j->refs++;
    serve_unlock();
    return j;
}

serve_job *serve_job_current(void)
{
    serve_lock();
    serve_job *j = S.current;
    if (j)
        j->refs++;
    serve_unlock();
    return j;
}

void serve_job_cancel(serve_job *j)
{
    serve_lock();
    if (j->state == JOB_QUEUED) {
        j->state = JOB_CANCELLED;
        j->finished = now();
        snprintf(j->error, sizeof j->error, "cancelled before it started");
        j->error_status = 409;
        j->version++;
    } else if (j->state == JOB_RUNNING) {
        j->cancel = true;
    }
    changed();
    serve_unlock();
}

/* ---- the worker -------------------------------------------------------------------- */

/* on_step: records progress; false stops the run. */
static bool on_step(int step, int steps, double elapsed, void *user)
{
    (void)elapsed;
    serve_job *j = user;
    serve_lock();
    if (steps > 0) {
        j->step = step;
        j->steps = steps;
        j->version++;
        changed();
    }
    bool go_on = !j->cancel && !j->skip && !S.stopping;
    serve_unlock();
    return go_on;
}

/* preview: the run's live preview becomes the job's (a PNG without parameters). A preview
 * that cannot be encoded is left out: the run goes on. */
static void on_preview(int step, int steps, const df_image *img, void *user)
{
    (void)steps;
    serve_job *j = user;
    void *png = NULL;
    size_t len = 0;
    if (df_image_encode_png(img, NULL, &png, &len) != DF_OK)
        return;
    serve_lock();
    void *old = j->preview_png;
    j->preview_png = png;
    j->preview_len = len;
    j->preview_step = step;
    j->preview_version++;
    j->version++;
    changed();
    serve_unlock();
    df_image_png_free(old);
}

/* DIFFUSE_SERVE_TEST_LOAD_DELAY=SECONDS: every model load first waits that long, so that a
 * test can hit the server while a model loads (tests/server/preview_loading.py). For tests
 * only; bounded to 60 s. */
static void test_load_delay(void)
{
    const char *e = getenv("DIFFUSE_SERVE_TEST_LOAD_DELAY");
    double d = e ? strtod(e, NULL) : 0;
    if (!(d > 0))
        return;
    if (d > 60)
        d = 60;
    struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Loads model m unless resident. Called without the lock. */
static df_status ensure_loaded(int m)
{
    serve_lock();
    model *md = &S.models[m];
    if (md->p) {
        serve_unlock();
        return DF_OK;
    }
    S.loading = true;
    changed();
    serve_unlock();
    fprintf(stderr, "diffuse serve: loading %s from %s\n", md->name, md->dir);
    test_load_delay();
    double t0 = now();
    df_pipeline *p = NULL;
    df_status s = df_pipeline_load(md->dir, &S.load, &p);
    if (s == DF_OK)
        fprintf(stderr, "diffuse serve: %s loaded in %.2f s\n", md->name, now() - t0);
    else
        fprintf(stderr, "diffuse serve: %s: %s\n", md->name, df_error_message());
    serve_lock();
    md->p = p;
    md->failed = s != DF_OK;
    S.loading = false;
    changed();
    serve_unlock();
    return s;
}

static void write_url_file(serve_image *im)
{
    char name[33], path[4096];
    serve_random_hex(name);
    snprintf(im->url_name, sizeof im->url_name, "%s.png", name);
    snprintf(path, sizeof path, "%s/%s", S.outputs, im->url_name);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    bool ok = fd >= 0 && write(fd, im->png, im->png_len) == (ssize_t)im->png_len;
    if (fd >= 0)
        close(fd);
    if (!ok) {
        fprintf(stderr, "diffuse serve: cannot write %s: %s\n", path, strerror(errno));
        im->url_name[0] = '\0';
    }
}

/* Inpainting: the request's mask (white repaints, black keeps, as diffusers and A1111 read
 * it) and A1111's crop padding, into the run's parameters. */
static void set_mask(df_gen_params *g, const serve_request *r)
{
    g->mask = r->mask;
    g->padding_mask_crop = r->padding_mask_crop;
}

/* The run's input pictures: one is `image` (img2img, or FLUX.2's reference), several are
 * FLUX.2's `images`, as diffuse generate's --image gives them. */
static void set_pictures(df_gen_params *g, const serve_request *r)
{
    if (r->n_inputs == 1)
        g->image = r->inputs[0];
    else if (r->n_inputs > 1)
        g->images = (const df_image *const *)r->inputs, g->n_images = r->n_inputs;
    g->strength = r->strength;
}

/* One image of job j with pipeline p: df_pipeline_run, then the PNG in memory. */
static df_status run_one(serve_job *j, df_pipeline *p, uint64_t seed, serve_image *im)
{
    const serve_request *r = &j->req;
    df_gen_params g = {
        .prompt = r->prompt,
        .negative_prompt = r->negative_prompt,
        .width = r->width,
        .height = r->height,
        .steps = r->steps,
        .guidance = r->guidance,
        .guidance_set = r->guidance_set,
        .seed = seed,
        .on_step = on_step,
        .progress_user = j,
        .preview = S.preview_every > 0 ? on_preview : NULL,
        .preview_every = S.preview_every,
        .int8_attention = S.int8_attention,
    };
    set_pictures(&g, r);
    set_mask(&g, r);
    df_gen_output out = {0};
    df_status s = df_pipeline_run(p, &g, &out);
    if (s != DF_OK)
        return s;
    bool flux2 = strncmp(df_pipeline_class(p), "Flux2", 5) == 0; /* references: no strength */
    char *params = NULL;
    df_image_params ip = {.prompt = r->prompt,
                          .negative_prompt = r->negative_prompt,
                          .steps = out.steps,
                          .sampler = "Euler",
                          .cfg_scale = out.guidance,
                          .seed = seed,
                          .width = out.width,
                          .height = out.height,
                          .model = j->model,
                          .denoising_strength =
                              r->n_inputs && !flux2 ? (r->strength > 0 ? r->strength : 0.6) : 0};
    s = df_image_format_parameters(&ip, &params);
    if (s == DF_OK)
        s = df_image_encode_png(out.images[0], params, &im->png, &im->png_len);
    df_image_text_free(params);
    im->seed = seed;
    serve_lock();
    j->width = out.width;
    j->height = out.height;
    j->steps_used = out.steps;
    j->guidance_used = out.guidance;
    serve_unlock();
    df_gen_output_free(&out);
    return s;
}

static void run_job(serve_job *j)
{
    int m = serve_model_find(j->model); /* model names never change */
    df_status s = ensure_loaded(m);
    bool load_failed = s != DF_OK; /* the server's fault, never the request's */
    serve_lock();
    df_pipeline *p = S.models[m].p;
    if (!j->req.seed_random) {
        /* keep */
    } else {
        char hex[33];
        serve_random_hex(hex);
        j->req.seed = strtoull(hex + 20, NULL, 16) & 0xffffffffu; /* A1111 seeds are 32-bit */
    }
    serve_unlock();
    for (int i = 0; s == DF_OK && i < j->req.images; i++) {
        serve_image im = {0};
        s = run_one(j, p, j->req.seed + (uint64_t)i, &im);
        if (s == DF_OK && j->req.want_url && S.outputs)
            write_url_file(&im);
        serve_lock();
        if (s == DF_OK) {
            j->images[j->n_images++] = im;
        } else if (s == DF_E_CANCELLED && j->skip && !j->cancel) {
            s = DF_OK; /* skip: on to the next image */
        }
        j->skip = false;
        j->image_index = i + 1;
        if (s == DF_OK && i + 1 < j->req.images)
            j->step = 0; /* a stopped job keeps the step it reached */
        j->version++;
        changed();
        serve_unlock();
    }
    serve_lock();
    if (s == DF_OK) {
        j->state = JOB_DONE;
    } else if (s == DF_E_CANCELLED) {
        j->state = JOB_CANCELLED;
        snprintf(j->error, sizeof j->error, "cancelled");
        j->error_status = 409;
    } else {
        j->state = JOB_FAILED;
        snprintf(j->error, sizeof j->error, "%s", df_error_message());
        /* the request's arguments, or something it asked that the model cannot do */
        j->error_status = !load_failed && (s == DF_E_ARG || s == DF_E_UNSUPPORTED) ? 400 : 500;
    }
    j->finished = now();
    j->version++;
    changed();
    serve_unlock();
}

static void *worker(void *arg)
{
    (void)arg;
    ensure_loaded(S.default_model);
    serve_lock();
    while (!S.stopping) {
        serve_job *next = NULL;
        for (serve_job *j = S.jobs; j; j = j->next) /* newest first: the last is the oldest */
            if (j->state == JOB_QUEUED)
                next = j;
        if (!next) {
            serve_wait(1.0);
            continue;
        }
        next->state = JOB_RUNNING;
        next->started = now();
        next->refs++;
        next->version++;
        S.current = next;
        changed();
        serve_unlock();
        run_job(next);
#ifdef __GLIBC__
        malloc_trim(0); /* a long-running server gives back what a run freed */
#endif
        serve_lock();
        S.current = NULL;
        unref(next);
        trim_finished();
    }
    serve_unlock();
    return NULL;
}

int serve_jobs_start(const serve_options *o)
{
#ifdef __GLIBC__
    /* One connection, one thread: without a bound glibc gives threads arenas of their own
     * that keep what they freed, and the server's memory creeps up with its connections. */
    mallopt(M_ARENA_MAX, 2);
#endif
    S.n_models = o->n_models;
    for (int i = 0; i < o->n_models; i++) {
        S.models[i].dir = o->model_dirs[i];
        folder_name(o->model_dirs[i], S.models[i].name, sizeof S.models[i].name);
        for (int k = 0; k < i; k++)
            if (!strcmp(S.models[k].name, S.models[i].name)) {
                fprintf(stderr,
                        "diffuse serve: two models are named '%s' (%s and %s): models "
                        "are named by their folder\n",
                        S.models[i].name, S.models[k].dir, S.models[i].dir);
                return -1;
            }
    }
    S.load = o->load;
    S.queue_cap = o->queue;
    S.outputs = o->outputs;
    S.preview_every = o->preview_every;
    S.int8_attention = o->int8_attention;
    S.loading = true; /* until the worker has loaded the default model */
    if (pthread_create(&S.worker, NULL, worker, NULL) != 0) {
        fprintf(stderr, "diffuse serve: cannot start the worker thread\n");
        return -1;
    }
    S.started = true;
    return 0;
}

void serve_jobs_stop(void)
{
    if (!S.started)
        return;
    serve_lock();
    S.stopping = true;
    for (serve_job *j = S.jobs; j; j = j->next)
        j->cancel = true;
    changed();
    serve_unlock();
    pthread_join(S.worker, NULL);
    serve_lock();
    for (serve_job *j = S.jobs; j; j = j->next)
        if (j->state == JOB_QUEUED) {
            j->state = JOB_CANCELLED;
            snprintf(j->error, sizeof j->error, "the server is stopping");
            j->error_status = 503;
            j->version++;
        }
    changed();
    serve_unlock();
    while (S.jobs) { /* handlers still waiting hold their own references */
        serve_lock();
        serve_job *j = S.jobs;
        S.jobs = j->next;
        unref(j);
        serve_unlock();
    }
    for (int i = 0; i < S.n_models; i++) {
        df_pipeline_free(S.models[i].p);
        S.models[i].p = NULL;
    }
    S.started = false;
}
