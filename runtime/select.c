/* kl_argmax and kl_topk (docs/DESIGN.md §11): the select kernel in one-shot
 * mode when it can serve the call; otherwise the same kernel in reduce mode,
 * an NCCL all-gather of the records, and the kernel in merge mode. Both paths
 * merge the same records with the same code, so they give the same results.
 * The choice is the gather's rule (kl_path_for) without the size limit:
 * records are a few bytes a row, never worth NCCL's latency. */
#include <stdint.h>
#include <string.h>

#include "rt.h"

/* A rank's records for `tokens` rows: the region's split, which is the
 * larger one, so one scratch serves both kernels. */
static size_t record_bytes(const kl_ctx *c, long long tokens) {
  return (size_t)tokens * (size_t)c->layout.rec_split * (size_t)c->layout.rec_chunks * 16;
}

size_t kl_select_scratch_bytes(const kl_ctx *c, long long tokens) {
  return record_bytes(c, tokens) * (size_t)(1 + c->nranks);
}

CUresult kl_launch_select(kl_ctx *c, CUfunction f, const kl_select_args *a, int grid,
                          CUstream s) {
  c->sprm.a = *a; /* the peers were set at mapping; the launch copies the parameter */
  void *args[] = {&c->sprm};
  CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
  attr.value.programmaticStreamSerializationAllowed = 1;
  int pdl = c->pdl && a->mode == KL_SELECT_ONESHOT;
  CUlaunchConfig cfg = {.gridDimX = (unsigned)grid, .gridDimY = 1, .gridDimZ = 1,
                        .blockDimX = (unsigned)c->layout.sel_block, .blockDimY = 1,
                        .blockDimZ = 1, .hStream = s, .attrs = &attr, .numAttrs = pdl ? 1 : 0};
  return c->cu->cuLaunchKernelEx(&cfg, f, args, NULL);
}

static kl_result launched(CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return KLRT_OK;
  return kl_rt_fail(KLRT_ECUDA, "launching the select kernel (%s): %s", what, kl_cu_errstr(r));
}

unsigned long long *kl_select_slots(const kl_ctx *c) {
  return (unsigned long long *)(c->state + sizeof(kl_state) + 8 * (size_t)c->layout.max_ctas);
}

static kl_result oneshot(kl_ctx *c, CUfunction f, kl_select_args *a, CUstream s) {
  a->mode = KL_SELECT_ONESHOT;
  a->state = (kl_state *)c->state;
  a->fault = kl_fault_word(c);
  a->slots = kl_select_slots(c);
  a->nslots = c->sel_nslots;
  int topk = f == c->topk;
  int grid = kl_layout_select_grid(&c->layout, a->tokens, topk ? c->topk_cap : c->argmax_cap, topk);
  return launched(kl_launch_select(c, f, a, grid, s), "one-shot");
}

static kl_result nccl_path(kl_ctx *c, CUfunction f, kl_select_args *a, CUstream s) {
  /* Agreed at creation, so every rank refuses alike: a rank that returned
   * here while its peers entered the all-gather would leave them waiting. */
  if (!c->select_everywhere)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: the NCCL path of kl_argmax/kl_topk needs the "
                      "generated select kernels on every rank, and some rank could not build "
                      "them (%s)", c->rank, c->stats.not_ready);
  if (!c->nccl && c->nranks > 1)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: the one-shot path cannot serve this call "
                      "and the context has no NCCL communicator for the fallback", c->rank);
  size_t rec = record_bytes(c, a->tokens);
  long long most = a->tokens > c->spec.max_tokens ? a->tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, &c->sel_scratch, &c->sel_scratch_bytes,
                            kl_select_scratch_bytes(c, a->tokens),
                            kl_select_scratch_bytes(c, most), s, "select scratch");
  if (res) return res;
  CUdeviceptr mine = c->sel_scratch, all = c->sel_scratch + rec;
  a->mode = KL_SELECT_REDUCE;
  a->rec = (void *)mine;
  int grid = kl_layout_select_grid(&c->layout, a->tokens, 0, f == c->topk);
  if ((res = launched(kl_launch_select(c, f, a, grid, s), "reduce")))
    return res;
  if (c->nranks == 1) {
    if ((res = kl_copy(c, all, mine, rec, s))) return res;
  } else {
    ncclResult_t nr = c->nccl_api->ncclAllGather((const void *)mine, (void *)all, rec, ncclUint8,
                                                 c->nccl, (cudaStream_t)s);
    if (nr != ncclSuccess)
      return kl_rt_fail(KLRT_ENCCL, "ncclAllGather: %s", c->nccl_api->ncclGetErrorString(nr));
  }
  a->mode = KL_SELECT_MERGE;
  a->rec = (void *)all;
  return launched(kl_launch_select(c, f, a, a->tokens, s), "merge");
}

/* The outputs: device memory on this GPU, aligned for their type, apart. */
static kl_result check_outputs(kl_ctx *c, int k, const int64_t *index, const float *value,
                               const float *lse, int tokens) {
  kl_result res;
  size_t n = (size_t)tokens * (size_t)k;
  if ((uintptr_t)index % 8 || (uintptr_t)value % 4 || (uintptr_t)lse % 4)
    return kl_rt_fail(KLRT_EINVAL, "index must be 8-byte aligned, value and lse 4-byte aligned");
  if ((res = kl_check_ptr(c, index, &c->checked_index, "index")) ||
      (value && (res = kl_check_ptr(c, value, &c->checked_value, "value"))) ||
      (lse && (res = kl_check_ptr(c, lse, &c->checked_lse, "lse"))))
    return res;
  uintptr_t i = (uintptr_t)index, v = (uintptr_t)value, l = (uintptr_t)lse;
  if ((value && kl_overlaps(i, n * 8, v, n * 4)) || (lse && kl_overlaps(i, n * 8, l, tokens * 4u)) ||
      (value && lse && kl_overlaps(v, n * 4, l, tokens * 4u)))
    return kl_rt_fail(KLRT_EINVAL, "index, value and lse overlap");
  return KLRT_OK;
}

/* The input as the kernel reads it: aligned, and apart from the outputs
 * (a merging CTA writes them while others may still read input rows). */
static kl_result input(kl_ctx *c, CUdeviceptr in, int k, const int64_t *index, const float *value,
                       const float *lse, int tokens, CUstream s, CUdeviceptr *kin) {
  size_t in_bytes = (size_t)tokens * (size_t)c->layout.shard_bytes, n = (size_t)tokens * k;
  *kin = in;
  if (in % (unsigned)c->layout.vec_bytes == 0 && !kl_overlaps(in, in_bytes, (uintptr_t)index, n * 8) &&
      !(value && kl_overlaps(in, in_bytes, (uintptr_t)value, n * 4)) &&
      !(lse && kl_overlaps(in, in_bytes, (uintptr_t)lse, (size_t)tokens * 4)))
    return KLRT_OK;
  long long most = tokens > c->spec.max_tokens ? tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, &c->stage_in, &c->stage_in_bytes, in_bytes,
                            (size_t)most * (size_t)c->layout.shard_bytes, s, "staging (input)");
  if (res || (res = kl_copy(c, c->stage_in, in, in_bytes, s))) return res;
  *kin = c->stage_in;
  c->stats.staged++;
  return KLRT_OK;
}

kl_result kl_select_impl(kl_ctx *c, int topk, const void *in, int64_t *index, float *value,
                         float *lse, int tokens, CUstream s) {
  kl_result res;
  int k = topk ? c->spec.topk : 1;
  CUdeviceptr kin;
  if ((res = kl_check_ptr(c, in, &c->checked_in, "shard")) ||
      (res = check_outputs(c, k, index, value, lse, tokens)) ||
      (res = input(c, (CUdeviceptr)in, k, index, value, lse, tokens, s, &kin)))
    return res;
  CUfunction f = topk ? c->topk : c->argmax;
  kl_select_args a = {(const void *)kin, (long long *)index, value, lse, NULL, NULL, NULL, NULL,
                      tokens, c->rank, 0, 0};
  kl_decline why = KL_DECLINE_COUNT;
  /* records are a few bytes a row: never over the size limit (bytes 0) */
  if (kl_path_for(c, tokens, 0, &why) == PATH_ONESHOT) {
    c->stats.oneshot++;
    return oneshot(c, f, &a, s);
  }
  c->stats.nccl++;
  c->stats.declined[why]++;
  return nccl_path(c, f, &a, s);
}
