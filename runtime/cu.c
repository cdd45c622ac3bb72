/* dlopen'd CUDA driver (see cu.h). */
#include "cu.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KL_STR_(x) #x
#define KL_STR(x) KL_STR_(x)

static kl_cu table;
static const kl_cu *loaded;
static char why_buf[256];
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Each symbol by the versioned name cuda.h maps it to (cuMemAlloc_v2, ...),
 * which is the ABI the toolkit's headers describe. */
static int resolve(void *lib) {
#define KL_CU_LOAD(name)                                                          \
  *(void **)(&table.name) = dlsym(lib, KL_STR(name));                             \
  if (!table.name) {                                                              \
    snprintf(why_buf, sizeof why_buf, "libcuda lacks %s (driver too old)", KL_STR(name)); \
    return -1;                                                                    \
  }
  KL_CU_FUNCS(KL_CU_LOAD)
#undef KL_CU_LOAD
#define KL_CU_LOAD_OPTIONAL(name) *(void **)(&table.name) = dlsym(lib, KL_STR(name));
  KL_CU_OPTIONAL(KL_CU_LOAD_OPTIONAL)
#undef KL_CU_LOAD_OPTIONAL
  return 0;
}

static void load(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    snprintf(why_buf, sizeof why_buf, "no CUDA driver: cannot load libcuda.so.1 (%s)", dlerror());
    return;
  }
  if (resolve(lib) != 0) return;
  CUresult r = table.cuInit(0);
  if (r != CUDA_SUCCESS) {
    snprintf(why_buf, sizeof why_buf, "no usable GPU: cuInit failed: %s", kl_cu_errstr(r));
    return;
  }
  int n = 0;
  if (table.cuDeviceGetCount(&n) != CUDA_SUCCESS || n == 0) {
    snprintf(why_buf, sizeof why_buf, "no GPU: the CUDA driver reports no device");
    return;
  }
  loaded = &table;
}

#ifdef KL_TESTING
const kl_cu *kl_testing_cu;
#endif

const kl_cu *kl_cu_get(const char **why) {
#ifdef KL_TESTING
  if (kl_testing_cu) return kl_testing_cu;
#endif
  pthread_once(&once, load);
  if (!loaded && why) *why = why_buf;
  return loaded;
}

const char *kl_cu_errstr(CUresult r) {
  static _Thread_local char buf[160];
  const char *name = NULL, *desc = NULL;
  if (loaded) {
    loaded->cuGetErrorName(r, &name);
    loaded->cuGetErrorString(r, &desc);
  }
  snprintf(buf, sizeof buf, "%s: %s", name ? name : "CUDA error", desc ? desc : "?");
  if (!name) snprintf(buf, sizeof buf, "CUDA error %d", (int)r);
  return buf;
}
