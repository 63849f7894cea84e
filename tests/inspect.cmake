# `diffuse inspect` checks: every golden model folder (config.json + weights) and pipeline
# folder (model_index.json) must inspect cleanly, and broken input must give exit 1 with one
# stderr line, usage errors exit 2 (tests/cli/inspect_errors.sh).

file(GLOB DF_INSPECT_MARKERS ${DF_GOLDEN_DIR}/*/*/config.json ${DF_GOLDEN_DIR}/*/*/model_index.json)
foreach(marker ${DF_INSPECT_MARKERS})
  get_filename_component(folder ${marker} DIRECTORY)
  get_filename_component(sub ${folder} NAME)
  get_filename_component(case_dir ${folder} DIRECTORY)
  get_filename_component(case ${case_dir} NAME)
  add_test(NAME inspect/${case}/${sub} COMMAND diffuse inspect --summary ${folder})
endforeach()

add_test(NAME inspect/errors
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/inspect_errors.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp)

# make-tiny's FLUX.2 text encoder folders check against their configs, and a Mistral3 one
# lists its vision tower, projector and lm_head as skipped.
foreach(arch mistral3 qwen3)
  set(dir ${CMAKE_BINARY_DIR}/test-tmp/tiny-${arch}-text-encoder)
  add_test(NAME inspect/make-tiny-${arch}-text-encoder
           COMMAND sh -c "'$<TARGET_FILE:diffuse>' make-tiny --arch ${arch}-text-encoder '${dir}' >/dev/null && '$<TARGET_FILE:diffuse>' inspect '${dir}'")
endforeach()
set_tests_properties(inspect/make-tiny-mistral3-text-encoder PROPERTIES PASS_REGULAR_EXPRESSION
                     "match the Mistral3ForConditionalGeneration config\n  skipped, not needed for text-to-image \\(never read\\): 16 tensors")
set_tests_properties(inspect/make-tiny-qwen3-text-encoder PROPERTIES PASS_REGULAR_EXPRESSION
                     "weights match the Qwen3ForCausalLM config")

# Generator seeds in case.json over torch's whole range (tests/cli/seed_range.sh).
if(EXISTS ${DF_GOLDEN_DIR}/rng-randn-f32-small)
  add_test(NAME cli/seed_range
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/seed_range.sh $<TARGET_FILE:diffuse-check>
                   ${DF_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
endif()
