# The backend registry: two device plugins built here (a working one and one built for
# another ABI), loaded from their own folder so that no other test sees them.
if(CMOCKA_FOUND)
  set(DF_TEST_PLUGIN_DIR ${CMAKE_BINARY_DIR}/test-plugins)
  foreach(plugin testdev badabi)
    add_library(diffuse-${plugin} MODULE ${CMAKE_SOURCE_DIR}/tests/plugin/testdev.c)
    # the installed headers' layout only: <diffuse/device.h> and the public headers
    target_include_directories(diffuse-${plugin} PRIVATE ${CMAKE_BINARY_DIR}/abi
                               ${CMAKE_SOURCE_DIR}/include)
    target_compile_options(diffuse-${plugin} PRIVATE ${DF_WARN} -fvisibility=hidden)
    set_target_properties(diffuse-${plugin} PROPERTIES PREFIX "lib"
                          LIBRARY_OUTPUT_DIRECTORY ${DF_TEST_PLUGIN_DIR})
  endforeach()
  target_compile_definitions(diffuse-badabi PRIVATE TESTDEV_BAD_ABI)
  add_dependencies(test_backends diffuse-testdev diffuse-badabi)
  foreach(mode autoload manual)
    add_test(NAME unit/test_backends_${mode} COMMAND test_backends ${mode})
    set(env "DIFFUSE_BACKEND_DIR=${DF_TEST_PLUGIN_DIR}")
    if(mode STREQUAL "manual")
      list(APPEND env "DIFFUSE_BACKEND_AUTOLOAD=0")
    endif()
    set_tests_properties(unit/test_backends_${mode} PROPERTIES ENVIRONMENT "${env}" TIMEOUT 120)
  endforeach()
endif()

# The installed layout: a plugin built outside the tree against the installed headers
# alone (tests/plugin/testdev.c, compiled by the script) and put in libdir is found by the
# installed program and by a program on the installed shared library, without
# DIFFUSE_BACKEND_DIR.
if(CMOCKA_FOUND)
  add_executable(test_list_devices ${CMAKE_SOURCE_DIR}/tests/plugin/list_devices.c)
  target_compile_options(test_list_devices PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_options(test_list_devices PRIVATE ${DF_SAN}) # the sanitizer runtime first
  target_include_directories(test_list_devices PRIVATE ${CMAKE_SOURCE_DIR}/include)
  target_link_libraries(test_list_devices PRIVATE diffuse_shared)
  set_target_properties(test_list_devices PROPERTIES SKIP_BUILD_RPATH ON
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME cli/installed_plugins
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/installed_plugins.sh ${CMAKE_BINARY_DIR}
                   ${CMAKE_INSTALL_LIBDIR} ${CMAKE_SOURCE_DIR}/tests/plugin/testdev.c
                   $<TARGET_FILE:test_list_devices> ${CMAKE_BINARY_DIR}/test-tmp
                   ${CMAKE_C_COMPILER})
  set_tests_properties(cli/installed_plugins PROPERTIES TIMEOUT 300)
endif()
