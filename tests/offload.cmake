# Offload levels on a tiny pipeline that make-tiny writes first (a test fixture).
if(TARGET test_offload)
  set(DF_TINY_FLUX ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
  add_test(NAME fixture/make-tiny-flux
           COMMAND diffuse make-tiny --arch flux --seed 3 ${DF_TINY_FLUX})
  set_tests_properties(fixture/make-tiny-flux PROPERTIES FIXTURES_SETUP tiny_flux)
  add_test(NAME unit/test_offload_tiny COMMAND test_offload ${DF_TINY_FLUX})
  set_tests_properties(unit/test_offload_tiny PROPERTIES FIXTURES_REQUIRED tiny_flux TIMEOUT 600)
endif()

# `diffuse generate` bad-input behaviour on the same tiny folder.
add_test(NAME cli/generate_errors
         COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/generate_errors.sh $<TARGET_FILE:diffuse>
                 ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux ${CMAKE_BINARY_DIR}/test-tmp)
set_tests_properties(cli/generate_errors PROPERTIES FIXTURES_REQUIRED tiny_flux TIMEOUT 600)

# make-tiny's streaming writer: the same seed and folder name with every component split
# into files of at most 100 kB (text encoders, transformer, VAE, each with its index) gives
# the image of the single files.
add_test(NAME cli/flux_sharded
         COMMAND sh -c "rm -rf \"$1\" && \"$0\" make-tiny --arch flux --seed 3 --shard-size 100000 \"$1\" >/dev/null && for c in text_encoder text_encoder_2 transformer vae; do ls \"$1\"/$c/*-00003-of-* \"$1\"/$c/*.safetensors.index.json >/dev/null || exit 1; done && \"$0\" generate -m \"$1\" -p fox -W 64 -H 64 --steps 1 -o \"$1\".png >/dev/null && \"$0\" generate -m \"$2\" -p fox -W 64 -H 64 --steps 1 -o \"$1\"-ref.png >/dev/null && cmp \"$1\".png \"$1\"-ref.png || { echo sharded folder differs; exit 1; }"
                 $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/sharded/tiny-flux
                 ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
set_tests_properties(cli/flux_sharded PROPERTIES FIXTURES_REQUIRED tiny_flux TIMEOUT 300)

# With too little memory for a whole decode (DIFFUSE_MEMORY_LIMIT fakes it) the pipeline
# tiles the decode by itself and says so; test_vae checks the image is the tiled one.
add_test(NAME cli/decode_tiles_when_memory_is_short
         COMMAND ${CMAKE_COMMAND} -E env DIFFUSE_MEMORY_LIMIT=1
                 $<TARGET_FILE:diffuse> generate -m ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux
                 -p fox -W 256 -H 256 --steps 1 -v
                 -o ${CMAKE_BINARY_DIR}/test-tmp/decode-short.png)
set_tests_properties(cli/decode_tiles_when_memory_is_short PROPERTIES
                     FIXTURES_REQUIRED tiny_flux TIMEOUT 300
                     PASS_REGULAR_EXPRESSION "decode: 256 x 256 tiled \\(16-latent tiles\\), needs [0-9.]+ GiB whole, [0-9.]+ GiB tiled, 0.00 GiB available")
