/* gpu_sample's helper kernels (sample_kernels.h). */
#include "sample_kernels.h"

#include <math.h>
#include <string.h>

const char sample_test_kernels[] =
    "\nusing namespace kl_%s;\n"
    "#line 1 \"gpu_sample_kernels\"\n"
    "extern \"C\" __global__ void row_aux(const float *t, float m, u64 seed, u64 offset,\n"
    "                                     long long n, float *e, float *g) {\n"
    "  for (long long c = blockIdx.x * 256ll + threadIdx.x; c < n; c += gridDim.x * 256ll) {\n"
    "    e[c] = expf(t[c] - m);\n"
    "    g[c] = gumbel(noise_word(seed, offset, (u64)c));\n"
    "  }\n"
    "}\n"
    "extern \"C\" __global__ void row_decide(const Key *cand, Key best, float best_t, RowArgs r,\n"
    "                                        long long *token) {\n"
    "  __shared__ Key draws[CAND_N];\n"
    "  for (int i = threadIdx.x; i < CAND_N; i += blockDim.x) draws[i] = draw_key(cand[i], r);\n"
    "  __syncthreads();\n"
    "  token[threadIdx.x] = decide_row(cand, draws, best, best_t, r);\n"
    "}\n";

uint64_t sample_key(float v, int64_t column) {
  uint32_t b;
  memcpy(&b, &v, sizeof b);
  if (isnan(v)) b = 0x7fc00000u;
  const uint32_t neg0 = b == 0x80000000u;
  if (neg0) b = 0u;
  const uint32_t hi = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (uint64_t)hi << 32 | ((0x7ffffffeu - (uint32_t)column) << 1 | neg0);
}
