/* GPU test: all ranks of each spec as threads on ONE GPU (how TP8 is tested
 * while 8-GPU machines are withheld), through libklrt's one-shot path.
 *
 *   gpu_one_gpu SPEC_FILE [STEPS]
 *
 * For every spec in the file: tp threads, one kl_ctx each (kl_group), steps
 * with changing data and token counts 1, 3, 64 and max_tokens; every step is
 * checked on the device against the reference values, and every 64th step
 * (and the last) is copied back and checked against the host reference. Then
 * the same steps captured in a CUDA graph per rank and replayed. A planted
 * error must be caught (so the checks can fail). Exit 77 without a GPU. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_util.h"
#include "klrt/klrt.h"

#define HOST_CHECK_EVERY 64
#define GRAPH_STEPS 8

typedef struct shared {
  const char *file;
  kl_spec spec;
  kl_layout layout;
  kl_group *group;
  int steps;
  int tokens[4];
  const kl_cu *cu;
  CUcontext cuctx;
} shared;

typedef struct rank_ctx {
  shared *sh;
  int rank;
  long long bad_device, bad_host, host_checks;
  int failed;
  char msg[512];
} rank_ctx;

static int fail(rank_ctx *r, const char *what, const char *detail) {
  snprintf(r->msg, sizeof r->msg, "rank %d: %s: %s", r->rank, what, detail);
  r->failed = 1;
  return -1;
}

/* Device buffers of one rank. */
typedef struct bufs {
  CUdeviceptr shard, out, step, bad;
  CUstream s;
  testkern k;
} bufs;

static int one_step(rank_ctx *r, kl_ctx *ctx, bufs *b, int tokens) {
  const kl_cu *cu = r->sh->cu;
  const kl_layout *l = &r->sh->layout;
  long long vocab = r->sh->spec.vocab_size;
  if (launch_fill(cu, &b->k, b->shard, tokens, l->shard, (unsigned)r->rank, b->step, b->s))
    return fail(r, "fill", "launch failed");
  if (kl_gather(ctx, (void *)b->shard, (void *)b->out, tokens, b->s) != KLRT_OK)
    return fail(r, "kl_gather", kl_last_error());
  if (launch_verify(cu, &b->k, b->out, tokens, vocab, l->shard, b->step, b->bad, b->s) ||
      launch_bump(cu, &b->k, b->step, b->s))
    return fail(r, "verify", "launch failed");
  return 0;
}

/* Copies the output back and checks it against the host reference. */
static int host_check(rank_ctx *r, bufs *b, int tokens, uint32_t step) {
  const kl_cu *cu = r->sh->cu;
  int elem = r->sh->layout.elem_bytes;
  size_t bytes = (size_t)tokens * (size_t)r->sh->spec.vocab_size * (size_t)elem;
  void *h = malloc(bytes);
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  CU_CHECK(cu, cuMemcpyDtoH(h, b->out, bytes));
  char what[96];
  snprintf(what, sizeof what, "%s rank %d", r->sh->spec.name, r->rank);
  r->bad_host += ref_check(elem, h, tokens, r->sh->spec.vocab_size, r->sh->layout.shard, step, what);
  r->host_checks++;
  free(h);
  return 0;
}

static int eager(rank_ctx *r, kl_ctx *ctx, bufs *b) {
  for (int s = 0; s < r->sh->steps; s++) {
    int tokens = r->sh->tokens[s % 4];
    if (one_step(r, ctx, b, tokens)) return -1;
    if (s % HOST_CHECK_EVERY == 0 || s == r->sh->steps - 1) host_check(r, b, tokens, (uint32_t)s);
  }
  return 0;
}

/* GRAPH_STEPS steps captured once, replayed until `steps` steps have run. */
static int graph(rank_ctx *r, kl_ctx *ctx, bufs *b) {
  const kl_cu *cu = r->sh->cu;
  CUgraph g;
  CUgraphExec ge;
  CU_CHECK(cu, cuStreamBeginCapture(b->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  for (int s = 0; s < GRAPH_STEPS; s++)
    if (one_step(r, ctx, b, r->sh->tokens[s % 4])) {
      cu->cuStreamEndCapture(b->s, &g);
      return -1;
    }
  CU_CHECK(cu, cuStreamEndCapture(b->s, &g));
  CU_CHECK(cu, cuGraphInstantiate(&ge, g, 0));
  int replays = r->sh->steps / GRAPH_STEPS;
  for (int i = 0; i < replays; i++) CU_CHECK(cu, cuGraphLaunch(ge, b->s));
  /* The last replayed step used tokens[(GRAPH_STEPS-1) % 4]; its step number is
   * the counter before the final bump. */
  uint32_t step;
  CU_CHECK(cu, cuStreamSynchronize(b->s));
  CU_CHECK(cu, cuMemcpyDtoH(&step, b->step, 4));
  host_check(r, b, r->sh->tokens[(GRAPH_STEPS - 1) % 4], step - 1);
  cu->cuGraphExecDestroy(ge);
  cu->cuGraphDestroy(g);
  return 0;
}

static void *run_rank(void *arg) {
  rank_ctx *r = arg;
  shared *sh = r->sh;
  const kl_cu *cu = sh->cu;
  cu->cuCtxSetCurrent(sh->cuctx);
  bufs b;
  memset(&b, 0, sizeof b);
  /* Everything slow happens before creation, which is a barrier: ranks that
   * start their steps seconds apart would run into the poll's time limit. */
  if (testkern_load(cu, sh->layout.elem_bytes, &b.k)) fail(r, "test kernels", "did not build");
  kl_config cfg = {.rank = r->rank, .nranks = sh->spec.tp, .device = 0, .group = sh->group};
  kl_ctx *ctx = NULL;
  if (kl_ctx_create_file(&ctx, sh->file, sh->spec.name, &cfg) != KLRT_OK) {
    fail(r, "kl_ctx_create_file", kl_last_error());
    return NULL;
  }
  kl_stats st;
  kl_ctx_stats(ctx, &st);
  if (!st.oneshot_ready) fail(r, "one-shot not ready", st.not_ready);
  size_t max_t = (size_t)sh->spec.max_tokens, elem = (size_t)sh->layout.elem_bytes;
  CU_CHECK(cu, cuStreamCreate(&b.s, CU_STREAM_NON_BLOCKING));
  CU_CHECK(cu, cuMemAlloc(&b.shard, max_t * (size_t)sh->layout.shard * elem));
  CU_CHECK(cu, cuMemAlloc(&b.out, max_t * (size_t)sh->spec.vocab_size * elem));
  CU_CHECK(cu, cuMemAlloc(&b.step, 16));
  CU_CHECK(cu, cuMemAlloc(&b.bad, 8));
  CU_CHECK(cu, cuMemsetD32(b.step, 0, 4));
  CU_CHECK(cu, cuMemsetD32(b.bad, 0, 2));
  if (!r->failed && !eager(r, ctx, &b)) graph(r, ctx, &b);
  if (!r->failed) {
    CU_CHECK(cu, cuStreamSynchronize(b.s));
    unsigned long long bad = 0;
    CU_CHECK(cu, cuMemcpyDtoH(&bad, b.bad, 8));
    r->bad_device = (long long)bad;
    if (kl_ctx_status(ctx) != KLRT_OK) fail(r, "device status", kl_last_error());
    kl_ctx_stats(ctx, &st);
    if (st.nccl != 0) fail(r, "path", "a call went to NCCL");
  }
  cu->cuStreamSynchronize(b.s);
  if (kl_ctx_destroy(ctx) != KLRT_OK) fail(r, "kl_ctx_destroy", kl_last_error());
  cu->cuMemFree(b.shard), cu->cuMemFree(b.out), cu->cuMemFree(b.step), cu->cuMemFree(b.bad);
  cu->cuModuleUnload(b.k.mod);
  cu->cuStreamDestroy(b.s);
  return NULL;
}

/* The checks must be able to fail: plant one wrong element and expect both
 * the device verify and the host reference to see exactly it. */
static int planted_error_is_caught(const kl_cu *cu, const kl_spec *s, const kl_layout *l) {
  testkern k;
  if (testkern_load(cu, l->elem_bytes, &k)) return -1;
  size_t elems = (size_t)s->vocab_size, bytes = elems * (size_t)l->elem_bytes;
  CUdeviceptr out, step, bad;
  CU_CHECK(cu, cuMemAlloc(&out, bytes));
  CU_CHECK(cu, cuMemAlloc(&step, 4));
  CU_CHECK(cu, cuMemAlloc(&bad, 8));
  CU_CHECK(cu, cuMemsetD32(step, 7, 1));
  CU_CHECK(cu, cuMemsetD32(bad, 0, 2));
  void *h = malloc(bytes);
  for (size_t j = 0; j < elems; j++) {
    uint32_t v = ref_expected(l->elem_bytes, ref_value(l->elem_bytes, 7, (uint32_t)(j / (size_t)l->shard), 0,
                                                      (uint32_t)(j % (size_t)l->shard)));
    if (j == elems / 2) v ^= 1; /* the planted error */
    if (l->elem_bytes == 2) ((uint16_t *)h)[j] = (uint16_t)v;
    else ((uint32_t *)h)[j] = v;
  }
  CU_CHECK(cu, cuMemcpyHtoD(out, h, bytes));
  launch_verify(cu, &k, out, 1, s->vocab_size, l->shard, step, bad, NULL);
  unsigned long long dev_bad = 0;
  CU_CHECK(cu, cuCtxSynchronize());
  CU_CHECK(cu, cuMemcpyDtoH(&dev_bad, bad, 8));
  fprintf(stderr, "(planted error, expected below)\n");
  long long host_bad = ref_check(l->elem_bytes, h, 1, s->vocab_size, l->shard, 7, "planted");
  cu->cuMemFree(out), cu->cuMemFree(step), cu->cuMemFree(bad), cu->cuModuleUnload(k.mod);
  free(h);
  return dev_bad == 1 && host_bad == 1 ? 0 : -1;
}

static int run_spec(shared *sh) {
  int tp = sh->spec.tp, fails = 0;
  kl_group_create(&sh->group, tp);
  rank_ctx *r = calloc((size_t)tp, sizeof *r);
  pthread_t *th = calloc((size_t)tp, sizeof *th);
  for (int i = 0; i < tp; i++) {
    r[i] = (rank_ctx){.sh = sh, .rank = i};
    pthread_create(&th[i], NULL, run_rank, &r[i]);
  }
  for (int i = 0; i < tp; i++) pthread_join(th[i], NULL);
  long long dev = 0, host = 0, checks = 0;
  for (int i = 0; i < tp; i++) {
    if (r[i].failed) fprintf(stderr, "FAIL %s\n", r[i].msg), fails++;
    dev += r[i].bad_device, host += r[i].bad_host, checks += r[i].host_checks;
  }
  if (dev || host) fails++;
  printf("%s %s: tp %d on one GPU, tokens {%d,%d,%d,%d}, %d eager + %d graph steps per rank: "
         "%lld device-checked mismatches, %lld host-checked mismatches (%lld host checks)\n",
         fails ? "FAIL" : "ok", sh->spec.name, tp, sh->tokens[0], sh->tokens[1], sh->tokens[2],
         sh->tokens[3], sh->steps, sh->steps / GRAPH_STEPS * GRAPH_STEPS, dev, host, checks);
  kl_group_destroy(sh->group);
  free(r), free(th);
  return fails;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s SPEC_FILE [STEPS]\n", argv[0]);
    return 2;
  }
  const kl_cu *cu = gpu_require(1);
  kl_spec_list list;
  kl_err err;
  if (kl_spec_load_file(argv[1], &list, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  CUdevice dev;
  CUcontext cuctx;
  CU_CHECK(cu, cuDeviceGet(&dev, 0));
  CU_CHECK(cu, cuDevicePrimaryCtxRetain(&cuctx, dev));
  CU_CHECK(cu, cuCtxSetCurrent(cuctx));
  int fails = 0;
  for (int i = 0; i < list.n; i++) {
    shared sh = {.file = argv[1], .spec = list.v[i], .cu = cu, .cuctx = cuctx};
    sh.steps = argc > 2 ? atoi(argv[2]) : 1024;
    kl_layout_derive(&sh.spec, &sh.layout, &err);
    int m = (int)sh.spec.max_tokens;
    int want[4] = {1, 3, 64, m};
    for (int t = 0; t < 4; t++) sh.tokens[t] = want[t] < m ? want[t] : m;
    if (i == 0 && planted_error_is_caught(cu, &sh.spec, &sh.layout) != 0) {
      fprintf(stderr, "FAIL: a planted error was not caught\n");
      fails++;
    }
    fails += run_spec(&sh);
  }
  kl_spec_list_free(&list);
  printf("%s\n", fails ? "FAILED" : "PASSED");
  return fails ? 1 : 0;
}
