/*
 * Tests of df_weights: a sharded checkpoint read through its index (and through its folder),
 * reads and slices across shards, and a corpus of broken indexes - missing shard, tensor
 * not in its shard, tensor missing from the map, shard names that leave the folder
 * (.., absolute, NUL), shards that are folders or FIFOs - each with its own error.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/stat.h>

#include <diffuse/weights.h>

#include "core/alloc.h"
#include "unit/io_files.h"

/* Shard a: "x" F32 [2, 4] = 0..7, "y" F32 [3] = 10..12. Shard b: "z" BF16 [2, 2] = 1..4. */
static void write_shards(const char *dir)
{
    char path[700];
    float a[11];
    for (int i = 0; i < 8; i++)
        a[i] = (float)i;
    for (int i = 0; i < 3; i++)
        a[8 + i] = (float)(10 + i);
    size_t len;
    uint8_t *b = st_bytes("{\"x\": {\"dtype\": \"F32\", \"shape\": [2, 4], \"data_offsets\": [0, 32]},"
                          " \"y\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [32, 44]}}",
                          a, sizeof a, &len);
    assert_int_equal(write_file(path_in(dir, "model-00001-of-00002.safetensors", path,
                                        sizeof path), b, len), 0);
    free(b);
    uint16_t z[4];
    for (int i = 0; i < 4; i++)
        z[i] = df_f32_to_bf16((float)(i + 1));
    b = st_bytes("{\"z\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}", z,
                 sizeof z, &len);
    assert_int_equal(write_file(path_in(dir, "model-00002-of-00002.safetensors", path,
                                        sizeof path), b, len), 0);
    free(b);
}

static const char *good_index =
    "{\"metadata\": {\"total_size\": 52}, \"weight_map\": {"
    "\"x\": \"model-00001-of-00002.safetensors\", \"y\": \"model-00001-of-00002.safetensors\","
    " \"z\": \"model-00002-of-00002.safetensors\"}}";

static void test_sharded(void **state)
{
    (void)state;
    char dir[512], path[700];
    test_dir("w-sharded", dir, sizeof dir);
    write_shards(dir);
    write_text(path_in(dir, "diffusion_pytorch_model.safetensors.index.json", path, sizeof path),
               good_index);
    int64_t live = df_alloc_live();
    df_weights *w;
    assert_int_equal(df_weights_open(path, &w), DF_OK);
    assert_int_equal(df_weights_shard_count(w), 2);
    assert_int_equal(df_weights_count(w), 3);
    assert_int_equal(df_weights_total_bytes(w), 52);
    df_tensor_info t;
    assert_int_equal(df_weights_at(w, 2, &t), DF_OK);
    assert_string_equal(t.name, "z");
    assert_int_equal(t.shard, 1);
    assert_string_equal(t.dtype_name, "BF16");
    assert_int_equal(df_weights_find(w, "y", &t), DF_OK);
    assert_int_equal(t.shard, 0);
    assert_int_equal(df_weights_find(w, "q", &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "no tensor 'q'"));
    assert_true(df_weights_contains(w, "x"));
    assert_false(df_weights_contains(w, "q"));
    float z[4];
    assert_int_equal(df_weights_read(w, "z", DF_DTYPE_F32, z, sizeof z), DF_OK);
    assert_true(z[0] == 1.0f && z[3] == 4.0f);
    float x[4];
    assert_int_equal(df_weights_read_rows(w, "x", 1, 2, DF_DTYPE_F32, x, sizeof x), DF_OK);
    assert_true(x[0] == 4.0f && x[3] == 7.0f);
    float xc[2];
    assert_int_equal(df_weights_read_cols(w, "x", 3, 4, DF_DTYPE_F32, xc, sizeof xc), DF_OK);
    assert_true(xc[0] == 3.0f && xc[1] == 7.0f);
    assert_int_equal(df_weights_bytes_read(w), 8 + 16 + 8);
    assert_int_equal(df_safetensors_bytes_read(df_weights_shard(w, 1)), 8);
    assert_int_equal(df_weights_release_pages(w, "z"), DF_OK);
    assert_int_equal(df_weights_release_pages(w, NULL), DF_OK);
    assert_int_equal(df_weights_release_pages(w, "q"), DF_E_FORMAT);
    assert_int_equal(df_weights_read(w, "q", DF_DTYPE_F32, z, sizeof z), DF_E_FORMAT);
    df_weights_free(w);

    /* The folder finds the index by its name. */
    assert_int_equal(df_weights_open(dir, &w), DF_OK);
    assert_int_equal(df_weights_count(w), 3);
    assert_non_null(strstr(df_weights_path(w), ".index.json"));
    df_weights_free(w);
    assert_int_equal(df_alloc_live(), live);

    /* One file is a checkpoint of one shard. */
    assert_int_equal(df_weights_open(path_in(dir, "model-00002-of-00002.safetensors", path,
                                             sizeof path), &w), DF_OK);
    assert_int_equal(df_weights_shard_count(w), 1);
    assert_int_equal(df_weights_count(w), 1);
    df_weights_free(w);
    df_weights_free(NULL);
    remove_tree(dir);
}

typedef struct bad_index {
    const char *what;
    const char *index;
    df_status status;
    const char *word;
} bad_index;

#define S1 "\"model-00001-of-00002.safetensors\""
#define S2 "\"model-00002-of-00002.safetensors\""

static const bad_index bad_indexes[] = {
    {"missing shard", "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": \"gone.safetensors\"}}",
     DF_E_IO, "shard 'gone.safetensors'"},
    {"tensor not in its shard",
     "{\"weight_map\": {\"x\": " S1 ", \"y\": " S1 ", \"z\": " S2 ", \"w\": " S2 "}}", DF_E_FORMAT,
     "no such tensor"},
    {"tensor missing from the map", "{\"weight_map\": {\"x\": " S1 ", \"z\": " S2 "}}",
     DF_E_FORMAT, "'y' of shard"},
    {"tensor placed in the wrong shard",
     "{\"weight_map\": {\"x\": " S1 ", \"y\": " S2 ", \"z\": " S2 "}}", DF_E_FORMAT,
     "no such tensor"},
    {"tensor in two shards",
     "{\"weight_map\": {\"x\": " S1 ", \"y\": \"dup.safetensors\", \"z\": " S2 "}}", DF_E_FORMAT,
     "places it in 'dup.safetensors'"},
    {"shard path with ..", "{\"weight_map\": {\"x\": \"../model-00001-of-00002.safetensors\"}}",
     DF_E_FORMAT, "'..'"},
    {"shard path with inner ..", "{\"weight_map\": {\"x\": \"a/../../etc/passwd\"}}", DF_E_FORMAT,
     "'..'"},
    {"absolute shard path", "{\"weight_map\": {\"x\": \"/etc/passwd\"}}", DF_E_FORMAT,
     "absolute"},
    {"NUL in shard path", "{\"weight_map\": {\"x\": \"a.safetensors\\u0000/../../x\"}}",
     DF_E_FORMAT, "NUL"},
    {"empty shard name", "{\"weight_map\": {\"x\": \"\"}}", DF_E_FORMAT, "empty"},
    {"shard is a folder", "{\"weight_map\": {\"x\": \"sub\"}}", DF_E_IO, "not a regular file"},
    {"shard is a FIFO", "{\"weight_map\": {\"x\": \"fifo\"}}", DF_E_IO, "not a regular file"},
    {"shard is a device", "{\"weight_map\": {\"x\": \"zero\"}}", DF_E_IO, "not a regular file"},
    {"weight_map missing", "{\"metadata\": {}}", DF_E_FORMAT, "'weight_map' is missing"},
    {"metadata not an object", "{\"metadata\": 5, \"weight_map\": {\"x\": " S1 "}}", DF_E_FORMAT,
     "key 'metadata': expected an object"},
    {"total_size negative", "{\"metadata\": {\"total_size\": -1}, \"weight_map\": {\"x\": " S1
     "}}", DF_E_FORMAT, "key 'metadata.total_size': expected a non-negative integer"},
    {"total_size a string", "{\"metadata\": {\"total_size\": \"52\"}, \"weight_map\": {\"x\": "
     S1 "}}", DF_E_FORMAT, "key 'metadata.total_size': expected an integer, found string"},
    {"weight_map not an object", "{\"weight_map\": [\"x\"]}", DF_E_FORMAT, "an object"},
    {"shard name not a string", "{\"weight_map\": {\"x\": 1}}", DF_E_FORMAT, "a string"},
    {"empty weight_map", "{\"weight_map\": {}}", DF_E_FORMAT, "empty"},
    {"index not an object", "[1]", DF_E_FORMAT, "must be a JSON object"},
    {"index not JSON", "{\"weight_map\": ", DF_E_FORMAT, "invalid JSON"},
    {"duplicate tensor", "{\"weight_map\": {\"x\": " S1 ", \"x\": " S1 "}}", DF_E_FORMAT,
     "duplicate"},
    {"broken shard", "{\"weight_map\": {\"x\": \"broken.safetensors\"}}", DF_E_FORMAT,
     "runs past the end"},
};

static void test_bad_indexes(void **state)
{
    (void)state;
    char dir[512], path[700];
    test_dir("w-bad", dir, sizeof dir);
    write_shards(dir);
    mkdir(path_in(dir, "sub", path, sizeof path), 0755);
    assert_int_equal(mkfifo(path_in(dir, "fifo", path, sizeof path), 0644), 0);
    if (symlink("/dev/zero", path_in(dir, "zero", path, sizeof path)) != 0)
        fail_msg("cannot make a link to /dev/zero");
    write_file(path_in(dir, "broken.safetensors", path, sizeof path), "\x05\0\0\0\0\0\0\0{}", 10);
    size_t len; /* a second shard that also holds "y" */
    uint8_t *b = st_bytes("{\"y\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                          NULL, 4, &len);
    write_file(path_in(dir, "dup.safetensors", path, sizeof path), b, len);
    free(b);
    int64_t live = df_alloc_live();
    size_t n = sizeof bad_indexes / sizeof bad_indexes[0];
    for (size_t i = 0; i < n; i++) {
        const bad_index *c = &bad_indexes[i];
        write_text(path_in(dir, "model.safetensors.index.json", path, sizeof path), c->index);
        df_weights *w = (df_weights *)1;
        df_status s = df_weights_open(path, &w);
        const char *m = df_error_message();
        if (s != c->status || !strstr(m, c->word) || !strstr(m, "index.json"))
            fail_msg("%s: got %s '%s', expected %s with '%s'", c->what, df_status_name(s), m,
                     df_status_name(c->status), c->word);
        assert_null(w);
        assert_int_equal(df_alloc_live(), live);
    }
    remove_tree(dir);
}

static void test_out_of_memory(void **state)
{
    (void)state;
    char dir[512], path[700];
    test_dir("w-oom", dir, sizeof dir);
    write_shards(dir);
    write_text(path_in(dir, "model.safetensors.index.json", path, sizeof path), good_index);
    int64_t live = df_alloc_live();
    for (int64_t n = 1;; n++) {
        df_weights *w = NULL;
        df_alloc_fail_at(n);
        df_status s = df_weights_open(path, &w);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            assert_int_equal(df_weights_count(w), 3);
            df_weights_free(w);
            assert_true(n > 20);
            break;
        }
        if (s != DF_E_OOM)
            fail_msg("allocation %lld: %s '%s'", (long long)n, df_status_name(s),
                     df_error_message());
        assert_null(w);
        assert_int_equal(df_alloc_live(), live);
        assert_true(n < 5000);
    }
    assert_int_equal(df_alloc_live(), live);
    remove_tree(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sharded),
        cmocka_unit_test(test_bad_indexes),
        cmocka_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
