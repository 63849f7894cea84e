# The Vulkan backend's tests, registered only when the backend is built. They run on
# Vulkan device 0 (lavapipe in CI) under the Khronos validation layer; any validation
# message fails them. Without a Vulkan driver at run time they report skipped (77).
if(DIFFUSE_VULKAN_BUILT)
  add_executable(test_vk_ops ${CMAKE_SOURCE_DIR}/tests/vulkan/test_vk_ops.c)
  target_include_directories(test_vk_ops PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests)
  target_compile_definitions(test_vk_ops PRIVATE _GNU_SOURCE)
  target_compile_options(test_vk_ops PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_vk_ops PRIVATE diffuse_vulkan_core diffuse_static)
  set_target_properties(test_vk_ops PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  set(VK_TEST_ENV "VK_INSTANCE_LAYERS=VK_LAYER_KHRONOS_validation"
      "DIFFUSE_CACHE_DIR=${CMAKE_BINARY_DIR}/test-tmp/vk-cache"
      "XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/test-tmp")
  if(DIFFUSE_SANITIZE)
    # lavapipe leaks a few bytes inside the driver, which the loader has unloaded by the
    # time LeakSanitizer reports (an unknown module, so no suppression can name it).
    list(APPEND VK_TEST_ENV "ASAN_OPTIONS=detect_leaks=0")
  endif()
  # The collectives (staged through the host) as one rank of three, the others simulated.
  add_executable(test_vk_collective ${CMAKE_SOURCE_DIR}/tests/vulkan/test_vk_collective.c)
  target_include_directories(test_vk_collective PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(test_vk_collective PRIVATE _GNU_SOURCE)
  target_compile_options(test_vk_collective PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_vk_collective PRIVATE diffuse_vulkan_core diffuse_static)
  set_target_properties(test_vk_collective PROPERTIES
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # The shaders' vocabulary (the generated vocab.glsl) against the C one; no driver needed.
  add_executable(test_vk_vocab ${CMAKE_SOURCE_DIR}/tests/vulkan/test_vk_vocab.c)
  target_include_directories(test_vk_vocab PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(test_vk_vocab PRIVATE _GNU_SOURCE)
  target_compile_options(test_vk_vocab PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_options(test_vk_vocab PRIVATE ${DF_SAN})
  target_link_libraries(test_vk_vocab PRIVATE diffuse_vulkan_core diffuse_static)
  set_target_properties(test_vk_vocab PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME vulkan/vocab
           COMMAND test_vk_vocab ${CMAKE_BINARY_DIR}/src/backend/vulkan/spv/vocab.glsl
                   ${CMAKE_SOURCE_DIR}/src/backend/vulkan/shaders)
  # The op table (tests/ops/test_ops.c) and the products' table (test_ops_matmul.c) on the
  # Vulkan device alone: the library's plugin, named, so that lavapipe is used; test_ops
  # skips (77) without a driver.
  if(CMOCKA_FOUND)
    foreach(t test_ops test_ops_matmul test_lora_epilogue)
      add_test(NAME vulkan/unit/${t} COMMAND ${t})
      set_tests_properties(vulkan/unit/${t} PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77
                           ENVIRONMENT "${VK_TEST_ENV};DIFFUSE_DEVICE=vulkan:0;DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin")
    endforeach()
  endif()
  add_test(NAME vulkan/ops COMMAND test_vk_ops)
  set_tests_properties(vulkan/ops PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${VK_TEST_ENV}" FIXTURES_SETUP vk_pipeline_cache)
  # A second process makes its pipelines from the cache the first one saved.
  add_test(NAME vulkan/ops_from_pipeline_cache COMMAND test_vk_ops --expect-cache)
  set_tests_properties(vulkan/ops_from_pipeline_cache PROPERTIES TIMEOUT 300
                       SKIP_RETURN_CODE 77 ENVIRONMENT "${VK_TEST_ENV}"
                       FIXTURES_REQUIRED vk_pipeline_cache)
  # The choice of the cooperative-matrix matmul, asked for with DIFFUSE_VULKAN_COOPMAT=1.
  add_executable(test_vk_coopmat ${CMAKE_SOURCE_DIR}/tests/vulkan/test_vk_coopmat.c)
  target_include_directories(test_vk_coopmat PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(test_vk_coopmat PRIVATE _GNU_SOURCE)
  target_compile_options(test_vk_coopmat PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_vk_coopmat PRIVATE diffuse_vulkan_core diffuse_static m)
  set_target_properties(test_vk_coopmat PROPERTIES
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME vulkan/coopmat_choice COMMAND test_vk_coopmat)
  set_tests_properties(vulkan/coopmat_choice PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${VK_TEST_ENV}")
  add_test(NAME vulkan/collectives COMMAND test_vk_collective)
  set_tests_properties(vulkan/collectives PROPERTIES TIMEOUT 120 SKIP_RETURN_CODE 77
                       ENVIRONMENT "${VK_TEST_ENV}")
  # Compiled mode on vulkan: every compile test, and the replay of a recorded command
  # buffer (nothing recorded, one submit per call, the device's counters in df_stats).
  add_test(NAME vulkan/compile_replay COMMAND test_compile)
  set_tests_properties(vulkan/compile_replay PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "${VK_TEST_ENV};DIFFUSE_DEVICE=vulkan;DIFFUSE_VULKAN_ALLOW_CPU=1;DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin"
    FAIL_REGULAR_EXPRESSION "vulkan validation:")
  # No driver at run time (the loader pointed at none): a message, not a crash.
  add_test(NAME vulkan/no_driver COMMAND test_vk_ops --expect-no-driver)
  set_tests_properties(vulkan/no_driver PROPERTIES TIMEOUT 60
    ENVIRONMENT "VK_ICD_FILENAMES=${CMAKE_BINARY_DIR}/test-tmp/no-such-icd.json;VK_DRIVER_FILES=${CMAKE_BINARY_DIR}/test-tmp/no-such-icd.json;XDG_RUNTIME_DIR=${CMAKE_BINARY_DIR}/test-tmp")
endif()

# Golden cases with --device vulkan (lavapipe is opened by index with ALLOW_CPU), failing on
# any validation message: every case of tests/golden.cmake in every mode (the rng, scheduler
# and tokenizer cases run on the host; they are cheap and stay here so that a case that
# starts to use the device is covered), compiled blocks for every blocks case, and the bf16
# cases. Registered in the Release pass only, as the sim device's are: the sanitizer pass
# runs the op tests above on vulkan. The 139 Vulkan tests add up to about 350 s of test time
# in the Release pass, at load 9 (docs/vulkan.md).
if(DIFFUSE_VULKAN_BUILT AND EXISTS ${DF_GOLDEN_DIR} AND CMAKE_BUILD_TYPE STREQUAL "Release")
  set(VK_GOLDEN_ENV ${VK_TEST_ENV} "DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin"
      "DIFFUSE_VULKAN_ALLOW_CPU=1")
  set(VK_GOLDEN_CASES ${DF_GOLDEN_CASES} ${DF_REPO_CASES})
  foreach(mode eager fuse compile)
    foreach(case ${VK_GOLDEN_CASES})
      set(dir ${DF_GOLDEN_DIR})
      if(case IN_LIST DF_REPO_CASES) # the repository's own cases (tests/cases.cmake)
        set(dir ${DF_CASES_DIR})
      endif()
      add_test(NAME golden-vulkan/${mode}/${case}
               COMMAND diffuse-check --device vulkan --mode ${mode} ${dir}/${case})
      set_tests_properties(golden-vulkan/${mode}/${case} PROPERTIES TIMEOUT 300
                           ENVIRONMENT "${VK_GOLDEN_ENV}"
                           FAIL_REGULAR_EXPRESSION "vulkan validation:")
    endforeach()
  endforeach()
  # compiled blocks: every blocks case
  foreach(case ${DF_GOLDEN_BLOCKS_CASES})
    add_test(NAME golden-vulkan/blocks/${case}
             COMMAND diffuse-check --device vulkan --mode blocks ${DF_GOLDEN_DIR}/${case})
    set_tests_properties(golden-vulkan/blocks/${case} PROPERTIES TIMEOUT 300
                         ENVIRONMENT "${VK_GOLDEN_ENV}" FAIL_REGULAR_EXPRESSION "vulkan validation:")
  endforeach()
  # bf16 compute: the cases golden.cmake runs in bf16, in the modes it runs them, and the
  # five transformer and text cases in every mode.
  set(VK_BF16_EAGER flux-transformer sd3-transformer flux2-transformer flux2-klein-transformer
      te-mistral te-t5 t2i-flux-schnell t2i-sd3 pipe-flux2)
  set(VK_BF16_PLANNED flux-transformer sd3-transformer flux2-transformer flux2-klein-transformer
      te-mistral t2i-flux-schnell)
  foreach(mode eager fuse compile)
    set(cases ${VK_BF16_PLANNED})
    if(mode STREQUAL "eager")
      set(cases ${VK_BF16_EAGER})
    endif()
    foreach(case ${cases})
      add_test(NAME golden-vulkan/bf16-${mode}/${case}
               COMMAND diffuse-check --device vulkan --dtype bf16 --mode ${mode}
                       ${DF_GOLDEN_DIR}/${case})
      set_tests_properties(golden-vulkan/bf16-${mode}/${case} PROPERTIES TIMEOUT 300
                           ENVIRONMENT "${VK_GOLDEN_ENV}"
                           FAIL_REGULAR_EXPRESSION "vulkan validation:")
    endforeach()
  endforeach()
  # Device selection: lavapipe (a CPU implementation) opens when named by index, and
  # `--device vulkan` alone refuses it without DIFFUSE_VULKAN_ALLOW_CPU=1 (lavapipe is
  # vulkan:0 in CI; on a machine with a GPU first these two do not apply).
  set(VK_NAMED_ENV ${VK_TEST_ENV} "DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin"
      "DIFFUSE_VULKAN_ALLOW_CPU=0")
  add_test(NAME vulkan/named_cpu_device
           COMMAND diffuse-check --device vulkan:0 ${DF_GOLDEN_DIR}/vae-decode-flux2)
  set_tests_properties(vulkan/named_cpu_device PROPERTIES TIMEOUT 300
                       ENVIRONMENT "${VK_NAMED_ENV}" FAIL_REGULAR_EXPRESSION "vulkan validation:")
  add_test(NAME vulkan/unnamed_cpu_device_refused
           COMMAND diffuse-check --device vulkan ${DF_GOLDEN_DIR}/vae-decode-flux2)
  set_tests_properties(vulkan/unnamed_cpu_device_refused PROPERTIES TIMEOUT 60
                       ENVIRONMENT "${VK_NAMED_ENV}"
                       PASS_REGULAR_EXPRESSION "CPU implementation of Vulkan.*--device vulkan:0")
  add_test(NAME vulkan/offload_same_image
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/vulkan/offload.sh $<TARGET_FILE:diffuse>
                   ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(vulkan/offload_same_image PROPERTIES TIMEOUT 600 FIXTURES_REQUIRED tiny_flux
                       ENVIRONMENT "${VK_GOLDEN_ENV}" FAIL_REGULAR_EXPRESSION "vulkan validation:")
  # The Vulkan device declares no int8 products: `--dtype int8` and a `diffuse quantize` folder
  # on vulkan:0 stop with a message naming what needed them, and a nonzero exit (no crash).
  add_test(NAME vulkan/int8_refused
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/vulkan/int8_refused.sh $<TARGET_FILE:diffuse>
                   $<TARGET_FILE:diffuse-check> ${DF_GOLDEN_DIR}/te-t5
                   ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(vulkan/int8_refused PROPERTIES TIMEOUT 300 FIXTURES_REQUIRED tiny_flux
                       ENVIRONMENT "${VK_NAMED_ENV}")
  # `mpirun -np 2 diffuse-check --tp 2 --device vulkan` on the FLUX.1 and FLUX.2 klein
  # pipeline cases (tests/tp_golden.cmake's command), a few seconds each.
  if(DF_TP_MPIRUN)
    foreach(mode eager fuse compile)
      foreach(case pipe-flux-schnell pipe-flux2-klein)
        add_test(NAME golden-vulkan/tp2-${mode}/${case}
                 COMMAND ${DF_TP_MPIRUN} -np 2 $<TARGET_FILE:diffuse-check> --tp 2 --device vulkan
                         --mode ${mode} --threads 1 ${DF_GOLDEN_DIR}/${case})
        set_tests_properties(golden-vulkan/tp2-${mode}/${case} PROPERTIES TIMEOUT 300
                             RUN_SERIAL TRUE ENVIRONMENT "${VK_GOLDEN_ENV}"
                             FAIL_REGULAR_EXPRESSION "vulkan validation:")
      endforeach()
    endforeach()
  endif()
  # `mpirun -np 2 diffuse generate --tp 2 --device vulkan` against one process on vulkan
  # (tests/tp/test_tp_mpi.c, group vulkan), where diffuse was built with MPI. The test reads
  # every run's stderr itself and fails on a validation message there.
  if(TARGET test_tp_mpi)
    add_test(NAME vulkan/tp2_same_image COMMAND test_tp_mpi vulkan)
    set_tests_properties(vulkan/tp2_same_image PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE
                         ENVIRONMENT "${VK_GOLDEN_ENV}")
  endif()
endif()

# A whole compiled FLUX.1, SD3 and FLUX.2 klein transformer replays as one recorded graph
# (0 kernels recorded, 1 graph launch, 1 submit a call from the second on) with the
# uncompiled forward's results: on vulkan (lavapipe) and on sim (Release).
add_executable(test_compiled_transformer ${CMAKE_SOURCE_DIR}/tests/vulkan/test_compiled_transformer.c)
target_compile_options(test_compiled_transformer PRIVATE ${DF_WARN} ${DF_SAN})
target_link_libraries(test_compiled_transformer PRIVATE diffuse_static m)
target_link_options(test_compiled_transformer PRIVATE ${DF_SAN})
set_target_properties(test_compiled_transformer PROPERTIES
                      RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
set(compiled_transformer_args ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux
    ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux2-klein)
if(CMAKE_BUILD_TYPE STREQUAL "Release")
  add_test(NAME sim/compiled_transformer_replay
           COMMAND test_compiled_transformer sim ${compiled_transformer_args})
  set_tests_properties(sim/compiled_transformer_replay PROPERTIES TIMEOUT 600
                       FIXTURES_REQUIRED "tiny_flux;tiny_sd3;tiny_flux2")
endif()
if(DIFFUSE_VULKAN_BUILT)
  add_test(NAME vulkan/compiled_transformer_replay
           COMMAND test_compiled_transformer vulkan:0 ${compiled_transformer_args})
  set_tests_properties(vulkan/compiled_transformer_replay PROPERTIES TIMEOUT 600
    SKIP_RETURN_CODE 77 FIXTURES_REQUIRED "tiny_flux;tiny_sd3;tiny_flux2"
    ENVIRONMENT "${VK_TEST_ENV};DIFFUSE_BACKEND_DIR=${CMAKE_BINARY_DIR}/bin"
    FAIL_REGULAR_EXPRESSION "vulkan validation:")
endif()
