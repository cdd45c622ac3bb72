# KLGEN_MANYLINUX: the wheel's binaries (libklrt.so, klgen) load on any x86-64
# Linux with glibc >= 2.28 (manylinux_2_28, PyTorch's own tag), though linked
# against a newer glibc: every call whose symbol a newer glibc versions past
# 2.28 is sent (ld --wrap) to manylinux/glibc_2_28*.c, which calls the older
# version. The list is what the binaries import above GLIBC_2.28 without it;
# the wheel check (.ci/wheel.sh) fails on any import it misses.
set(KL_GLIBC_WRAPPED dlopen dlsym dlerror dlclose pthread_once pthread_condattr_setclock
    exp log pow log2 stat fstat lstat)
if(KLGEN_MANYLINUX AND NOT CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64)$")
  message(FATAL_ERROR " KLGEN_MANYLINUX binds x86-64 glibc symbol versions: this is ${CMAKE_SYSTEM_PROCESSOR}")
endif()

# kl_manylinux(TARGET): TARGET (a shared library or an executable) so bound.
function(kl_manylinux target)
  if(NOT KLGEN_MANYLINUX)
    return()
  endif()
  set(dir ${PROJECT_SOURCE_DIR}/cmake/manylinux)
  set(wrapped ${KL_GLIBC_WRAPPED})
  target_sources(${target} PRIVATE ${dir}/glibc_2_28.c)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_sources(${target} PRIVATE ${dir}/glibc_2_28_start.c)
    list(APPEND wrapped __libc_start_main)
  endif()
  list(TRANSFORM wrapped PREPEND "LINKER:--wrap=")
  # libdl and libpthread held what glibc 2.28 resolves the old dl* and
  # pthread_* versions from: needed even though this glibc's are empty.
  target_link_options(${target} PRIVATE ${wrapped}
    "SHELL:-Wl,--push-state,--no-as-needed -l:libdl.so.2 -l:libpthread.so.0 -Wl,--pop-state")
endfunction()
