# Offload levels on a tiny pipeline that make-tiny writes first (a test fixture).
if(TARGET test_offload)
  set(DF_TINY_FLUX ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
  add_test(NAME fixture/make-tiny-flux
           COMMAND diffuse make-tiny --arch flux --seed 3 ${DF_TINY_FLUX})
  set_tests_properties(fixture/make-tiny-flux PROPERTIES FIXTURES_SETUP tiny_flux)
  add_test(NAME unit/test_offload_tiny COMMAND test_offload ${DF_TINY_FLUX})
  set_tests_properties(unit/test_offload_tiny PROPERTIES FIXTURES_REQUIRED tiny_flux TIMEOUT 600)
endif()

# `diffuse generate` bad-input behaviour on the same tiny folder.
add_test(NAME cli/generate_errors
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/generate_errors.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/generate_errors PROPERTIES FIXTURES_REQUIRED tiny_flux TIMEOUT 600)
