# Writes one C file holding every shipped config (src/models/configs/<model>/<path>.json) as a
# NUL-terminated byte array, and the table models/shipped.c reads (run with cmake -P):
#   cmake -DROOT=src/models/configs -DOUT=shipped_configs_data.c -P embed_configs.cmake
# The files are the data; this keeps them byte for byte (their SHA-256 is checked by
# test_shipped_configs), with no escaping by hand.
file(GLOB_RECURSE files RELATIVE "${ROOT}" "${ROOT}/*.json")
list(SORT files)
string(REPEAT "0x..," 16 row) # CMake's regular expressions have no {n}
set(arrays "")
set(rows "")
set(i 0)
foreach(rel IN LISTS files)
  file(READ "${ROOT}/${rel}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR bytes "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
  string(REGEX REPLACE "(${row})" "\\1\n" body "${body}")
  string(APPEND arrays "static const unsigned char blob_${i}[] = {\n${body}0x00};\n")
  string(APPEND rows "    {\"${rel}\", blob_${i}, ${bytes}},\n")
  math(EXPR i "${i} + 1")
endforeach()
file(WRITE "${OUT}"
     "/* Generated from src/models/configs by cmake/embed_configs.cmake; do not edit. */\n"
     "#include \"models/shipped.h\"\n\n"
     "${arrays}\n"
     "const df_shipped_blob df_shipped_blobs[] = {\n${rows}};\n"
     "const int df_shipped_blob_count = ${i};\n")
