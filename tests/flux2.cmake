# FLUX.2 pipelines from prompts on the tiny folders make-tiny writes (fixtures): the API
# test (modes, bf16, offload, batches, klein base CFG, bad prompts) and `diffuse generate`
# on both folders with bad folders' messages (tests/cli/flux2_generate.sh).
set(DF_TINY_FLUX2 ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux2)
set(DF_TINY_KLEIN ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux2-klein)
add_test(NAME fixture/make-tiny-flux2
         COMMAND diffuse make-tiny --arch flux2 --seed 4 ${DF_TINY_FLUX2})
add_test(NAME fixture/make-tiny-flux2-klein
         COMMAND diffuse make-tiny --arch flux2-klein --seed 5 ${DF_TINY_KLEIN})
set_tests_properties(fixture/make-tiny-flux2 fixture/make-tiny-flux2-klein
                     PROPERTIES FIXTURES_SETUP tiny_flux2)
if(TARGET test_flux2_prompts)
  add_test(NAME unit/test_flux2_prompts
           COMMAND test_flux2_prompts ${DF_TINY_FLUX2} ${DF_TINY_KLEIN})
  set_tests_properties(unit/test_flux2_prompts
                       PROPERTIES FIXTURES_REQUIRED tiny_flux2 TIMEOUT 900)
endif()
add_test(NAME cli/flux2_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/flux2_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_TINY_FLUX2} ${DF_TINY_KLEIN} ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/flux2_generate PROPERTIES FIXTURES_REQUIRED tiny_flux2 TIMEOUT 900)
