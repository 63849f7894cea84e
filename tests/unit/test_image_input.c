/*
 * Tests for input images (src/io/image_load.c, src/io/image_resize.c): every accepted PNG
 * and JPEG form decodes to the RGB bytes PIL's Image.open(...).convert("RGB") gives; the
 * refused kinds (not an image, truncated, 0x0, 16-bit, CMYK, too many pixels) fail with a
 * message naming the file and the rule; df_image_resize equals PIL's Image.resize for each
 * filter. The PIL references are tests/cases/image-input (tools/refgen/image_input.py).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <diffuse/image.h>

#include "core/alloc.h"

#define CASE_DIR DF_GOLDEN_DIR "/../cases/image-input"

static df_image *load_ok(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", CASE_DIR, name);
    df_image *img = NULL;
    df_status st = df_image_load(path, &img);
    if (st != DF_OK)
        fail_msg("%s: %s", path, df_error_message());
    return img;
}

static uint8_t *read_file(const char *name, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", CASE_DIR, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* The largest byte difference between two images of the same size. */
static int max_diff(const df_image *a, const df_image *b)
{
    assert_int_equal(a->width, b->width);
    assert_int_equal(a->height, b->height);
    int worst = 0;
    for (size_t i = 0; i < (size_t)a->width * a->height * 3; i++) {
        int d = abs((int)a->pixels[i] - (int)b->pixels[i]);
        worst = d > worst ? d : worst;
    }
    return worst;
}

static void test_accepted_forms_decode_as_pil_does(void **state)
{
    (void)state;
    static const char *names[] = {"rgb.png",     "grey.png",   "grey-alpha.png", "rgba.png",
                                  "palette.png", "yuv420.jpg", "yuv444.jpg",     "grey.jpg"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char ref[256];
        snprintf(ref, sizeof ref, "dec-%s.png", names[i]);
        char *dot = strrchr(ref, '.');
        for (char *p = ref; p < dot; p++)
            if (*p == '.')
                *p = '-';
        df_image *img = load_ok(names[i]), *want = load_ok(ref);
        assert_int_equal(img->width, 37);
        assert_int_equal(img->height, 29);
        int d = max_diff(img, want);
        if (d != 0)
            fail_msg("%s differs from PIL's decode by %d", names[i], d);
        df_image_free(img);
        df_image_free(want);
    }
}

static void expect_refused(const char *name, const void *data, size_t len, df_status code,
                           const char *rule)
{
    df_image *img = (df_image *)1;
    df_status st = df_image_decode(data, len, name, &img);
    assert_int_equal(st, code);
    assert_null(img);
    const char *msg = df_error_message();
    if (!strstr(msg, name) || !strstr(msg, rule))
        fail_msg("message '%s' should name '%s' and '%s'", msg, name, rule);
}

static void test_refused_kinds_name_the_file_and_the_rule(void **state)
{
    (void)state;
    size_t len;
    uint8_t *png16 = read_file("sixteen-bit.png", &len);
    expect_refused("sixteen-bit.png", png16, len, DF_E_UNSUPPORTED, "16-bit");
    free(png16);
    uint8_t *cmyk = read_file("cmyk.jpg", &len);
    expect_refused("cmyk.jpg", cmyk, len, DF_E_UNSUPPORTED, "CMYK");
    free(cmyk);

    expect_refused("notes.txt", "hello, world", 12, DF_E_FORMAT, "not a PNG or JPEG");
    expect_refused("empty.png", "", 0, DF_E_FORMAT, "empty");

    /* every truncation of a PNG and a JPEG is refused, never read as a partial picture
     * (up to the PNG's last 4 bytes: libspng does not read IEND's fixed CRC) */
    const char *files[] = {"rgb.png", "yuv420.jpg"};
    for (int f = 0; f < 2; f++) {
        uint8_t *data = read_file(files[f], &len);
        for (size_t cut = 1; cut < len - (f == 0 ? 4 : 0);
             cut += cut < 64 || cut > len - 64 ? 1 : 7) {
            df_image *img = (df_image *)1;
            df_status st = df_image_decode(data, cut, files[f], &img);
            if (st != DF_E_FORMAT)
                fail_msg("%s cut at %zu of %zu bytes: status %d: %s", files[f], cut, len, st,
                         df_error_message());
            assert_null(img);
            assert_non_null(strstr(df_error_message(), files[f]));
        }
        free(data);
    }
}

/* Rewrites the width and height of an IHDR and its CRC. */
static void png_set_size(uint8_t *png, uint32_t w, uint32_t h)
{
    uint8_t *ihdr = png + 8 + 4; /* the chunk type, then the data */
    for (int i = 0; i < 4; i++) {
        ihdr[4 + i] = (uint8_t)(w >> (24 - 8 * i));
        ihdr[8 + i] = (uint8_t)(h >> (24 - 8 * i));
    }
    uint32_t crc = 0xffffffffu;
    for (int i = 0; i < 4 + 13; i++) {
        crc ^= ihdr[i];
        for (int k = 0; k < 8; k++)
            crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1)));
    }
    crc ^= 0xffffffffu;
    for (int i = 0; i < 4; i++)
        ihdr[17 + i] = (uint8_t)(crc >> (24 - 8 * i));
}

static void test_sizes_outside_the_limits_are_refused_from_the_header(void **state)
{
    (void)state;
    size_t len;
    uint8_t *png = read_file("rgb.png", &len);
    png_set_size(png, 0, 0);
    df_image *img = (df_image *)1;
    assert_int_equal(df_image_decode(png, len, "zero.png", &img), DF_E_FORMAT);
    assert_null(img);
    assert_non_null(strstr(df_error_message(), "zero.png"));

    /* 20000 x 20000 claims 1.2 GB of pixels: refused before any of it is allocated */
    png_set_size(png, 20000, 20000);
    int64_t live = df_alloc_live();
    assert_int_equal(df_image_decode(png, len, "huge.png", &img), DF_E_ARG);
    assert_int_equal(df_alloc_live(), live);
    assert_non_null(strstr(df_error_message(), "huge.png"));
    assert_non_null(strstr(df_error_message(), "limit"));
    free(png);
}

static void test_decoding_survives_every_allocation_failure(void **state)
{
    (void)state;
    const char *files[] = {"rgb.png", "palette.png", "yuv420.jpg"};
    for (int f = 0; f < 3; f++) {
        size_t len;
        uint8_t *data = read_file(files[f], &len);
        int64_t live = df_alloc_live();
        df_status st = DF_E_OOM;
        for (int64_t k = 1; st == DF_E_OOM && k < 1000; k++) {
            df_image *img = NULL;
            df_alloc_fail_at(k);
            st = df_image_decode(data, len, files[f], &img);
            df_alloc_fail_at(0);
            if (st == DF_OK)
                df_image_free(img);
            else
                assert_null(img);
            assert_int_equal(df_alloc_live(), live);
        }
        assert_int_equal(st, DF_OK);
        free(data);
    }
}

static void test_resize_equals_pil(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        df_resample f;
    } filters[] = {{"lanczos", DF_RESAMPLE_LANCZOS},
                   {"bicubic", DF_RESAMPLE_BICUBIC},
                   {"bilinear", DF_RESAMPLE_BILINEAR},
                   {"nearest", DF_RESAMPLE_NEAREST}};
    static const int sizes[][2] = {{64, 64}, {16, 16}, {48, 24}, {29, 37}, {37, 13}, {8, 29}};
    df_image *src = load_ok("rgb.png");
    int failures = 0;
    for (int f = 0; f < 4; f++) {
        for (int s = 0; s < 6; s++) {
            char ref[128];
            snprintf(ref, sizeof ref, "resize-%s-%dx%d.png", filters[f].name, sizes[s][0],
                     sizes[s][1]);
            df_image *want = load_ok(ref), *got = NULL;
            assert_int_equal(df_image_resize(src, sizes[s][0], sizes[s][1], filters[f].f, &got),
                             DF_OK);
            int d = max_diff(got, want);
            if (d != 0) {
                print_error("%s: differs from PIL by %d\n", ref, d);
                failures++;
            }
            df_image_free(got);
            df_image_free(want);
        }
    }
    assert_int_equal(failures, 0);
    df_image *out = (df_image *)1;
    assert_int_equal(df_image_resize(src, 0, 10, DF_RESAMPLE_LANCZOS, &out), DF_E_ARG);
    assert_null(out);
    df_image_free(src);
}

static void test_sha256_of_files(void **state)
{
    (void)state;
    static const struct {
        const char *text, *hex;
    } vectors[] = {
        {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", /* 56 bytes: two blocks */
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    };
    char path[512];
    snprintf(path, sizeof path, "%s/sha256-%d.txt", DF_TEST_TMP, (int)getpid());
    for (size_t i = 0; i < sizeof vectors / sizeof vectors[0]; i++) {
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        fputs(vectors[i].text, f);
        fclose(f);
        char hex[65];
        assert_int_equal(df_file_sha256(path, hex), DF_OK);
        assert_string_equal(hex, vectors[i].hex);
    }
    remove(path);
    char hex[65];
    assert_int_equal(df_file_sha256("/nonexistent/in.png", hex), DF_E_IO);
    assert_non_null(strstr(df_error_message(), "/nonexistent/in.png"));
}

static void test_img2img_parameters_round_trip(void **state)
{
    (void)state;
    df_image_params p = {.prompt = "a fox",
                         .steps = 4,
                         .seed = 3,
                         .width = 64,
                         .height = 64,
                         .denoising_strength = 0.35,
                         .init_image = "in put.png",
                         .init_image_hash =
                             "749b73675cfa76f2615ecd603a4594eabb8b0c16fdcd37a1c180f6029eb17bfe"};
    char *text;
    assert_int_equal(df_image_format_parameters(&p, &text), DF_OK);
    assert_non_null(strstr(text, "Denoising strength: 0.35, Init image: in put.png, "
                                 "Init image hash: 749b7367"));
    df_image_params q;
    assert_int_equal(df_image_parse_parameters(text, &q), DF_OK);
    assert_true(q.denoising_strength == 0.35);
    assert_string_equal(q.init_image, p.init_image);
    assert_string_equal(q.init_image_hash, p.init_image_hash);
    df_image_params_deinit(&q);
    df_image_text_free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_forms_decode_as_pil_does),
        cmocka_unit_test(test_refused_kinds_name_the_file_and_the_rule),
        cmocka_unit_test(test_sizes_outside_the_limits_are_refused_from_the_header),
        cmocka_unit_test(test_decoding_survives_every_allocation_failure),
        cmocka_unit_test(test_resize_equals_pil),
        cmocka_unit_test(test_sha256_of_files),
        cmocka_unit_test(test_img2img_parameters_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
