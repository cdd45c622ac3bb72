/* GPU test helpers (see gpu_util.h). */
#include "gpu_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "klrt/klrt.h"
#include "klrt_testing.h"
#include "rt.h" /* kl_jit_cubin: the tests' sources through the JIT cache */

const kl_cu *gpu_require(int need) {
  const char *why = NULL;
  const kl_cu *cu = kl_cu_get(&why);
  if (!cu) {
    printf("SKIP: %s\n", why);
    exit(SKIP);
  }
  int n = 0;
  cu->cuDeviceGetCount(&n);
  if (n < need) {
    printf("SKIP: needs %d GPUs, found %d\n", need, n);
    exit(SKIP);
  }
  return cu;
}

void gpu_require_in_child(int need) {
  pid_t pid = fork();
  if (pid == 0) {
    int n = kl_device_count();
    _exit(n < 0 ? 0 : (n > 100 ? 100 : n));
  }
  int st = 0, n = 0;
  if (pid >= 0 && waitpid(pid, &st, 0) >= 0 && WIFEXITED(st)) n = WEXITSTATUS(st);
  if (n < need) {
    printf("SKIP: needs %d GPUs, found %d\n", need, n);
    exit(SKIP);
  }
}

CUcontext gpu_primary(const kl_cu *cu, int dev, int current) {
  CUdevice d;
  CUcontext cuctx;
  CU_CHECK(cu, cuDeviceGet(&d, dev));
  CU_CHECK(cu, cuDevicePrimaryCtxRetain(&cuctx, d));
  if (current) CU_CHECK(cu, cuCtxSetCurrent(cuctx));
  return cuctx;
}

CUcontext gpu_one_device(const kl_cu *cu, const char *file, kl_spec_list *list) {
  kl_err err;
  if (kl_spec_load_file(file, NULL, list, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  return gpu_primary(cu, 0, 1);
}

int gpu_specs_main(const char *file, int (*fn)(const gpu_spec_run *run, int steps), int steps) {
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1);
  gpu_spec_run run = {.cu = gpu_require(1), .file = file};
  kl_spec_list list;
  run.cuctx = gpu_one_device(run.cu, file, &list);
  int fails = 0;
  for (run.index = 0; run.index < list.n; run.index++) {
    run.spec = &list.v[run.index];
    fails += fn(&run, steps);
  }
  kl_spec_list_free(&list);
  printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails ? 1 : 0;
}

/* The same function on both sides: keep ref_value and VALUE_SRC in step. */
static uint32_t mixh(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

uint32_t ref_value(int elem, uint32_t step, uint32_t rank, uint32_t t, uint32_t col) {
  uint32_t h = mixh(step * 0x9E3779B1u + rank * 0x85EBCA77u + t * 0xC2B2AE3Du + col);
  uint32_t m = h & 63u;
  if (elem == 2) {
    static const uint32_t special[] = {0x8000, 0x7fc1, 0x7f80, 0xff80, 0x8001, 0x0000, 0xffff};
    return m < 7 ? special[m] : (h >> 8) & 0xffffu;
  }
  static const uint32_t special[] = {0x80000000u, 0x7fc00001u, 0x7f800000u, 0xff800000u,
                                     0x80000001u, 0x00000000u, 0xffffffffu};
  return m < 7 ? special[m] : h ^ (h << 7);
}

uint32_t ref_expected(int elem, uint32_t v) {
  return v == (elem == 2 ? 0x8000u : 0x80000000u) ? 0u : v;
}

long long ref_check(int elem, const void *out, int tokens, long long vocab, long long shard,
                    uint32_t step, const char *what) {
  long long bad = 0;
  for (int t = 0; t < tokens; t++)
    for (long long j = 0; j < vocab; j++) {
      uint32_t r = (uint32_t)(j / shard), col = (uint32_t)(j % shard);
      uint32_t want = ref_expected(elem, ref_value(elem, step, r, (uint32_t)t, col));
      uint32_t got = elem == 2 ? ((const uint16_t *)out)[t * vocab + j]
                               : ((const uint32_t *)out)[t * vocab + j];
      if (got != want && bad++ < 5)
        fprintf(stderr, "%s: step %u token %d col %lld: got 0x%x, want 0x%x\n", what, step, t, j,
                got, want);
    }
  return bad;
}

static const char *const kernels_src =
    "typedef unsigned int u32;\n"
    "#if ELEM == 2\n typedef unsigned short T;\n#else\n typedef unsigned int T;\n#endif\n"
    "__device__ u32 mixh(u32 x) { x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15;\n"
    "  x *= 0x846ca68bu; x ^= x >> 16; return x; }\n"
    "__device__ u32 value(u32 step, u32 rank, u32 t, u32 col) {\n"
    "  u32 h = mixh(step * 0x9E3779B1u + rank * 0x85EBCA77u + t * 0xC2B2AE3Du + col);\n"
    "  u32 m = h & 63u;\n"
    "#if ELEM == 2\n"
    "  const u32 sp[7] = {0x8000, 0x7fc1, 0x7f80, 0xff80, 0x8001, 0x0000, 0xffff};\n"
    "  return m < 7 ? sp[m] : (h >> 8) & 0xffffu;\n"
    "#else\n"
    "  const u32 sp[7] = {0x80000000u, 0x7fc00001u, 0x7f800000u, 0xff800000u, 0x80000001u, 0u,\n"
    "                     0xffffffffu};\n"
    "  return m < 7 ? sp[m] : h ^ (h << 7);\n"
    "#endif\n"
    "}\n"
    "extern \"C\" __global__ void fill(T *shard, int tokens, long long cols, u32 rank,\n"
    "                                  const u32 *step) {\n"
    "  u32 s = *step; long long n = (long long)tokens * cols;\n"
    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x)\n"
    "    shard[i] = (T)value(s, rank, (u32)(i / cols), (u32)(i % cols));\n"
    "}\n"
    "extern \"C\" __global__ void verify(const T *out, int tokens, long long vocab,\n"
    "    long long cols, const u32 *step, unsigned long long *bad) {\n"
    "  u32 s = *step; long long n = (long long)tokens * vocab; unsigned long long b = 0;\n"
    "  const u32 negzero = ELEM == 2 ? 0x8000u : 0x80000000u;\n"
    "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;\n"
    "       i += (long long)gridDim.x * blockDim.x) {\n"
    "    long long t = i / vocab, j = i % vocab;\n"
    "    u32 v = value(s, (u32)(j / cols), (u32)t, (u32)(j % cols));\n"
    "    if (v == negzero) v = 0;\n"
    "    if ((u32)out[i] != v) b++;\n"
    "  }\n"
    "  if (b) atomicAdd(bad, b);\n"
    "}\n"
    "extern \"C\" __global__ void bump(u32 *step) { *step += 1; }\n";

int gpu_load_source(const kl_cu *cu, const char *src, const char *name, CUmodule *mod) {
  CUdevice dev;
  CUcontext ctx;
  int maj = 0, min = 0;
  if (cu->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || cu->cuCtxGetDevice(&dev) != CUDA_SUCCESS)
    return -1;
  cu->cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cu->cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d%d", maj, min);
  kl_binary bin;
  kl_err err;
  /* the tests' cache (KLGEN_CACHE_DIR), as the library's: a second run of
   * a test, or its run under a sanitizer, compiles nothing again */
  const char *dir = getenv("KLGEN_CACHE_DIR");
  int hit = 0;
  if (kl_jit_cubin(src, name, arch, dir && *dir ? dir : NULL, &bin, &hit, &err)) {
    fprintf(stderr, "%s: %s\n", name, err.msg);
    return -1;
  }
  int rc = cu->cuModuleLoadData(mod, bin.data) != CUDA_SUCCESS;
  kl_binary_free(&bin);
  return rc ? -1 : 0;
}

int gpu_load_functions(const kl_cu *cu, const char *src, const char *name, CUmodule *mod,
                       const char *const *names, CUfunction *fn, int n) {
  if (gpu_load_source(cu, src, name, mod)) return -1;
  for (int i = 0; i < n; i++)
    if (cu->cuModuleGetFunction(&fn[i], *mod, names[i]) != CUDA_SUCCESS) return -1;
  for (int i = 0; i < n && cu->cuFuncLoad; i++)
    if (cu->cuFuncLoad(fn[i]) != CUDA_SUCCESS) return -1;
  return 0;
}

CUdeviceptr gpu_to_device(const kl_cu *cu, const void *p, size_t bytes) {
  CUdeviceptr d;
  CU_CHECK(cu, cuMemAlloc(&d, bytes ? bytes : 8));
  if (p && bytes) CU_CHECK(cu, cuMemcpyHtoD(d, p, bytes));
  return d;
}

void gpu_from_device(const kl_cu *cu, void *p, CUdeviceptr d, size_t bytes) {
  CU_CHECK(cu, cuCtxSynchronize());
  CU_CHECK(cu, cuMemcpyDtoH(p, d, bytes));
  CU_CHECK(cu, cuMemFree(d));
}

void gpu_capture_begin(const kl_cu *cu, CUstream s) {
  CU_CHECK(cu, cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
}

void gpu_capture_end(const kl_cu *cu, CUstream s, gpu_graph *gr) {
  gr->ge = NULL;
  CU_CHECK(cu, cuStreamEndCapture(s, &gr->g));
}

void gpu_graph_instantiate(const kl_cu *cu, gpu_graph *gr) {
  CU_CHECK(cu, cuGraphInstantiate(&gr->ge, gr->g, 0));
}

void gpu_graph_replay(const kl_cu *cu, const gpu_graph *gr, CUstream s, int times) {
  for (int i = 0; i < times; i++) CU_CHECK(cu, cuGraphLaunch(gr->ge, s));
}

void gpu_graph_destroy(const kl_cu *cu, gpu_graph *gr) {
  CU_CHECK(cu, cuGraphExecDestroy(gr->ge));
  CU_CHECK(cu, cuGraphDestroy(gr->g));
}

int gpu_graph_steps(const kl_cu *cu, CUstream s, rank_threads *t, int failed, int n,
                    int (*step)(void *arg, int i), void *arg, int times, gpu_graph *gr) {
  CU_CHECK(cu, cuStreamSynchronize(s));
  if (t) ranks_sync(t);
  int ok = !failed;
  if (ok) {
    gpu_capture_begin(cu, s);
    for (int i = 0; i < n && ok; i++) ok = step(arg, i) == 0;
    gpu_capture_end(cu, s, gr);
    if (ok) gpu_graph_instantiate(cu, gr);
    else cu->cuGraphDestroy(gr->g);
  }
  if (t) ranks_sync(t);
  if (!ok) return -1;
  gpu_graph_replay(cu, gr, s, times);
  return 0;
}

gpu_marks gpu_marks_of(kl_ctx *ctx) {
  gpu_marks m;
  void *p;
  if (kl_testing_marks(ctx, &p, &m.bytes, &m.sentinel, &m.per_token) != KLRT_OK ||
      m.bytes == 0 || m.bytes % 4 || m.per_token < 1) {
    fprintf(stderr, "kl_testing_marks: %s (%zu bytes)\n", kl_last_error(), m.bytes);
    exit(1);
  }
  m.p = (CUdeviceptr)(uintptr_t)p;
  return m;
}

size_t gpu_marks_set(const kl_cu *cu, const gpu_marks *m, CUstream s) {
  uint32_t *host = malloc(m->bytes);
  if (!host) {
    fprintf(stderr, "gpu_marks_set: out of memory\n");
    exit(1);
  }
  CU_CHECK(cu, cuMemcpyDtoHAsync(host, m->p, m->bytes, s));
  CU_CHECK(cu, cuStreamSynchronize(s));
  size_t set = 0;
  for (size_t i = 0; i < m->bytes / 4; i++) set += host[i] != m->sentinel;
  free(host);
  return set;
}

void gpu_marks_clear(const kl_cu *cu, const gpu_marks *m, CUstream s) {
  CU_CHECK(cu, cuMemsetD32Async(m->p, m->sentinel, m->bytes / 4, s));
  CU_CHECK(cu, cuStreamSynchronize(s));
}

int testkern_load(const kl_cu *cu, int elem, testkern *k) {
  static const char *const names[] = {"fill", "verify", "bump"};
  char *src = malloc(strlen(kernels_src) + 32);
  if (!src) return -1;
  sprintf(src, "#define ELEM %d\n%s", elem, kernels_src);
  CUfunction fn[3];
  int rc = gpu_load_functions(cu, src, "testdata", &k->mod, names, fn, 3);
  free(src);
  if (rc) return -1;
  k->elem = elem;
  k->fill = fn[0], k->verify = fn[1], k->bump = fn[2];
  return 0;
}

static unsigned grid_for(long long n) {
  long long g = (n + 255) / 256;
  return (unsigned)(g < 1 ? 1 : g > 64 ? 64 : g);
}

int launch_fill(const kl_cu *cu, const testkern *k, CUdeviceptr shard, int tokens,
                long long cols, unsigned rank, CUdeviceptr step, CUstream s) {
  void *a[] = {&shard, &tokens, &cols, &rank, &step};
  return cu->cuLaunchKernel(k->fill, grid_for(tokens * cols), 1, 1, 256, 1, 1, 0, s, a, NULL);
}

int launch_verify(const kl_cu *cu, const testkern *k, CUdeviceptr out, int tokens, long long vocab,
                  long long cols, CUdeviceptr step, CUdeviceptr bad, CUstream s) {
  void *a[] = {&out, &tokens, &vocab, &cols, &step, &bad};
  return cu->cuLaunchKernel(k->verify, grid_for(tokens * vocab), 1, 1, 256, 1, 1, 0, s, a, NULL);
}

int launch_bump(const kl_cu *cu, const testkern *k, CUdeviceptr step, CUstream s) {
  void *a[] = {&step};
  return cu->cuLaunchKernel(k->bump, 1, 1, 1, 1, 1, 1, 0, s, a, NULL);
}
