/* Transport (DESIGN §7): receive buffers shared across the ranks, and the
 * collective agreement on whether the one-shot path is ready on all of them.
 *
 * Two exchanges at creation. Round 1 carries each rank's identity, spec
 * fingerprint, compile result and buffer handle; every rank then maps its
 * peers. Round 2 carries the mapping result, KLGEN_DISABLE and the crossover
 * limit. Every rank sees the same data, so every rank reaches the same
 * decision: the dispatch can never split (DESIGN §8). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt.h"

#define INFO_MAGIC 0x4b4c5254u /* "KLRT" */
#define INFO_VERSION 1u
#define PEER_WHY 160 /* a reason travels with the exchange: bounded */

typedef struct peer_info {
  uint32_t magic, version;
  int32_t rank, nranks;
  uint64_t fingerprint, host, pid;
  int32_t usable; /* compiled, loaded, allocated */
  uint8_t uuid[16];
  uint64_t ptr;
  CUipcMemHandle handle;
  char why[PEER_WHY];
} peer_info;

typedef struct agree_info {
  int32_t mapped, disabled, has_nccl;
  int64_t crossover;
  char why[PEER_WHY];
} agree_info;

static uint64_t hash_str(const char *s) { return kl_fnv1a(KL_FNV_BASIS, s, strlen(s)); }

/* Ranks must run the very same kernel: same spec, same derived layout. */
static uint64_t fingerprint(const kl_ctx *c) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s|%lld|%lld|%d|%d|%lld|%d|%d|%lld", c->spec.name,
           (long long)c->spec.vocab_size, (long long)c->layout.padded_vocab, c->spec.tp,
           (int)c->spec.dtype, (long long)c->spec.max_tokens, c->layout.vec_bytes,
           c->layout.block, (long long)c->layout.total_bytes);
  return hash_str(buf);
}

static uint64_t host_id(void) {
  char h[256] = "";
  gethostname(h, sizeof h - 1);
  return hash_str(h);
}

/* Receive buffers filled with the sentinel, and a zeroed state block. */
static int alloc_buffers(kl_ctx *c, char *why) {
  const kl_cu *cu = c->cu;
  CUresult r;
  /* kl_state, then one 8-byte step slot per CTA the kernel may be launched
   * with, all zero (kl_abi.h). */
  kl_state header = {0};
  header.timeout_ns = (unsigned long long)c->layout.timeout_ns;
  size_t state_bytes = sizeof header + 8 * (size_t)c->layout.max_ctas;
  if ((r = cu->cuMemAlloc(&c->recv, (size_t)c->layout.total_bytes)) != CUDA_SUCCESS ||
      (r = cu->cuMemAlloc(&c->state, state_bytes)) != CUDA_SUCCESS ||
      (r = cu->cuMemsetD32(c->recv, c->layout.sentinel32, (size_t)c->layout.total_bytes / 4)) != CUDA_SUCCESS ||
      (r = cu->cuMemsetD32(c->state, 0, state_bytes / 4)) != CUDA_SUCCESS ||
      (r = cu->cuMemcpyHtoD(c->state, &header, sizeof header)) != CUDA_SUCCESS ||
      (r = cu->cuCtxSynchronize()) != CUDA_SUCCESS) {
    snprintf(why, PEER_WHY, "rank %d: receive buffers (%lld bytes): %s", c->rank,
             (long long)c->layout.total_bytes, kl_cu_errstr(r));
    return -1;
  }
  return 0;
}

static void fill_info(kl_ctx *c, peer_info *me, int usable, const char *why) {
  memset(me, 0, sizeof *me);
  me->magic = INFO_MAGIC;
  me->version = INFO_VERSION;
  me->rank = c->rank;
  me->nranks = c->nranks;
  me->fingerprint = fingerprint(c);
  me->host = host_id();
  me->pid = (uint64_t)getpid();
  CUuuid u;
  if (c->cu->cuDeviceGetUuid(&u, c->dev) == CUDA_SUCCESS) memcpy(me->uuid, u.bytes, 16);
  /* Threads of one process share pointers; other processes need an IPC handle. */
  if (usable && c->nranks > 1 && c->ex.group == NULL &&
      c->cu->cuIpcGetMemHandle(&me->handle, c->recv) != CUDA_SUCCESS) {
    usable = 0;
    why = "cuIpcGetMemHandle failed";
  }
  me->usable = usable;
  me->ptr = (uint64_t)c->recv;
  if (!usable) snprintf(me->why, sizeof me->why, "%s", why ? why : "?");
}

/* Round 1 consistency: a mismatch is a configuration error on every rank. */
static kl_result check_group(const kl_ctx *c, const peer_info *all) {
  for (int r = 0; r < c->nranks; r++) {
    const peer_info *p = &all[r];
    if (p->magic != INFO_MAGIC || p->version != INFO_VERSION)
      return kl_rt_fail(KLRT_ESPEC, "rank %d is not a compatible libklrt", r);
    if (p->rank != r || p->nranks != c->nranks)
      return kl_rt_fail(KLRT_EINVAL, "slot %d holds rank %d of %d: every rank needs a distinct "
                        "rank in 0..%d and the same nranks", r, p->rank, p->nranks, c->nranks - 1);
    if (p->fingerprint != all[0].fingerprint)
      return kl_rt_fail(KLRT_ESPEC, "rank %d was created with a different spec than rank 0", r);
  }
  return KLRT_OK;
}

static int find_device(const kl_cu *cu, const uint8_t uuid[16], CUdevice *dev) {
  int n = 0;
  cu->cuDeviceGetCount(&n);
  for (int i = 0; i < n; i++) {
    CUuuid u;
    if (cu->cuDeviceGet(dev, i) == CUDA_SUCCESS && cu->cuDeviceGetUuid(&u, *dev) == CUDA_SUCCESS &&
        memcmp(u.bytes, uuid, 16) == 0)
      return 0;
  }
  return -1;
}

/* Peer r's buffer in this rank's address space. 0, or -1 with why. */
static int map_peer(kl_ctx *c, const peer_info *p, char *why) {
  const kl_cu *cu = c->cu;
  CUdevice pdev;
  if (find_device(cu, p->uuid, &pdev) != 0) {
    snprintf(why, PEER_WHY, "rank %d: rank %d's GPU is not visible here (multi-node NVLink is not "
             "supported)", c->rank, p->rank);
    return -1;
  }
  if (pdev != c->dev) {
    int can = 0;
    cu->cuDeviceCanAccessPeer(&can, c->dev, pdev);
    if (!can) {
      snprintf(why, PEER_WHY, "rank %d: no peer access from GPU %d to rank %d's GPU", c->rank,
               c->ordinal, p->rank);
      return -1;
    }
  }
  int same_process = p->host == host_id() && p->pid == (uint64_t)getpid();
  if (same_process) {
    if (pdev != c->dev) {
      CUcontext pctx;
      CUresult r = cu->cuDevicePrimaryCtxRetain(&pctx, pdev);
      if (r == CUDA_SUCCESS) {
        r = cu->cuCtxEnablePeerAccess(pctx, 0);
        cu->cuDevicePrimaryCtxRelease(pdev); /* the peer rank holds its own reference */
      }
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        snprintf(why, PEER_WHY, "rank %d: enabling peer access to rank %d: %s", c->rank, p->rank,
                 kl_cu_errstr(r));
        return -1;
      }
    }
    c->peers[p->rank] = (CUdeviceptr)p->ptr;
    return 0;
  }
  CUresult r = cu->cuIpcOpenMemHandle(&c->peers[p->rank], p->handle,
                                      CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (r != CUDA_SUCCESS) {
    snprintf(why, PEER_WHY, "rank %d: cuIpcOpenMemHandle for rank %d: %s", c->rank, p->rank,
             kl_cu_errstr(r));
    return -1;
  }
  c->ipc_opened[p->rank] = 1;
  return 0;
}

/* Ranks whose buffers live on this rank's GPU, this one included. */
static int ranks_on_device(const kl_ctx *c, const peer_info *all) {
  int n = 0;
  for (int r = 0; r < c->nranks; r++)
    if (all[r].host == all[c->rank].host && memcmp(all[r].uuid, all[c->rank].uuid, 16) == 0) n++;
  return n;
}

/* Several ranks on one GPU need their streams in separate hardware queues.
 * The driver maps streams round robin onto CUDA_DEVICE_MAX_CONNECTIONS
 * queues (8 by default), and a queue runs in order: a rank whose next kernel
 * waits behind its spinning one-shot grid blocks any peer work queued after it
 * in the same queue, so the grid spins until the poll limit. Measured on one
 * H200 with 8 ranks: with 1 queue every run stalls at step 1; with 8 now and
 * then; with 32 never. 32 is the driver's maximum. */
#define KL_SHARED_GPU_QUEUES 32
static int queues_ok(const kl_ctx *c, int on_device, char *why) {
  int given;
  long long v = kl_param_int(KL_P_MAX_CONNECTIONS, &given);
  if (on_device < 2 || v >= KL_SHARED_GPU_QUEUES) return 1;
  snprintf(why, PEER_WHY, "rank %d: %d ranks share this GPU: set CUDA_DEVICE_MAX_CONNECTIONS=%d "
           "before CUDA starts (it is %lld%s)", c->rank, on_device, KL_SHARED_GPU_QUEUES, v,
           given ? "" : ", unset");
  return 0;
}

/* CTAs per rank such that every rank's CTAs on this GPU are resident at once:
 * a spinning CTA must never keep a peer's unscheduled CTA off the GPU. */
static int residency_cap(kl_ctx *c, int on_device) {
  int per_sm = 0;
  if (c->cu->cuOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, c->oneshot, c->layout.block, 0) !=
      CUDA_SUCCESS)
    return 0;
  /* With PDL a rank's next grid may become resident while this one runs: the
   * kernel lets it launch once past its own PDL wait, that is once the grid
   * before has finished, so at most two grids per rank are resident at once.
   * Alone on a GPU a rank cannot starve itself; sharing one, it could starve
   * a peer. */
  int grids = on_device > 1 && c->pdl ? 2 * on_device : on_device;
  return per_sm * c->sm_count / (grids ? grids : 1);
}

static void unmap_all(kl_ctx *c) {
  for (int r = 0; r < c->nranks; r++) {
    if (c->ipc_opened[r]) c->cu->cuIpcCloseMemHandle(c->peers[r]);
    c->ipc_opened[r] = 0;
    c->peers[r] = 0;
  }
}

static void free_buffers(kl_ctx *c) {
  if (c->recv) c->cu->cuMemFree(c->recv);
  if (c->state) c->cu->cuMemFree(c->state);
  c->recv = c->state = 0;
}

/* One launch of each kernel with no work, here, where a slow first launch
 * (lazy loading of the code) costs nothing: in a step it would make this rank
 * late and its peers' grids spin. tokens = 0 moves nothing; it advances the
 * step slots once, on every rank alike. */
static int warm_up(kl_ctx *c, char *why) {
  kl_relayout_args none = {NULL, NULL, 0, 0};
  void *rl[] = {&none};
  CUresult r = kl_launch_oneshot(c, 0, 0, 0, 1, c->stream);
  if (r == CUDA_SUCCESS)
    r = c->cu->cuLaunchKernel(c->relayout, 1, 1, 1, (unsigned)c->layout.relayout_block, 1, 1, 0,
                              c->stream, rl, NULL);
  if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
  if (r != CUDA_SUCCESS) {
    snprintf(why, PEER_WHY, "rank %d: first launch of the kernels: %s", c->rank, kl_cu_errstr(r));
    return -1;
  }
  return 0;
}

static int map_all(kl_ctx *c, const peer_info *all, char *why) {
  for (int r = 0; r < c->nranks; r++) {
    if (!all[r].usable) {
      snprintf(why, PEER_WHY, "%s", all[r].why);
      return -1;
    }
  }
  c->peers[c->rank] = c->recv;
  for (int r = 0; r < c->nranks; r++)
    if (r != c->rank && map_peer(c, &all[r], why) != 0) return -1;
  int on_device = ranks_on_device(c, all);
  if (!queues_ok(c, on_device, why)) return -1;
  c->cta_cap = residency_cap(c, on_device);
  if (c->cta_cap < 1) {
    snprintf(why, PEER_WHY, "rank %d: the one-shot kernel cannot be resident", c->rank);
    return -1;
  }
  c->nslots = kl_layout_grid(&c->layout, (int)c->spec.max_tokens, c->cta_cap);
  return warm_up(c, why);
}

kl_result kl_transport_setup(kl_ctx *c, int compiled, const char *compile_why) {
  char why[KL_WHY_MAX] = "";
  int usable = compiled && alloc_buffers(c, why) == 0;
  peer_info *all = calloc((size_t)c->nranks, sizeof *all);
  agree_info *agree = calloc((size_t)c->nranks, sizeof *agree);
  if (!all || !agree) {
    free(all), free(agree);
    return kl_rt_fail(KLRT_ENOMEM, "out of memory");
  }
  peer_info me;
  fill_info(c, &me, usable, compiled ? why : compile_why);
  kl_result res = KLRT_OK;
  if (kl_exchange_all(&c->ex, &me, all, sizeof me, why) != 0) {
    res = kl_rt_fail(KLRT_ENCCL, "rank %d: %s", c->rank, why);
    goto out;
  }
  if ((res = check_group(c, all)) != KLRT_OK) goto out;
  agree_info mine = {0};
  mine.mapped = map_all(c, all, mine.why) == 0;
  mine.disabled = (int32_t)kl_param_int(KL_P_DISABLE, NULL);
  mine.has_nccl = c->nccl != NULL || c->nranks == 1;
  mine.crossover = kl_crossover(c->arch, c->nranks, c->layout.shard_bytes, c->crossover_cfg,
                                c->cache_dir[0] ? c->cache_dir : NULL, &c->crossover_from);
  if (kl_exchange_all(&c->ex, &mine, agree, sizeof mine, why) != 0) {
    res = kl_rt_fail(KLRT_ENCCL, "rank %d: %s", c->rank, why);
    goto out;
  }
  c->ready = 1;
  c->nccl_everywhere = 1;
  c->crossover = agree[0].crossover;
  for (int r = 0; r < c->nranks; r++) {
    c->disabled |= agree[r].disabled;
    c->nccl_everywhere &= agree[r].has_nccl;
    if (agree[r].crossover < c->crossover) c->crossover = agree[r].crossover;
    if (!agree[r].mapped && c->ready) {
      c->ready = 0;
      snprintf(c->stats.not_ready, sizeof c->stats.not_ready, "%s", agree[r].why);
    }
  }
out:
  if (!c->ready || res != KLRT_OK) {
    unmap_all(c);
    free_buffers(c);
    c->ready = 0;
  }
  free(all);
  free(agree);
  return res;
}

void kl_transport_teardown(kl_ctx *c) {
  unmap_all(c);
  free_buffers(c);
}
