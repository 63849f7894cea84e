/*
 * The shaders' vocabulary against the C one. Usage: test_vk_vocab VOCAB_GLSL SHADER_DIR.
 *  - every constant of the generated vocab.glsl (DT_, OP_, FI_, ACT_) equals its C twin,
 *    and every C constant is there;
 *  - no shader or shader header defines a name with one of those prefixes (or CAP_) by
 *    hand: they include vocab.glsl instead;
 *  - common.glsl's unary_f has a branch for every unary op that fused programs run;
 *  - the backend's supports table (dvk_op_supported) runs every op but ALL_REDUCE.
 * Prints each check and fails (exit 1) on the first list of mismatches.
 */
#include <dirent.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/vulkan/vk_internal.h"

static int failures;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FAIL ");                                                                       \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s)
        s[n] = '\0';
    fclose(f);
    return s;
}

/* The value vocab.glsl gives `name`, or -999999 when it does not define it. */
static long glsl_value(const char *text, const char *name)
{
    char key[96];
    snprintf(key, sizeof key, "#define %s ", name);
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -999999;
}

static void check_value(const char *text, const char *name, long want)
{
    long got = glsl_value(text, name);
    CHECK(got == want, "vocab.glsl %s is %ld, the C value is %ld", name, got, want);
}

static void check_constants(const char *vocab)
{
    static const char *const dt[] = {"F32", "BF16", "F16", "F64", "I32", "I64", "U8", "I8"};
    _Static_assert(sizeof dt / sizeof *dt == DF_DTYPE_COUNT, "a dtype is missing here");
    for (int t = 0; t < DF_DTYPE_COUNT; t++) {
        char name[32];
        snprintf(name, sizeof name, "DT_%s", dt[t]);
        check_value(vocab, name, t);
    }
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs)                                         \
    check_value(vocab, "OP_" #name, DF_OP_##name);                                                 \
    DF_IF_##epi(check_value(vocab, "ACT_" #name, DF_ACT_##name);)
#include "backend/ops.def"
#undef DF_OP
    check_value(vocab, "OP_COUNT", DF_OP_COUNT);
    check_value(vocab, "FI_LOAD", DF_FI_LOAD);
    check_value(vocab, "FI_HEAD", DF_FI_HEAD);
    check_value(vocab, "ACT_NONE", DF_ACT_NONE);
    printf("ok   vocab.glsl: %d ops, %d activations, %d dtypes\n", DF_OP_COUNT, DF_ACT_COUNT - 1,
           DF_DTYPE_COUNT);
}

static void check_no_hand_numbers(const char *dir)
{
    regex_t re;
    if (regcomp(&re, "^[ \t]*#[ \t]*define[ \t]+(OP|FI|ACT|DT|CAP)_[A-Za-z0-9_]*",
                REG_EXTENDED | REG_NEWLINE) != 0) {
        CHECK(0, "regcomp");
        return;
    }
    DIR *d = opendir(dir);
    CHECK(d != NULL, "cannot open %s", dir);
    int files = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (!(n > 5 &&
              (strcmp(e->d_name + n - 5, ".comp") == 0 || strcmp(e->d_name + n - 5, ".glsl") == 0)))
            continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        char *text = slurp(path);
        CHECK(text != NULL, "cannot read %s", path);
        regmatch_t m;
        if (text && regexec(&re, text, 1, &m, 0) == 0)
            CHECK(0, "%s defines %.*s by hand: take it from vocab.glsl", e->d_name,
                  (int)(m.rm_eo - m.rm_so), text + m.rm_so);
        free(text);
        files++;
    }
    if (d)
        closedir(d);
    regfree(&re);
    CHECK(files >= 10, "only %d shader files found in %s", files, dir);
    printf("ok   %d shader files define no DT_/OP_/FI_/ACT_/CAP_ name by hand\n", files);
}

static void check_unary_branches(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/common.glsl", dir);
    char *text = slurp(path);
    CHECK(text != NULL, "cannot read %s", path);
    if (!text)
        return;
    const char *body = strstr(text, "float unary_f(");
    CHECK(body != NULL, "common.glsl has no unary_f");
    for (int op = 0; body && op < DF_OP_COUNT; op++) {
        bool plain = op == DF_OP_COPY || op == DF_OP_ADD || op == DF_OP_SUB || op == DF_OP_MUL ||
                     op == DF_OP_DIV;
        if (!df_vocab_op_fuses((df_op)op) || plain)
            continue;
        char want[64];
        const char *names[] = {
#define DF_OP(name, printed, n_in, kind, fuse, epi, attrs) #name,
#include "backend/ops.def"
#undef DF_OP
        };
        snprintf(want, sizeof want, "op == OP_%s)", names[op]);
        CHECK(strstr(body, want) != NULL, "common.glsl unary_f has no branch '%s'", want);
    }
    free(text);
    printf("ok   unary_f computes every unary op marked fuse\n");
}

static void check_supports(void)
{
    for (int op = 0; op < DF_OP_COUNT; op++)
        CHECK(dvk_op_supported((df_op)op) == (op != DF_OP_ALL_REDUCE), "vulkan supports %s: %d",
              dvk_op_name((df_op)op), dvk_op_supported((df_op)op));
    CHECK(!dvk_op_supported(DF_OP_COUNT), "vulkan claims an op past the vocabulary");
    printf("ok   the vulkan table runs every op but all_reduce\n");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: test_vk_vocab VOCAB_GLSL SHADER_DIR\n");
        return 2;
    }
    char *vocab = slurp(argv[1]);
    if (!vocab) {
        printf("FAIL cannot read %s\n", argv[1]);
        return 1;
    }
    check_constants(vocab);
    free(vocab);
    check_no_hand_numbers(argv[2]);
    check_unary_branches(argv[2]);
    check_supports();
    printf("%d failures\n", failures);
    return failures ? 1 : 0;
}
