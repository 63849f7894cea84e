# diffuse-bench smoke runs: the execution-mode comparison at tiny shapes, every mode side by
# side with its profile, so that the measuring tool keeps working (times are not checked:
# speed is reported by the bench, never asserted in tests).
add_test(NAME bench/modes-quick COMMAND diffuse-bench --quick --profile modes)
add_test(NAME bench/modes-list COMMAND diffuse-bench --quick --dtype f32 --mode eager,fuse modes)
add_test(NAME bench/bad-mode COMMAND diffuse-bench --quick --mode eager,nonsense modes)
set_tests_properties(bench/bad-mode PROPERTIES WILL_FAIL TRUE)
