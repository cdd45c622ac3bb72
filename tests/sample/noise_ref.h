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
 *     x / d, and t_above(x, 1 / d) where screens(d) holds (else NaN).
 * Returns the whole source (free it), or NULL with err set. */
#define NOISE_KERNELS 4
extern const char *const noise_kernel_names[NOISE_KERNELS];
char *noise_test_source(const char *spec_file, kl_err *err);

#endif
