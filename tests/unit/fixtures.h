/*
 * Fixtures the unit tests share (include after <cmocka.h>): a context on DIFFUSE_DEVICE's
 * device, and a FLUX.2 klein base folder made from the distilled tiny one.
 */
#ifndef DF_TESTS_UNIT_FIXTURES_H
#define DF_TESTS_UNIT_FIXTURES_H

#include <stdio.h>
#include <stdlib.h>

#include <diffuse/diffuse.h>

/* A context with `threads` workers; the test fails if it cannot be made. */
static inline df_ctx *fixture_ctx(int threads)
{
    df_ctx *ctx = NULL;
    assert_int_equal(df_ctx_create(&(df_ctx_opts){.threads = threads}, &ctx), DF_OK);
    return ctx;
}

/* Writes into `dir` (emptied first) a Flux2KleinPipeline base checkpoint (is_distilled
 * false: classifier-free guidance every step) with the components of the distilled folder
 * `klein_dir` (`diffuse make-tiny --arch flux2-klein`). Copies: a component linked from
 * outside the folder is refused. */
static inline void fixture_klein_base(const char *klein_dir, const char *dir)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && mkdir -p '%s' && cd '%s' && "
             "cp -r scheduler tokenizer text_encoder transformer vae '%s'",
             dir, dir, klein_dir, dir);
    assert_int_equal(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/model_index.json", dir);
    FILE *f = fopen(cmd, "w");
    assert_non_null(f);
    fputs("{\"_class_name\": \"Flux2KleinPipeline\", \"is_distilled\": false,\n"
          " \"scheduler\": [\"diffusers\", \"FlowMatchEulerDiscreteScheduler\"],\n"
          " \"text_encoder\": [\"transformers\", \"Qwen3ForCausalLM\"],\n"
          " \"tokenizer\": [\"transformers\", \"Qwen2TokenizerFast\"],\n"
          " \"transformer\": [\"diffusers\", \"Flux2Transformer2DModel\"],\n"
          " \"vae\": [\"diffusers\", \"AutoencoderKLFlux2\"]}\n",
          f);
    fclose(f);
}

#endif
