/* GPU test: a fault never looks like success, and never strands a rank in
 * a collective. Two ranks as threads on one GPU (CUDA_DEVICE_MAX_CONNECTIONS=32),
 * each with a communicator of the NCCL stand-in (tests/diff/nccl_standin.c,
 * whose path is argv[2]: NCCL refuses two ranks on one GPU), a spec with
 * timeout_ms = 200 (or argv[1]), and rank 1 skipping one call, for each of
 * kl_gather, kl_argmax, kl_topk and kl_sample (by the shards bare, by the
 * shards with a top_p array, and gathering: with a top-n logprob):
 *
 *   - rank 0's call times out; it and the call rank 0 makes right after it
 *     (before the host can know) return KLRT_OK, and both write poison (NaN
 *     logits, index -1, NaN values and lse; kl_sample's token -1 and NaN
 *     logprob), not stale outputs;
 *   - rank 0's next call (one-shot) returns KLRT_EDEVICE naming the ranks and
 *     the step, as does kl_ctx_status, without waiting for the device;
 *   - a CUDA graph captured before the fault replays into poison;
 *   - then, rank 0 knowing of the fault and rank 1 not yet, a call on the
 *     NCCL path (tokens past max_tokens) runs on both ranks: KLRT_OK and
 *     results on both, and the stand-in never gives up on a peer (a rank
 *     that refused it would leave the other in the all-gather);
 *   - rank 1, whose kernels learn of it from the fault word rank 0 wrote into
 *     its memory, writes poison in its next call and fails the call after;
 *   - both ranks knowing, an NCCL-path call and a graph of one captured
 *     before the fault still give results on both;
 *   - nothing hangs, and destroy works.
 *
 * Once more for kl_gather with rank 1 asking kl_ctx_status first, once rank
 * 0's timed-out step is done: it reports the fault (rank 0 wrote it into
 * rank 1's memory) and keeps it, so rank 1's next one-shot call returns
 * KLRT_EDEVICE, its outputs untouched.
 *
 * And once with no rank skipping: kl_sample with top_p 0.5, whose rows
 * (all equal) are sampled whole from the ranks' staged rows, where rank 1's
 * marks of a step are cleared (klrt_testing) once its kernel wrote them and
 * before rank 0 starts its own: both ranks' waits for those marks time out,
 * and the step goes as above for rank 0; rank 1's call of that step writes
 * poison too, and its next call fails.
 * Exit 77 without a GPU. */
#include <dlfcn.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_util.h"
#include "klrt/klrt.h"

#define VOCAB 4096
#define MAX_TOKENS 4
#define TOKENS 2 /* a one-shot call's */
#define NCCL_TOKENS 6 /* past MAX_TOKENS: the NCCL path's */
#define K 8
#define SHARD (VOCAB / 2)
#define SETS 3
#define NCCL_SET 2 /* the output set of the NCCL-path calls and their graph */

/* kl_sample four ways: no filter (the shard sampler), a filter that is off
 * (the shard sampler with candidates), a top-n logprob (the gather and the
 * row sampler), and top_p 0.5 (rows sampled whole from the staged rows, a
 * peer's marks lost) */
enum { GATHER, ARGMAX, TOPK, SAMPLE, SAMPLE_FILTERED, SAMPLE_GATHERED, SAMPLE_MARKS, GATHER_STATUS,
       OPS };
static const char *const names[] = {"kl_gather", "kl_argmax", "kl_topk", "kl_sample",
                                    "kl_sample (filters)", "kl_sample (gathered)",
                                    "kl_sample (a peer's marks lost)",
                                    "kl_gather (rank 1 asks kl_ctx_status first)"};
/* The call an op makes. */
static int call_of(int op) { return op == GATHER_STATUS ? GATHER : op; }
static int is_sample(int op) { return op >= SAMPLE && op <= SAMPLE_MARKS; }

/* The NCCL stand-in, loaded from its path (libklrt loads the same library). */
static ncclResult_t (*standin_init)(ncclComm_t *, int, const int *);
static ncclResult_t (*standin_destroy)(ncclComm_t);
static unsigned (*standin_timeouts)(void);

typedef struct shared {
  const kl_cu *cu;
  int timeout_ms;
  CUcontext cuctx;
  kl_group *group;
  ncclComm_t comms[2];
  rank_threads threads;
  int op;
  int failures;
  pthread_mutex_t m;
} shared;

typedef struct rank_arg {
  shared *sh;
  int rank;
} rank_arg;

__attribute__((format(printf, 3, 4))) static void failf(shared *sh, int rank, const char *fmt, ...) {
  pthread_mutex_lock(&sh->m);
  sh->failures++;
  printf("FAIL rank %d, %s: ", rank, names[sh->op]);
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  pthread_mutex_unlock(&sh->m);
}

/* A rank's input and three sets of outputs: a one-shot call's, the next
 * call's, and the NCCL-path calls'. */
typedef struct outs {
  CUdeviceptr out, index, value, lse;
} outs;
typedef struct bufs {
  CUdeviceptr shard;
  CUdeviceptr temperature; /* kl_sample's: 0.7 for every row */
  CUdeviceptr top_p;       /* and 1 (off), for a call with a filter array */
  CUdeviceptr top_p_half;  /* and 0.5: every row is sampled whole */
  outs o[SETS];
  CUstream s;
} bufs;

/* The op's call of `tokens` rows into output set `set`. */
static kl_result call_n(shared *sh, kl_ctx *c, const bufs *b, int set, int tokens) {
  const outs *o = &b->o[set];
  switch (call_of(sh->op)) {
  case GATHER: return kl_gather(c, (void *)b->shard, (void *)o->out, tokens, b->s);
  case ARGMAX:
    return kl_argmax(c, (void *)b->shard, (int64_t *)o->index, (float *)o->value, tokens, b->s);
  case SAMPLE:
  case SAMPLE_FILTERED:
  case SAMPLE_GATHERED:
  case SAMPLE_MARKS: { /* the token in index, its logprob in value (top-n: index after them) */
    kl_sampling p = KL_SAMPLING_INIT;
    p.temperature = (const float *)b->temperature;
    if (sh->op == SAMPLE_FILTERED) p.top_p = (const float *)b->top_p;
    if (sh->op == SAMPLE_MARKS) p.top_p = (const float *)b->top_p_half;
    const int n_top = sh->op == SAMPLE_GATHERED;
    int64_t *top = n_top ? (int64_t *)o->index + tokens : NULL;
    return kl_sample(c, (void *)b->shard, &p, (int64_t *)o->index, (float *)o->value, top, NULL,
                     n_top, tokens, b->s);
  }
  default:
    return kl_topk(c, (void *)b->shard, (int64_t *)o->index, (float *)o->value, (float *)o->lse,
                   tokens, b->s);
  }
}

/* The op's one-shot call (TOKENS rows). */
static kl_result call(shared *sh, kl_ctx *c, const bufs *b, int set) {
  return call_n(sh, c, b, set, TOKENS);
}

/* Outputs set to a canary (0x5a bytes), so a call that leaves them shows. */
static void canary(shared *sh, const bufs *b, int set) {
  const kl_cu *cu = sh->cu;
  const outs *o = &b->o[set];
  CU_CHECK(cu, cuMemsetD32Async(o->out, 0x5a5a5a5au, NCCL_TOKENS * VOCAB / 2, b->s));
  CU_CHECK(cu, cuMemsetD32Async(o->index, 0x5a5a5a5au, NCCL_TOKENS * K * 2, b->s));
  CU_CHECK(cu, cuMemsetD32Async(o->value, 0x5a5a5a5au, NCCL_TOKENS * K, b->s));
  CU_CHECK(cu, cuMemsetD32Async(o->lse, 0x5a5a5a5au, NCCL_TOKENS, b->s));
}

/* Whether the set's outputs still hold the canary (a refused call). Waits
 * for the stream. */
static int canary_kept(shared *sh, const bufs *b, int set) {
  const kl_cu *cu = sh->cu;
  const outs *o = &b->o[set];
  uint32_t w[4];
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  CU_CHECK(cu, cuMemcpyDtoH(&w[0], o->out, 4));
  CU_CHECK(cu, cuMemcpyDtoH(&w[1], o->index, 4));
  CU_CHECK(cu, cuMemcpyDtoH(&w[2], o->value, 4));
  CU_CHECK(cu, cuMemcpyDtoH(&w[3], o->lse, 4));
  return w[0] == 0x5a5a5a5au && w[1] == 0x5a5a5a5au && w[2] == 0x5a5a5a5au &&
         w[3] == 0x5a5a5a5au;
}

/* 1: every output of the op's call of `tokens` rows in the set is poison;
 * 0: every one is what the input (1.0 everywhere) gives. Waits for the
 * stream. */
static int outputs_are_n(shared *sh, const bufs *b, int set, int poison, int tokens) {
  const kl_cu *cu = sh->cu;
  const outs *o = &b->o[set];
  static _Thread_local uint16_t out[NCCL_TOKENS * VOCAB];
  int64_t index[NCCL_TOKENS * K];
  uint32_t value[NCCL_TOKENS * K], lse[NCCL_TOKENS];
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  CU_CHECK(cu, cuMemcpyDtoH(out, o->out, sizeof out));
  CU_CHECK(cu, cuMemcpyDtoH(index, o->index, sizeof index));
  CU_CHECK(cu, cuMemcpyDtoH(value, o->value, sizeof value));
  CU_CHECK(cu, cuMemcpyDtoH(lse, o->lse, sizeof lse));
  const int op = call_of(sh->op);
  int k = op == TOPK ? K : 1, ok = 1;
  if (is_sample(op)) /* all equal: any column, log(1 / VOCAB) */
    for (int t = 0; t < tokens; t++) {
      float lp;
      memcpy(&lp, &value[t], 4);
      const int good = poison ? index[t] == -1 && (value[t] & 0x7fffffffu) > 0x7f800000u
                              : index[t] >= 0 && index[t] < VOCAB && lp > -8.32f && lp < -8.31f;
      if (!good) printf("token %d: index %lld, logprob %g (0x%08x)\n", t, (long long)index[t], lp,
                        value[t]);
      ok &= good;
    }
  else if (op == GATHER)
    for (int i = 0; i < tokens * VOCAB; i++)
      ok &= poison ? (out[i] & 0x7fffu) > 0x7f80u : out[i] == 0x3f80u;
  else /* all equal: the lowest columns, in order */
    for (int i = 0; i < tokens * k; i++)
      ok &= poison ? index[i] == -1 && (value[i] & 0x7fffffffu) > 0x7f800000u
                   : index[i] == i % k && value[i] == 0x3f800000u;
  if (op == TOPK)
    for (int t = 0; t < tokens; t++)
      ok &= poison ? (lse[t] & 0x7fffffffu) > 0x7f800000u : lse[t] != 0x5a5a5a5au;
  return ok;
}

static int outputs_are(shared *sh, const bufs *b, int set, int poison) {
  return outputs_are_n(sh, b, set, poison, TOKENS);
}

static void expect_rc(shared *sh, int rank, kl_result got, kl_result want, const char *when) {
  if (got != want)
    failf(sh, rank, "%s: got %s (%s), want %s", when, kl_result_name(got), kl_last_error(),
          kl_result_name(want));
  else if (want == KLRT_EDEVICE && !strstr(kl_last_error(), "waiting for rank 1"))
    failf(sh, rank, "%s: the message does not name the ranks: %s", when, kl_last_error());
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Rank 1's step whose marks are lost: the call, then, once its kernel has
 * written this step's marks (polled from another stream while it runs: it
 * waits for rank 0's records), every mark back to the sentinel. */
static void lose_marks(shared *sh, kl_ctx *c, const bufs *b) {
  const kl_cu *cu = sh->cu;
  const gpu_marks m = gpu_marks_of(c);
  CUstream side;
  CU_CHECK(cu, cuStreamCreate(&side, CU_STREAM_NON_BLOCKING));
  gpu_marks_clear(cu, &m, side); /* idle: no step reads them */
  expect_rc(sh, 1, call(sh, c, b, 0), KLRT_OK, "the call whose marks are lost");
  /* every mark of the step, none left to land after the fill below (the
   * buffers held only the sentinel before the call) */
  const size_t want = (size_t)TOKENS * (size_t)m.per_token;
  size_t seen = 0;
  const int limit_ms = 1000 + 10 * sh->timeout_ms; /* under a tool too */
  for (int ms = 0; ms < limit_ms && (seen = gpu_marks_set(cu, &m, side)) < want; ms++)
    sleep_ms(1);
  if (seen != want)
    failf(sh, 1, "rank 1's kernel wrote %zu marks in %d ms, want %zu", seen, limit_ms, want);
  gpu_marks_clear(cu, &m, side);
  CU_CHECK(cu, cuStreamDestroy(side));
}

/* The op on the NCCL path (tokens past max_tokens): KLRT_OK and results,
 * whatever this rank knows of a fault. */
static void nccl_step(shared *sh, int rank, kl_ctx *c, const bufs *b, const char *what) {
  canary(sh, b, NCCL_SET);
  expect_rc(sh, rank, call_n(sh, c, b, NCCL_SET, NCCL_TOKENS), KLRT_OK, what);
  if (!outputs_are_n(sh, b, NCCL_SET, 0, NCCL_TOKENS))
    failf(sh, rank, "%s: its outputs are not results", what);
}

static void *rank_main(void *arg) {
  rank_arg *ra = arg;
  shared *sh = ra->sh;
  const kl_cu *cu = sh->cu;
  int rank = ra->rank;
  CU_CHECK(cu, cuCtxSetCurrent(sh->cuctx));
  bufs b;
  CU_CHECK(cu, cuStreamCreate(&b.s, CU_STREAM_NON_BLOCKING));
  /* room for an NCCL-path call's rows; a one-shot call uses the first ones */
  CU_CHECK(cu, cuMemAlloc(&b.shard, NCCL_TOKENS * SHARD * 2));
  CU_CHECK(cu, cuMemsetD32(b.shard, 0x3f803f80u, NCCL_TOKENS * SHARD / 2)); /* 1.0 everywhere */
  CU_CHECK(cu, cuMemAlloc(&b.temperature, NCCL_TOKENS * 4));
  CU_CHECK(cu, cuMemsetD32(b.temperature, 0x3f333333u, NCCL_TOKENS)); /* 0.7f */
  CU_CHECK(cu, cuMemAlloc(&b.top_p, NCCL_TOKENS * 4));
  CU_CHECK(cu, cuMemsetD32(b.top_p, 0x3f800000u, NCCL_TOKENS)); /* 1.0f */
  CU_CHECK(cu, cuMemAlloc(&b.top_p_half, NCCL_TOKENS * 4));
  CU_CHECK(cu, cuMemsetD32(b.top_p_half, 0x3f000000u, NCCL_TOKENS)); /* 0.5f */
  CU_CHECK(cu, cuCtxSynchronize()); /* the legacy stream's memsets, before any kernel reads */
  for (int i = 0; i < SETS; i++) {
    CU_CHECK(cu, cuMemAlloc(&b.o[i].out, NCCL_TOKENS * VOCAB * 2));
    CU_CHECK(cu, cuMemAlloc(&b.o[i].index, NCCL_TOKENS * K * 8));
    CU_CHECK(cu, cuMemAlloc(&b.o[i].value, NCCL_TOKENS * K * 4));
    CU_CHECK(cu, cuMemAlloc(&b.o[i].lse, NCCL_TOKENS * 4));
  }
  char src[256];
  snprintf(src, sizeof src, "return { name = 'fault_test', vocab_size = %d, tp = 2, dtype = "
           "'bf16', max_tokens = %d, timeout_ms = %d, topk = %d }", VOCAB, MAX_TOKENS,
           sh->timeout_ms, K);
  kl_config cfg = rank_config(rank, 2, 0, sh->group);
  cfg.nccl = sh->comms[rank];
  kl_ctx *c = NULL;
  if (kl_ctx_create_string(&c, src, NULL, &cfg) != KLRT_OK) {
    failf(sh, rank, "create: %s", kl_last_error()); /* the peer's creation gives up too */
    return NULL;
  }
  /* a good step, and the same step captured in a graph (replayed later);
   * so too on the NCCL path */
  canary(sh, &b, 0);
  expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_OK, "a good step");
  if (!outputs_are(sh, &b, 0, 0)) failf(sh, rank, "a good step's outputs are wrong");
  if (sh->op == SAMPLE_MARKS) { /* its rows were sampled whole: the marks were waited for */
    kl_stats st = KL_STATS_INIT;
    if (kl_ctx_stats(c, &st) != KLRT_OK || st.sample_gathered != 1 || st.oneshot != 1)
      failf(sh, rank, "a good step: %llu gathered calls of %llu one-shot, want 1 of 1",
            (unsigned long long)st.sample_gathered, (unsigned long long)st.oneshot);
  }
  /* a good NCCL-path step: its buffers grow here, not in the capture below */
  nccl_step(sh, rank, c, &b, "a good NCCL-path step");
  ranks_sync(&sh->threads);
  gpu_graph g, gn;
  gpu_capture_begin(cu, b.s);
  expect_rc(sh, rank, call(sh, c, &b, 1), KLRT_OK, "capture");
  gpu_capture_end(cu, b.s, &g);
  gpu_capture_begin(cu, b.s);
  expect_rc(sh, rank, call_n(sh, c, &b, NCCL_SET, NCCL_TOKENS), KLRT_OK,
            "capture on the NCCL path");
  gpu_capture_end(cu, b.s, &gn);
  ranks_sync(&sh->threads);
  gpu_graph_instantiate(cu, &g);
  gpu_graph_instantiate(cu, &gn);
  ranks_sync(&sh->threads);
  if (rank == 1 && sh->op == SAMPLE_MARKS) {
    canary(sh, &b, 0);
    lose_marks(sh, c, &b);
  }
  ranks_sync(&sh->threads);
  if (rank == 0) {
    /* rank 1 skips this call: it times out. The call right after it is made
     * before the host can know (the first has its time limit to go): its kernel
     * finds the fault when it starts. Both return KLRT_OK, and both must
     * write poison. */
    canary(sh, &b, 0);
    canary(sh, &b, 1);
    expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_OK, "the call that times out");
    expect_rc(sh, rank, call(sh, c, &b, 1), KLRT_OK, "the call before the host knows");
    if (!outputs_are(sh, &b, 0, 1)) failf(sh, rank, "the timed-out step's outputs are not poison");
    if (!outputs_are(sh, &b, 1, 1)) failf(sh, rank, "the next step's outputs are not poison");
    expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_EDEVICE, "the call after the host knows");
    printf("rank 0, %s: %s\n", names[sh->op], kl_last_error());
    expect_rc(sh, rank, kl_ctx_status(c), KLRT_EDEVICE, "kl_ctx_status");
    canary(sh, &b, 1);
    gpu_graph_replay(cu, &g, b.s, 1);
    if (!outputs_are(sh, &b, 1, 1)) failf(sh, rank, "a graph replayed after is not poison");
  }
  ranks_sync(&sh->threads); /* rank 0 has timed out */
  /* Rank 0 knows of the fault, rank 1 (but with lost marks) not yet: the
   * NCCL path still runs on both, with results. */
  nccl_step(sh, rank, c, &b, "an NCCL-path call, rank 0 knowing of the fault");
  ranks_sync(&sh->threads);
  if (rank == 1 && sh->op == GATHER_STATUS) {
    /* rank 0's timed-out step is done (its stream waited for before the
     * barriers): the fault is in this rank's memory, not in its mirror.
     * kl_ctx_status finds it and keeps it: the next call is refused. */
    expect_rc(sh, rank, kl_ctx_status(c), KLRT_EDEVICE, "kl_ctx_status before any call");
    canary(sh, &b, 0);
    expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_EDEVICE, "the call after kl_ctx_status");
    if (!canary_kept(sh, &b, 0)) failf(sh, rank, "a refused call wrote its outputs");
    printf("rank 1, %s: %s\n", names[sh->op], kl_last_error());
  } else if (rank == 1 && sh->op == SAMPLE_MARKS) {
    /* its own wait for its marks timed out too: its host knows once the
     * call is done */
    if (!outputs_are(sh, &b, 0, 1)) failf(sh, rank, "the timed-out step's outputs are not poison");
    expect_rc(sh, rank, call(sh, c, &b, 1), KLRT_EDEVICE, "the call after");
    printf("rank 1, %s: %s\n", names[sh->op], kl_last_error());
  } else if (rank == 1) {
    /* the fault is in this rank's memory (rank 0 wrote it), not yet in its
     * host's mirror: this call returns KLRT_OK and writes poison */
    canary(sh, &b, 0);
    expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_OK, "the call after the peer's time-out");
    if (!outputs_are(sh, &b, 0, 1)) failf(sh, rank, "its outputs are not poison");
    expect_rc(sh, rank, call(sh, c, &b, 0), KLRT_EDEVICE, "the call after that");
    printf("rank 1, %s: %s\n", names[sh->op], kl_last_error());
  }
  ranks_sync(&sh->threads);
  /* both know: the NCCL path still gives results, eager and replayed */
  nccl_step(sh, rank, c, &b, "an NCCL-path call, both ranks knowing of the fault");
  canary(sh, &b, NCCL_SET);
  gpu_graph_replay(cu, &gn, b.s, 1);
  if (!outputs_are_n(sh, &b, NCCL_SET, 0, NCCL_TOKENS))
    failf(sh, rank, "an NCCL-path graph replayed after the fault is not results");
  gpu_graph_destroy(cu, &g);
  gpu_graph_destroy(cu, &gn);
  ranks_sync(&sh->threads);
  expect_rc(sh, rank, kl_ctx_destroy(c), KLRT_OK, "destroy");
  cu->cuMemFree(b.shard);
  cu->cuMemFree(b.temperature);
  cu->cuMemFree(b.top_p);
  cu->cuMemFree(b.top_p_half);
  for (int i = 0; i < SETS; i++) {
    cu->cuMemFree(b.o[i].out), cu->cuMemFree(b.o[i].index);
    cu->cuMemFree(b.o[i].value), cu->cuMemFree(b.o[i].lse);
  }
  cu->cuStreamDestroy(b.s);
  return NULL;
}

/* The stand-in at path, for libklrt too (KLGEN_NCCL_LIBRARY); 0 or -1.
 * libklrt takes a libnccl already in the process before that variable's, so
 * none may be: the test is linked without NCCL. */
static int load_standin(const char *path) {
  if (dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD)) {
    fprintf(stderr, "gpu_fault: libnccl.so.2 is in this process, so libklrt would use it and "
            "not the NCCL stand-in: link the test without NCCL\n");
    return -1;
  }
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    fprintf(stderr, "gpu_fault: cannot load the NCCL stand-in %s: %s\n", path, dlerror());
    return -1;
  }
  *(void **)&standin_init = dlsym(lib, "ncclCommInitAll");
  *(void **)&standin_destroy = dlsym(lib, "ncclCommDestroy");
  *(void **)&standin_timeouts = dlsym(lib, "kl_standin_timeouts");
  if (!standin_init || !standin_destroy || !standin_timeouts) {
    fprintf(stderr, "gpu_fault: %s is not the NCCL stand-in\n", path);
    return -1;
  }
  setenv("KLGEN_NCCL_LIBRARY", path, 1);
  return 0;
}

int main(int argc, char **argv) {
  shared sh;
  memset(&sh, 0, sizeof sh);
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line as it happens: a run cut short shows where */
  if (argc != 3) {
    fprintf(stderr, "usage: gpu_fault TIMEOUT_MS NCCL_STANDIN_LIBRARY\n");
    return 2;
  }
  sh.timeout_ms = atoi(argv[1]); /* longer under compute-sanitizer */
  sh.cu = gpu_require(1);
  if (load_standin(argv[2]) != 0) return 1;
  sh.cuctx = gpu_primary(sh.cu, 0, 0);
  pthread_mutex_init(&sh.m, NULL);
  const int devs[2] = {0, 0};
  for (sh.op = GATHER; sh.op < OPS; sh.op++) {
    if (kl_group_create(&sh.group, 2) != KLRT_OK) return 1;
    if (standin_init(sh.comms, 2, devs) != ncclSuccess) {
      fprintf(stderr, "gpu_fault: the NCCL stand-in's ncclCommInitAll failed\n");
      return 1;
    }
    const unsigned gave_up = standin_timeouts();
    rank_arg args[2] = {{&sh, 0}, {&sh, 1}};
    ranks_start(&sh.threads, 2, rank_main, args, sizeof *args);
    ranks_join(&sh.threads);
    /* a rank the NCCL path left waiting for its peer: a collective one rank skipped */
    if (standin_timeouts() != gave_up)
      failf(&sh, -1, "the NCCL stand-in gave up on a peer %u time(s)", standin_timeouts() - gave_up);
    for (int r = 0; r < 2; r++) standin_destroy(sh.comms[r]);
    kl_group_destroy(sh.group);
  }
  printf("gpu_fault: %d passed, %d failed\n", sh.failures ? 0 : 1, sh.failures ? 1 : 0);
  return sh.failures ? 1 : 0;
}
