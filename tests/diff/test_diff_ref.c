/* CPU test of the differential suite's own parts, which need no GPU: the
 * reference's conversions against the compiler's _Float16 and an independent
 * bf16 rounding, its selections against a sort, the drawn specs (every one
 * meant valid loads; invalid ones are refused), and NVRTC on a sample of drawn
 * specs, so a template that breaks on some spec fails here, not on a GPU.
 *
 *   test_diff_ref [COMPILE_SAMPLE]   (specs compiled for sm_90; default 12) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "diff.h"
#include "diff_sample.h"

static int failures;
#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond) && failures++ < 20) {                      \
      printf("FAIL %s:%d: ", __FILE__, __LINE__);          \
      printf(__VA_ARGS__);                                 \
      printf("\n");                                        \
    }                                                      \
  } while (0)


static void fp16_all(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    _Float16 x;
    uint16_t hb = (uint16_t)h;
    memcpy(&x, &hb, 2);
    float want = (float)x, got = fp16_to_f(hb);
    CHECK(want != want ? got != got : f32_bits(got) == f32_bits(want), "fp16 0x%04x: %a, want %a", h,
          (double)got, (double)want);
  }
}

static uint16_t fp16_ref(float f) {
  _Float16 x = (_Float16)f;
  uint16_t h;
  memcpy(&h, &x, 2);
  return h;
}

/* bf16 by choosing between the two neighbours in double, ties to even. */
static uint16_t bf16_ref(float f) {
  if (f != f) return 0x7fc0;
  if (isinf(f)) return (uint16_t)(f32_bits(f) >> 16);
  uint32_t b = f32_bits(f), lo = b & 0xffff0000u, hi = lo + 0x10000u;
  double dlo = fabs((double)f32_of(lo) - (double)f), dhi;
  if ((hi & 0x7f800000u) == 0x7f800000u && (lo & 0x7fffffffu) == 0x7f7f0000u) {
    /* past the largest finite: the next value is Inf, halfway at 2^128 - 2^119 */
    dhi = fabs(ldexp(1.0, 128) - fabs((double)f));
    hi = (lo & 0x80000000u) | 0x7f800000u;
  } else {
    dhi = fabs((double)f32_of(hi) - (double)f);
  }
  if (dlo < dhi || (dlo == dhi && ((lo >> 16) & 1u) == 0)) return (uint16_t)(lo >> 16);
  return (uint16_t)(hi >> 16);
}

static void conversions(void) {
  rng r = rng_for(7, 7);
  for (long i = 0; i < 20000000; i++) {
    uint32_t b = (uint32_t)rng_next(&r);
    if (i % 4 == 1) b = (b & 0xffff0000u) | 0x8000u;           /* bf16 ties */
    if (i % 4 == 2) b = (b & 0xffffe000u) | 0x1000u;           /* fp16 ties */
    if (i % 4 == 3) b = (b & 0x80ffffffu) | (0x33u + (uint32_t)rng_below(&r, 0x15)) << 23; /* fp16 subnormals */
    float f = f32_of(b);
    if (f != f) continue;
    uint16_t h = f_to_fp16(f), w = fp16_ref(f);
    CHECK(h == w, "f_to_fp16(%a) = 0x%04x, want 0x%04x", (double)f, h, w);
    uint16_t g = f_to_bf16(f), v = bf16_ref(f);
    CHECK(g == v, "f_to_bf16(%a) = 0x%04x, want 0x%04x", (double)f, g, v);
  }
  CHECK(f_to_fp16(65519.996f) == 0x7bff && f_to_fp16(65520.0f) == 0x7c00, "fp16 overflow");
  CHECK(f_to_bf16(f32_of(0x7f7fffffu)) == 0x7f80, "bf16 overflow to Inf");
  CHECK(f_to_fp16(f32_of(0x7fc00001u)) & 0x7c00 && f_to_bf16(f32_of(0xffc00001u)) & 0x7f80, "NaN");
}

/* Selections against a full sort by a comparator written from the rules:
 * NaN above everything, -0 == +0 (float compares), ties to the lower column. */
typedef struct item {
  float v;
  int col;
} item;

static int by_rules(const void *a, const void *b) {
  const item *x = a, *y = b;
  int xn = x->v != x->v, yn = y->v != y->v;
  if (xn != yn) return xn ? -1 : 1;
  if (!xn && x->v != y->v) return x->v > y->v ? -1 : 1;
  return x->col - y->col;
}

static void selections(void) {
  static const float pool[] = {1.0f, -1.0f, 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 2.5f, 1e-40f};
  rng r = rng_for(9, 9);
  for (int trial = 0; trial < 3000; trial++) {
    int n = (int)rng_range(&r, 1, 300), k = (int)rng_range(&r, 1, n < 64 ? n : 64);
    float v[300];
    item sorted[300];
    for (int j = 0; j < n; j++) {
      v[j] = rng_chance(&r, 0.5) ? pool[rng_below(&r, 9)] : (float)rng_range(&r, -5, 5);
      if (v[j] != v[j] && rng_chance(&r, 0.5)) v[j] = f32_of(0xffc12345u);
      sorted[j] = (item){v[j], j};
    }
    qsort(sorted, (size_t)n, sizeof *sorted, by_rules);
    int64_t idx[64];
    uint32_t val[64];
    ref_topk(v, n, k, idx, val);
    for (int q = 0; q < k; q++) {
      int64_t want = sorted[q].col;
      uint32_t wv = v[want] != v[want] ? 0x7fc00000u : f32_bits(v[want]);
      CHECK(idx[q] == want && val[q] == wv, "trial %d [%d]: %lld, want %lld", trial, q,
            (long long)idx[q], (long long)want);
    }
    /* the argmax is torch.argmax: the first NaN, else the first largest */
    ref_topk(v, n, 1, idx, val);
    int64_t first = 0;
    for (int j = 1; j < n; j++) {
      int nan_j = v[j] != v[j], nan_f = v[first] != v[first];
      if (!nan_f && (nan_j || v[j] > v[first])) first = j;
    }
    CHECK(idx[0] == first, "argmax trial %d: %lld, want %lld", trial, (long long)idx[0],
          (long long)first);
  }
  float row[3] = {1.0f, 2.0f, 3.0f};
  CHECK(fabs(ref_lse(row, 3) - 3.40760596444438) < 1e-12, "lse");
  CHECK(lse_close(3.4076061f, 3.40760596444438) && !lse_close(3.41f, 3.40760596444438), "close");
  float inf_row[2] = {-INFINITY, -INFINITY};
  CHECK(ref_lse(inf_row, 2) == -INFINITY, "lse of -Inf");
}

/* Drawn specs: the ones meant valid load, the others do not (diff_draw
 * checks both); each rank is at most 16; compile a sample with NVRTC. */
static void draws(int sample) {
  int valid = 0, invalid = 0, topk = 0, epi = 0, compiled = 0;
  for (uint64_t seed = 1; seed <= 4000; seed++) {
    diff_case c;
    char why[600];
    diff_knobs k = {1, NCCL_STANDIN, 16, 4000, 1};
    int rc = diff_draw(seed, &k, &c, why, sizeof why);
    CHECK(rc == 0, "seed %llu: %s", (unsigned long long)seed, why);
    if (rc) continue;
    if (!c.valid) {
      invalid++;
      continue;
    }
    valid++;
    topk += c.spec.topk > 0;
    epi += c.layout.epilogue;
    CHECK(c.spec.tp >= 1 && c.spec.tp <= 16, "tp %d", c.spec.tp);
    CHECK((c.spec.max_tokens + c.extra_tokens) * c.layout.padded_vocab <= DIFF_ELEM_BUDGET &&
              c.spec.max_tokens + c.extra_tokens <= DIFF_MAX_ROWS,
          "seed %llu: over the budget", (unsigned long long)seed);
    if (compiled < sample && seed % 97 == 0) {
      char *src = NULL;
      kl_err err;
      kl_binary bin;
      int ok = kl_render(&c.spec, &c.layout, NULL, &src, &err) == 0 &&
               kl_nvrtc_compile(src, c.spec.name, "sm_90", &bin, &err) == 0;
      CHECK(ok, "seed %llu: %s: %s", (unsigned long long)seed, c.lua, err.msg);
      if (ok) kl_binary_free(&bin);
      free(src);
      compiled++;
    }
  }
  printf("draws: %d valid (%d with topk, %d with an epilogue), %d invalid; %d compiled\n", valid,
         topk, epi, invalid, compiled);
  CHECK(invalid > 0 && invalid < valid / 10, "invalid specs: %d of %d", invalid, valid);
  CHECK(topk > valid / 2 && epi > valid / 3, "coverage");
}

/* The sampler's C reference on rows worked out by hand (the Python
 * reference checks it on random rows: tests/python/test_reference.py). */
static int64_t token_of(const float *x, int64_t vocab, sample_args a, const float *g, int64_t *kept) {
  float t[8], e[8];
  const float m = sample_tempered(x, vocab, a.temperature, t);
  for (int64_t c = 0; c < vocab; c++) e[c] = expf(t[c] - m);
  return sample_token(t, m, vocab, &a, e, g, kept);
}

static void sampler(void) {
  const float x[5] = {3, 1, 3, 2, 3}, zero[5] = {0}, g[5] = {0, 5, 0.5f, 0, 1};
  int64_t kept;
  /* noise 0: the first largest; the noise picks among the kept only */
  CHECK(token_of(x, 5, (sample_args){1, 0, 1, 0}, zero, &kept) == 0 && kept == 5, "plain");
  CHECK(token_of(x, 5, (sample_args){1, 0, 1, 0}, g, &kept) == 1, "noise 5 on column 1");
  CHECK(token_of(x, 5, (sample_args){1, 2, 1, 0}, g, &kept) == 2 && kept == 2, "top_k 2: 0 and 2");
  CHECK(token_of(x, 5, (sample_args){1, 0, 1, 1}, g, &kept) == 4 && kept == 3, "min_p 1: equals");
  CHECK(token_of(x, 5, (sample_args){0, 2, 0.1f, 0.5f}, g, &kept) == 0, "greedy");
  /* four equal weights 2^38: p = 0.5 keeps two (their sum reaches p exactly) */
  const float flat[4] = {0, 0, 0, 0}, gf[4] = {0, 0, 0, 1};
  CHECK(token_of(flat, 4, (sample_args){1, 0, 0.5f, 0}, gf, &kept) == 0 && kept == 2, "top_p 0.5");
  CHECK(token_of(flat, 4, (sample_args){1, 0, 0.75f, 0}, gf, &kept) == 0 && kept == 3, "0.75");
  CHECK(token_of(flat, 4, (sample_args){1, 0, 0.7500001f, 0}, gf, &kept) == 3 && kept == 4,
        "past 0.75");
  CHECK(token_of(flat, 4, (sample_args){1, 0, 0x1p-149f, 0}, gf, &kept) == 0 && kept == 1,
        "the smallest p");
  /* rows whose largest is not finite: argmax, whatever the filters */
  const float nan_row[3] = {1, NAN, NAN}, inf_row[3] = {1, INFINITY, INFINITY},
              ninf[3] = {-INFINITY, -INFINITY, -INFINITY};
  CHECK(token_of(nan_row, 3, (sample_args){1, 1, 0.5f, 0.5f}, g, &kept) == 1, "NaN");
  CHECK(token_of(inf_row, 3, (sample_args){1, 1, 0.5f, 0.5f}, g, &kept) == 1, "Inf");
  CHECK(token_of(ninf, 3, (sample_args){1, 0, 1, 0}, g, &kept) == 0, "all -Inf");
  int64_t rank, top[3];
  CHECK(isnan(sample_logprob(nan_row, 3, 0, &rank)) && rank == 1, "NaN logprob");
  CHECK(fabsf(sample_logprob(flat, 4, 2, &rank) - logf(0.25f)) < 1e-7f && rank == 4, "flat logprob");
  CHECK(sample_top(nan_row, 3, 3, top) == 0 && top[0] == 1 && top[1] == 2 && top[2] == 0, "top");
}

/* The shards' candidates against the whole row: what they decide is
 * sample_token's token, for random rows of every kind gpu_diff draws, random
 * splits into shards, capacities and parameters; greedy and non-finite rows,
 * rows without a filter and rows with top-k are always decided. */
enum { C_ARGMAX, C_PLAIN, C_TOPK, C_MINP, C_TOPP, C_KINDS };
static const char *const cand_kinds[C_KINDS] = {"argmax", "no filter", "top-k", "min-p alone",
                                                "top-p, no top-k"};

static int cand_kind(const sample_args *a, float m) {
  if (a->temperature == 0.f || !isfinite(m)) return C_ARGMAX;
  if (a->top_k > 0) return C_TOPK;
  if (a->top_p < 1.f) return C_TOPP;
  return a->min_p > 0.f ? C_MINP : C_PLAIN;
}

static void candidates(int trials) {
  rng r = rng_for(2026, 12);
  long long seen[C_KINDS] = {0}, decided[C_KINDS] = {0};
  const int Ks[] = {1, 2, 8, 64};
  const float temps[] = {0.f, 1e-3f, 0.37f, 0.7f, 1.f, 1.7f};
  const float top_ps[] = {1.f, 1.f, 1e-7f, 0.05f, 0.5f, 0.9f, 0.99999f};
  const float min_ps[] = {0.f, 0.f, 1e-6f, 0.05f, 0.3f, 0.999f, 1.f};
  enum { V_MAX = 3000 };
  static uint32_t bits[V_MAX];
  static float x[V_MAX], t[V_MAX], e[V_MAX], g[V_MAX];
  static sample_shard shards[8];
  for (int it = 0; it < trials; it++) {
    const int64_t vocab = 1 + (int64_t)rng_below(&r, rng_chance(&r, 0.3) ? 80 : V_MAX);
    diff_fill_row(&r, KL_FP32, (int)rng_below(&r, (uint64_t)diff_row_kinds()), bits, vocab, vocab);
    for (int64_t c = 0; c < vocab; c++) {
      x[c] = f32_of(bits[c]);
      const uint32_t w = (uint32_t)rng_next(&r); /* the noise's form, host logf */
      g[c] = -logf(-logf((float)(2u * (w >> 9) + 1u) * 0x1p-24f));
    }
    const int K = Ks[rng_below(&r, 4)], tp = 1 + (int)rng_below(&r, 8);
    const int64_t ks[] = {0, 0, 0, 1, 2, 3, K};
    sample_args a = {temps[rng_below(&r, 6)], ks[rng_below(&r, 7)], top_ps[rng_below(&r, 7)],
                     min_ps[rng_below(&r, 7)]};
    if (a.top_k > K) a.top_k = K;     /* the domain: at most the capacity */
    if (a.top_k >= vocab) a.top_k = 0; /* as the caller maps it */
    const float m = sample_tempered(x, vocab, a.temperature, t);
    for (int64_t c = 0; c < vocab; c++) e[c] = isfinite(m) ? expf(t[c] - m) : 0.f;
    const int64_t want = sample_token(t, m, vocab, &a, e, g, NULL);
    const int64_t width = (vocab + tp - 1) / tp; /* the TP split; the last shards may be short */
    for (int s = 0; s < tp; s++) {
      const int64_t first = s * width < vocab ? s * width : vocab;
      const int64_t cols = first + width < vocab ? width : vocab - first;
      sample_shard_reduce(t, g, first, cols, K, &shards[s]);
    }
    const int known = rng_chance(&r, 0.5) && a.temperature > 0.f && isfinite(m);
    const int64_t outside = known ? sample_outside_weight(t, m, vocab, &a, K, e) : -1;
    const char *why = "";
    const int64_t got = sample_from_shards(shards, tp, vocab, &a, K, e, g, outside, &why);
    const int kind = cand_kind(&a, m);
    seen[kind]++, decided[kind] += got >= 0;
    CHECK(got < 0 || got == want, "trial %d: vocab %lld tp %d K %d (T %g k %lld p %g min_p %g): "
          "%s gave %lld, the row %lld", it, (long long)vocab, tp, K, (double)a.temperature,
          (long long)a.top_k, (double)a.top_p, (double)a.min_p, why, (long long)got,
          (long long)want);
    CHECK(got >= 0 || kind > C_TOPK, "trial %d: a %s row undecided: %s", it, cand_kinds[kind],
          why);
  }
  printf("candidates:");
  for (int k = 0; k < C_KINDS; k++)
    printf(" %s %lld/%lld%s", cand_kinds[k], decided[k], seen[k], k + 1 < C_KINDS ? "," : "");
  printf(" decided\n");
}

int main(int argc, char **argv) {
  fp16_all();
  conversions();
  selections();
  sampler();
  candidates(20000);
  draws(argc > 1 ? atoi(argv[1]) : 12);
  printf("test_diff_ref: %s\n", failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
