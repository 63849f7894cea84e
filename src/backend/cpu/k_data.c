/*
 * Data movement: nearest 2x upsampling, concatenation, row gathering (embeddings).
 *
 * upsample: each input row of W becomes an output row of 2W (every value twice), written
 * to two output rows; rows spread over threads. concat: two strided copies
 * (df_cpu_copy_view) into the two parts of the dense output, so any layout and dtype of a
 * and b works in one pass. gather: every id is checked against the table size first, on
 * the stream thread, so a bad id is a DF_E_ARG naming the id (never a read out of bounds);
 * then each row is converted to f32 (or copied when the table is f32). token_rows: one
 * pass over each (short) row of ids, on the stream thread.
 */
#include <inttypes.h>
#include <string.h>

#include "backend/cpu/cpu_kernels.h"
#include "backend/cpu/k_common.h"
#include "core/status.h"

DF_CPU_KERNEL(upsample2x)
{
    const df_view *x = &n->in[0];
    int64_t W = x->shape[3], rows = x->shape[0] * x->shape[1] * x->shape[2];
    const char *src = df_view_ptr(x);
    size_t es = df_dtype_size(x->dtype);
    float *out = df_view_ptr(&n->out);
    int nt = rows > 1 && rows * W * 4 >= DF_CPU_PAR_MIN ? df_cpu_threads(env) : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t r = 0; r < rows; r++) {
        float *restrict top = out + r * 4 * W, *bottom = top + 2 * W;
        const float *xr = (const float *)(src + r * W * (int64_t)es);
        if (x->dtype != DF_DTYPE_F32) { /* widen into the bottom row, which is written last */
            df_cpu_load_f32(src + r * W * (int64_t)es, x->dtype, 1, bottom, W);
            xr = bottom;
        }
        for (int64_t i = 0; i < W; i++) {
            float v = xr[i];
            top[2 * i] = v;
            top[2 * i + 1] = v;
        }
        memcpy(bottom, top, (size_t)(2 * W) * sizeof(float));
    }
    return DF_OK;
}

DF_CPU_KERNEL(concat)
{
    const df_view *a = &n->in[0], *b = &n->in[1], *out = &n->out;
    int d = (int)n->a.axis;
    df_view part = *out; /* the output's strides over a's shape, then over b's */
    memcpy(part.shape, a->shape, sizeof part.shape);
    df_cpu_copy_view(&part, a, df_cpu_threads(env));
    memcpy(part.shape, b->shape, sizeof part.shape);
    part.offset = out->offset + (uint64_t)(a->shape[d] * out->stride[d]) * df_dtype_size(out->dtype);
    df_cpu_copy_view(&part, b, df_cpu_threads(env));
    return DF_OK;
}

DF_CPU_KERNEL(gather)
{
    const df_view *table = &n->in[0], *ids = &n->in[1];
    int64_t V = table->shape[0], D = table->shape[1], count = df_view_numel(ids);
    const void *idp = df_view_ptr(ids);
    bool wide = ids->dtype == DF_DTYPE_I64;
    for (int64_t i = 0; i < count; i++) {
        int64_t id = wide ? ((const int64_t *)idp)[i] : ((const int32_t *)idp)[i];
        if (id < 0 || id >= V)
            return df_errorf(DF_E_ARG,
                             "gather: id %" PRId64 " at position %" PRId64
                             " is outside the table of %" PRId64 " rows",
                             id, i, V);
    }
    const char *tab = df_view_ptr(table);
    size_t es = df_dtype_size(table->dtype);
    float *out = df_view_ptr(&n->out);
    int nt = count > 1 && count * D >= DF_CPU_PAR_MIN ? df_cpu_threads(env) : 1;
    #pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (int64_t i = 0; i < count; i++) {
        int64_t id = wide ? ((const int64_t *)idp)[i] : ((const int32_t *)idp)[i];
        df_cpu_load_f32(tab + id * D * (int64_t)es, table->dtype, 1, out + i * D, D);
    }
    return DF_OK;
}

DF_CPU_KERNEL(token_rows)
{
    (void)env;
    const df_view *ids = &n->in[0];
    int64_t B = ids->shape[0], S = ids->shape[1], token = n->a.token;
    const void *idp = df_view_ptr(ids);
    bool wide = ids->dtype == DF_DTYPE_I64;
    int64_t *out = df_view_ptr(&n->out);
    for (int64_t b = 0; b < B; b++) {
        int64_t at = 0, best = 0;
        for (int64_t j = 0; j < S; j++) {
            int64_t id =
                wide ? ((const int64_t *)idp)[b * S + j] : ((const int32_t *)idp)[b * S + j];
            if (token >= 0 && id == token) {
                at = j;
                break;
            }
            if (token < 0 && (j == 0 || id > best))
                at = j, best = id;
        }
        out[b] = b * S + at;
    }
    return DF_OK;
}
