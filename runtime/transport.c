/* Transport (docs/design/oneshot.md): receive buffers shared across the ranks, and the
 * collective agreement on whether the one-shot path is ready on all of them.
 *
 * Two exchanges at creation. Round 1 carries each rank's identity, spec
 * fingerprint, compile result and buffer handle; every rank then maps its
 * peers. Round 2 carries the mapping result, KLGEN_DISABLE and the crossover
 * limit. Every rank sees the same data, so every rank reaches the same
 * decision: the dispatch can never split (docs/design/dispatch.md, "The path rule"). */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "rt.h"


static uint64_t hash_str(const char *s) { return kl_fnv1a(KL_FNV_BASIS, s, strlen(s)); }

/* Ranks must run the very same kernel with the same limits, from the same
 * libklrt: the spec, its derived layout, the kernel source, the poll limit. */
uint64_t kl_fingerprint(const kl_spec *s, const kl_layout *l, uint64_t source_hash) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s|%s|%d|%lld|%lld|%d|%d|%lld|%d|%d|%lld|%lld|%d|%016llx",
           KLRT_VERSION, s->name, KL_ABI_VERSION, (long long)s->vocab_size,
           (long long)l->padded_vocab, s->tp, (int)s->dtype, (long long)s->max_tokens,
           l->vec_bytes, l->block, (long long)l->recv_bytes, (long long)l->timeout_ns, s->topk,
           (unsigned long long)source_hash);
  return hash_str(buf);
}

/* A random number drawn once per process: it tells ranks in this process
 * (which share pointers) from ranks in others. Host name and pid do not:
 * containers on one host share both. */
static uint64_t nonce;
static pthread_once_t nonce_once = PTHREAD_ONCE_INIT;
static void draw_nonce(void) {
  uint64_t n = 0;
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    if (read(fd, &n, sizeof n) != (ssize_t)sizeof n) n = 0;
    close(fd);
  }
  /* no /dev/urandom: the address of a stack variable, time and pid */
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  uint64_t mix[4] = {n, (uint64_t)(uintptr_t)&t, (uint64_t)t.tv_nsec ^ (uint64_t)t.tv_sec,
                     (uint64_t)getpid()};
  nonce = kl_fnv1a(KL_FNV_BASIS, mix, sizeof mix) ^ n;
}
static uint64_t process_nonce(void) {
  pthread_once(&nonce_once, draw_nonce);
  return nonce;
}

/* Receive buffers filled with the sentinel but for the group's fault word (0),
 * a zeroed state block, and the fault word's host mirror (kl_abi.h). */
static int alloc_buffers(kl_ctx *c, char *why) {
  const kl_cu *cu = c->cu;
  CUresult r;
  /* kl_state, then one 8-byte step slot per CTA the one-shot kernel may be
   * launched with, then one per select CTA, all zero (kl_abi.h). */
  kl_state header = {0};
  header.timeout_ns = (unsigned long long)c->layout.timeout_ns;
  size_t state_bytes = sizeof header + 8 * ((size_t)c->layout.max_ctas + (size_t)c->layout.sel_max_ctas);
  size_t recv_bytes = (size_t)c->layout.recv_bytes;
  void *mirror = NULL;
  if ((r = cu->cuMemAllocHost(&mirror, 2 * sizeof(uint64_t))) == CUDA_SUCCESS) {
    /* pinned memory is mapped at the same address on the device (UVA); the
     * second word counts kl_sample's calls that sampled a row whole on the
     * device (kl_abi.h's kl_state) */
    c->mirror = mirror;
    c->mirror[0] = c->mirror[1] = 0;
    header.mirror = (unsigned long long *)mirror;
  }
  if (r != CUDA_SUCCESS ||
      (r = cu->cuMemAlloc(&c->recv, recv_bytes)) != CUDA_SUCCESS ||
      (r = cu->cuMemAlloc(&c->state, state_bytes)) != CUDA_SUCCESS ||
      (r = cu->cuMemsetD32(c->recv, c->layout.sentinel32, recv_bytes / 4)) != CUDA_SUCCESS ||
      (r = cu->cuMemsetD32(c->recv + (size_t)c->layout.fault_offset, 0, KL_FAULT_BYTES / 4)) !=
          CUDA_SUCCESS ||
      (r = cu->cuMemsetD32(c->state, 0, state_bytes / 4)) != CUDA_SUCCESS ||
      (r = cu->cuMemcpyHtoD(c->state, &header, sizeof header)) != CUDA_SUCCESS ||
      (r = cu->cuCtxSynchronize()) != CUDA_SUCCESS) {
    snprintf(why, KL_PEER_WHY, "rank %d: receive buffers (%lld bytes): %s", c->rank,
             (long long)c->layout.recv_bytes, kl_cu_errstr(r));
    return -1;
  }
  return 0;
}

static void fill_info(kl_ctx *c, peer_info *me, int usable, const char *why) {
  memset(me, 0, sizeof *me);
  me->magic = KL_INFO_MAGIC;
  me->version = KL_INFO_VERSION;
  me->rank = c->rank;
  me->nranks = c->nranks;
  me->fingerprint = kl_fingerprint(&c->spec, &c->layout, c->source_hash);
  me->nonce = process_nonce();
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
  if (!usable) snprintf(me->why, sizeof me->why, "%.*s", (int)sizeof me->why - 1, why ? why : "?");
}

/* Round 1 consistency: a mismatch is a configuration error on every rank.
 * Nothing a peer sent is trusted: strings are cut at their buffer's end. */
static kl_result check_group(const kl_ctx *c, peer_info *all) {
  for (int r = 0; r < c->nranks; r++) {
    peer_info *p = &all[r];
    p->why[KL_PEER_WHY - 1] = 0;
    if (p->magic != KL_INFO_MAGIC || p->version != KL_INFO_VERSION)
      return kl_rt_fail(KLRT_ESPEC, "rank %d is not a compatible libklrt", r);
    if (p->usable != 0 && p->usable != 1)
      return kl_rt_fail(KLRT_ESPEC, "rank %d sent a malformed exchange record", r);
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
    snprintf(why, KL_PEER_WHY, "rank %d: rank %d's GPU is not visible here (multi-node NVLink is not "
             "supported)", c->rank, p->rank);
    return -1;
  }
  if (pdev != c->dev) {
    int can = 0;
    cu->cuDeviceCanAccessPeer(&can, c->dev, pdev);
    if (!can) {
      snprintf(why, KL_PEER_WHY, "rank %d: no peer access from GPU %d to rank %d's GPU", c->rank,
               c->ordinal, p->rank);
      return -1;
    }
  }
  int same_process = p->nonce == process_nonce();
  if (same_process) {
    if (pdev != c->dev) {
      CUcontext pctx;
      CUresult r = cu->cuDevicePrimaryCtxRetain(&pctx, pdev);
      if (r == CUDA_SUCCESS) {
        r = cu->cuCtxEnablePeerAccess(pctx, 0);
        cu->cuDevicePrimaryCtxRelease(pdev); /* the peer rank holds its own reference */
      }
      if (r != CUDA_SUCCESS && r != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        snprintf(why, KL_PEER_WHY, "rank %d: enabling peer access to rank %d: %s", c->rank, p->rank,
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
    snprintf(why, KL_PEER_WHY, "rank %d: cuIpcOpenMemHandle for rank %d: %s", c->rank, p->rank,
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
    if (memcmp(all[r].uuid, all[c->rank].uuid, 16) == 0) n++; /* UUIDs are unique */
  return n;
}

/* Several ranks on one GPU need their streams in separate hardware queues.
 * The driver maps streams round robin onto CUDA_DEVICE_MAX_CONNECTIONS
 * queues (8 by default), and a queue runs in order: a rank whose next kernel
 * waits behind its spinning one-shot grid blocks any peer work queued after it
 * in the same queue, so the grid spins until the poll limit. The fewer the
 * queues, the likelier two ranks' streams share one; 32, the driver's
 * maximum, leaves the most room. */
#define KL_SHARED_GPU_QUEUES 32
static int queues_ok(const kl_ctx *c, int on_device, char *why) {
  int given;
  long long v = kl_param_int(KL_P_MAX_CONNECTIONS, &given);
  if (on_device < 2 || v >= KL_SHARED_GPU_QUEUES) return 1;
  snprintf(why, KL_PEER_WHY, "rank %d: %d ranks share this GPU: set CUDA_DEVICE_MAX_CONNECTIONS=%d "
           "before CUDA starts (it is %lld%s)", c->rank, on_device, KL_SHARED_GPU_QUEUES, v,
           given ? "" : ", unset");
  return 0;
}

static void unmap_all(kl_ctx *c) {
  for (int r = 0; r < c->nranks; r++) {
    if (c->ipc_opened[r]) c->cu->cuIpcCloseMemHandle(c->peers[r]);
    c->ipc_opened[r] = 0;
    c->peers[r] = 0;
  }
  kl_kernels_set_peers(c);
}

static void free_buffers(kl_ctx *c) {
  if (c->recv) c->cu->cuMemFree(c->recv);
  if (c->state) c->cu->cuMemFree(c->state);
  if (c->mirror) c->cu->cuMemFreeHost((void *)c->mirror);
  c->recv = c->state = 0;
  c->mirror = NULL;
}

static int map_all(kl_ctx *c, const peer_info *all, char *why) {
  for (int r = 0; r < c->nranks; r++) {
    if (!all[r].usable) {
      snprintf(why, KL_PEER_WHY, "%s", all[r].why);
      return -1;
    }
  }
  c->peers[c->rank] = c->recv;
  for (int r = 0; r < c->nranks; r++)
    if (r != c->rank && map_peer(c, &all[r], why) != 0) return -1;
  int on_device = ranks_on_device(c, all);
  if (!queues_ok(c, on_device, why)) return -1;
  /* Without PDL when ranks share the GPU: PDL lets a rank's next grid become
   * resident while its current one runs, and on a shared GPU those waiting
   * grids can hold what a peer's current grid needs to be resident, so the
   * peer is late and every rank's poll times out (tests/diff/'s random
   * cases with several ranks a GPU find it). A rank alone on its GPU keeps
   * it. */
  if (on_device > 1) c->pdl = 0;
  return kl_kernels_ready(c, on_device, why);
}

/* Round 2 consistency: flags are 0 or 1, a crossover is a byte count. */
static kl_result check_agreement(const kl_ctx *c, agree_info *agree) {
  for (int r = 0; r < c->nranks; r++) {
    agree_info *a = &agree[r];
    a->why[KL_PEER_WHY - 1] = 0;
    if (((a->mapped | a->disabled | a->has_nccl | a->has_kernels) & ~1) || a->sm_count < 1 ||
        a->subparts_cfg < kl_params[KL_P_SHARD_SUBPARTS].lo ||
        a->subparts_cfg > kl_params[KL_P_SHARD_SUBPARTS].hi)
      return kl_rt_fail(KLRT_ESPEC, "rank %d sent a malformed agreement record", r);
    if (a->crossover < 0)
      return kl_rt_fail(KLRT_EINVAL, "rank %d reports a crossover of %lld bytes (must be >= 0)",
                        r, (long long)a->crossover);
  }
  return KLRT_OK;
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
  mine.has_kernels = c->mod != NULL;
  mine.crossover = kl_crossover(c->arch, c->nranks, c->layout.shard_bytes, c->crossover_cfg,
                                c->cache_dir[0] ? c->cache_dir : NULL, &c->crossover_from);
  mine.sm_count = c->sm_count > 0 ? c->sm_count : 1;
  mine.subparts_cfg = (int32_t)kl_param_int(KL_P_SHARD_SUBPARTS, NULL);
  if (kl_exchange_all(&c->ex, &mine, agree, sizeof mine, why) != 0) {
    res = kl_rt_fail(KLRT_ENCCL, "rank %d: %s", c->rank, why);
    goto out;
  }
  if ((res = check_agreement(c, agree)) != KLRT_OK) goto out;
  c->ready = 1;
  c->nccl_everywhere = c->kernels_everywhere = 1;
  c->crossover = agree[0].crossover;
  c->group_sms = agree[0].sm_count;
  int subparts = c->layout.shard_subparts;
  for (int r = 0; r < c->nranks; r++) {
    if (agree[r].sm_count < c->group_sms) c->group_sms = agree[r].sm_count;
    if (agree[r].subparts_cfg < subparts) subparts = agree[r].subparts_cfg;
    c->disabled |= agree[r].disabled;
    c->nccl_everywhere &= agree[r].has_nccl;
    c->kernels_everywhere &= agree[r].has_kernels;
    if (agree[r].crossover < c->crossover) c->crossover = agree[r].crossover;
    if (!agree[r].mapped && c->ready) {
      c->ready = 0;
      snprintf(c->stats.not_ready, sizeof c->stats.not_ready, "%s", agree[r].why);
    }
  }
  c->group_subparts = subparts >= 4 ? 4 : subparts >= 2 ? 2 : 1; /* the kernel's: 1, 2 or 4 */
out:
  if (!c->ready || res != KLRT_OK) {
    kl_transport_teardown(c);
    c->ready = 0;
  }
  free(all);
  free(agree);
  return res;
}

void kl_transport_teardown(kl_ctx *c) {
  unmap_all(c);
  free_buffers(c);
  kl_kernels_forget(c);
}
