/*
 * Step caches: diffusers' transformer caches that skip or predict work between denoising
 * steps (`pipe.transformer.enable_cache(config)`), with the configs' own field names and
 * defaults. docs/step-cache.md says what each one decides, step by step.
 *
 * - FirstBlockCacheConfig(threshold): after the first block, the change of its residual
 *   against the last computed step, mean|r - r_prev| / mean|r_prev|, above `threshold`
 *   runs the remaining blocks; otherwise their cached residual is added and they are
 *   skipped (step 'S').
 * - TaylorSeerCacheConfig(cache_interval, disable_cache_before_step,
 *   disable_cache_after_step, max_order, taylor_factors_dtype): every attention module's
 *   output is either computed (and its Taylor factors updated) or predicted from them
 *   (step 'P'), on a fixed schedule.
 *
 * - MagCacheConfig(threshold, max_skip_steps, retention_ratio, num_inference_steps,
 *   mag_ratios): before the first block, the accumulated error of the per-step magnitude
 *   ratios decides whether every block is skipped (step 'S'), adding the residual of the
 *   last computed step to the image stream.
 *
 * A run with a cache reports its per-step trace in df_gen_output.cache_trace: 'C' computed,
 * 'S' skipped, 'P' predicted.
 */
#ifndef DIFFUSE_STEP_CACHE_H
#define DIFFUSE_STEP_CACHE_H

#include <stdbool.h>
#include <stddef.h>

#include "dtype.h"
#include "status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum df_cache_kind {
    DF_CACHE_NONE = 0,
    DF_CACHE_FIRST_BLOCK, /* FirstBlockCacheConfig */
    DF_CACHE_TAYLORSEER,  /* TaylorSeerCacheConfig */
    DF_CACHE_MAG,         /* MagCacheConfig */
} df_cache_kind;

#define DF_CACHE_MAX_MAG_RATIOS 1000

typedef struct df_cache_config {
    df_cache_kind kind;
    /* FirstBlockCacheConfig, MagCacheConfig */
    double threshold; /* 0.05; MagCache 0.06 */
    /* TaylorSeerCacheConfig */
    int cache_interval;            /* 5 */
    int disable_cache_before_step; /* 3 */
    int disable_cache_after_step;  /* -1: None */
    int max_order;                 /* 1 */
    df_dtype taylor_factors_dtype; /* DF_DTYPE_BF16 (torch.bfloat16) or DF_DTYPE_F32 */
    /* MagCacheConfig */
    int max_skip_steps;      /* 3 */
    double retention_ratio;  /* 0.2 */
    int num_inference_steps; /* 28 */
    int n_mag_ratios;        /* required (diffusers has no default either) */
    float mag_ratios[DF_CACHE_MAX_MAG_RATIOS];
} df_cache_config;

/* The config of `kind` with diffusers' defaults. */
DF_API df_cache_config df_cache_config_default(df_cache_kind kind);

/* Parses "first-block[:threshold=X]", "taylorseer[:key=value,...]" (keys: cache_interval,
 * disable_cache_before_step, disable_cache_after_step (a step or None), max_order,
 * taylor_factors_dtype (bfloat16 or float32)) or "magcache:mag_ratios=R[,key=value...]"
 * (keys: threshold, max_skip_steps, retention_ratio, num_inference_steps; R is "flux",
 * diffusers' FLUX_MAG_RATIOS, or numbers separated by '/'; interpolated to
 * num_inference_steps as diffusers does); "none" turns caching off. Unset keys keep their
 * defaults. DF_E_ARG naming the cache, key or value it cannot take. */
DF_API df_status df_cache_config_parse(const char *spec, df_cache_config *out);

/* The config as the spec above ("taylorseer:cache_interval=5,..."), all keys written. */
DF_API void df_cache_config_format(const df_cache_config *c, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
