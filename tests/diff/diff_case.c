/* One case: its ranks as threads (all on one GPU, or one a GPU), the steps
 * the main thread plans, and the comparison of every rank's outputs with the
 * reference. The main thread plans a step and makes its input, the ranks run
 * it, the main thread computes the reference meanwhile and then compares. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "diff_env.h"
#include "diff_sample.h"
#include "kl_abi.h"
#include "klrt_testing.h"

/* Where the step counters wrap: a multiple of 3 (kl_abi.h), else 2^32. */
#ifdef KL_STEP_WRAP
#define WRAP_AT ((uint64_t)KL_STEP_WRAP)
#else
#define WRAP_AT (1ull << 32)
#endif

enum { OP_GATHER, OP_ARGMAX, OP_TOPK, OP_SAMPLE, OP_COUNT };
static const char *const op_names[] = {"kl_gather", "kl_argmax", "kl_topk", "kl_sample"};
enum { PATH_UNKNOWN = -1, PATH_ONESHOT = 0, PATH_NCCL = 1 };
static const char *const path_names[] = {"one-shot", "NCCL"};

typedef struct step_plan {
  int tokens;
  int nops, ops[OP_COUNT];
  int overlap;      /* outputs overlap the shard: it is uploaded again before each op */
  size_t in_at, out_at; /* byte offsets of the shard and of out in the arena */
  size_t sel_at[5]; /* argmax index, value; top-k index, value, lse */
  int value, lse;   /* ask for them (else NULL) */
  /* kl_sample: its top-n, whether it asks for the logprob, which parameter
   * arrays it passes as NULL (bit i: top_k, top_p, min_p, seed, offset) */
  int n_top, want_lp;
  unsigned nulls;
  /* one rank's host late by late_us before its op at index late_at (eager
   * steps; late_rank -1: none): its peers run ahead into later calls, whose
   * kernels may spin while the late rank's earlier ones still need room */
  int late_rank, late_at, late_us;
  int replay;       /* launch the captured graph instead of calling */
  int capture;      /* capture this step into the graph; nothing runs */
} step_plan;

typedef struct rank_report {
  kl_result rc[OP_COUNT];
  char err[OP_COUNT][240];
  int path[OP_COUNT];
  double host_ms[OP_COUNT]; /* the call's own time: a call that blocks makes its peers wait */
  long long staged[OP_COUNT]; /* copies it made first (kl_stats.staged) */
  int cuda_failed;
  char cuda_err[200];
  kl_result status_rc; /* kl_ctx_status after the step */
  char status[240];     /* its message, if not KLRT_OK */
  double step_ms;   /* the step's wall time, enqueue to done: a time-out under the
                       poll limit would mean the device's clock, not a peer, was late */
  float dev_ms[DIFF_STEP_EVENTS]; /* device time from the step's start to its upload
                                     done and to each op done (eager steps), -1 unknown */
} rank_report;

typedef struct case_run {
  diff_env *env;
  const diff_case *c;
  int tp;
  kl_group *group;
  ncclComm_t comms[DIFF_MAX_RANKS];
  pthread_barrier_t all;   /* the ranks and the main thread */
  pthread_barrier_t ranks; /* the ranks alone */
  step_plan plan;
  int done;
  uint32_t wrap_near;
  int planned; /* steps planned so far (each its own stream for the late knob) */
  kl_result create_rc[DIFF_MAX_RANKS];
  char create_err[DIFF_MAX_RANKS][300];
  kl_result destroy_rc[DIFF_MAX_RANKS];
  rank_report rep[DIFF_MAX_RANKS];
  long long crossover; /* the limit the ranks agreed on (rank 0's stats) */
  int dead;            /* a step's kl_ctx_status said the group is dead: it stays so */
  int standin_broke;   /* the NCCL stand-in gave up on a peer: its results are undefined since */
  kl_result capture_rc[DIFF_MAX_RANKS][OP_COUNT]; /* each rank's calls while capturing */
} case_run;

typedef struct rank_arg {
  case_run *run;
  int rank;
} rank_arg;

/* ---- the failure report ---- */

/* The case's report: env->report where the caller keeps it apart (to judge a
 * stall, below), else stdout. */
static FILE *out;

/* A failure is a fault (FAULT) when the library reported it as it must after
 * a peer timed out: kl_ctx_status's dead group, a later one-shot call's
 * KLRT_EDEVICE, a one-shot call's outputs that are poison (NaN, index -1)
 * where they differ, or anything on the NCCL path in a step where the NCCL
 * stand-in gave up on a peer (it has no way to say so to the runtime; real
 * NCCL would hang). A dead group's NCCL-path calls still give results: their
 * KLRT_EDEVICE or poison is a defect, as is anything else (a stale or wrong
 * value, a wrong path, a CUDA error) (DEFECT). */
enum fail_kind { DEFECT, FAULT };

static void failf(diff_env *env, const diff_case *c, enum fail_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void failf(diff_env *env, const diff_case *c, enum fail_kind kind, const char *fmt, ...) {
  env->case_defects += kind == DEFECT;
  if (env->case_failures++ == 0) {
    fprintf(out, "FAIL case seed %llu: %s\n", (unsigned long long)c->seed, c->lua);
    fprintf(out, "  knobs: disable %d, crossover %lld, steps %d, graph %d, wrap %d, extra tokens %d, "
           "nccl %d\n", c->disable, c->crossover, c->steps, c->graph, c->wrap, c->extra_tokens,
           c->has_nccl);
  }
  if (env->case_failures > DIFF_DETAIL_LINES) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(out, "  %s: ", kind == FAULT ? "fault" : "defect");
  vfprintf(out, fmt, ap);
  fprintf(out, "\n");
  va_end(ap);
}

/* ---- the ranks ---- */

static CUdeviceptr at(const diff_slot *s, size_t off) { return s->arena + off; }

/* Set once an error poisons the CUDA context for good: every later case would
 * fail for that one, so the run stops (diff_context_lost). */
static volatile int context_lost;

static int sticky(CUresult r) {
  return r == CUDA_ERROR_ILLEGAL_ADDRESS || r == CUDA_ERROR_LAUNCH_FAILED ||
         r == CUDA_ERROR_ILLEGAL_INSTRUCTION || r == CUDA_ERROR_MISALIGNED_ADDRESS ||
         r == CUDA_ERROR_INVALID_ADDRESS_SPACE || r == CUDA_ERROR_INVALID_PC ||
         r == CUDA_ERROR_HARDWARE_STACK_ERROR || r == CUDA_ERROR_ASSERT;
}

int diff_context_lost(void) { return context_lost; }

static double ms_since(const struct timespec *t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return 1e3 * (double)(t1.tv_sec - t0->tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0->tv_nsec);
}

static int cu_ok(rank_report *rep, CUresult r, const char *what) {
  if (r == CUDA_SUCCESS) return 1;
  if (sticky(r)) context_lost = 1;
  if (!rep->cuda_failed)
    snprintf(rep->cuda_err, sizeof rep->cuda_err, "%s: %s", what, kl_cu_errstr(r));
  rep->cuda_failed = 1;
  return 0;
}

static size_t in_bytes(const case_run *run, int tokens) {
  return (size_t)tokens * (size_t)run->c->layout.shard_bytes;
}
static size_t out_bytes(const case_run *run, int tokens) {
  return (size_t)tokens * (size_t)run->c->spec.vocab_size * (size_t)run->c->layout.out_elem_bytes;
}

/* The selection outputs' sizes: argmax index, value; top-k index, value, lse. */
static void sel_sizes(const case_run *run, int tokens, size_t sz[5]) {
  size_t k = (size_t)run->c->spec.topk;
  sz[0] = 8 * (size_t)tokens, sz[1] = 4 * (size_t)tokens;
  sz[2] = 8 * k * (size_t)tokens, sz[3] = 4 * k * (size_t)tokens, sz[4] = 4 * (size_t)tokens;
}

/* kl_sample's parameter arrays in the pinned block and in each arena's sample
 * area (DIFF_SAMPLE_PARAM_BYTES): T, top_p, min_p, then top_k, seed, offset. */
enum { P_T, P_TOP_P, P_MIN_P, P_TOP_K, P_SEED, P_OFFSET };
static size_t param_at(int which) {
  static const size_t at_[] = {0, 4, 8, 12, 20, 28};
  return at_[which] * DIFF_MAX_ROWS;
}
static void *host_param(const diff_env *env, int which) {
  return (char *)env->h_params + param_at(which);
}
/* Its outputs after the parameters: token, logprob, top index, top logprob. */
static size_t sample_out_at(const diff_env *env, int which) {
  static const size_t at_[] = {0, 8, 12, 12 + 8 * 64};
  return env->sample_area + DIFF_SAMPLE_OUT_AT + at_[which] * DIFF_MAX_ROWS;
}

static kl_result call_sample(case_run *run, kl_ctx *ctx, const diff_slot *s, CUstream st) {
  const step_plan *p = &run->plan;
  const diff_env *env = run->env;
  CUdeviceptr base = at(s, env->sample_area);
  /* bits of nulls: top_k, top_p, min_p, seed, offset */
  kl_sampling sp = {(const float *)(base + param_at(P_T)),
                    (p->nulls & 1) ? NULL : (const int64_t *)(base + param_at(P_TOP_K)),
                    (p->nulls & 2) ? NULL : (const float *)(base + param_at(P_TOP_P)),
                    (p->nulls & 4) ? NULL : (const float *)(base + param_at(P_MIN_P)),
                    (p->nulls & 8) ? NULL : (const uint64_t *)(base + param_at(P_SEED)),
                    (p->nulls & 16) ? NULL : (const uint64_t *)(base + param_at(P_OFFSET))};
  return kl_sample(ctx, (const void *)at(s, p->in_at), &sp, (int64_t *)at(s, sample_out_at(env, 0)),
                   p->want_lp ? (float *)at(s, sample_out_at(env, 1)) : NULL,
                   p->n_top ? (int64_t *)at(s, sample_out_at(env, 2)) : NULL,
                   p->n_top ? (float *)at(s, sample_out_at(env, 3)) : NULL, p->n_top, p->tokens,
                   (kl_stream)st);
}

static int has_op(const step_plan *p, int op) {
  for (int i = 0; i < p->nops; i++)
    if (p->ops[i] == op) return 1;
  return 0;
}

/* kl_sample's outputs' sizes: token, logprob, top index, top logprob. */
static void sample_sizes(const step_plan *p, size_t ss[4]) {
  size_t n = (size_t)p->tokens, top = n * (size_t)p->n_top;
  ss[0] = 8 * n, ss[1] = p->want_lp ? 4 * n : 0, ss[2] = 8 * top, ss[3] = 4 * top;
}

static kl_result call_op(case_run *run, kl_ctx *ctx, const diff_slot *s, int op, CUstream st) {
  const step_plan *p = &run->plan;
  void *in = (void *)at(s, p->in_at);
  switch (op) {
  case OP_GATHER: return kl_gather(ctx, in, (void *)at(s, p->out_at), p->tokens, st);
  case OP_ARGMAX:
    return kl_argmax(ctx, in, (int64_t *)at(s, p->sel_at[0]),
                     p->value ? (float *)at(s, p->sel_at[1]) : NULL, p->tokens, st);
  case OP_SAMPLE: return call_sample(run, ctx, s, st);
  default:
    return kl_topk(ctx, in, (int64_t *)at(s, p->sel_at[2]),
                   p->value ? (float *)at(s, p->sel_at[3]) : NULL,
                   p->lse ? (float *)at(s, p->sel_at[4]) : NULL, p->tokens, st);
  }
}

/* Fills every output of the step with a canary, so an output a call leaves
 * unwritten shows (the shard is uploaded after: it may overlap). */
static void canary(case_run *run, const diff_slot *s, rank_report *rep) {
  const step_plan *p = &run->plan;
  size_t sz[5];
  sel_sizes(run, p->tokens, sz);
  cu_ok(rep, diff_move(run->env, at(s, p->out_at), NULL, 0xa5, out_bytes(run, p->tokens), s->s),
        "canary");
  for (int i = 0; i < 5; i++)
    if (sz[i]) cu_ok(rep, diff_move(run->env, at(s, p->sel_at[i]), NULL, 0xa5, sz[i], s->s), "canary");
  if (has_op(p, OP_SAMPLE)) {
    size_t ss[4];
    sample_sizes(p, ss);
    for (int i = 0; i < 4; i++)
      if (ss[i]) cu_ok(rep, diff_move(run->env, at(s, sample_out_at(run->env, i)), NULL, 0xa5,
                                      ss[i], s->s), "canary");
    /* the step's parameters (a replay reads them where its capture pointed) */
    cu_ok(rep, diff_move(run->env, at(s, run->env->sample_area), run->env->h_params, 0,
                         DIFF_SAMPLE_PARAM_BYTES, s->s), "parameters");
  }
}

/* Pinned host memory and device memory share one address space (UVA). */
static CUdeviceptr host(void *p) { return (CUdeviceptr)(uintptr_t)p; }
static const void *dev(CUdeviceptr p) { return (const void *)(uintptr_t)p; }

static void upload(case_run *run, const diff_slot *s, rank_report *rep) {
  cu_ok(rep, diff_move(run->env, at(s, run->plan.in_at), s->h_in, 0, in_bytes(run, run->plan.tokens),
                       s->s), "upload");
}

static void download(case_run *run, const diff_slot *s, rank_report *rep) {
  const kl_cu *cu = run->env->cu;
  const step_plan *p = &run->plan;
  size_t sz[5];
  sel_sizes(run, p->tokens, sz);
  cu_ok(rep, diff_move(run->env, host(s->h_out), dev(at(s, p->out_at)), 0, out_bytes(run, p->tokens),
                       s->s), "download");
  void *dst[5] = {s->h_idx1, s->h_val1, s->h_idxk, s->h_valk, s->h_lse};
  for (int i = 0; i < 5; i++)
    if (sz[i])
      cu_ok(rep, diff_move(run->env, host(dst[i]), dev(at(s, p->sel_at[i])), 0, sz[i], s->s),
            "download");
  if (has_op(p, OP_SAMPLE)) {
    size_t ss[4];
    sample_sizes(p, ss);
    void *sdst[4] = {s->h_tok, s->h_lp, s->h_tidx, s->h_tlp};
    for (int i = 0; i < 4; i++)
      if (ss[i])
        cu_ok(rep, diff_move(run->env, host(sdst[i]), dev(at(s, sample_out_at(run->env, i))), 0,
                             ss[i], s->s), "download");
  }
  cu_ok(rep, cu->cuStreamSynchronize(s->s), "stream");
}

static int path_of(const kl_stats *a, const kl_stats *b) {
  if (b->oneshot == a->oneshot + 1 && b->nccl == a->nccl) return PATH_ONESHOT;
  if (b->nccl == a->nccl + 1 && b->oneshot == a->oneshot) return PATH_NCCL;
  return PATH_UNKNOWN;
}

static void run_ops(case_run *run, kl_ctx *ctx, const diff_slot *s, rank_report *rep, int timed) {
  const step_plan *p = &run->plan;
  for (int i = 0; i < p->nops; i++) {
    if (timed && i > 0) cu_ok(rep, run->env->cu->cuEventRecord(s->ev[1 + i], s->s), "event");
    int op = p->ops[i];
    if (p->overlap && i > 0) upload(run, s, rep); /* the last op wrote over it */
    if (timed && i == p->late_at && (int)(rep - run->rep) == p->late_rank) {
      struct timespec d = {0, (long)p->late_us * 1000};
      nanosleep(&d, NULL);
    }
    kl_stats a = KL_STATS_INIT, b = KL_STATS_INIT;
    kl_ctx_stats(ctx, &a);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    diff_progress((int)(rep - run->rep), op_names[op]);
    rep->rc[op] = call_op(run, ctx, s, op, s->s);
    rep->host_ms[op] = ms_since(&t0);
    if (timed && run->env->serial_ops) cu_ok(rep, run->env->cu->cuStreamSynchronize(s->s), "stream");
    if (rep->rc[op] != KLRT_OK) snprintf(rep->err[op], sizeof rep->err[op], "%s", kl_last_error());
    kl_ctx_stats(ctx, &b);
    rep->staged[op] = (long long)(b.staged - a.staged);
    rep->path[op] = path_of(&a, &b);
  }
}

/* The step captured into *ge: every rank finishes its work first, and
 * instantiation waits until every rank has captured (it may synchronize
 * the device, which must not wait for a peer's spinning kernel). */
static void capture(case_run *run, kl_ctx *ctx, const diff_slot *s, rank_report *rep,
                    CUgraphExec *ge) {
  const kl_cu *cu = run->env->cu;
  const int rank = (int)(rep - run->rep);
  diff_progress(rank, "capture: its stream's work before");
  cu_ok(rep, cu->cuStreamSynchronize(s->s), "stream");
  diff_progress(rank, "capture: at the ranks' barrier before");
  pthread_barrier_wait(&run->ranks);
  CUgraph g = NULL;
  if (cu_ok(rep, cu->cuStreamBeginCapture(s->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")) {
    run_ops(run, ctx, s, rep, 0);
    cu_ok(rep, cu->cuStreamEndCapture(s->s, &g), "end capture");
  }
  for (int op = 0; op < OP_COUNT; op++) run->capture_rc[rank][op] = rep->rc[op];
  diff_progress(rank, "capture: at the ranks' barrier after");
  pthread_barrier_wait(&run->ranks);
  diff_progress(rank, "cuGraphInstantiate");
  if (!g || !cu_ok(rep, cu->cuGraphInstantiate(ge, g, 0), "instantiate")) *ge = NULL;
  if (g) cu->cuGraphDestroy(g);
  diff_progress(rank, "capture: at the ranks' barrier after instantiation");
  pthread_barrier_wait(&run->ranks);
}

/* Where an eager step's device time went: a peer whose upload finished
 * late had its kernel held back on the device (it could not start), one
 * whose upload was on time but whose op took the poll limit waited. */
static void device_times(case_run *run, const diff_slot *s, rank_report *rep) {
  int n = run->plan.replay ? 0 : 2 + run->plan.nops;
  for (int e = 1; e < DIFF_STEP_EVENTS; e++) {
    rep->dev_ms[e] = -1;
    if (e < n && run->env->cu->cuEventElapsedTime &&
        run->env->cu->cuEventElapsedTime(&rep->dev_ms[e], s->ev[0], s->ev[e]) != CUDA_SUCCESS)
      rep->dev_ms[e] = -1;
  }
}

static void run_step(case_run *run, int rank, kl_ctx *ctx, CUgraphExec *ge) {
  const diff_slot *s = &run->env->slots[rank];
  rank_report *rep = &run->rep[rank];
  const step_plan *p = &run->plan;
  memset(rep, 0, sizeof *rep);
  for (int i = 0; i < OP_COUNT; i++) rep->path[i] = PATH_UNKNOWN, rep->rc[i] = -1;
  if (p->capture) {
    capture(run, ctx, s, rep, ge);
    return;
  }
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  const kl_cu *cu = run->env->cu;
  int timed = !p->replay;
  if (timed) cu_ok(rep, cu->cuEventRecord(s->ev[0], s->s), "event");
  diff_progress(rank, "canary and upload");
  canary(run, s, rep);
  upload(run, s, rep);
  if (timed) cu_ok(rep, cu->cuEventRecord(s->ev[1], s->s), "event");
  if (p->replay) {
    diff_progress(rank, "cuGraphLaunch");
    if (*ge) cu_ok(rep, cu->cuGraphLaunch(*ge, s->s), "graph launch");
    /* a call the capture refused (a dead group's KLRT_EDEVICE) wrote nothing */
    for (int i = 0; i < p->nops; i++) {
      const int op = p->ops[i];
      const kl_result was = run->capture_rc[rank][op];
      rep->rc[op] = was != KLRT_OK ? was : *ge ? KLRT_OK : KLRT_ESTATE;
      if (was != KLRT_OK) snprintf(rep->err[op], sizeof rep->err[op], "in the capture");
    }
  } else {
    run_ops(run, ctx, s, rep, 1);
    cu_ok(rep, cu->cuEventRecord(s->ev[1 + p->nops], s->s), "event");
  }
  diff_progress(rank, "download (waits for the step's kernels)");
  download(run, s, rep);
  rep->step_ms = ms_since(&t0);
  device_times(run, s, rep);
  diff_progress(rank, "kl_ctx_status");
  rep->status_rc = kl_ctx_status(ctx);
  if (rep->status_rc != KLRT_OK) snprintf(rep->status, sizeof rep->status, "%s", kl_last_error());
}

static void *rank_main(void *arg) {
  rank_arg *ra = arg;
  case_run *run = ra->run;
  int rank = ra->rank;
  const diff_case *c = run->c;
  diff_env *env = run->env;
  const diff_slot *s = &env->slots[rank];
  env->cu->cuCtxSetCurrent(s->cuctx);
  kl_config cfg = KL_CONFIG_INIT;
  cfg.rank = rank;
  cfg.nranks = run->tp;
  cfg.device = s->device;
  cfg.group = run->tp > 1 ? run->group : NULL;
  cfg.nccl = c->has_nccl ? run->comms[rank] : NULL;
  cfg.cache_dir = env->cache_dir;
  cfg.crossover_bytes = c->crossover;
  kl_ctx *ctx = NULL;
  diff_progress(rank, "kl_ctx_create_string");
  run->create_rc[rank] = kl_ctx_create_string(&ctx, c->lua, NULL, &cfg);
  if (run->create_rc[rank] != KLRT_OK)
    snprintf(run->create_err[rank], sizeof run->create_err[rank], "%s", kl_last_error());
  if (ctx && rank == 0) {
    kl_stats st = KL_STATS_INIT;
    if (kl_ctx_stats(ctx, &st) == KLRT_OK) run->crossover = st.crossover_bytes;
  }
  diff_progress(rank, "at the barrier after creation");
  pthread_barrier_wait(&run->all);
  /* The first work on a stream after the group's contexts made theirs
   * could wait behind peers' spinning grids, as a new stream's first work
   * does (diff_main.c setup): at tp 16 on one H200, 7 first steps of 368
   * cases timed out so, 0 of 186 with an event recorded and waited for here
   * first (the next barrier waits for every rank's). */
  diff_progress(rank, "its stream's first work after creation");
  CUresult fr = ctx ? env->cu->cuEventRecord(s->ev[0], s->s) : CUDA_SUCCESS;
  if (fr == CUDA_SUCCESS && ctx) fr = env->cu->cuStreamSynchronize(s->s);
  if (fr != CUDA_SUCCESS) {
    snprintf(run->create_err[rank], sizeof run->create_err[rank], "first work after creation: %s",
             kl_cu_errstr(fr));
    if (sticky(fr)) context_lost = 1;
  }
  if (ctx && c->wrap) {
    uint32_t g = 0, sel = 0;
    if (kl_testing_set_steps(ctx, run->wrap_near, &g, &sel) != KLRT_OK)
      snprintf(run->create_err[rank], sizeof run->create_err[rank], "set steps: %s",
               kl_last_error());
  }
  pthread_barrier_wait(&run->all);
  CUgraphExec ge = NULL;
  for (;;) {
    diff_progress(rank, "at the barrier before a step");
    pthread_barrier_wait(&run->all); /* the plan is out */
    if (run->done) break;
    if (ctx) run_step(run, rank, ctx, &ge);
    diff_progress(rank, "at the barrier after its step (its results are in)");
    pthread_barrier_wait(&run->all); /* the results are in */
  }
  if (ge) env->cu->cuGraphExecDestroy(ge);
  run->destroy_rc[rank] = ctx ? kl_ctx_destroy(ctx) : KLRT_OK;
  return NULL;
}

/* ---- the main thread: plans, inputs, reference, comparison ---- */

typedef diff_ref_bufs ref_step;

static size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* An offset for a buffer of element size `elem`: aligned most of the time,
 * else off by whole elements, now and then by any byte count. */
static size_t misalign(rng *r, size_t elem) {
  double u = rng_unit(r);
  if (u < 0.65) return 0;
  if (u < 0.95) return elem * (size_t)rng_range(r, 1, 15);
  return (size_t)rng_range(r, 1, 15);
}

/* An output placed on the shard: out (the gather's) or an index (argmax's or
 * top-k's). The runtime must stage the shard; the test uploads it again
 * before each op, and runs the op whose output overlaps last, so that no
 * upload lands on an output that is still to be read back. */
static void overlap(case_run *run, rng *r, step_plan *p, size_t ib, size_t ob) {
  int op = (int)rng_below(r, 3);
  int present = -1;
  for (int i = 0; i < p->nops; i++)
    if (p->ops[i] == op) present = i;
  if (present < 0 || (op == OP_TOPK && !run->c->spec.topk)) return;
  p->overlap = 1;
  p->ops[present] = p->ops[p->nops - 1];
  p->ops[p->nops - 1] = op;
  if (op == OP_GATHER) {
    size_t oelem = (size_t)run->c->layout.out_elem_bytes;
    size_t lo = p->in_at + 1 > ob ? p->in_at + 1 - ob : 0, hi = p->in_at + ib - 1;
    size_t o = (lo + (size_t)rng_below(r, (uint64_t)(hi - lo + 1))) / oelem * oelem;
    p->out_at = o < lo ? o + oelem : o;
  } else {
    p->sel_at[op == OP_ARGMAX ? 0 : 2] = align_up(p->in_at + ib / 3, 8);
  }
}

static void plan_step(case_run *run, rng *r, step_plan *p, int tokens, int allow_overlap) {
  const diff_case *c = run->c;
  const diff_env *env = run->env;
  memset(p, 0, sizeof *p);
  p->tokens = tokens;
  p->ops[p->nops++] = OP_GATHER;
  if (rng_chance(r, 0.8)) p->ops[p->nops++] = OP_ARGMAX;
  if (c->spec.topk && rng_chance(r, 0.8)) p->ops[p->nops++] = OP_TOPK;
  if (c->spec.topk && rng_chance(r, 0.6)) {
    p->ops[p->nops++] = OP_SAMPLE;
    int most = c->spec.topk < c->spec.vocab_size ? c->spec.topk : (int)c->spec.vocab_size;
    p->n_top = rng_chance(r, 0.5) ? (int)rng_range(r, 1, most) : 0;
    p->want_lp = rng_chance(r, 0.8);
    p->nulls = rng_chance(r, 0.3) ? (unsigned)rng_below(r, 32) : 0;
    /* two in five the shard sampler's calls: no filter, no top-n (a stream
     * of its own: the knob came after seeds were replayed) */
    rng sr = rng_for(c->seed, 0x5a4d0000ull + (uint64_t)run->planned);
    if (rng_chance(&sr, 0.4)) p->nulls |= 7, p->n_top = 0;
  }
  for (int i = p->nops - 1; i > 0; i--) { /* in any order */
    int j = (int)rng_below(r, (uint64_t)i + 1), t = p->ops[i];
    p->ops[i] = p->ops[j], p->ops[j] = t;
  }
  /* from a stream of its own: the knob came after seeds were replayed */
  rng lr = rng_for(c->seed, 0x1a7e0000ull + (uint64_t)run->planned++);
  p->late_rank = run->tp > 1 && rng_chance(&lr, 0.2) ? (int)rng_below(&lr, (uint64_t)run->tp) : -1;
  p->late_at = (int)rng_below(&lr, (uint64_t)p->nops);
  /* at most a tenth of the poll limit: late, never given up on */
  const int64_t most_us = c->spec.timeout_ms < 200 ? (int64_t)c->spec.timeout_ms * 100 : 20000;
  p->late_us = (int)rng_range(&lr, most_us < 200 ? 0 : 200, most_us);
  p->value = rng_chance(r, 0.85);
  p->lse = rng_chance(r, 0.85);
  size_t elem = (size_t)c->layout.elem_bytes, oelem = (size_t)c->layout.out_elem_bytes;
  size_t ib = in_bytes(run, tokens), ob = out_bytes(run, tokens);
  p->in_at = misalign(r, elem);
  p->out_at = env->out_area + misalign(r, oelem);
  size_t sz[5];
  sel_sizes(run, tokens, sz);
  size_t base = env->sel_area;
  for (int i = 0; i < 5; i++) {
    p->sel_at[i] = base + (rng_chance(r, 0.3) ? (i == 0 || i == 2 ? 8 : 4) * (size_t)rng_range(r, 1, 7) : 0);
    base = align_up(p->sel_at[i] + sz[i] + 1, 256);
  }
  if (allow_overlap && rng_chance(r, 0.12)) overlap(run, r, p, ib, ob);
}
static void make_inputs(case_run *run, rng *r, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  int64_t padded = c->layout.padded_vocab, shard = c->layout.shard;
  int elem = c->layout.elem_bytes;
  for (int t = 0; t < tokens; t++)
    diff_fill_row(r, (int)c->spec.dtype, (int)rng_below(r, (uint64_t)diff_row_kinds()),
                  ref->rows + (size_t)t * (size_t)padded, c->spec.vocab_size, padded);
  for (int k = 0; k < run->tp; k++) {
    unsigned char *h = run->env->slots[k].h_in;
    for (int t = 0; t < tokens; t++) {
      const uint32_t *src = ref->rows + (size_t)t * (size_t)padded + (size_t)k * (size_t)shard;
      for (int64_t j = 0; j < shard; j++) {
        size_t at_ = ((size_t)t * (size_t)shard + (size_t)j) * (size_t)elem;
        if (elem == 2) {
          uint16_t v = (uint16_t)src[j];
          memcpy(h + at_, &v, 2);
        } else {
          memcpy(h + at_, &src[j], 4);
        }
      }
    }
  }
}

static uint32_t neg_zero(int dtype) { return dtype == KL_FP32 ? 0x80000000u : 0x8000u; }

/* The epilogue's outputs, with tanhf from the device. */
static void reference_values(case_run *run, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  diff_env *env = run->env;
  epilogue e;
  epilogue_of(&c->spec, &e);
  int64_t vocab = c->spec.vocab_size, padded = c->layout.padded_vocab;
  size_t n = (size_t)tokens * (size_t)vocab;
  for (int t = 0; t < tokens; t++)
    for (int64_t j = 0; j < vocab; j++) {
      uint32_t b = ref->rows[(size_t)t * (size_t)padded + (size_t)j];
      if (b == neg_zero(e.dtype)) b = 0; /* the selections read -0 as +0, as the gather has it */
      float x = elem_to_f(e.dtype, b);
      size_t i = (size_t)t * (size_t)vocab + (size_t)j;
      ref->vals[i] = x;
      if (e.has_cap) env->h_targ[i] = epilogue_arg(&e, x);
    }
  if (!e.on) return;
  if (e.has_cap) diff_device_tanh(env, n);
  for (size_t i = 0; i < n; i++) {
    uint32_t o = epilogue_finish(&e, ref->vals[i], e.has_cap ? env->h_tout[i] : 0.0f);
    ref->gbits[i] = o;
    ref->vals[i] = e.out_dtype == KL_FP32 ? elem_to_f(KL_FP32, o) : elem_to_f(e.dtype, o);
  }
}

/* kl_sample's parameters for the step's rows, into the pinned block every
 * rank uploads: each filter alone and together, their edges, greedy rows,
 * and now and then a row outside the domain (it must draw -1). */
static void draw_sample_params(case_run *run, rng *r, int tokens) {
  const diff_env *env = run->env;
  const long long v = run->c->spec.vocab_size, cap = run->c->spec.topk;
  static const float temps[] = {0.f, 0.f, 1e-3f, 0.37f, 0.7f, 1.f, 1.f, 1.7f, 9.5f};
  static const float ps[] = {1.f, 1.f, 1.f, 1e-7f, 0.05f, 0.5f, 0.9f, 0.99999f};
  static const float mps[] = {0.f, 0.f, 0.f, 1e-6f, 0.05f, 0.3f, 0.999f, 1.f};
  float *T = host_param(env, P_T), *P = host_param(env, P_TOP_P), *MP = host_param(env, P_MIN_P);
  int64_t *K = host_param(env, P_TOP_K);
  uint64_t *S = host_param(env, P_SEED), *O = host_param(env, P_OFFSET);
  for (int i = 0; i < tokens; i++) {
    const long long ks[] = {0, 0, 1, 2, cap, v, v + 3, cap + 1};
    T[i] = temps[rng_below(r, sizeof temps / sizeof *temps)];
    P[i] = ps[rng_below(r, sizeof ps / sizeof *ps)];
    MP[i] = mps[rng_below(r, sizeof mps / sizeof *mps)];
    K[i] = ks[rng_below(r, rng_chance(r, 0.95) ? 7 : 8)];
    S[i] = rng_next(r);
    O[i] = rng_below(r, 1ull << 40);
    if (rng_chance(r, 0.03)) T[i] = rng_chance(r, 0.5) ? -1.f : NAN;
  }
}

/* Row t's parameters as kl_sample reads them (NULL arrays off, 0). */
static int row_params(const case_run *run, int t, sample_args *a, uint64_t *seed,
                      uint64_t *offset) {
  const diff_env *env = run->env;
  const unsigned nulls = run->plan.nulls;
  const long long v = run->c->spec.vocab_size;
  const int64_t k = (nulls & 1) ? 0 : ((int64_t *)host_param(env, P_TOP_K))[t];
  a->temperature = ((float *)host_param(env, P_T))[t];
  a->top_k = k >= v ? 0 : k;
  a->top_p = (nulls & 2) ? 1.f : ((float *)host_param(env, P_TOP_P))[t];
  a->min_p = (nulls & 4) ? 0.f : ((float *)host_param(env, P_MIN_P))[t];
  *seed = (nulls & 8) ? 0 : ((uint64_t *)host_param(env, P_SEED))[t];
  *offset = (nulls & 16) ? 0 : ((uint64_t *)host_param(env, P_OFFSET))[t];
  return a->temperature >= 0.f && isfinite(a->temperature) && a->top_p > 0.f && a->top_p <= 1.f &&
         a->min_p >= 0.f && a->min_p <= 1.f && a->top_k >= 0 && a->top_k <= run->c->spec.topk;
}

/* kl_sample's reference inputs, before the ranks start (the main thread
 * makes no CUDA call while they run: an error of theirs must reach compare,
 * not end the run here): each row's parameters, its tempered values t (in
 * h_targ) and the device's noise and expf for them (h_tg, h_tout). */
static void sample_inputs(case_run *run, ref_step *ref, int tokens) {
  diff_env *env = run->env;
  const int64_t vocab = run->c->spec.vocab_size;
  diff_noise_row *rows = env->h_srow;
  for (int r = 0; r < tokens; r++) {
    ref->sok[r] = row_params(run, r, &ref->sargs[r], &rows[r].seed, &rows[r].offset);
    ref->sm[r] = sample_tempered(ref->vals + (size_t)r * (size_t)vocab, vocab,
                                 ref->sargs[r].temperature, env->h_targ + (size_t)r * (size_t)vocab);
    rows[r].m = isfinite(ref->sm[r]) ? ref->sm[r] : 0.f;
  }
  diff_device_noise(env, vocab, tokens);
}

/* kl_sample's reference (diff_sample.c) on the values the gather delivers. */
static void reference_samples(case_run *run, ref_step *ref, int tokens) {
  const diff_env *env = run->env;
  const int64_t vocab = run->c->spec.vocab_size;
  const int n = run->plan.n_top;
  int64_t top[64];
  for (int r = 0; r < tokens; r++) {
    const float *x = ref->vals + (size_t)r * (size_t)vocab;
    const size_t o = (size_t)r * (size_t)vocab;
    const int ok = ref->sok[r];
    double mx;
    const double ls = sample_log_sum(x, vocab, &mx);
    ref->tok[r] = ok ? sample_token(env->h_targ + o, ref->sm[r], vocab, &ref->sargs[r],
                                    env->h_tout + o, env->h_tg + o, NULL)
                     : -1;
    ref->lp[r] = ok ? sample_logprob_at(x[ref->tok[r]], mx, ls) : NAN;
    if (n) sample_top(x, vocab, n, top);
    for (int j = 0; j < n; j++) {
      const size_t i = (size_t)r * (size_t)n + (size_t)j;
      ref->tidx[i] = ok ? top[j] : -1;
      ref->tlp[i] = ok ? sample_logprob_at(x[top[j]], mx, ls) : NAN;
    }
  }
}

static void reference_selections(case_run *run, ref_step *ref, int tokens) {
  const diff_case *c = run->c;
  int64_t vocab = c->spec.vocab_size;
  int k = c->spec.topk;
  for (int t = 0; t < tokens; t++) {
    const float *v = ref->vals + (size_t)t * (size_t)vocab;
    ref_topk(v, vocab, 1, &ref->idx1[t], &ref->val1[t]);
    if (k) {
      ref_topk(v, vocab, k, ref->idxk + (size_t)t * (size_t)k, ref->valk + (size_t)t * (size_t)k);
      ref->lse[t] = ref_lse(v, vocab);
    }
  }
}

/* Whether the step's kl_sample goes to the shard sampler (runtime/sample.c):
 * no top-n, and on the NCCL path no filter array. */
static int sample_by_shards(const step_plan *p, int path) {
  return p->n_top == 0 && (path == PATH_ONESHOT || (p->nulls & 7) == 7);
}

/* The path the dispatch rule gives (docs/design/dispatch.md): the same on every rank. */
static int expected_path(const case_run *run, int op, int tokens, long long crossover) {
  const diff_case *c = run->c;
  if (c->disable || tokens > c->spec.max_tokens) return PATH_NCCL;
  int nccl_everywhere = run->tp == 1 || c->has_nccl;
  long long bytes = (long long)tokens * c->layout.shard_bytes;
  /* kl_sample moves its rows only with top-n (with filters one-shot, the
   * crossover leaves it alone: runtime/sample.c gathers) */
  int moves = op == OP_GATHER || (op == OP_SAMPLE && run->plan.n_top > 0);
  if (moves && nccl_everywhere && bytes > crossover) return PATH_NCCL;
  return PATH_ONESHOT;
}

static int is_nan_bits(uint32_t b, int elem) {
  return elem == 4 ? (b & 0x7fffffffu) > 0x7f800000u : (b & 0x7fffu) > 0x7c00u;
}

static int is_nan16(uint32_t b, int dtype) {
  return dtype == KL_BF16 ? (b & 0x7fffu) > 0x7f80u : (b & 0x7fffu) > 0x7c00u;
}

/* Each check returns the count of wrong outputs and adds to *poison those of
 * them that are poison (NaN, index -1): what a dead step must give. */
static long long check_gather(case_run *run, const ref_step *ref, int rank, int path, int tokens,
                              long long *poison, char *first, size_t n) {
  const diff_case *c = run->c;
  epilogue e;
  epilogue_of(&c->spec, &e);
  const unsigned char *got = run->env->slots[rank].h_out;
  int oelem = c->layout.out_elem_bytes;
  int64_t vocab = c->spec.vocab_size, padded = c->layout.padded_vocab;
  long long bad = 0;
  for (int t = 0; t < tokens; t++)
    for (int64_t j = 0; j < vocab; j++) {
      size_t i = (size_t)t * (size_t)vocab + (size_t)j;
      uint32_t g = 0, want;
      memcpy(&g, got + i * (size_t)oelem, (size_t)oelem);
      int ok;
      if (e.on) {
        want = ref->gbits[i];
        ok = g == want || (oelem == 4 ? is_nan_bits(g, 4) && is_nan_bits(want, 4)
                                      : is_nan16(g, e.out_dtype) && is_nan16(want, e.out_dtype));
      } else {
        want = ref->rows[(size_t)t * (size_t)padded + (size_t)j];
        /* the one-shot path reads -0 as +0 (its sentinel); NCCL moves bits */
        if (path == PATH_ONESHOT && want == neg_zero(e.dtype)) want = 0;
        ok = g == want;
      }
      if (ok) continue;
      *poison += oelem == 4 ? is_nan_bits(g, 4) : is_nan16(g, e.out_dtype);
      if (bad++ == 0)
        snprintf(first, n, "row %d col %lld: got 0x%x, want 0x%x", t, (long long)j, g, want);
    }
  return bad;
}

static long long check_selection(case_run *run, const ref_step *ref, int rank, int op, int tokens,
                                 long long *poison, char *first, size_t n) {
  const diff_case *c = run->c;
  const diff_slot *s = &run->env->slots[rank];
  const step_plan *p = &run->plan;
  int k = op == OP_TOPK ? c->spec.topk : 1;
  const int64_t *gi = op == OP_TOPK ? s->h_idxk : s->h_idx1;
  const uint32_t *gv = op == OP_TOPK ? s->h_valk : s->h_val1;
  const int64_t *wi = op == OP_TOPK ? ref->idxk : ref->idx1;
  const uint32_t *wv = op == OP_TOPK ? ref->valk : ref->val1;
  long long bad = 0;
  for (int t = 0; t < tokens; t++) {
    const long long bad_before = bad;
    float lse_t;
    memcpy(&lse_t, &s->h_lse[t], 4);
    int poisoned = op != OP_TOPK || !p->lse || isnan(lse_t);
    for (int q = 0; q < k; q++) {  /* a dead step poisons a token whole */
      size_t i = (size_t)t * (size_t)k + (size_t)q;
      poisoned &= gi[i] == -1 && (!p->value || is_nan_bits(gv[i], 4));
    }
    for (int q = 0; q < k; q++) {
      size_t i = (size_t)t * (size_t)k + (size_t)q;
      int ok = gi[i] == wi[i] && (!p->value || gv[i] == wv[i]);
      if (ok) continue;
      if (bad++ == 0)
        snprintf(first, n, "row %d [%d]: got index %lld value 0x%08x, want %lld 0x%08x", t, q,
                 (long long)gi[i], p->value ? gv[i] : 0u, (long long)wi[i], p->value ? wv[i] : 0u);
    }
    if (op == OP_TOPK && p->lse) {
      float got;
      memcpy(&got, &s->h_lse[t], 4);
      if (!lse_close(got, ref->lse[t]) && bad++ == 0)
        snprintf(first, n, "row %d: lse %.9g, want %.12g", t, (double)got, ref->lse[t]);
    }
    if (poisoned) *poison += bad - bad_before;
  }
  return bad;
}

static int lp_close(float got, float want) {
  if (isnan(want)) return isnan(got);
  if (got == want) return 1;
  return fabsf(got - want) <= 2e-6f * fabsf(want) + 1e-12f;
}

/* A row of kl_sample's outputs as a dead step leaves it: token -1, NaN logprobs. */
static int sample_row_poisoned(const diff_slot *s, const step_plan *p, int t) {
  if (s->h_tok[t] != -1 || (p->want_lp && !isnan(s->h_lp[t]))) return 0;
  for (int j = 0; j < p->n_top; j++) {
    const size_t i = (size_t)t * (size_t)p->n_top + (size_t)j;
    if (s->h_tidx[i] != -1 || !isnan(s->h_tlp[i])) return 0;
  }
  return 1;
}

static long long check_sample(case_run *run, const ref_step *ref, int rank, int tokens,
                              long long *poison, char *first, size_t n) {
  const diff_slot *s = &run->env->slots[rank];
  const step_plan *p = &run->plan;
  const int k = p->n_top;
  long long bad = 0;
  for (int t = 0; t < tokens; t++) {
    const int ok = s->h_tok[t] == ref->tok[t] && (!p->want_lp || lp_close(s->h_lp[t], ref->lp[t]));
    int top_bad = -1;
    for (int j = 0; j < k && top_bad < 0; j++) {
      const size_t i = (size_t)t * (size_t)k + (size_t)j;
      if (s->h_tidx[i] != ref->tidx[i] || !lp_close(s->h_tlp[i], ref->tlp[i])) top_bad = j;
    }
    if (ok && top_bad < 0) continue;
    *poison += sample_row_poisoned(s, p, t);
    if (bad++) continue;
    if (!ok)
      snprintf(first, n, "row %d: token %lld logprob %a, want %lld %a", t, (long long)s->h_tok[t],
               p->want_lp ? (double)s->h_lp[t] : 0.0, (long long)ref->tok[t], (double)ref->lp[t]);
    else {
      const size_t i = (size_t)t * (size_t)k + (size_t)top_bad;
      snprintf(first, n, "row %d top %d: column %lld logprob %a, want %lld %a", t, top_bad,
               (long long)s->h_tidx[i], (double)s->h_tlp[i], (long long)ref->tidx[i],
               (double)ref->tlp[i]);
    }
  }
  return bad;
}

/* When each rank's step began on the device, after the earliest rank's: the
 * ranks enqueued it together, so a rank far behind had its stream held
 * back on the device. One GPU only: events of two contexts do not compare. */
static int start_offsets(const case_run *run, float at[DIFF_MAX_RANKS]) {
  const diff_env *env = run->env;
  const kl_cu *cu = env->cu;
  float first = 0;
  if (env->devices != 1 || !cu->cuEventElapsedTime || run->plan.replay || run->plan.capture)
    return 0;
  cu->cuCtxPushCurrent(env->ctx0);
  for (int r = 0; r < run->tp; r++) {
    if (cu->cuEventElapsedTime(&at[r], env->slots[0].ev[0], env->slots[r].ev[0]) != CUDA_SUCCESS)
      at[r] = NAN;
    if (r == 0 || at[r] < first) first = at[r];
  }
  CUcontext dummy;
  cu->cuCtxPopCurrent(&dummy);
  for (int r = 0; r < run->tp; r++) at[r] -= first;
  return 1;
}

static void start_skew(const case_run *run, const char *label) {
  float at[DIFF_MAX_RANKS];
  if (!start_offsets(run, at)) return;
  fprintf(out, "  %s device ms from the first rank's step start to each rank's:", label);
  for (int r = 0; r < run->tp; r++) fprintf(out, " %.1f", (double)at[r]);
  fprintf(out, "\n");
}

/* A stall on the shared GPU: a rank whose step started on the device only
 * once its peers had waited out (most of) the poll limit, though every rank
 * enqueued it at once. Returns that rank (its delay in *ms), or -1. */
static int held_back(const case_run *run, float *ms) {
  float at[DIFF_MAX_RANKS];
  if (!start_offsets(run, at)) return -1;
  int late = -1;
  for (int r = 0; r < run->tp; r++)
    if (at[r] >= 0.9f * (float)run->c->spec.timeout_ms && (late < 0 || at[r] > at[late])) late = r;
  if (late >= 0) *ms = at[late];
  return late;
}

/* Which calls staged by rank (kl_stats.staged: an input or output
 * misaligned, or the two overlapping; cuMemcpyAsync, which may wait in a
 * copy engine's queue behind a peer's copy), or a line that none did. */
static void staged_calls(const case_run *run, const char *label) {
  int any = 0;
  for (int i = 0; i < run->plan.nops; i++) {
    int op = run->plan.ops[i];
    long long n = 0;
    for (int r = 0; r < run->tp; r++) n += run->rep[r].staged[op];
    if (!n) continue;
    any = 1;
    fprintf(out, "  %s %s staged by rank (calls):", label, op_names[op]);
    for (int r = 0; r < run->tp; r++) fprintf(out, " %lld", run->rep[r].staged[op]);
    fprintf(out, "\n");
  }
  if (!any) fprintf(out, "  %s no call staged a copy\n", label);
}

/* Every rank's wall time for a failing step and host time per call: a late
 * peer shows as the rank whose call blocked, or as none (then its kernel was
 * late on the GPU); a step that timed out in less wall time than the poll
 * limit was timed by a clock that jumped. */
static void host_times(const case_run *run, const char *label) {
  fprintf(out, "  %s step wall ms by rank:", label);
  for (int r = 0; r < run->tp; r++) fprintf(out, " %.1f", run->rep[r].step_ms);
  fprintf(out, "\n");
  for (int i = 0; i < run->plan.nops; i++) {
    int op = run->plan.ops[i];
    fprintf(out, "  %s host ms of %s by rank:", label, op_names[op]);
    for (int r = 0; r < run->tp; r++) fprintf(out, " %.2f", run->rep[r].host_ms[op]);
    fprintf(out, "\n");
  }
  if (run->plan.replay) return;
  staged_calls(run, label);
  if (run->plan.late_rank >= 0)
    fprintf(out, "  %s rank %d slept %.1f ms on the host before its %s\n", label,
            run->plan.late_rank, run->plan.late_us / 1000.0,
            op_names[run->plan.ops[run->plan.late_at]]);
  start_skew(run, label);
  for (int e = 1; e < 2 + run->plan.nops; e++) {
    fprintf(out, "  %s device ms to %s done by rank:", label,
           e == 1 ? "upload" : op_names[run->plan.ops[e - 2]]);
    for (int r = 0; r < run->tp; r++) fprintf(out, " %.1f", (double)run->rep[r].dev_ms[e]);
    fprintf(out, "\n");
  }
}

/* Whether a step's group died: a peer's time-out, reported by kl_ctx_status. */
static int step_dead(const case_run *run) {
  for (int rank = 0; rank < run->tp; rank++)
    if (run->rep[rank].status_rc == KLRT_EDEVICE) return 1;
  return 0;
}

static void compare(case_run *run, const ref_step *ref, long long crossover, const char *label,
                    int standin_gave_up) {
  diff_env *env = run->env;
  const diff_case *c = run->c;
  const step_plan *p = &run->plan;
  int before = env->case_failures;
  if (step_dead(run)) run->dead = 1;
  if (standin_gave_up) run->standin_broke = 1;
  float late_ms = 0;
  const int late = held_back(run, &late_ms);
  if (late >= 0 && !env->case_stalled) {
    env->case_stalled = 1;
    snprintf(env->stall_note, sizeof env->stall_note,
             "%.60s: rank %d's stream started %.0f ms after the first rank's", label, late,
             (double)late_ms);
  }
  for (int rank = 0; rank < run->tp; rank++) {
    const rank_report *rep = &run->rep[rank];
    if (rep->cuda_failed) failf(env, c, DEFECT, "%s rank %d: %s", label, rank, rep->cuda_err);
    /* a dead group's fault once (every rank says it), any other status always */
    if (rep->status_rc != KLRT_OK &&
        (rep->status_rc != KLRT_EDEVICE || rank == 0 || run->rep[0].status_rc == KLRT_OK))
      failf(env, c, rep->status_rc == KLRT_EDEVICE ? FAULT : DEFECT, "%s rank %d: kl_ctx_status: %s",
            label, rank, rep->status);
    for (int i = 0; i < p->nops; i++) {
      int op = p->ops[i];
      int want_path = expected_path(run, op, p->tokens, crossover);
      if (rep->rc[op] != KLRT_OK) {
        failf(env, c,
              rep->rc[op] == KLRT_EDEVICE && run->dead && want_path == PATH_ONESHOT ? FAULT
                                                                                    : DEFECT,
              "%s rank %d: %s returned %s: %s", label, rank, op_names[op],
              kl_result_name(rep->rc[op]), rep->err[op]);
        continue;
      }
      if (!p->replay && rep->path[op] != want_path)
        failf(env, c, DEFECT, "%s rank %d: %s took the %s path, the rule says %s", label, rank,
              op_names[op], rep->path[op] < 0 ? "unknown" : path_names[rep->path[op]],
              path_names[want_path]);
      if (p->capture) continue; /* nothing ran */
      char first[200] = "";
      long long poison = 0;
      long long bad =
          op == OP_GATHER   ? check_gather(run, ref, rank, want_path, p->tokens, &poison, first,
                                           sizeof first)
          : op == OP_SAMPLE ? check_sample(run, ref, rank, p->tokens, &poison, first, sizeof first)
                            : check_selection(run, ref, rank, op, p->tokens, &poison, first,
                                              sizeof first);
      env->cov.sampled += op == OP_SAMPLE;
      env->cov.by_shards += op == OP_SAMPLE && sample_by_shards(p, want_path);
      env->cov.filtered_shards += op == OP_SAMPLE && sample_by_shards(p, want_path) && (p->nulls & 7) != 7;
      env->cov.calls++;
      env->cov.path[want_path]++;
      int excused = (run->dead && poison == bad && want_path == PATH_ONESHOT) ||
                    (run->standin_broke && want_path == PATH_NCCL);
      if (bad)
        failf(env, c, excused ? FAULT : DEFECT,
              "%s rank %d: %s (%s path, tokens %d%s): %lld wrong (%lld poison), first %s (the "
              "call: %.2f ms on the host, %lld staged)", label, rank, op_names[op],
              path_names[want_path], p->tokens, p->overlap ? ", overlapping" : "", bad, poison,
              first, rep->host_ms[op], rep->staged[op]);
    }
  }
  if (before == 0 && env->case_failures > 0 && !p->capture) host_times(run, label);
}

static void step(case_run *run, rng *r, ref_step *ref, long long crossover, const char *name) {
  diff_env *env = run->env;
  char label[128];
  size_t n = (size_t)snprintf(label, sizeof label, "%s [", name);
  for (int i = 0; i < run->plan.nops && n < sizeof label; i++)
    n += (size_t)snprintf(label + n, sizeof label - n, "%s%s", i ? ", " : "",
                          op_names[run->plan.ops[i]] + 3);
  if (n < sizeof label) snprintf(label + n, sizeof label - n, "]");
  if (!run->plan.capture) {
    make_inputs(run, r, ref, run->plan.tokens);
    reference_values(run, ref, run->plan.tokens);
    if (has_op(&run->plan, OP_SAMPLE)) {
      draw_sample_params(run, r, run->plan.tokens);
      sample_inputs(run, ref, run->plan.tokens);
    }
  }
  diff_watchdog_note(label);
  unsigned gave_up = env->standin_timeouts ? env->standin_timeouts() : 0;
  pthread_barrier_wait(&run->all); /* go */
  if (!run->plan.capture) {
    reference_selections(run, ref, run->plan.tokens);
    if (has_op(&run->plan, OP_SAMPLE)) reference_samples(run, ref, run->plan.tokens);
  }
  pthread_barrier_wait(&run->all); /* done */
  if (env->standin_timeouts) gave_up = env->standin_timeouts() != gave_up;
  compare(run, ref, crossover, label, (int)gave_up);
}

static int draw_tokens(const diff_case *c, rng *r) {
  int max = (int)c->spec.max_tokens;
  if (c->extra_tokens > 0 && rng_chance(r, 0.25)) return max + (int)rng_range(r, 1, c->extra_tokens);
  double u = rng_unit(r);
  return u < 0.2 ? 1 : u < 0.35 ? max : (int)rng_range(r, 1, max);
}

static void run_steps(case_run *run, rng *r, ref_step *ref, long long crossover) {
  const diff_case *c = run->c;
  char label[64];
  int steps = c->wrap ? 8 : c->steps;
  for (int s = 0; s < steps; s++) {
    int tokens = c->wrap && rng_chance(r, 0.8) ? (int)rng_range(r, 1, c->spec.max_tokens)
                                               : draw_tokens(c, r);
    plan_step(run, r, &run->plan, tokens, 1);
    snprintf(label, sizeof label, "step %d", s);
    step(run, r, ref, crossover, label);
    run->env->cov.steps++;
  }
  if (!c->graph) return;
  /* A step captured in a graph and replayed with new inputs; between
   * replays, eager steps of other sizes (larger ones regrow the scratch a
   * graph on the NCCL path points into). */
  int gt = c->extra_tokens >= 2 && rng_chance(r, 0.5) ? (int)c->spec.max_tokens + 1 : draw_tokens(c, r);
  step_plan g;
  plan_step(run, r, &g, gt, 0);
  /* Up to max_tokens nothing a call needs is allocated by the call (staging
   * included), so half the graphs are captured with no step of their size
   * before; past it the scratch must grow before capture, and NCCL itself
   * may set up its connections at its first calls. */
  const int real_nccl = c->has_nccl && !run->env->standin_timeouts;
  if (gt > c->spec.max_tokens || real_nccl || rng_chance(r, 0.5)) {
    run->plan = g;
    step(run, r, ref, crossover, "graph warm-up");
  }
  run->plan = g;
  run->plan.capture = 1;
  step(run, r, ref, crossover, "capture");
  for (int k = 0; k < 3; k++) {
    run->plan = g;
    run->plan.replay = 1;
    snprintf(label, sizeof label, "replay %d", k);
    step(run, r, ref, crossover, label);
    run->env->cov.replays++;
    if (rng_chance(r, 0.6)) {
      int tokens = gt < c->spec.max_tokens + c->extra_tokens
                       ? (int)rng_range(r, gt + 1, c->spec.max_tokens + c->extra_tokens)
                       : draw_tokens(c, r);
      plan_step(run, r, &run->plan, tokens, 1);
      snprintf(label, sizeof label, "between replays %d", k);
      step(run, r, ref, crossover, label);
    }
  }
}

static int make_comms(case_run *run) {
  const diff_case *c = run->c;
  if (!c->has_nccl) return 0;
  int devs[DIFF_MAX_RANKS];
  for (int i = 0; i < run->tp; i++) devs[i] = run->env->slots[i].device;
  return run->env->comm_init_all(run->comms, run->tp, devs) == ncclSuccess ? 0 : -1;
}

void diff_run_case(diff_env *env, const diff_case *c) {
  env->case_failures = env->case_defects = env->case_stalled = 0;
  env->stall_note[0] = 0;
  out = env->report ? env->report : stdout;
  case_run *run = calloc(1, sizeof *run);
  ref_step *ref = &env->ref;
  run->env = env;
  run->c = c;
  run->tp = c->valid ? c->spec.tp : 1;
  if (!c->valid) { /* the tp the text says, for an invalid spec: parse it back */
    const char *p = strstr(c->lua, "tp = ");
    run->tp = p ? atoi(p + 5) : 1;
  }
  rng r = rng_for(c->seed, 2);
  if (c->disable) setenv("KLGEN_DISABLE", "1", 1);
  else unsetenv("KLGEN_DISABLE");
  if (run->tp > 1 && kl_group_create(&run->group, run->tp) != KLRT_OK) {
    failf(env, c, DEFECT, "kl_group_create: %s", kl_last_error());
    free(run);
    return;
  }
  if (c->valid && make_comms(run) != 0) {
    failf(env, c, DEFECT, "NCCL communicators could not be made");
    kl_group_destroy(run->group);
    free(run);
    return;
  }
  run->wrap_near = (uint32_t)(WRAP_AT - 1 - (uint64_t)rng_below(&r, 3));
  pthread_barrier_init(&run->all, NULL, (unsigned)run->tp + 1);
  pthread_barrier_init(&run->ranks, NULL, (unsigned)run->tp);
  pthread_t th[DIFF_MAX_RANKS];
  rank_arg args[DIFF_MAX_RANKS];
  diff_progress_reset();
  for (int k = 0; k < run->tp; k++) {
    args[k] = (rank_arg){run, k};
    pthread_create(&th[k], NULL, rank_main, &args[k]);
  }
  pthread_barrier_wait(&run->all); /* created */
  int created = 0;
  for (int k = 0; k < run->tp; k++) created += run->create_rc[k] == KLRT_OK;
  if (!c->valid) {
    env->cov.invalid++;
    for (int k = 0; k < run->tp; k++)
      if (run->create_rc[k] != KLRT_ESPEC)
        failf(env, c, DEFECT, "rank %d: an invalid spec gave %s, not KLRT_ESPEC", k,
              kl_result_name(run->create_rc[k]));
  } else if (created != run->tp) {
    for (int k = 0; k < run->tp; k++)
      if (run->create_rc[k] != KLRT_OK)
        failf(env, c, DEFECT, "rank %d: creation: %s: %s", k, kl_result_name(run->create_rc[k]),
              run->create_err[k]);
  }
  pthread_barrier_wait(&run->all); /* counters moved (wrap) */
  long long crossover = 0;
  if (c->valid && created == run->tp) {
    for (int k = 0; k < run->tp; k++)
      if (run->create_err[k][0]) failf(env, c, DEFECT, "rank %d: %s", k, run->create_err[k]);
    crossover = run->crossover;
    env->cov.cases_run++;
    env->cov.wrap += c->wrap;
    env->cov.disabled += c->disable;
    env->cov.graphs += c->graph;
    env->cov.tp[c->spec.tp]++;
    if (c->spec.topk) env->cov.topk++;
    run_steps(run, &r, ref, crossover);
  }
  run->done = 1;
  pthread_barrier_wait(&run->all);
  for (int k = 0; k < run->tp; k++) pthread_join(th[k], NULL);
  for (int k = 0; k < run->tp; k++)
    if (run->destroy_rc[k] != KLRT_OK)
      failf(env, c, DEFECT, "rank %d: kl_ctx_destroy: %s", k, kl_result_name(run->destroy_rc[k]));
  if (c->has_nccl && c->valid)
    for (int k = 0; k < run->tp; k++) env->comm_destroy(run->comms[k]);
  kl_group_destroy(run->group);
  pthread_barrier_destroy(&run->all);
  pthread_barrier_destroy(&run->ranks);
  free(run);
  out = stdout; /* env->report is the caller's to close */
}
