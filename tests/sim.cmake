# The sim device: memory the host cannot address, kernels on its own stream thread, real
# copies (backend/sim/sim.c). Every path that reaches the device is proved through it: the
# op tests, the defer-and-fuse and compile units, offload levels, tensor parallelism and
# every golden case in every mode. Registered in the Release pass only and in f32 (bf16
# and int8 compute run the same device paths), which keeps the added CI time to about two
# minutes on two cores.
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  if(CMOCKA_FOUND)
    foreach(t test_ops test_ops_matmul test_lazy test_compile test_tp)
      if(TARGET ${t})
        add_test(NAME sim/unit/${t} COMMAND ${t})
        set_tests_properties(sim/unit/${t} PROPERTIES ENVIRONMENT "DIFFUSE_DEVICE=sim"
                             TIMEOUT 600)
      endif()
    endforeach()
    if(TARGET test_offload)
      add_test(NAME sim/unit/test_offload_tiny COMMAND test_offload
               ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
      set_tests_properties(sim/unit/test_offload_tiny PROPERTIES
                           ENVIRONMENT "DIFFUSE_DEVICE=sim" FIXTURES_REQUIRED tiny_flux
                           TIMEOUT 600)
    endif()
  endif()
  if(EXISTS ${DF_GOLDEN_DIR} AND DEFINED DF_GOLDEN_CASES) # set by golden.cmake, read first
    # every case in every mode, as on the CPU (tests/golden.cmake's lists)
    set(runs "")
    foreach(mode ${DF_GOLDEN_MODES})
      foreach(case ${DF_GOLDEN_CASES})
        list(APPEND runs "${mode}:${case}")
      endforeach()
    endforeach()
    foreach(case ${DF_GOLDEN_BLOCKS_CASES})
      list(APPEND runs "blocks:${case}")
    endforeach()
    foreach(run ${runs})
      string(REPLACE ":" ";" parts ${run})
      list(GET parts 0 mode)
      list(GET parts 1 case)
      add_test(NAME golden/sim-${mode}/${case}
               COMMAND diffuse-check --device sim --mode ${mode} --threads 2
                       ${DF_GOLDEN_DIR}/${case})
      set_tests_properties(golden/sim-${mode}/${case} PROPERTIES TIMEOUT 600)
    endforeach()
    foreach(mode ${DF_GOLDEN_MODES}) # the repository's own cases (tests/cases.cmake)
      df_golden_tests(sim-${mode} ${mode} DIR ${DF_CASES_DIR} CASES ${DF_REPO_CASES}
                      ARGS --device sim)
    endforeach()
  endif()
endif()
