# test_lost_errors runs a tiny FLUX pipeline that `diffuse make-tiny` writes, so it needs
# the program built first.
if(TARGET test_lost_errors AND TARGET diffuse)
  target_compile_definitions(test_lost_errors PRIVATE DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_lost_errors diffuse)
endif()
