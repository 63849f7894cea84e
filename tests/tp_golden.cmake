# The golden pipeline cases whose pipeline has a tensor-parallel plan (FluxPipeline,
# Flux2Pipeline, Flux2KleinPipeline; StableDiffusion3Pipeline has none), split over 2 ranks:
# `mpirun -np 2 diffuse-check --tp 2` in every mode, 1 thread per rank. Registered as
# tests/tp.cmake registers its own: only with MPI and mpirun (DF_MPIRUN, found there).
# RUN_SERIAL: two ranks on a shared machine would time each other out under ctest -j.
if(DF_MPIRUN AND EXISTS ${DF_GOLDEN_DIR})
  set(DF_TP_GOLDEN_CASES pipe-flux-schnell t2i-flux-schnell t2i-flux-schnell-seed42
      pipe-flux2 pipe-flux2-klein t2i-flux2 t2i-flux2-klein)
  set(DF_TP_MPIRUN ${CMAKE_COMMAND} -E env OMPI_MCA_rmaps_base_oversubscribe=1
      ASAN_OPTIONS=detect_leaks=0 ${DF_MPIRUN} --oversubscribe --allow-run-as-root
      -x ASAN_OPTIONS)
  foreach(mode eager fuse compile blocks)
    foreach(case ${DF_TP_GOLDEN_CASES})
      add_test(NAME golden/tp2-${mode}/${case}
               COMMAND ${DF_TP_MPIRUN} -np 2 $<TARGET_FILE:diffuse-check> --tp 2
                       --mode ${mode} --threads 1 ${DF_GOLDEN_DIR}/${case})
      set_tests_properties(golden/tp2-${mode}/${case} PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
    endforeach()
  endforeach()
  # A case that fails on rank 1 only (its folder is missing there) fails on both ranks, with
  # rank 1's message printed once by rank 0, and no rank left waiting.
  add_test(NAME golden/tp2/rank-failure
           COMMAND ${DF_TP_MPIRUN} -np 1 $<TARGET_FILE:diffuse-check> --tp 2 --threads 1
                   ${DF_GOLDEN_DIR}/pipe-flux2 ${DF_GOLDEN_DIR}/pipe-flux2-klein
                   : -np 1 $<TARGET_FILE:diffuse-check> --tp 2 --threads 1
                   ${CMAKE_BINARY_DIR}/test-tmp/no-such-case ${DF_GOLDEN_DIR}/pipe-flux2-klein)
  set_tests_properties(golden/tp2/rank-failure PROPERTIES TIMEOUT 120 RUN_SERIAL TRUE
      PASS_REGULAR_EXPRESSION
      "pipe-flux2: rank 1: [^\n]*no-such-case/case.json.*FAIL pipe-flux2 .*PASS pipe-flux2-klein .*1 of 2 cases passed")
endif()
