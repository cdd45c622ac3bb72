/* libkl_flashinfer through dlopen (grid.h): klbench runs without it, and
 * says how to build it. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grid.h"

#define FI_LIBRARY "libkl_flashinfer.so"

/* FI_LIBRARY in the directory of this program. */
static int default_path(char *buf, size_t n) {
  char exe[4096];
  ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return -1;
  exe[len] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return -1;
  *slash = '\0';
  int w = snprintf(buf, n, "%s/%s", exe, FI_LIBRARY);
  return w > 0 && (size_t)w < n ? 0 : -1;
}

int fi_load(fi_lib *f, const char *path, char *why, size_t n) {
  char def[4200];
  memset(f, 0, sizeof *f);
  if (path && !strcmp(path, "none")) {
    snprintf(why, n, "left out (--flashinfer none)");
    return 1;
  }
  if (!path) {
    struct stat st;
    if (default_path(def, sizeof def) || stat(def, &st) != 0) {
      snprintf(why, n, "no %s beside klbench: bash bench/flashinfer.sh builds it (or give "
               "--flashinfer LIB)", FI_LIBRARY);
      return 1;
    }
    path = def;
  }
  f->so = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!f->so) {
    snprintf(why, n, "%s", dlerror());
    return -1;
  }
#define FI_SYM(name)                                                          \
  if (!(*(void **)&f->name = dlsym(f->so, #name))) {                          \
    snprintf(why, n, "%s: no %s (not a libkl_flashinfer of this tree)", path, #name); \
    dlclose(f->so);                                                           \
    f->so = NULL;                                                             \
    return -1;                                                                \
  }
  FI_FUNCS(FI_SYM)
#undef FI_SYM
  if (f->kl_fi_abi() != KL_FI_ABI) {
    snprintf(why, n, "%s: ABI %d, this klbench wants %d: rebuild it", path, f->kl_fi_abi(),
             KL_FI_ABI);
    dlclose(f->so);
    f->so = NULL;
    return -1;
  }
  snprintf(why, n, "%s (%s)", path, f->kl_fi_about());
  return 0;
}
