/*
 * Tests for the flow-match Euler scheduler (src/sched/flow_match_euler.c): the shift
 * formulas, the schedule's shape, config errors, the Euler step, and diffusers' own
 * schedules and steps (the sched-* golden cases); FLUX.2's empirical mu, schedule, noise
 * and ids (src/sched/flux2_latents.c).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/scheduler.h>

#include "core/alloc.h"
#include "golden_tensors.h"
#include "sched/flow_match_euler.h"
#include "sched/flux2_latents.h"

static df_scheduler *from_json(const char *json)
{
    df_scheduler *s = NULL;
    df_status st = df_scheduler_load_json(json, strlen(json), "test config", &s);
    if (st != DF_OK)
        fail_msg("%s", df_error_message());
    return s;
}

static df_status load_status(const char *json)
{
    df_scheduler *s = (df_scheduler *)1;
    df_status st = df_scheduler_load_json(json, strlen(json), "test config", &s);
    assert_null(s);
    return st;
}

/* ---- the shift formulas ------------------------------------------------------------- */

static void test_calculate_shift_is_linear_between_the_ends(void **state)
{
    (void)state;
    assert_float_equal(df_flux_calculate_shift(256, 256, 4096, 0.5, 1.15), 0.5, 1e-12);
    assert_float_equal(df_flux_calculate_shift(4096, 256, 4096, 0.5, 1.15), 1.15, 1e-12);
    assert_float_equal(df_flux_calculate_shift(2176, 256, 4096, 0.5, 1.15), 0.825, 1e-12);
    /* the value diffusers computed for the schnell golden case (image_seq_len 16) */
    assert_float_equal(df_flux_calculate_shift(16, 256, 4096, 0.5, 1.15), 0.459375, 1e-12);
}

static void test_empirical_mu_follows_the_two_fits(void **state)
{
    (void)state;
    /* below 4300 tokens: the 10-step fit at 10 steps, the 200-step fit at 200 steps */
    int64_t len = 1024;
    assert_float_equal(df_flux2_compute_empirical_mu(len, 200), 0.00016927 * 1024 + 0.45666666,
                       1e-9);
    assert_float_equal(df_flux2_compute_empirical_mu(len, 10), 8.73809524e-05 * 1024 + 1.89833333,
                       1e-9);
    /* linear in the step count in between */
    double m50 = df_flux2_compute_empirical_mu(len, 50),
           m100 = df_flux2_compute_empirical_mu(len, 100);
    double m150 = df_flux2_compute_empirical_mu(len, 150);
    assert_float_equal(m100 - m50, m150 - m100, 1e-9);
    /* above 4300 tokens the step count no longer matters */
    assert_float_equal(df_flux2_compute_empirical_mu(8192, 4), 0.00016927 * 8192 + 0.45666666,
                       1e-12);
    assert_true(df_flux2_compute_empirical_mu(8192, 4) == df_flux2_compute_empirical_mu(8192, 50));
}

/* The values diffusers printed for the pipe-flux2 and pipe-flux2-klein cases (16 tokens). */
static void test_empirical_mu_matches_the_pipelines(void **state)
{
    (void)state;
    assert_float_equal(df_flux2_compute_empirical_mu(16, 4), 1.9452163656143495, 1e-15);
    assert_float_equal(df_flux2_compute_empirical_mu(16, 3), 1.952797189010341, 1e-15);
}

/* FLUX.2's schedule: sigmas linspace(1, 1/n, n) shifted by e^mu / (e^mu + 1/sigma - 1)
 * with the empirical mu, a terminal 0, timesteps sigma * 1000 (pipe-flux2-klein's config). */
static void test_flux2_schedule_shifts_linspace_by_empirical_mu(void **state)
{
    (void)state;
    df_scheduler *s;
    if (df_scheduler_load(DF_GOLDEN_DIR "/pipe-flux2-klein/pipeline/scheduler", &s) != DF_OK)
        skip();
    enum { N = 4 };
    double sig[N];
    df_linspace(1.0, 1.0 / N, N, sig);
    double mu = df_flux2_compute_empirical_mu(16, N);
    assert_int_equal(df_scheduler_set_timesteps(s, N, sig, &mu), DF_OK);
    assert_int_equal(df_scheduler_num_steps(s), N);
    const float *got = df_scheduler_sigmas(s), *ts = df_scheduler_timesteps(s);
    for (int i = 0; i < N; i++) {
        double want = exp(mu) / (exp(mu) + (1.0 / (1.0 - i * (1.0 - 1.0 / N) / (N - 1)) - 1.0));
        assert_float_equal(got[i], want, 1e-6);
        assert_float_equal(ts[i], want * 1000.0, 1e-3);
    }
    assert_true(got[0] == 1.0f);
    assert_true(got[N] == 0.0f);
    df_scheduler_free(s);
}

static void test_linspace_matches_numpy(void **state)
{
    (void)state;
    double y[8];
    df_linspace(1.0, 0.25, 4, y);
    assert_true(y[0] == 1.0 && y[1] == 0.75 && y[2] == 0.5 && y[3] == 0.25);
    df_linspace(3.0, 7.0, 1, y);
    assert_true(y[0] == 3.0);
    df_linspace(0.0, 1.0, 8, y);
    assert_true(y[7] == 1.0);
    assert_true(y[3] == 3.0 * (1.0 / 7.0)); /* i * step + start, not i / div */
    /* FluxPipeline's sigmas: the golden files hold numpy's own np.linspace(1, 1/n, n) */
    static const struct {
        const char *c;
        int n;
    } cases[] = {{"sched-flowmatch-flux-dev-8", 8}, {"sched-flowmatch-flux-schnell-4", 4}};
    for (int k = 0; k < 2; k++) {
        int64_t n = 0;
        double *want = golden_read_f64(cases[k].c, "in.sigmas", &n);
        if (!want)
            continue;
        assert_int_equal(n, cases[k].n);
        df_linspace(1.0, 1.0 / cases[k].n, cases[k].n, y);
        assert_memory_equal(y, want, (size_t)n * sizeof *y);
        free(want);
    }
}

/* ---- the schedule ------------------------------------------------------------------ */

static void test_schedule_has_n_plus_one_sigmas_ending_at_zero(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{\"shift\": 3.0}");
    assert_int_equal(df_scheduler_num_steps(s), 0);
    assert_null(df_scheduler_sigmas(s));
    assert_int_equal(df_scheduler_set_timesteps(s, 7, NULL, NULL), DF_OK);
    assert_int_equal(df_scheduler_num_steps(s), 7);
    const float *sig = df_scheduler_sigmas(s), *ts = df_scheduler_timesteps(s);
    assert_true(sig[0] == 1.0f);
    assert_true(sig[7] == 0.0f);
    for (int i = 0; i < 7; i++) {
        assert_true(sig[i + 1] < sig[i]);
        assert_true(ts[i] == sig[i] * 1000.0f);
    }
    /* a shift of 3 pushes every sigma up: s' = 3s / (1 + 2s) > s */
    assert_true(sig[6] > 0.001f);
    df_scheduler_free(s);
}

static void test_invert_sigmas_appends_one(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{\"invert_sigmas\": true}");
    double sig_in[3] = {1.0, 0.75, 0.5};
    assert_int_equal(df_scheduler_set_timesteps(s, 3, sig_in, NULL), DF_OK);
    const float *sig = df_scheduler_sigmas(s);
    assert_true(sig[0] == 0.0f && sig[1] == 0.25f && sig[2] == 0.5f && sig[3] == 1.0f);
    assert_true(df_scheduler_timesteps(s)[1] == 250.0f);
    df_scheduler_free(s);
}

static void test_dynamic_shift_uses_mu(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{\"use_dynamic_shifting\": true}");
    double sig_in[2] = {1.0, 0.5}, mu = 1.0;
    assert_int_equal(df_scheduler_set_timesteps(s, 2, sig_in, NULL), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "mu"));
    assert_int_equal(df_scheduler_set_timesteps(s, 2, sig_in, &mu), DF_OK);
    /* e / (e + (1/0.5 - 1)) = e / (e + 1) */
    assert_float_equal(df_scheduler_sigmas(s)[1], exp(1.0) / (exp(1.0) + 1.0), 1e-7);
    df_scheduler_free(s);

    s = from_json("{\"use_dynamic_shifting\": true, \"time_shift_type\": \"linear\"}");
    mu = 2.0;
    assert_int_equal(df_scheduler_set_timesteps(s, 2, sig_in, &mu), DF_OK);
    assert_float_equal(df_scheduler_sigmas(s)[1], 2.0 / 3.0, 1e-7);
    df_scheduler_free(s);
}

static void test_shift_terminal_ends_the_schedule_there(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{\"shift\": 3.0, \"shift_terminal\": 0.1}");
    assert_int_equal(df_scheduler_set_timesteps(s, 10, NULL, NULL), DF_OK);
    assert_float_equal(df_scheduler_sigmas(s)[9], 0.1, 1e-7);
    assert_float_equal(df_scheduler_sigmas(s)[0], 1.0, 1e-7);
    double sig_in[4];
    df_linspace(1.0, 0.25, 4, sig_in);
    assert_int_equal(df_scheduler_set_timesteps(s, 4, sig_in, NULL), DF_OK);
    assert_float_equal(df_scheduler_sigmas(s)[3], 0.1, 1e-6);
    df_scheduler_free(s);
}

static void test_bad_step_counts_and_sigmas_are_refused(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{}");
    assert_int_equal(df_scheduler_set_timesteps(s, 0, NULL, NULL), DF_E_ARG);
    double bad[2] = {1.0, NAN};
    assert_int_equal(df_scheduler_set_timesteps(s, 2, bad, NULL), DF_E_ARG);
    assert_int_equal(df_scheduler_num_steps(s), 0);
    df_scheduler_free(s);
}

/* ---- the config file ------------------------------------------------------------------ */

static void test_defaults_are_diffusers_defaults(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\"}");
    const df_scheduler_config *c = df_scheduler_get_config(s);
    assert_int_equal(c->num_train_timesteps, 1000);
    assert_true(c->shift == 1.0 && c->base_shift == 0.5 && c->max_shift == 1.15);
    assert_int_equal(c->base_image_seq_len, 256);
    assert_int_equal(c->max_image_seq_len, 4096);
    assert_false(c->use_dynamic_shifting);
    assert_true(c->shift_terminal == 0.0);
    df_scheduler_free(s);

    /* the same from a struct */
    df_scheduler_config cfg;
    df_scheduler_config_default(&cfg);
    cfg.shift = 3.0;
    assert_int_equal(df_scheduler_create(&cfg, &s), DF_OK);
    assert_int_equal(df_scheduler_set_timesteps(s, 10, NULL, NULL), DF_OK);
    df_scheduler *t = from_json("{\"shift\": 3.0}");
    assert_int_equal(df_scheduler_set_timesteps(t, 10, NULL, NULL), DF_OK);
    assert_memory_equal(df_scheduler_sigmas(s), df_scheduler_sigmas(t), 11 * sizeof(float));
    df_scheduler_free(s);
    df_scheduler_free(t);
    cfg.shift = 0.0;
    s = (df_scheduler *)1;
    assert_int_equal(df_scheduler_create(&cfg, &s), DF_E_ARG);
    assert_null(s);
}

static void test_unsupported_features_are_refused_by_name(void **state)
{
    (void)state;
    static const char *keys[] = {"use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                                 "stochastic_sampling"};
    for (int i = 0; i < 4; i++) {
        char json[128];
        snprintf(json, sizeof json, "{\"%s\": true}", keys[i]);
        assert_int_equal(load_status(json), DF_E_UNSUPPORTED);
        assert_non_null(strstr(df_error_message(), keys[i]));
        snprintf(json, sizeof json, "{\"%s\": false}", keys[i]);
        df_scheduler_free(from_json(json));
    }
    assert_int_equal(load_status("{\"_class_name\": \"DDIMScheduler\"}"), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "DDIMScheduler"));
}

static void test_malformed_configs_name_the_key(void **state)
{
    (void)state;
    assert_int_equal(load_status("{\"shift\": \"three\"}"), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "shift"));
    assert_int_equal(load_status("{\"use_dynamic_shifting\": 1}"), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "use_dynamic_shifting"));
    assert_int_equal(load_status("{\"num_train_timesteps\": 0}"), DF_E_FORMAT);
    assert_int_equal(load_status("{\"num_train_timesteps\": 10.5}"), DF_E_FORMAT);
    assert_int_equal(load_status("{\"time_shift_type\": \"cubic\"}"), DF_E_FORMAT);
    assert_int_equal(load_status("{\"shift_terminal\": 1.0}"), DF_E_FORMAT);
    assert_int_equal(load_status("{\"use_dynamic_shifting\": true, \"base_image_seq_len\": 64,"
                                 " \"max_image_seq_len\": 64}"),
                     DF_E_FORMAT);
    assert_int_equal(load_status("{\"shift\": 3.0"), DF_E_FORMAT);
    assert_int_equal(load_status("[1, 2]"), DF_E_FORMAT);
    /* null keeps the default, as diffusers' Optional keys do */
    df_scheduler *s = from_json("{\"shift_terminal\": null, \"base_shift\": null}");
    assert_true(df_scheduler_get_config(s)->base_shift == 0.5);
    df_scheduler_free(s);
}

static void test_missing_file_is_an_io_error(void **state)
{
    (void)state;
    df_scheduler *s = (df_scheduler *)1;
    assert_int_equal(df_scheduler_load(DF_TEST_TMP "/no-such-folder", &s), DF_E_IO);
    assert_null(s);
    assert_non_null(strstr(df_error_message(), "no-such-folder"));
    /* a folder without the file: the message names the file that was looked for */
    assert_int_equal(df_scheduler_load(DF_TEST_TMP, &s), DF_E_IO);
    assert_null(s);
    assert_non_null(strstr(df_error_message(), "scheduler_config.json"));
}

static void test_load_takes_the_file_or_its_folder(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/sched-flowmatch-flux-dev-8/scheduler", DF_GOLDEN_DIR);
    df_scheduler *a, *b;
    if (df_scheduler_load(path, &a) != DF_OK)
        skip();
    strcat(path, "/scheduler_config.json");
    assert_int_equal(df_scheduler_load(path, &b), DF_OK);
    assert_true(df_scheduler_get_config(a)->use_dynamic_shifting);
    assert_true(df_scheduler_get_config(b)->max_shift == 1.15);
    assert_int_equal(df_scheduler_get_config(b)->max_image_seq_len, 4096);
    df_scheduler_free(a);
    df_scheduler_free(b);
}

static void test_load_survives_every_allocation_failure(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/sched-flowmatch-flux-dev-8/scheduler", DF_GOLDEN_DIR);
    int64_t live = df_alloc_live();
    for (int k = 1; k < 50; k++) {
        df_scheduler *s = NULL;
        df_alloc_fail_at(k);
        df_status st = df_scheduler_load(dir, &s);
        if (st == DF_OK) {
            double sig[3] = {1.0, 0.5, 0.25}, mu = 0.8;
            df_alloc_fail_at(1);
            assert_int_equal(df_scheduler_set_timesteps(s, 3, sig, &mu), DF_E_OOM);
            df_alloc_fail_at(0);
            df_scheduler_free(s);
            break;
        }
        df_alloc_fail_at(0);
        if (st == DF_E_IO)
            skip(); /* golden data not here */
        assert_int_equal(st, DF_E_OOM);
        assert_null(s);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_int_equal(df_alloc_live(), live);
}

/* ---- the step ------------------------------------------------------------------------ */

static void test_step_is_x_plus_dt_v_and_stops_at_the_end(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{}");
    float x[2] = {1.0f, -2.0f}, v[2] = {0.5f, 4.0f};
    assert_int_equal(df_scheduler_step(s, v, x, 2), DF_E_STATE); /* no schedule yet */
    double sig[2] = {1.0, 0.25};
    assert_int_equal(df_scheduler_set_timesteps(s, 2, sig, NULL), DF_OK);
    assert_int_equal(df_scheduler_step(s, v, x, 2), DF_OK); /* dt = -0.75 */
    assert_true(x[0] == 0.625f && x[1] == -5.0f);
    assert_int_equal(df_scheduler_step_index(s), 1);
    float dt;
    assert_int_equal(df_scheduler_current_dt(s, &dt), DF_OK);
    assert_true(dt == -0.25f);
    assert_int_equal(df_scheduler_step(s, v, x, 2), DF_OK);
    assert_true(x[0] == 0.5f && x[1] == -6.0f);
    assert_int_equal(df_scheduler_step(s, v, x, 2), DF_E_STATE);
    assert_int_equal(df_scheduler_set_begin_index(s, 2), DF_E_ARG);
    assert_int_equal(df_scheduler_set_begin_index(s, 1), DF_OK);
    assert_int_equal(df_scheduler_advance(s), DF_OK);
    assert_int_equal(df_scheduler_advance(s), DF_E_STATE);
    df_scheduler_free(s);
}

static void test_step_rounds_the_product_before_the_sum(void **state)
{
    (void)state;
    df_scheduler *s = from_json("{}");
    double sig[2] = {1.0, 0.25};
    assert_int_equal(df_scheduler_set_timesteps(s, 2, sig, NULL), DF_OK); /* dt = -0.75 */
    /* -0.75 * (1 + 2^-23) = -(0.75 + 1.5 ulp) rounds (to even) to -(0.75 + 2 ulp), so
       torch's two kernels give 0.75 - (0.75 + 2^-23) = -2^-23; a fused multiply-add
       would give -1.5 * 2^-24 */
    float x[1] = {0.75f}, v[1] = {1.0f + 0x1p-23f};
    assert_int_equal(df_scheduler_step(s, v, x, 1), DF_OK);
    assert_true(x[0] == -0x1p-23f);
    df_scheduler_free(s);
}

/* ---- diffusers' results --------------------------------------------------------------- */

static void run_golden(const char *name, int n, bool flux, double mu)
{
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s/scheduler", DF_GOLDEN_DIR, name);
    df_scheduler *s;
    if (df_scheduler_load(dir, &s) != DF_OK)
        skip();
    int64_t cnt = 0;
    double *sig_in = flux ? golden_read_f64(name, "in.sigmas", &cnt) : NULL;
    double *want_sig = golden_read_f64(name, "out.sigmas", &cnt);
    assert_int_equal(cnt, n + 1);
    double *want_ts = golden_read_f64(name, "out.timesteps", &cnt);
    assert_int_equal(cnt, n);
    double *x0 = golden_read_f64(name, "in.sample", &cnt);
    int64_t m = cnt;
    double *v = golden_read_f64(name, "in.model_output", &cnt);
    assert_int_equal(cnt, n * m);
    double *want_x = golden_read_f64(name, "out.prev_sample", &cnt);
    assert_int_equal(cnt, n * m);

    assert_int_equal(df_scheduler_set_timesteps(s, n, sig_in, flux ? &mu : NULL), DF_OK);
    const float *sig = df_scheduler_sigmas(s), *ts = df_scheduler_timesteps(s);
    int sig_exact = 0, ts_exact = 0;
    for (int i = 0; i <= n; i++) {
        assert_float_equal(sig[i], want_sig[i], 2e-6);
        sig_exact += sig[i] == want_sig[i];
    }
    for (int i = 0; i < n; i++) {
        assert_float_equal(ts[i], want_ts[i], 2e-3);
        ts_exact += ts[i] == want_ts[i];
    }
    float *x = malloc((size_t)m * sizeof *x), *vi = malloc((size_t)m * sizeof *vi);
    assert_true(x && vi);
    for (int64_t j = 0; j < m; j++)
        x[j] = (float)x0[j];
    int64_t x_exact = 0;
    double max_abs = 0;
    for (int i = 0; i < n; i++) {
        for (int64_t j = 0; j < m; j++)
            vi[j] = (float)v[i * m + j];
        assert_int_equal(df_scheduler_step(s, vi, x, m), DF_OK);
        for (int64_t j = 0; j < m; j++) {
            double d = fabs(x[j] - want_x[i * m + j]);
            max_abs = d > max_abs ? d : max_abs;
            x_exact += d == 0;
        }
    }
    print_message("%s: sigmas %d/%d exact, timesteps %d/%d exact, samples %lld/%lld exact "
                  "(max |diff| %.3g)\n",
                  name, sig_exact, n + 1, ts_exact, n, (long long)x_exact, (long long)(n * m),
                  max_abs);
    assert_true(max_abs <= 1e-5);
    /* float32 throughout, with diffusers' roundings: the values are diffusers' own */
    assert_int_equal(sig_exact, n + 1);
    assert_int_equal(ts_exact, n);
    assert_int_equal(x_exact, n * m);
    free(x);
    free(vi);
    free(sig_in);
    free(want_sig);
    free(want_ts);
    free(x0);
    free(v);
    free(want_x);
    df_scheduler_free(s);
}

static void test_golden_flux_dev_8(void **state)
{
    (void)state;
    run_golden("sched-flowmatch-flux-dev-8", 8, true,
               df_flux_calculate_shift(4096, 256, 4096, 0.5, 1.15));
}

static void test_golden_flux_schnell_4(void **state)
{
    (void)state;
    run_golden("sched-flowmatch-flux-schnell-4", 4, true, 0.459375);
}

static void test_golden_sd3_10(void **state)
{
    (void)state;
    run_golden("sched-flowmatch-sd3-10", 10, false, 0);
}

/* ---- FLUX.2's starting latents ------------------------------------------------------- */

/* Seed 42 drawn as (1, 128, 8, 16) is torch's (1, 16, 32, 32) draw of the rng golden case
 * (the same 16384 numbers from the same stream: only the count matters), then packed:
 * token p, channel c holds draw c * 128 + p. */
static void test_flux2_noise_is_torch_draw_packed(void **state)
{
    (void)state;
    int64_t n;
    double *want = golden_read_f64("rng-randn-f32-seed42-latent", "out.sample_0", &n);
    if (!want)
        skip();
    enum { C = 128, h = 8, w = 16, HW = h * w };
    assert_int_equal(n, C * HW);
    float *scratch = malloc(sizeof(float) * C * HW), *got = malloc(sizeof(float) * C * HW);
    assert_non_null(scratch);
    assert_non_null(got);
    df_rng rng;
    df_rng_init(&rng, 42);
    assert_int_equal(df_flux2_noise(&rng, 1, C, h, w, scratch, got), DF_OK);
    /* within the rng's own tolerance against torch (test_rng: libm's log and cos differ
     * from torch's in the last bit for some draws) */
    for (int p = 0; p < HW; p++)
        for (int c = 0; c < C; c++)
            assert_float_equal(got[p * C + c], want[c * HW + p], 1e-5);
    /* unpacking gives back the draw in torch's order */
    float *draw = malloc(sizeof(float) * C * HW);
    assert_non_null(draw);
    df_flux2_unpack_latents(got, 1, C, h, w, draw);
    assert_memory_equal(draw, scratch, sizeof(float) * C * HW);
    free(draw);
    assert_int_equal(df_flux2_noise(&rng, 0, C, h, w, scratch, got), DF_E_ARG);
    free(scratch);
    free(got);
    free(want);
}

static void test_flux2_ids_are_raster_and_text_positions(void **state)
{
    (void)state;
    enum { B = 2, h = 3, w = 5, L = 4 };
    int64_t ids[B * h * w * 4], txt[B * L * 4];
    df_flux2_latent_ids(B, h, w, ids);
    for (int b = 0; b < B; b++)
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                const int64_t *id = ids + ((b * h + y) * w + x) * 4;
                assert_true(id[0] == 0 && id[1] == y && id[2] == x && id[3] == 0);
            }
    df_flux2_text_ids(B, L, txt);
    for (int b = 0; b < B; b++)
        for (int l = 0; l < L; l++) {
            const int64_t *id = txt + (b * L + l) * 4;
            assert_true(id[0] == 0 && id[1] == 0 && id[2] == 0 && id[3] == l);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calculate_shift_is_linear_between_the_ends),
        cmocka_unit_test(test_empirical_mu_follows_the_two_fits),
        cmocka_unit_test(test_empirical_mu_matches_the_pipelines),
        cmocka_unit_test(test_flux2_schedule_shifts_linspace_by_empirical_mu),
        cmocka_unit_test(test_flux2_noise_is_torch_draw_packed),
        cmocka_unit_test(test_flux2_ids_are_raster_and_text_positions),
        cmocka_unit_test(test_linspace_matches_numpy),
        cmocka_unit_test(test_schedule_has_n_plus_one_sigmas_ending_at_zero),
        cmocka_unit_test(test_invert_sigmas_appends_one),
        cmocka_unit_test(test_dynamic_shift_uses_mu),
        cmocka_unit_test(test_shift_terminal_ends_the_schedule_there),
        cmocka_unit_test(test_bad_step_counts_and_sigmas_are_refused),
        cmocka_unit_test(test_defaults_are_diffusers_defaults),
        cmocka_unit_test(test_unsupported_features_are_refused_by_name),
        cmocka_unit_test(test_malformed_configs_name_the_key),
        cmocka_unit_test(test_missing_file_is_an_io_error),
        cmocka_unit_test(test_load_takes_the_file_or_its_folder),
        cmocka_unit_test(test_load_survives_every_allocation_failure),
        cmocka_unit_test(test_step_is_x_plus_dt_v_and_stops_at_the_end),
        cmocka_unit_test(test_step_rounds_the_product_before_the_sum),
        cmocka_unit_test(test_golden_flux_dev_8),
        cmocka_unit_test(test_golden_flux_schnell_4),
        cmocka_unit_test(test_golden_sd3_10),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
