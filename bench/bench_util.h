/* What klbench and klfloor share: fatal errors, the CUDA runtime check and
 * the median. Both are tools, not libraries: on an error they print and exit. */
#ifndef KL_BENCH_UTIL_H
#define KL_BENCH_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime.h>

/* The program's name for its messages ("klbench: what: why"). */
extern const char *const kl_bench_prog;

static inline void die(const char *what, const char *why) {
  fprintf(stderr, "%s: %s: %s\n", kl_bench_prog, what, why);
  exit(1);
}

/* The median of v[0..n) (sorts v). */
static inline double median(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1], v[j - 1] = t;
    }
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#define CUDA(call)                                             \
  do {                                                         \
    cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_)); \
  } while (0)

#endif
