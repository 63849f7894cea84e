# SD3 / SD3.5: the unit test test_sd3 writes a tiny SD3 pipeline with `diffuse make-tiny
# --arch sd3` (so it needs the program built first), and the CLI makes and runs one too.
if(TARGET test_sd3 AND TARGET diffuse)
  target_compile_definitions(test_sd3 PRIVATE DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_sd3 diffuse)
endif()

set(DF_TINY_SD3 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3)
add_test(NAME sd3/make-tiny COMMAND diffuse make-tiny --arch sd3 ${DF_TINY_SD3})
set_tests_properties(sd3/make-tiny PROPERTIES FIXTURES_SETUP tiny_sd3)
add_test(NAME sd3/generate
         COMMAND diffuse generate -m ${DF_TINY_SD3} -p "a red fox in the snow"
                 --negative-prompt "blurry" -W 64 -H 64 --steps 3 --guidance 4.5
                 --slg-layers 1 --slg-start 0.1 --slg-stop 0.9 --seed 1 --threads 2
                 -o ${DF_TINY_SD3}.png)
set_tests_properties(sd3/generate PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)

# Model offload gives the same image, bit for bit (cmake -E compare_files fails on any
# difference).
add_test(NAME sd3/generate-offload
         COMMAND diffuse generate -m ${DF_TINY_SD3} -p "a red fox in the snow"
                 --negative-prompt "blurry" -W 64 -H 64 --steps 3 --guidance 4.5
                 --slg-layers 1 --slg-start 0.1 --slg-stop 0.9 --seed 1 --threads 2
                 --offload model -o ${DF_TINY_SD3}-offload.png)
set_tests_properties(sd3/generate-offload PROPERTIES FIXTURES_REQUIRED tiny_sd3
                     FIXTURES_SETUP sd3_offload TIMEOUT 600 DEPENDS sd3/generate)
add_test(NAME sd3/offload-identical
         COMMAND ${CMAKE_COMMAND} -E compare_files ${DF_TINY_SD3}.png ${DF_TINY_SD3}-offload.png)
set_tests_properties(sd3/offload-identical PROPERTIES FIXTURES_REQUIRED sd3_offload
                     DEPENDS "sd3/generate;sd3/generate-offload")
