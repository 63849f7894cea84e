/*
 * Golden kind "rng": torch.randn / diffusers' randn_tensor from a seeded CPU generator.
 *
 * args.sizes lists the shapes drawn in order from ONE generator (args.generator, {"seed":
 * s}); output sample_i is the i-th draw. A list of generators (randn_tensor's batch form)
 * draws row b of every shape from generator b. args.dtype picks the float32 or the native
 * bfloat16 stream ("float32", "bfloat16", with or without "torch."). The execution mode
 * does not matter here: the numbers come from the host generator.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

#define MAX_GENERATORS 64

static int read_generators(check_case *c, const df_json *g, df_rng *rngs, int *n)
{
    bool list = df_json_type_of(g) == DF_JSON_ARRAY;
    *n = list ? (int)df_json_array_size(g) : 1;
    if (*n < 1 || *n > MAX_GENERATORS)
        return check_fail(c, "args.generator: expected 1 to %d generators", MAX_GENERATORS);
    for (int i = 0; i < *n; i++) {
        uint64_t seed;
        if (check_read_seed(c, list ? df_json_array_get(g, i) : g, &seed) != 0)
            return 1;
        df_rng_init(&rngs[i], seed);
    }
    return 0;
}

/* Draws `numel` values of `dtype` from one generator into out (as float). */
static df_status draw(df_rng *rng, df_dtype dtype, float *out, int64_t numel)
{
    if (dtype == DF_DTYPE_F32)
        return df_rng_randn_f32(rng, out, numel);
    uint16_t *h = malloc((size_t)(numel ? numel : 1) * sizeof *h);
    if (!h)
        return DF_E_OOM;
    df_status st = df_rng_randn_bf16(rng, h, numel);
    for (int64_t i = 0; st == DF_OK && i < numel; i++)
        out[i] = df_bf16_to_f32(h[i]);
    free(h);
    return st;
}

int check_kind_rng(check_case *c)
{
    const df_json *sizes, *gen;
    const char *dtype_name;
    if (df_json_get_array(c->args, "sizes", &sizes) != DF_OK ||
        df_json_get_string_or(c->args, "dtype", "float32", &dtype_name) != DF_OK)
        return check_fail(c, "%s", df_error_message());
    gen = df_json_get(c->args, "generator");
    if (!gen)
        return check_fail(c, "args.generator is missing");

    if (strncmp(dtype_name, "torch.", 6) == 0)
        dtype_name += 6;
    df_dtype dtype;
    if (!df_dtype_parse(dtype_name, &dtype) || (dtype != DF_DTYPE_F32 && dtype != DF_DTYPE_BF16))
        return check_fail(c, "args.dtype '%s': only float32 and bfloat16 are drawn", dtype_name);

    df_rng rngs[MAX_GENERATORS];
    int n_gen;
    if (read_generators(c, gen, rngs, &n_gen) != 0)
        return 1;

    int failures = 0;
    for (int64_t k = 0; k < df_json_array_size(sizes); k++) {
        const df_json *s = df_json_array_get(sizes, k);
        int64_t shape[8], ndim = df_json_array_size(s);
        if (df_json_type_of(s) != DF_JSON_ARRAY || ndim > 8)
            return check_fail(c, "args.sizes[%lld]: expected a shape of at most 8 dimensions",
                              (long long)k);
        for (int64_t d = 0; d < ndim; d++) {
            if (df_json_to_int(df_json_array_get(s, d), &shape[d]) != DF_OK || shape[d] < 0 ||
                shape[d] > ((int64_t)1 << 31))
                return check_fail(c, "args.sizes[%lld][%lld]: expected a dimension", (long long)k,
                                  (long long)d);
        }
        int64_t numel = 1;
        for (int64_t d = 0; d < ndim; d++) {
            if (__builtin_mul_overflow(numel, shape[d], &numel) || numel > ((int64_t)1 << 32))
                return check_fail(c, "args.sizes[%lld]: too many elements", (long long)k);
        }
        if (n_gen > 1 && (ndim == 0 || shape[0] != n_gen))
            return check_fail(c, "args.sizes[%lld]: %d generators need a batch of %d", (long long)k,
                              n_gen, n_gen);
        float *got = malloc((size_t)(numel ? numel : 1) * sizeof *got);
        if (!got)
            return check_fail(c, "out of memory for %lld values", (long long)numel);
        int64_t row = numel / n_gen;
        for (int b = 0; b < n_gen; b++) {
            df_status st = draw(&rngs[b], dtype, got + b * row, row);
            if (st != DF_OK) {
                free(got);
                return check_fail(c, "drawing sample_%lld: %s", (long long)k, df_error_message());
            }
        }
        char name[32];
        snprintf(name, sizeof name, "sample_%lld", (long long)k);
        failures += check_compare_f32(c, name, got, numel);
        free(got);
    }
    return failures ? 1 : 0;
}
