# Reference cases made in this repository (tools/refgen/, diffusers 0.42 / transformers 5.x),
# beside the shared golden ones: diffuse-check runs each in every execution mode, on the CPU
# here, and on the sim and Vulkan devices where tests/sim.cmake and tests/vulkan.cmake (read
# after this file) run the golden cases.
set(DF_CASES_DIR ${CMAKE_SOURCE_DIR}/tests/cases)
set(DF_REPO_CASES vae-decode-flux2-decoder-widths
    vae-encode-flux vae-encode-sd3-b2 vae-encode-sd3-mode vae-encode-flux2
    vae-encode-flux2-widths)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_REPO_CASES})
endforeach()

# Image to image and FLUX.2 reference images (tools/refgen/img2img.py, flux2_edit.py; the VAE
# encoder's cases, from vae_encode.py, are
# in the list above): whole pipelines on the golden cases' folders (named by relative path),
# in every mode on the CPU only, to keep the sim and Vulkan runs short (by hand they pass
# there too: docs/pipelines.md).
set(DF_IMAGE_CASES img2img-flux-s03 img2img-flux-s08-b2 img2img-flux-s10
    img2img-sd3-s03 img2img-sd3-s08-b2 img2img-sd3-s10 edit-flux2 edit-flux2-b2 edit-flux2-two
    edit-flux2-klein)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_IMAGE_CASES})
endforeach()
# Inpainting (tools/refgen/inpaint.py): FluxInpaintPipeline and StableDiffusion3InpaintPipeline
# on the same folders, with a picture and a mask in each case folder (the -crop cases with
# padding_mask_crop).
set(DF_INPAINT_CASES inpaint-flux-s03 inpaint-flux-s08-b2 inpaint-flux-s10 inpaint-flux-latents
    inpaint-sd3-s03 inpaint-sd3-s08-b2 inpaint-sd3-s10 inpaint-sd3-latents inpaint-flux-crop
    inpaint-sd3-crop)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_INPAINT_CASES})
endforeach()
df_golden_tests(cases-blocks blocks DIR ${DF_CASES_DIR} CASES edit-flux2 edit-flux2-b2
                edit-flux2-two edit-flux2-klein)

# SD3 without T5 (tools/refgen/sd3_no_t5.py): diffusers' text_encoder_3=None on the golden
# SD3 folder (df_load_opts.no_text_encoder_3), in every mode t2i-sd3 runs in; and the folder
# diffusers saves without T5, `--text-encoder-3 none`, -v, inspect and the refusals
# (tests/cli/sd3_no_t5.sh).
foreach(mode eager fuse compile blocks)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES t2i-sd3-no-t5)
endforeach()
# bf16 and int8 compute within their bounds, as t2i-sd3 (tests/golden.cmake).
df_golden_tests(cases-bf16 eager DIR ${DF_CASES_DIR} CASES t2i-sd3-no-t5 ARGS --dtype bf16)
df_golden_tests(cases-int8-eager eager DIR ${DF_CASES_DIR} CASES t2i-sd3-no-t5
                ARGS --dtype int8)
# ... and on the sim device, in the Release pass as tests/sim.cmake's runs (under 5 s each;
# on Vulkan, 10 to 15 s a run, it passes by hand in eager, fuse and compile).
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  foreach(mode eager fuse compile)
    df_golden_tests(sim-${mode} ${mode} DIR ${DF_CASES_DIR} CASES t2i-sd3-no-t5
                    ARGS --device sim)
  endforeach()
endif()
add_test(NAME cli/sd3_no_t5
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/sd3_no_t5.sh $<TARGET_FILE:diffuse>
                 $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR} ${DF_CASES_DIR}
                 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/sd3_no_t5 PROPERTIES TIMEOUT 300)

# `diffuse generate --image FILE --strength X`: metadata, effect and refusals.
add_test(NAME cli/img2img_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/img2img_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${DF_CASES_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/img2img_generate PROPERTIES TIMEOUT 300)

# `diffuse generate --image FILE --mask FILE [--padding-mask-crop N]`: metadata, effect and
# refusals.
add_test(NAME cli/inpaint_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/inpaint_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${DF_CASES_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/inpaint_generate PROPERTIES TIMEOUT 300)
# LoRA adapters (tools/refgen/lora.py): the adapter files of each case folder, loaded as
# diffusers' load_lora_weights + set_adapters did, on the golden FLUX.1, SD3 and FLUX.2 [klein]
# folders, in every mode.
set(DF_LORA_CASES lora-flux-peft lora-flux-kohya lora-flux-kohya-outside lora-flux-xlabs
    lora-flux-kohya-te2
    lora-sd3-peft
    lora-flux2-klein-peft lora-flux2-klein-bfl lora-flux2-klein-kohya)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_LORA_CASES})
endforeach()
# int8 compute: the adapters stay beside the quantized weights (unmerged, in f32) and the
# result must stay within the int8 bound of a pipeline case against the merged reference.
foreach(mode eager compile)
  foreach(case ${DF_LORA_CASES})
    add_test(NAME golden/cases-int8-${mode}/${case}
             COMMAND diffuse-check --dtype int8 --mode ${mode} --threads 2 ${DF_CASES_DIR}/${case})
    set_tests_properties(golden/cases-int8-${mode}/${case} PROPERTIES TIMEOUT 600)
  endforeach()
endforeach()

# `diffuse generate --lora FILE[:SCALE]` and `diffuse inspect` of an adapter.
add_test(NAME cli/lora_generate
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/lora_generate.sh $<TARGET_FILE:diffuse>
                 ${DF_GOLDEN_DIR} ${DF_CASES_DIR} ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/lora_generate PROPERTIES TIMEOUT 300)
