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

typedef struct df_weight_set df_weight_set;

/* Opens the weights of the component folder `dir` (diffusion_pytorch_model.safetensors,
 * model.safetensors, or their *.safetensors.index.json). `component` names it in messages
 * ("transformer"). */
df_status df_weight_set_open(df_ctx *ctx, const char *dir, const char *component,
                             df_weight_set **out);
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
/* Fails naming the first tensor of the checkpoint that nothing bound. */
df_status df_ws_check_all_used(df_weight_set *ws);
/* Bytes of the tensors bound so far. */
int64_t df_ws_bytes(const df_weight_set *ws);

/*
 * Residency, for offloading. A bound weight is resident: its pages are mapped and backends
 * may keep packed forms of it. df_ws_release() (after all work already queued) drops the
 * packed forms and the mapping's pages of every tensor whose name starts with `prefix`
 * (NULL: all); the file stays mapped, so the next use faults the pages back in.
 * df_ws_acquire() marks them resident again and asks the kernel to read them ahead.
 * df_stats' resident_weight_bytes follows both.
 */
df_status df_ws_release(df_weight_set *ws, const char *prefix);
void df_ws_acquire(df_weight_set *ws, const char *prefix);
int64_t df_ws_resident_bytes(const df_weight_set *ws);

#endif
