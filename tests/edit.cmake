# Editing with pictures in (issue #30): FLUX.1 Kontext (FluxKontextPipeline: the cases of
# tools/refgen/kontext.py on the tiny Kontext folder tests/cases/kontext-pipeline), FLUX.2
# references that Flux2ImageProcessor crops or shrinks (tools/refgen/flux2_edit.py), and the
# tiled VAE encoder (tools/refgen/vae_encode.py), in every execution mode on the CPU;
# edit-flux2-resize, whose 1032x1024 reference makes 4032 tokens, in eager mode only.
set(DF_EDIT_CASES kontext-gen kontext-latents kontext-b2 kontext-noimage edit-flux2-crop
    vae-encode-flux-tiled)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${CMAKE_SOURCE_DIR}/tests/cases
                  CASES ${DF_EDIT_CASES})
endforeach()
df_golden_tests(cases-eager eager DIR ${CMAKE_SOURCE_DIR}/tests/cases CASES edit-flux2-resize)

# The CLI on a Kontext folder assembled from tests/cases/kontext-pipeline and the golden
# text encoders.
add_test(NAME cli/kontext_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/kontext_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/kontext_generate PROPERTIES TIMEOUT 300)
