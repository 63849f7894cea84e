# Reference cases made in this repository (tools/refgen/, diffusers 0.42 / transformers 5.x),
# beside the shared golden ones: diffuse-check runs each in every execution mode, on the CPU
# here, and on the sim and Vulkan devices where tests/sim.cmake and tests/vulkan.cmake (read
# after this file) run the golden cases.
set(DF_CASES_DIR ${CMAKE_SOURCE_DIR}/tests/cases)
set(DF_REPO_CASES vae-decode-flux2-decoder-widths)
foreach(mode eager fuse compile)
  df_golden_tests(cases-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_REPO_CASES})
endforeach()
