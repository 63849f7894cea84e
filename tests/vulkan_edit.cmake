# The picture-in cases on the sim device and on Vulkan (DF_EDIT_SIM_CASES, DF_EDIT_VULKAN_RUNS:
# tests/edit.cmake says which and why). Read after tests/sim.cmake and tests/vulkan.cmake
# (the glob sorts this file after both), whose settings it reuses; Release pass only, as
# theirs, but for four sim runs that the sanitizer pass makes too (the host blend and the
# crop's overlay beside device memory; 2 to 7 s each there).
if(CMAKE_BUILD_TYPE STREQUAL "Release" AND EXISTS ${DF_GOLDEN_DIR})
  foreach(mode eager fuse compile)
    df_golden_tests(sim-${mode} ${mode} DIR ${CMAKE_SOURCE_DIR}/tests/cases
                    CASES ${DF_EDIT_SIM_CASES} ARGS --device sim)
  endforeach()
  if(DIFFUSE_VULKAN_BUILT)
    foreach(run ${DF_EDIT_VULKAN_RUNS})
      string(REPLACE ":" ";" parts ${run})
      list(GET parts 0 mode)
      list(GET parts 1 case)
      add_test(NAME golden-vulkan/${mode}/${case}
               COMMAND diffuse-check --device vulkan --mode ${mode}
                       ${CMAKE_SOURCE_DIR}/tests/cases/${case})
      set_tests_properties(golden-vulkan/${mode}/${case} PROPERTIES TIMEOUT 300
                           ENVIRONMENT "${VK_GOLDEN_ENV}"
                           FAIL_REGULAR_EXPRESSION "vulkan validation:")
    endforeach()
  endif()
endif()
if(NOT CMAKE_BUILD_TYPE STREQUAL "Release" AND EXISTS ${DF_GOLDEN_DIR})
  df_golden_tests(sim-eager eager DIR ${CMAKE_SOURCE_DIR}/tests/cases
                  CASES inpaint-flux-crop inpaint-sd3-s03 kontext-b2 edit-flux2-crop
                  ARGS --device sim)
endif()
