# Unit tests: every tests/unit/test_<module>.c is one cmocka program and one ctest test.
set(DF_GOLDEN_DIR "${CMAKE_SOURCE_DIR}/../shared/golden" CACHE PATH "golden reference cases")
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

# Extra registrations (golden cases, CLI checks, crasher replays) live beside their tests.
file(GLOB TEST_CMAKE CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*.cmake)
foreach(f ${TEST_CMAKE})
  include(${f})
endforeach()
