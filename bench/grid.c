/* klbench --grid (grid.h): every kernel at every size on GPU 0 (tp 1), each
 * cell's figure beside its roofline, the noise reference and FlashInfer's
 * kernels on the same rows.
 *
 * For each row width and dtype ("setting") klbench makes three specs of
 * width columns at tp 1, unpadded (a rank row is the row): topk 8
 * (kl_gather, kl_argmax, kl_topk k 8), topk 64 (kl_topk k 64, kl_sample)
 * and the epilogue's (fp32 out, soft-cap 30, engine numerics), each with
 * max_tokens the most tokens measured, or the most its one-shot buffers
 * allow. Their kernels are compiled first, all
 * settings at once on every CPU, into the JIT cache the contexts then load
 * from. Contexts take the runtime's own dispatch (the path each call took is
 * reported). Per token count ("cell"), every variant runs once, outside a
 * graph, and the results are checked against each other; then all are
 * timed as klbench's other tables are (measure.c: captured `steps` deep,
 * replayed in turn), with the steps a graph holds cut so that its slowest
 * variant's graph takes about GRAPH_US. The run starts with the copy
 * bandwidth (a large device-to-device cudaMemcpyAsync) and the launch floor
 * (floor.c's empty kernel, PDL, chained in a graph), which make every
 * cell's roofline: bytes / bandwidth + floor. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "floor.h"
#include "klbench.h"
#include "rt.h"

#define GRAPH_US 20000.0  /* a graph of the slowest variant in a cell */
#define MIN_STEPS 5
#define COPY_BYTES (512ull << 20) /* each side of the bandwidth copy: far beyond L2 */
#define COPY_STEPS 10
#define FLOOR_CTAS 20 /* klfloor's default grid */
#define FLOOR_THREADS 128
#define TEMPERATURE 0.7f
#define TOP_K 50
#define TOP_P 0.9f
#define MIN_P 0.1f
#define SOFTCAP 30.0f

enum spec_kind { S_SEL, S_SAMPLE, S_EPI, NSPECS };
static const char *const spec_extra[NSPECS] = {
    "topk = 8", "topk = 64", "out_dtype = 'fp32', softcap = 30.0, numerics = 'engine'"};
static const char *const spec_suffix[NSPECS] = {"k8", "k64", "epi"};

/* The variants of a cell: klgen's kernels (one a grid kernel, same order),
 * the noise reference, FlashInfer's. */
enum {
  V_NOISE = G_NKERNELS, V_FI_TOP1, V_FI_TOPK8, V_FI_TOPK64, V_FI_PLAIN, V_FI_FILTERED, V_FI_MINP,
  NV
};
static const char *const fi_names[NV] = {[V_FI_TOP1] = "top_k(k=1)", [V_FI_TOPK8] = "top_k(k=8)",
                                         [V_FI_TOPK64] = "top_k(k=64)",
                                         [V_FI_PLAIN] = "sampling_from_logits",
                                         [V_FI_FILTERED] = "top_k_top_p_sampling_from_logits",
                                         [V_FI_MINP] = "min_p_sampling_from_probs"};
/* FlashInfer's variant for each grid kernel (0: none). */
static const int fi_of[G_NKERNELS] = {
    [G_ARGMAX] = V_FI_TOP1,   [G_TOPK8] = V_FI_TOPK8, [G_TOPK64] = V_FI_TOPK64,
    [G_GREEDY] = V_FI_TOP1,   [G_PLAIN] = V_FI_PLAIN, [G_FILTERED] = V_FI_FILTERED,
    [G_MINP] = V_FI_MINP};

typedef struct setting {
  int width, elem;
  kl_dtype dtype;
  char lua[NSPECS][400];
  kl_spec spec[NSPECS];
  kl_layout lay[NSPECS];
  char *src[NSPECS];
} setting;

/* One cell's results, for the report. */
typedef struct cell {
  int tokens, steps;
  double us[NV];          /* NAN: not measured */
  char path[G_NKERNELS][8]; /* "oneshot", "nccl", "" */
  char check[G_NKERNELS][200]; /* "" when the checks pass */
} cell;

typedef struct grid {
  bench *b;
  rank R;
  setting set[GRID_MAX_WIDTHS * 2];
  int nset, max_rows;
  double copy_gbps, floor_us;
  char cache_dir[4096];
  fi_lib fi;
  int have_fi;
  char fi_note[600];
  grid_noise noise;
  CUmodule floor_mod;
  CUfunction floor_fn;
  void *copy_src, *copy_dst;
  /* the setting being measured */
  setting *s;
  kl_ctx *ctx[NSPECS];
  kl_fi *fih;
  unsigned char *host_in;
  void *in, *out, *out32, *fi_val;
  int64_t *idx, *topk_idx[2], *token[5], *fi_idx; /* token: greedy, plain, filtered, minp, noise */
  float *val, *topk_val[2], *lse[2];
  int32_t *fi_token[3];  /* plain, filtered, minp */
  /* per-row parameters, max_rows each */
  float *warm, *cold, *top_p, *min_p;
  int32_t *top_k;
  uint64_t *seed, *offset;
  cell cells[MAX_TOK];
  FILE *csv;
  int failed;
} grid;

/* ---------- specs and their kernels ---------- */

/* The spec of a setting, kind k, holding max_tokens rows; 0 if it loads and
 * its layout fits. */
static int make_spec(setting *s, int k, int max_tokens, kl_err *e) {
  snprintf(s->lua[k], sizeof s->lua[k],
           "return { name = 'grid_w%d_%s_%s', vocab_size = %d, padded_vocab = %d, tp = 1, "
           "dtype = '%s', max_tokens = %d, %s }",
           s->width, kl_dtype_name(s->dtype), spec_suffix[k], s->width, s->width,
           kl_dtype_name(s->dtype), max_tokens, spec_extra[k]);
  kl_spec_list list;
  /* the runtime's own chunk name: the same source it renders from this string */
  if (kl_spec_load_string("<spec string>", s->lua[k], strlen(s->lua[k]), NULL, &list, e)) return -1;
  s->spec[k] = list.v[0];
  kl_spec_list_free(&list);
  return kl_layout_derive(&s->spec[k], &s->lay[k], e);
}

/* The most rows up to want that the spec's one-shot buffers hold. */
static void fit_spec(setting *s, int k, int want) {
  kl_err e;
  if (!make_spec(s, k, want, &e)) return;
  int lo = 1, hi = want; /* lo fits, hi does not */
  if (make_spec(s, k, lo, &e)) die("grid spec", e.msg);
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    if (make_spec(s, k, mid, &e)) hi = mid;
    else lo = mid;
  }
  if (make_spec(s, k, lo, &e)) die("grid spec", e.msg);
}

static void make_settings(grid *g) {
  bench *b = g->b;
  for (int w = 0; w < b->go.nwidths; w++)
    for (int d = 0; d <= KL_FP32; d++) {
      if (!(b->go.dtypes & (1u << d))) continue;
      setting *s = &g->set[g->nset++];
      s->width = b->go.widths[w], s->dtype = (kl_dtype)d, s->elem = d == KL_FP32 ? 4 : 2;
      for (int k = 0; k < NSPECS; k++) {
        kl_err e;
        fit_spec(s, k, g->max_rows);
        if (kl_render(&s->spec[k], &s->lay[k], b->templates, &s->src[k], &e)) die("render", e.msg);
      }
    }
}

typedef struct job {
  grid *g;
  int next, n, hits;
  const setting *set[GRID_MAX_WIDTHS * 2 * NSPECS];
  int kind[GRID_MAX_WIDTHS * 2 * NSPECS];
  pthread_mutex_t mu;
  char error[600];
} job;

static void *compile_worker(void *arg) {
  job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->mu);
    int i = j->next++;
    pthread_mutex_unlock(&j->mu);
    if (i >= j->n) return NULL;
    const setting *s = j->set[i];
    int k = j->kind[i], hit = 0;
    kl_binary bin;
    kl_err e;
    int rc = kl_jit_cubin(s->src[k], s->spec[k].name, j->g->b->arch, j->g->cache_dir, &bin, &hit,
                          &e);
    pthread_mutex_lock(&j->mu);
    if (rc && !j->error[0])
      snprintf(j->error, sizeof j->error, "%s: %.500s", s->spec[k].name, e.msg);
    j->hits += hit;
    pthread_mutex_unlock(&j->mu);
    if (!rc) kl_binary_free(&bin);
  }
}

/* Every setting's kernels into the JIT cache, on every CPU at once: the
 * contexts then load them instead of compiling one after another. */
static void precompile(grid *g) {
  job *j = calloc(1, sizeof *j);
  if (!j) die("klbench", "out of memory");
  j->g = g;
  pthread_mutex_init(&j->mu, NULL);
  for (int i = 0; i < g->nset; i++)
    for (int k = 0; k < NSPECS; k++) j->set[j->n] = &g->set[i], j->kind[j->n++] = k;
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nth = cpus < 1 ? 1 : cpus > j->n ? j->n : (int)cpus;
  pthread_t th[256];
  if (nth > 256) nth = 256;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0; i < nth; i++) pthread_create(&th[i], NULL, compile_worker, j);
  for (int i = 0; i < nth; i++) pthread_join(th[i], NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (j->error[0]) die("JIT", j->error);
  printf("kernels: %d sources, %d from the JIT cache (%s), %.0f s on %d threads\n", j->n, j->hits,
         g->cache_dir, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
         nth);
  pthread_mutex_destroy(&j->mu);
  free(j);
}

/* The JIT cache directory: the runtime's, else a fresh one under /tmp. */
static int usable(const char *dir) {
  char why[4400];
  int fd = kl_cache_open(dir, why, sizeof why);
  if (fd < 0) return 0;
  close(fd);
  return 1;
}

static void cache_dir(grid *g) {
  if (kl_cache_dir(NULL, g->cache_dir, sizeof g->cache_dir) && usable(g->cache_dir)) return;
  snprintf(g->cache_dir, sizeof g->cache_dir, "/tmp/klbench-jit-XXXXXX");
  if (!mkdtemp(g->cache_dir) || !usable(g->cache_dir))
    die("JIT cache", "no usable directory (set KLGEN_CACHE_DIR)");
  fprintf(stderr, "klbench: note: JIT cache in %s (the runtime's own is not usable)\n",
          g->cache_dir);
}

static void load_module(grid *g, const char *src, const char *name, CUmodule *mod,
                        kl_binary *keep) {
  kl_binary bin;
  kl_err e;
  if (kl_nvrtc_compile(src, name, g->b->arch, &bin, &e)) die(name, e.msg);
  if (keep) {
    *keep = bin;
    return;
  }
  if (kl_cu_get(NULL)->cuModuleLoadData(mod, bin.data)) die(name, "cannot load");
  kl_binary_free(&bin);
}

/* The floor's and the noise reference's kernels. */
static void reference_kernels(grid *g) {
  load_module(g, floor_boundary_src, "klbench_floor", &g->floor_mod, NULL);
  if (kl_cu_get(NULL)->cuModuleGetFunction(&g->floor_fn, g->floor_mod, "kl_floor_empty"))
    die("floor", "no kl_floor_empty");
  char *src = grid_noise_source(g->set[0].src[S_SAMPLE], g->set[0].spec[S_SAMPLE].noise);
  kl_binary bin;
  load_module(g, src, "klbench_noise", NULL, &bin);
  free(src);
  grid_noise_load(&g->noise, &bin, g->max_rows, g->b->sm_count);
  kl_binary_free(&bin);
}

/* ---------- the run's references: bandwidth and floor ---------- */

static void copy_step(rank *R, int v, int T) {
  (void)v, (void)T;
  CUDA(cudaMemcpyAsync(R->grid->copy_dst, R->grid->copy_src, COPY_BYTES, cudaMemcpyDeviceToDevice,
                       R->s));
}

static void floor_step(rank *R, int v, int T) {
  (void)v, (void)T;
  if (floor_launch(R->grid->floor_fn, NULL, (CUstream)R->s, FLOOR_CTAS, FLOOR_THREADS, 1))
    die("floor", "launch failed");
}

static double timed(grid *g, step_fn fn, int steps) {
  int which = 0, keep = g->b->steps;
  double t;
  g->b->steps = steps;
  time_graphs(&g->R, fn, &which, 1, 1, g->b->replays, &t);
  g->b->steps = keep;
  return t;
}

static void references(grid *g) {
  CUDA(cudaMalloc(&g->copy_src, COPY_BYTES));
  CUDA(cudaMalloc(&g->copy_dst, COPY_BYTES));
  CUDA(cudaMemset(g->copy_src, 0x3c, COPY_BYTES));
  double us = timed(g, copy_step, COPY_STEPS); /* also brings the clocks up */
  us = timed(g, copy_step, COPY_STEPS);
  g->copy_gbps = 2.0 * (double)COPY_BYTES / (us * 1e3);
  g->floor_us = timed(g, floor_step, g->b->steps);
  CUDA(cudaFree(g->copy_src));
  CUDA(cudaFree(g->copy_dst));
}

/* ---------- a setting's contexts and buffers ---------- */

/* The per-row parameters, the same in every setting: T 0.7 (and 0), top_k
 * 50, top_p 0.9, min_p 0.1, seeds 1..rows, offsets 0. */
static void alloc_params(grid *g) {
  const size_t n = (size_t)g->max_rows;
  const float warm = TEMPERATURE, cold = 0.f, top_p = TOP_P, min_p = MIN_P;
  const int32_t top_k = TOP_K;
  const int64_t zero = 0;
  g->warm = bench_dev_fill(n, 4, &warm), g->cold = bench_dev_fill(n, 4, &cold);
  g->top_p = bench_dev_fill(n, 4, &top_p), g->min_p = bench_dev_fill(n, 4, &min_p);
  g->top_k = bench_dev_fill(n, 4, &top_k);
  g->offset = bench_dev_fill(n, 8, &zero);
  uint64_t *seeds = malloc(8 * n);
  if (!seeds) die("klbench", "out of memory");
  for (size_t i = 0; i < n; i++) seeds[i] = i + 1;
  g->seed = bench_dev(8 * n);
  CUDA(cudaMemcpy(g->seed, seeds, 8 * n, cudaMemcpyHostToDevice));
  free(seeds);
}

static void open_setting(grid *g, setting *s) {
  bench *b = g->b;
  g->s = s;
  kl_config cfg = {.size = sizeof(kl_config), .rank = 0, .nranks = 1, .device = 0,
                   .nccl = b->comms[0], .group = b->group, .cache_dir = g->cache_dir};
  for (int k = 0; k < NSPECS; k++) {
    kl_generated gen = bench_generated(&s->spec[k], &s->lay[k], s->src[k]);
    KL(kl_ctx_create_generated(&g->ctx[k], &gen, &cfg));
    kl_stats st = KL_STATS_INIT;
    kl_ctx_stats(g->ctx[k], &st);
    if (!st.cache_hit)
      fprintf(stderr, "klbench: note: %s was compiled again (not found in the JIT cache)\n",
              s->spec[k].name);
  }
  const size_t rows = (size_t)g->max_rows, w = (size_t)s->width, e = (size_t)s->elem;
  g->host_in = bench_logits(rows * w, s->dtype, 0x2545f491u ^ (uint32_t)s->width);
  g->in = bench_dev(rows * w * e);
  CUDA(cudaMemcpy(g->in, g->host_in, rows * w * e, cudaMemcpyHostToDevice));
  g->out = bench_dev(rows * w * e), g->out32 = bench_dev(rows * w * 4);
  g->idx = bench_dev(rows * 8), g->val = bench_dev(rows * 4);
  for (int i = 0; i < 2; i++) {
    size_t k = i ? 64 : 8;
    g->topk_idx[i] = bench_dev(rows * k * 8), g->topk_val[i] = bench_dev(rows * k * 4);
    g->lse[i] = bench_dev(rows * 4);
  }
  for (int i = 0; i < 5; i++) g->token[i] = bench_dev(rows * 8);
  g->fih = NULL;
  if (g->have_fi && g->fi.kl_fi_create(&g->fih, 0, (int)s->dtype, g->max_rows, s->width, 64)) {
    printf("FLASHINFER FAILED: %s: no FlashInfer columns for %d columns, %s\n",
           g->fi.kl_fi_error(), s->width, kl_dtype_name(s->dtype));
    g->fih = NULL, g->failed = 1;
  }
  if (g->fih) {
    g->fi_val = bench_dev(rows * 64 * e), g->fi_idx = bench_dev(rows * 64 * 8);
    for (int i = 0; i < 3; i++) g->fi_token[i] = bench_dev(rows * 4);
  }
}

static void close_setting(grid *g) {
  CUDA(cudaDeviceSynchronize());
  for (int k = 0; k < NSPECS; k++) {
    if (kl_ctx_status(g->ctx[k]) != KLRT_OK) die("device status", kl_last_error());
    kl_ctx_destroy(g->ctx[k]);
  }
  void *all[] = {g->in, g->out, g->out32, g->idx, g->val, g->topk_idx[0], g->topk_idx[1],
                 g->topk_val[0], g->topk_val[1], g->lse[0], g->lse[1], g->token[0], g->token[1],
                 g->token[2], g->token[3], g->token[4]};
  for (size_t i = 0; i < sizeof all / sizeof *all; i++) CUDA(cudaFree(all[i]));
  if (g->fih) {
    g->fi.kl_fi_destroy(g->fih);
    CUDA(cudaFree(g->fi_val));
    CUDA(cudaFree(g->fi_idx));
    for (int i = 0; i < 3; i++) CUDA(cudaFree(g->fi_token[i]));
  }
  free(g->host_in);
}

/* ---------- the variants ---------- */

static kl_result sample(grid *g, const float *t, int filter, int64_t *token, int T) {
  const int f = filter == G_FILTERED, m = filter == G_MINP;
  kl_sampling p = KL_SAMPLING_INIT;
  p.temperature = t, p.seed = g->seed, p.offset = g->offset;
  p.top_k = f ? g->top_k : NULL, p.top_p = f ? g->top_p : NULL, p.min_p = m ? g->min_p : NULL;
  return kl_sample(g->ctx[S_SAMPLE], g->in, &p, token, NULL, NULL, NULL, 0, T, g->R.s);
}

/* Runs variant v at T rows; NULL, or what failed. */
static const char *run_variant(grid *g, int v, int T) {
  kl_ctx *sel = g->ctx[S_SEL];
  kl_result r = KLRT_OK;
  int fr = 0;
  void *st = g->R.s;
  switch (v) {
    case G_GATHER: r = kl_gather(sel, g->in, g->out, T, st); break;
    case G_FUSED: r = kl_gather(g->ctx[S_EPI], g->in, g->out32, T, st); break;
    case G_ARGMAX: r = kl_argmax(sel, g->in, g->idx, g->val, T, st); break;
    case G_TOPK8: r = kl_topk(sel, g->in, g->topk_idx[0], g->topk_val[0], g->lse[0], T, st); break;
    case G_TOPK64:
      r = kl_topk(g->ctx[S_SAMPLE], g->in, g->topk_idx[1], g->topk_val[1], g->lse[1], T, st);
      break;
    case G_GREEDY: r = sample(g, g->cold, 0, g->token[0], T); break;
    case G_PLAIN: r = sample(g, g->warm, 0, g->token[1], T); break;
    case G_FILTERED: r = sample(g, g->warm, G_FILTERED, g->token[2], T); break;
    case G_MINP: r = sample(g, g->warm, G_MINP, g->token[3], T); break;
    case V_NOISE:
      if (grid_noise_launch(&g->noise, g->s->elem, g->in, T, g->s->width, g->warm, g->seed,
                            g->offset, g->token[4], (CUstream)st))
        return "the noise reference's launch failed";
      break;
    case V_FI_TOP1: fr = g->fi.kl_fi_top_k(g->fih, g->in, T, 1, g->fi_val, g->fi_idx, st); break;
    case V_FI_TOPK8: fr = g->fi.kl_fi_top_k(g->fih, g->in, T, 8, g->fi_val, g->fi_idx, st); break;
    case V_FI_TOPK64: fr = g->fi.kl_fi_top_k(g->fih, g->in, T, 64, g->fi_val, g->fi_idx, st); break;
    case V_FI_PLAIN:
      fr = g->fi.kl_fi_plain(g->fih, g->in, T, g->warm, g->seed, g->offset, g->fi_token[0], st);
      break;
    case V_FI_FILTERED:
      fr = g->fi.kl_fi_filtered(g->fih, g->in, T, g->warm, g->top_k, g->top_p, g->seed,
                                g->offset, g->fi_token[1], st);
      break;
    case V_FI_MINP:
      fr = g->fi.kl_fi_min_p(g->fih, g->in, T, g->warm, g->min_p, g->seed, g->offset,
                             g->fi_token[2], st);
      break;
  }
  if (r != KLRT_OK) return kl_last_error();
  if (fr) return g->fi.kl_fi_error();
  return NULL;
}

static void grid_step(rank *R, int v, int T) {
  const char *why = run_variant(R->grid, v, T);
  if (why) die("a variant failed inside a graph", why);
}

/* Whether variant v is measured: its kernel was asked for (the noise with
 * any sample but greedy's, FlashInfer's where it is loaded). */
static int wanted(const grid *g, int v) {
  unsigned k = g->b->go.kernels;
  if (v < G_NKERNELS) return (k >> v) & 1;
  if (v == V_NOISE) return (k & ((1u << G_PLAIN) | (1u << G_FILTERED) | (1u << G_MINP))) != 0;
  if (!g->fih) return 0;
  for (int i = 0; i < G_NKERNELS; i++)
    if (fi_of[i] == v && ((k >> i) & 1)) return 1;
  return 0;
}

static kl_ctx *ctx_of(grid *g, int v) {
  return v == G_FUSED ? g->ctx[S_EPI] : v == G_GATHER || v == G_ARGMAX || v == G_TOPK8
                                             ? g->ctx[S_SEL]
                                             : g->ctx[S_SAMPLE];
}

/* ---------- checks ---------- */

static void note(cell *c, int k, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void note(cell *c, int k, const char *fmt, ...) {
  size_t used = strlen(c->check[k]);
  if (used + 2 >= sizeof c->check[k]) return;
  if (used) used += (size_t)snprintf(c->check[k] + used, sizeof c->check[k] - used, "; ");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->check[k] + used, sizeof c->check[k] - used, fmt, ap);
  va_end(ap);
}

/* Element i of an array of bf16 (elem 2) or fp32 values, as a float. */
static float elem_value(const void *base, size_t i, int elem) {
  uint32_t u = 0;
  if (elem == 4) memcpy(&u, (const char *)base + 4 * i, 4);
  else {
    uint16_t h;
    memcpy(&h, (const char *)base + 2 * i, 2);
    u = (uint32_t)h << 16;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float host_x(const grid *g, int t, int col) {
  return elem_value(g->host_in, (size_t)t * (size_t)g->s->width + (size_t)col, g->s->elem);
}

static void *to_host(const void *d, size_t bytes) {
  void *h = malloc(bytes ? bytes : 1);
  if (!h) die("klbench", "out of memory");
  CUDA(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
  return h;
}

/* Rows 0 and T - 1 of a [T, row_bytes] device array, one after the other. */
static unsigned char *ends_to_host(const void *d, size_t row_bytes, int T) {
  unsigned char *h = malloc(2 * row_bytes);
  if (!h) die("klbench", "out of memory");
  CUDA(cudaMemcpy(h, d, row_bytes, cudaMemcpyDeviceToHost));
  CUDA(cudaMemcpy(h + row_bytes, (const char *)d + (size_t)(T - 1) * row_bytes, row_bytes,
                  cudaMemcpyDeviceToHost));
  return h;
}

/* kl_argmax's, kl_topk's and kl_sample's results of a cell, on the host. */
typedef struct outs {
  int64_t *idx, *k8, *k64, *tok[5];
  float *val, *v8, *v64;
} outs;

/* A token of a row with T 0.7 and filter: in range, and kept by the filter
 * (top_k 50: its logit at least the 50th largest; min_p 0.1: at least the
 * largest + 0.7 ln 0.1, within rounding). */
static const char *bad_draw(const grid *g, const outs *o, int t, int64_t tok, int filter) {
  if (tok < 0 || tok >= g->s->width) return "token out of range";
  float x = host_x(g, t, (int)tok);
  if (filter == G_FILTERED && o->v64 && x < o->v64[(size_t)t * 64 + TOP_K - 1])
    return "token outside the top 50";
  if (filter == G_MINP && o->val && x < o->val[t] + TEMPERATURE * logf(MIN_P) - 1e-3f)
    return "token below the min-p threshold";
  return NULL;
}

/* The row's largest logit and its first column, on the host. */
static float row_max(const grid *g, int t, int *first) {
  float m = -INFINITY;
  for (int c = 0; c < g->s->width; c++) {
    float x = host_x(g, t, c);
    if (x > m) m = x, *first = c;
  }
  return m;
}

static void check_selects(grid *g, cell *c, const outs *o, int T, const int *ran) {
  for (int t = 0; t < T; t++) {
    int first = 0;
    float m = t == 0 || t == T - 1 ? row_max(g, t, &first) : NAN;
    if (ran[G_ARGMAX] && !isnan(m) && (o->val[t] != m || o->idx[t] != first))
      note(c, G_ARGMAX, "row %d: %lld (%g), the host says %d (%g)", t, (long long)o->idx[t],
           (double)o->val[t], first, (double)m);
    if (ran[G_TOPK8] && ran[G_ARGMAX] && o->k8[(size_t)t * 8] != o->idx[t])
      note(c, G_TOPK8, "row %d: first %lld, argmax %lld", t, (long long)o->k8[(size_t)t * 8],
           (long long)o->idx[t]);
    if (ran[G_TOPK64] && ran[G_ARGMAX] && o->k64[(size_t)t * 64] != o->idx[t])
      note(c, G_TOPK64, "row %d: first %lld, argmax %lld", t, (long long)o->k64[(size_t)t * 64],
           (long long)o->idx[t]);
    if (ran[G_GREEDY] && ran[G_ARGMAX] && o->tok[0][t] != o->idx[t])
      note(c, G_GREEDY, "row %d: %lld, kl_argmax %lld", t, (long long)o->tok[0][t],
           (long long)o->idx[t]);
    if (ran[G_PLAIN] && ran[V_NOISE] && o->tok[1][t] != o->tok[4][t])
      note(c, G_PLAIN, "row %d: %lld, the noise reference %lld", t, (long long)o->tok[1][t],
           (long long)o->tok[4][t]);
    const char *why;
    if (ran[G_FILTERED] && (why = bad_draw(g, o, t, o->tok[2][t], G_FILTERED)))
      note(c, G_FILTERED, "row %d: %s", t, why);
    if (ran[G_MINP] && (why = bad_draw(g, o, t, o->tok[3][t], G_MINP)))
      note(c, G_MINP, "row %d: %s", t, why);
  }
}

static int cmp_desc(const void *a, const void *b) {
  float x = *(const float *)a, y = *(const float *)b;
  return (x < y) - (x > y);
}

/* FlashInfer's top k of each row (unsorted) against kl_topk's values (or
 * kl_argmax's at k 1), as sorted values. Runs the variant again: the
 * three share the output buffers. */
static void check_fi_top(grid *g, cell *c, const outs *o, int T, int v, int k, int kernel) {
  const char *why = run_variant(g, v, T);
  if (why) {
    note(c, kernel, "FlashInfer: %s", why);
    return;
  }
  CUDA(cudaStreamSynchronize(g->R.s));
  void *vals = to_host(g->fi_val, (size_t)T * (size_t)k * (size_t)g->s->elem);
  const float *want = k == 1 ? o->val : k == 8 ? o->v8 : o->v64;
  float got[64];
  for (int t = 0; t < T && want; t++) {
    for (int i = 0; i < k; i++)
      got[i] = elem_value(vals, (size_t)t * (size_t)k + (size_t)i, g->s->elem);
    qsort(got, (size_t)k, sizeof *got, cmp_desc);
    for (int i = 0; i < k; i++)
      if (got[i] != want[(size_t)t * (size_t)k + (size_t)i]) {
        note(c, kernel, "FlashInfer row %d: value %d is %g, klgen's %g", t, i, (double)got[i],
             (double)want[(size_t)t * (size_t)k + (size_t)i]);
        break;
      }
  }
  free(vals);
}

static void check_cell(grid *g, cell *c, int T, const int *ran) {
  outs o;
  memset(&o, 0, sizeof o);
  const size_t n = (size_t)T;
  if (ran[G_ARGMAX]) o.idx = to_host(g->idx, 8 * n), o.val = to_host(g->val, 4 * n);
  if (ran[G_TOPK8]) o.k8 = to_host(g->topk_idx[0], 64 * n), o.v8 = to_host(g->topk_val[0], 32 * n);
  if (ran[G_TOPK64])
    o.k64 = to_host(g->topk_idx[1], 512 * n), o.v64 = to_host(g->topk_val[1], 256 * n);
  for (int i = 0; i < 5; i++)
    if (ran[i == 4 ? V_NOISE : G_GREEDY + i]) o.tok[i] = to_host(g->token[i], 8 * n);
  const int width = g->s->width, ends[2] = {0, T - 1};
  if (ran[G_GATHER]) { /* rows 0 and T - 1 as they came in, -0 as +0 allowed */
    const size_t row = (size_t)width * (size_t)g->s->elem;
    unsigned char *out = ends_to_host(g->out, row, T);
    for (int r = 0; r < 2; r++)
      for (int col = 0; col < width; col++) {
        float a = host_x(g, ends[r], col);
        float b = elem_value(out, (size_t)r * (size_t)width + (size_t)col, g->s->elem);
        if (a != b) {
          note(c, G_GATHER, "row %d column %d: %g, the input %g", ends[r], col, (double)b,
               (double)a);
          break;
        }
      }
    free(out);
  }
  if (ran[G_FUSED]) { /* rows 0 and T - 1 soft-capped: within the cap, the input's sign */
    float *out = (float *)ends_to_host(g->out32, 4 * (size_t)width, T);
    for (int r = 0; r < 2; r++)
      for (int col = 0; col < width; col++) {
        float x = host_x(g, ends[r], col), y = out[(size_t)r * (size_t)width + (size_t)col];
        if (!(fabsf(y) <= SOFTCAP) || (x > 0 && y < 0) || (x < 0 && y > 0)) {
          note(c, G_FUSED, "row %d column %d: %g from %g", ends[r], col, (double)y, (double)x);
          break;
        }
      }
    free(out);
  }
  check_selects(g, c, &o, T, ran);
  for (int i = 0; i < 3; i++) { /* FlashInfer's draws: in range and kept by its filter */
    int v = V_FI_PLAIN + i, kernel = G_PLAIN + i;
    if (!ran[v]) continue;
    int32_t *tok = to_host(g->fi_token[i], 4 * n);
    for (int t = 0; t < T; t++) {
      const char *why = bad_draw(g, &o, t, tok[t], kernel);
      if (why) {
        note(c, kernel, "FlashInfer row %d: %s", t, why);
        break;
      }
    }
    free(tok);
  }
  if (ran[V_FI_TOP1]) check_fi_top(g, c, &o, T, V_FI_TOP1, 1, ran[G_ARGMAX] ? G_ARGMAX : G_GREEDY);
  if (ran[V_FI_TOPK8]) check_fi_top(g, c, &o, T, V_FI_TOPK8, 8, G_TOPK8);
  if (ran[V_FI_TOPK64]) check_fi_top(g, c, &o, T, V_FI_TOPK64, 64, G_TOPK64);
  free(o.idx), free(o.val), free(o.k8), free(o.v8), free(o.k64), free(o.v64);
  for (int i = 0; i < 5; i++) free(o.tok[i]);
}

/* ---------- cells and settings ---------- */

/* The grid kernel a variant's failure is reported under. */
static int kernel_of(int v) {
  if (v < G_NKERNELS) return v;
  if (v == V_NOISE) return G_PLAIN;
  for (int k = 0; k < G_NKERNELS; k++)
    if (fi_of[k] == v) return k;
  return G_GATHER;
}

/* Variant v once more after a first call, timed outside a graph (the
 * figure that sizes the graphs), and the path its context took. 0 if it ran. */
static int try_variant(grid *g, cell *c, int v, int T, double *us) {
  const char *why = run_variant(g, v, T); /* the first call loads what it loads lazily */
  kl_stats before = KL_STATS_INIT, after = KL_STATS_INIT;
  if (!why && v < G_NKERNELS) kl_ctx_stats(ctx_of(g, v), &before);
  if (!why) {
    CUDA(cudaEventRecord(g->R.e0, g->R.s));
    why = run_variant(g, v, T);
    CUDA(cudaEventRecord(g->R.e1, g->R.s));
  }
  CUDA(cudaStreamSynchronize(g->R.s));
  if (why) {
    note(c, kernel_of(v), "%s%s", v > V_NOISE ? "FlashInfer: " : "", why);
    return -1;
  }
  float ms;
  CUDA(cudaEventElapsedTime(&ms, g->R.e0, g->R.e1));
  *us = 1000.0 * ms;
  if (v < G_NKERNELS) {
    kl_ctx_stats(ctx_of(g, v), &after);
    snprintf(c->path[v], sizeof c->path[v], "%s",
             after.nccl > before.nccl ? "nccl" : after.oneshot > before.oneshot ? "oneshot" : "");
  }
  return 0;
}

static void run_cell(grid *g, cell *c, int T) {
  bench *b = g->b;
  memset(c, 0, sizeof *c);
  c->tokens = T;
  int ran[NV] = {0}, which[NV], n = 0;
  double slowest = 0, t[NV];
  for (int v = 0; v < NV; v++) {
    c->us[v] = NAN;
    double us;
    if (!wanted(g, v) || try_variant(g, c, v, T, &us)) continue;
    ran[v] = 1, which[n++] = v;
    slowest = us > slowest ? us : slowest;
  }
  check_cell(g, c, T, ran);
  int steps = slowest > 0 ? (int)(GRAPH_US / slowest) : b->steps, keep = b->steps;
  c->steps = steps < MIN_STEPS ? MIN_STEPS : steps > b->steps ? b->steps : steps;
  if (!n) return;
  b->steps = c->steps;
  time_graphs(&g->R, grid_step, which, n, T, b->replays, t);
  b->steps = keep;
  for (int i = 0; i < n; i++) c->us[which[i]] = t[i];
}

static grid_row row_of(const grid *g, const grid_meta *m, const cell *c, int k) {
  const setting *s = g->s;
  grid_row r = {.width = s->width, .tokens = c->tokens, .steps = c->steps, .kernel = k,
                .dtype = kl_dtype_name(s->dtype), .path = c->path[k], .check = c->check[k],
                .bytes = grid_bytes(k, c->tokens, s->width, s->elem), .klgen_us = c->us[k],
                .noise_us = NAN, .fi_us = NAN};
  r.roofline_us = grid_roofline(m, r.bytes);
  if (k == G_PLAIN || k == G_FILTERED || k == G_MINP) r.noise_us = c->us[V_NOISE];
  if (fi_of[k] && g->fih) r.fi_us = c->us[fi_of[k]], r.fi_call = fi_names[fi_of[k]];
  return r;
}

static void run_setting(grid *g, setting *s, const grid_meta *m, int index) {
  bench *b = g->b;
  open_setting(g, s);
  printf("\n%d columns, %s: max_tokens %lld (topk 8), %lld (topk 64), %lld (epilogue)\n",
         s->width, kl_dtype_name(s->dtype), (long long)s->spec[S_SEL].max_tokens,
         (long long)s->spec[S_SAMPLE].max_tokens, (long long)s->spec[S_EPI].max_tokens);
  grid_row *rows = calloc((size_t)b->ntok * G_NKERNELS, sizeof *rows);
  if (!rows) die("klbench", "out of memory");
  for (int i = 0; i < b->ntok; i++) {
    fprintf(stderr, "\r[%d/%d] %d columns, %s: tokens %d%-20s", index + 1, g->nset, s->width,
            kl_dtype_name(s->dtype), b->tokens[i], "");
    if (!isatty(2)) fputc('\n', stderr);
    cell *c = &g->cells[i];
    run_cell(g, c, b->tokens[i]);
    for (int k = 0; k < G_NKERNELS; k++) {
      rows[i * G_NKERNELS + k] = row_of(g, m, c, k);
      if (!((b->go.kernels >> k) & 1)) continue;
      if (c->check[k][0]) g->failed = 1;
      if (g->csv) grid_csv_row(g->csv, m, &rows[i * G_NKERNELS + k]);
    }
  }
  fprintf(stderr, "\r%70s\r", "");
  grid_print_setting(rows, b->ntok, b->go.kernels);
  fflush(stdout);
  free(rows);
  close_setting(g);
}

static void open_gpu(grid *g) {
  bench *b = g->b;
  CUDA(cudaSetDevice(0));
  CUDA(cudaFree(0)); /* the primary context, current for the driver calls */
  struct cudaDeviceProp prop;
  CUDA(cudaGetDeviceProperties(&prop, 0));
  snprintf(b->gpu, sizeof b->gpu, "%s", prop.name);
  snprintf(b->arch, sizeof b->arch, "sm_%d%d", prop.major, prop.minor);
  b->sm_count = prop.multiProcessorCount;
  b->n = 1;
  int dev0 = 0;
  NCCL(ncclCommInitAll(b->comms, 1, &dev0));
  KL(kl_group_create(&b->group, 1));
  pthread_barrier_init(&b->bar, NULL, 1);
  g->R.b = b, g->R.r = 0, g->R.grid = g;
  CUDA(cudaStreamCreateWithFlags(&g->R.s, cudaStreamNonBlocking));
  CUDA(cudaEventCreate(&g->R.e0));
  CUDA(cudaEventCreate(&g->R.e1));
}

static void load_flashinfer(grid *g) {
  int rc = fi_load(&g->fi, g->b->go.fi_path, g->fi_note, sizeof g->fi_note);
  if (rc < 0) die("FlashInfer", g->fi_note);
  g->have_fi = rc == 0;
  printf("FlashInfer: %s%s\n", g->have_fi ? "" : "absent (", g->fi_note);
  if (g->have_fi)
    printf("FlashInfer's calls, on the same rows, each as an engine makes it: top_k (argmax, "
           "greedy, top-k); the temperature (fp32 x / T, one kernel), then sampling_from_logits "
           "(plain) or top_k_top_p_sampling_from_logits (top_k_mask_logits, softmax, "
           "top_p_sampling_from_probs: filtered); softmax(x / T), then "
           "min_p_sampling_from_probs (min-p)\n");
  else
    printf("                                      the grid runs without its columns)\n");
}

int grid_run(bench *b) {
  grid *g = calloc(1, sizeof *g);
  if (!g) die("klbench", "out of memory");
  g->b = b;
  g->max_rows = b->tokens[b->ntok - 1];
  open_gpu(g);
  grid_meta m = {.gpu = b->gpu, .arch = b->arch, .command = b->command, .steps = b->steps,
                 .replays = b->replays};
  time_t now = time(NULL);
  strftime(m.date, sizeof m.date, "%Y-%m-%d %H:%M UTC", gmtime(&now));
  printf("klbench --grid on %s (%s, %d SMs), GPU 0, tp 1; %s\n", b->gpu, b->arch, b->sm_count,
         m.date);
  printf("method: each cell's variants captured up to %d steps deep (a graph of its slowest "
         "about %.0f ms), replayed in turn, median of %d replays; us per step\n",
         b->steps, GRAPH_US / 1000, b->replays);
  load_flashinfer(g);
  m.flashinfer = g->have_fi ? g->fi_note : "absent";
  cache_dir(g);
  make_settings(g);
  precompile(g);
  reference_kernels(g);
  alloc_params(g);
  references(g);
  m.copy_gbps = g->copy_gbps, m.floor_us = g->floor_us;
  printf("copy bandwidth %.1f GB/s (cudaMemcpyAsync, %llu MiB each way, read + written); launch "
         "floor %.2f us (empty kernels, PDL, %d x %d threads, chained in a graph)\n",
         g->copy_gbps, (unsigned long long)(COPY_BYTES >> 20), g->floor_us, FLOOR_CTAS,
         FLOOR_THREADS);
  printf("roofline = bytes / copy bandwidth + floor; bytes (T tokens, W columns, e bytes an "
         "element):\n%s", grid_byte_model);
  if (b->csv) {
    g->csv = fopen(b->csv, "w");
    if (!g->csv) die(b->csv, "cannot write");
    grid_csv_begin(g->csv, &m);
  }
  for (int i = 0; i < g->nset; i++) run_setting(g, &g->set[i], &m, i);
  if (g->csv) fclose(g->csv);
  grid_noise_release(&g->noise);
  for (int i = 0; i < g->nset; i++)
    for (int k = 0; k < NSPECS; k++) free(g->set[i].src[k]);
  ncclCommDestroy(b->comms[0]);
  kl_group_destroy(b->group);
  int rc = g->failed ? 1 : 0;
  if (g->failed) fprintf(stderr, "klbench: some cells' checks failed (CHECK FAILED above)\n");
  free(g);
  return rc;
}
