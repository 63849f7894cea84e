/*
 * int8 compute on a whole pipeline: the tiny FLUX.1 pipeline that `diffuse make-tiny`
 * writes (tests/int8.cmake makes it first; the folder is the first argument:
 * DF_TEST_NEEDS_ARGS). The same image bit for bit without offload, with model offload
 * and with sequential offload (quantization is deterministic, so re-quantizing a released
 * weight gives the same bytes); the transformer's resident weights are the 8-bit size; the
 * image stays close to the f32 one; a folder saved by df_quantize_model loads and gives
 * the same image and latents as quantizing on load, bit for bit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include <diffuse/diffuse.h>

static const char *model_dir;

static void generate_from(const char *dir, df_dtype dtype, df_offload level, df_gen_output *out)
{
    df_pipeline *p = NULL;
    assert_int_equal(
        df_pipeline_load(dir, &(df_load_opts){.threads = 2, .offload = level, .dtype = dtype}, &p),
        DF_OK);
    assert_int_equal(
        df_pipeline_run(
            p,
            &(df_gen_params){
                .prompt = "a red fox", .height = 64, .width = 64, .steps = 2, .seed = 7},
            out),
        DF_OK);
    df_pipeline_free(p);
}

static void generate(df_dtype dtype, df_offload level, df_gen_output *out)
{
    generate_from(model_dir, dtype, level, out);
}

static double psnr(const df_image *a, const df_image *b, size_t bytes)
{
    double se = 0;
    for (size_t i = 0; i < bytes; i++) {
        double d = (double)a->pixels[i] - (double)b->pixels[i];
        se += d * d;
    }
    return se > 0 ? 10.0 * log10(255.0 * 255.0 / (se / (double)bytes)) : INFINITY;
}

static void test_int8_offload_levels_agree(void **state)
{
    (void)state;
    static df_gen_output f32, none, model, seq;
    generate(DF_DTYPE_F32, DF_OFFLOAD_MODEL, &f32);
    generate(DF_DTYPE_I8, DF_OFFLOAD_NONE, &none);
    generate(DF_DTYPE_I8, DF_OFFLOAD_MODEL, &model);
    generate(DF_DTYPE_I8, DF_OFFLOAD_SEQUENTIAL, &seq);
    size_t bytes = (size_t)none.width * (size_t)none.height * 3;
    assert_memory_equal(none.images[0]->pixels, model.images[0]->pixels, bytes);
    assert_memory_equal(none.images[0]->pixels, seq.images[0]->pixels, bytes);
    /* the transformer phase with model offload: its weights alone are resident */
    int64_t f32_bytes = f32.phases[1].peak_resident_weight_bytes;
    int64_t i8_bytes = model.phases[1].peak_resident_weight_bytes;
    print_message("transformer resident: f32 %lld bytes, int8 %lld (%.3f); PSNR of the int8 "
                  "image against f32: %.1f dB\n",
                  (long long)f32_bytes, (long long)i8_bytes, (double)i8_bytes / (double)f32_bytes,
                  psnr(none.images[0], f32.images[0], bytes));
    assert_true(i8_bytes > 0);
    assert_true(i8_bytes < f32_bytes / 2); /* 8 of 32 bits, plus scales and kept layers */
    assert_true(psnr(none.images[0], f32.images[0], bytes) > 30.0);
    df_gen_output_free(&f32);
    df_gen_output_free(&none);
    df_gen_output_free(&model);
    df_gen_output_free(&seq);
}

/* Every execution mode gives an image close to strict eager's. */
static void test_int8_modes(void **state)
{
    (void)state;
    static df_gen_output eager, fused, compiled;
    generate(DF_DTYPE_I8, DF_OFFLOAD_NONE, &eager);
    df_pipeline *p = NULL;
    df_gen_params g = {.prompt = "a red fox", .height = 64, .width = 64, .steps = 2, .seed = 7};
    assert_int_equal(
        df_pipeline_load(
            model_dir,
            &(df_load_opts){.threads = 2, .dtype = DF_DTYPE_I8, .mode = DF_DEFER_AND_FUSE}, &p),
        DF_OK);
    assert_int_equal(df_pipeline_run(p, &g, &fused), DF_OK);
    df_pipeline_free(p);
    assert_int_equal(df_pipeline_load(model_dir,
                                      &(df_load_opts){.threads = 2,
                                                      .dtype = DF_DTYPE_I8,
                                                      .compile = true,
                                                      .mode = DF_DEFER_AND_FUSE},
                                      &p),
                     DF_OK);
    assert_int_equal(df_pipeline_run(p, &g, &compiled), DF_OK);
    df_pipeline_free(p);
    size_t bytes = (size_t)eager.width * (size_t)eager.height * 3;
    assert_true(psnr(eager.images[0], fused.images[0], bytes) > 40.0);
    assert_true(psnr(eager.images[0], compiled.images[0], bytes) > 40.0);
    df_gen_output_free(&eager);
    df_gen_output_free(&fused);
    df_gen_output_free(&compiled);
}

static void test_saved_quantized_round_trip(void **state)
{
    (void)state;
    char out[4096];
    snprintf(out, sizeof out, "%s/int8-saved", DF_TEST_TMP);
    assert_int_equal(df_quantize_model(model_dir, out, df_int8_default_group()), DF_OK);
    /* the transformer's linears are stored as I8 with their scales beside them */
    char path[4200];
    snprintf(path, sizeof path, "%s/transformer/diffusion_pytorch_model.safetensors", out);
    df_weights *w;
    assert_int_equal(df_weights_open(path, &w), DF_OK);
    int64_t i8 = 0, scales = 0;
    for (int64_t i = 0; i < df_weights_count(w); i++) {
        df_tensor_info info;
        assert_int_equal(df_weights_at(w, i, &info), DF_OK);
        i8 += info.dtype == DF_DTYPE_I8;
        size_t len = strlen(info.name);
        scales += len > 13 && strcmp(info.name + len - 13, ".weight_scale") == 0;
    }
    df_weights_free(w);
    assert_true(i8 > 0);
    assert_int_equal(i8, scales);

    static df_gen_output on_load, saved, saved_f32, f32_attention;
    generate(DF_DTYPE_I8, DF_OFFLOAD_NONE, &on_load);
    generate_from(out, DF_DTYPE_I8, DF_OFFLOAD_NONE, &saved);
    generate_from(out, DF_DTYPE_F32, DF_OFFLOAD_MODEL, &saved_f32); /* I8 weights: int8 anyway */
    /* f32 compute keeps f32 attention: int8 compute with its int8 scores switched off */
    setenv("DIFFUSE_INT8_ATTENTION", "0", 1);
    generate(DF_DTYPE_I8, DF_OFFLOAD_NONE, &f32_attention);
    unsetenv("DIFFUSE_INT8_ATTENTION");
    size_t bytes = (size_t)on_load.width * (size_t)on_load.height * 3;
    assert_memory_equal(on_load.images[0]->pixels, saved.images[0]->pixels, bytes);
    assert_memory_equal(on_load.latents, saved.latents,
                        (size_t)on_load.latents_shape[1] * (size_t)on_load.latents_shape[2] * 4);
    assert_memory_equal(f32_attention.images[0]->pixels, saved_f32.images[0]->pixels, bytes);
    assert_true(psnr(on_load.images[0], saved_f32.images[0], bytes) > 40.0);
    /* model offload reports the 8-bit bytes as resident for both */
    assert_true(saved_f32.phases[1].peak_resident_weight_bytes > 0);
    df_gen_output_free(&on_load);
    df_gen_output_free(&saved);
    df_gen_output_free(&saved_f32);
    df_gen_output_free(&f32_attention);
    /* a bad group is refused, naming it */
    assert_int_equal(df_quantize_model(model_dir, out, 7), DF_E_ARG);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: test_int8_pipeline TINY_FLUX_DIR\n");
        return 2;
    }
    model_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_offload_levels_agree),
        cmocka_unit_test(test_int8_modes),
        cmocka_unit_test(test_saved_quantized_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
