/* kl_gather's route: the one-shot kernel (docs/design/oneshot.md), or NCCL's
 * all-gather and the generated relayout kernel. What every call shares
 * (checks, the choice, staging, the exchange) is the dispatch layer's. */
#include <stdint.h>
#include <string.h>

#include "rt.h"

/* Bytes of `tokens` rows of the output. */
static void measure(const kl_ctx *c, kl_call *k) {
  k->out[0].bytes = (size_t)k->tokens * (size_t)c->spec.vocab_size * (size_t)c->layout.out_elem_bytes;
}

static kl_result oneshot(kl_ctx *c, kl_call *k, CUstream s) {
  CUdeviceptr kout;
  kl_result res;
  if ((res = kl_stage_in(c, k, s)) || (res = kl_stage_out(c, k, s, &kout))) return res;
  c->stats.staged += k->kin != (CUdeviceptr)k->in || kout != (CUdeviceptr)k->out[0].p;
  kl_kernel *kn = &c->kern[KL_K_ONESHOT];
  kn->prm.oneshot.a = (kl_oneshot_args){(const void *)k->kin, (void *)kout, (kl_state *)c->state,
                                        kl_fault_word(c), k->tokens, c->rank, kn->nslots, 0};
  CUresult r = kl_launch(c, KL_K_ONESHOT, kl_grid(c, KL_K_ONESHOT, k->tokens, 1), 1, s);
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_ECUDA, "launching the one-shot kernel: %s", kl_cu_errstr(r));
  return kl_unstage_out(c, k, kout, s);
}

/* Relayout without the generated kernel (its JIT failed on this rank): one
 * strided copy per rank. Slower, but the NCCL path must not depend on NVRTC. */
static kl_result relayout_copies(kl_ctx *c, CUdeviceptr out, int tokens, CUstream s) {
  if (c->layout.epilogue)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: the spec's epilogue needs the generated "
                      "relayout kernel, which did not build here (%s)", c->rank,
                      c->stats.not_ready);
  size_t e = (size_t)c->layout.elem_bytes, vocab_bytes = (size_t)c->spec.vocab_size * e;
  size_t shard_bytes = (size_t)c->layout.shard_bytes;
  for (int r = 0; r < c->nranks; r++) {
    size_t col = (size_t)r * shard_bytes;
    if (col >= vocab_bytes) break;
    CUDA_MEMCPY2D m;
    memset(&m, 0, sizeof m);
    m.srcMemoryType = m.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    m.srcDevice = c->buf[KL_BUF_SCRATCH].p + (size_t)r * (size_t)tokens * shard_bytes;
    m.srcPitch = shard_bytes;
    m.dstDevice = out + col;
    m.dstPitch = vocab_bytes;
    m.WidthInBytes = vocab_bytes - col < shard_bytes ? vocab_bytes - col : shard_bytes;
    m.Height = (size_t)tokens;
    KL_CU_TRY(c, cuMemcpy2DAsync(&m, s));
  }
  return KLRT_OK;
}

/* [tp, tokens, shard] in scratch to [tokens, vocab_size] in out. */
static kl_result relayout(kl_ctx *c, kl_call *k, CUstream s) {
  kl_kernel *kn = &c->kern[KL_K_RELAYOUT];
  if (!kn->fn) return relayout_copies(c, (CUdeviceptr)k->out[0].p, k->tokens, s);
  CUdeviceptr kout;
  kl_result res = kl_stage_out(c, k, s, &kout);
  if (res) return res;
  c->stats.staged += kout != (CUdeviceptr)k->out[0].p;
  kn->prm.relayout = (kl_relayout_args){(const void *)c->buf[KL_BUF_SCRATCH].p, (void *)kout,
                                        k->tokens, 0};
  CUresult r = kl_launch(c, KL_K_RELAYOUT, kl_grid(c, KL_K_RELAYOUT, k->tokens, 1), 0, s);
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_ECUDA, "launching the relayout kernel: %s", kl_cu_errstr(r));
  return kl_unstage_out(c, k, kout, s);
}

/* ncclAllGather leaves [tp, tokens, shard]; that is already [tokens, vocab]
 * when there is one token (or one rank) and no padding to slice off. */
static kl_result nccl(kl_ctx *c, kl_call *k, CUstream s) {
  CUdeviceptr in = (CUdeviceptr)k->in, out = (CUdeviceptr)k->out[0].p;
  size_t all_bytes = k->in_bytes * (size_t)c->nranks;
  int direct = (k->tokens == 1 || c->nranks == 1) &&
               c->spec.vocab_size == c->layout.padded_vocab && !c->layout.epilogue &&
               !kl_overlaps(in, k->in_bytes, out, k->out[0].bytes);
  kl_result res;
  CUdeviceptr dst = out;
  if (!direct) {
    if ((res = kl_ensure(c, KL_BUF_SCRATCH, all_bytes, all_bytes, s))) return res;
    dst = c->buf[KL_BUF_SCRATCH].p;
  }
  if ((res = kl_allgather(c, in, dst, k->in_bytes, s)) || direct) return res;
  return relayout(c, k, s);
}

const kl_route kl_gather_route = {
    .fn = "kl_gather",
    .kernel = KL_K_ONESHOT,
    .nouts = 1,
    .sized = 1,
    .logged = 1,
    .measure = measure,
    .oneshot = oneshot,
    .nccl = nccl,
};
