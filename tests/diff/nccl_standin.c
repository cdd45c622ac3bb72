/* A stand-in for the few NCCL calls libklrt makes, for ranks that share one GPU.
 *
 * NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so with one GPU
 * the NCCL paths (the relayout kernel, the select kernels' reduce and merge)
 * could not run at all. libklrt loads NCCL at run time (KLGEN_NCCL_LIBRARY),
 * so the tests load this library instead: ncclCommInitAll makes a group of
 * communicators over ranks that are threads of this process on one device,
 * and ncclAllGather is one kernel per rank: it copies its send buffer into
 * the group's staging memory, meets its peers in device memory, copies every
 * rank's part into recv in rank order, and leaves only when every rank has
 * read its part. (Staging, not the peers' buffers: a kernel then touches only
 * memory that existed when it was launched, which compute-sanitizer can
 * follow.) Like NCCL's, a call is enqueued and returns, and a captured graph
 * replays it: each rank counts its calls in device memory, so the k-th call
 * of every rank meets the k-th of the others.
 *
 * Test-only: it is built beside the tests and never installed. */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cu.h"
#include "klgen.h"

#define STANDIN_MAX_RANKS 64
#define STANDIN_THREADS 1024
#define STANDIN_TIMEOUT_S 30 /* a peer that never comes: give up, say so */
#define STANDIN_STAGE_BYTES (8u << 20)      /* a rank's part at most */

/* The board the kernels meet on, in device memory, zeroed at creation:
 * arrive[r]/leave[r], the last call rank r staged its part for / finished
 * reading in; calls[r], the calls rank r has completed. */
static const char *const kernel_src =
    "typedef unsigned long long u64;\n"
    "struct Board { u64 arrive[64], leave[64], calls[64]; };\n"
    "__device__ u64 now() { u64 t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); return t; }\n"
    "__device__ u64 ld_acquire(const u64 *p) { u64 v;\n"
    "  asm volatile(\"ld.acquire.gpu.global.u64 %0, [%1];\" : \"=l\"(v) : \"l\"(p) : \"memory\"); return v; }\n"
    "__device__ void st_release(u64 *p, u64 v) {\n"
    "  asm volatile(\"st.release.gpu.global.u64 [%0], %1;\" :: \"l\"(p), \"l\"(v) : \"memory\"); }\n"
    /* thread 0 waits until every rank's word reaches e; false on time-out */
    "__device__ bool meet(const u64 *w, int n, u64 e, unsigned *fault) {\n"
    "  const u64 t0 = now();\n"
    "  for (int r = 0; r < n; ++r)\n"
    "    while (ld_acquire(&w[r]) < e)\n"
    "      if ((long long)(now() - t0) > (long long)TIMEOUT_NS) { /* signed: memory.cuh.tmpl */\n"
    "        atomicAdd(fault, 1u);\n"
    "        return false;\n"
    "      }\n"
    "  return true;\n"
    "}\n"
    "__device__ void copy(char *dst, const char *src, u64 bytes) {\n"
    "  if (bytes % 16 == 0 && (u64)dst % 16 == 0 && (u64)src % 16 == 0)\n"
    "    for (u64 i = threadIdx.x; i < bytes / 16; i += THREADS) ((uint4 *)dst)[i] = ((const uint4 *)src)[i];\n"
    "  else\n"
    "    for (u64 i = threadIdx.x; i < bytes; i += THREADS) dst[i] = src[i];\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(THREADS)\n"
    "allgather(const char *send, char *recv, u64 bytes, int rank, int n, Board *b, char *stage,\n"
    "          unsigned *fault) {\n"
    "  __shared__ u64 e;\n"
    "  __shared__ int ok;\n"
    "  copy(stage + (u64)rank * STAGE, send, bytes);\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    __threadfence();\n"
    "    e = b->calls[rank] + 1;\n"
    "    st_release(&b->arrive[rank], e);\n"
    "    ok = meet(b->arrive, n, e, fault);\n"
    "  }\n"
    "  __syncthreads();\n"
    "  if (ok)\n"
    "    for (int r = 0; r < n; ++r) copy(recv + (u64)r * bytes, stage + (u64)r * STAGE, bytes);\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) {\n"
    "    __threadfence();\n"
    "    st_release(&b->leave[rank], e);\n"
    /* nobody stages its next part before every rank has read this one */
    "    if (ok) meet(b->leave, n, e, fault);\n"
    "    b->calls[rank] = e;\n"
    "  }\n"
    "}\n";

typedef struct standin_group {
  int n;
  int refs;
  CUcontext ctx;
  CUmodule mod;
  CUfunction fn;
  CUdeviceptr board, stage;
} standin_group;

struct ncclComm {
  standin_group *g;
  int rank;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned *faults; /* host-mapped: peers that never came, over every group */

/* Peers that never came to a call, over the process's groups (read by the tests). */
unsigned kl_standin_timeouts(void) { return faults ? *(volatile unsigned *)faults : 0u; }

/* The kernel's cubin, compiled once per process (a group is made per test
 * case, and NVRTC takes longer than the rest of a small case): for `arch`. */
static pthread_mutex_t compile_mu = PTHREAD_MUTEX_INITIALIZER;
static kl_binary cubin;
static char cubin_arch[16];

/* The wait for a peer before giving up: KL_STANDIN_TIMEOUT_S seconds where
 * set (compute-sanitizer slows every kernel, and a peer's one-shot kernel
 * may wait out a fault's time-out before it reaches the all-gather). */
static unsigned long long timeout_ns(void) {
  const char *s = getenv("KL_STANDIN_TIMEOUT_S");
  const long v = s ? strtol(s, NULL, 10) : 0;
  return (unsigned long long)(v > 0 && v <= 86400 ? v : STANDIN_TIMEOUT_S) * 1000000000ull;
}

static int compile_once(const char *arch) {
  pthread_mutex_lock(&compile_mu);
  int rc = 0;
  if (!cubin.data || strcmp(cubin_arch, arch) != 0) {
    char head[160];
    snprintf(head, sizeof head, "#define THREADS %d\n#define TIMEOUT_NS %lluull\n#define STAGE %uull\n",
             STANDIN_THREADS, timeout_ns(), STANDIN_STAGE_BYTES);
    char *src = malloc(strlen(head) + strlen(kernel_src) + 1);
    kl_binary bin;
    kl_err err;
    rc = -1;
    if (src) {
      strcpy(src, head);
      strcat(src, kernel_src);
      rc = kl_nvrtc_compile(src, "nccl_standin", arch, &bin, &err);
      if (rc) fprintf(stderr, "nccl stand-in: %s\n", err.msg);
      free(src);
    }
    if (rc == 0) {
      if (cubin.data) kl_binary_free(&cubin);
      cubin = bin;
      snprintf(cubin_arch, sizeof cubin_arch, "%s", arch);
    }
  }
  pthread_mutex_unlock(&compile_mu);
  return rc;
}

static int load_kernel(const kl_cu *cu, standin_group *g) {
  CUdevice dev;
  int maj = 0, min = 0;
  if (cu->cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  cu->cuDeviceGetAttribute(&maj, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  cu->cuDeviceGetAttribute(&min, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d%d", maj, min);
  if (compile_once(arch) != 0) return -1;
  pthread_mutex_lock(&compile_mu);
  int rc = cu->cuModuleLoadData(&g->mod, cubin.data) != CUDA_SUCCESS ||
           cu->cuModuleGetFunction(&g->fn, g->mod, "allgather") != CUDA_SUCCESS ||
           (cu->cuFuncLoad && cu->cuFuncLoad(g->fn) != CUDA_SUCCESS); /* no lazy load beside spinning kernels */
  pthread_mutex_unlock(&compile_mu);
  return rc ? -1 : 0;
}

/* Every device in devlist must be the same one: the ranks share it. */
ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist) {
  const kl_cu *cu = kl_cu_get(NULL);
  if (!cu || !comms || ndev < 1 || ndev > STANDIN_MAX_RANKS) return ncclInvalidArgument;
  int dev0 = devlist ? devlist[0] : 0;
  for (int i = 0; i < ndev; i++)
    if ((devlist ? devlist[i] : 0) != dev0) return ncclInvalidUsage;
  standin_group *g = calloc(1, sizeof *g);
  if (!g) return ncclSystemError;
  g->n = ndev;
  CUdevice dev;
  CUcontext dummy;
  size_t board = 3 * STANDIN_MAX_RANKS * sizeof(uint64_t);
  if (cu->cuDeviceGet(&dev, dev0) != CUDA_SUCCESS ||
      cu->cuDevicePrimaryCtxRetain(&g->ctx, dev) != CUDA_SUCCESS) {
    free(g);
    return ncclUnhandledCudaError;
  }
  cu->cuCtxPushCurrent(g->ctx);
  int bad = load_kernel(cu, g) != 0 || cu->cuMemAlloc(&g->board, board) != CUDA_SUCCESS ||
            cu->cuMemsetD32(g->board, 0, board / 4) != CUDA_SUCCESS ||
            /* the legacy stream's memset is not ordered with the ranks' streams */
            cu->cuStreamSynchronize(NULL) != CUDA_SUCCESS ||
            cu->cuMemAlloc(&g->stage, (size_t)ndev * STANDIN_STAGE_BYTES) != CUDA_SUCCESS;
  pthread_mutex_lock(&mu);
  if (!bad && !faults) {
    void *p = NULL;
    bad = cu->cuMemAllocHost(&p, sizeof *faults) != CUDA_SUCCESS;
    if (!bad) faults = p, *faults = 0;
  }
  pthread_mutex_unlock(&mu);
  if (!bad) bad = cu->cuCtxSynchronize() != CUDA_SUCCESS;
  cu->cuCtxPopCurrent(&dummy);
  if (bad) {
    cu->cuDevicePrimaryCtxRelease(dev);
    free(g);
    return ncclUnhandledCudaError;
  }
  for (int i = 0; i < ndev; i++) {
    comms[i] = calloc(1, sizeof *comms[i]);
    if (!comms[i]) return ncclSystemError; /* a test library: the leak is the test's end */
    comms[i]->g = g;
    comms[i]->rank = i;
  }
  g->refs = ndev;
  return ncclSuccess;
}

/* The last comm of a group frees it: after every rank's work is done (the
 * caller's duty, as with NCCL). */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclInvalidArgument;
  standin_group *g = comm->g;
  free(comm);
  pthread_mutex_lock(&mu);
  int last = --g->refs == 0;
  pthread_mutex_unlock(&mu);
  if (!last) return ncclSuccess;
  const kl_cu *cu = kl_cu_get(NULL);
  CUcontext dummy;
  CUdevice dev;
  cu->cuCtxPushCurrent(g->ctx);
  cu->cuCtxGetDevice(&dev);
  cu->cuMemFree(g->board);
  cu->cuMemFree(g->stage);
  cu->cuModuleUnload(g->mod);
  cu->cuCtxPopCurrent(&dummy);
  cu->cuDevicePrimaryCtxRelease(dev);
  free(g);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count) {
  if (!comm || !count) return ncclInvalidArgument;
  *count = comm->g->n;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank) {
  if (!comm || !rank) return ncclInvalidArgument;
  *rank = comm->rank;
  return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
  return r == ncclSuccess ? "no error" : "nccl stand-in: error";
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  if (!comm || type != ncclUint8) return ncclInvalidArgument;
  if (count > STANDIN_STAGE_BYTES) return ncclInvalidUsage; /* more than a rank's staging */
  const kl_cu *cu = kl_cu_get(NULL);
  standin_group *g = comm->g;
  uint64_t bytes = count;
  int rank = comm->rank, n = g->n;
  unsigned *fault = faults;
  void *args[] = {&send, &recv, &bytes, &rank, &n, &g->board, &g->stage, &fault};
  CUresult r = cu->cuLaunchKernel(g->fn, 1, 1, 1, STANDIN_THREADS, 1, 1, 0, (CUstream)stream, args,
                                  NULL);
  return r == CUDA_SUCCESS ? ncclSuccess : ncclUnhandledCudaError;
}
