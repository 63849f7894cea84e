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

# Generator seeds in case.json over torch's whole range (tests/cli/seed_range.sh).
if(EXISTS ${DF_GOLDEN_DIR}/rng-randn-f32-small)
  add_test(NAME cli/seed_range
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/seed_range.sh $<TARGET_FILE:diffuse-check>
                   ${DF_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
endif()
