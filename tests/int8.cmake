# int8 compute on the tiny FLUX.1 pipeline (the make-tiny fixture of tests/offload.cmake).
if(TARGET test_int8_pipeline)
  add_test(NAME unit/test_int8_pipeline COMMAND test_int8_pipeline
           ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
  set_tests_properties(unit/test_int8_pipeline PROPERTIES FIXTURES_REQUIRED tiny_flux
                       TIMEOUT 600)
endif()
