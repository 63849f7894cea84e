/*
 * Inside of df_weights: parsing a *.safetensors.index.json without opening its shards
 * (the fuzz target for configs uses it too).
 */
#ifndef DF_IO_WEIGHTS_H
#define DF_IO_WEIGHTS_H

#include <diffuse/json.h>
#include <diffuse/weights.h>

typedef struct df_index_entry {
    const char *tensor; /* borrowed from the JSON document */
    const char *shard;
} df_index_entry;

/*
 * Checks an index document: an object whose "weight_map" maps tensor names to shard names
 * (strings) that stay inside the index's folder (df_path_check_inside). On success *out is
 * a df_malloc'd array of *out_n entries sorted by tensor name, borrowing the document's
 * strings. DF_E_FORMAT (naming the index and the key) or DF_E_OOM.
 */
df_status df_weights_index_parse(const df_json *root, df_index_entry **out, int64_t *out_n);

#endif
