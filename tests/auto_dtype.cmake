# --dtype auto: test_auto_dtype writes tiny SD3 pipelines in bf16 and f32 with
# `diffuse make-tiny` (so it needs the program built first); the CLI's help and -v line.
if(TARGET test_auto_dtype AND TARGET diffuse)
  target_compile_definitions(test_auto_dtype PRIVATE DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_auto_dtype diffuse)
endif()
add_test(NAME cli/generate-dtype-help
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/generate_dtype_help.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/generate-dtype-help PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)
