# `diffuse generate --stats-json`: the run's counters under each offload level, on the tiny
# SD3 pipeline of tests/sd3.cmake.
add_test(NAME cli/stats-peak
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/stats_peak.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/stats-peak PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)
# The device's counters in --stats-json: on sim in compiled mode (it records graphs: the
# later steps launch them), and on vulkan (lavapipe, named by index) in fuse mode.
add_test(NAME cli/stats-device-sim
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/stats_device.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp sim
                 compile 1)
set_tests_properties(cli/stats-device-sim PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)
if(DIFFUSE_VULKAN_BUILT)
  add_test(NAME cli/stats-device-vulkan
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/stats_device.sh $<TARGET_FILE:diffuse>
                   ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp
                   vulkan:0 fuse 0)
  set_tests_properties(cli/stats-device-vulkan PROPERTIES FIXTURES_REQUIRED tiny_sd3
    TIMEOUT 600 FAIL_REGULAR_EXPRESSION "vulkan validation:"
    ENVIRONMENT "VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation;DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin;DIFFUSE_CACHE_DIR=${CMAKE_BINARY_DIR}/test-tmp/vk-cache;XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/test-tmp")
endif()
# `diffuse generate --profile`: phases and kernels' time, the image unchanged.
add_test(NAME cli/profile
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/profile.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/profile PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)
