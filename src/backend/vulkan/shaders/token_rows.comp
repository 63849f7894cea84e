#version 450
/* For each row b of ids [B, S]: b * S + the first position holding `token`, or of the
 * row's first largest id when token < 0 (0 when none), as i64. One invocation per row:
 * rows are short (77 tokens for CLIP). */
#include "common.glsl"

layout(local_size_x = 64) in;

layout(buffer_reference, std430, buffer_reference_align = 8) buffer Params {
    uint64_t ids, o;
    int64_t ids_dtype, rows, len, token;
};

void main()
{
    Params p = Params(pc.params);
    int64_t b = int64_t(gl_GlobalInvocationID.x);
    if (b >= p.rows)
        return;
    int64_t at = 0, best = 0;
    for (int64_t j = 0; j < p.len; j++) {
        int64_t id = load_i(p.ids, int(p.ids_dtype), b * p.len + j);
        if (p.token >= 0 && id == p.token) {
            at = j;
            break;
        }
        if (p.token < 0 && (j == 0 || id > best)) {
            at = j;
            best = id;
        }
    }
    I64s(p.o + uint64_t(b) * 8ul).v[0] = b * p.len + at;
}
