/* GPU test: TP2 across two GPUs in two processes (NCCL bootstrap, no MPI).
 *
 *   gpu_tp2 SPEC_FILE NAME
 *
 * Each rank, in lock-step with the other:
 *   1. one-shot output == ncclAllGather + host slice, bit for bit (-0.0 aside),
 *      tokens 1, 3 and max_tokens, data that includes -0.0, NaN, Inf, subnormals;
 *   2. every forced decline (tokens > max_tokens, KLGEN_DISABLE=1, size over
 *      KLGEN_CROSSOVER_BYTES) gives the same output through NCCL;
 *   3. rank 0's input (then output) misaligned, rank 1's aligned: correct, no hang;
 *   4. rank 1 skips a step: rank 0's kernel gives up within its time limit and
 *      kl_ctx_status reports it.
 * Exit 77 with fewer than two GPUs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nccl.h> /* and cuda_runtime.h: klrt.h includes neither */

#include "gpu_nccl.h"
#include "klrt/klrt.h"

typedef struct rank_env {
  int rank;
  const kl_cu *cu;
  ncclComm_t comm;
  CUstream s;
  kl_spec spec;
  kl_layout l;
  testkern k;
  CUdeviceptr shard, out, ref, step, bad;
  size_t cap_tokens;
  int fails;
} rank_env;

#define EXPECT(e, cond, ...)                                     \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "rank %d: FAIL: ", (e)->rank);             \
      fprintf(stderr, __VA_ARGS__);                              \
      fprintf(stderr, "\n");                                     \
      (e)->fails++;                                              \
    }                                                            \
  } while (0)

/* Rank r's kl_config on its GPU, with its communicator. */
static kl_config config_of(const rank_env *e, int r) {
  kl_config cfg = rank_config(r, 2, e->rank, NULL);
  cfg.nccl = e->comm;
  return cfg;
}

static kl_ctx *make_ctx(rank_env *e, const char *file, const char *name) {
  kl_config cfg = config_of(e, e->rank);
  kl_ctx *c = NULL;
  kl_result r = kl_ctx_create_file(&c, file, name, &cfg);
  EXPECT(e, r == KLRT_OK, "create: %s", kl_last_error());
  return c;
}

/* ncclAllGather of `in` into e->ref: the reference for the step. */
#define NCCL_CHECK_REF(e, in, bytes)                                                      \
  EXPECT(e, ncclAllGather((void *)(in), (void *)(e)->ref, (bytes), ncclUint8, (e)->comm,    \
                          (cudaStream_t)(e)->s) == ncclSuccess, "ncclAllGather")

/* out [T, vocab] against e->ref [2, T, shard] sliced; waits for the stream. */
static long long compare_with_ref(rank_env *e, CUdeviceptr out, int tokens) {
  const kl_cu *cu = e->cu;
  int elem = e->l.elem_bytes;
  size_t shard_bytes = (size_t)tokens * (size_t)e->l.shard_bytes;
  size_t out_bytes = (size_t)tokens * (size_t)e->spec.vocab_size * (size_t)elem;
  char *got = malloc(out_bytes), *all = malloc(shard_bytes * 2);
  CU_CHECK(cu, cuStreamSynchronize(e->s));
  CU_CHECK(cu, cuMemcpyDtoH(got, out, out_bytes));
  CU_CHECK(cu, cuMemcpyDtoH(all, e->ref, shard_bytes * 2));
  long long bad = 0;
  for (int t = 0; t < tokens; t++)
    for (long long j = 0; j < e->spec.vocab_size; j++) {
      long long rr = j / e->l.shard, col = j % e->l.shard;
      const char *src = all + ((size_t)rr * (size_t)tokens + (size_t)t) * (size_t)e->l.shard_bytes +
                        (size_t)col * (size_t)elem;
      const char *dst = got + ((size_t)t * (size_t)e->spec.vocab_size + (size_t)j) * (size_t)elem;
      uint32_t want = 0, have = 0;
      memcpy(&want, src, (size_t)elem);
      memcpy(&have, dst, (size_t)elem);
      /* NCCL moves bits untouched; the one-shot path rewrites -0.0 to +0.0. */
      if (have != want && have != ref_expected(elem, want) && bad++ < 3)
        fprintf(stderr, "rank %d: tokens %d [%d][%lld]: 0x%x != nccl 0x%x\n", e->rank, tokens, t,
                j, have, want);
    }
  free(got), free(all);
  return bad;
}

/* fill -> gather -> ncclAllGather reference; returns mismatches vs reference. */
static long long step_vs_nccl(rank_env *e, kl_ctx *c, int tokens, size_t in_off, size_t out_off) {
  const kl_cu *cu = e->cu;
  size_t shard_bytes = (size_t)tokens * (size_t)e->l.shard_bytes;
  size_t out_bytes = (size_t)tokens * (size_t)e->spec.vocab_size * (size_t)e->l.elem_bytes;
  CUdeviceptr in = e->shard + in_off, out = e->out + out_off;
  CU_CHECK(cu, cuMemsetD32Async(e->out, 0x5a5a5a5a, (out_bytes + out_off + 3) / 4, e->s));
  launch_fill(cu, &e->k, in, tokens, e->l.shard, (unsigned)e->rank, e->step, e->s);
  kl_result r = kl_gather(c, (void *)in, (void *)out, tokens, e->s);
  EXPECT(e, r == KLRT_OK, "gather(%d tokens): %s", tokens, kl_last_error());
  NCCL_CHECK_REF(e, in, shard_bytes);
  launch_bump(cu, &e->k, e->step, e->s);
  return compare_with_ref(e, out, tokens);
}

static void expect_path(rank_env *e, kl_ctx *c, uint64_t oneshot, uint64_t nccl, int decline,
                        const char *what) {
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(c, &st);
  EXPECT(e, st.oneshot == oneshot && st.nccl == nccl, "%s: %llu one-shot / %llu NCCL calls, "
         "expected %llu / %llu", what, (unsigned long long)st.oneshot, (unsigned long long)st.nccl,
         (unsigned long long)oneshot, (unsigned long long)nccl);
  if (decline >= 0)
    EXPECT(e, st.declined[decline] == nccl, "%s: %llu declines for %s", what,
           (unsigned long long)st.declined[decline], kl_decline_name((kl_decline)decline));
}

static void test_oneshot_equals_nccl(rank_env *e, const char *file, const char *name) {
  setenv("KLGEN_CROSSOVER_BYTES", "1000000000", 1); /* one-shot up to max_tokens here */
  kl_ctx *c = make_ctx(e, file, name);
  unsetenv("KLGEN_CROSSOVER_BYTES");
  if (!c) return;
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(c, &st);
  EXPECT(e, st.oneshot_ready, "one-shot not ready: %s", st.not_ready);
  int tokens[] = {1, 3, (int)e->spec.max_tokens};
  long long bad = 0;
  for (int i = 0; i < 3; i++)
    for (int rep = 0; rep < 4; rep++) bad += step_vs_nccl(e, c, tokens[i], 0, 0);
  EXPECT(e, bad == 0, "one-shot vs NCCL: %lld mismatches", bad);
  expect_path(e, c, 12, 0, -1, "one-shot");
  /* misaligned (one element) input, then output, on rank 0 only */
  size_t off = (size_t)e->l.elem_bytes;
  long long bad_in = step_vs_nccl(e, c, 3, e->rank == 0 ? off : 0, 0);
  long long bad_out = step_vs_nccl(e, c, 3, 0, e->rank == 0 ? off : 0);
  EXPECT(e, bad_in == 0 && bad_out == 0, "misaligned: %lld / %lld mismatches", bad_in, bad_out);
  expect_path(e, c, 14, 0, -1, "misaligned");
  /* tokens over capacity: NCCL serves */
  long long bad_over = step_vs_nccl(e, c, (int)e->spec.max_tokens + 5, 0, 0);
  EXPECT(e, bad_over == 0, "tokens > max_tokens via NCCL: %lld mismatches", bad_over);
  expect_path(e, c, 14, 1, KL_DECLINE_TOKENS, "tokens decline");
  /* the same with rank 0's output misaligned: the NCCL path's relayout
   * stages it too, in a buffer that outgrows the one-shot's */
  bad_over = step_vs_nccl(e, c, (int)e->spec.max_tokens + 5, 0, e->rank == 0 ? off : 0);
  EXPECT(e, bad_over == 0, "misaligned, tokens > max_tokens: %lld mismatches", bad_over);
  expect_path(e, c, 14, 2, KL_DECLINE_TOKENS, "tokens decline, misaligned");
  EXPECT(e, kl_ctx_status(c) == KLRT_OK, "status: %s", kl_last_error());
  EXPECT(e, kl_ctx_destroy(c) == KLRT_OK, "destroy: %s", kl_last_error());
  printf("rank %d: one-shot == NCCL (tokens 1, 3, %d; misaligned; over capacity, aligned and "
         "not): %s\n", e->rank,
         tokens[2], e->fails ? "FAIL" : "ok");
}

static void test_forced_decline(rank_env *e, const char *file, const char *name,
                                const char *var, const char *val, int decline) {
  setenv(var, val, 1);
  kl_ctx *c = make_ctx(e, file, name);
  unsetenv(var);
  if (!c) return;
  long long bad = step_vs_nccl(e, c, 1, 0, 0) + step_vs_nccl(e, c, 3, 0, 0);
  EXPECT(e, bad == 0, "%s=%s: %lld mismatches", var, val, bad);
  expect_path(e, c, 0, 2, decline, var);
  kl_ctx_destroy(c);
  printf("rank %d: %s=%s -> NCCL path, same output: %s\n", e->rank, var, val,
         bad ? "FAIL" : "ok");
}

/* Only rank 1 fails to build the kernel: every rank must agree it is not
 * ready and serve every call through NCCL. */
static void test_not_ready_anywhere(rank_env *e, const char *file, const char *name) {
  if (e->rank == 1) setenv("KLGEN_FAULT_JIT", "1", 1);
  kl_ctx *c = make_ctx(e, file, name);
  unsetenv("KLGEN_FAULT_JIT");
  if (!c) return;
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(c, &st);
  EXPECT(e, !st.oneshot_ready && strstr(st.not_ready, "rank 1: JIT failed"),
         "readiness not agreed: ready %d, '%s'", st.oneshot_ready, st.not_ready);
  long long bad = step_vs_nccl(e, c, 1, 0, 0) + step_vs_nccl(e, c, 3, 0, 0);
  EXPECT(e, bad == 0, "not ready: %lld mismatches", bad);
  expect_path(e, c, 0, 2, KL_DECLINE_NOT_READY, "not ready");
  /* kl_argmax's NCCL path runs the select kernels on every rank: both ranks
   * refuse alike (rank 0 entering the all-gather alone would wait forever) */
  kl_result a = kl_argmax(c, (void *)e->shard, (int64_t *)e->out, NULL, 1, e->s);
  EXPECT(e, a == KLRT_EUNAVAILABLE && strstr(kl_last_error(), "some rank could not build"),
         "argmax without select kernels on rank 1: %s (%s)", kl_result_name(a), kl_last_error());
  kl_ctx_destroy(c);
  printf("rank %d: JIT failed on rank 1 only -> not ready on both (%s), NCCL serves: %s\n",
         e->rank, st.not_ready, bad ? "FAIL" : "ok");
}

/* Both ranks pass a pointer to the other GPU's memory: a clear error on both,
 * and no GPU work (one rank erring alone would leave its peer waiting). */
static void test_foreign_pointer(rank_env *e, const char *file, const char *name) {
  kl_ctx *c = make_ctx(e, file, name);
  if (!c) return;
  const kl_cu *cu = e->cu;
  CUdevice other;
  CUcontext octx, prev;
  CUdeviceptr foreign;
  CU_CHECK(cu, cuDeviceGet(&other, 1 - e->rank));
  CU_CHECK(cu, cuDevicePrimaryCtxRetain(&octx, other));
  CU_CHECK(cu, cuCtxPushCurrent(octx));
  CU_CHECK(cu, cuMemAlloc(&foreign, 1 << 20));
  CU_CHECK(cu, cuCtxPopCurrent(&prev));
  kl_result r = kl_gather(c, (void *)foreign, (void *)e->out, 1, e->s);
  EXPECT(e, r == KLRT_EINVAL && strstr(kl_last_error(), "is on GPU"), "foreign shard: %s (%s)",
         kl_result_name(r), kl_last_error());
  r = kl_gather(c, (void *)e->shard, (void *)foreign, 1, e->s);
  EXPECT(e, r == KLRT_EINVAL, "foreign out: %s", kl_result_name(r));
  r = kl_gather(c, (void *)e->shard, (void *)e->out, 0, e->s);
  EXPECT(e, r == KLRT_EINVAL && strstr(kl_last_error(), "tokens is 0"), "tokens 0");
  r = kl_gather(c, NULL, (void *)e->out, 1, e->s);
  EXPECT(e, r == KLRT_EINVAL, "NULL shard");
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(c, &st);
  EXPECT(e, st.oneshot == 0 && st.nccl == 0, "misuse reached a path");
  /* still usable afterwards */
  EXPECT(e, step_vs_nccl(e, c, 1, 0, 0) == 0, "after misuse");
  kl_ctx_destroy(c);
  EXPECT(e, kl_gather(c, (void *)e->shard, (void *)e->out, 1, e->s) == KLRT_ESTATE,
         "gather after destroy");
  CU_CHECK(cu, cuCtxPushCurrent(octx));
  cu->cuMemFree(foreign);
  CU_CHECK(cu, cuCtxPopCurrent(&prev));
  printf("rank %d: foreign GPU pointers, tokens 0, NULL, use after destroy -> errors: %s\n",
         e->rank, e->fails ? "FAIL" : "ok");
}

/* Rank 0's shard lies inside its own output buffer: staged, correct. */
static void test_overlap(rank_env *e, const char *file, const char *name) {
  kl_ctx *c = make_ctx(e, file, name);
  if (!c) return;
  const kl_cu *cu = e->cu;
  int T = 3;
  size_t shard_bytes = (size_t)T * (size_t)e->l.shard_bytes;
  size_t out_bytes = (size_t)T * (size_t)e->spec.vocab_size * (size_t)e->l.elem_bytes;
  launch_fill(cu, &e->k, e->shard, T, e->l.shard, (unsigned)e->rank, e->step, e->s);
  CUdeviceptr in = e->shard;
  if (e->rank == 0) { /* a copy of the shard in the middle of the output */
    in = e->out + ((out_bytes / 2) & ~(size_t)15);
    CU_CHECK(cu, cuMemcpyAsync(in, e->shard, shard_bytes, e->s));
  }
  kl_result r = kl_gather(c, (void *)in, (void *)e->out, T, e->s);
  EXPECT(e, r == KLRT_OK, "overlapping gather: %s", kl_last_error());
  NCCL_CHECK_REF(e, e->shard, shard_bytes);
  launch_bump(cu, &e->k, e->step, e->s);
  long long bad = compare_with_ref(e, e->out, T);
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(c, &st);
  EXPECT(e, bad == 0, "overlap: %lld mismatches", bad);
  EXPECT(e, st.oneshot == 1 && (e->rank != 0 || st.staged == 1), "overlap: path %llu/%llu staged "
         "%llu", (unsigned long long)st.oneshot, (unsigned long long)st.nccl,
         (unsigned long long)st.staged);
  kl_ctx_destroy(c);
  printf("rank %d: input overlapping the output on rank 0 only -> staged, same result: %s\n",
         e->rank, bad ? "FAIL" : "ok");
}

/* The NCCL path inside a captured CUDA graph, replayed with new data. */
static void test_nccl_graph(rank_env *e, const char *file, const char *name) {
  setenv("KLGEN_DISABLE", "1", 1);
  kl_ctx *c = make_ctx(e, file, name);
  unsetenv("KLGEN_DISABLE");
  if (!c) return;
  const kl_cu *cu = e->cu;
  int T = 3;
  size_t shard_bytes = (size_t)T * (size_t)e->l.shard_bytes;
  gpu_graph gr;
  gpu_capture_begin(cu, e->s);
  launch_fill(cu, &e->k, e->shard, T, e->l.shard, (unsigned)e->rank, e->step, e->s);
  kl_result r = kl_gather(c, (void *)e->shard, (void *)e->out, T, e->s);
  NCCL_CHECK_REF(e, e->shard, shard_bytes);
  launch_bump(cu, &e->k, e->step, e->s);
  gpu_capture_end(cu, e->s, &gr);
  EXPECT(e, r == KLRT_OK, "capturing the NCCL path: %s", kl_last_error());
  gpu_graph_instantiate(cu, &gr);
  long long bad = 0;
  for (int rep = 0; rep < 5; rep++) {
    gpu_graph_replay(cu, &gr, e->s, 1);
    bad += compare_with_ref(e, e->out, T);
  }
  EXPECT(e, bad == 0, "NCCL path in a graph: %lld mismatches", bad);
  gpu_graph_destroy(cu, &gr);
  kl_ctx_destroy(c);
  printf("rank %d: NCCL path captured in a CUDA graph, 5 replays: %s\n", e->rank,
         bad ? "FAIL" : "ok");
}

/* Ranks that disagree with their communicator refuse alike, without hanging. */
static void test_rank_mismatch(rank_env *e, const char *file, const char *name) {
  kl_config cfg = config_of(e, 1 - e->rank);
  kl_ctx *c = NULL;
  kl_result r = kl_ctx_create_file(&c, file, name, &cfg);
  EXPECT(e, r == KLRT_EINVAL && c == NULL && strstr(kl_last_error(), "NCCL communicator says"),
         "swapped ranks: %s (%s)", kl_result_name(r), kl_last_error());
  printf("rank %d: rank swapped against the communicator -> %s: %s\n", e->rank,
         kl_result_name(r), r == KLRT_EINVAL ? "ok" : "FAIL");
}

/* Rank 1 skips a step; rank 0 must give up and say so. */
static void test_skipped_step(rank_env *e) {
  char src[512];
  snprintf(src, sizeof src,
           "return { name = 'skip_test', vocab_size = %lld, tp = 2, dtype = '%s', "
           "max_tokens = 4, timeout_ms = 300 }",
           (long long)e->spec.vocab_size, kl_dtype_name(e->spec.dtype));
  kl_config cfg = config_of(e, e->rank);
  kl_ctx *c = NULL;
  if (kl_ctx_create_string(&c, src, NULL, &cfg) != KLRT_OK) {
    EXPECT(e, 0, "create skip ctx: %s", kl_last_error());
    return;
  }
  if (e->rank == 0) {
    kl_gather(c, (void *)e->shard, (void *)e->out, 1, e->s);
    CU_CHECK(e->cu, cuStreamSynchronize(e->s)); /* returns: the poll is time-limited */
    kl_result r = kl_ctx_status(c);
    EXPECT(e, r == KLRT_EDEVICE, "status after a skipped peer: %s (%s)", kl_result_name(r),
           kl_last_error());
    printf("rank 0: peer skipped a step -> %s: %s\n", kl_result_name(r), kl_last_error());
  }
  kl_ctx_destroy(c);
}

/* The spec file and the name of the spec in it. */
typedef struct spec_arg {
  const char *file, *name;
} spec_arg;

static int run_rank(int rank, const int fd_id[2], void *arg) {
  const char *file = ((const spec_arg *)arg)->file, *name = ((const spec_arg *)arg)->name;
  rank_env e = {.rank = rank};
  e.cu = gpu_require(2);
  const kl_cu *cu = e.cu;
  if (gpu_nccl_rank(cu, rank, 2, fd_id, NULL, &e.comm)) return 1;
  kl_spec_list l;
  kl_err err;
  if (kl_spec_load_file(file, NULL, &l, &err)) return fprintf(stderr, "%s\n", err.msg), 1;
  for (int i = 0; i < l.n; i++)
    if (!strcmp(l.v[i].name, name)) e.spec = l.v[i];
  kl_spec_list_free(&l);
  if (e.spec.tp != 2) return fprintf(stderr, "%s is not a tp 2 spec in %s\n", name, file), 1;
  kl_layout_derive(&e.spec, &e.l, &err);
  size_t t = (size_t)e.spec.max_tokens + 8, elem = (size_t)e.l.elem_bytes;
  CU_CHECK(cu, cuStreamCreate(&e.s, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cu, cuMemAlloc(&e.shard, t * (size_t)e.l.shard_bytes + 64));
  CU_CHECK(cu, cuMemAlloc(&e.out, t * (size_t)e.spec.vocab_size * elem + 64));
  CU_CHECK(cu, cuMemAlloc(&e.ref, 2 * t * (size_t)e.l.shard_bytes));
  CU_CHECK(cu, cuMemAlloc(&e.step, 4));
  CU_CHECK(cu, cuMemAlloc(&e.bad, 8));
  CU_CHECK(cu, cuMemsetD32Async(e.step, 0, 1, e.s)); /* on e.s: ordered before the steps */
  if (testkern_load(cu, (int)elem, &e.k)) return 1;
  test_oneshot_equals_nccl(&e, file, name);
  test_forced_decline(&e, file, name, "KLGEN_DISABLE", "1", KL_DECLINE_DISABLED);
  test_forced_decline(&e, file, name, "KLGEN_CROSSOVER_BYTES", "1", KL_DECLINE_SIZE);
  test_overlap(&e, file, name);
  test_nccl_graph(&e, file, name);
  test_rank_mismatch(&e, file, name);
  test_not_ready_anywhere(&e, file, name);
  test_foreign_pointer(&e, file, name);
  test_skipped_step(&e);
  ncclCommDestroy(e.comm);
  return e.fails ? 1 : 0;
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s SPEC_FILE NAME\n", argv[0]);
    return 2;
  }
  gpu_require_in_child(2);
  spec_arg a = {argv[1], argv[2]};
  int fails = ranks_fork(2, run_rank, &a);
  if (fails < 0) return 1;
  printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails ? 1 : 0;
}
