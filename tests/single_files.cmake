# Single-file components beyond the FLUX.1 transformer (docs/io.md): VAEs in the original
# LDM names (BFL's ae.safetensors; SD3's under first_stage_model.) and a ComfyUI-prefixed
# fp8 CLIP-L, made by tools/refgen/component_files.py, and a ComfyUI all-in-one FLUX.1 file
# (transformer + VAE, the folder's text encoders: -m FILE --config DIR) by all_in_one.py,
# an SD3.5-medium-shaped transformer in the original MMDiT names (sd3_single_file.py) and a
# FLUX.2 transformer in BFL's FLUX.2 names (flux2_single_file.py),
# with diffusers' single-file loading as the reference, and FLUX.2's VAE in BFL's names, its
# Qwen3 / Mistral text encoders in ComfyUI's layouts and a FLUX.2-dev all-in-one file
# (flux2_component_files.py, the folder's classes on the file's values as the reference),
# run by diffuse-check in every mode and with bf16 and int8 compute.
# GGUF files in other programs' names (tools/refgen/gguf_names.py): stable-diffusion.cpp's
# GGUFs (FLUX.1 / FLUX.2 / SD3 transformers under model.diffusion_model., the VAE under
# first_stage_model. or vae., CLIP-L / CLIP-G and a llama.cpp-named T5 under
# text_encoders.*.transformer.) and a T5 encoder in llama.cpp's names.
set(DF_SINGLE_FILE_CASES vae-single-flux vae-single-sd3-comfy te-single-clip-comfy
    pipe-flux-all-in-one sd3-single-comfy flux2-single-comfy
    vae-single-flux2 vae-encode-single-flux2 te-single-qwen3-comfy te-single-qwen3-aio
    te-single-qwen3-gguf te-single-mistral-comfy te-single-mistral-pruned-comfy
    pipe-flux2-all-in-one pipe-flux2-klein-all-in-one
    flux-gguf-sdcpp vae-gguf-sdcpp sd3-gguf-sdcpp flux2-gguf-sdcpp te-gguf-clip-sdcpp
    te-gguf-t5-llamacpp pipe-flux-gguf-sdcpp te-single-clip-g-openclip
    te-single-mistral-consolidated)
foreach(case ${DF_SINGLE_FILE_CASES})
  foreach(mode eager fuse compile)
    add_test(NAME single-files/${mode}/${case}
             COMMAND diffuse-check --mode ${mode} --threads 2
                     ${CMAKE_SOURCE_DIR}/tests/cases/${case})
    set_tests_properties(single-files/${mode}/${case} PROPERTIES TIMEOUT 300)
  endforeach()
  foreach(dtype bf16 int8)
    add_test(NAME single-files/${dtype}/${case}
             COMMAND diffuse-check --dtype ${dtype} --threads 2
                     ${CMAKE_SOURCE_DIR}/tests/cases/${case})
    set_tests_properties(single-files/${dtype}/${case} PROPERTIES TIMEOUT 300)
  endforeach()
endforeach()

# `diffuse generate --vae / --text-encoder / --text-encoder-2 / --text-encoder-3 FILE`
# (tests/cli/component_files.sh).
add_test(NAME single-files/cli-component-files
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/component_files.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-component-files PROPERTIES TIMEOUT 300)

# FLUX.2's VAE and text encoder files, an all-in-one FLUX.2-dev file and its conversion
# (tests/cli/flux2_component_files.sh).
add_test(NAME single-files/cli-flux2-component-files
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/flux2_component_files.sh $<TARGET_FILE:diffuse>
                 $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-flux2-component-files PROPERTIES TIMEOUT 300)

# `diffuse inspect FILE`: the model, the components and what is missing, for an all-in-one
# FLUX.1 file and a lone CLIP-L.
add_test(NAME single-files/inspect-all-in-one
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/pipe-flux-all-in-one/flux1-tiny-aio-fp8.safetensors)
set_tests_properties(single-files/inspect-all-in-one PROPERTIES PASS_REGULAR_EXPRESSION
  "model: FLUX.1-schnell \\(transformer under model.diffusion_model.\\)\n  holds: transformer, VAE \\(LDM names\\)\n  config: none shipped for this size [^\n]*--config DIR\n  missing: CLIP-L [^\n]*T5 [^\n]*--config DIR")
add_test(NAME single-files/inspect-clip
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/te-single-clip-comfy/clip_l-comfy-fp8.safetensors)
set_tests_properties(single-files/inspect-clip PROPERTIES PASS_REGULAR_EXPRESSION
  "model: no transformer\n  holds: CLIP-L\n  config: the file holds no transformer[^\n]*\n  missing: transformer")

# The shipped configs: `diffuse config`, and -m FILE of a released size with no folder
# (tests/cli/shipped_configs.sh; full-size files are sparse).
add_test(NAME single-files/cli-shipped-configs
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/shipped_configs.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)

# FLUX.2: an all-in-one FLUX.2-dev file (transformer, VAE, Mistral) and a lone Qwen3.
add_test(NAME single-files/inspect-flux2-all-in-one
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/pipe-flux2-all-in-one/flux2-tiny-aio-fp8.safetensors)
set_tests_properties(single-files/inspect-flux2-all-in-one PROPERTIES PASS_REGULAR_EXPRESSION
  "model: FLUX.2-dev \\(transformer under model.diffusion_model.\\)\n  holds: transformer, VAE \\(FLUX.2's AutoencoderKLFlux2, LDM names\\), Mistral [^\n]*\n  config: none shipped for FLUX.2-dev[^\n]*\n  missing: configs and tokenizers"
  FAIL_REGULAR_EXPRESSION "FLUX.1 transformer")
add_test(NAME single-files/inspect-flux2-klein-all-in-one
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/pipe-flux2-klein-all-in-one/flux2-klein-tiny-aio-fp8.safetensors)
set_tests_properties(single-files/inspect-flux2-klein-all-in-one PROPERTIES PASS_REGULAR_EXPRESSION
  "model: FLUX.2-klein [^\n]*\n  holds: transformer, VAE \\(FLUX.2's AutoencoderKLFlux2, LDM names\\)\n  config: none shipped for FLUX.2-klein[^\n]*\n  missing: Qwen3 \\(--text-encoder FILE")
add_test(NAME single-files/inspect-qwen3
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/te-single-qwen3-comfy/qwen_3-tiny-comfy-fp8.safetensors)
set_tests_properties(single-files/inspect-qwen3 PROPERTIES PASS_REGULAR_EXPRESSION
  "model: no transformer\n  holds: Qwen3 [^\n]*\n  config: the file holds no transformer[^\n]*\n  missing: transformer [^\n]*VAE ")

# `diffuse convert FILE --config DIR -o OUT` (tests/cli/convert.sh).
add_test(NAME single-files/cli-convert
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/convert.sh $<TARGET_FILE:diffuse>
                 $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases
                 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-convert PROPERTIES TIMEOUT 300)

# `diffuse inspect` on stable-diffusion.cpp's one-file GGUF and on a llama.cpp T5 encoder GGUF
# that carries its tokenizer.
add_test(NAME single-files/inspect-gguf-sdcpp
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/flux-gguf-sdcpp/flux1-tiny-sdcpp-q8_0.gguf)
set_tests_properties(single-files/inspect-gguf-sdcpp PROPERTIES PASS_REGULAR_EXPRESSION
  "model: FLUX.1-schnell \\(transformer under model.diffusion_model.\\)\n  holds: transformer, VAE \\(LDM names\\)\n")
add_test(NAME single-files/inspect-gguf-sdcpp-all
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/pipe-flux-gguf-sdcpp/flux1-tiny-sdcpp-all-q8_0.gguf)
set_tests_properties(single-files/inspect-gguf-sdcpp-all PROPERTIES PASS_REGULAR_EXPRESSION
  "holds: transformer, VAE \\(LDM names\\), CLIP-L, T5 \\(llama.cpp names\\)\n  config: none shipped for this size [^\n]*\n  missing: configs and tokenizers")
add_test(NAME single-files/inspect-gguf-sdcpp-diffusers
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/pipe-flux-gguf-sdcpp/flux1-tiny-sdcpp-diffusers-f32.gguf)
set_tests_properties(single-files/inspect-gguf-sdcpp-diffusers PROPERTIES PASS_REGULAR_EXPRESSION
  "model: FLUX.1-schnell \\(diffusers names\\) \\(transformer under model.diffusion_model.\\)\n  holds: transformer, VAE \\(diffusers names\\)\n")
add_test(NAME single-files/inspect-gguf-t5-llamacpp
         COMMAND diffuse inspect -s ${CMAKE_SOURCE_DIR}/tests/cases/te-gguf-t5-llamacpp/t5-tiny-encoder-Q8_0.gguf)
set_tests_properties(single-files/inspect-gguf-t5-llamacpp PROPERTIES PASS_REGULAR_EXPRESSION
  "holds: T5 \\(llama.cpp names\\)\n  tokenizer: llama.cpp's T5 \\(tokenizer.ggml.\\*\\), used when the folder")

# llama.cpp's T5 GGUF through `diffuse generate` and `diffuse tokenize` with its own
# tokenizer, an sd.cpp GGUF in diffusers' names giving the folder's image, and one without
# --config (tests/cli/gguf_names.sh).
add_test(NAME single-files/cli-gguf-names
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/gguf_names.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-gguf-names PROPERTIES TIMEOUT 300)

# Mistral's tekken.json from a ComfyUI text encoder file (tests/cli/tekken_tokenizer.sh,
# tools/refgen/tekken_tokenizer.py).
add_test(NAME single-files/cli-tekken-tokenizer
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/tekken_tokenizer.sh $<TARGET_FILE:diffuse>
                 $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${DF_CASES_DIR}
                 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-tekken-tokenizer PROPERTIES TIMEOUT 300)

# Text encoders in OpenCLIP's and Mistral's own names, through generate and convert
# (tests/cli/text_encoder_layouts.sh).
add_test(NAME single-files/cli-text-encoder-layouts
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/text_encoder_layouts.sh $<TARGET_FILE:diffuse>
                 $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${DF_CASES_DIR}
                 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(single-files/cli-text-encoder-layouts PROPERTIES TIMEOUT 300)
