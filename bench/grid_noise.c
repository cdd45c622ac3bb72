/* The noise reference of klbench --grid (grid.h): a kernel that does only
 * what kl_sample's semantics require of a row with a temperature and no
 * filter: every column read, t = x / T, the column's Gumbel noise, the first
 * largest t + g. The noise is the product's: the text klgen rendered from
 * templates/noise.cuh.tmpl, cut from a spec's source, so the reference draws
 * what kl_sample draws (its token must equal kl_sample's plain token). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grid.h"
#include "klbench.h"
#include "rt.h"

#define NOISE_TEMPLATE "noise.cuh.tmpl\""
#define NOISE_THREADS 256

/* What the noise section uses of memory.cuh.tmpl, then the section. */
static const char head[] = "typedef unsigned int u32;\ntypedef unsigned long long u64;\n";

/* Each row is split over gridDim.x parts of part_cols columns; a part's
 * best key goes to the row's slot by atomicMax, and the part that arrives
 * last writes the token and clears the slot and the count for the next
 * launch. Keys order t + g as kl_sample's do: -0 equal to +0, of equal
 * values the lowest column. */
static const char kernels[] =
    "#line 1 \"klbench_grid_noise\"\n"
    "__device__ __forceinline__ u64 draw_key(float v, u32 c) {\n"
    "  u32 b = __float_as_uint(v);\n"
    "  if (b == 0x80000000u) b = 0u;\n"
    "  const u32 hi = (b & 0x80000000u) ? ~b : (b | 0x80000000u);\n"
    "  return (u64)hi << 32 | (0xffffffffu - c);\n"
    "}\n"
    "template <int ELEM>\n"
    "__device__ __forceinline__ u64 part_best(const unsigned char *row, u32 first, u32 end,\n"
    "                                         float d, u64 seed, u64 offset) {\n"
    "  constexpr u32 VEC = 16 / ELEM;\n"
    "  u64 best = 0;\n"
    "  for (u32 c = first + threadIdx.x * VEC; c < end; c += blockDim.x * VEC) {\n"
    "    union { uint4 v; unsigned short h[8]; float f[4]; } u;\n"
    "    u.v = *reinterpret_cast<const uint4 *>(row + (size_t)c * ELEM);\n"
    "#pragma unroll\n"
    "    for (u32 q = 0; q < VEC / 4; ++q) {\n"
    "      const uint4 w = noise_group(seed, offset, (u64)(c + 4 * q) >> 2);\n"
    "      const u32 words[4] = {w.x, w.y, w.z, w.w};\n"
    "#pragma unroll\n"
    "      for (u32 j = 0; j < 4; ++j) {\n"
    "        const u32 e = 4 * q + j;\n"
    "        float x;\n"
    "        if constexpr (ELEM == 2) x = __uint_as_float((u32)u.h[e] << 16);\n"
    "        else x = u.f[e];\n"
    "        const u64 k = draw_key(x / d + gumbel(words[j]), c + e);\n"
    "        best = k > best ? k : best;\n"
    "      }\n"
    "    }\n"
    "  }\n"
    "  return best;\n"
    "}\n"
    "template <int ELEM>\n"
    "__device__ __forceinline__ void noise_row(const unsigned char *x, u32 cols, u32 part_cols,\n"
    "                                          const float *temperature, const u64 *seed,\n"
    "                                          const u64 *offset, u64 *slot, u32 *count,\n"
    "                                          long long *token) {\n"
    "  const u32 row = blockIdx.y, first = blockIdx.x * part_cols;\n"
    "  const u32 end = cols - first < part_cols ? cols : first + part_cols;\n"
    "  u64 best = part_best<ELEM>(x + (size_t)row * cols * ELEM, first, end, temperature[row],\n"
    "                             seed[row], offset[row]);\n"
    "  for (int o = 16; o > 0; o >>= 1) {\n"
    "    const u64 v = __shfl_xor_sync(~0u, best, o);\n"
    "    best = v > best ? v : best;\n"
    "  }\n"
    "  __shared__ u64 warp_best[32];\n"
    "  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x != 0) return;\n"
    "  for (u32 w = 1; w < blockDim.x / 32; ++w)\n"
    "    best = warp_best[w] > best ? warp_best[w] : best;\n"
    "  atomicMax(slot + row, best);\n"
    "  __threadfence();\n"
    "  if (atomicAdd(count + row, 1u) != gridDim.x - 1) return;\n"
    "  __threadfence();\n"
    "  const u64 k = atomicExch(slot + row, 0ull);\n"
    "  count[row] = 0;\n"
    "  token[row] = (long long)(0xffffffffu - (u32)k);\n"
    "}\n"
    "#define NOISE_ENTRY(name, elem)                                                        \\\n"
    "  extern \"C\" __global__ void __launch_bounds__(256)                                  \\\n"
    "      name(const unsigned char *x, u32 cols, u32 part_cols, const float *temperature,   \\\n"
    "           const u64 *seed, const u64 *offset, u64 *slot, u32 *count, long long *token) { \\\n"
    "    noise_row<elem>(x, cols, part_cols, temperature, seed, offset, slot, count, token);  \\\n"
    "  }\n"
    "NOISE_ENTRY(kl_grid_noise_bf16, 2)\n"
    "NOISE_ENTRY(kl_grid_noise_fp32, 4)\n";

/* The line "#line N "...noise.cuh.tmpl"" of a rendered source and all that
 * follows it up to the next #line of another template. */
static int noise_section(const char *src, const char **start, size_t *len) {
  const char *p = src;
  *start = NULL;
  while (p && *p) {
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    if (!strncmp(p, "#line ", 6)) {
      int noise = n >= strlen(NOISE_TEMPLATE) &&
                  !strncmp(p + n - strlen(NOISE_TEMPLATE), NOISE_TEMPLATE, strlen(NOISE_TEMPLATE));
      if (noise && !*start) *start = p;
      if (!noise && *start) break;
    }
    p = eol ? eol + 1 : NULL;
  }
  if (!*start) return -1;
  *len = p ? (size_t)(p - *start) : strlen(*start);
  return 0;
}

char *grid_noise_source(const char *rendered, kl_noise noise_id) {
  const char *sec;
  size_t n;
  if (noise_section(rendered, &sec, &n))
    die("noise reference", "the rendered source has no noise.cuh.tmpl section (#line ... "
                           "\"noise.cuh.tmpl\")");
  char noise[48];
  snprintf(noise, sizeof noise, "static constexpr int NOISE = %d;\n", (int)noise_id);
  size_t total = strlen(head) + strlen(noise) + n + strlen(kernels) + 1;
  char *src = malloc(total);
  if (!src) die("noise reference", "out of memory");
  snprintf(src, total, "%s%s%.*s%s", head, noise, (int)n, sec, kernels);
  return src;
}

void grid_noise_load(grid_noise *g, const kl_binary *bin, int max_rows, int sms) {
  const kl_cu *cu = kl_cu_get(NULL);
  if (cu->cuModuleLoadData(&g->mod, bin->data) ||
      cu->cuModuleGetFunction(&g->fn[0], g->mod, "kl_grid_noise_bf16") ||
      cu->cuModuleGetFunction(&g->fn[1], g->mod, "kl_grid_noise_fp32"))
    die("noise reference", "cannot load its kernels");
  CUDA(cudaMalloc((void **)&g->slot, 8 * (size_t)max_rows));
  CUDA(cudaMalloc((void **)&g->count, 4 * (size_t)max_rows));
  CUDA(cudaMemset(g->slot, 0, 8 * (size_t)max_rows));
  CUDA(cudaMemset(g->count, 0, 4 * (size_t)max_rows));
  g->sms = sms;
}

void grid_noise_release(grid_noise *g) {
  kl_cu_get(NULL)->cuModuleUnload(g->mod);
  cudaFree(g->slot);
  cudaFree(g->count);
}

/* Parts a row: enough CTAs for four a multiprocessor, each at least one
 * pass of its threads over the row. */
int grid_noise_launch(const grid_noise *g, int elem, const void *x, int rows, int cols,
                      const float *temperature, const uint64_t *seed, const uint64_t *offset,
                      int64_t *token, CUstream s) {
  const unsigned vec = 16u / (unsigned)elem, pass = NOISE_THREADS * vec;
  unsigned parts = (unsigned)((4 * g->sms + rows - 1) / rows);
  const unsigned most = ((unsigned)cols + pass - 1) / pass;
  if (parts > most) parts = most;
  if (parts < 1) parts = 1;
  unsigned part_cols = ((unsigned)cols + parts - 1) / parts;
  part_cols = (part_cols + vec - 1) / vec * vec;
  parts = ((unsigned)cols + part_cols - 1) / part_cols;
  unsigned ucols = (unsigned)cols;
  void *args[] = {&x, &ucols, &part_cols, &temperature, &seed, &offset,
                  (void *)&g->slot, (void *)&g->count, &token};
  return (int)kl_cu_get(NULL)->cuLaunchKernel(g->fn[elem == 2 ? 0 : 1], parts, (unsigned)rows, 1,
                                              NOISE_THREADS, 1, 1, 0, s, args, NULL);
}
