/* The sampler's noise on the host, and the test kernels' source (noise_ref.h). */
#include "noise_ref.h"
#include "spec_source.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Random123 1.14, tests/kat_vectors: the three "philox4x32 10" lines. */
const noise_kat noise_kats[] = {
    {{0x00000000u, 0x00000000u, 0x00000000u, 0x00000000u}, {0x00000000u, 0x00000000u},
     {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};
const int noise_n_kats = (int)(sizeof noise_kats / sizeof *noise_kats);

/* Written from Salmon et al. with 64-bit products, not __umulhi's split:
 * the device side must agree with it, not share its shape. */
void noise_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int r = 0; r < 10; r++) {
    if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
    const uint64_t p0 = (uint64_t)0xD2511F53u * c0, p1 = (uint64_t)0xCD9E8D57u * c2;
    const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
    c1 = (uint32_t)p1;
    c3 = (uint32_t)p0;
    c0 = n0;
    c2 = n2;
  }
  out[0] = c0, out[1] = c1, out[2] = c2, out[3] = c3;
}

uint32_t noise_word_ref(uint64_t seed, uint64_t offset, uint64_t column) {
  const uint32_t ctr[4] = {(uint32_t)(column >> 2), (uint32_t)(column >> 34), (uint32_t)offset,
                           (uint32_t)(offset >> 32)};
  const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
  uint32_t w[4];
  noise_philox(ctr, key, w);
  return w[column & 3];
}

float noise_uniform_ref(uint32_t x) {
  return (float)(2u * (x >> 9) + 1u) * 0x1p-24f;
}

static uint32_t rotl32(uint32_t v, int s) { return v << s | v >> (32 - s); }

static uint32_t murmur3_block(uint32_t h, uint32_t k) {
  k = rotl32(k * 0xCC9E2D51u, 15) * 0x1B873593u;
  return rotl32(h ^ k, 13) * 5u + 0xE6546B64u;
}

uint32_t vllm_word_ref(uint64_t seed, uint64_t offset, uint64_t column) {
  const uint32_t w[4] = {(uint32_t)seed, (uint32_t)(seed >> 32), (uint32_t)offset,
                         (uint32_t)column};
  uint32_t h = 0;
  for (int i = 0; i < 4; i++) h = murmur3_block(h, w[i]);
  h ^= 16u;
  h = (h ^ (h >> 16)) * 0x85EBCA6Bu;
  h = (h ^ (h >> 13)) * 0xC2B2AE35u;
  return h ^ (h >> 16);
}

float vllm_uniform_ref(uint32_t x) {
  /* exact: x + 1/2 needs 33 bits, a double holds it, and one rounding to float */
  return (float)(((double)x + 0.5) * 0x1p-32);
}

/* volatile: each product and sum rounded to float, never fused */
float vllm_log1p_neg_ref(float u) {
  if (!(u < 0.25f)) return logf(fmaxf(1.0f - u, 0x1p-24f));
  volatile float p = 0.125f;
  for (int d = 7; d >= 1; d--) {
    volatile float prod = u * p;
    p = (float)(1.0 / d) + prod;
  }
  volatile float r = -u * p;
  return r;
}

/* A float's place in the order of all floats, as an integer. */
static int64_t float_rank(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  return (b & 0x80000000u) ? -(int64_t)(b & 0x7fffffffu) : (int64_t)b;
}

uint32_t noise_ulps(float a, float b) {
  const int64_t d = float_rank(a) - float_rank(b);
  return (uint32_t)(d < 0 ? -d : d);
}

const char *const noise_kernel_names[NOISE_KERNELS] = {
    "noise_kat_kernel",  "noise_word_kernel", "noise_value_kernel", "noise_t_kernel",
    "vllm_word_kernel", "vllm_value_kernel", "vllm_sweep_kernel",  "spec_noise_kernel"};

/* Appended after the spec's source, whose names are in namespace kl_<spec>
 * (u32 and u64 are memory.cuh.tmpl's): "%s" is the spec's name. */
static const char kernels[] =
    "\nusing namespace kl_%s;\n"
    "#line 1 \"noise_test_kernels\"\n"
    "extern \"C\" __global__ void noise_kat_kernel(const uint4 *ctr, const uint2 *key, uint4 *out,\n"
    "                                              int n) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) out[i] = philox4x32_10(ctr[i], key[i]);\n"
    "}\n"
    "extern \"C\" __global__ void noise_word_kernel(const u64 *seed, const u64 *offset,\n"
    "                                               const u64 *column, int n, u32 *word, u32 *group) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  word[i] = philox_word(seed[i], offset[i], column[i]);\n"
    "  const uint4 w = noise_group(seed[i], offset[i], column[i] >> 2);\n"
    "  const u32 ws[4] = {w.x, w.y, w.z, w.w};\n"
    "  group[i] = ws[column[i] & 3];\n"
    "}\n"
    "extern \"C\" __global__ void noise_value_kernel(const u32 *x, int n, float *u, float *inner,\n"
    "                                                float *g, float *bound) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  u[i] = philox_uniform(x[i]);\n"
    "  inner[i] = -logf(philox_uniform(x[i]));\n"
    "  g[i] = philox_gumbel(x[i]);\n"
    "  bound[i] = philox_gumbel_bound(x[i]);\n"
    "}\n"
    "extern \"C\" __global__ void noise_t_kernel(const float *x, const float *d, int n, float *t,\n"
    "                                            float *hi) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  t[i] = x[i] / d[i];\n"
    "  hi[i] = screens(d[i]) ? t_above(x[i], 1.f / d[i]) : __int_as_float(0x7fc00000);\n"
    "}\n"
    "extern \"C\" __global__ void vllm_word_kernel(const u64 *seed, const u64 *offset,\n"
    "                                              const u64 *column, int n, u32 *word) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i < n) word[i] = vllm_word(seed[i], offset[i], column[i]);\n"
    "}\n"
    "extern \"C\" __global__ void vllm_value_kernel(const u32 *x, int n, float *u, float *l,\n"
    "                                               float *g, float *bound) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  u[i] = vllm_uniform(x[i]);\n"
    "  l[i] = vllm_log1p_neg(vllm_uniform(x[i]));\n"
    "  g[i] = vllm_gumbel(x[i]);\n"
    "  bound[i] = vllm_gumbel_bound(x[i]);\n"
    "}\n"
    "extern \"C\" __global__ void vllm_sweep_kernel(u32 hi, unsigned long long *out) {\n"
    "  unsigned long long bad = 0;\n"
    "  for (u32 j = threadIdx.x; j < 65536u; j += blockDim.x) {\n"
    "    const u32 x = (hi + blockIdx.x) << 16 | j;\n"
    "    const float g = vllm_gumbel(x), b = vllm_gumbel_bound(x);\n"
    "    bad += !(g >= -2.8117f && g <= b && b <= VLLM_GUMBEL_BOUND);\n"
    "  }\n"
    "  if (bad) atomicAdd(out, bad);\n"
    "}\n"
    "extern \"C\" __global__ void spec_noise_kernel(const u64 *seed, const u64 *offset,\n"
    "                                               const u64 *column, int n, u32 *word,\n"
    "                                               float *g, float *bound) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  word[i] = noise_word(seed[i], offset[i], column[i]);\n"
    "  g[i] = gumbel(word[i]);\n"
    "  bound[i] = gumbel_bound(word[i]);\n"
    "}\n";

char *noise_test_source(const char *spec_file, int *noise, kl_err *err) {
  kl_spec_list list;
  if (kl_spec_load_file(spec_file, NULL, &list, err)) return NULL;
  *noise = (int)list.v[0].noise;
  char *all = spec_source_with(&list.v[0], kernels, err);
  kl_spec_list_free(&list);
  return all;
}
