/* The dispatch layer (docs/design/dispatch.md): what every step call shares. Each
 * kind of call (gather.c, select.c) describes itself as a route; this layer
 * checks its arguments, stages what must be staged, chooses the path, counts
 * it, and gives it the buffers, the one NCCL exchange and the ordering of
 * streams. The choice depends only on what every rank sees alike (tokens,
 * the spec, state agreed at creation); a condition only this rank can see (a
 * misaligned or overlapping buffer) is repaired with a staging copy, never
 * by a path of its own. */
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

static int capturing(const kl_ctx *c, CUstream s) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  c->cu->cuStreamIsCapturing(s, &st);
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* ---- buffers ---- */

static const char *const buf_names[KL_BUF_COUNT] = {
    [KL_BUF_SCRATCH] = "NCCL scratch", [KL_BUF_RECORDS] = "select scratch",
    [KL_BUF_STAGE_IN] = "staging (input)", [KL_BUF_STAGE_OUT] = "staging (output)",
    [KL_BUF_SAMPLE] = "sample scratch", [KL_BUF_SLICE_RESULTS] = "slice results",
    [KL_BUF_LISTS] = "sample lists"};

/* A failed allocation or clearing of device memory: out of memory only when
 * the driver says so; anything else (a context a fault has broken) is a
 * CUDA error, which no smaller request would avoid. */
static kl_result mem_fail(CUresult r, const char *what, size_t bytes) {
  return kl_rt_fail(r == CUDA_ERROR_OUT_OF_MEMORY ? KLRT_ENOMEM : KLRT_ECUDA, "%s (%zu bytes): %s",
                    what, bytes, kl_cu_errstr(r));
}

/* A buffer of at least `need` bytes, allocated for `size` (>= need, and at
 * least twice the old one, so it grows a few times at most). Never while
 * the stream is being captured (an allocation there would not be replayed).
 * The old buffer is kept until destroy, not freed: a captured graph may
 * still point into it, and cuMemFree waits for the whole device, which with
 * several ranks on one GPU is a wait on peers spinning for this rank. New
 * memory is zeroed (on s), so no kernel or copy ever reads bytes nobody
 * wrote (the select records' padding crosses the NCCL path). */
kl_result kl_ensure(kl_ctx *c, kl_buf_id b, size_t need, size_t size, CUstream s) {
  kl_buffer *buf = &c->buf[b];
  const char *what = buf_names[b];
  if (need <= buf->bytes) return KLRT_OK;
  if (capturing(c, s))
    return kl_rt_fail(KLRT_EINVAL, "%s: %zu bytes needed while capturing a CUDA graph (a step "
                      "past max_tokens); run one step of this size before capture so the buffer "
                      "exists", what, need);
  if (size < need) size = need;
  if (size < 2 * buf->bytes) size = 2 * buf->bytes;
  /* the new buffer first: a failure leaves the old one in place, so a call
   * within it (a captured one) still finds it. Room for two retirements:
   * the old buffer, or a new one whose clearing failed (cuMemFree here
   * would wait for the device, where a peer may be waiting for us). */
  CUdeviceptr *retired = realloc(c->retired, (size_t)(c->nretired + 2) * sizeof *retired);
  if (!retired) return kl_rt_fail(KLRT_ENOMEM, "%s: out of memory", what);
  c->retired = retired;
  CUdeviceptr p = 0;
  CUresult r = c->cu->cuMemAlloc(&p, size);
  if (r == CUDA_SUCCESS && (r = c->cu->cuMemsetD8Async(p, 0, size, s)) != CUDA_SUCCESS)
    c->retired[c->nretired++] = p;
  if (r != CUDA_SUCCESS) return mem_fail(r, what, size);
  if (buf->p) c->retired[c->nretired++] = buf->p; /* queued work may still use it */
  buf->p = p, buf->bytes = size;
  return KLRT_OK;
}

size_t kl_record_bytes(const kl_ctx *c, long long tokens) {
  /* the region's split, which is the larger one: one buffer serves both kernels */
  return (size_t)tokens * (size_t)c->layout.rec_split * (size_t)c->layout.rec_chunks * 16;
}

size_t kl_records_scratch_bytes(const kl_ctx *c, long long tokens) {
  return kl_record_bytes(c, tokens) * (size_t)(1 + c->nranks);
}

/* A sliced row's results (kl_slice_result, one a slice) and its counter:
 * the results of `rows` rows, then their counters. */
static size_t slice_row_bytes(const kl_ctx *c) {
  return (size_t)c->layout.sample_slices * sizeof(kl_slice_result) + sizeof(unsigned);
}

/* Where the buffer's rows' counters are. */
unsigned *kl_slice_counters(const kl_ctx *c) {
  const kl_buffer *pb = &c->buf[KL_BUF_SLICE_RESULTS];
  const size_t rows = pb->bytes / slice_row_bytes(c);
  return (unsigned *)(pb->p + rows * (size_t)c->layout.sample_slices * sizeof(kl_slice_result));
}

size_t kl_slice_results_bytes(const kl_ctx *c, long long tokens) {
  return (size_t)tokens * slice_row_bytes(c);
}

/* Staging for max_tokens from the start too: a rank's first misaligned or
 * overlapping call would otherwise allocate inside a step its peers are
 * already polling for (an allocation that waits for the device, as under
 * compute-sanitizer's initcheck, then waits for them until the time-out),
 * and a graph captured with such buffers would need a step before capture. */
static kl_result stage_alloc(kl_ctx *c) {
  static const kl_buf_id ids[2] = {KL_BUF_STAGE_IN, KL_BUF_STAGE_OUT};
  const size_t rows = (size_t)c->spec.max_tokens;
  const size_t sizes[2] = {rows * (size_t)c->layout.shard_bytes,
                           rows * (size_t)c->spec.vocab_size * (size_t)c->layout.out_elem_bytes};
  for (int i = 0; i < 2; i++) {
    kl_buffer *b = &c->buf[ids[i]];
    CUresult r = c->cu->cuMemAlloc(&b->p, sizes[i]);
    if (r == CUDA_SUCCESS) r = c->cu->cuMemsetD8Async(b->p, 0, sizes[i], c->stream);
    if (r != CUDA_SUCCESS) return mem_fail(r, buf_names[ids[i]], sizes[i]);
    b->bytes = sizes[i];
  }
  CUresult r = c->cu->cuStreamSynchronize(c->stream);
  return r == CUDA_SUCCESS ? KLRT_OK : mem_fail(r, "staging", sizes[0] + sizes[1]);
}

/* The NCCL paths (and kl_sample) need scratch for max_tokens from the start,
 * so that a graph captured at any size up to it needs no allocation. */
kl_result kl_buffers_alloc(kl_ctx *c) {
  kl_buffer *all = &c->buf[KL_BUF_SCRATCH], *rec = &c->buf[KL_BUF_RECORDS];
  size_t bytes = (size_t)c->spec.max_tokens * (size_t)c->layout.shard_bytes * (size_t)c->nranks;
  size_t sel = kl_records_scratch_bytes(c, c->spec.max_tokens);
  CUresult r = c->cu->cuMemAlloc(&all->p, bytes);
  if (r == CUDA_SUCCESS) all->bytes = bytes;
  if (r == CUDA_SUCCESS) r = c->cu->cuMemAlloc(&rec->p, sel);
  /* records leave padding words unwritten; NCCL copies them (kl_ensure).
   * On the context's stream and waited for: cuMemsetD32 would go to the
   * legacy stream, which is not ordered with the non-blocking streams the
   * kernels run on, and returns before it is done. */
  if (r == CUDA_SUCCESS) r = c->cu->cuMemsetD32Async(rec->p, 0, sel / 4, c->stream);
  if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
  if (r != CUDA_SUCCESS) return mem_fail(r, "NCCL scratch and records", bytes + sel);
  rec->bytes = sel;
  kl_result res = stage_alloc(c);
  if (res) return res;
  /* kl_sample's gathered rows, for max_tokens: its first call may be captured */
  if (c->spec.topk) {
    kl_buffer *smp = &c->buf[KL_BUF_SAMPLE];
    size_t rows = (size_t)c->spec.max_tokens * (size_t)c->spec.vocab_size *
                  (size_t)c->layout.out_elem_bytes;
    if ((r = c->cu->cuMemAlloc(&smp->p, rows)) != CUDA_SUCCESS)
      return mem_fail(r, "sample scratch", rows);
    smp->bytes = rows;
    /* the sliced rows' counters start at 0 (the kernels leave them so) */
    kl_buffer *res = &c->buf[KL_BUF_SLICE_RESULTS];
    size_t pb = kl_slice_results_bytes(c, c->spec.max_tokens);
    if ((r = c->cu->cuMemAlloc(&res->p, pb)) != CUDA_SUCCESS)
      return mem_fail(r, "slice results", pb);
    r = c->cu->cuMemsetD32Async(res->p, 0, pb / 4, c->stream);
    if (r == CUDA_SUCCESS) r = c->cu->cuStreamSynchronize(c->stream);
    if (r != CUDA_SUCCESS) return mem_fail(r, "slice results", pb);
    res->bytes = pb;
  }
  return KLRT_OK;
}

/* ---- arguments ---- */

static const char *const arg_names[KL_ARG_COUNT] = {
    "shard",       "out",    "index", "value", "lse",  "token", "logprob", "top_index",
    "top_logprob", "rank", "temperature", "top_k", "top_p", "min_p", "seed", "offset", "state_rows",
    "offset_rows", "bitmask", "repetition_penalty", "frequency_penalty", "presence_penalty",
    "prompt_mask", "output_counts", "allowed_count", "allowed_ids", "bias_count", "bias_ids",
    "bias_values", "min_len", "stop_count", "stop_ids", "position", "banned"};

const char *kl_arg_name(kl_arg a) { return arg_names[a]; }

int kl_overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) {
  return a < b + bn && b < a + an;
}

/* Whether p is pinned host memory the context's GPU reads at the same
 * address (mapped: cuMemHostAlloc's DEVICEMAP, any pinned allocation under
 * unified addressing). */
static int host_mapped(const kl_ctx *c, CUdeviceptr p) {
  CUpointer_attribute attr = CU_POINTER_ATTRIBUTE_DEVICE_POINTER;
  CUdeviceptr dp = 0;
  void *data = &dp;
  return c->cu->cuPointerGetAttributes(1, &attr, &data, p) == CUDA_SUCCESS && dp == p;
}

/* A pointer argument: memory of this context's GPU (the ordinal the driver
 * gives it), with the `bytes` the call reads or writes from p inside the
 * address range of its allocation; kl_sample's parameter arrays may be
 * mapped pinned host memory instead (engines keep per-request tables so,
 * vLLM's UVA buffers: the sampler reads the few words it needs in place).
 * One driver query a pointer, every call, never remembered: an address says
 * nothing of the allocation behind it at this call (one freed and made
 * again there may be on another GPU, or smaller). */
kl_result kl_check_ptr(const kl_ctx *c, const kl_call *k, const void *p, size_t bytes, kl_arg arg) {
  unsigned type = 0; /* CUmemorytype; 0: not CUDA memory */
  int ordinal = -1;
  CUdeviceptr start = 0;
  size_t size = 0;
  CUpointer_attribute attr[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                CU_POINTER_ATTRIBUTE_RANGE_SIZE};
  void *data[] = {&type, &ordinal, &start, &size};
  const CUdeviceptr d = (CUdeviceptr)p;
  const char *fn = k->route->fn, *name = arg_names[arg];
  CUresult r = c->cu->cuPointerGetAttributes(4, attr, data, d);
  const int table = arg >= KL_ARG_TEMPERATURE;
  if (table && (r != CUDA_SUCCESS || type == CU_MEMORYTYPE_HOST) && host_mapped(c, d)) {
    if (r != CUDA_SUCCESS) size = 0; /* no range to hold it to */
    r = CUDA_SUCCESS, type = CU_MEMORYTYPE_HOST;
    ordinal = c->ordinal; /* the context's GPU reads it where it is */
  }
  const char *what = table ? "CUDA device memory or mapped pinned host memory"
                           : "CUDA device memory";
  if (r != CUDA_SUCCESS)
    return kl_rt_fail(KLRT_EINVAL, "%s: %s %p is not %s (%s)", fn, name, p, what,
                      kl_cu_errstr(r));
  if (!type) return kl_rt_fail(KLRT_EINVAL, "%s: %s %p is not %s", fn, name, p, what);
  if (ordinal != c->ordinal)
    return kl_rt_fail(KLRT_EINVAL, "%s: %s %p is on GPU %d, but rank %d's context is on GPU %d",
                      fn, name, p, ordinal, c->rank, c->ordinal);
  /* size 0, or p outside the range: the driver tells no range to hold it to */
  if (size && d >= start && d - start < size && bytes > size - (d - start))
    return kl_rt_fail(KLRT_EINVAL, "%s: %s %p is too small: %d tokens need %zu bytes from it, "
                      "and its allocation ends %zu bytes after it", fn, name, p, k->tokens,
                      bytes, size - (size_t)(d - start));
  return KLRT_OK;
}

static int outputs_overlap(const kl_call *k, int i, int j) {
  const kl_out *a = &k->out[i], *b = &k->out[j];
  return a->p && b->p && kl_overlaps((uintptr_t)a->p, a->bytes, (uintptr_t)b->p, b->bytes);
}

/* The input and outputs on this GPU, each as large as the call's tokens
 * need; outputs the kernels write in place aligned for them and apart from
 * each other. */
static kl_result check_args(const kl_ctx *c, const kl_call *k) {
  const kl_route *r = k->route;
  kl_result res = kl_check_ptr(c, k, k->in, k->in_bytes, KL_ARG_SHARD);
  if (res) return res;
  for (int i = 0; i < r->nouts; i++)
    if ((uintptr_t)k->out[i].p & r->align_mask[i]) return kl_rt_fail(KLRT_EINVAL, "%s", r->misaligned);
  for (int i = 0; i < r->nouts; i++) {
    const kl_out *o = &k->out[i];
    if (o->p && (res = kl_check_ptr(c, k, o->p, o->bytes, o->arg))) return res;
  }
  for (int i = 0; i < r->nouts; i++)
    for (int j = i + 1; j < r->nouts; j++)
      if (outputs_overlap(k, i, j)) return kl_rt_fail(KLRT_EINVAL, "%s", r->overlap);
  return KLRT_OK;
}

/* ---- staging ---- */

static kl_result copy_async(kl_ctx *c, CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s) {
  KL_CU_TRY(c, cuMemcpyAsync(dst, src, n, s));
  return KLRT_OK;
}

static int overlaps_outputs(const kl_call *k, CUdeviceptr in) {
  for (int i = 0; i < k->route->nouts; i++)
    if (k->out[i].p && kl_overlaps(in, k->in_bytes, (uintptr_t)k->out[i].p, k->out[i].bytes))
      return 1;
  return 0;
}

/* Apart from the outputs too: a kernel may write them while its other CTAs
 * still read input rows. */
kl_result kl_stage_in(kl_ctx *c, kl_call *k, CUstream s) {
  CUdeviceptr in = (CUdeviceptr)k->in;
  k->kin = in;
  if (in % (unsigned)c->layout.vec_bytes == 0 && !overlaps_outputs(k, in)) return KLRT_OK;
  long long most = k->tokens > c->spec.max_tokens ? k->tokens : c->spec.max_tokens;
  kl_buffer *b = &c->buf[KL_BUF_STAGE_IN];
  kl_result res = kl_ensure(c, KL_BUF_STAGE_IN, k->in_bytes,
                            (size_t)most * (size_t)c->layout.shard_bytes, s);
  if (res || (res = copy_async(c, b->p, in, k->in_bytes, s))) return res;
  k->kin = b->p;
  return KLRT_OK;
}

kl_result kl_stage_out(kl_ctx *c, const kl_call *k, CUstream s, CUdeviceptr *target) {
  CUdeviceptr out = (CUdeviceptr)k->out[0].p;
  *target = out;
  if (out % (unsigned)c->layout.out_vec_bytes == 0) return KLRT_OK;
  long long most = k->tokens > c->spec.max_tokens ? k->tokens : c->spec.max_tokens;
  size_t row = k->out[0].bytes / (size_t)k->tokens;
  kl_result res = kl_ensure(c, KL_BUF_STAGE_OUT, k->out[0].bytes, (size_t)most * row, s);
  if (res) return res;
  *target = c->buf[KL_BUF_STAGE_OUT].p;
  return KLRT_OK;
}

kl_result kl_unstage_out(kl_ctx *c, const kl_call *k, CUdeviceptr target, CUstream s) {
  CUdeviceptr out = (CUdeviceptr)k->out[0].p;
  return target == out ? KLRT_OK : copy_async(c, out, target, k->out[0].bytes, s);
}

/* ---- the exchange ---- */

kl_result kl_allgather(kl_ctx *c, CUdeviceptr mine, CUdeviceptr all, size_t bytes, CUstream s) {
  if (c->nranks == 1) return copy_async(c, all, mine, bytes, s);
  ncclResult_t nr = c->nccl_api->ncclAllGather((const void *)mine, (void *)all, bytes, ncclUint8,
                                               c->nccl, (cudaStream_t)s);
  if (nr != ncclSuccess)
    return kl_rt_fail(KLRT_ENCCL, "ncclAllGather: %s", c->nccl_api->ncclGetErrorString(nr));
  return KLRT_OK;
}

/* ---- stream order ---- */

kl_result kl_order_streams(kl_ctx *c, CUstream s, int *outside) {
  *outside = !capturing(c, s);
  if (!*outside) return KLRT_OK;
#ifdef KL_TESTING
  /* Lets tests/gather/gpu_streams.c show that it fails without the ordering. */
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

/* ---- the group's fault ---- */

uint64_t kl_fault_known(kl_ctx *c) {
  if (!c->fault && c->mirror) c->fault = *c->mirror;
  return c->fault;
}

kl_result kl_fault_error(const kl_ctx *c, uint64_t f) {
  return kl_rt_fail(KLRT_EDEVICE, "rank %d: the one-shot path is dead: rank %u's one-shot step %u "
                    "timed out waiting for rank %u (after %lld ms); its calls are refused here, "
                    "or write poison (NaN, index -1) on a rank that has not seen the fault yet, "
                    "and calls on the NCCL path still run; destroy the context (collective) to "
                    "rebuild it", c->rank, KL_FAULT_RANK(f), KL_FAULT_STEP(f), KL_FAULT_PEER(f),
                    (long long)(c->layout.timeout_ns / 1000000));
}

/* ---- the call ---- */

/* The input where a route's kernels read it on both paths. */
static kl_result stage_for_kernels(kl_ctx *c, kl_call *k, CUstream s) {
  if (!k->route->nccl_kernels) return KLRT_OK;
  kl_result res = kl_stage_in(c, k, s);
  if (!res) c->stats.staged += k->kin != (CUdeviceptr)k->in;
  return res;
}

/* The one-shot path, unless this rank knows of the group's fault: its
 * kernels poll the peers, and a peer that refused the call (it knew) sends
 * nothing; but a rank that has not seen the fault yet and launches waits
 * for no one either: its kernels find the fault word set in its own receive
 * memory when they start, or while they poll, and write poison. So ranks
 * may decide this apart, and the refusal enqueues nothing. */
static kl_result oneshot_path(kl_ctx *c, kl_call *k, CUstream s) {
  const uint64_t f = kl_fault_known(c);
  if (f) return kl_fault_error(c, f);
  kl_result res = stage_for_kernels(c, k, s);
  return res ? res : k->route->oneshot(c, k, s);
}

/* The NCCL path, once the checks every rank makes alike have passed: a rank
 * that returned here while its peers entered the all-gather would leave
 * them waiting, so these refusals depend only on what was agreed. The
 * group's fault is not one of them: each rank learns of it at a time of its
 * own, and nothing on this path reads the receive memory it concerns. */
static kl_result nccl_path(kl_ctx *c, kl_call *k, CUstream s) {
  const kl_route *r = k->route;
  /* a spec's epilogue is applied by a generated kernel on every route's
   * NCCL path (the gather's relayout) */
  const char *needs = r->nccl_kernels ? r->nccl_kernels
                      : c->layout.epilogue ? "the spec's epilogue needs the generated relayout kernel"
                                           : NULL;
  if (needs && !c->kernels_everywhere)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: %s, and some rank could not build them (%s)",
                      c->rank, needs, c->stats.not_ready);
  if (!c->nccl_everywhere)
    return kl_rt_fail(KLRT_EUNAVAILABLE, "rank %d: the one-shot path cannot serve this call "
                      "and some rank's context has no NCCL communicator for the fallback",
                      c->rank);
  kl_result res = stage_for_kernels(c, k, s);
  return res ? res : r->nccl(c, k, s);
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

kl_result kl_dispatch(kl_ctx *c, kl_call *k, CUstream s) {
  const kl_route *r = k->route;
  k->in_bytes = (size_t)k->tokens * (size_t)c->layout.shard_bytes;
  k->kin = (CUdeviceptr)k->in;
  r->measure(c, k);
  /* the route's own arguments before the layer's: a wrong one (n_top) makes
   * the outputs' sizes meaningless, and its message says which */
  kl_result res = r->check ? r->check(c, k) : KLRT_OK;
  if (res || (res = check_args(c, k))) return res;
  kl_decline why = KL_DECLINE_COUNT;
  const int moves = r->sized && (!r->gathers || r->gathers(k));
  int path = kl_path_for(c, k->tokens, moves ? (long long)k->in_bytes : 0, &why);
  if (path == PATH_ONESHOT) c->stats.oneshot++;
  else c->stats.nccl++, c->stats.declined[why]++;
  if (r->count) r->count(c, k, path);
  res = path == PATH_ONESHOT ? oneshot_path(c, k, s) : nccl_path(c, k, s);
  if (r->logged && kl_log_enabled()) log_path(c, path, why, k->tokens);
  return res;
}
