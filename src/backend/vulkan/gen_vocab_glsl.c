/*
 * Writes vocab.glsl, the device vocabulary for the shaders: the dtype, op, fused-opcode and
 * activation numbers, each from its C twin (<diffuse/dtype.h>, backend/ops.def through
 * device.h), so a shader never numbers them by hand. Run at build time:
 * gen_vocab_glsl OUT_FILE. tests/vulkan/test_vk_vocab.c checks the result against the C.
 */
#include <stdio.h>

#include "backend/device.h"

static const struct {
    df_dtype t;
    const char *name;
} dtypes[] = {
    {DF_DTYPE_F32, "F32"}, {DF_DTYPE_BF16, "BF16"}, {DF_DTYPE_F16, "F16"}, {DF_DTYPE_F64, "F64"},
    {DF_DTYPE_I32, "I32"}, {DF_DTYPE_I64, "I64"},   {DF_DTYPE_U8, "U8"},   {DF_DTYPE_I8, "I8"},
};
_Static_assert(sizeof dtypes / sizeof *dtypes == DF_DTYPE_COUNT, "a dtype without a DT_ name");

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: gen_vocab_glsl OUT_FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fprintf(f, "/* The device vocabulary (generated from backend/ops.def and <diffuse/dtype.h> by "
               "gen_vocab_glsl.c; do not edit). */\n");
    for (size_t i = 0; i < sizeof dtypes / sizeof *dtypes; i++)
        fprintf(f, "#define DT_%s %d\n", dtypes[i].name, (int)dtypes[i].t);
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                         \
    fprintf(f, "#define OP_%s %d\n", #name, (int)DF_OP_##name);
#include "backend/ops.def"
#undef DF_OP
    fprintf(f, "#define OP_COUNT %d\n", (int)DF_OP_COUNT);
    fprintf(f, "#define FI_LOAD %d\n#define FI_HEAD %d\n", DF_FI_LOAD, DF_FI_HEAD);
    fprintf(f, "#define ACT_NONE %d\n", (int)DF_ACT_NONE);
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                         \
    DF_IF_##epi(fprintf(f, "#define ACT_%s %d\n", #name, (int)DF_ACT_##name);)
#include "backend/ops.def"
#undef DF_OP
    fprintf(f, "\n/* The op an epilogue activation computes, or -1. */\nint act_op(int act)\n{\n");
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                         \
    DF_IF_##epi(fprintf(f, "    if (act == ACT_%s)\n        return OP_%s;\n", #name, #name);)
#include "backend/ops.def"
#undef DF_OP
    fprintf(f, "    return -1;\n}\n");
    if (fclose(f) != 0) {
        perror(argv[1]);
        return 1;
    }
    return 0;
}
