# Golden parity tests: diffuse-check runs every case of ../shared/golden, in every execution
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
    pipe-flux2 pipe-flux2-klein)
# eager: strict eager; fuse: defer-and-fuse; compile: the transformer compiled whole, the rest
# deferred and fused (as `diffuse generate --mode compile`); blocks: compiled repeated blocks.
set(DF_GOLDEN_MODES eager fuse compile)
set(DF_GOLDEN_BLOCKS_CASES flux-transformer pipe-flux-schnell t2i-flux-schnell
    sd3-transformer pipe-sd3 t2i-sd3 flux2-transformer flux2-klein-transformer
    pipe-flux2 pipe-flux2-klein)

if(EXISTS ${DF_GOLDEN_DIR})
  foreach(mode ${DF_GOLDEN_MODES})
    foreach(case ${DF_GOLDEN_CASES})
      add_test(NAME golden/${mode}/${case}
               COMMAND diffuse-check --mode ${mode} --threads 2 ${DF_GOLDEN_DIR}/${case})
      set_tests_properties(golden/${mode}/${case} PROPERTIES TIMEOUT 600)
    endforeach()
  endforeach()
  foreach(case ${DF_GOLDEN_BLOCKS_CASES})
    add_test(NAME golden/blocks/${case}
             COMMAND diffuse-check --mode blocks --threads 2 ${DF_GOLDEN_DIR}/${case})
    set_tests_properties(golden/blocks/${case} PROPERTIES TIMEOUT 600)
  endforeach()
  # bf16 compute must stay within the bf16 tolerance of the float64 reference.
  foreach(case flux-transformer te-t5 te-mistral t2i-flux-schnell sd3-transformer t2i-sd3
          flux2-transformer flux2-klein-transformer pipe-flux2)
    add_test(NAME golden/bf16/${case}
             COMMAND diffuse-check --dtype bf16 --threads 2 ${DF_GOLDEN_DIR}/${case})
  endforeach()
  # ... and so must the defer-and-fuse and compiled plans, which write some operands of bf16
  # products in bf16 themselves.
  foreach(mode fuse compile)
    foreach(case flux-transformer t2i-flux-schnell sd3-transformer flux2-transformer
            flux2-klein-transformer)
      add_test(NAME golden/bf16-${mode}/${case}
               COMMAND diffuse-check --dtype bf16 --mode ${mode} --threads 2
                       ${DF_GOLDEN_DIR}/${case})
    endforeach()
  endforeach()
  # int8 compute must stay within the int8 bound of its kind of case (diffuse-check's
  # check_int8_rel_l2) in every mode.
  foreach(mode eager fuse compile blocks)
    foreach(case flux-transformer sd3-transformer te-t5 pipe-flux-schnell t2i-flux-schnell
            pipe-sd3 t2i-sd3)
      if(mode STREQUAL "blocks" AND case STREQUAL "te-t5")
        continue() # no repeated blocks to compile in a text encoder case
      endif()
      add_test(NAME golden/int8-${mode}/${case}
               COMMAND diffuse-check --dtype int8 --mode ${mode} --threads 2
                       ${DF_GOLDEN_DIR}/${case})
      set_tests_properties(golden/int8-${mode}/${case} PROPERTIES TIMEOUT 600)
    endforeach()
  endforeach()
else()
  message(WARNING "golden cases not found at ${DF_GOLDEN_DIR}; parity tests not registered")
endif()
