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

/* How many of the sorted columns top-p keeps of the first n: while the
 * integer weights before a column sum to less than ceil(p * total). */
static int64_t top_p_cut(const entry *s, int64_t n, const float *e, float p) {
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) total += (int64_t)(e[s[i].c] * 0x1p38f);
  const int64_t bound = ceil_product(p, total);
  int64_t before = 0, i = 0;
  for (; i < n && before < bound; i++) before += (int64_t)(e[s[i].c] * 0x1p38f);
  return i;
}

/* How many of the sorted columns s the filters keep (a prefix). */
static int64_t kept_prefix(const entry *s, float m, int64_t vocab, const sample_args *a,
                           const float *e) {
  int64_t n = vocab;
  if (a->min_p > 0.f) {
    /* log(min_p) rounded to float, then the float sum: a value threshold */
    const float threshold = m + (float)log((double)a->min_p);
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
  int64_t best = s[0].c;
  float score = t[best] + g[best];
  for (int64_t i = 1; i < n; i++) {
    const int64_t c = s[i].c;
    const float v = t[c] + g[c];
    if (v > score || (v == score && c < best)) best = c, score = v;
  }
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
  for (int64_t i = 0; i < vocab; i++) sum += exp((double)x[i] - m);
  return log(sum);
}

float sample_logprob_at(float xc, double mx, double log_sum) {
  return (float)(((double)xc - mx) - log_sum);
}

float sample_logprob(const float *x, int64_t vocab, int64_t c, int64_t *rank) {
  if (rank) {
    *rank = 0;
    for (int64_t i = 0; i < vocab; i++) *rank += x[i] >= x[c];
  }
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
