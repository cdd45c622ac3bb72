# Lua 5.4, linked statically (docs/DESIGN.md §4). Prefer the source fetched by
# cmake/deps.sh, built -fPIC so it can go into libklrt.so; else Debian's
# liblua5.4.a, which is not PIC: then only static libraries are built.
set(KLGEN_LUA_SRC "${PROJECT_SOURCE_DIR}/.deps/lua-5.4.4/src" CACHE PATH "Lua 5.4 source")
# `pip install .` runs only CMake: fetch the source here if deps.sh never ran.
if(KLGEN_PYTHON AND NOT EXISTS "${KLGEN_LUA_SRC}/lapi.c")
  execute_process(COMMAND bash "${PROJECT_SOURCE_DIR}/cmake/deps.sh" RESULT_VARIABLE _deps_rc)
  if(NOT _deps_rc EQUAL 0)
    message(FATAL_ERROR "cmake/deps.sh failed: the wheel needs Lua's source")
  endif()
endif()
if(EXISTS "${KLGEN_LUA_SRC}/lapi.c")
  # Only the core and the libraries a spec may use: no io, os, package, debug,
  # coroutine, so the sandbox cannot be reopened from C by accident.
  set(_core lapi lcode lctype ldebug ldo ldump lfunc lgc llex lmem lobject lopcodes
            lparser lstate lstring ltable ltm lundump lvm lzio lauxlib
            lbaselib lstrlib ltablib lmathlib lutf8lib)
  list(TRANSFORM _core PREPEND "${KLGEN_LUA_SRC}/")
  list(TRANSFORM _core APPEND ".c")
  # Objects first, so the installed libklrt.a can carry them too.
  add_library(kl_lua_obj OBJECT ${_core})
  set_target_properties(kl_lua_obj PROPERTIES POSITION_INDEPENDENT_CODE ON C_STANDARD 99)
  target_compile_definitions(kl_lua_obj PRIVATE LUA_USE_POSIX)
  target_compile_options(kl_lua_obj PRIVATE -w)
  add_library(kl_lua STATIC $<TARGET_OBJECTS:kl_lua_obj>)
  target_include_directories(kl_lua SYSTEM PUBLIC "${KLGEN_LUA_SRC}")
  target_link_libraries(kl_lua PUBLIC m)
  set(KLGEN_LUA_OBJECTS $<TARGET_OBJECTS:kl_lua_obj>)
  set(KLGEN_LUA_PIC ON)
else()
  find_path(LUA_INCLUDE_DIR lua.h PATH_SUFFIXES lua5.4 REQUIRED)
  find_library(LUA_STATIC NAMES liblua5.4.a REQUIRED)
  add_library(kl_lua INTERFACE)
  target_include_directories(kl_lua SYSTEM INTERFACE "${LUA_INCLUDE_DIR}")
  target_link_libraries(kl_lua INTERFACE "${LUA_STATIC}" m)
  set(KLGEN_LUA_OBJECTS "")
  set(KLGEN_LUA_PIC OFF)
  message(WARNING "Lua source not found (run cmake/deps.sh): libklrt.so will not be built")
endif()
