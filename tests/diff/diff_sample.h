/* The sampler's reference in C: klgen.reference.sample
 * (python/klgen/reference.py, docs/design/sampling.md) written again from
 * its definition, for the differential suite to hold kl_sample to on the
 * host. Only what libm may round differently from the device comes in
 * computed elsewhere: the noise g (logf) and the top-p weights' exponentials
 * e (expf), so the host decides nothing on a last-bit difference.
 * tests/python/test_reference.py compares it with the Python reference. */
#ifndef KL_DIFF_SAMPLE_H
#define KL_DIFF_SAMPLE_H

#include <stdint.h>

typedef struct sample_args {
  float temperature; /* 0: greedy */
  int64_t top_k;     /* 0: off (the caller maps >= vocab to 0) */
  float top_p;       /* 1: off */
  float min_p;       /* 0: off */
} sample_args;

/* vLLM's penalties on x, a column's logit (klrt.h's kl_sampling): n its
 * count in the request's output, seen its bit in the request's prompt (read
 * only with a repetition penalty rep != 1), freq and pres the frequency
 * and presence penalties; each product and difference rounded to float on
 * its own. A -0 result is +0. */
float sample_penalized(float x, int32_t n, int seen, float rep, float freq, float pres);

/* t[c] = x[c] / T in float32 (x itself when T is 0); returns t's largest
 * value, NaN when t holds a NaN. */
float sample_tempered(const float *x, int64_t vocab, float temperature, float *t);

/* The token of one row from its tempered values t (sample_tempered) and
 * largest value m: argmax t where T is 0 or the row is not regular (the first
 * NaN, else the first largest), else the first largest t + g among the
 * columns min-p, top-k and top-p keep. e[c] = expf(t[c] - m) is read only
 * where top-p runs (may be NULL otherwise); g[c] the noise. -1 when out of
 * memory. *kept, if not NULL, gets how many columns the filters kept (1 for
 * argmax rows). */
int64_t sample_token(const float *t, float m, int64_t vocab, const sample_args *a,
                     const float *e, const float *g, int64_t *kept);

/* Which columns the filters keep of a regular row with T > 0 (keep[c] 1 or
 * 0; e as for sample_token); returns how many, or -1 when out of memory. */
int64_t sample_keep(const float *t, float m, int64_t vocab, const sample_args *a, const float *e,
                    unsigned char *keep);

/* log_softmax of the raw logits x at column c, in double, rounded to float
 * (NaN when x's largest is not finite); *rank, if not NULL, sample_rank. */
float sample_logprob(const float *x, int64_t vocab, int64_t c, int64_t *rank);
/* The number of columns whose x >= x[c] (vLLM's rank of column c). */
int64_t sample_rank(const float *x, int64_t vocab, int64_t c);

/* The row's log_softmax pieces, once: *mx its largest x, the return value
 * the log of sum(exp(x - mx)) in double (NaN where mx is not finite or x
 * holds a NaN); column c's logprob is then sample_logprob_at. */
double sample_log_sum(const float *x, int64_t vocab, double *mx);
float sample_logprob_at(float xc, double mx, double log_sum);

/* The n columns of the largest x, largest first, NaN above all, ties to the
 * lowest column, into top[n]. 0, or -1 when out of memory. */
int sample_top(const float *x, int64_t vocab, int n, int64_t *top);

/* ---- the shards' candidates (docs/design/candidates.md):
 * what each rank would give the merge, and the rows that decides. The
 * kernels are to follow this; test_diff_ref holds it to sample_token. ---- */
#define SAMPLE_CAND_MAX 64

/* One shard's reduction of a row. */
typedef struct sample_shard {
  int n;                      /* candidates: min(K, the shard's columns) */
  float t[SAMPLE_CAND_MAX];   /* its n largest t in the key order */
  int64_t c[SAMPLE_CAND_MAX]; /* their columns (of the whole row) */
  float best, best_t;         /* its largest t + g in the key order, and that column's t */
  int64_t best_c;             /* the column (-1 for a shard of no column) */
} sample_shard;

/* Shard [first, first + cols) of a row's t and noise g (both indexed by the
 * row's columns), reduced to K (1..SAMPLE_CAND_MAX) candidates. */
void sample_shard_reduce(const float *t, const float *g, int64_t first, int64_t cols, int K,
                         sample_shard *out);

/* The token sample_token gives the whole row of `vocab` columns, from its
 * shards' reductions alone, or -1 where they cannot decide it (a row
 * sampled whole). a->top_k at most K; e and g as for sample_token (read at
 * candidates' columns only). outside: the sum of the integer top-p weights
 * floor(e * 2^38) of the columns top-p weighs that are not among the merged
 * candidates (those min-p keeps, or all), as a second exchange round would
 * give it; -1 when not known. *why, if not NULL, names the rule. */
/* What a second exchange round would give sample_from_shards as outside
 * for a regular row with T > 0: the integer top-p weights of the columns
 * past the row's first K in the key order that min-p keeps (or all). */
int64_t sample_outside_weight(const float *t, float m, int64_t vocab, const sample_args *a, int K,
                              const float *e);

int64_t sample_from_shards(const sample_shard *shards, int nshards, int64_t vocab,
                           const sample_args *a, int K, const float *e, const float *g,
                           int64_t outside, const char **why);

#endif
