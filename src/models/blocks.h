/*
 * Repeated blocks: what diffusers drives from a model's `_repeated_blocks`, written once for
 * every transformer (FLUX.1, SD3, FLUX.2).
 *
 * A model lists its repeated blocks in the order its forward runs them, each with its class
 * (a df_block_class: the forward of one block, its inputs and outputs) and the prefix of its
 * weights' names ("transformer_blocks.3."). From that list alone come two features:
 *
 * - Compiled repeated blocks (df_blocks_compile): one compiled program per block class and
 *   input signature, with the block's weights as arguments, so the compile cost does not
 *   grow with depth. A block's weights are every tensor the weight set bound under its
 *   prefix, in binding order (the same for every block of a class, as the same code binds
 *   them), so no model writes its weight list by hand.
 * - Sequential offload (df_blocks_set_sequential): each block's weights are resident only
 *   while it runs (the next block's pages are read ahead meanwhile); the weights outside
 *   the blocks (the model's `outer` prefixes) only during a forward.
 *
 * The forward calls df_blocks_begin, then df_blocks_run for each block in order, then
 * df_blocks_end. Failures, including a compiled call's, fail the context with their message
 * like any op.
 */
#ifndef DF_MODELS_BLOCKS_H
#define DF_MODELS_BLOCKS_H

#include <stdbool.h>

#include <diffuse/compile.h>

#include "models/loader.h"

/* One class of repeated blocks (a variant with other weights or outputs is its own class). */
typedef struct df_block_class {
    const char *name; /* diffusers' class name: "FluxTransformerBlock" */
    int n_in, n_out;
    /* Block `index` (its number among the model's blocks of this kind) of `model`: reads
     * in[0..n_in), writes out[0..n_out). Returns the context's status. */
    df_status (*forward)(df_ctx *ctx, void *model, int index, df_tensor *const *in,
                         df_tensor **out);
} df_block_class;

#define DF_BLOCK_PREFIX_MAX 64

/* One block of the model, as a compiled module's instance. */
typedef struct df_block {
    struct df_blocks *owner;
    const df_block_class *cls;
    int index;
    char prefix[DF_BLOCK_PREFIX_MAX]; /* its weights' names start with this */
    df_tensor **w;                    /* its weights, once compiled */
    int n_w;
} df_block;

#define DF_BLOCKS_MAX_CLASSES 8

typedef struct df_blocks {
    df_weight_set *ws;
    void *model;
    const char *const *outer; /* prefixes of the weights outside the blocks */
    int n_outer;
    df_block *block; /* [n], in forward order */
    int n, cap;
    /* Compiled repeated blocks: one per class (classes[k] compiles into compiled[k]). */
    const df_block_class *classes[DF_BLOCKS_MAX_CLASSES];
    df_compiled *compiled[DF_BLOCKS_MAX_CLASSES];
    int n_classes;
    bool sequential;
    int ahead; /* the block read ahead, or -1 */
} df_blocks;

/* An empty list for `model`, whose weights are `ws`. `outer` (borrowed: keep it static)
 * names the weights outside the blocks. */
void df_blocks_init(df_blocks *b, void *model, df_weight_set *ws, const char *const *outer,
                    int n_outer);
void df_blocks_deinit(df_blocks *b);

/* Appends block `index` of class `cls` (borrowed: keep it static), whose weights are named
 * "<prefix>.": the next df_blocks_run number. */
df_status df_blocks_add(df_blocks *b, const df_block_class *cls, int index, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Compiles every class of the list (once; again is a no-op); df_blocks_run uses the
 * programs from then on. opts may be NULL. */
df_status df_blocks_compile(df_blocks *b, const df_compile_opts *opts);
bool df_blocks_compiled(const df_blocks *b);
/* Programs traced so far, over all classes. */
int df_blocks_programs(const df_blocks *b);

/* Sequential offload on or off: on releases every weight now (each forward acquires what it
 * runs); off makes every weight resident again. */
df_status df_blocks_set_sequential(df_blocks *b, bool on);

/* Around a forward: the outer weights resident during it (sequential offload). */
void df_blocks_begin(df_ctx *ctx, df_blocks *b);
void df_blocks_end(df_ctx *ctx, df_blocks *b);

/* Runs block number `g` of the list (its class's forward, or its compiled program) on
 * in[0..n_in), writing out[0..n_out) (all NULL after a failure, which fails the context),
 * then ends the caller's block scope `mark` keeping the outputs (one fixed mark for a loop
 * of blocks: ending it after block g also releases block g-1's outputs) and only then
 * releases the block's weights under sequential offload. */
void df_blocks_run(df_ctx *ctx, df_blocks *b, int g, df_scope mark, df_tensor *const *in,
                   df_tensor **out);

/* The forward leaves out the blocks after the last one it ran (a step cache skipped them):
 * under sequential offload the block read ahead is released. */
void df_blocks_skip_rest(df_ctx *ctx, df_blocks *b);

/* The config's depth `n` (key `key`) of blocks named `prefix`.<i>.<probe> must be what the
 * checkpoint holds: block n-1 present, block n absent (DF_E_FORMAT naming both). */
df_status df_blocks_check_depth(df_weight_set *ws, const char *dir, const char *key, int64_t n,
                                const char *prefix, const char *probe);

#endif
