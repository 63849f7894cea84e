# Unit tests: every tests/unit/test_<module>.c is one cmocka program and one ctest test.
# The reference cases live in the repository (tests/golden, a copy of the project's shared
# folder kept by tools/sync-golden); DF_GOLDEN_DIR points elsewhere for a one-off run.
set(DF_GOLDEN_DIR "${CMAKE_SOURCE_DIR}/tests/golden" CACHE PATH "golden reference cases")
if(CMOCKA_FOUND)
  file(GLOB UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/test_*.c
       ${CMAKE_SOURCE_DIR}/tests/ops/test_*.c)
  foreach(src ${UNIT_TESTS})
    get_filename_component(name ${src} NAME_WE)
    add_executable(${name} ${src})
    target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
    target_compile_definitions(${name} PRIVATE _GNU_SOURCE
                               DF_GOLDEN_DIR="${DF_GOLDEN_DIR}"
                               DF_TEST_TMP="${CMAKE_BINARY_DIR}/test-tmp")
    target_compile_options(${name} PRIVATE ${DF_WARN} ${DF_SAN})
    target_link_libraries(${name} PRIVATE diffuse_static PkgConfig::CMOCKA)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
    # A test that needs arguments says DF_TEST_NEEDS_ARGS and is registered by its own
    # tests/<x>.cmake instead.
    file(STRINGS ${src} needs_args REGEX "DF_TEST_NEEDS_ARGS")
    if(NOT needs_args)
      add_test(NAME unit/${name} COMMAND ${name})
      set_tests_properties(unit/${name} PROPERTIES TIMEOUT 600)
    endif()
  endforeach()
endif()
file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/test-tmp)

# mpirun for every test that launches ranks (DF_MPIRUN_FOR_TESTS): the real one, run once
# more when Open MPI's launcher loses the exit of a rank that had ended normally, which a
# busy machine provokes (tests/tp/mpirun_retry.sh.in says how it is recognised).
if(MPI_C_FOUND)
  find_program(DF_MPIRUN_REAL NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
endif()
if(DF_MPIRUN_REAL)
  set(DF_MPIRUN_RETRY_LOG ${CMAKE_BINARY_DIR}/test-tmp/mpirun-retries.log)
  configure_file(${CMAKE_SOURCE_DIR}/tests/tp/mpirun_retry.sh.in
                 ${CMAKE_BINARY_DIR}/tests/mpirun-retry @ONLY
                 FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ
                                  GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(DF_MPIRUN_FOR_TESTS ${CMAKE_BINARY_DIR}/tests/mpirun-retry)
endif()

# df_golden_tests(GROUP MODE [DIR dir] [CASES...] [ARGS...]): one test golden/GROUP/CASE per
# case, `diffuse-check --mode MODE --threads 2 ARGS DIR/CASE` (DIR: DF_GOLDEN_DIR unless
# given); a text encoder case (te-*) has no repeated blocks to compile, so MODE blocks leaves
# those out. Defined here, before any tests/*.cmake is read, so that each of them can use it.
function(df_golden_tests group mode)
  cmake_parse_arguments(PARSE_ARGV 2 G "" "DIR" "CASES;ARGS")
  if(NOT G_DIR)
    set(G_DIR ${DF_GOLDEN_DIR})
  endif()
  if(NOT EXISTS ${G_DIR})
    return()
  endif()
  foreach(case ${G_CASES})
    if(mode STREQUAL "blocks" AND case MATCHES "^te-")
      continue()
    endif()
    add_test(NAME golden/${group}/${case}
             COMMAND diffuse-check --mode ${mode} --threads 2 ${G_ARGS} ${G_DIR}/${case})
    set_tests_properties(golden/${group}/${case} PROPERTIES TIMEOUT 600)
  endforeach()
endfunction()

# Extra registrations (golden cases, CLI checks, crasher replays) live beside their tests.
file(GLOB TEST_CMAKE CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*.cmake)
foreach(f ${TEST_CMAKE})
  include(${f})
endforeach()

# Open MPI 4 creates its session directory (<tmp>/ompi.<host>.<uid>) with a racy mkdir: two
# mpirun started at once by `ctest -j` can fail with "File exists". Each test gets a base
# of its own, short enough for the Unix socket paths Open MPI puts under it.
# `ctest -j` also runs more threads than there are cores (two tests of two threads each on
# the CI's two), so an idle worker must not spin on a core another test needs: OpenMP
# threads sleep between parallel regions (libgomp spins by default), and an MPI rank waiting
# in a collective yields its core. On a busy machine a tiny FLUX.2 `diffuse generate
# --threads 2` took 16 s of wall time spinning and 1.5 s passive; the results are the same.
get_property(DF_ALL_TESTS DIRECTORY PROPERTY TESTS)
set(DF_TEST_INDEX 0)
foreach(t ${DF_ALL_TESTS})
  math(EXPR DF_TEST_INDEX "${DF_TEST_INDEX} + 1")
  set_property(TEST ${t} APPEND PROPERTY ENVIRONMENT
               "OMPI_MCA_orte_tmpdir_base=/tmp/diffuse-mpi-tests/${DF_TEST_INDEX}"
               "OMP_WAIT_POLICY=passive" "OMPI_MCA_mpi_yield_when_idle=1")
endforeach()
