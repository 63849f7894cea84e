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

# A sharded copy (the same seed and folder name, the transformer and VAE split into files of at most 100 kB
# with their index) gives the same image as the single files.
add_test(NAME cli/flux2_sharded
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" make-tiny --arch flux2 --seed 4 --shard-size 100000 \"$1\" >/dev/null && ls \"$1\"/transformer/*-00003-of-* >/dev/null && \"$0\" generate -m \"$1\" -p fox -W 32 -H 32 --steps 1 -o \"$1\".png >/dev/null && \"$0\" generate -m \"$2\" -p fox -W 32 -H 32 --steps 1 -o \"$1\"-ref.png >/dev/null && cmp \"$1\".png \"$1\"-ref.png || { echo sharded folder differs; exit 1; }"
                 $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/sharded/tiny-flux2
                 ${DF_TINY_FLUX2})
set_tests_properties(cli/flux2_sharded PROPERTIES FIXTURES_REQUIRED tiny_flux2 TIMEOUT 300)
