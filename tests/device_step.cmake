# The Euler step on the device against the host step (DIFFUSE_HOST_STEP=1), bit for bit, on
# the tiny FLUX.1, SD3 and FLUX.2 klein folders; on the CPU here, on sim in the Release pass
# (where it also checks that the device path downloads nothing per step).
if(TARGET test_device_step)
  set(device_step_args ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3
      ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux2-klein)
  add_test(NAME unit/test_device_step COMMAND test_device_step ${device_step_args})
  set_tests_properties(unit/test_device_step PROPERTIES
                       FIXTURES_REQUIRED "tiny_flux;tiny_sd3;tiny_flux2" TIMEOUT 600)
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    add_test(NAME sim/unit/test_device_step COMMAND test_device_step ${device_step_args})
    set_tests_properties(sim/unit/test_device_step PROPERTIES ENVIRONMENT "DIFFUSE_DEVICE=sim"
                         FIXTURES_REQUIRED "tiny_flux;tiny_sd3;tiny_flux2" TIMEOUT 600)
  endif()
endif()

# A host read waits on the producing launch only (runtime/tensor.c), also on sim, where the
# read is a copy on the copy stream (unit/test_read_wait runs it on the CPU).
if(TARGET test_read_wait AND CMAKE_BUILD_TYPE STREQUAL "Release")
  add_test(NAME sim/unit/test_read_wait COMMAND test_read_wait)
  set_tests_properties(sim/unit/test_read_wait PROPERTIES ENVIRONMENT "DIFFUSE_DEVICE=sim"
                       TIMEOUT 300)
endif()
