# cmake -DOUT=file.c -DSYM=name -DBASE=dir -DFILES="a;b" -P embed.cmake
# Writes a C table of the files' contents so the binaries carry their templates
# (docs/design/spec.md) and need no install tree to find them.
set(body "#include <stddef.h>\n#include \"embedded.h\"\n")
set(table "")
set(i 0)
foreach(f IN LISTS FILES)
  file(READ "${BASE}/${f}" hex HEX)
  string(LENGTH "${hex}" n)
  math(EXPR bytes "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" hex "${hex}")
  string(APPEND body "static const char d${i}[] = {\n${hex}0x00};\n")
  string(APPEND table "  {\"${f}\", d${i}, ${bytes}},\n")
  math(EXPR i "${i} + 1")
endforeach()
string(APPEND body "const kl_embedded_file ${SYM}[] = {\n${table}  {NULL, NULL, 0}\n};\n")
file(WRITE "${OUT}.tmp" "${body}")
file(RENAME "${OUT}.tmp" "${OUT}")
