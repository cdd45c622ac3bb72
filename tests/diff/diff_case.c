/* One case (see diff_case.h): its group and communicators, its ranks as
 * threads (all on one GPU, or one a GPU) and what their creation must give,
 * its course of steps (eager, a graph captured and replayed between eager
 * steps of other sizes), each step in the ranks' rhythm: the main thread
 * makes its input, the ranks run it while the main thread computes the
 * reference, then the main thread compares. */
#include <stdlib.h>
#include <string.h>

#include "diff_case.h"
#include "kl_abi.h"

/* Where the step counters wrap: a multiple of 3 (kl_abi.h), else 2^32. */
#ifdef KL_STEP_WRAP
#define WRAP_AT ((uint64_t)KL_STEP_WRAP)
#else
#define WRAP_AT (1ull << 32)
#endif

static void step(case_run *run, rng *r, ref_step *ref, long long crossover, const char *name) {
  diff_env *env = run->env;
  char label[128];
  size_t n = (size_t)snprintf(label, sizeof label, "%s [", name);
  for (int i = 0; i < run->plan.nops && n < sizeof label; i++)
    n += (size_t)snprintf(label + n, sizeof label - n, "%s%s", i ? ", " : "",
                          op_name(run->plan.ops[i]) + 3);
  if (n < sizeof label) snprintf(label + n, sizeof label - n, "]");
  if (!run->plan.capture) diff_step_inputs(run, r, ref);
  diff_watchdog_note(label);
  unsigned gave_up = env->standin_timeouts ? env->standin_timeouts() : 0;
  ranks_sync_all(&run->threads); /* go */
  if (!run->plan.capture) diff_step_reference(run, ref);
  ranks_sync_all(&run->threads); /* done */
  if (env->standin_timeouts) gave_up = env->standin_timeouts() != gave_up;
  diff_compare(run, ref, crossover, label, (int)gave_up);
}

static void run_steps(case_run *run, rng *r, ref_step *ref, long long crossover) {
  const diff_case *c = run->c;
  char label[64];
  int steps = c->wrap ? 8 : c->steps;
  for (int s = 0; s < steps; s++) {
    int tokens = c->wrap && rng_chance(r, 0.8) ? (int)rng_range(r, 1, c->spec.max_tokens)
                                               : diff_draw_tokens(c, r);
    diff_plan_step(run, r, &run->plan, tokens, 1);
    snprintf(label, sizeof label, "step %d", s);
    step(run, r, ref, crossover, label);
    run->env->cov.steps++;
  }
  if (!c->graph) return;
  /* A step captured in a graph and replayed with new inputs; between
   * replays, eager steps of other sizes (larger ones regrow the scratch a
   * graph on the NCCL path points into). */
  int gt = c->extra_tokens >= 2 && rng_chance(r, 0.5) ? (int)c->spec.max_tokens + 1
                                                     : diff_draw_tokens(c, r);
  step_plan g;
  diff_plan_step(run, r, &g, gt, 0);
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
                       : diff_draw_tokens(c, r);
      diff_plan_step(run, r, &run->plan, tokens, 1);
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
  diff_report_to(env->report ? env->report : stdout);
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
    diff_failf(env, c, DEFECT, "kl_group_create: %s", kl_last_error());
    free(run);
    return;
  }
  if (c->valid && make_comms(run) != 0) {
    diff_failf(env, c, DEFECT, "NCCL communicators could not be made");
    kl_group_destroy(run->group);
    free(run);
    return;
  }
  run->wrap_near = (uint32_t)(WRAP_AT - 1 - (uint64_t)rng_below(&r, 3));
  rank_arg args[DIFF_MAX_RANKS];
  diff_progress_reset();
  for (int k = 0; k < run->tp; k++) args[k] = (rank_arg){run, k};
  ranks_start(&run->threads, run->tp, diff_rank_main, args, sizeof *args);
  ranks_sync_all(&run->threads); /* created */
  int created = 0;
  for (int k = 0; k < run->tp; k++) created += run->create_rc[k] == KLRT_OK;
  if (!c->valid) {
    env->cov.invalid++;
    for (int k = 0; k < run->tp; k++)
      if (run->create_rc[k] != KLRT_ESPEC)
        diff_failf(env, c, DEFECT, "rank %d: an invalid spec gave %s, not KLRT_ESPEC", k,
                   kl_result_name(run->create_rc[k]));
  } else if (created != run->tp) {
    for (int k = 0; k < run->tp; k++)
      if (run->create_rc[k] != KLRT_OK)
        diff_failf(env, c, DEFECT, "rank %d: creation: %s: %s", k,
                   kl_result_name(run->create_rc[k]), run->create_err[k]);
  }
  ranks_sync_all(&run->threads); /* counters moved (wrap) */
  long long crossover = 0;
  if (c->valid && created == run->tp) {
    for (int k = 0; k < run->tp; k++)
      if (run->create_err[k][0]) diff_failf(env, c, DEFECT, "rank %d: %s", k, run->create_err[k]);
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
  ranks_sync_all(&run->threads);
  ranks_join(&run->threads);
  for (int k = 0; k < run->tp; k++)
    if (run->destroy_rc[k] != KLRT_OK)
      diff_failf(env, c, DEFECT, "rank %d: kl_ctx_destroy: %s", k,
                 kl_result_name(run->destroy_rc[k]));
  if (c->has_nccl && c->valid)
    for (int k = 0; k < run->tp; k++) env->comm_destroy(run->comms[k]);
  kl_group_destroy(run->group);
  free(run);
  diff_report_to(stdout); /* env->report is the caller's to close */
}
