# FLUX.1 Kontext (FluxKontextPipeline): the cases of tools/refgen/kontext.py on the tiny
# Kontext folder tests/cases/kontext-pipeline, in every execution mode on the CPU, and the
# CLI on a Kontext folder assembled from it and the golden text encoders.
set(DF_KONTEXT_CASES kontext-gen kontext-latents kontext-b2 kontext-noimage)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${CMAKE_SOURCE_DIR}/tests/cases
                  CASES ${DF_KONTEXT_CASES})
endforeach()

add_test(NAME cli/kontext_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/kontext_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/kontext_generate PROPERTIES TIMEOUT 300)
