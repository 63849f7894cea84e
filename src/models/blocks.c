/*
 * Repeated blocks: compiled per class, and offloaded one at a time (blocks.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "models/blocks.h"
#include "runtime/lazy.h"
#include "runtime/runtime.h" /* df_ctx_fail: a failed block fails the context like an op */

void df_blocks_init(df_blocks *b, void *model, df_weight_set *ws, const char *const *outer,
                    int n_outer)
{
    *b = (df_blocks){.ws = ws, .model = model, .outer = outer, .n_outer = n_outer, .ahead = -1};
}

void df_blocks_deinit(df_blocks *b)
{
    for (int k = 0; k < b->n_classes; k++)
        df_compiled_free(b->compiled[k]);
    for (int g = 0; g < b->n; g++)
        df_free(b->block[g].w);
    df_free(b->block);
    *b = (df_blocks){.ahead = -1};
}

df_status df_blocks_add(df_blocks *b, const df_block_class *cls, int index, const char *fmt, ...)
{
    if (b->n == b->cap) {
        int cap = b->cap ? 2 * b->cap : 64;
        df_block *grown = df_realloc(b->block, (size_t)cap * sizeof *grown);
        if (!grown)
            return df_errorf(DF_E_OOM, "out of memory listing the %s blocks", cls->name);
        b->block = grown;
        b->cap = cap;
    }
    df_block *blk = &b->block[b->n];
    *blk = (df_block){.cls = cls, .index = index};
    va_list ap;
    va_start(ap, fmt);
    int len = vsnprintf(blk->prefix, sizeof blk->prefix - 1, fmt, ap);
    va_end(ap);
    DF_ASSERT(len > 0 && len < (int)sizeof blk->prefix - 1);
    blk->prefix[len] = '.', blk->prefix[len + 1] = '\0'; /* "blocks.1." is not "blocks.10." */
    b->n++;
    return DF_OK;
}

/* ---- compiled repeated blocks ------------------------------------------------------------ */

static df_status module_forward(df_ctx *ctx, void *self, df_tensor *const *in, df_tensor **out)
{
    const df_block *blk = self;
    return blk->cls->forward(ctx, blk->owner->model, blk->index, in, out);
}

static int module_weights(void *self, df_tensor **out)
{
    const df_block *blk = self;
    memcpy(out, blk->w, (size_t)blk->n_w * sizeof *out);
    return blk->n_w;
}

static int class_of(const df_blocks *b, const df_block_class *cls)
{
    for (int k = 0; k < b->n_classes; k++)
        if (b->classes[k] == cls)
            return k;
    return -1;
}

/* Block g's weights, collected from the weight set by its prefix. */
static df_status collect(df_blocks *b, int g)
{
    df_block *blk = &b->block[g];
    int n = df_ws_collect(b->ws, blk->prefix, NULL, 0);
    if (n > DF_MODULE_MAX_WEIGHTS)
        return df_errorf(DF_E_UNSUPPORTED, "compiling %s: block '%s' has %d weights; a compiled "
                         "module takes at most %d", blk->cls->name, blk->prefix, n,
                         DF_MODULE_MAX_WEIGHTS);
    blk->w = df_calloc(n ? (size_t)n : 1, sizeof *blk->w);
    if (!blk->w)
        return df_errorf(DF_E_OOM, "out of memory compiling %s", blk->cls->name);
    blk->n_w = df_ws_collect(b->ws, blk->prefix, blk->w, n);
    return DF_OK;
}

df_status df_blocks_compile(df_blocks *b, const df_compile_opts *opts)
{
    if (b->n_classes)
        return DF_OK;
    df_status s = DF_OK;
    for (int g = 0; g < b->n && s == DF_OK; g++) {
        df_block *blk = &b->block[g];
        blk->owner = b;
        s = collect(b, g);
        if (s != DF_OK || class_of(b, blk->cls) >= 0)
            continue;
        if (b->n_classes == DF_BLOCKS_MAX_CLASSES) {
            s = df_errorf(DF_E_UNSUPPORTED, "compiling %s: more than %d block classes",
                          blk->cls->name, DF_BLOCKS_MAX_CLASSES);
            break;
        }
        df_module m = {.name = blk->cls->name, .n_in = blk->cls->n_in,
                       .n_out = blk->cls->n_out, .forward = module_forward,
                       .weights = module_weights};
        s = df_compile(&m, opts, &b->compiled[b->n_classes]);
        if (s == DF_OK)
            b->classes[b->n_classes++] = blk->cls;
    }
    if (s != DF_OK) {
        for (int k = 0; k < b->n_classes; k++) {
            df_compiled_free(b->compiled[k]);
            b->compiled[k] = NULL;
        }
        b->n_classes = 0;
        for (int g = 0; g < b->n; g++) {
            df_free(b->block[g].w);
            b->block[g].w = NULL;
            b->block[g].n_w = 0;
        }
    }
    return s;
}

bool df_blocks_compiled(const df_blocks *b)
{
    return b->n_classes > 0;
}

int df_blocks_programs(const df_blocks *b)
{
    int n = 0;
    for (int k = 0; k < b->n_classes; k++)
        n += df_compiled_programs(b->compiled[k]);
    return n;
}

/* ---- sequential offload ------------------------------------------------------------------ */

df_status df_blocks_set_sequential(df_blocks *b, bool on)
{
    b->sequential = on;
    b->ahead = -1;
    /* Released now, each block acquired and released again by every forward: the runtime's
     * residency layer uses such weights in place rather than packing them every step. */
    if (on)
        return df_ws_release(b->ws, NULL); /* each forward acquires what it runs */
    df_ws_acquire(b->ws, NULL);
    return DF_OK;
}

static void fail(df_ctx *ctx, df_status s)
{
    if (s != DF_OK)
        df_ctx_fail(ctx, s);
}

void df_blocks_begin(df_ctx *ctx, df_blocks *b)
{
    (void)ctx;
    b->ahead = -1;
    for (int i = 0; b->sequential && i < b->n_outer; i++)
        df_ws_acquire(b->ws, b->outer[i]);
}

void df_blocks_end(df_ctx *ctx, df_blocks *b)
{
    for (int i = 0; b->sequential && i < b->n_outer; i++)
        fail(ctx, df_ws_release(b->ws, b->outer[i]));
}

/* Before block g: g resident (already, when it was read ahead) and g+1 read ahead while g
 * runs. */
static void offload_before(df_blocks *b, int g)
{
    if (!b->sequential)
        return;
    if (b->ahead != g)
        df_ws_acquire(b->ws, b->block[g].prefix);
    b->ahead = -1;
    if (g + 1 < b->n) {
        df_ws_acquire(b->ws, b->block[g + 1].prefix);
        b->ahead = g + 1;
    }
}

/* After block g's ops are queued: its weights leave once they have run. */
static void offload_after(df_ctx *ctx, df_blocks *b, int g)
{
    if (b->sequential)
        fail(ctx, df_ws_release(b->ws, b->block[g].prefix));
}

void df_blocks_run(df_ctx *ctx, df_blocks *b, int g, df_scope mark, df_tensor *const *in,
                   df_tensor **out)
{
    DF_ASSERT(g >= 0 && g < b->n);
    df_block *blk = &b->block[g];
    for (int j = 0; j < blk->cls->n_out; j++)
        out[j] = NULL;
    offload_before(b, g);
    int k = class_of(b, blk->cls);
    df_status s = k >= 0 ? df_compiled_call(ctx, b->compiled[k], blk, in, out)
                         : blk->cls->forward(ctx, b->model, blk->index, in, out);
    if (s != DF_OK) {
        fail(ctx, s);
        for (int j = 0; j < blk->cls->n_out; j++)
            out[j] = NULL;
    }
    /* In defer-and-fuse mode every block ends its graph, once the caller's block scope has
     * ended (so only the block's outputs are held), whatever the offload level: releasing a
     * block's weights must flush the pending graph, and if that were the only cut, plans
     * with and without offload would differ (what is held at a cut is kept, in f32 rather
     * than as bf16 operands; fusions across blocks round otherwise), and so would the
     * image. Every block of a class then plans the same graph: one cached program. */
    df_scope_end_n(ctx, mark, out, blk->cls->n_out);
    fail(ctx, df_lazy_cut(ctx));
    offload_after(ctx, b, g);
}

void df_blocks_skip_rest(df_ctx *ctx, df_blocks *b)
{
    if (b->sequential && b->ahead >= 0)
        fail(ctx, df_ws_release(b->ws, b->block[b->ahead].prefix));
    b->ahead = -1;
}

/* ---- depth ------------------------------------------------------------------------------- */

/* The config's depth `n` of blocks named `prefix`.<i>.<probe> must be what the checkpoint
 * holds: block n-1 present, block n absent. */
df_status df_blocks_check_depth(df_weight_set *ws, const char *dir, const char *key, int64_t n,
                                const char *prefix, const char *probe)
{
    if (n > 0 && !df_ws_has(ws, "%s.%lld.%s", prefix, (long long)(n - 1), probe)) {
        int have = 0;
        while (have < n && df_ws_has(ws, "%s.%d.%s", prefix, have, probe))
            have++;
        return df_errorf(DF_E_FORMAT,
                         "%s/config.json: key '%s' is %lld but the weights hold "
                         "%d such blocks (no tensor '%s.%d.%s')",
                         dir, key, (long long)n, have, prefix, have, probe);
    }
    if (df_ws_has(ws, "%s.%lld.%s", prefix, (long long)n, probe))
        return df_errorf(DF_E_FORMAT,
                         "%s/config.json: key '%s' is %lld but the weights hold "
                         "more blocks (tensor '%s.%lld.%s')",
                         dir, key, (long long)n, prefix, (long long)n, probe);
    return DF_OK;
}
