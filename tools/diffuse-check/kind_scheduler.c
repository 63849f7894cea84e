/*
 * Golden kind "scheduler": FlowMatchEulerDiscreteScheduler from the case's scheduler folder.
 *
 * As the case's "call" does: set_timesteps(num_inference_steps, sigmas=args.sigmas (a
 * tensor, or null), mu=args.mu (a number, or null)), then from args.sample one Euler step
 * per timestep with model_output[i]. Outputs: timesteps (n), sigmas (n + 1) and
 * prev_sample (n x sample), the sample after each step. The step runs on the host, so the
 * execution mode does not change the result.
 */
#include <stdio.h>
#include <stdlib.h>

#include "check.h"

typedef struct inputs {
    double *sigmas; /* NULL when args.sigmas is null */
    float *model_output, *sample;
    int64_t n_sigmas, n_model_output, n_sample;
} inputs;

static void inputs_free(inputs *in)
{
    free(in->sigmas);
    free(in->model_output);
    free(in->sample);
}

static int64_t numel(const int64_t *shape, int ndim)
{
    int64_t n = 1;
    for (int d = 0; d < ndim; d++)
        n *= shape[d];
    return n;
}

/* Reads the tensor that args.<key> names ("in.x") as f64 or f32; 1 (reported) on failure. */
static int tensor_arg(check_case *c, const char *key, double **f64, float **f32, int64_t *n)
{
    const char *name;
    if (df_json_get_string(c->args, key, &name) != DF_OK)
        return check_fail(c, "args.%s: %s", key, df_error_message());
    int64_t shape[8];
    int ndim;
    df_status st = f64 ? check_read_f64(c, name, f64, shape, &ndim)
                       : check_read_f32(c, name, f32, shape, &ndim);
    if (st != DF_OK)
        return check_fail(c, "args.%s: cannot read tensor '%s': %s", key, name, df_error_message());
    *n = numel(shape, ndim);
    return 0;
}

static int read_inputs(check_case *c, inputs *in)
{
    if (!df_json_is_null(df_json_get(c->args, "sigmas")) &&
        tensor_arg(c, "sigmas", &in->sigmas, NULL, &in->n_sigmas) != 0)
        return 1;
    if (tensor_arg(c, "model_output", NULL, &in->model_output, &in->n_model_output) != 0)
        return 1;
    return tensor_arg(c, "sample", NULL, &in->sample, &in->n_sample);
}

static int run(check_case *c, df_scheduler *s, const inputs *in, int steps, const double *mu)
{
    if (in->sigmas && in->n_sigmas != steps)
        return check_fail(c, "args.sigmas has %lld values for %d steps", (long long)in->n_sigmas,
                          steps);
    if (in->n_sample < 1 || in->n_model_output != steps * in->n_sample)
        return check_fail(c, "model_output has %lld values; expected %d steps x %lld",
                          (long long)in->n_model_output, steps, (long long)in->n_sample);
    if (df_scheduler_set_timesteps(s, steps, in->sigmas, mu) != DF_OK)
        return check_fail(c, "set_timesteps: %s", df_error_message());

    int64_t m = in->n_sample;
    float *prev = malloc((size_t)(steps * m) * sizeof *prev);
    float *x = malloc((size_t)m * sizeof *x);
    if (!prev || !x) {
        free(prev);
        free(x);
        return check_fail(c, "out of memory");
    }
    for (int64_t j = 0; j < m; j++)
        x[j] = in->sample[j];
    int failed = 0;
    for (int i = 0; i < steps && !failed; i++) {
        if (df_scheduler_step(s, in->model_output + i * m, x, m) != DF_OK)
            failed = check_fail(c, "step %d: %s", i, df_error_message());
        for (int64_t j = 0; j < m; j++)
            prev[i * m + j] = x[j];
    }
    if (!failed) {
        failed |= check_compare_f32(c, "timesteps", df_scheduler_timesteps(s), steps);
        failed |= check_compare_f32(c, "sigmas", df_scheduler_sigmas(s), steps + 1);
        failed |= check_compare_f32(c, "prev_sample", prev, steps * m);
    }
    free(prev);
    free(x);
    return failed ? 1 : 0;
}

int check_kind_scheduler(check_case *c)
{
    if (!c->model_dir)
        return check_fail(c, "a scheduler case needs \"dir\" (the scheduler folder)");
    int64_t steps;
    if (df_json_get_int(c->args, "num_inference_steps", &steps) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    if (steps < 1 || steps > 100000)
        return check_fail(c, "num_inference_steps %lld is out of range", (long long)steps);
    double mu = 0;
    bool has_mu = !df_json_is_null(df_json_get(c->args, "mu"));
    if (has_mu && df_json_get_double(c->args, "mu", &mu) != DF_OK)
        return check_fail(c, "%s", df_error_message());

    df_scheduler *s;
    if (df_scheduler_load(c->model_dir, &s) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    inputs in = {0};
    int result = read_inputs(c, &in) != 0 ? 1 : run(c, s, &in, (int)steps, has_mu ? &mu : NULL);
    inputs_free(&in);
    df_scheduler_free(s);
    return result;
}
