# Fuzz targets: every tests/fuzz/fuzz_<parser>.c is a libFuzzer entry point
# (LLVMFuzzerTestOneInput) with seed inputs in tests/fuzz/corpus/<parser>/ and inputs that
# once crashed it in tests/fuzz/crashers/<parser>/. A target ends with
#     #ifdef DF_FUZZ_REPLAY
#     #include "fuzz_replay.h"
#     #endif
#
# Every build gets a replay program per parser (the target compiled with -DDF_FUZZ_REPLAY,
# which adds a main() that runs files and folders through the entry point) and a ctest
# "fuzz/replay_<parser>" that replays the corpus and the crashers, under the sanitizers
# when the build has them.
#
# With -DDIFFUSE_FUZZ=ON and clang, bin/fuzz_<parser> is also built with
# -fsanitize=fuzzer,address,undefined, over a copy of the parsing layers (core/, io/, text/)
# compiled with coverage instrumentation (fuzz_lora: over models/lora.c, linked with the
# library for the rest); `make fuzz` runs each for FUZZ_SECONDS.

set(DF_FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
file(GLOB DF_FUZZ_TARGETS CONFIGURE_DEPENDS ${DF_FUZZ_DIR}/fuzz_*.c)

foreach(src ${DF_FUZZ_TARGETS})
  get_filename_component(name ${src} NAME_WE)
  string(REGEX REPLACE "^fuzz_" "" parser ${name})
  set(target fuzz_replay_${parser})
  add_executable(${target} ${src})
  target_compile_definitions(${target} PRIVATE DF_FUZZ_REPLAY _GNU_SOURCE
                             DF_GOLDEN_DIR="${DF_GOLDEN_DIR}")
  target_include_directories(${target} PRIVATE ${CMAKE_SOURCE_DIR}/src ${DF_FUZZ_DIR})
  target_compile_options(${target} PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(${target} PRIVATE diffuse_static)
  # Not in bin/: `make fuzz` runs every bin/fuzz_* as a libFuzzer binary.
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME fuzz/replay_${parser}
           COMMAND ${target} ${DF_FUZZ_DIR}/corpus/${parser} ${DF_FUZZ_DIR}/crashers/${parser})
  set_tests_properties(fuzz/replay_${parser} PROPERTIES TIMEOUT 300)
endforeach()

if(DIFFUSE_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "DIFFUSE_FUZZ needs clang (configure with -DCMAKE_C_COMPILER=clang); "
                    "only the replay tests are built")
  else()
    set(DF_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined
                    -fno-omit-frame-pointer)
    file(GLOB DF_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/core/*.c
         ${CMAKE_SOURCE_DIR}/src/io/*.c ${CMAKE_SOURCE_DIR}/src/text/*.c)
    add_library(diffuse_fuzz_lib STATIC ${DF_FUZZ_LIB_SOURCES})
    target_include_directories(diffuse_fuzz_lib PUBLIC ${CMAKE_SOURCE_DIR}/include
                               PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_compile_definitions(diffuse_fuzz_lib PRIVATE DF_BUILDING_LIBRARY _GNU_SOURCE
                               DF_VERSION="${PROJECT_VERSION}")
    target_compile_options(diffuse_fuzz_lib PRIVATE ${DF_WARN} ${DF_FUZZ_SAN}
                           -fsanitize=fuzzer-no-link)
    target_link_libraries(diffuse_fuzz_lib PUBLIC PkgConfig::CJSON PkgConfig::SPNG PkgConfig::TURBOJPEG
                          PkgConfig::UTF8PROC PkgConfig::PCRE2 Threads::Threads m)
    foreach(src ${DF_FUZZ_TARGETS})
      get_filename_component(name ${src} NAME_WE)
      add_executable(${name} ${src})
      target_compile_definitions(${name} PRIVATE _GNU_SOURCE DF_GOLDEN_DIR="${DF_GOLDEN_DIR}")
      target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${DF_FUZZ_DIR})
      target_compile_options(${name} PRIVATE ${DF_WARN} ${DF_FUZZ_SAN} -fsanitize=fuzzer)
      target_link_options(${name} PRIVATE ${DF_FUZZ_SAN} -fsanitize=fuzzer)
      if(name STREQUAL "fuzz_lora")
        # the adapter reader lives in models/: lora.c is compiled into the target with the
        # coverage instrumentation, the rest (its name maps) comes from the library as built
        target_sources(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src/models/lora.c)
        target_link_libraries(${name} PRIVATE diffuse_static OpenMP::OpenMP_C)
      else()
        target_link_libraries(${name} PRIVATE diffuse_fuzz_lib)
      endif()
    endforeach()
  endif()
endif()
