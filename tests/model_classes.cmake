# The model table's test runs `diffuse make-tiny` for every architecture the table names, so
# it needs the program built first.
if(TARGET test_model_classes AND TARGET diffuse)
  target_compile_definitions(test_model_classes PRIVATE DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_model_classes diffuse)
endif()
