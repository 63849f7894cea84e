# The model table's test runs `diffuse make-tiny` for every architecture the table names and
# asks `diffuse-check --classes` which case kinds run each class, so it needs both programs
# built first.
if(TARGET test_model_classes AND TARGET diffuse)
  target_compile_definitions(test_model_classes PRIVATE DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>")
  add_dependencies(test_model_classes diffuse)
endif()
if(TARGET test_model_classes AND TARGET diffuse-check)
  target_compile_definitions(test_model_classes
                             PRIVATE DF_DIFFUSE_CHECK_BIN="$<TARGET_FILE:diffuse-check>")
  add_dependencies(test_model_classes diffuse-check)
endif()
