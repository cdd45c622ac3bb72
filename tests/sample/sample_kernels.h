/* gpu_sample's helper kernels, appended to a spec's rendered source
 * (spec_source_with; "%s" is the spec's name), so that they run the
 * templates' functions as kl_sample's kernels do:
 *   row_aux(const float *t, float m, u64 seed, u64 offset, long long n,
 *           float *e, float *g)
 *     e[c] = expf(t[c] - m) (top-p's weights) and g[c] the noise of column c;
 *   row_decide(const Key *cand, Key best, float best_t, RowArgs r,
 *              long long *token)
 *     candidates.cuh.tmpl's decide_row by one warp (the candidates' draws
 *     made first, draw_key), each lane's answer in token[lane].
 * test_nvrtc compiles them for every spec with a topk; gpu_sample runs them. */
#ifndef KL_SAMPLE_KERNELS_H
#define KL_SAMPLE_KERNELS_H

#include <stdint.h>

extern const char sample_test_kernels[];

/* templates/candidates.cuh.tmpl's RowArgs, as a kernel parameter (the
 * same layout: the kernel reads it as RowArgs). */
typedef struct sample_row_args {
  float temperature, top_p, min_p;
  int top_k; /* 0: off (the caller maps >= vocab to 0) */
  uint64_t seed, offset;
} sample_row_args;
_Static_assert(sizeof(sample_row_args) == 32, "RowArgs: three floats, an int, two u64");

/* keys.cuh.tmpl's make_key on the host: value descending, NaN above +Inf,
 * -0 equal to +0, ties to the lowest column. */
uint64_t sample_key(float v, int64_t column);

#endif
