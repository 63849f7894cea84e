# Tensor parallelism across processes: `mpirun -np 2 diffuse generate --tp 2` against the
# single-process image, and ranks that fail (tests/tp/test_tp_mpi.c), for FluxPipeline and the
# FLUX.2 pipelines. Registered only when
# diffuse was built with MPI and mpirun exists; the in-process checks of the TP plans
# (thread communicator) are the unit test test_tp and run everywhere.
if(MPI_C_FOUND AND CMOCKA_FOUND AND TARGET diffuse)
  set(DF_MPIRUN ${DF_MPIRUN_FOR_TESTS}) # cmake/tests.cmake
endif()
if(DF_MPIRUN)
  add_executable(test_tp_mpi ${CMAKE_SOURCE_DIR}/tests/tp/test_tp_mpi.c)
  target_compile_definitions(test_tp_mpi PRIVATE _GNU_SOURCE
                             DF_DIFFUSE_BIN="$<TARGET_FILE:diffuse>" DF_MPIRUN="${DF_MPIRUN}"
                             DF_TEST_TMP="${CMAKE_BINARY_DIR}/test-tmp")
  target_compile_options(test_tp_mpi PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_tp_mpi PRIVATE diffuse_static PkgConfig::CMOCKA)
  set_target_properties(test_tp_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_dependencies(test_tp_mpi diffuse)
  # One program, two groups: FluxPipeline, and the FLUX.2 pipelines.
  add_test(NAME tp/mpirun COMMAND test_tp_mpi flux)
  add_test(NAME tp/mpirun-flux2 COMMAND test_tp_mpi flux2)
  # Each mpirun inside has its own 300 s limit; the whole test stays well under this.
  set_tests_properties(tp/mpirun PROPERTIES TIMEOUT 900 RUN_SERIAL TRUE)
  set_tests_properties(tp/mpirun-flux2 PROPERTIES TIMEOUT 1500 RUN_SERIAL TRUE)
elseif(MPI_C_FOUND)
  message(STATUS "mpirun not found: tensor-parallel process tests not registered")
endif()
