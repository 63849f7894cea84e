# diffuse serve (tools/diffuse/serve*.c, docs/server.md):
#   server/library   what the library grew for it: on_step cancellation, PNG in memory,
#                    host_step as a run parameter, the log hook (cmocka, models/demo)
#   server/request   the request layer: base64, JSON escaping, both protocols' bodies (cmocka)
#   server/api       every endpoint and error status against models/demo (stdlib Python)
#   server/load      8 clients for 20 s with cancels and hang-ups; RSS flat (not under the
#                    sanitizers, whose quarantine keeps freed memory); the queue drains
#   server/clients   openai (generate, edit), webuiapi (txt2img, img2img) and the page in
#                    headless Chromium (selenium, live previews), in a venv made in the build
#                    folder; skipped without Chromium or PyPI unless CI=true
#   server/preview_loading  live previews; 503 while a model loads (a test-only load delay)
#   server/images_in        img2img and edits with the standard library; every bad input
# The request parser's fuzz target is tests/fuzz/fuzz_serve_request.c.
if(CMOCKA_FOUND)
  add_executable(test_serve_request ${CMAKE_SOURCE_DIR}/tests/server/test_serve_request.c
                                    ${CMAKE_SOURCE_DIR}/tools/diffuse/serve_request.c)
  target_include_directories(test_serve_request PRIVATE ${CMAKE_SOURCE_DIR}/tools/diffuse)
  target_compile_options(test_serve_request PRIVATE ${DF_WARN} ${DF_SAN})
  target_link_libraries(test_serve_request PRIVATE diffuse_static PkgConfig::CMOCKA)
  set_target_properties(test_serve_request PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME server/request COMMAND test_serve_request)
  if(EXISTS ${CMAKE_SOURCE_DIR}/models/demo/model_index.json)
    add_executable(test_serve_library ${CMAKE_SOURCE_DIR}/tests/server/test_serve_library.c)
    target_include_directories(test_serve_library PRIVATE ${CMAKE_SOURCE_DIR}/src)
    target_compile_definitions(test_serve_library PRIVATE _GNU_SOURCE
                               DF_DEMO_MODEL="${CMAKE_SOURCE_DIR}/models/demo"
                               DF_GOLDEN_DIR="${CMAKE_SOURCE_DIR}/tests/golden"
                               DF_TEST_TMP="${CMAKE_BINARY_DIR}/test-tmp")
    target_compile_options(test_serve_library PRIVATE ${DF_WARN} ${DF_SAN})
    target_link_libraries(test_serve_library PRIVATE diffuse_static PkgConfig::CMOCKA)
    set_target_properties(test_serve_library PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                          ${CMAKE_BINARY_DIR}/tests)
    add_test(NAME server/library COMMAND test_serve_library)
    set_tests_properties(server/library PROPERTIES TIMEOUT 300)
  endif()
endif()

find_package(Python3 COMPONENTS Interpreter)
set(DF_SERVE_MODEL ${CMAKE_SOURCE_DIR}/models/demo)
if(Python3_Interpreter_FOUND AND EXISTS ${DF_SERVE_MODEL}/model_index.json)
  set(DF_SERVE_DIR ${CMAKE_SOURCE_DIR}/tests/server)
  add_test(NAME server/api
           COMMAND ${Python3_EXECUTABLE} ${DF_SERVE_DIR}/api.py $<TARGET_FILE:diffuse>
                   ${DF_SERVE_MODEL} ${CMAKE_BINARY_DIR}/test-tmp)
  set(DF_SERVE_LOAD_ARGS 20)
  if(DIFFUSE_SANITIZE)
    list(APPEND DF_SERVE_LOAD_ARGS --no-rss)
  endif()
  add_test(NAME server/load
           COMMAND ${Python3_EXECUTABLE} ${DF_SERVE_DIR}/load.py $<TARGET_FILE:diffuse>
                   ${DF_SERVE_MODEL} ${DF_SERVE_LOAD_ARGS})
  add_test(NAME server/clients
           COMMAND sh ${DF_SERVE_DIR}/clients.sh $<TARGET_FILE:diffuse> ${DF_SERVE_MODEL}
                   ${CMAKE_BINARY_DIR})
  set_tests_properties(server/api server/load server/clients PROPERTIES TIMEOUT 300
                       RUN_SERIAL TRUE)
  set_tests_properties(server/clients PROPERTIES SKIP_RETURN_CODE 77)
endif()
if(Python3_Interpreter_FOUND AND EXISTS ${DF_SERVE_MODEL}/model_index.json)
  # live previews (events, progress's current_image) and 503 while a model loads
  add_test(NAME server/preview_loading
           COMMAND ${Python3_EXECUTABLE} ${DF_SERVE_DIR}/preview_loading.py $<TARGET_FILE:diffuse>
                   ${DF_SERVE_MODEL} ${CMAKE_BINARY_DIR}/test-tmp)
  # pictures in: /sdapi/v1/img2img and /v1/images/edits, their bad input
  add_test(NAME server/images_in
           COMMAND ${Python3_EXECUTABLE} ${DF_SERVE_DIR}/images_in.py $<TARGET_FILE:diffuse>
                   ${DF_SERVE_MODEL})
  set_tests_properties(server/preview_loading server/images_in PROPERTIES TIMEOUT 300
                       RUN_SERIAL TRUE)
endif()
