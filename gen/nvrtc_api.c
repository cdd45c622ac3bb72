/* NVRTC by dlopen (see nvrtc_api.h). The search: a copy already in the process,
 * $KLGEN_NVRTC_LIBRARY (set through kl_nvrtc_set_library), the soname through
 * the system's search, then the toolkit this was built with. */
#include "nvrtc_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "dynlib.h"
#include "klgen.h"

#define KL_STR_(x) #x
#define KL_STR(x) KL_STR_(x)

static kl_nvrtc_api table;
static const kl_nvrtc_api *loaded;
static char hint[4096];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

void kl_nvrtc_set_library(const char *path) {
  pthread_mutex_lock(&mu);
  snprintf(hint, sizeof hint, "%s", path ? path : "");
  pthread_mutex_unlock(&mu);
}

static int resolve(void *lib, char *why, size_t n) {
#define KL_NVRTC_LOAD(name)                                                        \
  *(void **)(&table.name) = dlsym(lib, KL_STR(name));                              \
  if (!table.name) return snprintf(why, n, "NVRTC lacks %s (too old?)", KL_STR(name)), -1;
  KL_NVRTC_FUNCS(KL_NVRTC_LOAD)
#undef KL_NVRTC_LOAD
  return 0;
}

/* Loads under the lock; a failure is not remembered (the library may appear,
 * or a hint be set, before the next try). */
const kl_nvrtc_api *kl_nvrtc_api_get(char *why, size_t n) {
  pthread_mutex_lock(&mu);
  if (!loaded) {
    static const char *const fallbacks[] = {KL_NVRTC_FALLBACK, NULL};
    void *lib = kl_dynlib_open("NVRTC", KL_NVRTC_SONAME, hint, fallbacks, why, n);
    if (lib && resolve(lib, why, n) == 0) loaded = &table;
    else if (lib) dlclose(lib);
  }
  const kl_nvrtc_api *api = loaded;
  pthread_mutex_unlock(&mu);
  return api;
}
