# int8 compute on the tiny FLUX.1 pipeline (the make-tiny fixture of tests/offload.cmake).
if(TARGET test_int8_pipeline)
  add_test(NAME unit/test_int8_pipeline COMMAND test_int8_pipeline
           ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
  set_tests_properties(unit/test_int8_pipeline PROPERTIES FIXTURES_REQUIRED tiny_flux
                       TIMEOUT 600)
endif()

# int8 weights saved in the kernels' tiles (core/int8_tiles.h): read in place, the same bits
# as quantizing on load and as the row-major folder, tiles of another width repacked, two
# tensor-parallel ranks on their slices of the tiles, hostile layout tags refused.
if(TARGET test_int8_tiles)
  add_test(NAME unit/test_int8_tiles COMMAND test_int8_tiles
           ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux)
  set_tests_properties(unit/test_int8_tiles PROPERTIES FIXTURES_REQUIRED tiny_flux
                       TIMEOUT 600)
endif()

# The int8 group and kernel as load options (df_load_opts.int8_group, int8_path) against
# DIFFUSE_INT8_GROUP and DIFFUSE_INT8_PATH, on the demo pipeline; generate's --int8-group
# and --int8-path.
if(TARGET test_int8_settings AND EXISTS ${CMAKE_SOURCE_DIR}/models/demo/model_index.json)
  add_test(NAME unit/test_int8_settings
           COMMAND test_int8_settings ${CMAKE_SOURCE_DIR}/models/demo)
  set_tests_properties(unit/test_int8_settings PROPERTIES TIMEOUT 300)
  add_test(NAME cli/int8_options
           COMMAND sh ${CMAKE_SOURCE_DIR}/tests/cli/int8_options.sh $<TARGET_FILE:diffuse>
                   ${CMAKE_SOURCE_DIR}/models/demo ${CMAKE_BINARY_DIR}/test-tmp)
  set_tests_properties(cli/int8_options PROPERTIES TIMEOUT 300)
endif()

# FLUX.2 under int8 compute: the golden cases within the int8 bound of their kind
# (diffuse-check's check_int8_rel_l2) in every mode. te-mistral runs the decoder language
# model that FLUX.2-klein's Qwen3 encoder shares (models/decoder_lm.c).
foreach(mode eager fuse compile blocks)
  df_golden_tests(int8-${mode} ${mode} ARGS --dtype int8
                  CASES flux2-transformer flux2-klein-transformer te-mistral pipe-flux2
                        pipe-flux2-klein)
endforeach()

# FLUX.2 from prompts under int8 compute (the Mistral and Qwen3 encoders' linears quantized
# too): a folder saved by `diffuse quantize` gives quantize-on-load's image bit for bit. The
# saved copy has the same folder name, so the PNGs' parameter text is the same as well.
foreach(arch flux2 flux2-klein)
  add_test(NAME cli/int8_quantize_${arch}
           COMMAND sh -c "rm -rf \"$2\" && mkdir -p \"$2\" && \"$0\" quantize -m \"$1\" -o \"$2/$3\" >/dev/null && \"$0\" generate -m \"$1\" -p fox -W 32 -H 32 --steps 2 --dtype int8 -o \"$2/load.png\" >/dev/null && \"$0\" generate -m \"$2/$3\" -p fox -W 32 -H 32 --steps 2 --dtype int8 -o \"$2/saved.png\" >/dev/null && cmp \"$2/load.png\" \"$2/saved.png\" || { echo saved int8 folder differs; exit 1; }"
                   $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/tiny-${arch}
                   ${CMAKE_BINARY_DIR}/test-tmp/int8-saved-${arch} tiny-${arch})
  set_tests_properties(cli/int8_quantize_${arch} PROPERTIES FIXTURES_REQUIRED tiny_flux2
                       TIMEOUT 300)
endforeach()

# `diffuse quantize` streams: its peak memory is bounded by the largest tensor, well under
# the 8-bit transformer (not under the sanitizers, whose allocator keeps freed memory), and a
# sharded copy holds the same tensors (tests/unit/test_quantize_stream.c, which makes its
# own make-tiny folder of about 450 MB).
if(TARGET test_quantize_stream)
  if(DIFFUSE_SANITIZE)
    set(DF_QUANTIZE_PEAK "")
  else()
    set(DF_QUANTIZE_PEAK peak)
  endif()
  add_test(NAME unit/test_quantize_stream
           COMMAND test_quantize_stream $<TARGET_FILE:diffuse>
                   ${CMAKE_BINARY_DIR}/test-tmp/quantize-stream ${DF_QUANTIZE_PEAK})
  set_tests_properties(unit/test_quantize_stream PROPERTIES TIMEOUT 600)
endif()

# A folder quantized into shards (diffuse quantize --shard-size) loads as the single file
# does: the same int8 image, bit for bit.
add_test(NAME cli/int8_quantize_sharded
         COMMAND sh -c "rm -rf \"$2\" && mkdir -p \"$2/one\" \"$2/many\" && \"$0\" quantize -m \"$1\" -o \"$2/one/m\" >/dev/null && \"$0\" quantize --shard-size 100000 -m \"$1\" -o \"$2/many/m\" >/dev/null && test -f \"$2/many/m/transformer/diffusion_pytorch_model.safetensors.index.json\" && \"$0\" generate -m \"$2/one/m\" -p fox -W 32 -H 32 --steps 2 -o \"$2/one.png\" >/dev/null && \"$0\" generate -m \"$2/many/m\" -p fox -W 32 -H 32 --steps 2 -o \"$2/many.png\" >/dev/null && cmp \"$2/one.png\" \"$2/many.png\" || { echo sharded int8 folder differs; exit 1; }"
                 $<TARGET_FILE:diffuse> ${CMAKE_BINARY_DIR}/test-tmp/tiny-flux
                 ${CMAKE_BINARY_DIR}/test-tmp/int8-sharded)
set_tests_properties(cli/int8_quantize_sharded PROPERTIES FIXTURES_REQUIRED tiny_flux
                     TIMEOUT 300)
