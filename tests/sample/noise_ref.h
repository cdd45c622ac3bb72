/* The sampler's noise on the host (docs/design/sampling.md; klgen.reference's
 * bits and uniform), and the source of the kernels that run templates/noise.cuh.tmpl
 * for the tests: test_noise (CPU) checks this side against known answers and that
 * the kernels compile, gpu_noise runs them against it. */
#ifndef KL_NOISE_REF_H
#define KL_NOISE_REF_H

#include <stdint.h>

#include "klgen.h"

/* Random123's kat_vectors for philox4x32_10: counter, key, the four words. */
typedef struct noise_kat {
  uint32_t ctr[4], key[2], out[4];
} noise_kat;
extern const noise_kat noise_kats[];
extern const int noise_n_kats;

/* Philox4x32-10 of (ctr, key) into out. */
void noise_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);
/* Column c's word for (seed, offset): word c & 3 of Philox((c >> 2 lo, c >> 34,
 * offset lo, offset hi), (seed lo, seed hi)). */
uint32_t noise_word_ref(uint64_t seed, uint64_t offset, uint64_t column);
/* u = (2 * (x >> 9) + 1) * 2^-24, exact in float. */
float noise_uniform_ref(uint32_t x);
/* vLLM's noise: column c's word, MurmurHash3_x86_32 (seed 0) of the words
 * (seed lo, seed hi, offset lo, c lo); u = fl((x + 1/2) 2^-32); log(1 - u)
 * as vLLM's float32 series (each step rounded) below 0.25, else logf. */
uint32_t vllm_word_ref(uint64_t seed, uint64_t offset, uint64_t column);
float vllm_uniform_ref(uint32_t x);
float vllm_log1p_neg_ref(float u);
/* How many floats lie between a and b (0: the same bits); both finite. */
uint32_t noise_ulps(float a, float b);

/* The kernels a test runs, appended to a spec's rendered source so that they
 * call the noise functions exactly as a kernel of that source would:
 *   noise_kat_kernel(const uint4 *ctr, const uint2 *key, uint4 *out, int n)
 *     philox4x32_10 of each pair;
 *   noise_word_kernel(const u64 *seed, const u64 *offset, const u64 *column, int n,
 *                     u32 *word, u32 *group)
 *     noise_word, and the same column's word of noise_group;
 *   noise_value_kernel(const u32 *x, int n, float *u, float *inner, float *g, float *bound)
 *     noise_uniform, -logf(u), gumbel and gumbel_bound of each word;
 *   noise_t_kernel(const float *x, const float *d, int n, float *t, float *hi)
 *     x / d, and t_above(x, 1 / d) where screens(d) holds (else NaN);
 *   vllm_word_kernel(seed, offset, column, n, u32 *word)   vllm_word;
 *   vllm_value_kernel(const u32 *x, int n, float *u, float *l, float *g, float *bound)
 *     vllm_uniform, vllm_log1p_neg, vllm_gumbel and vllm_gumbel_bound;
 *   vllm_sweep_kernel(u32 hi, unsigned long long *out)
 *     over the 2^16 words hi << 16 | j a block: out[0] counts those whose
 *     bound is below g or above VLLM_GUMBEL_BOUND, or whose g is not finite;
 *   spec_noise_kernel(seed, offset, column, n, u32 *word, float *g, float *bound)
 *     noise_word, gumbel and gumbel_bound: the spec's own noise.
 * Returns the whole source (free it), or NULL with err set; *noise gets the
 * spec's noise (kl_noise). */
#define NOISE_KERNELS 8
extern const char *const noise_kernel_names[NOISE_KERNELS];
char *noise_test_source(const char *spec_file, int *noise, kl_err *err);

#endif
