/*
 * Fuzz target: the safetensors header parser and the reads that trust it.
 *
 * The input is taken as a whole file. When it opens, every tensor is looked up, every
 * loadable tensor up to 1 MB is read converted to f32 and to i32 (the checked integer path),
 * and row and column slices are read, so that a header the validator wrongly accepts shows
 * up as an out-of-bounds read under AddressSanitizer.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <diffuse/safetensors.h>

static void exercise(const df_safetensors *st)
{
    for (int64_t i = 0; i < df_safetensors_count(st); i++) {
        df_tensor_info t;
        if (df_safetensors_at(st, i, &t) != DF_OK)
            abort(); /* an index inside the count must be found */
        df_tensor_info again;
        if (df_safetensors_find(st, t.name, &again) != DF_OK || again.offset != t.offset)
            abort();
        if (t.dtype == DF_DTYPE_COUNT || t.numel > (1 << 18))
            continue;
        size_t bytes = (size_t)t.numel * 4;
        void *buf = malloc(bytes ? bytes : 1);
        if (!buf)
            continue;
        df_safetensors_read(st, t.name, DF_DTYPE_F32, buf, bytes);
        df_safetensors_read(st, t.name, DF_DTYPE_I32, buf, bytes);
        if (t.ndim >= 1 && t.shape[0] > 0)
            df_safetensors_read_rows(st, t.name, t.shape[0] - 1, t.shape[0], DF_DTYPE_BF16, buf,
                                     bytes);
        if (t.ndim == 2 && t.shape[1] > 1)
            df_safetensors_read_cols(st, t.name, 1, t.shape[1], DF_DTYPE_F32, buf, bytes);
        free(buf);
    }
    for (int64_t i = 0; i < df_safetensors_metadata_count(st); i++) {
        const char *k, *v;
        df_safetensors_metadata_at(st, i, &k, &v);
        if (!k || !v || df_safetensors_metadata(st, k) == NULL)
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    df_safetensors *st;
    if (df_safetensors_open_memory(data, size, "fuzz.safetensors", &st) == DF_OK) {
        exercise(st);
        df_safetensors_free(st);
    }
    return 0;
}

#ifdef DF_FUZZ_REPLAY
#include "fuzz_replay.h"
#endif
