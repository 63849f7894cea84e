# File formats (docs/io.md): the reference cases of tests/cases made by tools/refgen/ —
# FLUX.1 transformers from single files (ComfyUI fp8, city96 GGUF Q8_0 / Q4_K) through the
# name maps, run by diffuse-check in every mode and with bf16 and int8 compute (int8 in
# every mode too: its GGUF and fp8 weights stay in the file's bytes). The
# dequantisation and fp8 cases (gguf-dequant, fp8-safetensors) are read by
# tests/unit/test_gguf.c and test_fp8.c.
set(DF_CASES_DIR ${CMAKE_SOURCE_DIR}/tests/cases)
set(DF_FORMAT_CASES flux-single-comfy flux-gguf-q8_0 flux-gguf-q4_k)
foreach(case ${DF_FORMAT_CASES})
  foreach(mode eager fuse compile blocks)
    add_test(NAME formats/${mode}/${case}
             COMMAND diffuse-check --mode ${mode} --threads 2 ${DF_CASES_DIR}/${case})
    set_tests_properties(formats/${mode}/${case} PROPERTIES TIMEOUT 600)
  endforeach()
  foreach(dtype bf16 int8)
    add_test(NAME formats/${dtype}/${case}
             COMMAND diffuse-check --dtype ${dtype} --threads 2 ${DF_CASES_DIR}/${case})
    set_tests_properties(formats/${dtype}/${case} PROPERTIES TIMEOUT 600)
  endforeach()
  # int8 keeps the GGUF / fp8 weights in the file's bytes, packed in each product: every mode
  foreach(mode fuse compile blocks)
    add_test(NAME formats/int8-${mode}/${case}
             COMMAND diffuse-check --dtype int8 --mode ${mode} --threads 2 ${DF_CASES_DIR}/${case})
    set_tests_properties(formats/int8-${mode}/${case} PROPERTIES TIMEOUT 600)
  endforeach()
endforeach()

# `diffuse generate --transformer FILE` (tests/cli/transformer_file.sh).
add_test(NAME formats/cli-transformer-file
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/transformer_file.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${DF_CASES_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(formats/cli-transformer-file PROPERTIES TIMEOUT 600)

# `diffuse inspect FILE`: a GGUF's types and a single file's recognised layout; a
# truncated GGUF is one error line naming the file.
add_test(NAME formats/inspect-gguf
         COMMAND diffuse inspect -s ${DF_CASES_DIR}/flux-gguf-q8_0/flux1-tiny-q8_0.gguf)
set_tests_properties(formats/inspect-gguf PROPERTIES PASS_REGULAR_EXPRESSION
  "types: F32 x 46 F16 x 2 Q8_0 x 32\n  recognised: FLUX.1 transformer in Black Forest Labs' layout \\(no prefix\\), schnell[^\n]*, 2 double \\+ 2 single blocks")
add_test(NAME formats/inspect-comfy
         COMMAND diffuse inspect -s ${DF_CASES_DIR}/flux-single-comfy/flux1-tiny-comfy-fp8.safetensors)
set_tests_properties(formats/inspect-comfy PROPERTIES PASS_REGULAR_EXPRESSION
  "recognised: FLUX.1 transformer in Black Forest Labs' layout \\(prefix 'model.diffusion_model.'\\)")
add_test(NAME formats/inspect-truncated-gguf
         COMMAND sh -c "head -c 300 \"$1\" > \"$2/trunc.gguf\" && \"$0\" inspect \"$2/trunc.gguf\" 2>&1; test $? -eq 1"
                 $<TARGET_FILE:diffuse> ${DF_CASES_DIR}/flux-gguf-q8_0/flux1-tiny-q8_0.gguf
                 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(formats/inspect-truncated-gguf PROPERTIES PASS_REGULAR_EXPRESSION
  "^error: [^\n]*trunc.gguf: truncated[^\n]*\n$")
