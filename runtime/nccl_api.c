/* NCCL by dlopen (see nccl_api.h). */
#include "nccl_api.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "dynlib.h"

#define KL_STR_(x) #x
#define KL_STR(x) KL_STR_(x)

static kl_nccl_api table;
static const kl_nccl_api *loaded;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static int resolve(void *lib, char *why, size_t n) {
#define KL_NCCL_LOAD(name)                                                          \
  *(void **)(&table.name) = dlsym(lib, KL_STR(name));                               \
  if (!table.name) return snprintf(why, n, "NCCL lacks %s (too old?)", KL_STR(name)), -1;
  KL_NCCL_FUNCS(KL_NCCL_LOAD)
#undef KL_NCCL_LOAD
  return 0;
}

#ifdef KL_TESTING
const kl_nccl_api *kl_testing_nccl;
#endif

const kl_nccl_api *kl_nccl_api_get(const char *hint, char *why, size_t n) {
#ifdef KL_TESTING
  if (kl_testing_nccl) return kl_testing_nccl;
#endif
  pthread_mutex_lock(&mu);
  if (!loaded) {
    static const char *const fallbacks[] = {KL_NCCL_FALLBACK, NULL};
    void *lib = kl_dynlib_open("NCCL", "libnccl.so.2", hint, fallbacks, why, n);
    if (lib && resolve(lib, why, n) == 0) loaded = &table;
    else if (lib) dlclose(lib);
  }
  const kl_nccl_api *api = loaded;
  pthread_mutex_unlock(&mu);
  return api;
}
