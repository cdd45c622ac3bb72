/* Host-side all-gather between the ranks of a group, used only at creation and
 * destruction: through a kl_group (ranks are threads of this process), the
 * caller's callback, or the caller's NCCL communicator. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rt.h"

#define GROUP_WAIT_S 120 /* a rank that never arrives must not hang the others forever */

struct kl_group {
  int n;
  pthread_mutex_t m;
  pthread_cond_t cv;
  unsigned long gen;
  int arrived;
  unsigned char *buf; /* n * KL_EXCHANGE_MAX */
};

kl_result kl_group_create(kl_group **out, int nranks) {
  if (!out) return kl_rt_fail(KLRT_EINVAL, "kl_group_create: group is NULL");
  *out = NULL;
  if (nranks < 1 || nranks > KL_TP_MAX)
    return kl_rt_fail(KLRT_EINVAL, "kl_group_create: nranks %d out of range (1..%d)", nranks,
                      KL_TP_MAX);
  kl_group *g = calloc(1, sizeof *g);
  if (g) g->buf = calloc((size_t)nranks, KL_EXCHANGE_MAX);
  if (!g || !g->buf) {
    free(g);
    return kl_rt_fail(KLRT_ENOMEM, "kl_group_create: out of memory");
  }
  g->n = nranks;
  pthread_mutex_init(&g->m, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  *out = g;
  return KLRT_OK;
}

int kl_group_nranks(const kl_group *g) { return g->n; }

void kl_group_destroy(kl_group *g) {
  if (!g) return;
  pthread_mutex_destroy(&g->m);
  pthread_cond_destroy(&g->cv);
  free(g->buf);
  free(g);
}

/* Generation barrier with a deadline; call with g->m held. */
static int barrier(kl_group *g, char *why) {
  unsigned long gen = g->gen;
  if (++g->arrived == g->n) {
    g->arrived = 0;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    return 0;
  }
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += GROUP_WAIT_S;
  while (gen == g->gen) {
    if (pthread_cond_timedwait(&g->cv, &g->m, &until) == ETIMEDOUT && gen == g->gen) {
      g->arrived--;
      snprintf(why, KL_WHY_MAX, "group: only %d of %d ranks arrived within %d s", g->arrived + 1,
               g->n, GROUP_WAIT_S);
      return -1;
    }
  }
  return 0;
}

static int group_exchange(kl_exchange *ex, const void *mine, void *all, size_t bytes,
                          char *why) {
  kl_group *g = ex->group;
  pthread_mutex_lock(&g->m);
  memcpy(g->buf + (size_t)ex->rank * KL_EXCHANGE_MAX, mine, bytes);
  int rc = barrier(g, why);
  if (rc == 0) {
    for (int r = 0; r < g->n; r++)
      memcpy((char *)all + (size_t)r * bytes, g->buf + (size_t)r * KL_EXCHANGE_MAX, bytes);
    rc = barrier(g, why); /* nobody refills buf before everyone has read it */
  }
  pthread_mutex_unlock(&g->m);
  return rc;
}

static int nccl_exchange(kl_exchange *ex, const void *mine, void *all, size_t bytes,
                         char *why) {
  const kl_cu *cu = ex->cu;
  CUdeviceptr d = 0;
  CUresult r = cu->cuMemAlloc(&d, bytes * (size_t)(ex->nranks + 1));
  if (r != CUDA_SUCCESS) {
    snprintf(why, KL_WHY_MAX, "exchange: cuMemAlloc: %s", kl_cu_errstr(r));
    return -1;
  }
  CUdeviceptr recv = d + bytes;
  int rc = -1;
  ncclResult_t nr = ncclSuccess;
  if ((r = cu->cuMemcpyHtoDAsync(d, mine, bytes, ex->stream)) == CUDA_SUCCESS &&
      (nr = ex->nccl_api->ncclAllGather((const void *)d, (void *)recv, bytes, ncclUint8, ex->nccl,
                          (cudaStream_t)ex->stream)) == ncclSuccess &&
      (r = cu->cuMemcpyDtoHAsync(all, recv, bytes * (size_t)ex->nranks, ex->stream)) ==
          CUDA_SUCCESS &&
      (r = cu->cuStreamSynchronize(ex->stream)) == CUDA_SUCCESS)
    rc = 0;
  else if (nr != ncclSuccess)
    snprintf(why, KL_WHY_MAX, "exchange: ncclAllGather: %s", ex->nccl_api->ncclGetErrorString(nr));
  else
    snprintf(why, KL_WHY_MAX, "exchange: %s", kl_cu_errstr(r));
  cu->cuMemFree(d);
  return rc;
}

int kl_exchange_all(kl_exchange *ex, const void *mine, void *all, size_t bytes, char *why) {
  if (bytes > KL_EXCHANGE_MAX) {
    snprintf(why, KL_WHY_MAX, "exchange: %zu bytes is too large", bytes);
    return -1;
  }
  if (ex->nranks == 1) {
    memcpy(all, mine, bytes);
    return 0;
  }
  if (ex->group) return group_exchange(ex, mine, all, bytes, why);
  if (ex->fn) {
    if (ex->fn(mine, all, bytes, ex->user) == 0) return 0;
    snprintf(why, KL_WHY_MAX, "exchange: the all-gather callback failed");
    return -1;
  }
  if (ex->nccl) return nccl_exchange(ex, mine, all, bytes, why);
  snprintf(why, KL_WHY_MAX, "exchange: no group, callback or NCCL communicator");
  return -1;
}
