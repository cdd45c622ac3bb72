/* libklrt's host logic on a machine without a GPU: the library is given a
 * driver, an NCCL and a compiler of this file's own (kl_testing_fakes,
 * klrt_testing only), so real contexts are made and called and what they
 * would enqueue is recorded; no kernel runs. Each case is a contract the
 * GPU suites cannot reach cheaply: arguments refused before a launch, a
 * failed allocation that must leave the context as it was, and refusals
 * that every rank of a group must make alike (a rank that enters a
 * collective its peer skipped waits for good). Two ranks are two threads
 * of one kl_group. */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "ranks.h"
#include "rt.h"

/* ---- the driver: device memory is address ranges, launches are counted ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct { CUdeviceptr p; size_t n; int dev; } allocs[4096]; /* n 0: freed */
static int nallocs;
static CUdeviceptr next_addr = 0x7f0000000000ull;
static size_t alloc_limit;    /* cuMemAlloc fails above this many bytes (0: never) */
static int capturing;         /* what cuStreamIsCapturing reports */
static int launches;          /* kernels launched */
static _Thread_local int thread_launches; /* by this thread: a rank's own */
static _Thread_local struct {
  CUfunction f;
  unsigned grid;
} trace[8]; /* this thread's launches since trace_n was set to 0 (the first 8) */
static _Thread_local int trace_n;
static _Thread_local CUcontext current;

/* The driver's entry points this file does not fake succeed and do
 * nothing. They are called through their own types; on the x86-64 and
 * AArch64 C ABIs a function that takes its arguments and ignores them
 * returns the same from any of them. */
static CUresult ok(void) { return CUDA_SUCCESS; }
static CUresult device_get(CUdevice *d, int ordinal) { return *d = ordinal, CUDA_SUCCESS; }
static CUresult device_count(int *n) { return *n = 2, CUDA_SUCCESS; }
static CUresult attribute(int *v, CUdevice_attribute a, CUdevice d) {
  (void)d;
  *v = a == CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR ? 9
       : a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 0;
  return CUDA_SUCCESS;
}
static CUresult uuid(CUuuid *u, CUdevice d) {
  memset(u, 0, sizeof *u);
  u->bytes[0] = (char)(d + 1);
  return CUDA_SUCCESS;
}
static CUresult can_peer(int *can, CUdevice a, CUdevice b) { (void)a, (void)b; return *can = 1, CUDA_SUCCESS; }
static CUresult retain(CUcontext *c, CUdevice d) { return *c = (CUcontext)(uintptr_t)(0x1000 + d), CUDA_SUCCESS; }
static CUresult get_current(CUcontext *c) { return *c = current, CUDA_SUCCESS; }
static CUresult set_current(CUcontext c) { return current = c, CUDA_SUCCESS; }
static CUresult pop_current(CUcontext *c) {
  if (c) *c = current;
  current = NULL;
  return CUDA_SUCCESS;
}
static CUresult ctx_device(CUdevice *d) {
  *d = current ? (CUdevice)((uintptr_t)current - 0x1000) : 0;
  return CUDA_SUCCESS;
}
/* n bytes on GPU dev at `at` (0: the next free address). */
static CUresult alloc_at(CUdeviceptr *p, size_t n, int dev, CUdeviceptr at) {
  pthread_mutex_lock(&mu);
  CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
  if ((!alloc_limit || n <= alloc_limit) && nallocs < (int)(sizeof allocs / sizeof *allocs)) {
    *p = at ? at : next_addr;
    allocs[nallocs].p = *p, allocs[nallocs].dev = dev, allocs[nallocs++].n = n;
    if (!at) next_addr += ((n + 4095) & ~(size_t)4095) + 4096;
    r = CUDA_SUCCESS;
  }
  pthread_mutex_unlock(&mu);
  return r;
}
static CUresult mem_alloc(CUdeviceptr *p, size_t n) {
  CUdevice dev;
  ctx_device(&dev);
  return alloc_at(p, n, (int)dev, 0);
}
/* What the caller's cuMemFree would do: the address is no one's. */
static void mem_forget(CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < nallocs; i++)
    if (allocs[i].p == p) allocs[i].n = 0;
  pthread_mutex_unlock(&mu);
}
static CUresult host_alloc(void **p, size_t n) { return (*p = calloc(1, n)) ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY; }
static CUresult host_free(void *p) { return free(p), CUDA_SUCCESS; }
/* As the driver: an address no allocation holds gets memory type 0 (and
 * every other attribute 0), with CUDA_SUCCESS. An allocation of device
 * HOST_MAPPED is pinned host memory every GPU reads at its address (its
 * device pointer is itself), one of HOST_UNMAPPED pinned memory no GPU
 * maps (no device pointer). */
#define HOST_MAPPED (-1)
#define HOST_UNMAPPED (-2)
static CUresult pointer_attributes(unsigned n, CUpointer_attribute *a, void **data, CUdeviceptr p) {
  pthread_mutex_lock(&mu);
  int hit = -1;
  for (int i = 0; i < nallocs; i++)
    if (p >= allocs[i].p && p < allocs[i].p + allocs[i].n) hit = i;
  for (unsigned j = 0; j < n; j++) switch (a[j]) {
    case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
      *(unsigned *)data[j] = hit < 0 ? 0u
                             : allocs[hit].dev < 0 ? (unsigned)CU_MEMORYTYPE_HOST
                                                   : (unsigned)CU_MEMORYTYPE_DEVICE;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
      if (hit < 0 || allocs[hit].dev == HOST_UNMAPPED) {
        pthread_mutex_unlock(&mu);
        return CUDA_ERROR_INVALID_VALUE;
      }
      *(CUdeviceptr *)data[j] = p;
      break;
    case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: *(int *)data[j] = hit < 0 ? 0 : allocs[hit].dev; break;
    case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
      *(CUdeviceptr *)data[j] = hit < 0 ? 0 : allocs[hit].p;
      break;
    case CU_POINTER_ATTRIBUTE_RANGE_SIZE: *(size_t *)data[j] = hit < 0 ? 0 : allocs[hit].n; break;
    default: pthread_mutex_unlock(&mu); return CUDA_ERROR_NOT_SUPPORTED;
    }
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
static CUresult module_load(CUmodule *m, const void *image) { (void)image; return *m = (CUmodule)0x2000, CUDA_SUCCESS; }
/* A function is its entry point's name: one handle a name. */
static char fn_names[64][64];
static int n_fns;
static CUresult get_function(CUfunction *f, CUmodule m, const char *name) {
  (void)m;
  pthread_mutex_lock(&mu);
  int i = 0;
  while (i < n_fns && strcmp(fn_names[i], name) != 0) i++;
  if (i == n_fns && n_fns < 64) snprintf(fn_names[n_fns++], sizeof fn_names[0], "%s", name);
  pthread_mutex_unlock(&mu);
  return *f = (CUfunction)(uintptr_t)(0x3000 + 16 * i), CUDA_SUCCESS;
}
/* The kind of a function's entry point: kl_<spec>_<kind>, the kind the
 * last word but for the one kind of two (a spec's name has words too). */
static const char *fn_kind(CUfunction f) {
  const int i = (int)(((uintptr_t)f - 0x3000) / 16);
  if (i < 0 || i >= n_fns) return "?";
  const char *name = fn_names[i], *u = strrchr(name, '_');
  const size_t n = strlen(name), two = strlen("_shards_lists");
  if (n > two && !strcmp(name + n - two, "_shards_lists")) return name + n - two + 1;
  return u ? u + 1 : "?";
}
static CUresult occupancy(int *n, CUfunction f, int block, size_t shared) {
  (void)f, (void)block, (void)shared;
  return *n = 2, CUDA_SUCCESS;
}
static CUresult stream_create(CUstream *s, unsigned flags) { (void)flags; return *s = (CUstream)0x4000, CUDA_SUCCESS; }
static CUresult event_create(CUevent *e, unsigned flags) { (void)flags; return *e = (CUevent)0x5000, CUDA_SUCCESS; }
static CUresult is_capturing(CUstream s, CUstreamCaptureStatus *status) {
  (void)s;
  *status = capturing ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
static CUresult launch(const CUlaunchConfig *cfg, CUfunction f, void **args, void **extra) {
  (void)args, (void)extra;
  __atomic_add_fetch(&launches, 1, __ATOMIC_RELAXED);
  thread_launches++;
  if (trace_n < 8) trace[trace_n].f = f, trace[trace_n].grid = cfg->gridDimX;
  trace_n++;
  return CUDA_SUCCESS;
}
/* Device memory reads as zeros, but for the 64-bit words a test sets. */
static struct {
  CUdeviceptr p;
  uint64_t v;
} words[4];
static void set_word(CUdeviceptr p, uint64_t v) {
  pthread_mutex_lock(&mu);
  int i = 0;
  while (i < 3 && words[i].p && words[i].p != p) i++;
  words[i].p = p, words[i].v = v;
  pthread_mutex_unlock(&mu);
}
static CUresult to_host(void *dst, CUdeviceptr src, size_t n) {
  memset(dst, 0, n);
  pthread_mutex_lock(&mu);
  for (int i = 0; i < 4; i++)
    if (words[i].p && n == 8 && src == words[i].p) memcpy(dst, &words[i].v, 8);
  pthread_mutex_unlock(&mu);
  return CUDA_SUCCESS;
}
static CUresult to_host_async(void *dst, CUdeviceptr src, size_t n, CUstream s) {
  (void)s;
  return to_host(dst, src, n);
}

static kl_cu driver;
static void make_driver(void) {
#define OK(name) *(void **)&driver.name = (void *)ok;
  KL_CU_FUNCS(OK)
#undef OK
  driver.cuFuncLoad = NULL; /* optional in the driver: absent */
#define SET(name, fn) *(void **)&driver.name = (void *)fn
  SET(cuDeviceGet, device_get);
  SET(cuDeviceGetCount, device_count);
  SET(cuDeviceGetAttribute, attribute);
  SET(cuDeviceGetUuid, uuid);
  SET(cuDeviceCanAccessPeer, can_peer);
  SET(cuDevicePrimaryCtxRetain, retain);
  SET(cuCtxGetCurrent, get_current);
  SET(cuCtxSetCurrent, set_current);
  SET(cuCtxPushCurrent, set_current);
  SET(cuCtxPopCurrent, pop_current);
  SET(cuCtxGetDevice, ctx_device);
  SET(cuMemAlloc, mem_alloc);
  SET(cuMemAllocHost, host_alloc);
  SET(cuMemFreeHost, host_free);
  SET(cuPointerGetAttributes, pointer_attributes);
  SET(cuModuleLoadData, module_load);
  SET(cuModuleGetFunction, get_function);
  SET(cuOccupancyMaxActiveBlocksPerMultiprocessor, occupancy);
  SET(cuStreamCreate, stream_create);
  SET(cuEventCreate, event_create);
  SET(cuStreamIsCapturing, is_capturing);
  SET(cuLaunchKernelEx, launch);
  SET(cuMemcpyDtoH, to_host);
  SET(cuMemcpyDtoHAsync, to_host_async);
#undef SET
}

/* ---- NCCL: a communicator is a rank; an all-gather meets its peer ---- */

/* A rank's all-gather waits for its peer's, as NCCL's would on the device,
 * but not forever: one whose peer never comes within MEET_MS is counted as
 * stranded (NCCL would hang there) and fails. */
#define MEET_MS 1000
struct ncclComm {
  int rank, n;
};
static struct ncclComm comms[2] = {{0, 2}, {1, 2}};
static int allgathers[2], stranded[2];
static pthread_mutex_t meet_m = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t meet_cv = PTHREAD_COND_INITIALIZER;
static int meet_waiting;
static unsigned long meet_gen;
static ncclResult_t all_gather(const void *send, void *recv, size_t count, ncclDataType_t type,
                               ncclComm_t comm, cudaStream_t s) {
  (void)send, (void)recv, (void)count, (void)type, (void)s;
  __atomic_add_fetch(&allgathers[comm->rank], 1, __ATOMIC_RELAXED);
  pthread_mutex_lock(&meet_m);
  int met = 1;
  const unsigned long gen = meet_gen;
  if (++meet_waiting == comm->n) {
    meet_waiting = 0, meet_gen++;
    pthread_cond_broadcast(&meet_cv);
  } else {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += MEET_MS / 1000;
    while (met && gen == meet_gen)
      if (pthread_cond_timedwait(&meet_cv, &meet_m, &until) == ETIMEDOUT && gen == meet_gen)
        meet_waiting--, met = 0;
  }
  pthread_mutex_unlock(&meet_m);
  if (met) return ncclSuccess;
  __atomic_add_fetch(&stranded[comm->rank], 1, __ATOMIC_RELAXED);
  return ncclInternalError;
}
static ncclResult_t comm_count(const ncclComm_t comm, int *n) { return *n = comm->n, ncclSuccess; }
static ncclResult_t comm_rank(const ncclComm_t comm, int *r) { return *r = comm->rank, ncclSuccess; }
static const char *nccl_error(ncclResult_t r) { (void)r; return "NCCL error (test_host)"; }
static const kl_nccl_api nccl = {all_gather, comm_count, comm_rank, nccl_error};

/* ---- the compiler: a cubin of 16 bytes, or a failure on this thread ---- */

static _Thread_local int jit_fails;
static int jit(const char *source, const char *name, kl_binary *out, kl_err *err) {
  (void)source, (void)name;
  if (jit_fails) {
    snprintf(err->msg, sizeof err->msg, "JIT failed (test_host)");
    return -1;
  }
  out->data = calloc(1, 16), out->size = 16;
  return out->data ? 0 : -1;
}

/* ---- helpers ---- */

#define PTR(T, d) ((T *)(uintptr_t)(d))
static CUdeviceptr device_buffer(size_t n) {
  CUdeviceptr p = 0;
  if (mem_alloc(&p, n) != CUDA_SUCCESS) abort(); /* the test's own allocation */
  return p;
}

static const char *const spec1 = "return { name = 'h1', vocab_size = 1024, tp = 1, "
                                 "dtype = 'bf16', max_tokens = 4, topk = 16 }";

static kl_ctx *one_rank(void) {
  kl_config cfg = rank_config(0, 1, 0, NULL);
  kl_ctx *c = NULL;
  kl_result r = kl_ctx_create_string(&c, spec1, NULL, &cfg);
  CHECK_KL(r == KLRT_OK, "one rank: creation: %s", kl_result_name(r));
  return c;
}

/* Two ranks of spec as threads of one group; has_nccl[r]: rank r gets a
 * communicator; jit_fail_rank: that rank's compiler fails (-1: none). */
typedef struct pair {
  const char *spec;
  int has_nccl[2], jit_fail_rank;
  kl_group *group;
  kl_ctx *ctx[2];
  kl_result res[2];
} pair;
typedef struct rank_arg {
  pair *p;
  int rank;
} rank_arg;

static void *create_rank(void *v) {
  rank_arg *a = v;
  pair *p = a->p;
  kl_config cfg = rank_config(a->rank, 2, 0, p->group);
  if (p->has_nccl[a->rank]) cfg.nccl = &comms[a->rank];
  jit_fails = a->rank == p->jit_fail_rank;
  p->res[a->rank] = kl_ctx_create_string(&p->ctx[a->rank], p->spec, NULL, &cfg);
  jit_fails = 0;
  return NULL;
}
static void *destroy_rank(void *v) {
  rank_arg *a = v;
  a->p->res[a->rank] = kl_ctx_destroy(a->p->ctx[a->rank]);
  return NULL;
}
static void on_both(pair *p, void *(*fn)(void *)) {
  rank_arg a[2] = {{p, 0}, {p, 1}};
  ranks_run(2, fn, a, sizeof *a);
}
static void pair_create(pair *p) {
  if (kl_group_create(&p->group, 2) != KLRT_OK) abort();
  on_both(p, create_rank);
}
static void pair_destroy(pair *p) {
  on_both(p, destroy_rank);
  kl_group_destroy(p->group);
}

/* The path counts: calls sent down each path when it is chosen, refused or
 * not, so that every rank counts alike (each NCCL call here is declined,
 * by KLGEN_DISABLE or by its size). */
static void check_counts(kl_ctx *c, uint64_t oneshot, uint64_t nccl, const char *what) {
  kl_stats st = KL_STATS_INIT;
  uint64_t declined = 0;
  CHECK_KL(kl_ctx_stats(c, &st) == KLRT_OK, "kl_ctx_stats");
  for (int i = 0; i < KL_DECLINE_COUNT; i++) declined += st.declined[i];
  CHECK_KL(st.oneshot == oneshot && st.nccl == nccl && declined == nccl,
           "%s: want %llu one-shot, %llu NCCL calls and as many declines; got %llu, %llu, %llu",
           what, (unsigned long long)oneshot, (unsigned long long)nccl,
           (unsigned long long)st.oneshot, (unsigned long long)st.nccl,
           (unsigned long long)declined);
}

/* ---- the cases ---- */

/* Each of n kl_sample calls of 2 tokens, one a params, refused with
 * EINVAL whose message holds what[i], before anything is launched. */
static void expect_refused(kl_ctx *c, CUdeviceptr shard, CUdeviceptr token, const kl_sampling *p,
                           const char *const *what, int n) {
  for (int i = 0; i < n; i++) {
    const int before = launches;
    kl_result r = kl_sample(c, (void *)(uintptr_t)shard, &p[i], (int64_t *)(uintptr_t)token, NULL,
                            NULL, NULL, 0, 2, NULL);
    CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), what[i]) && launches == before,
             "want EINVAL with \"%s\" and no launch: %s (%s), %d launches", what[i],
             kl_result_name(r), kl_last_error(), launches - before);
  }
}

/* kl_sample's lists (allowed ids, logit bias, min_tokens, banned ids): a
 * list's arrays without each other or without a width, position without
 * min_tokens, an array past its buffer or misaligned, each refused before
 * anything is launched; lists in their buffers launch the lists kernel
 * first, then the sampler. */
static void sample_lists(void) {
  kl_ctx *c = one_rank();
  if (!c) return;
  CUdeviceptr shard = device_buffer(1 << 16), token = device_buffer(4096), par = device_buffer(4096);
  const int32_t *ints = (const int32_t *)(uintptr_t)(par + 1024); /* 768 int32 */
  kl_sampling p = {.size = sizeof(kl_sampling), .temperature = (const float *)(uintptr_t)par};
  kl_sampling all = p;
  all.allowed_count = ints, all.allowed_ids = ints + 16, all.allowed_width = 8;
  all.bias_count = ints, all.bias_ids = ints + 16, all.bias_values = (const float *)(ints + 64);
  all.bias_width = 16;
  all.min_len = ints, all.stop_count = ints, all.stop_ids = ints + 16, all.stop_width = 4;
  all.position = (const int64_t *)(uintptr_t)(par + 2048);
  all.banned = ints + 128, all.banned_width = 5;
  trace_n = 0;
  int before = launches;
  kl_result r = kl_sample(c, (void *)(uintptr_t)shard, &all, (int64_t *)(uintptr_t)token, NULL,
                          NULL, NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches == before + 2 && trace_n == 2 &&
           !strcmp(fn_kind(trace[0].f), "lists") && !strcmp(fn_kind(trace[1].f), "shards_lists"),
           "every list: %s (%s), %d launches, the first %s", kl_result_name(r), kl_last_error(),
           launches - before, trace_n ? fn_kind(trace[0].f) : "-");
  enum { N_ODD = 11 };
  kl_sampling odd[N_ODD];
  const char *what[N_ODD];
  for (int i = 0; i < N_ODD; i++) odd[i] = all;
  odd[0].allowed_ids = NULL;
  what[0] = "the allowed list needs allowed_count and allowed_ids together";
  odd[1].bias_values = NULL;
  what[1] = "the bias list needs bias_count, bias_ids and bias_values together";
  odd[2].min_len = NULL;
  what[2] = "the stop list needs min_len, stop_count and stop_ids together";
  odd[3].banned_width = 0;
  what[3] = "params->banned_width is 0 (must be >= 1 with its arrays";
  odd[4].allowed_count = NULL, odd[4].allowed_ids = NULL, odd[4].allowed_width = -1;
  what[4] = "params->allowed_width is -1";
  odd[5].min_len = NULL, odd[5].stop_count = NULL, odd[5].stop_ids = NULL;
  what[5] = "params->position is read by min_tokens alone";
  odd[6].bias_ids = ints + 760; /* 16 entries of its last 8 */
  what[6] = "bias_ids 0x";
  odd[7].bias_values = (const float *)(uintptr_t)(par + 1026);
  what[7] = "params->bias_values is not 4-byte aligned";
  odd[8].position = (const int64_t *)(uintptr_t)(par + 2052);
  what[8] = "params->position is not 8-byte aligned";
  odd[9].banned = ints + 766; /* 2 rows of 5 past the last 2 */
  what[9] = "banned 0x";
  odd[10].bias_width = 1 << 20;
  what[10] = "bias_width + banned_width is 1048581 (at most 524288)";
  expect_refused(c, shard, token, odd, what, N_ODD);
  /* a logprob with a list: the logprob is of the raw logits, so the rows
   * are gathered and sampled whole */
  CUdeviceptr lp = device_buffer(64);
  trace_n = 0;
  r = kl_sample(c, (void *)(uintptr_t)shard, &all, (int64_t *)(uintptr_t)token,
                (float *)(uintptr_t)lp, NULL, NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && trace_n == 3 && !strcmp(fn_kind(trace[0].f), "lists") &&
           !strcmp(fn_kind(trace[2].f), "sample"),
           "lists and a logprob: %s (%s), %d launches, the last %s", kl_result_name(r),
           kl_last_error(), trace_n, trace_n ? fn_kind(trace[trace_n - 1].f) : "-");
  kl_ctx_destroy(c);
}

/* kl_sample's parameters: an array misaligned for its type, a size that is
 * no version's, a table count without its index array (or the reverse), a
 * table past its buffer: each refused before anything is launched. */
static void sample_alignment(void) {
  kl_ctx *c = one_rank();
  if (!c) return;
  CUdeviceptr shard = device_buffer(1 << 16), token = device_buffer(4096), par = device_buffer(4096);
  kl_sampling p = {.size = sizeof(kl_sampling), .temperature = (const float *)(uintptr_t)par,
                   .seed = (const uint64_t *)(uintptr_t)(par + 1024),
                   .offset = (const uint64_t *)(uintptr_t)(par + 2048)};
  int before = launches;
  kl_result r = kl_sample(c, (void *)(uintptr_t)shard, &p, (int64_t *)(uintptr_t)token, NULL, NULL,
                          NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "aligned parameters: %s, %d launches",
           kl_result_name(r), launches - before);
  /* each a copy of p with one field wrong */
  enum { N_ODD = 24 };
  kl_sampling odd_p[N_ODD];
  const char *what[N_ODD];
  for (int i = 0; i < N_ODD; i++) odd_p[i] = p;
  const uint64_t *rows = (const uint64_t *)(uintptr_t)(par + 3072); /* 128 int64 */
  odd_p[0].temperature = (const float *)(uintptr_t)(par + 2);
  what[0] = "params->temperature is not 4-byte aligned";
  odd_p[1].top_k = (const int32_t *)(uintptr_t)(par + 3074);
  what[1] = "params->top_k is not 4-byte aligned";
  odd_p[2].top_p = (const float *)(uintptr_t)(par + 3073);
  what[2] = "params->top_p is not 4-byte aligned";
  odd_p[3].seed = (const uint64_t *)(uintptr_t)(par + 1028);
  what[3] = "params->seed is not 8-byte aligned";
  odd_p[4].offset = (const uint64_t *)(uintptr_t)(par + 2052);
  what[4] = "params->offset is not 8-byte aligned";
  odd_p[5].size = 0;
  what[5] = "params->size is 0: initialize it with KL_SAMPLING_INIT";
  odd_p[6].size = offsetof(kl_sampling, bitmask) - 8; /* no version's */
  what[6] = "less than the oldest kl_sampling";
  odd_p[7].states = 3;
  what[7] = "params->states is 3 without params->state_rows";
  odd_p[8].state_rows = (const void *)rows, odd_p[8].states = 0;
  what[8] = "params->states is 0 (must be >= 1 with params->state_rows)";
  odd_p[9].offset_rows = (const void *)rows, odd_p[9].offsets = -1;
  what[9] = "params->offsets is -1";
  odd_p[10].state_rows = (const void *)(uintptr_t)(par + 3076), odd_p[10].states = 2;
  what[10] = "params->state_rows is not 8-byte aligned";
  odd_p[11].offset_rows = (const void *)(uintptr_t)(par + 4088), odd_p[11].offsets = 2;
  what[11] = "offset_rows 0x"; /* past its allocation */
  /* tables of `states` entries: temperature's reaches past its buffer */
  odd_p[12].state_rows = (const void *)rows, odd_p[12].states = 2000;
  what[12] = "(a table of params->states = 2000 entries)";
  odd_p[13].offset_rows = (const void *)rows, odd_p[13].offsets = 1000;
  what[13] = "(a table of params->offsets = 1000 entries)";
  odd_p[14].state_rows = (const void *)rows, odd_p[14].states = 2, odd_p[14].state_rows_bits = 16;
  what[14] = "params->state_rows_bits is 16 (must be 64, or 0, or 32 with params->state_rows)";
  odd_p[15].offset_rows_bits = 32;
  what[15] = "params->offset_rows_bits is 32";
  /* 32-bit entries: 4-byte aligned is enough, 2 is not */
  odd_p[16].offset_rows = (const void *)(uintptr_t)(par + 3074), odd_p[16].offsets = 2;
  odd_p[16].offset_rows_bits = 32;
  what[16] = "params->offset_rows is not 4-byte aligned";
  /* the grammar's words: a row of 1024 / 32 a token, int32 */
  odd_p[17].bitmask = (const int32_t *)(uintptr_t)(par + 3074);
  what[17] = "params->bitmask is not 4-byte aligned";
  odd_p[18].bitmask = (const int32_t *)(uintptr_t)(par + 3968); /* 128 of the 256 bytes */
  what[18] = "bitmask 0x";
  /* the penalties: per-request tables, the counts a row of 1024 a request */
  odd_p[19].prompt_mask = (const int32_t *)(uintptr_t)(par + 3074);
  what[19] = "params->prompt_mask is not 4-byte aligned";
  odd_p[20].output_counts = (const int32_t *)(uintptr_t)par; /* 4096 of its 8192 bytes */
  what[20] = "output_counts 0x";
  odd_p[21].state_rows = (const void *)rows, odd_p[21].states = 2;
  odd_p[21].prompt_mask = (const int32_t *)(uintptr_t)(par + 3968); /* 128 of 256 bytes */
  what[21] = "(a table of params->states = 2 entries of 32 elements)";
  odd_p[22].frequency_penalty = (const float *)(uintptr_t)(par + 3073);
  what[22] = "params->frequency_penalty is not 4-byte aligned";
  odd_p[23].reserved = 1;
  what[23] = "params->reserved is 1 (must be 0)";
  expect_refused(c, shard, token, odd_p, what, N_ODD);
  /* a larger struct (a newer header) is taken when its extra bytes are 0 */
  struct {
    kl_sampling p;
    uint64_t extra;
  } newer = {p, 0};
  newer.p.size = sizeof newer;
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &newer.p, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "a larger params, extra 0: %s", kl_result_name(r));
  newer.extra = 1;
  r = kl_sample(c, (void *)(uintptr_t)shard, &newer.p, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), "does not know"),
           "a larger params, extra set: %s", kl_result_name(r));
  /* tables in mapped pinned host memory (vLLM's UVA buffers): taken;
   * unmapped: refused */
  CUdeviceptr mapped = 0, unmapped = 0;
  if (alloc_at(&mapped, 4096, HOST_MAPPED, 0) || alloc_at(&unmapped, 4096, HOST_UNMAPPED, 0))
    abort();
  kl_sampling in_host = p;
  in_host.temperature = (const float *)(uintptr_t)mapped;
  in_host.seed = (const uint64_t *)(uintptr_t)(mapped + 1024);
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &in_host, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "tables in mapped host memory: %s (%s)",
           kl_result_name(r), kl_last_error());
  in_host.temperature = (const float *)(uintptr_t)(mapped + 4092); /* past its allocation */
  r = kl_sample(c, (void *)(uintptr_t)shard, &in_host, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), "temperature") &&
           strstr(kl_last_error(), "is too small"), "a mapped table past its end: %s (%s)",
           kl_result_name(r), kl_last_error());
  in_host.temperature = (const float *)(uintptr_t)unmapped;
  r = kl_sample(c, (void *)(uintptr_t)shard, &in_host, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), "temperature"),
           "a table in unmapped host memory: %s (%s)", kl_result_name(r), kl_last_error());
  /* an older caller's struct, before the bitmask: taken, the bitmask off
   * whatever its bytes hold (a mask past its buffer would be refused) */
  kl_sampling older = p;
  older.size = offsetof(kl_sampling, bitmask);
  older.bitmask = (const int32_t *)(uintptr_t)(par + 3968);
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &older, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "a kl_sampling before the bitmask: %s (%s)",
           kl_result_name(r), kl_last_error());
  /* a bitmask within its buffer: taken */
  kl_sampling masked = p;
  masked.bitmask = (const int32_t *)(uintptr_t)(par + 3072);
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &masked, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "a bitmask: %s (%s)", kl_result_name(r),
           kl_last_error());
  /* penalties with their tables within their buffers: taken */
  kl_sampling pen = p;
  CUdeviceptr counts = device_buffer(8192);
  pen.repetition_penalty = (const float *)(uintptr_t)(par + 3072);
  pen.presence_penalty = (const float *)(uintptr_t)(par + 3080);
  pen.prompt_mask = (const int32_t *)(uintptr_t)(par + 3584);
  pen.output_counts = (const int32_t *)(uintptr_t)counts;
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &pen, (int64_t *)(uintptr_t)token, NULL, NULL, NULL,
                0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "penalties: %s (%s)", kl_result_name(r),
           kl_last_error());
  /* state_rows and offset_rows within their tables: taken */
  kl_sampling indexed = p;
  indexed.state_rows = (const void *)rows, indexed.states = 4;
  indexed.offset_rows = (const void *)(rows + 2), indexed.offsets = 4;
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &indexed, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "indexed parameters: %s (%s)", kl_result_name(r),
           kl_last_error());
  indexed.offset_rows = (const void *)(uintptr_t)(par + 3076); /* 4-byte aligned */
  indexed.offset_rows_bits = indexed.state_rows_bits = 32;
  before = launches;
  r = kl_sample(c, (void *)(uintptr_t)shard, &indexed, (int64_t *)(uintptr_t)token, NULL, NULL,
                NULL, 0, 2, NULL);
  CHECK_KL(r == KLRT_OK && launches > before, "32-bit index arrays: %s (%s)", kl_result_name(r),
           kl_last_error());
  kl_ctx_destroy(c);
}

/* A call past max_tokens grows a buffer; when that allocation fails the
 * context keeps the buffer it had, so a captured call within max_tokens
 * (which may not allocate) still runs. */
static void failed_growth(void) {
  setenv("KLGEN_DISABLE", "1", 1); /* every call takes the NCCL path and its buffers */
  kl_ctx *c = one_rank();
  unsetenv("KLGEN_DISABLE");
  if (!c) return;
  CUdeviceptr shard = device_buffer(1 << 20), index = device_buffer(1 << 12);
  void *in = (void *)(uintptr_t)shard;
  int64_t *out = (int64_t *)(uintptr_t)index;
  capturing = 1;
  kl_result r = kl_argmax(c, in, out, NULL, 4, NULL);
  capturing = 0;
  CHECK_KL(r == KLRT_OK, "captured kl_argmax within max_tokens: %s", kl_result_name(r));
  alloc_limit = 1;
  r = kl_argmax(c, in, out, NULL, 100, NULL);
  alloc_limit = 0;
  CHECK_KL(r == KLRT_ENOMEM, "kl_argmax past max_tokens, its allocation failing: %s",
           kl_result_name(r));
  capturing = 1;
  r = kl_argmax(c, in, out, NULL, 4, NULL);
  capturing = 0;
  CHECK_KL(r == KLRT_OK, "captured kl_argmax within max_tokens after a failed growth: %s",
           kl_result_name(r));
  check_counts(c, 0, 3, "three calls sent down the NCCL path, one failing there");
  kl_ctx_destroy(c);
}

/* Rank 0 has a communicator, rank 1 has none: a call the one-shot path
 * cannot serve (past max_tokens) is refused on both, and rank 0 enters no
 * all-gather. */
static void nccl_on_one_rank(void) {
  pair p = {.spec = "return { name = 'h2', vocab_size = 2048, tp = 2, dtype = 'bf16', "
                    "max_tokens = 4, topk = 16 }",
            .has_nccl = {1, 0}, .jit_fail_rank = -1};
  pair_create(&p);
  CHECK_KL(p.res[0] == KLRT_OK && p.res[1] == KLRT_OK, "creation: %s / %s",
           kl_result_name(p.res[0]), kl_result_name(p.res[1]));
  if (p.res[0] == KLRT_OK && p.res[1] == KLRT_OK) {
    allgathers[0] = allgathers[1] = 0;
    kl_result r[2];
    for (int i = 0; i < 2; i++) {
      CUdeviceptr in = device_buffer(1 << 20), out = device_buffer(1 << 20);
      r[i] = kl_gather(p.ctx[i], (void *)(uintptr_t)in, (void *)(uintptr_t)out, 8, NULL);
    }
    CHECK_KL(r[0] == KLRT_EUNAVAILABLE && r[1] == KLRT_EUNAVAILABLE && !allgathers[0],
             "past max_tokens, NCCL on rank 0 only: %s / %s, rank 0's all-gathers %d",
             kl_result_name(r[0]), kl_result_name(r[1]), allgathers[0]);
    for (int i = 0; i < 2; i++) check_counts(p.ctx[i], 0, 1, "a call refused on the NCCL path");
    pair_destroy(&p);
  }
  /* and where the one-shot path is not ready, creation fails on both */
  pair q = p;
  q.jit_fail_rank = 1, q.ctx[0] = q.ctx[1] = NULL;
  pair_create(&q);
  CHECK_KL(q.res[0] == KLRT_EUNAVAILABLE && q.res[1] == KLRT_EUNAVAILABLE,
           "not ready, NCCL on rank 0 only: creation %s / %s", kl_result_name(q.res[0]),
           kl_result_name(q.res[1]));
  for (int i = 0; i < 2; i++)
    if (q.res[i] == KLRT_OK) kl_ctx_destroy(q.ctx[i]);
  kl_group_destroy(q.group);
}

/* A spec with an epilogue whose kernels did not build on rank 1: the
 * gather is refused on both ranks before either enters the all-gather. */
static void epilogue_without_kernels(void) {
  pair p = {.spec = "return { name = 'h3', vocab_size = 2048, tp = 2, dtype = 'bf16', "
                    "max_tokens = 4, softcap = 30 }",
            .has_nccl = {1, 1}, .jit_fail_rank = 1};
  pair_create(&p);
  CHECK_KL(p.res[0] == KLRT_OK && p.res[1] == KLRT_OK, "creation: %s / %s",
           kl_result_name(p.res[0]), kl_result_name(p.res[1]));
  if (p.res[0] != KLRT_OK || p.res[1] != KLRT_OK) return;
  allgathers[0] = allgathers[1] = 0;
  kl_result r[2];
  for (int i = 0; i < 2; i++) {
    CUdeviceptr in = device_buffer(1 << 20), out = device_buffer(1 << 20);
    r[i] = kl_gather(p.ctx[i], (void *)(uintptr_t)in, (void *)(uintptr_t)out, 2, NULL);
  }
  CHECK_KL(r[0] == KLRT_EUNAVAILABLE && r[1] == KLRT_EUNAVAILABLE && !allgathers[0] &&
               !allgathers[1],
           "epilogue, kernels missing on rank 1: %s / %s, all-gathers %d / %d",
           kl_result_name(r[0]), kl_result_name(r[1]), allgathers[0], allgathers[1]);
  pair_destroy(&p);
}

/* The device check of a pointer holds for the allocation behind it, not
 * for its address: once the caller frees a buffer the driver may give the
 * address to another allocation, on another GPU or smaller, and a call
 * with it then is refused. */
static void pointer_reused(void) {
  kl_ctx *c = one_rank();
  if (!c) return;
  const size_t row = 1024 * 2; /* spec1: [tokens, 1024] bf16, in and out */
  CUdeviceptr in = device_buffer(2 * row), out = device_buffer(2 * row);
  kl_result r = kl_gather(c, PTR(void, in), PTR(void, out), 2, NULL);
  CHECK_KL(r == KLRT_OK, "a gather into a buffer of GPU 0: %s", kl_result_name(r));
  const struct {
    int dev;
    size_t n;
    kl_result want;
    const char *what;
  } again[] = {{1, 2 * row, KLRT_EINVAL, "kl_gather: out 0x"},
               {0, row, KLRT_EINVAL, "is too small: 2 tokens need 4096 bytes from it, and its "
                                     "allocation ends 2048 bytes after it"},
               {0, 2 * row, KLRT_OK, ""}};
  for (size_t i = 0; i < sizeof again / sizeof *again; i++) {
    mem_forget(out);
    CUdeviceptr at;
    if (alloc_at(&at, again[i].n, again[i].dev, out) != CUDA_SUCCESS) abort();
    const int before = launches;
    r = kl_gather(c, PTR(void, in), PTR(void, out), 2, NULL);
    CHECK_KL(r == again[i].want && (r == KLRT_OK) == (launches > before) &&
                 (r == KLRT_OK || strstr(kl_last_error(), again[i].what)),
             "its address made again, %zu bytes on GPU %d: %s (%s), want %s with \"%s\"",
             again[i].n, again[i].dev, kl_result_name(r), r ? kl_last_error() : "",
             kl_result_name(again[i].want), again[i].what);
  }
  CHECK_KL(strstr(kl_last_error(), "is on GPU 1, but rank 0's context is on GPU 0") || r == KLRT_OK,
           "the message names both GPUs");
  kl_ctx_destroy(c);
}

/* Every buffer a call reads or writes is checked against its tokens: one
 * whose allocation ends before the call's bytes do is refused, naming it,
 * before anything is launched; one exactly as large passes. */
static int before_too_small;
static void expect_small(kl_result r, const char *arg, const char *call) {
  if (!arg)
    CHECK_KL(r == KLRT_OK && launches > before_too_small, "%s: %s (%s), want KLRT_OK", call,
             kl_result_name(r), r ? kl_last_error() : "");
  else
    CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), arg) &&
                 strstr(kl_last_error(), "too small") && launches == before_too_small,
             "%s: %s (%s), %d launches; want EINVAL naming %s", call, kl_result_name(r),
             r ? kl_last_error() : "", launches - before_too_small, arg);
}
#define SMALL(call, arg) (before_too_small = launches, expect_small((call), (arg), #call))
static void buffers_too_small(void) {
  kl_ctx *c = one_rank();
  if (!c) return;
  const int t = 3;
  const size_t row = 1024 * 2; /* spec1's shard and output rows, bf16 */
  /* each buffer exactly as large as t tokens need; the short ones, a row
   * less, or 8 bytes */
  CUdeviceptr in = device_buffer(t * row), out = device_buffer(t * row),
              index = device_buffer(t * 16 * 8), value = device_buffer(t * 16 * 4),
              lse = device_buffer(t * 4), top = device_buffer(t * 2 * 8), temp = device_buffer(t * 4),
              in_short = device_buffer((t - 1) * row), out_short = device_buffer((t - 1) * row),
              tiny = device_buffer(8);
  kl_sampling p = {.size = sizeof(kl_sampling), .temperature = PTR(const float, temp)};
  kl_sampling p_short = {.size = sizeof(kl_sampling), .temperature = PTR(const float, tiny + 4)};
  SMALL(kl_gather(c, PTR(void, in), PTR(void, out), t, NULL), NULL);
  SMALL(kl_gather(c, PTR(void, in_short), PTR(void, out), t, NULL), "shard");
  SMALL(kl_gather(c, PTR(void, in), PTR(void, out_short), t, NULL), "out");
  SMALL(kl_gather(c, PTR(void, in), PTR(void, out + 2), t, NULL), "out"); /* 2 bytes past */
  SMALL(kl_argmax(c, PTR(void, in), PTR(int64_t, index), PTR(float, value), t, NULL), NULL);
  SMALL(kl_argmax(c, PTR(void, in), PTR(int64_t, tiny), NULL, t, NULL), "index");
  SMALL(kl_topk(c, PTR(void, in), PTR(int64_t, index), PTR(float, value), PTR(float, lse), t, NULL),
        NULL);
  SMALL(kl_topk(c, PTR(void, in), PTR(int64_t, index), PTR(float, value + 4), NULL, t, NULL),
        "value");
  SMALL(kl_topk(c, PTR(void, in), PTR(int64_t, index), PTR(float, value), PTR(float, tiny), t, NULL),
        "lse");
  SMALL(kl_sample(c, PTR(void, in), &p, PTR(int64_t, index), PTR(float, value), PTR(int64_t, top),
                  NULL, 2, t, NULL), NULL);
  SMALL(kl_sample(c, PTR(void, in), &p, PTR(int64_t, tiny), NULL, NULL, NULL, 0, t, NULL), "token");
  SMALL(kl_sample(c, PTR(void, in), &p, PTR(int64_t, index), PTR(float, tiny), NULL, NULL, 0, t,
                  NULL), "logprob");
  SMALL(kl_sample(c, PTR(void, in), &p, PTR(int64_t, index), NULL, PTR(int64_t, top + 8), NULL, 2,
                  t, NULL), "top_index");
  SMALL(kl_sample(c, PTR(void, in), &p_short, PTR(int64_t, index), NULL, NULL, NULL, 0, t, NULL),
        "temperature");
  kl_sampling p_rank = p;
  p_rank.rank = PTR(int64_t, lse + 8); /* t int64 from lse's third float: 8 bytes short */
  SMALL(kl_sample(c, PTR(void, in), &p_rank, PTR(int64_t, index), NULL, NULL, NULL, 0, t, NULL),
        "rank");
  p_rank.rank = PTR(int64_t, top); /* 16 bytes a token */
  SMALL(kl_sample(c, PTR(void, in), &p_rank, PTR(int64_t, index), NULL, NULL, NULL, 0, t, NULL),
        NULL);
  kl_ctx_destroy(c);
}
#undef SMALL

/* kl_sample's rank output: the row sampler writes it (the call gathers: the
 * one-shot gather, then the sampler); refused misaligned, overlapping
 * another output, or in host memory, before anything is launched. */
static void sample_rank(void) {
  kl_ctx *c = one_rank();
  if (!c) return;
  const int t = 2;
  CUdeviceptr in = device_buffer(t * 1024 * 2), token = device_buffer(t * 8),
              rank = device_buffer(t * 8 + 8), temp = device_buffer(t * 4), mapped = 0;
  if (alloc_at(&mapped, 4096, HOST_MAPPED, 0)) abort();
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = PTR(const float, temp), p.rank = PTR(int64_t, rank);
  kl_stats before = KL_STATS_INIT, after = KL_STATS_INIT;
  kl_ctx_stats(c, &before);
  int launched = launches;
  trace_n = 0;
  kl_result r = kl_sample(c, PTR(void, in), &p, PTR(int64_t, token), NULL, NULL, NULL, 0, t, NULL);
  kl_ctx_stats(c, &after);
  CHECK_KL(r == KLRT_OK && trace_n == 2 && !strcmp(fn_kind(trace[0].f), "oneshot") &&
               !strcmp(fn_kind(trace[1].f), "sample") &&
               after.sample_gathered == before.sample_gathered + 1,
           "a rank: %s (%s), %d launches, the last %s, want the gather and the row sampler",
           kl_result_name(r), r ? kl_last_error() : "", launches - launched,
           trace_n ? fn_kind(trace[trace_n - 1].f) : "-");
  const struct {
    CUdeviceptr at;
    const char *want;
  } odd[] = {{rank + 4, "must be 8-byte aligned"}, {token, "overlap"},
             {mapped, "rank"}};
  for (size_t i = 0; i < sizeof odd / sizeof *odd; i++) {
    p.rank = PTR(int64_t, odd[i].at);
    launched = launches;
    r = kl_sample(c, PTR(void, in), &p, PTR(int64_t, token), NULL, NULL, NULL, 0, t, NULL);
    CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), odd[i].want) && launches == launched,
             "rank at odd place %zu: %s (%s), %d launches; want EINVAL with \"%s\"", i,
             kl_result_name(r), kl_last_error(), launches - launched, odd[i].want);
  }
  /* a parameter array inside rank: the sampler writes one while it reads the other */
  CUdeviceptr both = device_buffer(64);
  p.rank = PTR(int64_t, both), p.temperature = PTR(const float, both + 8);
  launched = launches;
  r = kl_sample(c, PTR(void, in), &p, PTR(int64_t, token), NULL, NULL, NULL, 0, t, NULL);
  CHECK_KL(r == KLRT_EINVAL && strstr(kl_last_error(), "temperature overlaps rank") &&
               launches == launched,
           "temperature inside rank: %s (%s), %d launches", kl_result_name(r), kl_last_error(),
           launches - launched);
  kl_ctx_destroy(c);
}

/* ---- two ranks calling at once ---- */

/* The calls, each rank on a thread of its own: an all-gather then meets its
 * peer's, or is stranded. kl_sample three ways: by the shards, with a
 * filter, and with a top-n logprob (the last two gather on the NCCL path). */
typedef enum { OP_GATHER, OP_ARGMAX, OP_TOPK, OP_SAMPLE, OP_SAMPLE_FILTERED, OP_SAMPLE_TOP,
               OP_COUNT } op_id;
static const char *const op_names[OP_COUNT] = {"kl_gather", "kl_argmax", "kl_topk", "kl_sample",
                                               "kl_sample (top_p)", "kl_sample (n_top 1)"};
#define RANK_BUF (1 << 20) /* every buffer of a rank: room for any call here */
typedef struct rank_bufs {
  CUdeviceptr shard, out, index, value, lse, top, temperature, top_p;
} rank_bufs;
static void rank_bufs_alloc(rank_bufs *b) {
  CUdeviceptr *all[] = {&b->shard, &b->out, &b->index, &b->value, &b->lse, &b->top,
                        &b->temperature, &b->top_p};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) *all[i] = device_buffer(RANK_BUF);
}
static kl_result call_op(kl_ctx *c, op_id op, const rank_bufs *b, int tokens) {
  const void *in = PTR(const void, b->shard);
  kl_sampling p = {.size = sizeof(kl_sampling), .temperature = PTR(const float, b->temperature)};
  if (op == OP_SAMPLE_FILTERED) p.top_p = PTR(const float, b->top_p);
  const int n_top = op == OP_SAMPLE_TOP;
  switch (op) {
  case OP_GATHER: return kl_gather(c, in, PTR(void, b->out), tokens, NULL);
  case OP_ARGMAX: return kl_argmax(c, in, PTR(int64_t, b->index), PTR(float, b->value), tokens, NULL);
  case OP_TOPK:
    return kl_topk(c, in, PTR(int64_t, b->index), PTR(float, b->value), PTR(float, b->lse), tokens,
                   NULL);
  default:
    return kl_sample(c, in, &p, PTR(int64_t, b->index), PTR(float, b->value),
                     n_top ? PTR(int64_t, b->top) : NULL, NULL, n_top, tokens, NULL);
  }
}
typedef struct call_arg {
  kl_ctx *ctx;
  const rank_bufs *b;
  op_id op;
  int tokens;
  rank_result r;
  int launches;
} call_arg;
static void *call_rank(void *v) {
  call_arg *a = v;
  const int before = thread_launches;
  rank_result_set(&a->r, call_op(a->ctx, a->op, a->b, a->tokens), "");
  a->launches = thread_launches - before;
  return NULL;
}
/* One call on both ranks at once; a[r] gets rank r's result. */
static void call_both(pair *p, const rank_bufs b[2], op_id op, int tokens, call_arg a[2]) {
  for (int r = 0; r < 2; r++)
    a[r] = (call_arg){.ctx = p->ctx[r], .b = &b[r], .op = op, .tokens = tokens};
  ranks_run(2, call_rank, a, sizeof *a);
}

static const char *const spec_tp2 = "return { name = 'h4', vocab_size = 2048, tp = 2, "
                                    "dtype = 'bf16', max_tokens = 4, topk = 16 }";

/* A group of two with a communicator each; 0 if it could not be made. */
static int pair_with_nccl(pair *p) {
  *p = (pair){.spec = spec_tp2, .has_nccl = {1, 1}, .jit_fail_rank = -1};
  pair_create(p);
  CHECK_KL(p->res[0] == KLRT_OK && p->res[1] == KLRT_OK, "creation: %s / %s",
           kl_result_name(p->res[0]), kl_result_name(p->res[1]));
  if (p->res[0] == KLRT_OK && p->res[1] == KLRT_OK) return 1;
  for (int i = 0; i < 2; i++)
    if (p->res[i] == KLRT_OK) kl_ctx_destroy(p->ctx[i]);
  kl_group_destroy(p->group);
  return 0;
}

/* Both ranks' path counts alike. */
static void check_counts_agree(pair *p, const char *what) {
  kl_stats st[2] = {KL_STATS_INIT, KL_STATS_INIT};
  for (int r = 0; r < 2; r++) CHECK_KL(kl_ctx_stats(p->ctx[r], &st[r]) == KLRT_OK, "kl_ctx_stats");
  CHECK_KL(st[0].oneshot == st[1].oneshot && st[0].nccl == st[1].nccl &&
           !memcmp(st[0].declined, st[1].declined, sizeof st[0].declined) &&
           st[0].sample_gathered == st[1].sample_gathered,
           "%s: the ranks count apart: one-shot %llu / %llu, NCCL %llu / %llu, gathered %llu / %llu",
           what, (unsigned long long)st[0].oneshot, (unsigned long long)st[1].oneshot,
           (unsigned long long)st[0].nccl, (unsigned long long)st[1].nccl,
           (unsigned long long)st[0].sample_gathered, (unsigned long long)st[1].sample_gathered);
}

/* Every op on the NCCL path (tokens past max_tokens) on both ranks: both
 * enter the all-gather, none is stranded, both return KLRT_OK. */
static void nccl_calls_meet(pair *p, const rank_bufs b[2], const char *when) {
  for (op_id op = 0; op < OP_COUNT; op++) {
    call_arg a[2];
    const int ag[2] = {allgathers[0], allgathers[1]}, st[2] = {stranded[0], stranded[1]};
    call_both(p, b, op, 8, a);
    CHECK_KL(a[0].r.rc == KLRT_OK && a[1].r.rc == KLRT_OK && stranded[0] == st[0] &&
                 stranded[1] == st[1] && allgathers[0] - ag[0] == 1 && allgathers[1] - ag[1] == 1,
             "%s, %s on the NCCL path: %s / %s, all-gathers %d / %d, stranded %d / %d (%s | %s)",
             when, op_names[op], kl_result_name(a[0].r.rc), kl_result_name(a[1].r.rc),
             allgathers[0] - ag[0], allgathers[1] - ag[1], stranded[0] - st[0], stranded[1] - st[1],
             a[0].r.err, a[1].r.err);
  }
}

/* The group's fault seen by rank 0's host (its mirror set: a kernel of it
 * gave up) and not yet by rank 1's. A call on the NCCL path still runs on
 * both, so neither waits in an all-gather its peer skipped; a one-shot call
 * is refused on rank 0, enqueuing nothing, and enqueued on rank 1 (its
 * kernels find the fault word on the device and write poison). The row
 * sampler after NCCL's gather is not told the fault word (its rows are
 * results); after the one-shot gather it is. */
static void fault_seen_apart(void) {
  pair p;
  if (!pair_with_nccl(&p)) return;
  rank_bufs b[2];
  rank_bufs_alloc(&b[0]), rank_bufs_alloc(&b[1]);
  nccl_calls_meet(&p, b, "no fault");
  for (int r = 0; r < 2; r++)
    CHECK_KL(!p.ctx[r]->kern[KL_K_SAMPLE].prm.sample.fault,
             "rank %d: the row sampler after NCCL's gather is given the fault word", r);
  p.ctx[0]->mirror[0] = KL_FAULT(7, 0, 1);
  nccl_calls_meet(&p, b, "rank 0 has seen the fault, rank 1 not");
  for (op_id op = 0; op < OP_COUNT; op++) {
    call_arg a[2];
    call_both(&p, b, op, 2, a);
    CHECK_KL(a[0].r.rc == KLRT_EDEVICE && a[0].launches == 0 &&
                 strstr(a[0].r.err, "waiting for rank 1") && a[1].r.rc == KLRT_OK &&
                 a[1].launches > 0,
             "%s one-shot: rank 0 (seen) %s with %d launches (%s), rank 1 %s with %d", op_names[op],
             kl_result_name(a[0].r.rc), a[0].launches, a[0].r.err, kl_result_name(a[1].r.rc),
             a[1].launches);
  }
  CHECK_KL(p.ctx[1]->kern[KL_K_SAMPLE].prm.sample.fault == kl_fault_word(p.ctx[1]),
           "the row sampler after the one-shot gather is not given the fault word");
  check_counts_agree(&p, "calls after a fault seen on one rank");
  p.ctx[1]->mirror[0] = KL_FAULT(7, 0, 1); /* its kernels saw it */
  nccl_calls_meet(&p, b, "both ranks have seen the fault");
  pair_destroy(&p);
  CHECK_KL(p.res[0] == KLRT_OK && p.res[1] == KLRT_OK, "destroy after a fault: %s / %s",
           kl_result_name(p.res[0]), kl_result_name(p.res[1]));
}

/* kl_ctx_status finds the fault in rank 0's device copy of the word before
 * any kernel of rank 0 has told its host: it reports it and keeps it, so
 * rank 0's next one-shot call is refused as status said (and stays so,
 * whatever the word reads later), while a call on the NCCL path still
 * meets on both ranks. */
static void status_keeps_fault(void) {
  pair p;
  if (!pair_with_nccl(&p)) return;
  rank_bufs b[2];
  rank_bufs_alloc(&b[0]), rank_bufs_alloc(&b[1]);
  kl_result r = kl_ctx_status(p.ctx[0]);
  CHECK_KL(r == KLRT_OK, "status before the fault: %s", kl_result_name(r));
  const CUdeviceptr word = (CUdeviceptr)kl_fault_word(p.ctx[0]);
  set_word(word, KL_FAULT(3, 1, 0)); /* rank 1 gave up waiting for rank 0 */
  r = kl_ctx_status(p.ctx[0]);
  CHECK_KL(r == KLRT_EDEVICE && strstr(kl_last_error(), "rank 1's one-shot step 3 timed out "
                                                        "waiting for rank 0"),
           "status with the device word set: %s (%s)", kl_result_name(r), kl_last_error());
  set_word(word, 0); /* what it reads later does not matter: rank 0 knows */
  call_arg a[2];
  call_both(&p, b, OP_ARGMAX, 2, a);
  CHECK_KL(a[0].r.rc == KLRT_EDEVICE && a[0].launches == 0 && a[1].r.rc == KLRT_OK,
           "one-shot after status said EDEVICE: rank 0 %s with %d launches, rank 1 %s",
           kl_result_name(a[0].r.rc), a[0].launches, kl_result_name(a[1].r.rc));
  r = kl_ctx_status(p.ctx[0]);
  CHECK_KL(r == KLRT_EDEVICE, "status once more: %s", kl_result_name(r));
  nccl_calls_meet(&p, b, "after rank 0's status found the fault");
  check_counts_agree(&p, "calls after rank 0's status found the fault");
  pair_destroy(&p);
}

/* kl_sample's size rule (docs/design/samplers.md, "Which kernel, by
 * tokens"), on one rank of a spec whose one-shot path serves every call up
 * to max_tokens: for each token count, which kernels a call launches and
 * with how many CTAs. Without filters the shard sampler, each part in the
 * most subparts (a power of two up to the group's) that keep tokens x split
 * x subparts within the group's multiprocessors and tokens x subparts
 * within max_tokens; with filters the shard sampler with filters, one CTA
 * a part, plus a CTA a token that merges it apart where tokens x (split +
 * 1) stays within the kernel's cap and its step slots; with top-n
 * logprobs the gather (one-shot, or past the crossover NCCL's), then the
 * row sampler, a CTA a row up to its cap. */
static int rule_subparts(const kl_ctx *c, int t) {
  int most = 1;
  for (int64_t s = 2; s <= c->group_subparts; s *= 2)
    if (t * s * c->layout.topk_split <= c->group_sms && t * s <= c->spec.max_tokens) most = (int)s;
  return most;
}
static int rule_merge_ctas(const kl_ctx *c, int t) {
  const int64_t ctas = (int64_t)t * c->layout.topk_split + t;
  return ctas > c->kern[KL_K_SHARDS_FILTERED].cap || ctas > c->kern[KL_K_SHARDS_FILTERED].nslots
             ? 0 : t;
}
static void expect_launches(const char *what, int t, int n, const char *kind0, int grid0,
                            const char *kind1, int grid1) {
  const char *kind[2] = {kind0, kind1};
  const int grid[2] = {grid0, grid1};
  int ok = trace_n == n;
  for (int j = 0; ok && j < n; j++)
    ok = strcmp(fn_kind(trace[j].f), kind[j]) == 0 && (grid[j] < 0 || (int)trace[j].grid == grid[j]);
  CHECK_KL(ok, "%s, %d tokens: %d launches (%s x %u, %s x %u), want %d (%s x %d, %s x %d)", what, t,
           trace_n, trace_n > 0 ? fn_kind(trace[0].f) : "-", trace_n > 0 ? trace[0].grid : 0,
           trace_n > 1 ? fn_kind(trace[1].f) : "-", trace_n > 1 ? trace[1].grid : 0, n, kind0,
           grid0, kind1 ? kind1 : "-", grid1);
}
static void sample_size_rule(void) {
  static const char *const spec = "return { name = 'rule', vocab_size = 163840, tp = 1, "
                                  "dtype = 'bf16', max_tokens = 64, topk = 64 }";
  kl_config cfg = rank_config(0, 1, 0, NULL);
  kl_ctx *c = NULL;
  kl_result r = kl_ctx_create_string(&c, spec, NULL, &cfg);
  CHECK_KL(r == KLRT_OK, "size rule: creation: %s", kl_result_name(r));
  if (r) return;
  const int most = 64;
  CUdeviceptr shard = device_buffer((size_t)most * 163840 * 2), token = device_buffer(8 * most),
              lp = device_buffer(4 * most), par = device_buffer(64 * most),
              top_i = device_buffer(8 * most), top_v = device_buffer(4 * most);
  const kl_sampling plain = {.size = sizeof(kl_sampling), .temperature = (const float *)(uintptr_t)par};
  const kl_sampling filtered = {.size = sizeof(kl_sampling), .temperature = (const float *)(uintptr_t)par,
                                .top_p = (const float *)(uintptr_t)(par + 8 * most)};
  const int split = c->layout.topk_split, cap_sample = c->kern[KL_K_SAMPLE].cap;
  for (int t = 1; t <= most; t *= 2) {
    for (int call = 0; call < 3; call++) {
      kl_stats before = KL_STATS_INIT, after = KL_STATS_INIT;
      kl_ctx_stats(c, &before);
      trace_n = 0;
      const int n_top = call == 2;
      r = kl_sample(c, (void *)(uintptr_t)shard, call == 1 ? &filtered : &plain,
                    (int64_t *)(uintptr_t)token, (float *)(uintptr_t)lp,
                    n_top ? (int64_t *)(uintptr_t)top_i : NULL,
                    n_top ? (float *)(uintptr_t)top_v : NULL, n_top, t, NULL);
      kl_ctx_stats(c, &after);
      const char *what = call == 0 ? "no filters" : call == 1 ? "top_p" : "one top logprob";
      /* a call that gathers (top-n) takes the gather's path: past the
       * crossover NCCL's, at one rank a copy */
      const int oneshot = after.oneshot == before.oneshot + 1;
      CHECK_KL(r == KLRT_OK && (oneshot || (n_top && after.nccl == before.nccl + 1)),
               "size rule, %s, %d tokens: %s, want one call on the one-shot path", what, t,
               kl_result_name(r));
      if (call == 0)
        expect_launches(what, t, 1, "shards",
                        kl_layout_select_grid(&c->layout, t * rule_subparts(c, t),
                                              c->kern[KL_K_SHARDS].cap, 1), NULL, 0);
      else if (call == 1)
        expect_launches(what, t, 1, "candidates",
                        kl_layout_select_grid(&c->layout, t, c->kern[KL_K_SHARDS_FILTERED].cap, 1) +
                            rule_merge_ctas(c, t), NULL, 0);
      else if (oneshot)
        expect_launches(what, t, 2, "oneshot", -1, "sample", t < cap_sample ? t : cap_sample);
      else
        expect_launches(what, t, 1, "sample", t < cap_sample ? t : cap_sample, NULL, 0);
    }
  }
  /* the rule's ends on this spec: subparts at one token, none where the
   * parts alone fill the multiprocessors; merges apart at one token */
  CHECK_KL(rule_subparts(c, 1) > 1 && rule_subparts(c, (c->group_sms + split - 1) / split) == 1 &&
               rule_merge_ctas(c, 1) == 1,
           "size rule: subparts %d at 1 token, %d at %d; merge CTAs %d at 1 token (split %d, "
           "group subparts %d)", rule_subparts(c, 1),
           rule_subparts(c, (c->group_sms + split - 1) / split), (c->group_sms + split - 1) / split,
           rule_merge_ctas(c, 1), split, c->group_subparts);
  kl_ctx_destroy(c);
}

int main(void) {
  make_driver();
  kl_testing_fakes(&driver, &nccl, jit);
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1); /* two ranks on one (fake) GPU */
  sample_alignment();
  sample_lists();
  failed_growth();
  nccl_on_one_rank();
  epilogue_without_kernels();
  fault_seen_apart();
  status_keeps_fault();
  pointer_reused();
  buffers_too_small();
  sample_rank();
  sample_size_rule();
  printf("test_host: %s\n", check_fail ? "FAILED" : "passed");
  return check_fail != 0;
}
