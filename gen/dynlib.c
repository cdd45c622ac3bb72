/* See dynlib.h. */
#include "dynlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* Appends ", <path> (<dlerror>)" to why, bounded. */
static void tried(char *why, size_t n, const char *path) {
  const char *e = dlerror();
  size_t used = strlen(why);
  if (used + 1 < n) snprintf(why + used, n - used, ", %s (%s)", path, e ? e : "not found");
}

void *kl_dynlib_open(const char *what, const char *soname, const char *hint,
                     const char *const *fallbacks, char *why, size_t n) {
  /* A copy the host already loaded (PyTorch's): RTLD_NOLOAD finds, never loads. */
  void *h = dlopen(soname, RTLD_NOW | RTLD_NOLOAD | RTLD_LOCAL);
  if (h) return h;
  snprintf(why, n, "%s not found; searched: %s already in the process (no)", what, soname);
  if (hint && *hint) {
    if ((h = dlopen(hint, RTLD_NOW | RTLD_LOCAL))) return h;
    tried(why, n, hint);
  }
  if ((h = dlopen(soname, RTLD_NOW | RTLD_LOCAL))) return h;
  tried(why, n, soname);
  for (const char *const *f = fallbacks; f && *f; f++) {
    if ((h = dlopen(*f, RTLD_NOW | RTLD_LOCAL))) return h;
    tried(why, n, *f);
  }
  return NULL;
}
