# Step caches (docs/step-cache.md): diffusers' FirstBlockCache, TaylorSeer and MagCache on the tiny
# FLUX.1 and FLUX.2 [klein] pipelines, against diffusers' own cached float64 runs (tests/cases/cache-*, made by
# tools/refgen/step_cache_cases.py): the image and the per-call trace, in every mode that
# takes the cache, and the modes that refuse it say so.
set(DF_CACHE_CASES_DIR ${CMAKE_SOURCE_DIR}/tests/cases)
set(DF_CACHE_CASES cache-fbc-flux cache-taylorseer-flux cache-taylorseer-flux-bf16
    cache-taylorseer-flux-order1 cache-taylorseer-flux2-klein cache-mag-flux cache-mag-flux2)
if(EXISTS ${DF_GOLDEN_DIR}/pipe-flux-schnell AND EXISTS ${DF_GOLDEN_DIR}/pipe-flux2-klein
   AND EXISTS ${DF_GOLDEN_DIR}/pipe-flux2)
  foreach(case ${DF_CACHE_CASES})
    foreach(mode eager fuse)
      add_test(NAME step_cache/${mode}/${case}
               COMMAND diffuse-check --mode ${mode} --threads 2 ${DF_CACHE_CASES_DIR}/${case})
      set_tests_properties(step_cache/${mode}/${case} PROPERTIES TIMEOUT 600)
    endforeach()
  endforeach()
  # The first-block cache and MagCache work between compiled blocks; TaylorSeer, inside
  # them, does not.
  foreach(case cache-fbc-flux cache-mag-flux cache-mag-flux2)
    add_test(NAME step_cache/blocks/${case}
             COMMAND diffuse-check --mode blocks --threads 2 ${DF_CACHE_CASES_DIR}/${case})
  endforeach()
  add_test(NAME step_cache/blocks/taylorseer-refused
           COMMAND diffuse-check --mode blocks --threads 2
                   ${DF_CACHE_CASES_DIR}/cache-taylorseer-flux)
  set_tests_properties(step_cache/blocks/taylorseer-refused PROPERTIES
    PASS_REGULAR_EXPRESSION "taylorseer predicts attention inside the blocks")
  add_test(NAME step_cache/compile/refused
           COMMAND diffuse-check --mode compile --threads 2 ${DF_CACHE_CASES_DIR}/cache-fbc-flux)
  set_tests_properties(step_cache/compile/refused PROPERTIES
    PASS_REGULAR_EXPRESSION "the transformer is compiled whole")
  # diffuse generate: --cache's keys are the configs' own; an unknown one is refused.
  add_test(NAME step_cache/cli-unknown-key
           COMMAND diffuse generate -m ${DF_GOLDEN_DIR}/t2i-flux-schnell/pipeline -p x
                   --cache first-block:treshold=0.2)
  set_tests_properties(step_cache/cli-unknown-key PROPERTIES
    PASS_REGULAR_EXPRESSION "unknown key 'treshold' \\(first-block takes threshold\\)")
endif()
