/*
 * diffuse: text-to-image diffusion pipelines from diffusers-format model folders.
 *
 * This header includes the whole public API. Each part has its own header; read them in
 * this order: status and dtypes, the runtime (contexts, tensors, ops), weights and files,
 * text, models, schedulers, pipelines, images.
 */
#ifndef DIFFUSE_H
#define DIFFUSE_H

#include "status.h"
#include "dtype.h"
#include "runtime.h"
#include "ops.h"
/* Each part adds its header below, one line each. */
#include "safetensors_writer.h"
#include "step_cache.h"
#include "pipeline.h"
#include "compile.h"
#include "dist.h"
#include "models.h"
#include "json.h"
#include "safetensors.h"
#include "gguf.h"
#include "weights.h"
#include "layout.h"
#include "cpu.h"
#include "quantize.h"
#include "rng.h"
#include "scheduler.h"
#include "image.h"
#include "clip.h"
#include "t5.h"
#include "mistral.h"
#include "qwen3.h"
#include "flux.h"
#include "flux2.h"
#include "sd3.h"
#include "vae.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version string ("0.1.0"). */
DF_API const char *df_version(void);

#ifdef __cplusplus
}
#endif
#endif
