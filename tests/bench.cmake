# diffuse-bench smoke runs: the execution-mode comparison at tiny shapes, every mode side by
# side with its profile, so that the measuring tool keeps working (times are not checked:
# speed is reported by the bench, never asserted in tests).
add_test(NAME bench/modes-quick COMMAND diffuse-bench --quick --profile modes)
add_test(NAME bench/modes-list COMMAND diffuse-bench --quick --dtype f32 --mode eager,fuse modes)
# A mode it does not know is a usage error: exit status 2, not a crash.
add_test(NAME bench/bad-mode
         COMMAND sh -c "\"$0\" --quick --mode eager,nonsense modes; test $? -eq 2"
                 $<TARGET_FILE:diffuse-bench>)
# The FLUX.2 transformer workload at its tiny shape, in every mode it has.
add_test(NAME bench/flux2-quick COMMAND diffuse-bench --quick flux2)
add_test(NAME bench/flux2-quick-blocks COMMAND diffuse-bench --quick --mode blocks flux2)
# The step-cache workload on the tiny FLUX.1 pipeline of the golden cases.
add_test(NAME bench/cache-quick
         COMMAND diffuse-bench --quick cache ${DF_GOLDEN_DIR}/t2i-flux-schnell/pipeline)
set_tests_properties(bench/cache-quick PROPERTIES PASS_REGULAR_EXPRESSION "taylorseer")
# The unmerged-LoRA workload at its quick shape (M = 512), f32 and int8.
add_test(NAME bench/lora-quick COMMAND diffuse-bench --quick --threads 2 lora --reps 1)
set_tests_properties(bench/lora-quick PROPERTIES PASS_REGULAR_EXPRESSION "fused / unfused")
# The peer workload's diffuse side at its tiny shape, with no Python: the diffuse rows, then
# the line that says the PyTorch side was skipped and how to enable it.
add_test(NAME bench/peer-quick COMMAND diffuse-bench --quick --threads 2 peer)
set_tests_properties(bench/peer-quick PROPERTIES
                     ENVIRONMENT "DIFFUSE_PEER_PYTHON="
                     PASS_REGULAR_EXPRESSION
                     "diffuse 64\\+8 double\\+single +2 f32.*diffuse 64\\+8 double\\+single +2 bf16.*diffuse 64\\+8 double\\+single +2 i8.*PyTorch side skipped: no Python given \\(--python PATH")
