/* The sampler's noise, the host side gpu_noise holds the kernels to, on the CPU:
 * Random123's known answers for Philox4x32-10, columns' words worked out by
 * tests/python/test_reference.py's scalar Philox (an implementation of its
 * own), the uniform's edges, and the test kernels compiled through NVRTC with
 * a spec's source as gpu_noise compiles them.  test_noise SPEC */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "noise_ref.h"

static void philox_known_answers(void) {
  for (int i = 0; i < noise_n_kats; i++) {
    uint32_t w[4];
    noise_philox(noise_kats[i].ctr, noise_kats[i].key, w);
    CHECK(!memcmp(w, noise_kats[i].out, sizeof w), "kat %d: %08x %08x %08x %08x", i, w[0], w[1],
          w[2], w[3]);
  }
}

/* A column's word for (seed, offset), worked out elsewhere. */
typedef struct word_case {
  uint64_t seed, offset, column;
  uint32_t word;
} word_case;

/* Each case's word from fn (the host's Philox or vLLM's hash). */
static void check_words(const char *what, const word_case *w, size_t n,
                        uint32_t (*fn)(uint64_t, uint64_t, uint64_t)) {
  for (size_t i = 0; i < n; i++) {
    const uint32_t got = fn(w[i].seed, w[i].offset, w[i].column);
    CHECK(got == w[i].word, "%s seed %llx offset %llx column %llx: %08x, expected %08x", what,
          (unsigned long long)w[i].seed, (unsigned long long)w[i].offset,
          (unsigned long long)w[i].column, got, w[i].word);
  }
}

/* Edges of the key, the counter and the column's split over two words. */
static const word_case words[] = {
    {0x0000000000000000ull, 0x0000000000000000ull, 0x0ull, 0x6627e8d5u},
    {0x0000000000000000ull, 0x0000000000000000ull, 0x1ull, 0xe169c58du},
    {0x0000000000000000ull, 0x0000000000000000ull, 0x2ull, 0xbc57ac4cu},
    {0x0000000000000000ull, 0x0000000000000000ull, 0x3ull, 0x9b00dbd8u},
    {0x0000000000000000ull, 0x0000000000000000ull, 0x7ull, 0x097eff67u},
    {0xffffffffffffffffull, 0xffffffffffffffffull, 0x0ull, 0x3d3be307u},
    {0xffffffffffffffffull, 0x0000000000000000ull, 0xffffffffull, 0x4c527057u},
    {0x0000000000000001ull, 0x00000000ffffffffull, 0x100000000ull, 0xd68c0f12u},
    {0x0123456789abcdefull, 0x0000000100000000ull, 0x400000003ull, 0xc4dbe84bu},
    {0x000000000000002aull, 0xfffffffffffffffeull, 0x27fffull, 0x1d804ff2u},
    {0x0000000100000000ull, 0x0000000000000007ull, 0x400000000ull, 0x5ced24f4u},
    {0xfedcba9876543210ull, 0x8000000000000000ull, 0x251ffull, 0x224c1ee7u},
};

static void column_words(void) {
  check_words("philox", words, sizeof words / sizeof *words, noise_word_ref);
}

/* vLLM's words: tests/python/test_reference_vllm.py holds klgen.reference's
 * vllm_bits to vLLM's own hash; these are the reference's answers. */
static const word_case vllm_words[] = {
    {0x0000000000000000ull, 0x0000000000000000ull, 0x0ull, 0x8134cdf8u},
    {0x0000000000000000ull, 0x0000000000000000ull, 0x1ull, 0x00990201u},
    {0x0000000000000001ull, 0x0000000000000000ull, 0x0ull, 0x92228d1bu},
    {0x0000000000000000ull, 0x0000000000000001ull, 0x0ull, 0x0d568719u},
    {0xffffffffffffffffull, 0xffffffffffffffffull, 0xffffffffull, 0xe519346eu},
    {0x0123456789abcdefull, 0x0000000100000007ull, 0x27fffull, 0x9fd290abu},
    {0x000000000000002aull, 0x0000000000003039ull, 0x3ffffull, 0xaf122346u},
    {0xfedcba9876543210ull, 0x8000000000000000ull, 0x251ffull, 0xf2c568b6u},
};

/* The words, u's ends and the series: u(0) = 2^-33, u(max) = 1 (it rounds),
 * u's halves each exact; the series is u (1 + u/2 + ...) and log(1 - u) at
 * 0.25 and beyond; g's range [-2.8116, 22.874]. */
static void vllm_noise_ref(void) {
  check_words("vllm", vllm_words, sizeof vllm_words / sizeof *vllm_words, vllm_word_ref);
  CHECK(vllm_uniform_ref(0) == 0x1p-33f, "vllm u(0)");
  CHECK(vllm_uniform_ref(0xffffffffu) == 1.0f, "vllm u(max)");
  CHECK(vllm_uniform_ref(0x8134cdf8u) == 0x1.02699cp-1f, "vllm u(0x8134cdf8)");
  CHECK(vllm_uniform_ref(0x00990201u) == 0x1.320404p-9f, "vllm u(0x00990201)");
  CHECK(vllm_log1p_neg_ref(0x1p-33f) == -0x1p-33f, "series at u(0)");
  CHECK(vllm_log1p_neg_ref(0.25f) == logf(0.75f), "direct at 0.25");
  CHECK(vllm_log1p_neg_ref(1.0f) == logf(0x1p-24f), "direct at 1");
  const double l = fabs((double)vllm_log1p_neg_ref(0.1f) - log1p(-0.1));
  CHECK(l < 1e-7, "series at 0.1 off by %g", l);
  const double lo = -log(-(double)logf(0x1p-24f)), hi = -log(0x1p-33);
  CHECK(lo > -2.8116 && lo < -2.8115 && hi > 22.873 && hi < 22.874, "vllm g in [%g, %g]", lo, hi);
}

/* u's grid: the low 9 bits never count, the extremes are 2^-24 and 1 - 2^-24,
 * and g is finite at both: -2.81154 and 16.63553 (docs/design/sampling.md's [-2.8116, 16.6356]). */
static void uniform_edges(void) {
  CHECK(noise_uniform_ref(0) == 0x1p-24f, "u(0)");
  CHECK(noise_uniform_ref(0x1ffu) == 0x1p-24f, "u(0x1ff)");
  CHECK(noise_uniform_ref(0x200u) == 0x3p-24f, "u(0x200)");
  CHECK(noise_uniform_ref(0xffffffffu) == 1.0f - 0x1p-24f, "u(max)");
  CHECK(noise_uniform_ref(0x80000000u) == 0.5f + 0x1p-24f, "u(2^31)");
  CHECK(noise_uniform_ref(0x7fffffffu) == 0.5f - 0x1p-24f, "u(2^31 - 1)");
  const double lo = -log(-log(0x1p-24)), hi = -log(-log(1.0 - 0x1p-24));
  CHECK(lo > -2.8116 && lo < -2.8115 && hi > 16.6355 && hi < 16.6356, "g in [%g, %g]", lo, hi);
  CHECK(noise_ulps(1.0f, 1.0f) == 0 && noise_ulps(1.0f, nextafterf(1.0f, 2.0f)) == 1 &&
            noise_ulps(-0x1p-149f, 0x1p-149f) == 2,
        "ulps");
}

static int has(const kl_binary *b, const char *s) {
  const size_t n = strlen(s);
  for (size_t i = 0; i + n <= b->size; i++)
    if (!memcmp((const char *)b->data + i, s, n)) return 1;
  return 0;
}

/* What gpu_noise loads compiles, warning-free, with the kernels in the cubin. */
static void kernels_compile(const char *spec) {
  kl_err e;
  int noise;
  char *src = noise_test_source(spec, &noise, &e);
  CHECK(src != NULL, "%s", e.msg);
  if (!src) return;
  kl_binary b;
  int rc = kl_nvrtc_compile(src, "noise_test", "sm_90", &b, &e);
  free(src);
  CHECK(rc == 0, "%s", e.msg);
  if (rc) return;
  for (int k = 0; k < NOISE_KERNELS; k++)
    CHECK(has(&b, noise_kernel_names[k]), "no %s in the cubin", noise_kernel_names[k]);
  CHECK(b.log == NULL || b.log[0] == 0, "NVRTC warnings:\n%s", b.log);
  kl_binary_free(&b);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_noise SPEC\n");
    return 2;
  }
  philox_known_answers();
  column_words();
  uniform_edges();
  vllm_noise_ref();
  kernels_compile(argv[1]);
  return check_done();
}
