/* What klbench's modules share: the bench and rank state; the measuring
 * (measure.c), which every table uses; the sampling-ready table (select.c),
 * which klbench.c runs for --select; kl_sample's (sample.c), for --sample,
 * with select.c's engine kernels; the grid (grid.c and the modules grid.h
 * names), for --grid. Calls go one way: klbench.c -> sample.c, select.c,
 * grid.c -> measure.c, and sample.c -> select.c. */
#ifndef KL_KLBENCH_H
#define KL_KLBENCH_H

#include <pthread.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "bench_util.h"
#include "grid.h"
#include "klgen.h"
#include "klrt/klrt.h"

#define MAX_TOK 64
#define MAX_RANKS 8
#define HIDDEN 7168
#define MAX_VARIANTS 24 /* graphs timed side by side (paths, end-to-end, grid variants) */
enum { P_ONESHOT, P_NOPDL, P_RING, P_SYMM, P_AUTO, NPATHS };
enum { E_GEMM, E_ONESHOT, E_NOPDL, E_RING, NE2E };

typedef struct bench {
  const char *spec_path, *name, *csv, *plot, *tune, *templates;
  char *source; /* rendered from `templates`, or NULL: the runtime renders */
  int tokens[MAX_TOK], ntok, steps, replays, gemm, n;
  kl_spec orig, spec;
  kl_layout l;
  char spec_src[1024], gpu[256], arch[16];
  int sm_count;
  ncclComm_t comms[MAX_RANKS];
  kl_group *group;
  pthread_barrier_t bar;
  double t[NPATHS][MAX_TOK][MAX_RANKS];  /* µs per step, median over replays */
  long long bad[MAX_TOK][MAX_RANKS];      /* elements where paths disagree */
  int auto_path[MAX_TOK];                 /* 0 one-shot, 1 NCCL */
  int e2e_tokens[2];
  double e2e[NE2E][2][MAX_RANKS];
  int symm_rank[MAX_RANKS], symm_ok; /* symm_ok: windows on every rank */
  int failed;
  int select, topk; /* --select: the sampling table instead (select.c), top-k's k */
  struct select_bench *sel;
  int sample; /* --sample: kl_sample's table instead (sample.c) */
  struct sample_bench *smp;
  int grid;       /* --grid: the roofline grid instead (grid.c) */
  int replays_given;
  grid_opts go;
  char command[1024]; /* the command line, for the grid's CSV */
} bench;

typedef struct rank {
  bench *b;
  int r;
  cudaStream_t s;
  kl_ctx *ctx[4]; /* one-shot, no-PDL, auto, NCCL (one-shot declined) */
  CUfunction relayout;
  CUmodule mod;
  void *in, *out[NPATHS], *symm;
  size_t in_bytes, out_bytes, all_bytes;
  ncclWindow_t win;
  cudaEvent_t e0, e1;
  struct select_rank *sel; /* --select, --sample */
  struct sample_rank *smp;  /* --sample */
  struct grid *grid;        /* --grid */
} rank;


#define NCCL(call)                                                   \
  do {                                                               \
    ncclResult_t n_ = (call);                                        \
    if (n_ != ncclSuccess) die(#call, ncclGetErrorString(n_));       \
  } while (0)
#define KL(call)                                                     \
  do {                                                               \
    if ((call) != KLRT_OK) die(#call, kl_last_error());              \
  } while (0)

/* ---- measure.c ---- */
/* What kl_ctx_create_generated takes for a spec, its layout and a source
 * rendered from --templates (borrowed: source must outlive the call). */
kl_generated bench_generated(const kl_spec *s, const kl_layout *l, const char *source);

/* For each of the n variants which[i]: `steps` calls of fn captured once and
 * replayed in turn, every rank together; t[i]: median us per step. */
typedef void (*step_fn)(rank *R, int p, int T);
void time_graphs(rank *R, step_fn fn, const int *which, int n, int T, int replays, double *t);
double worst(const double *v, int n);
void progress(const bench *b, int i, const char *what);
/* elems logits of dtype on the host (free them), the same for the same seed. */
unsigned char *bench_logits(size_t elems, kl_dtype dtype, uint32_t seed);
/* Device memory (dies if there is none); n copies of value. */
void *bench_dev(size_t bytes);
void *bench_dev_fill(size_t n, size_t elem, const void *value);

/* ---- select.c: --select, and the engines' kernels --sample measures too ---- */
void select_setup(bench *b);
void select_rank(rank *R);   /* a rank thread's part: contexts, checks, timing */
void select_report(bench *b, FILE *csv);
kl_config select_config(const rank *R); /* this rank's, one-shot up to any size */
kl_ctx *select_ctx(const bench *b, const char *extra, const kl_config *cfg);
void select_engine_ops(rank *R);        /* R->sel: the engines' kernels, the shard input */
void *select_shard(const rank *R);      /* [max tokens, shard], finite logits */
int64_t *select_pairs(rank *R, int T);  /* greedy by NCCL pairs: the indices (device) */
void select_release(rank *R);

/* ---- grid.c: --grid (on GPU 0; the exit status) ---- */
int grid_run(bench *b);

/* ---- sample.c: --sample ---- */
void sample_setup(bench *b);
void sample_rank(rank *R);
void sample_report(bench *b, FILE *csv);

#endif
