/* Calls into glibc bound to the symbol versions glibc 2.28 has, so that a
 * binary linked against a newer glibc (Debian 12's 2.36) loads on any glibc
 * >= 2.28: the manylinux_2_28 wheel (KLGEN_MANYLINUX, cmake/manylinux.cmake).
 *
 * A glibc >= 2.34 binds dlopen, dlsym, dlerror, dlclose, pthread_once and
 * pthread_condattr_setclock to GLIBC_2.34, a glibc >= 2.33 stat, fstat and
 * lstat to GLIBC_2.33, a glibc >= 2.29 exp, log, pow and log2 to GLIBC_2.29.
 * Each still carries its older version, the same code; stat, fstat and lstat
 * were inline calls of __xstat, __fxstat and __lxstat, which remain. The
 * linker sends every call (--wrap=NAME) to __wrap_NAME here, which calls the
 * older version. (Before 2.34 the dl* and pthread_* functions lived in libdl
 * and libpthread: the link keeps both as dependencies.) x86-64 only. */
#include <stddef.h>
#include <sys/stat.h>

#define OLD(ret, name, version, params)                                      \
  ret kl_glibc_old_##name params;                                            \
  __asm__(".symver kl_glibc_old_" #name ", " #name "@" version);

OLD(void *, dlopen, "GLIBC_2.2.5", (const char *file, int mode))
OLD(void *, dlsym, "GLIBC_2.2.5", (void *handle, const char *name))
OLD(char *, dlerror, "GLIBC_2.2.5", (void))
OLD(int, dlclose, "GLIBC_2.2.5", (void *handle))
OLD(int, pthread_once, "GLIBC_2.2.5", (void *once, void (*init)(void)))
OLD(int, pthread_condattr_setclock, "GLIBC_2.3.3", (void *attr, int clock))
OLD(double, exp, "GLIBC_2.2.5", (double x))
OLD(double, log, "GLIBC_2.2.5", (double x))
OLD(double, pow, "GLIBC_2.2.5", (double x, double y))
OLD(double, log2, "GLIBC_2.2.5", (double x))
OLD(int, __xstat, "GLIBC_2.2.5", (int ver, const char *path, struct stat *st))
OLD(int, __fxstat, "GLIBC_2.2.5", (int ver, int fd, struct stat *st))
OLD(int, __lxstat, "GLIBC_2.2.5", (int ver, const char *path, struct stat *st))

#define HIDDEN __attribute__((visibility("hidden")))
#define STAT_VER 1 /* _STAT_VER_LINUX: the kernel's struct stat, as <sys/stat.h> has it */

HIDDEN void *__wrap_dlopen(const char *file, int mode) { return kl_glibc_old_dlopen(file, mode); }
HIDDEN void *__wrap_dlsym(void *handle, const char *name) { return kl_glibc_old_dlsym(handle, name); }
HIDDEN char *__wrap_dlerror(void) { return kl_glibc_old_dlerror(); }
HIDDEN int __wrap_dlclose(void *handle) { return kl_glibc_old_dlclose(handle); }
HIDDEN int __wrap_pthread_once(void *once, void (*init)(void)) {
  return kl_glibc_old_pthread_once(once, init);
}
HIDDEN int __wrap_pthread_condattr_setclock(void *attr, int clock) {
  return kl_glibc_old_pthread_condattr_setclock(attr, clock);
}
HIDDEN double __wrap_exp(double x) { return kl_glibc_old_exp(x); }
HIDDEN double __wrap_log(double x) { return kl_glibc_old_log(x); }
HIDDEN double __wrap_pow(double x, double y) { return kl_glibc_old_pow(x, y); }
HIDDEN double __wrap_log2(double x) { return kl_glibc_old_log2(x); }
HIDDEN int __wrap_stat(const char *path, struct stat *st) {
  return kl_glibc_old___xstat(STAT_VER, path, st);
}
HIDDEN int __wrap_fstat(int fd, struct stat *st) { return kl_glibc_old___fxstat(STAT_VER, fd, st); }
HIDDEN int __wrap_lstat(const char *path, struct stat *st) {
  return kl_glibc_old___lxstat(STAT_VER, path, st);
}
