/* klbench --sample: kl_sample on the spec's per-rank shard (the spec with
 * topk = 64, the candidates' capacity) against what engines run today.
 * Variants:
 *   filtered    kl_sample, every row T 0.7, top_k 50, top_p 0.9 (by the
 *               shards' candidates on the one-shot path; top_k 50 <= 64
 *               decides every row)
 *   plain T     kl_sample, every row T 0.7, no filter (by the shards)
 *   grammar     plain T through a grammar bitmask keeping a random half of
 *               each row's columns (what the mask costs beside plain T)
 *   penalties   plain T with vLLM's repetition (1.2), frequency (0.5) and
 *               presence (0.3) penalties on every row, its prompt's bits and
 *               output counts random (what they cost beside plain T)
 *   bias        plain T with a logit bias of 16 random columns a row
 *   allowed     plain T keeping 256 random allowed ids a row
 *   min_tokens  plain T with min_tokens on and 4 random stop ids a row
 *   banned      plain T with 4 random banned ids a row (bad words' result)
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
enum {
  S_FILTERED, S_PLAIN, S_GRAMMAR, S_PENALTIES, S_BIAS, S_ALLOWED, S_MIN, S_BANNED, /* draws */
  S_GREEDY, S_GATHER, S_ARGMAX, S_PAIRS, NS
};
static const char *const variant_names[NS] = {
    "filtered", "plain T", "grammar", "penalties", "bias",   "allowed",
    "min_tokens", "banned", "greedy", "gather",    "argmax", "NCCL pairs"};
static const char *const csv_names[NS] = {
    "filtered", "plain", "grammar", "penalties", "bias",   "allowed",
    "min_tokens", "banned", "greedy", "gather",  "argmax", "nccl_pairs"};
enum { DRAWN = S_GREEDY }; /* the variants whose tokens are draws: filtered .. banned */
/* Entries a row of each list variant. */
enum { BIAS_N = 16, ALLOWED_N = 256, STOP_N = 4, BANNED_N = 4 };

struct sample_bench {
  double t[NS][MAX_TOK][MAX_RANKS];
  long long bad[MAX_TOK][MAX_RANKS];
  int64_t *drawn[MAX_RANKS]; /* each rank's drawn tokens (DRAWN variants), every size */
  size_t stride;             /* entries per size: DRAWN times the most tokens */
};

struct sample_rank {
  kl_ctx *ctx;
  float *warm, *cold, *top_p; /* temperature 0.7 and 0 per row, top_p 0.9 */
  int32_t *top_k;
  int64_t *seed, *offset;
  int32_t *mask;             /* the grammar variant's bitmask, every row */
  uint32_t *h_mask;          /* a host copy, for the check */
  float *pen[3];             /* repetition, frequency, presence: every row */
  int32_t *prompt, *counts;  /* each row's prompt bits and output counts */
  int32_t *bias_n, *bias_ids, *allowed_n, *allowed_ids, *min_len, *stop_n, *stop_ids, *banned;
  float *bias_values;
  int32_t *h_allowed;        /* a host copy, for the check */
  int64_t *token[DRAWN + 1], *index; /* each variant's draws and greedy; kl_argmax's */
  float *value;
};

/* Words of a grammar row: a bit per column of the vocabulary. */
static size_t mask_words(const rank *R) { return ((size_t)R->b->spec.vocab_size + 31) / 32; }

/* The bench's random numbers: xorshift64, the same on every rank. */
static uint64_t next(uint64_t *x) {
  *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
  return *x;
}

/* Every row's bitmask: random words (the same on every rank, as an engine's
 * mask is), each bit set with probability one half. */
static void alloc_mask(rank *R, size_t rows) {
  struct sample_rank *S = R->smp;
  const size_t n = rows * mask_words(R);
  S->h_mask = malloc(4 * n);
  if (!S->h_mask) die("klbench", "out of memory");
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < n; i++) S->h_mask[i] = (uint32_t)(next(&x) >> 32);
  CUDA(cudaMalloc((void **)&S->mask, 4 * n));
  CUDA(cudaMemcpy(S->mask, S->h_mask, 4 * n, cudaMemcpyHostToDevice));
}

/* The penalties' values and tables for every row: a prompt of a random
 * eighth of the columns, an output count (1..4) at a random tenth. */
static void alloc_penalties(rank *R, size_t rows) {
  struct sample_rank *S = R->smp;
  const float values[3] = {1.2f, 0.5f, 0.3f};
  for (int k = 0; k < 3; k++) S->pen[k] = bench_dev_fill(rows, 4, &values[k]);
  const size_t vocab = (size_t)R->b->spec.vocab_size, words = mask_words(R);
  uint32_t *prompt = malloc(4 * rows * words);
  int32_t *counts = malloc(4 * rows * vocab);
  if (!prompt || !counts) die("klbench", "out of memory");
  uint64_t x = 0x2545f4914f6cdd1dull;
  for (size_t i = 0; i < rows * words; i++) {
    next(&x);
    prompt[i] = (uint32_t)x & (uint32_t)(x >> 21) & (uint32_t)(x >> 42);
  }
  for (size_t i = 0; i < rows * vocab; i++) {
    next(&x);
    counts[i] = x % 10 == 0 ? (int32_t)(1 + (x >> 8) % 4) : 0;
  }
  CUDA(cudaMalloc((void **)&S->prompt, 4 * rows * words));
  CUDA(cudaMalloc((void **)&S->counts, 4 * rows * vocab));
  CUDA(cudaMemcpy(S->prompt, prompt, 4 * rows * words, cudaMemcpyHostToDevice));
  CUDA(cudaMemcpy(S->counts, counts, 4 * rows * vocab, cudaMemcpyHostToDevice));
  free(prompt), free(counts);
}

/* rows x n random columns of the vocabulary, on the device; the host copy
 * in *host when host is not NULL. */
static int32_t *random_ids(rank *R, size_t rows, int n, uint64_t x, int32_t **host) {
  int32_t *h = malloc(4 * rows * (size_t)n), *d;
  if (!h) die("klbench", "out of memory");
  for (size_t i = 0; i < rows * (size_t)n; i++)
    h[i] = (int32_t)(next(&x) % (uint64_t)R->b->spec.vocab_size);
  CUDA(cudaMalloc((void **)&d, 4 * rows * (size_t)n));
  CUDA(cudaMemcpy(d, h, 4 * rows * (size_t)n, cudaMemcpyHostToDevice));
  if (host) *host = h;
  else free(h);
  return d;
}

/* The list variants' lists, every row full: bias values in [-4, 4), and a
 * min_tokens every row's position (0) is below. */
static void alloc_lists(rank *R, size_t rows) {
  struct sample_rank *S = R->smp;
  const int32_t bias_n = BIAS_N, allowed_n = ALLOWED_N, stop_n = STOP_N, min_len = 1 << 30;
  S->bias_n = bench_dev_fill(rows, 4, &bias_n);
  S->allowed_n = bench_dev_fill(rows, 4, &allowed_n);
  S->stop_n = bench_dev_fill(rows, 4, &stop_n);
  S->min_len = bench_dev_fill(rows, 4, &min_len);
  S->bias_ids = random_ids(R, rows, BIAS_N, 0x8a5cd789635d2dffull, NULL);
  S->allowed_ids = random_ids(R, rows, ALLOWED_N, 0x121fd2155c472f96ull, &S->h_allowed);
  S->stop_ids = random_ids(R, rows, STOP_N, 0x61c8864680b583ebull, NULL);
  S->banned = random_ids(R, rows, BANNED_N, 0xd1342543de82ef95ull, NULL);
  float *values = malloc(4 * rows * BIAS_N);
  if (!values) die("klbench", "out of memory");
  uint64_t x = 0xbf58476d1ce4e5b9ull;
  for (size_t i = 0; i < rows * BIAS_N; i++) values[i] = (float)(next(&x) % 8000) / 1000.0f - 4.0f;
  CUDA(cudaMalloc((void **)&S->bias_values, 4 * rows * BIAS_N));
  CUDA(cudaMemcpy(S->bias_values, values, 4 * rows * BIAS_N, cudaMemcpyHostToDevice));
  free(values);
}

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
  alloc_mask(R, n);
  alloc_penalties(R, n);
  alloc_lists(R, n);
  for (int i = 0; i <= DRAWN; i++) CUDA(cudaMalloc((void **)&S->token[i], 8 * n));
  CUDA(cudaMalloc((void **)&S->index, 8 * n));
  CUDA(cudaMalloc((void **)&S->value, 4 * n));
}

/* Variant v's processor on p (the plain and greedy variants have none). */
static void processor(const struct sample_rank *S, int v, kl_sampling *p) {
  switch (v) {
    case S_FILTERED: p->top_k = S->top_k, p->top_p = S->top_p; break;
    case S_GRAMMAR: p->bitmask = S->mask; break;
    case S_PENALTIES:
      p->repetition_penalty = S->pen[0], p->frequency_penalty = S->pen[1];
      p->presence_penalty = S->pen[2];
      p->prompt_mask = S->prompt, p->output_counts = S->counts;
      break;
    case S_BIAS:
      p->bias_width = BIAS_N, p->bias_count = S->bias_n;
      p->bias_ids = S->bias_ids, p->bias_values = S->bias_values;
      break;
    case S_ALLOWED:
      p->allowed_width = ALLOWED_N, p->allowed_count = S->allowed_n;
      p->allowed_ids = S->allowed_ids;
      break;
    case S_MIN:
      p->stop_width = STOP_N, p->min_len = S->min_len;
      p->stop_count = S->stop_n, p->stop_ids = S->stop_ids;
      break;
    case S_BANNED: p->banned_width = BANNED_N, p->banned = S->banned; break;
  }
}

static void draw(rank *R, int v, int T) {
  struct sample_rank *S = R->smp;
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = v == S_GREEDY ? S->cold : S->warm;
  processor(S, v, &p);
  p.seed = (const uint64_t *)S->seed, p.offset = (const uint64_t *)S->offset;
  KL(kl_sample(S->ctx, select_shard(R), &p, S->token[v], NULL, NULL, NULL, 0, T, R->s));
}

static void sample_step(rank *R, int v, int T) {
  struct sample_rank *S = R->smp;
  switch (v) {
    case S_GATHER: KL(kl_gather(R->ctx[0], select_shard(R), R->out[0], T, R->s)); break;
    case S_ARGMAX: KL(kl_argmax(S->ctx, select_shard(R), S->index, S->value, T, R->s)); break;
    case S_PAIRS: select_pairs(R, T); break;
    default: draw(R, v, T); break;
  }
}

/* Whether column g is one of row t's allowed ids. */
static int allowed(const struct sample_rank *S, int t, int64_t g) {
  for (int k = 0; k < ALLOWED_N; k++)
    if (S->h_allowed[(size_t)t * ALLOWED_N + k] == g) return 1;
  return 0;
}

/* greedy == kl_argmax == NCCL pairs, every token a column, every grammar
 * token one its row's mask keeps, every allowed token one of its row's
 * ids; the draws kept for the report's comparison across ranks.
 * Mismatches. */
static long long check(rank *R, int i) {
  struct sample_rank *S = R->smp;
  struct sample_bench *B = R->b->smp;
  const int T = R->b->tokens[i];
  const int64_t V = R->b->spec.vocab_size;
  int64_t *pairs = NULL;
  for (int v = 0; v < NS; v++) {
    if (v == S_PAIRS) pairs = select_pairs(R, T);
    else sample_step(R, v, T);
  }
  CUDA(cudaStreamSynchronize(R->s));
  enum { INDEX = S_GREEDY + 1, PAIRS, ALL };
  int64_t *h = malloc(8 * (size_t)T * ALL);
  if (!h) die("klbench", "out of memory");
  for (int k = 0; k < ALL; k++) {
    const int64_t *from = k == INDEX ? S->index : k == PAIRS ? pairs : S->token[k];
    CUDA(cudaMemcpy(h + k * T, from, 8 * (size_t)T, cudaMemcpyDeviceToHost));
  }
  long long bad = 0;
  for (int t = 0; t < T; t++) {
    const int64_t greedy = h[S_GREEDY * T + t];
    bad += greedy != h[INDEX * T + t] || greedy != h[PAIRS * T + t];
    for (int k = 0; k <= S_GREEDY; k++) bad += h[k * T + t] < 0 || h[k * T + t] >= V;
    const int64_t g = h[S_GRAMMAR * T + t], a = h[S_ALLOWED * T + t];
    if (g >= 0 && g < V)
      bad += !(S->h_mask[(size_t)t * mask_words(R) + (size_t)g / 32] >> (g % 32) & 1u);
    bad += !allowed(S, t, a);
  }
  memcpy(B->drawn[R->r] + (size_t)i * B->stride, h, 8 * (size_t)T * DRAWN);
  free(h);
  return bad;
}

void sample_setup(bench *b) {
  b->smp = calloc(1, sizeof *b->smp);
  if (!b->smp) die("klbench", "out of memory");
  b->smp->stride = DRAWN * (size_t)b->tokens[b->ntok - 1];
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
  free(S.h_mask), free(S.h_allowed);
  select_release(R);
  R->smp = NULL;
}

void sample_report(bench *b, FILE *csv) {
  printf("\nkl_sample, us per step (spec topk %d; filtered: T 0.7, top_k 50, top_p 0.9; "
         "plain: T 0.7; grammar: plain through a bitmask keeping half; penalties: plain with "
         "repetition 1.2, frequency 0.5, presence 0.3; bias, allowed, min_tokens, banned: "
         "plain with %d, %d, %d, %d ids a row):\n",
         SAMPLE_CAPACITY, BIAS_N, ALLOWED_N, STOP_N, BANNED_N);
  printf("%-7s", "tokens");
  for (int v = 0; v < NS; v++) printf(" %11s", variant_names[v]);
  printf(" %14s %8s\n", "pairs/greedy", "agree");
  if (csv) {
    fprintf(csv, "tokens");
    for (int v = 0; v < NS; v++) fprintf(csv, ",%s_us", csv_names[v]);
    fprintf(csv, ",mismatches\n");
  }
  for (int i = 0; i < b->ntok; i++) {
    double t[NS];
    long long bad = 0;
    for (int v = 0; v < NS; v++) t[v] = worst(b->smp->t[v][i], b->n);
    for (int r = 0; r < b->n; r++) {
      bad += b->smp->bad[i][r];
      const size_t at = (size_t)i * b->smp->stride;
      bad += memcmp(b->smp->drawn[r] + at, b->smp->drawn[0] + at,
                    8 * DRAWN * (size_t)b->tokens[i]) != 0; /* every rank the same tokens */
    }
    printf("%-7d", b->tokens[i]);
    for (int v = 0; v < NS; v++) printf(" %11.2f", t[v]);
    printf(" %13.2fx %8s\n", t[S_PAIRS] / t[S_GREEDY], bad ? "NO" : "yes");
    if (csv) {
      fprintf(csv, "%d", b->tokens[i]);
      for (int v = 0; v < NS; v++) fprintf(csv, ",%.3f", t[v]);
      fprintf(csv, ",%lld\n", bad);
    }
    if (bad) b->failed = 1;
  }
  for (int r = 0; r < b->n; r++) free(b->smp->drawn[r]);
}
