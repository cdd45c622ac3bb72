/* klbench: the one-shot gather against NCCL, side by side, on this machine's GPUs.
 *
 *   klbench SPEC [NAME] [--tokens LIST] [--steps N] [--replays R] [--csv FILE]
 *           [--plot FILE.svg] [--tune FILE] [--no-gemm] [--templates DIR] [--select [--topk K]]
 *           [--sample]
 *
 * One thread per GPU. Per token count, every path is captured `steps` deep in a
 * CUDA graph per rank; the ranks replay together (a barrier before each
 * replay), the paths' graphs in turn, CUDA events time each replay; a path's
 * figure is the median over replays, then the max over ranks (docs/BENCHMARKS.md,
 * "Method"). Paths:
 *   one-shot         kl_gather forced onto the one-shot kernel (PDL on)
 *   one-shot no-PDL  the same kernel launched without PDL
 *   NCCL ring        the runtime's own NCCL fallback: kl_gather with the one-shot
 *                    path declined (ncclAllGather on plain buffers + the
 *                    generated relayout), so the bench times what engines get
 *   NCCL symm        ncclAllGather on ncclMemAlloc'd NCCL_WIN_COLL_SYMMETRIC
 *                    windows + the same relayout: NCCL's fastest configuration,
 *                    which the runtime does not use (yet)
 *   auto             kl_gather as the runtime dispatches it
 * All outputs are compared before anything is timed. Then an end-to-end step:
 * the LM-head GEMM (cuBLAS, hidden 7168) followed by the gather.
 * --select measures the fused epilogue, kl_argmax and kl_topk (k: --topk,
 * default 8) against the engines' separate kernels instead (bench/select.c).
 * --sample measures kl_sample (T 0.7 with and without top-k 50 and top-p
 * 0.9, with each logits processor alone, and greedy) against kl_gather,
 * kl_argmax and NCCL pairs instead (bench/sample.c).
 * --templates DIR renders the kernels from DIR instead of the built-in
 * templates (as klgen --templates does): a template change is measured
 * against the same NCCL figures without rebuilding anything. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "klbench.h"
#include "rt.h"

static const char *const path_names[NPATHS] = {"one-shot", "one-shot no-PDL", "NCCL ring",
                                               "NCCL symm", "auto"};
static const char *const e2e_names[NE2E] = {"GEMM alone", "GEMM + one-shot (PDL)",
                                            "GEMM + one-shot (no PDL)", "GEMM + NCCL ring"};

const char *const kl_bench_prog = "klbench";

/* ---------- setup ---------- */

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

static int parse_tokens(bench *b, const char *list) {
  b->ntok = 0;
  for (const char *p = list; *p && b->ntok < MAX_TOK;) {
    char *end;
    long v = strtol(p, &end, 10);
    if (end == p || v < 1 || v > KL_TOKENS_MAX) return -1;
    b->tokens[b->ntok++] = (int)v;
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return -1;
  }
  qsort(b->tokens, (size_t)b->ntok, sizeof *b->tokens, cmp_int);
  return b->ntok ? 0 : -1;
}

/* Powers of two from 1 until a rank sends 16 MiB per step. */
static void default_tokens(bench *b) {
  long long limit = (16LL << 20) / b->l.shard_bytes;
  b->ntok = 0;
  for (long long t = 1; t <= limit && b->ntok < MAX_TOK; t *= 2) b->tokens[b->ntok++] = (int)t;
  if (limit >= 1 && b->tokens[b->ntok - 1] != limit && b->ntok < MAX_TOK)
    b->tokens[b->ntok++] = (int)limit;
}

/* The spec as measured: at most one rank per GPU; a spec for more ranks than
 * GPUs keeps its per-rank shard, at the GPU count available. max_tokens
 * covers the sweep so the one-shot column exists at every size. */
static void derive_spec(bench *b, int gpus) {
  kl_spec_list list;
  kl_err e;
  if (kl_spec_load_file(b->spec_path, NULL, &list, &e)) die("spec", e.msg);
  int k = 0;
  if (b->name) {
    for (k = 0; k < list.n && strcmp(list.v[k].name, b->name); k++) {}
    if (k == list.n) die(b->spec_path, "no spec of that name");
  } else if (list.n > 1) {
    die(b->spec_path, "defines several specs; name one");
  }
  b->orig = list.v[k];
  kl_spec_list_free(&list);
  kl_layout ol;
  kl_layout_derive(&b->orig, &ol, &e);
  b->n = b->orig.tp <= gpus ? b->orig.tp : gpus;
  b->spec = b->orig;
  if (b->n != b->orig.tp) {
    b->spec.tp = b->n;
    b->spec.vocab_size = ol.shard * b->n;
    b->spec.pad_to = 0;
    b->spec.padded_vocab = b->spec.vocab_size;
    printf("note: %s is for tp %d but this machine has %d GPU(s): measuring its per-rank shard "
           "(%lld columns, %lld bytes per token) at tp %d\n", b->orig.name, b->orig.tp, gpus,
           (long long)ol.shard, (long long)ol.shard_bytes, b->n);
  }
  kl_layout_derive(&b->spec, &b->l, &e);
  if (!b->ntok) default_tokens(b);
  if (b->tokens[b->ntok - 1] > b->spec.max_tokens) b->spec.max_tokens = b->tokens[b->ntok - 1];
  if (kl_layout_derive(&b->spec, &b->l, &e)) die("spec for the sweep", e.msg);
  snprintf(b->spec_src, sizeof b->spec_src,
           "return { name = '%s', vocab_size = %lld, padded_vocab = %lld, tp = %d, "
           "dtype = '%s', max_tokens = %lld }",
           b->spec.name, (long long)b->spec.vocab_size, (long long)b->l.padded_vocab, b->spec.tp,
           kl_dtype_name(b->spec.dtype), (long long)b->spec.max_tokens);
}

static void make_contexts(rank *R) {
  bench *b = R->b;
  kl_config base = {.size = sizeof(kl_config), .rank = R->r, .nranks = b->n, .device = R->r, .nccl = b->comms[R->r],
                    .group = b->group};
  kl_config os = base, np = base, nc = base;
  os.crossover_bytes = np.crossover_bytes = 1LL << 40; /* always one-shot */
  np.no_pdl = 1;
  nc.crossover_bytes = 1; /* every step over the crossover: the NCCL fallback */
  if (b->source) {
    kl_generated g = bench_generated(&b->spec, &b->l, b->source);
    KL(kl_ctx_create_generated(&R->ctx[0], &g, &os));
    KL(kl_ctx_create_generated(&R->ctx[1], &g, &np));
    KL(kl_ctx_create_generated(&R->ctx[2], &g, &base));
    KL(kl_ctx_create_generated(&R->ctx[3], &g, &nc));
    return;
  }
  KL(kl_ctx_create_string(&R->ctx[0], b->spec_src, NULL, &os));
  KL(kl_ctx_create_string(&R->ctx[1], b->spec_src, NULL, &np));
  KL(kl_ctx_create_string(&R->ctx[2], b->spec_src, NULL, &base));
  KL(kl_ctx_create_string(&R->ctx[3], b->spec_src, NULL, &nc));
}

/* The generated relayout kernel, for the NCCL symm column (what the runtime's
 * NCCL path runs after ncclAllGather). */
static void load_relayout(rank *R) {
  bench *b = R->b;
  kl_err e;
  char *src, dir[4096], name[128];
  kl_binary bin;
  int hit;
  const kl_cu *cu = kl_cu_get(NULL);
  if (kl_render(&b->spec, &b->l, b->templates, &src, &e)) die("render", e.msg);
  if (kl_jit_cubin(src, b->spec.name, b->arch, kl_cache_dir(NULL, dir, sizeof dir) ? dir : NULL,
                   &bin, &hit, &e))
    die("jit", e.msg);
  kl_entry_name(&b->spec, "relayout", name, sizeof name);
  if (cu->cuModuleLoadData(&R->mod, bin.data) || cu->cuModuleGetFunction(&R->relayout, R->mod, name))
    die("relayout", "cannot load");
  kl_binary_free(&bin);
  free(src);
}

static void alloc_buffers(rank *R) {
  bench *b = R->b;
  size_t T = (size_t)b->tokens[b->ntok - 1], e = (size_t)b->l.elem_bytes;
  R->in_bytes = T * (size_t)b->l.shard_bytes;
  R->out_bytes = T * (size_t)b->spec.vocab_size * e;
  R->all_bytes = R->in_bytes * (size_t)b->n;
  CUDA(cudaMalloc(&R->in, R->in_bytes));
  for (int p = 0; p < NPATHS; p++) CUDA(cudaMalloc(&R->out[p], R->out_bytes));
  /* Symmetric windows: [send | recv] in one registered allocation. */
  size_t sym = R->in_bytes + R->all_bytes;
  if (ncclMemAlloc(&R->symm, sym) == ncclSuccess &&
      ncclCommWindowRegister(b->comms[R->r], R->symm, sym, &R->win, NCCL_WIN_COLL_SYMMETRIC) ==
          ncclSuccess)
    b->symm_rank[R->r] = 1;
  else
    fprintf(stderr, "klbench: rank %d: NCCL symmetric windows unavailable\n", R->r);
  /* Logits-like data, different per rank, including -0.0 now and then. */
  unsigned char *h = malloc(R->in_bytes);
  uint32_t x = 0x9e3779b9u * (uint32_t)(R->r + 1);
  for (size_t i = 0; i < R->in_bytes; i++) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    h[i] = (unsigned char)(x >> 24);
  }
  CUDA(cudaMemcpy(R->in, h, R->in_bytes, cudaMemcpyHostToDevice));
  if (b->symm_rank[R->r]) CUDA(cudaMemcpy(R->symm, h, R->in_bytes, cudaMemcpyHostToDevice));
  free(h);
  CUDA(cudaEventCreate(&R->e0));
  CUDA(cudaEventCreate(&R->e1));
}

/* ---------- the paths ---------- */

/* NCCL symm: ncclAllGather on the windows, then the relayout launched as the
 * runtime's NCCL path launches it (gather.c). */
static void symm_gather(rank *R, const void *in, void *all, void *out, int T) {
  bench *b = R->b;
  size_t bytes = (size_t)T * (size_t)b->l.shard_bytes;
  /* One token and no padding: NCCL's layout is already the output's. */
  if (T == 1 && b->spec.vocab_size == b->l.padded_vocab) {
    NCCL(ncclAllGather(in, out, bytes, ncclUint8, b->comms[R->r], R->s));
    return;
  }
  NCCL(ncclAllGather(in, all, bytes, ncclUint8, b->comms[R->r], R->s));
  int64_t out_bytes = (int64_t)T * b->spec.vocab_size * b->l.elem_bytes;
  unsigned grid = (unsigned)kl_layout_relayout_grid(&b->l, out_bytes,
                                                    KL_RELAYOUT_CTAS_PER_SM * b->sm_count);
  kl_relayout_args a = {all, out, T, 0};
  void *args[] = {&a};
  if (kl_cu_get(NULL)->cuLaunchKernel(R->relayout, grid, 1, 1, (unsigned)b->l.relayout_block, 1,
                                      1, 0, (CUstream)R->s, args, NULL))
    die("relayout", "launch failed");
}

static void run_path(rank *R, int p, int T) {
  switch (p) {
    case P_ONESHOT: KL(kl_gather(R->ctx[0], R->in, R->out[p], T, R->s)); break;
    case P_NOPDL: KL(kl_gather(R->ctx[1], R->in, R->out[p], T, R->s)); break;
    case P_AUTO: KL(kl_gather(R->ctx[2], R->in, R->out[p], T, R->s)); break;
    case P_RING: KL(kl_gather(R->ctx[3], R->in, R->out[p], T, R->s)); break;
    case P_SYMM:
      symm_gather(R, R->symm, (char *)R->symm + R->in_bytes, R->out[p], T);
      break;
  }
}

/* Every path once; outputs compared with NCCL ring's (-0.0 == +0.0). */
static long long check_paths(rank *R, int T) {
  bench *b = R->b;
  size_t n = (size_t)T * (size_t)b->spec.vocab_size * (size_t)b->l.elem_bytes;
  for (int p = 0; p < NPATHS; p++) {
    if (p == P_SYMM && !b->symm_ok) continue;
    CUDA(cudaMemsetAsync(R->out[p], 0x5a, n, R->s));
    run_path(R, p, T);
  }
  CUDA(cudaStreamSynchronize(R->s));
  long long bad = 0;
  unsigned char *ref = malloc(n), *got = malloc(n);
  CUDA(cudaMemcpy(ref, R->out[P_RING], n, cudaMemcpyDeviceToHost));
  int e = b->l.elem_bytes;
  for (int p = 0; p < NPATHS; p++) {
    if (p == P_RING || (p == P_SYMM && !b->symm_ok)) continue;
    CUDA(cudaMemcpy(got, R->out[p], n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i += (size_t)e) {
      uint32_t a = 0, c = 0, neg = e == 2 ? 0x8000u : 0x80000000u;
      memcpy(&a, got + i, (size_t)e);
      memcpy(&c, ref + i, (size_t)e);
      bad += a != c && !(c == neg && a == 0);
    }
  }
  free(ref), free(got);
  return bad;
}

/* ---------- end to end: LM head + gather ---------- */

typedef struct e2e {
  cublasHandle_t h;
  void *x, *w, *logits;
  cudaDataType dt;
} e2e;
static e2e E2E[MAX_RANKS];

static int e2e_rounds(const bench *b) { return 3 * b->replays > 63 ? 63 : 3 * b->replays; }

static void e2e_step(rank *R, int which, int T) {
  bench *b = R->b;
  e2e *E = &E2E[R->r];
  const float one = 1.0f, zero = 0.0f;
  if (cublasGemmEx(E->h, CUBLAS_OP_T, CUBLAS_OP_N, (int)b->l.shard, T, HIDDEN, &one, E->w, E->dt,
                   HIDDEN, E->x, E->dt, HIDDEN, &zero, E->logits, E->dt, (int)b->l.shard,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
    die("cublasGemmEx", "failed");
  if (which == E_ONESHOT) KL(kl_gather(R->ctx[0], E->logits, R->out[0], T, R->s));
  if (which == E_NOPDL) KL(kl_gather(R->ctx[1], E->logits, R->out[1], T, R->s));
  if (which == E_RING) KL(kl_gather(R->ctx[3], E->logits, R->out[P_RING], T, R->s));
}

static void run_e2e(rank *R) {
  bench *b = R->b;
  e2e *E = &E2E[R->r];
  size_t e = (size_t)b->l.elem_bytes;
  E->dt = b->spec.dtype == KL_BF16 ? CUDA_R_16BF : b->spec.dtype == KL_FP16 ? CUDA_R_16F : CUDA_R_32F;
  if (cublasCreate(&E->h) != CUBLAS_STATUS_SUCCESS) die("cublasCreate", "failed");
  cublasSetStream(E->h, R->s);
  int T2 = b->e2e_tokens[1];
  CUDA(cudaMalloc(&E->x, (size_t)T2 * HIDDEN * e));
  CUDA(cudaMalloc(&E->w, (size_t)b->l.shard * HIDDEN * e));
  CUDA(cudaMalloc(&E->logits, (size_t)T2 * (size_t)b->l.shard * e));
  CUDA(cudaMemset(E->x, 0x11, (size_t)T2 * HIDDEN * e)); /* small finite values */
  CUDA(cudaMemset(E->w, 0x11, (size_t)b->l.shard * HIDDEN * e));
  /* The gather is small beside the GEMM, whose time wanders by more than
   * the gather takes: three times the rounds (e2e_rounds). */
  int all[NE2E];
  double t[NE2E];
  for (int w = 0; w < NE2E; w++) all[w] = w;
  for (int i = 0; i < 2; i++) {
    time_graphs(R, e2e_step, all, NE2E, b->e2e_tokens[i], e2e_rounds(b), t);
    for (int w = 0; w < NE2E; w++) b->e2e[w][i][R->r] = t[w];
  }
  cublasDestroy(E->h);
  cudaFree(E->x), cudaFree(E->w), cudaFree(E->logits);
}

/* ---------- the rank thread ---------- */

static void *rank_main(void *arg) {
  rank *R = arg;
  bench *b = R->b;
  CUDA(cudaSetDevice(R->r));
  CUDA(cudaStreamCreateWithFlags(&R->s, cudaStreamNonBlocking));
  load_relayout(R);
  make_contexts(R);
  alloc_buffers(R);
  pthread_barrier_wait(&b->bar);
  if (R->r == 0) {
    b->symm_ok = 1;
    for (int r = 0; r < b->n; r++) b->symm_ok &= b->symm_rank[r];
  }
  if (b->select || b->sample) {
    if (b->select) select_rank(R);
    else sample_rank(R);
    for (int k = 0; k < 4; k++) kl_ctx_destroy(R->ctx[k]);
    if (b->symm_rank[R->r]) ncclCommWindowDeregister(b->comms[R->r], R->win);
    return NULL;
  }
  /* Warm-up, so the first size measured does not pay for idle clocks. */
  for (int k = 0; k < 4000; k++) run_path(R, P_ONESHOT, b->tokens[0]);
  CUDA(cudaStreamSynchronize(R->s));
  pthread_barrier_wait(&b->bar);
  for (int i = 0; i < b->ntok; i++) {
    int T = b->tokens[i];
    if (R->r == 0) progress(b, i, "checking that all paths agree");
    kl_stats before = KL_STATS_INIT, after = KL_STATS_INIT; /* which path the dispatch took for this size */
    kl_ctx_stats(R->ctx[2], &before);
    b->bad[i][R->r] = check_paths(R, T);
    kl_ctx_stats(R->ctx[2], &after);
    if (R->r == 0) b->auto_path[i] = after.nccl > before.nccl;
    int which[NPATHS], n = 0;
    double t[NPATHS];
    for (int p = 0; p < NPATHS; p++) {
      b->t[p][i][R->r] = NAN;
      if (p != P_SYMM || b->symm_ok) which[n++] = p;
    }
    if (R->r == 0) progress(b, i, "timing every path");
    time_graphs(R, run_path, which, n, T, b->replays, t);
    for (int k = 0; k < n; k++) b->t[which[k]][i][R->r] = t[k];
  }
  if (b->gemm) {
    if (R->r == 0) fprintf(stderr, "\rend-to-end: LM-head GEMM + gather%30s\n", "");
    run_e2e(R);
  }
  CUDA(cudaStreamSynchronize(R->s));
  kl_stats nc = KL_STATS_INIT;
  kl_ctx_stats(R->ctx[3], &nc);
  if (nc.oneshot != 0) die("NCCL ring", "the runtime took the one-shot path");
  for (int k = 0; k < 4; k++) {
    if (kl_ctx_status(R->ctx[k]) != KLRT_OK) die("device status", kl_last_error());
    kl_ctx_destroy(R->ctx[k]);
  }
  if (b->symm_rank[R->r]) ncclCommWindowDeregister(b->comms[R->r], R->win);
  return NULL;
}

/* ---------- reporting ---------- */

static void fmt_bytes(long long b, char *buf, size_t n) {
  if (b >= 1 << 20) snprintf(buf, n, "%.2f MiB", (double)b / (1 << 20));
  else snprintf(buf, n, "%lld KiB", b >> 10);
}

static void report(bench *b, FILE *csv) {
  printf("\n%-7s %11s %9s %9s %10s %10s %9s %9s %10s %12s\n", "tokens", "bytes/rank",
         "one-shot", "no-PDL", "NCCL ring", "NCCL symm", "auto", "auto via", "vs NCCL",
         "one-shot BW");
  printf("%-7s %11s %9s %9s %10s %10s %9s %9s %10s %12s\n", "", "", "us", "us", "us", "us", "us",
         "", "best", "GB/s/rank");
  if (csv)
    fprintf(csv, "tokens,bytes_per_rank,oneshot_us,oneshot_nopdl_us,nccl_ring_us,nccl_symm_us,"
                 "auto_us,auto_path,speedup_vs_best_nccl,oneshot_gbps,mismatches\n");
  for (int i = 0; i < b->ntok; i++) {
    double t[NPATHS];
    long long bad = 0;
    for (int p = 0; p < NPATHS; p++) t[p] = worst(b->t[p][i], b->n);
    for (int r = 0; r < b->n; r++) bad += b->bad[i][r];
    double best_nccl = isnan(t[P_SYMM]) || t[P_RING] < t[P_SYMM] ? t[P_RING] : t[P_SYMM];
    long long bytes = (long long)b->tokens[i] * b->l.shard_bytes;
    /* bytes a rank receives from its peers per step, over the step time */
    double gbps = (double)bytes * (b->n - 1) / (t[P_ONESHOT] * 1e3);
    char bb[32];
    fmt_bytes(bytes, bb, sizeof bb);
    printf("%-7d %11s %9.2f %9.2f %10.2f %10.2f %9.2f %9s %9.2fx %12.1f%s\n", b->tokens[i], bb,
           t[P_ONESHOT], t[P_NOPDL], t[P_RING], t[P_SYMM], t[P_AUTO],
           b->auto_path[i] ? "NCCL" : "one-shot", best_nccl / t[P_ONESHOT], gbps,
           bad ? "  OUTPUTS DIFFER" : "");
    if (csv)
      fprintf(csv, "%d,%lld,%.3f,%.3f,%.3f,%.3f,%.3f,%s,%.3f,%.1f,%lld\n", b->tokens[i], bytes,
              t[P_ONESHOT], t[P_NOPDL], t[P_RING], t[P_SYMM], t[P_AUTO],
              b->auto_path[i] ? "nccl" : "oneshot", best_nccl / t[P_ONESHOT], gbps, bad);
    if (bad) b->failed = 1;
  }
  if (!b->gemm) return;
  printf("\nend to end (LM-head GEMM [tokens, %d] x [%d, %lld], then the gather), us per step,\n"
         "the four graphs replayed in turn (rotating), median of %d rounds:\n", HIDDEN, HIDDEN,
         (long long)b->l.shard, e2e_rounds(b));
  printf("%-26s %9d tok %11s %9d tok %11s\n", "", b->e2e_tokens[0], "over GEMM", b->e2e_tokens[1],
         "over GEMM");
  double base[2] = {worst(b->e2e[E_GEMM][0], b->n), worst(b->e2e[E_GEMM][1], b->n)};
  for (int w = 0; w < NE2E; w++) {
    double t0 = worst(b->e2e[w][0], b->n), t1 = worst(b->e2e[w][1], b->n);
    if (w == E_GEMM) printf("%-26s %13.2f %11s %13.2f\n", e2e_names[w], t0, "", t1);
    else
      printf("%-26s %13.2f %+11.2f %13.2f %+11.2f\n", e2e_names[w], t0, t0 - base[0], t1,
             t1 - base[1]);
  }
}

static void write_tune(const bench *b) {
  /* The largest measured size at which the one-shot kernel is still at least
   * as fast as the NCCL path the dispatch falls back to (ring + relayout). */
  long long cross = 0;
  for (int i = 0; i < b->ntok; i++) {
    double os = worst(b->t[P_ONESHOT][i], b->n), ring = worst(b->t[P_RING][i], b->n);
    if (os > ring) break;
    cross = (long long)b->tokens[i] * b->l.shard_bytes;
  }
  FILE *f = fopen(b->tune, "a");
  if (!f) die(b->tune, "cannot write");
  time_t now = time(NULL);
  fprintf(f, "# klbench %s on %d x %s, %s", b->spec.name, b->n, b->gpu, ctime(&now));
  fprintf(f, "%s %d %lld %lld\n", b->arch, b->n, (long long)b->l.shard_bytes, cross);
  fclose(f);
  printf("\ncrossover for %s, tp %d, shard %lld B: %lld bytes per rank per step -> %s\n", b->arch,
         b->n, (long long)b->l.shard_bytes, cross, b->tune);
}

int klbench_plot(const char *path, const char *title, const int *tokens, int n,
                 const double *series, const char *const *names, int nseries);

static const char usage[] =
    "usage: klbench SPEC [NAME] [options]\n"
    "       klbench --grid [--quick] [--widths LIST] [--dtypes LIST] [--kernels LIST] [options]\n"
    "Times klgen's paths against NCCL and the engines' kernels on this machine's GPUs,\n"
    "one rank per GPU (a spec for more ranks than GPUs keeps its per-rank shard).\n"
    "Each path is captured --steps deep in a CUDA graph per rank; ranks replay together;\n"
    "a figure is the median over --replays, then the largest over ranks, in us per step.\n"
    "  SPEC, NAME        a spec file, and which of its specs (a file with several)\n"
    "  --tokens LIST     tokens per step, e.g. 1,8,64 (default: powers of two up to the\n"
    "                    16 MiB crossover; --sample: 1,8,64; --grid: 1,2,4,...,512)\n"
    "  --steps N         steps a graph holds (default 200; --grid: at most, see below)\n"
    "  --replays R       replays timed, 1-64 (default 7; --grid: 5)\n"
    "  --csv FILE        the table as CSV too\n"
    "  --plot FILE.svg   the gather's table as a plot\n"
    "  --tune FILE       append the measured crossover (KLGEN_TUNE_FILE's format)\n"
    "  --no-gemm         leave out the end-to-end step (LM-head GEMM + gather)\n"
    "  --select          the fused epilogue, kl_argmax and kl_topk against the engines'\n"
    "                    separate kernels, instead of the gather\n"
    "  --topk K          with --select: kl_topk's k (default 8)\n"
    "  --sample          kl_sample (greedy, plain T 0.7, T 0.7 with top-k 50 and top-p\n"
    "                    0.9, T 0.7 with each processor: a grammar bitmask, penalties,\n"
    "                    logit bias, allowed ids, min_tokens, banned ids)\n"
    "                    against gather + argmax and NCCL pairs\n"
    "  --templates DIR   kernels rendered from DIR instead of the built-in templates\n"
    "  -h, --help        this text\n"
    "\n"
    "--grid (no SPEC): every kernel at every size on GPU 0 at tp 1, against its roofline,\n"
    "the noise reference and FlashInfer. For each width W and dtype, klbench makes the\n"
    "specs (W columns, tp 1; topk 8, topk 64, and fp32 out + soft-cap 30 with engine\n"
    "numerics), max_tokens the most tokens or what the one-shot buffers allow (a call\n"
    "above it takes the NCCL path: the CSV says which path each call took). Kernels:\n"
    "gather, fused, argmax, topk8, topk64 (kl_topk with the lse), greedy (kl_sample T 0),\n"
    "plain (T 0.7), filtered (T 0.7, top_k 50, top_p 0.9), minp (T 0.7, min_p 0.1). Each\n"
    "cell is checked before it is timed; a graph holds at most --steps steps and about\n"
    "20 ms of its cell's slowest variant. Roofline = bytes / copy bandwidth (a large\n"
    "device-to-device copy, read + written) + launch floor (an empty kernel a step in a\n"
    "graph), both measured in the run; %% of roofline = roofline / time. Bytes, T tokens,\n"
    "W columns, e bytes an element:\n"
    "%s"
    "The noise reference (beside plain, filtered, minp): a kernel that reads every column\n"
    "and draws its noise (templates/noise.cuh.tmpl, as klgen renders it), t = x / T,\n"
    "and takes the first largest t + g: kl_sample's plain token, which it must equal.\n"
    "FlashInfer (libkl_flashinfer.so, bench/flashinfer.sh): its top_k (argmax, greedy,\n"
    "top-k), sampling_from_logits, top_k_top_p_sampling_from_logits, softmax +\n"
    "min_p_sampling_from_probs, on the same rows, the temperature applied first.\n"
    "  --grid            the grid instead of a spec's tables\n"
    "  --quick           a smoke subset: widths 20480,163840, bf16, tokens 1,8,64,256\n"
    "  --widths LIST     row widths, multiples of 8 from 1024 to 2097152\n"
    "                    (default 20480,64128,163840,262144)\n"
    "  --dtypes LIST     bf16, fp32 or bf16,fp32 (default both)\n"
    "  --kernels LIST    some of the kernels above (default all)\n"
    "  --flashinfer LIB  libkl_flashinfer.so, or none (default: beside klbench; without\n"
    "                    it the grid runs without FlashInfer's columns and says so)\n"
    "With --csv FILE: one row a kernel and cell (width, dtype, tokens, kernel, bytes,\n"
    "copy_gbps, floor_us, roofline_us, klgen_us, pct_roofline, klgen_path, noise_us,\n"
    "flashinfer_us, flashinfer_call, steps, check), after '# ' lines on the run;\n"
    "bench/grid_table.py turns it into BENCHMARKS tables. Exit status 1 if a check failed.\n";

static int usage_line(void) {
  fprintf(stderr, "usage: klbench SPEC [NAME] [options] (see --help)\n");
  return 2;
}

static int grid_usage(const char *why) {
  fprintf(stderr, "klbench: %s (see --help)\n", why);
  return 2;
}

/* The checks of the options --grid takes and leaves. */
static int grid_args(bench *b, int grid_opts_given) {
  if (!b->grid) return grid_opts_given ? grid_usage("--quick, --widths, --dtypes, --kernels and "
                                                    "--flashinfer go with --grid") : -1;
  if (b->spec_path) return grid_usage("--grid makes its own specs: give no SPEC");
  if (b->select || b->sample || b->plot || b->tune)
    return grid_usage("--grid takes neither --select, --sample, --plot nor --tune");
  if (!b->ntok) parse_tokens(b, b->go.quick ? grid_quick_tokens : grid_tokens);
  if (b->tokens[b->ntok - 1] > 65535) return grid_usage("--grid: tokens up to 65535");
  if (!b->replays_given) b->replays = 5;
  grid_defaults(&b->go);
  return -1;
}

/* -1 to go on, else the exit status (2 for a usage error). */
static int parse_args(bench *b, int argc, char **argv) {
  b->steps = 200, b->replays = 7, b->gemm = 1, b->topk = 8;
  b->e2e_tokens[0] = 1, b->e2e_tokens[1] = 8;
  int grid_opts_given = 0;
  for (int i = 1, used = 0; i < argc; i++) {
    used += snprintf(b->command + used, sizeof b->command - (size_t)used, "%s%s", i > 1 ? " " : "",
                     argv[i]);
    if (used >= (int)sizeof b->command) used = (int)sizeof b->command - 1;
  }
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    int more = i + 1 < argc;
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) return printf(usage, grid_byte_model), 0;
    if (!strcmp(a, "--tokens") && more) {
      if (parse_tokens(b, argv[++i])) die("--tokens", "expected a list like 1,2,4,8");
    } else if (!strcmp(a, "--steps") && more) b->steps = atoi(argv[++i]);
    else if (!strcmp(a, "--replays") && more) b->replays = atoi(argv[++i]), b->replays_given = 1;
    else if (!strcmp(a, "--csv") && more) b->csv = argv[++i];
    else if (!strcmp(a, "--plot") && more) b->plot = argv[++i];
    else if (!strcmp(a, "--tune") && more) b->tune = argv[++i];
    else if (!strcmp(a, "--no-gemm")) b->gemm = 0;
    else if (!strcmp(a, "--select")) b->select = 1, b->gemm = 0;
    else if (!strcmp(a, "--sample")) b->sample = 1, b->gemm = 0;
    else if (!strcmp(a, "--grid")) b->grid = 1, b->gemm = 0;
    else if (!strcmp(a, "--quick")) b->go.quick = 1, grid_opts_given = 1;
    else if ((!strcmp(a, "--widths") || !strcmp(a, "--dtypes") || !strcmp(a, "--kernels") ||
              !strcmp(a, "--flashinfer")) && more) {
      if (grid_option(&b->go, a, argv[++i])) return 2;
      grid_opts_given = 1;
    } else if (!strcmp(a, "--topk") && more) b->topk = atoi(argv[++i]);
    else if (!strcmp(a, "--templates") && more) b->templates = argv[++i];
    else if (a[0] == '-' || (b->spec_path && b->name)) return usage_line();
    else if (!b->spec_path) b->spec_path = a;
    else b->name = a;
  }
  if (b->steps < 1 || b->replays < 1 || b->replays > 64 || b->topk < 1 || b->topk > KL_TOPK_MAX ||
      (b->select && b->sample))
    return usage_line();
  int rc = grid_args(b, grid_opts_given);
  if (rc >= 0 || b->grid) return rc;
  if (b->sample && !b->ntok) parse_tokens(b, "1,8,64"); /* the sizes engines decode at */
  if (!b->spec_path) return usage_line();
  return -1;
}

int main(int argc, char **argv) {
  bench *b = calloc(1, sizeof *b);
  if (!b) die("klbench", "out of memory");
  int rc = parse_args(b, argc, argv);
  if (rc >= 0) return free(b), rc;
  setenv("NCCL_NVLS_ENABLE", "0", 0); /* NVLink multicast stays off on shared hosts */
  if (b->grid) {
    rc = grid_run(b);
    free(b);
    return rc;
  }
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) die("CUDA", "no GPU");
  if (gpus > MAX_RANKS) gpus = MAX_RANKS;
  derive_spec(b, gpus);
  if (b->select) select_setup(b);
  if (b->sample) sample_setup(b);
  if (b->templates) {
    kl_err e;
    if (kl_render(&b->spec, &b->l, b->templates, &b->source, &e)) die("--templates", e.msg);
  }
  struct cudaDeviceProp prop;
  CUDA(cudaGetDeviceProperties(&prop, 0));
  snprintf(b->gpu, sizeof b->gpu, "%s", prop.name);
  snprintf(b->arch, sizeof b->arch, "sm_%d%d", prop.major, prop.minor);
  b->sm_count = prop.multiProcessorCount;
  printf("klbench: %s (vocab %lld, tp %d, %s; %lld B per rank per token) on %d x %s (%s), "
         "NCCL %d.%d.%d\n", b->orig.name, (long long)b->orig.vocab_size, b->orig.tp,
         kl_dtype_name(b->orig.dtype), (long long)b->l.shard_bytes, b->n, b->gpu, b->arch,
         NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  printf("method: each path captured %d steps deep in a CUDA graph per rank, ranks replay "
         "together, paths in turn, median of %d replays, max over ranks\n", b->steps, b->replays);
  if (b->templates) printf("kernels rendered from the templates in %s\n", b->templates);
  int devs[MAX_RANKS];
  for (int r = 0; r < b->n; r++) devs[r] = r;
  NCCL(ncclCommInitAll(b->comms, b->n, devs));
  KL(kl_group_create(&b->group, b->n));
  pthread_barrier_init(&b->bar, NULL, (unsigned)b->n);
  rank R[MAX_RANKS];
  pthread_t th[MAX_RANKS];
  memset(R, 0, sizeof R);
  for (int r = 0; r < b->n; r++) {
    R[r].b = b, R[r].r = r;
    pthread_create(&th[r], NULL, rank_main, &R[r]);
  }
  for (int r = 0; r < b->n; r++) pthread_join(th[r], NULL);
  fprintf(stderr, "\r%60s\r", "");
  FILE *csv = b->csv ? fopen(b->csv, "w") : NULL;
  if (b->csv && !csv) die(b->csv, "cannot write");
  if (b->select) select_report(b, csv);
  else if (b->sample) sample_report(b, csv);
  else report(b, csv);
  if (csv) fclose(csv);
  if (b->tune && !b->select && !b->sample) write_tune(b);
  if (b->plot && !b->select && !b->sample) {
    double *series = calloc((size_t)NPATHS * (size_t)b->ntok, sizeof *series);
    for (int p = 0; p < NPATHS; p++)
      for (int i = 0; i < b->ntok; i++) series[p * b->ntok + i] = worst(b->t[p][i], b->n);
    char title[512];
    snprintf(title, sizeof title, "%s: all-gather per decode step, %d x %s (tp %d, %lld B/rank/token)",
             b->orig.name, b->n, b->gpu, b->n, (long long)b->l.shard_bytes);
    if (klbench_plot(b->plot, title, b->tokens, b->ntok, series, path_names, NPATHS))
      die(b->plot, "cannot write");
    printf("\nplot: %s\n", b->plot);
    free(series);
  }
  for (int r = 0; r < b->n; r++) ncclCommDestroy(b->comms[r]);
  kl_group_destroy(b->group);
  rc = b->failed ? 1 : 0;
  if (b->failed) fprintf(stderr, "klbench: outputs of the paths differ\n");
  free(b->source);
  free(b->sel);
  free(b->smp);
  free(b);
  return rc;
}
