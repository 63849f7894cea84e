# Tensor parallelism of the FLUX.2 pipelines across processes (tests/tp/test_tp_mpi_flux2.c),
# registered as tests/tp.cmake registers FluxPipeline's: only with MPI and mpirun (DF_MPIRUN,
# found there), run as root with --allow-run-as-root.
if(DF_MPIRUN)
  add_executable(test_tp_mpi_flux2 ${CMAKE_SOURCE_DIR}/tests/tp/test_tp_mpi_flux2.c)
  target_compile_definitions(test_tp_mpi_flux2 PRIVATE _GNU_SOURCE
                             DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>" DF_MPIRUN="${DF_MPIRUN}"
                             DF_TEST_TMP="${CMAKE_BINARY_DIR}/test-tmp")
  target_compile_options(test_tp_mpi_flux2 PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_tp_mpi_flux2 PRIVATE diffuse_static PkgConfig::CMOCKA)
  set_target_properties(test_tp_mpi_flux2 PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests)
  add_dependencies(test_tp_mpi_flux2 diffuse)
  add_test(NAME tp/mpirun-flux2 COMMAND test_tp_mpi_flux2)
  set_tests_properties(tp/mpirun-flux2 PROPERTIES TIMEOUT 1500 RUN_SERIAL TRUE)
endif()
