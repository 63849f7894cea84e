# Golden parity tests: diffuse-check runs every case of tests/golden, in every execution
# mode that exists.
set(DF_GOLDEN_CASES
    rng-randn-f32-small rng-randn-f32-seed42-latent rng-randn-bf16-seed42
    sched-flowmatch-flux-schnell-4 sched-flowmatch-flux-dev-8 sched-flowmatch-sd3-10
    tok-clip-l-77 tok-clip-g-77 tok-t5-512 tok-mistral-tekken tok-qwen3
    te-clip-l te-clip-g te-t5 te-mistral
    flux-transformer flux2-transformer flux2-klein-transformer
    vae-decode-flux vae-decode-sd3 vae-decode-flux2
    pipe-flux-schnell t2i-flux-schnell t2i-flux-schnell-seed42
    sd3-transformer pipe-sd3 t2i-sd3 t2i-sd3-seed0
    pipe-flux2 pipe-flux2-klein t2i-flux2 t2i-flux2-klein)
# eager: strict eager; fuse: defer-and-fuse; compile: the transformer compiled whole, the rest
# deferred and fused (as `diffuse generate --mode compile`); blocks: compiled repeated blocks.
set(DF_GOLDEN_MODES eager fuse compile)
set(DF_GOLDEN_BLOCKS_CASES flux-transformer pipe-flux-schnell t2i-flux-schnell
    sd3-transformer pipe-sd3 t2i-sd3 flux2-transformer flux2-klein-transformer
    pipe-flux2 pipe-flux2-klein t2i-flux2 t2i-flux2-klein)

# df_golden_tests (cmake/tests.cmake) registers each case; tests/int8.cmake uses it too.

if(EXISTS ${DF_GOLDEN_DIR})
  foreach(mode ${DF_GOLDEN_MODES})
    df_golden_tests(${mode} ${mode} CASES ${DF_GOLDEN_CASES})
  endforeach()
  df_golden_tests(blocks blocks CASES ${DF_GOLDEN_BLOCKS_CASES})
  # bf16 compute must stay within the bf16 tolerance of the float64 reference.
  df_golden_tests(bf16 eager ARGS --dtype bf16
                  CASES flux-transformer te-t5 te-mistral t2i-flux-schnell sd3-transformer
                        t2i-sd3 flux2-transformer flux2-klein-transformer pipe-flux2)
  # ... and so must the defer-and-fuse and compiled plans, which write some operands of bf16
  # products in bf16 themselves.
  foreach(mode fuse compile)
    df_golden_tests(bf16-${mode} ${mode} ARGS --dtype bf16
                    CASES flux-transformer t2i-flux-schnell sd3-transformer flux2-transformer
                          flux2-klein-transformer)
  endforeach()
  # int8 compute must stay within the int8 bound of its kind of case (diffuse-check's
  # check_int8_rel_l2) in every mode.
  foreach(mode eager fuse compile blocks)
    df_golden_tests(int8-${mode} ${mode} ARGS --dtype int8
                    CASES flux-transformer sd3-transformer te-t5 pipe-flux-schnell
                          t2i-flux-schnell pipe-sd3 t2i-sd3)
  endforeach()
else()
  message(WARNING "golden cases not found at ${DF_GOLDEN_DIR}; parity tests not registered")
endif()

# tests/golden is a copy of the shared reference folder: it must still match its own SOURCE,
# and, where the shared folder is beside the checkout, that folder (skipped, saying so, in a
# clone that has none; tools/sync-golden brings new cases over).
add_test(NAME golden/copy/verify COMMAND ${CMAKE_SOURCE_DIR}/tools/sync-golden --verify)
add_test(NAME golden/copy/matches-shared COMMAND ${CMAKE_SOURCE_DIR}/tools/sync-golden --check)
set_tests_properties(golden/copy/matches-shared PROPERTIES SKIP_RETURN_CODE 77)
