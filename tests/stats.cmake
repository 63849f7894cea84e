# `diffuse generate --stats-json`: the run's counters under each offload level, on the tiny
# SD3 pipeline of tests/sd3.cmake.
add_test(NAME cli/stats-peak
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/stats_peak.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/cli-tiny-sd3 ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/stats-peak PROPERTIES FIXTURES_REQUIRED tiny_sd3 TIMEOUT 600)
