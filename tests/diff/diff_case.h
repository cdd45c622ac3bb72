/* A case of the differential suite as it runs, and the parts that run it:
 * diff_case.c the case (its ranks' creation, its course of steps, each
 * step's rhythm), diff_ranks.c the rank threads, diff_plan.c a step's plan,
 * diff_inputs.c a step's inputs and their reference, diff_check.c the
 * comparison of every rank's outputs with it, diff_report.c the report of
 * a failing case. The main thread plans a step and makes its input, the
 * ranks run it, the main thread computes the reference meanwhile and then
 * compares. */
#ifndef KL_DIFF_CASE_H
#define KL_DIFF_CASE_H

#include <stdio.h>

#include "diff_env.h"
#include "ranks.h"

enum { OP_GATHER, OP_ARGMAX, OP_TOPK, OP_SAMPLE, OP_COUNT };
static inline const char *op_name(int op) {
  static const char *const names[] = {"kl_gather", "kl_argmax", "kl_topk", "kl_sample"};
  return names[op];
}
enum { PATH_UNKNOWN = -1, PATH_ONESHOT = 0, PATH_NCCL = 1 };

typedef struct step_plan {
  int tokens;
  int nops, ops[OP_COUNT];
  int overlap;      /* outputs overlap the shard: it is uploaded again before each op */
  size_t in_at, out_at; /* byte offsets of the shard and of out in the arena */
  size_t sel_at[5]; /* argmax index, value; top-k index, value, lse */
  int value, lse;   /* ask for them (else NULL) */
  /* kl_sample: its top-n, whether it asks for the logprob and the rank,
   * whether its logprob outputs hold the logits (logit_values), which
   * parameter arrays it passes as NULL (bit i: top_k, top_p, min_p, seed,
   * offset) */
  int n_top, want_lp, want_rank, logit_values;
  unsigned nulls;
  /* kl_sampling's tables: states (0: no state_rows, T..seed per row) and
   * offsets (0: no offset_rows) entries, their index arrays' bits (32, 64) */
  int states, offsets, states_bits, offsets_bits;
  int masked;       /* kl_sample gets a bitmask (the arena's mask area) */
  /* kl_sample gets penalties (the arena's penalty area), and which of their
   * arrays are NULL (bit i: repetition, frequency, presence, prompt_mask,
   * output_counts) */
  int penalized;
  unsigned pen_nulls;
  /* kl_sample gets lists (the arena's list area), which (bit i: allowed,
   * bias, min_tokens, banned, position) and how wide their rows are */
  int listed;
  unsigned lists;
  int widths[4];
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
  rank_threads threads; /* ranks_sync_all: the ranks and the main thread */
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

typedef diff_ref_bufs ref_step;

/* ---- a step's buffers: in the arena, and the pinned parameter block ---- */

static inline size_t in_bytes(const case_run *run, int tokens) {
  return (size_t)tokens * (size_t)run->c->layout.shard_bytes;
}
static inline size_t out_bytes(const case_run *run, int tokens) {
  return (size_t)tokens * (size_t)run->c->spec.vocab_size * (size_t)run->c->layout.out_elem_bytes;
}

/* The selection outputs' sizes: argmax index, value; top-k index, value, lse. */
static inline void sel_sizes(const case_run *run, int tokens, size_t sz[5]) {
  size_t k = (size_t)run->c->spec.topk;
  sz[0] = 8 * (size_t)tokens, sz[1] = 4 * (size_t)tokens;
  sz[2] = 8 * k * (size_t)tokens, sz[3] = 4 * k * (size_t)tokens, sz[4] = 4 * (size_t)tokens;
}

/* kl_sample's parameter arrays in the pinned block and in each arena's sample
 * area (DIFF_SAMPLE_PARAM_BYTES): T, top_p, min_p, top_k, then seed, offset,
 * state_rows, offset_rows. */
enum { P_T, P_TOP_P, P_MIN_P, P_TOP_K, P_SEED, P_OFFSET, P_STATE_ROWS, P_OFFSET_ROWS };
static inline size_t param_at(int which) {
  static const size_t at_[] = {0, 4, 8, 12, 16, 24, 32, 40};
  return at_[which] * DIFF_MAX_ROWS;
}
static inline void *host_param(const diff_env *env, int which) {
  return (char *)env->h_params + param_at(which);
}
/* Its outputs after the parameters: token, logprob, top index, top logprob,
 * rank. */
static inline size_t sample_out_at(const diff_env *env, int which) {
  static const size_t at_[] = {0, 8, 12, 12 + 8 * 64, 12 + 12 * 64};
  return env->sample_area + DIFF_SAMPLE_OUT_AT + at_[which] * DIFF_MAX_ROWS;
}

/* A bitmask row's words. */
static inline size_t mask_words(const case_run *run) {
  return ((size_t)run->c->spec.vocab_size + 31) / 32;
}

/* The entries of kl_sample's per-request tables: states, or a row each. */
static inline int table_entries(const step_plan *p) {
  return p->states > p->tokens ? p->states : p->tokens;
}
/* Whether kl_sample gets a penalty array, and whether it gathers its rows
 * (runtime/sample.c: with top-n, or a logprob and penalties). */
static inline int sample_has_penalty(const step_plan *p) {
  return p->penalized && (p->pen_nulls & 7) != 7;
}
/* Whether it gets a list (allowed, bias, min_tokens or banned). */
static inline int sample_has_lists(const step_plan *p) { return p->listed && (p->lists & 15); }
static inline int sample_gathers(const step_plan *p) {
  return p->n_top > 0 || p->want_rank ||
         (p->want_lp && (sample_has_penalty(p) || sample_has_lists(p)));
}
/* The penalties' arrays in the pinned block and each arena's penalty area. */
static inline float *pen_values(const diff_env *env, int which) { /* 0 rep, 1 freq, 2 pres */
  return (float *)(env->h_pen + (size_t)which * 4 * DIFF_MAX_ROWS);
}
static inline uint32_t *pen_prompt(const diff_env *env) {
  return (uint32_t *)(env->h_pen + DIFF_PEN_PROMPT_AT);
}
static inline int32_t *pen_counts(const diff_env *env) {
  return (int32_t *)(env->h_pen + DIFF_PEN_COUNTS_AT);
}
/* The lists' arrays in the pinned block and each arena's list area, by
 * byte offset: the counts, min_len, position (int64), then the rows of
 * ids, bias values, stop ids and banned ids, DIFF_MAX_ROWS rows of each. */
enum { L_ALLOWED_COUNT, L_BIAS_COUNT, L_MIN_LEN, L_STOP_COUNT, L_POSITION, L_ALLOWED_IDS,
       L_BIAS_IDS, L_BIAS_VALUES, L_STOP_IDS, L_BANNED, L_COUNT };
static inline size_t list_at(int which) {
  static const int words[L_COUNT] = {1, 1, 1, 1, 2, DIFF_LIST_WIDTH_ALLOWED, DIFF_LIST_WIDTH_BIAS,
                                     DIFF_LIST_WIDTH_BIAS, DIFF_LIST_WIDTH_STOP,
                                     DIFF_LIST_WIDTH_BANNED};
  size_t at = 0;
  for (int i = 0; i < which; i++) at += (size_t)words[i] * 4 * DIFF_MAX_ROWS;
  return at;
}
static inline void *list_array(const diff_env *env, int which) { return env->h_list + list_at(which); }

static inline int has_op(const step_plan *p, int op) {
  for (int i = 0; i < p->nops; i++)
    if (p->ops[i] == op) return 1;
  return 0;
}

/* kl_sample's outputs' sizes: token, logprob, top index, top logprob, rank. */
enum { DIFF_SAMPLE_OUTS = 5 };
static inline void sample_sizes(const step_plan *p, size_t ss[DIFF_SAMPLE_OUTS]) {
  size_t n = (size_t)p->tokens, top = n * (size_t)p->n_top;
  ss[0] = 8 * n, ss[1] = p->want_lp ? 4 * n : 0, ss[2] = 8 * top, ss[3] = 4 * top;
  ss[4] = p->want_rank ? 8 * n : 0;
}

static inline uint32_t neg_zero(int dtype) { return dtype == KL_FP32 ? 0x80000000u : 0x8000u; }

/* ---- diff_ranks.c ---- */
/* A rank's thread (arg: its rank_arg): its context made, then each step the
 * main thread plans, until run->done; its context destroyed. */
void *diff_rank_main(void *arg);

/* ---- diff_plan.c ---- */
/* The step's plan into *p: its calls in a random order, their outputs'
 * places (misaligned now and then, overlapping the shard if allow_overlap),
 * a rank late on the host now and then. */
void diff_plan_step(case_run *run, rng *r, step_plan *p, int tokens, int allow_overlap);
/* A step's token count: 1, max_tokens, any between, or past it. */
int diff_draw_tokens(const diff_case *c, rng *r);

/* ---- diff_inputs.c ---- */
/* The planned step's input (ref->rows and each rank's h_in), the values the
 * gather must deliver, and kl_sample's parameters and the device's noise
 * for them: made before the ranks start the step. */
void diff_step_inputs(case_run *run, rng *r, ref_step *ref);
/* The selections and samples the step must give: made while the ranks run. */
void diff_step_reference(case_run *run, ref_step *ref);

/* ---- diff_check.c ---- */
/* Every rank's result codes, paths and outputs of the step against the
 * reference; failures go to the report. */
void diff_compare(case_run *run, const ref_step *ref, long long crossover, const char *label,
                  int standin_gave_up);

/* ---- diff_report.c ---- */
/* A failure is a fault (FAULT) when the library reported it as it must after
 * a peer timed out: kl_ctx_status's dead group, a later one-shot call's
 * KLRT_EDEVICE, a one-shot call's outputs that are poison (NaN, index -1)
 * where they differ, or anything on the NCCL path in a step where the NCCL
 * stand-in gave up on a peer (it has no way to say so to the runtime; real
 * NCCL would hang). A dead group's NCCL-path calls still give results: their
 * KLRT_EDEVICE or poison is a defect, as is anything else (a stale or wrong
 * value, a wrong path, a CUDA error) (DEFECT). */
enum fail_kind { DEFECT, FAULT };
/* Where the case's report goes (env->report, kept apart to judge a stall;
 * else stdout). */
void diff_report_to(FILE *f);
/* A failure of the case: its seed and spec first, then up to
 * DIFF_DETAIL_LINES lines. */
void diff_failf(diff_env *env, const diff_case *c, enum fail_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A rank whose step started on the device most of the poll limit late
 * (its delay in *ms), or -1. */
int diff_held_back(const case_run *run, float *ms);
/* The times of a failing step, by rank: wall, host per call, device. */
void diff_host_times(const case_run *run, const char *label);

#endif
