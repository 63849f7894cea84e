# Writes a C file holding one SPIR-V binary as a 4-byte aligned array (run with cmake -P):
#   cmake -DIN=x.spv -DOUT=x.spv.c -DNAME=x -P embed_spirv.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR bytes "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE "${OUT}" "/* Generated from ${NAME}.comp by glslc at build time; do not edit. */\n"
     "#include <stddef.h>\n"
     "_Alignas(4) const unsigned char dvk_spv_${NAME}[] = {\n${body}\n};\n"
     "const size_t dvk_spv_${NAME}_bytes = ${bytes};\n")
