# Editing with pictures in (issue #30): FLUX.1 Kontext (FluxKontextPipeline: the cases of
# tools/refgen/kontext.py on the tiny Kontext folder tests/cases/kontext-pipeline), FLUX.2
# references that Flux2ImageProcessor crops or shrinks (tools/refgen/flux2_edit.py), and the
# tiled VAE encoder (tools/refgen/vae_encode.py), in every execution mode on the CPU (and
# with compiled repeated blocks);
# edit-flux2-resize, whose 1032x1024 reference makes 4032 tokens, in eager mode only.
set(DF_EDIT_CASES kontext-gen kontext-latents kontext-b2 kontext-noimage kontext-truecfg
    edit-flux2-crop vae-encode-flux-tiled)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${CMAKE_SOURCE_DIR}/tests/cases
                  CASES ${DF_EDIT_CASES})
endforeach()
df_golden_tests(cases-eager eager DIR ${CMAKE_SOURCE_DIR}/tests/cases CASES edit-flux2-resize)
df_golden_tests(cases-blocks blocks DIR ${CMAKE_SOURCE_DIR}/tests/cases
                CASES kontext-latents kontext-b2 kontext-truecfg edit-flux2-crop)

# The CLI on a Kontext folder assembled from tests/cases/kontext-pipeline and the golden
# text encoders.
add_test(NAME cli/kontext_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/kontext_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${CMAKE_SOURCE_DIR}/tests/cases ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/kontext_generate PROPERTIES TIMEOUT 300)

# Tensor parallelism with pictures in (docs/tensor-parallel.md): rank 0 encodes the picture
# and shares its tokens (Kontext, FLUX.2 references) or its starting latents (img2img,
# inpainting, whose blend runs on rank 0: a batch of two, and the crop with its overlay);
# `mpirun -np 2 diffuse-check --tp 2`, as tests/tp_golden.cmake runs the golden cases.
if(DF_MPIRUN_FOR_TESTS)
  set(DF_EDIT_TP_MPIRUN ${CMAKE_COMMAND} -E env OMPI_MCA_rmaps_base_oversubscribe=1
      ASAN_OPTIONS=detect_leaks=0 ${DF_MPIRUN_FOR_TESTS} --oversubscribe --allow-run-as-root
      -x ASAN_OPTIONS)
  foreach(mode eager compile)
    foreach(case kontext-latents kontext-b2 edit-flux2-crop edit-flux2-two img2img-flux-s03
                 inpaint-flux-s08-b2 inpaint-flux-crop kontext-truecfg)
      add_test(NAME golden/tp2-${mode}/${case}
               COMMAND ${DF_EDIT_TP_MPIRUN} -np 2 $<TARGET_FILE:diffuse-check> --tp 2
                       --mode ${mode} --threads 1 ${CMAKE_SOURCE_DIR}/tests/cases/${case})
      set_tests_properties(golden/tp2-${mode}/${case} PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
    endforeach()
  endforeach()
endif()


# The picture-in cases on the other devices, as tests/sim.cmake and tests/vulkan.cmake run
# the golden cases; registered in tests/vulkan_edit.cmake, which the glob reads after both
# (it reuses their settings). On the sim device (memory the host cannot address; each run
# under 2 s) every img2img, inpainting and Kontext case but kontext-gen (4056 picture
# tokens), and FLUX.2's cropped reference, in every mode. On Vulkan (lavapipe, 4 to 35 s a
# run) one or two per pipeline: img2img, inpainting (the blend on the host while the
# transformer runs on the device; the crop's overlay) for FLUX.1 and SD3, Kontext with B = 2
# and with true CFG, FLUX.2's reference, each in eager mode; Kontext fused; the FLUX.1 ones
# compiled too.
set(DF_EDIT_SIM_CASES ${DF_IMAGE_CASES} ${DF_INPAINT_CASES} kontext-latents kontext-b2
    kontext-noimage kontext-truecfg edit-flux2-crop)
set(DF_EDIT_VULKAN_RUNS eager:img2img-flux-s03 eager:inpaint-flux-crop eager:inpaint-sd3-s03
    eager:kontext-b2 eager:kontext-truecfg eager:edit-flux2-crop fuse:kontext-latents
    compile:img2img-flux-s03 compile:inpaint-flux-crop compile:kontext-b2)
