/* What the suite's run holds across cases: per rank a stream, a device arena
 * and pinned host buffers (made once: allocating while ranks spin would wait
 * for them), the device tanhf, the communicators, the coverage counters. */
#ifndef KL_DIFF_ENV_H
#define KL_DIFF_ENV_H

#include <nccl.h>

#include "cu.h"
#include "diff.h"
#include "diff_sample.h"
#include "gpu_util.h" /* CU_CHECK */
#include "klrt/klrt.h"

#include <stdio.h>
#include <stdlib.h>

#define DIFF_MAX_RANKS 16
#define DIFF_STEP_EVENTS 6 /* begun, uploaded, each of up to four calls done */
/* kl_sample's parameters, struct of arrays: T, top_p, min_p (fp32), top_k
 * (int32), seed, offset, state_rows, offset_rows (64-bit), DIFF_MAX_ROWS
 * each; and its outputs: token (int64), logprob (fp32), top index [rows,
 * 64] (int64), top logprob (fp32), rank (int64). */
#define DIFF_SAMPLE_PARAM_BYTES ((size_t)DIFF_MAX_ROWS * 48)
#define DIFF_SAMPLE_OUT_AT 8192
#define DIFF_SAMPLE_BYTES (DIFF_SAMPLE_OUT_AT + (size_t)DIFF_MAX_ROWS * (20 + 64 * 12))
/* kl_sample's bitmask: a row of ceil(vocab / 32) int32 words a token */
#define DIFF_MASK_BYTES (((size_t)DIFF_ELEM_BUDGET / 32 + DIFF_MAX_ROWS) * 4)
/* kl_sample's penalties, per entry of its tables (DIFF_MAX_ROWS at most):
 * repetition, frequency, presence (fp32), the prompts' bits (a row of mask
 * words an entry, DIFF_MASK_BYTES in all) and the output counts (int32, a
 * row of vocab_size an entry: a step has penalties only where they fit) */
#define DIFF_PEN_PROMPT_AT ((size_t)DIFF_MAX_ROWS * 12)
#define DIFF_PEN_COUNTS_AT (DIFF_PEN_PROMPT_AT + DIFF_MASK_BYTES)
#define DIFF_PEN_BYTES (DIFF_PEN_COUNTS_AT + (size_t)DIFF_ELEM_BUDGET * 4)
/* kl_sample's lists, DIFF_MAX_ROWS entries of each array (diff_case.h's
 * list_array says where): the counts, min_len, position, then the rows of
 * ids at most these wide */
#define DIFF_LIST_WIDTH_ALLOWED 64
#define DIFF_LIST_WIDTH_BIAS 300
#define DIFF_LIST_WIDTH_STOP 8
#define DIFF_LIST_WIDTH_BANNED 16
#define DIFF_LIST_BYTES                                                                     \
  ((size_t)DIFF_MAX_ROWS * 4 *                                                              \
   (6 + DIFF_LIST_WIDTH_ALLOWED + 2 * DIFF_LIST_WIDTH_BIAS + DIFF_LIST_WIDTH_STOP +         \
    DIFF_LIST_WIDTH_BANNED))
#define DIFF_DETAIL_LINES 12 /* failure lines printed per case */

typedef struct diff_slot {
  int device;
  CUcontext cuctx;
  CUstream s;
  CUdeviceptr arena;
  unsigned char *h_in, *h_out;
  int64_t *h_idx1, *h_idxk;
  uint32_t *h_val1, *h_valk, *h_lse;
  int64_t *h_tok, *h_tidx, *h_rank; /* kl_sample's token, top indices and ranks, read back */
  float *h_lp, *h_tlp;      /* its logprobs */
  /* timing events of an eager step: begun, uploaded, each op done (up to 4) */
  CUevent ev[DIFF_STEP_EVENTS];
} diff_slot;

typedef struct diff_coverage {
  long cases_run, invalid, steps, calls, replays, graphs, wrap, disabled, topk, sampled;
  long by_shards; /* kl_sample calls the shard sampler served */
  long filtered_shards; /* of them, with a filter array (its candidates, staged rows) */
  long masked;          /* kl_sample calls with a bitmask */
  long penalized;       /* kl_sample calls with penalties */
  long listed;          /* kl_sample calls with lists */
  long ranked;          /* kl_sample calls with ranks */
  long logits;          /* kl_sample calls with logprobs as logits (logit_values) */
  long path[2]; /* calls by path: one-shot, NCCL */
  long tp[DIFF_MAX_RANKS + 1];
} diff_coverage;

typedef struct diff_ref_bufs {
  uint32_t *rows;
  float *vals;
  uint32_t *gbits;
  int64_t idx1[DIFF_MAX_ROWS];
  uint32_t val1[DIFF_MAX_ROWS];
  int64_t *idxk;
  uint32_t *valk;
  double lse[DIFF_MAX_ROWS];
  /* kl_sample's: token, logprob, rank, top indices and logprobs [rows, n_top] */
  int64_t tok[DIFF_MAX_ROWS];
  int64_t rank[DIFF_MAX_ROWS];
  float lp[DIFF_MAX_ROWS];
  int64_t *tidx;
  float *tlp;
  /* its inputs, made before the ranks start (the device's noise and expf) */
  sample_args sargs[DIFF_MAX_ROWS];
  float sm[DIFF_MAX_ROWS];
  int sok[DIFF_MAX_ROWS];
  float *svals; /* the values it samples: vals through the step's bitmask and penalties */
  float *lvals; /* the values of its logprobs: vals through the step's bitmask */
} diff_ref_bufs;

typedef struct diff_env {
  const kl_cu *cu;
  int devices;
  nccl_mode nccl;
  ncclResult_t (*comm_init_all)(ncclComm_t *comms, int n, const int *devs);
  void (*comm_destroy)(ncclComm_t comm);
  const char *cache_dir;
  size_t out_area, sel_area, arena_bytes; /* arena: [shard | out | selections] */
  diff_slot slots[DIFF_MAX_RANKS];
  diff_ref_bufs ref;
  /* tanhf on the device, for the reference's epilogue */
  CUcontext ctx0;
  CUstream ts; /* rank 0's stream: used only between steps */
  CUmodule tmod;
  CUfunction tanh_fn, move_fn;
  int ce_copies; /* --copies ce: the steps' data by copy engine (diff_move) */
  int serial_ops; /* --serial-ops: an eager step's calls one at a time (each waited for),
                     so no rank queues work behind its spinning kernel */
  CUdeviceptr targ, tout;
  float *h_targ, *h_tout;
  /* kl_sample: the step's per-row parameters (pinned: every rank uploads
   * them, DIFF_SAMPLE_PARAM_BYTES) and the arena's sample area; the
   * reference's noise and expf from the device (diff_device_noise) */
  void *h_params;
  size_t sample_area;
  uint32_t *h_mask; /* the step's bitmask (pinned), uploaded to mask_area */
  size_t mask_area;
  unsigned char *h_pen; /* the step's penalties (pinned, DIFF_PEN_*), uploaded to pen_area */
  size_t pen_area;
  unsigned char *h_list; /* the step's lists (pinned, DIFF_LIST_BYTES), uploaded to list_area */
  size_t list_area;
  CUmodule smod[2];
  CUfunction noise_fn[2]; /* by the spec's noise: Philox's, vLLM's */
  CUdeviceptr tg, srow;
  float *h_tg;
  void *h_srow;
  int case_failures; /* failure lines of the case running */
  int case_defects;  /* those of them that are not a fault reported as it must be */
  int case_stalled;  /* a step of it started late on one rank's stream, by the poll limit */
  char stall_note[160]; /* which step and rank */
  FILE *report;      /* where the case's failures go (NULL: stdout) */
  unsigned (*standin_timeouts)(void); /* the NCCL stand-in's count of peers that never came */
  diff_coverage cov;
} diff_env;

/* diff_case.c (the parts of a case: diff_case.h) */
void diff_run_case(diff_env *env, const diff_case *c);
/* diff_ranks.c */
int diff_context_lost(void); /* a sticky CUDA error: nothing more can run */
/* diff_main.c */
void diff_device_tanh(diff_env *env, size_t n); /* h_tout[i] = tanhf(h_targ[i]) */
/* For `rows` rows of `vocab` tempered values t in h_targ and per row
 * {float m; u64 seed, offset} in h_srow (diff_noise_row): h_tout = expf(t - m),
 * h_tg = the noise of (seed, offset, column), as kl_sample's kernel has them. */
typedef struct diff_noise_row {
  float m;
  uint64_t seed, offset;
} diff_noise_row;
void diff_device_noise(diff_env *env, long long vocab, int rows, int noise);
/* n bytes to dst on s: from src (device, or pinned host), or `fill` when src is NULL */
CUresult diff_move(const diff_env *env, CUdeviceptr dst, const void *src, int fill, size_t n,
                   CUstream s);
void diff_watchdog_note(const char *where);
/* What rank `rank`'s thread does from now on (a string that lives as long
 * as the run), for the watchdog's report of a case that hangs: which rank
 * waits where, and for how long. diff_progress_reset(): no rank yet. */
void diff_progress(int rank, const char *what);
void diff_progress_reset(void);

#endif
