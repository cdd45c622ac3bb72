/* The sampler's noise on the host, and the test kernels' source (noise_ref.h). */
#include "noise_ref.h"
#include "spec_source.h"

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

const char *const noise_kernel_names[NOISE_KERNELS] = {"noise_kat_kernel", "noise_word_kernel",
                                                       "noise_value_kernel", "noise_t_kernel"};

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
    "  word[i] = noise_word(seed[i], offset[i], column[i]);\n"
    "  const uint4 w = noise_group(seed[i], offset[i], column[i] >> 2);\n"
    "  const u32 ws[4] = {w.x, w.y, w.z, w.w};\n"
    "  group[i] = ws[column[i] & 3];\n"
    "}\n"
    "extern \"C\" __global__ void noise_value_kernel(const u32 *x, int n, float *u, float *inner,\n"
    "                                                float *g, float *bound) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  u[i] = noise_uniform(x[i]);\n"
    "  inner[i] = -logf(noise_uniform(x[i]));\n"
    "  g[i] = gumbel(x[i]);\n"
    "  bound[i] = gumbel_bound(x[i]);\n"
    "}\n"
    "extern \"C\" __global__ void noise_t_kernel(const float *x, const float *d, int n, float *t,\n"
    "                                            float *hi) {\n"
    "  const int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "  if (i >= n) return;\n"
    "  t[i] = x[i] / d[i];\n"
    "  hi[i] = screens(d[i]) ? t_above(x[i], 1.f / d[i]) : __int_as_float(0x7fc00000);\n"
    "}\n";

char *noise_test_source(const char *spec_file, kl_err *err) {
  kl_spec_list list;
  if (kl_spec_load_file(spec_file, NULL, &list, err)) return NULL;
  char *all = spec_source_with(&list.v[0], kernels, err);
  kl_spec_list_free(&list);
  return all;
}
