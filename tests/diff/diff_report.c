/* The report of a failing case (see diff_case.h): its seed and spec, each
 * failure, and a failing step's times by rank, which tell a late peer from
 * a late device. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#include "diff_case.h"

/* The case's report: env->report where the caller keeps it apart (to judge a
 * stall: diff_held_back), else stdout. */
static FILE *out;

void diff_report_to(FILE *f) { out = f; }

void diff_failf(diff_env *env, const diff_case *c, enum fail_kind kind, const char *fmt, ...) {
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
int diff_held_back(const case_run *run, float *ms) {
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
    fprintf(out, "  %s %s staged by rank (calls):", label, op_name(op));
    for (int r = 0; r < run->tp; r++) fprintf(out, " %lld", run->rep[r].staged[op]);
    fprintf(out, "\n");
  }
  if (!any) fprintf(out, "  %s no call staged a copy\n", label);
}

/* Every rank's wall time for a failing step and host time per call: a late
 * peer shows as the rank whose call blocked, or as none (then its kernel was
 * late on the GPU); a step that timed out in less wall time than the poll
 * limit was timed by a clock that jumped. */
void diff_host_times(const case_run *run, const char *label) {
  fprintf(out, "  %s step wall ms by rank:", label);
  for (int r = 0; r < run->tp; r++) fprintf(out, " %.1f", run->rep[r].step_ms);
  fprintf(out, "\n");
  for (int i = 0; i < run->plan.nops; i++) {
    int op = run->plan.ops[i];
    fprintf(out, "  %s host ms of %s by rank:", label, op_name(op));
    for (int r = 0; r < run->tp; r++) fprintf(out, " %.2f", run->rep[r].host_ms[op]);
    fprintf(out, "\n");
  }
  if (run->plan.replay) return;
  staged_calls(run, label);
  if (run->plan.late_rank >= 0)
    fprintf(out, "  %s rank %d slept %.1f ms on the host before its %s\n", label,
            run->plan.late_rank, run->plan.late_us / 1000.0,
            op_name(run->plan.ops[run->plan.late_at]));
  start_skew(run, label);
  for (int e = 1; e < 2 + run->plan.nops; e++) {
    fprintf(out, "  %s device ms to %s done by rank:", label,
           e == 1 ? "upload" : op_name(run->plan.ops[e - 2]));
    for (int r = 0; r < run->tp; r++) fprintf(out, " %.1f", (double)run->rep[r].dev_ms[e]);
    fprintf(out, "\n");
  }
}
