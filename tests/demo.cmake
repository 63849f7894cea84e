# The shipped demo pipeline (models/demo, trained by tools/train-demo) draws held-out
# captions; a random-weight pipeline from `diffuse make-tiny --arch flux` and colour-swapped
# captions fail the same measures. Registered only where the trained folder is present.
set(DF_DEMO_MODEL ${CMAKE_SOURCE_DIR}/models/demo)
if(TARGET test_demo AND TARGET diffuse)
  target_compile_definitions(test_demo PRIVATE DF_DEMO_MODEL="${DF_DEMO_MODEL}"
                                               DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_demo diffuse)
  if(EXISTS ${DF_DEMO_MODEL}/model_index.json)
    add_test(NAME demo/held-out COMMAND test_demo)
    set_tests_properties(demo/held-out PROPERTIES TIMEOUT 600)
    # `make demo-img2img`: the demo's picture recoloured by the caption, scored as above.
    add_test(NAME demo/img2img COMMAND test_demo img2img)
    set_tests_properties(demo/img2img PROPERTIES TIMEOUT 300)
    # `diffuse generate -m models/demo -p ...` with the folder's own size and token defaults.
    add_test(NAME cli/demo_defaults
             COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/demo_defaults.sh $<TARGET_FILE:diffuse>
                     ${DF_DEMO_MODEL} ${CMAKE_BINARY_DIR}/test-tmp)
    set_tests_properties(cli/demo_defaults PROPERTIES TIMEOUT 300)
  endif()
endif()
