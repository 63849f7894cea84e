# The option matrix of `diffuse generate` (tests/cli/option_matrix.txt): tiny FLUX.1, SD3 and
# FLUX.2 (dev, klein) pipelines over every combination of mode, compiled blocks, offload,
# dtype, batch and VAE tiling, and FLUX.1 and FLUX.2 under `mpirun -np 2 ... --tp 2` too. Split into slices (architecture x
# dtype, and the --tp 2 runs) so that ctest -j runs them side by side; DF_MATRIX_SUBSET_*
# below says which slices run every combination and which a pairwise subset.
if(TARGET diffuse)
  add_executable(option_matrix ${CMAKE_SOURCE_DIR}/tests/cli/option_matrix.c)
  target_compile_definitions(option_matrix PRIVATE _GNU_SOURCE)
  target_compile_options(option_matrix PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(option_matrix PRIVATE diffuse_static)
  set_target_properties(option_matrix PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_dependencies(option_matrix diffuse)
  set(DF_MATRIX_TABLE ${CMAKE_SOURCE_DIR}/tests/cli/option_matrix.txt)
  set(DF_MATRIX_SLICES "flux-f32\;arch=flux dtype=f32 tp=1" "flux-bf16\;arch=flux dtype=bf16 tp=1"
                       "sd3-f32\;arch=sd3 dtype=f32" "sd3-bf16\;arch=sd3 dtype=bf16"
                       "flux2-f32\;arch=flux2 dtype=f32 tp=1"
                       "flux2-bf16\;arch=flux2 dtype=bf16 tp=1"
                       "flux2-klein-f32\;arch=flux2-klein dtype=f32 tp=1"
                       "flux2-klein-bf16\;arch=flux2-klein dtype=bf16 tp=1")
  # Unoptimised builds (Debug, the sanitizer build) round fused and separate kernels
  # differently (measured: a level per channel in f32, where Release gives the same bits),
  # which sequential offload's flush after every block exposes: one level of slack there.
  set(DF_MATRIX_SLACK "")
  if(NOT CMAKE_BUILD_TYPE MATCHES "^(Release|RelWithDebInfo|MinSizeRel)$")
    set(DF_MATRIX_SLACK --slack 1)
  endif()
  # How much of each slice runs (option_matrix --pairs: every pair of values of two axes in
  # some combination, about a sixth of a slice, each compared with its reference only).
  # Release: every combination of the single-process slices, so that each option's own
  # tolerance is checked against the same run without it; the --tp 2 slices pairwise, since
  # each mpirun costs about a second (72 of them per FLUX.2 slice) and tensor parallelism's
  # numbers are checked in every mode against the references by golden/tp2-*. The sanitizer
  # build looks for memory errors, which need each code path run once, not each numeric
  # combination again: every slice pairwise, which still runs each mode, compiled blocks,
  # each offload kind, tiling, batches and --tp 2 with each of the others.
  set(DF_MATRIX_SUBSET_1 "")
  set(DF_MATRIX_SUBSET_2 --pairs)
  if(NOT CMAKE_BUILD_TYPE STREQUAL "Release")
    set(DF_MATRIX_SUBSET_1 --pairs)
  endif()
  set(DF_MATRIX_MPIRUN ${DF_MPIRUN_FOR_TESTS}) # cmake/tests.cmake
  if(MPI_C_FOUND AND DF_MATRIX_MPIRUN)
    list(APPEND DF_MATRIX_SLICES "flux-tp2-f32\;arch=flux dtype=f32 tp=2"
                                 "flux-tp2-bf16\;arch=flux dtype=bf16 tp=2"
                                 "flux2-tp2\;arch=flux2 tp=2"
                                 "flux2-klein-tp2\;arch=flux2-klein tp=2")
  endif()
  foreach(slice ${DF_MATRIX_SLICES})
    list(GET slice 0 name)
    list(GET slice 1 filter)
    separate_arguments(filter)
    set(subset ${DF_MATRIX_SUBSET_1})
    if(name MATCHES "-tp2")
      set(subset ${DF_MATRIX_SUBSET_2})
    endif()
    add_test(NAME matrix/${name}
             COMMAND option_matrix ${DF_MATRIX_TABLE} $<TARGET_FILE:diffuse>
                     ${CMAKE_BINARY_DIR}/test-tmp/matrix-${name} --mpirun "${DF_MATRIX_MPIRUN}"
                     ${DF_MATRIX_SLACK} ${subset} ${filter})
    set_tests_properties(matrix/${name} PROPERTIES TIMEOUT 900)
  endforeach()
endif()

# The runner itself: a refusal it accepts, and a difference it must report.
if(TARGET option_matrix)
  add_test(NAME matrix/selftest
           COMMAND option_matrix ${CMAKE_SOURCE_DIR}/tests/cli/option_matrix_selftest.txt
                   $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/matrix-selftest)
  add_test(NAME matrix/selftest-mismatch
           COMMAND option_matrix ${CMAKE_SOURCE_DIR}/tests/cli/option_matrix_mismatch.txt
                   $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/matrix-mismatch)
  set_tests_properties(matrix/selftest-mismatch PROPERTIES
                       PASS_REGULAR_EXPRESSION "FAIL arch=flux seed=four: images differ")
endif()
