/*
 * Test helper: reads one tensor of a golden case's case.safetensors as float64.
 *
 * A deliberately small reader (8-byte header length, JSON header, raw little-endian data)
 * so that the rng and scheduler tests do not depend on the library's safetensors loader.
 * Handles F64 and F32 tensors only; anything unexpected returns NULL.
 */
#ifndef DF_TESTS_GOLDEN_TENSORS_H
#define DF_TESTS_GOLDEN_TENSORS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <diffuse/json.h>

/* Returns a malloc'd array of the tensor's values (free()), its element count in *n;
 * NULL if the case, the file or the tensor is missing. */
static inline double *golden_read_f64(const char *case_name, const char *tensor, int64_t *n)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/case.safetensors", DF_GOLDEN_DIR, case_name);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    double *vals = NULL;
    char *header = NULL;
    df_json *root = NULL;
    uint8_t len_bytes[8];
    if (fread(len_bytes, 1, 8, f) != 8)
        goto done;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | len_bytes[i];
    if (hlen > (1u << 24))
        goto done;
    header = calloc(1, hlen + 1);
    if (!header || fread(header, 1, hlen, f) != hlen)
        goto done;
    if (df_json_parse_string(header, hlen, path, &root) != DF_OK)
        goto done;
    const df_json *t = df_json_get(root, tensor);
    const char *dtype = df_json_string(df_json_get(t, "dtype"));
    const df_json *offs = df_json_get(t, "data_offsets");
    if (!dtype || df_json_array_size(offs) != 2)
        goto done;
    long begin = (long)df_json_number(df_json_array_get(offs, 0));
    long end = (long)df_json_number(df_json_array_get(offs, 1));
    int f64 = strcmp(dtype, "F64") == 0;
    int esize = f64 ? 8 : 4;
    if ((!f64 && strcmp(dtype, "F32") != 0) || end < begin || (end - begin) % esize != 0)
        goto done;
    int64_t count = (end - begin) / esize;
    uint8_t *raw = malloc((size_t)(end - begin) + 1);
    vals = malloc((size_t)count * sizeof *vals + 1);
    if (raw && vals && fseek(f, (long)(8 + hlen) + begin, SEEK_SET) == 0 &&
        fread(raw, 1, (size_t)(end - begin), f) == (size_t)(end - begin)) {
        for (int64_t i = 0; i < count; i++) {
            if (f64) {
                memcpy(&vals[i], raw + 8 * i, 8);
            } else {
                float x;
                memcpy(&x, raw + 4 * i, 4);
                vals[i] = x;
            }
        }
        *n = count;
    } else {
        free(vals);
        vals = NULL;
    }
    free(raw);
done:
    df_json_free(root);
    free(header);
    fclose(f);
    return vals;
}

#endif
