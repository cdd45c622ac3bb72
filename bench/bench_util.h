/* What klbench and klfloor share: fatal errors and the CUDA runtime check.
 * Both are tools, not libraries: on an error they print and exit. */
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

#define CUDA(call)                                             \
  do {                                                         \
    cudaError_t e_ = (call);                                   \
    if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_)); \
  } while (0)

#endif
