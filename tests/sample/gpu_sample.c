/* templates/sample.cu.tmpl on the GPU: kl_sample's row sampler, as the JIT
 * compiles it for each spec of a file (specs with a top-k), on gathered rows
 * of every kind gpu_diff draws (ties, -Inf, NaN, all equal, huge values),
 * with random parameters per row (greedy, each filter alone and together,
 * edges, and rows outside the domain), against the sampler's C reference
 * (tests/diff/diff_sample.c). The reference takes the noise and top-p's expf
 * from the device (helper kernels appended to the spec's source), so
 * tokens must agree bit for bit; logprobs within 2 ulp. Each such row is
 * also split into random shards, reduced and merged on the host, and
 * candidates.cuh.tmpl's decide_row must decide from that alone what
 * sample_from_shards decides (the same token, or a row sampled whole).
 * Then kl_sample itself on one rank: eager on both paths, in a replayed CUDA
 * graph (which reads the parameters of the replay), and the calls it must
 * refuse. Last, its distribution: 102,400 draws of fixed logits per case of
 * (temperature, top_k, top_p, min_p), at tp 2 gathered and tp 4 by the
 * shards (ranks as threads on the GPU), against the exact filtered softmax
 * by a chi-squared test; the same seeds and offsets draw the same tokens
 * again and at either tp.
 *   gpu_sample SPECS [ROWS [--no-distribution]]   (exit 77 without a GPU) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "diff.h"
#include "sample_kernels.h"
#include "spec_source.h"
#include "diff_sample.h"
#include "gpu_util.h"
#include "kl_abi.h"
#include "klrt/klrt.h"

typedef struct dev {
  const kl_cu *cu;
  CUfunction sample, aux, decide;
  long long decided, undecided; /* rows of the candidates' check */
} dev;

typedef struct rows {
  int n, n_top, out_dtype, topk; /* topk: the spec's (the domain's top_k bound) */
  long long vocab;
  uint32_t *bits;  /* [n, vocab] gathered element bits */
  float *temperature, *top_p, *min_p;
  int32_t *top_k;
  uint64_t *seed, *offset;
  long long *token, *top_index; /* the kernel's */
  float *logprob, *top_logprob;
} rows;

static const float temps[] = {0.f, 0.f, 1e-3f, 0.37f, 0.5f, 1.f, 1.f, 1.7f, 9.5f};
static const float top_ps[] = {1.f, 1.f, 1.f, 1e-7f, 0.05f, 0.3f, 0.5f, 0.9f, 0.99999f};
static const float min_ps[] = {0.f, 0.f, 0.f, 1e-6f, 0.05f, 0.3f, 0.999f, 1.f};
#define PICK(r, a) (a)[rng_below(r, sizeof(a) / sizeof *(a))]

/* Row i's parameters; about one row in 16 outside the domain. */
static void draw_params(rng *r, rows *w, int i) {
  const long long v = w->vocab, cap = w->topk;
  const long long ks[] = {0, 0, 0, 1, 2, 3, cap, cap, v, v + 5, cap + 1, v - 1};
  w->temperature[i] = PICK(r, temps);
  w->top_k[i] = (int32_t)PICK(r, ks);
  w->top_p[i] = PICK(r, top_ps);
  w->min_p[i] = PICK(r, min_ps);
  w->seed[i] = rng_next(r);
  w->offset[i] = rng_below(r, 1ull << 40);
  if (rng_chance(r, 1.0 / 16)) switch (rng_below(r, 5)) {
    case 0: w->temperature[i] = -1.f; break;
    case 1: w->temperature[i] = NAN; break;
    case 2: w->top_p[i] = 0.f; break;
    case 3: w->min_p[i] = 1.5f; break;
    default: w->top_k[i] = -3; break;
    }
}

/* Whether row i's filters may drop columns (its top-k below the vocabulary). */
static int filtered(const rows *w, int i) {
  return (w->top_k[i] > 0 && w->top_k[i] < w->vocab) || w->top_p[i] < 1.f || w->min_p[i] > 0.f;
}
/* Min-p its only filter: a row the row sampler slices as a plain one. */
static int min_p_alone(const rows *w, int i) {
  return w->min_p[i] > 0.f && !(w->top_k[i] > 0 && w->top_k[i] < w->vocab) && !(w->top_p[i] < 1.f);
}

/* The domain: as check_sampling_args with max_top_k the spec's topk (n_top here). */
static int valid(const rows *w, int i) {
  const long long k = w->top_k[i] >= w->vocab ? 0 : w->top_k[i];
  return w->temperature[i] >= 0.f && isfinite(w->temperature[i]) && w->top_p[i] > 0.f &&
         w->top_p[i] <= 1.f && w->min_p[i] >= 0.f && w->min_p[i] <= 1.f && k >= 0 && k <= w->topk;
}

static CUdeviceptr up(const dev *d, const void *p, size_t bytes) {
  return gpu_to_device(d->cu, p, bytes);
}

static void down(const dev *d, void *p, CUdeviceptr x, size_t bytes) {
  gpu_from_device(d->cu, p, x, bytes);
}

/* The sampler over all rows, as kl_sample launches it (fewer CTAs than rows
 * or their slices: each CTA takes several). slices > 0: a greedy,
 * plain-temperature or min-p-alone row without top-n logprobs (w->n_top 0)
 * is split over
 * that many CTAs of `cols` columns each, whose counters must be back at 0
 * after. dead: the group's fault word is set, as a peer that gave up sets it. */
static void run_kernel(const dev *d, rows *w, int slices, long long cols, int dead) {
  const size_t n = (size_t)w->n, eb = w->out_dtype == KL_FP32 ? 4 : 2;
  void *packed = malloc(n * (size_t)w->vocab * eb);
  for (size_t j = 0; j < n * (size_t)w->vocab; j++)
    if (eb == 4) ((uint32_t *)packed)[j] = w->bits[j];
    else ((uint16_t *)packed)[j] = (uint16_t)w->bits[j];
  kl_sample_args a = {0};
  CUdeviceptr lg = up(d, packed, n * (size_t)w->vocab * eb), T = up(d, w->temperature, 4 * n),
              K = up(d, w->top_k, 4 * n), P = up(d, w->top_p, 4 * n), MP = up(d, w->min_p, 4 * n),
              S = up(d, w->seed, 8 * n), O = up(d, w->offset, 8 * n), tok = up(d, NULL, 8 * n),
              lp = up(d, NULL, 4 * n), ti = w->n_top ? up(d, NULL, 8 * n * (size_t)w->n_top) : 0,
              tl = w->n_top ? up(d, NULL, 4 * n * (size_t)w->n_top) : 0;
  /* a row's slice results at the kernel's stride (SAMPLE_SLICES <= 32), whatever the slices */
  const size_t part_bytes = n * 32 * sizeof(kl_slice_result);
  CUdeviceptr parts = slices > 0 ? up(d, NULL, part_bytes + 4 * n) : 0;
  if (parts) CU_CHECK(d->cu, cuMemsetD32(parts, 0, part_bytes / 4 + n));
  CU_CHECK(d->cu, cuMemsetD32(tok, 0x5a5a5a5au, 2 * n)); /* a row left unwritten shows */
  free(packed);
  a.logits = (const void *)lg, a.params.temperature = (const float *)T;
  a.params.top_k = (const int *)K, a.params.top_p = (const float *)P;
  a.params.min_p = (const float *)MP, a.params.seed = (const unsigned long long *)S;
  a.params.offset = (const unsigned long long *)O;
  a.token = (long long *)tok, a.logprob = (float *)lp;
  a.top_index = (long long *)ti, a.top_logprob = (float *)tl;
  a.tokens = w->n, a.n_top = w->n_top;
  a.slices = slices > 0 ? slices : 1, a.slice_cols = slices > 0 ? cols : w->vocab;
  const unsigned long long fault_word = 1;
  CUdeviceptr fault = dead ? up(d, &fault_word, 8) : 0;
  a.fault = (const unsigned long long *)fault;
  a.slice_results = (kl_slice_result *)parts;
  a.arrived = parts ? (unsigned *)(parts + part_bytes) : NULL;
  void *args[] = {&a};
  const unsigned grid = (unsigned)(w->n * (slices > 0 ? slices : 1) / 3 + 1);
  CU_CHECK(d->cu, cuLaunchKernel(d->sample, grid, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
  down(d, w->token, tok, 8 * n);
  down(d, w->logprob, lp, 4 * n);
  if (w->n_top) {
    down(d, w->top_index, ti, 8 * n * (size_t)w->n_top);
    down(d, w->top_logprob, tl, 4 * n * (size_t)w->n_top);
  }
  if (parts) {
    unsigned *arrived = malloc(4 * n);
    CU_CHECK(d->cu, cuMemcpyDtoH(arrived, parts + part_bytes, 4 * n));
    for (size_t i = 0; i < n; i++) CHECK(arrived[i] == 0, "row %zu: counter %u after", i, arrived[i]);
    free(arrived);
  }
  CUdeviceptr all[] = {lg, T, K, P, MP, S, O, parts, fault}; /* down() freed the outputs */
  for (size_t j = 0; j < sizeof all / sizeof *all; j++)
    if (all[j]) CU_CHECK(d->cu, cuMemFree(all[j]));
}

static int close_to(float got, float want) {
  if (isnan(want)) return isnan(got);
  if (got == want) return 1; /* infinities too */
  /* 2 ulp, and near log 1 = 0 what a float64 sum in another order moves */
  return fabsf(got - want) <= 2 * (nextafterf(fabsf(want), INFINITY) - fabsf(want)) + 1e-12f;
}

static int key_desc(const void *a, const void *b) {
  const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x < y) - (x > y);
}

/* 1..8 shards of [0, vocab) at random cuts (some empty, as a rank whose part
 * is all padding): cut[s] .. cut[s + 1]. Returns how many. */
static int random_shards(rng *r, long long vocab, int64_t cut[9]) {
  const int ns = 1 + (int)rng_below(r, 8);
  cut[0] = 0, cut[ns] = vocab;
  for (int s = 1; s < ns; s++) cut[s] = (int64_t)rng_below(r, (uint64_t)vocab + 1);
  for (int s = 2; s < ns; s++) /* insertion sort of the inner cuts */
    for (int q = s; q > 1 && cut[q - 1] > cut[q]; q--) {
      const int64_t x = cut[q];
      cut[q] = cut[q - 1], cut[q - 1] = x;
    }
  return ns;
}

/* The shards' candidates (candidates.cuh.tmpl's decide_row) against
 * sample_from_shards: row i split into random shards, each reduced to its
 * first K of t in the key order and its best draw, merged here; the device
 * decides from the merge alone. Every lane answers alike, as the reference
 * does (-1: a row to sample whole), and a decided row's token is the whole
 * row's, want. */
static void check_candidates(dev *d, const rows *w, int i, const float *t, const float *e,
                             const float *g, const sample_args *a, int64_t want, const char *name) {
  const long long v = w->vocab;
  const int K = w->n_top, n = K < v ? K : (int)v;
  rng r = rng_for(w->seed[i], 3);
  int64_t cut[9];
  const int ns = random_shards(&r, v, cut);
  sample_shard sh[8];
  uint64_t cand[8 * SAMPLE_CAND_MAX], best = 0;
  float best_t = 0.f;
  int all = 0;
  for (int s = 0; s < ns; s++) {
    sample_shard_reduce(t, g, cut[s], cut[s + 1] - cut[s], K, &sh[s]);
    for (int j = 0; j < sh[s].n; j++) cand[all++] = sample_key(sh[s].t[j], sh[s].c[j]);
    const uint64_t b = sh[s].best_c >= 0 ? sample_key(sh[s].best, sh[s].best_c) : 0;
    if (b > best) best = b, best_t = sh[s].best_t;
  }
  qsort(cand, (size_t)all, sizeof *cand, key_desc);
  const char *why = "";
  const int64_t from = sample_from_shards(sh, ns, v, a, K, e, g, -1, &why);
  sample_row_args ra = {a->temperature, a->top_p, a->min_p, (int)a->top_k, w->seed[i],
                        w->offset[i]};
  CUdeviceptr dc = up(d, cand, 8 * (size_t)n), dt = up(d, NULL, 8 * 32);
  void *args[] = {&dc, &best, &best_t, &ra, &dt};
  CU_CHECK(d->cu, cuLaunchKernel(d->decide, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
  long long got[32];
  down(d, got, dt, sizeof got);
  CU_CHECK(d->cu, cuMemFree(dc));
  int same = 1;
  for (int l = 1; l < 32; l++) same &= got[l] == got[0];
  CHECK(same && got[0] == from, "%s row %d, %d shards (T %g, k %lld, p %g, min_p %g): the "
        "candidates decide %lld (lanes %s), the reference %lld (%s)", name, i, ns,
        (double)a->temperature, (long long)a->top_k, (double)a->top_p, (double)a->min_p, got[0],
        same ? "agree" : "differ", (long long)from, why);
  CHECK(from < 0 || from == want, "%s row %d: the shards' candidates give %lld, the row %lld (%s)",
        name, i, (long long)from, (long long)want, why);
  if (from >= 0) d->decided++;
  else d->undecided++;
}

/* Row i against the reference, with the device's noise and expf; the
 * shards' candidates too if `candidates`. Returns how many columns its
 * filters keep (1 for an argmax row, 0 for one outside the domain). */
static int64_t check_row(dev *d, const rows *w, int i, const char *name, int candidates) {
  const long long v = w->vocab;
  float *x = malloc(sizeof(float) * (size_t)v), *t = malloc(sizeof(float) * (size_t)v);
  float *e = malloc(sizeof(float) * (size_t)v), *g = malloc(sizeof(float) * (size_t)v);
  for (long long c = 0; c < v; c++) x[c] = elem_to_f(w->out_dtype, w->bits[(size_t)i * v + c]);
  const float m = sample_tempered(x, v, w->temperature[i], t);
  CUdeviceptr dt = up(d, t, 4 * (size_t)v), de = up(d, NULL, 4 * (size_t)v),
              dg = up(d, NULL, 4 * (size_t)v);
  float mm = isfinite(m) ? m : 0.f;
  unsigned long long seed = w->seed[i], offset = w->offset[i];
  void *args[] = {&dt, &mm, &seed, &offset, (void *)&v, &de, &dg};
  CU_CHECK(d->cu, cuLaunchKernel(d->aux, 64, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
  down(d, e, de, 4 * (size_t)v);
  down(d, g, dg, 4 * (size_t)v);
  CU_CHECK(d->cu, cuMemFree(dt));
  sample_args a = {w->temperature[i], w->top_k[i] >= v ? 0 : w->top_k[i], w->top_p[i], w->min_p[i]};
  const int ok = valid(w, i);
  int64_t kept = 0;
  const int64_t want = ok ? sample_token(t, m, v, &a, e, g, &kept) : -1;
  if (ok && candidates) check_candidates(d, w, i, t, e, g, &a, want, name);
  CHECK(w->token[i] == want, "%s row %d (T %g, k %lld, p %g, min_p %g): token %lld, want %lld",
        name, i, (double)a.temperature, (long long)w->top_k[i], (double)a.top_p, (double)a.min_p,
        w->token[i], (long long)want);
  const float lp = ok && want >= 0 ? sample_logprob(x, v, want, NULL) : NAN;
  CHECK(close_to(w->logprob[i], lp), "%s row %d: logprob %a, want %a", name, i,
        (double)w->logprob[i], (double)lp);
  int64_t top[64];
  const int n = w->n_top < v ? w->n_top : (int)v;
  sample_top(x, v, n, top);
  for (int j = 0; j < n; j++) {
    const long long got = w->top_index[(size_t)i * w->n_top + j];
    const long long wi = ok ? top[j] : -1;
    const float wl = ok ? sample_logprob(x, v, top[j], NULL) : NAN;
    CHECK(got == wi && close_to(w->top_logprob[(size_t)i * w->n_top + j], wl),
          "%s row %d top %d: %lld %a, want %lld %a", name, i, j, got,
          (double)w->top_logprob[(size_t)i * w->n_top + j], wi, (double)wl);
  }
  free(x), free(t), free(e), free(g);
  return kept;
}

static void *xmalloc(size_t n) {
  void *p = calloc(1, n ? n : 1);
  if (!p) exit(1);
  return p;
}

static void alloc_rows(rows *w) {
  const size_t n = (size_t)w->n;
  w->bits = xmalloc(4 * n * (size_t)w->vocab);
  w->temperature = xmalloc(4 * n), w->top_p = xmalloc(4 * n), w->min_p = xmalloc(4 * n);
  w->top_k = xmalloc(4 * n), w->seed = xmalloc(8 * n), w->offset = xmalloc(8 * n);
  w->token = xmalloc(8 * n), w->logprob = xmalloc(4 * n);
  w->top_index = xmalloc(8 * n * (size_t)w->n_top);
  w->top_logprob = xmalloc(4 * n * (size_t)w->n_top);
}

static void free_rows(rows *w) {
  void *all[] = {w->bits, w->temperature, w->top_p, w->min_p, w->top_k, w->seed, w->offset,
                 w->token, w->logprob, w->top_index, w->top_logprob};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) free(all[j]);
}

static void spec_rows(dev *d, const kl_spec *s, int n, uint64_t seed) {
  rows w = {n, s->topk, s->out_dtype, s->topk, s->vocab_size, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL};
  rng r = rng_for(seed, 1);
  alloc_rows(&w);
  for (int i = 0; i < n; i++) {
    uint32_t *row = w.bits + (size_t)i * (size_t)w.vocab;
    if (i % 8 == 7) /* a value each 256 columns repeat: more keys reach the candidates' */
      for (long long c = 0; c < w.vocab; c++)  /* threshold than they hold (their fallback) */
        row[c] = f_to_elem(w.out_dtype, -(float)(c % 256));
    else
      diff_fill_row(&r, w.out_dtype, (int)rng_below(&r, (uint64_t)diff_row_kinds()), row, w.vocab,
                    w.vocab);
    draw_params(&r, &w, i);
  }
  run_kernel(d, &w, 0, 0, 0);
  d->decided = d->undecided = 0;
  for (int i = 0; i < n; i++) check_row(d, &w, i, s->name, 1);
  printf("%s: the shards' candidates decided %lld of %lld rows in the domain\n", s->name,
         d->decided, d->decided + d->undecided);
  /* again without top-n, as kl_sample launches it: greedy and plain-temperature
   * rows split over the layout's slices, and over the fewer, wider ones a
   * call with many rows takes (down to one a row) */
  kl_layout l;
  kl_err e;
  if (kl_layout_derive(s, &l, &e) == 0) {
    rows w1 = w;
    w1.n_top = 0;
    /* about a row in four is split: with few rows there may be none, and
     * then row 0 is made one (greedy, no filter), so the split path runs */
    int any = 0;
    for (int i = 0; i < n; i++)
      any |= valid(&w1, i) && (w1.temperature[i] == 0.f || !filtered(&w1, i));
    if (!any) w1.temperature[0] = 0.f, w1.top_k[0] = 0, w1.top_p[0] = 1.f, w1.min_p[0] = 0.f;
    const int64_t tries[3] = {l.sample_slices, (l.sample_slices + 1) / 2, 1};
    for (int t = 0; t < 3; t++) {
      int64_t cols = 0;
      const int slices = kl_layout_sample_slices(w1.vocab, tries[t], &cols);
      run_kernel(d, &w1, slices, (long long)cols, 0);
      int split = 0;
      for (int i = 0; i < n; i++) {
        check_row(d, &w1, i, s->name, 0);
        split += valid(&w1, i) && (w1.temperature[i] == 0.f || !filtered(&w1, i) ||
                                   min_p_alone(&w1, i));
      }
      CHECK(split > 0, "%s: no row to split among %d", s->name, n);
    }
    /* a dead step: every row poison, split or whole, and the counters back at 0 */
    run_kernel(d, &w1, l.sample_slices, l.sample_slice_cols, 1);
    for (int i = 0; i < n; i++)
      CHECK(w1.token[i] == -1 && isnan(w1.logprob[i]), "%s row %d, dead step: token %lld "
            "logprob %a", s->name, i, w1.token[i], (double)w1.logprob[i]);
  }
  free_rows(&w);
}

/* The spec's rendered source with the helper kernel, loaded. */
static void load(dev *d, const kl_spec *s) {
  kl_err e;
  char *all = spec_source_with(s, sample_test_kernels, &e);
  if (!all) {
    fprintf(stderr, "gpu_sample: %s\n", e.msg);
    exit(1);
  }
  CUmodule mod;
  if (gpu_load_source(d->cu, all, "gpu_sample", &mod)) exit(1);
  free(all);
  char entry[KL_NAME_MAX + 32];
  kl_entry_name(s, "sample", entry, sizeof entry);
  CU_CHECK(d->cu, cuModuleGetFunction(&d->sample, mod, entry));
  CU_CHECK(d->cu, cuModuleGetFunction(&d->aux, mod, "row_aux"));
  CU_CHECK(d->cu, cuModuleGetFunction(&d->decide, mod, "row_decide"));
}

/* ---- kl_sample end to end, one rank (tp 1: the gather is a copy) ---- */

#define API_SPEC                                                                          \
  "return { name = 'sample_tp1', vocab_size = 5000, tp = 1, dtype = 'bf16', "            \
  "max_tokens = 16, topk = 8 }"

typedef struct api_bufs {
  CUdeviceptr shard, T, K, P, MP, S, O, token, logprob, top_index, top_logprob;
} api_bufs;

/* The device parameters of w's rows, and outputs for them. */
static api_bufs api_upload(const dev *d, const rows *w, const uint16_t *shard, long long padded) {
  const size_t n = (size_t)w->n, top = n * (size_t)w->n_top;
  return (api_bufs){up(d, shard, 2 * n * (size_t)padded), up(d, w->temperature, 4 * n),
                    up(d, w->top_k, 4 * n), up(d, w->top_p, 4 * n), up(d, w->min_p, 4 * n),
                    up(d, w->seed, 8 * n), up(d, w->offset, 8 * n), up(d, NULL, 8 * n),
                    up(d, NULL, 4 * n), up(d, NULL, 8 * top), up(d, NULL, 4 * top)};
}

static kl_sampling api_params(const api_bufs *b) {
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = (const float *)b->T, p.top_k = (const int32_t *)b->K;
  p.top_p = (const float *)b->P, p.min_p = (const float *)b->MP;
  p.seed = (const uint64_t *)b->S, p.offset = (const uint64_t *)b->O;
  return p;
}

static kl_result api_call(kl_ctx *ctx, const api_bufs *b, const kl_sampling *p, int n_top, int n,
                          CUstream s) {
  const kl_cu *cu = kl_cu_get(NULL); /* a row the call leaves unwritten must not keep the last call's token */
  if (cu->cuMemsetD32Async(b->token, 0x5a5a5a5au, 2 * (size_t)n, s) != CUDA_SUCCESS) return KLRT_ECUDA;
  return kl_sample(ctx, (const void *)b->shard, p, (int64_t *)b->token, (float *)b->logprob,
                   n_top ? (int64_t *)b->top_index : NULL, n_top ? (float *)b->top_logprob : NULL,
                   n_top, n, (kl_stream)s);
}

static void api_results(const dev *d, rows *w, const api_bufs *b) {
  const size_t n = (size_t)w->n, top = n * (size_t)w->n_top;
  CU_CHECK(d->cu, cuCtxSynchronize());
  CU_CHECK(d->cu, cuMemcpyDtoH(w->token, b->token, 8 * n));
  CU_CHECK(d->cu, cuMemcpyDtoH(w->logprob, b->logprob, 4 * n));
  if (!top) return;
  CU_CHECK(d->cu, cuMemcpyDtoH(w->top_index, b->top_index, 8 * top));
  CU_CHECK(d->cu, cuMemcpyDtoH(w->top_logprob, b->top_logprob, 4 * top));
}

static void refused(kl_result rc, const char *what) {
  const char *msg = kl_last_error(); /* this call's: read before the next */
  CHECK(rc == KLRT_EINVAL && strstr(msg, what) != NULL, "misuse: %s (%s), want EINVAL with \"%s\"",
        kl_result_name(rc), msg, what);
}

/* Calls that must be refused, each with its message, the context unharmed. */
static void api_misuse(kl_ctx *ctx, const api_bufs *b, int n) {
  kl_sampling p = api_params(b), none = KL_SAMPLING_INIT;
  float host_t[1] = {1.f};
  kl_sampling host = p, over = p, odd_t = p, odd_seed = p;
  host.temperature = host_t;
  over.top_p = (const float *)b->logprob; /* a parameter array on an output */
  odd_t.temperature = (const float *)(b->T + 2); /* device memory, misaligned */
  odd_seed.seed = (const uint64_t *)(b->S + 4);
  const void *shard = (const void *)b->shard;
  refused(api_call(ctx, b, &p, 9, n, NULL), "n_top is 9");
  refused(api_call(ctx, b, &p, -1, n, NULL), "n_top is -1");
  refused(api_call(ctx, b, &none, 8, n, NULL), "temperature is NULL");
  refused(kl_sample(ctx, shard, NULL, (int64_t *)b->token, NULL, NULL, NULL, 0, n, NULL),
          "params is NULL");
  refused(kl_sample(ctx, shard, &p, (int64_t *)b->token, NULL, NULL, NULL, 3, n, NULL),
          "top_index must be given");
  refused(kl_sample(ctx, shard, &p, (int64_t *)(b->token + 4), NULL, NULL, NULL, 0, n, NULL),
          "8-byte aligned");
  refused(api_call(ctx, b, &host, 8, n, NULL), "temperature");
  refused(api_call(ctx, b, &over, 8, n, NULL), "params->top_p overlaps logprob");
  refused(api_call(ctx, b, &odd_t, 0, n, NULL), "params->temperature is not 4-byte aligned");
  refused(api_call(ctx, b, &odd_seed, 0, n, NULL), "params->seed is not 8-byte aligned");
  refused(api_call(ctx, b, &p, 8, 0, NULL), "tokens is 0");
}

/* w's first n rows' parameters as per-request tables in pinned host memory
 * the GPU maps (vLLM's UVA buffers), in reverse order, read through 32-bit
 * state_rows and offset_rows, themselves in that memory: the rows' tokens. */
static void api_host_tables(dev *d, kl_ctx *ctx, const api_bufs *b, rows *w, int n) {
  void *h = NULL;
  CU_CHECK(d->cu, cuMemAllocHost(&h, 64 * (size_t)n));
  float *T = h, *P = T + n, *MP = P + n;
  int32_t *K = (int32_t *)(MP + n), *sr = K + n, *orow = sr + n;
  uint64_t *S = (uint64_t *)((char *)h + 8 * (((size_t)24 * n + 7) / 8)), *O = S + n;
  for (int i = 0; i < n; i++) {
    const int j = n - 1 - i;
    T[j] = w->temperature[i], P[j] = w->top_p[i], MP[j] = w->min_p[i], K[j] = w->top_k[i];
    S[j] = w->seed[i], O[j] = w->offset[i], sr[i] = orow[i] = j;
  }
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = T, p.top_k = K, p.top_p = P, p.min_p = MP, p.seed = S, p.offset = O;
  p.state_rows = sr, p.states = n, p.state_rows_bits = 32;
  p.offset_rows = orow, p.offsets = n, p.offset_rows_bits = 32;
  CHECK(api_call(ctx, b, &p, 0, n, NULL) == KLRT_OK, "kl_sample, tables in host memory: %s",
        kl_last_error());
  CU_CHECK(d->cu, cuCtxSynchronize());
  w->n = n, w->n_top = 0;
  api_results(d, w, b);
  for (int i = 0; i < n; i++) check_row(d, w, i, "kl_sample, tables in mapped host memory", 0);
  CU_CHECK(d->cu, cuMemFreeHost(h));
}

/* The first 20 rows' filters, kept while a test puts its own in w. */
typedef struct filters {
  int32_t top_k[20];
  float top_p[20], min_p[20];
} filters;
static filters keep_filters(const rows *w) {
  filters f;
  memcpy(f.top_k, w->top_k, sizeof f.top_k);
  memcpy(f.top_p, w->top_p, sizeof f.top_p);
  memcpy(f.min_p, w->min_p, sizeof f.min_p);
  return f;
}
static void put_filters(rows *w, const filters *f) {
  memcpy(w->top_k, f->top_k, sizeof f->top_k);
  memcpy(w->top_p, f->top_p, sizeof f->top_p);
  memcpy(w->min_p, f->min_p, sizeof f->min_p);
}
/* w's first n filters to the device's parameter arrays. */
static void upload_filters(const dev *d, const api_bufs *b, const rows *w, int n) {
  CU_CHECK(d->cu, cuMemcpyHtoD(b->K, w->top_k, 4 * (size_t)n));
  CU_CHECK(d->cu, cuMemcpyHtoD(b->P, w->top_p, 4 * (size_t)n));
  CU_CHECK(d->cu, cuMemcpyHtoD(b->MP, w->min_p, 4 * (size_t)n));
}

/* kl_sample's stats now and the calls it counted since `before`: one on
 * `path` (0 one-shot, 1 NCCL), and `gathered` of them in sample_gathered;
 * -1: 0 or 1, as the device found (the shards with filters sample whole only
 * the rows their candidates cannot decide, and count the call if any). The
 * caller has synchronized. */
static void counted(kl_ctx *ctx, const kl_stats *before, int path, int gathered, const char *what) {
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(ctx, &st);
  CHECK(path ? st.nccl == before->nccl + 1 : st.oneshot == before->oneshot + 1,
        "%s: not one call on the %s path", what, path ? "NCCL" : "one-shot");
  const uint64_t more = st.sample_gathered - before->sample_gathered;
  CHECK(gathered < 0 ? more <= 1 : more == (uint64_t)gathered,
        "%s: %llu gathered calls, want %d more than %llu", what,
        (unsigned long long)st.sample_gathered, gathered,
        (unsigned long long)before->sample_gathered);
  if (gathered < 0) printf("%s: %s\n", what, more ? "rows sampled whole" : "every row decided");
}

/* sample_gathered for calls with filters, exactly where it is known. Rows with
 * top-k alone are decided by the shards' candidates in this spec (0): a part
 * has one chunk a thread, so at most 8 x 8 keys reach its threshold, and the
 * merge sees 3 x 8, both far below the caps past which a row goes whole (a
 * spec with more columns a thread may send a row of many ties whole). A row
 * whose top-p alone keeps more columns than the candidates hold cannot be
 * decided by them (1: the call sampled a row whole, in the kernel that
 * merged it); such a call twice counts twice. Min-p alone (1e-6, which
 * keeps past the candidates, and 0.05) is checked row by row, its count
 * only reported. The rows' own filters are put back after. */
static void api_gathered(dev *d, kl_ctx *ctx, const api_bufs *b, rows *w) {
  const int n = 16;
  const filters kept = keep_filters(w);
  kl_sampling all = api_params(b);
  for (int pass = 0; pass < 5; pass++) {
    const int top_p = pass == 1 || pass == 2, min_p = pass >= 3;
    for (int i = 0; i < n; i++)
      w->top_k[i] = pass ? 0 : 1 + i % w->topk, w->top_p[i] = top_p ? 0.99999f : 1.f,
      w->min_p[i] = min_p ? (pass == 3 ? 1e-6f : 0.05f) : 0.f;
    upload_filters(d, b, w, n);
    kl_stats st = KL_STATS_INIT;
    kl_ctx_stats(ctx, &st);
    const char *what = pass == 0 ? "kl_sample, top-k alone"
                       : top_p   ? "kl_sample, top-p 0.99999 alone"
                       : pass == 3 ? "kl_sample, min-p 1e-6 alone" : "kl_sample, min-p 0.05 alone";
    CHECK(api_call(ctx, b, &all, 0, n, NULL) == KLRT_OK, "%s: %s", what, kl_last_error());
    w->n = n, w->n_top = 0;
    api_results(d, w, b);
    int past = 0; /* rows whose kept set is past the candidates */
    for (int i = 0; i < n; i++) past |= check_row(d, w, i, what, 0) > w->topk;
    CHECK(!(top_p || pass == 3) || past, "%s: no row keeps more than %d columns: the test's rows changed", what,
          w->topk);
    /* min-p alone: the parts' best draws over what each may keep decide a
     * row unless the best of them falls between its part's threshold and
     * the row's */
    counted(ctx, &st, 0, pass == 0 ? 0 : top_p ? 1 : -1, what);
  }
  put_filters(w, &kept);
  upload_filters(d, b, w, n);
}

/* The marks a select step does not write itself go back to the sentinel,
 * so a mark left from an earlier step can never equal a later one's (the
 * counter wraps): a call with filters marks its n rows' parts, then two
 * kl_argmax steps, one of each parity, leave no mark set. */
static void api_marks(const dev *d, kl_ctx *ctx, const api_bufs *b) {
  const int n = 16;
  kl_sampling all = api_params(b);
  CHECK(api_call(ctx, b, &all, 0, n, NULL) == KLRT_OK, "kl_sample (marks): %s", kl_last_error());
  const gpu_marks m = gpu_marks_of(ctx);
  CU_CHECK(d->cu, cuCtxSynchronize());
  const size_t set = gpu_marks_set(d->cu, &m, NULL);
  CHECK(set >= (size_t)n * (size_t)m.per_token, "a call with filters of %d rows set %zu marks, "
        "want %zu at least", n, set, (size_t)n * (size_t)m.per_token);
  kl_stats st0 = KL_STATS_INIT, st = KL_STATS_INIT;
  kl_ctx_stats(ctx, &st0);
  for (int i = 0; i < 2; i++)
    CHECK(kl_argmax(ctx, (const void *)b->shard, (int64_t *)b->token, (float *)b->logprob, n,
                    NULL) == KLRT_OK, "kl_argmax (marks): %s", kl_last_error());
  kl_ctx_stats(ctx, &st);
  CHECK(st.oneshot == st0.oneshot + 2, "kl_argmax (marks): %llu one-shot steps, want 2",
        (unsigned long long)(st.oneshot - st0.oneshot));
  CU_CHECK(d->cu, cuCtxSynchronize());
  const size_t left = gpu_marks_set(d->cu, &m, NULL);
  CHECK(left == 0, "two kl_argmax steps after a call with filters left %zu marks set", left);
}

/* The shard sampler: calls with no filter array and no top-n, on both paths
 * and replayed from a graph with new seeds, against the reference with the
 * rows' filters off; then with the arrays (one-shot: the shards' candidates). */
static void api_shards(dev *d, kl_ctx *ctx, const api_bufs *b, rows *w, rng *r) {
  const int steps[] = {16, 20};
  const filters kept = keep_filters(w);
  for (int i = 0; i < 20; i++) w->top_k[i] = 0, w->top_p[i] = 1.f, w->min_p[i] = 0.f; /* what NULL means */
  kl_sampling bare = api_params(b);
  bare.top_k = NULL, bare.top_p = NULL, bare.min_p = NULL;
  kl_stats st = KL_STATS_INIT;
  w->n_top = 0;
  for (int k = 0; k < 2; k++) {
    kl_ctx_stats(ctx, &st);
    CHECK(api_call(ctx, b, &bare, 0, steps[k], NULL) == KLRT_OK, "kl_sample by the shards: %s",
          kl_last_error());
    CU_CHECK(d->cu, cuCtxSynchronize());
    counted(ctx, &st, k, 0, "kl_sample by the shards");
    w->n = steps[k];
    api_results(d, w, b);
    for (int i = 0; i < steps[k]; i++)
      check_row(d, w, i, k ? "kl_sample by the shards (NCCL)" : "kl_sample by the shards", 0);
  }
  kl_sampling all = api_params(b); /* the arrays given (rows' filters in them) */
  kl_ctx_stats(ctx, &st);
  CHECK(api_call(ctx, b, &all, 0, 16, NULL) == KLRT_OK, "kl_sample with filters: %s",
        kl_last_error());
  CU_CHECK(d->cu, cuCtxSynchronize());
  counted(ctx, &st, 0, -1, "kl_sample with filter arrays");
  /* done before the capture: a captured call is not ordered after the last
   * call's stream (nothing outside a graph can be), and this call's slowest
   * row, a radix search, would write its token over the replay's (seen under
   * compute-sanitizer's synccheck and initcheck, which slow it most) */
  CU_CHECK(d->cu, cuCtxSynchronize());
  CUstream s;
  CU_CHECK(d->cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  gpu_graph g;
  gpu_capture_begin(d->cu, s);
  kl_result rc = api_call(ctx, b, &bare, 0, 16, s);
  gpu_capture_end(d->cu, s, &g);
  CHECK(rc == KLRT_OK, "kl_sample by the shards captured: %s", kl_last_error());
  gpu_graph_instantiate(d->cu, &g);
  w->n = 16;
  for (int replay = 0; replay < 2; replay++) {
    for (int i = 0; i < 16; i++) w->seed[i] = rng_next(r);
    CU_CHECK(d->cu, cuMemcpyHtoDAsync(b->S, w->seed, 8 * 16, s));
    gpu_graph_replay(d->cu, &g, s, 1);
    api_results(d, w, b);
    for (int i = 0; i < 16; i++)
      check_row(d, w, i, replay ? "kl_sample by the shards, replayed again" : "kl_sample by the shards, replayed", 0);
  }
  gpu_graph_destroy(d->cu, &g);
  CU_CHECK(d->cu, cuStreamDestroy(s));
  put_filters(w, &kept);
}

static void api(dev *d) {
  kl_spec_list list;
  kl_err e;
  if (kl_spec_load_string("api", API_SPEC, strlen(API_SPEC), NULL, &list, &e)) {
    fprintf(stderr, "gpu_sample: %s\n", e.msg);
    exit(1);
  }
  load(d, &list.v[0]); /* the helper kernel, for the reference */
  kl_layout l;
  kl_layout_derive(&list.v[0], &l, &e);
  const int n = 20, steps[] = {16, 20}; /* max_tokens (one-shot), past it (NCCL path) */
  const long long v = list.v[0].vocab_size, padded = l.padded_vocab;
  rows w = {n, 8, KL_BF16, 8, v, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
  alloc_rows(&w);
  uint32_t *row = xmalloc(4 * (size_t)padded);
  uint16_t *shard = xmalloc(2 * (size_t)n * (size_t)padded);
  rng r = rng_for(77, 2);
  for (int i = 0; i < n; i++) {
    diff_fill_row(&r, KL_BF16, (int)rng_below(&r, (uint64_t)diff_row_kinds()), row, v, padded);
    for (long long c = 0; c < padded; c++) shard[(size_t)i * padded + c] = (uint16_t)row[c];
    for (long long c = 0; c < v; c++) w.bits[(size_t)i * v + c] = row[c];
    draw_params(&r, &w, i);
  }
  kl_config cfg = rank_config(0, 1, 0, NULL);
  kl_ctx *ctx = NULL;
  CHECK(kl_ctx_create_string(&ctx, API_SPEC, NULL, &cfg) == KLRT_OK, "create: %s", kl_last_error());
  if (!ctx) exit(1);
  api_bufs b = api_upload(d, &w, shard, padded);
  kl_sampling p = api_params(&b);
  /* each path with top-n logprobs, then without (greedy and plain-temperature
   * rows split over CTAs; past max_tokens their scratch grows) */
  for (int q = 0; q < 4; q++) {
    const int k = q % 2, n_top = q < 2 ? 8 : 0;
    kl_stats st0 = KL_STATS_INIT;
    kl_ctx_stats(ctx, &st0);
    CHECK(api_call(ctx, &b, &p, n_top, steps[k], NULL) == KLRT_OK, "kl_sample: %s", kl_last_error());
    CU_CHECK(d->cu, cuCtxSynchronize());
    /* top-n, or filter arrays past max_tokens: gathered; else the shards' candidates */
    counted(ctx, &st0, k, n_top || k ? 1 : -1, k ? "kl_sample past max_tokens" : "kl_sample");
    w.n = steps[k], w.n_top = n_top;
    api_results(d, &w, &b);
    for (int i = 0; i < steps[k]; i++)
      check_row(d, &w, i, k ? "kl_sample (NCCL)" : "kl_sample", n_top > 0);
  }
  api_host_tables(d, ctx, &b, &w, 16);
  api_shards(d, ctx, &b, &w, &r);
  api_gathered(d, ctx, &b, &w);
  api_marks(d, ctx, &b);
  w.n = 16, w.n_top = 8;
  api_misuse(ctx, &b, 16);
  /* captured: a replay reads the parameters as they are then (new seeds) */
  CUstream s;
  CU_CHECK(d->cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  gpu_graph g;
  gpu_capture_begin(d->cu, s);
  kl_result rc = api_call(ctx, &b, &p, 8, 16, s);
  gpu_capture_end(d->cu, s, &g);
  CHECK(rc == KLRT_OK, "kl_sample captured: %s", kl_last_error());
  gpu_graph_instantiate(d->cu, &g);
  for (int i = 0; i < 16; i++) w.seed[i] = rng_next(&r);
  CU_CHECK(d->cu, cuMemcpyHtoDAsync(b.S, w.seed, 8 * 16, s)); /* before the replay, in order */
  gpu_graph_replay(d->cu, &g, s, 1);
  api_results(d, &w, &b);
  for (int i = 0; i < 16; i++) check_row(d, &w, i, "kl_sample replayed", 1);
  gpu_graph_destroy(d->cu, &g);
  /* without top-n: split rows, whose counters each replay must leave at 0 */
  gpu_capture_begin(d->cu, s);
  rc = api_call(ctx, &b, &p, 0, 16, s);
  gpu_capture_end(d->cu, s, &g);
  CHECK(rc == KLRT_OK, "kl_sample captured without top-n: %s", kl_last_error());
  gpu_graph_instantiate(d->cu, &g);
  w.n_top = 0;
  for (int replay = 0; replay < 2; replay++) {
    for (int i = 0; i < 16; i++) w.seed[i] = rng_next(&r);
    CU_CHECK(d->cu, cuMemcpyHtoDAsync(b.S, w.seed, 8 * 16, s));
    gpu_graph_replay(d->cu, &g, s, 1);
    api_results(d, &w, &b);
    for (int i = 0; i < 16; i++) check_row(d, &w, i, "kl_sample replayed, split", 0);
  }
  w.n_top = 8;
  gpu_graph_destroy(d->cu, &g);
  CU_CHECK(d->cu, cuStreamDestroy(s));
  CHECK(kl_ctx_destroy(ctx) == KLRT_OK, "destroy: %s", kl_last_error());
  CUdeviceptr all[] = {b.shard, b.T, b.K, b.P, b.MP, b.S, b.O, b.token, b.logprob, b.top_index,
                       b.top_logprob};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) CU_CHECK(d->cu, cuMemFree(all[j]));
  free(row), free(shard), free_rows(&w);
  kl_spec_list_free(&list);
  printf("kl_sample (tp 1): one-shot, NCCL path, replayed, and its misuse\n");
}

/* ---- the distribution: kl_sample at tp 2 and 4, ranks as threads on one GPU ---- */

#define CHI_VOCAB 48
#define CHI_ROWS 64
#define CHI_CALLS 1600 /* 102,400 draws a case */

typedef struct chi_rank {
  int rank, tp;
  kl_group *group;
  CUcontext cuctx;
  const char *spec;
  sample_args a;
  int bare;     /* no filter arrays: the shard sampler */
  int gathered; /* a top-n logprob asked for: the gather and the row sampler */
  const float *logits; /* [CHI_VOCAB], every row */
  int64_t *tokens;     /* [CHI_CALLS + 1, CHI_ROWS]: the draws, then call 0 again */
  rank_result res;
} chi_rank;

/* One rank: CHI_CALLS calls of CHI_ROWS rows of the same logits, row i with
 * seed i + 1 and call j with offset j, so every draw has noise of its own. */
static void *chi_rank_main(void *arg) {
  chi_rank *r = arg;
  const kl_cu *cu = kl_cu_get(NULL);
  cu->cuCtxSetCurrent(r->cuctx);
  /* Everything allocated and uploaded before the (collective) creation: once
   * a peer is created its kernels may spin, waiting for this rank. */
  kl_info info = KL_INFO_INIT;
  kl_result rc = kl_spec_info_string(r->spec, NULL, &info);
  if (rc) return rank_result_set(&r->res, rc, ""), NULL;
  const size_t shard = (size_t)info.shard, rows = CHI_ROWS, calls = CHI_CALLS;
  float *x = xmalloc(4 * rows * shard), *T = xmalloc(4 * rows), *P = xmalloc(4 * rows),
        *MP = xmalloc(4 * rows);
  int32_t *K = xmalloc(4 * rows);
  uint64_t *S = xmalloc(8 * rows), *O = xmalloc(8 * calls * rows);
  for (size_t i = 0; i < rows; i++) {
    for (size_t j = 0; j < shard; j++) {
      const size_t c = (size_t)r->rank * shard + j;
      x[i * shard + j] = c < CHI_VOCAB ? r->logits[c] : 0.f; /* padding: never read */
    }
    T[i] = r->a.temperature, P[i] = r->a.top_p, MP[i] = r->a.min_p, K[i] = (int32_t)r->a.top_k;
    S[i] = i + 1;
  }
  for (size_t j = 0; j < calls * rows; j++) O[j] = j / rows;
  dev d = {cu, NULL, NULL, NULL, 0, 0};
  CUstream s; /* a stream of its own: the ranks' kernels wait for each other */
  CU_CHECK(cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUdeviceptr dx = up(&d, x, 4 * rows * shard), dT = up(&d, T, 4 * rows), dP = up(&d, P, 4 * rows),
              dMP = up(&d, MP, 4 * rows), dK = up(&d, K, 4 * rows), dS = up(&d, S, 8 * rows),
              dO = up(&d, O, 8 * calls * rows), dtok = up(&d, NULL, 8 * (calls + 1) * rows),
              dtop = up(&d, NULL, 8 * rows);
  /* A stream's first work waits for the GPU's work before it: were that a
   * peer's spinning grid, this rank's first step would wait out the poll
   * limit. So the stream works once before any peer spins. */
  CU_CHECK(cu, cuMemsetD8Async(dtok, 0, 8, s));
  CU_CHECK(cu, cuCtxSynchronize()); /* no kernel of this group runs yet */
  kl_config cfg = rank_config(r->rank, r->tp, 0, r->group);
  kl_ctx *ctx = NULL;
  rc = kl_ctx_create_string(&ctx, r->spec, NULL, &cfg);
  for (size_t j = 0; j <= calls && !rc; j++) {
    const size_t call = j < calls ? j : 0; /* the last: call 0's parameters again */
    kl_sampling p = KL_SAMPLING_INIT;
    p.temperature = (const float *)dT, p.top_k = (const int32_t *)dK;
    p.top_p = (const float *)dP, p.min_p = (const float *)dMP, p.seed = (const uint64_t *)dS;
    p.offset = (const uint64_t *)(dO + 8 * call * rows);
    if (r->bare) p.top_k = NULL, p.top_p = NULL, p.min_p = NULL;
    rc = kl_sample(ctx, (const void *)dx, &p, (int64_t *)(dtok + 8 * j * rows), NULL,
                   r->gathered ? (int64_t *)dtop : NULL, NULL, r->gathered, CHI_ROWS, (kl_stream)s);
  }
  CU_CHECK(cu, cuStreamSynchronize(s));
  if (rc) rank_result_set(&r->res, rc, "");
  if (!rc) down(&d, r->tokens, dtok, 8 * (calls + 1) * rows);
  CUdeviceptr all[] = {dx, dT, dP, dMP, dK, dS, dO, dtop};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) cu->cuMemFree(all[j]);
  free(x), free(T), free(P), free(MP), free(K), free(S), free(O);
  CU_CHECK(cu, cuStreamDestroy(s));
  if (ctx && (rc = kl_ctx_destroy(ctx)) != KLRT_OK && !r->res.rc) rank_result_set(&r->res, rc, "");
  return NULL;
}

/* Rank 0's draws of every rank's group at tp (tokens [CHI_CALLS + 1, CHI_ROWS]);
 * bare: with no filter arrays (a has none), by the shard sampler; gathered:
 * with a top-n logprob, by the gather and the row sampler; neither: by the
 * shards' candidates (and the rows they leave, from the staged rows). */
static int chi_draws(CUcontext cuctx, int tp, const float *logits, sample_args a, int bare,
                     int gathered, int64_t *tokens) {
  char spec[200];
  snprintf(spec, sizeof spec, "return { name = 'chi_tp%d', vocab_size = %d, tp = %d, "
           "dtype = 'fp32', max_tokens = %d, topk = 8 }", tp, CHI_VOCAB, tp, CHI_ROWS);
  kl_group *group;
  kl_group_create(&group, tp);
  chi_rank r[4];
  const size_t n = (size_t)(CHI_CALLS + 1) * CHI_ROWS;
  for (int i = 0; i < tp; i++)
    r[i] = (chi_rank){i, tp, group, cuctx, spec, a, bare, gathered, logits,
                      i ? xmalloc(8 * n) : tokens, {KLRT_OK, ""}};
  ranks_run(tp, chi_rank_main, r, sizeof *r);
  int ok = 1;
  for (int i = 0; i < tp; i++) {
    CHECK(r[i].res.rc == KLRT_OK, "chi tp %d rank %d: %s: %s", tp, i, kl_result_name(r[i].res.rc),
          r[i].res.err);
    ok &= r[i].res.rc == KLRT_OK;
  }
  for (int i = 1; i < tp; i++) {
    CHECK(!ok || memcmp(r[i].tokens, tokens, 8 * n) == 0, "tp %d: rank %d drew other tokens than "
          "rank 0", tp, i);
    free(r[i].tokens);
  }
  kl_group_destroy(group);
  return ok;
}

/* The upper tail of chi-squared with df degrees of freedom (Wilson-Hilferty). */
static double chi2_sf(double x, int df) {
  const double k = df, z = (cbrt(x / k) - (1 - 2 / (9 * k))) / sqrt(2 / (9 * k));
  return 0.5 * erfc(z / sqrt(2.0));
}

/* The draws against the exact filtered softmax: none outside the kept set,
 * a chi-squared test over the kept columns (expected counts under 5 pooled). */
static void chi_check(const float *logits, sample_args a, const int64_t *tokens, int tp) {
  float t[CHI_VOCAB], e[CHI_VOCAB];
  unsigned char keep[CHI_VOCAB];
  const float m = sample_tempered(logits, CHI_VOCAB, a.temperature, t);
  for (int c = 0; c < CHI_VOCAB; c++) e[c] = expf(t[c] - m);
  sample_keep(t, m, CHI_VOCAB, &a, e, keep);
  double prob[CHI_VOCAB], sum = 0;
  long long seen[CHI_VOCAB] = {0}, outside = 0;
  const long long n = (long long)CHI_CALLS * CHI_ROWS;
  for (int c = 0; c < CHI_VOCAB; c++) sum += prob[c] = keep[c] ? exp((double)t[c] - m) : 0;
  for (long long i = 0; i < n; i++) {
    const int64_t c = tokens[i];
    if (c < 0 || c >= CHI_VOCAB || !keep[c]) outside++;
    else seen[c]++;
  }
  double chi = 0, pool_e = 0, pool_o = 0;
  int bins = 0;
  for (int c = 0; c < CHI_VOCAB; c++) {
    if (!keep[c]) continue;
    const double want = (double)n * prob[c] / sum;
    if (want < 5) {
      pool_e += want, pool_o += (double)seen[c];
      continue;
    }
    chi += ((double)seen[c] - want) * ((double)seen[c] - want) / want, bins++;
  }
  if (pool_e > 0) chi += (pool_o - pool_e) * (pool_o - pool_e) / pool_e, bins++;
  const double p = bins > 1 ? chi2_sf(chi, bins - 1) : 1.0;
  CHECK(outside == 0 && p > 1e-6, "tp %d (T %g, k %lld, p %g, min_p %g): %lld draws outside the "
        "kept set, chi2 %.1f over %d bins, p-value %.2g", tp, (double)a.temperature,
        (long long)a.top_k, (double)a.top_p, (double)a.min_p, outside, chi, bins, p);
  CHECK(memcmp(tokens, tokens + n, 8 * CHI_ROWS) == 0,
        "tp %d: the same seeds and offsets drew other tokens", tp);
  printf("chi-squared, tp %d, T %g k %lld p %g min_p %g: %lld draws, %d bins, chi2 %.1f, "
         "p-value %.3g\n", tp, (double)a.temperature, (long long)a.top_k, (double)a.top_p,
         (double)a.min_p, n, bins, chi, p);
}

static void distribution(const dev *d) {
  CUcontext cuctx;
  CU_CHECK(d->cu, cuCtxGetCurrent(&cuctx));
  float logits[CHI_VOCAB];
  rng r = rng_for(4242, 3);
  for (int c = 0; c < CHI_VOCAB; c++) logits[c] = (float)(3.0 * rng_unit(&r) - 1.5 * (c % 7 == 0));
  const sample_args cases[] = {{1.f, 0, 1.f, 0.f},   {0.6f, 0, 1.f, 0.f},  {0.7f, 5, 1.f, 0.f},
                               {1.3f, 0, 0.8f, 0.f}, {1.f, 0, 1.f, 0.1f}, {0.9f, 8, 0.9f, 0.02f}};
  const size_t n = (size_t)(CHI_CALLS + 1) * CHI_ROWS;
  int64_t *t2 = xmalloc(8 * n), *t4 = xmalloc(8 * n);
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    /* tp 4 draws by the shards (without filter arrays where the case has
     * none), tp 2 from the gathered rows */
    const sample_args *a = &cases[k];
    const int bare = a->top_k == 0 && a->top_p == 1.f && a->min_p == 0.f;
    if (!chi_draws(cuctx, 2, logits, *a, 0, 1, t2) || !chi_draws(cuctx, 4, logits, *a, bare, 0, t4))
      continue;
    chi_check(logits, *a, t2, 2);
    chi_check(logits, *a, t4, 4);
    /* the noise is keyed by the column: any split, either sampler, draws the same */
    CHECK(memcmp(t2, t4, 8 * n) == 0, "case %zu: tp 2 gathered and tp 4 by the shards%s drew "
          "differently", k, bare ? "" : "' candidates");
  }
  free(t2), free(t4);
}

int main(int argc, char **argv) {
  if (argc < 2 || argc > 4 || (argc > 2 && atoi(argv[2]) < 1) ||
      (argc > 3 && strcmp(argv[3], "--no-distribution"))) {
    fprintf(stderr, "usage: gpu_sample SPECS [ROWS [--no-distribution]]\n");
    return 2;
  }
  setvbuf(stdout, NULL, _IOLBF, 0); /* a line per part as it ends: progress */
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", "32", 1); /* ranks share the GPU (distribution) */
  dev d = {gpu_require(1), NULL, NULL, NULL, 0, 0};
  kl_spec_list list;
  gpu_one_device(d.cu, argv[1], &list);
  const int n = argc > 2 ? atoi(argv[2]) : 96;
  for (int k = 0; k < list.n; k++) {
    if (list.v[k].topk == 0) continue;
    load(&d, &list.v[k]);
    spec_rows(&d, &list.v[k], n, 1000u + (unsigned)k);
    printf("%s: %d rows of %lld\n", list.v[k].name, n, (long long)list.v[k].vocab_size);
  }
  kl_spec_list_free(&list);
  api(&d);
  if (argc < 4) distribution(&d); /* under compute-sanitizer: too many draws */
  return check_done();
}
