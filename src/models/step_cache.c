/*
 * Step caches: diffusers 0.42's FirstBlockCache and TaylorSeer hooks, decision for decision.
 *
 * FirstBlockCache (hooks/first_block_cache.py). The first block's residual r = out - in is
 * compared with the residual of the last call that computed every block:
 * diff = mean|r - r_prev| / mean|r_prev| (over every element, batch included). The first
 * call always computes; later calls compute when diff > threshold. Only a computing call
 * replaces r_prev, the first block's output and the tail residual (the last block's output
 * minus the first block's output); a skipping call returns that residual plus its own first
 * block's output. The residuals are read to the host and summed in double (diffusers reads
 * the quotient with .item(), a host sync per call, too).
 *
 * TaylorSeer (hooks/taylorseer_cache.py). Call s (from 0) computes when s <
 * disable_cache_before_step, or (s - disable_cache_before_step - 1) mod cache_interval == 0
 * (Python's modulo, never negative), or s >= disable_cache_after_step; otherwise every
 * hooked module predicts. A computing module updates its factors: F0 = its output, then
 * F(j+1) = (F(j) - F_prev(j)) / (s - s_last) for j < max_order while the previous call had
 * factor j, each stored in taylor_factors_dtype (rounded after the whole chain, which runs
 * in the output's dtype). A prediction is sum_j F(j) * (s - s_last)^j / j!.
 *
 * MagCache (hooks/mag_cache.py). Before the first block, at step s past
 * int(retention_ratio * num_inference_steps + 0.5): ratio *= mag_ratios[s], steps += 1,
 * err += |1 - ratio| (all float32, as torch computes on the ratios' 0-d float32 tensors,
 * the threshold rounded to float32 for the comparison); the call skips every block when a
 * residual is stored, err <= threshold and steps <= max_skip_steps, and otherwise resets
 * ratio, steps and err and computes. A skipping call returns the image stream's input plus
 * the stored residual (the text stream passes through); a computing call stores the last
 * block's image output minus the first block's image input. The step counter and the
 * state restart after num_inference_steps calls.
 *
 * Every call of a run goes through one state: the pipelines call their transformer once per
 * step (diffusers' cache_context("cond")).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/ops.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/step_cache.h"

#define MAX_CALLS 1000
#define MAX_ORDER 8
#define MAX_OUT   2

/* One TaylorSeer-hooked module: factors[i][j] is output i's order-j factor. */
typedef struct ts_module {
    df_tensor *factors[MAX_OUT][MAX_ORDER + 1];
    int n_factors, n_out;
    int last_update; /* the call that last computed it, or -1 */
} ts_module;

struct df_step_cache {
    df_cache_config cfg;
    char model[64];
    int call;    /* the current call, from 0 (-1 before the first) */
    char letter; /* the current call's letter */
    char trace[MAX_CALLS + 1];
    double diffs[MAX_CALLS];
    /* FirstBlockCache */
    float *prev, *cur; /* the head residual of the last computed call; this call's */
    int64_t n_res;
    bool have_prev;
    df_tensor *head_out, *tail_res;
    /* MagCache: the accumulation in float32, as torch does it on the ratios' 0-d tensors */
    int mag_step;
    float mag_ratio, mag_err;
    int mag_steps;
    df_tensor *mag_in, *mag_res; /* this call's head input; the last computed residual */
    /* TaylorSeer */
    ts_module *mod;
    int n_mod;
    bool predicting; /* this call predicts */
};

/* ---- configs ------------------------------------------------------------------------------ */

df_cache_config df_cache_config_default(df_cache_kind kind)
{
    return (df_cache_config){.kind = kind,
                             .threshold = kind == DF_CACHE_MAG ? 0.06 : 0.05,
                             .cache_interval = 5,
                             .disable_cache_before_step = 3,
                             .disable_cache_after_step = -1,
                             .max_order = 1,
                             .taylor_factors_dtype = DF_DTYPE_BF16,
                             .max_skip_steps = 3,
                             .retention_ratio = 0.2,
                             .num_inference_steps = 28};
}

/* diffusers' FLUX_MAG_RATIOS (hooks/mag_cache.py): FLUX.1-dev at 28 steps. */
static const float flux_mag_ratios[28] = {
    1.0f,     1.21094f, 1.11719f, 1.07812f, 1.0625f,  1.03906f, 1.03125f,
    1.03906f, 1.02344f, 1.03125f, 1.02344f, 0.98047f, 1.01562f, 1.00781f,
    1.0f,     1.00781f, 1.0f,     1.00781f, 1.0f,     1.0f,     0.99609f,
    0.99609f, 0.98047f, 0.98828f, 0.96484f, 0.95703f, 0.93359f, 0.89062f};

static df_status parse_ratios(df_cache_config *c, const char *cache, const char *v)
{
    if (strcmp(v, "flux") == 0 || strcmp(v, "FLUX_MAG_RATIOS") == 0) {
        c->n_mag_ratios = 28;
        memcpy(c->mag_ratios, flux_mag_ratios, sizeof flux_mag_ratios);
        return DF_OK;
    }
    int n = 0;
    for (const char *p = v; *p;) {
        char *end;
        double x = strtod(p, &end);
        if (end == p || !isfinite(x) || (*end && *end != '/') || n == DF_CACHE_MAX_MAG_RATIOS)
            return df_errorf(DF_E_ARG,
                             "--cache %s: mag_ratios must be 'flux' or at most %d "
                             "numbers separated by '/', not '%s'",
                             cache, DF_CACHE_MAX_MAG_RATIOS, v);
        c->mag_ratios[n++] = (float)x; /* torch.tensor(list): float32 */
        p = *end ? end + 1 : end;
    }
    if (n == 0)
        return df_errorf(DF_E_ARG, "--cache %s: mag_ratios is empty", cache);
    c->n_mag_ratios = n;
    return DF_OK;
}

static df_status parse_number(const char *cache, const char *key, const char *v, double *out)
{
    char *end;
    double x = strtod(v, &end);
    if (*v == '\0' || *end != '\0' || !(x >= 0) || !isfinite(x))
        return df_errorf(DF_E_ARG, "--cache %s: %s must be a number >= 0, not '%s'", cache, key, v);
    *out = x;
    return DF_OK;
}

static df_status parse_int(const char *cache, const char *key, const char *v, int min, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < min || x > 1000000)
        return df_errorf(DF_E_ARG, "--cache %s: %s must be an integer >= %d, not '%s'", cache, key,
                         min, v);
    *out = (int)x;
    return DF_OK;
}

static df_status parse_key(df_cache_config *c, const char *cache, const char *key, const char *v)
{
    if ((c->kind == DF_CACHE_FIRST_BLOCK || c->kind == DF_CACHE_MAG) &&
        strcmp(key, "threshold") == 0)
        return parse_number(cache, key, v, &c->threshold);
    if (c->kind == DF_CACHE_MAG) {
        if (strcmp(key, "max_skip_steps") == 0)
            return parse_int(cache, key, v, 0, &c->max_skip_steps);
        if (strcmp(key, "retention_ratio") == 0)
            return parse_number(cache, key, v, &c->retention_ratio);
        if (strcmp(key, "num_inference_steps") == 0)
            return parse_int(cache, key, v, 1, &c->num_inference_steps);
        if (strcmp(key, "mag_ratios") == 0)
            return parse_ratios(c, cache, v);
        if (strcmp(key, "calibrate") == 0 && (strcmp(v, "False") == 0 || strcmp(v, "false") == 0))
            return DF_OK;
        if (strcmp(key, "calibrate") == 0)
            return df_errorf(DF_E_UNSUPPORTED,
                             "--cache %s: calibrate is not implemented; give "
                             "mag_ratios",
                             cache);
    }
    if (c->kind == DF_CACHE_TAYLORSEER) {
        if (strcmp(key, "cache_interval") == 0)
            return parse_int(cache, key, v, 1, &c->cache_interval);
        if (strcmp(key, "disable_cache_before_step") == 0)
            return parse_int(cache, key, v, 0, &c->disable_cache_before_step);
        if (strcmp(key, "disable_cache_after_step") == 0) {
            if (strcmp(v, "None") == 0 || strcmp(v, "none") == 0) {
                c->disable_cache_after_step = -1;
                return DF_OK;
            }
            return parse_int(cache, key, v, 0, &c->disable_cache_after_step);
        }
        if (strcmp(key, "max_order") == 0) {
            DF_TRY(parse_int(cache, key, v, 0, &c->max_order));
            if (c->max_order > MAX_ORDER)
                return df_errorf(DF_E_ARG, "--cache %s: max_order %d is above %d", cache,
                                 c->max_order, MAX_ORDER);
            return DF_OK;
        }
        if (strcmp(key, "taylor_factors_dtype") == 0) {
            if (strcmp(v, "bfloat16") == 0 || strcmp(v, "torch.bfloat16") == 0)
                c->taylor_factors_dtype = DF_DTYPE_BF16;
            else if (strcmp(v, "float32") == 0 || strcmp(v, "torch.float32") == 0)
                c->taylor_factors_dtype = DF_DTYPE_F32;
            else
                return df_errorf(DF_E_ARG,
                                 "--cache %s: taylor_factors_dtype must be bfloat16 "
                                 "or float32, not '%s'",
                                 cache, v);
            return DF_OK;
        }
    }
    return df_errorf(DF_E_ARG, "--cache %s: unknown key '%s' (%s)", cache, key,
                     c->kind == DF_CACHE_FIRST_BLOCK ? "first-block takes threshold"
                     : c->kind == DF_CACHE_MAG
                         ? "magcache takes threshold, max_skip_steps, retention_ratio, "
                           "num_inference_steps, mag_ratios"
                         : "taylorseer takes cache_interval, disable_cache_before_step, "
                           "disable_cache_after_step, max_order, taylor_factors_dtype");
}

/* MagCacheConfig.__post_init__: ratios of another length are resampled to
 * num_inference_steps by nearest_interp, index round((float)i * (float)scale), rounding
 * half to even as torch.round does. */
static void interpolate_ratios(df_cache_config *c)
{
    int src = c->n_mag_ratios, n = c->num_inference_steps;
    if (src == n || n > DF_CACHE_MAX_MAG_RATIOS)
        return;
    float from[DF_CACHE_MAX_MAG_RATIOS];
    memcpy(from, c->mag_ratios, (size_t)src * sizeof *from);
    if (n == 1) {
        c->mag_ratios[0] = from[src - 1];
    } else {
        float scale = (float)((double)(src - 1) / (double)(n - 1));
        for (int i = 0; i < n; i++) {
            int k = (int)nearbyintf((float)i * scale);
            c->mag_ratios[i] = from[k < src ? k : src - 1];
        }
    }
    c->n_mag_ratios = n;
}

df_status df_cache_config_parse(const char *spec, df_cache_config *out)
{
    if (!spec || !out)
        return df_errorf(DF_E_ARG, "--cache: no value");
    char buf[16384]; /* a spec with 1000 mag_ratios */
    if (strlen(spec) >= sizeof buf)
        return df_errorf(DF_E_ARG, "--cache: the value is longer than %zu bytes", sizeof buf - 1);
    strcpy(buf, spec);
    char *keys = strchr(buf, ':');
    if (keys)
        *keys++ = '\0';
    df_cache_config c;
    if (strcmp(buf, "none") == 0)
        c = df_cache_config_default(DF_CACHE_NONE);
    else if (strcmp(buf, "first-block") == 0)
        c = df_cache_config_default(DF_CACHE_FIRST_BLOCK);
    else if (strcmp(buf, "taylorseer") == 0)
        c = df_cache_config_default(DF_CACHE_TAYLORSEER);
    else if (strcmp(buf, "magcache") == 0)
        c = df_cache_config_default(DF_CACHE_MAG);
    else
        return df_errorf(DF_E_ARG,
                         "--cache: unknown cache '%s' (expected first-block, "
                         "taylorseer, magcache or none)",
                         buf);
    if (keys && c.kind == DF_CACHE_NONE && *keys)
        return df_errorf(DF_E_ARG, "--cache none takes no keys, found '%s'", keys);
    for (char *kv = keys, *next; kv && *kv; kv = next) {
        next = strchr(kv, ',');
        if (next)
            *next++ = '\0';
        char *v = strchr(kv, '=');
        if (!v)
            return df_errorf(DF_E_ARG, "--cache %s: expected key=value, found '%s'", buf, kv);
        *v++ = '\0';
        DF_TRY(parse_key(&c, buf, kv, v));
    }
    if (c.kind == DF_CACHE_MAG && c.n_mag_ratios == 0)
        return df_errorf(DF_E_ARG, "--cache magcache: mag_ratios is required (they are "
                                   "model-dependent; 'flux' gives diffusers' FLUX_MAG_RATIOS)");
    if (c.kind == DF_CACHE_MAG)
        interpolate_ratios(&c);
    *out = c;
    return DF_OK;
}

void df_cache_config_format(const df_cache_config *c, char *buf, size_t cap)
{
    if (c->kind == DF_CACHE_FIRST_BLOCK) {
        int digits = 6; /* the shortest that reads back as the same double */
        while (digits < 17) {
            char t[64];
            snprintf(t, sizeof t, "%.*g", digits, c->threshold);
            if (strtod(t, NULL) == c->threshold)
                break;
            digits++;
        }
        snprintf(buf, cap, "first-block:threshold=%.*g", digits, c->threshold);
    } else if (c->kind == DF_CACHE_TAYLORSEER) {
        char after[16];
        if (c->disable_cache_after_step < 0)
            snprintf(after, sizeof after, "None");
        else
            snprintf(after, sizeof after, "%d", c->disable_cache_after_step);
        snprintf(buf, cap,
                 "taylorseer:cache_interval=%d,disable_cache_before_step=%d,"
                 "disable_cache_after_step=%s,max_order=%d,taylor_factors_dtype=%s",
                 c->cache_interval, c->disable_cache_before_step, after, c->max_order,
                 c->taylor_factors_dtype == DF_DTYPE_BF16 ? "bfloat16" : "float32");
    } else if (c->kind == DF_CACHE_MAG) {
        int len =
            snprintf(buf, cap,
                     "magcache:threshold=%g,max_skip_steps=%d,retention_ratio=%g,"
                     "num_inference_steps=%d,mag_ratios=",
                     c->threshold, c->max_skip_steps, c->retention_ratio, c->num_inference_steps);
        for (int i = 0; i < c->n_mag_ratios && len > 0 && (size_t)len < cap; i++)
            len += snprintf(buf + len, cap - (size_t)len, "%s%.9g", i ? "/" : "", c->mag_ratios[i]);
    } else {
        snprintf(buf, cap, "none");
    }
}

/* ---- the cache ---------------------------------------------------------------------------- */

df_status df_step_cache_create(const df_cache_config *cfg, const char *model, int n_modules,
                               df_step_cache **out)
{
    *out = NULL;
    if (!cfg || cfg->kind == DF_CACHE_NONE)
        return DF_OK;
    if (cfg->kind != DF_CACHE_FIRST_BLOCK && cfg->kind != DF_CACHE_TAYLORSEER &&
        cfg->kind != DF_CACHE_MAG)
        return df_errorf(DF_E_ARG, "step cache: unknown kind %d", (int)cfg->kind);
    if (cfg->kind == DF_CACHE_MAG &&
        (cfg->n_mag_ratios < 1 || cfg->n_mag_ratios > DF_CACHE_MAX_MAG_RATIOS ||
         cfg->num_inference_steps < 1))
        return df_errorf(DF_E_ARG,
                         "magcache: mag_ratios (1 to %d) and num_inference_steps >= 1 "
                         "are required",
                         DF_CACHE_MAX_MAG_RATIOS);
    if (cfg->kind == DF_CACHE_TAYLORSEER &&
        (cfg->max_order < 0 || cfg->max_order > MAX_ORDER || cfg->cache_interval < 1 ||
         (cfg->taylor_factors_dtype != DF_DTYPE_BF16 && cfg->taylor_factors_dtype != DF_DTYPE_F32)))
        return df_errorf(DF_E_ARG,
                         "taylorseer: max_order must be in [0, %d], cache_interval "
                         ">= 1 and taylor_factors_dtype bfloat16 or float32",
                         MAX_ORDER);
    df_step_cache *c = df_calloc(1, sizeof *c);
    if (!c)
        return df_errorf(DF_E_OOM, "out of memory for the step cache");
    c->cfg = *cfg;
    c->call = -1;
    c->mag_ratio = 1.0f;
    snprintf(c->model, sizeof c->model, "%s", model);
    if (cfg->kind == DF_CACHE_TAYLORSEER) {
        c->mod = df_calloc(n_modules ? (size_t)n_modules : 1, sizeof *c->mod);
        if (!c->mod) {
            df_free(c);
            return df_errorf(DF_E_OOM, "out of memory for the step cache");
        }
        c->n_mod = n_modules;
        for (int i = 0; i < n_modules; i++)
            c->mod[i].last_update = -1;
    }
    *out = c;
    return DF_OK;
}

const df_cache_config *df_step_cache_config(const df_step_cache *c)
{
    return &c->cfg;
}

/* Python's a % n for n > 0: never negative. */
static int py_mod(int a, int n)
{
    int r = a % n;
    return r < 0 ? r + n : r;
}

void df_step_cache_begin(df_step_cache *c)
{
    if (!c)
        return;
    c->call++;
    c->letter = 'C';
    c->predicting = false;
    if (c->call < MAX_CALLS)
        c->diffs[c->call] = NAN;
    if (c->cfg.kind == DF_CACHE_TAYLORSEER) {
        const df_cache_config *k = &c->cfg;
        bool warmup = c->call < k->disable_cache_before_step;
        bool interval = py_mod(c->call - k->disable_cache_before_step - 1, k->cache_interval) == 0;
        bool cooldown = k->disable_cache_after_step >= 0 && c->call >= k->disable_cache_after_step;
        c->predicting = !(warmup || interval || cooldown);
        if (c->predicting)
            c->letter = 'P';
    }
}

void df_step_cache_end(df_step_cache *c)
{
    if (c && c->call >= 0 && c->call < MAX_CALLS) {
        c->trace[c->call] = c->letter;
        c->trace[c->call + 1] = '\0';
    }
}

const char *df_step_cache_trace(const df_step_cache *c)
{
    return c->trace;
}

const double *df_step_cache_diffs(const df_step_cache *c, int *n)
{
    *n = c->call + 1 < MAX_CALLS ? c->call + 1 : MAX_CALLS;
    return c->diffs;
}

/* ---- FirstBlockCache ---------------------------------------------------------------------- */

bool df_step_cache_first_block(const df_step_cache *c)
{
    return c && c->cfg.kind == DF_CACHE_FIRST_BLOCK;
}

static void fail(df_ctx *ctx, df_status s)
{
    if (s != DF_OK)
        df_ctx_fail(ctx, s);
}

/* Fails the context; false for the callers that answer "run the blocks?". */
static bool failed(df_ctx *ctx, df_status s)
{
    fail(ctx, s);
    return false;
}

bool df_step_cache_head(df_ctx *ctx, df_step_cache *c, df_tensor *x_in, df_tensor *x_out)
{
    df_tensor *r = df_sub(ctx, x_out, x_in); /* [B, S, D] the first block's residual */
    if (!r)
        return false;
    int64_t n = df_tensor_numel(r);
    if (!c->cur || n != c->n_res) {
        if (c->have_prev)
            return failed(ctx, df_errorf(DF_E_SHAPE,
                                         "first-block cache: the residual has "
                                         "%lld elements, the cached one %lld",
                                         (long long)n, (long long)c->n_res));
        df_free(c->prev), df_free(c->cur);
        c->prev = df_malloc((size_t)n * sizeof *c->prev);
        c->cur = df_malloc((size_t)n * sizeof *c->cur);
        c->n_res = n;
        if (!c->prev || !c->cur)
            return failed(ctx, df_errorf(DF_E_OOM, "out of memory for the first-block cache"));
    }
    df_status s = df_tensor_read(ctx, r, DF_DTYPE_F32, c->cur, (size_t)n * sizeof *c->cur);
    if (s != DF_OK)
        return failed(ctx, s);
    bool run = true;
    if (c->have_prev) {
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            num += fabs((double)c->cur[i] - (double)c->prev[i]);
            den += fabs((double)c->prev[i]);
        }
        double diff = (num / (double)n) / (den / (double)n);
        if (c->call >= 0 && c->call < MAX_CALLS)
            c->diffs[c->call] = diff;
        run = diff > c->cfg.threshold;
    }
    if (run) {
        float *t = c->prev;
        c->prev = c->cur, c->cur = t;
        c->have_prev = true;
    } else {
        c->letter = 'S';
    }
    return run;
}

void df_step_cache_keep_head(df_ctx *ctx, df_step_cache *c, df_tensor *head_out)
{
    df_tensor_free(c->head_out);
    c->head_out = df_tensor_persist(df_contiguous(ctx, head_out));
}

df_tensor *df_step_cache_skip(df_ctx *ctx, df_step_cache *c, df_tensor *head_out)
{
    if (!c->tail_res)
        return df_ctx_fail(ctx, df_errorf(DF_E_ARG, "first-block cache: no cached residual"));
    return df_add(ctx, c->tail_res, head_out);
}

void df_step_cache_tail(df_ctx *ctx, df_step_cache *c, df_tensor *tail_out)
{
    if (!c->head_out) {
        fail(ctx, df_errorf(DF_E_ARG, "first-block cache: the tail ran without the head"));
        return;
    }
    df_tensor *res = df_sub(ctx, tail_out, c->head_out);
    df_tensor_free(c->tail_res);
    c->tail_res = df_tensor_persist(res);
    df_tensor_free(c->head_out);
    c->head_out = NULL;
}

/* ---- MagCache ----------------------------------------------------------------------------- */

bool df_step_cache_mag(const df_step_cache *c)
{
    return c && c->cfg.kind == DF_CACHE_MAG;
}

/* MagCacheBlockHook._advance_step: the state restarts after num_inference_steps calls. */
static void mag_advance(df_step_cache *c)
{
    if (++c->mag_step >= c->cfg.num_inference_steps) {
        c->mag_step = 0;
        c->mag_ratio = 1.0f, c->mag_steps = 0, c->mag_err = 0.0f;
        df_tensor_free(c->mag_res);
        c->mag_res = NULL;
    }
}

df_tensor *df_step_cache_mag_head(df_ctx *ctx, df_step_cache *c, df_tensor *x_in)
{
    c->mag_in = x_in;
    const df_cache_config *k = &c->cfg;
    bool run = true;
    float scale = c->mag_step < k->n_mag_ratios ? k->mag_ratios[c->mag_step] : 1.0f;
    int retention = (int)(k->retention_ratio * k->num_inference_steps + 0.5);
    if (c->mag_step >= retention) {
        c->mag_ratio *= scale;
        c->mag_steps++;
        c->mag_err += fabsf(1.0f - c->mag_ratio);
        if (c->call >= 0 && c->call < MAX_CALLS)
            c->diffs[c->call] = c->mag_err; /* what the threshold is compared with */
        if (c->mag_res && c->mag_err <= (float)k->threshold && c->mag_steps <= k->max_skip_steps) {
            run = false;
        } else {
            c->mag_ratio = 1.0f, c->mag_steps = 0, c->mag_err = 0.0f;
        }
    }
    if (run)
        return NULL;
    c->letter = 'S';
    df_tensor *out = df_add(ctx, x_in, c->mag_res);
    mag_advance(c); /* the tail's hook advances on a skipped call too */
    return out;
}

void df_step_cache_mag_tail(df_ctx *ctx, df_step_cache *c, df_tensor *x_out)
{
    if (!c->mag_in) {
        fail(ctx, df_errorf(DF_E_ARG, "magcache: the tail ran without the head"));
        return;
    }
    df_tensor *res = df_sub(ctx, x_out, c->mag_in); /* the image stream's residual */
    df_tensor_free(c->mag_res);
    c->mag_res = df_tensor_persist(res);
    c->mag_in = NULL;
    mag_advance(c);
}

/* ---- TaylorSeer --------------------------------------------------------------------------- */

static ts_module *module_of(df_ctx *ctx, df_step_cache *c, int module, int n)
{
    if (module < 0 || module >= c->n_mod || n < 1 || n > MAX_OUT) {
        fail(ctx, df_errorf(DF_E_ARG,
                            "taylorseer: %s has no attention module %d with %d "
                            "outputs",
                            c->model, module, n));
        return NULL;
    }
    return &c->mod[module];
}

bool df_step_cache_predict(df_ctx *ctx, df_step_cache *c, int module, df_tensor **out, int n)
{
    if (!c || c->cfg.kind != DF_CACHE_TAYLORSEER || !c->predicting)
        return false;
    for (int i = 0; i < n; i++)
        out[i] = NULL;
    ts_module *m = module_of(ctx, c, module, n);
    if (!m)
        return true;
    if (m->last_update < 0 || m->n_out != n) {
        fail(ctx, df_errorf(DF_E_ARG,
                            "taylorseer: call %d of %s predicts before any call "
                            "computed (disable_cache_before_step=%d)",
                            c->call, c->model, c->cfg.disable_cache_before_step));
        return true;
    }
    double k = c->call - m->last_update, coeff = 1.0;
    for (int i = 0; i < n; i++) {
        df_tensor *y = df_cast(ctx, m->factors[i][0], DF_DTYPE_F32);
        for (int j = 1; j < m->n_factors; j++) {
            coeff = pow(k, j);
            for (int f = 2; f <= j; f++)
                coeff /= f;
            y = df_add(
                ctx, y,
                df_scale(ctx, df_cast(ctx, m->factors[i][j], DF_DTYPE_F32), (float)coeff, 0.0f));
        }
        out[i] = y;
    }
    return true;
}

void df_step_cache_update(df_ctx *ctx, df_step_cache *c, int module, df_tensor *const *out, int n)
{
    if (!c || c->cfg.kind != DF_CACHE_TAYLORSEER)
        return;
    ts_module *m = module_of(ctx, c, module, n);
    if (!m)
        return;
    int delta = c->call - m->last_update, had = m->n_factors;
    for (int i = 0; i < n; i++) {
        df_tensor *chain[MAX_ORDER + 1] = {out[i]};
        int got = 1;
        for (int j = 0; m->last_update >= 0 && j < c->cfg.max_order; j++) {
            if (j >= had)
                break;
            df_tensor *prev = df_cast(ctx, m->factors[i][j], DF_DTYPE_F32);
            chain[j + 1] = df_scale(ctx, df_sub(ctx, chain[j], prev), 1.0f / (float)delta, 0.0f);
            got = j + 2;
        }
        for (int j = 0; j < MAX_ORDER + 1; j++) {
            df_tensor_free(m->factors[i][j]);
            m->factors[i][j] = NULL;
        }
        for (int j = 0; j < got; j++)
            m->factors[i][j] =
                df_tensor_persist(df_cast(ctx, chain[j], c->cfg.taylor_factors_dtype));
        m->n_factors = got;
    }
    m->n_out = n;
    m->last_update = c->call;
}

void df_step_cache_free(df_step_cache *c)
{
    if (!c)
        return;
    df_tensor_free(c->head_out);
    df_tensor_free(c->tail_res);
    df_tensor_free(c->mag_res);
    for (int k = 0; k < c->n_mod; k++)
        for (int i = 0; i < MAX_OUT; i++)
            for (int j = 0; j < MAX_ORDER + 1; j++)
                df_tensor_free(c->mod[k].factors[i][j]);
    df_free(c->mod);
    df_free(c->prev);
    df_free(c->cur);
    df_free(c);
}
