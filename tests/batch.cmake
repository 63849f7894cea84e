# Batches: diffuse-check reads list arguments (prompts, negative prompts, generators) as
# diffusers does (the pipelines' batch parity itself is tests/unit/test_batch.c).
if(EXISTS ${DF_GOLDEN_DIR}/t2i-sd3-seed0)
  add_test(NAME check/batch-args
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/check_batch_args.sh
                   $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(check/batch-args PROPERTIES TIMEOUT 600)
endif()
