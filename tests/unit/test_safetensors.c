/*
 * Tests of the safetensors reader: a good file in memory and on disk, reads with dtype
 * conversion, row and column slices that touch only their bytes (counted, and on a real
 * file also seen in the page cache), unaligned data, integer range checks, a corpus of
 * malformed headers each giving its own error, an out-of-memory sweep over open, and every
 * golden case file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fcntl.h>
#include <math.h>
#include <string.h>
#include <sys/mman.h>

#include <diffuse/safetensors.h>

#include "core/alloc.h"
#include "unit/io_files.h"

/* A file with three tensors: w F32 [2, 3] (values 0.5 * i), b BF16 [4], s I64 scalar. */
static uint8_t *good_file(size_t *len)
{
    const char *h = "{\"__metadata__\": {\"format\": \"pt\", \"by\": \"test\"},"
                    " \"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 24]},"
                    " \"b\": {\"dtype\": \"BF16\", \"shape\": [4], \"data_offsets\": [24, 32]},"
                    " \"s\": {\"dtype\": \"I64\", \"shape\": [], \"data_offsets\": [32, 40]}}";
    uint8_t data[40];
    for (int i = 0; i < 6; i++) {
        float f = 0.5f * (float)i;
        memcpy(data + 4 * i, &f, 4);
    }
    for (int i = 0; i < 4; i++) {
        uint16_t v = df_f32_to_bf16(1.0f + (float)i / 128.0f);
        memcpy(data + 24 + 2 * i, &v, 2);
    }
    int64_t s = -42;
    memcpy(data + 32, &s, 8);
    return st_bytes(h, data, sizeof data, len);
}

static void check_good(const df_safetensors *st)
{
    assert_int_equal(df_safetensors_count(st), 3);
    df_tensor_info t;
    assert_int_equal(df_safetensors_at(st, 0, &t), DF_OK); /* name order: b, s, w */
    assert_string_equal(t.name, "b");
    assert_int_equal(df_safetensors_at(st, 2, &t), DF_OK);
    assert_string_equal(t.name, "w");
    assert_int_equal(df_safetensors_at(st, 3, &t), DF_E_ARG);
    assert_int_equal(df_safetensors_find(st, "w", &t), DF_OK);
    assert_int_equal(t.dtype, DF_DTYPE_F32);
    assert_string_equal(t.dtype_name, "F32");
    assert_int_equal(t.ndim, 2);
    assert_int_equal(t.shape[0] * 10 + t.shape[1], 23);
    assert_int_equal(t.numel, 6);
    assert_int_equal(t.nbytes, 24);
    assert_int_equal(df_safetensors_find(st, "s", &t), DF_OK);
    assert_int_equal(t.ndim, 0);
    assert_int_equal(t.numel, 1);
    assert_int_equal(df_safetensors_find(st, "nope", &t), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "no tensor 'nope'"));
    assert_true(df_safetensors_contains(st, "b"));
    assert_false(df_safetensors_contains(st, "x"));
    assert_int_equal(df_safetensors_metadata_count(st), 2);
    assert_string_equal(df_safetensors_metadata(st, "format"), "pt");
    const char *k, *v;
    df_safetensors_metadata_at(st, 0, &k, &v);
    assert_string_equal(k, "by");
    assert_string_equal(v, "test");
    assert_null(df_safetensors_metadata(st, "missing"));
    assert_int_equal(df_safetensors_bytes_read(st), 0); /* nothing touched at open */

    float w[6];
    assert_int_equal(df_safetensors_read(st, "w", DF_DTYPE_F32, w, sizeof w), DF_OK);
    for (int i = 0; i < 6; i++)
        assert_true(w[i] == 0.5f * (float)i);
    uint16_t wb[6];
    assert_int_equal(df_safetensors_read(st, "w", DF_DTYPE_BF16, wb, sizeof wb), DF_OK);
    for (int i = 0; i < 6; i++)
        assert_int_equal(wb[i], df_f32_to_bf16(0.5f * (float)i));
    float b[4];
    assert_int_equal(df_safetensors_read(st, "b", DF_DTYPE_F32, b, sizeof b), DF_OK);
    for (int i = 0; i < 4; i++)
        assert_true(b[i] == 1.0f + (float)i / 128.0f);
    double s;
    assert_int_equal(df_safetensors_read(st, "s", DF_DTYPE_F64, &s, sizeof s), DF_OK);
    assert_true(s == -42.0);
    int32_t s32;
    assert_int_equal(df_safetensors_read(st, "s", DF_DTYPE_I32, &s32, sizeof s32), DF_OK);
    assert_int_equal(s32, -42);
    assert_int_equal(df_safetensors_bytes_read(st), 24 + 24 + 8 + 8 + 8);
    assert_int_equal(df_safetensors_read(st, "w", DF_DTYPE_F32, w, sizeof w - 1), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "destination"));
    assert_int_equal(df_safetensors_read(st, "w", DF_DTYPE_COUNT, w, sizeof w), DF_E_ARG);
}

static void test_good_memory(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open_memory(buf, len, "mem.safetensors", &st), DF_OK);
    check_good(st);
    assert_string_equal(df_safetensors_path(st), "mem.safetensors");
    /* Releasing pages of a caller's buffer must leave it alone. */
    uint8_t *copy = malloc(len);
    memcpy(copy, buf, len);
    assert_int_equal(df_safetensors_release_pages(st, NULL), DF_OK);
    assert_int_equal(df_safetensors_release_pages(st, "w"), DF_OK);
    assert_memory_equal(copy, buf, len);
    assert_int_equal(df_safetensors_release_pages(st, "zz"), DF_E_FORMAT);
    df_safetensors_free(st);
    df_safetensors_free(NULL);
    free(copy);
    free(buf);
}

static void test_good_file(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("st-good", dir, sizeof dir);
    size_t len;
    uint8_t *buf = good_file(&len);
    assert_int_equal(write_file(path_in(dir, "m.safetensors", path, sizeof path), buf, len), 0);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(path, &st), DF_OK);
    check_good(st);
    df_tensor_info t;
    assert_int_equal(df_safetensors_find(st, "b", &t), DF_OK);
    assert_memory_equal(t.data, buf + t.offset, t.nbytes); /* a pointer into the mapping */
    assert_int_equal(df_safetensors_release_pages(st, "b"), DF_OK);
    assert_int_equal(df_safetensors_release_pages(st, NULL), DF_OK);
    float w[6]; /* pages come back from the file after release */
    assert_int_equal(df_safetensors_read(st, "w", DF_DTYPE_F32, w, sizeof w), DF_OK);
    assert_true(w[5] == 2.5f);
    df_safetensors_free(st);

    df_safetensors *none = (df_safetensors *)1;
    assert_int_equal(df_safetensors_open(path_in(dir, "absent", path, sizeof path), &none),
                     DF_E_IO);
    assert_null(none);
    assert_int_equal(df_safetensors_open(dir, &none), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "not a regular file"));
    assert_int_equal(write_file(path_in(dir, "empty", path, sizeof path), "", 0), 0);
    assert_int_equal(df_safetensors_open(path, &none), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "truncated"));
    free(buf);
    remove_tree(dir);
}

/* A [rows, cols] F32 tensor "m" with m[r][c] = r * 1000 + c, after a 1-D "v" of 16 floats. */
static uint8_t *matrix_file(int rows, int cols, size_t *len)
{
    char h[256];
    size_t mbytes = (size_t)rows * (size_t)cols * 4;
    snprintf(h, sizeof h,
             "{\"v\": {\"dtype\": \"F32\", \"shape\": [16], \"data_offsets\": [0, 64]}, "
             "\"m\": {\"dtype\": \"F32\", \"shape\": [%d, %d], \"data_offsets\": [64, %zu]}}",
             rows, cols, 64 + mbytes);
    float *data = malloc(64 + mbytes);
    for (int i = 0; i < 16; i++)
        data[i] = (float)-i;
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            data[16 + r * cols + c] = (float)(r * 1000 + c);
    uint8_t *b = st_bytes(h, data, 64 + mbytes, len);
    free(data);
    return b;
}

static void test_slices(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = matrix_file(64, 48, &len);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open_memory(buf, len, "slices", &st), DF_OK);
    float rows[10 * 48];
    uint64_t before = df_safetensors_bytes_read(st);
    assert_int_equal(df_safetensors_read_rows(st, "m", 10, 20, DF_DTYPE_F32, rows, sizeof rows),
                     DF_OK);
    assert_int_equal(df_safetensors_bytes_read(st) - before, 10 * 48 * 4);
    for (int r = 0; r < 10; r++)
        for (int c = 0; c < 48; c++)
            assert_true(rows[r * 48 + c] == (float)((r + 10) * 1000 + c));

    float cols[64 * 12];
    before = df_safetensors_bytes_read(st);
    assert_int_equal(df_safetensors_read_cols(st, "m", 5, 17, DF_DTYPE_F32, cols, sizeof cols),
                     DF_OK);
    assert_int_equal(df_safetensors_bytes_read(st) - before, 64 * 12 * 4);
    for (int r = 0; r < 64; r++)
        for (int c = 0; c < 12; c++)
            assert_true(cols[r * 12 + c] == (float)(r * 1000 + c + 5));

    uint16_t colsb[64 * 3]; /* with conversion */
    assert_int_equal(df_safetensors_read_cols(st, "m", 45, 48, DF_DTYPE_BF16, colsb,
                                              sizeof colsb), DF_OK);
    assert_int_equal(colsb[7 * 3 + 2], df_f32_to_bf16((float)(7 * 1000 + 47)));
    double vpart[4];
    before = df_safetensors_bytes_read(st);
    assert_int_equal(df_safetensors_read_rows(st, "v", 12, 16, DF_DTYPE_F64, vpart,
                                              sizeof vpart), DF_OK);
    assert_int_equal(df_safetensors_bytes_read(st) - before, 16);
    assert_true(vpart[0] == -12.0 && vpart[3] == -15.0);
    /* Empty ranges read nothing. */
    assert_int_equal(df_safetensors_read_rows(st, "m", 3, 3, DF_DTYPE_F32, NULL, 0), DF_OK);

    assert_int_equal(df_safetensors_read_rows(st, "m", 60, 65, DF_DTYPE_F32, rows, sizeof rows),
                     DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "rows [60, 65)"));
    assert_int_equal(df_safetensors_read_rows(st, "m", 5, 4, DF_DTYPE_F32, rows, sizeof rows),
                     DF_E_ARG);
    assert_int_equal(df_safetensors_read_cols(st, "m", -1, 4, DF_DTYPE_F32, cols, sizeof cols),
                     DF_E_ARG);
    assert_int_equal(df_safetensors_read_cols(st, "v", 0, 4, DF_DTYPE_F32, cols, sizeof cols),
                     DF_E_SHAPE);
    assert_int_equal(df_safetensors_read_cols(st, "m", 0, 48, DF_DTYPE_F32, cols, sizeof cols),
                     DF_E_ARG); /* destination too small */
    assert_int_equal(df_safetensors_read_rows(st, "x", 0, 1, DF_DTYPE_F32, rows, sizeof rows),
                     DF_E_FORMAT);
    df_safetensors_free(st);
    free(buf);
}

/* Which pages of [p, p + n) are in the page cache: 1 per resident page into vec. */
static int resident(const void *p, size_t n, unsigned char *vec)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p / page * page;
    return mincore((void *)a, (uintptr_t)p + n - a, vec);
}

/*
 * On a real file: evict it from the page cache, read 4 rows of a 1024 x 1024 F32 matrix
 * (one page per row) with readahead off, and check that only the pages under those rows
 * came in. Skipped where the file system does not drop clean pages on request.
 */
static void test_slice_pages(void **state)
{
    (void)state;
    char dir[512], path[600];
    test_dir("st-pages", dir, sizeof dir);
    size_t len;
    uint8_t *buf = matrix_file(1024, 1024, &len);
    assert_int_equal(write_file(path_in(dir, "big.safetensors", path, sizeof path), buf, len),
                     0);
    free(buf);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open(path, &st), DF_OK);
    df_tensor_info t;
    assert_int_equal(df_safetensors_find(st, "m", &t), DF_OK);
    /* Reading the header at open brought neighbouring pages in (the kernel reads around a
     * fault). Unmap them from this process, then drop the file from the page cache. */
    assert_int_equal(df_safetensors_release_pages(st, NULL), DF_OK);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), npages = t.nbytes / page + 2;
    unsigned char *vec = calloc(npages, 1);
    assert_int_equal(resident(t.data, t.nbytes, vec), 0);
    int cached = 0;
    for (size_t i = 1; i + 1 < npages; i++)
        cached += vec[i] & 1;
    if (cached > 0 || page != 4096) {
        print_message("page-cache check skipped: the file system kept %d pages\n", cached);
    } else {
        uintptr_t a = (uintptr_t)t.data / page * page;
        assert_int_equal(madvise((void *)a, t.nbytes, MADV_RANDOM), 0);
        float rows[4 * 1024];
        assert_int_equal(df_safetensors_read_rows(st, "m", 500, 504, DF_DTYPE_F32, rows,
                                                  sizeof rows), DF_OK);
        assert_true(rows[3 * 1024 + 7] == 503007.0f);
        assert_int_equal(resident(t.data, t.nbytes, vec), 0);
        uintptr_t lo = (uintptr_t)t.data + 500 * 4096, hi = lo + 4 * 4096;
        for (size_t i = 0; i < npages; i++) {
            uintptr_t pa = a + i * page;
            bool inside = pa + page > lo && pa < hi;
            if ((vec[i] & 1) && !inside && pa + page <= (uintptr_t)t.data + t.nbytes &&
                pa >= (uintptr_t)t.data + page)
                fail_msg("page %zu outside rows 500..503 was read", i);
            if (inside)
                assert_true(vec[i] & 1);
        }
    }
    assert_int_equal(df_safetensors_bytes_read(st), 4 * 4096 * (cached == 0 && page == 4096));
    free(vec);
    df_safetensors_free(st);
    remove_tree(dir);
}

static void test_unaligned_and_ranges(void **state)
{
    (void)state;
    /* Header padded to 9 bytes: the data starts at offset 17, misaligned for F32. */
    char h[128] = "{\"x\": {\"dtype\": \"F32\", \"shape\": [5], \"data_offsets\": [0, 20]}}";
    if (strlen(h) % 2 == 0)
        strcat(h, " ");
    float vals[5] = {1.5f, -2.0f, NAN, 3e9f, 255.0f};
    size_t len;
    uint8_t *buf = st_bytes(h, vals, sizeof vals, &len);
    df_safetensors *st;
    assert_int_equal(df_safetensors_open_memory(buf, len, "odd", &st), DF_OK);
    df_tensor_info t;
    df_safetensors_find(st, "x", &t);
    assert_true(t.offset % 2 == 1);
    double d[5];
    assert_int_equal(df_safetensors_read(st, "x", DF_DTYPE_F64, d, sizeof d), DF_OK);
    assert_true(d[0] == 1.5 && d[1] == -2.0 && isnan(d[2]) && d[4] == 255.0);
    int32_t i32[5];
    assert_int_equal(df_safetensors_read(st, "x", DF_DTYPE_I32, i32, sizeof i32), DF_E_FORMAT);
    assert_non_null(strstr(df_error_message(), "does not fit"));
    assert_int_equal(df_safetensors_read_rows(st, "x", 0, 2, DF_DTYPE_I32, i32, sizeof i32),
                     DF_OK);
    assert_int_equal(i32[0], 1);
    assert_int_equal(i32[1], -2);
    uint8_t u8[2];
    assert_int_equal(df_safetensors_read_rows(st, "x", 3, 5, DF_DTYPE_U8, u8, sizeof u8),
                     DF_E_FORMAT); /* 3e9 */
    df_safetensors_free(st);
    free(buf);

    /* Dtypes diffuse lists but does not load. */
    const char *h2 = "{\"q\": {\"dtype\": \"I16\", \"shape\": [3], \"data_offsets\": [0, 6]},"
                     " \"m\": {\"dtype\": \"BOOL\", \"shape\": [1], \"data_offsets\": [6, 7]},"
                     " \"w\": {\"dtype\": \"I8\", \"shape\": [1], \"data_offsets\": [7, 8]}}";
    buf = st_bytes(h2, NULL, 8, &len);
    assert_int_equal(df_safetensors_open_memory(buf, len, "i16", &st), DF_OK);
    assert_int_equal(df_safetensors_find(st, "q", &t), DF_OK);
    assert_int_equal(t.dtype, DF_DTYPE_COUNT);
    assert_string_equal(t.dtype_name, "I16");
    float f[3];
    assert_int_equal(df_safetensors_read(st, "q", DF_DTYPE_F32, f, sizeof f), DF_E_UNSUPPORTED);
    assert_non_null(strstr(df_error_message(), "I16"));
    /* I8 loads (int8 weights saved quantized) */
    assert_int_equal(df_safetensors_find(st, "w", &t), DF_OK);
    assert_int_equal(t.dtype, DF_DTYPE_I8);
    df_safetensors_free(st);
    free(buf);
}

typedef struct bad_case {
    const char *what;
    const char *header;
    size_t data_len;
    uint64_t hlen; /* 0: the header's length */
    size_t total;  /* != 0: cut the file to total - 1 bytes */
    df_status status;
    const char *word;
} bad_case;

#define T(dtype, shape, b, e) \
    "{\"dtype\": \"" dtype "\", \"shape\": " shape ", \"data_offsets\": [" #b ", " #e "]}"

static const bad_case bad_cases[] = {
    {"empty file", "", 0, 0, 1, DF_E_FORMAT, "truncated"},
    {"7 bytes", "", 0, 0, 8, DF_E_FORMAT, "truncated"},
    {"length past EOF", "{}", 0, 100, 0, DF_E_FORMAT, "past the end"},
    {"huge length", "{}", 0, (uint64_t)1 << 62, 0, DF_E_FORMAT, "100 MB"},
    {"length just over 100 MB", "{}", 0, ((uint64_t)100 << 20) + 1, 0, DF_E_FORMAT, "100 MB"},
    {"header cut short", "{\"a\": " T("F32", "[1]", 0, 4) "}", 4, 0, 30, DF_E_FORMAT,
     "past the end"},
    {"zero-length header", "", 0, 0, 0, DF_E_FORMAT, "the header is empty"},
    {"header starts with a space", " {}", 0, 0, 0, DF_E_FORMAT, "begins with ' '"},
    {"header starts with a newline", "\n{}", 0, 0, 0, DF_E_FORMAT, "begins with byte 0x0a"},
    {"invalid JSON", "{\"a\": {\"dtype\": \"F32\",, }}", 0, 0, 0, DF_E_FORMAT, "invalid JSON"},
    {"header not an object", "[1, 2]", 0, 0, 0, DF_E_FORMAT, "begins with '['"},
    {"trailing garbage", "{} x", 0, 0, 0, DF_E_FORMAT, "unexpected text"},
    {"unknown dtype", "{\"a\": " T("F33", "[1]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT,
     "unknown dtype 'F33'"},
    {"dtype not a string", "{\"a\": {\"dtype\": 4, \"shape\": [], \"data_offsets\": [0, 4]}}", 4,
     0, 0, DF_E_FORMAT, "'dtype' must be a string"},
    {"shape/bytes mismatch", "{\"a\": " T("F32", "[2, 3]", 0, 20) "}", 20, 0, 0, DF_E_FORMAT,
     "hold 20"},
    {"bf16 size mismatch", "{\"a\": " T("BF16", "[3]", 0, 12) "}", 12, 0, 0, DF_E_FORMAT,
     "needs 3 x 2"},
    {"offsets out of range", "{\"a\": " T("F32", "[2]", 0, 8) "}", 4, 0, 0, DF_E_FORMAT,
     "data section has 4 bytes"},
    {"overlap", "{\"a\": " T("F32", "[2]", 0, 8) ", \"b\": " T("F32", "[2]", 4, 12) "}", 12, 0,
     0, DF_E_FORMAT, "overlap"},
    {"same range twice", "{\"a\": " T("F32", "[1]", 0, 4) ", \"b\": " T("F32", "[1]", 0, 4) "}",
     4, 0, 0, DF_E_FORMAT, "overlap"},
    {"hole", "{\"a\": " T("F32", "[1]", 0, 4) ", \"b\": " T("F32", "[1]", 8, 12) "}", 12, 0, 0,
     DF_E_FORMAT, "hole"},
    {"bytes after the last tensor", "{\"a\": " T("F32", "[1]", 0, 4) "}", 9, 0, 0, DF_E_FORMAT,
     "belongs to no tensor"},
    {"negative shape", "{\"a\": " T("F32", "[-1]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT,
     "shape[0] is -1"},
    {"non-integer shape", "{\"a\": " T("F32", "[1.5]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT,
     "shape[0] is 1.5"},
    {"shape 2.0", "{\"a\": " T("F32", "[2.0]", 0, 8) "}", 8, 0, 0, DF_E_FORMAT,
     "shape[0] is 2 (not an integer literal)"},
    {"shape 2e0", "{\"a\": " T("F32", "[1, 2e0]", 0, 8) "}", 8, 0, 0, DF_E_FORMAT,
     "shape[1] is 2 (not an integer literal)"},
    {"shape -0", "{\"a\": " T("F32", "[-0]", 0, 0) "}", 0, 0, 0, DF_E_FORMAT,
     "shape[0] is -0"},
    {"offset 8.5", "{\"a\": " T("U8", "[8]", 0.5, 8.5) "}", 9, 0, 0, DF_E_FORMAT,
     "data_offsets[0] is 0.5 (not an integer literal)"},
    {"offset 4.0", "{\"a\": " T("F32", "[1]", 0, 4.0) "}", 4, 0, 0, DF_E_FORMAT,
     "data_offsets[1] is 4 (not an integer literal)"},
    {"offset past 2^64", "{\"a\": " T("F32", "[1]", 0, 18446744073709551620) "}", 4, 0, 0,
     DF_E_FORMAT, "data_offsets[1] is 1.8446744073709552e+19"},
    {"string in shape", "{\"a\": " T("F32", "[1, \"2\"]", 0, 8) "}", 8, 0, 0, DF_E_FORMAT,
     "shape[1] is string"},
    {"shape not an array", "{\"a\": " T("F32", "4", 0, 16) "}", 16, 0, 0, DF_E_FORMAT,
     "'shape' must be an array"},
    {"duplicate names", "{\"a\": " T("F32", "[1]", 0, 4) ", \"a\": " T("F32", "[1]", 4, 8) "}",
     8, 0, 0, DF_E_FORMAT, "duplicate key 'a'"},
    {"data_offsets arity", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4,"
     " 8]}}", 4, 0, 0, DF_E_FORMAT, "[begin, end], found 3"},
    {"data_offsets missing", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, 0, 0,
     DF_E_FORMAT, "found nothing"},
    {"negative offset", "{\"a\": " T("F32", "[1]", -4, 0) "}", 4, 0, 0, DF_E_FORMAT,
     "data_offsets[0] is -4"},
    {"offsets reversed", "{\"a\": " T("F32", "[0]", 4, 0) "}", 4, 0, 0, DF_E_FORMAT,
     "end before"},
    {"tensor not an object", "{\"a\": [1, 2]}", 0, 0, 0, DF_E_FORMAT, "expected an object"},
    {"metadata not strings", "{\"__metadata__\": {\"n\": 3}}", 0, 0, 0, DF_E_FORMAT,
     "values must be strings"},
    {"metadata not an object", "{\"__metadata__\": [\"x\"]}", 0, 0, 0, DF_E_FORMAT,
     "__metadata__ must be an object"},
    {"too many dimensions", "{\"a\": " T("F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4, 0, 0,
     DF_E_UNSUPPORTED, "9 dimensions"},
    {"element count overflow",
     "{\"a\": " T("F32", "[4294967296, 4294967296, 4294967296]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT,
     "too many elements"},
    {"byte count overflow", "{\"a\": " T("F64", "[4611686018427387904]", 0, 4) "}", 4, 0, 0,
     DF_E_FORMAT, "needs"},
    {"invalid UTF-8 name", "{\"\xc0\xaf\": " T("F32", "[1]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT,
     "UTF-8"},
    {"NUL in a name", "{\"a\\u0000b\": " T("F32", "[1]", 0, 4) "}", 4, 0, 0, DF_E_FORMAT, "NUL"},
};

static void test_malformed_corpus(void **state)
{
    (void)state;
    size_t n = sizeof bad_cases / sizeof bad_cases[0];
    assert_true(n >= 20);
    for (size_t i = 0; i < n; i++) {
        const bad_case *c = &bad_cases[i];
        size_t len;
        uint64_t hlen = c->hlen ? c->hlen : strlen(c->header);
        uint8_t *buf = st_bytes_len(hlen, c->header, NULL, c->data_len, &len);
        if (c->total)
            len = c->total - 1 < len ? c->total - 1 : len;
        df_safetensors *st = (df_safetensors *)1;
        df_status s = df_safetensors_open_memory(buf, len, "bad.safetensors", &st);
        const char *m = df_error_message();
        if (s != c->status || !strstr(m, c->word) || !strstr(m, "bad.safetensors"))
            fail_msg("%s: got %s '%s', expected %s with '%s'", c->what, df_status_name(s), m,
                     df_status_name(c->status), c->word);
        assert_null(st);
        free(buf);
    }
}

static void test_out_of_memory(void **state)
{
    (void)state;
    size_t len;
    uint8_t *buf = good_file(&len);
    int64_t live = df_alloc_live();
    int failures = 0;
    for (int64_t n = 1;; n++) {
        df_safetensors *st = NULL;
        df_alloc_fail_at(n);
        df_status s = df_safetensors_open_memory(buf, len, "oom", &st);
        df_alloc_fail_at(0);
        if (s == DF_OK) {
            check_good(st);
            df_safetensors_free(st);
            break;
        }
        if (s != DF_E_OOM)
            fail_msg("allocation %lld failed: %s '%s'", (long long)n, df_status_name(s),
                     df_error_message());
        assert_null(st);
        assert_int_equal(df_alloc_live(), live);
        failures++;
        assert_true(n < 5000);
    }
    assert_int_equal(df_alloc_live(), live);
    assert_true(failures >= 10);
    free(buf);
}

/* Every golden case.safetensors opens, and every tensor it holds reads as f64. */
static void test_golden_cases(void **state)
{
    (void)state;
    DIR *d = opendir(DF_GOLDEN_DIR);
    if (!d)
        skip();
    int files = 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[1024];
        snprintf(path, sizeof path, "%s/%s/case.safetensors", DF_GOLDEN_DIR, e->d_name);
        if (access(path, R_OK) != 0)
            continue;
        df_safetensors *st;
        if (df_safetensors_open(path, &st) != DF_OK)
            fail_msg("%s", df_error_message());
        for (int64_t i = 0; i < df_safetensors_count(st); i++) {
            df_tensor_info t;
            assert_int_equal(df_safetensors_at(st, i, &t), DF_OK);
            double *v = malloc((size_t)t.numel * 8 + 8);
            if (df_safetensors_read(st, t.name, DF_DTYPE_F64, v, (size_t)t.numel * 8) != DF_OK)
                fail_msg("%s", df_error_message());
            free(v);
        }
        df_safetensors_free(st);
        files++;
    }
    closedir(d);
    assert_true(files > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_memory),      cmocka_unit_test(test_good_file),
        cmocka_unit_test(test_slices),           cmocka_unit_test(test_slice_pages),
        cmocka_unit_test(test_unaligned_and_ranges), cmocka_unit_test(test_malformed_corpus),
        cmocka_unit_test(test_out_of_memory),    cmocka_unit_test(test_golden_cases),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
