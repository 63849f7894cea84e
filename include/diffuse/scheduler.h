/*
 * Schedulers: the noise schedule and the update rule of the denoising loop.
 *
 * df_scheduler is diffusers' FlowMatchEulerDiscreteScheduler (FLUX.1, FLUX.2, SD3/3.5),
 * configured from the model folder's scheduler/scheduler_config.json. Use it as the
 * pipelines do:
 *
 *     df_scheduler *s;
 *     DF_CHECK(df_scheduler_load("model/scheduler", &s));
 *     double mu = df_flux_calculate_shift(seq_len, cfg->base_image_seq_len, ...);
 *     DF_CHECK(df_scheduler_set_timesteps(s, steps, flux_sigmas, &mu));
 *     for (int i = 0; i < df_scheduler_num_steps(s); i++) {
 *         ... model_output = transformer(x, df_scheduler_timesteps(s)[i] / 1000) ...
 *         DF_CHECK(df_scheduler_step(s, model_output, x, n));
 *     }
 *     df_scheduler_free(s);
 *
 * Sigmas and timesteps are float32, rounded where diffusers rounds them (it computes the
 * schedule in numpy float32 or float64 and stores float32), so they are diffusers' own
 * values, not approximations of them.
 */
#ifndef DIFFUSE_SCHEDULER_H
#define DIFFUSE_SCHEDULER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum df_time_shift {
    DF_TIME_SHIFT_EXPONENTIAL, /* e^mu / (e^mu + (1/sigma - 1)) */
    DF_TIME_SHIFT_LINEAR,      /* mu / (mu + (1/sigma - 1)) */
} df_time_shift;

/* The scheduler_config.json keys diffuse implements, with diffusers' names. */
typedef struct df_scheduler_config {
    int num_train_timesteps;    /* 1000 */
    double shift;               /* 1.0; static shift when dynamic shifting is off */
    bool use_dynamic_shifting;  /* false; then set_timesteps needs mu */
    double base_shift;          /* 0.5  (FluxPipeline's calculate_shift) */
    double max_shift;           /* 1.15 */
    int64_t base_image_seq_len; /* 256 */
    int64_t max_image_seq_len;  /* 4096 */
    bool invert_sigmas;         /* false */
    double shift_terminal;      /* 0 = none (null in the file) */
    df_time_shift time_shift_type;
} df_scheduler_config;

typedef struct df_scheduler df_scheduler;

/* Fills *cfg with diffusers' defaults (the values in the comments above). */
DF_API void df_scheduler_config_default(df_scheduler_config *cfg);

/*
 * Reads scheduler_config.json. `path` is the file or the folder holding it. Keys missing
 * from the file take diffusers' defaults; unknown keys are ignored. Fails with DF_E_IO if
 * the file cannot be read, DF_E_FORMAT for malformed JSON or a key of the wrong type,
 * DF_E_UNSUPPORTED for a class other than FlowMatchEulerDiscreteScheduler or a feature
 * diffuse does not implement (use_karras_sigmas, use_exponential_sigmas, use_beta_sigmas,
 * stochastic_sampling). On success *out is owned by the caller (df_scheduler_free).
 */
DF_API df_status df_scheduler_load(const char *path, df_scheduler **out);

/* The same from JSON text in memory; `name` is used in error messages. */
DF_API df_status df_scheduler_load_json(const char *json, size_t len, const char *name,
                                        df_scheduler **out);

/* From a config struct (start from df_scheduler_config_default). Fails with DF_E_ARG for
 * values the loader would refuse in a file (num_train_timesteps < 1, shift <= 0,
 * shift_terminal >= 1, equal sequence lengths with dynamic shifting). */
DF_API df_status df_scheduler_create(const df_scheduler_config *cfg, df_scheduler **out);

/* The configuration in use (borrowed, valid while s lives). */
DF_API const df_scheduler_config *df_scheduler_get_config(const df_scheduler *s);

/*
 * set_timesteps(num_steps, sigmas=..., mu=...) as diffusers 0.37 does it. `sigmas` is
 * NULL (the schedule is spaced linearly between the configured sigma_max and sigma_min,
 * as SD3 uses it) or num_steps values (FLUX passes df_linspace(1, 1/n, n)). `mu` is NULL
 * or the resolution-dependent shift, required when use_dynamic_shifting is on and ignored
 * otherwise. Afterwards there are num_steps timesteps, num_steps + 1 sigmas (the last 0,
 * or 1 with invert_sigmas) and the step index is 0. Fails with DF_E_ARG for num_steps < 1,
 * a missing mu, or a non-finite sigma or mu.
 */
DF_API df_status df_scheduler_set_timesteps(df_scheduler *s, int num_steps, const double *sigmas,
                                            const double *mu);

/* Steps of the current schedule (0 before set_timesteps). */
DF_API int df_scheduler_num_steps(const df_scheduler *s);
/* num_steps timesteps (sigma * num_train_timesteps) and num_steps + 1 sigmas; borrowed,
 * valid until the next set_timesteps. NULL before the first. */
DF_API const float *df_scheduler_timesteps(const df_scheduler *s);
DF_API const float *df_scheduler_sigmas(const df_scheduler *s);

/* Index of the next step() (0 after set_timesteps). set_begin_index starts a schedule
 * part-way (diffusers' set_begin_index); DF_E_ARG when out of range. */
DF_API int df_scheduler_step_index(const df_scheduler *s);
DF_API df_status df_scheduler_set_begin_index(df_scheduler *s, int index);

/*
 * One Euler step on host float32 data: sample[i] += float32(dt * model_output[i]) with
 * dt = float32(sigma_next - sigma), every product and sum rounded to float32 as torch
 * does, then the step index advances. Fails with DF_E_STATE when no step is left.
 */
DF_API df_status df_scheduler_step(df_scheduler *s, const float *model_output, float *sample,
                                   int64_t n);

DF_API void df_scheduler_free(df_scheduler *s); /* NULL is fine */

/* FluxPipeline's calculate_shift: mu linear in the image sequence length, base_shift at
 * base_seq and max_shift at max_seq (base_seq != max_seq). */
DF_API double df_flux_calculate_shift(int64_t image_seq_len, int64_t base_seq, int64_t max_seq,
                                      double base_shift, double max_shift);

/* Flux2Pipeline's compute_empirical_mu: BFL's piecewise-linear fit in the sequence length,
 * interpolated in the step count below 4300 tokens. */
DF_API double df_flux2_compute_empirical_mu(int64_t image_seq_len, int num_steps);

/* numpy.linspace(start, stop, n) bit for bit (endpoint included); FLUX's sigmas are
 * df_linspace(1.0, 1.0 / n, n, out). n <= 0 writes nothing. */
DF_API void df_linspace(double start, double stop, int64_t n, double *out);

#ifdef __cplusplus
}
#endif
#endif
