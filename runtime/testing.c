/* The test hooks (klrt_testing.h, rt.h's kl_testing_fakes): compiled into
 * the tests' copy of the library (klrt_testing, KL_TESTING) alone, never
 * into an installed one. */
#include <stdint.h>
#include <stdlib.h>

#include "klrt_testing.h"
#include "rt.h"

#ifndef KL_TESTING
#error "testing.c is klrt_testing's alone (KL_TESTING)"
#endif

void kl_testing_fakes(const kl_cu *cu, const kl_nccl_api *nccl, kl_testing_jit_fn jit) {
  kl_testing_cu = cu, kl_testing_nccl = nccl, kl_testing_jit = jit;
}

/* n step slots at dev: each one's step count moved to the largest value <=
 * near with the same residue modulo 6 (3: the rotating buffers; 2: kl_sample's
 * staged rows); the tokens of the last step kept. */
static kl_result move_slots(kl_ctx *c, CUdeviceptr dev, int n, uint32_t near, uint32_t *set) {
  uint64_t *slots = calloc((size_t)n, sizeof *slots);
  if (!slots) return kl_rt_fail(KLRT_ENOMEM, "out of memory");
  CUresult r = c->cu->cuMemcpyDtoH(slots, dev, (size_t)n * 8);
  uint32_t to = 0, first = (uint32_t)slots[0];
  for (int i = 0; i < n && r == CUDA_SUCCESS; i++) {
    uint32_t step = (uint32_t)slots[i];
    if (step != first) {
      free(slots);
      return kl_rt_fail(KLRT_ESTATE, "step slots disagree (%u, %u)", first, step);
    }
    to = near - (uint32_t)((near % 6 + 6 - step % 6) % 6);
    slots[i] = (slots[i] & 0xffffffff00000000ull) | to;
  }
  /* from pageable memory cuMemcpyHtoD may return before the copy lands, and
   * on the legacy stream, unordered with the kernels' streams: wait for it */
  if (r == CUDA_SUCCESS) r = c->cu->cuMemcpyHtoDAsync(dev, slots, (size_t)n * 8, c->stream);
  if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
  free(slots);
  if (r != CUDA_SUCCESS) return kl_rt_fail(KLRT_ECUDA, "step slots: %s", kl_cu_errstr(r));
  if (set) *set = to;
  return KLRT_OK;
}

kl_result kl_testing_set_steps(kl_ctx *c, uint32_t near, uint32_t *gather_step,
                               uint32_t *select_step) {
  if (!c) return kl_rt_fail(KLRT_EINVAL, "kl_testing_set_steps: ctx is NULL");
  if (near >= KL_STEP_WRAP || near < 2)
    return kl_rt_fail(KLRT_EINVAL, "kl_testing_set_steps: %u is not a step (2..%u)", near,
                      KL_STEP_WRAP - 1);
  kl_result res = kl_ctx_acquire(c, 0, "kl_testing_set_steps");
  if (res) return res;
  int pushed;
  if (!c->state) res = kl_rt_fail(KLRT_ESTATE, "the one-shot path has no state here");
  else if (!(res = kl_ctx_enter(c, &pushed))) {
    CUresult r = c->cu->cuCtxSynchronize();
    if (r != CUDA_SUCCESS) res = kl_rt_fail(KLRT_ECUDA, "%s", kl_cu_errstr(r));
    const kl_kernel *g = &c->kern[KL_K_ONESHOT], *sel = &c->kern[KL_K_ARGMAX];
    if (!res) res = move_slots(c, (CUdeviceptr)g->slots, g->nslots, near, gather_step);
    if (!res) res = move_slots(c, (CUdeviceptr)sel->slots, sel->nslots, near, select_step);
    kl_ctx_leave(c, pushed);
  }
  kl_ctx_release(c);
  return res;
}

kl_result kl_testing_marks(kl_ctx *c, void **marks, size_t *bytes, uint32_t *sentinel,
                           int *per_token) {
  if (!c || !marks || !bytes || !sentinel || !per_token)
    return kl_rt_fail(KLRT_EINVAL, "kl_testing_marks: a NULL argument");
  if (!c->recv) return kl_rt_fail(KLRT_ESTATE, "the one-shot path has no buffers here");
  *marks = (void *)(uintptr_t)(c->recv + (CUdeviceptr)c->layout.mark_offset);
  *bytes = 2 * (size_t)c->layout.mark_buffer_bytes;
  *sentinel = c->layout.sentinel32;
  *per_token = c->layout.topk_split;
  return KLRT_OK;
}
