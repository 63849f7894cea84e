/*
 * FlowMatchEulerDiscreteScheduler, as diffusers 0.37 computes it.
 *
 * The schedule is what diffusers stores, bit for bit, so every rounding it does is done
 * here too (the golden cases compare with 2e-6):
 *   - The configured sigma_max / sigma_min come from __init__: sigmas t/N for t = N..1 in
 *     float32, statically shifted in float32 unless dynamic shifting is on.
 *   - set_timesteps without sigmas (SD3): a float64 linspace between sigma_max*N and
 *     sigma_min*N, divided by N, shifted in float64, then rounded to float32.
 *   - set_timesteps with sigmas (FLUX): the sigmas are rounded to float32 first and the
 *     shift runs in numpy float32 arithmetic, Python scalars (shift, e^mu, mu) rounded
 *     to float32 where they meet the array. shift_terminal's scale factor is a numpy
 *     float64 scalar there (numpy 1.x promotion), rounded when it meets the array.
 *   - timesteps = float32(sigma * N); the final sigma 0 (or 1 with invert_sigmas).
 * The step is x + float32(dt * v) with dt = float32(sigma_next - sigma), as torch's
 * separate kernels round each result. Products are never fused with the following sum
 * (see the pragma below): numpy and torch round them.
 * Karras / exponential / beta sigmas and stochastic sampling are not implemented and are
 * refused when the config turns them on.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "sched/flow_match_euler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <diffuse/json.h>
#include <diffuse/ops.h>

#include "core/alloc.h"
#include "core/status.h"

struct df_scheduler {
    df_scheduler_config cfg;
    double sigma_min, sigma_max; /* float32 values, from __init__ */
    int num_steps;
    float *timesteps; /* [num_steps] */
    float *sigmas;    /* [num_steps + 1] */
    int step_index;
};

/* ---- helpers that the pipelines share ------------------------------------------------ */

double df_flux_calculate_shift(int64_t image_seq_len, int64_t base_seq, int64_t max_seq,
                               double base_shift, double max_shift)
{
    double m = (max_shift - base_shift) / (double)(max_seq - base_seq);
    double b = base_shift - m * (double)base_seq;
    return (double)image_seq_len * m + b;
}

double df_flux2_compute_empirical_mu(int64_t image_seq_len, int num_steps)
{
    const double a1 = 8.73809524e-05, b1 = 1.89833333; /* fit at 10 steps */
    const double a2 = 0.00016927, b2 = 0.45666666;     /* fit at 200 steps */
    double len = (double)image_seq_len;
    if (image_seq_len > 4300)
        return a2 * len + b2;
    double m_200 = a2 * len + b2;
    double m_10 = a1 * len + b1;
    double a = (m_200 - m_10) / 190.0;
    double b = m_200 - 200.0 * a;
    return a * (double)num_steps + b;
}

void df_linspace(double start, double stop, int64_t n, double *out)
{
    if (n <= 0)
        return;
    if (n == 1) {
        out[0] = start;
        return;
    }
    double div = (double)(n - 1);
    double delta = stop - start;
    double step = delta / div;
    for (int64_t i = 0; i < n; i++) {
        double y = step == 0.0 ? (double)i / div * delta : (double)i * step;
        out[i] = y + start;
    }
    out[n - 1] = stop;
}

/* ---- configuration ------------------------------------------------------------------ */

void df_scheduler_config_default(df_scheduler_config *cfg)
{
    *cfg = (df_scheduler_config){
        .num_train_timesteps = 1000,
        .shift = 1.0,
        .use_dynamic_shifting = false,
        .base_shift = 0.5,
        .max_shift = 1.15,
        .base_image_seq_len = 256,
        .max_image_seq_len = 4096,
        .invert_sigmas = false,
        .shift_terminal = 0.0,
        .time_shift_type = DF_TIME_SHIFT_EXPONENTIAL,
    };
}

/* `bad` is DF_E_FORMAT for a file, DF_E_ARG for a struct from the caller. */
static df_status check_config(const df_scheduler_config *c, const char *name, df_status bad)
{
    if (c->num_train_timesteps < 1)
        return df_errorf(bad, "%s: num_train_timesteps must be at least 1, found %d", name,
                         c->num_train_timesteps);
    if (!isfinite(c->shift) || c->shift <= 0)
        return df_errorf(bad, "%s: shift must be a positive number, found %g", name, c->shift);
    if (!isfinite(c->shift_terminal) || c->shift_terminal >= 1.0)
        return df_errorf(bad, "%s: shift_terminal must be below 1, found %g", name,
                         c->shift_terminal);
    if (c->time_shift_type != DF_TIME_SHIFT_EXPONENTIAL &&
        c->time_shift_type != DF_TIME_SHIFT_LINEAR)
        return df_errorf(bad, "%s: unknown time_shift_type %d", name, (int)c->time_shift_type);
    if (c->use_dynamic_shifting && c->base_image_seq_len == c->max_image_seq_len)
        return df_errorf(bad,
                         "%s: base_image_seq_len and max_image_seq_len are both %lld; "
                         "dynamic shifting needs two different lengths",
                         name, (long long)c->base_image_seq_len);
    return DF_OK;
}

static df_status refuse_if_set(const df_json *root, const char *key, const char *what)
{
    bool on;
    DF_TRY(df_json_get_bool_or(root, key, false, &on));
    if (on)
        return df_errorf(DF_E_UNSUPPORTED, "%s: '%s' is true, but %s is not implemented",
                         df_json_source(root), key, what);
    return DF_OK;
}

static df_status parse_config(const df_json *root, df_scheduler_config *c)
{
    const char *name = df_json_source(root);
    if (df_json_type_of(root) != DF_JSON_OBJECT)
        return df_errorf(DF_E_FORMAT, "%s: expected a JSON object, found %s", name,
                         df_json_type_name(df_json_type_of(root)));
    const char *cls;
    DF_TRY(df_json_get_string_or(root, "_class_name", "FlowMatchEulerDiscreteScheduler", &cls));
    if (strcmp(cls, "FlowMatchEulerDiscreteScheduler") != 0)
        return df_errorf(DF_E_UNSUPPORTED,
                         "%s: scheduler class '%s' is not supported "
                         "(diffuse implements FlowMatchEulerDiscreteScheduler)",
                         name, cls);

    df_scheduler_config_default(c);
    int64_t train;
    DF_TRY(df_json_get_int_or(root, "num_train_timesteps", c->num_train_timesteps, &train));
    if (train < 1 || train > 1000000)
        return df_errorf(DF_E_FORMAT, "%s: num_train_timesteps must be in [1, 1000000], found %lld",
                         name, (long long)train);
    c->num_train_timesteps = (int)train;
    DF_TRY(df_json_get_double_or(root, "shift", c->shift, &c->shift));
    DF_TRY(df_json_get_bool_or(root, "use_dynamic_shifting", c->use_dynamic_shifting,
                               &c->use_dynamic_shifting));
    DF_TRY(df_json_get_double_or(root, "base_shift", c->base_shift, &c->base_shift));
    DF_TRY(df_json_get_double_or(root, "max_shift", c->max_shift, &c->max_shift));
    DF_TRY(df_json_get_int_or(root, "base_image_seq_len", c->base_image_seq_len,
                              &c->base_image_seq_len));
    DF_TRY(
        df_json_get_int_or(root, "max_image_seq_len", c->max_image_seq_len, &c->max_image_seq_len));
    DF_TRY(df_json_get_bool_or(root, "invert_sigmas", c->invert_sigmas, &c->invert_sigmas));
    DF_TRY(df_json_get_double_or(root, "shift_terminal", 0.0, &c->shift_terminal));

    const char *ts;
    DF_TRY(df_json_get_string_or(root, "time_shift_type", "exponential", &ts));
    if (strcmp(ts, "exponential") == 0)
        c->time_shift_type = DF_TIME_SHIFT_EXPONENTIAL;
    else if (strcmp(ts, "linear") == 0)
        c->time_shift_type = DF_TIME_SHIFT_LINEAR;
    else
        return df_errorf(
            DF_E_FORMAT,
            "%s: 'time_shift_type' must be \"exponential\" or \"linear\", found \"%s\"", name, ts);
    DF_TRY(refuse_if_set(root, "use_karras_sigmas", "the Karras sigma schedule"));
    DF_TRY(refuse_if_set(root, "use_exponential_sigmas", "the exponential sigma schedule"));
    DF_TRY(refuse_if_set(root, "use_beta_sigmas", "the beta sigma schedule"));
    DF_TRY(refuse_if_set(root, "stochastic_sampling", "stochastic sampling"));
    return check_config(c, name, DF_E_FORMAT);
}

/* ---- construction ------------------------------------------------------------------- */

/* A Python float (double) as numpy / torch round it to meet a float32 array. */
static float f32(double x)
{
    return (float)x;
}

/* __init__'s schedule ends: sigmas N/N and 1/N, statically shifted in float32 (torch) unless
 * dynamic shifting is on. */
static double init_sigma(const df_scheduler_config *c, int t)
{
    float s = (float)t / (float)c->num_train_timesteps;
    if (!c->use_dynamic_shifting) {
        float shift = f32(c->shift), shift_m1 = f32(c->shift - 1.0);
        float num = shift * s;
        float den = 1.0f + shift_m1 * s;
        s = num / den;
    }
    return s;
}

df_status df_scheduler_create(const df_scheduler_config *cfg, df_scheduler **out)
{
    *out = NULL;
    DF_TRY(check_config(cfg, "scheduler config", DF_E_ARG));
    df_scheduler *s = df_calloc(1, sizeof *s);
    if (!s)
        return df_errorf(DF_E_OOM, "scheduler: out of memory");
    s->cfg = *cfg;
    s->sigma_max = init_sigma(cfg, cfg->num_train_timesteps);
    s->sigma_min = init_sigma(cfg, 1);
    *out = s;
    return DF_OK;
}

static df_status from_document(df_json *root, df_scheduler **out)
{
    df_scheduler_config cfg;
    df_status st = parse_config(root, &cfg);
    df_json_free(root);
    if (st != DF_OK)
        return st;
    return df_scheduler_create(&cfg, out);
}

df_status df_scheduler_load_json(const char *json, size_t len, const char *name, df_scheduler **out)
{
    *out = NULL;
    df_json *root;
    DF_TRY(df_json_parse_string(json, len, name, &root));
    return from_document(root, out);
}

df_status df_scheduler_load(const char *path, df_scheduler **out)
{
    *out = NULL;
    struct stat info;
    df_json *root;
    if (stat(path, &info) == 0 && S_ISDIR(info.st_mode)) {
        size_t plen = strlen(path);
        char *file = df_malloc(plen + 32);
        if (!file)
            return df_errorf(DF_E_OOM, "%s: out of memory", path);
        snprintf(file, plen + 32, "%s%sscheduler_config.json", path,
                 plen && path[plen - 1] == '/' ? "" : "/");
        df_status st = df_json_parse_file(file, &root);
        df_free(file);
        DF_TRY(st);
    } else {
        DF_TRY(df_json_parse_file(path, &root));
    }
    return from_document(root, out);
}

const df_scheduler_config *df_scheduler_get_config(const df_scheduler *s)
{
    return &s->cfg;
}

void df_scheduler_free(df_scheduler *s)
{
    if (!s)
        return;
    df_free(s->timesteps);
    df_free(s->sigmas);
    df_free(s);
}

/* ---- set_timesteps --------------------------------------------------------------------- */

/* Without explicit sigmas: float64 all the way (numpy), rounded to float32 at the end. */
static void schedule_f64(const df_scheduler *s, int n, double mu, double *sig)
{
    const df_scheduler_config *c = &s->cfg;
    double train = c->num_train_timesteps;
    df_linspace(s->sigma_max * train, s->sigma_min * train, n, sig);
    for (int i = 0; i < n; i++)
        sig[i] = sig[i] / train;
    for (int i = 0; i < n; i++) {
        double t = sig[i];
        if (c->use_dynamic_shifting && c->time_shift_type == DF_TIME_SHIFT_EXPONENTIAL)
            sig[i] = exp(mu) / (exp(mu) + (1.0 / t - 1.0));
        else if (c->use_dynamic_shifting)
            sig[i] = mu / (mu + (1.0 / t - 1.0));
        else
            sig[i] = c->shift * t / (1.0 + (c->shift - 1.0) * t);
    }
    if (c->shift_terminal != 0.0) {
        double scale = (1.0 - sig[n - 1]) / (1.0 - c->shift_terminal);
        for (int i = 0; i < n; i++)
            sig[i] = 1.0 - (1.0 - sig[i]) / scale;
    }
}

/* With explicit sigmas: numpy float32 arithmetic; Python scalars become float32. */
static void schedule_f32(const df_scheduler *s, int n, const double *given, double mu, float *sig)
{
    const df_scheduler_config *c = &s->cfg;
    for (int i = 0; i < n; i++)
        sig[i] = (float)given[i];
    float e_mu = f32(exp(mu)), mu_f = f32(mu);
    float shift = f32(c->shift), shift_m1 = f32(c->shift - 1.0);
    for (int i = 0; i < n; i++) {
        float t = sig[i];
        float odds = 1.0f / t - 1.0f;
        if (c->use_dynamic_shifting && c->time_shift_type == DF_TIME_SHIFT_EXPONENTIAL)
            sig[i] = e_mu / (e_mu + odds);
        else if (c->use_dynamic_shifting)
            sig[i] = mu_f / (mu_f + odds);
        else
            sig[i] = shift * t / (1.0f + shift_m1 * t);
    }
    if (c->shift_terminal != 0.0) {
        float last = 1.0f - sig[n - 1];
        float scale = f32((double)last / (1.0 - c->shift_terminal));
        for (int i = 0; i < n; i++)
            sig[i] = 1.0f - (1.0f - sig[i]) / scale;
    }
}

df_status df_scheduler_set_timesteps(df_scheduler *s, int num_steps, const double *sigmas,
                                     const double *mu)
{
    const df_scheduler_config *c = &s->cfg;
    if (num_steps < 1)
        return df_errorf(DF_E_ARG, "scheduler: the number of steps must be at least 1, got %d",
                         num_steps);
    if (num_steps > 1000000)
        return df_errorf(DF_E_ARG, "scheduler: %d steps is too many", num_steps);
    if (c->use_dynamic_shifting && !mu)
        return df_errorf(DF_E_ARG, "scheduler: use_dynamic_shifting is on, so mu must be given");
    double m = c->use_dynamic_shifting ? *mu : 0.0;
    if (!isfinite(m))
        return df_errorf(DF_E_ARG, "scheduler: mu is %g", m);
    for (int i = 0; sigmas && i < num_steps; i++) {
        if (!isfinite(sigmas[i]))
            return df_errorf(DF_E_ARG, "scheduler: sigma %d is %g", i, sigmas[i]);
    }

    float *ts = df_malloc((size_t)num_steps * sizeof *ts);
    float *sig = df_malloc(((size_t)num_steps + 1) * sizeof *sig);
    double *work = sigmas ? NULL : df_malloc((size_t)num_steps * sizeof *work);
    if (!ts || !sig || (!sigmas && !work)) {
        df_free(ts);
        df_free(sig);
        df_free(work);
        return df_errorf(DF_E_OOM, "scheduler: out of memory for %d steps", num_steps);
    }
    if (sigmas) {
        schedule_f32(s, num_steps, sigmas, m, sig);
    } else {
        schedule_f64(s, num_steps, m, work);
        for (int i = 0; i < num_steps; i++)
            sig[i] = (float)work[i];
        df_free(work);
    }

    float train = (float)c->num_train_timesteps;
    if (c->invert_sigmas) {
        for (int i = 0; i < num_steps; i++)
            sig[i] = 1.0f - sig[i];
    }
    for (int i = 0; i < num_steps; i++)
        ts[i] = sig[i] * train;
    sig[num_steps] = c->invert_sigmas ? 1.0f : 0.0f;

    df_free(s->timesteps);
    df_free(s->sigmas);
    s->timesteps = ts;
    s->sigmas = sig;
    s->num_steps = num_steps;
    s->step_index = 0;
    return DF_OK;
}

int df_scheduler_num_steps(const df_scheduler *s)
{
    return s->num_steps;
}

const float *df_scheduler_timesteps(const df_scheduler *s)
{
    return s->timesteps;
}

const float *df_scheduler_sigmas(const df_scheduler *s)
{
    return s->sigmas;
}

/* ---- stepping ----------------------------------------------------------------------- */

int df_scheduler_step_index(const df_scheduler *s)
{
    return s->step_index;
}

df_status df_scheduler_set_begin_index(df_scheduler *s, int index)
{
    if (index < 0 || index >= s->num_steps)
        return df_errorf(DF_E_ARG, "scheduler: begin index %d is outside the %d steps", index,
                         s->num_steps);
    s->step_index = index;
    return DF_OK;
}

df_status df_scheduler_current_dt(const df_scheduler *s, float *out)
{
    if (s->step_index >= s->num_steps)
        return df_errorf(DF_E_STATE,
                         "scheduler: step %d requested but the schedule has %d steps "
                         "(call set_timesteps first)",
                         s->step_index + 1, s->num_steps);
    *out = s->sigmas[s->step_index + 1] - s->sigmas[s->step_index];
    return DF_OK;
}

df_status df_scheduler_advance(df_scheduler *s)
{
    float dt = 0.0f;
    DF_TRY(df_scheduler_current_dt(s, &dt));
    s->step_index++;
    return DF_OK;
}

df_status df_scheduler_step(df_scheduler *s, const float *model_output, float *sample, int64_t n)
{
    if (n < 0 || (n > 0 && (!model_output || !sample)))
        return df_errorf(DF_E_ARG, "scheduler step: %lld elements", (long long)n);
    float dt = 0.0f;
    DF_TRY(df_scheduler_current_dt(s, &dt));
    for (int64_t i = 0; i < n; i++) {
        float delta = dt * model_output[i];
        sample[i] = sample[i] + delta;
    }
    s->step_index++;
    return DF_OK;
}

df_status df_scheduler_step_tensor(df_scheduler *s, df_ctx *ctx, df_tensor *model_output,
                                   df_tensor **sample)
{
    float dt = 0.0f;
    DF_TRY(df_scheduler_current_dt(s, &dt));
    if (!model_output || !*sample)
        return df_ctx_status(ctx) != DF_OK ? df_ctx_status(ctx)
                                           : df_errorf(DF_E_ARG, "scheduler step: no tensor");
    if (df_tensor_numel(model_output) != df_tensor_numel(*sample))
        return df_errorf(
            DF_E_ARG, "scheduler step: model output of %lld elements for a sample of %lld",
            (long long)df_tensor_numel(model_output), (long long)df_tensor_numel(*sample));
    df_tensor *v = df_reshape(ctx, model_output, df_tensor_shape(*sample), df_tensor_ndim(*sample));
    df_tensor *next = df_add(ctx, *sample, df_scale(ctx, v, dt, -0.0f)); /* x + f32(dt * v) */
    DF_TRY(df_ctx_status(ctx));
    *sample = next;
    s->step_index++;
    return DF_OK;
}

bool df_scheduler_host_step(void)
{
    const char *e = getenv("DIFFUSE_HOST_STEP");
    return e && *e && strcmp(e, "0") != 0;
}
