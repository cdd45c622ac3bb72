/* klbench --select: the fused epilogue and the sampling-ready gathers
 * against what engines run today, on the spec's per-rank shard. Variants:
 *   plain          kl_gather, no epilogue
 *   fused          kl_gather through an epilogue: fp32 out, soft-cap 30
 *                  (engine numerics)
 *   plain + ops    kl_gather, then that epilogue as the engine runs it:
 *                  x * (1/c), tanh, * c (each rounded to the model dtype),
 *                  the fp32 upcast, one kernel each
 *   argmax         kl_argmax
 *   gather+argmax  kl_gather, then an argmax kernel over [tokens, vocab]
 *   NCCL pairs     each rank's (value, index) per token, ncclAllGather of
 *                  the pairs, the final reduction (the engines' way today)
 *   top-8          kl_topk, k = 8, with the log-sum-exp
 * Results are compared before anything is timed: fused == plain + ops bit
 * for bit, and the three argmaxes (and top-8's first) give the same index.
 * Timing as for the gather table: graphs of `steps` calls, replayed in turn
 * by all ranks together, median over replays, max over ranks. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "klbench.h"
#include "rt.h"

#define SOFTCAP 30.0f
enum { V_PLAIN, V_FUSED, V_OPS, V_ARGMAX, V_GATHER_ARGMAX, V_PAIRS, V_TOPK, NV };

struct select_bench {
  double t[NV][MAX_TOK][MAX_RANKS];
  long long bad[MAX_TOK][MAX_RANKS];
};

struct select_rank {
  kl_ctx *sel, *epi; /* plain + topk, and the epilogue spec; both one-shot */
  CUmodule mod;
  CUfunction mul, tanh_, upcast, row_argmax, pair_argmax, pair_merge;
  void *in, *out, *out32, *ops32, *tmp[2], *pairs, *all_pairs;
  int64_t *idx[3], *topk_idx;
  float *val[3], *topk_val, *lse;
};

/* The engine's separate kernels, as plainly as torch's: elementwise ops with
 * 16-byte loads, argmax with one CTA per row. Ties go to the lowest column
 * and NaN is largest, as in torch.argmax and kl_argmax. */
static const char *const ops_src =
    "typedef unsigned int u32; typedef unsigned short u16;\n"
    "#if ELEM == 4\n typedef u32 T;\n"
    "__device__ float to_f(u32 b) { return __uint_as_float(b); }\n"
    "__device__ u32 from_f(float f) { return __float_as_uint(f); }\n"
    "#elif FP16\n typedef u16 T;\n"
    "__device__ float to_f(u32 b) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"((u16)b)); return f; }\n"
    "__device__ u32 from_f(float f) { u16 h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "#else\n typedef u16 T;\n"
    "__device__ float to_f(u32 b) { return __uint_as_float(b << 16); }\n"
    "__device__ u32 from_f(float f) { u16 h; asm(\"cvt.rn.bf16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n"
    "#endif\n"
    "#define PER (16 / ELEM)\n"
    "#define EW(name, expr) extern \"C\" __global__ void name(const T *in, T *out, long long n, float c) {\\\n"
    "  for (long long i = (blockIdx.x * 256LL + threadIdx.x) * PER; i < n; i += gridDim.x * 256LL * PER) {\\\n"
    "    union { uint4 v; T e[PER]; } u; u.v = *(const uint4 *)(in + i);\\\n"
    "    for (int k = 0; k < PER; ++k) { float x = to_f(u.e[k]); u.e[k] = (T)from_f(expr); }\\\n"
    "    *(uint4 *)(out + i) = u.v; } }\n"
    "EW(mul, x * c)\n"
    "EW(tanh_, tanhf(x))\n"
    "extern \"C\" __global__ void upcast(const T *in, float *out, long long n) {\n"
    "  for (long long i = (blockIdx.x * 256LL + threadIdx.x) * PER; i < n; i += gridDim.x * 256LL * PER) {\n"
    "    union { uint4 v; T e[PER]; } u; u.v = *(const uint4 *)(in + i);\n"
    "    for (int k = 0; k < PER; ++k) out[i + k] = to_f(u.e[k]); } }\n"
    "__device__ bool better(float v, long long i, float w, long long j) {\n"
    "  if (v != v) return w == w || i < j;\n"
    "  if (w != w) return false;\n"
    "  return v > w || (v == w && i < j); }\n"
    "struct Pair { float v; int i; };\n"
    "__device__ void block_best(float &v, long long &i) {\n"
    "  __shared__ float sv[32]; __shared__ long long si[32];\n"
    "  for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(~0u, v, o);\n"
    "    long long j = __shfl_xor_sync(~0u, i, o); if (better(w, j, v, i)) v = w, i = j; }\n"
    "  if ((threadIdx.x & 31) == 0) sv[threadIdx.x >> 5] = v, si[threadIdx.x >> 5] = i;\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x < 32) { v = threadIdx.x < blockDim.x / 32 ? sv[threadIdx.x] : __int_as_float(0xff800000);\n"
    "    i = threadIdx.x < blockDim.x / 32 ? si[threadIdx.x] : (1LL << 62);\n"
    "    for (int o = 16; o > 0; o >>= 1) { float w = __shfl_xor_sync(~0u, v, o);\n"
    "      long long j = __shfl_xor_sync(~0u, i, o); if (better(w, j, v, i)) v = w, i = j; } } }\n"
    "__device__ void row_best(const T *row, long long cols, float &v, long long &i) {\n"
    "  v = __int_as_float(0xff800000); i = 1LL << 62;\n"
    "  for (long long c = threadIdx.x * (long long)PER; c < cols; c += blockDim.x * (long long)PER) {\n"
    "    union { uint4 q; T e[PER]; } u; u.q = *(const uint4 *)(row + c);\n"
    "    for (int k = 0; k < PER && c + k < cols; ++k) { float x = to_f(u.e[k]);\n"
    "      if (better(x, c + k, v, i)) v = x, i = c + k; } }\n"
    "  block_best(v, i); }\n"
    "extern \"C\" __global__ void row_argmax(const T *x, long long cols, long long *idx, float *val) {\n"
    "  float v; long long i; row_best(x + blockIdx.x * cols, cols, v, i);\n"
    "  if (threadIdx.x == 0) idx[blockIdx.x] = i, val[blockIdx.x] = v; }\n"
    "extern \"C\" __global__ void pair_argmax(const T *x, long long cols, long long valid, long long off, Pair *out) {\n"
    "  float v; long long i; row_best(x + blockIdx.x * cols, valid, v, i);\n"
    "  if (threadIdx.x == 0) out[blockIdx.x].v = v, out[blockIdx.x].i = (int)(i + off); }\n"
    "extern \"C\" __global__ void pair_merge(const Pair *all, int tp, int rows, long long *idx, float *val) {\n"
    "  int t = blockIdx.x * blockDim.x + threadIdx.x; if (t >= rows) return;\n"
    "  float v = all[t].v; long long i = all[t].i;\n"
    "  for (int r = 1; r < tp; ++r) { Pair p = all[r * rows + t]; if (better(p.v, p.i, v, i)) v = p.v, i = p.i; }\n"
    "  idx[t] = i; val[t] = v; }\n";

static void load_ops(rank *R) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  char head[128];
  snprintf(head, sizeof head, "#define ELEM %d\n#define FP16 %d\n", b->l.elem_bytes,
           b->spec.dtype == KL_FP16);
  char *src = malloc(strlen(head) + strlen(ops_src) + 1);
  strcpy(src, head);
  strcat(src, ops_src);
  kl_binary bin;
  kl_err e;
  if (kl_nvrtc_compile(src, "engine_ops", b->arch, &bin, &e)) die("engine ops", e.msg);
  free(src);
  const kl_cu *cu = kl_cu_get(NULL);
  if (cu->cuModuleLoadData(&S->mod, bin.data) ||
      cu->cuModuleGetFunction(&S->mul, S->mod, "mul") ||
      cu->cuModuleGetFunction(&S->tanh_, S->mod, "tanh_") ||
      cu->cuModuleGetFunction(&S->upcast, S->mod, "upcast") ||
      cu->cuModuleGetFunction(&S->row_argmax, S->mod, "row_argmax") ||
      cu->cuModuleGetFunction(&S->pair_argmax, S->mod, "pair_argmax") ||
      cu->cuModuleGetFunction(&S->pair_merge, S->mod, "pair_merge"))
    die("engine ops", "cannot load");
  kl_binary_free(&bin);
}

static void launch(rank *R, CUfunction f, unsigned grid, unsigned block, void **args) {
  if (kl_cu_get(NULL)->cuLaunchKernel(f, grid, 1, 1, block, 1, 1, 0, (CUstream)R->s, args, NULL))
    die("engine ops", "launch failed");
}

static unsigned ew_grid(const bench *b, long long n) {
  long long per = 256LL * (16 / b->l.elem_bytes), g = (n + per - 1) / per;
  long long cap = 4LL * b->sm_count;
  return (unsigned)(g < 1 ? 1 : g > cap ? cap : g);
}

/* x * (1/c), tanh, * c, each rounded to the model dtype, then fp32. */
static void engine_epilogue(rank *R, int T) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  long long n = (long long)T * b->spec.vocab_size;
  float inv = 1.0f / SOFTCAP, cap = SOFTCAP;
  void *a1[] = {&R->out[0], &S->tmp[0], &n, &inv};
  void *a2[] = {&S->tmp[0], &S->tmp[1], &n, &inv};
  void *a3[] = {&S->tmp[1], &S->tmp[0], &n, &cap};
  void *a4[] = {&S->tmp[0], &S->ops32, &n};
  launch(R, S->mul, ew_grid(b, n), 256, a1);
  launch(R, S->tanh_, ew_grid(b, n), 256, a2);
  launch(R, S->mul, ew_grid(b, n), 256, a3);
  launch(R, S->upcast, ew_grid(b, n), 256, a4);
}

/* Greedy as engines run it sharded: each rank's (value, index) per token,
 * ncclAllGather of the pairs, the final reduction. The indices, on the device. */
int64_t *select_pairs(rank *R, int T) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  long long cols = b->l.shard, off = (long long)R->r * b->l.shard;
  long long valid = b->spec.vocab_size - off < cols ? b->spec.vocab_size - off : cols;
  void *a1[] = {&S->in, &cols, &valid, &off, &S->pairs};
  launch(R, S->pair_argmax, (unsigned)T, 1024, a1);
  if (ncclAllGather(S->pairs, S->all_pairs, (size_t)T * 8, ncclUint8, b->comms[R->r], R->s) !=
      ncclSuccess)
    die("ncclAllGather", "pairs");
  int tp = b->n, rows = T;
  void *a2[] = {&S->all_pairs, &tp, &rows, &S->idx[2], &S->val[2]};
  launch(R, S->pair_merge, (unsigned)((T + 127) / 128), 128, a2);
  return S->idx[2];
}

static void sel_step(rank *R, int v, int T) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  long long vocab = b->spec.vocab_size;
  void *am[] = {&R->out[0], &vocab, &S->idx[1], &S->val[1]};
  switch (v) {
    case V_PLAIN: KL(kl_gather(R->ctx[0], S->in, R->out[0], T, R->s)); break;
    case V_FUSED: KL(kl_gather(S->epi, S->in, S->out32, T, R->s)); break;
    case V_OPS:
      KL(kl_gather(R->ctx[0], S->in, R->out[0], T, R->s));
      engine_epilogue(R, T);
      break;
    case V_ARGMAX: KL(kl_argmax(S->sel, S->in, S->idx[0], S->val[0], T, R->s)); break;
    case V_GATHER_ARGMAX:
      KL(kl_gather(R->ctx[0], S->in, R->out[0], T, R->s));
      launch(R, S->row_argmax, (unsigned)T, 1024, am);
      break;
    case V_PAIRS: select_pairs(R, T); break;
    case V_TOPK:
      KL(kl_topk(S->sel, S->in, S->topk_idx, S->topk_val, S->lse, T, R->s));
      break;
  }
}

/* A spec source: the bench's spec with `extra` fields. */
static void spec_with(const bench *b, const char *extra, char *buf, size_t n) {
  size_t len = strlen(b->spec_src);
  snprintf(buf, n, "%.*s, %s }", (int)(len - 2), b->spec_src, extra);
}

/* A context for the bench's spec with `extra` fields; with --templates, its
 * kernels are rendered from those templates, as the gather table's are. */
kl_ctx *select_ctx(const bench *b, const char *extra, const kl_config *cfg) {
  char src[1200];
  kl_ctx *ctx = NULL;
  spec_with(b, extra, src, sizeof src);
  if (!b->templates) {
    KL(kl_ctx_create_string(&ctx, src, NULL, cfg));
    return ctx;
  }
  kl_spec_list list;
  kl_layout l;
  kl_err e;
  char *code;
  if (kl_spec_load_string("select spec", src, strlen(src), NULL, &list, &e)) die("select spec", e.msg);
  const kl_spec *s = &list.v[0];
  if (kl_layout_derive(s, &l, &e) || kl_render(s, &l, b->templates, &code, &e)) die("--templates", e.msg);
  kl_generated g = bench_generated(s, &l, code);
  KL(kl_ctx_create_generated(&ctx, &g, cfg));
  free(code);
  kl_spec_list_free(&list);
  return ctx;
}

static void fill_input(rank *R, size_t elems) {
  bench *b = R->b;
  unsigned char *h = bench_logits(elems, b->spec.dtype, 0x2545f491u * (uint32_t)(R->r + 1));
  CUDA(cudaMemcpy(R->sel->in, h, elems * (size_t)b->l.elem_bytes, cudaMemcpyHostToDevice));
  free(h);
}

static void alloc_select(rank *R) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  size_t T = (size_t)b->tokens[b->ntok - 1], V = (size_t)b->spec.vocab_size;
  size_t e = (size_t)b->l.elem_bytes;
  S->in = bench_dev(T * (size_t)b->l.shard_bytes);
  fill_input(R, T * (size_t)b->l.shard);
  S->out32 = bench_dev(T * V * 4);
  S->ops32 = bench_dev(T * V * 4);
  S->tmp[0] = bench_dev(T * V * e);
  S->tmp[1] = bench_dev(T * V * e);
  S->pairs = bench_dev(T * 8);
  S->all_pairs = bench_dev(T * 8 * (size_t)b->n);
  for (int i = 0; i < 3; i++) S->idx[i] = bench_dev(T * 8), S->val[i] = bench_dev(T * 4);
  S->topk_idx = bench_dev(T * (size_t)b->topk * 8);
  S->topk_val = bench_dev(T * (size_t)b->topk * 4);
  S->lse = bench_dev(T * 4);
}

/* fused == plain + ops bit for bit; the argmaxes agree. Mismatches. */
static long long check(rank *R, int T) {
  bench *b = R->b;
  struct select_rank *S = R->sel;
  for (int v = 0; v < NV; v++) sel_step(R, v, T);
  CUDA(cudaStreamSynchronize(R->s));
  size_t n = (size_t)T * (size_t)b->spec.vocab_size * 4;
  unsigned char *f = malloc(n), *o = malloc(n);
  CUDA(cudaMemcpy(f, S->out32, n, cudaMemcpyDeviceToHost));
  CUDA(cudaMemcpy(o, S->ops32, n, cudaMemcpyDeviceToHost));
  long long bad = memcmp(f, o, n) != 0;
  free(f), free(o);
  size_t k = (size_t)b->topk;
  int64_t *idx = malloc((size_t)T * 8 * (3 + k));
  for (int i = 0; i < 3; i++)
    CUDA(cudaMemcpy(idx + i * T, S->idx[i], (size_t)T * 8, cudaMemcpyDeviceToHost));
  CUDA(cudaMemcpy(idx + 3 * T, S->topk_idx, (size_t)T * k * 8, cudaMemcpyDeviceToHost));
  for (int t = 0; t < T; t++)
    bad += idx[t] != idx[T + t] || idx[t] != idx[2 * T + t] || idx[t] != idx[3 * T + t * k];
  free(idx);
  return bad;
}

void select_setup(bench *b) {
  b->sel = calloc(1, sizeof *b->sel);
  if (!b->sel) die("klbench", "out of memory");
}

kl_config select_config(const rank *R) {
  const bench *b = R->b;
  kl_config cfg = {.size = sizeof(kl_config), .rank = R->r, .nranks = b->n, .device = R->r,
                   .nccl = b->comms[R->r], .group = b->group, .crossover_bytes = 1LL << 40};
  return cfg;
}

void select_engine_ops(rank *R) {
  R->sel = calloc(1, sizeof *R->sel);
  if (!R->sel) die("klbench", "out of memory");
  load_ops(R);
  alloc_select(R);
}

void *select_shard(const rank *R) { return R->sel->in; }

void select_rank(rank *R) {
  bench *b = R->b;
  kl_config cfg = select_config(R);
  select_engine_ops(R);
  struct select_rank *S = R->sel;
  char topk[32];
  snprintf(topk, sizeof topk, "topk = %d", b->topk);
  S->sel = select_ctx(b, topk, &cfg);
  S->epi = select_ctx(b, "out_dtype = 'fp32', softcap = 30.0", &cfg);
  for (int k = 0; k < 2000; k++) sel_step(R, k % NV, b->tokens[0]); /* clocks up */
  CUDA(cudaStreamSynchronize(R->s));
  for (int i = 0; i < b->ntok; i++) {
    int T = b->tokens[i], all[NV];
    double t[NV];
    if (R->r == 0) progress(b, i, "checking fused == separate, argmaxes agree");
    b->sel->bad[i][R->r] = check(R, T);
    if (R->r == 0) progress(b, i, "timing the sampling variants");
    for (int v = 0; v < NV; v++) all[v] = v;
    time_graphs(R, sel_step, all, NV, T, b->replays, t);
    for (int v = 0; v < NV; v++) b->sel->t[v][i][R->r] = t[v];
  }
  CUDA(cudaStreamSynchronize(R->s));
  kl_stats st = KL_STATS_INIT;
  kl_ctx_stats(S->sel, &st);
  if (st.nccl) die("--select", "kl_argmax/kl_topk left the one-shot path");
  if (kl_ctx_status(S->sel) != KLRT_OK || kl_ctx_status(S->epi) != KLRT_OK)
    die("device status", kl_last_error());
  kl_ctx_destroy(S->sel);
  kl_ctx_destroy(S->epi);
  select_release(R);
}

void select_release(rank *R) {
  kl_cu_get(NULL)->cuModuleUnload(R->sel->mod);
  free(R->sel);
  R->sel = NULL;
}

void select_report(bench *b, FILE *csv) {
  printf("\nsampling-ready gathers, us per step (soft-cap %.0f, fp32 out; top-k: k = %d):\n",
         SOFTCAP, b->topk);
  printf("%-7s %8s %8s %10s %8s %8s %14s %11s %8s %12s %10s %10s\n", "tokens", "plain",
         "fused", "plain+ops", "fused x", "argmax", "gather+argmax", "NCCL pairs", "top-k",
         "x g+argmax", "x pairs", "agree");
  if (csv)
    fprintf(csv, "tokens,plain_us,fused_us,plain_ops_us,argmax_us,gather_argmax_us,"
                 "nccl_pairs_us,topk_us,mismatches\n");
  for (int i = 0; i < b->ntok; i++) {
    double t[NV];
    long long bad = 0;
    for (int v = 0; v < NV; v++) t[v] = worst(b->sel->t[v][i], b->n);
    for (int r = 0; r < b->n; r++) bad += b->sel->bad[i][r];
    printf("%-7d %8.2f %8.2f %10.2f %7.2fx %8.2f %14.2f %11.2f %8.2f %11.2fx %9.2fx %10s\n",
           b->tokens[i], t[V_PLAIN], t[V_FUSED], t[V_OPS], t[V_OPS] / t[V_FUSED], t[V_ARGMAX],
           t[V_GATHER_ARGMAX], t[V_PAIRS], t[V_TOPK], t[V_GATHER_ARGMAX] / t[V_ARGMAX],
           t[V_PAIRS] / t[V_ARGMAX], bad ? "NO" : "yes");
    if (csv)
      fprintf(csv, "%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%lld\n", b->tokens[i], t[V_PLAIN],
              t[V_FUSED], t[V_OPS], t[V_ARGMAX], t[V_GATHER_ARGMAX], t[V_PAIRS], t[V_TOPK], bad);
    if (bad) b->failed = 1;
  }
}
