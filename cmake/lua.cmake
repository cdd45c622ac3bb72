# Lua 5.4, linked statically (docs/design/build.md): the copy in third_party/
# (the part klgen uses), built position-independent so that it can go into
# libklrt.so, hidden there. -DKLGEN_LUA_SRC=DIR builds another Lua 5.4 source.
set(_lua_bundled "${PROJECT_SOURCE_DIR}/third_party/lua-5.4.8/src")
set(KLGEN_LUA_SRC "${_lua_bundled}" CACHE PATH "Lua 5.4 source")
# A cache that names a bundled copy the tree no longer has (third_party/lua-*)
# builds the one it has.
get_filename_component(_lua_parent "${KLGEN_LUA_SRC}/../.." ABSOLUTE)
if(NOT EXISTS "${KLGEN_LUA_SRC}" AND _lua_parent STREQUAL "${PROJECT_SOURCE_DIR}/third_party")
  set_property(CACHE KLGEN_LUA_SRC PROPERTY VALUE "${_lua_bundled}")
endif()
# Only the core and the libraries a spec may use: no io, os, package, debug,
# coroutine, so the sandbox cannot be reopened from C by accident.
set(_core lapi lcode lctype ldebug ldo ldump lfunc lgc llex lmem lobject lopcodes
          lparser lstate lstring ltable ltm lundump lvm lzio lauxlib
          lbaselib lstrlib ltablib lmathlib lutf8lib)
list(TRANSFORM _core PREPEND "${KLGEN_LUA_SRC}/")
list(TRANSFORM _core APPEND ".c")
foreach(f IN LISTS _core)
  if(NOT EXISTS "${f}")
    message(FATAL_ERROR " KLGEN_LUA_SRC=${KLGEN_LUA_SRC} is not a Lua 5.4 source directory "
                        "(no ${f}): leave KLGEN_LUA_SRC unset to build third_party/lua-5.4.8")
  endif()
endforeach()
file(STRINGS "${KLGEN_LUA_SRC}/lua.h" _lua_ver REGEX "^#define LUA_VERSION_(MAJOR|MINOR)")
if(NOT _lua_ver MATCHES "MAJOR[\t ]+\"5\".*MINOR[\t ]+\"4\"")
  message(FATAL_ERROR " KLGEN_LUA_SRC=${KLGEN_LUA_SRC} is not Lua 5.4: klgen needs Lua 5.4")
endif()
# Objects first, so the installed libklrt.a can carry them too.
add_library(kl_lua_obj OBJECT ${_core})
set_target_properties(kl_lua_obj PROPERTIES POSITION_INDEPENDENT_CODE ON C_STANDARD 99)
target_compile_definitions(kl_lua_obj PRIVATE LUA_USE_POSIX)
target_compile_options(kl_lua_obj PRIVATE -w)
add_library(kl_lua STATIC $<TARGET_OBJECTS:kl_lua_obj>)
target_include_directories(kl_lua SYSTEM PUBLIC "${KLGEN_LUA_SRC}")
target_link_libraries(kl_lua PUBLIC m)
set(KLGEN_LUA_OBJECTS $<TARGET_OBJECTS:kl_lua_obj>)
