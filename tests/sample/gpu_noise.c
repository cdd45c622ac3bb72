/* templates/noise.cuh.tmpl on the GPU against the host (noise_ref.c): the
 * sampler's noise as a kernel of a rendered spec computes it.
 *   - philox4x32_10: Random123's known answers;
 *   - noise_word and noise_group: bit for bit, for every combination of edge
 *     seeds, offsets and columns, and for random ones;
 *   - noise_uniform: bit for bit, for every one of its 2^23 values;
 *     -logf(u) within 2 ulp of the double log of u, and gumbel within 2 ulp
 *     of the double log of that float (each log against its own exact value:
 *     near g = 0 one ulp of the inner log is many of g's, so the chain as a
 *     whole is held to the float32 steps the contract names, not to g's double);
 *   the bounds the samplers skip columns by: gumbel_bound at least gumbel and
 *     within GUMBEL_BOUND, for every u; t_above at least x / d, for edge and
 *     random x and d where screens(d) holds;
 *   vLLM's noise (vllm_word, vllm_uniform, vllm_log1p_neg, vllm_gumbel):
 *     words bit for bit on the same columns; u bit for bit, the series bit
 *     for bit and logf within 2 ulp, on every word of 2^24 spread over the
 *     range and u's edges; and for all 2^32 words, g finite and at least
 *     -2.8117, vllm_gumbel_bound at least g and within VLLM_GUMBEL_BOUND;
 *   the spec's own noise (noise_word, gumbel, gumbel_bound) is the family
 *     its `noise` names.
 *  gpu_noise SPEC   (exit 77 without a GPU) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_util.h"
#include "noise_ref.h"

#define ULPS 2 /* CUDA's logf is within 1 ulp; both logs are checked within 2 */
#define RANDOM_CASES (1 << 16)
#define VALUES (1u << 23) /* u's distinct values: x >> 9 */
#define GUMBEL_BOUND 16.640625f      /* noise.cuh.tmpl's PHILOX_GUMBEL_BOUND */
#define VLLM_GUMBEL_BOUND 22.890625f /* and VLLM_GUMBEL_BOUND */

typedef struct gpu {
  const kl_cu *cu;
  CUfunction fn[NOISE_KERNELS];
  int noise; /* the spec's: 0 Philox, 1 vLLM's */
} gpu;

static void launch(const gpu *g, int k, int n, void **args) {
  const unsigned block = 256, grid = ((unsigned)n + block - 1) / block;
  CU_CHECK(g->cu, cuLaunchKernel(g->fn[k], grid, 1, 1, block, 1, 1, 0, NULL, args, NULL));
}

/* The rendered spec's source with the test kernels, for this GPU. */
static void load(gpu *g, const char *spec) {
  gpu_primary(g->cu, 0, 1);
  kl_err e;
  char *src = noise_test_source(spec, &g->noise, &e);
  if (!src) {
    fprintf(stderr, "%s\n", e.msg);
    exit(1);
  }
  CUmodule mod;
  int rc = gpu_load_source(g->cu, src, "noise_test", &mod);
  free(src);
  if (rc) exit(1);
  for (int k = 0; k < NOISE_KERNELS; k++)
    CU_CHECK(g->cu, cuModuleGetFunction(&g->fn[k], mod, noise_kernel_names[k]));
  printf("noise kernels compiled\n");
}

static void known_answers(const gpu *g) {
  const int n = noise_n_kats;
  uint32_t ctr[16], key[8], out[16];
  for (int i = 0; i < n; i++) {
    memcpy(ctr + 4 * i, noise_kats[i].ctr, sizeof noise_kats[i].ctr);
    memcpy(key + 2 * i, noise_kats[i].key, sizeof noise_kats[i].key);
  }
  CUdeviceptr dc = gpu_to_device(g->cu, ctr, 16 * (size_t)n),
              dk = gpu_to_device(g->cu, key, 8 * (size_t)n),
              dout = gpu_to_device(g->cu, NULL, 16 * (size_t)n);
  int nn = n;
  void *args[] = {&dc, &dk, &dout, &nn};
  launch(g, 0, n, args);
  gpu_from_device(g->cu, out, dout, 16 * (size_t)n);
  g->cu->cuMemFree(dc);
  g->cu->cuMemFree(dk);
  for (int i = 0; i < n; i++)
    CHECK(!memcmp(out + 4 * i, noise_kats[i].out, 16), "philox4x32_10 kat %d: %08x %08x %08x %08x",
          i, out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
}

static uint64_t splitmix64(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static const uint64_t edge_seeds[] = {0, 1, 0xffffffffull, 0x100000000ull, 0x0123456789abcdefull,
                                      0xffffffffffffffffull};
static const uint64_t edge_offsets[] = {0, 1, 0xfffffffeull, 0xffffffffull, 0x100000000ull,
                                        0xfffffffffffffffeull, 0xffffffffffffffffull};
/* 0..7, the 32-bit edge, the counter's second word (2^34 + 3), the ends of
 * large vocabularies (Qwen2.5's 152064, Kimi's 163840, 2^18), and 2^62. */
static const uint64_t edge_columns[] = {0, 1, 2, 3, 4, 5, 6, 7, 0xfffffffeull, 0xffffffffull,
                                        0x100000000ull, 0x400000003ull, 0x400000004ull, 152063,
                                        163839, 262143, 0x4000000000000000ull};
#define N_EDGE_SEEDS (sizeof edge_seeds / sizeof *edge_seeds)
#define N_EDGE_OFFSETS (sizeof edge_offsets / sizeof *edge_offsets)
#define N_EDGE_COLUMNS (sizeof edge_columns / sizeof *edge_columns)
#define N_EDGE (int)(N_EDGE_SEEDS * N_EDGE_OFFSETS * N_EDGE_COLUMNS)

/* Every combination of the edges, then random triples (columns below 2^40). */
static void make_cases(uint64_t *s, uint64_t *o, uint64_t *c, int n) {
  int i = 0;
  for (size_t a = 0; a < N_EDGE_SEEDS; a++)
    for (size_t b = 0; b < N_EDGE_OFFSETS; b++)
      for (size_t k = 0; k < N_EDGE_COLUMNS; k++, i++)
        s[i] = edge_seeds[a], o[i] = edge_offsets[b], c[i] = edge_columns[k];
  uint64_t rng = 22;
  for (; i < n; i++) {
    s[i] = splitmix64(&rng);
    o[i] = splitmix64(&rng);
    c[i] = splitmix64(&rng) >> (24 + splitmix64(&rng) % 40);
  }
}

static void column_words(const gpu *g) {
  const int n = N_EDGE + RANDOM_CASES;
  const size_t b64 = 8 * (size_t)n, b32 = 4 * (size_t)n;
  uint64_t *s = malloc(b64), *o = malloc(b64), *c = malloc(b64);
  uint32_t *word = malloc(b32), *group = malloc(b32);
  if (!s || !o || !c || !word || !group) exit(1);
  make_cases(s, o, c, n);
  CUdeviceptr ds = gpu_to_device(g->cu, s, b64), dof = gpu_to_device(g->cu, o, b64),
              dc = gpu_to_device(g->cu, c, b64),
              dw = gpu_to_device(g->cu, NULL, b32), dg = gpu_to_device(g->cu, NULL, b32);
  int nn = n;
  void *args[] = {&ds, &dof, &dc, &nn, &dw, &dg};
  launch(g, 1, n, args);
  gpu_from_device(g->cu, word, dw, b32);
  gpu_from_device(g->cu, group, dg, b32);
  g->cu->cuMemFree(ds);
  g->cu->cuMemFree(dof);
  g->cu->cuMemFree(dc);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const uint32_t want = noise_word_ref(s[i], o[i], c[i]);
    if (word[i] == want && group[i] == want) continue;
    if (bad++ < 5)
      fprintf(stderr, "seed %llx offset %llx column %llx: noise_word %08x, noise_group %08x, "
              "expected %08x\n", (unsigned long long)s[i], (unsigned long long)o[i],
              (unsigned long long)c[i], word[i], group[i], want);
  }
  CHECK(bad == 0, "%d of %d columns' words differ from the host's", bad, n);
  printf("words: %d columns (%d edge combinations)\n", n, N_EDGE);
  free(s), free(o), free(c), free(word), free(group);
}

/* Word i of the exhaustive run: u's value i, with low bits that must not count. */
static uint32_t value_word(uint32_t i) { return i << 9 | ((i * 0x9E3779B1u) >> 23); }

/* u, the inner log and g of value i against the host; the worst ulps so far. */
static int check_value(uint32_t i, float u, float inner, float g, float bound,
                       uint32_t worst[2]) {
  const float want_u = noise_uniform_ref(value_word(i));
  const uint32_t e_inner = noise_ulps(inner, (float)-log((double)want_u));
  const uint32_t e_g = noise_ulps(g, (float)-log((double)inner));
  if (e_inner > worst[0]) worst[0] = e_inner;
  if (e_g > worst[1]) worst[1] = e_g;
  const int ok = memcmp(&u, &want_u, sizeof u) == 0 && e_inner <= ULPS && e_g <= ULPS &&
                 g >= -2.8117f && g <= 16.6357f && g <= bound && bound <= GUMBEL_BOUND;
  return ok;
}

static void values(const gpu *g) {
  const size_t bytes = 4 * (size_t)VALUES;
  uint32_t *x = malloc(bytes);
  float *u = malloc(bytes), *inner = malloc(bytes), *gv = malloc(bytes), *bd = malloc(bytes);
  if (!x || !u || !inner || !gv || !bd) exit(1);
  for (uint32_t i = 0; i < VALUES; i++) x[i] = value_word(i);
  CUdeviceptr dx = gpu_to_device(g->cu, x, bytes), du = gpu_to_device(g->cu, NULL, bytes),
              di = gpu_to_device(g->cu, NULL, bytes), dg = gpu_to_device(g->cu, NULL, bytes),
              db = gpu_to_device(g->cu, NULL, bytes);
  int n = (int)VALUES;
  void *args[] = {&dx, &n, &du, &di, &dg, &db};
  launch(g, 2, n, args);
  gpu_from_device(g->cu, u, du, bytes);
  gpu_from_device(g->cu, inner, di, bytes);
  gpu_from_device(g->cu, gv, dg, bytes);
  gpu_from_device(g->cu, bd, db, bytes);
  g->cu->cuMemFree(dx);
  uint32_t worst[2] = {0, 0}, bad = 0;
  for (uint32_t i = 0; i < VALUES; i++) {
    if (check_value(i, u[i], inner[i], gv[i], bd[i], worst)) continue;
    if (bad++ < 5)
      fprintf(stderr, "x %08x: u %a (expected %a), -logf(u) %a, g %a, bound %a\n", x[i],
              (double)u[i], (double)noise_uniform_ref(x[i]), (double)inner[i], (double)gv[i],
              (double)bd[i]);
  }
  CHECK(bad == 0, "%u of %u values of u wrong", bad, VALUES);
  printf("values: all %u of u; worst -logf(u) %u ulp, gumbel %u ulp of their doubles\n", VALUES,
         worst[0], worst[1]);
  free(x), free(u), free(inner), free(gv), free(bd);
}

/* x and d of case i: every pair of the edge values, then random bit patterns
 * (any float for x, a positive one for d). */
static const float edge_x[] = {0.f, -0.f, 1.f, -1.f, 0x1p-149f, -0x1p-149f, 0x1p-126f, -0x1p-126f,
                               3.4028235e38f, -3.4028235e38f, 1e30f, -1e30f, 7.5f, -7.5f,
                               1.f / 0.f, -1.f / 0.f, 0.f / 0.f, 0x1.fffffep-1f, -16.f};
static const float edge_d[] = {1.f, 0.7f, 0x1p-100f, 0x1p100f, 0x1.000002p-100f, 0x1.fffffep99f,
                               1e-20f, 1e20f, 3.f, 0.1f, 0x1p-101f, 0x1p101f};
#define N_EDGE_X (int)(sizeof edge_x / sizeof edge_x[0])
#define N_EDGE_D (int)(sizeof edge_d / sizeof edge_d[0])
static void make_pairs(float *x, float *d, int n) {
  uint64_t r = 0x2545F4914F6CDD1Dull;
  for (int i = 0; i < n; i++) {
    uint32_t bx, bd;
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    bx = (uint32_t)r, bd = (uint32_t)(r >> 32) & 0x7fffffffu;
    if (i < N_EDGE_X * N_EDGE_D) {
      x[i] = edge_x[i % N_EDGE_X], d[i] = edge_d[i / N_EDGE_X];
      continue;
    }
    memcpy(&x[i], &bx, 4);
    memcpy(&d[i], &bd, 4);
  }
}

/* t_above(x, 1 / d) >= x / d wherever screens(d) holds (NaN stays NaN: it
 * never skips), and screens(d) for the normal range it names. */
static void quotients(const gpu *g) {
  const int n = RANDOM_CASES;
  const size_t bytes = 4 * (size_t)n;
  float *x = malloc(bytes), *d = malloc(bytes), *t = malloc(bytes), *hi = malloc(bytes);
  if (!x || !d || !t || !hi) exit(1);
  make_pairs(x, d, n);
  CUdeviceptr dx = gpu_to_device(g->cu, x, bytes), dd = gpu_to_device(g->cu, d, bytes),
              dt = gpu_to_device(g->cu, NULL, bytes), dh = gpu_to_device(g->cu, NULL, bytes);
  int nn = n;
  void *args[] = {&dx, &dd, &nn, &dt, &dh};
  launch(g, 3, n, args);
  gpu_from_device(g->cu, t, dt, bytes);
  gpu_from_device(g->cu, hi, dh, bytes);
  g->cu->cuMemFree(dx), g->cu->cuMemFree(dd), g->cu->cuMemFree(dt), g->cu->cuMemFree(dh);
  int bad = 0, screened = 0;
  for (int i = 0; i < n; i++) {
    const int in_range = d[i] >= 0x1p-100f && d[i] <= 0x1p100f;
    if (hi[i] == hi[i]) screened++;
    const int ok = in_range ? (t[i] != t[i] ? hi[i] != hi[i] : hi[i] >= t[i]) : hi[i] != hi[i];
    if (ok || bad++ >= 5) continue;
    fprintf(stderr, "x %a d %a: x / d %a, t_above %a\n", (double)x[i], (double)d[i],
            (double)t[i], (double)hi[i]);
  }
  CHECK(bad == 0, "%d of %d quotients above their bound", bad, n);
  printf("quotients: %d, %d screened\n", n, screened);
  free(x), free(d), free(t), free(hi);
}

/* The device's words for the cases (kernel k: vllm_word_kernel or
 * spec_noise_kernel, whose g and bound come back too when asked). */
static void words_of(const gpu *g, int k, const uint64_t *s, const uint64_t *o, const uint64_t *c,
                     int n, uint32_t *word, float *gv, float *bound) {
  const size_t b64 = 8 * (size_t)n, b32 = 4 * (size_t)n;
  CUdeviceptr ds = gpu_to_device(g->cu, s, b64), dof = gpu_to_device(g->cu, o, b64),
              dc = gpu_to_device(g->cu, c, b64), dw = gpu_to_device(g->cu, NULL, b32),
              dg = gpu_to_device(g->cu, NULL, b32), db = gpu_to_device(g->cu, NULL, b32);
  int nn = n;
  void *args[] = {&ds, &dof, &dc, &nn, &dw, &dg, &db};
  launch(g, k, n, args);
  gpu_from_device(g->cu, word, dw, b32);
  if (gv) gpu_from_device(g->cu, gv, dg, b32);
  if (bound) gpu_from_device(g->cu, bound, db, b32);
  g->cu->cuMemFree(ds), g->cu->cuMemFree(dof), g->cu->cuMemFree(dc);
  g->cu->cuMemFree(dw), g->cu->cuMemFree(dg), g->cu->cuMemFree(db);
}

static void vllm_words(const gpu *g) {
  const int n = N_EDGE + RANDOM_CASES;
  uint64_t *s = malloc(8 * (size_t)n), *o = malloc(8 * (size_t)n), *c = malloc(8 * (size_t)n);
  uint32_t *word = malloc(4 * (size_t)n);
  if (!s || !o || !c || !word) exit(1);
  make_cases(s, o, c, n);
  words_of(g, 4, s, o, c, n, word, NULL, NULL);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const uint32_t want = vllm_word_ref(s[i], o[i], c[i]);
    if (word[i] != want && bad++ < 5)
      fprintf(stderr, "vllm seed %llx offset %llx column %llx: %08x, expected %08x\n",
              (unsigned long long)s[i], (unsigned long long)o[i], (unsigned long long)c[i],
              word[i], want);
  }
  CHECK(bad == 0, "%d of %d vLLM words differ from the host's", bad, n);
  printf("vllm words: %d columns\n", n);
  free(s), free(o), free(c), free(word);
}

/* Word i of 2^24: spread over the whole range, with u's ends and the
 * series' edge (u near 0.25) among them. */
static uint32_t vllm_value_word(uint32_t i) {
  static const uint32_t edges[] = {0u, 1u, 0xffffu, 0x10000u, 0x3fffffffu, 0x40000000u,
                                   0x40000001u, 0x3fffff80u, 0xfffffffeu, 0xffffffffu};
  if (i < sizeof edges / sizeof *edges) return edges[i];
  return i << 8 | ((i * 0x9E3779B1u) >> 24);
}

static int vllm_value_ok(uint32_t x, float u, float l, float gv, float bound, uint32_t worst[2]) {
  const float want_u = vllm_uniform_ref(x), want_l = vllm_log1p_neg_ref(want_u);
  uint32_t e_l = noise_ulps(l, want_l);
  if (want_u >= 0.25f) { /* logf on each side: each within an ulp */
    e_l = noise_ulps(l, (float)log(fmax((double)(1.0f - want_u), 0x1p-24)));
    if (e_l > worst[0]) worst[0] = e_l;
  }
  const uint32_t e_g = noise_ulps(gv, (float)-log(-(double)l));
  if (e_g > worst[1]) worst[1] = e_g;
  return memcmp(&u, &want_u, sizeof u) == 0 && (want_u >= 0.25f ? e_l <= ULPS : e_l == 0) &&
         e_g <= ULPS && gv >= -2.8117f && gv <= bound && bound <= VLLM_GUMBEL_BOUND;
}

static void vllm_values(const gpu *g) {
  const uint32_t n = 1u << 24;
  const size_t bytes = 4 * (size_t)n;
  uint32_t *x = malloc(bytes);
  float *u = malloc(bytes), *l = malloc(bytes), *gv = malloc(bytes), *bd = malloc(bytes);
  if (!x || !u || !l || !gv || !bd) exit(1);
  for (uint32_t i = 0; i < n; i++) x[i] = vllm_value_word(i);
  CUdeviceptr dx = gpu_to_device(g->cu, x, bytes), du = gpu_to_device(g->cu, NULL, bytes),
              dl = gpu_to_device(g->cu, NULL, bytes), dg = gpu_to_device(g->cu, NULL, bytes),
              db = gpu_to_device(g->cu, NULL, bytes);
  int nn = (int)n;
  void *args[] = {&dx, &nn, &du, &dl, &dg, &db};
  launch(g, 5, nn, args);
  gpu_from_device(g->cu, u, du, bytes);
  gpu_from_device(g->cu, l, dl, bytes);
  gpu_from_device(g->cu, gv, dg, bytes);
  gpu_from_device(g->cu, bd, db, bytes);
  g->cu->cuMemFree(dx), g->cu->cuMemFree(du), g->cu->cuMemFree(dl);
  g->cu->cuMemFree(dg), g->cu->cuMemFree(db);
  uint32_t worst[2] = {0, 0}, bad = 0;
  for (uint32_t i = 0; i < n; i++) {
    if (vllm_value_ok(x[i], u[i], l[i], gv[i], bd[i], worst) || bad++ >= 5) continue;
    fprintf(stderr, "vllm x %08x: u %a (expected %a), l %a (expected %a), g %a, bound %a\n",
            x[i], (double)u[i], (double)vllm_uniform_ref(x[i]), (double)l[i],
            (double)vllm_log1p_neg_ref(vllm_uniform_ref(x[i])), (double)gv[i], (double)bd[i]);
  }
  CHECK(bad == 0, "%u of %u vLLM values wrong", bad, n);
  printf("vllm values: %u words; worst logf(1 - u) %u ulp, g %u ulp of their doubles\n", n,
         worst[0], worst[1]);
  free(x), free(u), free(l), free(gv), free(bd);
}

/* Every one of the 2^32 words: 2^16 CTAs of 2^16 words each. */
static void vllm_sweep(const gpu *g) {
  unsigned long long bad = 0;
  CUdeviceptr dout = gpu_to_device(g->cu, &bad, sizeof bad);
  unsigned hi = 0;
  void *args[] = {&hi, &dout};
  CU_CHECK(g->cu, cuLaunchKernel(g->fn[6], 65536, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
  gpu_from_device(g->cu, &bad, dout, sizeof bad);
  g->cu->cuMemFree(dout);
  CHECK(bad == 0, "%llu of 2^32 vLLM words: g not finite or above its bound", bad);
  printf("vllm sweep: all 2^32 words, %llu outside their bounds\n", bad);
}

/* noise_word, gumbel and gumbel_bound are the spec's family, bit for bit. */
static void spec_noise(const gpu *g) {
  const int n = N_EDGE + RANDOM_CASES;
  const size_t b32 = 4 * (size_t)n;
  uint64_t *s = malloc(8 * (size_t)n), *o = malloc(8 * (size_t)n), *c = malloc(8 * (size_t)n);
  uint32_t *word = malloc(b32);
  float *gv = malloc(b32), *bd = malloc(b32), *fg = malloc(b32), *fb = malloc(b32);
  if (!s || !o || !c || !word || !gv || !bd || !fg || !fb) exit(1);
  make_cases(s, o, c, n);
  words_of(g, 7, s, o, c, n, word, gv, bd);
  CUdeviceptr dx = gpu_to_device(g->cu, word, b32), du = gpu_to_device(g->cu, NULL, b32),
              di = gpu_to_device(g->cu, NULL, b32), dg = gpu_to_device(g->cu, NULL, b32),
              db = gpu_to_device(g->cu, NULL, b32);
  int nn = n;
  void *args[] = {&dx, &nn, &du, &di, &dg, &db};
  launch(g, g->noise ? 5 : 2, n, args);  /* the family's own values of the same words */
  gpu_from_device(g->cu, fg, dg, b32);
  gpu_from_device(g->cu, fb, db, b32);
  g->cu->cuMemFree(dx), g->cu->cuMemFree(du), g->cu->cuMemFree(di);
  g->cu->cuMemFree(dg), g->cu->cuMemFree(db);
  int bad = 0;
  for (int i = 0; i < n; i++) {
    const uint32_t want = g->noise ? vllm_word_ref(s[i], o[i], c[i]) : noise_word_ref(s[i], o[i], c[i]);
    if (word[i] == want && !memcmp(&gv[i], &fg[i], 4) && !memcmp(&bd[i], &fb[i], 4)) continue;
    if (bad++ < 5)
      fprintf(stderr, "spec noise, column %llx: word %08x (expected %08x), g %a / %a\n",
              (unsigned long long)c[i], word[i], want, (double)gv[i], (double)fg[i]);
  }
  CHECK(bad == 0, "%d of %d columns: the spec's noise is not %s's", bad, n,
        g->noise ? "vLLM" : "Philox");
  printf("spec noise: %s, %d columns\n", kl_noise_name((kl_noise)g->noise), n);
  free(s), free(o), free(c), free(word), free(gv), free(bd), free(fg), free(fb);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gpu_noise SPEC\n");
    return 2;
  }
  gpu g = {gpu_require(1), {0}, 0};
  load(&g, argv[1]);
  known_answers(&g);
  column_words(&g);
  values(&g);
  quotients(&g);
  vllm_words(&g);
  vllm_values(&g);
  vllm_sweep(&g);
  spec_noise(&g);
  return check_done();
}
