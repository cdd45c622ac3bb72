/* Dispatch (docs/DESIGN.md §8): the one-shot kernel when it can serve this call, NCCL
 * otherwise. The choice depends only on what every rank sees alike (tokens,
 * the spec, state agreed at creation); a condition only this rank can see (a
 * misaligned or overlapping buffer) is repaired here with a staging copy. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rt.h"

/* Same decision on every rank: no pointer, stream or timing enters it. */
int kl_path_for(const kl_ctx *c, int tokens, long long bytes, kl_decline *why) {
  if (c->disabled) return *why = KL_DECLINE_DISABLED, PATH_NCCL;
  if (!c->ready) return *why = KL_DECLINE_NOT_READY, PATH_NCCL;
  if (tokens > c->spec.max_tokens) return *why = KL_DECLINE_TOKENS, PATH_NCCL;
  if (c->nccl_everywhere && bytes > c->crossover) return *why = KL_DECLINE_SIZE, PATH_NCCL;
  return PATH_ONESHOT;
}

int kl_choose_path(const kl_ctx *c, int tokens, kl_decline *why) {
  return kl_path_for(c, tokens, (long long)tokens * c->layout.shard_bytes, why);
}

int kl_capturing(const kl_ctx *c, CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  c->cu->cuStreamIsCapturing(s, &st);
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* A buffer of at least `need` bytes, allocated for `size` (>= need, and at
 * least twice the old one, so it grows a few times at most). Never while
 * the stream is being captured (an allocation there would not be replayed).
 * The old buffer is kept until destroy, not freed: a captured graph may
 * still point into it, and cuMemFree waits for the whole device, which with
 * several ranks on one GPU is a wait on peers spinning for this rank. New
 * memory is zeroed (on s), so no kernel or copy ever reads bytes nobody
 * wrote (the select records' padding crosses the NCCL path). */
kl_result kl_ensure(kl_ctx *c, CUdeviceptr *buf, size_t *cap, size_t need, size_t size,
                        CUstream s, const char *what) {
  if (need <= *cap) return KLRT_OK;
  if (kl_capturing(c, s))
    return kl_rt_fail(KLRT_EINVAL, "%s: %zu bytes needed while capturing a CUDA graph; run one "
                      "step of this size before capture so the buffer exists", what, need);
  if (size < need) size = need;
  if (size < 2 * *cap) size = 2 * *cap;
  if (*buf) {
    CUdeviceptr *r = realloc(c->retired, (size_t)(c->nretired + 1) * sizeof *r);
    if (!r) return kl_rt_fail(KLRT_ENOMEM, "%s: out of memory", what);
    c->retired = r;
    c->retired[c->nretired++] = *buf;
  }
  *buf = 0, *cap = 0;
  CUresult r = c->cu->cuMemAlloc(buf, size);
  if (r == CUDA_SUCCESS) r = c->cu->cuMemsetD8Async(*buf, 0, size, s);
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_ENOMEM, "%s: cuMemAlloc(%zu): %s", what, size, kl_cu_errstr(r));
  *cap = size;
  return KLRT_OK;
}

/* Bytes of `tokens` rows of the output. */
static size_t out_bytes_for(const kl_ctx *c, long long tokens) {
  return (size_t)tokens * (size_t)c->spec.vocab_size * (size_t)c->layout.out_elem_bytes;
}

/* Where a kernel writes `out`: out itself when aligned for the kernel's
 * vector stores, else the output staging buffer (copied to out after). */
static kl_result output_target(kl_ctx *c, CUdeviceptr out, int tokens, CUstream s,
                               CUdeviceptr *target) {
  *target = out;
  if (out % (unsigned)c->layout.out_vec_bytes == 0) return KLRT_OK;
  long long most = tokens > c->spec.max_tokens ? tokens : c->spec.max_tokens;
  kl_result res = kl_ensure(c, &c->stage_out, &c->stage_out_bytes, out_bytes_for(c, tokens),
                         out_bytes_for(c, most), s, "staging (output)");
  if (res) return res;
  *target = c->stage_out;
  return KLRT_OK;
}

int kl_overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) {
  return a < b + bn && b < a + an;
}

/* Device pointers must live on this context's GPU (checked once per pointer). */
kl_result kl_check_ptr(kl_ctx *c, const void *p, const void **cache, const char *what) {
  if (p == *cache) return KLRT_OK;
  int ordinal = -1;
  CUresult r = c->cu->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                            (CUdeviceptr)p);
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_EINVAL, "%s %p is not CUDA device memory (%s)", what, p,
                      kl_cu_errstr(r));
  if (ordinal != c->ordinal)
    return kl_rt_fail(KLRT_EINVAL, "%s %p is on GPU %d, but rank %d's context is on GPU %d", what,
                      p, ordinal, c->rank, c->ordinal);
  *cache = p;
  return KLRT_OK;
}

kl_result kl_copy(kl_ctx *c, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  KL_CU_TRY(c, cuMemcpyAsync(dst, src, n, s));
  return KLRT_OK;
}

CUresult kl_launch_oneshot(kl_ctx *c, CUdeviceptr in, CUdeviceptr out, int tokens, int grid,
                           CUstream s) {
  /* Only the args change from launch to launch (the peers are set at mapping);
   * the launch copies the parameter, and one thread at a time calls a context. */
  c->prm.a = (kl_oneshot_args){(const void *)in, (void *)out, (kl_state *)c->state,
                               kl_fault_word(c), tokens, c->rank, c->nslots, 0};
  void *args[] = {&c->prm};
  /* PDL: this launch may begin while the previous kernel (the LM head, or
   * the last step's gather) drains; the kernel waits for it before reading. */
  CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
  attr.value.programmaticStreamSerializationAllowed = 1;
  CUlaunchConfig cfg = {.gridDimX = (unsigned)grid, .gridDimY = 1, .gridDimZ = 1,
                        .blockDimX = (unsigned)c->layout.block, .blockDimY = 1, .blockDimZ = 1,
                        .hStream = s, .attrs = &attr, .numAttrs = c->pdl ? 1 : 0};
  return c->cu->cuLaunchKernelEx(&cfg, c->oneshot, args, NULL);
}

static kl_result oneshot(kl_ctx *c, CUdeviceptr in, CUdeviceptr out, int tokens, CUstream s) {
  size_t in_bytes = (size_t)tokens * (size_t)c->layout.shard_bytes;
  size_t out_bytes = out_bytes_for(c, tokens);
  CUdeviceptr kin = in, kout = out;
  kl_result res;
  if (in % (unsigned)c->layout.vec_bytes || kl_overlaps(in, in_bytes, out, out_bytes)) {
    size_t most = (size_t)c->spec.max_tokens * (size_t)c->layout.shard_bytes;
    if ((res = kl_ensure(c, &c->stage_in, &c->stage_in_bytes, in_bytes, most, s, "staging (input)")) ||
        (res = kl_copy(c, c->stage_in, in, in_bytes, s)))
      return res;
    kin = c->stage_in;
  }
  if ((res = output_target(c, out, tokens, s, &kout))) return res;
  c->stats.staged += kin != in || kout != out;
  int grid = kl_layout_grid(&c->layout, tokens, c->cta_cap);
  CUresult r = kl_launch_oneshot(c, kin, kout, tokens, grid, s);
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_ECUDA, "launching the one-shot kernel: %s", kl_cu_errstr(r));
  if (kout != out) return kl_copy(c, out, kout, out_bytes, s);
  return KLRT_OK;
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
    m.srcDevice = c->scratch + (size_t)r * (size_t)tokens * shard_bytes;
    m.srcPitch = shard_bytes;
    m.dstDevice = out + col;
    m.dstPitch = vocab_bytes;
    m.WidthInBytes = vocab_bytes - col < shard_bytes ? vocab_bytes - col : shard_bytes;
    m.Height = (size_t)tokens;
    KL_CU_TRY(c, cuMemcpy2DAsync(&m, s));
  }
  return KLRT_OK;
}

/* ncclAllGather leaves [tp, tokens, shard]; that is already [tokens, vocab]
 * when there is one token (or one rank) and no padding to slice off. */
static kl_result nccl_path(kl_ctx *c, CUdeviceptr in, CUdeviceptr out, int tokens, CUstream s) {
  if (!c->nccl && c->nranks > 1)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: the one-shot path cannot serve this call "
                      "and the context has no NCCL communicator for the fallback", c->rank);
  size_t shard_bytes = (size_t)tokens * (size_t)c->layout.shard_bytes;
  size_t out_bytes = out_bytes_for(c, tokens);
  size_t all_bytes = shard_bytes * (size_t)c->nranks;
  int direct = (tokens == 1 || c->nranks == 1) && c->spec.vocab_size == c->layout.padded_vocab &&
               !c->layout.epilogue && !kl_overlaps(in, shard_bytes, out, out_bytes);
  kl_result res;
  CUdeviceptr dst = out;
  if (!direct) {
    if ((res = kl_ensure(c, &c->scratch, &c->scratch_bytes, all_bytes, all_bytes, s, "NCCL scratch")))
      return res;
    dst = c->scratch;
  }
  if (c->nranks == 1) {
    if ((res = kl_copy(c, dst, in, shard_bytes, s))) return res;
  } else {
    ncclResult_t nr = c->nccl_api->ncclAllGather((const void *)in, (void *)dst, shard_bytes, ncclUint8, c->nccl,
                                    (cudaStream_t)s);
    if (nr != ncclSuccess)
      return kl_rt_fail(KLRT_ENCCL, "ncclAllGather: %s", c->nccl_api->ncclGetErrorString(nr));
  }
  if (direct) return KLRT_OK;
  if (!c->relayout) return relayout_copies(c, out, tokens, s);
  CUdeviceptr kout;
  if ((res = output_target(c, out, tokens, s, &kout))) return res;
  c->stats.staged += kout != out;
  unsigned grid = (unsigned)kl_layout_relayout_grid(&c->layout, (int64_t)out_bytes,
                                                     KL_RELAYOUT_CTAS_PER_SM * c->sm_count);
  kl_relayout_args a = {(const void *)c->scratch, (void *)kout, tokens, 0};
  void *args[] = {&a};
  KL_CU_TRY(c, cuLaunchKernel(c->relayout, grid, 1, 1, (unsigned)c->layout.relayout_block, 1, 1,
                              0, s, args, NULL));
  if (kout != out) return kl_copy(c, out, kout, out_bytes, s);
  return KLRT_OK;
}

kl_result kl_order_streams(kl_ctx *c, CUstream s, int *outside) {
  *outside = !kl_capturing(c, s);
  if (!*outside) return KLRT_OK;
#ifdef KL_TESTING
  /* Lets tests/gpu_streams.c show that it fails without the ordering. */
  if (getenv("KLGEN_FAULT_NO_STREAM_ORDER")) return KLRT_OK;
#endif
  if (c->have_last_stream && c->last_stream != s)
    KL_CU_TRY(c, cuStreamWaitEvent(s, c->order_event, 0));
  return KLRT_OK;
}

kl_result kl_order_mark(kl_ctx *c, CUstream s) {
  /* Recorded after every call, on its own stream: a later call on another
   * stream waits for it without touching this stream, which may be gone. */
  KL_CU_TRY(c, cuEventRecord(c->order_event, s));
  c->last_stream = s;
  c->have_last_stream = 1;
  return KLRT_OK;
}

static void log_path(kl_ctx *c, int path, kl_decline why, int tokens) {
  if (path == c->last_path && (path == PATH_ONESHOT || c->stats.declined[why] > 1)) return;
  if (path == PATH_ONESHOT)
    kl_log("rank %d: %s: one-shot path (tokens %d)", c->rank, c->spec.name, tokens);
  else
    kl_log("rank %d: %s: NCCL path, one-shot declined: %s (tokens %d%s%s)", c->rank, c->spec.name,
           kl_decline_name(why), tokens, why == KL_DECLINE_NOT_READY ? "; " : "",
           why == KL_DECLINE_NOT_READY ? c->stats.not_ready : "");
  c->last_path = path;
}

kl_result kl_gather_impl(kl_ctx *c, const void *in, void *out, int tokens, CUstream s) {
  kl_result res;
  if ((res = kl_check_ptr(c, in, &c->checked_in, "shard")) ||
      (res = kl_check_ptr(c, out, &c->checked_out, "out")))
    return res;
  kl_decline why = KL_DECLINE_COUNT;
  int path = kl_choose_path(c, tokens, &why);
  if (path == PATH_ONESHOT) {
    c->stats.oneshot++;
    res = oneshot(c, (CUdeviceptr)in, (CUdeviceptr)out, tokens, s);
  } else {
    c->stats.nccl++;
    c->stats.declined[why]++;
    res = nccl_path(c, (CUdeviceptr)in, (CUdeviceptr)out, tokens, s);
  }
  if (kl_log_enabled()) log_path(c, path, why, tokens);
  return res;
}
