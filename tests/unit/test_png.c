/*
 * Tests for images, PNG files and the generation-parameters text (src/io/png.c,
 * src/io/image_params.c): round trips, every PNG colour type on load, the all-or-nothing
 * save (unwritable folders, a disk that fills up mid-write, out of memory), and the
 * web-UI parameters form.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <spng.h>

#include <diffuse/image.h>

#include "core/alloc.h"

/* A fresh folder per test under DF_TEST_TMP. */
static char dir[512];

static int setup(void **state)
{
    (void)state;
    static int counter;
    mkdir(DF_TEST_TMP, 0777);
    snprintf(dir, sizeof dir, "%s/png-%d-%d", DF_TEST_TMP, (int)getpid(), counter++);
    return mkdir(dir, 0777);
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            remove(p);
    }
    if (d)
        closedir(d);
    return rmdir(dir);
}

static int files_in_dir(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

static df_image *noise_image(int w, int h, unsigned seed)
{
    df_image *img;
    assert_int_equal(df_image_create(w, h, &img), DF_OK);
    for (size_t i = 0; i < (size_t)w * h * 3; i++) {
        seed = seed * 1103515245u + 12345u;
        img->pixels[i] = (uint8_t)(seed >> 16);
    }
    return img;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

static bool file_has(const char *path, const char *needle)
{
    size_t len;
    char *buf = read_file(path, &len);
    bool found = buf && memmem(buf, len, needle, strlen(needle)) != NULL;
    free(buf);
    return found;
}

/* ---- the image and round trips --------------------------------------------------------- */

static void test_create_checks_the_size(void **state)
{
    (void)state;
    df_image *img = (df_image *)1;
    assert_int_equal(df_image_create(0, 5, &img), DF_E_ARG);
    assert_null(img);
    assert_int_equal(df_image_create(5, -1, &img), DF_E_ARG);
    assert_int_equal(df_image_create(3, 2, &img), DF_OK);
    assert_int_equal(img->channels, 3);
    for (int i = 0; i < 18; i++)
        assert_int_equal(img->pixels[i], 0);
    df_image_free(img);
    df_image_free(NULL);
}

static void round_trip(const char *params, const char *chunk_type)
{
    char path[600];
    snprintf(path, sizeof path, "%s/out.png", dir);
    df_image *img = noise_image(37, 23, 5), *back = NULL;
    assert_int_equal(df_image_save_png(img, path, params), DF_OK);
    char *got = (char *)1;
    assert_int_equal(df_image_load_png(path, &back, &got), DF_OK);
    assert_int_equal(back->width, 37);
    assert_int_equal(back->height, 23);
    assert_int_equal(back->channels, 3);
    assert_memory_equal(back->pixels, img->pixels, 37 * 23 * 3);
    if (params) {
        assert_non_null(got);
        assert_string_equal(got, params);
        assert_true(file_has(path, chunk_type));
    } else {
        assert_null(got);
        assert_false(file_has(path, "tEXt") || file_has(path, "iTXt"));
    }
    assert_int_equal(files_in_dir(), 1); /* no temporary file left behind */
    df_image_text_free(got);
    df_image_free(back);
    df_image_free(img);
}

static void test_round_trip_ascii_parameters(void **state)
{
    (void)state;
    round_trip("a cat\nSteps: 4, Sampler: Euler, CFG scale: 0, Seed: 42, Size: 37x23", "tEXt");
}

static void test_round_trip_latin1_and_unicode_parameters(void **state)
{
    (void)state;
    round_trip("caf\xc3\xa9 au lait", "tEXt");               /* Latin-1 fits tEXt */
    round_trip("\xe7\x8c\xab \xf0\x9f\x90\xb1 cat", "iTXt"); /* beyond Latin-1: iTXt */
    round_trip("tab\there", "iTXt");                         /* tEXt has no tabs */
}

static void test_round_trip_without_parameters(void **state)
{
    (void)state;
    round_trip(NULL, NULL);
}

static void test_invalid_utf8_parameters_are_refused(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/bad.png", dir);
    df_image *img = noise_image(4, 4, 1);
    assert_int_equal(df_image_save_png(img, path, "bad \xff byte"), DF_E_ARG);
    assert_non_null(strstr(df_error_message(), "UTF-8"));
    assert_int_equal(files_in_dir(), 0);
    df_image_free(img);
}

static void test_parameters_after_the_image_data_are_found(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/late.png", dir);
    df_image *img = noise_image(8, 8, 2);
    assert_int_equal(df_image_save_png(img, path, "late text"), DF_OK);
    /* move the tEXt chunk (with its own CRC) to just before IEND */
    size_t len;
    char *buf = read_file(path, &len);
    assert_non_null(buf);
    char *out = malloc(len), *o = out, *text = NULL;
    size_t text_len = 0;
    memcpy(o, buf, 8);
    o += 8;
    for (size_t at = 8; at < len;) {
        uint32_t n = (uint32_t)(uint8_t)buf[at] << 24 | (uint32_t)(uint8_t)buf[at + 1] << 16 |
                     (uint32_t)(uint8_t)buf[at + 2] << 8 | (uint8_t)buf[at + 3];
        size_t total = 12 + n;
        if (memcmp(buf + at + 4, "tEXt", 4) == 0) {
            text = buf + at;
            text_len = total;
        } else {
            if (memcmp(buf + at + 4, "IEND", 4) == 0) {
                assert_non_null(text);
                memcpy(o, text, text_len);
                o += text_len;
            }
            memcpy(o, buf + at, total);
            o += total;
        }
        at += total;
    }
    assert_int_equal((size_t)(o - out), len);
    FILE *f = fopen(path, "wb");
    assert_int_equal(fwrite(out, 1, len, f), len);
    fclose(f);
    df_image *back;
    char *got;
    assert_int_equal(df_image_load_png(path, &back, &got), DF_OK);
    assert_non_null(got);
    assert_string_equal(got, "late text");
    df_image_text_free(got);
    df_image_free(back);
    df_image_free(img);
    free(buf);
    free(out);
}

/* ---- the all-or-nothing save ---------------------------------------------------------- */

static void test_unwritable_path_is_an_io_error_and_leaves_no_file(void **state)
{
    (void)state;
    df_image *img = noise_image(4, 4, 3);
    char path[700];
    snprintf(path, sizeof path, "%s/missing-folder/out.png", dir);
    assert_int_equal(df_image_save_png(img, path, "p"), DF_E_IO);
    assert_non_null(strstr(df_error_message(), path));
    assert_int_equal(files_in_dir(), 0);

    /* a folder where the file should go: the rename fails, the temporary file goes */
    snprintf(path, sizeof path, "%s/taken", dir);
    assert_int_equal(mkdir(path, 0777), 0);
    assert_int_equal(df_image_save_png(img, path, "p"), DF_E_IO);
    assert_non_null(strstr(df_error_message(), path));
    assert_int_equal(files_in_dir(), 1);
    rmdir(path);

    /* a path through a regular file */
    snprintf(path, sizeof path, "%s/plain", dir);
    FILE *f = fopen(path, "w");
    fclose(f);
    char below[800];
    snprintf(below, sizeof below, "%s/out.png", path);
    assert_int_equal(df_image_save_png(img, below, NULL), DF_E_IO);
    assert_int_equal(files_in_dir(), 1);
    df_image_free(img);
}

static void test_failed_write_keeps_the_existing_file(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/keep.png", dir);
    df_image *good = noise_image(16, 16, 7), *big = noise_image(256, 256, 8);
    assert_int_equal(df_image_save_png(good, path, "the good one"), DF_OK);

    /* the disk "fills up" after 4 KiB: writing the large image fails half-way */
    struct rlimit old, small = {4096, 4096};
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
    small.rlim_max = old.rlim_max;
    void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    df_status st = df_image_save_png(big, path, "the bad one");
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, old_handler);
    assert_int_equal(st, DF_E_IO);
    assert_non_null(strstr(df_error_message(), path));

    assert_int_equal(files_in_dir(), 1); /* the temporary file is gone */
    df_image *back;
    char *text;
    assert_int_equal(df_image_load_png(path, &back, &text), DF_OK);
    assert_int_equal(back->width, 16);
    assert_memory_equal(back->pixels, good->pixels, 16 * 16 * 3);
    assert_string_equal(text, "the good one");
    df_image_text_free(text);
    df_image_free(back);
    df_image_free(good);
    df_image_free(big);
}

static void test_save_and_load_survive_every_allocation_failure(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/oom.png", dir);
    df_image *img = noise_image(20, 10, 9);
    int64_t live = df_alloc_live();
    bool saved = false;
    for (int k = 1; k < 400 && !saved; k++) {
        df_alloc_fail_at(k);
        df_status st = df_image_save_png(img, path, "some \xe2\x9c\x93 text");
        df_alloc_fail_at(0);
        assert_int_equal(df_alloc_live(), live);
        if (st == DF_OK) {
            saved = true;
        } else {
            assert_int_equal(st, DF_E_OOM);
            assert_int_equal(files_in_dir(), 0);
        }
    }
    assert_true(saved);
    bool loaded = false;
    for (int k = 1; k < 400 && !loaded; k++) {
        df_image *back = NULL;
        char *text = NULL;
        df_alloc_fail_at(k);
        df_status st = df_image_load_png(path, &back, &text);
        df_alloc_fail_at(0);
        if (st == DF_OK) {
            loaded = true;
            assert_string_equal(text, "some \xe2\x9c\x93 text");
            df_image_text_free(text);
            df_image_free(back);
        } else {
            assert_int_equal(st, DF_E_OOM);
            assert_null(back);
            assert_null(text);
        }
        assert_int_equal(df_alloc_live(), live);
    }
    assert_true(loaded);
    df_image_free(img);
}

/* ---- loading what other programs write ------------------------------------------------ */

static struct spng_ihdr ihdr(uint32_t w, uint32_t h, uint8_t depth, uint8_t color_type)
{
    return (struct spng_ihdr){
        .width = w, .height = h, .bit_depth = depth, .color_type = color_type};
}

static void write_png(const char *path, struct spng_ihdr header, const void *data, size_t len,
                      const struct spng_plte *plte)
{
    spng_ctx *ctx = spng_ctx_new(SPNG_CTX_ENCODER);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(spng_set_png_file(ctx, f), 0);
    assert_int_equal(spng_set_ihdr(ctx, &header), 0);
    if (plte)
        assert_int_equal(spng_set_plte(ctx, (struct spng_plte *)plte), 0);
    assert_int_equal(spng_encode_image(ctx, data, len, SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE), 0);
    spng_ctx_free(ctx);
    fclose(f);
}

static df_image *load(const char *path)
{
    df_image *img;
    char *text = (char *)1;
    assert_int_equal(df_image_load_png(path, &img, &text), DF_OK);
    assert_null(text);
    return img;
}

static void test_every_colour_type_loads_as_rgb8(void **state)
{
    (void)state;
    char path[600];
    snprintf(path, sizeof path, "%s/other.png", dir);

    uint8_t grey[2] = {10, 250};
    write_png(path, ihdr(2, 1, 8, SPNG_COLOR_TYPE_GRAYSCALE), grey, 2, NULL);
    df_image *img = load(path);
    assert_memory_equal(img->pixels, ((uint8_t[]){10, 10, 10, 250, 250, 250}), 6);
    df_image_free(img);

    uint8_t ga[4] = {7, 0, 200, 255};
    write_png(path, ihdr(2, 1, 8, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA), ga, 4, NULL);
    img = load(path);
    assert_memory_equal(img->pixels, ((uint8_t[]){7, 7, 7, 200, 200, 200}), 6);
    df_image_free(img);

    uint8_t rgba[8] = {1, 2, 3, 0, 4, 5, 6, 128};
    write_png(path, ihdr(2, 1, 8, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA), rgba, 8, NULL);
    img = load(path);
    assert_memory_equal(img->pixels, ((uint8_t[]){1, 2, 3, 4, 5, 6}), 6);
    df_image_free(img);

    uint16_t rgb16[3] = {0x12ff, 0xfffe, 0x0001}; /* host-endian for SPNG_FMT_PNG */
    write_png(path, ihdr(1, 1, 16, SPNG_COLOR_TYPE_TRUECOLOR), rgb16, 6, NULL);
    img = load(path);
    assert_int_equal(img->pixels[0], 0x12); /* the high byte, not rounded */
    assert_int_equal(img->pixels[1], 0xff);
    assert_int_equal(img->pixels[2], 0x00);
    df_image_free(img);

    struct spng_plte plte = {.n_entries = 2};
    plte.entries[0] = (struct spng_plte_entry){9, 8, 7, 255};
    plte.entries[1] = (struct spng_plte_entry){100, 150, 200, 255};
    uint8_t idx[1] = {0x40}; /* 2 pixels at 2 bits: 1, 0 */
    write_png(path, ihdr(2, 1, 2, SPNG_COLOR_TYPE_INDEXED), idx, 1, &plte);
    img = load(path);
    assert_memory_equal(img->pixels, ((uint8_t[]){100, 150, 200, 9, 8, 7}), 6);
    df_image_free(img);
}

static void test_bad_files_are_refused(void **state)
{
    (void)state;
    char path[600];
    df_image *img = (df_image *)1;
    char *text = (char *)1;
    snprintf(path, sizeof path, "%s/none.png", dir);
    assert_int_equal(df_image_load_png(path, &img, &text), DF_E_IO);
    assert_null(img);
    assert_null(text);
    assert_non_null(strstr(df_error_message(), "none.png"));

    snprintf(path, sizeof path, "%s/text.png", dir);
    FILE *f = fopen(path, "w");
    fputs("this is not a PNG file at all", f);
    fclose(f);
    assert_int_equal(df_image_load_png(path, &img, NULL), DF_E_FORMAT);
    assert_null(img);

    /* a real PNG cut short */
    df_image *good = noise_image(32, 32, 4);
    assert_int_equal(df_image_save_png(good, path, "x"), DF_OK);
    size_t len;
    char *buf = read_file(path, &len);
    f = fopen(path, "wb");
    fwrite(buf, 1, len / 2, f);
    fclose(f);
    df_status st = df_image_load_png(path, &img, NULL);
    assert_true(st == DF_E_FORMAT);
    assert_null(img);
    free(buf);
    df_image_free(good);
}

/* ---- the parameters text -------------------------------------------------------------- */

static void test_parameters_have_the_web_ui_form(void **state)
{
    (void)state;
    char *text;
    df_image_params p = {.prompt = "a golden retriever surfing a wave",
                         .steps = 4,
                         .cfg_scale = 0,
                         .seed = 42,
                         .width = 512,
                         .height = 512,
                         .model = "FLUX.1-schnell"};
    assert_int_equal(df_image_format_parameters(&p, &text), DF_OK);
    assert_string_equal(text, "a golden retriever surfing a wave\n"
                              "Steps: 4, Sampler: Euler, CFG scale: 0, Seed: 42, "
                              "Size: 512x512, Model: FLUX.1-schnell");
    df_image_text_free(text);

    p.negative_prompt = "blurry";
    p.cfg_scale = 3.5;
    p.model = "models/a, b: c";
    p.sampler = "Euler";
    assert_int_equal(df_image_format_parameters(&p, &text), DF_OK);
    assert_string_equal(text, "a golden retriever surfing a wave\n"
                              "Negative prompt: blurry\n"
                              "Steps: 4, Sampler: Euler, CFG scale: 3.5, Seed: 42, "
                              "Size: 512x512, Model: \"models/a, b: c\"");
    df_image_text_free(text);
}

static void test_parameters_round_trip(void **state)
{
    (void)state;
    df_image_params p = {.prompt = "two lines\n  of prompt, with: punctuation",
                         .negative_prompt = "low quality\nwatermark",
                         .steps = 28,
                         .sampler = "Euler",
                         .cfg_scale = 0.1,
                         .seed = UINT64_C(18446744073709551615),
                         .width = 1024,
                         .height = 768,
                         .model = "dir \"quoted\"\\, odd:name"};
    char *text;
    assert_int_equal(df_image_format_parameters(&p, &text), DF_OK);
    df_image_params q;
    assert_int_equal(df_image_parse_parameters(text, &q), DF_OK);
    assert_string_equal(q.prompt, p.prompt);
    assert_string_equal(q.negative_prompt, p.negative_prompt);
    assert_int_equal(q.steps, 28);
    assert_string_equal(q.sampler, "Euler");
    assert_true(q.cfg_scale == 0.1);
    assert_true(q.seed == p.seed);
    assert_int_equal(q.width, 1024);
    assert_int_equal(q.height, 768);
    assert_string_equal(q.model, p.model);
    df_image_params_deinit(&q);
    assert_null(q.prompt);
    df_image_text_free(text);
}

static void test_parameters_from_a_web_ui_file(void **state)
{
    (void)state;
    df_image_params q;
    assert_int_equal(df_image_parse_parameters(
                         "masterpiece, a castle\nNegative prompt: ugly\n"
                         "Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 7, "
                         "Seed: 1234, Size: 512x768, Model hash: 6ce0161689, Model: v1-5, "
                         "Version: v1.9.4\n",
                         &q),
                     DF_OK);
    assert_string_equal(q.prompt, "masterpiece, a castle");
    assert_string_equal(q.negative_prompt, "ugly");
    assert_int_equal(q.steps, 20);
    assert_string_equal(q.sampler, "DPM++ 2M");
    assert_true(q.cfg_scale == 7.0);
    assert_true(q.seed == 1234);
    assert_int_equal(q.width, 512);
    assert_int_equal(q.height, 768);
    assert_string_equal(q.model, "v1-5");
    df_image_params_deinit(&q);

    /* fewer than three pairs on the last line: it is all prompt */
    assert_int_equal(df_image_parse_parameters("a photo\nstyle: noir, mood: dark", &q), DF_OK);
    assert_string_equal(q.prompt, "a photo\nstyle: noir, mood: dark");
    assert_null(q.negative_prompt);
    assert_null(q.model);
    assert_int_equal(q.steps, 0);
    df_image_params_deinit(&q);

    assert_int_equal(df_image_parse_parameters("", &q), DF_OK);
    assert_string_equal(q.prompt, "");
    df_image_params_deinit(&q);
}

static void test_parsing_survives_every_allocation_failure(void **state)
{
    (void)state;
    const char *text = "p\nNegative prompt: n\nSteps: 1, Sampler: \"a,b\", Seed: 3, Model: m";
    int64_t live = df_alloc_live();
    for (int k = 1; k < 100; k++) {
        df_image_params q;
        df_alloc_fail_at(k);
        df_status st = df_image_parse_parameters(text, &q);
        df_alloc_fail_at(0);
        if (st == DF_OK) {
            assert_string_equal(q.sampler, "a,b");
            df_image_params_deinit(&q);
            break;
        }
        assert_int_equal(st, DF_E_OOM);
        assert_null(q.prompt);
        assert_int_equal(df_alloc_live(), live);
    }
    assert_int_equal(df_alloc_live(), live);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_create_checks_the_size),
        T(test_round_trip_ascii_parameters),
        T(test_round_trip_latin1_and_unicode_parameters),
        T(test_round_trip_without_parameters),
        T(test_invalid_utf8_parameters_are_refused),
        T(test_parameters_after_the_image_data_are_found),
        T(test_unwritable_path_is_an_io_error_and_leaves_no_file),
        T(test_failed_write_keeps_the_existing_file),
        T(test_save_and_load_survive_every_allocation_failure),
        T(test_every_colour_type_loads_as_rgb8),
        T(test_bad_files_are_refused),
        T(test_parameters_have_the_web_ui_form),
        T(test_parameters_round_trip),
        T(test_parameters_from_a_web_ui_file),
        T(test_parsing_survives_every_allocation_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#undef T
}
