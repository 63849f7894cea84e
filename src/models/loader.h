/*
 * Binding a component's weights by their checkpoint names.
 *
 * A df_weight_set opens a component folder's weights (one safetensors file or a sharded
 * index), and hands out tensors by name after checking their shape against what the model
 * code expects from its config. Tensors wrap the mapped file: nothing is copied and a
 * bf16 checkpoint stays bf16 in memory. The set owns every tensor it handed out and frees
 * them with itself; model code keeps plain pointers. df_ws_check_all_used() then reports
 * any tensor in the file that the model did not bind (an unexpected weight is an error:
 * it means the config and the checkpoint disagree).
 *
 * Errors name the component, the tensor, the expected and the found shape.
 */
#ifndef DF_MODELS_LOADER_H
#define DF_MODELS_LOADER_H

#include <stdbool.h>

#include <diffuse/json.h>
#include <diffuse/ops.h>
#include <diffuse/runtime.h>

#include "models/names.h"

typedef struct df_weight_set df_weight_set;

/* Opens the weights of the component folder `dir` (diffusion_pytorch_model.safetensors,
 * model.safetensors, or their *.safetensors.index.json). `component` names it in messages
 * ("transformer"). */
df_status df_weight_set_open(df_ctx *ctx, const char *dir, const char *component,
                             df_weight_set **out);
/* The weights in the single file `file` (safetensors or GGUF) read through the name map
 * `map` (names.h; given `arg`; used when a tensor name ends in `probe`), with
 * config_dir/config.json as the config. See single_file.h. */
df_status df_weight_set_open_single(df_ctx *ctx, const char *config_dir, const char *file,
                                    const char *component, df_name_map map, int arg,
                                    const char *probe, df_weight_set **out);
/* A single-file set that took no map yet takes `map` when a name ends in `probe` (a model
 * whose files come in two layouts tries each; `hint`: see df_single_file_try_map); true
 * when it did. */
bool df_ws_try_map(df_weight_set *ws, df_name_map map, int arg, const char *probe,
                   const char *hint);
void df_weight_set_free(df_weight_set *ws);

/* Also reads `dir`/config.json; the result is owned by the set. */
df_status df_weight_set_config(df_weight_set *ws, const df_json **out);

/* The tensor `name` with exactly `ndim` dimensions of `shape` (a -1 entry accepts any size).
 * The name is printf-formatted. */
df_status df_ws_tensor(df_weight_set *ws, df_tensor **out, int ndim, const int64_t *shape,
                       const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* "<name>.weight" [out_f, in_f] and, if `bias`, "<name>.bias" [out_f]. */
df_status df_ws_linear(df_weight_set *ws, df_linear_weights *out, int64_t out_f, int64_t in_f,
                       bool bias, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Whether the checkpoint holds `name`. */
bool df_ws_has(df_weight_set *ws, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Marks every tensor whose name starts with `prefix` as deliberately unused (e.g. the
 * encoder half of a VAE checkpoint when only the decoder runs). */
void df_ws_ignore_prefix(df_weight_set *ws, const char *prefix);
/* Tensors of the checkpoint that nothing bound are not an error (diffusers warns and loads):
 * one line on stderr names them ("warning: <component>: <file>: tensors the config does not
 * call for were not loaded: 'a' 'b' ..."). Fails only when the checkpoint cannot be read. */
df_status df_ws_check_all_used(df_weight_set *ws);
/* The last such warning line of this thread ("" if none); for tests. */
const char *df_ws_last_warning(void);
/* Bytes of the tensors bound so far. */
int64_t df_ws_bytes(const df_weight_set *ws);
/* The tensors bound so far, by diffusers' names (for writing them out): how many, and the
 * i-th with its name (valid while the set lives). */
int df_ws_bound_count(const df_weight_set *ws);
df_tensor *df_ws_bound(const df_weight_set *ws, int i, const char **name);
/* The tensors bound so far whose names start with `prefix`, in binding order: the first
 * `cap` into out; returns how many there are. */
int df_ws_collect(const df_weight_set *ws, const char *prefix, df_tensor **out, int cap);

/*
 * Tensor parallelism: binding only this rank's slice of a weight.
 *
 * A linear layer [out_f, in_f] split "colwise" keeps the rows (output features)
 * [r*out_f/N, (r+1)*out_f/N) and the same slice of its bias; split "rowwise" it keeps the
 * columns (input features) [r*in_f/N, ...) and its bias whole, bound on rank 0 only: the
 * rowwise product gives partial sums that an all-reduce adds up, and the bias must be added
 * once, so rank 0 adds it inside its product and the other ranks bind none (the tensor is
 * still marked as used). For a plain tensor (an embedding table [rows, cols]), colwise
 * splits the last dimension and rowwise the first, as torch's ColwiseParallel and
 * RowwiseParallel do for nn.Embedding.
 *
 * Packed weights (a fused projection, or an input that is a concatenation) give the split
 * dimension as blocks in proportion `parts` (e.g. {1, 4} for cat[attn (D), mlp (4D)]):
 * each block is split across the ranks separately and the rank's pieces are concatenated,
 * like diffusers' PackedColwiseParallel / PackedRowwiseParallel.
 *
 * A range of rows is contiguous in the file: the tensor wraps that sub-range of the mapping
 * (no copy; only its pages are ever touched). A range of columns, or several packed row
 * ranges, is read (df_weights_read_cols / _read_rows) into memory the set owns. df_stats'
 * weight_bytes_read counts only the slice. A size not divisible by the number of ranks is
 * DF_E_ARG naming the tensor, the size and the ranks.
 */
typedef enum df_shard_style {
    DF_SHARD_REPLICATE = 0, /* the whole tensor on every rank */
    DF_SHARD_COLWISE,       /* output features (weight rows, bias); a table's last dimension */
    DF_SHARD_ROWWISE,       /* input features (weight columns); a table's first dimension */
} df_shard_style;

#define DF_SHARD_MAX_PARTS 8

typedef struct df_shard {
    df_shard_style style;
    int rank, world;
    int n_parts;                   /* 0 or 1: the split dimension is one block */
    int parts[DF_SHARD_MAX_PARTS]; /* packed: relative block sizes along the split dimension */
} df_shard;

/* df_ws_linear, keeping only this rank's part (`out_f`, `in_f` are the full sizes). */
df_status df_ws_linear_sharded(df_weight_set *ws, df_linear_weights *out, int64_t out_f,
                               int64_t in_f, bool bias, const df_shard *sh, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* df_ws_tensor, keeping only this rank's part (`shape` is the full shape). */
df_status df_ws_tensor_sharded(df_weight_set *ws, df_tensor **out, int ndim, const int64_t *shape,
                               const df_shard *sh, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));

/*
 * A model's tensor-parallel plan: which of its modules are split, by name, as diffusers
 * writes `_tp_plan`. `module` is the name without ".weight"; a '*' stands for a block index
 * (one or more digits). Modules not listed are replicated.
 */
typedef struct df_tp_rule {
    const char *module;
    df_shard_style style;
    int n_parts;
    int parts[DF_SHARD_MAX_PARTS];
} df_tp_rule;

/* From now on df_ws_linear / df_ws_tensor split the modules the plan names, for `rank` of
 * `world` ranks (world <= 1: nothing is split). The rules are borrowed: keep them static. */
void df_ws_set_tp_plan(df_weight_set *ws, const df_tp_rule *rules, int n, int rank, int world);

/*
 * Residency, for offloading: the set's weights by name prefix, as the runtime's
 * df_weight_release / df_weight_acquire do them (runtime/weight.h). A bound weight is
 * resident: its pages are mapped and backends may keep packed forms of it. df_ws_release()
 * (after all work already queued) drops the packed forms and the mapping's pages of every
 * tensor whose name starts with `prefix` (NULL: all); the file stays mapped, so the next
 * use faults the pages back in. df_ws_acquire() marks them resident again and asks the
 * kernel to read them ahead. df_stats' resident_weight_bytes follows both.
 */
df_status df_ws_release(df_weight_set *ws, const char *prefix);
void df_ws_acquire(df_weight_set *ws, const char *prefix);
int64_t df_ws_resident_bytes(const df_weight_set *ws);

#endif
