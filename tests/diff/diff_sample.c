/* The sampler's reference in C (diff_sample.h): the steps of
 * klgen.reference.sample one by one, on one row, with a sort and integer
 * arithmetic where the Python uses torch. */
#include "diff_sample.h"

#include <math.h>
#include <stdlib.h>

typedef struct entry {
  float v;
  int64_t c;
} entry;

/* The key order: value descending, ties to the lowest column; NaN first
 * (only sample_top sees one). */
static int key_order(const void *pa, const void *pb) {
  const entry *a = pa, *b = pb;
  int an = isnan(a->v), bn = isnan(b->v);
  if (an != bn) return an ? -1 : 1;
  if (!an && a->v != b->v) return a->v > b->v ? -1 : 1;
  return (a->c > b->c) - (a->c < b->c);
}

static entry *sorted(const float *v, int64_t vocab) {
  entry *s = malloc((size_t)vocab * sizeof *s);
  if (!s) return NULL;
  for (int64_t c = 0; c < vocab; c++) s[c] = (entry){v[c], c};
  qsort(s, (size_t)vocab, sizeof *s, key_order);
  return s;
}

float sample_tempered(const float *x, int64_t vocab, float temperature, float *t) {
  const float d = temperature == 0.f ? 1.f : temperature;
  float m = -INFINITY;
  int nan = 0;
  for (int64_t c = 0; c < vocab; c++) {
    t[c] = x[c] / d;
    nan |= isnan(t[c]);
    if (t[c] > m) m = t[c];
  }
  return nan ? NAN : m;
}

/* The row is regular: its largest t is finite (else the token is argmax t). */
static int sample_regular(float m) { return isfinite(m); }

/* The first NaN, else the first largest (column 0 when all are -Inf). */
static int64_t argmax(const float *t, int64_t vocab) {
  int64_t best = 0;
  for (int64_t c = 0; c < vocab; c++) {
    if (isnan(t[c])) return c;
    if (t[c] > t[best]) best = c;
  }
  return best;
}

/* ceil(p * total), exactly: p = mant * 2^(ex - 24) with a 24-bit mant. */
static int64_t ceil_product(float p, int64_t total) {
  int ex;
  const float f = frexpf(p, &ex);
  const unsigned __int128 prod = (unsigned __int128)(uint64_t)ldexpf(f, 24) * (uint64_t)total;
  const int s = 24 - ex; /* >= 23: p <= 1 */
  if (s >= 128) return prod != 0;
  const unsigned __int128 one = 1;
  return (int64_t)(prod >> s) + ((prod & ((one << s) - 1)) != 0);
}

/* A column's top-p weight, floor(e * 2^38), e = expf(t - m). */
static int64_t weight_of(const float *e, int64_t c) { return (int64_t)(e[c] * 0x1p38f); }

/* Min-p's value threshold: log(min_p) rounded to float, then the float sum. */
static float min_p_threshold(float m, float min_p) { return m + (float)log((double)min_p); }

/* a before b in the key order of t + g: the larger, ties to the lower column. */
static int draw_before(float va, int64_t ca, float vb, int64_t cb) {
  return va > vb || (va == vb && ca < cb);
}

/* Which of the first n columns has the largest t + g (the first column
 * of equals). */
static int draw_among(const entry *s, int n, const float *g) {
  int best = 0;
  float score = s[0].v + g[s[0].c];
  for (int i = 1; i < n; i++) {
    const float v = s[i].v + g[s[i].c];
    if (draw_before(v, s[i].c, score, s[best].c)) best = i, score = v;
  }
  return best;
}

/* How many of the first n columns top-p keeps when the weights before a
 * column must reach bound, or -1 when the first n do not reach it. */
static int top_p_keeps(const entry *s, int n, const float *e, int64_t bound) {
  int64_t before = 0;
  int i = 0;
  for (; i < n && before < bound; i++) before += weight_of(e, s[i].c);
  return before < bound ? -1 : i;
}

/* How many of the sorted columns top-p keeps of the first n: while the
 * integer weights before a column sum to less than ceil(p * total). */
static int64_t top_p_cut(const entry *s, int64_t n, const float *e, float p) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) total += weight_of(e, s[i].c);
  return top_p_keeps(s, (int)n, e, ceil_product(p, total));
}

/* How many of the sorted columns s the filters keep (a prefix). */
static int64_t kept_prefix(const entry *s, float m, int64_t vocab, const sample_args *a,
                           const float *e) {
  int64_t n = vocab;
  if (a->min_p > 0.f) {
    const float threshold = min_p_threshold(m, a->min_p);
    n = 0;
    while (n < vocab && s[n].v >= threshold) n++;
  }
  if (a->top_k > 0 && a->top_k < n) n = a->top_k;
  if (a->top_p < 1.f) n = top_p_cut(s, n, e, a->top_p);
  return n;
}

int64_t sample_keep(const float *t, float m, int64_t vocab, const sample_args *a, const float *e,
                    unsigned char *keep) {
  entry *s = sorted(t, vocab);
  if (!s) return -1;
  const int64_t n = kept_prefix(s, m, vocab, a, e);
  for (int64_t i = 0; i < vocab; i++) keep[s[i].c] = i < n;
  free(s);
  return n;
}

int64_t sample_token(const float *t, float m, int64_t vocab, const sample_args *a,
                     const float *e, const float *g, int64_t *kept) {
  if (kept) *kept = 1;
  if (a->temperature == 0.f || !sample_regular(m)) return argmax(t, vocab);
  entry *s = sorted(t, vocab);
  if (!s) return -1;
  const int64_t n = kept_prefix(s, m, vocab, a, e);
  const int64_t best = s[draw_among(s, (int)n, g)].c;
  free(s);
  if (kept) *kept = n;
  return best;
}

double sample_log_sum(const float *x, int64_t vocab, double *mx) {
  double m = -INFINITY, sum = 0;
  int nan = 0;
  for (int64_t i = 0; i < vocab; i++) {
    nan |= isnan(x[i]);
    if (x[i] > m) m = x[i];
  }
  *mx = m;
  if (nan || !isfinite(m)) return NAN;
  /* compensated (Neumaier): summed in column order, terms far below the
   * largest one (1) would be dropped once it is in */
  double lost = 0;
  for (int64_t i = 0; i < vocab; i++) {
    const double t = exp((double)x[i] - m), s = sum + t;
    lost += fabs(sum) >= fabs(t) ? (sum - s) + t : (t - s) + sum;
    sum = s;
  }
  return log(sum + lost);
}

/* One rounded float product: volatile, so that no compiler fuses it into
 * the difference after it (vLLM rounds both). */
static float product(float a, float b) {
  volatile float p = a * b;
  return p;
}

float sample_penalized(float x, int32_t n, int seen, float rep, float freq, float pres) {
  const int any = rep != 1.f || freq != 0.f || pres != 0.f;
  if (!any) return x;
  if (rep != 1.f && (seen || n > 0)) x = product(x, x > 0.f ? 1.f / rep : rep);
  x = x - product(freq, (float)n);
  if (n > 0) x = x - pres;
  return x + 0.f;
}

float sample_logprob_at(float xc, double mx, double log_sum) {
  return (float)(((double)xc - mx) - log_sum);
}

int64_t sample_rank(const float *x, int64_t vocab, int64_t c) {
  int64_t n = 0;
  for (int64_t i = 0; i < vocab; i++) n += x[i] >= x[c];
  return n;
}

float sample_logprob(const float *x, int64_t vocab, int64_t c, int64_t *rank) {
  if (rank) *rank = sample_rank(x, vocab, c);
  double mx;
  const double ls = sample_log_sum(x, vocab, &mx);
  return sample_logprob_at(x[c], mx, ls);
}

int sample_top(const float *x, int64_t vocab, int n, int64_t *top) {
  entry *s = sorted(x, vocab);
  if (!s) return -1;
  for (int i = 0; i < n && i < vocab; i++) top[i] = s[i].c;
  free(s);
  return 0;
}

/* ---- the shards' candidates ---- */

void sample_shard_reduce(const float *t, const float *g, int64_t first, int64_t cols, int K,
                         sample_shard *out) {
  entry *s = sorted(t + first, cols);
  out->n = cols < K ? (int)cols : K;
  for (int i = 0; i < out->n; i++) out->t[i] = s[i].v, out->c[i] = first + s[i].c;
  free(s);
  out->best_c = -1;
  out->best = out->best_t = -INFINITY;
  for (int64_t c = first; c < first + cols; c++) {
    const float v = t[c] + g[c];
    if (out->best_c < 0 || draw_before(v, c, out->best, out->best_c))
      out->best = v, out->best_t = t[c], out->best_c = c;
  }
}

/* The first K of every shard's candidates in the key order: the row's first
 * min(K, vocab), since each shard gave its own first ones. Their count. */
static int merged(const sample_shard *shards, int nshards, int64_t vocab, int K, entry *cand) {
  int all = 0;
  for (int r = 0; r < nshards; r++)
    for (int i = 0; i < shards[r].n; i++) cand[all++] = (entry){shards[r].t[i], shards[r].c[i]};
  qsort(cand, (size_t)all, sizeof *cand, key_order);
  return vocab < K ? (int)vocab : K;
}

static int64_t undecided(const char **why, const char *rule) {
  if (why) *why = rule;
  return -1;
}

/* Top-p over all n candidates and columns past them whose weight is not
 * known: it lies in [0, (vocab - n) * most], as no column past the
 * candidates has a larger t than the last (expf taken as monotone, with a
 * margin of 2^-20 and 1 for a last-bit slip, past a weight of 0 too). The
 * cut only moves later as the total grows, so when the best draw up to the
 * latest cut comes before the earliest, it is the token whatever the
 * weight past the candidates. */
static int64_t top_p_bounded(const entry *cand, int n, int64_t vocab, float p, const float *e,
                             const float *g, const char **why) {
  int64_t sum = 0;
  for (int i = 0; i < n; i++) sum += weight_of(e, cand[i].c);
  const int64_t last = weight_of(e, cand[n - 1].c), most = last + (last >> 20) + 1;
  const int first = top_p_keeps(cand, n, e, ceil_product(p, sum));
  const int latest = top_p_keeps(cand, n, e, ceil_product(p, sum + (vocab - n) * most));
  if (latest < 0) return undecided(why, "top-p's nucleus may run past the candidates");
  const int best = draw_among(cand, latest, g);
  if (best >= first) return undecided(why, "top-p: the draw depends on the weight past the candidates");
  if (why) *why = "top-p within bounds";
  return cand[best].c;
}

/* A regular row (T > 0, its largest t finite) of `vocab` columns from its n
 * merged candidates (all the row when n == vocab). keep: the kept prefix within the candidates, or
 * beyond (what is kept runs past them, its length unknown). */
static int64_t regular_from(const entry *cand, int n, int64_t vocab, const sample_shard *shards,
                            int nshards, const sample_args *a, const float *e, const float *g,
                            int64_t outside, const char **why) {
  const int full = n == vocab;
  const float m = cand[0].v;
  int keep = n, beyond = !full;
  float threshold = -INFINITY;
  if (a->min_p > 0.f) { /* a value threshold: past the candidates if the last one is in */
    threshold = min_p_threshold(m, a->min_p);
    int n1 = 0;
    while (n1 < n && cand[n1].v >= threshold) n1++;
    keep = n1, beyond = !full && n1 == n;
  }
  if (a->top_k > 0 && (beyond || a->top_k < keep)) /* k <= K <= n when beyond */
    keep = (int)a->top_k, beyond = 0;
  if (a->top_p < 1.f) {
    if (beyond && outside < 0) return top_p_bounded(cand, keep, vocab, a->top_p, e, g, why);
    int64_t total = beyond ? outside : 0;
    for (int i = 0; i < keep; i++) total += weight_of(e, cand[i].c);
    keep = top_p_keeps(cand, keep, e, ceil_product(a->top_p, total));
    if (keep < 0) return undecided(why, "top-p's nucleus runs past the candidates");
    beyond = 0;
  }
  if (!beyond) {
    if (why) *why = "the candidates";
    return cand[draw_among(cand, keep, g)].c;
  }
  /* nothing bounds the kept set: the largest t + g over the row, the shards' best */
  int b = -1;
  for (int r = 0; r < nshards; r++)
    if (shards[r].best_c >= 0 &&
        (b < 0 || draw_before(shards[r].best, shards[r].best_c, shards[b].best, shards[b].best_c)))
      b = r;
  if (shards[b].best_t < threshold)
    return undecided(why, "min-p: the row's best draw is below its threshold");
  if (why) *why = "the shards' best draws";
  return shards[b].best_c;
}

int64_t sample_outside_weight(const float *t, float m, int64_t vocab, const sample_args *a, int K,
                              const float *e) {
  entry *s = sorted(t, vocab);
  if (!s) return -1;
  const float threshold = a->min_p > 0.f ? min_p_threshold(m, a->min_p) : -INFINITY;
  int64_t sum = 0;
  for (int64_t i = K; i < vocab && s[i].v >= threshold; i++) sum += weight_of(e, s[i].c);
  free(s);
  return sum;
}

int64_t sample_from_shards(const sample_shard *shards, int nshards, int64_t vocab,
                           const sample_args *a, int K, const float *e, const float *g,
                           int64_t outside, const char **why) {
  entry *cand = malloc((size_t)nshards * SAMPLE_CAND_MAX * sizeof *cand);
  if (!cand) return undecided(why, "out of memory");
  const int n = merged(shards, nshards, vocab, K, cand);
  int64_t token;
  if (a->top_k > K) { /* outside the domain: the candidates cannot hold its cut */
    free(cand);
    return undecided(why, "top_k above the capacity");
  }
  /* greedy, or a NaN, +Inf or all -Inf row: argmax t, the first candidate */
  if (a->temperature == 0.f || !isfinite(cand[0].v)) {
    if (why) *why = "argmax";
    token = cand[0].c;
  } else {
    token = regular_from(cand, n, vocab, shards, nshards, a, e, g, outside, why);
  }
  free(cand);
  return token;
}
