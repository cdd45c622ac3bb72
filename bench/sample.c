/* klbench --sample: kl_sample on the spec's per-rank shard (the spec with
 * topk = 64, the candidates' capacity) against what engines run today.
 * Variants:
 *   filtered    kl_sample, every row T 0.7, top_k 50, top_p 0.9 (by the
 *               shards' candidates on the one-shot path; top_k 50 <= 64
 *               decides every row)
 *   plain T     kl_sample, every row T 0.7, no filter (by the shards)
 *   greedy      kl_sample, every row T 0 (by the shards)
 *   gather      kl_gather alone: where an engine's sampler starts
 *   argmax      kl_argmax
 *   NCCL pairs  each rank's (value, index) per token, ncclAllGather, the
 *               final reduction (select.c's: the engines' sharded greedy)
 * The engine's torch sampler after the gather is measured by
 * python -m klgen.bench --sample. Checked before anything is timed: greedy
 * == kl_argmax == NCCL pairs, and every rank draws the same tokens. Timing
 * as for the other tables (graphs replayed by all ranks together, median
 * over replays, max over ranks). */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "klbench.h"

#define SAMPLE_CAPACITY 64
enum { S_FILTERED, S_PLAIN, S_GREEDY, S_GATHER, S_ARGMAX, S_PAIRS, NS };
static const char *const variant_names[NS] = {"filtered", "plain T", "greedy", "gather",
                                              "argmax", "NCCL pairs"};

struct sample_bench {
  double t[NS][MAX_TOK][MAX_RANKS];
  long long bad[MAX_TOK][MAX_RANKS];
  int64_t *drawn[MAX_RANKS]; /* each rank's filtered and plain tokens, every size */
  size_t stride;             /* entries per size: twice the most tokens */
};

struct sample_rank {
  kl_ctx *ctx;
  float *warm, *cold, *top_p; /* temperature 0.7 and 0 per row, top_p 0.9 */
  int32_t *top_k;
  int64_t *seed, *offset;
  int64_t *token[3], *index; /* filtered, plain, greedy; kl_argmax's */
  float *value;
};

/* The parameter rows, and seeds 1..n (each row draws its own noise). */
static void alloc_sample(rank *R) {
  struct sample_rank *S = R->smp;
  const size_t n = (size_t)R->b->tokens[R->b->ntok - 1];
  const float warm = 0.7f, cold = 0.0f, top_p = 0.9f;
  const int32_t top_k = 50;
  const int64_t zero = 0;
  S->warm = bench_dev_fill(n, 4, &warm);
  S->cold = bench_dev_fill(n, 4, &cold);
  S->top_p = bench_dev_fill(n, 4, &top_p);
  S->top_k = bench_dev_fill(n, 4, &top_k);
  S->offset = bench_dev_fill(n, 8, &zero);
  int64_t *seeds = malloc(8 * n);
  for (size_t i = 0; i < n; i++) seeds[i] = (int64_t)i + 1;
  CUDA(cudaMalloc((void **)&S->seed, 8 * n));
  CUDA(cudaMemcpy(S->seed, seeds, 8 * n, cudaMemcpyHostToDevice));
  free(seeds);
  for (int i = 0; i < 3; i++) CUDA(cudaMalloc((void **)&S->token[i], 8 * n));
  CUDA(cudaMalloc((void **)&S->index, 8 * n));
  CUDA(cudaMalloc((void **)&S->value, 4 * n));
}

static void draw(rank *R, const float *temperature, int filtered, int64_t *token, int T) {
  struct sample_rank *S = R->smp;
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = temperature;
  p.top_k = filtered ? S->top_k : NULL;
  p.top_p = filtered ? S->top_p : NULL;
  p.seed = (const uint64_t *)S->seed, p.offset = (const uint64_t *)S->offset;
  KL(kl_sample(S->ctx, select_shard(R), &p, token, NULL, NULL, NULL, 0, T, R->s));
}

static void sample_step(rank *R, int v, int T) {
  struct sample_rank *S = R->smp;
  switch (v) {
    case S_FILTERED: draw(R, S->warm, 1, S->token[0], T); break;
    case S_PLAIN: draw(R, S->warm, 0, S->token[1], T); break;
    case S_GREEDY: draw(R, S->cold, 0, S->token[2], T); break;
    case S_GATHER: KL(kl_gather(R->ctx[0], select_shard(R), R->out[0], T, R->s)); break;
    case S_ARGMAX: KL(kl_argmax(S->ctx, select_shard(R), S->index, S->value, T, R->s)); break;
    case S_PAIRS: select_pairs(R, T); break;
  }
}

/* greedy == kl_argmax == NCCL pairs, every token a column; the filtered and
 * plain draws kept for the report's comparison across ranks. Mismatches. */
static long long check(rank *R, int i) {
  struct sample_rank *S = R->smp;
  struct sample_bench *B = R->b->smp;
  const int T = R->b->tokens[i];
  int64_t *pairs = NULL;
  for (int v = 0; v < NS; v++) {
    if (v == S_PAIRS) pairs = select_pairs(R, T);
    else sample_step(R, v, T);
  }
  CUDA(cudaStreamSynchronize(R->s));
  int64_t *h = malloc(8 * (size_t)T * 5);
  const int64_t *from[5] = {S->token[0], S->token[1], S->token[2], S->index, pairs};
  for (int k = 0; k < 5; k++) CUDA(cudaMemcpy(h + k * T, from[k], 8 * (size_t)T, cudaMemcpyDeviceToHost));
  long long bad = 0;
  for (int t = 0; t < T; t++) {
    bad += h[2 * T + t] != h[3 * T + t] || h[2 * T + t] != h[4 * T + t];
    for (int k = 0; k < 3; k++) bad += h[k * T + t] < 0 || h[k * T + t] >= R->b->spec.vocab_size;
  }
  memcpy(B->drawn[R->r] + (size_t)i * B->stride, h, 8 * (size_t)T * 2);
  free(h);
  return bad;
}

void sample_setup(bench *b) {
  b->smp = calloc(1, sizeof *b->smp);
  if (!b->smp) die("klbench", "out of memory");
  b->smp->stride = 2 * (size_t)b->tokens[b->ntok - 1];
  for (int r = 0; r < b->n; r++) {
    b->smp->drawn[r] = calloc((size_t)b->ntok * b->smp->stride, 8);
    if (!b->smp->drawn[r]) die("klbench", "out of memory");
  }
}

void sample_rank(rank *R) {
  bench *b = R->b;
  struct sample_rank S;
  memset(&S, 0, sizeof S);
  R->smp = &S;
  kl_config cfg = select_config(R);
  char capacity[32];
  snprintf(capacity, sizeof capacity, "topk = %d", SAMPLE_CAPACITY);
  S.ctx = select_ctx(b, capacity, &cfg);
  select_engine_ops(R);
  alloc_sample(R);
  for (int k = 0; k < 2000; k++) sample_step(R, k % NS, b->tokens[0]); /* clocks up */
  CUDA(cudaStreamSynchronize(R->s));
  for (int i = 0; i < b->ntok; i++) {
    int all[NS];
    double t[NS];
    if (R->r == 0) progress(b, i, "checking greedy == argmax == NCCL pairs");
    b->smp->bad[i][R->r] = check(R, i);
    if (R->r == 0) progress(b, i, "timing kl_sample and the engines' ways");
    for (int v = 0; v < NS; v++) all[v] = v;
    time_graphs(R, sample_step, all, NS, b->tokens[i], b->replays, t);
    for (int v = 0; v < NS; v++) b->smp->t[v][i][R->r] = t[v];
  }
  CUDA(cudaStreamSynchronize(R->s));
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(S.ctx, &st);
  if (st.nccl) die("--sample", "kl_sample left the one-shot path");
  if (kl_ctx_status(S.ctx) != KLRT_OK) die("device status", kl_last_error());
  kl_ctx_destroy(S.ctx);
  select_release(R);
  R->smp = NULL;
}

void sample_report(bench *b, FILE *csv) {
  printf("\nkl_sample, us per step (spec topk %d; filtered: T 0.7, top_k 50, top_p 0.9; "
         "plain: T 0.7):\n", SAMPLE_CAPACITY);
  printf("%-7s", "tokens");
  for (int v = 0; v < NS; v++) printf(" %11s", variant_names[v]);
  printf(" %14s %8s\n", "pairs/greedy", "agree");
  if (csv)
    fprintf(csv, "tokens,filtered_us,plain_us,greedy_us,gather_us,argmax_us,nccl_pairs_us,"
                 "mismatches\n");
  for (int i = 0; i < b->ntok; i++) {
    double t[NS];
    long long bad = 0;
    for (int v = 0; v < NS; v++) t[v] = worst(b->smp->t[v][i], b->n);
    for (int r = 0; r < b->n; r++) {
      bad += b->smp->bad[i][r];
      const size_t at = (size_t)i * b->smp->stride;
      bad += memcmp(b->smp->drawn[r] + at, b->smp->drawn[0] + at,
                    8 * 2 * (size_t)b->tokens[i]) != 0; /* every rank the same tokens */
    }
    printf("%-7d", b->tokens[i]);
    for (int v = 0; v < NS; v++) printf(" %11.2f", t[v]);
    printf(" %13.2fx %8s\n", t[S_PAIRS] / t[S_GREEDY], bad ? "NO" : "yes");
    if (csv)
      fprintf(csv, "%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%lld\n", b->tokens[i], t[S_FILTERED],
              t[S_PLAIN], t[S_GREEDY], t[S_GATHER], t[S_ARGMAX], t[S_PAIRS], bad);
    if (bad) b->failed = 1;
  }
  for (int r = 0; r < b->n; r++) free(b->smp->drawn[r]);
}
