# The Vulkan backend's tests, registered only when the backend is built. They run on
# Vulkan device 0 (lavapipe in CI) under the Khronos validation layer; any validation
# message fails them. Without a Vulkan driver at run time they report skipped (77).
if(DIFFUSE_VULKAN_BUILT)
  add_executable(test_vk_ops ${CMAKE_SOURCE_DIR}/tests/vulkan/test_vk_ops.c)
  target_include_directories(test_vk_ops PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(test_vk_ops PRIVATE _GNU_SOURCE)
  target_compile_options(test_vk_ops PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_vk_ops PRIVATE diffuse_vulkan_core diffuse_static)
  set_target_properties(test_vk_ops PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(VK_TEST_ENV "VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation"
      "DIFFUSE_CACHE_DIR=${CMAKE_BINARY_DIR}/test-tmp/vk-cache"
      "XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/test-tmp")
  add_test(NAME vulkan/ops COMMAND test_vk_ops)
  set_tests_properties(vulkan/ops PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${VK_TEST_ENV}" FIXTURES_SETUP vk_pipeline_cache)
  # A second process makes its pipelines from the cache the first one saved.
  add_test(NAME vulkan/ops_from_pipeline_cache COMMAND test_vk_ops --expect-cache)
  set_tests_properties(vulkan/ops_from_pipeline_cache PROPERTIES TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${VK_TEST_ENV}"
                       FIXTURES_REQUIRED vk_pipeline_cache)
  # No driver at run time (the loader pointed at none): a message, not a crash.
  add_test(NAME vulkan/no_driver COMMAND test_vk_ops --expect-no-driver)
  set_tests_properties(vulkan/no_driver PROPERTIES TIMEOUT 60
    ENVIRONMENT "VK_ICD_FILENAMES=${CMAKE_BINARY_DIR}/test-tmp/no-such-icd.json;VK_DRIVER_FILES=${CMAKE_BINARY_DIR}/test-tmp/no-such-icd.json;XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/test-tmp")
endif()
