/*
 * Config keys of the diffusers 0.42 / transformers 5.x classes the supported pipelines load.
 *
 * First, coverage: tests/cases/config-keys/keys.json lists every key those classes take
 * (tools/refgen/dump_config_keys.py reads them from the installed source), and
 * docs/config-keys.md must say, for each one, what diffuse does with it. A key a new
 * diffusers adds fails this test until someone decides.
 *
 * Then the decisions themselves, through the real loaders: each value diffuse does not
 * implement is refused with DF_E_UNSUPPORTED and a message naming the file, the key and the
 * value; keys that are read change what is built (decoder_block_out_channels); keys that are
 * ignored (force_upcast) load either way. Each variant is a golden folder with one edit in
 * its config.json and its weights linked.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <diffuse/diffuse.h>

#include "unit/io_files.h"

#define CASES_DIR DF_GOLDEN_DIR "/../cases"
#define DOCS      DF_GOLDEN_DIR "/../../docs/config-keys.md"

/* --- helpers ----------------------------------------------------------------------------- */

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* A copy of the folder `src` under DF_TEST_TMP/name: every file but config.json linked,
 * config.json with the first `old` replaced by `new` (which must be there). */
static const char *variant(const char *name, const char *src, const char *old, const char *new,
                           char *dir, size_t cap)
{
    test_dir(name, dir, cap);
    DIR *d = opendir(src);
    assert_non_null(d);
    char from[1024], to[1024];
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "config.json") == 0)
            continue;
        snprintf(from, sizeof from, "%s/%s", src, e->d_name);
        assert_int_equal(symlink(from, path_in(dir, e->d_name, to, sizeof to)), 0);
    }
    closedir(d);
    snprintf(from, sizeof from, "%s/config.json", src);
    char *text = read_all(from);
    char *at = strstr(text, old);
    if (!at)
        fail_msg("'%s' is not in %s", old, from);
    size_t head = (size_t)(at - text), n = strlen(text) + strlen(new) + 1;
    char *edited = malloc(n);
    snprintf(edited, n, "%.*s%s%s", (int)head, text, new, at + strlen(old));
    assert_int_equal(write_text(path_in(dir, "config.json", to, sizeof to), edited), 0);
    free(text);
    free(edited);
    return dir;
}

/* The last error message holds each of the (NULL-terminated) words. */
static void assert_message_names(const char *first, ...)
{
    const char *msg = df_error_message();
    va_list ap;
    va_start(ap, first);
    for (const char *w = first; w; w = va_arg(ap, const char *))
        if (!strstr(msg, w))
            fail_msg("message lacks '%s': %s", w, msg);
    va_end(ap);
}

static df_ctx *new_ctx(void)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = 2}, &ctx), DF_OK);
    return ctx;
}

/* --- coverage ---------------------------------------------------------------------------- */

/* docs/config-keys.md has a row "| <class> | `<key>` | ... |" for every key of keys.json; a
 * transformers config's key may also sit under "(every transformers config)". */
static void test_every_key_of_the_current_classes_is_documented(void **state)
{
    (void)state;
    char *docs = read_all(DOCS);
    df_json *keys = NULL;
    assert_int_equal(df_json_parse_file(CASES_DIR "/config-keys/keys.json", &keys), DF_OK);
    const df_json *classes = df_json_get(keys, "classes");
    assert_true(df_json_object_size(classes) >= 11);
    int64_t checked = 0, missing = 0;
    for (int64_t c = 0; c < df_json_object_size(classes); c++) {
        const char *cls;
        const df_json *list = df_json_object_at(classes, c, &cls);
        bool transformers = strstr(cls, "Config") != NULL;
        for (int64_t k = 0; k < df_json_object_size(list); k++) {
            const char *key;
            df_json_object_at(list, k, &key);
            char row[256], common[256];
            snprintf(row, sizeof row, "| %s | `%s` |", cls, key);
            snprintf(common, sizeof common, "| (every transformers config) | `%s` |", key);
            if (!strstr(docs, row) && !(transformers && strstr(docs, common))) {
                fprintf(stderr, "docs/config-keys.md has no row for %s.%s\n", cls, key);
                missing++;
            }
            checked++;
        }
    }
    assert_true(checked > 250);
    assert_int_equal(missing, 0);
    df_json_free(keys);
    free(docs);
}

/* --- refusals ---------------------------------------------------------------------------- */

static void test_transformer_values_not_implemented_are_refused(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[512];

    df_flux *flux = NULL;
    variant("ck_flux_patch", DF_GOLDEN_DIR "/flux-transformer/model", "\"patch_size\": 1",
            "\"patch_size\": 2", dir, sizeof dir);
    assert_int_equal(df_flux_load(ctx, dir, &flux), DF_E_UNSUPPORTED);
    assert_null(flux);
    assert_message_names("config.json", "'patch_size'", "2", NULL);

    df_flux2 *flux2 = NULL;
    variant("ck_flux2_patch", DF_GOLDEN_DIR "/flux2-transformer/model", "\"patch_size\": 1",
            "\"patch_size\": 2", dir, sizeof dir);
    assert_int_equal(df_flux2_load(ctx, dir, &flux2), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'patch_size'", "2", NULL);

    df_sd3 *sd3 = NULL;
    variant("ck_sd3_qk", DF_GOLDEN_DIR "/sd3-transformer/model", "\"qk_norm\": \"rms_norm\"",
            "\"qk_norm\": \"layer_norm\"", dir, sizeof dir);
    assert_int_equal(df_sd3_load(ctx, dir, &sd3), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'qk_norm'", "layer_norm", NULL);

    variant("ck_sd3_pos", DF_GOLDEN_DIR "/sd3-transformer/model", "\"pos_embed_max_size\": 16",
            "\"pos_embed_max_size\": null", dir, sizeof dir);
    assert_int_equal(df_sd3_load(ctx, dir, &sd3), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'pos_embed_max_size'", "null", NULL);
    df_ctx_free(ctx);
}

static void test_vae_values_not_implemented_are_refused(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[512];
    df_vae *vae = NULL;

    variant("ck_vae_act", DF_GOLDEN_DIR "/vae-decode-sd3/vae", "\"act_fn\": \"silu\"",
            "\"act_fn\": \"gelu\"", dir, sizeof dir);
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_E_UNSUPPORTED);
    assert_null(vae);
    assert_message_names("config.json", "act_fn", "gelu", NULL);

    variant("ck_vae_up", DF_GOLDEN_DIR "/vae-decode-sd3/vae", "\"UpDecoderBlock2D\"",
            "\"AttnUpDecoderBlock2D\"", dir, sizeof dir);
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "up_block_types[0]", "AttnUpDecoderBlock2D", NULL);

    variant("ck_vae2_patch", DF_GOLDEN_DIR "/vae-decode-flux2/vae", "\"patch_size\": [\n    2,",
            "\"patch_size\": [\n    1,", dir, sizeof dir);
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "patch_size", "[1, 2]", NULL);
    df_ctx_free(ctx);
}

static void test_scheduler_values_not_implemented_are_refused(void **state)
{
    (void)state;
    static const char *const keys[] = {"use_karras_sigmas", "use_exponential_sigmas",
                                       "use_beta_sigmas", "stochastic_sampling"};
    for (int i = 0; i < 4; i++) {
        char json[256];
        snprintf(json, sizeof json,
                 "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"shift\": 3.0, "
                 "\"%s\": true}",
                 keys[i]);
        df_scheduler *s = (df_scheduler *)1;
        assert_int_equal(df_scheduler_load_json(json, strlen(json), "scheduler_config.json", &s),
                         DF_E_UNSUPPORTED);
        assert_null(s);
        assert_message_names("scheduler_config.json", keys[i], "true", NULL);
        /* false is the implemented value */
        snprintf(json, sizeof json,
                 "{\"_class_name\": \"FlowMatchEulerDiscreteScheduler\", \"%s\": false}", keys[i]);
        assert_int_equal(df_scheduler_load_json(json, strlen(json), "s.json", &s), DF_OK);
        df_scheduler_free(s);
    }
}

static void test_text_encoder_values_not_implemented_are_refused(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    char dir[512];

    df_clip *clip = NULL;
    variant("ck_clip_act", DF_GOLDEN_DIR "/te-clip-l/text_encoder",
            "\"hidden_act\": \"quick_gelu\"", "\"hidden_act\": \"relu\"", dir, sizeof dir);
    assert_int_equal(df_clip_load(ctx, dir, &clip), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'hidden_act'", "relu", NULL);

    df_t5 *t5 = NULL;
    variant("ck_t5_ff", DF_GOLDEN_DIR "/te-t5/text_encoder_2",
            "\"feed_forward_proj\": \"gated-gelu\"", "\"feed_forward_proj\": \"relu\"", dir,
            sizeof dir);
    assert_int_equal(df_t5_load(ctx, dir, &t5), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'feed_forward_proj'", "relu", NULL);

    df_decoder_lm *lm = NULL;
    variant("ck_mistral_rope", DF_GOLDEN_DIR "/te-mistral/text_encoder",
            "\"rope_theta\": 1000000000.0,",
            "\"rope_theta\": 1000000000.0, \"rope_parameters\": {\"rope_type\": \"yarn\", "
            "\"factor\": 4.0},",
            dir, sizeof dir);
    assert_int_equal(df_mistral_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'rope_parameters'", "yarn", NULL);

    const char *qwen3 = DF_GOLDEN_DIR "/t2i-flux2-klein/pipeline/text_encoder";
    variant("ck_qwen3_window", qwen3, "\"use_sliding_window\": false",
            "\"use_sliding_window\": true", dir, sizeof dir);
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_message_names("config.json", "'use_sliding_window'", "true", NULL);

    /* transformers 5.x names each layer's attention; a sliding layer is not implemented */
    variant("ck_qwen3_layers", qwen3, "\"full_attention\"", "\"sliding_attention\"", dir,
            sizeof dir);
    assert_int_equal(df_qwen3_load(ctx, dir, &lm), DF_E_UNSUPPORTED);
    assert_null(lm);
    assert_message_names("config.json", "'layer_types[0]'", "sliding_attention", NULL);
    df_ctx_free(ctx);
}

/* --- keys that are read, keys that are ignored -------------------------------------------- */

/* diffusers 0.42's decoder_block_out_channels build the decoder: the reference case's VAE
 * has decoder widths [4, 8, 12] and encoder widths [4, 4, 4]. Without the key (null, or [],
 * which diffusers' `or` treats the same) the decoder would be the encoder's widths, which
 * the file's decoder tensors do not have. */
static void test_decoder_block_out_channels_build_the_decoder(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    const char *src = CASES_DIR "/vae-decode-flux2-decoder-widths/vae";
    df_vae *vae = NULL;
    assert_int_equal(df_vae_load(ctx, src, &vae), DF_OK);
    const df_vae_info *c = df_vae_config(vae);
    assert_int_equal(c->n_blocks, 3);
    assert_int_equal(c->block_out_channels[0], 4);
    assert_int_equal(c->block_out_channels[1], 8);
    assert_int_equal(c->block_out_channels[2], 12);
    assert_int_equal(c->scale_factor, 4);
    df_vae_free(vae);

    char dir[512];
    static const char *const same[] = {"null", "[]"};
    for (int i = 0; i < 2; i++) {
        char edit[64];
        snprintf(edit, sizeof edit, "\"decoder_block_out_channels\": %s,", same[i]);
        variant(i ? "ck_vae_dec_empty" : "ck_vae_dec_null", src,
                "\"decoder_block_out_channels\": [\n    4,\n    8,\n    12\n  ],", edit, dir,
                sizeof dir);
        assert_int_equal(df_vae_load(ctx, dir, &vae), DF_E_FORMAT);
        assert_null(vae);
        assert_message_names("decoder.", NULL); /* a decoder tensor of the other widths */
    }
    df_ctx_free(ctx);
}

/* force_upcast is not a key of the 0.42 AutoencoderKLFlux2 (its save_pretrained writes none,
 * as the decoder-widths case shows), but 0.37's folders have it: both load. */
static void test_force_upcast_present_or_absent_loads(void **state)
{
    (void)state;
    df_ctx *ctx = new_ctx();
    df_vae *vae = NULL;
    char *cfg = read_all(CASES_DIR "/vae-decode-flux2-decoder-widths/vae/config.json");
    assert_null(strstr(cfg, "force_upcast"));
    free(cfg);
    cfg = read_all(DF_GOLDEN_DIR "/vae-decode-flux2/vae/config.json");
    assert_non_null(strstr(cfg, "\"force_upcast\": true"));
    free(cfg);
    assert_int_equal(df_vae_load(ctx, DF_GOLDEN_DIR "/vae-decode-flux2/vae", &vae), DF_OK);
    df_vae_free(vae);

    char dir[512];
    variant("ck_vae2_no_upcast", DF_GOLDEN_DIR "/vae-decode-flux2/vae", "\"force_upcast\": true,",
            "", dir, sizeof dir);
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_OK);
    df_vae_free(vae);
    variant("ck_vae2_upcast_false", DF_GOLDEN_DIR "/vae-decode-flux2/vae",
            "\"force_upcast\": true,", "\"force_upcast\": false,", dir, sizeof dir);
    assert_int_equal(df_vae_load(ctx, dir, &vae), DF_OK);
    df_vae_free(vae);
    df_ctx_free(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_key_of_the_current_classes_is_documented),
        cmocka_unit_test(test_transformer_values_not_implemented_are_refused),
        cmocka_unit_test(test_vae_values_not_implemented_are_refused),
        cmocka_unit_test(test_scheduler_values_not_implemented_are_refused),
        cmocka_unit_test(test_text_encoder_values_not_implemented_are_refused),
        cmocka_unit_test(test_decoder_block_out_channels_build_the_decoder),
        cmocka_unit_test(test_force_upcast_present_or_absent_loads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
