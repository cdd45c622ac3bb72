/* The rank threads of a case (see diff_case.h): each makes its context,
 * then runs the steps the main thread plans (canary, upload, the calls or
 * the graph's replay, download, kl_ctx_status), recording per call its
 * result, path and times in its rank_report. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "diff_case.h"
#include "klrt_testing.h"

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

/* The step's lists in sp, from an arena's list area at `area`. */
static void set_lists(kl_sampling *sp, const step_plan *p, CUdeviceptr area) {
#define LIST(type, which) ((const type *)(area + list_at(which)))
  if (p->lists & 1) {
    sp->allowed_count = LIST(int32_t, L_ALLOWED_COUNT), sp->allowed_ids = LIST(int32_t, L_ALLOWED_IDS);
    sp->allowed_width = p->widths[0];
  }
  if (p->lists & 2) {
    sp->bias_count = LIST(int32_t, L_BIAS_COUNT), sp->bias_ids = LIST(int32_t, L_BIAS_IDS);
    sp->bias_values = LIST(float, L_BIAS_VALUES), sp->bias_width = p->widths[1];
  }
  if (p->lists & 4) {
    sp->min_len = LIST(int32_t, L_MIN_LEN), sp->stop_count = LIST(int32_t, L_STOP_COUNT);
    sp->stop_ids = LIST(int32_t, L_STOP_IDS), sp->stop_width = p->widths[2];
  }
  if (p->lists & 8) sp->banned = LIST(int32_t, L_BANNED), sp->banned_width = p->widths[3];
  if (p->lists & 16) sp->position = LIST(int64_t, L_POSITION);
#undef LIST
}

static kl_result call_sample(case_run *run, kl_ctx *ctx, const diff_slot *s, CUstream st) {
  const step_plan *p = &run->plan;
  const diff_env *env = run->env;
  CUdeviceptr base = at(s, env->sample_area);
  /* bits of nulls: top_k, top_p, min_p, seed, offset */
  kl_sampling sp = KL_SAMPLING_INIT;
  sp.temperature = (const float *)(base + param_at(P_T));
  sp.top_k = (p->nulls & 1) ? NULL : (const int32_t *)(base + param_at(P_TOP_K));
  sp.top_p = (p->nulls & 2) ? NULL : (const float *)(base + param_at(P_TOP_P));
  sp.min_p = (p->nulls & 4) ? NULL : (const float *)(base + param_at(P_MIN_P));
  sp.seed = (p->nulls & 8) ? NULL : (const uint64_t *)(base + param_at(P_SEED));
  sp.offset = (p->nulls & 16) ? NULL : (const uint64_t *)(base + param_at(P_OFFSET));
  if (p->states) {
    sp.state_rows = (const void *)(base + param_at(P_STATE_ROWS));
    sp.states = p->states, sp.state_rows_bits = p->states_bits;
  }
  if (p->offsets) {
    sp.offset_rows = (const void *)(base + param_at(P_OFFSET_ROWS));
    sp.offsets = p->offsets, sp.offset_rows_bits = p->offsets_bits;
  }
  if (p->masked) sp.bitmask = (const int32_t *)at(s, env->mask_area);
  if (p->penalized) {
    const CUdeviceptr pen = at(s, env->pen_area);
    const unsigned n = p->pen_nulls;
    sp.repetition_penalty = (n & 1) ? NULL : (const float *)pen;
    sp.frequency_penalty = (n & 2) ? NULL : (const float *)(pen + 4 * DIFF_MAX_ROWS);
    sp.presence_penalty = (n & 4) ? NULL : (const float *)(pen + 8 * DIFF_MAX_ROWS);
    sp.prompt_mask = (n & 8) ? NULL : (const int32_t *)(pen + DIFF_PEN_PROMPT_AT);
    sp.output_counts = (n & 16) ? NULL : (const int32_t *)(pen + DIFF_PEN_COUNTS_AT);
  }
  if (p->listed) set_lists(&sp, p, at(s, env->list_area));
  if (p->want_rank) sp.rank = (int64_t *)at(s, sample_out_at(env, 4));
  sp.logit_values = p->logit_values;
  return kl_sample(ctx, (const void *)at(s, p->in_at), &sp, (int64_t *)at(s, sample_out_at(env, 0)),
                   p->want_lp ? (float *)at(s, sample_out_at(env, 1)) : NULL,
                   p->n_top ? (int64_t *)at(s, sample_out_at(env, 2)) : NULL,
                   p->n_top ? (float *)at(s, sample_out_at(env, 3)) : NULL, p->n_top, p->tokens,
                   (kl_stream)st);
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
    size_t ss[DIFF_SAMPLE_OUTS];
    sample_sizes(p, ss);
    for (int i = 0; i < DIFF_SAMPLE_OUTS; i++)
      if (ss[i]) cu_ok(rep, diff_move(run->env, at(s, sample_out_at(run->env, i)), NULL, 0xa5,
                                      ss[i], s->s), "canary");
    /* the step's parameters (a replay reads them where its capture pointed) */
    cu_ok(rep, diff_move(run->env, at(s, run->env->sample_area), run->env->h_params, 0,
                         DIFF_SAMPLE_PARAM_BYTES, s->s), "parameters");
    if (p->masked)
      cu_ok(rep, diff_move(run->env, at(s, run->env->mask_area), run->env->h_mask, 0,
                           4 * mask_words(run) * (size_t)p->tokens, s->s), "bitmask");
    if (p->penalized) {
      const size_t n = (size_t)table_entries(p), pen = run->env->pen_area;
      const size_t head = DIFF_PEN_PROMPT_AT + 4 * mask_words(run) * n;
      const size_t counts = 4 * (size_t)run->c->spec.vocab_size * n;
      cu_ok(rep, diff_move(run->env, at(s, pen), run->env->h_pen, 0, head, s->s), "penalties");
      cu_ok(rep, diff_move(run->env, at(s, pen + DIFF_PEN_COUNTS_AT),
                           run->env->h_pen + DIFF_PEN_COUNTS_AT, 0, counts, s->s), "counts");
    }
    if (p->listed)
      cu_ok(rep, diff_move(run->env, at(s, run->env->list_area), run->env->h_list, 0,
                           DIFF_LIST_BYTES, s->s), "lists");
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
    size_t ss[DIFF_SAMPLE_OUTS];
    sample_sizes(p, ss);
    void *sdst[DIFF_SAMPLE_OUTS] = {s->h_tok, s->h_lp, s->h_tidx, s->h_tlp, s->h_rank};
    for (int i = 0; i < DIFF_SAMPLE_OUTS; i++)
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
    diff_progress((int)(rep - run->rep), op_name(op));
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
  ranks_sync(&run->threads);
  CUgraph g = NULL;
  if (cu_ok(rep, cu->cuStreamBeginCapture(s->s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture")) {
    run_ops(run, ctx, s, rep, 0);
    cu_ok(rep, cu->cuStreamEndCapture(s->s, &g), "end capture");
  }
  for (int op = 0; op < OP_COUNT; op++) run->capture_rc[rank][op] = rep->rc[op];
  diff_progress(rank, "capture: at the ranks' barrier after");
  ranks_sync(&run->threads);
  diff_progress(rank, "cuGraphInstantiate");
  if (!g || !cu_ok(rep, cu->cuGraphInstantiate(ge, g, 0), "instantiate")) *ge = NULL;
  if (g) cu->cuGraphDestroy(g);
  diff_progress(rank, "capture: at the ranks' barrier after instantiation");
  ranks_sync(&run->threads);
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

void *diff_rank_main(void *arg) {
  rank_arg *ra = arg;
  case_run *run = ra->run;
  int rank = ra->rank;
  const diff_case *c = run->c;
  diff_env *env = run->env;
  const diff_slot *s = &env->slots[rank];
  env->cu->cuCtxSetCurrent(s->cuctx);
  kl_config cfg = rank_config(rank, run->tp, s->device, run->tp > 1 ? run->group : NULL);
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
  ranks_sync_all(&run->threads);
  /* The first work on a stream after the group's contexts made theirs
   * could wait behind peers' spinning grids, as a new stream's first work
   * does (diff_main.c setup), and time out so; an event recorded and
   * waited for here first keeps them apart (the next barrier waits for
   * every rank's). */
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
  ranks_sync_all(&run->threads);
  CUgraphExec ge = NULL;
  for (;;) {
    diff_progress(rank, "at the barrier before a step");
    ranks_sync_all(&run->threads); /* the plan is out */
    if (run->done) break;
    if (ctx) run_step(run, rank, ctx, &ge);
    diff_progress(rank, "at the barrier after its step (its results are in)");
    ranks_sync_all(&run->threads); /* the results are in */
  }
  if (ge) env->cu->cuGraphExecDestroy(ge);
  run->destroy_rc[rank] = ctx ? kl_ctx_destroy(ctx) : KLRT_OK;
  return NULL;
}
