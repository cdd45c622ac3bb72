/* templates/sample.cu.tmpl on the GPU: kl_sample's row sampler, as the JIT
 * compiles it for each spec of a file (specs with a top-k), on gathered rows
 * of every kind gpu_diff draws (ties, -Inf, NaN, all equal, huge values),
 * with random parameters per row (greedy, each filter alone and together,
 * edges, and rows outside the domain), against the sampler's C reference
 * (gpu_diff/diff_sample.c). The reference takes the noise and top-p's expf
 * from the device (helper kernels appended to the spec's source), so
 * tokens must agree bit for bit; logprobs within 2 ulp.
 * Then kl_sample itself on one rank: eager, in a replayed CUDA graph (which
 * reads the parameters of the replay), and the calls it must refuse.
 *   gpu_sample SPECS [ROWS]   (exit 77 without a GPU) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "gpu_diff/diff.h"
#include "gpu_diff/diff_sample.h"
#include "gpu_util.h"
#include "kl_abi.h"
#include "klrt/klrt.h"

/* Appended to the spec's source ("%s": its name): one row's noise and
 * expf(t - m), as the sampler computes them. */
static const char aux[] =
    "\nusing namespace kl_%s;\n"
    "#line 1 \"gpu_sample_kernels\"\n"
    "extern \"C\" __global__ void row_aux(const float *t, float m, u64 seed, u64 offset,\n"
    "                                     long long n, float *e, float *g) {\n"
    "  for (long long c = blockIdx.x * 256ll + threadIdx.x; c < n; c += gridDim.x * 256ll) {\n"
    "    e[c] = expf(t[c] - m);\n"
    "    g[c] = gumbel(noise_word(seed, offset, (u64)c));\n"
    "  }\n"
    "}\n";

typedef struct dev {
  const kl_cu *cu;
  CUfunction sample, aux;
} dev;

typedef struct rows {
  int n, n_top, out_dtype;
  long long vocab;
  uint32_t *bits;  /* [n, vocab] gathered element bits */
  float *temperature, *top_p, *min_p;
  long long *top_k;
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
  const long long v = w->vocab, cap = w->n_top;
  const long long ks[] = {0, 0, 0, 1, 2, 3, cap, cap, v, v + 5, cap + 1, v - 1};
  w->temperature[i] = PICK(r, temps);
  w->top_k[i] = PICK(r, ks);
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

/* The domain: as check_sampling_args with max_top_k the spec's topk (n_top here). */
static int valid(const rows *w, int i) {
  const long long k = w->top_k[i] >= w->vocab ? 0 : w->top_k[i];
  return w->temperature[i] >= 0.f && isfinite(w->temperature[i]) && w->top_p[i] > 0.f &&
         w->top_p[i] <= 1.f && w->min_p[i] >= 0.f && w->min_p[i] <= 1.f && k >= 0 && k <= w->n_top;
}

static CUdeviceptr up(const dev *d, const void *p, size_t bytes) {
  CUdeviceptr x;
  CU_CHECK(d->cu, cuMemAlloc(&x, bytes ? bytes : 8));
  if (p && bytes) CU_CHECK(d->cu, cuMemcpyHtoD(x, p, bytes));
  return x;
}

static void down(const dev *d, void *p, CUdeviceptr x, size_t bytes) {
  CU_CHECK(d->cu, cuCtxSynchronize());
  CU_CHECK(d->cu, cuMemcpyDtoH(p, x, bytes));
  CU_CHECK(d->cu, cuMemFree(x));
}

/* The sampler over all rows, as kl_sample launches it (fewer CTAs than rows:
 * each CTA takes several). */
static void run_kernel(const dev *d, rows *w) {
  const size_t n = (size_t)w->n, eb = w->out_dtype == KL_FP32 ? 4 : 2;
  void *packed = malloc(n * (size_t)w->vocab * eb);
  for (size_t j = 0; j < n * (size_t)w->vocab; j++)
    if (eb == 4) ((uint32_t *)packed)[j] = w->bits[j];
    else ((uint16_t *)packed)[j] = (uint16_t)w->bits[j];
  kl_sample_args a = {0};
  CUdeviceptr lg = up(d, packed, n * (size_t)w->vocab * eb), T = up(d, w->temperature, 4 * n),
              K = up(d, w->top_k, 8 * n), P = up(d, w->top_p, 4 * n), MP = up(d, w->min_p, 4 * n),
              S = up(d, w->seed, 8 * n), O = up(d, w->offset, 8 * n), tok = up(d, NULL, 8 * n),
              lp = up(d, NULL, 4 * n), ti = up(d, NULL, 8 * n * (size_t)w->n_top),
              tl = up(d, NULL, 4 * n * (size_t)w->n_top);
  free(packed);
  a.logits = (const void *)lg, a.temperature = (const float *)T, a.top_k = (const long long *)K;
  a.top_p = (const float *)P, a.min_p = (const float *)MP;
  a.seed = (const unsigned long long *)S, a.offset = (const unsigned long long *)O;
  a.token = (long long *)tok, a.logprob = (float *)lp;
  a.top_index = (long long *)ti, a.top_logprob = (float *)tl;
  a.tokens = w->n, a.n_top = w->n_top;
  void *args[] = {&a};
  const unsigned grid = (unsigned)(w->n / 3 + 1);
  CU_CHECK(d->cu, cuLaunchKernel(d->sample, grid, 1, 1, 256, 1, 1, 0, NULL, args, NULL));
  down(d, w->token, tok, 8 * n);
  down(d, w->logprob, lp, 4 * n);
  down(d, w->top_index, ti, 8 * n * (size_t)w->n_top);
  down(d, w->top_logprob, tl, 4 * n * (size_t)w->n_top);
  CUdeviceptr all[] = {lg, T, K, P, MP, S, O};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) CU_CHECK(d->cu, cuMemFree(all[j]));
}

static int close_to(float got, float want) {
  if (isnan(want)) return isnan(got);
  if (got == want) return 1; /* infinities too */
  return fabsf(got - want) <= 2 * (nextafterf(fabsf(want), INFINITY) - fabsf(want)) + 1e-30f;
}

/* Row i against the reference, with the device's noise and expf. */
static void check_row(const dev *d, const rows *w, int i, const char *name) {
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
  const int64_t want = ok ? sample_token(t, m, v, &a, e, g, NULL) : -1;
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
  w->top_k = xmalloc(8 * n), w->seed = xmalloc(8 * n), w->offset = xmalloc(8 * n);
  w->token = xmalloc(8 * n), w->logprob = xmalloc(4 * n);
  w->top_index = xmalloc(8 * n * (size_t)w->n_top);
  w->top_logprob = xmalloc(4 * n * (size_t)w->n_top);
}

static void free_rows(rows *w) {
  void *all[] = {w->bits, w->temperature, w->top_p, w->min_p, w->top_k, w->seed, w->offset,
                 w->token, w->logprob, w->top_index, w->top_logprob};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) free(all[j]);
}

static void spec_rows(const dev *d, const kl_spec *s, int n, uint64_t seed) {
  rows w = {n, s->topk, s->out_dtype, s->vocab_size, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, NULL, NULL, NULL};
  rng r = rng_for(seed, 1);
  alloc_rows(&w);
  for (int i = 0; i < n; i++) {
    diff_fill_row(&r, w.out_dtype, (int)rng_below(&r, (uint64_t)diff_row_kinds()),
                  w.bits + (size_t)i * (size_t)w.vocab, w.vocab, w.vocab);
    draw_params(&r, &w, i);
  }
  run_kernel(d, &w);
  for (int i = 0; i < n; i++) check_row(d, &w, i, s->name);
  free_rows(&w);
}

/* The spec's rendered source with the helper kernel, loaded. */
static void load(dev *d, const kl_spec *s) {
  kl_layout l;
  kl_err e;
  char *src = NULL;
  if (kl_layout_derive(s, &l, &e) || kl_render(s, &l, NULL, &src, &e)) {
    fprintf(stderr, "gpu_sample: %s\n", e.msg);
    exit(1);
  }
  const size_t n = strlen(src) + sizeof aux + strlen(s->name);
  char *all = xmalloc(n);
  const size_t head = strlen(src);
  memcpy(all, src, head);
  snprintf(all + head, n - head, aux, s->name);
  free(src);
  CUmodule mod;
  if (gpu_load_source(d->cu, all, "gpu_sample", &mod)) exit(1);
  free(all);
  char entry[KL_NAME_MAX + 32];
  kl_entry_name(s, "sample", entry, sizeof entry);
  CU_CHECK(d->cu, cuModuleGetFunction(&d->sample, mod, entry));
  CU_CHECK(d->cu, cuModuleGetFunction(&d->aux, mod, "row_aux"));
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
                    up(d, w->top_k, 8 * n), up(d, w->top_p, 4 * n), up(d, w->min_p, 4 * n),
                    up(d, w->seed, 8 * n), up(d, w->offset, 8 * n), up(d, NULL, 8 * n),
                    up(d, NULL, 4 * n), up(d, NULL, 8 * top), up(d, NULL, 4 * top)};
}

static kl_sampling api_params(const api_bufs *b) {
  return (kl_sampling){(const float *)b->T, (const int64_t *)b->K, (const float *)b->P,
                       (const float *)b->MP, (const uint64_t *)b->S, (const uint64_t *)b->O};
}

static kl_result api_call(kl_ctx *ctx, const api_bufs *b, const kl_sampling *p, int n_top, int n,
                          CUstream s) {
  return kl_sample(ctx, (const void *)b->shard, p, (int64_t *)b->token, (float *)b->logprob,
                   (int64_t *)b->top_index, (float *)b->top_logprob, n_top, n, (kl_stream)s);
}

static void api_results(const dev *d, rows *w, const api_bufs *b) {
  const size_t n = (size_t)w->n, top = n * (size_t)w->n_top;
  CU_CHECK(d->cu, cuCtxSynchronize());
  CU_CHECK(d->cu, cuMemcpyDtoH(w->token, b->token, 8 * n));
  CU_CHECK(d->cu, cuMemcpyDtoH(w->logprob, b->logprob, 4 * n));
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
  kl_sampling p = api_params(b), none = {0};
  float host_t[1] = {1.f};
  kl_sampling host = p, over = p;
  host.temperature = host_t;
  over.top_p = (const float *)b->logprob; /* a parameter array on an output */
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
  refused(api_call(ctx, b, &p, 8, 0, NULL), "tokens is 0");
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
  rows w = {n, 8, KL_BF16, v, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
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
  kl_config cfg = KL_CONFIG_INIT;
  cfg.nranks = 1;
  kl_ctx *ctx = NULL;
  CHECK(kl_ctx_create_string(&ctx, API_SPEC, NULL, &cfg) == KLRT_OK, "create: %s", kl_last_error());
  if (!ctx) exit(1);
  api_bufs b = api_upload(d, &w, shard, padded);
  kl_sampling p = api_params(&b);
  for (int k = 0; k < 2; k++) {
    kl_stats st0 = KL_STATS_INIT, st1 = KL_STATS_INIT;
    kl_ctx_stats(ctx, &st0);
    CHECK(api_call(ctx, &b, &p, 8, steps[k], NULL) == KLRT_OK, "kl_sample: %s", kl_last_error());
    kl_ctx_stats(ctx, &st1);
    CHECK(k ? st1.nccl == st0.nccl + 1 : st1.oneshot == st0.oneshot + 1,
          "kl_sample of %d rows took the %s path", steps[k], k ? "one-shot" : "NCCL");
    w.n = steps[k];
    api_results(d, &w, &b);
    for (int i = 0; i < steps[k]; i++) check_row(d, &w, i, k ? "kl_sample (NCCL)" : "kl_sample");
  }
  w.n = 16;
  api_misuse(ctx, &b, 16);
  /* captured: a replay reads the parameters as they are then (new seeds) */
  CUstream s;
  CU_CHECK(d->cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CUgraph g;
  CUgraphExec ge;
  CU_CHECK(d->cu, cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  kl_result rc = api_call(ctx, &b, &p, 8, 16, s);
  CU_CHECK(d->cu, cuStreamEndCapture(s, &g));
  CHECK(rc == KLRT_OK, "kl_sample captured: %s", kl_last_error());
  CU_CHECK(d->cu, cuGraphInstantiate(&ge, g, 0));
  for (int i = 0; i < 16; i++) w.seed[i] = rng_next(&r);
  CU_CHECK(d->cu, cuMemcpyHtoDAsync(b.S, w.seed, 8 * 16, s)); /* before the replay, in order */
  CU_CHECK(d->cu, cuGraphLaunch(ge, s));
  api_results(d, &w, &b);
  for (int i = 0; i < 16; i++) check_row(d, &w, i, "kl_sample replayed");
  CU_CHECK(d->cu, cuGraphExecDestroy(ge));
  CU_CHECK(d->cu, cuGraphDestroy(g));
  CU_CHECK(d->cu, cuStreamDestroy(s));
  CHECK(kl_ctx_destroy(ctx) == KLRT_OK, "destroy: %s", kl_last_error());
  CUdeviceptr all[] = {b.shard, b.T, b.K, b.P, b.MP, b.S, b.O, b.token, b.logprob, b.top_index,
                       b.top_logprob};
  for (size_t j = 0; j < sizeof all / sizeof *all; j++) CU_CHECK(d->cu, cuMemFree(all[j]));
  free(row), free(shard), free_rows(&w);
  kl_spec_list_free(&list);
  printf("kl_sample (tp 1): one-shot, NCCL path, replayed, and its misuse\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: gpu_sample SPECS [ROWS]\n");
    return 2;
  }
  dev d = {gpu_require(1), NULL, NULL};
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
  return check_done();
}
