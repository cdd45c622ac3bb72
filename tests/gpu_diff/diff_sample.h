/* The sampler's reference in C: klgen.reference.sample
 * (python/klgen/reference.py, docs/DESIGN.md "Sampling") written again from
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
 * (NaN when x's largest is not finite); *rank, if not NULL, the number of
 * columns whose x >= x[c]. */
float sample_logprob(const float *x, int64_t vocab, int64_t c, int64_t *rank);

/* The row's log_softmax pieces, once: *mx its largest x, the return value
 * the log of sum(exp(x - mx)) in double (NaN where mx is not finite or x
 * holds a NaN); column c's logprob is then sample_logprob_at. */
double sample_log_sum(const float *x, int64_t vocab, double *mx);
float sample_logprob_at(float xc, double mx, double log_sum);

/* The n columns of the largest x, largest first, NaN above all, ties to the
 * lowest column, into top[n]. 0, or -1 when out of memory. */
int sample_top(const float *x, int64_t vocab, int n, int64_t *top);

#endif
